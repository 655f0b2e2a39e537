//! The claim cache end to end: the driver's ResourceClaim watch against the fake API server,
//! prepares through the fake kubelet over the real Unix sockets. Whether a prepare was answered
//! from the cache or by a GET is read from the API server's request log, not from the driver.
//!
//! The scheduler is not modelled: each claim's allocation and reservation is written by the test
//! (TEST-WRITTEN ALLOCATION).

use erdma_dra::server;
use erdma_dra::{DraConfig, Driver};
use erdma_fake_kubelet::dra::{self as kubelet, DraDriverClient};
use erdma_k8s::fake::FakeApiServer;
use erdma_model::{CharDevice, DeviceKind, NodeDevices, RdmaDevice};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimConsumerReference, ResourceClaimSpec, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const DRIVER: &str = "erdma.alibabacloud.com";
const NODE: &str = "node-a";

fn inventory() -> NodeDevices {
    let mut n = NodeDevices::empty();
    for i in 0..2u32 {
        let mut d = RdmaDevice::named(format!("erdma_{i}"), DeviceKind::Erdma);
        d.driver = Some("erdma".into());
        d.char_devices.uverbs = Some(CharDevice {
            path: format!("/dev/infiniband/uverbs{i}"),
            major: Some(231),
            minor: Some(192 + i),
            present: true,
        });
        n.devices.push(d);
    }
    n
}

/// A claim in `default`: `alloc` is (driver, pool, device) of each result (none: unallocated),
/// reserved for one pod when allocated.
fn claim(name: &str, uid: &str, alloc: &[(&str, &str, &str)]) -> ResourceClaim {
    let results: Vec<DeviceRequestAllocationResult> = alloc
        .iter()
        .map(|(driver, pool, device)| DeviceRequestAllocationResult {
            driver: (*driver).into(),
            pool: (*pool).into(),
            device: (*device).into(),
            request: "rdma".into(),
            ..Default::default()
        })
        .collect();
    let allocated = !results.is_empty();
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: ResourceClaimSpec::default(),
        status: Some(ResourceClaimStatus {
            allocation: allocated.then(|| AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: None,
                }),
                ..Default::default()
            }),
            reserved_for: allocated.then(|| {
                vec![ResourceClaimConsumerReference {
                    api_group: None,
                    resource: "pods".into(),
                    name: format!("pod-{name}"),
                    uid: format!("pod-{uid}"),
                }]
            }),
            ..Default::default()
        }),
    }
}

struct Running {
    api: FakeApiServer,
    driver: Arc<Driver>,
    kubelet: DraDriverClient,
    servers: server::Servers,
    cancel: CancellationToken,
    _dir: tempfile::TempDir,
}

async fn start(api: FakeApiServer) -> Running {
    let dir = tempfile::Builder::new()
        .prefix("dcc")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let mut cfg = DraConfig::new(NODE);
    cfg.kubelet_dir = dir.path().join("kubelet");
    cfg.cdi_dir = dir.path().join("cdi");
    cfg.sysfs = dir.path().join("sys");
    let (_tx, inv) = watch::channel(inventory());
    let driver = Arc::new(Driver::new(cfg.clone(), api.client(), inv).expect("driver starts"));
    let cancel = CancellationToken::new();
    let (d, c) = (driver.clone(), cancel.clone());
    tokio::spawn(async move { d.watch_claims(c).await });
    let servers = server::serve(driver.clone(), &cancel).expect("sockets bound");
    let kubelet = kubelet::register(&cfg.kubelet_dir.join("plugins_registry"), DRIVER)
        .await
        .expect("the kubelet registers the driver");
    until("the claim watch has listed", || {
        driver.claim_cache_stats().synced
    })
    .await;
    Running {
        api,
        driver,
        kubelet,
        servers,
        cancel,
        _dir: dir,
    }
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

impl Running {
    fn gets(&self, name: &str) -> usize {
        self.api
            .requests_matching("GET", &format!("/resourceclaims/{name}"))
            .len()
    }

    /// Prepares one claim: (devices, error).
    async fn prepare(&self, name: &str, uid: &str) -> (Vec<String>, String) {
        let r = self
            .kubelet
            .prepare(vec![kubelet::claim("default", name, uid)])
            .await
            .expect("prepare answers");
        let c = &r.claims[uid];
        (
            c.devices.iter().map(|d| d.device_name.clone()).collect(),
            c.error.clone(),
        )
    }

    async fn unprepare(&self, name: &str, uid: &str) {
        let r = self
            .kubelet
            .unprepare(vec![kubelet::claim("default", name, uid)])
            .await
            .expect("unprepare answers");
        assert_eq!(r.claims[uid].error, "");
    }

    async fn stop(self) {
        self.servers.shutdown().await;
        self.cancel.cancel();
    }
}

#[tokio::test]
async fn a_claim_the_watch_delivered_is_prepared_without_a_get() {
    let r = start(FakeApiServer::new()).await;
    r.api
        .put(&claim("a", "uid-a", &[(DRIVER, NODE, "erdma-0")]));
    let d = r.driver.clone();
    until("the cache holds a", || d.claim_cache().holds("uid-a")).await;
    let (devices, error) = r.prepare("a", "uid-a").await;
    assert_eq!((devices, error.as_str()), (vec!["erdma-0".to_string()], ""));
    assert_eq!(r.gets("a"), 0, "answered from the cache");
    let s = r.driver.claim_cache_stats();
    assert_eq!((s.hits, s.misses), (1, 0));
    r.stop().await;
}

#[tokio::test]
async fn a_claim_listed_before_the_driver_started_hits() {
    let api = FakeApiServer::new();
    api.put(&claim("a", "uid-a", &[(DRIVER, NODE, "erdma-1")]));
    let r = start(api).await;
    let (devices, error) = r.prepare("a", "uid-a").await;
    assert_eq!((devices, error.as_str()), (vec!["erdma-1".to_string()], ""));
    assert_eq!(r.gets("a"), 0);
    r.stop().await;
}

#[tokio::test]
async fn a_miss_falls_back_to_the_get() {
    let r = start(FakeApiServer::new()).await;
    // Allocated but not reserved: the cache does not keep it; the GET still prepares it (the
    // kubelet decides whether a claim is reserved for its pod).
    let mut c = claim("a", "uid-a", &[(DRIVER, NODE, "erdma-0")]);
    if let Some(s) = c.status.as_mut() {
        s.reserved_for = None;
    }
    r.api.put(&c);
    // A later claim's arrival shows the watch has processed a's version.
    r.api
        .put(&claim("z", "uid-z", &[(DRIVER, NODE, "erdma-1")]));
    let d = r.driver.clone();
    until("the cache holds z", || d.claim_cache().holds("uid-z")).await;
    assert!(!r.driver.claim_cache().holds("uid-a"));
    let (devices, error) = r.prepare("a", "uid-a").await;
    assert_eq!((devices, error.as_str()), (vec!["erdma-0".to_string()], ""));
    assert_eq!(r.gets("a"), 1, "read by GET");
    let s = r.driver.claim_cache_stats();
    assert_eq!((s.hits, s.misses), (0, 1));
    r.stop().await;
}

#[tokio::test]
async fn claims_of_other_nodes_and_drivers_are_not_kept() {
    let r = start(FakeApiServer::new()).await;
    r.api
        .put(&claim("b", "uid-b", &[(DRIVER, "node-b", "erdma-0")]));
    r.api
        .put(&claim("n", "uid-n", &[("dra.net", NODE, "eth0")]));
    r.api
        .put(&claim("z", "uid-z", &[(DRIVER, NODE, "erdma-1")]));
    let d = r.driver.clone();
    until("the cache holds z", || d.claim_cache().holds("uid-z")).await;
    assert_eq!(r.driver.claim_cache_stats().claims, 1, "only z is kept");
    let (_, error) = r.prepare("b", "uid-b").await;
    assert!(error.contains("not this node's pool"), "{error}");
    assert_eq!(r.gets("b"), 1, "the miss read b by GET");
    let (_, error) = r.prepare("n", "uid-n").await;
    assert!(error.contains("no devices of driver"), "{error}");
    assert_eq!(r.gets("n"), 1);
    r.stop().await;
}

#[tokio::test]
async fn a_deleted_claim_and_a_reused_name() {
    let r = start(FakeApiServer::new()).await;
    r.api
        .put(&claim("a", "uid-1", &[(DRIVER, NODE, "erdma-0")]));
    let d = r.driver.clone();
    until("the cache holds uid-1", || d.claim_cache().holds("uid-1")).await;
    r.api.remove::<ResourceClaim>(Some("default"), "a");
    until("the cache forgot uid-1", || !d.claim_cache().holds("uid-1")).await;
    let (devices, error) = r.prepare("a", "uid-1").await;
    assert!(devices.is_empty());
    assert!(
        error.contains("reading the ResourceClaim failed"),
        "{error}"
    );
    // The name comes back under a new UID, allocated elsewhere on the node.
    r.api
        .put(&claim("a", "uid-2", &[(DRIVER, NODE, "erdma-1")]));
    until("the cache holds uid-2", || d.claim_cache().holds("uid-2")).await;
    let (_, error) = r.prepare("a", "uid-1").await;
    assert!(error.contains("now has UID \"uid-2\""), "{error}");
    let gets = r.gets("a");
    let (devices, error) = r.prepare("a", "uid-2").await;
    assert_eq!((devices, error.as_str()), (vec!["erdma-1".to_string()], ""));
    assert_eq!(r.gets("a"), gets, "the new UID hits");
    r.stop().await;
}

#[tokio::test]
async fn after_unprepare_a_reallocated_claim_is_read_by_get_until_seen_deallocated() {
    let r = start(FakeApiServer::new()).await;
    r.api
        .put(&claim("a", "uid-a", &[(DRIVER, NODE, "erdma-0")]));
    let d = r.driver.clone();
    until("the cache holds a", || d.claim_cache().holds("uid-a")).await;
    assert_eq!(r.prepare("a", "uid-a").await.0, ["erdma-0"]);
    r.unprepare("a", "uid-a").await;
    // Prepared again while the watch has shown nothing newer: the cache is not trusted.
    assert_eq!(r.prepare("a", "uid-a").await.0, ["erdma-0"]);
    assert_eq!(r.gets("a"), 1, "fenced: read by GET");
    r.unprepare("a", "uid-a").await;
    // Deallocated, then allocated again on the other device and reserved.
    r.api.put(&claim("a", "uid-a", &[]));
    r.api
        .put(&claim("a", "uid-a", &[(DRIVER, NODE, "erdma-1")]));
    until("the cache holds the new allocation", || {
        d.claim_cache().holds("uid-a")
    })
    .await;
    assert_eq!(r.prepare("a", "uid-a").await.0, ["erdma-1"]);
    assert_eq!(r.gets("a"), 1, "the new allocation came from the cache");
    r.stop().await;
}

#[tokio::test]
async fn a_broken_watch_recovers_and_prepares_meanwhile_use_the_get() {
    let r = start(FakeApiServer::new()).await;
    // The API server forgets its history and ends the watch: the watcher lists again.
    r.api.compact();
    r.api.close_watches();
    r.api
        .put(&claim("a", "uid-a", &[(DRIVER, NODE, "erdma-0")]));
    let (devices, error) = r.prepare("a", "uid-a").await;
    assert_eq!((devices, error.as_str()), (vec!["erdma-0".to_string()], ""));
    let d = r.driver.clone();
    r.api
        .put(&claim("b", "uid-b", &[(DRIVER, NODE, "erdma-1")]));
    until("the watch delivers b", || d.claim_cache().holds("uid-b")).await;
    let gets = r.gets("b");
    assert_eq!(r.prepare("b", "uid-b").await.0, ["erdma-1"]);
    assert_eq!(r.gets("b"), gets, "b came from the cache");
    r.stop().await;
}
