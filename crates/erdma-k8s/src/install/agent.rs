//! The agent's DaemonSet: its flags from the values, host paths, capabilities and probes.

use super::*;
use k8s_openapi::api::core::v1::AppArmorProfile;

/// The agent's arguments (the original's flag names, then the port its probes use and, where the
/// agent reads the CRI, an explicit `agent.criSocket`), then `agent.extraArgs` as given.
/// `--exposed-local-eris` only where it applies: local discovery, or `agent.filterClusterERIs`.
pub fn agent_args(v: &Values) -> Vec<String> {
    let a = &v.agent;
    let mut args = Vec::new();
    if !a.prefer_driver.is_empty() {
        args.push(format!("--prefer-driver={}", a.prefer_driver));
    }
    if a.allocate_all_devices {
        args.push("--allocate-all-devices".into());
    }
    if a.jumbo_frame_mtu != 0 {
        args.push(format!("--jumbo-frame-mtu={}", a.jumbo_frame_mtu));
    }
    if !a.exposed_local_eris.is_empty() && (v.config.local_eri_discovery || a.filter_cluster_eris) {
        args.push(format!(
            "--exposed-local-eris={}",
            a.exposed_local_eris.join(",")
        ));
    }
    if a.filter_cluster_eris {
        args.push("--filter-cluster-eris".into());
    }
    if v.config.local_eri_discovery {
        args.push("--local-eri-discovery".into());
    }
    if v.dra.enabled {
        args.push("--resource-api=node-label".into());
    }
    if !a.rdma_usage.enabled {
        args.push("--rdma-usage=false".into());
    }
    if agent_prestart(v) {
        args.push("--deviceplugin-prestart-container".into());
    }
    if agent_reads_cri(v) && !a.cri_socket.is_empty() {
        args.push(format!("--cri-socket={}", a.cri_socket));
    }
    let di = &a.driver_installer;
    for (flag, value) in [
        ("--erdma-installer-version", &di.version),
        ("--driver-installer-sha256", &di.sha256),
        ("--gpu-installer-sha256", &di.gpu_sha256),
        ("--driver-installer-base-url", &di.base_url),
    ] {
        if !value.is_empty() {
            args.push(format!("{flag}={value}"));
        }
    }
    if di.allow_insecure_download {
        args.push("--allow-insecure-driver-download".into());
    }
    if a.nri != "auto" {
        args.push(format!("--nri={}", a.nri));
    }
    if a.nri_memlock != "unlimited" {
        args.push(format!("--nri-memlock={}", a.nri_memlock));
    }
    if !a.nri_rdma_max.trim().is_empty() {
        args.push(format!("--nri-rdma-max={}", a.nri_rdma_max.trim()));
    }
    args.push("--dev-root=/host/dev".into());
    args.push(format!("--metrics-addr=0.0.0.0:{}", a.metrics_port));
    let root = v.kubelet_root();
    if root != DEFAULT_KUBELET_ROOT {
        args.push(format!("--kubelet-dir={root}/device-plugins"));
        args.push(format!(
            "--pod-resources-socket={root}/pod-resources/kubelet.sock"
        ));
        if v.dra.enabled {
            args.push(format!("--kubelet-root-dir={root}"));
        }
    }
    args.extend(log_args(v));
    args.extend(a.extra_args.iter().cloned());
    args
}

/// The agent's `/metrics` and `/healthz` port (`--metrics-addr`, the agent's default port).
pub const AGENT_METRICS_PORT: i32 = 9101;

/// The kubelet's default root directory (`kubeletRootDir`).
pub const DEFAULT_KUBELET_ROOT: &str = "/var/lib/kubelet";

/// Where the agent's CRI client looks without `agent.criSocket` (containerd, the ACK default).
pub const DEFAULT_CRI_SOCKET_DIR: &str = "/run/containerd";

/// One host path of the agent. Each is justified in `docs/operations.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentHostPath {
    /// Volume name.
    pub volume: &'static str,
    /// Path on the host.
    pub host_path: String,
    /// hostPath `type`.
    pub kind: &'static str,
    /// Path in the agent container.
    pub mount_path: String,
    /// Mounted read-only.
    pub read_only: bool,
    /// `mountPropagation` (`None`: the default, no propagation).
    pub propagation: Option<&'static str>,
}

impl AgentHostPath {
    fn same(volume: &'static str, path: &str, kind: &'static str, read_only: bool) -> Self {
        AgentHostPath {
            volume,
            host_path: path.into(),
            kind,
            mount_path: path.into(),
            read_only,
            propagation: None,
        }
    }
}

/// Whether the agent runs the SMC-R pre-start hook (`--deviceplugin-prestart-container`):
/// always. The original chart turned it off with the webhook, whose privileged `smcr-init` did
/// the work; erdma's webhook injects an unprivileged `smcr-init` that only checks what the agent
/// configured before it started.
pub(super) fn agent_prestart(_: &Values) -> bool {
    true
}

/// Whether the agent talks to the runtime over CRI: the SMC-R pre-start hook (webhook off), and
/// per-pod RDMA usage, which names the pods its processes belong to from the runtime's sandboxes.
pub(super) fn agent_reads_cri(v: &Values) -> bool {
    agent_prestart(v) || v.agent.rdma_usage.enabled
}

/// The directory holding the CRI socket the agent uses (see [`agent_reads_cri`]).
pub(super) fn cri_socket_dir(v: &Values) -> String {
    std::path::Path::new(&v.agent.cri_socket)
        .parent()
        .map(|p| p.display().to_string())
        .filter(|p| !v.agent.cri_socket.is_empty() && !p.is_empty())
        .unwrap_or_else(|| DEFAULT_CRI_SOCKET_DIR.to_string())
}

/// The agent's host paths, in volume order.
///
/// Not mounted on purpose: `/lib/modules` (kmod runs in the host's mount namespace through
/// `setns`, so it reads the host's own `/lib/modules`), `/sys` (the container's sysfs is the
/// host's: sysfs is global except for net devices, and the pod is `hostNetwork`; read-only is
/// enough for the inventory), `/var/run` as a whole (it would carry the ServiceAccount token's
/// mount point into the host's `/run`).
pub fn agent_host_paths(v: &Values) -> Vec<AgentHostPath> {
    let root = v.kubelet_root();
    let mut p = vec![
        AgentHostPath::same(
            "device-plugins",
            &format!("{root}/device-plugins"),
            "DirectoryOrCreate",
            false,
        ),
        AgentHostPath::same(
            "pod-resources",
            &format!("{root}/pod-resources"),
            "DirectoryOrCreate",
            true,
        ),
        AgentHostPath {
            volume: "host-dev",
            host_path: "/dev".into(),
            kind: "Directory",
            mount_path: "/host/dev".into(),
            read_only: true,
            propagation: None,
        },
    ];
    if v.agent.nri != "off" {
        // The runtime's NRI socket (its directory only, never all of /var/run).
        p.push(AgentHostPath::same(
            "nri",
            "/var/run/nri",
            "DirectoryOrCreate",
            true,
        ));
    }
    if agent_reads_cri(v) {
        let cri = cri_socket_dir(v);
        let kind = if cri == DEFAULT_CRI_SOCKET_DIR {
            "DirectoryOrCreate"
        } else {
            "Directory"
        };
        p.push(AgentHostPath::same("cri-socket", &cri, kind, true));
    }
    if agent_prestart(v) {
        p.push(AgentHostPath {
            propagation: Some("HostToContainer"),
            ..AgentHostPath::same("netns", "/var/run/netns", "DirectoryOrCreate", true)
        });
        p.push(AgentHostPath::same(
            "bpffs",
            "/sys/fs/bpf",
            "Directory",
            false,
        ));
    }
    if v.dra.enabled {
        p.push(AgentHostPath::same(
            "plugins-registry",
            &format!("{root}/plugins_registry"),
            "DirectoryOrCreate",
            false,
        ));
        p.push(AgentHostPath::same(
            "kubelet-plugins",
            &format!("{root}/plugins"),
            "DirectoryOrCreate",
            false,
        ));
        p.push(AgentHostPath::same(
            "cdi",
            "/var/run/cdi",
            "DirectoryOrCreate",
            false,
        ));
    }
    p
}

/// Linux capabilities added to the runtime's default set (not privileged). Why each: see
/// `docs/operations.md`.
pub const AGENT_CAPABILITIES: [&str; 5] = [
    "SYS_MODULE",
    "SYS_ADMIN",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "NET_ADMIN",
];

/// Capabilities dropped from the runtime's default set: nothing in the agent (or the host
/// commands it runs) opens raw IP or packet sockets; netlink sockets need no `NET_RAW`.
pub const AGENT_DROPPED_CAPABILITIES: [&str; 1] = ["NET_RAW"];

pub(super) fn agent_probe(period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/healthz".into()),
            port: IntOrString::String("metrics".into()),
            ..Default::default()
        }),
        initial_delay_seconds: Some(5),
        period_seconds: Some(period),
        timeout_seconds: Some(5),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

/// The pod annotation that set a container's AppArmor profile before Kubernetes 1.30 (beta),
/// naming the agent's container.
pub const APPARMOR_BETA_ANNOTATION: &str =
    "container.apparmor.security.beta.kubernetes.io/alibabacloud-erdma-controller";

/// The agent container's securityContext: `agent.securityContext`, with `agent.appArmorProfile`
/// as its `appArmorProfile` where the cluster has the field (Kubernetes 1.30+).
fn agent_security_context(v: &Values, cluster: &Cluster) -> Option<SecurityContext> {
    let profile = &v.agent.app_armor_profile;
    let mut sc = v.agent.security_context.clone().unwrap_or_default();
    if !profile.is_empty() && cluster.at_least(1, 30) {
        sc.app_armor_profile = Some(AppArmorProfile {
            type_: profile.clone(),
            localhost_profile: None,
        });
    }
    some_nonempty(&Some(sc))
}

/// The agent pods' metadata: [`pod_meta`], and before Kubernetes 1.30 the beta annotation for
/// `agent.appArmorProfile` (an API server that knows both refuses them when they disagree, so
/// never both).
fn agent_pod_meta(v: &Values, cluster: &Cluster) -> ObjectMeta {
    let mut m = pod_meta(v, "agent");
    let profile = v.agent.app_armor_profile.as_str();
    if !profile.is_empty() && !cluster.at_least(1, 30) {
        let value = if profile == "Unconfined" {
            "unconfined"
        } else {
            "runtime/default"
        };
        m.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(APPARMOR_BETA_ANNOTATION.into(), value.into());
    }
    m
}

pub(super) fn agent_daemonset(v: &Values, cluster: &Cluster) -> Result<DaemonSet, Error> {
    let paths = agent_host_paths(v);
    let a = &v.agent;
    let container = Container {
        name: CONTAINER_NAME.into(),
        image: Some(v.agent.image.reference("agent")?),
        image_pull_policy: Some(v.agent.image.pull_policy.clone()),
        args: Some(agent_args(v)),
        env: Some(
            std::iter::once(field_env("NODE_NAME", "spec.nodeName"))
                .chain(a.extra_env.iter().cloned())
                .collect(),
        ),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: a.metrics_port,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        // `/healthz` answers 200 while the agent's HTTP server runs, whatever the driver, ERI
        // source or kubelet state (those are in its JSON body, the node condition and Events).
        liveness_probe: Some(agent_probe(20, 3)),
        readiness_probe: Some(agent_probe(10, 3)),
        security_context: agent_security_context(v, cluster),
        resources: Some(
            v.resources
                .clone()
                .filter(|r| *r != ResourceRequirements::default())
                .unwrap_or_else(|| ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".to_string(), Quantity("50m".into())),
                        ("memory".to_string(), Quantity("64Mi".into())),
                    ])),
                    // The agent's peak is about 10 MiB (docs/performance.md).
                    limits: Some(BTreeMap::from([(
                        "memory".to_string(),
                        Quantity("256Mi".into()),
                    )])),
                    ..Default::default()
                }),
        ),
        volume_mounts: Some(
            paths
                .iter()
                .map(|h| VolumeMount {
                    mount_propagation: h.propagation.map(str::to_string),
                    ..mount(h.volume, &h.mount_path, h.read_only)
                })
                .chain(a.extra_volume_mounts.iter().cloned())
                .collect(),
        ),
        ..Default::default()
    };
    Ok(DaemonSet {
        metadata: meta(AGENT_NAME, Some(&v.namespace), labels(v, "agent")),
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(selector(v, "agent")),
                ..Default::default()
            },
            update_strategy: some_nonempty(&a.update_strategy),
            template: PodTemplateSpec {
                metadata: Some(agent_pod_meta(v, cluster)),
                spec: Some(PodSpec {
                    service_account_name: Some(v.agent_sa()),
                    image_pull_secrets: non_empty(&v.agent.image_pull_secrets),
                    affinity: some_affinity(&v.affinity),
                    host_network: Some(true),
                    host_pid: Some(true),
                    dns_policy: Some("ClusterFirstWithHostNet".into()),
                    priority_class_name: (!a.priority_class_name.is_empty())
                        .then(|| a.priority_class_name.clone()),
                    node_selector: non_empty_map(&v.node_selector),
                    tolerations: non_empty(&v.tolerations),
                    containers: vec![container],
                    volumes: Some(
                        paths
                            .iter()
                            .map(|h| host_path(h.volume, &h.host_path, h.kind))
                            .chain(a.extra_volumes.iter().cloned())
                            .collect(),
                    ),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The DeviceClass of the DRA driver: every device of `erdma.alibabacloud.com`, and requests for
/// the extended resource `aliyun/erdma` (KEP-5004) on nodes where DRA serves it.
pub fn dra_device_class(v: &Values) -> DeviceClass {
    DeviceClass {
        metadata: meta(DRA_DRIVER, None, labels(v, "agent")),
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: format!("device.driver == \"{DRA_DRIVER}\""),
                }),
            }]),
            extended_resource_name: Some(DRA_EXTENDED_RESOURCE.into()),
            config: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent_template(v: &Values, cluster: &Cluster) -> PodTemplateSpec {
        agent_daemonset(v, cluster)
            .expect("agent")
            .spec
            .expect("spec")
            .template
    }

    /// Before Kubernetes 1.30 the profile is the beta annotation naming the agent's container
    /// (the API server refuses one naming a container the pod does not have); from 1.30 the
    /// securityContext field; never both.
    #[test]
    fn the_apparmor_profile_is_the_annotation_before_1_30_and_the_field_from_1_30() {
        let v = Values::default();
        let old = agent_template(&v, &Cluster::with((1, 29), &[]));
        let ann = old.metadata.and_then(|m| m.annotations).unwrap_or_default();
        assert_eq!(
            ann.get("container.apparmor.security.beta.kubernetes.io/alibabacloud-erdma-controller")
                .map(String::as_str),
            Some("unconfined")
        );
        let old_spec = old.spec.expect("pod");
        assert_eq!(old_spec.containers[0].name, "alibabacloud-erdma-controller");
        let old_sc = old_spec.containers[0].security_context.clone().expect("sc");
        assert_eq!(old_sc.app_armor_profile, None);
        assert_eq!(old_sc.read_only_root_filesystem, Some(true));

        let new = agent_template(&v, &Cluster::with((1, 30), &[]));
        assert!(new.metadata.and_then(|m| m.annotations).is_none());
        let sc = new.spec.expect("pod").containers[0]
            .security_context
            .clone()
            .expect("sc");
        assert_eq!(
            sc.app_armor_profile.map(|p| p.type_).as_deref(),
            Some("Unconfined")
        );
        assert_eq!(
            sc.seccomp_profile.map(|p| p.type_).as_deref(),
            Some("RuntimeDefault")
        );

        let mut runtime = Values::default();
        runtime.agent.app_armor_profile = "RuntimeDefault".into();
        let ann = agent_template(&runtime, &Cluster::with((1, 29), &[]))
            .metadata
            .and_then(|m| m.annotations)
            .unwrap_or_default();
        assert_eq!(ann.values().collect::<Vec<_>>(), ["runtime/default"]);
        let mut none = Values::default();
        none.agent.app_armor_profile = String::new();
        for version in [(1, 29), (1, 30)] {
            let t = agent_template(&none, &Cluster::with(version, &[]));
            assert!(t.metadata.and_then(|m| m.annotations).is_none());
            let sc = t.spec.expect("pod").containers[0].security_context.clone();
            assert_eq!(sc.and_then(|s| s.app_armor_profile), None);
        }
        let mut bad = Values::default();
        bad.agent.app_armor_profile = "localhost/erdma".into();
        let e = bad.validate().expect_err("refused").to_string();
        assert!(
            e.contains("agent.appArmorProfile") && e.contains("RuntimeDefault"),
            "{e}"
        );
    }

    #[test]
    fn the_agent_has_a_memory_limit_unless_resources_are_given() {
        let ds = agent_daemonset(&Values::default(), &Cluster::offline()).expect("agent");
        let c = &ds
            .spec
            .expect("spec")
            .template
            .spec
            .expect("pod")
            .containers[0];
        let limits = c
            .resources
            .clone()
            .and_then(|r| r.limits)
            .unwrap_or_default();
        assert_eq!(limits.get("memory").map(|q| q.0.as_str()), Some("256Mi"));
    }
}
