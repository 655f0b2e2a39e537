//! The agent's DRA mode with the libraries' fakes: a fixture node tree scanned by the real
//! inventory, the in-memory API server, and the fake kubelet's DRA client over the real sockets.

use erdma_agent::cluster::Cluster;
use erdma_agent::resource_api::{self, Choice, DraSettings, ResourceApi};
use erdma_fake_kubelet::dra as kubelet;
use erdma_host::fake::{FixedInterfaceAddrs, NodeTree};
use erdma_host::{RootedDevFs, RootedSysfs, fixtures};
use erdma_inventory::{Inventory, Sources};
use erdma_k8s::fake::FakeApiServer;
use erdma_model::{DeviceSelection, NodeDevices};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

fn served_fixture() -> (NodeTree, NodeDevices) {
    let tree = NodeTree::temp();
    assert!(fixtures::build("erdma-iwarp", &tree));
    let inv = Inventory::new(Sources {
        sysfs: Arc::new(RootedSysfs::new(tree.sys())),
        devfs: Arc::new(RootedDevFs::new(tree.dev())),
        addrs: Arc::new(FixedInterfaceAddrs(BTreeMap::new())),
    });
    let (served, _) = DeviceSelection::default().apply(&inv.scan());
    (tree, served)
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn a_node_labelled_dra_publishes_slices_and_prepares_claims_instead_of_the_device_plugin() {
    let (tree, served) = served_fixture();
    let api = FakeApiServer::new();
    api.put(&Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            labels: Some(BTreeMap::from([(
                resource_api::NODE_LABEL.to_string(),
                "dra".to_string(),
            )])),
            ..Default::default()
        },
        ..Default::default()
    });
    let cluster = Cluster::new(api.client(), "n1");
    let chosen = resource_api::resolve(Choice::NodeLabel, Some(&cluster))
        .await
        .unwrap();
    assert_eq!(chosen, ResourceApi::Dra);
    resource_api::publish_condition(&cluster, chosen, "aliyun/erdma")
        .await
        .unwrap();
    let cond = api
        .get::<Node>(None, "n1")
        .and_then(|n| n.status)
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "ERdmaResourceAPI")
        .expect("condition");
    assert_eq!(cond.reason.as_deref(), Some("DRA"));

    let dir = tempfile::Builder::new()
        .prefix("wt")
        .tempdir_in("/tmp")
        .unwrap();
    let (view_tx, view_rx) = watch::channel(None);
    let cancel = CancellationToken::new();
    let (_served_tx, served_rx) = watch::channel(served);
    let run = tokio::spawn(resource_api::run_dra(
        DraSettings {
            kubelet_root_dir: dir.path().join("kubelet"),
            cdi_dir: dir.path().join("cdi"),
            sysfs: tree.sys().to_path_buf(),
        },
        cluster.clone(),
        served_rx,
        Some("i-test".into()),
        view_tx,
        cancel.clone(),
    ));
    until("the ResourceSlice", || {
        api.get::<ResourceSlice>(None, "n1-erdma.alibabacloud.com")
            .is_some()
    })
    .await;
    let slice: ResourceSlice = api.get(None, "n1-erdma.alibabacloud.com").unwrap();
    let devices = slice.spec.devices.unwrap();
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["erdma-0", "erdma-1"]);
    let attrs = devices[0].attributes.as_ref().unwrap();
    let s = |k: &str| attrs.get(k).and_then(|a| a.string.clone());
    assert_eq!(s("ibdev").as_deref(), Some("erdma_0"));
    assert_eq!(s("mac").as_deref(), Some("00:16:3e:0a:1b:2c"));
    assert_eq!(s("netdev").as_deref(), Some("eth1"));
    assert_eq!(s("mode").as_deref(), Some("iwarp"));
    assert_eq!(s("instanceId").as_deref(), Some("i-test"));

    let registry = dir.path().join("kubelet/plugins_registry");
    until("the registration socket", || {
        registry.join("erdma.alibabacloud.com-reg.sock").exists()
    })
    .await;
    let k = kubelet::register(&registry, "erdma.alibabacloud.com")
        .await
        .unwrap();
    until("registered in /healthz", || {
        view_rx
            .borrow()
            .as_ref()
            .is_some_and(|d| d.registration == "registered")
    })
    .await;

    // The allocation the scheduler would write (test-written).
    api.put(&ResourceClaim {
        metadata: ObjectMeta {
            name: Some("c1".into()),
            namespace: Some("default".into()),
            uid: Some("uid-c1".into()),
            ..Default::default()
        },
        spec: Default::default(),
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![DeviceRequestAllocationResult {
                        driver: "erdma.alibabacloud.com".into(),
                        pool: "n1".into(),
                        device: "erdma-1".into(),
                        request: "rdma".into(),
                        ..Default::default()
                    }]),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    });
    let r = k
        .prepare(vec![kubelet::claim("default", "c1", "uid-c1")])
        .await
        .unwrap();
    assert_eq!(r.claims["uid-c1"].error, "");
    assert_eq!(
        r.claims["uid-c1"].devices[0].cdi_device_ids,
        ["erdma.alibabacloud.com/claim=uid-c1-erdma_1"]
    );
    let spec = std::fs::read_to_string(
        dir.path()
            .join("cdi/erdma.alibabacloud.com-claim_uid-c1.json"),
    )
    .unwrap();
    // The fixture numbers uverbs independently of the devices: erdma_1 is uverbs0.
    assert!(spec.contains("/dev/infiniband/uverbs0"), "{spec}");
    assert!(
        !spec.contains("uverbs1"),
        "only the allocated device (erdma_0 is uverbs1): {spec}"
    );
    assert!(
        !dir.path().join("kubelet/device-plugins").exists(),
        "the device plugin is not involved"
    );
    cancel.cancel();
    run.await.unwrap().unwrap();
    assert!(
        !registry.join("erdma.alibabacloud.com-reg.sock").exists(),
        "deregistered on shutdown"
    );
}
