//! The plugin side of NRI: connect to the runtime's socket, register, answer `Configure` with the
//! events the [`Handler`] wants, and hand it every subscribed pod and container event, each within a
//! time budget well inside the runtime's own (2 s by default in containerd, told in `Configure` in
//! milliseconds): a handler that overruns is answered for with "no change", so the runtime never
//! fails a pod because erdma was slow (nor closes the plugin, which it does on its own timeout).
//!
//! Each event is answered over the RPC the runtime uses: its own one (`RunPodSandbox`, ... NRI
//! v0.12+, as the upstream stub answers them) or `StateChange` (older runtimes). An event the
//! plugin is not subscribed to, and any unknown method, is refused with Unimplemented (12), on which
//! a v0.12 runtime falls back to `StateChange`. A Synchronize split over several messages (`more`)
//! is collected and handed over once. Every hook's duration and outcome goes to a [`HookObserver`].

use crate::api::{self, Event};
use crate::mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::ttrpc::{self, Answer, BoxFuture, Client, RpcError, Service, code};
use prost::Message as _;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The runtime's default request timeout (containerd, CRI-O).
pub const RUNTIME_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long registration may take.
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);
/// Most pods and containers a split Synchronize may carry in all its parts (a node runs a few
/// hundred at most); a runtime that sends more is refused, so that endless `more` parts cannot
/// grow the plugin's memory without bound.
pub const MAX_SYNC_OBJECTS: usize = 100_000;

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
    /// Events to subscribe (an empty list subscribes all, as the runtime reads a mask of 0).
    pub events: Vec<Event>,
    /// Longest time a handler may take for one call; the runtime's own timeout, when the runtime
    /// tells it at Configure (NRI v0.7+, containerd 2.0+: milliseconds), caps it at half of that.
    /// A runtime that does not tell it (containerd 1.7) is assumed to allow 2 s, unless the budget
    /// is set above half of that: then the operator raised the runtime's timeout too
    /// (`plugin_request_timeout`).
    pub budget: Duration,
    /// Told every hook's duration and outcome.
    pub observer: Option<Arc<dyn HookObserver>>,
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

/// What the runtime called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    /// `Configure`.
    Configure,
    /// `Synchronize`, once for all its parts.
    Synchronize,
    /// `Shutdown`.
    Shutdown,
    /// A pod or container event, whichever RPC brought it (its own one in NRI v0.12+, or
    /// `StateChange`).
    Event(Event),
}

impl Hook {
    /// The name NRI gives it (`Configure`, `RunPodSandbox`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Hook::Configure => "Configure",
            Hook::Synchronize => "Synchronize",
            Hook::Shutdown => "Shutdown",
            Hook::Event(e) => api::event_name(e),
        }
    }
}

/// How a hook ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Answered with the handler's result.
    Ok,
    /// Answered with an error (the handler's, or an undecodable request): the runtime fails the
    /// operation; for `ValidateContainerAdjustment`, the plugin rejects the adjustment.
    Error,
    /// The handler overran its budget and was cut: answered "no change".
    OverBudget,
}

impl Outcome {
    /// `ok`, `error` or `over_budget`.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::OverBudget => "over_budget",
        }
    }
}

/// How a plugin session ([`run_session`]) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionEnd {
    /// Normally: the runtime closed the connection or asked the plugin to shut down, or the
    /// plugin stopped.
    Ended,
    /// Bad plugin settings ([`NriError::Config`]).
    ConfigError,
    /// The socket could not be reached ([`NriError::Connect`]).
    ConnectError,
    /// The runtime refused or did not answer the registration ([`NriError::Register`]).
    RegisterError,
    /// The session broke ([`NriError::Session`]).
    SessionError,
}

impl SessionEnd {
    /// How `result`, a session's, ended.
    pub fn of(result: &Result<(), NriError>) -> Self {
        match result {
            Ok(()) => SessionEnd::Ended,
            Err(NriError::Config(_)) => SessionEnd::ConfigError,
            Err(NriError::Connect { .. }) => SessionEnd::ConnectError,
            Err(NriError::Register(_)) => SessionEnd::RegisterError,
            Err(NriError::Session(_)) => SessionEnd::SessionError,
        }
    }

    /// `ended`, `config_error`, `connect_error`, `register_error` or `session_error`.
    pub fn name(self) -> &'static str {
        match self {
            SessionEnd::Ended => "ended",
            SessionEnd::ConfigError => "config_error",
            SessionEnd::ConnectError => "connect_error",
            SessionEnd::RegisterError => "register_error",
            SessionEnd::SessionError => "session_error",
        }
    }
}

/// Told every hook's duration (from the request's arrival, or the first part's for a split
/// Synchronize, to the answer) and outcome, and how each session ended; metrics, typically.
pub trait HookObserver: Send + Sync + 'static {
    /// One answered hook.
    fn observe(&self, hook: Hook, outcome: Outcome, elapsed: Duration);

    /// One session ended (the caller reconnects); nothing by default.
    fn session_ended(&self, end: SessionEnd) {
        let _ = end;
    }
}

impl std::fmt::Debug for dyn HookObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookObserver")
    }
}

/// What the plugin does with the events.
pub trait Handler: Send + Sync + 'static {
    /// Existing pods and containers at registration (all parts of a split Synchronize at once);
    /// updates to apply to them.
    fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> BoxFuture<'_, Vec<api::ContainerUpdate>>;
    /// A subscribed pod or container event other than CreateContainer, over its own RPC (NRI
    /// v0.12+) or `StateChange`. An error fails the runtime's operation (for RunPodSandbox: the
    /// sandbox; for ValidateContainerAdjustment it rejects the adjustment).
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

/// The parts of a split Synchronize received so far.
struct PendingSync {
    started: Instant,
    pods: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
    parts: usize,
}

struct PluginService<H> {
    handler: Arc<H>,
    events: i32,
    budget: Duration,
    runtime_timeout: Mutex<Duration>,
    sync: Mutex<Option<PendingSync>>,
    observer: Option<Arc<dyn HookObserver>>,
    shutdown: CancellationToken,
}

/// The pod and container of a per-event request (NRI v0.12+), by the event its method carries.
fn decode_event_request(
    event: Event,
    body: &[u8],
) -> Result<(Option<api::PodSandbox>, Option<api::Container>), prost::DecodeError> {
    Ok(match event {
        Event::RunPodSandbox => (api::RunPodSandboxRequest::decode(body)?.pod, None),
        Event::UpdatePodSandbox => (api::UpdatePodSandboxRequest::decode(body)?.pod, None),
        Event::PostUpdatePodSandbox => (api::PostUpdatePodSandboxRequest::decode(body)?.pod, None),
        Event::StopPodSandbox => (api::StopPodSandboxRequest::decode(body)?.pod, None),
        Event::RemovePodSandbox => (api::RemovePodSandboxRequest::decode(body)?.pod, None),
        Event::PostCreateContainer => {
            let r = api::PostCreateContainerRequest::decode(body)?;
            (r.pod, r.container)
        }
        Event::StartContainer => {
            let r = api::StartContainerRequest::decode(body)?;
            (r.pod, r.container)
        }
        Event::PostStartContainer => {
            let r = api::PostStartContainerRequest::decode(body)?;
            (r.pod, r.container)
        }
        Event::UpdateContainer => {
            let r = api::UpdateContainerRequest::decode(body)?;
            (r.pod, r.container)
        }
        Event::PostUpdateContainer => {
            let r = api::PostUpdateContainerRequest::decode(body)?;
            (r.pod, r.container)
        }
        Event::StopContainer => {
            let r = api::StopContainerRequest::decode(body)?;
            (r.pod, r.container)
        }
        Event::RemoveContainer => {
            let r = api::RemoveContainerRequest::decode(body)?;
            (r.pod, r.container)
        }
        Event::ValidateContainerAdjustment => {
            let r = api::ValidateContainerAdjustmentRequest::decode(body)?;
            (r.pod, r.container)
        }
        Event::Unknown | Event::CreateContainer | Event::Last => (None, None),
    })
}

/// The event of a per-event method other than CreateContainer (which has its own handler).
fn event_of_method(method: &str) -> Option<Event> {
    const METHODS: &[Event] = &[
        Event::RunPodSandbox,
        Event::UpdatePodSandbox,
        Event::PostUpdatePodSandbox,
        Event::StopPodSandbox,
        Event::RemovePodSandbox,
        Event::PostCreateContainer,
        Event::StartContainer,
        Event::PostStartContainer,
        Event::UpdateContainer,
        Event::PostUpdateContainer,
        Event::StopContainer,
        Event::RemoveContainer,
        Event::ValidateContainerAdjustment,
    ];
    METHODS
        .iter()
        .copied()
        .find(|e| api::event_name(*e) == method)
}

fn who(pod: Option<&api::PodSandbox>, container: Option<&api::Container>) -> String {
    let (ns, name) = pod.map_or(("", ""), |p| (p.namespace.as_str(), p.name.as_str()));
    match container {
        Some(c) => format!("{ns}/{name} container {}", c.name),
        None => format!("{ns}/{name}"),
    }
}

impl<H: Handler> PluginService<H> {
    fn budget(&self) -> Duration {
        let runtime = *self
            .runtime_timeout
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.budget.min(runtime / 2)
    }

    /// The runtime reads a subscription of 0 as every event.
    fn subscribed(&self, event: Event) -> bool {
        let mask = if self.events == 0 {
            api::VALID_EVENTS
        } else {
            self.events
        };
        api::subscribed(mask, event)
    }

    fn observe(&self, hook: Hook, outcome: Outcome, started: Instant) {
        if let Some(o) = &self.observer {
            o.observe(hook, outcome, started.elapsed());
        }
    }

    /// Runs `work` within `budget`: `Ok(None)` when it overran (the caller answers "no change").
    async fn within<T>(
        &self,
        hook: Hook,
        who: &str,
        started: Instant,
        budget: Duration,
        work: impl Future<Output = Result<T, String>>,
    ) -> Result<Option<T>, String> {
        let (outcome, result) = match tokio::time::timeout(budget, work).await {
            Ok(Ok(v)) => (Outcome::Ok, Ok(Some(v))),
            Ok(Err(e)) => (Outcome::Error, Err(e)),
            Err(_) => {
                tracing::warn!(hook = hook.name(), %who, ?budget, "NRI: over budget, answered with no change");
                (Outcome::OverBudget, Ok(None))
            }
        };
        self.observe(hook, outcome, started);
        result
    }

    fn decode<M: prost::Message + Default>(
        &self,
        hook: Hook,
        started: Instant,
        body: &[u8],
    ) -> Result<M, (i32, String)> {
        M::decode(body).map_err(|e| {
            self.observe(hook, Outcome::Error, started);
            (
                code::INTERNAL,
                format!("cannot decode the {} request: {e}", hook.name()),
            )
        })
    }

    fn not_subscribed(method: &str, event: Event) -> (i32, String) {
        (
            code::UNIMPLEMENTED,
            format!(
                "{}/{method}: erdma's NRI plugin is not subscribed to {}",
                api::PLUGIN_SERVICE,
                api::event_name(event)
            ),
        )
    }

    async fn dispatch(&self, method: &str, body: Vec<u8>) -> Answer {
        let started = Instant::now();
        match method {
            "Configure" => {
                let req: api::ConfigureRequest = self.decode(Hook::Configure, started, &body)?;
                self.configure(&req);
                self.observe(Hook::Configure, Outcome::Ok, started);
                Ok(api::ConfigureResponse {
                    events: self.events,
                }
                .encode_to_vec())
            }
            "Synchronize" => self.synchronize(&body, started).await,
            "CreateContainer" => {
                let hook = Hook::Event(Event::CreateContainer);
                if !self.subscribed(Event::CreateContainer) {
                    return Err(Self::not_subscribed(method, Event::CreateContainer));
                }
                let req: api::CreateContainerRequest = self.decode(hook, started, &body)?;
                let (pod, c) = (
                    req.pod.unwrap_or_default(),
                    req.container.unwrap_or_default(),
                );
                let who = who(Some(&pod), Some(&c));
                let budget = self.budget();
                match self
                    .within(
                        hook,
                        &who,
                        started,
                        budget,
                        self.handler.create_container(pod, c),
                    )
                    .await
                {
                    Ok(adjust) => Ok(api::CreateContainerResponse {
                        adjust,
                        ..Default::default()
                    }
                    .encode_to_vec()),
                    Err(e) => Err((code::UNKNOWN, e)),
                }
            }
            "StateChange" => {
                let ev: api::StateChangeEvent =
                    self.decode(Hook::Event(Event::Unknown), started, &body)?;
                let event = Event::try_from(ev.event).unwrap_or(Event::Unknown);
                // CreateContainer has its own RPC in every NRI version.
                if matches!(event, Event::Unknown | Event::Last | Event::CreateContainer)
                    || !self.subscribed(event)
                {
                    return Err(Self::not_subscribed(method, event));
                }
                self.event(event, ev.pod, ev.container, started).await
            }
            "Shutdown" => {
                tracing::info!("NRI: the runtime asked the plugin to shut down");
                self.shutdown.cancel();
                self.observe(Hook::Shutdown, Outcome::Ok, started);
                Ok(api::Empty {}.encode_to_vec())
            }
            other => match event_of_method(other) {
                Some(event) if self.subscribed(event) => {
                    let (pod, container) = decode_event_request(event, &body).map_err(|e| {
                        self.observe(Hook::Event(event), Outcome::Error, started);
                        (
                            code::INTERNAL,
                            format!("cannot decode the {other} request: {e}"),
                        )
                    })?;
                    self.event(event, pod, container, started).await
                }
                Some(event) => Err(Self::not_subscribed(other, event)),
                None => Err((
                    code::UNIMPLEMENTED,
                    format!(
                        "{}/{other} is not implemented by erdma's NRI plugin",
                        api::PLUGIN_SERVICE
                    ),
                )),
            },
        }
    }

    fn configure(&self, req: &api::ConfigureRequest) {
        // Both timeouts are milliseconds; 0 (containerd 1.7) leaves the assumed default.
        if let Some(ms) = u64::try_from(req.request_timeout).ok().filter(|ms| *ms > 0) {
            *self
                .runtime_timeout
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Duration::from_millis(ms);
        }
        let told = |ms: i64| (ms > 0).then_some(ms);
        // The registration timeout only bounds RegisterPlugin, which is over by now.
        tracing::info!(
            runtime = %req.runtime_name,
            version = %req.runtime_version,
            nri_version = %req.nri_version,
            request_timeout_ms = ?told(req.request_timeout),
            registration_timeout_ms = ?told(req.registration_timeout),
            budget_ms = self.budget().as_millis(),
            "NRI: configured by the runtime"
        );
    }

    /// Collects the parts of a split Synchronize (each answered `more: true` with no updates, as
    /// the runtime requires) and hands all pods and containers to the handler at the last one.
    async fn synchronize(&self, body: &[u8], started: Instant) -> Answer {
        let req: api::SynchronizeRequest = self.decode(Hook::Synchronize, started, body)?;
        let all = {
            let mut pending = self.sync.lock().unwrap_or_else(|e| e.into_inner());
            let p = pending.get_or_insert_with(|| PendingSync {
                started,
                pods: Vec::new(),
                containers: Vec::new(),
                parts: 0,
            });
            p.pods.extend(req.pods);
            p.containers.extend(req.containers);
            p.parts += 1;
            if p.pods.len() + p.containers.len() > MAX_SYNC_OBJECTS {
                let parts = p.parts;
                pending.take();
                self.observe(Hook::Synchronize, Outcome::Error, started);
                return Err((
                    code::INTERNAL,
                    format!(
                        "Synchronize carries more than {MAX_SYNC_OBJECTS} pods and containers in {parts} parts; refused"
                    ),
                ));
            }
            if req.more {
                return Ok(api::SynchronizeResponse {
                    update: Vec::new(),
                    more: true,
                }
                .encode_to_vec());
            }
            pending.take()
        };
        let Some(all) = all else {
            return Err((code::INTERNAL, "synchronize state lost".into()));
        };
        // The runtime's deadline covers every part, so the handler gets what is left of it.
        let budget = self.budget().saturating_sub(all.started.elapsed());
        let who = format!(
            "{} pods, {} containers in {} parts",
            all.pods.len(),
            all.containers.len(),
            all.parts
        );
        tracing::debug!(%who, "NRI: Synchronize complete");
        let handler = self.handler.clone();
        let update = self
            .within(Hook::Synchronize, &who, all.started, budget, async move {
                Ok(handler.synchronize(all.pods, all.containers).await)
            })
            .await
            .ok()
            .flatten()
            .unwrap_or_default();
        Ok(api::SynchronizeResponse {
            update,
            more: false,
        }
        .encode_to_vec())
    }

    async fn event(
        &self,
        event: Event,
        pod: Option<api::PodSandbox>,
        container: Option<api::Container>,
        started: Instant,
    ) -> Answer {
        let who = who(pod.as_ref(), container.as_ref());
        let budget = self.budget();
        let r = self
            .within(
                Hook::Event(event),
                &who,
                started,
                budget,
                self.handler.state_change(event, pod, container),
            )
            .await;
        match r {
            // Every "no change" answer to an event (StateChange's Empty, RunPodSandboxResponse,
            // an UpdateContainerResponse without updates, a validation without rejection) is a
            // message with no fields set, which encodes as no bytes.
            Ok(_) => Ok(Vec::new()),
            Err(reason) if event == Event::ValidateContainerAdjustment => {
                Ok(api::ValidateContainerAdjustmentResponse {
                    reject: true,
                    reason,
                }
                .encode_to_vec())
            }
            Err(e) => Err((code::UNKNOWN, e)),
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
/// How it ended goes to the [`HookObserver`].
pub async fn run_session<H: Handler>(
    cfg: &PluginConfig,
    handler: Arc<H>,
    cancel: &CancellationToken,
) -> Result<(), NriError> {
    let result = session(cfg, handler, cancel).await;
    if let Some(o) = &cfg.observer {
        o.session_ended(SessionEnd::of(&result));
    }
    result
}

async fn session<H: Handler>(
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
        sync: Mutex::new(None),
        observer: cfg.observer.clone(),
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
