//! Health and Prometheus text metrics of the controller (`/healthz`, `/metrics` on one HTTP port).

use bytes::Bytes;
use http_body_util::Full;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Labels of the reconcile counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// `node` or `erdmadevice`.
    pub controller: &'static str,
    /// `ok` or `error`.
    pub result: &'static str,
}

/// The controller's metrics in one prometheus-client registry; cheap to update from any task.
pub struct Metrics {
    registry: Registry,
    /// Reconcile passes by controller and result.
    reconciles: Family<ReconcileLabels, Counter>,
    /// AdmissionReviews answered.
    pub reviews: Counter,
    /// Pods that got `smcr-init`.
    pub injected: Counter,
    /// 1 while this replica leads.
    pub leader: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        let (reviews, injected, leader) =
            (Counter::default(), Counter::default(), Gauge::default());
        registry.register(
            "erdma_controller_reconciles",
            "Reconcile passes by controller and result",
            reconciles.clone(),
        );
        registry.register(
            "erdma_webhook_reviews",
            "AdmissionReviews answered",
            reviews.clone(),
        );
        registry.register(
            "erdma_webhook_injections",
            "Pods that got the smcr-init init container",
            injected.clone(),
        );
        registry.register(
            "erdma_controller_leader",
            "1 while this replica is the leader",
            leader.clone(),
        );
        for controller in ["node", "erdmadevice"] {
            for result in ["ok", "error"] {
                // Listed at 0 before the first pass.
                drop(reconciles.get_or_create(&ReconcileLabels { controller, result }));
            }
        }
        Metrics {
            registry,
            reconciles,
            reviews,
            injected,
            leader,
        }
    }
}

impl Metrics {
    /// Counts one reconcile pass of `controller` (`node`, `erdmadevice`).
    pub fn reconciled(&self, controller: &'static str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reconciles
            .get_or_create(&ReconcileLabels { controller, result })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}

/// Serves `/healthz` and `/metrics` on `listener` until `cancel`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => match a { Ok((s, _)) => s, Err(_) => continue },
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let metrics = metrics.clone();
                    async move {
                        let (status, body) = match req.uri().path() {
                            "/healthz" | "/readyz" => (200, "ok".to_string()),
                            "/metrics" => (200, metrics.render()),
                            _ => (404, "not found".to_string()),
                        };
                        Ok::<_, std::convert::Infallible>(
                            hyper::Response::builder()
                                .status(status)
                                .body(Full::new(Bytes::from(body)))
                                .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new()))),
                        )
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
        });
    }
}
