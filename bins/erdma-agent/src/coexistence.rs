//! Another device plugin serving the agent's resource on this node (terway's eRDMA ENI plugin, or
//! the original agent left by an unfinished upgrade). Observed soon after a socket appears or goes
//! in the device-plugin directory, every [`RECHECK`] while the kubelet's device list holds
//! devices erdma does not advertise, and every [`EVERY`] otherwise. A change of verdict is logged,
//! shown in `/healthz` and the `erdma_agent_device_plugin_conflict` gauge and, in a cluster,
//! published as the `ERdmaDevicePluginConflict` node condition and an Event. The agent never
//! re-registers while the other plugin runs; it registers again once after it has gone, because
//! the kubelet is then left without a working plugin for the resource.

use crate::cluster::Cluster;
use crate::metrics::AgentMetrics;
use erdma_deviceplugin::coexistence::Observer;
use erdma_deviceplugin::runner::Reclaimer;
use erdma_model::NodeDevices;
use erdma_model::coexistence::{self, Conflict, Debounce};
use serde::Serialize;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

/// How often the agent looks when nothing wakes it. Another plugin cannot feed the kubelet
/// without a socket in the device-plugin directory, whose creation wakes the agent; this look
/// is the safety net for a missed event.
pub const EVERY: Duration = Duration::from_secs(300);
/// How soon the agent looks again after the kubelet's device list showed devices erdma does not
/// advertise (confirmed on the second look, and followed until it clears).
pub const RECHECK: Duration = Duration::from_secs(30);
/// How long after a socket change it looks (lets a registration finish).
const SETTLE: Duration = Duration::from_secs(1);

/// What `/healthz` shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ConflictView {
    /// Whether another plugin serves the resource.
    pub conflict: bool,
    /// What was seen.
    pub message: String,
    /// How to resolve it (only while in conflict).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// The evidence.
    pub evidence: Vec<coexistence::Evidence>,
    /// Re-registrations after another plugin had gone.
    pub reclaims: u64,
}

/// Inputs of [`run`].
pub struct Config {
    /// Gathers the evidence.
    pub observer: Observer,
    /// Makes the device plugin register again.
    pub reclaimer: Reclaimer,
    /// Observation period without wake-ups.
    pub every: Duration,
    /// Observation period while the kubelet's device list is in question.
    pub recheck: Duration,
}

/// Observes until cancelled.
pub async fn run(
    cfg: Config,
    served: watch::Receiver<NodeDevices>,
    cluster: Option<Cluster>,
    metrics: Arc<AgentMetrics>,
    view_tx: watch::Sender<Option<ConflictView>>,
    cancel: CancellationToken,
) {
    let wake = Arc::new(Notify::new());
    let _watcher = watch_sockets(&cfg.observer, wake.clone());
    let resource = cfg.observer.resource.clone();
    let mut debounce = Debounce::default();
    let mut shown: Option<Conflict> = None;
    let mut published: Option<Conflict> = None;
    let mut reclaims = 0u64;
    // The first look waits for start-up to settle: the kubelet's device list (tens of thousands
    // of IDs on a large node) would otherwise be decoded while the plugin registers.
    tokio::select! {
        _ = cancel.cancelled() => return,
        _ = tokio::time::sleep(SETTLE) => {}
    }
    loop {
        let names: BTreeSet<String> = served
            .borrow()
            .devices
            .iter()
            .map(|d| d.name.clone())
            .collect();
        let verdict = debounce.observe(cfg.observer.observe(&names).await);
        if verdict.reclaim {
            reclaims += 1;
            metrics.device_plugin_reclaims.inc();
            cfg.reclaimer.request();
        }
        let now = verdict.conflict;
        if shown.as_ref() != Some(&now) || verdict.reclaim {
            if now.is_conflict() {
                tracing::warn!(fix = %now.fix(&resource), "{}", now.message(&resource));
            } else if shown.is_some() {
                tracing::info!("{}", now.message(&resource));
            }
            metrics
                .device_plugin_conflict
                .set(i64::from(now.is_conflict()));
            let view = ConflictView {
                conflict: now.is_conflict(),
                message: now.message(&resource),
                fix: now.is_conflict().then(|| now.fix(&resource)),
                evidence: now.evidence.clone(),
                reclaims,
            };
            view_tx.send_replace(Some(view));
            shown = Some(now.clone());
        }
        if let Some(c) = &cluster
            && published.as_ref() != Some(&now)
        {
            match c
                .publish_plugin_conflict(published.as_ref(), &now, &resource)
                .await
            {
                Ok(()) => published = Some(now),
                // Retried at the next observation.
                Err(e) => tracing::warn!("{e}"),
            }
        }
        let next = if debounce.kubelet_list_in_question() {
            cfg.recheck
        } else {
            cfg.every
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(next) => {}
            _ = wake.notified() => {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(SETTLE) => {}
                }
            }
        }
    }
}

/// Wakes the observer when a socket (`*.sock`) other than erdma's own is created, removed or
/// renamed in the device-plugin directory: a plugin registering (known or not, its socket comes
/// first) or going, or the kubelet restarting (`kubelet.sock`), after which the kubelet's device
/// list is rebuilt. Not the kubelet's checkpoint, rewritten at every allocation. `None` when the directory cannot be watched (the periodic look still runs).
fn watch_sockets(observer: &Observer, wake: Arc<Notify>) -> Option<notify::RecommendedWatcher> {
    use notify::event::{EventKind, ModifyKind};
    use notify::{RecursiveMode, Watcher};
    let own = observer.own_socket.clone();
    let mut w = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let Ok(ev) = res else { return };
        let changed = matches!(
            ev.kind,
            EventKind::Create(_) | EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
        );
        let other = ev.paths.iter().any(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".sock") && n != own)
        });
        if changed && other {
            wake.notify_one();
        }
    })
    .map_err(|e| {
        tracing::debug!(
            "inotify unavailable ({e}); other device plugins are seen by the periodic look only"
        )
    })
    .ok()?;
    w.watch(&observer.dir, RecursiveMode::NonRecursive)
        .map_err(|e| tracing::debug!(dir = %observer.dir.display(), "cannot watch the device-plugin directory ({e}); periodic look only"))
        .ok()?;
    Some(w)
}

/// The watch for another device plugin serving the same resource, which makes the device plugin
/// register again once that one is gone; `/healthz` gets the conflict.
pub fn start(
    observer: Observer,
    reclaimer: Reclaimer,
    shared: crate::tasks::Shared<'_>,
    served: &watch::Receiver<NodeDevices>,
    view: &mut watch::Receiver<Option<ConflictView>>,
    tasks: &mut crate::tasks::Tasks,
) {
    let (tx, rx) = watch::channel(None);
    *view = rx;
    let cfg = Config {
        observer,
        reclaimer,
        every: EVERY,
        recheck: RECHECK,
    };
    let watch = run(
        cfg,
        served.clone(),
        shared.cluster.clone(),
        shared.metrics.clone(),
        tx,
        tasks.cancel.clone(),
    );
    tasks.spawn("watching for another device plugin", watch);
}
