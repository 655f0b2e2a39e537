//! `erdmactl doctor`: run the eRDMA troubleshooting checks for a node, a pod, or this machine.

use crate::devices;
use crate::output::{self, Format};
use crate::submit::{KubeArgs, kube_client, kube_client_with_retry, runtime};
use crate::top;
use erdma_doctor::cluster::{self, Exec, PodTarget};
use erdma_doctor::smc_usage;
use erdma_doctor::usage::{Evidence, PodUsageView};
use erdma_doctor::{Check, Report};
use erdma_usage::report::{NodeUsage, OtherKind};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Arguments of `erdmactl doctor`. Without `--node`/`--pod` it checks this machine (`--local`).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Check this node: aliyun/erdma allocatable, agent pod, driver mode and readiness, other plugins.
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// Check this pod: scheduling, admission, resources, IPC_LOCK, RDMA libraries, SMC-R, whether
    /// it uses RDMA (the agent's usage and its NCCL log); and its node.
    #[arg(long, value_name = "POD")]
    pub pod: Option<String>,
    /// Namespace of --pod (default: the kubeconfig context's namespace).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// The other end of an SMC-R connection (`pod` or `namespace/pod`), checked for the annotation.
    #[arg(long, value_name = "POD")]
    pub peer: Option<String>,
    /// Run `kubectl exec … ls` in the pod to look for libibverbs and the eRDMA provider.
    #[arg(long)]
    pub exec: bool,
    /// Also check this machine's devices and char devices (the default without --node/--pod).
    #[arg(long)]
    pub local: bool,
    /// sysfs root for --local.
    #[arg(long, default_value = "/sys", value_name = "DIR")]
    pub sysfs_root: PathBuf,
    /// Device directory for --local (see `erdmactl devices --dev-root`).
    #[arg(long, value_name = "DIR")]
    pub dev_root: Option<PathBuf>,
    /// Kubelet device-plugin directory for --local, searched for other plugins serving aliyun/erdma.
    #[arg(
        long,
        default_value = "/var/lib/kubelet/device-plugins",
        value_name = "DIR"
    )]
    pub kubelet_dir: PathBuf,
    /// The container runtime's NRI socket for --local.
    #[arg(long, default_value = "/var/run/nri/nri.sock", value_name = "PATH")]
    pub nri_socket: PathBuf,
    /// Where the local agent serves /healthz for --local (`off` to skip).
    #[arg(long, default_value = erdma_doctor::agent_health::DEFAULT_ADDR, value_name = "HOST:PORT")]
    pub agent_addr: String,
    /// Label selector of the agent pods (default: recognised by the erdma-agent DaemonSet or image).
    #[arg(long, value_name = "SELECTOR")]
    pub agent_selector: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Format,
    /// Exit with status 1 when a check warns, too (for CI gates and readiness checks).
    #[arg(long)]
    pub strict: bool,
    /// Kubernetes API access.
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// `kubectl exec` with the same kubeconfig/context.
struct KubectlExec<'a> {
    kube: &'a KubeArgs,
}

impl Exec for KubectlExec<'_> {
    fn list(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        paths: &[&str],
    ) -> Result<String, String> {
        let mut cmd = Command::new("kubectl");
        if let Some(k) = &self.kube.kubeconfig {
            cmd.arg("--kubeconfig").arg(k);
        }
        if let Some(c) = &self.kube.context {
            cmd.args(["--context", c]);
        }
        cmd.args([
            "exec", "-n", namespace, pod, "-c", container, "--", "ls", "-1",
        ])
        .args(paths);
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run kubectl: {e} (install kubectl or drop --exec)"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        // `ls` exits 2 when some paths are missing; that is an answer, not a failure.
        if out.status.success() || !stdout.trim().is_empty() {
            return Ok(stdout);
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output");
        if last.contains("No such file or directory") {
            // Every path was missing: the image has no RDMA libraries at all.
            return Ok(String::new());
        }
        Err(last.to_string())
    }
}

fn local_checks(args: &Args, agent: Option<std::net::SocketAddr>) -> Vec<Check> {
    let report = devices::scan(&devices::Args {
        sysfs_root: args.sysfs_root.clone(),
        dev_root: args.dev_root.clone(),
        driver: vec![],
        output: Format::Table,
        kubelet_root_dir: args.kubelet_dir.parent().map(Path::to_path_buf),
    });
    let mut checks = erdma_doctor::local::checks(&report.node);
    let sockets = erdma_host::plugin_dir::sockets(&args.kubelet_dir)
        .map(|v| v.into_iter().map(|s| (s.file_name, s.live)).collect())
        .map_err(|e| e.to_string());
    checks.push(erdma_doctor::coexistence::local(
        &args.kubelet_dir.display().to_string(),
        sockets,
    ));
    let mut nri_view = None;
    let mut dra_view = None;
    if let Some(addr) = agent {
        let answer = erdma_doctor::agent_health::fetch(addr, std::time::Duration::from_secs(2));
        if let Ok((200, body)) = &answer {
            nri_view = serde_json::from_str::<serde_json::Value>(body.trim())
                .ok()
                .and_then(|v| v.get("nri").cloned());
            dra_view = serde_json::from_str::<serde_json::Value>(body.trim())
                .ok()
                .and_then(|v| v.get("dra").cloned());
        }
        checks.push(erdma_doctor::agent_health::check(&args.agent_addr, answer));
    }
    checks.push(erdma_doctor::nri::check(
        &args.nri_socket.display().to_string(),
        args.nri_socket.exists(),
        nri_view.as_ref(),
    ));
    if let Some(c) = dra_check(dra_view.as_ref(), report.dra.as_ref()) {
        checks.push(c);
    }
    checks
}

/// `local.dra`, when this node runs the DRA driver (the agent's `/healthz` has `dra`) or has its
/// checkpoint: registration, the ResourceSlice, claims prepared per device.
pub fn dra_check(
    view: Option<&serde_json::Value>,
    local: Option<&devices::DraLocal>,
) -> Option<Check> {
    const ID: &str = "local.dra";
    let prepared = |m: &serde_json::Map<String, serde_json::Value>| {
        if m.is_empty() {
            "none".to_string()
        } else {
            m.iter()
                .map(|(d, n)| format!("{d}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    match (view, local) {
        (Some(v), _) => {
            let reg = v["registration"].as_str().unwrap_or("unknown");
            let slice = v["slice"].as_str().unwrap_or("unknown");
            let claims = v["prepared_claims"]
                .as_object()
                .map(prepared)
                .unwrap_or_else(|| "unknown".into());
            let msg = format!(
                "DRA driver {}: kubelet registration {reg}; ResourceSlice {slice}; claims prepared per device: {claims}",
                v["driver"].as_str().unwrap_or("erdma.alibabacloud.com")
            );
            if reg != "registered" {
                Some(Check::warn(
                    ID,
                    msg,
                    "the kubelet has not accepted the driver: check that the agent mounts /var/lib/kubelet/plugins_registry and /var/lib/kubelet/plugins (chart dra.enabled) and that the kubelet is 1.34+ (v1.DRAPlugin)",
                ))
            } else if !["created", "updated", "unchanged"]
                .iter()
                .any(|p| slice.starts_with(p))
            {
                Some(Check::warn(
                    ID,
                    msg,
                    "the ResourceSlice is not published: check the agent's RBAC for resource.k8s.io resourceslices (chart dra.enabled) and that the API server serves resource.k8s.io/v1",
                ))
            } else if let Some(dropped) = dropped_fields(v) {
                Some(Check::warn(
                    ID,
                    format!("{msg}; the API server dropped {dropped}"),
                    "turn those feature gates on in kube-apiserver's --feature-gates (and kube-scheduler's, kube-controller-manager's; on by default from Kubernetes 1.36): without DRAConsumableCapacity each device is allocated whole to one claim, without DRADeviceTaints an unhealthy device stays allocatable; the agent writes the slice again within 5 minutes",
                ))
            } else {
                Some(Check::pass(ID, msg))
            }
        }
        (None, Some(l)) => {
            let claims: Vec<String> = l
                .prepared
                .iter()
                .map(|(d, c)| format!("{d}: {}", c.len()))
                .collect();
            Some(Check::info(
                ID,
                format!(
                    "DRA checkpoint {}: claims prepared per device: {}{}",
                    l.checkpoint,
                    if claims.is_empty() {
                        "none".into()
                    } else {
                        claims.join(", ")
                    },
                    l.error
                        .as_ref()
                        .map(|e| format!(" (unreadable: {e})"))
                        .unwrap_or_default()
                ),
                "the agent's /healthz was not read (--agent-addr); it shows the registration and the ResourceSlice",
            ))
        }
        (None, None) => None,
    }
}

/// The `/healthz` `dra.dropped_fields` as `field (gate) on devices; …`, or `None` when empty.
fn dropped_fields(v: &serde_json::Value) -> Option<String> {
    let list = v["dropped_fields"].as_array().filter(|l| !l.is_empty())?;
    Some(
        list.iter()
            .map(|d| {
                let devices: Vec<&str> = d["devices"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|x| x.as_str())
                    .collect();
                format!(
                    "{} ({} off) on {}",
                    d["field"].as_str().unwrap_or("?"),
                    d["feature_gate"].as_str().unwrap_or("?"),
                    devices.join(", ")
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    )
}

/// What the agent's `/usage` says of `pod` (`namespace/name`).
pub fn usage_view(u: &NodeUsage, pod: &str) -> Option<PodUsageView> {
    let p = u.pod(pod)?;
    let mut v = PodUsageView {
        containers_seen: p.containers.len(),
        ..Default::default()
    };
    for d in &p.devices {
        if d.allocated {
            v.allocated.push(d.device.clone());
        }
        let c = &d.counts;
        v.qps += c.qps;
        v.qps_rts += c.qps_by_state.get("RTS").copied().unwrap_or(0);
        v.mr_bytes += c.mr_bytes;
        v.objects |= c.qps + c.mrs + c.cqs + c.pds > 0;
    }
    Some(v)
}

/// What the agent's `/usage` says of the SMC connections of `pod`, with the kernel's `smc`
/// queue pairs on the devices of its links.
pub fn smc_view(u: &NodeUsage, pod: &str) -> smc_usage::Answer {
    let Some(p) = u.pod(pod) else {
        return smc_usage::Answer::NotListed;
    };
    let Some(s) = &p.smc else {
        return smc_usage::Answer::NoSummary;
    };
    let mut link_groups = std::collections::BTreeMap::new();
    for o in &u.others {
        if o.kind == OtherKind::Kernel
            && o.owners.iter().any(|w| w == "smc")
            && s.devices.contains(&o.device)
        {
            link_groups.insert(o.device.clone(), o.counts.qps_by_state.clone());
        }
    }
    smc_usage::Answer::Summary(smc_usage::SmcView {
        error: s.error.clone(),
        smcr: s.smcr,
        smcd: s.smcd,
        fallback_tcp: s.fallback_tcp,
        listening: s.listening,
        reasons: s
            .fallback_reasons
            .iter()
            .map(|r| smc_usage::Reason {
                label: r.label(),
                name: r.name.clone(),
                peer: r.peer.clone(),
                meaning: r.meaning.clone(),
                connections: r.connections,
            })
            .collect(),
        devices: s.devices.clone(),
        link_groups,
    })
}

/// `pod.rdma_usage`: the pod's usage from its node's agent (through the pod proxy), judged with
/// its log; and `pod.smcr.connections` for a pod that asks for SMC-R, from the same answer.
async fn usage_checks(client: &kube::Client, inputs: &cluster::UsageInputs) -> Vec<Check> {
    let usage = match &inputs.agent {
        Some(a) => {
            top::usage_proxy(
                client,
                a.metadata.namespace.as_deref().unwrap_or("default"),
                a.metadata.name.as_deref().unwrap_or_default(),
                top::agent_port(a),
            )
            .await
        }
        None => Err(format!("no erdma agent pod runs on node {}", inputs.node)),
    };
    let mut out = vec![erdma_doctor::usage::check(&Evidence {
        pod: &inputs.pod,
        node: &inputs.node,
        held: &inputs.held,
        usage: usage
            .as_ref()
            .map(|u| usage_view(u, &inputs.pod))
            .map_err(Clone::clone),
        log: inputs.log.as_deref().map_err(Clone::clone),
        ib_hca: inputs.ib_hca.as_deref(),
    })];
    if inputs.smcr {
        out.push(smc_usage::check(&smc_usage::Evidence {
            pod: &inputs.pod,
            node: &inputs.node,
            usage: usage.map(|u| smc_view(&u, &inputs.pod)),
        }));
    }
    out
}

/// Runs the command: exit 0 when nothing failed, 1 when a check failed (or warned, with
/// `--strict`); see [`crate::exit::DOCTOR`].
/// `--agent-addr` as the help says: `HOST:PORT` (a name such as `localhost` is resolved), or
/// `off`. Anything else is a usage error, not a warning.
fn agent_addr(value: &str) -> anyhow::Result<Option<std::net::SocketAddr>> {
    use std::net::ToSocketAddrs;
    if value == "off" {
        return Ok(None);
    }
    let resolved = value
        .to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("--agent-addr {value:?} is not HOST:PORT ({e}); e.g. 127.0.0.1:9101, localhost:9101 or off"))?
        .next();
    resolved
        .map(Some)
        .ok_or_else(|| anyhow::anyhow!("--agent-addr {value:?} resolves to no address"))
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let local = args.local || (args.node.is_none() && args.pod.is_none());
    let agent = if local {
        agent_addr(&args.agent_addr)?
    } else {
        None
    };
    let mut targets = Vec::new();
    let mut checks = Vec::new();
    if args.node.is_some() || args.pod.is_some() {
        let rt = runtime()?;
        rt.block_on(async {
            let client = kube_client(&args.kube).await?;
            if let Some(node) = &args.node {
                targets.push(format!("node/{node}"));
                checks.extend(
                    cluster::node_checks(&client, node, args.agent_selector.as_deref()).await?,
                );
            }
            if let Some(pod) = &args.pod {
                let ns = args
                    .namespace
                    .clone()
                    .unwrap_or_else(|| client.default_namespace().to_string());
                targets.push(format!("pod/{ns}/{pod}"));
                let exec = KubectlExec { kube: &args.kube };
                let target = PodTarget {
                    namespace: &ns,
                    name: pod,
                    peer: args.peer.as_deref(),
                    agent_selector: args.agent_selector.as_deref(),
                };
                let exec: Option<&dyn Exec> = if args.exec { Some(&exec) } else { None };
                checks.extend(cluster::pod_checks(&client, &target, exec).await?);
                if let Some(inputs) = cluster::usage_inputs(&client, &target).await? {
                    let proxy = kube_client_with_retry(&args.kube, false).await?;
                    checks.extend(usage_checks(&proxy, &inputs).await);
                }
            }
            anyhow::Ok(())
        })?;
    }
    if local {
        targets.push("local".into());
        checks.extend(local_checks(args, agent));
    }
    let report = Report::new(targets.join(" "), checks);
    match args.output {
        Format::Table => crate::output::emit(&report.to_text())?,
        f => crate::output::emit(&output::render(&report, f)?)?,
    }
    Ok(ExitCode::from(report.exit_status(args.strict)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use erdma_doctor::check::Status;

    #[test]
    fn dra_state_from_the_agent_healthz() {
        let ok = serde_json::json!({"driver": "erdma.alibabacloud.com", "registration": "registered",
            "slice": "unchanged generation 2", "prepared_claims": {"erdma-0": 2}});
        let c = dra_check(Some(&ok), None).expect("check");
        assert_eq!(c.status, Status::Pass);
        assert!(c.message.contains("erdma-0: 2"), "{}", c.message);
        let gates_off = serde_json::json!({"driver": "erdma.alibabacloud.com", "registration": "registered",
            "slice": "created generation 1", "prepared_claims": {},
            "dropped_fields": [{"field": "allowMultipleAllocations", "feature_gate": "DRAConsumableCapacity",
                "devices": ["erdma-0", "erdma-1"]}]});
        let c = dra_check(Some(&gates_off), None).expect("check");
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.message.contains(
                "the API server dropped allowMultipleAllocations (DRAConsumableCapacity off) on erdma-0, erdma-1"
            ),
            "{}",
            c.message
        );
        let unpublished = serde_json::json!({"registration": "registered",
            "slice": "list ResourceSlices: forbidden", "prepared_claims": {}});
        let c = dra_check(Some(&unpublished), None).expect("check");
        assert_eq!(c.status, Status::Warn);
        assert!(c.hint.unwrap_or_default().contains("RBAC"));
        let pending =
            serde_json::json!({"registration": "pending", "slice": "created generation 1"});
        assert_eq!(
            dra_check(Some(&pending), None).expect("check").status,
            Status::Warn
        );
        assert!(
            dra_check(None, None).is_none(),
            "nothing on a device-plugin node"
        );
    }
}
