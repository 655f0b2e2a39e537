//! The long-running fake kubelet: Registration server, plugin dial-back, ListAndWatch consumer,
//! restarts, pod-resources server.

use crate::error::{FakeKubeletError, Result};
use crate::state::{self, DeviceState, OptionsState, ResourceState, StateFile};
use erdma_kubelet::deviceplugin::v1beta1 as api;
use erdma_kubelet::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use erdma_kubelet::deviceplugin::v1beta1::registration_server::{Registration, RegistrationServer};
use erdma_kubelet::uds::{self, ClientAuthority};
use std::collections::HashMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// Kubelet's dial timeout for a registering plugin.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Configuration of a fake kubelet.
#[derive(Debug, Clone)]
pub struct FakeKubeletConfig {
    /// Device-plugin directory (holds `kubelet.sock` and the plugin sockets).
    pub dir: PathBuf,
    /// Where to serve the pod-resources API, if at all.
    pub pod_resources_socket: Option<PathBuf>,
    /// `:authority` used when dialing plugins back.
    pub dial_authority: ClientAuthority,
}

impl FakeKubeletConfig {
    /// Defaults for `dir`: no pod-resources socket, `:authority` `localhost`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FakeKubeletConfig {
            dir: dir.into(),
            pod_resources_socket: None,
            dial_authority: ClientAuthority::Localhost,
        }
    }
}

struct Memory {
    state: StateFile,
    /// Open ListAndWatch streams per resource, oldest first: like the kubelet, every registered
    /// plugin's stream stays open and feeds the resource, whoever registered last.
    conns: HashMap<String, Vec<Conn>>,
    next_conn: u64,
}

struct Conn {
    id: u64,
    endpoint: String,
    cancel: CancellationToken,
}

impl Memory {
    /// Records which endpoints of `resource` have an open stream, oldest first.
    fn sync_streams(&mut self, resource: &str) {
        let streams: Vec<String> = self
            .conns
            .get(resource)
            .map(|v| v.iter().map(|c| c.endpoint.clone()).collect())
            .unwrap_or_default();
        if let Some(r) = self.state.resources.get_mut(resource) {
            r.connected = streams.contains(&r.endpoint);
            r.streams = streams;
        }
    }
}

pub(crate) struct Shared {
    cfg: FakeKubeletConfig,
    mem: Mutex<Memory>,
    version: watch::Sender<u64>,
    reject: Mutex<Option<String>>,
}

impl Shared {
    fn mem(&self) -> std::sync::MutexGuard<'_, Memory> {
        // A panic while holding the lock cannot leave the plain data inconsistent in a way that
        // matters for a test fake; keep going.
        self.mem.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn changed(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.cfg.dir
    }

    pub(crate) fn resources(&self) -> std::collections::BTreeMap<String, ResourceState> {
        self.mem().state.resources.clone()
    }

    /// Notified at every change of the state.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}

impl crate::podresources::Source for Shared {
    fn dir(&self) -> &Path {
        Shared::dir(self)
    }

    fn resources(&self) -> std::collections::BTreeMap<String, ResourceState> {
        Shared::resources(self)
    }
}

/// A running fake kubelet.
pub struct FakeKubelet {
    shared: Arc<Shared>,
    server: Mutex<Option<(CancellationToken, JoinHandle<()>)>>,
    background: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl FakeKubelet {
    /// Creates the directory if needed, serves `kubelet.sock` (and the pod-resources socket when
    /// configured) and starts writing the state file.
    pub async fn start(cfg: FakeKubeletConfig) -> Result<FakeKubelet> {
        std::fs::create_dir_all(&cfg.dir).map_err(|source| FakeKubeletError::Io {
            what: "create",
            path: cfg.dir.clone(),
            source,
        })?;
        let (version, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            cfg,
            mem: Mutex::new(Memory {
                state: StateFile::default(),
                conns: HashMap::new(),
                next_conn: 0,
            }),
            version,
            reject: Mutex::new(None),
        });
        let background = CancellationToken::new();
        let mut tasks = vec![tokio::spawn(state_writer(
            shared.clone(),
            background.clone(),
        ))];
        if let Some(path) = shared.cfg.pod_resources_socket.clone() {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|source| FakeKubeletError::Io {
                    what: "create",
                    path: parent.into(),
                    source,
                })?;
            }
            let listener = uds::bind(&path)?;
            let svc = crate::podresources::server(shared.clone());
            let cancel = background.clone();
            tasks.push(tokio::spawn(async move {
                let r = tonic::transport::Server::builder()
                    .add_service(svc)
                    .serve_with_incoming_shutdown(uds::incoming(listener), cancel.cancelled())
                    .await;
                if let Err(e) = r {
                    tracing::error!("pod-resources server: {e}");
                }
            }));
        }
        let kubelet = FakeKubelet {
            shared,
            server: Mutex::new(None),
            background,
            tasks,
        };
        kubelet.serve_registration()?;
        kubelet.shared.changed();
        Ok(kubelet)
    }

    fn serve_registration(&self) -> Result<()> {
        let path = self.shared.cfg.dir.join(api::KUBELET_SOCKET_NAME);
        let listener = uds::bind(&path)?;
        self.serve_registration_on(listener);
        Ok(())
    }

    fn serve_registration_on(&self, listener: tokio::net::UnixListener) {
        let cancel = self.background.child_token();
        let svc = RegistrationServer::new(RegistrationService {
            shared: self.shared.clone(),
        });
        let c2 = cancel.clone();
        let task = tokio::spawn(async move {
            let r = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(uds::incoming(listener), c2.cancelled())
                .await;
            if let Err(e) = r {
                tracing::error!("registration server: {e}");
            }
        });
        *self.server.lock().unwrap_or_else(|p| p.into_inner()) = Some((cancel, task));
    }

    /// Writes the device-plugin resources into the Node's status from now on, as the kubelet's
    /// node status does ([`crate::node_status`]); stops with [`FakeKubelet::shutdown`].
    pub fn report_node_status(&mut self, cfg: crate::node_status::NodeStatusConfig) {
        let shared = self.shared.clone();
        let changes = shared.subscribe();
        self.tasks.push(tokio::spawn(crate::node_status::run(
            cfg,
            move || shared.resources(),
            changes,
            self.background.clone(),
        )));
    }

    /// Makes every following Register fail with `reason` (None: accept again), to test how a
    /// plugin copes with a kubelet that refuses it.
    pub fn set_reject_register(&self, reason: Option<String>) {
        *self.shared.reject.lock().unwrap_or_else(|p| p.into_inner()) = reason;
    }

    /// The device-plugin directory.
    pub fn dir(&self) -> &Path {
        &self.shared.cfg.dir
    }

    /// Path of `kubelet.sock`.
    pub fn socket(&self) -> PathBuf {
        self.shared.cfg.dir.join(api::KUBELET_SOCKET_NAME)
    }

    /// A snapshot of the in-memory state (allocations are read from the ledger).
    pub fn state(&self) -> StateFile {
        let mut s = self.shared.mem().state.clone();
        s.allocations = state::read_ledger(self.dir()).unwrap_or_default();
        s
    }

    /// Waits until `pred` holds for the in-memory state, or fails after `timeout`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&StateFile) -> bool,
    ) -> Result<StateFile> {
        let mut rx = self.shared.version.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let s = self.state();
            if pred(&s) {
                return Ok(s);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => {
                    let s = self.state();
                    if pred(&s) {
                        return Ok(s);
                    }
                    return Err(FakeKubeletError::Refused(format!(
                        "condition not met within {timeout:?}; state: {}",
                        summary(&s)
                    )));
                }
            }
        }
    }

    /// Simulates a kubelet restart: stops serving, forgets every plugin, deletes every socket in
    /// the directory (as the kubelet's `CleanupPluginDirectory` does), then re-creates
    /// `kubelet.sock`. The allocation ledger (the checkpoint) survives.
    pub async fn restart(&self) -> Result<()> {
        self.stop_and_forget().await;
        remove_sockets(self.dir(), self.shared.cfg.pod_resources_socket.as_deref())?;
        self.serve_registration()?;
        self.shared.changed();
        Ok(())
    }

    /// The first half of a restart, for tests of other restart orders: stops serving, forgets
    /// every plugin, counts the restart and removes `kubelet.sock` only (plugin sockets are left
    /// to the caller). [`FakeKubelet::come_back`] is the second half.
    pub async fn go_down(&self) {
        self.stop_and_forget().await;
        let _ = std::fs::remove_file(self.socket());
        self.shared.changed();
    }

    /// Stops serving `kubelet.sock`, forgets every plugin and counts a restart.
    async fn stop_and_forget(&self) {
        let old = self.server.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((cancel, task)) = old {
            cancel.cancel();
            let _ = task.await;
        }
        {
            let mut mem = self.shared.mem();
            for (_, conns) in mem.conns.drain() {
                for c in conns {
                    c.cancel.cancel();
                }
            }
            mem.state.resources.clear();
            mem.state.kubelet_restarts += 1;
        }
    }

    /// Serves `kubelet.sock` again after [`FakeKubelet::go_down`]; it listens when this returns.
    pub fn come_back(&self) -> Result<()> {
        self.serve_registration()?;
        self.shared.changed();
        Ok(())
    }

    /// Like [`FakeKubelet::come_back`], on a listener the caller made at `kubelet.sock`: as the
    /// kubelet's `net.Listen` does, the caller can bind first (the file appears) and listen later.
    pub fn come_back_on(&self, listener: tokio::net::UnixListener) {
        self.serve_registration_on(listener);
        self.shared.changed();
    }

    /// Stops serving and removes `kubelet.sock` (plugin sockets are left alone).
    pub async fn shutdown(mut self) {
        let old = self.server.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((cancel, task)) = old {
            cancel.cancel();
            let _ = task.await;
        }
        // Write the final state before stopping the writer.
        write_now(&self.shared).await;
        self.background.cancel();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        let _ = std::fs::remove_file(self.socket());
        if let Some(p) = &self.shared.cfg.pod_resources_socket {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A one-line summary of a state (device lists can be thousands of entries long).
fn summary(s: &StateFile) -> String {
    let resources: Vec<String> = s
        .resources
        .iter()
        .map(|(name, r)| {
            format!(
                "{name}: endpoint {}, connected {}, streams {:?}, {} devices ({} healthy), {} updates",
                r.endpoint,
                r.connected,
                r.streams,
                r.devices.len(),
                r.healthy_ids().count(),
                r.updates
            )
        })
        .collect();
    format!(
        "registrations {}, kubelet restarts {}, allocations {}, resources [{}]",
        s.registrations,
        s.kubelet_restarts,
        s.allocations.len(),
        resources.join("; ")
    )
}

/// Removes every socket in `dir` (and `extra`, when given).
fn remove_sockets(dir: &Path, extra: Option<&Path>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|source| FakeKubeletError::Io {
        what: "list",
        path: dir.into(),
        source,
    })?;
    for e in entries.flatten() {
        let is_sock = e.file_type().map(|t| t.is_socket()).unwrap_or(false);
        if is_sock && Some(e.path().as_path()) != extra {
            let _ = std::fs::remove_file(e.path());
        }
    }
    Ok(())
}

async fn write_now(shared: &Arc<Shared>) {
    let snapshot = shared.mem().state.clone();
    let dir = shared.cfg.dir.clone();
    let write = move || -> Result<()> {
        let _lock = state::lock(&dir)?;
        let mut s = snapshot;
        s.allocations = state::read_ledger(&dir)?;
        state::write_state(&dir, &s)
    };
    // The lab times health changes up to this file: on a multi-threaded runtime (the daemon's)
    // the write runs on this thread, which hands its other tasks over, instead of waiting for a
    // blocking-pool thread to be scheduled.
    let r = match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread => Ok(tokio::task::block_in_place(write)),
        _ => tokio::task::spawn_blocking(write).await,
    };
    match r {
        Ok(Ok(())) => tracing::debug!("state file written"),
        Ok(Err(e)) => tracing::warn!("writing the state file: {e}"),
        Err(e) => tracing::warn!("writing the state file: {e}"),
    }
}

async fn state_writer(shared: Arc<Shared>, cancel: CancellationToken) {
    let mut rx = shared.version.subscribe();
    loop {
        write_now(&shared).await;
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = rx.changed() => if r.is_err() { return },
        }
    }
}

struct RegistrationService {
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(
        &self,
        request: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let r = request.into_inner();
        tracing::info!(resource = %r.resource_name, endpoint = %r.endpoint, version = %r.version, "Register");
        if let Some(reason) = self
            .shared
            .reject
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Err(Status::failed_precondition(reason));
        }
        if !api::SUPPORTED_VERSIONS.contains(&r.version.as_str()) {
            return Err(Status::invalid_argument(format!(
                "requested device plugin version {:?} is not supported; supported versions: {:?}",
                r.version,
                api::SUPPORTED_VERSIONS
            )));
        }
        if !erdma_kubelet::is_extended_resource_name(&r.resource_name) {
            return Err(Status::invalid_argument(format!(
                "invalid name of device plugin socket: {:?} is not an extended resource name",
                r.resource_name
            )));
        }
        if r.endpoint.is_empty() || r.endpoint.contains('/') {
            return Err(Status::invalid_argument(format!(
                "endpoint {:?} must be a socket file name in the device-plugin directory",
                r.endpoint
            )));
        }
        // A second plugin for the same resource is accepted, as the kubelet does: it becomes the
        // endpoint Allocate goes to, and the first plugin's stream stays open.
        let path = self.shared.cfg.dir.join(&r.endpoint);
        let channel = uds::connect(&path, self.shared.cfg.dial_authority.clone(), DIAL_TIMEOUT)
            .await
            .map_err(|e| Status::unavailable(format!("failed to dial device plugin: {e}")))?;
        let mut client = DevicePluginClient::new(channel);
        client
            .get_device_plugin_options(api::Empty {})
            .await
            .map_err(|e| {
                Status::unavailable(format!("GetDevicePluginOptions on {}: {e}", r.endpoint))
            })?;
        let stream = client
            .list_and_watch(api::Empty {})
            .await
            .map_err(|e| Status::unavailable(format!("ListAndWatch on {}: {e}", r.endpoint)))?
            .into_inner();
        let options = r.options.unwrap_or_default();
        let cancel = CancellationToken::new();
        let conn_id;
        {
            let mut mem = self.shared.mem();
            mem.next_conn += 1;
            let id = mem.next_conn;
            let conns = mem.conns.entry(r.resource_name.clone()).or_default();
            // The same endpoint registering again is that plugin restarted: its old stream is over.
            conns.retain(|c| {
                let same = c.endpoint == r.endpoint;
                if same {
                    c.cancel.cancel();
                }
                !same
            });
            let others = !conns.is_empty();
            conns.push(Conn {
                id,
                endpoint: r.endpoint.clone(),
                cancel: cancel.clone(),
            });
            conn_id = id;
            // Another plugin's device list stays until this one sends its own, as in the kubelet.
            let devices = match mem.state.resources.get(&r.resource_name) {
                Some(old) if others => old.devices.clone(),
                _ => Vec::new(),
            };
            mem.state.resources.insert(
                r.resource_name.clone(),
                ResourceState {
                    endpoint: r.endpoint.clone(),
                    options: OptionsState {
                        pre_start_required: options.pre_start_required,
                        get_preferred_allocation_available: options
                            .get_preferred_allocation_available,
                    },
                    devices,
                    connected: true,
                    streams: Vec::new(),
                    updates: 0,
                    received_monotonic_us: 0,
                },
            );
            mem.sync_streams(&r.resource_name);
            mem.state.registrations += 1;
        }
        self.shared.changed();
        tokio::spawn(consume(
            self.shared.clone(),
            r.resource_name,
            stream,
            conn_id,
            cancel,
        ));
        Ok(Response::new(api::Empty {}))
    }
}

async fn consume(
    shared: Arc<Shared>,
    resource: String,
    mut stream: tonic::Streaming<api::ListAndWatchResponse>,
    conn_id: u64,
    cancel: CancellationToken,
) {
    loop {
        let msg = tokio::select! {
            _ = cancel.cancelled() => return,
            m = stream.next() => m,
        };
        let received = state::monotonic_us();
        let mut mem = shared.mem();
        // Every open stream of the resource updates it (the kubelet keys device lists by resource
        // name, not by plugin); a stream replaced by its own plugin's re-registration is over.
        if mem
            .conns
            .get(&resource)
            .is_none_or(|v| !v.iter().any(|c| c.id == conn_id))
        {
            return;
        }
        let Some(entry) = mem.state.resources.get_mut(&resource) else {
            return;
        };
        match msg {
            Some(Ok(update)) => {
                entry.devices = update
                    .devices
                    .into_iter()
                    .map(|d| DeviceState {
                        id: d.id,
                        health: d.health,
                        numa: d
                            .topology
                            .map(|t| t.nodes.into_iter().map(|n| n.id).collect())
                            .unwrap_or_default(),
                    })
                    .collect();
                entry.updates += 1;
                entry.received_monotonic_us = received;
                drop(mem);
                tracing::debug!(%resource, "ListAndWatch update received");
                shared.changed();
            }
            end => {
                if let Some(Err(e)) = end {
                    tracing::warn!(%resource, "ListAndWatch ended with an error: {e}");
                } else {
                    tracing::warn!(%resource, "ListAndWatch ended unexpectedly");
                }
                // Like the kubelet: every device of the resource becomes unhealthy at once, even
                // when another plugin's stream for it is still open.
                for d in &mut entry.devices {
                    d.health = api::UNHEALTHY.to_string();
                }
                if let Some(v) = mem.conns.get_mut(&resource) {
                    v.retain(|c| c.id != conn_id);
                    if v.is_empty() {
                        mem.conns.remove(&resource);
                    }
                }
                mem.sync_streams(&resource);
                drop(mem);
                shared.changed();
                return;
            }
        }
    }
}

impl FakeKubelet {
    /// Allocation against this (in-process) fake kubelet's current view of the plugins.
    pub async fn allocate(
        &self,
        opts: &crate::client::AllocateOptions,
    ) -> Result<crate::client::AllocationOutput> {
        let _lock = crate::client::take_lock(self.dir()).await?;
        let resources = self.shared.resources();
        crate::client::allocate_locked(self.dir(), &resources, opts, &[], false, true).await
    }
}
