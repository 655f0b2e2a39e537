//! A runtime stand-in (feature `fake`): listens on an NRI socket and drives a connected plugin the
//! way containerd does (accept, wait for `RegisterPlugin`, `Configure`, `Synchronize`, then pod
//! and container events, each a ttRPC call on the plugin's connection), as one of three NRI
//! versions ([`Mode`]). Like the runtime it closes the plugin's connection when the plugin breaks
//! the protocol or does not answer in time. The real runtime checks the same plugin in the lab
//! (containerd with NRI enabled).

use crate::api::{self, Event};
use crate::mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::ttrpc::{self, Answer, BoxFuture, Client, RpcError, Service, code};
use prost::Message as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The runtime the stand-in plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// containerd 1.7 (NRI v0.6): `Configure` tells no timeouts (0), `Synchronize` is one
    /// message, events come over `StateChange`, events up to RemoveContainer.
    Containerd17,
    /// containerd 2.0/2.1 (NRI v0.8): `Configure` tells the timeouts in milliseconds (2000 and
    /// 5000 by default), a `Synchronize` too large for one ttRPC message is split (`more`), events
    /// come over `StateChange`.
    #[default]
    Nri08,
    /// NRI v0.12: as v0.8 plus the events 12-14, and each event goes to its own RPC first
    /// (`RunPodSandbox`, ...); when the plugin answers Unimplemented the runtime falls back to
    /// `StateChange` for that event and, from then on, for every event it has a fallback for.
    Nri012,
}

impl Mode {
    fn valid_events(self) -> i32 {
        match self {
            Mode::Containerd17 | Mode::Nri08 => api::VALID_EVENTS_V08,
            Mode::Nri012 => api::VALID_EVENTS,
        }
    }
}

/// Events a v0.12 runtime sends to their own RPC first and, after an Unimplemented, over
/// `StateChange` (upstream `pkg/adaptation/plugin_type.go`, `origImplWrapper`).
const FALLS_BACK: &[Event] = &[
    Event::RunPodSandbox,
    Event::PostUpdatePodSandbox,
    Event::StopPodSandbox,
    Event::RemovePodSandbox,
    Event::PostCreateContainer,
    Event::StartContainer,
    Event::PostStartContainer,
    Event::PostUpdateContainer,
    Event::RemoveContainer,
];

/// The fewest pods and containers a runtime puts in one part of a split Synchronize.
const MIN_OBJECTS_PER_SYNC_MESSAGE: usize = 8;

/// Listens for plugins.
pub struct FakeRuntime {
    listener: UnixListener,
}

/// One part of a `Synchronize` as sent and answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncPart {
    /// Pods in the part.
    pub pods: usize,
    /// Containers in the part.
    pub containers: usize,
    /// The request's `more`.
    pub more: bool,
    /// The reply's `more`.
    pub reply_more: bool,
    /// Updates in the reply.
    pub reply_updates: usize,
}

/// A completed `Synchronize`.
#[derive(Debug, Clone, PartialEq)]
pub struct Synced {
    /// The updates of the last part's reply (the only one that may carry any).
    pub update: Vec<api::ContainerUpdate>,
    /// Every part sent, in order.
    pub parts: Vec<SyncPart>,
}

/// One connected plugin.
pub struct Session {
    client: Mutex<Option<Client>>,
    registrations: mpsc::UnboundedReceiver<api::RegisterPluginRequest>,
    /// The subscription after [`Session::configure`] as the runtime reads it (0 is every event).
    pub events: i32,
    /// The runtime played.
    pub mode: Mode,
    /// Timeout of each call to the plugin (of a whole `Synchronize`), told in `Configure` in
    /// milliseconds except in [`Mode::Containerd17`].
    pub timeout: Duration,
    /// How long the runtime waits for `RegisterPlugin`, told likewise.
    pub registration_timeout: Duration,
    fell_back: AtomicBool,
    methods: Mutex<Vec<String>>,
    closed: Mutex<Option<String>>,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Drop for Session {
    /// Closes the connection, as a runtime that goes away.
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

struct RuntimeService {
    registrations: mpsc::UnboundedSender<api::RegisterPluginRequest>,
}

impl Service for RuntimeService {
    fn call<'a>(
        &'a self,
        service: &'a str,
        method: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, Answer> {
        Box::pin(async move {
            match (service, method) {
                (api::RUNTIME_SERVICE, "RegisterPlugin") => {
                    let req = api::RegisterPluginRequest::decode(body.as_slice())
                        .map_err(|e| (code::INTERNAL, e.to_string()))?;
                    if req.plugin_idx.len() != 2 {
                        return Err((
                            code::UNKNOWN,
                            format!("invalid plugin index {:?}", req.plugin_idx),
                        ));
                    }
                    let _ = self.registrations.send(req);
                    Ok(api::Empty {}.encode_to_vec())
                }
                _ => Err((code::UNIMPLEMENTED, format!("{service}/{method}"))),
            }
        })
    }
}

impl FakeRuntime {
    /// Listens on `path`.
    pub fn bind(path: &Path) -> std::io::Result<Self> {
        Ok(FakeRuntime {
            listener: UnixListener::bind(path)?,
        })
    }

    /// Accepts the next plugin connection; the session plays [`Mode::Nri08`] with containerd's
    /// default timeouts until told otherwise.
    pub async fn accept(&self) -> std::io::Result<Session> {
        let (stream, _) = self.listener.accept().await?;
        let mut mux = Mux::new(stream);
        let plugin_conn = mux.open(PLUGIN_SERVICE_CONN);
        let runtime_conn = mux.open(RUNTIME_SERVICE_CONN);
        let mux_task = mux.start();
        let (tx, rx) = mpsc::unbounded_channel();
        let server = tokio::spawn(ttrpc::serve(
            runtime_conn,
            Arc::new(RuntimeService { registrations: tx }),
        ));
        let (client, reader) = Client::new(plugin_conn);
        Ok(Session {
            client: Mutex::new(Some(client)),
            registrations: rx,
            events: 0,
            mode: Mode::default(),
            timeout: Duration::from_secs(2),
            registration_timeout: Duration::from_secs(5),
            fell_back: AtomicBool::new(false),
            methods: Mutex::new(Vec::new()),
            closed: Mutex::new(None),
            tasks: vec![
                mux_task.abort_handle(),
                server.abort_handle(),
                reader.abort_handle(),
            ],
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Session {
    /// Waits for the plugin's `RegisterPlugin`, at most the registration timeout (then the
    /// runtime closes the connection: `None`).
    pub async fn registration(&mut self) -> Option<api::RegisterPluginRequest> {
        match tokio::time::timeout(self.registration_timeout, self.registrations.recv()).await {
            Ok(r) => r,
            Err(_) => {
                self.close("plugin registration timed out".into());
                None
            }
        }
    }

    /// Why the runtime closed the plugin's connection, once it did.
    pub fn closed(&self) -> Option<String> {
        lock(&self.closed).clone()
    }

    /// Whether a [`Mode::Nri012`] runtime fell back to `StateChange` for this plugin.
    pub fn fell_back(&self) -> bool {
        self.fell_back.load(Ordering::Relaxed)
    }

    /// The plugin's methods called so far, in order (a request refused as oversized before
    /// sending is not among them).
    pub fn methods(&self) -> Vec<String> {
        lock(&self.methods).clone()
    }

    /// Closes the plugin's connection, as the runtime does on a fatal error.
    fn close(&self, reason: String) {
        lock(&self.closed).get_or_insert(reason);
        lock(&self.client).take();
        for t in &self.tasks {
            t.abort();
        }
    }

    /// One call to the plugin, answered by `deadline`. A timeout or a broken connection closes
    /// the plugin, as the runtime's `isFatalError` does.
    async fn call_until<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        method: &str,
        req: &Req,
        deadline: Instant,
    ) -> Result<Resp, RpcError> {
        let body = self
            .call_raw_until(method, req.encode_to_vec(), deadline)
            .await?;
        Resp::decode(body.as_slice()).map_err(|e| RpcError::Protocol(e.to_string()))
    }

    async fn call_raw_until(
        &self,
        method: &str,
        body: Vec<u8>,
        deadline: Instant,
    ) -> Result<Vec<u8>, RpcError> {
        if let Some(reason) = self.closed() {
            return Err(RpcError::Protocol(format!(
                "the runtime closed the plugin: {reason}"
            )));
        }
        let Some(client) = lock(&self.client).clone() else {
            return Err(RpcError::Closed);
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let r = client.call(api::PLUGIN_SERVICE, method, body, left).await;
        if !matches!(r, Err(RpcError::Oversized { .. })) {
            lock(&self.methods).push(method.to_string());
        }
        if let Err(
            e @ (RpcError::Timeout { .. }
            | RpcError::Closed
            | RpcError::Mux(_)
            | RpcError::Protocol(_)),
        ) = &r
        {
            self.close(format!("failed to handle {method} request: {e}"));
        }
        r
    }

    /// Calls `method` with `body` as is (for methods the runtime does not call).
    pub async fn call_raw(&self, method: &str, body: Vec<u8>) -> Result<Vec<u8>, RpcError> {
        self.call_raw_until(method, body, Instant::now() + self.timeout)
            .await
    }

    fn millis(d: Duration) -> i64 {
        i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
    }

    /// `Configure`; returns the plugin's mask and remembers the subscription. A mask with events
    /// the runtime's version lacks closes the plugin, as the runtime does.
    pub async fn configure(&mut self) -> Result<i32, RpcError> {
        let (request_timeout, registration_timeout, nri_version) = match self.mode {
            Mode::Containerd17 => (0, 0, ""),
            Mode::Nri08 => (
                Self::millis(self.timeout),
                Self::millis(self.registration_timeout),
                "v0.8.0",
            ),
            Mode::Nri012 => (
                Self::millis(self.timeout),
                Self::millis(self.registration_timeout),
                "v0.12.2",
            ),
        };
        let r: api::ConfigureResponse = self
            .call_until(
                "Configure",
                &api::ConfigureRequest {
                    config: String::new(),
                    runtime_name: "erdma-fake-runtime".into(),
                    runtime_version: "0".into(),
                    registration_timeout,
                    request_timeout,
                    nri_version: nri_version.into(),
                },
                Instant::now() + self.timeout,
            )
            .await?;
        let valid = self.mode.valid_events();
        let extra = r.events & !valid;
        if extra != 0 {
            let reason = format!("invalid plugin events: 0x{extra:x}");
            self.close(reason.clone());
            return Err(RpcError::Protocol(reason));
        }
        self.events = if r.events == 0 { valid } else { r.events };
        Ok(r.events)
    }

    /// `Synchronize` with existing pods and containers, all at once when it fits one ttRPC
    /// message, else (from NRI v0.8) in parts as the runtime splits it: each part's counts scaled
    /// by the limit over the rejected length (at most 0.9), at least 8 objects a part, one
    /// deadline for all parts. A reply to a non-final part that does not echo `more`, or carries
    /// updates, closes the plugin ("plugin does not handle split sync requests").
    pub async fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> Result<Synced, RpcError> {
        let deadline = Instant::now() + self.timeout;
        let split = self.mode != Mode::Containerd17;
        let (mut pi, mut ci) = (0, 0);
        let (mut pods_per_msg, mut ctrs_per_msg) = (pods.len(), containers.len());
        let mut parts = Vec::new();
        loop {
            let (pods_left, ctrs_left) = (pods.len() - pi, containers.len() - ci);
            let req = api::SynchronizeRequest {
                pods: pods[pi..pi + pods_per_msg].to_vec(),
                containers: containers[ci..ci + ctrs_per_msg].to_vec(),
                more: pods_left > pods_per_msg || ctrs_left > ctrs_per_msg,
            };
            let r: Result<api::SynchronizeResponse, RpcError> =
                self.call_until("Synchronize", &req, deadline).await;
            match r {
                Ok(reply) => {
                    parts.push(SyncPart {
                        pods: req.pods.len(),
                        containers: req.containers.len(),
                        more: req.more,
                        reply_more: reply.more,
                        reply_updates: reply.update.len(),
                    });
                    if !req.more {
                        return Ok(Synced {
                            update: reply.update,
                            parts,
                        });
                    }
                    if !reply.update.is_empty() || reply.more != req.more {
                        let reason = "plugin does not handle split sync requests".to_string();
                        self.close(reason.clone());
                        return Err(RpcError::Protocol(reason));
                    }
                    pi += pods_per_msg;
                    ci += ctrs_per_msg;
                    pods_per_msg = pods_per_msg.min(pods.len() - pi);
                    ctrs_per_msg = ctrs_per_msg.min(containers.len() - ci);
                }
                Err(RpcError::Oversized { length, max, .. })
                    if split && pods_per_msg + ctrs_per_msg > MIN_OBJECTS_PER_SYNC_MESSAGE =>
                {
                    let factor = (max as f64 / length as f64).min(0.9);
                    pods_per_msg = (pods_per_msg as f64 * factor) as usize;
                    ctrs_per_msg = (ctrs_per_msg as f64 * factor) as usize;
                    if pods_per_msg + ctrs_per_msg < MIN_OBJECTS_PER_SYNC_MESSAGE {
                        // Upstream takes 4 and 4; fewer when fewer are left.
                        pods_per_msg = (MIN_OBJECTS_PER_SYNC_MESSAGE / 2).min(pods_left);
                        ctrs_per_msg = (MIN_OBJECTS_PER_SYNC_MESSAGE / 2).min(ctrs_left);
                    }
                }
                Err(e @ RpcError::Oversized { .. }) => {
                    let reason = if split {
                        "failed to synchronize plugin with split messages".to_string()
                    } else {
                        e.to_string()
                    };
                    self.close(reason.clone());
                    return Err(RpcError::Protocol(reason));
                }
                Err(e) => {
                    self.close(format!("failed to synchronize plugin: {e}"));
                    return Err(e);
                }
            }
        }
    }

    /// A pod or container lifecycle event other than the ones with adjustments or updates
    /// (CreateContainer, UpdateContainer, StopContainer, ValidateContainerAdjustment), sent only
    /// when subscribed, over the RPC the mode's runtime uses; `Ok(false)` when not subscribed.
    pub async fn state_change(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> Result<bool, RpcError> {
        let notification = matches!(event, Event::UpdatePodSandbox) || FALLS_BACK.contains(&event);
        if !notification {
            return Err(RpcError::Protocol(format!(
                "{} is not a notification event",
                api::event_name(event)
            )));
        }
        if !api::subscribed(self.events, event) {
            return Ok(false);
        }
        let deadline = Instant::now() + self.timeout;
        if self.mode == Mode::Nri012 {
            // UpdatePodSandbox has no StateChange fallback.
            if event == Event::UpdatePodSandbox || !self.fell_back() {
                match self.per_event(event, pod, container, deadline).await {
                    Err(RpcError::Status {
                        code: code::UNIMPLEMENTED,
                        ..
                    }) if event != Event::UpdatePodSandbox => {
                        self.fell_back.store(true, Ordering::Relaxed);
                    }
                    r => return r.map(|()| true),
                }
            }
        }
        let _: api::Empty = self
            .call_until(
                "StateChange",
                &api::StateChangeEvent {
                    event: event as i32,
                    pod: Some(pod.clone()),
                    container: container.cloned(),
                },
                deadline,
            )
            .await?;
        Ok(true)
    }

    /// An event over its own RPC (NRI v0.12). Every response of these is an empty message.
    async fn per_event(
        &self,
        event: Event,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
        deadline: Instant,
    ) -> Result<(), RpcError> {
        let (pod, container) = (Some(pod.clone()), container.cloned());
        let method = api::event_name(event);
        let body = match event {
            Event::RunPodSandbox => api::RunPodSandboxRequest { pod }.encode_to_vec(),
            Event::UpdatePodSandbox => api::UpdatePodSandboxRequest {
                pod,
                ..Default::default()
            }
            .encode_to_vec(),
            Event::PostUpdatePodSandbox => api::PostUpdatePodSandboxRequest { pod }.encode_to_vec(),
            Event::StopPodSandbox => api::StopPodSandboxRequest { pod }.encode_to_vec(),
            Event::RemovePodSandbox => api::RemovePodSandboxRequest { pod }.encode_to_vec(),
            Event::PostCreateContainer => {
                api::PostCreateContainerRequest { pod, container }.encode_to_vec()
            }
            Event::StartContainer => api::StartContainerRequest { pod, container }.encode_to_vec(),
            Event::PostStartContainer => {
                api::PostStartContainerRequest { pod, container }.encode_to_vec()
            }
            Event::PostUpdateContainer => {
                api::PostUpdateContainerRequest { pod, container }.encode_to_vec()
            }
            Event::RemoveContainer => {
                api::RemoveContainerRequest { pod, container }.encode_to_vec()
            }
            other => {
                return Err(RpcError::Protocol(format!(
                    "{} has no notification RPC",
                    api::event_name(other)
                )));
            }
        };
        let _ = self.call_raw_until(method, body, deadline).await?;
        Ok(())
    }

    /// `CreateContainer` (only when subscribed; else no adjustment).
    pub async fn create_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Result<api::CreateContainerResponse, RpcError> {
        if !api::subscribed(self.events, Event::CreateContainer) {
            return Ok(api::CreateContainerResponse::default());
        }
        self.call_until(
            "CreateContainer",
            &api::CreateContainerRequest {
                pod: Some(pod.clone()),
                container: Some(container.clone()),
            },
            Instant::now() + self.timeout,
        )
        .await
    }
}
