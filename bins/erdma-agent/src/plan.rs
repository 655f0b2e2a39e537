//! What this agent runs on this node, decided once: a pure value derived from the resolved
//! [`Settings`] and what the node offers ([`NodeOffers`]: the Kubernetes API or not, the runtime's
//! NRI socket or not, the resource API chosen). [`crate::agent::run`] only wires the tasks the
//! plan names; every policy decision between the settings and the tasks lives here.

use crate::cli::{Choice, NriMode, Settings};
use serde::Serialize;
use std::path::PathBuf;

/// The API in use on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResourceApi {
    /// The kubelet device-plugin API.
    DevicePlugin,
    /// DRA.
    Dra,
}

impl ResourceApi {
    /// The label value / flag spelling.
    pub fn name(&self) -> &'static str {
        match self {
            ResourceApi::DevicePlugin => "device-plugin",
            ResourceApi::Dra => "dra",
        }
    }
}

/// What the node offers at start, found by the agent before it plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeOffers {
    /// The Kubernetes API answered (node name and a config).
    pub cluster: bool,
    /// The runtime's NRI socket (`--nri-socket`) exists.
    pub nri_socket: bool,
    /// The resource API resolved for this node (`--resource-api`, the node label).
    pub resource_api: ResourceApi,
}

/// How SMC-R pods are configured on this node (`/healthz`'s `nri.smcr_path`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmcrPath {
    /// Not by the agent (the webhook's init container, SMC-R off, or a DRA node: no pre-start
    /// call and no pod-resources device IDs for the PNET ID).
    None,
    /// At sandbox creation, through NRI.
    Nri,
    /// In the kubelet's PreStartContainer call.
    PreStart,
}

impl SmcrPath {
    /// The `/healthz` spelling.
    pub fn name(self) -> &'static str {
        match self {
            SmcrPath::None => "none",
            SmcrPath::Nri => "nri",
            SmcrPath::PreStart => "prestart",
        }
    }
}

/// Where the served ERIs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EriSourcePlan {
    /// The local devices (`--local-eri-discovery`).
    Local,
    /// This node's ERdmaDevice, followed in the cluster.
    Cluster,
}

/// The sockets and directories the agent's tasks use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sockets {
    /// The device-plugin directory holding kubelet.sock.
    pub kubelet_dir: PathBuf,
    /// The kubelet's root directory (DRA's plugins_registry/ and plugins/).
    pub kubelet_root_dir: PathBuf,
    /// The kubelet's pod-resources socket, if given.
    pub pod_resources: Option<PathBuf>,
    /// The runtime's NRI socket.
    pub nri: PathBuf,
    /// The CRI socket of the SMC-R hook (`None`: auto-detect).
    pub cri: Option<PathBuf>,
    /// The device plugin's CDI spec directory (`None`: no CDI).
    pub cdi: Option<PathBuf>,
    /// The DRA driver's CDI spec directory (`--cdi-spec-dir`, else /var/run/cdi).
    pub dra_cdi: PathBuf,
}

/// The DRA driver's CDI directory when `--cdi-spec-dir` is not set.
pub const DEFAULT_DRA_CDI_DIR: &str = "/var/run/cdi";

/// Everything the agent decided to run on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPlan {
    /// Device plugin or DRA (never both).
    pub resource_api: ResourceApi,
    /// Report the resource API as a node condition (with the cluster).
    pub report_resource_api: bool,
    /// Clear this node's DRA leftovers (device plugin chosen by the node label, with the
    /// cluster).
    pub retire_dra: bool,
    /// Run the NRI plugin.
    pub nri: bool,
    /// `--nri` as `/healthz` shows it.
    pub nri_mode: &'static str,
    /// How SMC-R pods are configured.
    pub smcr: SmcrPath,
    /// Probe and load the SMC-R BPF policy (started before the API connection).
    pub smcr_probe: bool,
    /// The kubelet must call PreStartContainer (device plugin).
    pub pre_start_required: bool,
    /// Every container gets every device.
    pub allocate_all: bool,
    /// `allocate_all` was forced on by `--exposed-local-eris` with `--local-eri-discovery`.
    pub allocate_all_forced: bool,
    /// The device plugin answers Allocate with CDI device names.
    pub cdi: bool,
    /// Ask the metadata service for the instance ID.
    pub fetch_instance_id: bool,
    /// Set up the ERI netdevs.
    pub netdev: bool,
    /// Set up the SMC-R pnet table.
    pub smc_pnet: bool,
    /// Where the served ERIs come from.
    pub eri_source: EriSourcePlan,
    /// Watch for another device plugin serving the resource (device plugin only).
    pub coexistence: bool,
    /// Per-pod RDMA usage on scrape and `GET /usage` (`--rdma-usage`, with the metrics server).
    pub rdma_usage: bool,
    /// The sockets and directories.
    pub sockets: Sockets,
}

/// Why the agent cannot run on this node as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// DRA chosen without the Kubernetes API.
    DraWithoutCluster,
}

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlanError::DraWithoutCluster => f.write_str(
                "--resource-api dra needs the Kubernetes API (NODE_NAME and in-cluster config or --kubeconfig) to publish ResourceSlices and read claims",
            ),
        }
    }
}

impl std::error::Error for PlanError {}

impl AgentPlan {
    /// Whether the SMC-R BPF policy is probed: decided from the settings alone, since the probe
    /// starts before the node's offers are known.
    pub fn probes_smcr(s: &Settings) -> bool {
        s.prestart_container
    }

    /// The plan for `s` on a node offering `node`.
    pub fn new(s: &Settings, node: &NodeOffers) -> Result<AgentPlan, PlanError> {
        let api = node.resource_api;
        let dra = api == ResourceApi::Dra;
        if dra && !node.cluster {
            return Err(PlanError::DraWithoutCluster);
        }
        let nri = match s.nri {
            NriMode::Off => false,
            NriMode::On => true,
            NriMode::Auto => node.nri_socket,
        };
        let smcr = match (s.prestart_container, nri) {
            _ if dra => SmcrPath::None,
            (false, _) => SmcrPath::None,
            (true, true) => SmcrPath::Nri,
            (true, false) => SmcrPath::PreStart,
        };
        // Kept from the original agent: a local allow-list implies all-devices mode.
        let allocate_all_forced =
            !s.allocate_all_devices && !s.exposed_local_eris.is_empty() && s.local_eri_discovery;
        Ok(AgentPlan {
            resource_api: api,
            report_resource_api: node.cluster,
            retire_dra: node.cluster
                && api == ResourceApi::DevicePlugin
                && s.resource_api == Choice::NodeLabel,
            nri,
            nri_mode: match s.nri {
                NriMode::Auto => "auto",
                NriMode::On => "on",
                NriMode::Off => "off",
            },
            smcr,
            smcr_probe: Self::probes_smcr(s),
            // With NRI, SMC-R happens at sandbox creation: the kubelet need not call
            // PreStartContainer.
            pre_start_required: !dra && s.prestart_container && !nri,
            allocate_all: s.allocate_all_devices || allocate_all_forced,
            allocate_all_forced,
            cdi: s.cdi_spec_dir.is_some(),
            fetch_instance_id: s.instance_id.is_none() && !s.exposed_local_eris.is_empty(),
            netdev: s.setup_eri_netdev,
            smc_pnet: s.setup_smc_pnet,
            eri_source: if s.local_eri_discovery {
                EriSourcePlan::Local
            } else {
                EriSourcePlan::Cluster
            },
            coexistence: !dra,
            rdma_usage: s.rdma_usage && matches!(s.metrics_addr, crate::cli::MetricsAddr::On(_)),
            sockets: Sockets {
                kubelet_dir: s.kubelet_dir.clone(),
                kubelet_root_dir: s.kubelet_root_dir.clone(),
                pod_resources: s.pod_resources_socket.clone(),
                nri: s.nri_socket.clone(),
                cri: s.cri_socket.clone(),
                cdi: s.cdi_spec_dir.clone(),
                dra_cdi: s
                    .cdi_spec_dir
                    .clone()
                    .unwrap_or_else(|| DEFAULT_DRA_CDI_DIR.into()),
            },
        })
    }

    /// Logs what the plan decided that the agent's start-up does not log itself.
    pub fn log(&self) {
        let api = self.resource_api.name();
        tracing::info!(resource_api = api, "serving eRDMA devices through {api}");
        if self.allocate_all_forced {
            tracing::info!(
                "--exposed-local-eris with --local-eri-discovery: every container gets every exposed device"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Flags;
    use ResourceApi::{DevicePlugin as Dp, Dra};
    use clap::Parser;

    /// The ERI and allocation settings of a row.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Eris {
        /// Cluster mode, nothing else.
        Cluster,
        /// `--local-eri-discovery`.
        Local,
        /// `--local-eri-discovery --exposed-local-eris=...`.
        LocalExposed,
        /// `--local-eri-discovery --exposed-local-eris=... --instance-id`.
        LocalExposedWithId,
        /// `--allocate-all-devices` in cluster mode.
        AllocateAll,
        /// `--exposed-local-eris=... --filter-cluster-eris`.
        ClusterFiltered,
    }

    fn settings(mode: &str, prestart: bool, choice: &str, eris: Eris) -> Settings {
        let mut v: Vec<String> = vec!["erdma-agent".into(), format!("--nri={mode}")];
        v.push(format!("--deviceplugin-prestart-container={prestart}"));
        v.push(format!("--resource-api={choice}"));
        let list = "--exposed-local-eris=i-* erdma_0".to_string();
        match eris {
            Eris::Cluster => {}
            Eris::Local => v.push("--local-eri-discovery".into()),
            Eris::LocalExposed => v.extend(["--local-eri-discovery".into(), list]),
            Eris::LocalExposedWithId => v.extend([
                "--local-eri-discovery".into(),
                list,
                "--instance-id=i-abc".into(),
            ]),
            Eris::AllocateAll => v.push("--allocate-all-devices".into()),
            Eris::ClusterFiltered => v.extend([list, "--filter-cluster-eris".into()]),
        }
        Settings::resolve(Flags::try_parse_from(v).unwrap()).unwrap()
    }

    /// NRI and SMC-R: (api, --nri, socket present, prestart) → (nri, smcr path, kubelet must
    /// call PreStartContainer). Every combination, written out.
    #[rustfmt::skip]
    const NRI: [(ResourceApi, &str, bool, bool, bool, SmcrPath, bool); 24] = [
        (Dp,  "off",  false, false, false, SmcrPath::None,     false),
        (Dp,  "off",  false, true,  false, SmcrPath::PreStart, true),
        (Dp,  "off",  true,  false, false, SmcrPath::None,     false),
        (Dp,  "off",  true,  true,  false, SmcrPath::PreStart, true),
        (Dp,  "on",   false, false, true,  SmcrPath::None,     false),
        (Dp,  "on",   false, true,  true,  SmcrPath::Nri,      false),
        (Dp,  "on",   true,  false, true,  SmcrPath::None,     false),
        (Dp,  "on",   true,  true,  true,  SmcrPath::Nri,      false),
        (Dp,  "auto", false, false, false, SmcrPath::None,     false),
        (Dp,  "auto", false, true,  false, SmcrPath::PreStart, true),
        (Dp,  "auto", true,  false, true,  SmcrPath::None,     false),
        (Dp,  "auto", true,  true,  true,  SmcrPath::Nri,      false),
        (Dra, "off",  false, false, false, SmcrPath::None,     false),
        (Dra, "off",  false, true,  false, SmcrPath::None,     false),
        (Dra, "off",  true,  false, false, SmcrPath::None,     false),
        (Dra, "off",  true,  true,  false, SmcrPath::None,     false),
        (Dra, "on",   false, false, true,  SmcrPath::None,     false),
        (Dra, "on",   false, true,  true,  SmcrPath::None,     false),
        (Dra, "on",   true,  false, true,  SmcrPath::None,     false),
        (Dra, "on",   true,  true,  true,  SmcrPath::None,     false),
        (Dra, "auto", false, false, false, SmcrPath::None,     false),
        (Dra, "auto", false, true,  false, SmcrPath::None,     false),
        (Dra, "auto", true,  false, true,  SmcrPath::None,     false),
        (Dra, "auto", true,  true,  true,  SmcrPath::None,     false),
    ];

    /// ERIs and allocation: row → (allocate all, forced, fetch the instance ID, ERI source).
    #[rustfmt::skip]
    const ERI_ROWS: [(Eris, bool, bool, bool, EriSourcePlan); 6] = [
        (Eris::Cluster,            false, false, false, EriSourcePlan::Cluster),
        (Eris::Local,              false, false, false, EriSourcePlan::Local),
        (Eris::LocalExposed,       true,  true,  true,  EriSourcePlan::Local),
        (Eris::LocalExposedWithId, true,  true,  false, EriSourcePlan::Local),
        (Eris::AllocateAll,        true,  false, false, EriSourcePlan::Cluster),
        (Eris::ClusterFiltered,    false, false, true,  EriSourcePlan::Cluster),
    ];

    /// The cluster: (api, --resource-api, cluster) → (refused, report the condition, retire
    /// DRA, watch for another plugin).
    #[rustfmt::skip]
    const CLUSTER: [(ResourceApi, &str, bool, bool, bool, bool, bool); 8] = [
        (Dp,  "device-plugin", false, false, false, false, true),
        (Dp,  "device-plugin", true,  false, true,  false, true),
        (Dp,  "node-label",    false, false, false, false, true),
        (Dp,  "node-label",    true,  false, true,  true,  true),
        (Dra, "dra",           false, true,  false, false, false),
        (Dra, "dra",           true,  false, true,  false, false),
        (Dra, "node-label",    false, true,  false, false, false),
        (Dra, "node-label",    true,  false, true,  false, false),
    ];

    /// Every combination of resource API (and how it was chosen) × `--nri` × socket ×
    /// pre-start × cluster × ERI/allocation settings, each field checked against the hand-written
    /// row of the table that decides it.
    #[test]
    fn every_combination_plans_as_the_tables_say() {
        let mut checked = 0;
        for &(api, choice, cluster, refused, report, retire, coexist) in &CLUSTER {
            for &(nri_api, mode, socket, prestart, nri, smcr, pre_start) in &NRI {
                if nri_api != api {
                    continue;
                }
                for &(eris, all, forced, fetch, source) in &ERI_ROWS {
                    let s = settings(mode, prestart, choice, eris);
                    let offers = NodeOffers {
                        cluster,
                        nri_socket: socket,
                        resource_api: api,
                    };
                    let row = format!(
                        "{api:?} {choice} {mode} socket={socket} prestart={prestart} cluster={cluster} {eris:?}"
                    );
                    let plan = AgentPlan::new(&s, &offers);
                    if refused {
                        assert_eq!(plan, Err(PlanError::DraWithoutCluster), "{row}");
                        checked += 1;
                        continue;
                    }
                    let p = plan.unwrap_or_else(|e| panic!("{row}: {e}"));
                    assert_eq!(p.resource_api, api, "{row}");
                    assert_eq!(p.nri, nri, "{row}");
                    assert_eq!(p.nri_mode, mode, "{row}");
                    assert_eq!(p.smcr, smcr, "{row}");
                    assert_eq!(p.smcr_probe, prestart, "{row}");
                    assert_eq!(p.pre_start_required, pre_start, "{row}");
                    assert_eq!(p.allocate_all, all, "{row}");
                    assert_eq!(p.allocate_all_forced, forced, "{row}");
                    assert_eq!(p.fetch_instance_id, fetch, "{row}");
                    assert_eq!(p.eri_source, source, "{row}");
                    assert_eq!(p.report_resource_api, report, "{row}");
                    assert_eq!(p.retire_dra, retire, "{row}");
                    assert_eq!(p.coexistence, coexist, "{row}");
                    checked += 1;
                }
            }
        }
        // 8 cluster rows × 12 NRI rows of their API × 6 ERI rows.
        assert_eq!(checked, 8 * 12 * 6);
    }

    /// Usage: (--rdma-usage, --metrics-addr) → usage collected.
    #[rustfmt::skip]
    const USAGE: [(Option<&str>, &str, bool); 6] = [
        (None,          "0.0.0.0:9101", true),
        (Some("true"),  "0.0.0.0:9101", true),
        (Some("false"), "0.0.0.0:9101", false),
        (None,          "off",          false),
        (Some("true"),  "off",          false),
        (Some("false"), "off",          false),
    ];

    #[test]
    fn rdma_usage_needs_the_flag_and_the_metrics_server() {
        let offers = NodeOffers {
            cluster: false,
            nri_socket: false,
            resource_api: Dp,
        };
        for (flag, addr, on) in USAGE {
            let mut v = vec!["erdma-agent".to_string(), format!("--metrics-addr={addr}")];
            v.extend(flag.map(|f| format!("--rdma-usage={f}")));
            let s = Settings::resolve(Flags::try_parse_from(v).unwrap()).unwrap();
            let p = AgentPlan::new(&s, &offers).unwrap();
            assert_eq!(p.rdma_usage, on, "{flag:?} {addr}");
        }
    }

    #[test]
    fn dra_without_the_cluster_is_refused_with_todays_message() {
        let s = settings("auto", false, "dra", Eris::Cluster);
        let e = AgentPlan::new(
            &s,
            &NodeOffers {
                cluster: false,
                nri_socket: false,
                resource_api: Dra,
            },
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--resource-api dra needs the Kubernetes API (NODE_NAME and in-cluster config or --kubeconfig) to publish ResourceSlices and read claims"
        );
    }

    #[test]
    fn cdi_host_setup_and_sockets_follow_the_settings() {
        let offers = NodeOffers {
            cluster: true,
            nri_socket: false,
            resource_api: Dp,
        };
        let s = settings("auto", false, "device-plugin", Eris::Cluster);
        let p = AgentPlan::new(&s, &offers).unwrap();
        assert!(!p.cdi);
        // Managed driver, cluster mode: both host setups by default.
        assert!(p.netdev && p.smc_pnet);
        assert_eq!(
            p.sockets,
            Sockets {
                kubelet_dir: "/var/lib/kubelet/device-plugins".into(),
                kubelet_root_dir: "/var/lib/kubelet".into(),
                pod_resources: None,
                nri: "/var/run/nri/nri.sock".into(),
                cri: None,
                cdi: None,
                dra_cdi: "/var/run/cdi".into(),
            }
        );
        let s = Settings::resolve(
            Flags::try_parse_from([
                "erdma-agent",
                "--cdi-spec-dir=/etc/cdi",
                "--prefer-driver=none",
                "--pod-resources-socket=/pr.sock",
                "--nri-socket=/nri.sock",
                "--cri-socket=/cri.sock",
                "--kubelet-dir=/k/dp",
                "--kubelet-root-dir=/k",
            ])
            .unwrap(),
        )
        .unwrap();
        let p = AgentPlan::new(&s, &offers).unwrap();
        assert!(p.cdi);
        // --prefer-driver none: neither host setup by default.
        assert!(!p.netdev && !p.smc_pnet);
        assert_eq!(
            p.sockets,
            Sockets {
                kubelet_dir: "/k/dp".into(),
                kubelet_root_dir: "/k".into(),
                pod_resources: Some("/pr.sock".into()),
                nri: "/nri.sock".into(),
                cri: Some("/cri.sock".into()),
                cdi: Some("/etc/cdi".into()),
                dra_cdi: "/etc/cdi".into(),
            }
        );
        let s = settings("auto", false, "device-plugin", Eris::Local);
        let p = AgentPlan::new(&s, &offers).unwrap();
        // Local discovery: no netdev setup by default, pnet setup still.
        assert!(!p.netdev && p.smc_pnet);
    }
}
