//! Health and Prometheus text metrics of the controller (`/healthz`, `/readyz`, `/metrics` on one
//! HTTP port, served by [`erdma_host::http`] as the agent's).

use axum::http::StatusCode;
use axum::routing::any;
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

/// Labels of the ECS attempt counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EcsLabels {
    /// The ECS action.
    pub action: String,
    /// `ok`, `throttled` or `error`.
    pub outcome: &'static str,
}

/// Labels of the ECS retry counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    /// The ECS action.
    pub action: String,
}

/// Labels of the instance-mismatch counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MismatchLabels {
    /// The check that failed: `private_ip` or `vpc`.
    pub check: &'static str,
}

/// The controller's metrics in one prometheus-client registry; cheap to update from any task.
pub struct Metrics {
    registry: Arc<Registry>,
    /// Reconcile passes by controller and result.
    reconciles: Family<ReconcileLabels, Counter>,
    /// AdmissionReviews answered.
    pub reviews: Counter,
    /// Pods that got `smcr-init`.
    pub injected: Counter,
    /// 1 while this replica leads.
    pub leader: Gauge,
    /// 1 while this replica's webhook port serves (`erdma_webhook_serving`).
    pub webhook_serving: Gauge,
    /// Set when this replica must serve the webhook: `/readyz` then waits for
    /// [`Metrics::webhook_serving`].
    pub webhook_required: std::sync::atomic::AtomicBool,
    ecs: Family<EcsLabels, Counter>,
    ecs_retries: Family<ActionLabels, Counter>,
    mismatches: Family<MismatchLabels, Counter>,
    /// The connections of this process's HTTP servers (`erdma_http_connections*`).
    pub connections: erdma_host::http::ConnectionMetrics,
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
        let webhook_serving = Gauge::default();
        registry.register(
            "erdma_webhook_serving",
            "1 while this replica's webhook port serves",
            webhook_serving.clone(),
        );
        let ecs = Family::<EcsLabels, Counter>::default();
        let ecs_retries = Family::<ActionLabels, Counter>::default();
        registry.register(
            "erdma_ecs_requests",
            "ECS call attempts by action and outcome (ok, throttled, error)",
            ecs.clone(),
        );
        registry.register(
            "erdma_ecs_retries",
            "ECS calls tried again after a retryable failure, by action",
            ecs_retries.clone(),
        );
        let connections = erdma_host::http::ConnectionMetrics::register(&mut registry);
        let mismatches = Family::<MismatchLabels, Counter>::default();
        registry.register(
            "erdma_controller_instance_mismatch",
            "Node reconciles refused before any ECS write: the instance the Node names is not that node (check: private_ip, vpc)",
            mismatches.clone(),
        );
        for check in ["private_ip", "vpc"] {
            drop(mismatches.get_or_create(&MismatchLabels { check }));
        }
        for controller in ["node", "erdmadevice"] {
            for result in ["ok", "error"] {
                // Listed at 0 before the first pass.
                drop(reconciles.get_or_create(&ReconcileLabels { controller, result }));
            }
        }
        Metrics {
            registry: Arc::new(registry),
            reconciles,
            reviews,
            injected,
            leader,
            webhook_serving,
            webhook_required: Default::default(),
            ecs,
            ecs_retries,
            mismatches,
            connections,
        }
    }
}

impl erdma_cloud::ecs::EcsObserver for Metrics {
    fn answered(
        &self,
        action: &str,
        _params: &[(String, String)],
        outcome: erdma_cloud::ecs::Outcome,
    ) {
        self.ecs
            .get_or_create(&EcsLabels {
                action: action.to_string(),
                outcome: outcome.as_str(),
            })
            .inc();
    }

    fn retried(&self, action: &str, _params: &[(String, String)]) {
        self.ecs_retries
            .get_or_create(&ActionLabels {
                action: action.to_string(),
            })
            .inc();
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

    /// Counts a node refused by the instance check `check` ([`crate::verify::Mismatch::check`]).
    pub fn instance_mismatch(&self, check: &'static str) {
        self.mismatches
            .get_or_create(&MismatchLabels { check })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        erdma_host::http::encode(&self.registry)
    }
}

/// Serves `/healthz` (`ok` while the process runs), `/readyz` (`ok` once the webhook port serves
/// when this replica must serve one, else `503`) and `/metrics` on `listener` until `cancel`; any
/// method, as before the port to axum; elsewhere `404 not found`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let registry = metrics.registry.clone();
    let ready = metrics.clone();
    let app = axum::Router::new()
        .route("/healthz", any(|| async { "ok" }))
        .route(
            "/readyz",
            any(move || {
                let ready = ready.clone();
                async move { readiness(&ready) }
            }),
        )
        .route(
            "/metrics",
            any(move || {
                let answer = erdma_host::http::metrics_response(&registry);
                async move { answer }
            }),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found") });
    let bounds = erdma_host::http::Bounds::new("metrics", metrics.connections.clone());
    erdma_host::http::serve(listener, app, bounds, cancel).await
}

/// The `/readyz` answer: not ready while the webhook this replica must serve does not serve yet
/// (the API server would otherwise be sent to a replica that refuses the connection).
fn readiness(m: &Metrics) -> (StatusCode, &'static str) {
    let required = m
        .webhook_required
        .load(std::sync::atomic::Ordering::Relaxed);
    if required && m.webhook_serving.get() == 0 {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the webhook port does not serve yet (waiting for its certificate)",
        )
    } else {
        (StatusCode::OK, "ok")
    }
}
