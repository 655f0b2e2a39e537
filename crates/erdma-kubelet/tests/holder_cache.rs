//! The kept pod-resources answer against a real gRPC server on a Unix socket: a pod it has costs
//! no call, a pod it lacks costs one, concurrent refreshes share one call, a poke refreshes it,
//! and DRA claims count as holding.

use erdma_kubelet::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use erdma_kubelet::podresources::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ClaimResource, ContainerDevices,
    ContainerResources, DynamicResource, GetPodResourcesRequest, GetPodResourcesResponse,
    ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};
use erdma_kubelet::podresources::{Answered, Held, HolderCache, PodResourcesClient};
use erdma_kubelet::uds;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

#[derive(Clone, Default)]
struct Kubelet {
    calls: Arc<AtomicUsize>,
    answer: Arc<Mutex<ListPodResourcesResponse>>,
    delay: Duration,
}

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        Ok(Response::new(self.answer.lock().unwrap().clone()))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }

    async fn get(
        &self,
        _: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }
}

fn device_pod(ns: &str, name: &str, ids: &[&str]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers: vec![ContainerResources {
            name: "app".into(),
            devices: vec![ContainerDevices {
                resource_name: "aliyun/erdma".into(),
                device_ids: ids.iter().map(|s| s.to_string()).collect(),
                topology: None,
            }],
            ..Default::default()
        }],
    }
}

fn claim_pod(ns: &str, name: &str, driver: &str, device: &str) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: ns.into(),
        containers: vec![ContainerResources {
            name: "main".into(),
            dynamic_resources: vec![DynamicResource {
                claim_name: format!("{name}-rdma"),
                claim_namespace: ns.into(),
                claim_resources: vec![ClaimResource {
                    cdi_devices: vec![],
                    driver_name: driver.into(),
                    pool_name: "node-1".into(),
                    device_name: device.into(),
                }],
            }],
            ..Default::default()
        }],
    }
}

struct Served {
    kubelet: Kubelet,
    stop: CancellationToken,
    _dir: tempfile::TempDir,
    cache: Arc<HolderCache>,
}

fn serve(kubelet: Kubelet) -> Served {
    let dir = tempfile::Builder::new()
        .prefix("hc")
        .tempdir_in("/tmp")
        .unwrap();
    let path = dir.path().join("kubelet.sock");
    let listener = uds::bind(&path).unwrap();
    let stop = CancellationToken::new();
    let (k, s) = (kubelet.clone(), stop.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(k))
            .serve_with_incoming_shutdown(uds::incoming(listener), s.cancelled())
            .await
            .unwrap();
    });
    let cache = HolderCache::new(
        PodResourcesClient::new(&path),
        Held::both("aliyun/erdma", "erdma.alibabacloud.com"),
    );
    Served {
        kubelet,
        stop,
        _dir: dir,
        cache,
    }
}

#[tokio::test]
async fn a_kept_pod_costs_no_call_and_a_new_pod_costs_one() {
    let s = serve(Kubelet::default());
    *s.kubelet.answer.lock().unwrap() = ListPodResourcesResponse {
        pod_resources: vec![device_pod("default", "a", &["erdma_0/1"])],
    };
    let (h, answered) = s.cache.pod("default", "a").await.unwrap();
    assert_eq!(answered, Answered::Kubelet, "nothing kept yet");
    assert_eq!(h[0].device_ids, ["erdma_0/1"]);
    assert_eq!(s.kubelet.calls.load(Ordering::SeqCst), 1);
    for _ in 0..5 {
        let (h, answered) = s.cache.pod("default", "a").await.unwrap();
        assert_eq!((answered, h.len()), (Answered::Kept, 1));
    }
    assert_eq!(
        s.kubelet.calls.load(Ordering::SeqCst),
        1,
        "answered from the kept answer"
    );

    // A pod admitted since: not kept, so one call; a pod that holds nothing: one call, empty.
    s.kubelet
        .answer
        .lock()
        .unwrap()
        .pod_resources
        .push(claim_pod(
            "team-d",
            "b",
            "erdma.alibabacloud.com",
            "erdma-1",
        ));
    let (h, answered) = s.cache.pod("team-d", "b").await.unwrap();
    assert_eq!(answered, Answered::Kubelet);
    assert_eq!(
        h[0].claimed[0].device, "erdma-1",
        "a DRA claim holds the device"
    );
    assert_eq!(h[0].claimed[0].claim_name, "b-rdma");
    let (h, _) = s.cache.pod("default", "idle").await.unwrap();
    assert!(h.is_empty());
    assert_eq!(s.kubelet.calls.load(Ordering::SeqCst), 3);
    s.stop.cancel();
}

#[tokio::test]
async fn a_claim_of_another_driver_holds_nothing() {
    let s = serve(Kubelet::default());
    *s.kubelet.answer.lock().unwrap() = ListPodResourcesResponse {
        pod_resources: vec![claim_pod("default", "gpu", "gpu.example.com", "gpu-0")],
    };
    assert!(s.cache.fresh().await.unwrap().is_empty());
    s.stop.cancel();
}

#[tokio::test]
async fn concurrent_refreshes_share_one_call() {
    let s = serve(Kubelet {
        delay: Duration::from_millis(200),
        ..Kubelet::default()
    });
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let c = s.cache.clone();
            tokio::spawn(async move { c.fresh().await.map(|h| h.len()) })
        })
        .collect();
    for c in calls {
        assert_eq!(c.await.unwrap().unwrap(), 0);
    }
    // The first caller's call, and at most one more for the callers that arrived while it ran.
    let n = s.kubelet.calls.load(Ordering::SeqCst);
    assert!(
        (1..=2).contains(&n),
        "{n} List calls for 8 concurrent refreshes"
    );
    s.stop.cancel();
}

#[tokio::test]
async fn a_poke_refreshes_the_kept_answer() {
    let s = serve(Kubelet::default());
    let cancel = CancellationToken::new();
    let refresher = tokio::spawn(s.cache.clone().refresh_on_poke(cancel.clone()));
    s.cache.fresh().await.unwrap();
    let before = s.cache.kept().unwrap().generation;
    *s.kubelet.answer.lock().unwrap() = ListPodResourcesResponse {
        pod_resources: vec![device_pod("default", "new", &["erdma_0/2"])],
    };
    s.cache.poke();
    for _ in 0..500 {
        if s.cache.kept().unwrap().generation > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let calls = s.kubelet.calls.load(Ordering::SeqCst);
    let (h, answered) = s.cache.pod("default", "new").await.unwrap();
    assert_eq!(answered, Answered::Kept, "the poke brought the new pod in");
    assert_eq!(h[0].device_ids, ["erdma_0/2"]);
    assert_eq!(s.kubelet.calls.load(Ordering::SeqCst), calls);
    cancel.cancel();
    refresher.await.unwrap();
    s.stop.cancel();
}
