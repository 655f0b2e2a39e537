//! The kubelet's side of DRA (test support): finds a driver's registration socket in a
//! `plugins_registry` directory as the plugin watcher does, asks `GetInfo`, validates it like the
//! kubelet (type `DRAPlugin`, a plugin API the kubelet speaks, an absolute endpoint that is a
//! socket), reports the verdict with `NotifyRegistrationStatus`, and then calls
//! `NodePrepareResources` / `NodeUnprepareResources` on the driver's service socket.
//!
//! The kubelet release it plays is a [`KubeletVersion`] (default: the newest). What differs
//! between releases, as read in kubernetes `pkg/kubelet/cm/dra/plugin/`:
//!
//! - the plugin API (every release modelled): the first entry of the plugin's
//!   `supported_versions` that the kubelet speaks (`v1.DRAPlugin`, `v1beta1.DRAPlugin`), in the
//!   plugin's order (`validateSupportedServices`); none is a refused registration;
//! - the resource-health stream (KEP-4680, feature gate `ResourceHealthStatus`: alpha and off by
//!   default in 1.34 and 1.35, beta and on from 1.36): 1.34 to 1.36 open
//!   `v1alpha1.DRAResourceHealth` on every registered plugin whether it lists it or not
//!   (`DRAPluginManager.add`); 1.37 picks the service from `supported_versions` in its own
//!   preference order (`v1.DRAResourceHealth`, then `v1alpha1.DRAResourceHealth`;
//!   `pickHealthService`) and opens none for a plugin that lists none;
//! - a second plugin registering for the same driver name ([`DraKubelet`]): every release keeps
//!   each plugin, by endpoint, in registration order, refuses a second registration of an
//!   endpoint already registered for the driver, and calls the most recently registered one
//!   (`DRAPluginManager.add` / `get`); 1.34 to 1.36 keep one health stream per plugin, 1.37 one
//!   per driver, on the most recently registered plugin (a newer plugin that lists no health
//!   service ends the stream; there is no fall-back to an older plugin).
//!
//! Scheduling is not modelled: the allocation the scheduler would write into a ResourceClaim's
//! status is written by the test.

use crate::error::{FakeKubeletError, Result};
use erdma_kubelet::dra::v1 as dra;
use erdma_kubelet::dra::v1::dra_plugin_client::DraPluginClient;
use erdma_kubelet::dra_health::{v1 as health_v1, v1alpha1 as health_v1alpha1};
use erdma_kubelet::pluginregistration::v1 as reg;
use erdma_kubelet::pluginregistration::v1::registration_client::RegistrationClient;
use erdma_kubelet::uds::{self, ClientAuthority};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// `v1.DRAPlugin`, the plugin API the fake kubelet calls.
pub const PLUGIN_V1: &str = dra::DRA_PLUGIN_SERVICE;
/// `v1beta1.DRAPlugin`: accepted at registration as the kubelet accepts it; its calls are not
/// modelled (the fake has no v1beta1 client).
pub const PLUGIN_V1BETA1: &str = "v1beta1.DRAPlugin";
/// The plugin APIs the kubelet speaks, newest first (`servicesSupportedByKubelet`, 1.34+).
pub const SUPPORTED_SERVICES: &[&str] = &[PLUGIN_V1, PLUGIN_V1BETA1];
/// The v1 resource-health service (kubelet 1.37+), as a plugin lists it.
pub const HEALTH_V1: &str = "v1.DRAResourceHealth";
/// The v1alpha1 resource-health service (every kubelet since 1.34), as a plugin lists it.
pub const HEALTH_V1ALPHA1: &str = "v1alpha1.DRAResourceHealth";

/// The kubelet release the fake plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum KubeletVersion {
    /// 1.34.
    V1_34,
    /// 1.35.
    V1_35,
    /// 1.36.
    V1_36,
    /// 1.37 (master).
    #[default]
    V1_37,
}

impl KubeletVersion {
    /// Every release modelled, oldest first.
    pub const ALL: [KubeletVersion; 4] = [
        KubeletVersion::V1_34,
        KubeletVersion::V1_35,
        KubeletVersion::V1_36,
        KubeletVersion::V1_37,
    ];
    /// The newest release modelled (the default).
    pub const NEWEST: KubeletVersion = KubeletVersion::V1_37;

    /// `1.34` … `1.37`.
    pub fn name(self) -> &'static str {
        match self {
            KubeletVersion::V1_34 => "1.34",
            KubeletVersion::V1_35 => "1.35",
            KubeletVersion::V1_36 => "1.36",
            KubeletVersion::V1_37 => "1.37",
        }
    }

    /// The default of the `ResourceHealthStatus` feature gate: alpha (off) in 1.34 and 1.35,
    /// beta (on) from 1.36.
    pub fn resource_health_status_default(self) -> bool {
        self >= KubeletVersion::V1_36
    }

    /// True when the health service is picked from the plugin's `supported_versions` (1.37+);
    /// older kubelets open `v1alpha1` on every plugin.
    pub fn health_from_registration(self) -> bool {
        self >= KubeletVersion::V1_37
    }

    /// The health services this kubelet calls, preferred first.
    pub fn health_services(self) -> &'static [&'static str] {
        if self.health_from_registration() {
            &[HEALTH_V1, HEALTH_V1ALPHA1]
        } else {
            &[HEALTH_V1ALPHA1]
        }
    }

    /// True when one health stream per driver follows its latest plugin (1.37+); older
    /// kubelets keep one stream per registered plugin.
    pub fn one_health_stream_per_driver(self) -> bool {
        self >= KubeletVersion::V1_37
    }
}

impl std::fmt::Display for KubeletVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KubeletVersion {
    type Err = String;

    /// `1.34`, `v1.35`, `1.36.2`, … (the minor release decides).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let t = s.trim();
        let t = t.strip_prefix('v').unwrap_or(t);
        let mut parts = t.split('.');
        let minor = match (parts.next(), parts.next()) {
            (Some("1"), Some(m)) => m,
            _ => "",
        };
        Self::ALL
            .into_iter()
            .find(|v| v.name().strip_prefix("1.") == Some(minor))
            .ok_or_else(|| {
                format!(
                    "kubelet version {s:?} is not one of {}",
                    Self::ALL.map(|v| v.name()).join(", ")
                )
            })
    }
}

/// The plugin API the kubelet picks from `supported_versions`: the first entry it speaks, in the
/// plugin's order; the error is the kubelet's.
pub fn plugin_service(supported: &[String]) -> std::result::Result<&'static str, String> {
    if supported.is_empty() {
        return Err("empty list of supported gRPC services (aka supported versions)".into());
    }
    supported
        .iter()
        .find_map(|s| SUPPORTED_SERVICES.iter().find(|k| **k == s.as_str()).copied())
        .ok_or_else(|| {
            format!(
                "none of services supported by the plugin ({supported:?}) are supported by the kubelet ({SUPPORTED_SERVICES:?})"
            )
        })
}

/// The health service `version` opens for a plugin listing `supported`, with the
/// `ResourceHealthStatus` gate `gate`: none with the gate off; `v1alpha1` always before 1.37;
/// from 1.37 the first of [`KubeletVersion::health_services`] that the plugin lists, or none.
pub fn health_service(
    version: KubeletVersion,
    gate: bool,
    supported: &[String],
) -> Option<&'static str> {
    if !gate {
        return None;
    }
    if !version.health_from_registration() {
        return Some(HEALTH_V1ALPHA1);
    }
    version
        .health_services()
        .iter()
        .find(|h| supported.iter().any(|s| s == *h))
        .copied()
}

/// A registered DRA driver.
#[derive(Debug, Clone)]
pub struct DraDriverClient {
    /// What `GetInfo` returned.
    pub info: reg::PluginInfo,
    /// The registration socket it was found at.
    pub registration_socket: PathBuf,
    /// The kubelet release that registered it.
    pub kubelet_version: KubeletVersion,
    /// The plugin API picked from `supported_versions`.
    pub plugin_service: &'static str,
    /// The health service this kubelet opens on the plugin (with its `ResourceHealthStatus`
    /// gate), if any.
    pub health_service: Option<&'static str>,
    channel: Channel,
}

fn rpc(call: &'static str, endpoint: &Path) -> impl FnOnce(tonic::Status) -> FakeKubeletError {
    let endpoint = endpoint.display().to_string();
    move |status| FakeKubeletError::Rpc {
        call,
        endpoint,
        status: Box::new(status),
    }
}

/// Validates `GetInfo` as the kubelet's DRA registration handler does and returns the plugin API
/// it picks; the error is what the kubelet would send in `NotifyRegistrationStatus`.
pub fn validate_info(info: &reg::PluginInfo) -> std::result::Result<&'static str, String> {
    if info.r#type != reg::DRA_PLUGIN {
        return Err(format!(
            "plugin type {:?} is not {}",
            info.r#type,
            reg::DRA_PLUGIN
        ));
    }
    if info.name.is_empty() {
        return Err("plugin name is empty".into());
    }
    let chosen = plugin_service(&info.supported_versions).map_err(|e| {
        format!(
            "invalid supported gRPC versions of DRA driver plugin {} at endpoint {}: {e}",
            info.name, info.endpoint
        )
    })?;
    let ep = Path::new(&info.endpoint);
    if !ep.is_absolute() || !uds::is_socket(ep) {
        return Err(format!(
            "endpoint {:?} is not an absolute path of a socket",
            info.endpoint
        ));
    }
    Ok(chosen)
}

/// The registration sockets in a `plugins_registry` directory (hidden files are ignored, as the
/// plugin watcher ignores them), sorted.
pub fn registration_sockets(registry: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(registry).map_err(|source| FakeKubeletError::Io {
        what: "read plugins_registry",
        path: registry.to_path_buf(),
        source,
    })?;
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
                && uds::is_socket(p)
        })
        .collect();
    out.sort();
    Ok(out)
}

/// `GetInfo` on a registration socket.
async fn get_info(sock: &Path) -> Result<(RegistrationClient<Channel>, reg::PluginInfo)> {
    let ch = uds::connect(sock, ClientAuthority::Localhost, DIAL_TIMEOUT).await?;
    let mut rc = RegistrationClient::new(ch);
    let info = rc
        .get_info(reg::InfoRequest {})
        .await
        .map_err(rpc("GetInfo", sock))?
        .into_inner();
    Ok((rc, info))
}

/// Tells the plugin the verdict; a refusal becomes the error returned.
async fn notify(
    rc: &mut RegistrationClient<Channel>,
    sock: &Path,
    name: &str,
    verdict: std::result::Result<(), String>,
) -> Result<()> {
    rc.notify_registration_status(reg::RegistrationStatus {
        plugin_registered: verdict.is_ok(),
        error: verdict.clone().err().unwrap_or_default(),
    })
    .await
    .map_err(rpc("NotifyRegistrationStatus", sock))?;
    verdict.map_err(|e| {
        FakeKubeletError::Refused(format!("DRA driver {name} at {}: {e}", sock.display()))
    })
}

async fn connect_service(
    sock: &Path,
    info: reg::PluginInfo,
    version: KubeletVersion,
    plugin_service: &'static str,
    gate: bool,
) -> Result<DraDriverClient> {
    let endpoint = PathBuf::from(&info.endpoint);
    let channel = uds::connect(&endpoint, ClientAuthority::Localhost, DIAL_TIMEOUT).await?;
    let health_service = health_service(version, gate, &info.supported_versions);
    tracing::info!(
        driver = %info.name,
        kubelet = %version,
        plugin_service,
        health_service = health_service.unwrap_or("none"),
        "registered DRA driver"
    );
    Ok(DraDriverClient {
        info,
        registration_socket: sock.to_path_buf(),
        kubelet_version: version,
        plugin_service,
        health_service,
        channel,
    })
}

/// Registers the DRA driver `name` found in `registry` as the newest kubelet does: GetInfo,
/// validation, Notify (with the verdict), and a connection to its service socket. A refused
/// registration is an error after the driver was told why.
pub async fn register(registry: &Path, name: &str) -> Result<DraDriverClient> {
    register_as(registry, name, KubeletVersion::NEWEST).await
}

/// [`register`] as kubelet `version` (with its default `ResourceHealthStatus` gate); one-shot:
/// no health stream is opened (see [`DraKubelet`]).
pub async fn register_as(
    registry: &Path,
    name: &str,
    version: KubeletVersion,
) -> Result<DraDriverClient> {
    for sock in registration_sockets(registry)? {
        let (mut rc, info) = get_info(&sock).await?;
        if info.name != name {
            continue;
        }
        let verdict = validate_info(&info);
        notify(&mut rc, &sock, name, verdict.map(drop)).await?;
        let chosen = validate_info(&info).map_err(FakeKubeletError::Refused)?;
        return connect_service(
            &sock,
            info,
            version,
            chosen,
            version.resource_health_status_default(),
        )
        .await;
    }
    Err(FakeKubeletError::Refused(format!(
        "no registration socket of DRA driver {name} in {}",
        registry.display()
    )))
}

/// A claim's identity as the kubelet sends it.
pub fn claim(namespace: &str, name: &str, uid: &str) -> dra::Claim {
    dra::Claim {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

/// A device's health as a health stream reported it (either API version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    /// Pool.
    pub pool: String,
    /// Device.
    pub device: String,
    /// `Healthy`, `Unhealthy` or `Unknown`.
    pub health: &'static str,
    /// The plugin's message.
    pub message: String,
    /// `health_check_timeout_seconds`.
    pub timeout_seconds: i64,
    /// `last_updated_time` (Unix seconds).
    pub last_updated: i64,
}

/// An open `NodeWatchResources` stream of one API version.
pub struct HealthStream {
    /// The service it was opened on (`v1.DRAResourceHealth` or `v1alpha1.DRAResourceHealth`).
    pub service: &'static str,
    inner: HealthInner,
}

enum HealthInner {
    V1(tonic::Streaming<health_v1::NodeWatchResourcesResponse>),
    V1alpha1(tonic::Streaming<health_v1alpha1::NodeWatchResourcesResponse>),
}

impl std::fmt::Debug for HealthStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthStream")
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

/// The message of one health update, as the kubelet reads it (both versions carry the same
/// fields under the same numbers).
macro_rules! devices_of {
    ($v:ident, $msg:expr) => {
        $msg.devices
            .into_iter()
            .map(|d| {
                let id = d.device.unwrap_or_default();
                DeviceHealth {
                    pool: id.pool_name,
                    device: id.device_name,
                    health: match $v::HealthStatus::try_from(d.health) {
                        Ok($v::HealthStatus::Healthy) => "Healthy",
                        Ok($v::HealthStatus::Unhealthy) => "Unhealthy",
                        _ => "Unknown",
                    },
                    message: d.message,
                    timeout_seconds: d.health_check_timeout_seconds,
                    last_updated: d.last_updated_time,
                }
            })
            .collect()
    };
}

impl HealthStream {
    /// The next update; `None` when the plugin ended the stream.
    pub async fn next(&mut self) -> Result<Option<Vec<DeviceHealth>>> {
        let status = |s: tonic::Status| FakeKubeletError::Rpc {
            call: "NodeWatchResources",
            endpoint: String::new(),
            status: Box::new(s),
        };
        Ok(match &mut self.inner {
            HealthInner::V1(s) => s
                .message()
                .await
                .map_err(status)?
                .map(|m| devices_of!(health_v1, m)),
            HealthInner::V1alpha1(s) => s
                .message()
                .await
                .map_err(status)?
                .map(|m| devices_of!(health_v1alpha1, m)),
        })
    }
}

impl DraDriverClient {
    fn speaks_v1(&self) -> Result<()> {
        if self.plugin_service == PLUGIN_V1 {
            return Ok(());
        }
        Err(FakeKubeletError::Refused(format!(
            "DRA driver {} registered {}; the fake kubelet calls only {PLUGIN_V1}",
            self.info.name, self.plugin_service
        )))
    }

    /// `NodePrepareResources`, checking that every claim got an entry (the kubelet retries the
    /// missing ones; a test wants to know).
    pub async fn prepare(
        &self,
        claims: Vec<dra::Claim>,
    ) -> Result<dra::NodePrepareResourcesResponse> {
        self.speaks_v1()?;
        let uids: Vec<String> = claims.iter().map(|c| c.uid.clone()).collect();
        let resp = DraPluginClient::new(self.channel.clone())
            .node_prepare_resources(dra::NodePrepareResourcesRequest { claims })
            .await
            .map_err(rpc("NodePrepareResources", Path::new(&self.info.endpoint)))?
            .into_inner();
        if let Some(missing) = uids.iter().find(|u| !resp.claims.contains_key(*u)) {
            return Err(FakeKubeletError::Refused(format!(
                "NodePrepareResources answered without claim {missing}"
            )));
        }
        Ok(resp)
    }

    /// Opens `DRAResourceHealth.NodeWatchResources` (`v1alpha1`, what 1.34 to 1.36 kubelets
    /// call whatever the plugin lists) on the driver's service socket.
    pub async fn watch_health(
        &self,
    ) -> Result<tonic::Streaming<erdma_kubelet::dra_health::v1alpha1::NodeWatchResourcesResponse>>
    {
        use health_v1alpha1 as health;
        let stream =
            health::dra_resource_health_client::DraResourceHealthClient::new(self.channel.clone())
                .node_watch_resources(health::NodeWatchResourcesRequest {})
                .await
                .map_err(rpc("NodeWatchResources", Path::new(&self.info.endpoint)))?
                .into_inner();
        Ok(stream)
    }

    /// Opens `NodeWatchResources` of `service` ([`HEALTH_V1`] or [`HEALTH_V1ALPHA1`]).
    pub async fn open_health(&self, service: &'static str) -> Result<HealthStream> {
        let endpoint = Path::new(&self.info.endpoint);
        let inner = match service {
            HEALTH_V1 => HealthInner::V1(
                health_v1::dra_resource_health_client::DraResourceHealthClient::new(
                    self.channel.clone(),
                )
                .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
                .await
                .map_err(rpc("NodeWatchResources", endpoint))?
                .into_inner(),
            ),
            HEALTH_V1ALPHA1 => HealthInner::V1alpha1(
                health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
                    self.channel.clone(),
                )
                .node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
                .await
                .map_err(rpc("NodeWatchResources", endpoint))?
                .into_inner(),
            ),
            other => {
                return Err(FakeKubeletError::Refused(format!(
                    "{other:?} is not a health service ({HEALTH_V1}, {HEALTH_V1ALPHA1})"
                )));
            }
        };
        Ok(HealthStream { service, inner })
    }

    /// Opens the health stream this kubelet release opens on the plugin
    /// ([`DraDriverClient::health_service`]); `None` when it opens none.
    pub async fn open_negotiated_health(&self) -> Result<Option<HealthStream>> {
        match self.health_service {
            Some(s) => self.open_health(s).await.map(Some),
            None => Ok(None),
        }
    }

    /// `NodeUnprepareResources`, checking that every claim got an entry.
    pub async fn unprepare(
        &self,
        claims: Vec<dra::Claim>,
    ) -> Result<dra::NodeUnprepareResourcesResponse> {
        self.speaks_v1()?;
        let uids: Vec<String> = claims.iter().map(|c| c.uid.clone()).collect();
        let resp = DraPluginClient::new(self.channel.clone())
            .node_unprepare_resources(dra::NodeUnprepareResourcesRequest { claims })
            .await
            .map_err(rpc(
                "NodeUnprepareResources",
                Path::new(&self.info.endpoint),
            ))?
            .into_inner();
        if let Some(missing) = uids.iter().find(|u| !resp.claims.contains_key(*u)) {
            return Err(FakeKubeletError::Refused(format!(
                "NodeUnprepareResources answered without claim {missing}"
            )));
        }
        Ok(resp)
    }
}

/// Updates kept per health stream (the latest ones).
const KEPT_UPDATES: usize = 16;

/// A health stream the kubelet opened, as it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthRecord {
    /// The driver.
    pub driver: String,
    /// The plugin's service socket.
    pub endpoint: String,
    /// The service it was opened on.
    pub service: &'static str,
    /// The latest updates received, oldest first.
    pub updates: Vec<Vec<DeviceHealth>>,
    /// Updates received in all.
    pub received: usize,
    /// Why it is no longer open (`None` while open).
    pub ended: Option<String>,
}

struct Plugin {
    client: DraDriverClient,
    /// Index into the health records and the stream's stop token, while one runs for it.
    stream: Option<(usize, CancellationToken)>,
}

#[derive(Default)]
struct ManagerState {
    /// Driver name → its plugins in registration order.
    drivers: BTreeMap<String, Vec<Plugin>>,
    streams: Vec<HealthRecord>,
}

/// The kubelet's DRA plugin manager (`DRAPluginManager`) of one release: every registration
/// socket registered stays registered until [`DraKubelet::deregister`] (the plugin removed its
/// socket), several plugins of one driver are kept by endpoint, and the health streams are
/// opened and closed as that release does (see the module documentation). Cheap to clone.
#[derive(Clone)]
pub struct DraKubelet {
    version: KubeletVersion,
    resource_health_status: bool,
    state: Arc<Mutex<ManagerState>>,
}

impl std::fmt::Debug for DraKubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraKubelet")
            .field("version", &self.version)
            .field("resource_health_status", &self.resource_health_status)
            .finish_non_exhaustive()
    }
}

impl DraKubelet {
    /// The plugin manager of kubelet `version`, its `ResourceHealthStatus` gate at the release's
    /// default.
    pub fn new(version: KubeletVersion) -> Self {
        DraKubelet {
            version,
            resource_health_status: version.resource_health_status_default(),
            state: Arc::default(),
        }
    }

    /// Sets the `ResourceHealthStatus` gate (`--feature-gates ResourceHealthStatus=…`).
    pub fn with_resource_health_status(mut self, on: bool) -> Self {
        self.resource_health_status = on;
        self
    }

    /// The release played.
    pub fn version(&self) -> KubeletVersion {
        self.version
    }

    fn state(&self) -> MutexGuard<'_, ManagerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers every registration socket of driver `name` in `registry` that is not registered
    /// yet (as the plugin watcher does for each new socket), and returns the driver's plugin the
    /// kubelet now calls. A refused registration is an error after the plugin was told why.
    pub async fn register(&self, registry: &Path, name: &str) -> Result<DraDriverClient> {
        let known: Vec<PathBuf> = self
            .state()
            .drivers
            .values()
            .flatten()
            .map(|p| p.client.registration_socket.clone())
            .collect();
        let mut found = false;
        for sock in registration_sockets(registry)? {
            if known.contains(&sock) {
                continue;
            }
            let (mut rc, info) = get_info(&sock).await?;
            if info.name != name {
                continue;
            }
            found = true;
            self.register_info(&mut rc, &sock, info).await?;
        }
        if let Some(c) = self.get(name) {
            return Ok(c);
        }
        Err(FakeKubeletError::Refused(if found {
            format!("DRA driver {name} is not registered")
        } else {
            format!(
                "no registration socket of DRA driver {name} in {}",
                registry.display()
            )
        }))
    }

    /// Registers the plugin behind registration socket `sock`.
    pub async fn register_socket(&self, sock: &Path) -> Result<DraDriverClient> {
        let (mut rc, info) = get_info(sock).await?;
        self.register_info(&mut rc, sock, info).await
    }

    async fn register_info(
        &self,
        rc: &mut RegistrationClient<Channel>,
        sock: &Path,
        info: reg::PluginInfo,
    ) -> Result<DraDriverClient> {
        let name = info.name.clone();
        let verdict = validate_info(&info).and_then(|chosen| {
            let taken = self
                .state()
                .drivers
                .get(&name)
                .is_some_and(|ps| ps.iter().any(|p| p.client.info.endpoint == info.endpoint));
            if taken {
                // One plugin instance cannot hijack the endpoint of another instance.
                Err(format!(
                    "endpoint {} already registered for DRA driver plugin {name}",
                    info.endpoint
                ))
            } else {
                Ok(chosen)
            }
        });
        let chosen = verdict.clone();
        notify(rc, sock, &name, verdict.map(drop)).await?;
        let chosen = chosen.map_err(FakeKubeletError::Refused)?;
        let client = connect_service(
            sock,
            info,
            self.version,
            chosen,
            self.resource_health_status,
        )
        .await?;
        self.add(client.clone());
        Ok(client)
    }

    fn add(&self, client: DraDriverClient) {
        let driver = client.info.name.clone();
        let mut st = self.state();
        if self.version.one_health_stream_per_driver() {
            // The driver's one stream moves to the newest plugin, or ends when that plugin lists
            // no health service (no fall-back to an older plugin).
            let mut ended = Vec::new();
            for p in st.drivers.get_mut(&driver).into_iter().flatten() {
                if let Some((i, stop)) = p.stream.take() {
                    stop.cancel();
                    ended.push(i);
                }
            }
            for i in ended {
                Self::end(
                    &mut st.streams,
                    i,
                    "a newer plugin of the driver registered",
                );
            }
        }
        let stream = client
            .health_service
            .map(|service| self.start_stream(&mut st, &client, service));
        st.drivers
            .entry(driver)
            .or_default()
            .push(Plugin { client, stream });
    }

    /// Marks record `i` ended (if it was open) with `why`.
    fn end(streams: &mut [HealthRecord], i: usize, why: &str) {
        if let Some(r) = streams.get_mut(i)
            && r.ended.is_none()
        {
            r.ended = Some(why.to_string());
        }
    }

    fn start_stream(
        &self,
        st: &mut ManagerState,
        client: &DraDriverClient,
        service: &'static str,
    ) -> (usize, CancellationToken) {
        let i = st.streams.len();
        st.streams.push(HealthRecord {
            driver: client.info.name.clone(),
            endpoint: client.info.endpoint.clone(),
            service,
            updates: Vec::new(),
            received: 0,
            ended: None,
        });
        let stop = CancellationToken::new();
        let (state, c, s) = (self.state.clone(), client.clone(), stop.clone());
        tokio::spawn(async move {
            let record = |f: &dyn Fn(&mut HealthRecord)| {
                let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(r) = st.streams.get_mut(i) {
                    f(r);
                }
            };
            let mut stream = tokio::select! {
                _ = s.cancelled() => return,
                r = c.open_health(service) => match r {
                    Ok(stream) => stream,
                    Err(e) => {
                        let why = format!("opening failed: {e}");
                        record(&|r| r.ended = Some(why.clone()));
                        return;
                    }
                },
            };
            loop {
                let next = tokio::select! {
                    _ = s.cancelled() => return,
                    n = stream.next() => n,
                };
                match next {
                    Ok(Some(devices)) => record(&|r| {
                        r.received += 1;
                        r.updates.push(devices.clone());
                        if r.updates.len() > KEPT_UPDATES {
                            r.updates.remove(0);
                        }
                    }),
                    Ok(None) => {
                        record(&|r| r.ended = Some("the plugin ended the stream".into()));
                        return;
                    }
                    Err(e) => {
                        let why = e.to_string();
                        record(&|r| r.ended = Some(why.clone()));
                        return;
                    }
                }
            }
        });
        (i, stop)
    }

    /// The plugin removed its registration socket `sock`: it is forgotten and its health stream
    /// ends. No stream is started on another plugin of the driver.
    pub fn deregister(&self, sock: &Path) {
        let mut st = self.state();
        let mut ended = Vec::new();
        for plugins in st.drivers.values_mut() {
            plugins.retain_mut(|p| {
                if p.client.registration_socket != sock {
                    return true;
                }
                if let Some((i, stop)) = p.stream.take() {
                    stop.cancel();
                    ended.push(i);
                }
                false
            });
        }
        st.drivers.retain(|_, ps| !ps.is_empty());
        for i in ended {
            Self::end(&mut st.streams, i, "the plugin was deregistered");
        }
    }

    /// The plugin of `driver` the kubelet calls: the most recently registered one.
    pub fn get(&self, driver: &str) -> Option<DraDriverClient> {
        self.state()
            .drivers
            .get(driver)
            .and_then(|ps| ps.last())
            .map(|p| p.client.clone())
    }

    /// The endpoints registered for `driver`, in registration order.
    pub fn endpoints(&self, driver: &str) -> Vec<String> {
        self.state()
            .drivers
            .get(driver)
            .map(|ps| ps.iter().map(|p| p.client.info.endpoint.clone()).collect())
            .unwrap_or_default()
    }

    /// Every health stream opened so far, in the order opened.
    pub fn health_streams(&self) -> Vec<HealthRecord> {
        self.state().streams.clone()
    }

    /// The open health streams of `driver`.
    pub fn open_health_streams(&self, driver: &str) -> Vec<HealthRecord> {
        self.health_streams()
            .into_iter()
            .filter(|r| r.driver == driver && r.ended.is_none())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn registration_is_validated_like_the_kubelet() {
        let dir = tempfile::tempdir().expect("tmp");
        let sock = dir.path().join("dra.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        let good = reg::PluginInfo {
            r#type: reg::DRA_PLUGIN.into(),
            name: "erdma.alibabacloud.com".into(),
            endpoint: sock.display().to_string(),
            supported_versions: list(&["v1.DRAPlugin"]),
        };
        assert_eq!(validate_info(&good), Ok("v1.DRAPlugin"));
        let with = |f: &dyn Fn(&mut reg::PluginInfo)| {
            let mut i = good.clone();
            f(&mut i);
            validate_info(&i)
        };
        let refused = |r: std::result::Result<&'static str, String>| r.expect_err("refused");
        assert!(refused(with(&|i| i.r#type = "DevicePlugin".into())).contains("is not DRAPlugin"));
        assert!(
            refused(with(
                &|i| i.supported_versions = list(&["v1alpha4.NodeService"])
            ))
            .contains("none of services supported by the plugin")
        );
        assert!(
            refused(with(&|i| i.supported_versions.clear()))
                .contains("empty list of supported gRPC services")
        );
        // A health service alone is no plugin API.
        assert!(
            refused(with(
                &|i| i.supported_versions = list(&["v1.DRAResourceHealth"])
            ))
            .contains("none of services supported by the plugin")
        );
        assert!(
            refused(with(&|i| i.endpoint = "dra.sock".into())).contains("not an absolute path")
        );
        assert!(refused(with(&|i| i.name.clear())).contains("name is empty"));
        // The plugin's order decides among the APIs the kubelet speaks.
        assert_eq!(
            with(&|i| i.supported_versions = list(&["v1beta1.DRAPlugin", "v1.DRAPlugin"])),
            Ok("v1beta1.DRAPlugin")
        );
        assert_eq!(
            with(&|i| i.supported_versions = list(&["v1alpha1.DRAResourceHealth", "v1.DRAPlugin"])),
            Ok("v1.DRAPlugin")
        );
    }

    #[test]
    fn the_service_names_are_the_generated_ones() {
        assert_eq!(
            health_v1::dra_resource_health_server::SERVICE_NAME,
            "v1.DRAResourceHealth"
        );
        assert_eq!(
            health_v1alpha1::dra_resource_health_server::SERVICE_NAME,
            "v1alpha1.DRAResourceHealth"
        );
        assert_eq!(HEALTH_V1, "v1.DRAResourceHealth");
        assert_eq!(HEALTH_V1ALPHA1, "v1alpha1.DRAResourceHealth");
        assert_eq!(PLUGIN_V1, "v1.DRAPlugin");
    }

    #[test]
    fn each_release_picks_its_health_service() {
        use KubeletVersion::*;
        let none = list(&["v1.DRAPlugin"]);
        let alpha = list(&["v1.DRAPlugin", "v1alpha1.DRAResourceHealth"]);
        let v1 = list(&["v1.DRAPlugin", "v1.DRAResourceHealth"]);
        // Listed v1alpha1 first: the kubelet's preference decides, not the plugin's order.
        let both = list(&[
            "v1.DRAPlugin",
            "v1alpha1.DRAResourceHealth",
            "v1.DRAResourceHealth",
        ]);
        for old in [V1_34, V1_35, V1_36] {
            for s in [&none, &alpha, &v1, &both] {
                assert_eq!(
                    health_service(old, true, s),
                    Some("v1alpha1.DRAResourceHealth")
                );
            }
        }
        assert_eq!(health_service(V1_37, true, &none), None);
        assert_eq!(
            health_service(V1_37, true, &alpha),
            Some("v1alpha1.DRAResourceHealth")
        );
        assert_eq!(
            health_service(V1_37, true, &v1),
            Some("v1.DRAResourceHealth")
        );
        assert_eq!(
            health_service(V1_37, true, &both),
            Some("v1.DRAResourceHealth")
        );
        for v in KubeletVersion::ALL {
            assert_eq!(health_service(v, false, &both), None, "{v}: gate off");
        }
        assert_eq!(
            KubeletVersion::ALL.map(|v| v.resource_health_status_default()),
            [false, false, true, true]
        );
    }

    #[test]
    fn versions_parse_by_their_minor_release() {
        assert_eq!("1.34".parse(), Ok(KubeletVersion::V1_34));
        assert_eq!("v1.35".parse(), Ok(KubeletVersion::V1_35));
        assert_eq!(" 1.36.2 ".parse(), Ok(KubeletVersion::V1_36));
        assert_eq!("1.37".parse(), Ok(KubeletVersion::V1_37));
        assert_eq!(KubeletVersion::default(), KubeletVersion::V1_37);
        let e = "1.33".parse::<KubeletVersion>().expect_err("not modelled");
        assert!(e.contains("1.34, 1.35, 1.36, 1.37"), "{e}");
        assert!("2.34".parse::<KubeletVersion>().is_err());
        assert!("1.3".parse::<KubeletVersion>().is_err());
    }
}
