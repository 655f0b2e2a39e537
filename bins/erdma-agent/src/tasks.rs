//! The agent's running tasks and their one shutdown: [`Tasks`] spawns each concern's task under
//! the name [`Pending`] reports when a shutdown abandons it, and [`Tasks::stop`] cancels and
//! waits for them all, the driver reconciler first; [`with_grace`] bounds the whole shutdown by
//! [`SHUTDOWN_GRACE`]. Also the tasks that belong to no concern: `/metrics` and the release of
//! the pages only start-up used.

use crate::cli::Settings;
use crate::pending::Pending;
use erdma_inventory::Inventory;
use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Set once the urgent part of the start is over: the kubelet has the served devices (the device
/// plugin's ListAndWatch handed them over, or the DRA driver serves), at the latest
/// [`crate::devices::COMPLETE_AT_LATEST`] after the start. Work that nothing waits for — the
/// full inventory scan, the node's driver labels and conditions, the `ERdmaDevice` status
/// report — starts after it, leaving a node's few CPUs to the registration.
#[derive(Debug, Clone, Default)]
pub struct StartedUp(Arc<tokio::sync::SetOnce<()>>);

impl StartedUp {
    /// Marks the start as over (again: no effect).
    pub fn set(&self) {
        let _ = self.0.set(());
    }

    /// Returns once the start is over (at once when it is).
    pub async fn wait(&self) {
        self.0.wait().await;
    }
}

/// The agent's tasks, what they share (the cancel token, [`Pending`]), and what must stay alive
/// until they stopped (watch senders, watchers).
pub struct Tasks {
    /// What the agent waits on, by name.
    pub pending: Pending,
    /// Fires on shutdown.
    pub cancel: CancellationToken,
    /// Set once the urgent part of the start is over ([`StartedUp`]).
    pub started_up: StartedUp,
    handles: Vec<JoinHandle<()>>,
    reconciler: Option<JoinHandle<()>>,
    kept: Vec<Box<dyn Any + Send>>,
}

impl Tasks {
    /// No tasks yet.
    pub fn new(pending: Pending, cancel: CancellationToken) -> Self {
        Tasks {
            pending,
            cancel,
            started_up: StartedUp::default(),
            handles: Vec::new(),
            reconciler: None,
            kept: Vec::new(),
        }
    }

    /// Runs `fut` as a task, recorded as `what` until it ends.
    pub fn spawn(&mut self, what: &str, fut: impl Future<Output = ()> + Send + 'static) {
        let tracked = self.pending.track(what, fut);
        self.handles.push(tokio::spawn(tracked));
    }

    /// Runs `fut` as a task that a shutdown does not report.
    pub fn spawn_unnamed(&mut self, fut: impl Future<Output = ()> + Send + 'static) {
        self.handles.push(tokio::spawn(fut));
    }

    /// The driver reconciler, awaited first on [`Tasks::stop`].
    pub fn set_reconciler(&mut self, reconciler: Option<JoinHandle<()>>) {
        self.reconciler = reconciler;
    }

    /// Keeps `v` (a watch sender, a watcher) alive until the tasks stopped.
    pub fn keep(&mut self, v: impl Any + Send) {
        self.kept.push(Box::new(v));
    }

    /// Cancels every task and waits for them, the driver reconciler first: the one shutdown of
    /// the device-plugin and the DRA paths.
    pub async fn stop(self) {
        self.cancel.cancel();
        if let Some(r) = self.reconciler {
            let _ = r.await;
        }
        for t in self.handles {
            let _ = t.await;
        }
        drop(self.kept);
    }

    /// The release of the pages only start-up used.
    pub fn start_release(&mut self) {
        let cancel = self.cancel.clone();
        self.spawn_unnamed(release_startup_pages(cancel));
    }
}

/// How long the agent's graceful shutdown may take once `cancel` fired: what has not finished by
/// then is abandoned (and logged). The binary leaves its runtime half a second more, so that the
/// process ends within 5 s of SIGTERM (the README's shutdown contract).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(4);

/// How long [`with_grace`] lets sysfs reads still in flight (not blocked) finish before it
/// reports them as abandoned.
const IN_FLIGHT_SETTLE: Duration = Duration::from_millis(200);

/// `serving` until it ends or, once `cancel` fired, [`SHUTDOWN_GRACE`] passed: then `Ok`, after
/// logging each thing still pending (`abandoned: ...`); sysfs reads still blocked are logged the
/// same way however it ended.
pub async fn with_grace(
    serving: impl Future<Output = anyhow::Result<()>>,
    cancel: &CancellationToken,
    pending: &Pending,
    inventory: &Inventory,
) -> anyhow::Result<()> {
    let deadline = async {
        cancel.cancelled().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    let result = tokio::select! {
        r = serving => r,
        () = deadline => {
            tracing::warn!(
                grace = ?SHUTDOWN_GRACE,
                "the graceful shutdown did not finish in time; exiting without it"
            );
            for what in pending.list() {
                tracing::warn!("abandoned: {what}");
            }
            Ok(())
        }
    };
    // A read merely in flight (a first scan that a start-up error overtook) ends within
    // milliseconds: it is waited for briefly, so that only what really stays behind is reported.
    let settle = tokio::time::Instant::now() + IN_FLIGHT_SETTLE;
    while inventory.pending_reads().iter().any(|r| !r.blocked)
        && tokio::time::Instant::now() < settle
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for read in inventory.pending_reads() {
        let how = if read.blocked {
            "blocked, its thread left behind: a driver stuck in it?"
        } else {
            "in flight"
        };
        tracing::warn!("abandoned: sysfs {read} ({how})");
    }
    result
}

/// How long after the start the agent gives back the pages only start-up needed: registration,
/// the first scan and the first ERdmaDevice read are over by then on any node.
const STARTUP_SETTLES: Duration = Duration::from_secs(10);
/// The release is repeated this often, so that a burst (a kubelet restart, many allocations)
/// leaves the resident set at the idle loop's again.
const RELEASE_EVERY: Duration = Duration::from_secs(600);

/// Gives back the resident pages start-up left behind (text pages only the start used, freed
/// heap), once start-up settled and then every [`RELEASE_EVERY`]: see
/// [`erdma_host::resident`]. The idle agent's own pages come back on their next use.
async fn release_startup_pages(cancel: CancellationToken) {
    let mut wait = STARTUP_SETTLES;
    let mut first = true;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        // Logged before the release: logging afterwards would map the formatting code again.
        match erdma_host::resident::own_releasable_mappings() {
            Ok(text) => {
                let kib = text.iter().map(|m| (m.end - m.start) / 1024).sum::<usize>();
                if first {
                    tracing::info!(
                        mappings = text.len(),
                        mapped_kib = kib,
                        "giving back the pages only start-up used (read-only file mappings, free heap)"
                    );
                }
                let r = erdma_host::resident::release(&text);
                if !r.refused.is_empty() {
                    tracing::warn!("giving back start-up pages: {r}");
                }
            }
            Err(e) => tracing::warn!("{e}"),
        }
        first = false;
        wait = RELEASE_EVERY;
    }
}

/// The resource API's own run (the device plugin or the DRA driver), awaited by the agent until
/// `cancel` or its failure: its result, and what stays recorded in [`Pending`] until the other
/// tasks stopped.
pub type Serving = std::pin::Pin<
    Box<dyn Future<Output = (anyhow::Result<()>, Option<crate::pending::PendingGuard>)>>,
>;

/// What the concerns' start functions share once the plan is made: the settings, the plan, the
/// Kubernetes API (if any), the one owner of who holds which device, the agent's metrics.
#[derive(Clone, Copy)]
pub struct Shared<'a> {
    /// The resolved settings.
    pub settings: &'a Settings,
    /// What runs on this node.
    pub plan: &'a crate::plan::AgentPlan,
    /// The Kubernetes API.
    pub cluster: &'a Option<crate::cluster::Cluster>,
    /// Who holds which device.
    pub holders: &'a std::sync::Arc<erdma_kubelet::podresources::HolderCache>,
    /// The agent's metrics.
    pub metrics: &'a std::sync::Arc<crate::metrics::AgentMetrics>,
}
