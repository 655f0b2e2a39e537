//! Health and Prometheus text metrics of the controller (`/healthz`, `/metrics` on one HTTP port).

use bytes::Bytes;
use http_body_util::Full;
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio_util::sync::CancellationToken;

/// Counters; cheap to update from any task.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Node reconciles that succeeded.
    pub node_ok: AtomicU64,
    /// Node reconciles that failed.
    pub node_err: AtomicU64,
    /// ERdmaDevice reconciles that succeeded.
    pub device_ok: AtomicU64,
    /// ERdmaDevice reconciles that failed.
    pub device_err: AtomicU64,
    /// Pods that got `smcr-init`.
    pub injected: AtomicU64,
    /// AdmissionReviews answered.
    pub reviews: AtomicU64,
    /// 1 while this replica leads.
    pub leader: AtomicU64,
}

impl Metrics {
    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# HELP erdma_controller_reconciles_total Reconcile passes by controller and result."
        );
        let _ = writeln!(s, "# TYPE erdma_controller_reconciles_total counter");
        for (c, r, v) in [
            ("node", "ok", &self.node_ok),
            ("node", "error", &self.node_err),
            ("erdmadevice", "ok", &self.device_ok),
            ("erdmadevice", "error", &self.device_err),
        ] {
            let _ = writeln!(
                s,
                "erdma_controller_reconciles_total{{controller=\"{c}\",result=\"{r}\"}} {}",
                g(v)
            );
        }
        let _ = writeln!(
            s,
            "# HELP erdma_webhook_reviews_total AdmissionReviews answered.\n# TYPE erdma_webhook_reviews_total counter"
        );
        let _ = writeln!(s, "erdma_webhook_reviews_total {}", g(&self.reviews));
        let _ = writeln!(
            s,
            "# HELP erdma_webhook_injections_total Pods that got the smcr-init init container.\n# TYPE erdma_webhook_injections_total counter"
        );
        let _ = writeln!(s, "erdma_webhook_injections_total {}", g(&self.injected));
        let _ = writeln!(
            s,
            "# HELP erdma_controller_leader 1 while this replica is the leader.\n# TYPE erdma_controller_leader gauge"
        );
        let _ = writeln!(s, "erdma_controller_leader {}", g(&self.leader));
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
