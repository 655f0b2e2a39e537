//! A stand-in for another device plugin on the node, such as terway's eRDMA ENI plugin: serves a
//! fixed device list for a resource on a socket name of the caller's choosing, registers it with
//! the kubelet, and keeps its `ListAndWatch` stream open until stopped.

use crate::error::{FakeKubeletError, Result};
use erdma_kubelet::deviceplugin::v1beta1 as api;
use erdma_kubelet::deviceplugin::v1beta1::device_plugin_server::{
    DevicePlugin, DevicePluginServer,
};
use erdma_kubelet::deviceplugin::v1beta1::registration_client::RegistrationClient;
use erdma_kubelet::uds::{self, ClientAuthority};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// The senders of the open ListAndWatch streams (a stream ends when its sender is dropped).
type OpenStreams =
    Arc<Mutex<Vec<mpsc::Sender<std::result::Result<api::ListAndWatchResponse, Status>>>>>;

/// A running stand-in plugin.
pub struct OtherPlugin {
    dir: PathBuf,
    socket_name: String,
    cancel: CancellationToken,
    streams: OpenStreams,
    server: JoinHandle<()>,
}

#[derive(Clone)]
struct Service {
    ids: Arc<Vec<String>>,
    streams: OpenStreams,
}

type Stream = Pin<
    Box<
        dyn tokio_stream::Stream<Item = std::result::Result<api::ListAndWatchResponse, Status>>
            + Send,
    >,
>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> std::result::Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::DevicePluginOptions::default()))
    }

    type ListAndWatchStream = Stream;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> std::result::Result<Response<Stream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let devices = self
            .ids
            .iter()
            .map(|id| api::Device {
                id: id.clone(),
                health: api::HEALTHY.into(),
                topology: None,
            })
            .collect();
        tx.send(Ok(api::ListAndWatchResponse { devices }))
            .await
            .map_err(|_| Status::internal("stream closed"))?;
        // The stream stays open for as long as the sender is kept.
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(tx);
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<api::PreferredAllocationRequest>,
    ) -> std::result::Result<Response<api::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("no preferred allocation"))
    }

    async fn allocate(
        &self,
        r: Request<api::AllocateRequest>,
    ) -> std::result::Result<Response<api::AllocateResponse>, Status> {
        Ok(Response::new(api::AllocateResponse {
            container_responses: r
                .into_inner()
                .container_requests
                .iter()
                .map(|_| api::ContainerAllocateResponse::default())
                .collect(),
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> std::result::Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

impl OtherPlugin {
    /// Serves `ids` (all healthy, no topology) on `<dir>/<socket_name>`.
    pub fn start(dir: &Path, socket_name: &str, ids: Vec<String>) -> Result<OtherPlugin> {
        let path = dir.join(socket_name);
        let listener = uds::bind(&path)
            .map_err(|e| FakeKubeletError::Refused(format!("bind {}: {e}", path.display())))?;
        let streams = Arc::new(Mutex::new(Vec::new()));
        let svc = Service {
            ids: Arc::new(ids),
            streams: streams.clone(),
        };
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        let server = tokio::spawn(async move {
            let r = tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(svc))
                .serve_with_incoming_shutdown(uds::incoming(listener), c.cancelled())
                .await;
            if let Err(e) = r {
                tracing::error!("other plugin server: {e}");
            }
        });
        Ok(OtherPlugin {
            dir: dir.to_path_buf(),
            socket_name: socket_name.to_string(),
            cancel,
            streams,
            server,
        })
    }

    /// Registers `resource` with the kubelet whose `kubelet.sock` is in the same directory.
    pub async fn register(&self, resource: &str) -> Result<()> {
        let sock = self
            .dir
            .join(erdma_kubelet::deviceplugin::v1beta1::KUBELET_SOCKET_NAME);
        let ch = uds::connect(&sock, ClientAuthority::Localhost, Duration::from_secs(5))
            .await
            .map_err(|e| FakeKubeletError::Refused(format!("connect {}: {e}", sock.display())))?;
        RegistrationClient::new(ch)
            .register(api::RegisterRequest {
                version: api::VERSION.into(),
                endpoint: self.socket_name.clone(),
                resource_name: resource.into(),
                options: Some(api::DevicePluginOptions::default()),
            })
            .await
            .map_err(|e| FakeKubeletError::Refused(format!("Register {resource}: {e}")))?;
        Ok(())
    }

    /// Ends its streams, stops serving and removes its socket, as a plugin that is switched off.
    pub async fn stop(self) {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.cancel.cancel();
        let _ = self.server.await;
        let _ = std::fs::remove_file(self.dir.join(&self.socket_name));
    }
}
