//! The DRA driver end to end against the fake kubelet (registration, prepare, unprepare over the
//! real Unix sockets) and the fake API server (ResourceSlice publishing, ResourceClaim reads).
//!
//! The scheduler is not modelled: each claim's allocation — what kube-scheduler's DRA plugin would
//! write into `status.allocation` — is written by the test ([`scheduler_allocates`]).

use erdma_dra::publish::{self, SliceAction};
use erdma_dra::server::{self, RegistrationState};
use erdma_dra::{CapacityModel, DraConfig, Driver};
use erdma_fake_kubelet::dra::{self as kubelet, DraDriverClient};
use erdma_k8s::fake::FakeApiServer;
use erdma_model::container::ANNOTATION_RDMA_MAX;
use erdma_model::device::NumaNode;
use erdma_model::{CharDevice, DeviceKind, Health, NodeDevices, RdmaDevice};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimSpec,
    ResourceClaimStatus, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const DRIVER: &str = "erdma.alibabacloud.com";
const NODE: &str = "node-a";

fn chardev(path: &str, minor: u32) -> CharDevice {
    CharDevice {
        path: path.into(),
        major: Some(231),
        minor: Some(minor),
        present: true,
    }
}

fn inventory(erdma1_healthy: bool) -> NodeDevices {
    let mut a = RdmaDevice::named("erdma_0", DeviceKind::Erdma);
    a.driver = Some("erdma".into());
    a.numa_node = NumaNode(Some(0));
    a.char_devices.uverbs = Some(chardev("/dev/infiniband/uverbs0", 192));
    let mut b = RdmaDevice::named("erdma_1", DeviceKind::Erdma);
    b.driver = Some("erdma".into());
    b.char_devices.uverbs = Some(chardev("/dev/infiniband/uverbs1", 193));
    if !erdma1_healthy {
        b.health = Health::from_reasons(vec!["port 1 is DOWN (netdev eth2 is down)".into()]);
    }
    let mut n = NodeDevices::empty();
    n.devices = vec![a, b];
    n.rdma_cm = Some(CharDevice {
        path: "/dev/infiniband/rdma_cm".into(),
        major: Some(10),
        minor: Some(58),
        present: true,
    });
    n
}

fn config(root: &Path) -> DraConfig {
    let mut cfg = DraConfig::new(NODE);
    cfg.kubelet_dir = root.join("kubelet");
    cfg.cdi_dir = root.join("cdi");
    cfg.sysfs = root.join("sys");
    // Two shares per device so that a third claim exceeds the capacity.
    cfg.capacity = CapacityModel {
        shares: 2,
        hca_handles: 16,
        hca_handles_default: 4,
        hca_objects: 100_000,
        hca_objects_default: 8000,
    };
    cfg
}

/// Writes a ResourceClaim with the allocation kube-scheduler's DRA plugin would make: one request
/// `rdma` satisfied by `device` of this node's pool with the given consumed capacity (TEST-WRITTEN
/// ALLOCATION; the scheduler is not part of this test).
fn scheduler_allocates(
    api: &FakeApiServer,
    name: &str,
    uid: &str,
    device: &str,
    shares: u32,
    handles: u32,
) {
    let claim = ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: ResourceClaimSpec::default(),
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![DeviceRequestAllocationResult {
                        driver: DRIVER.into(),
                        pool: NODE.into(),
                        device: device.into(),
                        request: "rdma".into(),
                        share_id: Some(format!("share-{uid}")),
                        consumed_capacity: Some(BTreeMap::from([
                            ("shares".to_string(), Quantity(shares.to_string())),
                            ("hcaHandle".to_string(), Quantity(handles.to_string())),
                            ("hcaObject".to_string(), Quantity("8k".into())),
                        ])),
                        ..Default::default()
                    }]),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    };
    api.put(&claim);
}

/// The fake API server with this node's Node (the owner of its ResourceSlice).
fn api_with_node() -> FakeApiServer {
    let api = FakeApiServer::new();
    api.put(&Node {
        metadata: ObjectMeta {
            name: Some(NODE.into()),
            uid: Some("node-a-uid".into()),
            ..Default::default()
        },
        ..Default::default()
    });
    api
}

struct Running {
    driver: Arc<Driver>,
    servers: server::Servers,
    kubelet: DraDriverClient,
}

async fn start(cfg: &DraConfig, api: &FakeApiServer, inv: watch::Receiver<NodeDevices>) -> Running {
    let driver = Arc::new(Driver::new(cfg.clone(), api.client(), inv).expect("driver starts"));
    let servers = server::serve(driver.clone(), &CancellationToken::new()).expect("sockets bound");
    let kubelet = kubelet::register(&cfg.kubelet_dir.join("plugins_registry"), DRIVER)
        .await
        .expect("the kubelet registers the driver");
    Running {
        driver,
        servers,
        kubelet,
    }
}

fn spec_of(cfg: &DraConfig, uid: &str) -> serde_json::Value {
    let p = cfg.cdi_dir.join(format!("{DRIVER}-claim_{uid}.json"));
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).expect("spec is JSON")
}

fn env_of(spec: &serde_json::Value) -> Vec<String> {
    spec["containerEdits"]["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn shared_capacity_prepare_refusal_and_restart_idempotency() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = config(tmp.path());
    let api = api_with_node();
    let (_inv_tx, inv) = watch::channel(inventory(true));

    let run = start(&cfg, &api, inv.clone()).await;
    // Registration as the kubelet sees it.
    assert_eq!(run.kubelet.info.r#type, "DRAPlugin");
    assert_eq!(
        run.kubelet.info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ]
    );
    assert_eq!(run.kubelet.plugin_service, "v1.DRAPlugin");
    assert_eq!(
        Path::new(&run.kubelet.info.endpoint),
        tmp.path()
            .join("kubelet/plugins/erdma.alibabacloud.com/dra.sock")
    );
    assert_eq!(
        run.kubelet.registration_socket,
        tmp.path()
            .join("kubelet/plugins_registry/erdma.alibabacloud.com-reg.sock")
    );
    assert_eq!(
        *run.servers.registration.borrow(),
        RegistrationState::Registered
    );

    scheduler_allocates(&api, "claim-a", "uid-a", "erdma-0", 1, 4);
    scheduler_allocates(&api, "claim-b", "uid-b", "erdma-0", 1, 6);
    scheduler_allocates(&api, "claim-c", "uid-c", "erdma-0", 1, 4);

    // Two claims share erdma-0 by capacity: each gets its own spec, CDI ID and limits.
    let resp = run
        .kubelet
        .prepare(vec![
            kubelet::claim("default", "claim-a", "uid-a"),
            kubelet::claim("default", "claim-b", "uid-b"),
        ])
        .await
        .expect("prepare answers");
    for uid in ["uid-a", "uid-b"] {
        let r = &resp.claims[uid];
        assert_eq!(r.error, "", "{uid}");
        assert_eq!(r.devices.len(), 1);
        assert_eq!(r.devices[0].pool_name, NODE);
        assert_eq!(r.devices[0].device_name, "erdma-0");
        assert_eq!(r.devices[0].request_names, ["rdma"]);
        assert_eq!(
            r.devices[0].cdi_device_ids,
            [format!("erdma.alibabacloud.com/claim={uid}-erdma_0")]
        );
    }
    let a = spec_of(&cfg, "uid-a");
    let b = spec_of(&cfg, "uid-b");
    assert_eq!(a["kind"], "erdma.alibabacloud.com/claim");
    assert_eq!(a["devices"][0]["name"], "uid-a-erdma_0");
    assert_eq!(b["devices"][0]["name"], "uid-b-erdma_0");
    for s in [&a, &b] {
        assert_eq!(
            s["devices"][0]["containerEdits"]["deviceNodes"],
            serde_json::json!([{"path": "/dev/infiniband/uverbs0", "permissions": "rw"}]),
            "only the allocated device's char device"
        );
        assert_eq!(
            s["containerEdits"]["deviceNodes"][0]["path"],
            "/dev/infiniband/rdma_cm"
        );
    }
    for (s, claim) in [(&a, "UID_A"), (&b, "UID_B")] {
        assert!(env_of(s).contains(&format!("ERDMA_DEVICES_{claim}=erdma_0")));
        assert!(env_of(s).contains(&format!("ERDMA_NCCL_IB_HCA_{claim}==erdma_0")));
    }
    assert_eq!(
        a["devices"][0]["annotations"][ANNOTATION_RDMA_MAX],
        "erdma_0 hca_handle=4 hca_object=8000"
    );
    assert_eq!(
        b["devices"][0]["annotations"][ANNOTATION_RDMA_MAX],
        "erdma_0 hca_handle=6 hca_object=8000"
    );
    assert!(
        env_of(&b)
            .contains(&"ERDMA_RDMA_MAX_UID_B=erdma_0 hca_handle=6 hca_object=8000".to_string())
    );
    // One container with both claims: the runtime merges the env of both specs, a later
    // variable replacing an earlier one of the same name. Each claim's device list and limits
    // stay whole.
    let mut merged = BTreeMap::new();
    for e in env_of(&a).into_iter().chain(env_of(&b)) {
        let (k, v) = e.split_once('=').expect("KEY=VALUE");
        merged.insert(k.to_string(), v.to_string());
    }
    for (k, v) in [
        ("ERDMA_DEVICES_UID_A", "erdma_0"),
        ("ERDMA_DEVICES_UID_B", "erdma_0"),
        (
            "ERDMA_RDMA_MAX_UID_A",
            "erdma_0 hca_handle=4 hca_object=8000",
        ),
        (
            "ERDMA_RDMA_MAX_UID_B",
            "erdma_0 hca_handle=6 hca_object=8000",
        ),
    ] {
        assert_eq!(
            merged.get(k).map(String::as_str),
            Some(v),
            "{k} in {merged:?}"
        );
    }

    // A third claim on the full device is refused with a clear error, and leaves nothing behind.
    let resp = run
        .kubelet
        .prepare(vec![kubelet::claim("default", "claim-c", "uid-c")])
        .await
        .expect("prepare answers");
    let err = &resp.claims["uid-c"].error;
    assert!(
        err.contains("device erdma-0 has shares=2") && err.contains("exceeds the capacity"),
        "{err}"
    );
    assert!(resp.claims["uid-c"].devices.is_empty());
    assert!(
        !cfg.cdi_dir
            .join(format!("{DRIVER}-claim_uid-c.json"))
            .exists()
    );

    // Restart of the agent (driver and sockets) and of the kubelet (a new registration).
    run.servers.shutdown().await;
    drop(run.driver);
    assert!(
        !cfg.registration_socket().exists(),
        "deregistered on shutdown"
    );
    let run = start(&cfg, &api, inv.clone()).await;
    let again = run
        .kubelet
        .prepare(vec![kubelet::claim("default", "claim-a", "uid-a")])
        .await
        .expect("prepare answers");
    assert_eq!(
        again.claims["uid-a"].devices[0].cdi_device_ids,
        ["erdma.alibabacloud.com/claim=uid-a-erdma_0"],
        "the same answer from the checkpoint"
    );
    // The capacity held by a and b survived the restart.
    let still = run
        .kubelet
        .prepare(vec![kubelet::claim("default", "claim-c", "uid-c")])
        .await
        .expect("prepare answers");
    assert!(still.claims["uid-c"].error.contains("exceeds the capacity"));
    let prepared = run.driver.prepared().await;
    assert_eq!(
        prepared.claims.keys().collect::<Vec<_>>(),
        ["uid-a", "uid-b"]
    );
    assert_eq!(
        prepared.claims["uid-b"].devices[0].share_id.as_deref(),
        Some("share-uid-b")
    );
    let again = run
        .kubelet
        .prepare(vec![kubelet::claim("default", "claim-b", "uid-b")])
        .await
        .expect("prepare answers");
    assert_eq!(
        again.claims["uid-b"].devices[0].share_id.as_deref(),
        Some("share-uid-b"),
        "the kubelet gets the share the claim was allocated"
    );

    // Unprepare frees the capacity; unpreparing again (or an unknown claim) succeeds.
    let un = run
        .kubelet
        .unprepare(vec![
            kubelet::claim("default", "claim-a", "uid-a"),
            kubelet::claim("default", "claim-z", "uid-z"),
        ])
        .await
        .expect("unprepare answers");
    assert_eq!(un.claims["uid-a"].error, "");
    assert_eq!(un.claims["uid-z"].error, "");
    assert!(
        !cfg.cdi_dir
            .join(format!("{DRIVER}-claim_uid-a.json"))
            .exists()
    );
    let un = run
        .kubelet
        .unprepare(vec![kubelet::claim("default", "claim-a", "uid-a")])
        .await
        .expect("unprepare answers");
    assert_eq!(un.claims["uid-a"].error, "");
    let now = run
        .kubelet
        .prepare(vec![kubelet::claim("default", "claim-c", "uid-c")])
        .await
        .expect("prepare answers");
    assert_eq!(now.claims["uid-c"].error, "");
    run.servers.shutdown().await;
}

#[tokio::test]
async fn prepare_refuses_what_the_node_cannot_serve() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = config(tmp.path());
    let api = api_with_node();
    let (_inv_tx, inv) = watch::channel(inventory(false));
    let run = start(&cfg, &api, inv).await;
    scheduler_allocates(&api, "sick", "uid-s", "erdma-1", 1, 4);
    scheduler_allocates(&api, "ghost", "uid-g", "erdma-9", 1, 4);
    scheduler_allocates(&api, "greedy", "uid-h", "erdma-0", 1, 17);
    let resp = run
        .kubelet
        .prepare(vec![
            kubelet::claim("default", "ghost", "uid-g"),
            kubelet::claim("default", "greedy", "uid-h"),
            kubelet::claim("default", "absent", "uid-x"),
            // The claim was re-created: the UID the kubelet has is not the object's any more.
            kubelet::claim("default", "sick", "uid-old"),
        ])
        .await
        .expect("prepare answers");
    let err = |u: &str| resp.claims[u].error.clone();
    assert!(
        err("uid-g").contains("device erdma-9 is not served on node node-a"),
        "{}",
        err("uid-g")
    );
    assert!(err("uid-h").contains("hcaHandle=16"), "{}", err("uid-h"));
    assert!(
        err("uid-x").contains("reading the ResourceClaim failed"),
        "{}",
        err("uid-x")
    );
    assert!(
        err("uid-old").contains("deleted and re-created"),
        "{}",
        err("uid-old")
    );
    assert!(run.driver.prepared().await.claims.is_empty());
    run.servers.shutdown().await;
}

/// A device allocated to a claim and unhealthy by the time the kubelet prepares it (a link flap
/// after the scheduler's decision): prepared as allocated, as the upstream helper does (it has
/// no health check at prepare); the ResourceSlice's taint keeps new claims off the device and the
/// health stream reports it on the pod.
#[tokio::test]
async fn a_claim_on_a_device_that_turned_unhealthy_is_prepared_as_allocated() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = config(tmp.path());
    let api = api_with_node();
    let (_inv_tx, inv) = watch::channel(inventory(false));
    let run = start(&cfg, &api, inv).await;
    scheduler_allocates(&api, "sick", "uid-s", "erdma-1", 1, 4);
    let resp = run
        .kubelet
        .prepare(vec![kubelet::claim("default", "sick", "uid-s")])
        .await
        .expect("prepare answers");
    assert_eq!(resp.claims["uid-s"].error, "");
    assert_eq!(resp.claims["uid-s"].devices[0].device_name, "erdma-1");
    assert!(
        run.driver.prepared().await.claims.contains_key("uid-s"),
        "recorded as prepared"
    );
    run.servers.shutdown().await;
}

#[tokio::test]
async fn slices_follow_the_inventory_with_taints_and_stale_slices_go() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = config(tmp.path());
    let api = api_with_node();
    let client = api.client();
    // A slice an earlier agent wrote under another name for this node and driver, and one of
    // another node, which must stay.
    let mut stale = erdma_dra::slice::resource_slice(vec![], &cfg, 7);
    stale.metadata.name = Some("node-a-old".into());
    api.put(&stale);
    let mut other_cfg = cfg.clone();
    other_cfg.node_name = "node-b".into();
    api.put(&erdma_dra::slice::resource_slice(vec![], &other_cfg, 1));

    let mut memory = erdma_model::DeviceMemory::default();
    let devs = publish::publishable(&mut memory, &inventory(true), &cfg, Some("i-1".into()));
    let o = publish::sync(&client, &cfg, devs.clone())
        .await
        .expect("sync");
    assert_eq!(o.action, SliceAction::Created);
    assert_eq!(o.deleted, ["node-a-old"]);
    let names: Vec<String> = api
        .list::<ResourceSlice>(None)
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    assert_eq!(
        names,
        [
            "node-a-erdma.alibabacloud.com",
            "node-b-erdma.alibabacloud.com"
        ]
    );
    // The API server adds a taint's timeAdded and drops fields of disabled features: not a change.
    let mut stored: ResourceSlice = api
        .get(None, "node-a-erdma.alibabacloud.com")
        .expect("slice stored");
    if let Some(d) = stored.spec.devices.as_mut() {
        d[1].allow_multiple_allocations = None;
    }
    api.put(&stored);
    let o = publish::sync(&client, &cfg, devs).await.expect("sync");
    assert_eq!(o.action, SliceAction::Unchanged);
    assert_eq!(o.generation, 1);

    // Link down on erdma_1: the device stays, tainted, under a new pool generation.
    let devs = publish::publishable(&mut memory, &inventory(false), &cfg, Some("i-1".into()));
    let o = publish::sync(&client, &cfg, devs).await.expect("sync");
    assert_eq!(o.action, SliceAction::Updated);
    assert_eq!(o.generation, 2);
    let slice: ResourceSlice = api
        .get(None, "node-a-erdma.alibabacloud.com")
        .expect("slice stored");
    assert_eq!(slice.spec.pool.generation, 2);
    let devices = slice.spec.devices.expect("devices");
    assert_eq!(devices.len(), 2);
    assert!(devices[0].taints.is_none());
    let t = &devices[1].taints.as_ref().expect("erdma-1 tainted")[0];
    assert_eq!(
        (t.key.as_str(), t.effect.as_str()),
        ("erdma.alibabacloud.com/unhealthy", "NoSchedule")
    );
    assert_eq!(devices[1].allow_multiple_allocations, Some(true));
    assert_eq!(
        devices[0]
            .attributes
            .as_ref()
            .and_then(|a| a.get("instanceId"))
            .and_then(|a| a.string.clone())
            .as_deref(),
        Some("i-1")
    );

    // The device vanishes from the inventory: still published, tainted as gone.
    let mut only_a = inventory(true);
    only_a.devices.truncate(1);
    let devs = publish::publishable(&mut memory, &only_a, &cfg, None);
    assert_eq!(devs.len(), 2);
    assert_eq!(
        devs[1]
            .taints
            .as_ref()
            .and_then(|t| t[0].value.clone())
            .as_deref(),
        Some("device-gone")
    );

    // Switching the node back to the device plugin removes the driver's slices of this node only.
    let removed = publish::remove_all(&client, &cfg).await.expect("remove");
    assert_eq!(removed, ["node-a-erdma.alibabacloud.com"]);
    assert_eq!(api.list::<ResourceSlice>(None).len(), 1);
}

/// The kubelet's resource-health stream: every device of the pool at once, HEALTHY or UNHEALTHY
/// with the inventory's reason, and an update as soon as a device's health changes.
#[tokio::test]
async fn health_stream_reports_each_device_and_follows_changes() {
    use erdma_kubelet::dra_health::v1alpha1::HealthStatus;
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = config(tmp.path());
    let api = api_with_node();
    let (inv_tx, inv) = watch::channel(inventory(true));
    let run = start(&cfg, &api, inv).await;
    let mut stream = run.kubelet.watch_health().await.expect("stream opens");
    let deadline = std::time::Duration::from_secs(30);
    let mut next = async || {
        tokio::time::timeout(deadline, stream.message())
            .await
            .expect("an update within the hang guard")
            .expect("stream healthy")
            .expect("stream open")
    };
    let seen = |m: &erdma_kubelet::dra_health::v1alpha1::NodeWatchResourcesResponse| {
        m.devices
            .iter()
            .map(|d| {
                let id = d.device.clone().unwrap_or_default();
                (
                    id.pool_name,
                    id.device_name,
                    HealthStatus::try_from(d.health).unwrap_or(HealthStatus::Unknown),
                    d.message.clone(),
                    d.health_check_timeout_seconds,
                    d.last_updated_time > 1_700_000_000,
                )
            })
            .collect::<Vec<_>>()
    };
    let first = next().await;
    assert_eq!(
        seen(&first),
        [
            (
                NODE.to_string(),
                "erdma-0".to_string(),
                HealthStatus::Healthy,
                String::new(),
                60,
                true
            ),
            (
                NODE.to_string(),
                "erdma-1".to_string(),
                HealthStatus::Healthy,
                String::new(),
                60,
                true
            ),
        ]
    );
    inv_tx.send_replace(inventory(false));
    let second = next().await;
    assert_eq!(
        seen(&second)[1],
        (
            NODE.to_string(),
            "erdma-1".to_string(),
            HealthStatus::Unhealthy,
            "port 1 is DOWN (netdev eth2 is down)".to_string(),
            60,
            true
        )
    );
    assert_eq!(
        seen(&second)[0].2,
        HealthStatus::Healthy,
        "erdma-0 stays healthy"
    );
    run.servers.shutdown().await;
}

/// The health stream as each kubelet release negotiates it from erdma's `GetInfo`: 1.37 opens
/// the `v1` service only because erdma lists it (it opens none for a plugin listing none); 1.36
/// opens `v1alpha1` whatever is listed. Either way the updates carry every device.
#[tokio::test]
async fn each_kubelet_release_gets_a_health_stream_from_what_get_info_lists() {
    use erdma_fake_kubelet::dra::{DraKubelet, KubeletVersion};
    for (version, service) in [
        (KubeletVersion::V1_37, "v1.DRAResourceHealth"),
        (KubeletVersion::V1_36, "v1alpha1.DRAResourceHealth"),
    ] {
        let tmp = tempfile::tempdir().expect("tmp");
        let cfg = config(tmp.path());
        let api = api_with_node();
        let (_inv_tx, inv) = watch::channel(inventory(false));
        let driver = Arc::new(Driver::new(cfg.clone(), api.client(), inv).expect("driver starts"));
        let servers =
            server::serve(driver.clone(), &CancellationToken::new()).expect("sockets bound");
        let kubelet = DraKubelet::new(version);
        let client = kubelet
            .register(&cfg.kubelet_dir.join("plugins_registry"), DRIVER)
            .await
            .expect("the kubelet registers the driver");
        assert_eq!(
            client.health_service,
            Some(service),
            "kubelet {version} on GetInfo {:?}",
            client.info.supported_versions
        );
        let mut got = None;
        for _ in 0..500 {
            let open = kubelet.open_health_streams(DRIVER);
            if let Some(u) = open.first().and_then(|r| r.updates.first()) {
                got = Some((open[0].service, u.clone()));
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let (opened, update) = got.unwrap_or_else(|| {
            panic!(
                "kubelet {version}: no health update; streams {:?}",
                kubelet.health_streams()
            )
        });
        assert_eq!(opened, service);
        let seen: Vec<(String, String, &str, i64)> = update
            .iter()
            .map(|d| {
                (
                    d.pool.clone(),
                    d.device.clone(),
                    d.health,
                    d.timeout_seconds,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (NODE.to_string(), "erdma-0".to_string(), "Healthy", 60),
                (NODE.to_string(), "erdma-1".to_string(), "Unhealthy", 60),
            ],
            "kubelet {version}"
        );
        assert_eq!(update[1].message, "port 1 is DOWN (netdev eth2 is down)");
        servers.shutdown().await;
    }
}

/// A sync reads only this node's slices of this driver: every list carries the field selector,
/// and a slice of another node that no client could even decode is never sent to it.
#[tokio::test]
async fn a_sync_on_one_node_never_reads_another_nodes_slices() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = config(tmp.path());
    let api = api_with_node();
    let collection = "/apis/resource.k8s.io/v1/resourceslices";
    // Stored as another API server version or a broken client might leave it: not a
    // ResourceSlice this client can decode. Listing it would fail the whole list.
    for (name, node, driver) in [
        ("node-b-erdma.alibabacloud.com", "node-b", DRIVER),
        ("node-a-other.example.com", "node-a", "other.example.com"),
    ] {
        api.state()
            .objects
            .entry(collection.to_string())
            .or_default()
            .insert(
                name.to_string(),
                serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": {"name": name, "resourceVersion": "1"},
                    "spec": {"driver": driver, "nodeName": node, "pool": {"name": node},
                        "devices": "not a list"}}),
            );
    }
    let mut memory = erdma_model::DeviceMemory::default();
    let devs = publish::publishable(&mut memory, &inventory(true), &cfg, None);
    let o = publish::sync(&api.client(), &cfg, devs)
        .await
        .expect("the sync never sees the other node's slice");
    assert_eq!(o.action, SliceAction::Created);
    let removed = publish::remove_all(&api.client(), &cfg)
        .await
        .expect("neither does the removal");
    assert_eq!(removed, ["node-a-erdma.alibabacloud.com"]);
    let lists = api.queries_matching("GET", collection);
    assert_eq!(lists.len(), 2, "{lists:?}");
    for q in &lists {
        assert_eq!(
            q.get("fieldSelector").map(String::as_str),
            Some("spec.nodeName=node-a,spec.driver=erdma.alibabacloud.com"),
            "{q:?}"
        );
    }
    assert_eq!(
        api.state().objects[collection].len(),
        2,
        "the other slices are untouched"
    );
}

/// The publisher watches this node's slices: when another client deletes the slice (the kubelet
/// wipes a driver's slices when it starts) it is published again, and a slice another client
/// adds for this node and driver is removed.
#[tokio::test]
async fn slices_changed_by_another_client_are_published_again() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = config(tmp.path());
    let api = api_with_node();
    let (_inv_tx, inv) = watch::channel(inventory(true));
    let (status_tx, status) = watch::channel(Err("not yet".to_string()));
    let cancel = CancellationToken::new();
    let run = tokio::spawn(publish::run(
        api.client(),
        cfg.clone(),
        inv,
        None,
        status_tx,
        cancel.clone(),
    ));
    let name = "node-a-erdma.alibabacloud.com";
    let until = async |what: &str, f: &dyn Fn() -> bool| {
        for _ in 0..500 {
            if f() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!(
            "timed out waiting for {what}; status {:?}",
            *status.borrow()
        );
    };
    until("the first publication", &|| {
        api.get::<ResourceSlice>(None, name).is_some()
    })
    .await;
    let watching = || {
        api.queries_matching("GET", "/apis/resource.k8s.io/v1/resourceslices")
            .iter()
            .any(|q| q.get("watch").is_some_and(|w| w == "true" || w == "1"))
    };
    until("the watch", &watching).await;
    let watches: Vec<_> = api
        .queries_matching("GET", "/apis/resource.k8s.io/v1/resourceslices")
        .into_iter()
        .filter(|q| q.contains_key("watch"))
        .collect();
    assert_eq!(
        watches[0].get("fieldSelector").map(String::as_str),
        Some("spec.nodeName=node-a,spec.driver=erdma.alibabacloud.com")
    );

    api.remove::<ResourceSlice>(None, name);
    until("the slice published again", &|| {
        api.get::<ResourceSlice>(None, name).is_some()
    })
    .await;
    let again: ResourceSlice = api.get(None, name).expect("slice");
    assert_eq!(again.spec.devices.map(|d| d.len()), Some(2));

    let mut intruder = erdma_dra::slice::resource_slice(vec![], &cfg, 9);
    intruder.metadata.name = Some("node-a-intruder".into());
    api.put(&intruder);
    until("the other slice of this node and driver removed", &|| {
        api.get::<ResourceSlice>(None, "node-a-intruder").is_none()
    })
    .await;
    cancel.cancel();
    run.await.expect("publisher stops");
}

/// An API server that answers 429 with `Retry-After: 30` (its flow control) is not asked again
/// by the publisher before 30 s have passed, even when the inventory changes meanwhile (its own
/// back-off would have retried after 1, 2, 4 ... s); once the API server answers again, the slice
/// is published with the newest inventory.
#[tokio::test(start_paused = true)]
async fn the_publisher_waits_as_long_as_a_429_retry_after_asks() {
    use erdma_k8s::fake::Fault;
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = config(tmp.path());
    let api = api_with_node();
    api.set_fault(Fault::Status {
        code: 429,
        retry_after_seconds: Some(30),
    });
    let (inv_tx, inv) = watch::channel(inventory(true));
    let (status_tx, status) = watch::channel(Err("not yet".to_string()));
    let cancel = CancellationToken::new();
    let run = tokio::spawn(publish::run(
        api.client(),
        cfg.clone(),
        inv,
        None,
        status_tx,
        cancel.clone(),
    ));
    // the publisher's own requests (the slice watch's list and watch, kube-runtime's with
    // `limit` and `watch`, keep their own back-off)
    let published = || {
        api.fault_report()
            .faulted
            .iter()
            .filter(|f| !f.request.contains("watch") && !f.request.contains("limit"))
            .count()
    };
    let start = tokio::time::Instant::now();
    let mut seen = Vec::new();
    while tokio::time::Instant::now() - start < std::time::Duration::from_secs(75) {
        let n = published();
        if n > seen.len() {
            seen.push(tokio::time::Instant::now() - start);
            if seen.len() == 1 {
                // an inventory change 5 s into the wait: it must not cut the wait short
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                inv_tx.send_replace(inventory(false));
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(seen.len() >= 2, "the publisher retried: {seen:?}");
    for pair in seen.windows(2) {
        assert!(
            pair[1] - pair[0] >= std::time::Duration::from_secs(30),
            "a retry came sooner than the 30 s the API server asked for: requests at {seen:?}"
        );
    }
    assert!(
        status.borrow().as_ref().is_err_and(|e| e.contains("429")),
        "the status names the refusal: {:?}",
        *status.borrow()
    );
    api.set_fault(Fault::Off);
    let name = "node-a-erdma.alibabacloud.com";
    for _ in 0..1000 {
        if api.get::<ResourceSlice>(None, name).is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let slice: ResourceSlice = api
        .get(None, name)
        .expect("published once the API server answers");
    assert!(
        slice.spec.devices.as_ref().is_some_and(|d| d
            .iter()
            .any(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))),
        "the newest inventory (erdma1 unhealthy, tainted) is what got published: {slice:?}"
    );
    cancel.cancel();
    run.await.expect("publisher stops");
}

/// The stored slice read back from the create/update answer against an API server with the
/// DRA feature gates off (1.35's defaults): every field it dropped is reported with its gate;
/// once the gates are on, writing again (as the publisher does every RECHECK_DROPPED while
/// fields are dropped) stores everything and reports nothing.
#[tokio::test]
async fn fields_dropped_by_the_api_server_are_read_back_with_their_feature_gate() {
    use erdma_dra::readback::DroppedField;
    use erdma_k8s::fake::FeatureGates;
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = config(tmp.path());
    let api = api_with_node();
    api.set_feature_gates(FeatureGates::release(35).expect("1.35"));
    let client = api.client();
    let mut memory = erdma_model::DeviceMemory::default();
    // erdma_1's link is down: it is written with a taint.
    let devs = publish::publishable(&mut memory, &inventory(false), &cfg, None);
    let o = publish::sync(&client, &cfg, devs.clone())
        .await
        .expect("sync");
    assert_eq!(o.action, SliceAction::Created);
    let both = vec!["erdma-0".to_string(), "erdma-1".to_string()];
    assert_eq!(
        o.dropped,
        [
            DroppedField {
                field: "taints",
                feature_gate: "DRADeviceTaints",
                devices: vec!["erdma-1".into()],
            },
            DroppedField {
                field: "allowMultipleAllocations",
                feature_gate: "DRAConsumableCapacity",
                devices: both.clone(),
            },
            DroppedField {
                field: "capacity.requestPolicy",
                feature_gate: "DRAConsumableCapacity",
                devices: both.clone(),
            },
        ]
    );
    // The stored slice names the tainted device, so a reader sees the taint is missing.
    let stored: ResourceSlice = api
        .get(None, "node-a-erdma.alibabacloud.com")
        .expect("stored");
    assert_eq!(
        stored
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(publish::ANNOTATION_TAINTED))
            .map(String::as_str),
        Some("erdma-1")
    );
    assert!(
        stored.spec.devices.as_ref().expect("devices")[1]
            .taints
            .is_none()
    );
    // Unchanged devices: not written again, still reported.
    let o = publish::sync(&client, &cfg, devs.clone())
        .await
        .expect("sync");
    assert_eq!(o.action, SliceAction::Unchanged);
    assert_eq!(o.dropped.len(), 3);

    // Only DRAConsumableCapacity on: the capacity fields are stored, the taint still dropped.
    api.set_feature_gates(
        FeatureGates::release(35)
            .expect("1.35")
            .with("DRAConsumableCapacity=true")
            .expect("gates"),
    );
    let o = publish::sync_with(&client, &cfg, devs.clone(), true)
        .await
        .expect("sync");
    assert_eq!(o.action, SliceAction::Updated);
    assert_eq!(
        o.dropped,
        [DroppedField {
            field: "taints",
            feature_gate: "DRADeviceTaints",
            devices: vec!["erdma-1".into()],
        }]
    );
    api.set_feature_gates(FeatureGates::default());
    let o = publish::sync_with(&client, &cfg, devs.clone(), true)
        .await
        .expect("sync");
    assert_eq!(o.action, SliceAction::Updated);
    assert_eq!(o.dropped, []);
    let o = publish::sync_with(&client, &cfg, devs, true)
        .await
        .expect("sync");
    assert_eq!(
        o.action,
        SliceAction::Unchanged,
        "nothing lacking: not written again"
    );
}

/// Writes a claim with the given allocation results and configuration (TEST-WRITTEN
/// ALLOCATION, as [`scheduler_allocates`]).
fn allocate_results(
    api: &FakeApiServer,
    name: &str,
    uid: &str,
    results: Vec<DeviceRequestAllocationResult>,
    config: Option<Vec<DeviceAllocationConfiguration>>,
) {
    api.put(&ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: ResourceClaimSpec::default(),
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    });
}

fn result(device: &str, request: &str) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        driver: DRIVER.into(),
        pool: NODE.into(),
        device: device.into(),
        request: request.into(),
        ..Default::default()
    }
}

/// A `firstAvailable` request is allocated as `<main>/<subrequest>`; the kubelet matches the
/// container's `resources.claims[].request` (the main name) exactly, so the answer names `main`.
#[tokio::test]
async fn a_subrequest_is_answered_under_its_main_request() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = config(tmp.path());
    let api = api_with_node();
    let (_inv_tx, inv) = watch::channel(inventory(true));
    let run = start(&cfg, &api, inv).await;
    allocate_results(
        &api,
        "fa",
        "uid-fa",
        vec![result("erdma-0", "rdma/erdma")],
        None,
    );
    let resp = run
        .kubelet
        .prepare(vec![kubelet::claim("default", "fa", "uid-fa")])
        .await
        .expect("prepare answers");
    let r = &resp.claims["uid-fa"];
    assert_eq!(r.error, "");
    assert_eq!(r.devices[0].request_names, ["rdma"]);
    // The checkpoint keeps the allocation's own name; the answer from it is the same.
    let cp = run.driver.prepared().await;
    assert_eq!(cp.claims["uid-fa"].devices[0].request, "rdma/erdma");
    let again = run
        .kubelet
        .prepare(vec![kubelet::claim("default", "fa", "uid-fa")])
        .await
        .expect("prepare answers");
    assert_eq!(again.claims["uid-fa"].devices[0].request_names, ["rdma"]);
    run.servers.shutdown().await;
}

/// `adminAccess` (monitoring) is honoured: prepared on a device whose shares are all held,
/// without consuming any, and without an rdma limit in its spec.
#[tokio::test]
async fn admin_access_is_prepared_without_consuming_capacity_or_a_limit() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = config(tmp.path());
    let api = api_with_node();
    let (_inv_tx, inv) = watch::channel(inventory(true));
    let run = start(&cfg, &api, inv).await;
    scheduler_allocates(&api, "full", "uid-f", "erdma-0", 2, 4);
    let mut admin = result("erdma-0", "monitor");
    admin.admin_access = Some(true);
    allocate_results(&api, "mon", "uid-m", vec![admin], None);
    let resp = run
        .kubelet
        .prepare(vec![
            kubelet::claim("default", "full", "uid-f"),
            kubelet::claim("default", "mon", "uid-m"),
        ])
        .await
        .expect("prepare answers");
    assert_eq!(resp.claims["uid-f"].error, "");
    assert_eq!(
        resp.claims["uid-m"].error, "",
        "admin access needs no share"
    );
    assert_eq!(resp.claims["uid-m"].devices[0].device_name, "erdma-0");
    let spec = spec_of(&cfg, "uid-m");
    assert!(
        spec["devices"][0]["annotations"][ANNOTATION_RDMA_MAX].is_null(),
        "{spec}"
    );
    assert!(
        !env_of(&spec)
            .iter()
            .any(|e| e.starts_with("ERDMA_RDMA_MAX")),
        "{spec}"
    );
    assert!(env_of(&spec).contains(&"ERDMA_DEVICES_UID_M=erdma_0".to_string()));
    let cp = run.driver.prepared().await;
    let used = cp.used(None);
    assert_eq!(used["erdma-0"].shares, 2, "only the regular claim's shares");
    assert_eq!(used["erdma-0"].hca_handle, 4);
    assert!(cp.claims["uid-m"].devices[0].admin);
    run.servers.shutdown().await;
}

/// Opaque configuration for this driver (erdma defines none) is refused per claim, naming the
/// claim, the field and the fix; another driver's is not ours to judge.
#[tokio::test]
async fn opaque_config_for_this_driver_is_refused_per_claim() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = config(tmp.path());
    let api = api_with_node();
    let (_inv_tx, inv) = watch::channel(inventory(true));
    let run = start(&cfg, &api, inv).await;
    let opaque = |driver: &str| DeviceAllocationConfiguration {
        opaque: Some(OpaqueDeviceConfiguration {
            driver: driver.into(),
            parameters: RawExtension(serde_json::json!({"gid": 3})),
        }),
        requests: None,
        source: "FromClaim".into(),
    };
    allocate_results(
        &api,
        "tuned",
        "uid-t",
        vec![result("erdma-0", "rdma")],
        Some(vec![opaque(DRIVER)]),
    );
    allocate_results(
        &api,
        "mixed",
        "uid-o",
        vec![result("erdma-0", "rdma")],
        Some(vec![opaque("gpu.example.com")]),
    );
    let resp = run
        .kubelet
        .prepare(vec![
            kubelet::claim("default", "tuned", "uid-t"),
            kubelet::claim("default", "mixed", "uid-o"),
        ])
        .await
        .expect("prepare answers");
    let err = &resp.claims["uid-t"].error;
    assert!(err.contains("claim default/tuned"), "{err}");
    assert!(err.contains("spec.devices.config[].opaque"), "{err}");
    assert!(err.contains(r#"{"gid":3}"#), "{err}");
    assert!(err.contains("defines no opaque parameters"), "{err}");
    assert!(resp.claims["uid-t"].devices.is_empty());
    assert!(
        !cfg.cdi_dir
            .join(format!("{DRIVER}-claim_uid-t.json"))
            .exists()
    );
    assert_eq!(resp.claims["uid-o"].error, "");
    run.servers.shutdown().await;
}

/// Every prepare reads its claim by a GET of that claim: no list or watch of the cluster's
/// ResourceClaims.
#[tokio::test]
async fn claims_are_read_by_get_only() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = config(tmp.path());
    let api = api_with_node();
    let (_inv_tx, inv) = watch::channel(inventory(true));
    let run = start(&cfg, &api, inv).await;
    scheduler_allocates(&api, "a", "uid-a", "erdma-0", 1, 4);
    let resp = run
        .kubelet
        .prepare(vec![
            kubelet::claim("default", "a", "uid-a"),
            kubelet::claim("default", "gone", "uid-g"),
        ])
        .await
        .expect("prepare answers");
    assert_eq!(resp.claims["uid-a"].error, "");
    assert_eq!(
        api.requests_matching("GET", "/namespaces/default/resourceclaims/a")
            .len(),
        1
    );
    let collection = api.requests_matching("GET", "/resourceclaims");
    assert!(
        collection.iter().all(|r| r.contains("/resourceclaims/")),
        "only GETs of one claim: {collection:?}"
    );
    let reads = run.driver.claim_reads();
    assert_eq!((reads.gets, reads.failed), (2, 1));
    run.servers.shutdown().await;
}

/// The slice is owned by its Node (GC deletes it with the Node); a slice an older agent wrote
/// without the owner gets it; without the Node nothing is published and the error names it.
#[tokio::test]
async fn the_slice_is_owned_by_its_node() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = config(tmp.path());
    let devs = |memory: &mut erdma_model::DeviceMemory| {
        publish::publishable(memory, &inventory(true), &cfg, None)
    };
    let mut memory = erdma_model::DeviceMemory::default();

    let bare = FakeApiServer::new();
    let e = publish::sync(&bare.client(), &cfg, devs(&mut memory))
        .await
        .expect_err("no Node");
    let e = e.to_string();
    assert!(e.contains("Node node-a not found"), "{e}");
    assert!(bare.list::<ResourceSlice>(None).is_empty());

    let api = api_with_node();
    let owner = serde_json::json!([{
        "apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-a-uid", "controller": true,
    }]);
    // Written by an agent that set no owner, with the same devices.
    let mut old = erdma_dra::slice::resource_slice(devs(&mut memory), &cfg, 1);
    old.metadata.annotations = Some(BTreeMap::from([(
        publish::ANNOTATION_DIGEST.to_string(),
        publish::digest(&devs(&mut memory)),
    )]));
    api.put(&old);
    let o = publish::sync(&api.client(), &cfg, devs(&mut memory))
        .await
        .expect("sync");
    assert_eq!(o.action, SliceAction::Updated, "the owner is added");
    let stored: ResourceSlice = api
        .get(None, "node-a-erdma.alibabacloud.com")
        .expect("slice stored");
    assert_eq!(
        serde_json::to_value(&stored.metadata.owner_references).expect("json"),
        owner
    );
    let o = publish::sync(&api.client(), &cfg, devs(&mut memory))
        .await
        .expect("sync");
    assert_eq!(o.action, SliceAction::Unchanged);

    api.remove::<ResourceSlice>(None, "node-a-erdma.alibabacloud.com");
    let o = publish::sync(&api.client(), &cfg, devs(&mut memory))
        .await
        .expect("sync");
    assert_eq!(o.action, SliceAction::Created);
    let stored: ResourceSlice = api
        .get(None, "node-a-erdma.alibabacloud.com")
        .expect("slice stored");
    assert_eq!(
        serde_json::to_value(&stored.metadata.owner_references).expect("json"),
        owner
    );
}
