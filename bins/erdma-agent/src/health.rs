//! `/healthz`, `/readyz`, `/metrics` and `/usage`: one axum server. `/healthz` composes what each
//! task publishes on its own watch channel (driver status, instance ID, ERI source, served set, ERI
//! netdev and SMC-R pnet setup, SMC-R decisions, the NRI plugin, another device plugin); nobody writes into a
//! shared view. `/metrics` renders the process's one prometheus-client registry, after bringing
//! the per-pod RDMA usage up to date when it is on; `/usage` answers that usage as JSON
//! ([`crate::usage`]).

use crate::coexistence::ConflictView;
use crate::devices::ServedView;
use crate::nri::NriView;
use crate::resource_api::{DraView, ResourceApi};
use crate::smcr::Decision;
use crate::source::EriSource;
use erdma_deviceplugin::Metrics;
use erdma_driver::DriverStatus;
use erdma_host::http::{Bounds, ConnectionMetrics};
use erdma_model::Excluded;
use prometheus_client::registry::Registry;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;
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
    pub smcr: Vec<Decision>,
    /// The NRI plugin: mode, whether it is used and connected, and the SMC-R path of this node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nri: Option<NriView>,
    /// Whether another device plugin serves the resource on this node (after the first look).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_plugin_conflict: Option<ConflictView>,
    /// Which API serves the devices on this node (`device-plugin` or `dra`), once decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_api: Option<ResourceApi>,
    /// The DRA driver's state, when DRA serves this node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dra: Option<DraView>,
}

/// The channels `/healthz` reads, one per concern; each has exactly one publishing task.
#[derive(Debug, Clone)]
pub struct HealthSources {
    /// The driver manager's status.
    pub driver: watch::Receiver<DriverStatus>,
    /// The instance ID, once known.
    pub instance_id: watch::Receiver<Option<String>>,
    /// Why the instance ID is not known yet.
    pub instance_id_error: watch::Receiver<Option<String>>,
    /// The ERI source.
    pub eri_source: watch::Receiver<EriSource>,
    /// Served and excluded devices.
    pub served: watch::Receiver<ServedView>,
    /// ERI netdev setup per interface.
    pub netdev: watch::Receiver<BTreeMap<String, String>>,
    /// SMC-R pnet setup warnings.
    pub smc_pnet_warnings: watch::Receiver<Vec<String>>,
    /// The last SMC-R pre-start decisions.
    pub smcr: watch::Receiver<Vec<Decision>>,
    /// The NRI plugin's state.
    pub nri: watch::Receiver<Option<NriView>>,
    /// Another device plugin for the resource.
    pub device_plugin_conflict: watch::Receiver<Option<ConflictView>>,
    /// Device plugin or DRA on this node.
    pub resource_api: watch::Receiver<Option<ResourceApi>>,
    /// The DRA driver's state.
    pub dra: watch::Receiver<Option<DraView>>,
}

impl HealthSources {
    /// Sources that never change from their first value (`driver`): for a part of the agent that
    /// runs alone, or as a base to replace fields of.
    pub fn fixed(driver: DriverStatus) -> Self {
        fn rx<T>(v: T) -> watch::Receiver<T> {
            watch::channel(v).1
        }
        HealthSources {
            driver: rx(driver),
            instance_id: rx(None),
            instance_id_error: rx(None),
            eri_source: rx(EriSource::Local),
            served: rx(ServedView::default()),
            netdev: rx(BTreeMap::new()),
            smc_pnet_warnings: rx(Vec::new()),
            smcr: rx(Vec::new()),
            nri: rx(None),
            device_plugin_conflict: rx(None),
            resource_api: rx(None),
            dra: rx(None),
        }
    }

    /// The current view, composed from the last value of every channel.
    pub fn view(&self) -> HealthView {
        let source = self.eri_source.borrow().clone();
        let served = self.served.borrow().clone();
        HealthView {
            driver: Some(self.driver.borrow().clone()),
            instance_id: self.instance_id.borrow().clone(),
            instance_id_error: self.instance_id_error.borrow().clone(),
            eri_source: source.describe(),
            eri_source_ready: !matches!(source, EriSource::Waiting(_)),
            served: served.served,
            excluded: served.excluded,
            netdev: self.netdev.borrow().clone(),
            smc_pnet_warnings: self.smc_pnet_warnings.borrow().clone(),
            smcr: self.smcr.borrow().clone(),
            nri: self.nri.borrow().clone(),
            device_plugin_conflict: self.device_plugin_conflict.borrow().clone(),
            resource_api: *self.resource_api.borrow(),
            dra: self.dra.borrow().clone(),
        }
    }

    /// Whether the agent serves the devices through the resource API this node uses: the device
    /// plugin registered with the kubelet, or (on a DRA node) the DRA driver registered with the
    /// kubelet's plugin watcher. `Err` says what is missing.
    pub fn ready(&self, plugin: &Metrics) -> Result<(), String> {
        match *self.resource_api.borrow() {
            Some(ResourceApi::Dra) => match self.dra.borrow().as_ref() {
                Some(d) if d.registration == "registered" => Ok(()),
                Some(d) => Err(format!(
                    "DRA driver {} not registered with the kubelet ({})",
                    d.driver, d.registration
                )),
                None => Err("DRA driver not started yet".into()),
            },
            _ if plugin.is_registered() => Ok(()),
            _ => Err("device plugin not registered with the kubelet".into()),
        }
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
        let view = self.view();
        let registered = self.ready(plugin).is_ok();
        let out = Out {
            ok: true,
            registered,
            view,
        };
        let mut s = serde_json::to_string(&out)
            .unwrap_or_else(|e| format!("{{\"ok\":true,\"registered\":false,\"error\":\"{e}\"}}"));
        s.push('\n');
        s
    }
}

/// What the server renders.
#[derive(Clone)]
pub struct Exposition {
    /// The process's one metrics registry.
    pub registry: Arc<Registry>,
    /// The device plugin's metrics (registration state).
    pub plugin: Arc<Metrics>,
    /// The `/healthz` sources.
    pub health: HealthSources,
    /// Per-pod RDMA usage (`--rdma-usage`): read before `/metrics` is rendered, and served at
    /// `/usage`; `None` when off.
    pub usage: Option<Arc<crate::usage::UsageService>>,
}

/// The routes: `/metrics`, `/healthz`, `/readyz` and `/usage`. `/healthz` answers 200 while the
/// process runs (an outage elsewhere must not make Kubernetes restart the agent); `/readyz`
/// answers 200 once the agent serves through the node's resource API (the device plugin or the
/// DRA driver registered with the kubelet), else 503 with what is missing. With usage on,
/// `/metrics` first brings the usage up to date ([`crate::usage::UsageService::current`]);
/// `/usage` answers its JSON ([`erdma_usage::report::NodeUsage`]), 503 when it could not be read
/// or usage is off. The usage names pods: `/usage` answers 403 to a peer
/// [`crate::usage::UsageService::readable_by`] refuses (any but loopback, by default), and
/// `/metrics` leaves out the families that name pods for it.
pub fn router(what: Exposition) -> axum::Router {
    use axum::http::StatusCode;
    use axum::http::header::CONTENT_TYPE;
    use axum::routing::get;
    let (h, r) = (what.clone(), what.clone());
    let (registry, usage) = (what.registry.clone(), what.usage.clone());
    let usage_json = what.usage.clone();
    axum::Router::new()
        .route(
            "/metrics",
            get(move |req: axum::extract::Request| {
                let (registry, usage) = (registry.clone(), usage.clone());
                let peer = erdma_host::http::peer(&req);
                async move {
                    let Some(u) = usage else {
                        return erdma_host::http::metrics_response(&registry);
                    };
                    u.current().await;
                    if u.readable_by(peer).is_err() {
                        return erdma_host::http::metrics_response(&registry);
                    }
                    let mut pods = Registry::default();
                    pods.register_collector(Box::new(crate::usage::PodUsageCollector(u)));
                    erdma_host::http::metrics_response_all(&[&registry, &pods])
                }
            }),
        )
        .route(
            "/usage",
            get(move |req: axum::extract::Request| {
                let usage = usage_json.clone();
                let peer = erdma_host::http::peer(&req);
                async move {
                    let (code, body) = match usage {
                        Some(u) => match u.readable_by(peer) {
                            Err(why) => {
                                tracing::debug!(?peer, "/usage refused");
                                let why = format!("{why}\n");
                                return (
                                    StatusCode::FORBIDDEN,
                                    [(CONTENT_TYPE, "text/plain")],
                                    why,
                                );
                            }
                            Ok(()) => {
                                let now = u.current().await;
                                let code = if now.available {
                                    StatusCode::OK
                                } else {
                                    StatusCode::SERVICE_UNAVAILABLE
                                };
                                (code, serde_json::to_string(&*now).unwrap_or_default())
                            }
                        },
                        None => {
                            let off = erdma_usage::report::NodeUsage::unavailable(
                                None,
                                0,
                                "RDMA usage is off on this agent (--rdma-usage=false)".into(),
                            );
                            let body = serde_json::to_string(&off).unwrap_or_default();
                            (StatusCode::SERVICE_UNAVAILABLE, body)
                        }
                    };
                    (code, [(CONTENT_TYPE, "application/json")], body)
                }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let body = h.health.healthz(&h.plugin);
                async move { ([(CONTENT_TYPE, "application/json")], body) }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let ready = r.health.ready(&r.plugin);
                async move {
                    match ready {
                        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
                        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
                    }
                }
            }),
        )
}

/// Serves [`router`] on `listener` until `cancel` fires ([`erdma_host::http::serve`] under the
/// default bounds, its connections counted in metrics of its own: requests in progress are
/// answered, connections dropped [`erdma_host::http::DRAIN`] after). Never fails once bound; the
/// `Result` is for the callers written against `axum::serve`.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    what: Exposition,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let bounds = Bounds::new(SERVER, ConnectionMetrics::default());
    erdma_host::http::serve(listener, router(what), bounds, cancel).await;
    Ok(())
}

/// The `server` label of the agent's connection metrics.
pub const SERVER: &str = "metrics";

/// `/metrics`, `/healthz`, `/readyz` and `/usage` on `--metrics-addr`, unless it is `off`, its
/// connections counted in `connections`.
pub fn start(
    s: &crate::cli::Settings,
    what: Exposition,
    connections: ConnectionMetrics,
    tasks: &mut crate::tasks::Tasks,
) {
    if let crate::cli::MetricsAddr::On(addr) = s.metrics_addr {
        let cancel = tasks.cancel.clone();
        tasks.spawn("serving /metrics", serve(addr, what, connections, cancel));
    }
}

/// Binds `addr` (`--metrics-addr`) and serves [`router`] there under the default bounds
/// ([`erdma_host::http::bounds`]) until `cancel` fires; a failed bind is logged and retried every
/// 10 s while the devices are served.
pub async fn serve(
    addr: std::net::SocketAddr,
    what: Exposition,
    connections: ConnectionMetrics,
    cancel: CancellationToken,
) {
    let bind = erdma_host::http::Bind {
        addr,
        flag: "--metrics-addr",
        serves: "/metrics and /healthz",
        meanwhile: "devices are served meanwhile",
    };
    let bounds = Bounds::new(SERVER, connections);
    erdma_host::http::serve_bound(bind, router(what), bounds, cancel).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    /// On a DRA node the device plugin never registers: `/readyz` follows the DRA driver's
    /// registration with the kubelet instead (it used to wait for the device plugin forever).
    #[tokio::test]
    async fn readyz_follows_the_resource_api_of_the_node() {
        let (api_tx, api_rx) = watch::channel(Some(ResourceApi::Dra));
        let (dra_tx, dra_rx) = watch::channel(None);
        let health = HealthSources {
            resource_api: api_rx,
            dra: dra_rx,
            ..HealthSources::fixed(DriverStatus::unmanaged())
        };
        let plugin = Arc::new(Metrics::new());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = CancellationToken::new();
        let server = tokio::spawn(serve_on(
            listener,
            Exposition {
                registry: Arc::new(Registry::default()),
                plugin: plugin.clone(),
                health,
                usage: None,
            },
            cancel.clone(),
        ));
        let r = get(addr, "/readyz").await;
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(r.contains("DRA driver not started yet"), "{r}");
        let view = |registration: &str| DraView {
            driver: "erdma.alibabacloud.com".into(),
            registration: registration.into(),
            ..DraView::default()
        };
        dra_tx.send_replace(Some(view("pending")));
        let r = get(addr, "/readyz").await;
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(
            r.contains(
                "DRA driver erdma.alibabacloud.com not registered with the kubelet (pending)"
            ),
            "{r}"
        );
        dra_tx.send_replace(Some(view("registered")));
        let r = get(addr, "/readyz").await;
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(!plugin.is_registered(), "no device plugin on a DRA node");
        let h = get(addr, "/healthz").await;
        assert!(h.contains("\"registered\":true"), "{h}");

        // A device-plugin node: ready once the device plugin registered.
        api_tx.send_replace(Some(ResourceApi::DevicePlugin));
        let r = get(addr, "/readyz").await;
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(r.contains("device plugin not registered"), "{r}");
        plugin.observe_registration(true);
        let r = get(addr, "/readyz").await;
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        cancel.cancel();
        server.await.unwrap().unwrap();
    }
}
