//! `pod run --manifest`: a pod from its manifest, run on the real runtime in the kubelet's
//! order. Its spec is checked and planned first ([`crate::podspec::translate::PodPlan`]), so a
//! pod the lab cannot run leaves nothing behind. Then: admission (`Allocate` of the extended
//! resource in each container's limits, init containers first, each reusing the devices of the
//! init containers before it as the device manager's `devicesToReuse` does; the app container
//! reuses theirs), the volumes (hostPath type checks, emptyDirs), `RunPodSandbox`; for each init
//! container in order `ImageStatus` against its pull policy, `PreStartContainer` when the plugin
//! asks, `CreateContainer`, `StartContainer` and `ContainerStatus` until it exited (exit code 0
//! needed: else the pod fails, naming the container, its exit code and the tail of its log);
//! then the same for the app container, which is probed until ready or the ready timeout. A
//! failure before the app container starts undoes what was done (as the kubelet cleans up a
//! pod that cannot start); a container that never becomes ready stays recorded
//! (`ready: false`) so it can be inspected and deleted.
//!
//! Where the kubelet restarts a failed init container (restart policy `Always`/`OnFailure`:
//! `Init:Error`, then `Init:CrashLoopBackOff`), the lab kubelet fails the pod at once.

use crate::client::{AllocateOptions, AllocationOutput};
use crate::error::{FakeKubeletError, Result};
use crate::pods::{self, CdiForm, InitContainerRecord, PodRecord, PodSpec};
use crate::podspec::atomic;
use crate::podspec::images::{self, ImageRecord};
use crate::podspec::probe::{self, ProbeTarget};
use crate::podspec::translate::{ContainerInputs, ContainerPlan, PodPlan, VolumePlan};
use crate::podspec::volumes::{self, VolumeRecord};
use erdma_cri::CriClient;
use erdma_cri::runtime::v1 as cri;
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
    /// How long the app container may take to become ready, from `StartContainer`.
    pub ready_timeout: Duration,
    /// How long each init container may run, from its `StartContainer` until it exited.
    pub init_timeout: Duration,
}

/// How often `ContainerStatus` is asked while an init container runs (the kubelet's PLEG
/// relists every second; the lab asks more often to start the next container sooner).
const INIT_POLL: Duration = Duration::from_millis(100);

/// Lines of an init container's log quoted when it fails.
const LOG_TAIL_LINES: usize = 10;

/// `3 s`, or `300 ms` for a time that is not whole seconds.
fn shown(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The flag-path spec the shared admission and CDI helpers take, for container `c`.
fn shared_spec(run: &ManifestRun, c: &ContainerPlan) -> PodSpec {
    let p = &run.plan;
    PodSpec {
        pod: p.pod_name(),
        container: c.name().to_string(),
        image: c.image.clone(),
        command: Vec::new(),
        // Any container's resource: what `release_devices` looks at to give the pod's back.
        resource: p.containers().find_map(|c| c.extended.clone()),
        cdi: run.cdi,
        annotations: BTreeMap::new(),
        host_network: p.host_network(),
        authority: run.authority.clone(),
        log_root: run.log_root.clone(),
        dra: None,
        run_as_user: None,
        mounts: Vec::new(),
        cgroup_driver: p.node().cgroup_driver,
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
/// path and the type, as the kubelet's `FailedMount` event does), each emptyDir made, the files
/// of each configMap, secret, projected and downwardAPI volume written as the atomic writer
/// does (in `<dir>/pod-volumes/<uid>/<volume>`); then the subPaths that do not exist yet (with
/// the mode of their volume).
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
            VolumePlan::Files {
                name,
                kind,
                from,
                payload,
            } => {
                let pod_dir = st
                    .pod_dir
                    .get_or_insert_with(|| volumes::pod_volume_dir(dir, &plan.uid))
                    .clone();
                // The kubelet's wrapped emptyDir, then the atomic writer's files in it.
                let path = volumes::make_empty_dir(&pod_dir, name)
                    .and_then(|p| atomic::write_payload(&p, payload).map(|_| p))
                    .map_err(|e| {
                        FakeKubeletError::Refused(format!(
                            "pod {who}: MountVolume.SetUp failed for volume {name:?} ({kind} from {from}): writing its files in {}: {e}",
                            pod_dir.join(name).display()
                        ))
                    })?;
                st.paths.insert(name.clone(), path.clone());
                st.volumes.push(VolumeRecord {
                    name: name.clone(),
                    kind: kind.to_string(),
                    host_path: path,
                    host_path_type: String::new(),
                    check: None,
                });
            }
        }
    }
    for m in plan
        .containers()
        .flat_map(|c| c.mounts.iter())
        .filter(|m| !m.sub_path.is_empty())
    {
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

/// Undoes the node side of a pod that did not start: its devices and its volumes.
async fn undo(dir: &Path, spec: &PodSpec, st: &NodeState) {
    pods::release_devices(dir, spec).await;
    if let Some(d) = &st.pod_dir
        && let Err(e) = pods::remove_pod_volumes(d)
    {
        tracing::warn!(pod = %spec.pod, "removing the pod's volumes failed: {e}");
    }
}

/// Undoes a pod whose sandbox exists: the containers made in it, the sandbox, then the node side.
async fn abort(
    dir: &Path,
    cri: &mut CriClient,
    spec: &PodSpec,
    sandbox_id: &str,
    containers: &[String],
    node: &NodeState,
) {
    for id in containers {
        if let Err(e) = cri.stop_container(id, 0).await {
            tracing::warn!(pod = %spec.pod, container = %id, "stopping a container failed: {e}");
        }
        if let Err(e) = cri.remove_container(id).await {
            tracing::warn!(pod = %spec.pod, container = %id, "removing a container failed: {e}");
        }
    }
    if let Err(c) = pods::remove_sandbox(cri, sandbox_id).await {
        tracing::warn!(pod = %spec.pod, "cleaning up the sandbox failed: {c}");
    }
    undo(dir, spec, node).await;
}

/// Admission in the kubelet's order: each init container's extended resource, reusing the
/// devices of the init containers admitted before it, then the app container's, reusing all of
/// theirs. Returns the init containers' allocations (in order) and the app container's.
async fn admit_all(
    dir: &Path,
    run: &ManifestRun,
) -> Result<(Vec<Option<AllocationOutput>>, Option<AllocationOutput>)> {
    let plan = &run.plan;
    let mut admitted: Vec<String> = Vec::new();
    let one = async |c: &ContainerPlan, admitted: &[String]| -> Result<Option<AllocationOutput>> {
        let Some((resource, count)) = &c.extended else {
            return Ok(None);
        };
        let opts = AllocateOptions {
            resource: resource.clone(),
            count: *count,
            pod: plan.pod_name(),
            container: c.name().to_string(),
            authority: run.authority.clone(),
        };
        crate::client::admit_reusing(dir, &opts, admitted)
            .await
            .map(Some)
    };
    let mut inits = Vec::new();
    for c in &plan.init_containers {
        inits.push(one(c, &admitted).await?);
        admitted.push(c.name().to_string());
    }
    let app = one(&plan.app, &admitted).await?;
    Ok((inits, app))
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
    let spec = shared_spec(run, &plan.app);
    let t0 = Instant::now();
    let mut timings = BTreeMap::new();
    let seen = k8s_openapi::jiff::Timestamp::now().to_string();
    let sandbox = plan.sandbox_config(&run.log_root, &seen);
    std::fs::create_dir_all(&sandbox.log_directory).map_err(|source| FakeKubeletError::Io {
        what: "create the pod log directory",
        path: PathBuf::from(&sandbox.log_directory),
        source,
    })?;
    let mut node = NodeState::default();
    // Admission: the device plugin's Allocate for each container's extended resource.
    let t = Instant::now();
    let (mut init_allocations, mut allocation) = match admit_all(dir, run).await {
        Ok(a) => a,
        Err(e) => {
            undo(dir, &spec, &node).await;
            return Err(e);
        }
    };
    if allocation.is_some() || init_allocations.iter().any(Option::is_some) {
        timings.insert("allocate".to_string(), ms(t.elapsed()));
    }
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
    let mut created: Vec<String> = Vec::new();
    let mut sb = SandboxRun {
        dir,
        run,
        sandbox_id: &sandbox_id,
        sandbox: &sandbox,
        node: &node,
        net: Network::default(),
        created: &mut created,
    };
    let started = match sb.network(cri).await {
        Ok(()) => {
            sb.start_all(cri, &mut init_allocations, allocation.as_mut())
                .await
        }
        Err(e) => Err(e),
    };
    let net = std::mem::take(&mut sb.net);
    let (inits, started) = match started {
        Ok(s) => s,
        Err(e) => {
            abort(dir, cri, &spec, &sandbox_id, &created, &node).await;
            return Err(e);
        }
    };
    let Started {
        container_id,
        image,
        image_note,
        started_at,
        timings: app_timings,
    } = started;
    timings.extend(app_timings);
    let mut notes = plan.notes.clone();
    if let Some(n) = image_note {
        notes.insert("image_pull".into(), n.into());
    }
    for r in &inits {
        if r.image.pull_policy == images::PullPolicy::Always {
            notes.insert(format!("image_pull/{}", r.name), images::NOT_PULLED.into());
        }
    }
    if !inits.is_empty() {
        notes.insert(
            "init_containers".into(),
            "run to completion in order before the app container; a failed one fails the pod (the kubelet would restart it)".into(),
        );
    }
    notes.insert(
        "cgroup_parent".into(),
        "the kubelet's name for the node's cgroup driver (cgroupfs: /kubepods[/burstable|/besteffort]/pod<UID>; systemd: /kubepods.slice/.../kubepods[-burstable|-besteffort]-pod<UID_>.slice), created by the runtime; the lab kubelet sets no pod-level limits on it (the container's resources are passed)".into(),
    );
    let mut record = PodRecord {
        pod: pod.clone(),
        uid: plan.uid.clone(),
        sandbox_id,
        container: plan.app.name().to_string(),
        container_id: container_id.clone(),
        ip: net.ip,
        netns: net.netns,
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
        init_containers: inits,
    };
    pods::write_record(&path, &record)?;
    let mut target = ProbeTarget {
        cri,
        container_id: &container_id,
        pod_ip: &net.pod_ip,
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

/// The sandbox's network as the runtime reports it.
#[derive(Debug, Default)]
struct Network {
    ip: Option<String>,
    netns: Option<PathBuf>,
    pod_ip: String,
}

/// What starting the app container gave.
struct Started {
    container_id: String,
    image: ImageRecord,
    image_note: Option<&'static str>,
    started_at: Instant,
    timings: BTreeMap<String, u64>,
}

/// A container created and started.
struct Launched {
    id: String,
    image: ImageRecord,
    image_note: Option<&'static str>,
    started_at: Instant,
    timings: BTreeMap<String, u64>,
}

/// The containers' side of a pod whose sandbox runs.
struct SandboxRun<'a> {
    dir: &'a Path,
    run: &'a ManifestRun,
    sandbox_id: &'a str,
    sandbox: &'a cri::PodSandboxConfig,
    node: &'a NodeState,
    net: Network,
    /// Every container created so far (for the clean-up of a pod that fails).
    created: &'a mut Vec<String>,
}

impl SandboxRun<'_> {
    async fn network(&mut self, cri: &mut CriClient) -> Result<()> {
        let plan = &self.run.plan;
        let status = cri.sandbox_status(self.sandbox_id, true).await?;
        let ip = status
            .status
            .as_ref()
            .and_then(|s| s.network.as_ref())
            .map(|n| n.ip.clone())
            .filter(|ip| !ip.is_empty());
        self.net = if plan.host_network() {
            Network {
                ip,
                netns: None,
                pod_ip: plan.node().ip.clone(),
            }
        } else {
            Network {
                netns: erdma_cri::netns_from_info(&status.info, Path::new("/proc")),
                pod_ip: ip.clone().unwrap_or_default(),
                ip,
            }
        };
        Ok(())
    }

    /// The init containers to completion, in order, then the app container started.
    async fn start_all(
        &mut self,
        cri: &mut CriClient,
        init_allocations: &mut [Option<AllocationOutput>],
        allocation: Option<&mut AllocationOutput>,
    ) -> Result<(Vec<InitContainerRecord>, Started)> {
        let plan = &self.run.plan;
        let mut inits = Vec::new();
        for (c, a) in plan.init_containers.iter().zip(init_allocations.iter_mut()) {
            inits.push(self.run_init(cri, c, a.as_mut()).await?);
        }
        let l = self.launch(cri, &plan.app, allocation).await?;
        Ok((
            inits,
            Started {
                container_id: l.id,
                image: l.image,
                image_note: l.image_note,
                started_at: l.started_at,
                timings: l.timings,
            },
        ))
    }

    /// `ImageStatus` against the pull policy, `PreStartContainer` when the plugin asks,
    /// `CreateContainer` with the translated config, `StartContainer`.
    async fn launch(
        &mut self,
        cri: &mut CriClient,
        c: &ContainerPlan,
        allocation: Option<&mut AllocationOutput>,
    ) -> Result<Launched> {
        let plan = &self.run.plan;
        let mut timings = BTreeMap::new();
        // The kubelet's EnsureImageExists: the lab never pulls.
        let t = Instant::now();
        let lookup = images::with_default_tag(&c.image);
        let found = cri.image_status(&lookup).await?;
        let (image, image_note) =
            images::decide(&c.image, c.pull_policy, found.as_ref()).map_err(|e| {
                FakeKubeletError::Refused(format!(
                    "pod {}, container {:?}: {e}",
                    plan.pod_name(),
                    c.name()
                ))
            })?;
        timings.insert("image".to_string(), ms(t.elapsed()));
        let (image_uid, image_username) = found
            .as_ref()
            .map(images::image_user)
            .unwrap_or((Some(0), String::new()));
        let allocation = match allocation {
            Some(a) => {
                let t = Instant::now();
                crate::client::pre_start(self.dir, a, self.run.authority.clone()).await?;
                if a.pre_start_called {
                    timings.insert("pre_start".to_string(), ms(t.elapsed()));
                }
                Some(&*a)
            }
            None => None,
        };
        let mut config = plan.config_for(
            c,
            &ContainerInputs {
                pod_ip: &self.net.pod_ip,
                image_id: &image.id,
                image_uid,
                image_username: &image_username,
                allocation,
                volume_paths: &self.node.paths,
            },
        )?;
        if let Some(a) = allocation {
            pods::push_cdi(
                &mut config,
                &shared_spec(self.run, c),
                "erdma-fake-kubelet",
                &a.cdi_devices,
            );
        }
        let t = Instant::now();
        let id = cri
            .create_container(self.sandbox_id, config, self.sandbox.clone())
            .await?;
        self.created.push(id.clone());
        timings.insert("create".to_string(), ms(t.elapsed()));
        let t = Instant::now();
        cri.start_container(&id).await?;
        let started_at = Instant::now();
        timings.insert("start".to_string(), ms(t.elapsed()));
        Ok(Launched {
            id,
            image,
            image_note,
            started_at,
            timings,
        })
    }

    /// Runs init container `c` until it exited; an exit code other than 0, or no exit within
    /// the init timeout, fails the pod.
    async fn run_init(
        &mut self,
        cri: &mut CriClient,
        c: &ContainerPlan,
        mut allocation: Option<&mut AllocationOutput>,
    ) -> Result<InitContainerRecord> {
        let who = format!(
            "pod {}: init container {:?} ({})",
            self.run.plan.pod_name(),
            c.name(),
            c.field
        );
        let l = self.launch(cri, c, allocation.as_deref_mut()).await?;
        let mut timings = l.timings;
        let log = Path::new(&self.sandbox.log_directory)
            .join(c.name())
            .join("0.log");
        let deadline = l.started_at + self.run.init_timeout;
        let status = loop {
            let st = cri.container_status(&l.id).await?;
            if st.state == cri::ContainerState::ContainerExited as i32 {
                break st;
            }
            if Instant::now() >= deadline {
                return Err(FakeKubeletError::Refused(format!(
                    "{who} did not exit within {} of its start (still {}); the app container does not start before it has. {}. Fix: see why it does not finish, or raise --init-timeout",
                    shown(self.run.init_timeout),
                    cri::ContainerState::try_from(st.state)
                        .map(|s| s.as_str_name().to_string())
                        .unwrap_or_else(|_| format!("state {}", st.state)),
                    log_tail(&log, LOG_TAIL_LINES)
                )));
            }
            tokio::time::sleep(INIT_POLL).await;
        };
        timings.insert("run".to_string(), ms(l.started_at.elapsed()));
        if status.exit_code != 0 {
            return Err(FakeKubeletError::Refused(format!(
                "{who} exited with code {}{} (Init:Error; the kubelet would restart it, the lab kubelet fails the pod). {}",
                status.exit_code,
                if status.reason.is_empty() {
                    String::new()
                } else {
                    format!(", reason {}", status.reason)
                },
                log_tail(&log, LOG_TAIL_LINES)
            )));
        }
        Ok(InitContainerRecord {
            name: c.name().to_string(),
            container_id: l.id,
            image: l.image,
            allocation: allocation.as_deref().cloned(),
            exit_code: status.exit_code,
            started_at_ns: status.started_at,
            finished_at_ns: status.finished_at,
            timings_ms: timings,
        })
    }
}

/// The last `n` lines of a container's CRI log (`<RFC 3339 time> <stream> <P|F> <text>`, a `P`
/// line continued by the next), as a sentence for an error.
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = match std::fs::read(path) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => return format!("Its log {} cannot be read: {e}", path.display()),
    };
    let lines = erdma_k8s::fake::cri_log_lines(&text);
    if lines.is_empty() {
        return format!("Its log {} is empty", path.display());
    }
    let from = lines.len().saturating_sub(n);
    format!(
        "The last {} lines of its log {}:\n{}",
        lines.len() - from,
        path.display(),
        lines[from..]
            .iter()
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_of_a_cri_log() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("0.log");
        std::fs::write(
            &p,
            "2026-01-01T00:00:00.000000001Z stdout F one\n\
             2026-01-01T00:00:00.000000002Z stderr P tw\n\
             2026-01-01T00:00:00.000000003Z stderr F o\n\
             2026-01-01T00:00:00.000000004Z stdout F three four\n",
        )
        .unwrap();
        assert_eq!(
            log_tail(&p, 2),
            format!(
                "The last 2 lines of its log {}:\n  two\n  three four",
                p.display()
            )
        );
        assert!(log_tail(&p, 10).contains("The last 3 lines"));
        std::fs::write(&p, "").unwrap();
        assert!(log_tail(&p, 2).ends_with("is empty"));
        assert!(
            log_tail(&d.path().join("none"), 2).contains("cannot be read"),
            "a missing log is said so"
        );
    }
}
