//! A stand-in DRA kubelet plugin (test support), to see what a kubelet release does with a
//! plugin's registration: it lists the `supported_versions` it is given, serves
//! `v1.DRAPlugin` (every claim answered with no devices) and both resource-health versions on
//! its service socket whatever it lists, and records which health versions were opened and what
//! the kubelet said about the registration.

use crate::error::{FakeKubeletError, Result};
use erdma_kubelet::dra::v1 as dra;
use erdma_kubelet::dra::v1::dra_plugin_server::{DraPlugin, DraPluginServer};
use erdma_kubelet::dra_health::{v1 as health_v1, v1alpha1 as health_v1alpha1};
use erdma_kubelet::pluginregistration::v1 as reg;
use erdma_kubelet::pluginregistration::v1::registration_server::{
    Registration, RegistrationServer,
};
use erdma_kubelet::uds;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// The pool the stand-in's health updates name; the device is the API version streamed.
pub const POOL: &str = "stand-in";

#[derive(Default)]
struct Seen {
    health_opened: Vec<&'static str>,
    notified: Vec<(bool, String)>,
}

type Shared = Arc<Mutex<Seen>>;

fn seen(s: &Shared) -> std::sync::MutexGuard<'_, Seen> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Clone)]
struct Service {
    info: reg::PluginInfo,
    seen: Shared,
    stop: CancellationToken,
}

#[tonic::async_trait]
impl Registration for Service {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> std::result::Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        req: Request<reg::RegistrationStatus>,
    ) -> std::result::Result<Response<reg::RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        seen(&self.seen)
            .notified
            .push((s.plugin_registered, s.error));
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

#[tonic::async_trait]
impl DraPlugin for Service {
    async fn node_prepare_resources(
        &self,
        req: Request<dra::NodePrepareResourcesRequest>,
    ) -> std::result::Result<Response<dra::NodePrepareResourcesResponse>, Status> {
        let claims = req
            .into_inner()
            .claims
            .into_iter()
            .map(|c| (c.uid, dra::NodePrepareResourceResponse::default()))
            .collect();
        Ok(Response::new(dra::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<dra::NodeUnprepareResourcesRequest>,
    ) -> std::result::Result<Response<dra::NodeUnprepareResourcesResponse>, Status> {
        let claims = req
            .into_inner()
            .claims
            .into_iter()
            .map(|c| (c.uid, dra::NodeUnprepareResourceResponse::default()))
            .collect();
        Ok(Response::new(dra::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

type BoxStream<T> =
    Pin<Box<dyn tokio_stream::Stream<Item = std::result::Result<T, Status>> + Send>>;

/// `first`, then open without updates until `stop` fires or the kubelet goes.
fn one_then_open<T: Send + 'static>(first: T, stop: CancellationToken) -> BoxStream<T> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        if tx.send(Ok(first)).await.is_err() {
            return;
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tx.closed() => {}
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

macro_rules! health_api {
    ($v:ident, $name:expr, $device:expr) => {
        #[tonic::async_trait]
        impl $v::dra_resource_health_server::DraResourceHealth for Service {
            type NodeWatchResourcesStream = BoxStream<$v::NodeWatchResourcesResponse>;

            async fn node_watch_resources(
                &self,
                _: Request<$v::NodeWatchResourcesRequest>,
            ) -> std::result::Result<Response<Self::NodeWatchResourcesStream>, Status> {
                seen(&self.seen).health_opened.push($name);
                let first = $v::NodeWatchResourcesResponse {
                    devices: vec![$v::DeviceHealth {
                        device: Some($v::DeviceIdentifier {
                            pool_name: POOL.into(),
                            device_name: $device.into(),
                        }),
                        health: $v::HealthStatus::Healthy as i32,
                        last_updated_time: 0,
                        health_check_timeout_seconds: 60,
                        message: String::new(),
                    }],
                };
                Ok(Response::new(one_then_open(first, self.stop.clone())))
            }
        }
    };
}

health_api!(health_v1, crate::dra::HEALTH_V1, "v1");
health_api!(health_v1alpha1, crate::dra::HEALTH_V1ALPHA1, "v1alpha1");

/// A running stand-in plugin.
pub struct StandInDraPlugin {
    /// Its registration socket in the kubelet's `plugins_registry`.
    pub registration_socket: PathBuf,
    /// Its service socket (`GetInfo`'s endpoint).
    pub endpoint: PathBuf,
    seen: Shared,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for StandInDraPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandInDraPlugin")
            .field("registration_socket", &self.registration_socket)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> FakeKubeletError {
    let path = path.to_path_buf();
    move |source| FakeKubeletError::Io { what, path, source }
}

impl StandInDraPlugin {
    /// Starts instance `instance` of driver `driver` under the kubelet root `kubelet_dir`:
    /// registration socket `plugins_registry/<driver>-<instance>-reg.sock`, service socket
    /// `plugins/<driver>/<instance>.sock`, listing `supported_versions`.
    pub fn start(
        kubelet_dir: &Path,
        driver: &str,
        instance: &str,
        supported_versions: &[&str],
    ) -> Result<Self> {
        let registry = kubelet_dir.join("plugins_registry");
        let plugins = kubelet_dir.join("plugins").join(driver);
        for d in [&registry, &plugins] {
            std::fs::create_dir_all(d).map_err(io("create directory", d))?;
        }
        let endpoint = plugins.join(format!("{instance}.sock"));
        let registration_socket = registry.join(format!("{driver}-{instance}-reg.sock"));
        let seen: Shared = Arc::default();
        let stop = CancellationToken::new();
        let svc = Service {
            info: reg::PluginInfo {
                r#type: reg::DRA_PLUGIN.into(),
                name: driver.into(),
                endpoint: endpoint.display().to_string(),
                supported_versions: supported_versions.iter().map(|s| s.to_string()).collect(),
            },
            seen: seen.clone(),
            stop: stop.clone(),
        };
        let service_listener = uds::bind(&endpoint)?;
        let registration_listener = uds::bind(&registration_socket)?;
        let mut tasks = Vec::new();
        let (s, st) = (svc.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(DraPluginServer::new(s.clone()))
                .add_service(
                    health_v1::dra_resource_health_server::DraResourceHealthServer::new(s.clone()),
                )
                .add_service(
                    health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(s),
                )
                .serve_with_incoming_shutdown(uds::incoming(service_listener), st.cancelled())
                .await;
        }));
        let st = stop.clone();
        tasks.push(tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(svc))
                .serve_with_incoming_shutdown(uds::incoming(registration_listener), st.cancelled())
                .await;
        }));
        Ok(StandInDraPlugin {
            registration_socket,
            endpoint,
            seen,
            stop,
            tasks,
        })
    }

    /// The health services the kubelet opened on it, in order.
    pub fn health_opened(&self) -> Vec<&'static str> {
        seen(&self.seen).health_opened.clone()
    }

    /// Every `NotifyRegistrationStatus` received: (registered, the kubelet's error).
    pub fn notified(&self) -> Vec<(bool, String)> {
        seen(&self.seen).notified.clone()
    }

    /// Stops serving (open health streams end) and removes both sockets.
    pub async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        for s in [&self.registration_socket, &self.endpoint] {
            if uds::is_socket(s) {
                let _ = std::fs::remove_file(s);
            }
        }
    }
}
