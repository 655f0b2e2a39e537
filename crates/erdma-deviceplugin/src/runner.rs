//! The plugin lifecycle: serve the socket, register, notice kubelet restarts, re-serve and
//! re-register, shut down cleanly.
//!
//! Restart detection uses inotify on the device-plugin directory (our socket removed,
//! `kubelet.sock` created; [`crate::dirwatch`]) plus a stat of both sockets every
//! [`PluginConfig::safety_poll`] (every second while no watch is live). While the kubelet is
//! down, registration is retried with a backoff (50 ms doubling to 5 s, cut short when
//! `kubelet.sock` appears). A new `kubelet.sock` that refuses the connection (the kubelet binds
//! it, so it appears, a moment before it listens) is retried every 20 ms for 2 s, so the grown
//! back-off never decides when a kubelet that has just appeared is reached. Nothing here exits
//! the process.

use crate::config::PluginConfig;
use crate::devices::ServedSet;
use crate::dirwatch::{DirEvent, DirWatch, POLL};
use crate::metrics::Metrics;
use crate::service::{
    AllocateObserver, DevicePluginService, NoopPreStart, PluginState, PreStartHook,
};
use erdma_kubelet::deviceplugin::v1beta1 as api;
use erdma_kubelet::deviceplugin::v1beta1::registration_client::RegistrationClient;
use erdma_kubelet::podresources::{Held, Holders, PodResourcesClient};
use erdma_kubelet::uds::{self, ClientAuthority};
use erdma_model::{Backoff, NodeDevices};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const BACKOFF_START: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
const REGISTER_TIMEOUT: Duration = Duration::from_secs(15);
/// How often a new `kubelet.sock` that refused the connection is tried again ...
const SETTLE_STEP: Duration = Duration::from_millis(20);
/// ... and for how long after its first refusal, before the back-off (from its start) takes over:
/// a socket nobody listens on for that long is a stale one.
const SETTLE_WINDOW: Duration = Duration::from_secs(2);

/// Errors that stop the plugin before it starts.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The configuration is unusable.
    #[error("device plugin configuration: {0}")]
    Config(String),
}

/// Identity of a file (device, inode), to tell a re-created socket from the old one.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Everything needed to run the plugin.
pub struct Plugin {
    cfg: PluginConfig,
    devices: watch::Receiver<NodeDevices>,
    metrics: Arc<Metrics>,
    pre_start: Arc<dyn PreStartHook>,
    reclaim: Arc<Notify>,
    on_allocate: Option<AllocateObserver>,
    holders: Option<Arc<Holders>>,
}

/// Asks a running plugin to register again, as after a kubelet restart. Used only after another
/// plugin that had taken the resource over has gone (see [`crate::coexistence`]): the kubelet then
/// still points at the departed plugin, and registering again is the only way back.
#[derive(Debug, Clone)]
pub struct Reclaimer(Arc<Notify>);

impl Reclaimer {
    /// Requests one re-registration (requests made while one is pending merge).
    pub fn request(&self) {
        self.0.notify_one();
    }
}

impl Plugin {
    /// A plugin serving the snapshots published on `devices`.
    pub fn new(
        cfg: PluginConfig,
        devices: watch::Receiver<NodeDevices>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Plugin {
            cfg,
            devices,
            metrics,
            pre_start: Arc::new(NoopPreStart),
            reclaim: Arc::new(Notify::new()),
            on_allocate: None,
            holders: None,
        }
    }

    /// Reads who holds which device from `holders` (the process's one owner of the pod-resources
    /// answer), and pokes it after each Allocate. Without it, a plugin with
    /// `pod_resources_socket` starts an owner of its own.
    pub fn with_holders(mut self, holders: Arc<Holders>) -> Self {
        self.holders = Some(holders);
        self
    }

    /// A handle that makes the running plugin register again.
    pub fn reclaimer(&self) -> Reclaimer {
        Reclaimer(self.reclaim.clone())
    }

    /// Calls `f` after each successful Allocate (it must not block).
    pub fn on_allocate(mut self, f: AllocateObserver) -> Self {
        self.on_allocate = Some(f);
        self
    }

    /// Replaces the PreStartContainer hook (used when pre-start mode is configured).
    pub fn with_pre_start(mut self, hook: Arc<dyn PreStartHook>) -> Self {
        self.pre_start = hook;
        self
    }

    /// Runs until `cancel` fires; then stops serving and removes the socket. Only a bad
    /// configuration returns an error; kubelet trouble is logged and retried.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), PluginError> {
        self.cfg.validate().map_err(PluginError::Config)?;
        let cfg = self.cfg.clone();
        let first = Arc::new(ServedSet::from_snapshot(
            &self.devices.borrow(),
            cfg.slots_per_device,
        ));
        let (served_tx, served_rx) = watch::channel(first);
        let feeder = tokio::spawn(feed_served(
            self.devices,
            served_tx,
            cfg.clone(),
            self.metrics.clone(),
            cancel.clone(),
        ));
        // Who holds which device: the owner handed over, else one of our own when a
        // pod-resources socket is configured. Allocate pokes it (the kubelet's record changed).
        let on_allocate = self.on_allocate;
        let holders = match (self.holders, &cfg.pod_resources_socket) {
            (Some(h), _) => Some(h),
            (None, Some(socket)) => Some(Holders::start(
                PodResourcesClient::new(socket),
                Held::resource(&cfg.resource_name),
                cancel.clone(),
            )),
            (None, None) => None,
        };
        let state = Arc::new(PluginState {
            cfg: cfg.clone(),
            served: served_rx,
            metrics: self.metrics.clone(),
            pre_start: self.pre_start,
            reclaim: self.reclaim,
            on_allocate,
            holders: holders.clone(),
        });
        let usage = holders.map(|h| {
            tokio::spawn(track_usage(
                h.subscribe(),
                self.metrics.clone(),
                cancel.clone(),
            ))
        });
        if let Some((mut watch, mut events)) = DirWatch::start(&cfg, &cancel).await {
            lifecycle(&state, &mut watch, &mut events, &cancel).await;
        }
        let _ = feeder.await;
        if let Some(u) = usage {
            let _ = u.await;
        }
        Ok(())
    }
}

/// Sets the slots-in-use gauge from every pod-resources answer the owner publishes (after each
/// Allocate, and at its safety refresh).
async fn track_usage(
    mut holders: watch::Receiver<Arc<erdma_kubelet::podresources::Snapshot>>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    loop {
        {
            let s = holders.borrow_and_update();
            match &s.error {
                None if s.is_answered() => {
                    metrics.set_slots_in_use(&crate::podresources::used_slots(&s.holders))
                }
                None => {}
                Some(e) => tracing::debug!("pod-resources unavailable for the slots metric: {e}"),
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = holders.changed() => if r.is_err() { return },
        }
    }
}

/// Rebuilds the served set whenever the inventory publishes a new snapshot.
async fn feed_served(
    mut devices: watch::Receiver<NodeDevices>,
    tx: watch::Sender<Arc<ServedSet>>,
    cfg: PluginConfig,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let mut memory = erdma_model::DeviceMemory::default();
    loop {
        let merged = memory.merge(&devices.borrow_and_update());
        let set = Arc::new(ServedSet::from_snapshot(&merged, cfg.slots_per_device));
        metrics.observe_devices(&set);
        if let Some(cdi) = &cfg.cdi
            && let Err(e) = crate::cdi::write_spec(cdi, &set)
        {
            tracing::error!("{e}");
        }
        let changed = tx.send_if_modified(|cur| {
            if cur.rdma_cm == set.rdma_cm
                && cur.devices == set.devices
                && cur.slots_per_device == set.slots_per_device
            {
                false
            } else {
                *cur = set;
                true
            }
        });
        // Counted after the served set is updated, so an observer of the counter knows this
        // snapshot's effect (or its absence) is already visible to ListAndWatch.
        metrics.inventory_snapshots.inc();
        tracing::trace!(changed, "inventory snapshot taken in");
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = devices.changed() => if r.is_err() {
                // The publisher is gone: keep serving the last snapshot until shutdown.
                cancel.cancelled().await;
                return;
            },
        }
    }
}

struct Server {
    stop: CancellationToken,
    task: JoinHandle<()>,
    socket_id: Option<(u64, u64)>,
    path: PathBuf,
}

impl Server {
    fn start(state: &Arc<PluginState>, parent: &CancellationToken) -> Result<Server, String> {
        let path = state.cfg.socket_path();
        let listener = uds::bind(&path).map_err(|e| e.to_string())?;
        let socket_id = file_id(&path);
        let stop = parent.child_token();
        let svc = api::device_plugin_server::DevicePluginServer::new(DevicePluginService::new(
            state.clone(),
            stop.clone(),
        ))
        .max_decoding_message_size(16 << 20);
        let s2 = stop.clone();
        let task = tokio::spawn(async move {
            let r = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(uds::incoming(listener), s2.cancelled())
                .await;
            if let Err(e) = r {
                tracing::error!("device-plugin server: {e}");
            }
        });
        tracing::info!(socket = %path.display(), "serving the device plugin");
        Ok(Server {
            stop,
            task,
            socket_id,
            path,
        })
    }

    /// True when our socket file is still the one we bound.
    fn socket_intact(&self) -> bool {
        self.socket_id.is_some() && file_id(&self.path) == self.socket_id
    }

    /// Stops serving; removes the socket when it is still ours.
    async fn stop(self) {
        self.stop.cancel();
        let intact = self.socket_intact();
        let mut task = self.task;
        if tokio::time::timeout(Duration::from_secs(2), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
        if intact && file_id(&self.path) == self.socket_id {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Why a Register attempt failed.
#[derive(Debug)]
enum RegisterError {
    /// `kubelet.sock` is missing or not a socket.
    NoSocket(String),
    /// `kubelet.sock` is there but the connection failed: nobody listens on it (yet, or any more).
    Connect(String),
    /// The kubelet was reached and refused the registration, or did not answer in time.
    Register(String),
}

impl std::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegisterError::NoSocket(e) | RegisterError::Connect(e) | RegisterError::Register(e) => {
                f.write_str(e)
            }
        }
    }
}

/// What prompted a registration attempt (the `trigger` label of the attempts metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    /// The first attempt after serving our socket.
    Served,
    /// `kubelet.sock` appeared (its event, or a rescan that found it).
    KubeletSocket,
    /// A short step after a new `kubelet.sock` refused the connection.
    KubeletSocketRetry,
    /// The back-off timer.
    Backoff,
}

impl Trigger {
    fn label(self) -> &'static str {
        match self {
            Trigger::Served => "served",
            Trigger::KubeletSocket => "kubelet_socket",
            Trigger::KubeletSocketRetry => "kubelet_socket_retry",
            Trigger::Backoff => "backoff",
        }
    }
}

/// The wait before the next attempt after a failed one.
///
/// The kubelet makes `kubelet.sock` with `bind()` and then `listen()`: the file appears, and the
/// directory watch reports it, a moment before the kubelet accepts on it, and nothing marks that
/// moment. An attempt the appearance prompted can be refused; waiting for the back-off then (grown
/// to seconds while the kubelet was away) would let the timer, not the kubelet, decide when the
/// plugin registers. So a `kubelet.sock` not seen refusing before is tried again every
/// [`SETTLE_STEP`] for [`SETTLE_WINDOW`], and the back-off starts over after that.
struct Retry {
    backoff: Backoff,
    /// The `kubelet.sock` (device, inode) last found refusing connections, and until when it is
    /// tried at short steps.
    refusing: Option<((u64, u64), tokio::time::Instant)>,
}

impl Retry {
    fn new() -> Self {
        Retry {
            backoff: Backoff::new(BACKOFF_START, BACKOFF_MAX),
            refusing: None,
        }
    }

    /// The delay after `err` and what the attempt after it will be, given the identity of
    /// `kubelet.sock` now.
    fn after(
        &mut self,
        err: &RegisterError,
        kubelet: Option<(u64, u64)>,
        now: tokio::time::Instant,
    ) -> (Duration, Trigger) {
        if let (RegisterError::Connect(_), Some(id)) = (err, kubelet) {
            if self.refusing.is_none_or(|(seen, _)| seen != id) {
                self.refusing = Some((id, now + SETTLE_WINDOW));
                self.backoff.reset();
            }
            if self.refusing.is_some_and(|(_, until)| now < until) {
                return (SETTLE_STEP, Trigger::KubeletSocketRetry);
            }
        }
        (self.backoff.next_delay(), Trigger::Backoff)
    }
}

async fn register(state: &PluginState) -> Result<(), RegisterError> {
    let cfg = &state.cfg;
    let kubelet = cfg.kubelet_socket();
    if !uds::is_socket(&kubelet) {
        return Err(RegisterError::NoSocket(if kubelet.exists() {
            format!(
                "{} is not a socket; is this the kubelet's device-plugin directory?",
                kubelet.display()
            )
        } else {
            format!(
                "{} does not exist (kubelet down or restarting)",
                kubelet.display()
            )
        }));
    }
    let ch = uds::connect(&kubelet, ClientAuthority::Localhost, Duration::from_secs(2))
        .await
        .map_err(|e| RegisterError::Connect(e.to_string()))?;
    let req = api::RegisterRequest {
        version: api::VERSION.to_string(),
        endpoint: cfg.socket_name(),
        resource_name: cfg.resource_name.clone(),
        options: Some(api::DevicePluginOptions {
            pre_start_required: cfg.pre_start_required,
            get_preferred_allocation_available: true,
        }),
    };
    tokio::time::timeout(REGISTER_TIMEOUT, RegistrationClient::new(ch).register(req))
        .await
        .map_err(|_| {
            RegisterError::Register(format!(
                "Register on {} timed out after {REGISTER_TIMEOUT:?}",
                kubelet.display()
            ))
        })?
        .map_err(|s| {
            RegisterError::Register(format!(
                "kubelet rejected Register of {}: {}",
                cfg.resource_name,
                s.message()
            ))
        })?;
    Ok(())
}

/// Our socket is no longer the one we bound. Removed (the kubelet's restart cleanup): count a
/// kubelet restart and let the caller re-serve at once. Replaced by another socket: another agent
/// instance (a rolling update) took over; stand down without touching its socket, and serve again
/// only when it is gone. Returns `false` when cancelled meanwhile.
async fn lost_socket(state: &PluginState, server: Server, cancel: &CancellationToken) -> bool {
    state.metrics.set_unregistered();
    let path = server.path.clone();
    if !uds::is_socket(&path) {
        tracing::warn!(
            "kubelet restart detected (plugin socket removed); re-serving and re-registering"
        );
        state.metrics.kubelet_restarts.inc();
        server.stop().await;
        return true;
    }
    tracing::error!(
        socket = %path.display(),
        "another process replaced our plugin socket (a second erdma-agent for {}?); standing down until it goes away",
        state.cfg.resource_name
    );
    server.stop().await;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return false,
            _ = tokio::time::sleep(POLL) => {}
        }
        if !uds::is_socket(&path) {
            tracing::info!(socket = %path.display(), "the other plugin's socket is gone; serving again");
            return true;
        }
    }
}

/// Whether the kubelet restarted since it accepted our registration: our socket is gone or
/// replaced, or the kubelet's socket is a new one (not the one `kubelet_id` names).
fn restarted_since(server: &Server, cfg: &PluginConfig, kubelet_id: Option<(u64, u64)>) -> bool {
    !server.socket_intact()
        || file_id(&cfg.kubelet_socket()).is_some_and(|id| Some(id) != kubelet_id)
}

/// Serve → register → watch, again and again, until cancelled.
async fn lifecycle(
    state: &Arc<PluginState>,
    watch: &mut DirWatch,
    events: &mut mpsc::UnboundedReceiver<DirEvent>,
    cancel: &CancellationToken,
) {
    let cfg = &state.cfg;
    let mut backoff = Backoff::new(BACKOFF_START, BACKOFF_MAX);
    'outer: loop {
        if cancel.is_cancelled() {
            return;
        }
        let server = match Server::start(state, cancel) {
            Ok(s) => s,
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::error!("cannot serve the device plugin: {e}; retrying in {delay:?}");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                continue;
            }
        };
        // Drop events caused before this server existed.
        while events.try_recv().is_ok() {}
        watch.rescan_taken();
        // Register, retrying while the kubelet is away.
        let mut retry = Retry::new();
        let mut trigger = Trigger::Served;
        let kubelet_id = loop {
            let kubelet_id = file_id(&cfg.kubelet_socket());
            state.metrics.observe_registration_attempt(trigger.label());
            let delay = match register(state).await {
                Ok(()) => {
                    state.metrics.observe_registration(true);
                    tracing::info!(resource = %cfg.resource_name, endpoint = %cfg.socket_name(), "registered with the kubelet");
                    // `kubelet.sock` did not exist when it was looked at, yet Register got
                    // through: it appeared in between, and that is the kubelet that accepted
                    // us. (A later replacement also removes our socket, which is watched.)
                    break kubelet_id.or_else(|| file_id(&cfg.kubelet_socket()));
                }
                Err(e) => {
                    state.metrics.observe_registration(false);
                    let (delay, next) = retry.after(
                        &e,
                        file_id(&cfg.kubelet_socket()),
                        tokio::time::Instant::now(),
                    );
                    if next == Trigger::KubeletSocketRetry {
                        tracing::debug!(
                            "registration failed: {e}; kubelet.sock is new and may not be listened on yet; retrying in {delay:?}"
                        );
                    } else {
                        tracing::warn!("registration failed: {e}; retrying in {delay:?}");
                    }
                    trigger = next;
                    delay
                }
            };
            let deadline = tokio::time::sleep(delay);
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => { server.stop().await; return; }
                    _ = &mut deadline => {
                        watch.rearm();
                        break;
                    }
                    ev = events.recv() => match ev {
                        Some(DirEvent::KubeletSocketCreated) => {
                            trigger = Trigger::KubeletSocket;
                            break;
                        }
                        Some(DirEvent::Rescan) => {
                            watch.rescan_taken();
                            if uds::is_socket(&cfg.kubelet_socket()) {
                                trigger = Trigger::KubeletSocket;
                                break;
                            }
                        }
                        Some(DirEvent::OwnSocketRemoved) if !server.socket_intact() => {
                            if !lost_socket(state, server, cancel).await {
                                return;
                            }
                            continue 'outer;
                        }
                        _ => {}
                    },
                }
            }
            if !server.socket_intact() {
                if !lost_socket(state, server, cancel).await {
                    return;
                }
                continue 'outer;
            }
        };
        backoff.reset();
        // Registered: wait for a kubelet restart.
        loop {
            let restarted = tokio::select! {
                _ = cancel.cancelled() => {
                    state.metrics.set_unregistered();
                    server.stop().await;
                    tracing::info!("device plugin stopped");
                    return;
                }
                ev = events.recv() => match ev {
                    Some(DirEvent::OwnSocketRemoved) => !server.socket_intact(),
                    Some(DirEvent::KubeletSocketCreated) => file_id(&cfg.kubelet_socket()) != kubelet_id,
                    Some(DirEvent::Rescan) => {
                        watch.rescan_taken();
                        restarted_since(&server, cfg, kubelet_id)
                    }
                    None => false,
                },
                _ = tokio::time::sleep(watch.poll_period()) => {
                    watch.rearm();
                    restarted_since(&server, cfg, kubelet_id)
                }
                _ = state.reclaim.notified() => {
                    tracing::warn!(resource = %cfg.resource_name, "the other device plugin that took the resource over has gone; re-serving and re-registering so the kubelet uses this plugin again");
                    state.metrics.set_unregistered();
                    server.stop().await;
                    continue 'outer;
                }
            };
            if restarted {
                state.metrics.set_unregistered();
                if !server.socket_intact() {
                    if !lost_socket(state, server, cancel).await {
                        return;
                    }
                    continue 'outer;
                }
                tracing::warn!(
                    "kubelet restart detected (kubelet.sock re-created); re-serving and re-registering"
                );
                state.metrics.kubelet_restarts.inc();
                server.stop().await;
                continue 'outer;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    fn refused() -> RegisterError {
        RegisterError::Connect("connection refused".into())
    }

    /// The delays `retry` gives for failures `every` apart, all with `err` on socket `id`, until
    /// `span` has passed.
    fn delays(
        retry: &mut Retry,
        err: &RegisterError,
        id: Option<(u64, u64)>,
        start: Instant,
        span: Duration,
    ) -> Vec<(Duration, Trigger)> {
        let mut now = start;
        let mut out = Vec::new();
        while now < start + span {
            let (d, t) = retry.after(err, id, now);
            out.push((d, t));
            now += d;
        }
        out
    }

    #[test]
    fn a_new_kubelet_socket_that_refuses_is_tried_at_short_steps_then_the_backoff_starts_over() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut retry = Retry::new();
        // kubelet.sock absent for a while: the back-off grows.
        let absent = RegisterError::NoSocket("absent".into());
        let grown = delays(&mut retry, &absent, None, t0, ms(3000));
        assert!(grown.iter().all(|&(_, t)| t == Trigger::Backoff));
        assert_eq!(retry.backoff.peek(), ms(3200));
        // It appears and refuses (bound, not listened on yet): short steps for the window, not
        // the 3.2 s the back-off had reached.
        let at = t0 + ms(3000);
        let new = Some((1, 10));
        let steps = delays(&mut retry, &refused(), new, at, SETTLE_WINDOW);
        assert_eq!(steps.len() as u32, SETTLE_WINDOW.as_millis() as u32 / 20);
        assert!(
            steps
                .iter()
                .all(|&s| s == (SETTLE_STEP, Trigger::KubeletSocketRetry))
        );
        // Still refusing after the window: a stale socket; the back-off from its start.
        let later = at + SETTLE_WINDOW;
        assert_eq!(
            retry.after(&refused(), new, later),
            (ms(50), Trigger::Backoff)
        );
        assert_eq!(
            retry.after(&refused(), new, later + ms(50)),
            (ms(100), Trigger::Backoff)
        );
        // Another kubelet.sock: a window of its own.
        let other = Some((1, 11));
        assert_eq!(
            retry.after(&refused(), other, later + ms(150)),
            (SETTLE_STEP, Trigger::KubeletSocketRetry)
        );
    }

    #[test]
    fn only_a_refused_connection_to_an_existing_socket_is_retried_at_short_steps() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut retry = Retry::new();
        let id = Some((1, 10));
        let rejected = RegisterError::Register("kubelet rejected Register".into());
        assert_eq!(retry.after(&rejected, id, t0), (ms(50), Trigger::Backoff));
        assert_eq!(retry.after(&rejected, id, t0), (ms(100), Trigger::Backoff));
        let missing = RegisterError::NoSocket("absent".into());
        assert_eq!(retry.after(&missing, None, t0), (ms(200), Trigger::Backoff));
        // Refused, but the socket has gone again by the time it is looked at: no window.
        assert_eq!(
            retry.after(&refused(), None, t0),
            (ms(400), Trigger::Backoff)
        );
    }
}
