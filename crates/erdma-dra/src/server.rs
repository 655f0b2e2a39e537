//! The two sockets: the DRA service (`<kubelet>/plugins/<driver>/dra.sock`, with the
//! resource-health stream of [`crate::health`] beside it) and the plugin-watcher
//! registration (`<kubelet>/plugins_registry/<driver>-reg.sock`). The service socket is bound
//! first, so the kubelet, which dials the endpoint as soon as it sees the registration socket,
//! always finds it. `GetInfo` lists every service of the socket ([`supported_services`]): the
//! plugin API and both resource-health versions.

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

struct RegistrationService {
    info: reg::PluginInfo,
    state: watch::Sender<RegistrationState>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(
        &self,
        _req: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        req: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        let new = if s.plugin_registered {
            tracing::info!(driver = %self.info.name, "registered with the kubelet");
            RegistrationState::Registered
        } else {
            tracing::error!(driver = %self.info.name, error = %s.error, "the kubelet refused the DRA driver's registration");
            RegistrationState::Refused(s.error)
        };
        self.state.send_replace(new);
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

struct DraService {
    driver: Arc<Driver>,
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
        let claims = req.into_inner().claims;
        check_claims(&claims)?;
        Ok(Response::new(self.driver.prepare(&claims).await))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<dra::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra::NodeUnprepareResourcesResponse>, Status> {
        let claims = req.into_inner().claims;
        check_claims(&claims)?;
        Ok(Response::new(self.driver.unprepare(&claims).await))
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
    let svc = DraPluginServer::new(DraService { driver });
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
    let svc = RegistrationServer::new(RegistrationService { info, state: tx });
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
