//! SMC-R for annotated pods in the device plugin's `PreStartContainer` (issue 6), and the
//! release of a pod's namespace from the BPF socket policy when the pod is gone.
//!
//! Pre-start: device IDs → owning pod (the published pod-resources snapshot) → sandbox (CRI:
//! network namespace, annotations) → `erdma_smc` decision with the PNET ID of the granted device
//! (from the served snapshot) → metric, Event on the pod (or a log line outside a cluster). The
//! NRI path ([`SmcrHook::at_sandbox`]) starts from the sandbox the runtime hands over and the
//! pod's devices in the snapshot. Both read the annotation once and describe the sandbox in one
//! place ([`SmcrHook::configure`]). The
//! container fails only with `--smcr-strict`; otherwise every problem, including a pod that
//! cannot be looked up (no CRI socket), is reported and the pod starts on TCP.
//!
//! Pod deletion: the hook remembers the pods it put into the BPF policy (pod → namespace
//! cookie). [`SmcrHook::reap`] asks the owner of the pod-resources answer for a fresh one every
//! few seconds; a
//! remembered pod that no longer holds the resource is gone, and its cookie leaves the policy.
//! This needs no watch on the API server and no CRI event stream, and works the same with and
//! without a cluster. A sandbox recreated under the same pod name (new namespace, new cookie)
//! releases the old cookie at its next pre-start. Pods configured with `tcp2smc` need nothing:
//! the setting dies with their namespace.

use crate::cluster::{Cluster, PodRef};
use crate::metrics::AgentMetrics;
use erdma_cri::CriClient;
use erdma_deviceplugin::PreStartHook;
use erdma_kubelet::podresources::{Answered, FRESH_WITHIN, Holder, HolderCache, SETTLE_WITHIN};
use erdma_model::{NodeDevices, PnetId, SlotId};
use erdma_smc::annotation::SmcRequest;
use erdma_smc::configure::{PodOptions, SmcConfigurator, SocketPolicy};
use erdma_smc::prestart::{EventType, OutcomeKind, PodSandbox, PreStartOutcome};
use erdma_smc::probe::Mechanism;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::Status;

/// How many pre-start decisions `/healthz` keeps.
pub const RECENT_DECISIONS: usize = 32;

/// How often the reaper looks for deleted pods.
pub const REAP_EVERY: Duration = Duration::from_secs(10);

/// One pre-start decision, as `/healthz` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// `namespace/name`, when the pod was found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The device IDs of the `PreStartContainer` call.
    pub devices: Vec<String>,
    /// What was decided (`lookup_failed`: pod-resources or CRI unavailable).
    pub outcome: OutcomeKind,
    /// The Event / log text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Whether the container was failed (`--smcr-strict`).
    pub failed_container: bool,
}

/// Where the hook looks pods up.
#[derive(Debug, Clone)]
pub struct HookConfig {
    /// Extended resource name (`aliyun/erdma`).
    pub resource: String,
    /// Who holds which device (the process's one owner of the pod-resources answer): where
    /// PreStartContainer and RunPodSandbox look a pod up.
    pub holders: Arc<HolderCache>,
    /// `--cri-socket`; `None`: the first of `erdma_cri::DEFAULT_SOCKETS` under `host_root`.
    pub cri_socket: Option<PathBuf>,
    /// The host's root as seen by the agent (for the default CRI sockets).
    pub host_root: PathBuf,
    /// The host's `/proc` as seen by the agent (for the sandbox's `/proc/<pid>/ns/net`).
    pub proc_root: PathBuf,
    /// `--smcr-strict`.
    pub strict: bool,
}

/// The SMC-R work on a pod namespace (blocking calls; the hook runs them in `spawn_blocking`).
pub trait PodConfigurator: Send + Sync + 'static {
    /// The pre-start decision for `pod` with `pnetid` (of the granted device) on its interface.
    fn prestart(&self, pod: &PodSandbox, pnetid: Option<&PnetId>) -> PreStartOutcome;
    /// Removes a namespace cookie from the BPF policy; true when it was there.
    fn release_pod(&self, netns_cookie: u64) -> Result<bool, String>;
    /// Namespaces in the BPF policy now (`None` without a policy).
    fn policy_namespaces(&self) -> Option<usize>;
}

/// The real configurator with the agent's BPF policy (when the kernel supports it).
#[derive(Clone)]
pub struct Smc {
    configurator: SmcConfigurator,
    policy: Option<Arc<dyn SocketPolicy>>,
}

impl Smc {
    /// `options` for every pod; `policy` from [`open_policy`].
    pub fn new(options: PodOptions, policy: Option<Arc<dyn SocketPolicy>>) -> Self {
        Smc {
            configurator: SmcConfigurator::new(options, policy.clone()),
            policy,
        }
    }
}

impl PodConfigurator for Smc {
    fn prestart(&self, pod: &PodSandbox, pnetid: Option<&PnetId>) -> PreStartOutcome {
        self.configurator.prestart(pod, pnetid)
    }

    fn release_pod(&self, netns_cookie: u64) -> Result<bool, String> {
        self.configurator
            .release_pod(netns_cookie)
            .map_err(|e| e.to_string())
    }

    fn policy_namespaces(&self) -> Option<usize> {
        self.policy.as_ref()?.enabled().ok().map(|v| v.len())
    }
}

/// The agent's pod options: `eth0`, IPv6 off unless `keep_ipv6`, any mechanism. Strictness is
/// decided by the hook (so that the outcome stays "unsupported" in the metrics).
pub fn pod_options(keep_ipv6: bool) -> PodOptions {
    PodOptions {
        disable_ipv6: !keep_ipv6,
        strict: false,
        sysctl_root: sysctl_root(is_read_only, |p| p.join("net").is_dir()),
        ..PodOptions::default()
    }
}

/// The `/proc/sys` through which pod sysctls (`disable_ipv6`, `tcp2smc`) are written. Container
/// runtimes mount the container's `/proc/sys` read-only unless the container is privileged; the
/// host's own `/proc/sys`, reached through PID 1's root (the agent runs with hostPID and
/// SYS_PTRACE), is writable. A `/proc/sys/net/...` file belongs to the network namespace of the
/// thread that opens it, not to the mount, so writing through the host's mount from a thread that
/// entered the pod's namespace still changes only the pod. The original remounted `/proc/sys`
/// read-write instead, which changes the container's mount for everything else too.
pub fn sysctl_root(read_only: impl Fn(&Path) -> bool, has_net: impl Fn(&Path) -> bool) -> PathBuf {
    let own = Path::new("/proc/sys");
    let host = Path::new("/proc/1/root/proc/sys");
    if read_only(own) && has_net(host) && !read_only(host) {
        host.to_path_buf()
    } else {
        own.to_path_buf()
    }
}

fn is_read_only(p: &Path) -> bool {
    nix::sys::statvfs::statvfs(p)
        .map(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
        .unwrap_or(false)
}

/// The BPF socket policy on kernels that support it: the one pinned under `pin_dir` by an
/// earlier agent, else a fresh load pinned there. `None` (logged) when the kernel lacks
/// `IPPROTO_SMC` or the `update_socket_protocol` hook, or loading fails; pods then use
/// `tcp2smc` where the kernel has it, or get an "unsupported" Event.
#[cfg(feature = "bpf")]
pub fn open_policy(pin_dir: &Path) -> Option<Arc<dyn SocketPolicy>> {
    use erdma_smc::policy::BpfSocketPolicy;
    use erdma_smc::probe;
    // The cheap probe (one socket call) first: without IPPROTO_SMC the hook does not matter.
    if !probe::ipproto_smc_works() {
        tracing::info!(
            "SMC-R BPF socket policy not loaded: IPPROTO_SMC sockets are not supported here (Linux 6.11+ with the smc module)"
        );
        return None;
    }
    if let Err(why) = probe::bpf_hook_present(
        Path::new("/proc/kallsyms"),
        Path::new("/sys/kernel/btf/vmlinux"),
    ) {
        tracing::info!("SMC-R BPF socket policy not loaded: {why}");
        return None;
    }
    match BpfSocketPolicy::open_pinned(pin_dir) {
        Ok(p) => {
            tracing::info!(dir = %pin_dir.display(), "SMC-R BPF socket policy: reusing the pinned one");
            return Some(Arc::new(p));
        }
        Err(e) => tracing::debug!("no pinned SMC-R policy: {e}"),
    }
    match BpfSocketPolicy::load() {
        Ok(mut p) => {
            match p.pin(pin_dir) {
                Ok(()) => {
                    tracing::info!(dir = %pin_dir.display(), "SMC-R BPF socket policy loaded and pinned")
                }
                Err(e) => tracing::warn!(
                    "SMC-R BPF socket policy loaded but not pinned ({e}); it detaches when the agent exits. Fix: mount bpffs at /sys/fs/bpf or pass --bpf-pin-dir"
                ),
            }
            Some(Arc::new(p))
        }
        Err(e) => {
            tracing::warn!("SMC-R BPF socket policy cannot be loaded: {e}");
            None
        }
    }
}

/// Built without the `bpf` feature: no BPF socket policy (pods use `tcp2smc` where present).
#[cfg(not(feature = "bpf"))]
pub fn open_policy(pin_dir: &Path) -> Option<Arc<dyn SocketPolicy>> {
    tracing::info!(
        dir = %pin_dir.display(),
        "SMC-R BPF socket policy unavailable: erdma-agent was built without the `bpf` feature"
    );
    None
}

/// The PNET ID of the first granted device that has one in the served snapshot. A granted device
/// is a device plugin slot ID, or a DRA device's name in the driver's pool (`erdma-0`).
pub fn pnet_of(served: &NodeDevices, device_ids: &[String]) -> Option<PnetId> {
    device_ids.iter().find_map(|id| {
        let device = match SlotId::parse(id) {
            Ok(slot) => served.device(&slot.device)?,
            Err(_) => erdma_dra::slice::find_device(served, id)?,
        };
        device.pnet_id.clone()
    })
}

/// The device plugin's `PreStartContainer` hook for SMC-R.
pub struct SmcrHook {
    cfg: HookConfig,
    smc: Arc<dyn PodConfigurator>,
    served: watch::Receiver<NodeDevices>,
    cluster: Option<Cluster>,
    metrics: Arc<AgentMetrics>,
    /// The last decisions (newest last), published for `/healthz`.
    decisions: watch::Sender<Vec<Decision>>,
    /// Pods in the BPF policy: `namespace/name` → namespace cookie.
    tracked: Mutex<BTreeMap<String, u64>>,
}

impl std::fmt::Debug for SmcrHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmcrHook")
            .field("cfg", &self.cfg)
            .field("tracked", &self.tracked())
            .finish_non_exhaustive()
    }
}

impl SmcrHook {
    /// A hook; `cluster` is used for pod Events (without it they are logged).
    pub fn new(
        cfg: HookConfig,
        smc: Arc<dyn PodConfigurator>,
        served: watch::Receiver<NodeDevices>,
        cluster: Option<Cluster>,
        metrics: Arc<AgentMetrics>,
    ) -> Self {
        if let Some(n) = smc.policy_namespaces() {
            metrics.smc.policy_namespaces.set(n as i64);
        }
        SmcrHook {
            cfg,
            smc,
            served,
            cluster,
            metrics,
            decisions: watch::channel(Vec::new()).0,
            tracked: Mutex::new(BTreeMap::new()),
        }
    }

    /// The last decisions (newest last, at most [`RECENT_DECISIONS`]), as they are made.
    pub fn decisions(&self) -> watch::Receiver<Vec<Decision>> {
        self.decisions.subscribe()
    }

    /// Pods in the BPF policy: `namespace/name` → namespace cookie.
    pub fn tracked(&self) -> BTreeMap<String, u64> {
        self.tracked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The container holding any of `device_ids`: from the published snapshot when it has them
    /// (after a pending refresh, bounded), else from a fresh one from the owner. No call here.
    async fn holder_of(&self, device_ids: &[String]) -> Result<Holder, String> {
        let holders = &self.cfg.holders;
        if let Some(h) = holders.snapshot().holding(device_ids) {
            return Ok(h.clone());
        }
        if let Some(h) = holders.settled(SETTLE_WITHIN).await.holding(device_ids) {
            return Ok(h.clone());
        }
        let fresh = holders
            .fresh_within(FRESH_WITHIN)
            .await
            .map_err(|e| format!("pod lookup failed: {e}"))?;
        if let Some(h) = fresh.holding(device_ids) {
            return Ok(h.clone());
        }
        Err(format!(
            "pod not found: no pod holds {} devices {device_ids:?} according to the kubelet's pod-resources answer",
            self.cfg.resource
        ))
    }

    async fn lookup(&self, device_ids: &[String]) -> Result<erdma_cri::SandboxInfo, String> {
        let socket = erdma_cri::find_socket(self.cfg.cri_socket.as_deref(), &self.cfg.host_root)
            .map_err(|e| format!("container runtime unavailable: {e}"))?;
        let mut cri = CriClient::connect(&socket, &self.cfg.proc_root)
            .await
            .map_err(|e| format!("container runtime unavailable: {e}"))?;
        let holder = self.holder_of(device_ids).await?;
        cri.pod_sandbox(&holder.namespace, &holder.pod)
            .await
            .map_err(|e| match e {
                erdma_cri::CriError::NotFound(_) => format!("pod not found: {e}"),
                e => format!("pod lookup failed: {e}"),
            })
    }

    /// The whole pre-start decision for one container (never fails; see
    /// [`Decision::failed_container`]).
    pub async fn decide(&self, device_ids: &[String]) -> Decision {
        let info = match self.lookup(device_ids).await {
            Ok(i) => i,
            Err(why) => {
                self.metrics.smcr_lookup_failures.inc();
                let message = format!(
                    "PreStartContainer for {} {device_ids:?}: SMC-R not configured, {why}",
                    self.cfg.resource
                );
                tracing::warn!(strict = self.cfg.strict, "{message}");
                return self.remember(Decision {
                    pod: None,
                    devices: device_ids.to_vec(),
                    outcome: OutcomeKind::LookupFailed,
                    message: Some(message),
                    failed_container: self.cfg.strict,
                });
            }
        };
        let request = SmcRequest::from_annotations(&info.annotations);
        let target = PodRef {
            namespace: info.namespace,
            name: info.name,
            uid: info.uid,
        };
        self.configure(target, info.netns, request, device_ids.to_vec())
            .await
    }

    /// NRI `RunPodSandbox`: SMC-R for pod `target` (network namespace `netns`, `None` for the
    /// node's) when its annotation asks for it and it holds devices (the published snapshot,
    /// after a pending refresh; a pod missing from it costs a fresh answer from the owner).
    /// `None` when there is nothing to decide.
    pub async fn at_sandbox(
        &self,
        target: PodRef,
        netns: Option<PathBuf>,
        annotations: &BTreeMap<String, String>,
    ) -> Option<Decision> {
        let request = SmcRequest::from_annotations(annotations);
        let who = format!("{}/{}", target.namespace, target.name);
        if !request.enabled() && !matches!(request, SmcRequest::Invalid(_)) {
            return None;
        }
        let held = self.cfg.holders.held();
        let devices = match self.cfg.holders.pod(&target.namespace, &target.name).await {
            Ok((holders, answered)) => {
                self.metrics.holder_lookups(answered == Answered::Kept);
                pod_device_ids(&holders, &target.namespace, &target.name)
            }
            Err(e) => {
                self.metrics.smcr_lookup_failures.inc();
                tracing::warn!(pod = %who, "NRI RunPodSandbox: cannot tell whether the pod holds {held}: {e}; SMC-R not configured");
                return None;
            }
        };
        if devices.is_empty() {
            tracing::info!(pod = %who, "NRI RunPodSandbox: annotated for SMC-R but holds no {held}; SMC-R not configured");
            return None;
        }
        Some(self.configure(target, netns, request, devices).await)
    }

    /// The decision for a pod found (either path): the one place its sandbox is described.
    pub async fn configure(
        &self,
        target: PodRef,
        netns: Option<PathBuf>,
        request: SmcRequest,
        devices: Vec<String>,
    ) -> Decision {
        let sandbox = PodSandbox::new(&target.namespace, &target.name, netns, request, devices);
        let device_ids = sandbox.devices.clone();
        let pod = sandbox.pod.clone();
        let pnet = pnet_of(&self.served.borrow(), &device_ids);
        let smc = self.smc.clone();
        let outcome = tokio::task::spawn_blocking(move || smc.prestart(&sandbox, pnet.as_ref()))
            .await
            .unwrap_or_else(|e| PreStartOutcome::Failed {
                pod: pod.clone(),
                error: format!("SMC-R configuration task failed: {e}"),
            });
        self.metrics.smc.record(&outcome);
        self.track(&pod, &outcome);
        let message = outcome.event_message();
        if let Some(m) = &message {
            let (kind, reason) = outcome.event_reason();
            if kind == EventType::Normal {
                tracing::info!(pod = %pod, reason, "{m}");
            } else {
                tracing::warn!(pod = %pod, reason, "{m}");
            }
            if let Some(cluster) = self.cluster.clone() {
                let m = m.clone();
                // The kubelet waits for PreStartContainer: do not make it wait for the API.
                tokio::spawn(async move {
                    if let Err(e) = cluster.pod_event(&target, kind.as_str(), reason, &m).await {
                        tracing::warn!("{e}");
                    }
                });
            }
        }
        self.remember(Decision {
            pod: Some(pod),
            devices: device_ids,
            outcome: outcome.kind(),
            message,
            failed_container: outcome.fails_container(self.cfg.strict),
        })
    }

    fn remember(&self, d: Decision) -> Decision {
        self.decisions.send_modify(|v| {
            v.push(d.clone());
            let extra = v.len().saturating_sub(RECENT_DECISIONS);
            v.drain(..extra);
        });
        d
    }

    /// Remembers a pod put into the BPF policy; a different cookie for the same pod means its
    /// sandbox was recreated, and the old namespace leaves the policy.
    fn track(&self, pod: &str, outcome: &PreStartOutcome) {
        let PreStartOutcome::Configured { report } = outcome else {
            return;
        };
        let (Some(Mechanism::BpfPolicy), Some(cookie)) = (report.mechanism, report.netns_cookie)
        else {
            return;
        };
        let old = self
            .tracked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pod.to_string(), cookie);
        if let Some(old) = old.filter(|o| *o != cookie) {
            self.release(pod, old);
        }
        self.update_gauge();
    }

    /// Takes a removed pod's namespace out of the BPF policy (NRI `RemovePodSandbox`).
    pub fn forget(&self, pod: &str) {
        let old = self
            .tracked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(pod);
        if let Some(cookie) = old {
            self.release(pod, cookie);
            self.update_gauge();
        }
    }

    fn release(&self, pod: &str, cookie: u64) {
        match self.smc.release_pod(cookie) {
            Ok(_) => tracing::info!(pod, cookie, "SMC-R: pod namespace left the BPF policy"),
            Err(e) => tracing::warn!(pod, cookie, "SMC-R: cannot release the pod namespace: {e}"),
        }
    }

    fn update_gauge(&self) {
        if let Some(n) = self.smc.policy_namespaces() {
            self.metrics.smc.policy_namespaces.set(n as i64);
        }
    }

    /// One reaper pass: releases the remembered pods that no longer hold the resource according
    /// to the kubelet. Returns the released pods; an unreachable kubelet releases nothing.
    pub async fn reap_once(&self) -> Result<Vec<String>, String> {
        if self.tracked().is_empty() {
            return Ok(Vec::new());
        }
        let holders = self.cfg.holders.fresh().await.map_err(|e| e.to_string())?;
        let live = live_pods(&holders);
        let gone: Vec<(String, u64)> = {
            let mut t = self.tracked.lock().unwrap_or_else(|p| p.into_inner());
            let gone: Vec<(String, u64)> = t
                .iter()
                .filter(|(pod, _)| !live.contains(*pod))
                .map(|(p, c)| (p.clone(), *c))
                .collect();
            for (p, _) in &gone {
                t.remove(p);
            }
            gone
        };
        for (pod, cookie) in &gone {
            self.release(pod, *cookie);
        }
        if !gone.is_empty() {
            self.update_gauge();
        }
        Ok(gone.into_iter().map(|(p, _)| p).collect())
    }

    /// Runs [`Self::reap_once`] every `every` until `cancel` fires.
    pub async fn reap(self: Arc<Self>, every: Duration, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            if let Err(e) = self.reap_once().await {
                tracing::warn!("SMC-R: cannot check for deleted pods ({e}); retrying");
            }
        }
    }
}

/// The devices that pod `namespace/name` holds, over all its containers: the device plugin's
/// slot IDs, then the DRA devices of its claims (by their name in the driver's pool), each once.
pub fn pod_device_ids(holders: &[Holder], namespace: &str, name: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for h in holders
        .iter()
        .filter(|h| h.namespace == namespace && h.pod == name)
    {
        let ids = h
            .device_ids
            .iter()
            .chain(h.claimed.iter().map(|c| &c.device));
        for id in ids {
            if !out.contains(id) {
                out.push(id.clone());
            }
        }
    }
    out
}

/// `namespace/name` of the pods among `holders`.
fn live_pods(holders: &[Holder]) -> BTreeSet<String> {
    holders
        .iter()
        .map(|h| format!("{}/{}", h.namespace, h.pod))
        .collect()
}

#[tonic::async_trait]
impl PreStartHook for SmcrHook {
    async fn pre_start(&self, device_ids: &[String]) -> Result<(), Status> {
        let d = self.decide(device_ids).await;
        if d.failed_container {
            return Err(Status::failed_precondition(d.message.unwrap_or_else(
                || format!("SMC-R could not be configured for {device_ids:?} (--smcr-strict)"),
            )));
        }
        Ok(())
    }
}

/// The SMC-R BPF policy's kernel probe and load, when the plan probes: it reads
/// /proc/kallsyms (tens of ms), so it starts at once, beside the inventory scan, and is awaited
/// by [`start`] before the device plugin starts.
pub fn start_probe(
    plan_probes: bool,
    s: &crate::cli::Settings,
) -> Option<tokio::task::JoinHandle<Option<Arc<dyn SocketPolicy>>>> {
    plan_probes.then(|| {
        let pin_dir = s.bpf_pin_dir.clone();
        tokio::task::spawn_blocking(move || open_policy(&pin_dir))
    })
}

/// The SMC-R hook for annotated pods once the probe ended (none without a probe), and its
/// reaper; `/healthz` gets its decisions. The caller hands it to the device plugin's
/// PreStartContainer or to the NRI plugin, as the plan says.
pub async fn start(
    probe: Option<tokio::task::JoinHandle<Option<Arc<dyn SocketPolicy>>>>,
    shared: crate::tasks::Shared<'_>,
    served: &watch::Receiver<NodeDevices>,
    view: &mut watch::Receiver<Vec<Decision>>,
    tasks: &mut crate::tasks::Tasks,
) -> anyhow::Result<Option<Arc<SmcrHook>>> {
    use anyhow::Context;
    let Some(probe) = probe else {
        return Ok(None);
    };
    let policy = tasks
        .pending
        .track("loading the SMC-R BPF policy", probe)
        .await
        .context("loading the SMC-R BPF policy")?;
    let s = shared.settings;
    let smc = Smc::new(pod_options(s.smcr_keep_ipv6), policy);
    let hook = Arc::new(SmcrHook::new(
        HookConfig {
            resource: s.resource_name.clone(),
            holders: shared.holders.clone(),
            cri_socket: shared.plan.sockets.cri.clone(),
            host_root: "/".into(),
            proc_root: "/proc".into(),
            strict: s.smcr_strict,
        },
        Arc::new(smc),
        served.clone(),
        shared.cluster.clone(),
        shared.metrics.clone(),
    ));
    *view = hook.decisions();
    tracing::info!(
        strict = s.smcr_strict,
        keep_ipv6 = s.smcr_keep_ipv6,
        "SMC-R pre-start hook enabled for pods annotated {}=\"true\"",
        erdma_smc::annotation::SMCR_ANNOTATION
    );
    let reap = hook.clone().reap(REAP_EVERY, tasks.cancel.clone());
    tasks.spawn("the SMC-R hook's reaper", reap);
    Ok(Some(hook))
}

#[cfg(test)]
mod sysctl_root_tests {
    use super::sysctl_root;
    use std::path::Path;

    #[test]
    fn read_only_proc_sys_goes_through_the_hosts_proc() {
        let own_ro = |p: &Path| p == Path::new("/proc/sys");
        assert_eq!(
            sysctl_root(own_ro, |_| true),
            Path::new("/proc/1/root/proc/sys")
        );
        // Writable own /proc/sys (privileged container, or not in a container): use it.
        assert_eq!(sysctl_root(|_| false, |_| true), Path::new("/proc/sys"));
        // Host proc not reachable (no hostPID): keep our own; the write error then names it.
        assert_eq!(sysctl_root(own_ro, |_| false), Path::new("/proc/sys"));
        assert_eq!(sysctl_root(|_| true, |_| true), Path::new("/proc/sys"));
    }
}
