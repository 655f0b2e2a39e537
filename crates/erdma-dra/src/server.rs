//! The two sockets: the DRA service (`<kubelet>/plugins/<driver>/dra.sock`, with the
//! resource-health stream of [`crate::health`] beside it) and the plugin-watcher
//! registration (`<kubelet>/plugins_registry/<driver>-reg.sock`). The service socket is bound
//! first, so the kubelet, which dials the endpoint as soon as it sees the registration socket,
//! always finds it. `GetInfo` lists every service of the socket ([`supported_services`]): the
//! plugin API and both resource-health versions. Every call of the kubelet on either socket is
//! told to a [`CallObserver`] (the agent's metrics), with its duration and outcome.

use crate::claims::Driver;
use crate::health::HealthService;
use erdma_kubelet::dra::v1 as dra;
use erdma_kubelet::dra::v1::dra_plugin_server::{DraPlugin, DraPluginServer};
use erdma_kubelet::dra_health::v1::dra_resource_health_server as health_v1;
use erdma_kubelet::dra_health::v1alpha1::dra_resource_health_server as health_v1alpha1;
use erdma_kubelet::pluginregistration::v1 as reg;
use erdma_kubelet::pluginregistration::v1::registration_server::{
    Registration, RegistrationServer,
};
use erdma_kubelet::uds;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// Most claims accepted in one call.
const MAX_CLAIMS: usize = 1024;

/// What the kubelet said about the registration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum RegistrationState {
    /// Not told yet.
    #[default]
    Pending,
    /// Registered.
    Registered,
    /// Refused, with the kubelet's error.
    Refused(String),
}

/// A call of the kubelet on the driver's sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    /// `Registration.GetInfo` (the plugin watcher found the registration socket).
    GetInfo,
    /// `Registration.NotifyRegistrationStatus` (the kubelet's verdict on the registration).
    NotifyRegistrationStatus,
    /// `DRAPlugin.NodePrepareResources`.
    NodePrepareResources,
    /// `DRAPlugin.NodeUnprepareResources`.
    NodeUnprepareResources,
}

impl Call {
    /// The RPC's name (`NodePrepareResources`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Call::GetInfo => "GetInfo",
            Call::NotifyRegistrationStatus => "NotifyRegistrationStatus",
            Call::NodePrepareResources => "NodePrepareResources",
            Call::NodeUnprepareResources => "NodeUnprepareResources",
        }
    }
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallOutcome {
    /// Answered, every claim in it without an error (the kubelet's registration: accepted).
    Ok,
    /// Answered, with this many of its claims failed (never 0): the kubelet retries them.
    ClaimErrors(usize),
    /// Refused with a gRPC status (too many claims), or the kubelet refused the registration.
    Refused,
}

impl CallOutcome {
    /// `ok`, or `error` for [`CallOutcome::ClaimErrors`] and [`CallOutcome::Refused`].
    pub fn name(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::ClaimErrors(_) | CallOutcome::Refused => "error",
        }
    }

    /// How many claims of the call failed.
    pub fn claim_errors(self) -> usize {
        match self {
            CallOutcome::ClaimErrors(n) => n,
            CallOutcome::Ok | CallOutcome::Refused => 0,
        }
    }

    fn of_claims(failed: usize) -> Self {
        if failed == 0 {
            CallOutcome::Ok
        } else {
            CallOutcome::ClaimErrors(failed)
        }
    }
}

/// Told every call's duration (from its arrival to the answer) and outcome; metrics, typically.
pub trait CallObserver: Send + Sync + 'static {
    /// One answered call.
    fn observe(&self, call: Call, outcome: CallOutcome, elapsed: Duration);
}

impl std::fmt::Debug for dyn CallObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallObserver")
    }
}

/// The observer of both services, if any.
#[derive(Clone, Default)]
struct Observed(Option<Arc<dyn CallObserver>>);

impl Observed {
    fn observe(&self, call: Call, outcome: CallOutcome, started: Instant) {
        if let Some(o) = &self.0 {
            o.observe(call, outcome, started.elapsed());
        }
    }

    /// Tells a call's `answer` (an error is [`CallOutcome::Refused`]; else `failed` counts its
    /// failed claims) and passes it on.
    fn answered<T>(
        &self,
        call: Call,
        started: Instant,
        answer: Result<T, Status>,
        failed: impl FnOnce(&T) -> usize,
    ) -> Result<Response<T>, Status> {
        let outcome = match &answer {
            Ok(a) => CallOutcome::of_claims(failed(a)),
            Err(_) => CallOutcome::Refused,
        };
        self.observe(call, outcome, started);
        answer.map(Response::new)
    }
}

struct RegistrationService {
    info: reg::PluginInfo,
    state: watch::Sender<RegistrationState>,
    observed: Observed,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(
        &self,
        _req: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        let started = Instant::now();
        self.observed
            .answered(Call::GetInfo, started, Ok(self.info.clone()), |_| 0)
    }

    async fn notify_registration_status(
        &self,
        req: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let started = Instant::now();
        let s = req.into_inner();
        let new = if s.plugin_registered {
            tracing::info!(driver = %self.info.name, "registered with the kubelet");
            RegistrationState::Registered
        } else {
            tracing::error!(driver = %self.info.name, error = %s.error, "the kubelet refused the DRA driver's registration");
            RegistrationState::Refused(s.error)
        };
        let outcome = match new {
            RegistrationState::Refused(_) => CallOutcome::Refused,
            _ => CallOutcome::Ok,
        };
        self.state.send_replace(new);
        self.observed
            .observe(Call::NotifyRegistrationStatus, outcome, started);
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

struct DraService {
    driver: Arc<Driver>,
    observed: Observed,
}

fn check_claims(claims: &[dra::Claim]) -> Result<(), Status> {
    if claims.len() > MAX_CLAIMS {
        return Err(Status::invalid_argument(format!(
            "{} claims in one call (at most {MAX_CLAIMS})",
            claims.len()
        )));
    }
    Ok(())
}

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        req: Request<dra::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra::NodePrepareResourcesResponse>, Status> {
        let started = Instant::now();
        let claims = req.into_inner().claims;
        let answer = match check_claims(&claims) {
            Ok(()) => Ok(self.driver.prepare(&claims).await),
            Err(e) => Err(e),
        };
        self.observed
            .answered(Call::NodePrepareResources, started, answer, |a| {
                a.claims.values().filter(|c| !c.error.is_empty()).count()
            })
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<dra::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra::NodeUnprepareResourcesResponse>, Status> {
        let started = Instant::now();
        let claims = req.into_inner().claims;
        let answer = match check_claims(&claims) {
            Ok(()) => Ok(self.driver.unprepare(&claims).await),
            Err(e) => Err(e),
        };
        self.observed
            .answered(Call::NodeUnprepareResources, started, answer, |a| {
                a.claims.values().filter(|c| !c.error.is_empty()).count()
            })
    }
}

/// What `GetInfo` lists in `supported_versions`: every gRPC service the driver's socket serves,
/// as `<package>.<service>`, the API first. Kubelets 1.34 to 1.36 take the first entry they
/// know as the plugin API and open the `v1alpha1` health stream whether it is listed or not;
/// newer kubelets open the health stream only for a health service listed here (v1 before
/// v1alpha1), so both are named: the socket serves both.
pub fn supported_services() -> Vec<String> {
    vec![
        dra::DRA_PLUGIN_SERVICE.to_string(),
        health_v1::SERVICE_NAME.to_string(),
        health_v1alpha1::SERVICE_NAME.to_string(),
    ]
}

/// The running sockets.
#[derive(Debug)]
pub struct Servers {
    /// What the kubelet said about the registration.
    pub registration: watch::Receiver<RegistrationState>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    sockets: Vec<std::path::PathBuf>,
}

impl Servers {
    /// Stops both servers and removes their sockets (the kubelet deregisters the driver).
    pub async fn shutdown(self) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        for s in &self.sockets {
            if uds::is_socket(s) {
                let _ = std::fs::remove_file(s);
            }
        }
    }
}

/// Binds and serves both sockets until `cancel` fires or [`Servers::shutdown`].
pub fn serve(driver: Arc<Driver>, cancel: &CancellationToken) -> crate::error::Result<Servers> {
    serve_observed(driver, None, cancel)
}

/// [`serve`], telling every call of the kubelet to `observer`.
pub fn serve_observed(
    driver: Arc<Driver>,
    observer: Option<Arc<dyn CallObserver>>,
    cancel: &CancellationToken,
) -> crate::error::Result<Servers> {
    let observed = Observed(observer);
    let cfg = driver.config().clone();
    let dra_path = cfg.dra_socket();
    let reg_path = cfg.registration_socket();
    for p in [&dra_path, &reg_path] {
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).map_err(crate::error::io_err("create directory", dir))?;
        }
    }
    let stop = cancel.child_token();
    let mut tasks = Vec::new();
    let dra_listener = uds::bind(&dra_path)?;
    let health = HealthService {
        pool: cfg.pool_name().to_string(),
        served: driver.served(),
        stop: stop.clone(),
    };
    let svc = DraPluginServer::new(DraService {
        driver,
        observed: observed.clone(),
    });
    let s = stop.clone();
    tasks.push(tokio::spawn(async move {
        if let Err(e) = tonic::transport::Server::builder()
            .add_service(svc)
            .add_service(health_v1alpha1::DraResourceHealthServer::new(
                health.clone(),
            ))
            .add_service(health_v1::DraResourceHealthServer::new(health))
            .serve_with_incoming_shutdown(uds::incoming(dra_listener), s.cancelled())
            .await
        {
            tracing::error!("DRA service: {e}");
        }
    }));
    let (tx, rx) = watch::channel(RegistrationState::Pending);
    let info = reg::PluginInfo {
        r#type: reg::DRA_PLUGIN.to_string(),
        name: cfg.driver_name.clone(),
        endpoint: dra_path.display().to_string(),
        supported_versions: supported_services(),
    };
    let reg_listener = uds::bind(&reg_path)?;
    let svc = RegistrationServer::new(RegistrationService {
        info,
        state: tx,
        observed,
    });
    let s = stop.clone();
    tasks.push(tokio::spawn(async move {
        if let Err(e) = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(uds::incoming(reg_listener), s.cancelled())
            .await
        {
            tracing::error!("DRA registration service: {e}");
        }
    }));
    tracing::info!(registration = %reg_path.display(), service = %dra_path.display(), "serving the DRA driver");
    Ok(Servers {
        registration: rx,
        stop,
        tasks,
        sockets: vec![reg_path, dra_path],
    })
}
