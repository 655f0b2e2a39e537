//! The lab's kubelet from admission on, over a real container runtime (CRI): a pod is one sandbox
//! with one container. [`run_pod`] does what the kubelet does for it, in the kubelet's order:
//! with DRA ([`PodSpec::dra`]), the container's ResourceClaims are prepared before the sandbox
//! ([`crate::claims`]: `NodePrepareResources` through each claim's driver); the device plugin's
//! `Allocate` at admission ([`crate::client::admit`]: the allocation is in the ledger and on
//! pod-resources from then on, so an NRI plugin can find the pod's devices when the runtime hands
//! it the sandbox), `RunPodSandbox` (labels and annotations as the kubelet sets them),
//! `PreStartContainer` when the plugin asks for it (the sandbox exists by then, for a hook that
//! looks the pod up in the runtime), then `CreateContainer` with the Allocate response's devices,
//! mounts, envs, annotations and CDI device names, the CDI device IDs the DRA drivers returned
//! (plus the pod's own host-path mounts and user), and `StartContainer`.
//! [`delete_pod`] stops and removes the container and the sandbox, releases the devices and
//! unprepares the claims.
//!
//! Each running pod is recorded in `<dir>/pods/<namespace>_<name>.json` ([`PodRecord`]). A pod
//! from a manifest (`crate::manifest_pod`) records more: its image, volumes, probes and
//! readiness, its init containers (run to completion in the same sandbox before the app
//! container, removed by [`delete_pod`]), and notes on what the lab does differently.

use crate::claims::{DraAccess, PreparedPodClaim};
use crate::client::{AllocateOptions, AllocationOutput, MountOut};
use crate::error::{FakeKubeletError, Result};
use crate::podspec::images::ImageRecord;
use crate::podspec::probe::ProbeRecord;
use crate::podspec::volumes::VolumeRecord;
use erdma_cri::runtime::v1 as cri;
use erdma_cri::{CriClient, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID};
use erdma_kubelet::uds::ClientAuthority;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Container label with the container name (set by the kubelet).
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Prefix of the container annotations that request CDI devices (the form that predates the CRI
/// `CDI_devices` field; containerd and CRI-O read both).
pub const CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// How the Allocate response's CDI device names reach the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CdiForm {
    /// The CRI `CDI_devices` field of `ContainerConfig` (kubelet 1.28+).
    Field,
    /// A container annotation `cdi.k8s.io/<key>: name,name` (the older form).
    Annotation,
}

/// One pod to run.
#[derive(Debug, Clone)]
pub struct PodSpec {
    /// `namespace/name`.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Image reference (present in the runtime: the lab imports it at boot).
    pub image: String,
    /// The container's command (empty: the image's).
    pub command: Vec<String>,
    /// Device-plugin resource and count to allocate; `None`: a pod without the resource.
    pub resource: Option<(String, usize)>,
    /// How CDI device names are passed.
    pub cdi: CdiForm,
    /// Pod annotations (returned by the runtime in `PodSandboxStatus`).
    pub annotations: BTreeMap<String, String>,
    /// The pod uses the node's network namespace.
    pub host_network: bool,
    /// `:authority` sent to the device plugin.
    pub authority: ClientAuthority,
    /// Where pod log directories are made (the kubelet's `/var/log/pods`).
    pub log_root: PathBuf,
    /// DRA: prepare the container's ResourceClaims (read from the Pod object) and pass their CDI
    /// device IDs; `None`: no DRA.
    pub dra: Option<DraAccess>,
    /// The container's user (`securityContext.runAsUser`); `None`: the image's (root).
    pub run_as_user: Option<i64>,
    /// The pod's host-path volumes mounted into the container.
    pub mounts: Vec<MountOut>,
    /// The kubelet's cgroup driver (the form of the sandbox's cgroup parent).
    pub cgroup_driver: crate::podspec::translate::CgroupDriver,
}

/// An init container the lab's kubelet ran to completion in the pod's sandbox before the app
/// container (kept, exited, until `pod delete`, as the kubelet keeps it until the pod goes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitContainerRecord {
    /// Container name.
    pub name: String,
    /// Container id.
    pub container_id: String,
    /// The image as the runtime reported it.
    pub image: ImageRecord,
    /// Its devices (`None` without an extended resource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<AllocationOutput>,
    /// Its exit code (0: it succeeded).
    pub exit_code: i32,
    /// `started_at` and `finished_at` from `ContainerStatus` (nanoseconds since the epoch).
    pub started_at_ns: i64,
    /// See `started_at_ns`.
    pub finished_at_ns: i64,
    /// Milliseconds per step: `image`, `pre_start`, `create`, `start`, `run` (from
    /// `StartContainer` until the kubelet saw it exit).
    pub timings_ms: BTreeMap<String, u64>,
}

/// A pod the lab's kubelet started, as recorded in `<dir>/pods/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    /// `namespace/name`.
    pub pod: String,
    /// The pod UID sent to the runtime.
    pub uid: String,
    /// Sandbox id.
    pub sandbox_id: String,
    /// Container name.
    pub container: String,
    /// Container id.
    pub container_id: String,
    /// The pod IP the runtime's CNI gave it (`None` for host-network pods).
    pub ip: Option<String>,
    /// The network namespace path the runtime reports (`None` for host-network pods).
    pub netns: Option<PathBuf>,
    /// The (app) container's allocation (`None` for a container without the resource).
    pub allocation: Option<AllocationOutput>,
    /// CDI device names passed to the runtime, and how.
    pub cdi_devices: Vec<String>,
    /// `field` or `annotation`.
    pub cdi_form: CdiForm,
    /// Milliseconds per step: `prepare`, `allocate`, `sandbox`, `pre_start`, `create`, `start`,
    /// `total`.
    pub timings_ms: BTreeMap<String, u64>,
    /// ResourceClaims prepared for the container (DRA), with the CDI device IDs each gave it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dra_claims: Vec<PreparedPodClaim>,
    /// The kubelet plugin registry the claims were prepared through (to unprepare them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra_registry: Option<PathBuf>,
    /// Where the pod's spec came from (`pod run --manifest`): `DaemonSet NS/NAME in FILE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// `spec.nodeName` the pod saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// `status.hostIP` the pod saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<String>,
    /// The image as the runtime reported it (`ImageStatus`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageRecord>,
    /// The pod's volumes on the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeRecord>,
    /// The pod's own volume directory (its emptyDirs), removed by `pod delete`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_volume_dir: Option<PathBuf>,
    /// Whether the container became ready (its startup and readiness probes passed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Milliseconds from `StartContainer` to ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_after_ms: Option<u64>,
    /// Why the container is not ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready_reason: Option<String>,
    /// The probes run: startup, readiness, and one liveness check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probes: Vec<ProbeRecord>,
    /// What the lab kubelet did differently from a kubelet with an API server and a registry
    /// (`service_account`, `image_pull`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub notes: BTreeMap<String, String>,
    /// The init containers run before the app container, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<InitContainerRecord>,
}

fn split_pod(pod: &str) -> Result<(&str, &str)> {
    match pod.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns, name))
        }
        _ => Err(FakeKubeletError::Refused(format!(
            "pod {pod:?} must be NAMESPACE/NAME"
        ))),
    }
}

/// A new pod UID for `namespace/name`: `namespace-name-<nanoseconds since the epoch, hex>`.
pub fn new_uid(pod: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{nanos:x}", pod.replace('/', "-"))
}

/// Path of a pod's record.
pub fn record_path(dir: &Path, pod: &str) -> Result<PathBuf> {
    let (ns, name) = split_pod(pod)?;
    Ok(dir.join("pods").join(format!("{ns}_{name}.json")))
}

/// The record of a running pod.
pub fn read_record(dir: &Path, pod: &str) -> Result<PodRecord> {
    let path = record_path(dir, pod)?;
    let text = std::fs::read(&path).map_err(|source| FakeKubeletError::Io {
        what: "read pod record (was the pod started with `erdma-fake-kubelet pod run`?)",
        path: path.clone(),
        source,
    })?;
    serde_json::from_slice(&text).map_err(|source| FakeKubeletError::Json { path, source })
}

/// Every recorded pod (`namespace/name`), sorted.
pub fn recorded_pods(dir: &Path) -> Result<Vec<String>> {
    let d = dir.join("pods");
    let entries = match std::fs::read_dir(&d) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(FakeKubeletError::Io {
                what: "list",
                path: d,
                source,
            });
        }
    };
    let mut pods: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let stem = name.strip_suffix(".json")?;
            let (ns, pod) = stem.split_once('_')?;
            Some(format!("{ns}/{pod}"))
        })
        .collect();
    pods.sort();
    Ok(pods)
}

/// The sandbox config the kubelet would send for `spec` with pod UID `uid`.
pub fn sandbox_config(spec: &PodSpec, uid: &str) -> Result<cri::PodSandboxConfig> {
    let (ns, name) = split_pod(&spec.pod)?;
    let labels = BTreeMap::from([
        (LABEL_POD_NAME.to_string(), name.to_string()),
        (LABEL_POD_NAMESPACE.to_string(), ns.to_string()),
        (LABEL_POD_UID.to_string(), uid.to_string()),
    ]);
    let network = if spec.host_network {
        cri::NamespaceMode::Node
    } else {
        cri::NamespaceMode::Pod
    };
    Ok(cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.to_string(),
            uid: uid.to_string(),
            namespace: ns.to_string(),
            attempt: 0,
        }),
        // The kubelet sets a hostname only for pods with their own network (and UTS) namespace;
        // runc refuses a hostname in the node's UTS namespace.
        hostname: if spec.host_network {
            String::new()
        } else {
            name.to_string()
        },
        log_directory: spec
            .log_root
            .join(format!("{ns}_{name}_{uid}"))
            .display()
            .to_string(),
        labels,
        annotations: spec.annotations.clone(),
        port_mappings: Vec::new(),
        linux: Some(cri::LinuxPodSandboxConfig {
            // no CPU or memory asked: a BestEffort pod's cgroup, as the kubelet names it
            cgroup_parent: crate::podspec::translate::pod_cgroup_parent(
                spec.cgroup_driver,
                crate::podspec::translate::QosClass::BestEffort,
                uid,
            ),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: network as i32,
                    pid: cri::NamespaceMode::Container as i32,
                    ipc: cri::NamespaceMode::Pod as i32,
                    target_id: String::new(),
                }),
                privileged: false,
                ..Default::default()
            }),
            sysctls: BTreeMap::new(),
        }),
    })
}

/// The container config the kubelet would send for `spec` with `allocation`: the Allocate
/// response's devices (with their cgroup permissions), mounts, envs and annotations, and its
/// CDI device names in the form `spec.cdi` asks for.
pub fn container_config(
    spec: &PodSpec,
    sandbox: &cri::PodSandboxConfig,
    allocation: Option<&AllocationOutput>,
) -> cri::ContainerConfig {
    let mut labels = sandbox.labels.clone();
    labels.insert(LABEL_CONTAINER_NAME.to_string(), spec.container.clone());
    let mut config = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: spec.container.clone(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: spec.image.clone(),
            ..Default::default()
        }),
        command: spec.command.clone(),
        labels,
        log_path: format!("{}/0.log", spec.container),
        mounts: spec.mounts.iter().map(cri_mount).collect(),
        linux: spec.run_as_user.map(|uid| cri::LinuxContainerConfig {
            security_context: Some(cri::LinuxContainerSecurityContext {
                run_as_user: Some(cri::Int64Value { value: uid }),
                ..Default::default()
            }),
            resources: None,
        }),
        ..Default::default()
    };
    let Some(a) = allocation else {
        return config;
    };
    config.envs = a
        .envs
        .iter()
        .map(|(k, v)| cri::KeyValue {
            key: k.clone(),
            value: v.clone().into_bytes(),
        })
        .collect();
    config.mounts.extend(a.mounts.iter().map(cri_mount));
    config.devices = a
        .devices
        .iter()
        .map(|d| cri::Device {
            container_path: d.container_path.clone(),
            host_path: d.host_path.clone(),
            permissions: d.permissions.clone(),
        })
        .collect();
    config.annotations = a.annotations.clone();
    push_cdi(&mut config, spec, "erdma-fake-kubelet", &a.cdi_devices);
    config
}

/// Adds CDI device names to a container config in the form `spec.cdi` asks for; `source` names
/// the annotation key's owner (`erdma-fake-kubelet`: the device manager, `dra`: the DRA manager)
/// so that the two forms of one container do not overwrite each other.
pub fn push_cdi(config: &mut cri::ContainerConfig, spec: &PodSpec, source: &str, names: &[String]) {
    if names.is_empty() {
        return;
    }
    match spec.cdi {
        CdiForm::Field => {
            config
                .cdi_devices
                .extend(names.iter().map(|n| cri::CdiDevice { name: n.clone() }));
        }
        CdiForm::Annotation => {
            // One annotation per container and manager, as the kubelet wrote it.
            let key = format!("{CDI_ANNOTATION_PREFIX}{source}_{}", spec.container);
            config.annotations.insert(key, names.join(","));
        }
    }
}

fn cri_mount(m: &MountOut) -> cri::Mount {
    cri::Mount {
        container_path: m.container_path.clone(),
        host_path: m.host_path.clone(),
        readonly: m.read_only,
        ..Default::default()
    }
}

fn ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Runs one pod: allocation (Allocate), sandbox, PreStartContainer, container, start. On a
/// failure the sandbox (when it exists) is stopped and removed again and the allocation released,
/// as the kubelet cleans up a pod that cannot start.
pub async fn run_pod(dir: &Path, cri: &mut CriClient, spec: &PodSpec) -> Result<PodRecord> {
    let path = record_path(dir, &spec.pod)?;
    if path.exists() {
        return Err(FakeKubeletError::Refused(format!(
            "pod {} is already running ({}); delete it first",
            spec.pod,
            path.display()
        )));
    }
    let t0 = Instant::now();
    let mut timings = BTreeMap::new();
    // DRA: the kubelet prepares a pod's claims before it creates the sandbox (SyncPod), so a
    // refused claim leaves nothing behind in the runtime.
    let dra_claims = match &spec.dra {
        Some(access) => {
            let (ns, name) = split_pod(&spec.pod)?;
            let t = Instant::now();
            let c = crate::claims::prepare_container(access, ns, name, &spec.container).await?;
            timings.insert("prepare".to_string(), ms(t));
            c
        }
        None => Vec::new(),
    };
    let out = run_prepared(dir, cri, spec, &path, t0, timings, dra_claims.clone()).await;
    if out.is_err()
        && let Some(access) = &spec.dra
        && let Err(u) = crate::claims::unprepare(access, &dra_claims).await
    {
        tracing::warn!(pod = %spec.pod, "unpreparing the claims failed: {u}");
    }
    out
}

async fn run_prepared(
    dir: &Path,
    cri: &mut CriClient,
    spec: &PodSpec,
    path: &Path,
    t0: Instant,
    mut timings: BTreeMap<String, u64>,
    dra_claims: Vec<PreparedPodClaim>,
) -> Result<PodRecord> {
    let uid = new_uid(&spec.pod);
    let sandbox = sandbox_config(spec, &uid)?;
    // The kubelet creates the pod's log directory before the sandbox.
    std::fs::create_dir_all(&sandbox.log_directory).map_err(|source| FakeKubeletError::Io {
        what: "create the pod log directory",
        path: PathBuf::from(&sandbox.log_directory),
        source,
    })?;
    // Admission: the kubelet allocates devices before it syncs the pod.
    let mut allocation = match &spec.resource {
        Some((resource, count)) => {
            let t = Instant::now();
            let opts = AllocateOptions {
                resource: resource.clone(),
                count: *count,
                pod: spec.pod.clone(),
                container: spec.container.clone(),
                authority: spec.authority.clone(),
            };
            let a = crate::client::admit(dir, &opts).await?;
            timings.insert("allocate".to_string(), ms(t));
            Some(a)
        }
        None => None,
    };
    let t = Instant::now();
    let sandbox_id = match cri.run_pod_sandbox(sandbox.clone()).await {
        Ok(id) => id,
        Err(e) => {
            release_devices(dir, spec).await;
            return Err(e.into());
        }
    };
    timings.insert("sandbox".to_string(), ms(t));
    let started = start_in_sandbox(
        dir,
        cri,
        spec,
        Sandbox {
            config: &sandbox,
            id: &sandbox_id,
        },
        Grants {
            allocation: allocation.as_mut(),
            dra_claims: &dra_claims,
        },
        &mut timings,
    )
    .await;
    let container_id = match started {
        Ok(v) => v,
        Err(e) => {
            if let Err(c) = remove_sandbox(cri, &sandbox_id).await {
                tracing::warn!(pod = %spec.pod, "cleaning up the sandbox failed: {c}");
            }
            release_devices(dir, spec).await;
            return Err(e);
        }
    };
    let status = cri.sandbox_status(&sandbox_id, true).await?;
    let ip = status
        .status
        .as_ref()
        .and_then(|s| s.network.as_ref())
        .map(|n| n.ip.clone())
        .filter(|ip| !ip.is_empty());
    let netns = if spec.host_network {
        None
    } else {
        erdma_cri::netns_from_info(&status.info, Path::new("/proc"))
    };
    timings.insert("total".to_string(), ms(t0));
    let record = PodRecord {
        pod: spec.pod.clone(),
        uid,
        sandbox_id,
        container: spec.container.clone(),
        container_id,
        ip,
        netns,
        cdi_devices: allocation
            .as_ref()
            .map(|a| a.cdi_devices.clone())
            .unwrap_or_default()
            .into_iter()
            .chain(dra_claims.iter().flat_map(|c| c.cdi_devices.clone()))
            .collect(),
        cdi_form: spec.cdi,
        allocation,
        timings_ms: timings,
        dra_registry: spec.dra.as_ref().map(|a| a.registry.clone()),
        dra_claims,
        source: None,
        node_name: None,
        host_ip: None,
        image: None,
        volumes: Vec::new(),
        pod_volume_dir: None,
        ready: None,
        ready_after_ms: None,
        not_ready_reason: None,
        probes: Vec::new(),
        notes: BTreeMap::new(),
        init_containers: Vec::new(),
    };
    write_record(path, &record)?;
    Ok(record)
}

/// Writes a pod's record (atomically, as the state file).
pub(crate) fn write_record(path: &Path, record: &PodRecord) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| FakeKubeletError::Io {
            what: "create",
            path: parent.to_path_buf(),
            source,
        })?;
    }
    crate::state::write_json(path, record)
}

/// Gives a pod's devices back after it failed to start (a warning when that fails too).
pub(crate) async fn release_devices(dir: &Path, spec: &PodSpec) {
    if spec.resource.is_some()
        && let Err(r) = crate::release(dir, &spec.pod).await
    {
        tracing::warn!(pod = %spec.pod, "releasing the devices failed: {r}");
    }
}

/// A pod's sandbox as the runtime made it.
struct Sandbox<'a> {
    config: &'a cri::PodSandboxConfig,
    id: &'a str,
}

/// What the container was given: the device plugin's allocation and the prepared DRA claims.
struct Grants<'a> {
    allocation: Option<&'a mut AllocationOutput>,
    dra_claims: &'a [PreparedPodClaim],
}

async fn start_in_sandbox(
    dir: &Path,
    cri: &mut CriClient,
    spec: &PodSpec,
    sandbox: Sandbox<'_>,
    grants: Grants<'_>,
    timings: &mut BTreeMap<String, u64>,
) -> Result<String> {
    let Sandbox {
        config: sandbox,
        id: sandbox_id,
    } = sandbox;
    let dra_claims = grants.dra_claims;
    let allocation = match grants.allocation {
        Some(a) => {
            let t = Instant::now();
            crate::client::pre_start(dir, a, spec.authority.clone()).await?;
            if a.pre_start_called {
                timings.insert("pre_start".to_string(), ms(t));
            }
            Some(&*a)
        }
        None => None,
    };
    let mut config = container_config(spec, sandbox, allocation);
    let names: Vec<String> = dra_claims
        .iter()
        .flat_map(|c| c.cdi_devices.clone())
        .collect();
    push_cdi(&mut config, spec, "dra", &names);
    let t = Instant::now();
    let container_id = cri
        .create_container(sandbox_id, config, sandbox.clone())
        .await?;
    timings.insert("create".to_string(), ms(t));
    let t = Instant::now();
    cri.start_container(&container_id).await?;
    timings.insert("start".to_string(), ms(t));
    Ok(container_id)
}

/// `StopPodSandbox` and `RemovePodSandbox`.
pub(crate) async fn remove_sandbox(cri: &mut CriClient, sandbox_id: &str) -> Result<()> {
    cri.stop_pod_sandbox(sandbox_id).await?;
    cri.remove_pod_sandbox(sandbox_id).await?;
    Ok(())
}

/// Deletes a recorded pod as the kubelet does: `StopContainer` (`grace` seconds),
/// `RemoveContainer`, `RemoveContainer` of each exited init container, `StopPodSandbox`,
/// `RemovePodSandbox`, then its devices go back to the pool and its volumes are removed.
pub async fn delete_pod(
    dir: &Path,
    cri: &mut CriClient,
    pod: &str,
    grace: i64,
) -> Result<PodRecord> {
    let record = read_record(dir, pod)?;
    cri.stop_container(&record.container_id, grace).await?;
    cri.remove_container(&record.container_id).await?;
    for init in &record.init_containers {
        // The sandbox's removal takes what is left anyway; a runtime that lost the container
        // must not keep the pod from going.
        if let Err(e) = cri.remove_container(&init.container_id).await {
            tracing::warn!(pod = %pod, container = %init.name, "removing the init container failed: {e}");
        }
    }
    remove_sandbox(cri, &record.sandbox_id).await?;
    if record.allocation.is_some() {
        crate::release(dir, pod).await?;
    }
    if let Some(v) = &record.pod_volume_dir {
        remove_pod_volumes(v)?;
    }
    let path = record_path(dir, pod)?;
    std::fs::remove_file(&path).map_err(|source| FakeKubeletError::Io {
        what: "remove",
        path,
        source,
    })?;
    // After the pod is gone, as the kubelet unprepares once no container of the pod runs (it
    // retries a failed unprepare; here the error is returned to the caller).
    if let Some(registry) = &record.dra_registry
        && !record.dra_claims.is_empty()
    {
        crate::claims::unprepare_at(registry, &record.dra_claims).await?;
    }
    Ok(record)
}

/// Removes a pod's volume directory (its emptyDirs); one already gone is fine.
pub(crate) fn remove_pod_volumes(path: &Path) -> Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(FakeKubeletError::Io {
            what: "remove the pod's emptyDir volumes",
            path: path.to_path_buf(),
            source,
        }),
    }
}
