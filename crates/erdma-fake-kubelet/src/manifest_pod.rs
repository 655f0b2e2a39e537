//! `pod run --manifest`: a pod from its manifest, run on the real runtime in the kubelet's
//! order. Its spec is checked and planned first ([`crate::podspec::translate::PodPlan`]), so a
//! pod the lab cannot run leaves nothing behind. Then: admission (`Allocate` of the extended
//! resource in the container's limits), the volumes (hostPath type checks, emptyDirs),
//! `RunPodSandbox`, `ImageStatus` against the pull policy, `PreStartContainer` when the plugin
//! asks, `CreateContainer` with the translated config, `StartContainer`, and the probes until
//! ready or the ready timeout. A failure before the container starts undoes what was done (as
//! the kubelet cleans up a pod that cannot start); a container that never becomes ready stays
//! recorded (`ready: false`) so it can be inspected and deleted.

use crate::client::{AllocateOptions, AllocationOutput};
use crate::pods::{self, CdiForm, PodRecord, PodSpec};
use crate::podspec::images::{self, ImageRecord};
use crate::podspec::probe::{self, ProbeTarget};
use crate::podspec::translate::{ContainerInputs, PodPlan, VolumePlan};
use crate::podspec::volumes::{self, VolumeRecord};
use crate::{FakeKubeletError, Result};
use erdma_cri::CriClient;
use erdma_kubelet::uds::ClientAuthority;
use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One manifest pod to run.
#[derive(Debug, Clone)]
pub struct ManifestRun {
    /// The checked pod.
    pub plan: PodPlan,
    /// How the Allocate response's CDI device names reach the runtime.
    pub cdi: CdiForm,
    /// `:authority` sent to the device plugin.
    pub authority: ClientAuthority,
    /// Where pod log directories are made.
    pub log_root: PathBuf,
    /// How long the container may take to become ready, from `StartContainer`.
    pub ready_timeout: Duration,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The flag-path spec the shared admission and CDI helpers take.
fn shared_spec(run: &ManifestRun) -> PodSpec {
    let p = &run.plan;
    PodSpec {
        pod: p.pod_name(),
        container: p.container.name.clone(),
        image: p.image.clone(),
        command: Vec::new(),
        resource: p.extended.clone(),
        cdi: run.cdi,
        annotations: BTreeMap::new(),
        host_network: p.host_network(),
        authority: run.authority.clone(),
        log_root: run.log_root.clone(),
        dra: None,
        run_as_user: None,
        mounts: Vec::new(),
    }
}

/// What was set up on the node, for the record and for the clean-up.
#[derive(Default)]
struct NodeState {
    volumes: Vec<VolumeRecord>,
    paths: BTreeMap<String, PathBuf>,
    pod_dir: Option<PathBuf>,
}

/// The kubelet's volume setup: each hostPath checked by type (a failure names the volume, the
/// path and the type, as the kubelet's `FailedMount` event does), each emptyDir made; then the
/// subPaths that do not exist yet (with the mode of their volume).
fn set_up_volumes(dir: &Path, plan: &PodPlan, st: &mut NodeState) -> Result<()> {
    let who = plan.pod_name();
    for v in &plan.volumes {
        match v {
            VolumePlan::HostPath { name, path, ty } => {
                let check = volumes::check_host_path(path, *ty).map_err(|e| {
                    FakeKubeletError::Refused(format!(
                        "pod {who}: MountVolume.SetUp failed for volume {name:?} (hostPath {}, type {}): {e}. Fix: make {} on the node, or change the volume's type",
                        path.display(),
                        if ty.as_str().is_empty() { "unset" } else { ty.as_str() },
                        path.display()
                    ))
                })?;
                st.paths.insert(name.clone(), path.clone());
                st.volumes.push(VolumeRecord {
                    name: name.clone(),
                    kind: "hostPath".into(),
                    host_path: path.clone(),
                    host_path_type: ty.as_str().into(),
                    check: Some(check),
                });
            }
            VolumePlan::EmptyDir { name } => {
                let pod_dir = st
                    .pod_dir
                    .get_or_insert_with(|| volumes::pod_volume_dir(dir, &plan.uid))
                    .clone();
                let path = volumes::make_empty_dir(&pod_dir, name).map_err(|source| {
                    FakeKubeletError::Io {
                        what: "make the emptyDir volume",
                        path: pod_dir.join(name),
                        source,
                    }
                })?;
                st.paths.insert(name.clone(), path.clone());
                st.volumes.push(VolumeRecord {
                    name: name.clone(),
                    kind: "emptyDir".into(),
                    host_path: path,
                    host_path_type: String::new(),
                    check: None,
                });
            }
        }
    }
    for m in plan.mounts.iter().filter(|m| !m.sub_path.is_empty()) {
        let Some(base) = st.paths.get(&m.volume) else {
            continue;
        };
        let target = base.join(&m.sub_path);
        if std::fs::symlink_metadata(&target).is_ok() {
            continue;
        }
        let mode = std::fs::metadata(base)
            .map(|md| md.permissions().mode() & 0o7777)
            .unwrap_or(0o755);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(&target)
            .map_err(|source| FakeKubeletError::Io {
                what: "create the subPath directory",
                path: target.clone(),
                source,
            })?;
    }
    Ok(())
}

/// Undoes the node side of a pod that did not start: its devices and its emptyDirs.
async fn undo(dir: &Path, spec: &PodSpec, st: &NodeState) {
    pods::release_devices(dir, spec).await;
    if let Some(d) = &st.pod_dir
        && let Err(e) = pods::remove_pod_volumes(d)
    {
        tracing::warn!(pod = %spec.pod, "removing the emptyDir volumes failed: {e}");
    }
}

/// Runs the pod of `run` (see the module documentation). The returned record says whether the
/// container became ready; it is written to `<dir>/pods/` once the container started, and again
/// with the probes' results.
pub async fn run_manifest_pod(
    dir: &Path,
    cri: &mut CriClient,
    run: &ManifestRun,
) -> Result<PodRecord> {
    let plan = &run.plan;
    let pod = plan.pod_name();
    let path = pods::record_path(dir, &pod)?;
    if path.exists() {
        return Err(FakeKubeletError::Refused(format!(
            "pod {pod} is already running ({}); delete it first",
            path.display()
        )));
    }
    let spec = shared_spec(run);
    let t0 = Instant::now();
    let mut timings = BTreeMap::new();
    let seen = k8s_openapi::jiff::Timestamp::now().to_string();
    let sandbox = plan.sandbox_config(&run.log_root, &seen);
    std::fs::create_dir_all(&sandbox.log_directory).map_err(|source| FakeKubeletError::Io {
        what: "create the pod log directory",
        path: PathBuf::from(&sandbox.log_directory),
        source,
    })?;
    // Admission: the device plugin's Allocate for the container's extended resource.
    let mut allocation: Option<AllocationOutput> = match &plan.extended {
        Some((resource, count)) => {
            let t = Instant::now();
            let a = crate::client::admit(
                dir,
                &AllocateOptions {
                    resource: resource.clone(),
                    count: *count,
                    pod: pod.clone(),
                    container: plan.container.name.clone(),
                    authority: run.authority.clone(),
                },
            )
            .await?;
            timings.insert("allocate".to_string(), ms(t.elapsed()));
            Some(a)
        }
        None => None,
    };
    let mut node = NodeState::default();
    let t = Instant::now();
    if let Err(e) = set_up_volumes(dir, plan, &mut node) {
        undo(dir, &spec, &node).await;
        return Err(e);
    }
    timings.insert("volumes".to_string(), ms(t.elapsed()));
    let t = Instant::now();
    let sandbox_id = match cri.run_pod_sandbox(sandbox.clone()).await {
        Ok(id) => id,
        Err(e) => {
            undo(dir, &spec, &node).await;
            return Err(e.into());
        }
    };
    timings.insert("sandbox".to_string(), ms(t.elapsed()));
    let started = start(
        dir,
        cri,
        run,
        &spec,
        &sandbox_id,
        &sandbox,
        allocation.as_mut(),
        &node,
        &mut timings,
    )
    .await;
    let Started {
        container_id,
        ip,
        netns,
        image,
        image_note,
        pod_ip,
        started_at,
    } = match started {
        Ok(s) => s,
        Err(e) => {
            if let Err(c) = pods::remove_sandbox(cri, &sandbox_id).await {
                tracing::warn!(pod = %pod, "cleaning up the sandbox failed: {c}");
            }
            undo(dir, &spec, &node).await;
            return Err(e);
        }
    };
    let mut notes = plan.notes.clone();
    if let Some(n) = image_note {
        notes.insert("image_pull".into(), n.into());
    }
    notes.insert(
        "cgroup_parent".into(),
        "the runtime's default (the lab kubelet makes no pod cgroups; the container's resources are passed)".into(),
    );
    let mut record = PodRecord {
        pod: pod.clone(),
        uid: plan.uid.clone(),
        sandbox_id,
        container: plan.container.name.clone(),
        container_id: container_id.clone(),
        ip,
        netns,
        cdi_devices: allocation
            .as_ref()
            .map(|a| a.cdi_devices.clone())
            .unwrap_or_default(),
        cdi_form: run.cdi,
        allocation,
        timings_ms: timings.clone(),
        dra_claims: Vec::new(),
        dra_registry: None,
        source: Some(plan.source.clone()),
        node_name: plan.spec.node_name.clone(),
        host_ip: Some(plan.node().ip.clone()),
        image: Some(image),
        volumes: node.volumes,
        pod_volume_dir: node.pod_dir,
        ready: Some(false),
        ready_after_ms: None,
        not_ready_reason: Some("probing".into()),
        probes: Vec::new(),
        notes,
    };
    pods::write_record(&path, &record)?;
    let mut target = ProbeTarget {
        cri,
        container_id: &container_id,
        pod_ip: &pod_ip,
    };
    let r = probe::wait_ready(&plan.probes, &mut target, started_at, run.ready_timeout).await;
    record.ready = Some(r.ready);
    record.ready_after_ms = r.ready_after.map(ms);
    record.not_ready_reason = r.reason;
    record.probes = r.probes;
    if let Some(after) = record.ready_after_ms {
        timings.insert("ready".to_string(), after);
    }
    timings.insert("total".to_string(), ms(t0.elapsed()));
    record.timings_ms = timings;
    pods::write_record(&path, &record)?;
    Ok(record)
}

/// What starting the container gave.
struct Started {
    container_id: String,
    ip: Option<String>,
    netns: Option<PathBuf>,
    image: ImageRecord,
    image_note: Option<&'static str>,
    pod_ip: String,
    started_at: Instant,
}

#[allow(clippy::too_many_arguments)]
async fn start(
    dir: &Path,
    cri: &mut CriClient,
    run: &ManifestRun,
    spec: &PodSpec,
    sandbox_id: &str,
    sandbox: &erdma_cri::runtime::v1::PodSandboxConfig,
    allocation: Option<&mut AllocationOutput>,
    node: &NodeState,
    timings: &mut BTreeMap<String, u64>,
) -> Result<Started> {
    let plan = &run.plan;
    let status = cri.sandbox_status(sandbox_id, true).await?;
    let ip = status
        .status
        .as_ref()
        .and_then(|s| s.network.as_ref())
        .map(|n| n.ip.clone())
        .filter(|ip| !ip.is_empty());
    let (netns, pod_ip) = if plan.host_network() {
        (None, plan.node().ip.clone())
    } else {
        (
            erdma_cri::netns_from_info(&status.info, Path::new("/proc")),
            ip.clone().unwrap_or_default(),
        )
    };
    // The kubelet's EnsureImageExists: the lab never pulls.
    let t = Instant::now();
    let lookup = images::with_default_tag(&plan.image);
    let found = cri.image_status(&lookup).await?;
    let (image, image_note) = images::decide(&plan.image, plan.pull_policy, found.as_ref())
        .map_err(|e| FakeKubeletError::Refused(format!("pod {}: {e}", plan.pod_name())))?;
    timings.insert("image".to_string(), ms(t.elapsed()));
    let (image_uid, image_username) = found
        .as_ref()
        .map(images::image_user)
        .unwrap_or((Some(0), String::new()));
    let allocation = match allocation {
        Some(a) => {
            let t = Instant::now();
            crate::client::pre_start(dir, a, run.authority.clone()).await?;
            if a.pre_start_called {
                timings.insert("pre_start".to_string(), ms(t.elapsed()));
            }
            Some(&*a)
        }
        None => None,
    };
    let mut config = plan.container_config(&ContainerInputs {
        pod_ip: &pod_ip,
        image_id: &image.id,
        image_uid,
        image_username: &image_username,
        allocation,
        volume_paths: &node.paths,
    })?;
    if let Some(a) = allocation {
        pods::push_cdi(&mut config, spec, "erdma-fake-kubelet", &a.cdi_devices);
    }
    let t = Instant::now();
    let container_id = cri
        .create_container(sandbox_id, config, sandbox.clone())
        .await?;
    timings.insert("create".to_string(), ms(t.elapsed()));
    let t = Instant::now();
    cri.start_container(&container_id).await?;
    let started_at = Instant::now();
    timings.insert("start".to_string(), ms(t.elapsed()));
    Ok(Started {
        container_id,
        ip,
        netns,
        image,
        image_note,
        pod_ip,
        started_at,
    })
}
