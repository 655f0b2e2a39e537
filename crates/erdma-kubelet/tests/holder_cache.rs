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
use erdma_kubelet::podresources::{
    Answered, Held, HolderCache, Holders, PodResourcesClient, SAFETY_REFRESH, Snapshot,
};
use erdma_kubelet::uds;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

#[derive(Clone, Default)]
struct Kubelet {
    calls: Arc<AtomicUsize>,
    answer: Arc<Mutex<ListPodResourcesResponse>>,
    delay: Duration,
    /// Answer `List` with an error.
    fail: Arc<std::sync::atomic::AtomicBool>,
}

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        if self.fail.load(Ordering::SeqCst) {
            return Err(Status::internal("checkpoint unreadable"));
        }
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
    dir: tempfile::TempDir,
    cache: Arc<HolderCache>,
    /// Connections the server accepted.
    conns: Arc<AtomicUsize>,
}

/// Serves `kubelet` on `path` until `stop`, counting accepted connections in `conns`.
fn serve_on(
    path: &std::path::Path,
    kubelet: Kubelet,
    stop: CancellationToken,
    conns: Arc<AtomicUsize>,
) {
    let listener = uds::bind(path).unwrap();
    let incoming = tokio_stream::StreamExt::map(uds::incoming(listener), move |c| {
        conns.fetch_add(1, Ordering::SeqCst);
        c
    });
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(kubelet))
            .serve_with_incoming_shutdown(incoming, stop.cancelled())
            .await
            .unwrap();
    });
}

fn serve(kubelet: Kubelet) -> Served {
    let dir = tempfile::Builder::new()
        .prefix("hc")
        .tempdir_in("/tmp")
        .unwrap();
    let path = dir.path().join("kubelet.sock");
    let stop = CancellationToken::new();
    let conns = Arc::new(AtomicUsize::new(0));
    serve_on(&path, kubelet.clone(), stop.clone(), conns.clone());
    let cache = HolderCache::new(
        PodResourcesClient::new(&path),
        Held::both("aliyun/erdma", "erdma.alibabacloud.com"),
    );
    Served {
        kubelet,
        stop,
        dir,
        cache,
        conns,
    }
}

/// Waits (a hang guard, not a latency target) until `f` holds for the published snapshot.
async fn published(holders: &Holders, f: impl Fn(&Snapshot) -> bool) -> Arc<Snapshot> {
    let mut rx = holders.subscribe();
    tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|s| f(s)))
        .await
        .expect("published in time")
        .expect("owner alive")
        .clone()
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

/// A poke publishes a new snapshot on the channel: a subscriber sees the allocation's pod
/// without asking anything.
#[tokio::test]
async fn a_snapshot_is_published_after_a_poke() {
    let s = serve(Kubelet::default());
    let cancel = CancellationToken::new();
    tokio::spawn(s.cache.clone().refresh_on_poke(cancel.clone()));
    let first = published(&s.cache, Snapshot::is_answered).await;
    assert!(first.holders.is_empty() && first.error.is_none());
    let mut rx = s.cache.subscribe();
    rx.borrow_and_update();
    *s.kubelet.answer.lock().unwrap() = ListPodResourcesResponse {
        pod_resources: vec![device_pod("default", "allocated", &["erdma_1/0"])],
    };
    s.cache.poke();
    tokio::time::timeout(Duration::from_secs(20), rx.changed())
        .await
        .expect("published in time")
        .unwrap();
    let snap = rx.borrow().clone();
    assert!(snap.generation > first.generation);
    assert_eq!(
        snap.of_pod("default", "allocated")[0].device_ids,
        ["erdma_1/0"]
    );
    assert_eq!(
        snap.holding(&["erdma_1/0".to_string()])
            .map(|h| h.pod.as_str()),
        Some("allocated")
    );
    cancel.cancel();
    s.stop.cancel();
}

/// The kubelet restarts: its pod-resources socket is removed and created again, with other pods
/// behind it. The refresher notices the new socket and publishes their holders without a poke,
/// well before its safety refresh.
#[tokio::test]
async fn a_recreated_socket_is_refreshed_without_a_poke() {
    let s = serve(Kubelet::default());
    *s.kubelet.answer.lock().unwrap() = ListPodResourcesResponse {
        pod_resources: vec![device_pod("default", "before", &["erdma_0/1"])],
    };
    let cancel = CancellationToken::new();
    tokio::spawn(s.cache.clone().refresh_on_poke(cancel.clone()));
    let first = published(&s.cache, |s| !s.of_pod("default", "before").is_empty()).await;

    // The kubelet goes away ...
    s.stop.cancel();
    let path = s.dir.path().join("kubelet.sock");
    for _ in 0..200 {
        if std::fs::remove_file(&path).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let restarted = Instant::now();
    // ... and comes back with its socket created again.
    let again = Kubelet::default();
    *again.answer.lock().unwrap() = ListPodResourcesResponse {
        pod_resources: vec![device_pod("default", "after", &["erdma_0/2"])],
    };
    let stop = CancellationToken::new();
    serve_on(&path, again.clone(), stop.clone(), s.conns.clone());
    let snap = published(&s.cache, |s| !s.of_pod("default", "after").is_empty()).await;
    assert!(snap.generation > first.generation);
    assert!(snap.of_pod("default", "before").is_empty());
    assert!(
        restarted.elapsed() < SAFETY_REFRESH,
        "noticed by the socket watch, not the safety refresh ({:?})",
        restarted.elapsed()
    );
    assert!(again.calls.load(Ordering::SeqCst) >= 1);
    cancel.cancel();
    stop.cancel();
}

/// Readers of the published snapshot (kept pods, settled answers) open no connection and make no
/// call; a poke costs one call on the owner's one connection, and a reader that needs an answer
/// newer than its question waits for the refresher's.
#[tokio::test]
async fn readers_see_new_holders_without_opening_connections() {
    let s = serve(Kubelet::default());
    *s.kubelet.answer.lock().unwrap() = ListPodResourcesResponse {
        pod_resources: vec![device_pod("default", "a", &["erdma_0/1"])],
    };
    let cancel = CancellationToken::new();
    tokio::spawn(s.cache.clone().refresh_on_poke(cancel.clone()));
    published(&s.cache, Snapshot::is_answered).await;
    let (conns, calls) = (
        s.conns.load(Ordering::SeqCst),
        s.kubelet.calls.load(Ordering::SeqCst),
    );
    assert_eq!((conns, calls), (1, 1), "the refresher's first answer");
    let readers: Vec<_> = (0..16)
        .map(|_| {
            let h = s.cache.clone();
            tokio::spawn(async move {
                let (p, answered) = h.pod("default", "a").await.unwrap();
                let settled = h.settled(Duration::from_secs(1)).await;
                (
                    p.len(),
                    answered,
                    settled.holders.len(),
                    h.snapshot().generation,
                )
            })
        })
        .collect();
    for r in readers {
        assert_eq!(r.await.unwrap(), (1, Answered::Kept, 1, 1));
    }
    assert_eq!(s.conns.load(Ordering::SeqCst), 1, "no reader connected");
    assert_eq!(
        s.kubelet.calls.load(Ordering::SeqCst),
        1,
        "no reader called"
    );

    // An allocation: the poke's refresh brings the new pod to every reader.
    s.kubelet
        .answer
        .lock()
        .unwrap()
        .pod_resources
        .push(device_pod("default", "b", &["erdma_0/2"]));
    s.cache.poke();
    let settled = s.cache.settled(Duration::from_secs(20)).await;
    assert_eq!(
        settled.of_pod("default", "b").len(),
        1,
        "settled waits for the poke"
    );
    let (p, answered) = s.cache.pod("default", "b").await.unwrap();
    assert_eq!((p.len(), answered), (1, Answered::Kept));
    // A fresh answer is the refresher's, on the same connection.
    let before = s.kubelet.calls.load(Ordering::SeqCst);
    let fresh = s.cache.fresh().await.unwrap();
    assert_eq!(fresh.len(), 2);
    assert_eq!(s.kubelet.calls.load(Ordering::SeqCst), before + 1);
    assert_eq!(
        s.conns.load(Ordering::SeqCst),
        1,
        "one connection for everything"
    );
    cancel.cancel();
    s.stop.cancel();
}

/// A failed refresh is published with its error and keeps the last holders; `fresh` reports it.
#[tokio::test]
async fn a_failed_refresh_keeps_the_holders_and_says_why() {
    let s = serve(Kubelet::default());
    *s.kubelet.answer.lock().unwrap() = ListPodResourcesResponse {
        pod_resources: vec![device_pod("default", "a", &["erdma_0/1"])],
    };
    s.cache.fresh().await.unwrap();
    s.kubelet.fail.store(true, Ordering::SeqCst);
    let e = s.cache.fresh().await.unwrap_err();
    assert!(e.to_string().contains("checkpoint unreadable"), "{e}");
    let snap = s.cache.snapshot();
    assert!(snap.error.is_some());
    assert!(snap.is_answered());
    assert_eq!(
        snap.of_pod("default", "a").len(),
        1,
        "the last answer is kept"
    );
}
