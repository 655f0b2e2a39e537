//! The plugin side of NRI: connect to the runtime's socket, register, answer `Configure` with the
//! events the [`Handler`] wants, and hand it every subscribed pod and container event, each within a
//! time budget well inside the runtime's own (2 s by default in containerd): a handler that overruns
//! is answered for with "no change", so the runtime never fails a pod because erdma was slow.

use crate::api::{self, Event};
use crate::mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::ttrpc::{self, Answer, BoxFuture, Client, RpcError, Service, code};
use prost::Message as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The runtime's default request timeout (containerd, CRI-O).
pub const RUNTIME_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long registration may take.
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors of a plugin session.
#[derive(Debug, thiserror::Error)]
pub enum NriError {
    /// The socket could not be reached.
    #[error(
        "NRI socket {path}: {source} (is NRI enabled in the runtime? containerd 1.7: [plugins.\"io.containerd.nri.v1.nri\"] disable = false)"
    )]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The runtime refused or did not answer the registration.
    #[error("NRI registration: {0}")]
    Register(RpcError),
    /// The session broke.
    #[error("NRI session: {0}")]
    Session(#[from] RpcError),
    /// Bad plugin settings.
    #[error("NRI plugin settings: {0}")]
    Config(String),
}

/// Plugin identity and subscription.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// The runtime's NRI socket.
    pub socket: PathBuf,
    /// Plugin name (`erdma`).
    pub name: String,
    /// Two-digit index that orders plugins (`10`).
    pub idx: String,
    /// Events to subscribe (CreateContainer is always answered when subscribed).
    pub events: Vec<Event>,
    /// Longest time a handler may take for one call; the runtime's own timeout, when the runtime
    /// tells it at Configure, caps it at half of that. A runtime that does not tell it
    /// (containerd 1.7) is assumed to allow 2 s, unless the budget is set above half of that:
    /// then the operator raised the runtime's timeout too (`plugin_request_timeout`).
    pub budget: Duration,
}

impl PluginConfig {
    /// Checks name and index as the runtime does.
    pub fn validate(&self) -> Result<(), NriError> {
        if self.name.is_empty() || self.name.contains(['/', ' ']) {
            return Err(NriError::Config(format!(
                "plugin name {:?} must be non-empty without '/' or spaces",
                self.name
            )));
        }
        if self.idx.len() != 2 || !self.idx.bytes().all(|b| b.is_ascii_digit()) {
            return Err(NriError::Config(format!(
                "plugin index {:?} must be two digits (00-99)",
                self.idx
            )));
        }
        Ok(())
    }
}

/// What the plugin does with the events.
pub trait Handler: Send + Sync + 'static {
    /// Existing pods and containers at registration; updates to apply to them.
    fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> BoxFuture<'_, Vec<api::ContainerUpdate>>;
    /// A pod or container lifecycle event other than CreateContainer. An error fails the runtime's
    /// operation (for RunPodSandbox: the sandbox).
    fn state_change(
        &self,
        event: Event,
        pod: Option<api::PodSandbox>,
        container: Option<api::Container>,
    ) -> BoxFuture<'_, Result<(), String>>;
    /// Adjustments of a container about to be created. An error fails the container.
    fn create_container(
        &self,
        pod: api::PodSandbox,
        container: api::Container,
    ) -> BoxFuture<'_, Result<api::ContainerAdjustment, String>>;
}

struct PluginService<H> {
    handler: Arc<H>,
    events: i32,
    budget: Duration,
    runtime_timeout: Mutex<Duration>,
    shutdown: CancellationToken,
}

impl<H: Handler> PluginService<H> {
    fn budget(&self) -> Duration {
        let runtime = *self
            .runtime_timeout
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.budget.min(runtime / 2)
    }

    async fn dispatch(&self, method: &str, body: Vec<u8>) -> Answer {
        fn decode<M: prost::Message + Default>(b: &[u8], what: &str) -> Result<M, (i32, String)> {
            M::decode(b).map_err(|e| (code::INTERNAL, format!("cannot decode {what}: {e}")))
        }
        let budget = self.budget();
        match method {
            "Configure" => {
                let req: api::ConfigureRequest = decode(&body, "ConfigureRequest")?;
                if req.request_timeout > 0 {
                    *self
                        .runtime_timeout
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) =
                        Duration::from_nanos(req.request_timeout as u64);
                }
                tracing::info!(runtime = %req.runtime_name, version = %req.runtime_version, request_timeout_ms = req.request_timeout / 1_000_000, "NRI: configured by the runtime");
                Ok(api::ConfigureResponse {
                    events: self.events,
                }
                .encode_to_vec())
            }
            "Synchronize" => {
                let req: api::SynchronizeRequest = decode(&body, "SynchronizeRequest")?;
                let update = match tokio::time::timeout(
                    budget,
                    self.handler.synchronize(req.pods, req.containers),
                )
                .await
                {
                    Ok(u) => u,
                    Err(_) => {
                        tracing::warn!(?budget, "NRI Synchronize: over budget, no updates");
                        Vec::new()
                    }
                };
                Ok(api::SynchronizeResponse {
                    update,
                    more: false,
                }
                .encode_to_vec())
            }
            "CreateContainer" => {
                let req: api::CreateContainerRequest = decode(&body, "CreateContainerRequest")?;
                let (pod, c) = (
                    req.pod.unwrap_or_default(),
                    req.container.unwrap_or_default(),
                );
                let who = format!("{}/{} container {}", pod.namespace, pod.name, c.name);
                match tokio::time::timeout(budget, self.handler.create_container(pod, c)).await {
                    Ok(Ok(adjust)) => Ok(api::CreateContainerResponse {
                        adjust: Some(adjust),
                        ..Default::default()
                    }
                    .encode_to_vec()),
                    Ok(Err(e)) => Err((code::UNKNOWN, e)),
                    Err(_) => {
                        tracing::warn!(%who, ?budget, "NRI CreateContainer: over budget, nothing adjusted");
                        Ok(api::CreateContainerResponse::default().encode_to_vec())
                    }
                }
            }
            "StateChange" => {
                let ev: api::StateChangeEvent = decode(&body, "StateChangeEvent")?;
                let event = Event::try_from(ev.event).unwrap_or(Event::Unknown);
                match tokio::time::timeout(
                    budget,
                    self.handler.state_change(event, ev.pod, ev.container),
                )
                .await
                {
                    Ok(Ok(())) => Ok(api::Empty {}.encode_to_vec()),
                    Ok(Err(e)) => Err((code::UNKNOWN, e)),
                    Err(_) => {
                        tracing::warn!(
                            ?event,
                            ?budget,
                            "NRI event: over budget, answered without waiting"
                        );
                        Ok(api::Empty {}.encode_to_vec())
                    }
                }
            }
            "UpdateContainer" => Ok(api::UpdateContainerResponse::default().encode_to_vec()),
            "StopContainer" => Ok(api::StopContainerResponse::default().encode_to_vec()),
            "Shutdown" => {
                tracing::info!("NRI: the runtime asked the plugin to shut down");
                self.shutdown.cancel();
                Ok(api::Empty {}.encode_to_vec())
            }
            other => Err((
                code::UNIMPLEMENTED,
                format!(
                    "{}/{other} is not implemented by erdma's NRI plugin",
                    api::PLUGIN_SERVICE
                ),
            )),
        }
    }
}

impl<H: Handler> Service for PluginService<H> {
    fn call<'a>(
        &'a self,
        service: &'a str,
        method: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, Answer> {
        Box::pin(async move {
            if service != api::PLUGIN_SERVICE {
                return Err((code::UNIMPLEMENTED, format!("unknown service {service}")));
            }
            self.dispatch(method, body).await
        })
    }
}

/// One session: connect, register, serve until the runtime closes the connection, asks the plugin
/// to shut down, or `cancel` fires. Ok when the session ended normally (the caller reconnects).
pub async fn run_session<H: Handler>(
    cfg: &PluginConfig,
    handler: Arc<H>,
    cancel: &CancellationToken,
) -> Result<(), NriError> {
    cfg.validate()?;
    let stream = tokio::net::UnixStream::connect(&cfg.socket)
        .await
        .map_err(|source| NriError::Connect {
            path: cfg.socket.clone(),
            source,
        })?;
    let mut mux = Mux::new(stream);
    let plugin_conn = mux.open(PLUGIN_SERVICE_CONN);
    let runtime_conn = mux.open(RUNTIME_SERVICE_CONN);
    let mux_task = mux.start();
    let shutdown = CancellationToken::new();
    let service = Arc::new(PluginService {
        handler,
        events: api::event_mask(&cfg.events),
        budget: cfg.budget,
        runtime_timeout: Mutex::new(RUNTIME_REQUEST_TIMEOUT.max(cfg.budget * 2)),
        shutdown: shutdown.clone(),
    });
    let mut server = tokio::spawn(ttrpc::serve(plugin_conn, service));
    let (client, client_task) = Client::new(runtime_conn);
    let registered = client
        .call(
            api::RUNTIME_SERVICE,
            "RegisterPlugin",
            api::RegisterPluginRequest {
                plugin_name: cfg.name.clone(),
                plugin_idx: cfg.idx.clone(),
            }
            .encode_to_vec(),
            REGISTRATION_TIMEOUT,
        )
        .await;
    let result = match registered {
        Err(e) => Err(NriError::Register(e)),
        Ok(_) => {
            tracing::info!(plugin = %format!("{}-{}", cfg.idx, cfg.name), socket = %cfg.socket.display(), "NRI: registered");
            tokio::select! {
                _ = cancel.cancelled() => Ok(()),
                _ = shutdown.cancelled() => Ok(()),
                r = &mut server => match r {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(NriError::Session(e)),
                    Err(e) => Err(NriError::Session(RpcError::Protocol(format!("server task: {e}")))),
                },
            }
        }
    };
    server.abort();
    client_task.abort();
    mux_task.abort();
    result
}
