//! Per-pod RDMA usage (`--rdma-usage`, issue 32): read when asked, not on a timer. A scrape of
//! `/metrics` or a `GET /usage` asks [`UsageService::current`]: a result younger than
//! [`MAX_AGE`] is reused, else one collection runs (never two at once: a second asker waits for
//! the first's result) off the async runtime (`spawn_blocking`; RDMA netlink has its own receive
//! timeout):
//!
//! 1. the kernel's RDMA objects and port counters ([`erdma_usage::Snapshot`] over RDMA netlink),
//!    each owner PID's pod UID and container from `<proc>/<pid>/cgroup`; a scrape waits at most
//!    [`READ_BUDGET`] for it;
//! 2. who was allocated which device: the pod-resources owner's published snapshot
//!    ([`HolderCache::snapshot`], no I/O), device IDs `<device>/<slot>` or DRA devices;
//! 3. pod UID ↔ namespace/name from the container runtime's sandbox list (CRI `ListPodSandbox`),
//!    kept and listed again only when a UID or a holder is unknown to it, at most once per
//!    [`NAMES_EVERY`];
//! 4. [`erdma_usage::attribute`], then [`erdma_usage::report::build`]: the [`NodeUsage`] that
//!    `GET /usage` answers and the usage metrics ([`UsageCollector`]) are made from;
//! 5. for each listed pod that asks for SMC-R (its sandbox's annotation, from the runtime once
//!    per pod UID, with the sandbox's network namespace), its SMC sockets by mode ([`smc`]:
//!    `smc_diag` inside the pod's namespace), at most [`MAX_SMC_PODS`] pods and
//!    [`SMC_BUDGET`] per read.
//!
//! The metrics are written from the last result at each scrape (a prometheus-client collector,
//! no family that accumulates), so a pod that ended leaves the exposition with its objects.
//!
//! Test hooks (environment, not settings): `ERDMA_AGENT_FAKE_RDMA` names a file describing the
//! kernel's answer ([`parse_fake`]) used instead of RDMA netlink, `ERDMA_AGENT_PROC_ROOT` a
//! directory used instead of `/proc`, `ERDMA_AGENT_FAKE_SMC` a file describing SMC sockets
//! ([`smc::parse_fake`]).

pub mod smc;

use erdma_cri::{PodIdentity, SandboxInfo};
use erdma_kubelet::podresources::{Holder, HolderCache};
use erdma_usage::report::{self, NodeUsage, PodName, SmcSummary, TrafficKind};
use erdma_usage::{
    CqEntry, DeviceEntry, FakeSource, MrEntry, NetlinkSource, PdEntry, PodDevices, PodUid,
    PortCounters, QpEntry, QpState, QpType, Snapshot, UsageSource,
};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A result younger than this is reused.
pub const MAX_AGE: Duration = Duration::from_secs(2);
/// How long a scrape waits for the kernel's answer (RDMA netlink times out each receive after
/// 2 s, and a read makes several): past it the answer says so, and the read, left to finish,
/// keeps the next ones from starting until it has.
pub const READ_BUDGET: Duration = Duration::from_secs(5);
/// The sandbox list is asked again for an unknown pod at most this often.
pub const NAMES_EVERY: Duration = Duration::from_secs(10);
/// Most pods the metrics name (the rest are counted in `erdma_usage_pods_left_out`); with at
/// most [`erdma_usage::nldev`]'s 8 QP states and the node's devices this bounds the series.
pub const MAX_METRIC_PODS: usize = 256;
/// Most pods whose SMC sockets one read dumps (the rest carry an error saying so).
pub const MAX_SMC_PODS: usize = 64;
/// Most pods one read asks the runtime about (their sandbox: the SMC-R annotation and network
/// namespace, kept per pod UID); the rest wait for the next read.
pub const MAX_SMC_LOOKUPS: usize = 8;
/// How long a read waits for the runtime's sandbox answers, and separately for the SMC dumps.
pub const SMC_BUDGET: Duration = Duration::from_secs(2);

/// The environment variable naming a fake kernel answer (tests).
pub const FAKE_RDMA_ENV: &str = "ERDMA_AGENT_FAKE_RDMA";
/// The environment variable naming a `/proc` to read instead of the real one (tests).
pub const PROC_ROOT_ENV: &str = "ERDMA_AGENT_PROC_ROOT";

/// Internal UID of a pod known by name only (allocated a device, its UID not in the runtime's
/// list): `name:<namespace>/<name>`; the answer shows such a pod with an empty UID.
const NAME_ONLY: &str = "name:";

/// Lists the pods the container runtime knows.
pub trait PodLister: Send + Sync {
    /// Every pod: UID, namespace, name.
    fn list(&self) -> Pin<Box<dyn Future<Output = Result<Vec<PodIdentity>, String>> + Send + '_>>;

    /// The ready sandbox of pod `namespace/name`: its UID, annotations and network namespace;
    /// `None` from a lister that cannot look sandboxes up (then no pod gets an SMC summary).
    fn sandbox<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Option<SandboxInfo>, String>> + Send + 'a>> {
        let _ = (namespace, name);
        Box::pin(async { Ok(None) })
    }
}

/// The runtime's CRI socket (`--cri-socket`, else the usual places).
pub struct CriLister {
    /// `--cri-socket`.
    pub socket: Option<PathBuf>,
    /// The host's `/proc` (for a sandbox the runtime names by its PID only).
    pub proc_root: PathBuf,
}

impl CriLister {
    async fn client(&self) -> Result<erdma_cri::CriClient, String> {
        let socket = erdma_cri::find_socket(self.socket.as_deref(), std::path::Path::new("/"))
            .map_err(|e| e.to_string())?;
        erdma_cri::CriClient::connect(&socket, &self.proc_root)
            .await
            .map_err(|e| e.to_string())
    }
}

impl PodLister for CriLister {
    fn list(&self) -> Pin<Box<dyn Future<Output = Result<Vec<PodIdentity>, String>> + Send + '_>> {
        Box::pin(async move { self.client().await?.pods().await.map_err(|e| e.to_string()) })
    }

    fn sandbox<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Option<SandboxInfo>, String>> + Send + 'a>> {
        Box::pin(async move {
            self.client()
                .await?
                .pod_sandbox(namespace, name)
                .await
                .map(Some)
                .map_err(|e| e.to_string())
        })
    }
}

/// A fixed list (tests).
impl PodLister for Vec<PodIdentity> {
    fn list(&self) -> Pin<Box<dyn Future<Output = Result<Vec<PodIdentity>, String>> + Send + '_>> {
        let v = self.clone();
        Box::pin(async move { Ok(v) })
    }
}

/// Pod names by UID, and UIDs by name, from the runtime's last list.
#[derive(Default)]
struct Names {
    by_uid: BTreeMap<PodUid, PodName>,
    by_name: BTreeMap<PodName, PodUid>,
    listed: Option<Instant>,
}

impl Names {
    /// Lists the pods again when one of `uids` or `pods` is unknown and the last list is older
    /// than [`NAMES_EVERY`].
    async fn cover(
        &mut self,
        lister: &dyn PodLister,
        uids: &BTreeSet<PodUid>,
        pods: &BTreeSet<PodName>,
    ) {
        let missing = uids.iter().any(|u| !self.by_uid.contains_key(u))
            || pods.iter().any(|p| !self.by_name.contains_key(p));
        if !missing || self.listed.is_some_and(|t| t.elapsed() < NAMES_EVERY) {
            return;
        }
        self.listed = Some(Instant::now());
        match lister.list().await {
            Ok(list) => {
                self.by_uid.clear();
                self.by_name.clear();
                for p in list {
                    let name = PodName {
                        namespace: p.namespace,
                        name: p.name,
                    };
                    self.by_name.insert(name.clone(), PodUid(p.uid.clone()));
                    self.by_uid.insert(PodUid(p.uid), name);
                }
            }
            Err(e) => tracing::debug!("RDMA usage: listing the runtime's pods: {e}"),
        }
    }
}

/// What the runtime said of a pod's sandbox, kept per pod UID.
#[derive(Debug, Clone)]
enum SmcTarget {
    /// The pod does not ask for SMC-R: no summary.
    NotAsked,
    /// It asks; its network namespace.
    Netns(PathBuf),
    /// It asks but uses the node's network namespace.
    HostNetwork,
    /// The runtime could not say (asked again after [`NAMES_EVERY`]).
    Unknown { error: String, at: Instant },
}

/// The last result.
#[derive(Clone)]
struct Collected {
    at: Instant,
    took: Duration,
    usage: Arc<NodeUsage>,
}

/// Where usage is read from.
pub struct UsageInputs {
    /// The kernel (RDMA netlink, or a fake).
    pub source: Arc<dyn UsageSource + Send + Sync>,
    /// `/proc` of the host PID namespace.
    pub proc_root: PathBuf,
    /// Who holds which device: the pod-resources owner's last answer (no I/O).
    pub holders: Arc<dyn Fn() -> Arc<Vec<Holder>> + Send + Sync>,
    /// The runtime's pods.
    pub pods: Arc<dyn PodLister>,
    /// This node's name.
    pub node: Option<String>,
}

/// Usage on request: see the module.
pub struct UsageService {
    inputs: UsageInputs,
    names: tokio::sync::Mutex<Names>,
    collecting: tokio::sync::Mutex<()>,
    reading: AtomicBool,
    budget: Duration,
    last: Mutex<Option<Collected>>,
    smc: Arc<dyn smc::SmcReader>,
    smc_targets: tokio::sync::Mutex<BTreeMap<String, SmcTarget>>,
    smc_reading: AtomicBool,
    remote_readers: AtomicBool,
}

impl UsageService {
    /// A service reading `inputs` (SMC sockets with `smc_diag`, or `ERDMA_AGENT_FAKE_SMC`).
    pub fn new(inputs: UsageInputs) -> Arc<Self> {
        Self::with_smc(inputs, smc::from_env())
    }

    /// A service reading `inputs`, and pods' SMC sockets with `smc`.
    pub fn with_smc(inputs: UsageInputs, smc: Arc<dyn smc::SmcReader>) -> Arc<Self> {
        Arc::new(UsageService {
            inputs,
            names: tokio::sync::Mutex::new(Names::default()),
            collecting: tokio::sync::Mutex::new(()),
            reading: AtomicBool::new(false),
            budget: READ_BUDGET,
            last: Mutex::new(None),
            smc,
            smc_targets: tokio::sync::Mutex::new(BTreeMap::new()),
            smc_reading: AtomicBool::new(false),
            remote_readers: AtomicBool::new(false),
        })
    }

    /// Lets any peer read the per-pod usage (`--usage-remote`); by default only loopback peers.
    pub fn serve_remote_readers(&self, on: bool) {
        self.remote_readers.store(on, Ordering::Relaxed);
    }

    /// Whether `peer` may read the per-pod usage (`/usage`, the per-pod families of `/metrics`):
    /// a loopback peer (a process on the node, or `kubectl port-forward` to the agent's
    /// host-network pod, which the runtime dials from the node's loopback), or any peer with
    /// `--usage-remote`. `Err` is the answer for the others (an unknown peer is one of them).
    pub fn readable_by(&self, peer: Option<std::net::SocketAddr>) -> Result<(), String> {
        let loopback = peer.is_some_and(|p| p.ip().to_canonical().is_loopback());
        if loopback || self.remote_readers.load(Ordering::Relaxed) {
            return Ok(());
        }
        let from = peer.map_or_else(|| "an unknown address".to_string(), |p| p.ip().to_string());
        Err(format!(
            "per-pod RDMA usage names the pods of this node, so this agent serves it to loopback \
             clients only, and this request came from {from}. Read it on the node, or through \
             `kubectl port-forward -n <namespace> <agent pod> <port>` and \
             `erdmactl top pods --agent-addr 127.0.0.1:<port>`; or start the agent with \
             --usage-remote=true to serve it to every client that reaches this port"
        ))
    }

    /// The real inputs: RDMA netlink (or `ERDMA_AGENT_FAKE_RDMA`), `/proc` (or
    /// `ERDMA_AGENT_PROC_ROOT`), the runtime at `cri_socket`.
    pub fn real(
        holders: Arc<HolderCache>,
        cri_socket: Option<PathBuf>,
        node: Option<String>,
    ) -> Arc<Self> {
        let source: Arc<dyn UsageSource + Send + Sync> = match std::env::var_os(FAKE_RDMA_ENV) {
            Some(path) => Arc::new(FakeFile(path.into())),
            None => Arc::new(NetlinkSource::new()),
        };
        let proc_root = std::env::var_os(PROC_ROOT_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| "/proc".into());
        Self::new(UsageInputs {
            source,
            holders: Arc::new(move || holders.snapshot().holders.clone()),
            pods: Arc::new(CriLister {
                socket: cri_socket,
                proc_root: proc_root.clone(),
            }),
            proc_root,
            node,
        })
    }

    fn fresh(&self) -> Option<Collected> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.as_ref().filter(|c| c.at.elapsed() < MAX_AGE).cloned()
    }

    /// The last result, whatever its age (what the metrics are written from).
    fn latest(&self) -> Option<Collected> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The usage now: the last result when younger than [`MAX_AGE`], else a new collection (one
    /// at a time).
    pub async fn current(self: &Arc<Self>) -> Arc<NodeUsage> {
        if let Some(c) = self.fresh() {
            return c.usage;
        }
        let _one = self.collecting.lock().await;
        if let Some(c) = self.fresh() {
            return c.usage;
        }
        let start = Instant::now();
        let usage = Arc::new(self.collect().await);
        let c = Collected {
            at: Instant::now(),
            took: start.elapsed(),
            usage: usage.clone(),
        };
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(c);
        // The read's snapshot and maps are freed by now: their pages go back, so that a node
        // scraped every few seconds keeps the idle agent's resident set.
        erdma_host::resident::give_back_free_heap();
        usage
    }

    async fn collect(self: &Arc<Self>) -> NodeUsage {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let node = self.inputs.node.clone();
        let held = (self.inputs.holders)();
        // One kernel read at a time, even past the budget: a read still running when its scrape
        // gave up keeps the next ones from starting another.
        if self.reading.swap(true, Ordering::SeqCst) {
            return NodeUsage::unavailable(
                node,
                now_ms,
                "the previous read of the kernel's RDMA objects has not finished (RDMA netlink slow to answer)".into(),
            );
        }
        let me = self.clone();
        let read = tokio::task::spawn_blocking(move || {
            let r = Snapshot::read(me.inputs.source.as_ref()).map(|snap| {
                let pids = snap.pids();
                let pid_pods = erdma_usage::cgroup::read_pid_pods(&me.inputs.proc_root, &pids);
                (snap, pid_pods)
            });
            me.reading.store(false, Ordering::SeqCst);
            r
        });
        let (snap, pid_pods) = match tokio::time::timeout(self.budget, read).await {
            Ok(Ok(Ok(v))) => v,
            Ok(Ok(Err(e))) => return NodeUsage::unavailable(node, now_ms, e.to_string()),
            Ok(Err(e)) => {
                return NodeUsage::unavailable(node, now_ms, format!("the read failed: {e}"));
            }
            Err(_) => {
                return NodeUsage::unavailable(
                    node,
                    now_ms,
                    format!(
                        "the kernel's RDMA objects were not read within {:?}",
                        self.budget
                    ),
                );
            }
        };
        let allocated = allocated_by_name(&held, &snap);
        let uids: BTreeSet<PodUid> = pid_pods.values().map(|(u, _)| u.clone()).collect();
        let wanted: BTreeSet<PodName> = allocated.keys().cloned().collect();
        let mut names = self.names.lock().await;
        names.cover(self.inputs.pods.as_ref(), &uids, &wanted).await;
        let mut by_uid = names.by_uid.clone();
        let mut pod_devices = PodDevices::new();
        for (pod, devs) in allocated {
            let uid = names
                .by_name
                .get(&pod)
                .cloned()
                .unwrap_or_else(|| PodUid(format!("{NAME_ONLY}{pod}")));
            by_uid.insert(uid.clone(), pod);
            pod_devices.entry(uid).or_default().extend(devs);
        }
        drop(names);
        let usage = erdma_usage::attribute(&snap, &pid_pods, &pod_devices);
        let mut r = report::build(&usage, &by_uid, node, now_ms);
        for p in &mut r.pods {
            if p.uid.starts_with(NAME_ONLY) {
                p.uid.clear();
            }
        }
        self.add_smc(&mut r).await;
        r
    }

    /// Step 5 of the module: the SMC summary of each listed pod that asks for SMC-R.
    async fn add_smc(self: &Arc<Self>, r: &mut NodeUsage) {
        let mut targets = self.smc_targets.lock().await;
        let listed: BTreeSet<&str> = r.pods.iter().map(|p| p.uid.as_str()).collect();
        targets.retain(|uid, _| listed.contains(uid.as_str()));
        // The runtime is asked about pods it has not answered for yet, a few per read.
        let wanted: Vec<(String, String, String)> = r
            .pods
            .iter()
            .filter(|p| !p.uid.is_empty())
            .filter(|p| match targets.get(&p.uid) {
                None => true,
                Some(SmcTarget::Unknown { at, .. }) => at.elapsed() >= NAMES_EVERY,
                Some(_) => false,
            })
            .filter_map(|p| Some((p.uid.clone(), p.namespace.clone()?, p.name.clone()?)))
            .take(MAX_SMC_LOOKUPS)
            .collect();
        let lister = self.inputs.pods.clone();
        let _ = tokio::time::timeout(SMC_BUDGET, async {
            for (uid, ns, name) in wanted {
                let t = match lister.sandbox(&ns, &name).await {
                    Ok(None) => SmcTarget::NotAsked,
                    Ok(Some(sb)) if sb.uid != uid => SmcTarget::Unknown {
                        error: format!(
                            "the runtime's ready sandbox of {ns}/{name} is of pod UID {}, not {uid}",
                            sb.uid
                        ),
                        at: Instant::now(),
                    },
                    Ok(Some(sb)) => {
                        let asks = erdma_smc::annotation::SmcRequest::from_annotations(
                            &sb.annotations,
                        )
                        .enabled();
                        match (asks, sb.host_network, sb.netns) {
                            (false, _, _) => SmcTarget::NotAsked,
                            (true, true, _) | (true, false, None) => SmcTarget::HostNetwork,
                            (true, false, Some(ns)) => SmcTarget::Netns(ns),
                        }
                    }
                    Err(e) => SmcTarget::Unknown {
                        error: format!("the container runtime did not say (SMC-R annotation, network namespace): {e}"),
                        at: Instant::now(),
                    },
                };
                targets.insert(uid, t);
            }
        })
        .await;
        let mut dumps: Vec<(String, PathBuf)> = Vec::new();
        for p in &mut r.pods {
            let error = |e: String| {
                Some(SmcSummary {
                    error: Some(e),
                    ..Default::default()
                })
            };
            p.smc = match targets.get(&p.uid) {
                None | Some(SmcTarget::NotAsked) => None,
                Some(SmcTarget::HostNetwork) => error(
                    "the pod uses the node's network namespace: SMC-R is not set up for host-network pods".into(),
                ),
                Some(SmcTarget::Unknown { error: e, .. }) => error(e.clone()),
                Some(SmcTarget::Netns(_)) if dumps.len() >= MAX_SMC_PODS => error(format!(
                    "not read: at most {MAX_SMC_PODS} pods' SMC sockets are read at a time"
                )),
                Some(SmcTarget::Netns(ns)) => {
                    dumps.push((p.uid.clone(), ns.clone()));
                    None
                }
            };
        }
        if dumps.is_empty() {
            return;
        }
        let unread = |why: String, r: &mut NodeUsage| {
            for p in &mut r.pods {
                if dumps.iter().any(|(u, _)| *u == p.uid) {
                    p.smc = Some(SmcSummary {
                        error: Some(why.clone()),
                        ..Default::default()
                    });
                }
            }
        };
        // As with the RDMA read: one dump at a time, even past the budget.
        if self.smc_reading.swap(true, Ordering::SeqCst) {
            unread(
                "the previous read of SMC sockets has not finished".into(),
                r,
            );
            return;
        }
        let me = self.clone();
        let todo = dumps.clone();
        let read = tokio::task::spawn_blocking(move || {
            let out: Vec<(String, Result<SmcSummary, smc::ReadError>)> = todo
                .into_iter()
                .map(|(uid, ns)| (uid, me.smc.sockets(&ns).map(|s| smc::summarise(&s))))
                .collect();
            me.smc_reading.store(false, Ordering::SeqCst);
            out
        });
        let results = match tokio::time::timeout(SMC_BUDGET, read).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return unread(format!("the SMC read failed: {e}"), r),
            Err(_) => {
                return unread(
                    format!("the pod's SMC sockets were not read within {SMC_BUDGET:?}"),
                    r,
                );
            }
        };
        for (uid, res) in results {
            let summary = match res {
                Ok(s) => s,
                Err(e) => {
                    if matches!(e, smc::ReadError::Gone(_)) {
                        targets.remove(&uid);
                    }
                    SmcSummary {
                        error: Some(e.message().to_string()),
                        ..Default::default()
                    }
                }
            };
            if let Some(p) = r.pods.iter_mut().find(|p| p.uid == uid) {
                p.smc = Some(summary);
            }
        }
    }
}

/// Pod → the RDMA devices the kubelet allocated it: slot IDs `<device>/<index>` of the device
/// plugin, and DRA devices by their ResourceSlice name (the RDMA device whose DNS-label form it
/// is).
fn allocated_by_name(held: &[Holder], snap: &Snapshot) -> BTreeMap<PodName, BTreeSet<String>> {
    let dra_names: BTreeMap<String, String> = snap
        .devices
        .iter()
        .filter_map(|d| Some((erdma_dra::slice::device_name(&d.name)?, d.name.clone())))
        .collect();
    let mut out: BTreeMap<PodName, BTreeSet<String>> = BTreeMap::new();
    for h in held {
        let devs = out
            .entry(PodName {
                namespace: h.namespace.clone(),
                name: h.pod.clone(),
            })
            .or_default();
        for id in &h.device_ids {
            if let Ok(slot) = erdma_model::SlotId::parse(id) {
                devs.insert(slot.device);
            }
        }
        for c in &h.claimed {
            if let Some(d) = dra_names.get(&c.device) {
                devs.insert(d.clone());
            }
        }
    }
    out
}

/// Writes every usage metric (per node, device and pod) from the service's last result at each
/// scrape.
#[derive(Clone)]
pub struct UsageCollector(pub Arc<UsageService>);

/// Writes the usage metrics that name no pod (the per-node and per-device families) from the
/// service's last result at each scrape: what the one registry holds when `--rdma-usage` is on.
#[derive(Clone)]
pub struct NodeUsageCollector(pub Arc<UsageService>);

/// Writes the usage metrics that name pods (`erdma_pod_*`, `erdma_device_traffic_pod`) from the
/// service's last result: what `/metrics` adds for a peer [`UsageService::readable_by`] allows.
#[derive(Clone)]
pub struct PodUsageCollector(pub Arc<UsageService>);

/// Which usage families a collector writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageFamilies {
    /// Every family.
    All,
    /// The families that name no pod.
    Node,
    /// The families that name pods.
    Pods,
}

impl UsageFamilies {
    fn node(self) -> bool {
        self != UsageFamilies::Pods
    }
    fn pods(self) -> bool {
        self != UsageFamilies::Node
    }
}

impl std::fmt::Debug for NodeUsageCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeUsageCollector")
    }
}

impl std::fmt::Debug for PodUsageCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PodUsageCollector")
    }
}

impl prometheus_client::collector::Collector for NodeUsageCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        match self.0.latest() {
            Some(c) => encode_usage(&c.usage, Some(c.took), UsageFamilies::Node, encoder),
            None => Ok(()),
        }
    }
}

impl prometheus_client::collector::Collector for PodUsageCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        match self.0.latest() {
            Some(c) => encode_usage(&c.usage, Some(c.took), UsageFamilies::Pods, encoder),
            None => Ok(()),
        }
    }
}

impl std::fmt::Debug for UsageCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UsageCollector")
    }
}

impl prometheus_client::collector::Collector for UsageCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        match self.0.latest() {
            Some(c) => encode_usage(&c.usage, Some(c.took), UsageFamilies::All, encoder),
            None => Ok(()),
        }
    }
}

type Labels = Vec<(&'static str, String)>;

/// One family: its samples as `(labels, value)`.
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    ty: MetricType,
    samples: Vec<(Labels, M)>,
) -> Result<(), std::fmt::Error> {
    if samples.is_empty() {
        return Ok(());
    }
    let mut m = encoder.encode_descriptor(name, help, None, ty)?;
    for (labels, v) in samples {
        v.encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauge(v: u64) -> ConstGauge<i64> {
    ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))
}

/// The usage metrics of `u` of the kind `which` (see docs/operations.md for each family and its
/// bound).
pub fn encode_usage(
    u: &NodeUsage,
    took: Option<Duration>,
    which: UsageFamilies,
    mut e: DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    if which.node() {
        encode_node_usage(u, took, &mut e)?;
    }
    if which.pods() {
        encode_pod_usage(u, &mut e)?;
    }
    Ok(())
}

fn encode_node_usage(
    u: &NodeUsage,
    took: Option<Duration>,
    e: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    family(
        e,
        "erdma_usage_available",
        "1 when the last usage read succeeded (RDMA netlink answered), else 0",
        MetricType::Gauge,
        vec![(vec![], gauge(u.available as u64))],
    )?;
    if let Some(t) = took {
        family(
            e,
            "erdma_usage_collection_seconds",
            "How long the last usage read took",
            MetricType::Gauge,
            vec![(vec![], ConstGauge::new(t.as_secs_f64()))],
        )?;
    }
    let shown = &u.pods[..u.pods.len().min(MAX_METRIC_PODS)];
    family(
        e,
        "erdma_usage_pods_left_out",
        "Pods with RDMA usage left out of the per-pod metrics (more than 256)",
        MetricType::Gauge,
        vec![(vec![], gauge((u.pods.len() - shown.len()) as u64))],
    )?;

    let (mut holders, mut traffic) = (Vec::new(), Vec::new());
    let (mut txb, mut rxb, mut txp, mut rxp, mut errs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for d in &u.devices {
        let dev = || vec![("device", d.device.clone())];
        holders.push((dev(), gauge(d.holders.len() as u64)));
        let kind = match d.traffic {
            TrafficKind::Pod => "pod",
            TrafficKind::Shared => "shared",
            TrafficKind::Unused => "unused",
        };
        let mut l = dev();
        l.push(("traffic", kind.to_string()));
        traffic.push((l, gauge(1)));
        for port in &d.ports {
            let l = || {
                vec![
                    ("device", d.device.clone()),
                    ("port", port.port.to_string()),
                ]
            };
            for (v, out) in [
                (port.tx_bytes, &mut txb),
                (port.rx_bytes, &mut rxb),
                (port.tx_packets, &mut txp),
                (port.rx_packets, &mut rxp),
            ] {
                if let Some(v) = v {
                    out.push((l(), ConstCounter::new(v)));
                }
            }
            for name in report::ERROR_COUNTERS {
                if let Some(v) = port.counters.get(*name) {
                    let mut l = l();
                    l.push(("counter", name.to_string()));
                    errs.push((l, ConstCounter::new(*v)));
                }
            }
        }
    }
    family(
        e,
        "erdma_device_holders",
        "Pods allocated the device or seen using it",
        MetricType::Gauge,
        holders,
    )?;
    family(
        e,
        "erdma_device_traffic",
        "Whose the device's traffic is: 1 for the device's one kind (pod: one pod holds it alone; shared; unused)",
        MetricType::Gauge,
        traffic,
    )?;
    family(
        e,
        "erdma_device_tx_bytes",
        "Bytes sent by the port (drivers that count them: erdma, bnxt_re)",
        MetricType::Counter,
        txb,
    )?;
    family(
        e,
        "erdma_device_rx_bytes",
        "Bytes received by the port (drivers that count them: erdma, bnxt_re)",
        MetricType::Counter,
        rxb,
    )?;
    family(
        e,
        "erdma_device_tx_packets",
        "Packets sent by the port",
        MetricType::Counter,
        txp,
    )?;
    family(
        e,
        "erdma_device_rx_packets",
        "Packets received by the port",
        MetricType::Counter,
        rxp,
    )?;
    family(
        e,
        "erdma_device_errors",
        "The port's drop, retransmit, NAK and congestion counters, by the driver's counter name",
        MetricType::Counter,
        errs,
    )?;

    let (mut oq, mut ob) = (Vec::new(), Vec::new());
    for o in &u.others {
        let kind = match o.kind {
            report::OtherKind::Host => "host",
            report::OtherKind::Kernel => "kernel",
            report::OtherKind::Unknown => "unknown",
        };
        let l = vec![("device", o.device.clone()), ("owner", kind.to_string())];
        oq.push((l.clone(), gauge(o.counts.qps)));
        ob.push((l, gauge(o.counts.mr_bytes)));
    }
    family(
        e,
        "erdma_device_other_qps",
        "Queue pairs not of a pod: owner host (a process outside pods), kernel (the RDMA core, smc, ...) or unknown",
        MetricType::Gauge,
        oq,
    )?;
    family(
        e,
        "erdma_device_other_mr_bytes",
        "Bytes registered in memory regions not of a pod, by owner kind",
        MetricType::Gauge,
        ob,
    )?;
    Ok(())
}

/// The families that name pods: per pod and device, and the pod a device's traffic is.
fn encode_pod_usage(u: &NodeUsage, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let shown = &u.pods[..u.pods.len().min(MAX_METRIC_PODS)];
    let pod_labels = |p: &report::PodReport, dev: &str| -> Labels {
        let (ns, name) = match (&p.namespace, &p.name) {
            (Some(ns), Some(n)) => (ns.clone(), n.clone()),
            _ => (String::new(), p.uid.clone()),
        };
        vec![
            ("namespace", ns),
            ("pod", name),
            ("device", dev.to_string()),
        ]
    };
    let mut qps = Vec::new();
    let (mut mrs, mut mr_bytes, mut cqs, mut pds) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for p in shown {
        for d in &p.devices {
            let l = pod_labels(p, &d.device);
            for (state, n) in &d.counts.qps_by_state {
                let mut l = l.clone();
                l.push(("state", state.clone()));
                qps.push((l, gauge(*n)));
            }
            mrs.push((l.clone(), gauge(d.counts.mrs)));
            mr_bytes.push((l.clone(), gauge(d.counts.mr_bytes)));
            cqs.push((l.clone(), gauge(d.counts.cqs)));
            pds.push((l, gauge(d.counts.pds)));
        }
    }
    family(
        e,
        "erdma_pod_qps",
        "Queue pairs of a pod on a device, by QP state",
        MetricType::Gauge,
        qps,
    )?;
    family(
        e,
        "erdma_pod_mrs",
        "Memory regions of a pod on a device",
        MetricType::Gauge,
        mrs,
    )?;
    family(
        e,
        "erdma_pod_mr_bytes",
        "Bytes a pod registered in memory regions on a device (memory pinned for RDMA)",
        MetricType::Gauge,
        mr_bytes,
    )?;
    family(
        e,
        "erdma_pod_cqs",
        "Completion queues of a pod on a device",
        MetricType::Gauge,
        cqs,
    )?;
    family(
        e,
        "erdma_pod_pds",
        "Protection domains of a pod on a device",
        MetricType::Gauge,
        pds,
    )?;
    let mut traffic_pod = Vec::new();
    for d in &u.devices {
        if let Some(p) = &d.traffic_pod {
            let (ns, name) = p.split_once('/').unwrap_or(("", p));
            let l = vec![
                ("device", d.device.clone()),
                ("namespace", ns.to_string()),
                ("pod", name.to_string()),
            ];
            traffic_pod.push((l, gauge(1)));
        }
    }
    family(
        e,
        "erdma_device_traffic_pod",
        "1 for the pod that holds the device alone: the device's counters are its traffic",
        MetricType::Gauge,
        traffic_pod,
    )
}

/// The kernel's answer as a file describes it ([`parse_fake`]), read again at each call (tests:
/// `ERDMA_AGENT_FAKE_RDMA`).
struct FakeFile(PathBuf);

impl FakeFile {
    fn now(&self) -> FakeSource {
        parse_fake(&std::fs::read_to_string(&self.0).unwrap_or_default())
    }
}

impl UsageSource for FakeFile {
    fn devices(&self) -> Result<Vec<DeviceEntry>, erdma_usage::UsageError> {
        self.now().devices()
    }
    fn qps(&self) -> Result<Vec<QpEntry>, erdma_usage::UsageError> {
        self.now().qps()
    }
    fn mrs(&self) -> Result<Vec<MrEntry>, erdma_usage::UsageError> {
        self.now().mrs()
    }
    fn cqs(&self) -> Result<Vec<CqEntry>, erdma_usage::UsageError> {
        self.now().cqs()
    }
    fn pds(&self) -> Result<Vec<PdEntry>, erdma_usage::UsageError> {
        self.now().pds()
    }
    fn port_counters(&self, dev: &str, port: u32) -> Result<PortCounters, erdma_usage::UsageError> {
        self.now().port_counters(dev, port)
    }
}

/// A fake kernel answer from text, one object a line (blank lines and `#` comments skipped):
///
/// ```text
/// device <name> <ports>
/// qp <device> <lqpn> <state: RESET|INIT|RTR|RTS|SQD|SQE|ERR> <pid|kernel:<name>|->
/// mr <device> <bytes> <owner>
/// cq <device> <owner>
/// pd <device> <owner>
/// counter <device> <port> <name> <value>
/// ```
///
/// Device indexes follow the `device` lines' order; lines that do not parse are skipped.
pub fn parse_fake(text: &str) -> FakeSource {
    let mut f = FakeSource::default();
    let mut index: BTreeMap<String, u32> = BTreeMap::new();
    let owner = |s: &str| -> (Option<u32>, Option<String>) {
        match s.strip_prefix("kernel:") {
            Some(k) => (None, Some(k.to_string())),
            None => (s.parse().ok(), None),
        }
    };
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let idx = |d: &str| index.get(d).copied().unwrap_or(0);
        match w.as_slice() {
            ["device", name, ports] => {
                let i = index.len() as u32;
                index.insert(name.to_string(), i);
                f.devices.push(DeviceEntry {
                    index: i,
                    name: name.to_string(),
                    ports: ports.parse().unwrap_or(1),
                });
            }
            ["qp", dev, lqpn, state, who] => {
                let state = [
                    QpState::Reset,
                    QpState::Init,
                    QpState::Rtr,
                    QpState::Rts,
                    QpState::Sqd,
                    QpState::Sqe,
                    QpState::Err,
                ]
                .into_iter()
                .find(|s| s.as_str() == *state)
                .unwrap_or(QpState::Unknown(255));
                let (pid, kern_name) = owner(who);
                f.qps.push(QpEntry {
                    dev_index: idx(dev),
                    dev_name: dev.to_string(),
                    port: Some(1),
                    lqpn: lqpn.parse().unwrap_or(0),
                    state,
                    qp_type: if kern_name.is_some() {
                        QpType::Gsi
                    } else {
                        QpType::Rc
                    },
                    pid,
                    kern_name,
                });
            }
            ["mr", dev, bytes, who] => {
                let (pid, kern_name) = owner(who);
                f.mrs.push(MrEntry {
                    dev_index: idx(dev),
                    dev_name: dev.to_string(),
                    mrn: None,
                    mr_len: bytes.parse().unwrap_or(0),
                    pdn: None,
                    pid,
                    kern_name,
                });
            }
            ["cq", dev, who] => {
                let (pid, kern_name) = owner(who);
                f.cqs.push(CqEntry {
                    dev_index: idx(dev),
                    dev_name: dev.to_string(),
                    cqn: None,
                    cqe: None,
                    users: None,
                    pid,
                    kern_name,
                });
            }
            ["pd", dev, who] => {
                let (pid, kern_name) = owner(who);
                f.pds.push(PdEntry {
                    dev_index: idx(dev),
                    dev_name: dev.to_string(),
                    pdn: None,
                    users: None,
                    pid,
                    kern_name,
                });
            }
            ["counter", dev, port, name, value] => {
                let port: u32 = port.parse().unwrap_or(1);
                let v: u64 = value.parse().unwrap_or(0);
                match f
                    .port_counters
                    .iter_mut()
                    .find(|c| c.dev_name == *dev && c.port == port)
                {
                    Some(c) => {
                        c.counters.insert(name.to_string(), v);
                    }
                    None => f.port_counters.push(PortCounters {
                        dev_index: idx(dev),
                        dev_name: dev.to_string(),
                        port,
                        counters: [(name.to_string(), v)].into_iter().collect(),
                    }),
                }
            }
            _ => {}
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use erdma_kubelet::podresources::ClaimedDevice;

    const UID_A: &str = "6a0b2c3d-1e2f-4a5b-8c7d-9e0f1a2b3c4d";
    const UID_B: &str = "7b1c3d4e-2f30-4b6c-9d8e-0f1a2b3c4d5e";

    /// A fake `/proc`: PID → pod UID (container `ab…`).
    fn proc_tree(pids: &[(u32, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (pid, uid) in pids {
            let dir = d.path().join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(
                dir.join("cgroup"),
                format!(
                    "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{}.scope\n",
                    uid.replace('-', "_"),
                    "ab".repeat(32)
                ),
            )
            .unwrap();
        }
        d
    }

    const KERNEL: &str = "
        # two devices, the RDMA core's objects on each
        device erdma_0 1
        device erdma_1 1
        qp erdma_0 1 RTS kernel:ib_core
        qp erdma_1 1 RTS kernel:ib_core
        # pod A (pid 100) on erdma_0: 2 QPs RTS, 1 INIT, 1 MiB registered
        qp erdma_0 17 RTS 100
        qp erdma_0 18 RTS 100
        qp erdma_0 19 INIT 100
        mr erdma_0 1048576 100
        cq erdma_0 100
        pd erdma_0 100
        # pod B (pid 200) and a host process (pid 7) on erdma_1
        qp erdma_1 20 RTS 200
        qp erdma_1 21 ERR 7
        counter erdma_0 1 tx_bytes_cnt 4096
        counter erdma_0 1 rx_bytes_cnt 8192
        counter erdma_0 1 tx_packets_cnt 4
        counter erdma_0 1 rx_packets_cnt 8
        counter erdma_0 1 tx_bps_limit_drop_cnt 3
        counter erdma_0 1 listen_create_cnt 1
        counter erdma_1 1 tx_bytes_cnt 1
        this line is not understood
    ";

    fn pods() -> Vec<PodIdentity> {
        vec![
            PodIdentity {
                uid: UID_A.into(),
                namespace: "ml".into(),
                name: "trainer-0".into(),
            },
            PodIdentity {
                uid: UID_B.into(),
                namespace: "ml".into(),
                name: "trainer-1".into(),
            },
        ]
    }

    /// A lister that counts its calls.
    struct Counting(Vec<PodIdentity>, std::sync::atomic::AtomicUsize);

    impl PodLister for Counting {
        fn list(
            &self,
        ) -> Pin<Box<dyn Future<Output = Result<Vec<PodIdentity>, String>> + Send + '_>> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.0.list()
        }
    }

    fn service(
        kernel: &str,
        proc_root: &std::path::Path,
        holders: Vec<Holder>,
        lister: Arc<dyn PodLister>,
    ) -> Arc<UsageService> {
        let holders = Arc::new(holders);
        UsageService::new(UsageInputs {
            source: Arc::new(parse_fake(kernel)),
            proc_root: proc_root.to_path_buf(),
            holders: Arc::new(move || holders.clone()),
            pods: lister,
            node: Some("node-1".into()),
        })
    }

    fn metrics(u: &Arc<UsageService>) -> String {
        let mut r = prometheus_client::registry::Registry::default();
        r.register_collector(Box::new(UsageCollector(u.clone())));
        crate::metrics::encode(&r)
    }

    #[test]
    fn the_fake_kernel_text_parses() {
        let f = parse_fake(KERNEL);
        assert_eq!(f.devices.len(), 2);
        assert_eq!(f.devices[1].index, 1);
        assert_eq!(f.qps.len(), 7);
        assert_eq!(f.qps[0].kern_name.as_deref(), Some("ib_core"));
        assert_eq!(f.qps[4].state, QpState::Init);
        assert_eq!(f.mrs[0].mr_len, 1 << 20);
        assert_eq!(f.port_counters.len(), 2);
        assert_eq!(f.port_counters[0].counters["tx_bytes_cnt"], 4096);
    }

    #[tokio::test]
    async fn pods_devices_and_metrics_from_the_kernel_the_cgroups_and_the_kubelet() {
        let proc_root = proc_tree(&[(100, UID_A), (200, UID_B)]);
        let holders = vec![
            Holder::of_ids("ml", "trainer-0", "main", vec!["erdma_0/3".into()]),
            Holder::of_ids("ml", "trainer-1", "main", vec!["erdma_1/0".into()]),
            // Allocated, not running yet, unknown to the runtime.
            Holder::of_ids("ml", "waiting", "main", vec!["erdma_1/1".into()]),
        ];
        let u = service(KERNEL, proc_root.path(), holders, Arc::new(pods()));
        let r = u.current().await;
        assert!(r.available, "{:?}", r.error);
        assert_eq!(r.node.as_deref(), Some("node-1"));
        let a = r.pod("ml/trainer-0").unwrap();
        assert_eq!(a.uid, UID_A);
        let d = &a.devices[0];
        assert_eq!((d.device.as_str(), d.allocated), ("erdma_0", true));
        assert_eq!(
            (
                d.counts.qps,
                d.counts.mrs,
                d.counts.mr_bytes,
                d.counts.cqs,
                d.counts.pds
            ),
            (3, 1, 1 << 20, 1, 1)
        );
        // Known by name only: an empty UID.
        let w = r.pod("ml/waiting").unwrap();
        assert_eq!(w.uid, "");
        let e0 = r.device("erdma_0").unwrap();
        assert_eq!(e0.traffic, TrafficKind::Pod);
        assert_eq!(e0.traffic_pod.as_deref(), Some("ml/trainer-0"));
        assert_eq!(e0.ports[0].tx_bytes, Some(4096));
        let e1 = r.device("erdma_1").unwrap();
        assert_eq!(e1.traffic, TrafficKind::Shared);
        assert_eq!(e1.holders, vec!["ml/trainer-1", "ml/waiting"]);
        assert!(e1.host_users);

        let m = metrics(&u);
        for line in [
            "erdma_usage_available 1",
            r#"erdma_pod_qps{namespace="ml",pod="trainer-0",device="erdma_0",state="RTS"} 2"#,
            r#"erdma_pod_qps{namespace="ml",pod="trainer-0",device="erdma_0",state="INIT"} 1"#,
            r#"erdma_pod_mr_bytes{namespace="ml",pod="trainer-0",device="erdma_0"} 1048576"#,
            r#"erdma_pod_cqs{namespace="ml",pod="trainer-0",device="erdma_0"} 1"#,
            r#"erdma_pod_mrs{namespace="ml",pod="waiting",device="erdma_1"} 0"#,
            r#"erdma_device_tx_bytes_total{device="erdma_0",port="1"} 4096"#,
            r#"erdma_device_rx_bytes_total{device="erdma_0",port="1"} 8192"#,
            r#"erdma_device_tx_packets_total{device="erdma_0",port="1"} 4"#,
            r#"erdma_device_rx_packets_total{device="erdma_0",port="1"} 8"#,
            r#"erdma_device_errors_total{device="erdma_0",port="1",counter="tx_bps_limit_drop_cnt"} 3"#,
            r#"erdma_device_holders{device="erdma_1"} 2"#,
            r#"erdma_device_traffic{device="erdma_0",traffic="pod"} 1"#,
            r#"erdma_device_traffic{device="erdma_1",traffic="shared"} 1"#,
            r#"erdma_device_traffic_pod{device="erdma_0",namespace="ml",pod="trainer-0"} 1"#,
            r#"erdma_device_other_qps{device="erdma_1",owner="host"} 1"#,
            r#"erdma_device_other_qps{device="erdma_0",owner="kernel"} 1"#,
        ] {
            assert!(m.contains(line), "{line} missing from\n{m}");
        }
        // Not an error counter: not exported.
        assert!(!m.contains("listen_create_cnt"), "{m}");
    }

    #[tokio::test]
    async fn results_are_reused_for_two_seconds_and_ended_pods_leave_the_metrics() {
        let proc_root = proc_tree(&[(100, UID_A)]);
        let kernel = "device erdma_0 1\nqp erdma_0 17 RTS 100\n";
        let lister = Arc::new(Counting(pods(), Default::default()));
        let u = service(kernel, proc_root.path(), vec![], lister.clone());
        let first = u.current().await;
        let again = u.current().await;
        assert!(Arc::ptr_eq(&first, &again), "reused within MAX_AGE");
        assert!(metrics(&u).contains(r#"pod="trainer-0""#));
        assert_eq!(lister.1.load(std::sync::atomic::Ordering::SeqCst), 1);

        // The pod's process ended: its objects are gone from the kernel's answer.
        std::fs::remove_dir_all(proc_root.path().join("100")).unwrap();
        let u2 = service(
            "device erdma_0 1\n",
            proc_root.path(),
            vec![],
            lister.clone(),
        );
        u2.current().await;
        let m = metrics(&u2);
        assert!(!m.contains("trainer-0"), "{m}");
        assert!(
            m.contains(r#"erdma_device_traffic{device="erdma_0",traffic="unused"} 1"#),
            "{m}"
        );
    }

    #[tokio::test]
    async fn concurrent_askers_share_one_collection() {
        let proc_root = proc_tree(&[(100, UID_A)]);
        let lister = Arc::new(Counting(vec![], Default::default()));
        let u = service(
            "device erdma_0 1\nqp erdma_0 17 RTS 100\n",
            proc_root.path(),
            vec![],
            lister.clone(),
        );
        let (a, b) = tokio::join!(u.current(), u.current());
        assert!(Arc::ptr_eq(&a, &b));
        // The UID is unknown to the runtime: asked once, not again within NAMES_EVERY.
        assert_eq!(lister.1.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(a.pods[0].uid, UID_A);
        assert_eq!(a.pods[0].namespace, None);
        let m = metrics(&u);
        assert!(
            m.contains(&format!(
                r#"erdma_pod_qps{{namespace="",pod="{UID_A}",device="erdma_0",state="RTS"}} 1"#
            )),
            "{m}"
        );
    }

    #[tokio::test]
    async fn without_rdma_netlink_the_answer_says_why() {
        let proc_root = tempfile::tempdir().unwrap();
        let u = UsageService::new(UsageInputs {
            source: Arc::new(FakeSource {
                fail_errno: Some(1), // EPERM
                ..Default::default()
            }),
            proc_root: proc_root.path().into(),
            holders: Arc::new(|| Arc::new(Vec::new())),
            pods: Arc::new(Vec::<PodIdentity>::new()),
            node: None,
        });
        let r = u.current().await;
        assert!(!r.available);
        assert!(
            r.error.as_deref().unwrap_or_default().contains("errno 1"),
            "{:?}",
            r.error
        );
        let m = metrics(&u);
        assert!(m.contains("erdma_usage_available 0"), "{m}");
        assert!(!m.contains("erdma_pod_"), "{m}");
    }

    /// A kernel that answers only when told to.
    struct Stuck(Mutex<std::sync::mpsc::Receiver<()>>);

    impl UsageSource for Stuck {
        fn devices(&self) -> Result<Vec<DeviceEntry>, erdma_usage::UsageError> {
            let _ = self.0.lock().unwrap().recv();
            Ok(vec![])
        }
        fn qps(&self) -> Result<Vec<QpEntry>, erdma_usage::UsageError> {
            Ok(vec![])
        }
        fn mrs(&self) -> Result<Vec<MrEntry>, erdma_usage::UsageError> {
            Ok(vec![])
        }
        fn cqs(&self) -> Result<Vec<CqEntry>, erdma_usage::UsageError> {
            Ok(vec![])
        }
        fn pds(&self) -> Result<Vec<PdEntry>, erdma_usage::UsageError> {
            Ok(vec![])
        }
        fn port_counters(
            &self,
            dev: &str,
            _: u32,
        ) -> Result<PortCounters, erdma_usage::UsageError> {
            Err(erdma_usage::UsageError::NoSuchDevice(dev.into()))
        }
    }

    #[tokio::test]
    async fn a_slow_kernel_costs_a_scrape_the_budget_and_never_two_reads() {
        let (tx, rx) = std::sync::mpsc::channel();
        let proc_root = tempfile::tempdir().unwrap();
        let mut u = UsageService::new(UsageInputs {
            source: Arc::new(Stuck(Mutex::new(rx))),
            proc_root: proc_root.path().into(),
            holders: Arc::new(|| Arc::new(Vec::new())),
            pods: Arc::new(Vec::<PodIdentity>::new()),
            node: None,
        });
        Arc::get_mut(&mut u).unwrap().budget = Duration::from_millis(50);
        let r = u.current().await;
        assert!(!r.available);
        assert!(
            r.error.as_deref().unwrap().contains("not read within 50ms"),
            "{r:?}"
        );
        // Past the reuse window, the stuck read still runs: no second one starts.
        *u.last.lock().unwrap() = None;
        let r = u.current().await;
        assert!(
            r.error.as_deref().unwrap().contains("has not finished"),
            "{r:?}"
        );
        // The kernel answers: the read ends and the next one runs.
        tx.send(()).unwrap();
        tx.send(()).unwrap();
        for _ in 0..100 {
            if !u.reading.load(Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        *u.last.lock().unwrap() = None;
        assert!(u.current().await.available);
    }

    /// The runtime's pods with their sandboxes (annotations, network namespace).
    struct Sandboxes(Vec<SandboxInfo>, std::sync::atomic::AtomicUsize);

    impl PodLister for Sandboxes {
        fn list(
            &self,
        ) -> Pin<Box<dyn Future<Output = Result<Vec<PodIdentity>, String>> + Send + '_>> {
            let v = self
                .0
                .iter()
                .map(|s| PodIdentity {
                    uid: s.uid.clone(),
                    namespace: s.namespace.clone(),
                    name: s.name.clone(),
                })
                .collect();
            Box::pin(async move { Ok(v) })
        }

        fn sandbox<'a>(
            &'a self,
            namespace: &'a str,
            name: &'a str,
        ) -> Pin<Box<dyn Future<Output = Result<Option<SandboxInfo>, String>> + Send + 'a>>
        {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let found = self
                .0
                .iter()
                .find(|s| s.namespace == namespace && s.name == name)
                .cloned();
            Box::pin(async move {
                found
                    .map(Some)
                    .ok_or_else(|| "no ready sandbox".to_string())
            })
        }
    }

    fn sandbox(uid: &str, name: &str, smcr: Option<&str>, netns: Option<&str>) -> SandboxInfo {
        SandboxInfo {
            id: format!("sb-{name}"),
            namespace: "ml".into(),
            name: name.into(),
            uid: uid.into(),
            host_network: netns.is_none(),
            netns: netns.map(PathBuf::from),
            annotations: smcr
                .map(|v| {
                    (
                        erdma_smc::annotation::SMCR_ANNOTATION.to_string(),
                        v.to_string(),
                    )
                })
                .into_iter()
                .collect(),
        }
    }

    struct FakeSmc(String);

    impl smc::SmcReader for FakeSmc {
        fn sockets(
            &self,
            netns: &std::path::Path,
        ) -> Result<Vec<erdma_smc::diag::SmcSocket>, smc::ReadError> {
            smc::parse_fake(&self.0, netns)
        }
    }

    #[tokio::test]
    async fn pods_that_ask_for_smcr_get_their_smc_sockets_summed_up() {
        const UID_C: &str = "8c2d4e5f-3041-4c7d-8e9f-1a2b3c4d5e6f";
        const UID_D: &str = "9d3e5f60-4152-4d8e-9fa0-2b3c4d5e6f70";
        let proc_root = proc_tree(&[(100, UID_A)]);
        let holders = vec![
            Holder::of_ids("ml", "trainer-0", "main", vec!["erdma_0/0".into()]),
            Holder::of_ids("ml", "trainer-1", "main", vec!["erdma_0/1".into()]),
            Holder::of_ids("ml", "host-net", "main", vec!["erdma_0/2".into()]),
            Holder::of_ids("ml", "no-smc", "main", vec!["erdma_0/3".into()]),
        ];
        let lister = Arc::new(Sandboxes(
            vec![
                sandbox(UID_A, "trainer-0", Some("true"), Some("/run/netns/a")),
                sandbox(UID_B, "trainer-1", Some("true"), Some("/run/netns/b")),
                sandbox(UID_C, "host-net", Some("true"), None),
                sandbox(UID_D, "no-smc", Some("false"), Some("/run/netns/d")),
            ],
            Default::default(),
        ));
        let kernel = "device erdma_0 1\nqp erdma_0 1 RTS kernel:smc\nqp erdma_0 17 RTS 100\n";
        let smc = "/run/netns/a ACTIVE SMCR erdma_0\n/run/netns/a ACTIVE SMCR erdma_0\n\
                   /run/netns/a LISTEN SMCR\n/run/netns/a ACTIVE TCP 0x03010000\n\
                   /run/netns/b unsupported\n/run/netns/d ACTIVE SMCR erdma_0\n";
        let u = UsageService::with_smc(
            UsageInputs {
                source: Arc::new(parse_fake(kernel)),
                proc_root: proc_root.path().to_path_buf(),
                holders: Arc::new(move || Arc::new(holders.clone())),
                pods: lister.clone(),
                node: None,
            },
            Arc::new(FakeSmc(smc.into())),
        );
        let r = u.current().await;
        let a = r
            .pod("ml/trainer-0")
            .unwrap()
            .smc
            .as_ref()
            .expect("a summary");
        assert_eq!(
            (a.smcr, a.fallback_tcp, a.listening, a.error.as_deref()),
            (2, 1, 1, None)
        );
        assert_eq!(a.devices, vec!["erdma_0"]);
        assert_eq!(a.fallback_reasons[0].label(), "PEERNOSMC");
        // No SMC in the kernel: named, the rest of the answer is whole.
        let b = r.pod("ml/trainer-1").unwrap().smc.as_ref().unwrap();
        assert!(
            b.error.as_deref().unwrap().starts_with("SMC unsupported"),
            "{b:?}"
        );
        assert_eq!(b.connections(), 0);
        let c = r.pod("ml/host-net").unwrap().smc.as_ref().unwrap();
        assert!(
            c.error.as_deref().unwrap().contains("host-network"),
            "{c:?}"
        );
        assert_eq!(
            r.pod("ml/no-smc").unwrap().smc,
            None,
            "not asked: no summary"
        );
        assert!(r.available);
        assert_eq!(lister.1.load(std::sync::atomic::Ordering::SeqCst), 4);
        // The sandboxes are asked once per pod.
        *u.last.lock().unwrap() = None;
        let again = u.current().await;
        assert_eq!(lister.1.load(std::sync::atomic::Ordering::SeqCst), 4);
        assert_eq!(
            again
                .pod("ml/trainer-0")
                .unwrap()
                .smc
                .as_ref()
                .unwrap()
                .smcr,
            2
        );
    }

    #[tokio::test]
    async fn a_gone_namespace_is_looked_up_again_and_lookups_are_bounded() {
        let proc_root = tempfile::tempdir().unwrap();
        let n = MAX_SMC_LOOKUPS + 2;
        let boxes: Vec<SandboxInfo> = (0..n)
            .map(|i| {
                sandbox(
                    &format!("uid-{i}"),
                    &format!("p{i}"),
                    Some("true"),
                    Some(&format!("/run/netns/{i}")),
                )
            })
            .collect();
        let holders: Vec<Holder> = (0..n)
            .map(|i| Holder::of_ids("ml", &format!("p{i}"), "c", vec![format!("erdma_0/{i}")]))
            .collect();
        let lister = Arc::new(Sandboxes(boxes, Default::default()));
        let u = UsageService::with_smc(
            UsageInputs {
                source: Arc::new(parse_fake("device erdma_0 1\n")),
                proc_root: proc_root.path().to_path_buf(),
                holders: Arc::new(move || Arc::new(holders.clone())),
                pods: lister.clone(),
                node: None,
            },
            Arc::new(FakeSmc("/run/netns/0 gone\n".into())),
        );
        let r = u.current().await;
        let asked = |l: &Sandboxes| l.1.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(asked(&lister), MAX_SMC_LOOKUPS);
        let with = r.pods.iter().filter(|p| p.smc.is_some()).count();
        assert_eq!(with, MAX_SMC_LOOKUPS, "the rest wait for the next read");
        let p0 = r.pod("ml/p0").unwrap().smc.as_ref().unwrap();
        assert!(p0.error.as_deref().unwrap().contains("gone"), "{p0:?}");
        *u.last.lock().unwrap() = None;
        let r = u.current().await;
        // The two not asked yet, and p0 whose namespace was gone.
        assert_eq!(asked(&lister), MAX_SMC_LOOKUPS + 3);
        assert!(r.pods.iter().all(|p| p.smc.is_some()));
    }

    #[test]
    fn dra_claims_name_their_rdma_device() {
        let mut snap = Snapshot::default();
        snap.devices.push(DeviceEntry {
            index: 0,
            name: "erdma_0".into(),
            ports: 1,
        });
        let mut h = Holder::of_ids("ml", "p", "c", vec![]);
        h.claimed.push(ClaimedDevice {
            claim_namespace: "ml".into(),
            claim_name: "rdma".into(),
            pool: "node-1".into(),
            device: "erdma-0".into(),
        });
        let a = allocated_by_name(&[h], &snap);
        let devs: Vec<_> = a.values().flatten().cloned().collect();
        assert_eq!(devs, vec!["erdma_0".to_string()]);
    }
}
