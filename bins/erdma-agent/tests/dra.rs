//! The agent's DRA mode with the libraries' fakes: a fixture node tree scanned by the real
//! inventory, the in-memory API server, and the fake kubelet's DRA client over the real sockets.

mod common;

use common::{RunningDra, served_fixture, start_dra, start_dra_with, until};
use erdma_agent::cluster::Cluster;
use erdma_agent::resource_api::{self, Choice, ResourceApi};
use erdma_fake_kubelet::dra as kubelet;
use erdma_k8s::fake::FakeApiServer;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

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

    let RunningDra {
        dir,
        view: view_rx,
        served: _served_tx,
        cancel,
        run,
        prepares,
    } = start_dra(&tree, served, cluster.clone(), Some("i-test".into()));
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
        prepares.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "a prepared claim tells the agent to refresh who holds which device"
    );
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

/// The kubelet's calls on the DRA driver are counted by method and outcome, timed by method,
/// and their failed claims counted, in the agent's one registry, and served on `/metrics`.
#[tokio::test]
async fn the_kubelets_dra_calls_are_counted_and_timed_on_metrics() {
    let (tree, served) = served_fixture();
    let api = FakeApiServer::new();
    api.put(&Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            ..Default::default()
        },
        ..Default::default()
    });
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
                        device: "erdma-0".into(),
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
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = erdma_agent::metrics::AgentMetrics::register(&mut registry);
    let running = start_dra_with(
        &tree,
        served,
        Cluster::new(api.client(), "n1"),
        None,
        Some(metrics.dra.clone()),
    );
    let sockets = running.dir.path().join("kubelet/plugins_registry");
    until("the registration socket", || {
        sockets.join("erdma.alibabacloud.com-reg.sock").exists()
    })
    .await;
    let k = kubelet::register(&sockets, "erdma.alibabacloud.com")
        .await
        .unwrap();
    let ok = k
        .prepare(vec![kubelet::claim("default", "c1", "uid-c1")])
        .await
        .unwrap();
    assert_eq!(ok.claims["uid-c1"].error, "");
    // One claim prepared, one the API server does not know: the call carries one error.
    let mixed = k
        .prepare(vec![
            kubelet::claim("default", "c1", "uid-c1"),
            kubelet::claim("default", "gone", "uid-gone"),
        ])
        .await
        .unwrap();
    assert_ne!(mixed.claims["uid-gone"].error, "");
    let too_many = (0..1025)
        .map(|i| kubelet::claim("default", &format!("c{i}"), &format!("uid-{i}")))
        .collect();
    assert!(
        k.prepare(too_many).await.is_err(),
        "refused: too many claims"
    );
    k.unprepare(vec![kubelet::claim("default", "c1", "uid-c1")])
        .await
        .unwrap();

    // Served by the agent's HTTP server as the agent serves it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let http = CancellationToken::new();
    let server = tokio::spawn(erdma_agent::health::serve_on(
        listener,
        erdma_agent::health::Exposition {
            registry: Arc::new(registry),
            plugin: Arc::new(erdma_deviceplugin::Metrics::new()),
            health: erdma_agent::health::HealthSources::fixed(
                erdma_driver::DriverStatus::unmanaged(),
            ),
            usage: None,
        },
        http.clone(),
    ));
    let text = {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    };
    for line in [
        r#"erdma_dra_calls_total{method="GetInfo",outcome="ok"} 1"#,
        r#"erdma_dra_calls_total{method="NotifyRegistrationStatus",outcome="ok"} 1"#,
        r#"erdma_dra_calls_total{method="NodePrepareResources",outcome="ok"} 1"#,
        r#"erdma_dra_calls_total{method="NodePrepareResources",outcome="error"} 2"#,
        r#"erdma_dra_calls_total{method="NodeUnprepareResources",outcome="ok"} 1"#,
        r#"erdma_dra_claim_errors_total{method="NodePrepareResources"} 1"#,
        "# TYPE erdma_dra_call_duration_seconds histogram",
        r#"erdma_dra_call_duration_seconds_count{method="NodePrepareResources"} 3"#,
        r#"erdma_dra_call_duration_seconds_count{method="NodeUnprepareResources"} 1"#,
        r#"erdma_dra_call_duration_seconds_bucket{le="+Inf",method="GetInfo"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
    }
    assert!(
        !text.contains(r#"erdma_dra_claim_errors_total{method="NodeUnprepareResources"}"#),
        "{text}"
    );
    http.cancel();
    server.await.unwrap().unwrap();
    running.cancel.cancel();
    running.run.await.unwrap().unwrap();
}

/// The lab's path end to end without containers: the lab allocator writes what the scheduler
/// would (shares by consumable capacity, the extended-resource claim of KEP-5004), and the fake
/// kubelet's DRA manager finds each container's claims in its Pod object and prepares them.
#[tokio::test]
async fn lab_allocator_and_kubelet_claims_share_a_device_by_capacity_and_serve_the_extended_resource()
 {
    use erdma_fake_kubelet::allocator::{Allocator, ClaimRequest};
    use erdma_fake_kubelet::claims::{self, DraAccess};
    let (tree, served) = served_fixture();
    let api = FakeApiServer::new();
    // the Node: the owner of its ResourceSlice
    api.put(&Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            ..Default::default()
        },
        ..Default::default()
    });
    let mut values = erdma_k8s::install::Values::default();
    values.dra.enabled = true;
    api.put(&erdma_k8s::install::dra_device_class(&values));
    let RunningDra {
        dir,
        view: _view_rx,
        served: _served_tx,
        cancel,
        run,
        ..
    } = start_dra(&tree, served, Cluster::new(api.client(), "n1"), None);
    let registry = dir.path().join("kubelet/plugins_registry");
    until("the slice and the registration socket", || {
        api.get::<ResourceSlice>(None, "n1-erdma.alibabacloud.com")
            .is_some()
            && registry.join("erdma.alibabacloud.com-reg.sock").exists()
    })
    .await;
    let alloc = Allocator::new(api.client(), "n1");
    let access = DraAccess {
        client: api.client(),
        registry,
        kubelet_version: Default::default(),
    };
    let req = |pod: &str, claim: &str, shares: u64| ClaimRequest {
        pod: format!("lab/{pod}"),
        container: "c".into(),
        claim: claim.into(),
        class: "erdma.alibabacloud.com".into(),
        count: 1,
        capacity: BTreeMap::from([("shares".to_string(), shares)]),
        device: Some("erdma-1".into()),
        overcommit: false,
        first_available: None,
    };
    let a = alloc.claim(&req("pod-a", "claim-a", 150)).await.unwrap();
    let b = alloc.claim(&req("pod-b", "claim-b", 50)).await.unwrap();
    let result = |c: &ResourceClaim| {
        c.status
            .clone()
            .unwrap()
            .allocation
            .unwrap()
            .devices
            .unwrap()
            .results
            .unwrap()[0]
            .clone()
    };
    assert_eq!(result(&a).device, "erdma-1");
    assert_eq!(result(&b).device, "erdma-1");
    assert_ne!(result(&a).share_id, result(&b).share_id);
    let pa = claims::prepare_container(&access, "lab", "pod-a", "c")
        .await
        .unwrap();
    let pb = claims::prepare_container(&access, "lab", "pod-b", "c")
        .await
        .unwrap();
    let ua = a.metadata.uid.clone().unwrap();
    let ub = b.metadata.uid.clone().unwrap();
    assert_eq!(
        pa[0].cdi_devices,
        [format!("erdma.alibabacloud.com/claim={ua}-erdma_1")]
    );
    assert_eq!(
        pb[0].cdi_devices,
        [format!("erdma.alibabacloud.com/claim={ub}-erdma_1")]
    );

    // A third claim: the allocator sees erdma-1 full; written anyway, the driver refuses it.
    let e = alloc
        .claim(&req("pod-c", "claim-c", 1))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("erdma-1: shares=200, allocated 200, asked 1"),
        "{e}"
    );
    let mut over = req("pod-c", "claim-c2", 1);
    over.overcommit = true;
    alloc.claim(&over).await.unwrap();
    let e = claims::prepare_container(&access, "lab", "pod-c", "c")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("device erdma-1 has shares=200; 2 prepared claim(s) hold 200 and this claim asks 1, which exceeds the capacity"),
        "{e}"
    );

    // aliyun/erdma: 1 through the DeviceClass mapping: the claim goes to the device with room.
    let ext = alloc
        .extended("lab/pod-e", "c", "aliyun/erdma", 1)
        .await
        .unwrap();
    assert!(
        ext.metadata
            .name
            .as_deref()
            .unwrap()
            .starts_with("pod-e-extended-resources-")
    );
    assert_eq!(result(&ext).request, "container-0-request-0");
    assert_eq!(result(&ext).device, "erdma-0");
    let pe = claims::prepare_container(&access, "lab", "pod-e", "c")
        .await
        .unwrap();
    let ue = ext.metadata.uid.clone().unwrap();
    assert_eq!(
        pe[0].cdi_devices,
        [format!("erdma.alibabacloud.com/claim={ue}-erdma_0")]
    );

    // A prioritized list (`firstAvailable`): allocated as `rdma/erdma`, the container names the
    // request `rdma`, and the kubelet matches that name exactly against the driver's answer.
    let mut fa = req("pod-f", "claim-f", 10);
    fa.device = Some("erdma-0".into());
    fa.first_available = Some("erdma".into());
    let f = alloc.claim(&fa).await.unwrap();
    assert_eq!(result(&f).request, "rdma/erdma");
    let pf = claims::prepare_container(&access, "lab", "pod-f", "c")
        .await
        .unwrap();
    let uf = f.metadata.uid.clone().unwrap();
    assert_eq!(
        pf[0].cdi_devices,
        [format!("erdma.alibabacloud.com/claim={uf}-erdma_0")],
        "the container of a firstAvailable claim gets its device"
    );
    let e = alloc
        .extended("lab/pod-x", "c", "example.com/none", 1)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no DeviceClass has extendedResourceName example.com/none"),
        "{e}"
    );

    claims::unprepare(&access, &pa).await.unwrap();
    assert!(
        !dir.path()
            .join(format!("cdi/erdma.alibabacloud.com-claim_{ua}.json"))
            .exists()
    );
    assert!(
        dir.path()
            .join(format!("cdi/erdma.alibabacloud.com-claim_{ub}.json"))
            .exists()
    );
    cancel.cancel();
    run.await.unwrap().unwrap();
}

/// A kubelet newer than 1.36 opens the resource-health stream only for a health service the
/// plugin lists in `GetInfo`: the agent's DRA driver lists both, and the kubelet streams `v1`.
#[tokio::test]
async fn the_newest_kubelet_opens_the_agents_v1_health_stream() {
    use erdma_fake_kubelet::dra::{DraKubelet, KubeletVersion};
    let (tree, served) = served_fixture();
    let api = FakeApiServer::new();
    let cluster = Cluster::new(api.client(), "n1");
    let RunningDra {
        dir,
        view: _view,
        served: _served_tx,
        cancel,
        run,
        prepares: _,
    } = start_dra(&tree, served, cluster, None);
    let registry = dir.path().join("kubelet/plugins_registry");
    until("the registration socket", || {
        registry.join("erdma.alibabacloud.com-reg.sock").exists()
    })
    .await;
    let kubelet = DraKubelet::new(KubeletVersion::V1_37);
    let client = kubelet
        .register(&registry, "erdma.alibabacloud.com")
        .await
        .unwrap();
    assert_eq!(
        client.health_service,
        Some("v1.DRAResourceHealth"),
        "GetInfo lists {:?}",
        client.info.supported_versions
    );
    until("a health update", || {
        kubelet
            .open_health_streams("erdma.alibabacloud.com")
            .iter()
            .any(|r| r.received > 0)
    })
    .await;
    let stream = kubelet
        .open_health_streams("erdma.alibabacloud.com")
        .remove(0);
    assert_eq!(stream.service, "v1.DRAResourceHealth");
    let devices: Vec<(String, String, &str)> = stream.updates[0]
        .iter()
        .map(|d| (d.pool.clone(), d.device.clone(), d.health))
        .collect();
    assert_eq!(
        devices,
        [
            ("n1".to_string(), "erdma-0".to_string(), "Healthy"),
            ("n1".to_string(), "erdma-1".to_string(), "Healthy"),
        ]
    );
    cancel.cancel();
    run.await.unwrap().unwrap();
}

/// Against an API server with the DRA feature gates of 1.35 (off), the agent's driver reports
/// what the API server dropped from its ResourceSlice: in `/healthz` (`dra.dropped_fields`), in
/// `erdma_dra_dropped_fields{field,feature_gate}`, with a Warning Event on the node and the
/// `ERdmaResourceAPI` condition's reason; once the gates are on and the devices change, the
/// gauge goes to 0 and a Normal Event says so.
#[tokio::test]
async fn fields_the_api_server_drops_are_reported_with_their_feature_gates() {
    use erdma_k8s::fake::FeatureGates;
    use k8s_openapi::api::events::v1::Event;
    let (tree, served) = served_fixture();
    let api = FakeApiServer::new();
    api.set_feature_gates(FeatureGates::release(35).unwrap());
    api.put(&Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            ..Default::default()
        },
        ..Default::default()
    });
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = erdma_agent::metrics::AgentMetrics::register(&mut registry);
    let cluster = Cluster::new(api.client(), "n1");
    let mut changed = served.clone();
    let RunningDra {
        dir: _dir,
        view,
        served: served_tx,
        cancel,
        run,
        prepares: _,
    } = start_dra_with(&tree, served, cluster, None, Some(metrics.dra.clone()));
    until("dropped fields in /healthz", || {
        view.borrow()
            .as_ref()
            .is_some_and(|d| !d.dropped_fields.is_empty())
    })
    .await;
    let d = view.borrow().clone().unwrap();
    let fields: Vec<(&str, &str, Vec<String>)> = d
        .dropped_fields
        .iter()
        .map(|f| (f.field, f.feature_gate, f.devices.clone()))
        .collect();
    let both = vec!["erdma-0".to_string(), "erdma-1".to_string()];
    assert_eq!(
        fields,
        [
            (
                "allowMultipleAllocations",
                "DRAConsumableCapacity",
                both.clone()
            ),
            (
                "capacity.requestPolicy",
                "DRAConsumableCapacity",
                both.clone()
            ),
        ],
        "the fixture's devices are healthy: no taint written"
    );
    let healthz = serde_json::to_value(&d).unwrap();
    assert_eq!(
        healthz["dropped_fields"][0]["feature_gate"],
        "DRAConsumableCapacity"
    );
    let text = erdma_agent::metrics::encode(&registry);
    for line in [
        r#"erdma_dra_dropped_fields{field="allowMultipleAllocations",feature_gate="DRAConsumableCapacity"} 2"#,
        r#"erdma_dra_dropped_fields{field="capacity.requestPolicy",feature_gate="DRAConsumableCapacity"} 2"#,
        r#"erdma_dra_dropped_fields{field="taints",feature_gate="DRADeviceTaints"} 0"#,
    ] {
        assert!(text.contains(line), "{line} not in:\n{text}");
    }
    let events = || {
        api.list::<Event>(Some("default"))
            .into_iter()
            .map(|e| {
                (
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                )
            })
            .collect::<Vec<_>>()
    };
    until("the Warning Event", || {
        events()
            .iter()
            .any(|(_, r, _)| r == "ResourceSliceFieldsDropped")
    })
    .await;
    let warn = events()
        .into_iter()
        .find(|(_, r, _)| r == "ResourceSliceFieldsDropped")
        .unwrap();
    assert_eq!(warn.0, "Warning");
    assert!(
        warn.2.contains("feature gate DRAConsumableCapacity is off")
            && warn.2.contains("allocated whole to one claim at a time"),
        "{}",
        warn.2
    );
    let condition = || {
        api.get::<Node>(None, "n1")
            .and_then(|n| n.status)
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "ERdmaResourceAPI")
    };
    until("the condition", || condition().is_some()).await;
    let c = condition().unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_deref()),
        ("True", Some("DRAFeatureGatesOff"))
    );
    assert!(
        c.message
            .as_deref()
            .is_some_and(|m| m.contains("DRAConsumableCapacity")),
        "{c:?}"
    );

    // The gates go on; the next write (a device changed) stores everything.
    api.set_feature_gates(FeatureGates::default());
    changed.devices.truncate(1);
    served_tx.send_replace(changed);
    until("no dropped fields", || {
        view.borrow()
            .as_ref()
            .is_some_and(|d| d.dropped_fields.is_empty())
    })
    .await;
    until("the Normal Event", || {
        events()
            .iter()
            .any(|(_, r, _)| r == "ResourceSliceFieldsStored")
    })
    .await;
    let text = erdma_agent::metrics::encode(&registry);
    assert!(
        text.contains(r#"erdma_dra_dropped_fields{field="allowMultipleAllocations",feature_gate="DRAConsumableCapacity"} 0"#),
        "{text}"
    );
    until("the condition's reason back to DRA", || {
        condition().and_then(|c| c.reason).as_deref() == Some("DRA")
    })
    .await;
    cancel.cancel();
    run.await.unwrap().unwrap();
}
