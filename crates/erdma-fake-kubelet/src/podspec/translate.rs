//! A Pod's spec as the kubelet turns it into CRI requests (`pkg/kubelet/kuberuntime`:
//! `generatePodSandboxConfig`, `generateContainerConfig`, `determineEffectiveSecurityContext`,
//! `generateLinuxContainerResources`; `pkg/kubelet/kubelet_pods.go`: `makeEnvironmentVariables`,
//! `makeMounts`; `pkg/apis/core/v1/helper/qos`: `GetPodQOS`), for a pod of one app container and
//! its init containers. [`PodPlan::new`] checks the whole spec first and refuses what the lab
//! kubelet cannot do (naming the field, the value and the fix), so nothing is allocated or
//! created for a pod that cannot run.

use super::atomic::FileProjection;
use super::expand::expand;
use super::images::{self, PullPolicy};
use super::manifest::ManifestPod;
use super::objects::{self, ApiObjects};
use super::probe::{self, Probes};
use super::quantity::Quantity;
use super::volumes::{self, HostPathType};
use crate::client::AllocationOutput;
use crate::error::{FakeKubeletError, Result};
use erdma_cri::runtime::v1 as cri;
use erdma_cri::{LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID};
use k8s_openapi::api::core::v1::{Container, PodSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Container label with the container name.
const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";

/// The node the pod runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// `spec.nodeName`.
    pub name: String,
    /// The node's IP: `status.hostIP`, and the pod IP of a host-network pod.
    pub ip: String,
    /// Allocatable CPU in millicores (a limit the container does not set, for the downward API).
    pub cpu_millis: i64,
    /// Allocatable and total memory in bytes (the downward API's default limit, and the memory
    /// capacity of the kubelet's OOM score rule).
    pub memory_bytes: i64,
    /// The kubelet's cgroup driver (the form of the pod's cgroup parent).
    pub cgroup_driver: CgroupDriver,
}

/// The `/proc` paths the kubelet asks the runtime to mask, for the default `procMount`.
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// The `/proc` paths the kubelet asks the runtime to make read-only, for the default
/// `procMount`.
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The note for the service-account token the API server's admission would add.
pub const SERVICE_ACCOUNT_NOTE: &str = "not mounted (no API server)";

/// A volume the pod gets on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumePlan {
    /// `hostPath`: checked by type before the sandbox.
    HostPath {
        /// The volume's name.
        name: String,
        /// `hostPath.path`.
        path: PathBuf,
        /// `hostPath.type`.
        ty: HostPathType,
    },
    /// `emptyDir` (disk): a new directory of the pod.
    EmptyDir {
        /// The volume's name.
        name: String,
    },
    /// A volume of files the kubelet writes with its atomic writer (`configMap`, `secret`,
    /// `projected`, `downwardAPI`), read-only in every container.
    Files {
        /// The volume's name.
        name: String,
        /// `configMap`, `secret`, `projected` or `downwardAPI`.
        kind: &'static str,
        /// Where the content came from (`ConfigMap kube-system/x`), for the record.
        from: String,
        /// The files: path in the volume to content and mode.
        payload: BTreeMap<String, FileProjection>,
    },
}

impl VolumePlan {
    /// The volume's name.
    pub fn name(&self) -> &str {
        match self {
            VolumePlan::HostPath { name, .. }
            | VolumePlan::EmptyDir { name }
            | VolumePlan::Files { name, .. } => name,
        }
    }
}

/// A `volumeMount` of the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPlan {
    /// The volume.
    pub volume: String,
    /// `mountPath`.
    pub container_path: String,
    /// `subPath` (empty: the whole volume).
    pub sub_path: String,
    /// `readOnly`.
    pub read_only: bool,
    /// `mountPropagation`.
    pub propagation: cri::MountPropagation,
}

/// Where an env variable's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum EnvSource {
    /// `value`, with `$(VAR)` references to the variables before it.
    Value(String),
    /// Known now (a resource of the container, or a pod field that does not depend on the IP).
    Fixed(String),
    /// `status.podIP` / `status.podIPs`: known once the sandbox has its IP.
    PodIp,
}

/// The container's CPU and memory after the API server's defaulting (a request defaults to
/// its limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    /// Requested millicores.
    pub cpu_request: Option<i64>,
    /// Millicore limit.
    pub cpu_limit: Option<i64>,
    /// Requested bytes.
    pub memory_request: Option<i64>,
    /// Byte limit.
    pub memory_limit: Option<i64>,
}

/// One container of the pod (an init container or the app container), checked.
#[derive(Debug, Clone)]
pub struct ContainerPlan {
    /// The container as the spec has it.
    pub container: Container,
    /// Where the spec has it: `spec.containers[0]`, `spec.initContainers[1]`.
    pub field: String,
    /// An init container (run to completion before the app container).
    pub init: bool,
    /// Its image reference.
    pub image: String,
    /// Its pull policy.
    pub pull_policy: PullPolicy,
    /// Its CPU and memory.
    pub resources: Resources,
    /// The one extended resource of its limits and the count (`aliyun/erdma`, 2).
    pub extended: Option<(String, usize)>,
    /// Its mounts, in spec order.
    pub mounts: Vec<MountPlan>,
    /// Its `envFrom` variables, in the order the kubelet sets them (sources in order, keys
    /// sorted), before `env`.
    env_from: Vec<(String, String)>,
    env: Vec<(String, EnvSource)>,
}

impl ContainerPlan {
    /// Checks container `c`, found at `field`, on its own (its image, pull policy, fields the
    /// lab kubelet refuses, resources); its mounts and env are planned with the pod's volumes.
    fn check(
        c: &Container,
        field: String,
        init: bool,
        refuse: &impl Fn(&str, String) -> FakeKubeletError,
        notes: &mut BTreeMap<String, String>,
    ) -> Result<ContainerPlan> {
        if c.name.is_empty() {
            return Err(refuse(&format!("{field}.name"), "is empty".into()));
        }
        let image = c.image.clone().filter(|i| !i.is_empty()).ok_or_else(|| {
            refuse(
                &format!("{field}.image"),
                "is empty. Fix: name the image".into(),
            )
        })?;
        let pull_policy = images::pull_policy(&image, c.image_pull_policy.as_deref())
            .map_err(|e| refuse(&format!("{field}.imagePullPolicy"), e))?;
        check_container(c, &field, refuse, notes)?;
        let (resources, extended) = resources(c, &field, refuse)?;
        Ok(ContainerPlan {
            container: c.clone(),
            field,
            init,
            image,
            pull_policy,
            resources,
            extended,
            mounts: Vec::new(),
            env_from: Vec::new(),
            env: Vec::new(),
        })
    }

    /// The container's name.
    pub fn name(&self) -> &str {
        &self.container.name
    }

    fn privileged(&self) -> bool {
        self.container
            .security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false)
    }
}

/// The pod's QoS class (`GetPodQOS`), from the CPU and memory of all its containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    /// Every container has CPU and memory limits, and requests equal to them.
    Guaranteed,
    /// Some container requests or limits CPU or memory, not all as for `Guaranteed`.
    Burstable,
    /// No container requests or limits CPU or memory.
    BestEffort,
}

/// How the node's kubelet and runtime manage cgroups (the kubelet's `--cgroup-driver`, which
/// must match the runtime's: containerd's `SystemdCgroup`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CgroupDriver {
    /// The kubelet and runc write the cgroup file system themselves.
    #[default]
    Cgroupfs,
    /// systemd owns the cgroups: pods are slices, containers transient scopes runc asks systemd
    /// for over D-Bus.
    Systemd,
}

/// The pod's cgroup, the sandbox's `cgroup_parent`, as the kubelet names it
/// (`pkg/kubelet/cm`: `GetPodContainerName` turns the name `kubepods[/burstable|/besteffort]/
/// pod<UID>` into the driver's form).
///
/// cgroupfs: `/kubepods/pod<UID>` for a Guaranteed pod, `/kubepods/burstable/pod<UID>` and
/// `/kubepods/besteffort/pod<UID>` for the others; containerd puts each container's cgroup right
/// below it (`<parent>/<container id>`).
///
/// systemd (`CgroupName.ToSystemd`): every component's `-` becomes `_` (systemd reads `-` as
/// nesting), the components are joined with `-` into one slice name, and the slice is expanded
/// into its path: `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<UID_>.slice`.
/// containerd takes the last element as the scope's slice (`cri-containerd-<id>.scope` in it).
///
/// Either way a process's `/proc/<pid>/cgroup` names its pod's UID as on a kubelet's node (what
/// the agent's usage attribution reads).
pub fn pod_cgroup_parent(driver: CgroupDriver, qos: QosClass, uid: &str) -> String {
    let qos_part = match qos {
        QosClass::Guaranteed => None,
        QosClass::Burstable => Some("burstable"),
        QosClass::BestEffort => Some("besteffort"),
    };
    match driver {
        CgroupDriver::Cgroupfs => match qos_part {
            None => format!("/kubepods/pod{uid}"),
            Some(q) => format!("/kubepods/{q}/pod{uid}"),
        },
        CgroupDriver::Systemd => {
            let mut parts = vec!["kubepods".to_string()];
            parts.extend(qos_part.map(str::to_string));
            parts.push(format!("pod{}", uid.replace('-', "_")));
            // each slice's path holds every shorter prefix as its parent slice
            let mut path = String::new();
            for n in 1..=parts.len() {
                path.push('/');
                path.push_str(&parts[..n].join("-"));
                path.push_str(".slice");
            }
            path
        }
    }
}

/// A checked pod, ready to be turned into CRI requests.
#[derive(Debug, Clone)]
pub struct PodPlan {
    /// Where the pod came from.
    pub source: String,
    /// The pod's metadata (labels and annotations of its template).
    pub meta: ObjectMeta,
    /// The pod's spec, with `spec.nodeName` and the service account defaulted.
    pub spec: PodSpec,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// The app container.
    pub app: ContainerPlan,
    /// The init containers, in the order they run.
    pub init_containers: Vec<ContainerPlan>,
    /// The pod's volumes, in spec order (the service-account token volume left out).
    pub volumes: Vec<VolumePlan>,
    /// The app container's probes.
    pub probes: Probes,
    /// What the lab does differently from a kubelet with an API server.
    pub notes: BTreeMap<String, String>,
    /// The service variables every container gets (with an API server: the `kubernetes`
    /// service and, with `enableServiceLinks`, the namespace's services).
    pub service_env: Vec<(String, String)>,
    node: NodeInfo,
}

/// What the container config needs beyond the plan: known after admission, volume setup, the
/// sandbox and the image check.
#[derive(Debug, Clone, Copy)]
pub struct ContainerInputs<'a> {
    /// The pod IP (the node's for a host-network pod).
    pub pod_ip: &'a str,
    /// The image ID from `ImageStatus`.
    pub image_id: &'a str,
    /// The image's numeric user, if any.
    pub image_uid: Option<i64>,
    /// The image's user name when it is not numeric.
    pub image_username: &'a str,
    /// The device plugin's Allocate response.
    pub allocation: Option<&'a AllocationOutput>,
    /// Each volume's path on the node.
    pub volume_paths: &'a BTreeMap<String, PathBuf>,
}

/// The type of a volume as the spec names it (`configMap`, `secret`, ...).
fn volume_type(v: &Volume) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(o)) => o
            .keys()
            .filter(|k| k.as_str() != "name")
            .cloned()
            .collect::<Vec<_>>()
            .join(", "),
        _ => "unknown".into(),
    }
}

fn is_service_account_volume(v: &Volume) -> bool {
    v.name.starts_with("kube-api-access-") && v.projected.is_some()
}

/// Truncates a hostname as the kubelet does: at most 63 characters, no trailing `-` or `.`.
fn truncate_hostname(h: &str) -> String {
    let t: String = h.chars().take(63).collect();
    t.trim_end_matches(['-', '.']).to_string()
}

/// The kubelet's `MilliCPUToShares`.
pub fn milli_cpu_to_shares(milli: i64) -> i64 {
    if milli == 0 {
        return 2;
    }
    (milli.saturating_mul(1024) / 1000).clamp(2, 262_144)
}

/// The kubelet's `milliCPUToQuota` for `period` microseconds.
pub fn milli_cpu_to_quota(milli: i64, period: i64) -> i64 {
    if milli == 0 {
        return 0;
    }
    (milli.saturating_mul(period) / 1000).max(1000)
}

/// The CFS period the kubelet uses (100 ms, in microseconds).
pub const CPU_PERIOD_US: i64 = 100_000;

impl PodPlan {
    /// Checks `m` for node `node` and plans it with pod UID `uid`, for a kubelet without an API
    /// server (ConfigMap and Secret volumes and env are refused, the service account token is
    /// not mounted).
    pub fn new(m: ManifestPod, node: &NodeInfo, uid: String) -> Result<PodPlan> {
        Self::build(m, node, uid, None)
    }

    /// Checks and plans `m` as [`PodPlan::new`], for a kubelet with an API server that read
    /// `api` for it: ConfigMap, Secret and projected (service account token) volumes, env from
    /// ConfigMaps and Secrets, the service variables. The ServiceAccount admission
    /// (`podspec::serviceaccount::admit`) is applied to `m` before.
    pub fn with_api(
        m: ManifestPod,
        node: &NodeInfo,
        uid: String,
        api: &ApiObjects,
    ) -> Result<PodPlan> {
        Self::build(m, node, uid, Some(api))
    }

    fn build(
        m: ManifestPod,
        node: &NodeInfo,
        uid: String,
        api: Option<&ApiObjects>,
    ) -> Result<PodPlan> {
        let ManifestPod { source, pod, .. } = m;
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let who = format!("pod {namespace}/{name} ({source})");
        let refuse =
            |field: &str, msg: String| FakeKubeletError::Refused(format!("{who}: {field}: {msg}"));
        let meta = pod.metadata;
        let Some(mut spec) = pod.spec else {
            return Err(refuse("spec", "missing".into()));
        };
        spec.node_name = Some(node.name.clone());
        if spec
            .service_account_name
            .as_deref()
            .unwrap_or("")
            .is_empty()
        {
            spec.service_account_name = Some(
                spec.service_account
                    .clone()
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "default".into()),
            );
        }
        let mut notes = BTreeMap::new();
        check_pod_level(&spec, &refuse, &mut notes)?;
        let mut init_containers = Vec::new();
        for (i, c) in spec.init_containers.iter().flatten().enumerate() {
            let field = format!("spec.initContainers[{i}]");
            check_init_container(c, &field, &refuse)?;
            init_containers.push(ContainerPlan::check(c, field, true, &refuse, &mut notes)?);
        }
        let container = match spec.containers.as_slice() {
            [one] => one.clone(),
            [] => return Err(refuse("spec.containers", "the pod has no container".into())),
            many => {
                let names: Vec<&str> = many.iter().map(|c| c.name.as_str()).collect();
                return Err(refuse(
                    "spec.containers",
                    format!(
                        "{} containers {names:?}: the lab kubelet runs one container per pod (its pod record holds one container). Fix: split the pod, one container each",
                        many.len()
                    ),
                ));
            }
        };
        let app = ContainerPlan::check(
            &container,
            "spec.containers[0]".into(),
            false,
            &refuse,
            &mut notes,
        )?;
        let mut seen = BTreeMap::new();
        for c in init_containers.iter().chain([&app]) {
            if let Some(first) = seen.insert(c.name().to_string(), c.field.clone()) {
                return Err(refuse(
                    &format!("{}.name", c.field),
                    format!(
                        "{:?} is also the name of {first} (as the API server validates, container names are unique in a pod). Fix: rename one",
                        c.name()
                    ),
                ));
            }
        }
        let mut plan = PodPlan {
            source,
            namespace,
            name,
            uid,
            app,
            init_containers,
            volumes: Vec::new(),
            probes: Probes::default(),
            notes,
            service_env: Vec::new(),
            node: node.clone(),
            meta,
            spec,
        };
        if let Some(api) = api {
            plan.notes.extend(api.notes.clone());
            let links = plan.spec.enable_service_links.unwrap_or(true);
            plan.service_env = objects::service_env(
                &api.services,
                api.master.as_ref().map(|(h, p)| (h.as_str(), *p)),
                &plan.namespace,
                links,
            );
        }
        plan.plan_volumes(api, &refuse)?;
        plan.plan_env(api, &refuse)?;
        plan.plan_probes(&refuse)?;
        Ok(plan)
    }

    /// The init containers, then the app container.
    pub fn containers(&self) -> impl Iterator<Item = &ContainerPlan> {
        self.init_containers
            .iter()
            .chain(std::iter::once(&self.app))
    }

    fn containers_mut(&mut self) -> impl Iterator<Item = &mut ContainerPlan> {
        self.init_containers
            .iter_mut()
            .chain(std::iter::once(&mut self.app))
    }

    fn spec(&self) -> &PodSpec {
        &self.spec
    }

    /// The node the pod was planned for.
    pub fn node(&self) -> &NodeInfo {
        &self.node
    }

    /// `namespace/name`.
    pub fn pod_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the pod uses the node's network namespace.
    pub fn host_network(&self) -> bool {
        self.spec().host_network.unwrap_or(false)
    }

    /// Whether some container of the pod is privileged (the sandbox is then privileged too).
    fn any_privileged(&self) -> bool {
        self.containers().any(ContainerPlan::privileged)
    }

    /// The pod's QoS class (`GetPodQOS`): over the init and app containers, only CPU and
    /// memory count, and only positive amounts; `Guaranteed` needs both limits in every
    /// container and the summed requests equal to the summed limits.
    pub fn qos_class(&self) -> QosClass {
        let pos = |v: Option<i64>| v.filter(|x| *x > 0);
        // Sums of (cpu, memory): `None` when no container has the resource.
        let add = |sum: Option<i128>, v: Option<i64>| match (sum, v) {
            (s, None) => s,
            (s, Some(x)) => Some(s.unwrap_or(0) + i128::from(x)),
        };
        let (mut req, mut lim) = ([None, None], [None, None]);
        let mut guaranteed = true;
        for c in self.containers() {
            let r = c.resources;
            req[0] = add(req[0], pos(r.cpu_request));
            req[1] = add(req[1], pos(r.memory_request));
            lim[0] = add(lim[0], pos(r.cpu_limit));
            lim[1] = add(lim[1], pos(r.memory_limit));
            if pos(r.cpu_limit).is_none() || pos(r.memory_limit).is_none() {
                guaranteed = false;
            }
        }
        if req.iter().chain(lim.iter()).all(Option::is_none) {
            return QosClass::BestEffort;
        }
        let matched = (0..2).all(|i| req[i].is_none() || req[i] == lim[i]);
        let same_keys = (0..2).all(|i| req[i].is_some() == lim[i].is_some());
        if guaranteed && matched && same_keys {
            QosClass::Guaranteed
        } else {
            QosClass::Burstable
        }
    }

    fn plan_volumes(
        &mut self,
        api: Option<&ApiObjects>,
        refuse: &impl Fn(&str, String) -> FakeKubeletError,
    ) -> Result<()> {
        let mut skipped = Vec::new();
        let pod_volumes = self.spec.volumes.clone().unwrap_or_default();
        for (i, v) in pod_volumes.iter().enumerate() {
            let f = format!("spec.volumes[{i}] {:?}", v.name);
            if let Some(h) = &v.host_path {
                let ty = HostPathType::parse(h.type_.as_deref())
                    .map_err(|e| refuse(&format!("{f}.hostPath.type"), e))?;
                if !h.path.starts_with('/') || volumes::has_backsteps(&h.path) {
                    return Err(refuse(
                        &format!("{f}.hostPath.path"),
                        format!(
                            "{:?} must be an absolute path without '..'. Fix: write the path on the node",
                            h.path
                        ),
                    ));
                }
                self.volumes.push(VolumePlan::HostPath {
                    name: v.name.clone(),
                    path: PathBuf::from(&h.path),
                    ty,
                });
            } else if let Some(e) = &v.empty_dir {
                match e.medium.as_deref().unwrap_or("") {
                    "" => {}
                    m => {
                        return Err(refuse(
                            &format!("{f}.emptyDir.medium"),
                            format!(
                                "{m:?}: the lab kubelet makes emptyDir volumes on disk only (no tmpfs or hugepage mounts). Fix: drop the medium"
                            ),
                        ));
                    }
                }
                self.volumes.push(VolumePlan::EmptyDir {
                    name: v.name.clone(),
                });
            } else if api.is_none() && is_service_account_volume(v) {
                skipped.push(v.name.clone());
                self.notes
                    .insert("service_account".into(), SERVICE_ACCOUNT_NOTE.into());
            } else if let Some(files) = self.plan_files(v, &f, api, refuse)? {
                self.volumes.push(files);
            } else {
                return Err(refuse(
                    &f,
                    format!(
                        "a {} volume: {}. Fix: use a hostPath volume, or drop the volume",
                        volume_type(v),
                        if api.is_some() {
                            "the lab kubelet mounts hostPath, emptyDir, configMap, secret, downwardAPI and projected volumes only"
                        } else {
                            "the lab kubelet has no API server or volume plugins; it mounts hostPath, emptyDir and downwardAPI volumes only (configMap, secret and projected ones with --api-server)"
                        }
                    ),
                ));
            }
        }
        let volumes = self.volumes.clone();
        for c in self.containers_mut() {
            c.mounts = plan_mounts(c, &volumes, &skipped, refuse)?;
        }
        if api.is_some() {
            // The ServiceAccount admission's outcome is in the notes already.
        } else if self.spec.automount_service_account_token == Some(false) {
            self.notes.insert(
                "service_account".into(),
                "not requested (automountServiceAccountToken: false)".into(),
            );
        } else {
            self.notes
                .insert("service_account".into(), SERVICE_ACCOUNT_NOTE.into());
        }
        Ok(())
    }

    /// `FsUserFrom`: the user every container runs as, when all set the same one (container
    /// over pod security context); the service account token is then that user's, mode 0600.
    fn fs_user(&self) -> Option<i64> {
        let psc = self.spec.security_context.as_ref();
        let mut user = None;
        for c in self.containers() {
            let u = c
                .container
                .security_context
                .as_ref()
                .and_then(|s| s.run_as_user)
                .or(psc.and_then(|p| p.run_as_user))?;
            match user {
                Some(seen) if seen != u => return None,
                _ => user = Some(u),
            }
        }
        user
    }

    /// The downward API's value of a volume item (`fieldRef` of the pod's metadata, or
    /// `resourceFieldRef` of a container).
    fn downward_file(
        &self,
        item: &k8s_openapi::api::core::v1::DownwardAPIVolumeFile,
        f: &str,
        refuse: &impl Fn(&str, String) -> FakeKubeletError,
    ) -> Result<Vec<u8>> {
        if let Some(r) = &item.field_ref {
            let m = &self.meta;
            let labels = m.labels.clone().unwrap_or_default();
            let annotations = m.annotations.clone().unwrap_or_default();
            let value = match r.field_path.as_str() {
                "metadata.name" => self.name.clone(),
                "metadata.namespace" => self.namespace.clone(),
                "metadata.uid" => self.uid.clone(),
                "metadata.labels" => objects::format_map(&labels),
                "metadata.annotations" => objects::format_map(&annotations),
                p => match subscript(p) {
                    Some(("metadata.labels", k)) => labels.get(k).cloned().unwrap_or_default(),
                    Some(("metadata.annotations", k)) => {
                        annotations.get(k).cloned().unwrap_or_default()
                    }
                    _ => {
                        return Err(refuse(
                            &format!("{f}.fieldRef.fieldPath"),
                            format!(
                                "{p:?}: a downwardAPI volume gives metadata.name, metadata.namespace, metadata.uid, metadata.labels, metadata.annotations and their ['KEY'] (as the API server validates)"
                            ),
                        ));
                    }
                },
            };
            return Ok(value.into_bytes());
        }
        if let Some(r) = &item.resource_field_ref {
            let cn = r.container_name.as_deref().unwrap_or("");
            let target = self.containers().find(|c| c.name() == cn).ok_or_else(|| {
                refuse(
                    &format!("{f}.resourceFieldRef.containerName"),
                    format!("{cn:?} is no container of the pod (a volume item must name one)"),
                )
            })?;
            let divisor = match &r.divisor {
                Some(d) => Some(
                    Quantity::parse(&d.0)
                        .map_err(|e| refuse(&format!("{f}.resourceFieldRef.divisor"), e))?,
                ),
                None => None,
            };
            let v = self
                .resource_value(&target.resources, &r.resource, divisor)
                .map_err(|e| refuse(&format!("{f}.resourceFieldRef"), e))?;
            return Ok(v.into_bytes());
        }
        Err(refuse(
            f,
            "names neither fieldRef nor resourceFieldRef".into(),
        ))
    }

    /// The files of downward API items.
    fn downward_items(
        &self,
        items: &[k8s_openapi::api::core::v1::DownwardAPIVolumeFile],
        default_mode: u32,
        f: &str,
        refuse: &impl Fn(&str, String) -> FakeKubeletError,
    ) -> Result<BTreeMap<String, FileProjection>> {
        let mut out = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            let fi = format!("{f}.items[{i}]");
            super::atomic::check_path(&item.path).map_err(|e| refuse(&format!("{fi}.path"), e))?;
            let data = self.downward_file(item, &fi, refuse)?;
            let mode = match item.mode {
                Some(m) => objects::mode_of(m).map_err(|e| refuse(&format!("{fi}.mode"), e))?,
                None => default_mode,
            };
            out.insert(
                item.path.clone(),
                FileProjection {
                    data,
                    mode,
                    fs_user: None,
                },
            );
        }
        Ok(out)
    }

    /// A configMap, secret, projected or downwardAPI volume as the files the kubelet writes
    /// (`None`: another type). ConfigMaps, Secrets and the token come from `api`; without it
    /// only downward API content is known, and the others are refused.
    fn plan_files(
        &mut self,
        v: &Volume,
        f: &str,
        api: Option<&ApiObjects>,
        refuse: &impl Fn(&str, String) -> FakeKubeletError,
    ) -> Result<Option<VolumePlan>> {
        let ns = self.namespace.clone();
        let needs_api = |what: &str| {
            refuse(
                f,
                format!(
                    "a {what} volume: the lab kubelet has no API server or volume plugins; it reads ConfigMaps, Secrets and tokens only with --api-server and --service-account-dir, and mounts hostPath, emptyDir and downwardAPI volumes without. Fix: run the pod with them, or use a hostPath volume"
                ),
            )
        };
        let mode = |m: Option<i32>, field: &str| -> Result<u32> {
            match m {
                None => Ok(0o644),
                Some(m) => objects::mode_of(m).map_err(|e| refuse(&format!("{f}.{field}"), e)),
            }
        };
        type Data = Option<BTreeMap<String, Vec<u8>>>;
        let config_map = |name: &str, field: &str, optional: bool| -> Result<Data> {
            let api = api.ok_or_else(|| needs_api("configMap"))?;
            match api.config_maps.get(name) {
                Some(Some(cm)) => Ok(Some(objects::config_map_data(cm))),
                _ if optional => Ok(None),
                _ => Err(refuse(
                    &format!("{f}.{field}"),
                    format!(
                        "MountVolume.SetUp failed: configmap {name:?} not found (ConfigMap {ns}/{name}). Fix: create it (apiserver --objects), or mark the source optional"
                    ),
                )),
            }
        };
        let secret = |name: &str, field: &str, optional: bool| -> Result<Data> {
            let api = api.ok_or_else(|| needs_api("secret"))?;
            match api.secrets.get(name) {
                Some(Some(s)) => Ok(Some(objects::secret_data(s))),
                _ if optional => Ok(None),
                _ => Err(refuse(
                    &format!("{f}.{field}"),
                    format!(
                        "MountVolume.SetUp failed: secret {name:?} not found (Secret {ns}/{name}). Fix: create it (apiserver --objects), or mark the source optional"
                    ),
                )),
            }
        };
        let name = v.name.clone();
        if let Some(c) = &v.config_map {
            let default_mode = mode(c.default_mode, "configMap.defaultMode")?;
            let optional = c.optional == Some(true);
            let data = config_map(&c.name, "configMap.name", optional)?.unwrap_or_default();
            let payload = objects::payload(
                "configmap",
                &data,
                c.items.as_deref(),
                default_mode,
                optional,
            )
            .map_err(|e| {
                refuse(
                    &format!("{f}.configMap.items"),
                    format!("MountVolume.SetUp failed: {e} (ConfigMap {ns}/{})", c.name),
                )
            })?;
            return Ok(Some(VolumePlan::Files {
                name,
                kind: "configMap",
                from: format!("ConfigMap {ns}/{}", c.name),
                payload,
            }));
        }
        if let Some(s) = &v.secret {
            let secret_name = s.secret_name.clone().unwrap_or_default();
            let default_mode = mode(s.default_mode, "secret.defaultMode")?;
            let optional = s.optional == Some(true);
            let data = secret(&secret_name, "secret.secretName", optional)?.unwrap_or_default();
            let payload =
                objects::payload("secret", &data, s.items.as_deref(), default_mode, optional)
                    .map_err(|e| {
                        refuse(
                            &format!("{f}.secret.items"),
                            format!("MountVolume.SetUp failed: {e} (Secret {ns}/{secret_name})"),
                        )
                    })?;
            self.notes.insert(
                "secret_volumes".into(),
                "written to the pod's volume directory on disk (the kubelet uses tmpfs)".into(),
            );
            return Ok(Some(VolumePlan::Files {
                name,
                kind: "secret",
                from: format!("Secret {ns}/{secret_name}"),
                payload,
            }));
        }
        if let Some(d) = &v.downward_api {
            let default_mode = mode(d.default_mode, "downwardAPI.defaultMode")?;
            let payload = self.downward_items(
                d.items.as_deref().unwrap_or_default(),
                default_mode,
                &format!("{f}.downwardAPI"),
                refuse,
            )?;
            return Ok(Some(VolumePlan::Files {
                name,
                kind: "downwardAPI",
                from: "the downward API".into(),
                payload,
            }));
        }
        let Some(p) = &v.projected else {
            return Ok(None);
        };
        let default_mode = mode(p.default_mode, "projected.defaultMode")?;
        let mut payload = BTreeMap::new();
        let mut from = Vec::new();
        for (i, src) in p.sources.iter().flatten().enumerate() {
            let fs = format!("{f}.projected.sources[{i}]");
            if let Some(c) = &src.config_map {
                let optional = c.optional == Some(true);
                let field = format!("projected.sources[{i}].configMap.name");
                let data = config_map(&c.name, &field, optional)?.unwrap_or_default();
                let part = objects::payload(
                    "configmap",
                    &data,
                    c.items.as_deref(),
                    default_mode,
                    optional,
                )
                .map_err(|e| refuse(&format!("{fs}.configMap.items"), e))?;
                payload.extend(part);
                from.push(format!("ConfigMap {ns}/{}", c.name));
            } else if let Some(s) = &src.secret {
                let optional = s.optional == Some(true);
                let field = format!("projected.sources[{i}].secret.name");
                let data = secret(&s.name, &field, optional)?.unwrap_or_default();
                let part =
                    objects::payload("secret", &data, s.items.as_deref(), default_mode, optional)
                        .map_err(|e| refuse(&format!("{fs}.secret.items"), e))?;
                payload.extend(part);
                from.push(format!("Secret {ns}/{}", s.name));
            } else if let Some(d) = &src.downward_api {
                payload.extend(self.downward_items(
                    d.items.as_deref().unwrap_or_default(),
                    default_mode,
                    &format!("{fs}.downwardAPI"),
                    refuse,
                )?);
                from.push("the downward API".into());
            } else if let Some(t) = &src.service_account_token {
                let api = api.ok_or_else(|| needs_api("projected service account token"))?;
                let sa = self.spec.service_account_name.clone().unwrap_or_default();
                let field = format!("{fs}.serviceAccountToken");
                let token = api.token.clone().map_err(|e| {
                    refuse(
                        &field,
                        format!("no token for service account {ns}/{sa}: {e}"),
                    )
                })?;
                super::atomic::check_path(&t.path)
                    .map_err(|e| refuse(&format!("{field}.path"), e))?;
                // `projected.go`: 0600 (the user's or, with fsGroup, the group's) when the
                // pod's containers run as one user or the pod has an fsGroup.
                let fs_user = self.fs_user();
                let fs_group = self.spec.security_context.as_ref().and_then(|s| s.fs_group);
                let mode = if fs_user.is_some() || fs_group.is_some() {
                    0o600
                } else {
                    default_mode
                };
                let owner = match fs_user {
                    Some(u) => Some(
                        u32::try_from(u)
                            .map_err(|_| refuse(&field, format!("runAsUser {u} is no user ID")))?,
                    ),
                    None => None,
                };
                payload.insert(
                    t.path.clone(),
                    FileProjection {
                        data: token.into_bytes(),
                        mode,
                        fs_user: owner,
                    },
                );
                from.push(format!("the token of ServiceAccount {ns}/{sa}"));
                let mut note = format!(
                    "projected: the token of {ns}/{sa} the lab API server wrote (audience and expirationSeconds are not applied)"
                );
                if fs_group.is_some() {
                    note.push_str("; fsGroup ownership of the volume is not applied");
                }
                self.notes.insert("service_account".into(), note);
            } else {
                return Err(refuse(
                    &fs,
                    "a projection the lab kubelet does not make (it makes configMap, secret, downwardAPI and serviceAccountToken ones). Fix: drop it".into(),
                ));
            }
        }
        Ok(Some(VolumePlan::Files {
            name,
            kind: "projected",
            from: from.join(", "),
            payload,
        }))
    }

    fn plan_env(
        &mut self,
        api: Option<&ApiObjects>,
        refuse: &impl Fn(&str, String) -> FakeKubeletError,
    ) -> Result<()> {
        let planned = self
            .containers()
            .map(|c| self.env_sources(c, api, refuse))
            .collect::<Result<Vec<_>>>()?;
        for (c, (env_from, env)) in self.containers_mut().zip(planned) {
            c.env_from = env_from;
            c.env = env;
        }
        Ok(())
    }

    /// A container's `envFrom` variables, from the ConfigMaps and Secrets of `api`: each
    /// source's keys (sorted), prefixed; a later source wins.
    fn env_from(
        &self,
        c: &ContainerPlan,
        api: Option<&ApiObjects>,
        refuse: &impl Fn(&str, String) -> FakeKubeletError,
    ) -> Result<Vec<(String, String)>> {
        let mut out: Vec<(String, String)> = Vec::new();
        let ns = &self.namespace;
        for (i, from) in c.container.env_from.iter().flatten().enumerate() {
            let f = format!("{}.envFrom[{i}]", c.field);
            let (kind, name, optional) = match (&from.config_map_ref, &from.secret_ref) {
                (Some(r), _) => ("ConfigMap", r.name.clone(), r.optional == Some(true)),
                (_, Some(r)) => ("Secret", r.name.clone(), r.optional == Some(true)),
                _ => {
                    return Err(refuse(
                        &f,
                        "names neither configMapRef nor secretRef".into(),
                    ));
                }
            };
            let Some(api) = api else {
                return Err(refuse(
                    &format!("{}.envFrom", c.field),
                    format!(
                        "{kind} {name:?}: the lab kubelet has no API server to read it from (run the pod with --api-server). Fix: list the variables under env with values"
                    ),
                ));
            };
            let data: Option<BTreeMap<String, Vec<u8>>> = if kind == "ConfigMap" {
                api.config_maps.get(&name).cloned().flatten().map(|cm| {
                    cm.data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes()))
                        .collect()
                })
            } else {
                api.secrets
                    .get(&name)
                    .cloned()
                    .flatten()
                    .map(|s| objects::secret_data(&s))
            };
            let Some(data) = data else {
                if optional {
                    continue;
                }
                return Err(refuse(
                    &f,
                    format!(
                        "CreateContainerConfigError: {} {name:?} not found ({kind} {ns}/{name}). Fix: create it (apiserver --objects), or mark the source optional",
                        kind.to_lowercase()
                    ),
                ));
            };
            let prefix = from.prefix.clone().unwrap_or_default();
            for (k, v) in data {
                let value = String::from_utf8(v).map_err(|_| {
                    refuse(
                        &f,
                        format!(
                            "key {k:?} of {kind} {ns}/{name} is not UTF-8 text, which an environment variable must be"
                        ),
                    )
                })?;
                let key = format!("{prefix}{k}");
                match out.iter_mut().find(|(n, _)| *n == key) {
                    Some(slot) => slot.1 = value,
                    None => out.push((key, value)),
                }
            }
        }
        Ok(out)
    }

    /// `c`'s `envFrom` variables and where each of its env variables comes from, in
    /// declaration order (a `configMapKeyRef`/`secretKeyRef` to an optional source or key that
    /// is missing sets nothing, as the kubelet skips it).
    #[allow(clippy::type_complexity)]
    fn env_sources(
        &self,
        c: &ContainerPlan,
        api: Option<&ApiObjects>,
        refuse: &impl Fn(&str, String) -> FakeKubeletError,
    ) -> Result<(Vec<(String, String)>, Vec<(String, EnvSource)>)> {
        let env_from = self.env_from(c, api, refuse)?;
        let meta = &self.pod_meta_for_env();
        let mut out = Vec::new();
        for (i, e) in c.container.env.iter().flatten().enumerate() {
            let f = format!("{}.env[{i}] {:?}", c.field, e.name);
            let value = e.value.clone().unwrap_or_default();
            let source = if !value.is_empty() {
                EnvSource::Value(value)
            } else if let Some(from) = &e.value_from {
                if let Some(r) = &from.config_map_key_ref {
                    let field = format!("{f}.valueFrom.configMapKeyRef");
                    let data = api.map(|a| {
                        a.config_maps.get(&r.name).cloned().flatten().map(|cm| {
                            cm.data
                                .unwrap_or_default()
                                .into_iter()
                                .map(|(k, v)| (k, v.into_bytes()))
                                .collect()
                        })
                    });
                    match self.key_ref(
                        &field,
                        "ConfigMap",
                        &r.name,
                        &r.key,
                        r.optional,
                        data,
                        refuse,
                    )? {
                        Some(v) => EnvSource::Fixed(v),
                        None => continue,
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let field = format!("{f}.valueFrom.secretKeyRef");
                    let data = api.map(|a| {
                        a.secrets
                            .get(&r.name)
                            .cloned()
                            .flatten()
                            .map(|s| objects::secret_data(&s))
                    });
                    match self
                        .key_ref(&field, "Secret", &r.name, &r.key, r.optional, data, refuse)?
                    {
                        Some(v) => EnvSource::Fixed(v),
                        None => continue,
                    }
                } else if let Some(r) = &from.field_ref {
                    let api = r.api_version.as_deref().unwrap_or("v1");
                    if api != "v1" && !api.is_empty() {
                        return Err(refuse(
                            &format!("{f}.valueFrom.fieldRef.apiVersion"),
                            format!("{api:?}: only v1 fields are defined"),
                        ));
                    }
                    field_value(&r.field_path, meta)
                        .map_err(|e| refuse(&format!("{f}.valueFrom.fieldRef.fieldPath"), e))?
                } else if let Some(r) = &from.resource_field_ref {
                    // The named container's resources (any container of the pod), else its own.
                    let target = match r.container_name.as_deref().filter(|n| !n.is_empty()) {
                        None => c,
                        Some(cn) => {
                            self.containers().find(|o| o.name() == cn).ok_or_else(|| {
                                refuse(
                                    &format!("{f}.valueFrom.resourceFieldRef.containerName"),
                                    format!("{cn:?} is no container of the pod"),
                                )
                            })?
                        }
                    };
                    let divisor = match &r.divisor {
                        Some(d) => Some(Quantity::parse(&d.0).map_err(|e| {
                            refuse(&format!("{f}.valueFrom.resourceFieldRef.divisor"), e)
                        })?),
                        None => None,
                    };
                    EnvSource::Fixed(
                        self.resource_value(&target.resources, &r.resource, divisor)
                            .map_err(|e| refuse(&format!("{f}.valueFrom.resourceFieldRef"), e))?,
                    )
                } else {
                    return Err(refuse(
                        &format!("{f}.valueFrom"),
                        "names no source the lab kubelet knows (fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef)".into(),
                    ));
                }
            } else {
                EnvSource::Value(String::new())
            };
            out.push((e.name.clone(), source));
        }
        Ok((env_from, out))
    }

    /// The value of a `configMapKeyRef` / `secretKeyRef` (`data`: `None` without an API
    /// server, `Some(None)` for an object not found); `None` when an optional source or key is
    /// missing (the variable is not set).
    #[allow(clippy::too_many_arguments)]
    fn key_ref(
        &self,
        field: &str,
        kind: &str,
        name: &str,
        key: &str,
        optional: Option<bool>,
        data: Option<Option<BTreeMap<String, Vec<u8>>>>,
        refuse: &impl Fn(&str, String) -> FakeKubeletError,
    ) -> Result<Option<String>> {
        let ns = &self.namespace;
        let optional = optional == Some(true);
        let Some(data) = data else {
            return Err(refuse(
                field,
                format!(
                    "key {key:?} of {kind} {name:?}: the lab kubelet has no API server to read it from (run the pod with --api-server). Fix: set the env var's value"
                ),
            ));
        };
        let Some(data) = data else {
            if optional {
                return Ok(None);
            }
            return Err(refuse(
                field,
                format!(
                    "CreateContainerConfigError: {} {name:?} not found ({kind} {ns}/{name}). Fix: create it (apiserver --objects), or mark the reference optional",
                    kind.to_lowercase()
                ),
            ));
        };
        match data.get(key) {
            Some(v) => String::from_utf8(v.clone()).map(Some).map_err(|_| {
                refuse(
                    field,
                    format!(
                        "key {key} of {kind} {ns}/{name} is not UTF-8 text, which an environment variable must be"
                    ),
                )
            }),
            None if optional => Ok(None),
            None => Err(refuse(
                field,
                format!(
                    "CreateContainerConfigError: couldn't find key {key} in {kind} {ns}/{name}. Fix: add the key, or mark the reference optional"
                ),
            )),
        }
    }

    fn pod_meta_for_env(&self) -> EnvMeta {
        EnvMeta {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            uid: self.uid.clone(),
            labels: self.meta.labels.clone().unwrap_or_default(),
            annotations: self.meta.annotations.clone().unwrap_or_default(),
            node_name: self.node.name.clone(),
            node_ip: self.node.ip.clone(),
            service_account: self.spec.service_account_name.clone().unwrap_or_default(),
        }
    }

    /// The downward API's value of a container resource (`limits.cpu`, ...), as the kubelet
    /// computes it: a limit the container does not set is the node's allocatable amount (a
    /// request it does not set is its limit, else 0); the
    /// value is divided by the divisor (default 1) and rounded up.
    fn resource_value(
        &self,
        r: &Resources,
        resource: &str,
        divisor: Option<Quantity>,
    ) -> Result<String, String> {
        let divisor = divisor.filter(|d| !d.is_zero());
        let cpu = |v: i64| -> Result<String, String> {
            let d = divisor.map(|d| d.milli_value()).unwrap_or(1000);
            if d != 1 && d != 1000 {
                return Err(format!(
                    "divisor for {resource} must be 1m or 1 (as the API server validates)"
                ));
            }
            Ok(ceil_div(i128::from(v), d).to_string())
        };
        let mem = |v: i64| -> Result<String, String> {
            let d = divisor.map(|d| d.value()).unwrap_or(1);
            let allowed =
                (0..=6).any(|k| d == 1000i128.pow(k)) || (1..=6).any(|k| d == 1i128 << (10 * k));
            if !allowed || divisor.is_some_and(|q| !q.is_integer()) {
                return Err(format!(
                    "divisor for {resource} must be 1, 1k ... 1E or 1Ki ... 1Ei (as the API server validates)"
                ));
            }
            Ok(ceil_div(i128::from(v), d).to_string())
        };
        match resource {
            "limits.cpu" => cpu(r.cpu_limit.unwrap_or(self.node.cpu_millis)),
            "requests.cpu" => cpu(r.cpu_request.unwrap_or(0)),
            "limits.memory" => mem(r.memory_limit.unwrap_or(self.node.memory_bytes)),
            "requests.memory" => mem(r.memory_request.unwrap_or(0)),
            other => Err(format!(
                "resource {other:?}: the lab kubelet gives limits.cpu, limits.memory, requests.cpu and requests.memory. Fix: use one of them"
            )),
        }
    }

    fn plan_probes(&mut self, refuse: &impl Fn(&str, String) -> FakeKubeletError) -> Result<()> {
        let c = &self.app.container;
        let one =
            |kind: &'static str, field: &str, p: &Option<k8s_openapi::api::core::v1::Probe>| {
                p.as_ref()
                    .map(|p| probe::plan(kind, p, c))
                    .transpose()
                    .map_err(|e| refuse(&format!("spec.containers[0].{field}"), e))
            };
        self.probes = Probes {
            startup: one("startup", "startupProbe", &c.startup_probe)?,
            readiness: one("readiness", "readinessProbe", &c.readiness_probe)?,
            liveness: one("liveness", "livenessProbe", &c.liveness_probe)?,
        };
        Ok(())
    }

    /// The namespaces of the sandbox and its container: the node's network, PID and IPC
    /// namespaces for `hostNetwork`, `hostPID`, `hostIPC`; else the pod's network and IPC and
    /// the container's PID namespace (the pod's with `shareProcessNamespace`).
    pub fn namespace_options(&self) -> cri::NamespaceOption {
        let s = self.spec();
        let node = cri::NamespaceMode::Node as i32;
        cri::NamespaceOption {
            network: if s.host_network.unwrap_or(false) {
                node
            } else {
                cri::NamespaceMode::Pod as i32
            },
            pid: if s.host_pid.unwrap_or(false) {
                node
            } else if s.share_process_namespace.unwrap_or(false) {
                cri::NamespaceMode::Pod as i32
            } else {
                cri::NamespaceMode::Container as i32
            },
            ipc: if s.host_ipc.unwrap_or(false) {
                node
            } else {
                cri::NamespaceMode::Pod as i32
            },
            target_id: String::new(),
        }
    }

    fn supplemental_groups(&self) -> Vec<i64> {
        let sc = self.spec().security_context.as_ref();
        sc.and_then(|s| s.fs_group)
            .into_iter()
            .chain(
                sc.and_then(|s| s.supplemental_groups.clone())
                    .into_iter()
                    .flatten(),
            )
            .collect()
    }

    /// The kubelet's pod labels: the pod's own plus `io.kubernetes.pod.{name,namespace,uid}`.
    pub fn pod_labels(&self) -> BTreeMap<String, String> {
        let mut l = self.meta.labels.clone().unwrap_or_default();
        l.insert(LABEL_POD_NAME.into(), self.name.clone());
        l.insert(LABEL_POD_NAMESPACE.into(), self.namespace.clone());
        l.insert(LABEL_POD_UID.into(), self.uid.clone());
        l
    }

    /// `RunPodSandbox`'s config: `log_root/<ns>_<name>_<uid>` for logs; `seen` is the
    /// `kubernetes.io/config.seen` time the kubelet's pod source stamps (RFC 3339).
    pub fn sandbox_config(&self, log_root: &Path, seen: &str) -> cri::PodSandboxConfig {
        let s = self.spec();
        let host_network = s.host_network.unwrap_or(false);
        let mut annotations = self.meta.annotations.clone().unwrap_or_default();
        annotations.insert("kubernetes.io/config.source".into(), "api".into());
        annotations.insert("kubernetes.io/config.seen".into(), seen.into());
        let hostname = if host_network {
            String::new()
        } else {
            let h = s
                .hostname_override
                .clone()
                .or_else(|| s.hostname.clone())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| self.name.clone());
            truncate_hostname(&h)
        };
        let psc = s.security_context.as_ref();
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: self.name.clone(),
                uid: self.uid.clone(),
                namespace: self.namespace.clone(),
                attempt: 0,
            }),
            hostname,
            log_directory: log_root
                .join(format!("{}_{}_{}", self.namespace, self.name, self.uid))
                .display()
                .to_string(),
            port_mappings: self.port_mappings(),
            labels: self.pod_labels(),
            annotations,
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: pod_cgroup_parent(
                    self.node.cgroup_driver,
                    self.qos_class(),
                    &self.uid,
                ),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(self.namespace_options()),
                    run_as_user: psc
                        .and_then(|p| p.run_as_user)
                        .map(|value| cri::Int64Value { value }),
                    run_as_group: psc
                        .and_then(|p| p.run_as_group)
                        .map(|value| cri::Int64Value { value }),
                    supplemental_groups: self.supplemental_groups(),
                    privileged: self.any_privileged(),
                }),
                sysctls: psc
                    .and_then(|p| p.sysctls.clone())
                    .into_iter()
                    .flatten()
                    .map(|x| (x.name, x.value))
                    .collect(),
            }),
        }
    }

    /// A container's ports with the API server's defaults (protocol TCP; a host-network
    /// pod's host port is its container port).
    fn ports(&self, c: &Container) -> Vec<Port> {
        let host_network = self.host_network();
        c.ports
            .iter()
            .flatten()
            .map(|p| Port {
                name: p.name.clone().filter(|n| !n.is_empty()),
                host_port: match p.host_port.unwrap_or(0) {
                    0 if host_network => p.container_port,
                    h => h,
                },
                container_port: p.container_port,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                host_ip: p.host_ip.clone().filter(|h| !h.is_empty()),
            })
            .collect()
    }

    fn port_mappings(&self) -> Vec<cri::PortMapping> {
        // The kubelet maps the ports of the app containers (`pod.Spec.Containers`).
        self.ports(&self.app.container)
            .into_iter()
            .map(|p| cri::PortMapping {
                protocol: match p.protocol.as_str() {
                    "UDP" => cri::Protocol::Udp,
                    "SCTP" => cri::Protocol::Sctp,
                    _ => cri::Protocol::Tcp,
                } as i32,
                container_port: p.container_port,
                host_port: p.host_port,
                host_ip: p.host_ip.unwrap_or_default(),
            })
            .collect()
    }

    /// The container's ports as the kubelet's `io.kubernetes.container.ports` annotation holds
    /// them (Go's JSON of `[]v1.ContainerPort`: field order name, hostPort, containerPort,
    /// protocol, hostIP; empty fields left out).
    fn ports_annotation(&self, c: &Container) -> Option<String> {
        let ports = self.ports(c);
        if ports.is_empty() {
            return None;
        }
        let q = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
        let items: Vec<String> = ports
            .iter()
            .map(|p| {
                let mut f = Vec::new();
                if let Some(n) = &p.name {
                    f.push(format!("\"name\":{}", q(n)));
                }
                if p.host_port != 0 {
                    f.push(format!("\"hostPort\":{}", p.host_port));
                }
                f.push(format!("\"containerPort\":{}", p.container_port));
                f.push(format!("\"protocol\":{}", q(&p.protocol)));
                if let Some(h) = &p.host_ip {
                    f.push(format!("\"hostIP\":{}", q(h)));
                }
                format!("{{{}}}", f.join(","))
            })
            .collect();
        Some(format!("[{}]", items.join(",")))
    }

    /// The app container's env ([`PodPlan::env_of`]).
    pub fn pod_env(&self, pod_ip: &str) -> Vec<(String, String)> {
        self.env_of(&self.app, pod_ip)
    }

    /// A container's env (`makeEnvironmentVariables`) in declaration order: `value`s expanded
    /// against the variables declared before them, `fieldRef`/`resourceFieldRef` resolved. A
    /// name declared twice keeps its first place and its last value.
    pub fn env_of(&self, c: &ContainerPlan, pod_ip: &str) -> Vec<(String, String)> {
        // envFrom first, env over it, the service variables last (where not set): the
        // kubelet's order; `$(VAR)` sees what is set so far, then the service variables.
        let mut out: Vec<(String, String)> = c.env_from.clone();
        let services = &self.service_env;
        for (name, source) in &c.env {
            let value = match source {
                EnvSource::Value(v) if v.is_empty() => String::new(),
                EnvSource::Value(v) => expand(v, |k| {
                    out.iter()
                        .chain(services.iter())
                        .find(|(n, _)| n == k)
                        .map(|(_, v)| v.clone())
                }),
                EnvSource::Fixed(v) => v.clone(),
                EnvSource::PodIp => pod_ip.to_string(),
            };
            match out.iter_mut().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = value,
                None => out.push((name.clone(), value)),
            }
        }
        for (k, v) in services {
            if !out.iter().any(|(n, _)| n == k) {
                out.push((k.clone(), v.clone()));
            }
        }
        out
    }

    /// The OOM score adjustment of the app container ([`PodPlan::oom_score_adj_of`]).
    pub fn oom_score_adj(&self) -> i64 {
        self.oom_score_adj_of(&self.app)
    }

    /// The OOM score adjustment of a container (`GetContainerOOMScoreAdjust`): -997 for a
    /// node-critical or `Guaranteed` pod, 1000 for a `BestEffort` one, else from the
    /// container's memory request against the node's memory.
    pub fn oom_score_adj_of(&self, c: &ContainerPlan) -> i64 {
        let s = self.spec();
        let by_class = match s.priority_class_name.as_deref() {
            Some("system-node-critical") => Some(2_000_001_000),
            Some("system-cluster-critical") => Some(2_000_000_000),
            _ => None,
        };
        let priority = s.priority.map(i64::from).or(by_class);
        let critical = priority.is_some_and(|p| p >= 2_000_000_000);
        if critical && s.priority_class_name.as_deref() == Some("system-node-critical") {
            return -997;
        }
        match self.qos_class() {
            QosClass::Guaranteed => return -997,
            QosClass::BestEffort => return 1000,
            QosClass::Burstable => {}
        }
        let r = c.resources;
        let capacity = i128::from(self.node.memory_bytes.max(1));
        let req = i128::from(r.memory_request.unwrap_or(0));
        let adj = 1000 - (1000 * req) / capacity;
        let adj = i64::try_from(adj).unwrap_or(3);
        if adj < 3 {
            3
        } else if adj == 1000 {
            999
        } else {
            adj
        }
    }

    /// The app container's `CreateContainer` config ([`PodPlan::config_for`]).
    pub fn container_config(&self, inp: &ContainerInputs<'_>) -> Result<cri::ContainerConfig> {
        self.config_for(&self.app, inp)
    }

    /// `CreateContainer`'s config for container `cp`, as the kubelet writes it: the Allocate
    /// response's envs, mounts, devices and annotations first, then the pod's (env, volume
    /// mounts, the kubelet's annotations); the command and args expanded against the whole env;
    /// the image by the ID `ImageStatus` gave; the effective security context (container over
    /// pod, the image's user when none is set) and the resources the kubelet computes.
    pub fn config_for(
        &self,
        cp: &ContainerPlan,
        inp: &ContainerInputs<'_>,
    ) -> Result<cri::ContainerConfig> {
        let c = &cp.container;
        let alloc = inp.allocation;
        let mut envs: Vec<(String, String)> = alloc
            .map(|a| a.envs.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        envs.extend(self.env_of(cp, inp.pod_ip));
        let mut all = BTreeMap::new();
        for (k, v) in &envs {
            all.insert(k.clone(), v.clone());
        }
        let exp = |list: &Option<Vec<String>>| -> Vec<String> {
            list.iter()
                .flatten()
                .map(|s| expand(s, |k| all.get(k).cloned()))
                .collect()
        };
        let mut mounts: Vec<cri::Mount> = alloc
            .map(|a| {
                a.mounts
                    .iter()
                    .map(|m| cri::Mount {
                        container_path: m.container_path.clone(),
                        host_path: m.host_path.clone(),
                        readonly: m.read_only,
                        ..Default::default()
                    })
                    .collect()
            })
            .unwrap_or_default();
        for m in &cp.mounts {
            let base = inp.volume_paths.get(&m.volume).ok_or_else(|| {
                FakeKubeletError::Refused(format!(
                    "pod {}: volume {:?} was not set up",
                    self.pod_name(),
                    m.volume
                ))
            })?;
            let host = if m.sub_path.is_empty() {
                base.clone()
            } else {
                base.join(&m.sub_path)
            };
            mounts.push(cri::Mount {
                container_path: m.container_path.clone(),
                host_path: host.display().to_string(),
                readonly: m.read_only,
                selinux_relabel: false,
                propagation: m.propagation as i32,
            });
        }
        let mut annotations = alloc.map(|a| a.annotations.clone()).unwrap_or_default();
        annotations.insert("io.kubernetes.container.restartCount".into(), "0".into());
        annotations.insert(
            "io.kubernetes.container.terminationMessagePath".into(),
            c.termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".into()),
        );
        annotations.insert(
            "io.kubernetes.container.terminationMessagePolicy".into(),
            c.termination_message_policy
                .clone()
                .unwrap_or_else(|| "File".into()),
        );
        annotations.insert(
            "io.kubernetes.pod.terminationGracePeriod".into(),
            self.spec()
                .termination_grace_period_seconds
                .unwrap_or(30)
                .to_string(),
        );
        if let Some(p) = self.ports_annotation(c) {
            annotations.insert("io.kubernetes.container.ports".into(), p);
        }
        let mut labels = BTreeMap::new();
        labels.insert(LABEL_POD_NAME.to_string(), self.name.clone());
        labels.insert(LABEL_POD_NAMESPACE.to_string(), self.namespace.clone());
        labels.insert(LABEL_POD_UID.to_string(), self.uid.clone());
        labels.insert(LABEL_CONTAINER_NAME.to_string(), c.name.clone());
        Ok(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: c.name.clone(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: inp.image_id.to_string(),
                annotations: BTreeMap::new(),
                user_specified_image: cp.image.clone(),
            }),
            command: exp(&c.command),
            args: exp(&c.args),
            working_dir: c.working_dir.clone().unwrap_or_default(),
            envs: envs
                .into_iter()
                .map(|(key, value)| cri::KeyValue {
                    key,
                    value: value.into_bytes(),
                })
                .collect(),
            mounts,
            devices: alloc
                .map(|a| {
                    a.devices
                        .iter()
                        .map(|d| cri::Device {
                            container_path: d.container_path.clone(),
                            host_path: d.host_path.clone(),
                            permissions: d.permissions.clone(),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            labels,
            annotations,
            log_path: format!("{}/0.log", c.name),
            stdin: c.stdin.unwrap_or(false),
            stdin_once: c.stdin_once.unwrap_or(false),
            tty: c.tty.unwrap_or(false),
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(self.linux_resources_of(cp)),
                security_context: Some(self.security_context(cp, inp)?),
            }),
            cdi_devices: Vec::new(),
        })
    }

    /// The app container's `LinuxContainerResources` ([`PodPlan::linux_resources_of`]).
    pub fn linux_resources(&self) -> cri::LinuxContainerResources {
        self.linux_resources_of(&self.app)
    }

    /// The kubelet's `LinuxContainerResources` of a container: CPU shares from the request (or
    /// the limit), the CFS quota from the limit over a 100 ms period, the memory limit, the OOM
    /// score.
    pub fn linux_resources_of(&self, c: &ContainerPlan) -> cri::LinuxContainerResources {
        let r = c.resources;
        let cpu_for_shares = r.cpu_request.or(r.cpu_limit).unwrap_or(0);
        cri::LinuxContainerResources {
            cpu_period: CPU_PERIOD_US,
            cpu_quota: milli_cpu_to_quota(r.cpu_limit.unwrap_or(0), CPU_PERIOD_US),
            cpu_shares: milli_cpu_to_shares(cpu_for_shares),
            memory_limit_in_bytes: r.memory_limit.unwrap_or(0),
            oom_score_adj: self.oom_score_adj_of(c),
        }
    }

    fn security_context(
        &self,
        c: &ContainerPlan,
        inp: &ContainerInputs<'_>,
    ) -> Result<cri::LinuxContainerSecurityContext> {
        let csc = c.container.security_context.clone().unwrap_or_default();
        let psc = self.spec().security_context.clone().unwrap_or_default();
        let run_as_user = csc.run_as_user.or(psc.run_as_user);
        let run_as_group = csc.run_as_group.or(psc.run_as_group);
        let non_root = csc.run_as_non_root.or(psc.run_as_non_root).unwrap_or(false);
        let who = format!("pod {:?}, container {}", self.pod_name(), c.name());
        if non_root {
            let why = match (run_as_user, inp.image_uid, inp.image_username) {
                (Some(0), _, _) => Some(format!(
                    "container's runAsUser breaks non-root policy ({who})"
                )),
                (Some(_), _, _) => None,
                (None, Some(0), _) => Some(format!(
                    "container has runAsNonRoot and image will run as root ({who})"
                )),
                (None, None, name) if !name.is_empty() => Some(format!(
                    "container has runAsNonRoot and image has non-numeric user ({name}), cannot verify user is non-root ({who})"
                )),
                _ => None,
            };
            if let Some(why) = why {
                return Err(FakeKubeletError::Refused(format!(
                    "CreateContainerConfigError: {why}. Fix: set runAsUser to a non-root UID, or use an image with a numeric non-root user"
                )));
            }
        }
        let unmasked = csc.proc_mount.as_deref() == Some("Unmasked");
        let paths = |p: &[&str]| -> Vec<String> {
            if unmasked {
                Vec::new()
            } else {
                p.iter().map(|s| s.to_string()).collect()
            }
        };
        let (run_as_user, run_as_username) = match run_as_user {
            Some(u) => (Some(u), String::new()),
            None => (inp.image_uid, inp.image_username.to_string()),
        };
        Ok(cri::LinuxContainerSecurityContext {
            capabilities: csc.capabilities.as_ref().map(|caps| cri::Capability {
                add_capabilities: caps.add.clone().unwrap_or_default(),
                drop_capabilities: caps.drop.clone().unwrap_or_default(),
            }),
            privileged: csc.privileged.unwrap_or(false),
            namespace_options: Some(self.namespace_options()),
            run_as_user: run_as_user.map(|value| cri::Int64Value { value }),
            run_as_username,
            readonly_rootfs: csc.read_only_root_filesystem.unwrap_or(false),
            supplemental_groups: self.supplemental_groups(),
            no_new_privs: csc.allow_privilege_escalation == Some(false),
            run_as_group: run_as_group.map(|value| cri::Int64Value { value }),
            masked_paths: paths(DEFAULT_MASKED_PATHS),
            readonly_paths: paths(DEFAULT_READONLY_PATHS),
            apparmor: apparmor_profile(
                csc.app_armor_profile
                    .as_ref()
                    .or(psc.app_armor_profile.as_ref()),
                &who,
            )?,
            seccomp: Some(seccomp_profile(
                csc.seccomp_profile
                    .as_ref()
                    .or(psc.seccomp_profile.as_ref()),
                &who,
            )?),
        })
    }
}

/// Where the lab kubelet (root dir `/var/lib/kubelet`) looks for `Localhost` seccomp profiles,
/// as the kubelet's `<root-dir>/seccomp`.
pub const SECCOMP_PROFILE_ROOT: &str = "/var/lib/kubelet/seccomp";

/// The container's seccomp profile as the kubelet sends it: the container's
/// `securityContext.seccompProfile`, else the pod's; neither: `Unconfined` (the kubelet's
/// `--seccomp-default` is off by default, and the lab kubelet models that default). `Localhost`
/// names a file under [`SECCOMP_PROFILE_ROOT`].
fn seccomp_profile(
    profile: Option<&k8s_openapi::api::core::v1::SeccompProfile>,
    who: &str,
) -> Result<cri::SecurityProfile> {
    use cri::security_profile::ProfileType;
    let (profile_type, localhost_ref) = match profile {
        None => (ProfileType::Unconfined, String::new()),
        Some(p) => match (p.type_.as_str(), p.localhost_profile.as_deref()) {
            ("RuntimeDefault", _) => (ProfileType::RuntimeDefault, String::new()),
            ("Localhost", Some(name)) if !name.is_empty() => (
                ProfileType::Localhost,
                format!("{SECCOMP_PROFILE_ROOT}/{name}"),
            ),
            ("Localhost", _) => {
                return Err(FakeKubeletError::Refused(format!(
                    "seccompProfile of type Localhost without localhostProfile ({who}). Fix: name the profile's file under {SECCOMP_PROFILE_ROOT} in localhostProfile"
                )));
            }
            _ => (ProfileType::Unconfined, String::new()),
        },
    };
    Ok(cri::SecurityProfile {
        profile_type: profile_type as i32,
        localhost_ref,
    })
}

/// The container's AppArmor profile as the kubelet sends it (`getAppArmorProfile`): the
/// container's `securityContext.appArmorProfile`, else the pod's; neither: none, and the runtime
/// applies its default profile to an unprivileged container (containerd:
/// `cri-containerd.apparmor.d`).
fn apparmor_profile(
    profile: Option<&k8s_openapi::api::core::v1::AppArmorProfile>,
    who: &str,
) -> Result<Option<cri::SecurityProfile>> {
    use cri::security_profile::ProfileType;
    let Some(p) = profile else {
        return Ok(None);
    };
    let (profile_type, localhost_ref) = match (p.type_.as_str(), p.localhost_profile.as_deref()) {
        ("RuntimeDefault", _) => (ProfileType::RuntimeDefault, String::new()),
        ("Unconfined", _) => (ProfileType::Unconfined, String::new()),
        ("Localhost", Some(name)) if !name.is_empty() => (ProfileType::Localhost, name.to_string()),
        ("Localhost", _) => {
            return Err(FakeKubeletError::Refused(format!(
                "appArmorProfile of type Localhost without localhostProfile ({who}). Fix: name the profile loaded on the node in localhostProfile"
            )));
        }
        (other, _) => {
            return Err(FakeKubeletError::Refused(format!(
                "appArmorProfile type {other:?} is not RuntimeDefault, Unconfined or Localhost ({who})"
            )));
        }
    };
    Ok(Some(cri::SecurityProfile {
        profile_type: profile_type as i32,
        localhost_ref,
    }))
}

/// A container's `volumeMounts`, checked against the pod's volumes (`skipped`: volumes the lab
/// kubelet leaves out, whose mounts are left out too).
fn plan_mounts(
    c: &ContainerPlan,
    volumes: &[VolumePlan],
    skipped: &[String],
    refuse: &impl Fn(&str, String) -> FakeKubeletError,
) -> Result<Vec<MountPlan>> {
    let privileged = c.privileged();
    let mut mounts = Vec::new();
    for (i, m) in c.container.volume_mounts.iter().flatten().enumerate() {
        let f = format!("{}.volumeMounts[{i}]", c.field);
        if skipped.contains(&m.name) {
            continue;
        }
        let Some(volume) = volumes.iter().find(|v| v.name() == m.name) else {
            return Err(refuse(
                &format!("{f}.name"),
                format!("{:?} names no volume of the pod", m.name),
            ));
        };
        if !m.mount_path.starts_with('/') {
            return Err(refuse(
                &format!("{f}.mountPath"),
                format!("{:?} must be an absolute path", m.mount_path),
            ));
        }
        if m.sub_path_expr.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(refuse(
                &format!("{f}.subPathExpr"),
                "the lab kubelet takes subPath only. Fix: write the subPath out".into(),
            ));
        }
        let sub_path = m.sub_path.clone().unwrap_or_default();
        if sub_path.starts_with('/') || volumes::has_backsteps(&sub_path) {
            return Err(refuse(
                &format!("{f}.subPath"),
                format!("{sub_path:?} must be a relative path without '..'"),
            ));
        }
        let propagation = match m.mount_propagation.as_deref().unwrap_or("None") {
            "None" | "" => cri::MountPropagation::PropagationPrivate,
            "HostToContainer" => cri::MountPropagation::PropagationHostToContainer,
            "Bidirectional" if privileged => cri::MountPropagation::PropagationBidirectional,
            "Bidirectional" => {
                return Err(refuse(
                        &format!("{f}.mountPropagation"),
                        "Bidirectional mount propagation is available only to privileged containers (as the API server validates). Fix: use HostToContainer, or make the container privileged".into(),
                    ));
            }
            other => {
                return Err(refuse(
                    &format!("{f}.mountPropagation"),
                    format!("{other:?} is not None, HostToContainer or Bidirectional"),
                ));
            }
        };
        if m.recursive_read_only.as_deref() == Some("Enabled") {
            return Err(refuse(
                    &format!("{f}.recursiveReadOnly"),
                    "Enabled: the lab kubelet does not ask for recursive read-only mounts. Fix: use IfPossible or Disabled".into(),
                ));
        }
        mounts.push(MountPlan {
            volume: m.name.clone(),
            container_path: m.mount_path.clone(),
            sub_path,
            // The kubelet mounts the volumes of its atomic writer read-only.
            read_only: m.read_only.unwrap_or(false) || matches!(volume, VolumePlan::Files { .. }),
            propagation,
        });
    }
    Ok(mounts)
}

fn ceil_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b != 0 && (a > 0) == (b > 0) {
        q + 1
    } else {
        q
    }
}

/// A container port after the API server's defaults.
struct Port {
    name: Option<String>,
    host_port: i32,
    container_port: i32,
    protocol: String,
    host_ip: Option<String>,
}

/// The pod fields the downward API gives, except the pod IP.
struct EnvMeta {
    name: String,
    namespace: String,
    uid: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    node_name: String,
    node_ip: String,
    service_account: String,
}

/// `metadata.labels['key']` → `("metadata.labels", "key")`.
fn subscript(path: &str) -> Option<(&str, &str)> {
    let (base, rest) = path.split_once("['")?;
    let key = rest.strip_suffix("']")?;
    Some((base, key))
}

fn field_value(path: &str, m: &EnvMeta) -> Result<EnvSource, String> {
    let fixed = |s: &str| Ok(EnvSource::Fixed(s.to_string()));
    match path {
        "metadata.name" => fixed(&m.name),
        "metadata.namespace" => fixed(&m.namespace),
        "metadata.uid" => fixed(&m.uid),
        "spec.nodeName" => fixed(&m.node_name),
        "spec.serviceAccountName" => fixed(&m.service_account),
        "status.hostIP" | "status.hostIPs" => fixed(&m.node_ip),
        "status.podIP" | "status.podIPs" => Ok(EnvSource::PodIp),
        p => match subscript(p) {
            Some(("metadata.labels", k)) => {
                fixed(m.labels.get(k).map(String::as_str).unwrap_or(""))
            }
            Some(("metadata.annotations", k)) => {
                fixed(m.annotations.get(k).map(String::as_str).unwrap_or(""))
            }
            _ => Err(format!(
                "{p:?}: the lab kubelet gives metadata.name, metadata.namespace, metadata.uid, metadata.labels['KEY'], metadata.annotations['KEY'], spec.nodeName, spec.serviceAccountName, status.hostIP(s), status.podIP(s). Fix: use one of them"
            )),
        },
    }
}

fn check_pod_level(
    spec: &PodSpec,
    refuse: &impl Fn(&str, String) -> FakeKubeletError,
    notes: &mut BTreeMap<String, String>,
) -> Result<()> {
    if spec
        .ephemeral_containers
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        return Err(refuse(
            "spec.ephemeralContainers",
            "the lab kubelet runs one container per pod. Fix: drop them".into(),
        ));
    }
    if spec.host_users == Some(false) {
        return Err(refuse(
            "spec.hostUsers",
            "false: the lab kubelet makes no user namespaces. Fix: drop hostUsers".into(),
        ));
    }
    if let Some(rc) = spec.runtime_class_name.as_deref().filter(|r| !r.is_empty()) {
        return Err(refuse(
            "spec.runtimeClassName",
            format!(
                "{rc:?}: the lab kubelet has no API server to read the RuntimeClass from; it uses the runtime's default handler. Fix: drop runtimeClassName"
            ),
        ));
    }
    if spec.resource_claims.as_ref().is_some_and(|r| !r.is_empty()) {
        return Err(refuse(
            "spec.resourceClaims",
            "DRA claims need the API server: run the pod with `pod run --kubeconfig` (without --manifest)".into(),
        ));
    }
    if spec.resources.is_some() {
        return Err(refuse(
            "spec.resources",
            "pod-level resources are not modelled by the lab kubelet. Fix: set the container's resources".into(),
        ));
    }
    if spec.dns_config.is_some() || spec.dns_policy.as_deref() == Some("None") {
        notes.insert(
            "dns".into(),
            "dnsConfig not applied: the sandbox gets the runtime's default resolv.conf (the lab has no cluster DNS)".into(),
        );
    }
    if spec.host_aliases.as_ref().is_some_and(|h| !h.is_empty()) {
        notes.insert(
            "host_aliases".into(),
            "not written (the lab kubelet manages no /etc/hosts)".into(),
        );
    }
    if let Some(psc) = &spec.security_context
        && psc.se_linux_options.is_some()
    {
        notes.insert(
            "pod_security_context".into(),
            "seLinuxOptions are not passed (the runtime's defaults apply)".into(),
        );
    }
    Ok(())
}

/// What the API server validates of an init container beyond a container's fields, and what
/// the lab kubelet does not run (sidecars).
fn check_init_container(
    c: &Container,
    f: &str,
    refuse: &impl Fn(&str, String) -> FakeKubeletError,
) -> Result<()> {
    if c.restart_policy.as_deref() == Some("Always") {
        return Err(refuse(
            &format!("{f}.restartPolicy"),
            "Always (a sidecar container): the lab kubelet runs init containers to completion, one after the other, and no sidecars. Fix: drop restartPolicy, or run the sidecar as a pod of its own".into(),
        ));
    }
    if let Some(p) = c.restart_policy.as_deref() {
        return Err(refuse(
            &format!("{f}.restartPolicy"),
            format!(
                "{p:?}: only Always may be set for an init container (as the API server validates)"
            ),
        ));
    }
    for (set, field) in [
        (c.lifecycle.is_some(), "lifecycle"),
        (c.liveness_probe.is_some(), "livenessProbe"),
        (c.readiness_probe.is_some(), "readinessProbe"),
        (c.startup_probe.is_some(), "startupProbe"),
    ] {
        if set {
            return Err(refuse(
                &format!("{f}.{field}"),
                "may not be set for init containers (as the API server validates). Fix: drop it"
                    .into(),
            ));
        }
    }
    Ok(())
}

fn check_container(
    c: &Container,
    f: &str,
    refuse: &impl Fn(&str, String) -> FakeKubeletError,
    notes: &mut BTreeMap<String, String>,
) -> Result<()> {
    if c.volume_devices.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(refuse(
            &format!("{f}.volumeDevices"),
            "block volumes need a PersistentVolumeClaim; the lab kubelet has none. Fix: drop them"
                .into(),
        ));
    }
    if c.resources
        .as_ref()
        .and_then(|r| r.claims.as_ref())
        .is_some_and(|cl| !cl.is_empty())
    {
        return Err(refuse(
            &format!("{f}.resources.claims"),
            "DRA claims need the API server: run the pod with `pod run --kubeconfig` (without --manifest)".into(),
        ));
    }
    if let Some(l) = &c.lifecycle {
        if l.post_start.is_some() {
            return Err(refuse(
                &format!("{f}.lifecycle.postStart"),
                "the lab kubelet runs no lifecycle hooks (a failed postStart hook kills the container). Fix: drop the hook".into(),
            ));
        }
        if l.pre_stop.is_some() {
            notes.insert(
                "lifecycle".into(),
                "preStop is not run on `pod delete`".into(),
            );
        }
    }
    if let Some(sc) = &c.security_context {
        if sc.privileged == Some(true) && sc.allow_privilege_escalation == Some(false) {
            return Err(refuse(
                &format!("{f}.securityContext"),
                "cannot set allowPrivilegeEscalation to false and privileged to true (as the API server validates)".into(),
            ));
        }
        if let Some(pm) = sc.proc_mount.as_deref()
            && pm != "Default"
            && pm != "Unmasked"
        {
            return Err(refuse(
                &format!("{f}.securityContext.procMount"),
                format!("{pm:?} is not Default or Unmasked"),
            ));
        }
        if sc.se_linux_options.is_some() {
            notes.insert(
                "security_context".into(),
                "seLinuxOptions are not passed (the runtime's defaults apply)".into(),
            );
        }
    }
    Ok(())
}

/// Whether `name` is an extended resource (`aliyun/erdma`): domain-prefixed, not of
/// `kubernetes.io`, not `requests.*`.
fn is_extended(name: &str) -> bool {
    match name.split_once('/') {
        Some((domain, rest)) => {
            !rest.is_empty()
                && domain != "kubernetes.io"
                && !domain.ends_with(".kubernetes.io")
                && !name.starts_with("requests.")
        }
        None => false,
    }
}

fn resources(
    c: &Container,
    field: &str,
    refuse: &impl Fn(&str, String) -> FakeKubeletError,
) -> Result<(Resources, Option<(String, usize)>)> {
    let f = format!("{field}.resources");
    let empty = BTreeMap::new();
    let r = c.resources.as_ref();
    let limits = r.and_then(|r| r.limits.as_ref()).unwrap_or(&empty);
    let requests = r.and_then(|r| r.requests.as_ref()).unwrap_or(&empty);
    let parse = |side: &str, name: &str, q: &str| -> Result<Quantity> {
        let v = Quantity::parse(q).map_err(|e| refuse(&format!("{f}.{side}.{name}"), e))?;
        if v.is_negative() {
            return Err(refuse(
                &format!("{f}.{side}.{name}"),
                format!("{q:?} is negative"),
            ));
        }
        Ok(v)
    };
    let mut out = Resources::default();
    let mut extended: Option<(String, usize)> = None;
    for (side, list) in [("limits", limits), ("requests", requests)] {
        for (name, q) in list {
            let v = parse(side, name, &q.0)?;
            let field = format!("{f}.{side}.{name}");
            let as_i64 = |x: i128| {
                i64::try_from(x).map_err(|_| refuse(&field, format!("{:?} is too large", q.0)))
            };
            match name.as_str() {
                "cpu" => {
                    let m = Some(as_i64(v.milli_value())?);
                    if side == "limits" {
                        out.cpu_limit = m;
                    } else {
                        out.cpu_request = m;
                    }
                }
                "memory" => {
                    let b = Some(as_i64(v.value())?);
                    if side == "limits" {
                        out.memory_limit = b;
                    } else {
                        out.memory_request = b;
                    }
                }
                "ephemeral-storage" => {}
                n if n.starts_with("hugepages-") => {
                    return Err(refuse(
                        &field,
                        "hugepages are not modelled by the lab kubelet. Fix: drop the hugepages resource".into(),
                    ));
                }
                n if is_extended(n) => {
                    if !v.is_integer() {
                        return Err(refuse(
                            &field,
                            format!("{:?}: an extended resource is a whole number", q.0),
                        ));
                    }
                    let count = usize::try_from(v.value())
                        .map_err(|_| refuse(&field, format!("{:?} is too large", q.0)))?;
                    if side == "requests" {
                        let limit = limits.get(n).map(|l| Quantity::parse(&l.0));
                        match limit {
                            Some(Ok(l)) if l == v => {}
                            Some(Ok(l)) if l.value() == v.value() => {}
                            _ => {
                                return Err(refuse(
                                    &field,
                                    format!(
                                        "{:?}: an extended resource's request must equal its limit (as the API server validates). Fix: set resources.limits.{n} to the same count",
                                        q.0
                                    ),
                                ));
                            }
                        }
                        continue;
                    }
                    if let Some((other, _)) = &extended {
                        return Err(refuse(
                            &format!("{f}.limits"),
                            format!(
                                "two extended resources ({other}, {n}): the lab kubelet allocates one device-plugin resource per pod (its pod record holds one allocation). Fix: ask for one"
                            ),
                        ));
                    }
                    if count > 0 {
                        extended = Some((n.to_string(), count));
                    }
                }
                other => {
                    return Err(refuse(
                        &field,
                        format!(
                            "{other:?} is not a resource the lab kubelet knows (cpu, memory, ephemeral-storage, or an extended resource like aliyun/erdma)"
                        ),
                    ));
                }
            }
        }
    }
    // The API server defaults a request to its limit.
    if out.cpu_request.is_none() {
        out.cpu_request = out.cpu_limit;
    }
    if out.memory_request.is_none() {
        out.memory_request = out.memory_limit;
    }
    Ok((out, extended))
}
