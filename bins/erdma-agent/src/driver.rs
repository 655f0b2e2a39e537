//! The driver manager wiring: the reconciler task (or, with `--prefer-driver none`, an immediate
//! ready status and nothing that touches the driver), and the observer that turns each status
//! change into logs, `/healthz`, metrics, and node labels / condition / Events in a cluster.

use crate::cluster::Cluster;
use crate::metrics::AgentMetrics;
use erdma_driver::{DriverConfig, DriverReconciler, DriverStatus, Host, PodResourceUsage};
use erdma_model::DriverMode;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The driver status channel and, unless the mode is `none`, the reconciler task (await it on
/// shutdown). The sender is returned too so that the channel stays open for `none`.
pub fn start<H: Host, U: PodResourceUsage>(
    host: H,
    usage: U,
    cfg: DriverConfig,
    cancel: CancellationToken,
) -> (
    watch::Receiver<DriverStatus>,
    Option<watch::Sender<DriverStatus>>,
    Option<JoinHandle<()>>,
) {
    if cfg.mode == DriverMode::None {
        tracing::info!("--prefer-driver none: serving devices as found, never touching the driver");
        let (tx, rx) = watch::channel(DriverStatus::unmanaged());
        return (rx, Some(tx), None);
    }
    if cfg.force_reload {
        tracing::warn!(
            "!!! --force-driver-reload: the erdma module WILL be reloaded for a mode change even while pods hold aliyun/erdma; their RDMA connections break !!!"
        );
    }
    tracing::info!(mode = %cfg.mode, installer = cfg.installer_version.as_str(), "driver manager starting; no devices are advertised until the driver is ready");
    let (tx, rx) = watch::channel(DriverStatus::starting(cfg.mode));
    let task = tokio::spawn(DriverReconciler::new(host, usage, cfg).run(cancel, tx));
    (rx, None, Some(task))
}

/// Follows the driver status until `cancel` fires: logs, metrics, and (in a
/// cluster) node labels, the node condition and Events; without a cluster they are logged.
/// Publishing failures are retried on the next change or after 30 s.
pub async fn observe(
    mut rx: watch::Receiver<DriverStatus>,
    metrics: Arc<AgentMetrics>,
    cluster: Option<Cluster>,
    started_up: crate::tasks::StartedUp,
    cancel: CancellationToken,
) {
    let mut previous: Option<DriverStatus> = None;
    let mut published: Option<DriverStatus> = None;
    loop {
        let now = rx.borrow_and_update().clone();
        if previous.as_ref() != Some(&now) {
            metrics.observe_driver(previous.as_ref(), &now);
            if let Some(p) = &now.pending {
                tracing::warn!(
                    from = p.from.name(),
                    to = p.to.name(),
                    holders = p.holders.len(),
                    "driver reload refused: {}",
                    now.reason
                );
            }
            for w in &now.warnings {
                tracing::warn!("driver: {w}");
            }
        }
        let mut retry = false;
        if published.as_ref() != Some(&now) {
            if cluster.is_some() {
                // The node's labels and condition wait for the kubelet to have the devices.
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = started_up.wait() => {}
                }
            }
            match &cluster {
                Some(c) => match c.publish_driver(published.as_ref(), &now).await {
                    Ok(()) => published = Some(now.clone()),
                    Err(e) => {
                        tracing::warn!(
                            "publishing the driver state to the node failed: {e}; retrying in 30 s"
                        );
                        retry = true;
                    }
                },
                None => {
                    let (ty, st, reason, message) = now.node_condition();
                    tracing::info!(labels = ?now.node_labels(), condition = %format!("{ty}={st} ({reason}: {message})"), "driver state (not in a cluster: node labels and condition are only logged)");
                    published = Some(now.clone());
                }
            }
        }
        previous = Some(now);
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = rx.changed() => if r.is_err() { cancel.cancelled().await; return },
            _ = tokio::time::sleep(std::time::Duration::from_secs(30)), if retry => {}
        }
    }
}

/// The driver manager (readiness gate) of `s`: its reconciler, asking the kubelet through the
/// one pod-resources owner whether pods hold the devices, and the observer of its status;
/// `/healthz` gets the status.
pub fn start_manager(
    shared: crate::tasks::Shared<'_>,
    view: &mut watch::Receiver<DriverStatus>,
    tasks: &mut crate::tasks::Tasks,
) -> watch::Receiver<DriverStatus> {
    let holders = shared.holders;
    let mut cfg = shared.settings.driver.clone();
    cfg.resource = holders.held().clone();
    // The DRA driver's prepared claims count when the kubelet does not report claims.
    let usage = crate::reload_guard::WithPreparedClaims {
        inner: erdma_driver::KubeletPodResources::from_cache(holders.clone()),
        checkpoint: erdma_dra::checkpoint::path_under(
            &shared.plan.sockets.kubelet_root_dir,
            erdma_model::names::DRA_DRIVER,
        ),
    };
    if cfg.installer_trust.allow_insecure_http {
        tracing::warn!(
            "INSECURE: --allow-insecure-driver-download is set; a driver installer may be downloaded over plain HTTP (its SHA-256 pin is still checked)"
        );
    }
    let host = erdma_driver::NodeHost::new().with_installer_trust(cfg.installer_trust.clone());
    let (rx, tx, reconciler) = start(host, usage, cfg, tasks.cancel.clone());
    tasks.keep(tx);
    tasks.set_reconciler(reconciler);
    let observe = observe(
        rx.clone(),
        shared.metrics.clone(),
        shared.cluster.clone(),
        tasks.started_up.clone(),
        tasks.cancel.clone(),
    );
    tasks.spawn("reporting the driver state", observe);
    *view = rx.clone();
    rx
}
