//! A node moved from the device plugin to DRA: the kubelet leaves `aliyun/erdma` in the Node's
//! status (at 0 once the plugin is gone), and the scheduler's DRA plugin then keeps every
//! `aliyun/erdma` pod off the node. The agent's DRA mode removes the key once the kubelet let the
//! device plugin go, and again when the kubelet writes it back. The in-memory API server stands
//! for the API server; the device-plugin directory is a temporary one with what the kubelet
//! leaves there (the plugin's socket, the kubelet's checkpoint).

mod common;

use common::{RESOURCE, served_fixture, start_dra_retiring, until};
use erdma_agent::cluster::Cluster;
use erdma_agent::plugin_resource::{self, Retirer, Step};
use erdma_k8s::fake::FakeApiServer;
use erdma_model::Health;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use std::os::unix::net::UnixListener;
use std::path::Path;

/// The device plugin's socket for `aliyun/erdma` in the device-plugin directory.
const PLUGIN_SOCKET: &str = "erdma-aliyun_erdma-erdma.sock";

/// What a kubelet writes into the node's status for a device plugin that went: the resource at
/// `erdma` beside the node's own resources.
fn node_with(erdma: Option<&str>) -> Node {
    let mut list = BTreeMap::from([
        ("cpu".to_string(), Quantity("4".into())),
        ("memory".to_string(), Quantity("8Gi".into())),
    ]);
    if let Some(q) = erdma {
        list.insert(RESOURCE.to_string(), Quantity(q.into()));
    }
    Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            capacity: Some(list.clone()),
            allocatable: Some(list),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// (capacity, allocatable) of `aliyun/erdma` and whether cpu is still in both.
fn status_of(api: &FakeApiServer) -> (Option<String>, Option<String>, bool) {
    let status = api
        .get::<Node>(None, "n1")
        .and_then(|n| n.status)
        .unwrap_or_default();
    let cap = status.capacity.unwrap_or_default();
    let alloc = status.allocatable.unwrap_or_default();
    (
        cap.get(RESOURCE).map(|q| q.0.clone()),
        alloc.get(RESOURCE).map(|q| q.0.clone()),
        cap.contains_key("cpu") && alloc.contains_key("cpu"),
    )
}

/// The kubelet's device-manager checkpoint as the kubelet writes it, registering `resources`.
fn kubelet_checkpoint(dir: &Path, resources: &[(&str, &[&str])]) {
    let registered: serde_json::Map<String, serde_json::Value> = resources
        .iter()
        .map(|(r, ids)| (r.to_string(), serde_json::json!(ids)))
        .collect();
    let text = serde_json::json!({
        "Data": {"PodDeviceEntries": [], "RegisteredDevices": registered},
        "Checksum": 3_281_747_120u64,
    });
    std::fs::write(
        dir.join(plugin_resource::KUBELET_CHECKPOINT),
        text.to_string(),
    )
    .unwrap();
}

#[tokio::test]
async fn the_resource_stays_while_the_kubelet_holds_the_device_plugin_and_goes_after() {
    let api = FakeApiServer::new();
    api.put(&node_with(Some("2")));
    let dir = tempfile::tempdir().unwrap();
    let retirer = Retirer {
        cluster: Cluster::new(api.client(), "n1"),
        resource: RESOURCE.into(),
        plugin_dir: dir.path().to_path_buf(),
    };

    // The device plugin still serves (a surge pod of the old agent): the kubelet would write
    // the resource back within seconds, and its pods are still being placed by it.
    let listener = UnixListener::bind(dir.path().join(PLUGIN_SOCKET)).unwrap();
    let step = retirer.step().await.unwrap();
    assert!(
        matches!(&step, Step::PluginHeld(why) if why.contains(PLUGIN_SOCKET)),
        "{step:?}"
    );
    assert_eq!(status_of(&api), (Some("2".into()), Some("2".into()), true));

    // The plugin went (its socket file stays, nobody listens), but the kubelet keeps it for its
    // grace period: its checkpoint still registers the resource (no healthy device left).
    drop(listener);
    kubelet_checkpoint(
        dir.path(),
        &[("nvidia.com/gpu", &["GPU-1"]), (RESOURCE, &[])],
    );
    let step = retirer.step().await.unwrap();
    assert!(
        matches!(&step, Step::PluginHeld(why) if why.contains("kubelet_internal_checkpoint")),
        "{step:?}"
    );
    assert_eq!(status_of(&api), (Some("2".into()), Some("2".into()), true));

    // The grace period is over: the kubelet dropped it from its checkpoint and wrote it as 0.
    kubelet_checkpoint(dir.path(), &[("nvidia.com/gpu", &["GPU-1"])]);
    api.put(&node_with(Some("0")));
    assert_eq!(
        retirer.step().await.unwrap(),
        Step::Removed {
            capacity: Some("0".into()),
            allocatable: Some("0".into())
        }
    );
    assert_eq!(status_of(&api), (None, None, true), "only the key goes");
    let patches = api
        .requests_matching("PATCH", "/api/v1/nodes/n1/status")
        .len();
    assert_eq!(retirer.step().await.unwrap(), Step::Absent);
    assert_eq!(
        api.requests_matching("PATCH", "/api/v1/nodes/n1/status")
            .len(),
        patches,
        "nothing is written when the key is absent"
    );
}

#[test]
fn the_kubelets_checkpoint_registers_a_resource_with_or_without_devices() {
    let text = br#"{"Data":{"PodDeviceEntries":[{"PodUID":"u1","ContainerName":"c","ResourceName":"aliyun/erdma","DeviceIDs":{"0":["erdma_0/3"]},"AllocResp":"CgA="}],"RegisteredDevices":{"aliyun/erdma":[]}},"Checksum":1}"#;
    assert_eq!(plugin_resource::registers(text, RESOURCE), Ok(true));
    let text = br#"{"Data":{"PodDeviceEntries":[{"PodUID":"u1","ContainerName":"c","ResourceName":"aliyun/erdma","DeviceIDs":{"0":["erdma_0/3"]},"AllocResp":"CgA="}],"RegisteredDevices":{"nvidia.com/gpu":["GPU-1"]}},"Checksum":1}"#;
    assert_eq!(
        plugin_resource::registers(text, RESOURCE),
        Ok(false),
        "a pod's old allocation is not a registration"
    );
    assert!(plugin_resource::registers(b"{\"Data\":", RESOURCE).is_err());
}

/// The agent's DRA mode on a node the device plugin served: the key goes from capacity and
/// allocatable (an Event says so); when the kubelet writes it back (its grace period ended after
/// the first removal), the next ResourceSlice sync removes it again.
#[tokio::test]
async fn a_node_switched_to_dra_loses_the_device_plugin_resource_and_again_after_the_kubelet_rewrites_it()
 {
    let (tree, served) = served_fixture();
    let api = FakeApiServer::new();
    api.put(&node_with(Some("0")));
    let running = start_dra_retiring(&tree, served.clone(), Cluster::new(api.client(), "n1"));
    until("aliyun/erdma removed from the node's status", || {
        status_of(&api) == (None, None, true)
    })
    .await;
    let removed = |api: &FakeApiServer| {
        api.list::<Event>(Some("default"))
            .iter()
            .filter(|e| e.reason.as_deref() == Some(plugin_resource::EVENT_REMOVED))
            .count()
    };
    assert_eq!(removed(&api), 1, "the removal is recorded as an Event");

    // The kubelet writes it back; a device's health changes, so the ResourceSlice syncs.
    let patches = api
        .requests_matching("PATCH", "/api/v1/nodes/n1/status")
        .len();
    api.put(&node_with(Some("0")));
    let mut changed = served;
    changed.devices[0].health = Health::from_reasons(vec!["port 1 is DOWN".into()]);
    running.served.send_replace(changed);
    until("aliyun/erdma removed again after the sync", || {
        status_of(&api) == (None, None, true)
    })
    .await;
    assert!(
        api.requests_matching("PATCH", "/api/v1/nodes/n1/status")
            .len()
            > patches,
        "removed by a patch of the status"
    );
    running.cancel.cancel();
    running.run.await.unwrap().unwrap();
}
