//! The agent's own state for `/healthz` and its metrics (driver readiness, pending driver changes,
//! refused reloads, ERI source, ERI netdev and SMC-R pnet setup), and the `/metrics` + `/healthz`
//! HTTP server that joins them with the device plugin's metrics.

use erdma_deviceplugin::Metrics;
use erdma_driver::DriverStatus;
use erdma_model::Excluded;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// What `/healthz` reports besides the plugin registration.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HealthView {
    /// The driver manager's status (mode, ready, reason, pending change).
    pub driver: Option<DriverStatus>,
    /// This node's ECS instance ID, once known.
    pub instance_id: Option<String>,
    /// Why the instance ID is not known yet (the metadata service keeps being retried).
    pub instance_id_error: Option<String>,
    /// Where the served ERIs come from, and its state.
    pub eri_source: String,
    /// Whether the ERI source lets devices be served now.
    pub eri_source_ready: bool,
    /// Devices advertised to the kubelet now.
    pub served: Vec<String>,
    /// Devices left out, with reasons.
    pub excluded: Vec<Excluded>,
    /// ERI netdev setup per interface: `ok`, `primary (untouched)`, or the error.
    pub netdev: BTreeMap<String, String>,
    /// SMC-R pnet setup warnings of the last run.
    pub smc_pnet_warnings: Vec<String>,
    /// The last SMC-R pre-start decisions (newest last, at most
    /// [`crate::smcr::RECENT_DECISIONS`]); empty without `--deviceplugin-prestart-container`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub smcr: Vec<crate::smcr::Decision>,
    /// Whether another device plugin serves the resource on this node (after the first look).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_plugin_conflict: Option<crate::coexistence::ConflictView>,
}

/// The agent's metrics (prefix `erdma_agent`) and the SMC-R metrics (prefix `erdma_smc`).
#[derive(Debug)]
pub struct AgentMetrics {
    registry: Registry,
    /// SMC-R pre-start outcomes and BPF policy size.
    pub smc: erdma_smc::metrics::SmcMetrics,
    /// SMC-R pre-starts whose pod could not be looked up (pod-resources or CRI unavailable).
    pub smcr_lookup_failures: Counter,
    /// 1 while the driver is ready (devices may be advertised).
    pub driver_ready: Gauge,
    /// 1 while a driver mode change is pending (refused because pods hold the devices).
    pub driver_pending_change: Gauge,
    /// Driver reloads refused because pods held the devices.
    pub driver_reload_refusals: Counter,
    /// ERI netdevs whose setup failed in the last run.
    pub netdev_setup_failures: Gauge,
    /// 1 while another device plugin serves the resource on this node.
    pub device_plugin_conflict: Gauge,
    /// Re-registrations after another device plugin for the resource had gone.
    pub device_plugin_reclaims: Counter,
}

impl AgentMetrics {
    fn new() -> Self {
        let mut root = Registry::default();
        let smc = erdma_smc::metrics::SmcMetrics::register(&mut root);
        let registry = root.sub_registry_with_prefix("erdma_agent");
        let smcr_lookup_failures = Counter::default();
        registry.register(
            "smcr_lookup_failures",
            "SMC-R pre-starts whose pod could not be looked up (kubelet pod-resources or container runtime unavailable)",
            smcr_lookup_failures.clone(),
        );
        let driver_ready = Gauge::default();
        let driver_pending_change = Gauge::default();
        let driver_reload_refusals = Counter::default();
        let netdev_setup_failures = Gauge::default();
        registry.register(
            "driver_ready",
            "1 while the erdma driver is ready and devices may be advertised",
            driver_ready.clone(),
        );
        registry.register(
            "driver_pending_change",
            "1 while a driver mode change is pending because pods hold aliyun/erdma",
            driver_pending_change.clone(),
        );
        registry.register(
            "driver_reload_refusals",
            "Driver reloads refused because pods held aliyun/erdma",
            driver_reload_refusals.clone(),
        );
        registry.register(
            "eri_netdev_setup_failures",
            "ERI netdevs whose setup failed in the last run",
            netdev_setup_failures.clone(),
        );
        let device_plugin_conflict = Gauge::default();
        let device_plugin_reclaims = Counter::default();
        registry.register(
            "device_plugin_conflict",
            "1 while another device plugin (terway's eRDMA ENI plugin, the original agent) serves the same resource on this node",
            device_plugin_conflict.clone(),
        );
        registry.register(
            "device_plugin_reclaims",
            "Re-registrations with the kubelet after another device plugin for the resource had gone",
            device_plugin_reclaims.clone(),
        );
        AgentMetrics {
            registry: root,
            smc,
            smcr_lookup_failures,
            driver_ready,
            driver_pending_change,
            driver_reload_refusals,
            netdev_setup_failures,
            device_plugin_conflict,
            device_plugin_reclaims,
        }
    }

    /// The OpenMetrics text of the agent's metrics.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Shared agent state: the health view and the agent metrics.
#[derive(Debug)]
pub struct AgentState {
    view: Mutex<HealthView>,
    /// Agent metrics.
    pub metrics: AgentMetrics,
}

impl Default for AgentState {
    fn default() -> Self {
        AgentState {
            view: Mutex::new(HealthView::default()),
            metrics: AgentMetrics::new(),
        }
    }
}

impl AgentState {
    /// Changes the health view.
    pub fn update(&self, f: impl FnOnce(&mut HealthView)) {
        let mut v = self.view.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut v);
    }

    /// A copy of the health view.
    pub fn view(&self) -> HealthView {
        self.view.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records a driver status: health view and metrics. `previous` is the status before, so a
    /// newly refused change counts once.
    pub fn observe_driver(&self, previous: Option<&DriverStatus>, now: &DriverStatus) {
        self.metrics.driver_ready.set(i64::from(now.ready));
        self.metrics
            .driver_pending_change
            .set(i64::from(now.pending.is_some()));
        if let Some(p) = &now.pending {
            let same = previous
                .and_then(|s| s.pending.as_ref())
                .is_some_and(|q| q.to == p.to && q.from == p.from);
            if !same {
                self.metrics.driver_reload_refusals.inc();
            }
        }
        self.update(|v| v.driver = Some(now.clone()));
    }

    /// The `/healthz` JSON.
    pub fn healthz(&self, plugin: &Metrics) -> String {
        #[derive(Serialize)]
        struct Out {
            ok: bool,
            registered: bool,
            #[serde(flatten)]
            view: HealthView,
        }
        let out = Out {
            ok: true,
            registered: plugin.is_registered(),
            view: self.view(),
        };
        let mut s = serde_json::to_string(&out)
            .unwrap_or_else(|e| format!("{{\"ok\":true,\"registered\":false,\"error\":\"{e}\"}}"));
        s.push('\n');
        s
    }

    /// `/metrics`: the device plugin's metrics followed by the agent's, one exposition.
    pub fn metrics_text(&self, plugin: &Metrics) -> String {
        let p = plugin.encode();
        let mut out = p.strip_suffix("# EOF\n").map(str::to_string).unwrap_or(p);
        out.push_str(&self.metrics.encode());
        out
    }
}

/// Serves `/metrics` and `/healthz` on `listener` until `cancel` fires. `/healthz` answers 200
/// while the process runs (an outage elsewhere must not make Kubernetes restart the agent).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    plugin: Arc<Metrics>,
    state: Arc<AgentState>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    use axum::http::header::CONTENT_TYPE;
    use axum::routing::get;
    let (p1, s1) = (plugin.clone(), state.clone());
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let (p, s) = (p1.clone(), s1.clone());
                async move {
                    (
                        [(
                            CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        s.metrics_text(&p),
                    )
                }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let (p, s) = (plugin.clone(), state.clone());
                async move { ([(CONTENT_TYPE, "application/json")], s.healthz(&p)) }
            }),
        );
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await
}
