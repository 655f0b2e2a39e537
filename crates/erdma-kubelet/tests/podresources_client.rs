//! The pod-resources client against a real gRPC server on a Unix socket: one connection for
//! many calls, a new one after the server went away, and no attempt at a missing socket.

use erdma_kubelet::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use erdma_kubelet::podresources::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse,
};
use erdma_kubelet::podresources::{Held, PodResourcesClient};
use erdma_kubelet::uds;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

#[derive(Clone, Default)]
struct Kubelet {
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(ListPodResourcesResponse::default()))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(AllocatableResourcesResponse {
            devices: vec![ContainerDevices {
                resource_name: "aliyun/erdma".into(),
                device_ids: vec!["erdma_0-0".into(), "erdma_0-1".into()],
                topology: None,
            }],
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        _: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }
}

/// Serves `kubelet` on `path` until `stop`, counting accepted connections.
fn serve(
    path: &Path,
    kubelet: Kubelet,
    stop: CancellationToken,
) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let listener = uds::bind(path).unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    let incoming = tokio_stream::StreamExt::map(uds::incoming(listener), move |c| {
        counted.fetch_add(1, Ordering::SeqCst);
        c
    });
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(kubelet))
            .serve_with_incoming_shutdown(incoming, stop.cancelled())
            .await
            .unwrap();
    });
    (accepted, task)
}

#[tokio::test]
async fn one_connection_serves_many_calls_and_a_restarted_kubelet_gets_a_new_one() {
    let dir = tempfile::Builder::new()
        .prefix("pr")
        .tempdir_in("/tmp")
        .unwrap();
    let path = dir.path().join("kubelet.sock");
    let kubelet = Kubelet::default();
    let stop = CancellationToken::new();
    let (accepted, server) = serve(&path, kubelet.clone(), stop.clone());
    let client = PodResourcesClient::new(&path);
    let shared = client.clone();
    for _ in 0..3 {
        assert_eq!(
            client.list(&Held::resource("aliyun/erdma")).await.unwrap(),
            vec![]
        );
        assert_eq!(
            shared.allocatable("aliyun/erdma").await.unwrap(),
            ["erdma_0-0", "erdma_0-1"]
        );
    }
    assert_eq!(kubelet.calls.load(Ordering::SeqCst), 6);
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one connection for six calls"
    );

    // The kubelet restarts: the old connection is gone, the next call still succeeds.
    stop.cancel();
    server.await.unwrap();
    std::fs::remove_file(&path).unwrap();
    let restarted = Kubelet::default();
    let stop = CancellationToken::new();
    let (accepted, server) = serve(&path, restarted.clone(), stop.clone());
    assert_eq!(
        client.list(&Held::resource("aliyun/erdma")).await.unwrap(),
        vec![]
    );
    assert_eq!(
        client.list(&Held::resource("aliyun/erdma")).await.unwrap(),
        vec![]
    );
    assert_eq!(restarted.calls.load(Ordering::SeqCst), 2);
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "reconnected once");
    stop.cancel();
    server.await.unwrap();
}

#[tokio::test]
async fn a_missing_socket_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.sock");
    let err = PodResourcesClient::new(&path)
        .list(&Held::resource("aliyun/erdma"))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("absent.sock"), "{text}");
    assert!(text.contains("cannot connect"), "{text}");
}
