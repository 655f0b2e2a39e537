//! The fake kubelet writes device-plugin resources into the Node's status as the kubelet does:
//! a stand-in plugin registers over the real Registration socket, the in-memory API server holds
//! the Node.

mod common;

use erdma_fake_kubelet::node_status::NodeStatusConfig;
use erdma_fake_kubelet::{FakeKubelet, FakeKubeletConfig, OtherPlugin};
use erdma_k8s::fake::FakeApiServer;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use std::collections::BTreeMap;
use std::time::Duration;

const NODE: &str = "lab-node";
const RES: &str = "aliyun/erdma";

fn api_with_node() -> FakeApiServer {
    let api = FakeApiServer::new();
    let list = BTreeMap::from([("cpu".to_string(), Quantity("2".into()))]);
    api.put(&Node {
        metadata: ObjectMeta {
            name: Some(NODE.into()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            capacity: Some(list.clone()),
            allocatable: Some(list),
            ..Default::default()
        }),
        ..Default::default()
    });
    api
}

async fn kubelet(dir: &std::path::Path, api: &FakeApiServer, stop_grace: Duration) -> FakeKubelet {
    let mut kubelet = FakeKubelet::start(FakeKubeletConfig::new(dir))
        .await
        .unwrap();
    kubelet.report_node_status(NodeStatusConfig {
        client: api.client(),
        node: NODE.into(),
        stop_grace,
        update_every: Duration::from_millis(100),
    });
    kubelet
}

/// `resource` in (status.capacity, status.allocatable), and whether cpu is still in both.
fn status_of(api: &FakeApiServer, resource: &str) -> (Option<String>, Option<String>, bool) {
    let status = api
        .get::<Node>(None, NODE)
        .and_then(|n| n.status)
        .unwrap_or_default();
    let cap = status.capacity.unwrap_or_default();
    let alloc = status.allocatable.unwrap_or_default();
    (
        cap.get(resource).map(|q| q.0.clone()),
        alloc.get(resource).map(|q| q.0.clone()),
        cap.contains_key("cpu") && alloc.contains_key("cpu"),
    )
}

/// Waits until `resource` reads (capacity, allocatable) = `want` with cpu kept; panics with
/// what the node holds when it never does.
async fn wait_status(api: &FakeApiServer, resource: &str, want: (Option<&str>, Option<&str>)) {
    let matches = |s: &(Option<String>, Option<String>, bool)| {
        s.0.as_deref() == want.0 && s.1.as_deref() == want.1 && s.2
    };
    for _ in 0..1500 {
        if matches(&status_of(api, resource)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "node {NODE}'s {resource} never read {want:?}: (capacity, allocatable, cpu kept) = {:?}",
        status_of(api, resource)
    );
}

/// Removes `resource` from the node's status, as the agent on a DRA node does.
async fn remove_key(api: &FakeApiServer) {
    let patch =
        serde_json::json!({"status": {"capacity": {RES: null}, "allocatable": {RES: null}}});
    Api::<Node>::all(api.client())
        .patch_status(NODE, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("dev-{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_plugin_is_in_capacity_and_allocatable_and_a_plugin_that_went_keeps_capacity()
{
    let dir = common::short_dir("fk-ns");
    let api = api_with_node();
    let kubelet = kubelet(dir.path(), &api, Duration::from_secs(3600)).await;
    let plugin = OtherPlugin::start(dir.path(), "dev.sock", ids(3)).unwrap();
    plugin.register(RES).await.unwrap();
    wait_status(&api, RES, (Some("3"), Some("3"))).await;

    // The kubelet still holds the plugin: a key removed by someone else comes back.
    remove_key(&api).await;
    wait_status(&api, RES, (Some("3"), Some("3"))).await;

    // The plugin goes: its devices turn unhealthy, capacity stays for the grace period.
    plugin.stop().await;
    wait_status(&api, RES, (Some("3"), Some("0"))).await;

    // A kubelet restart within the grace period: no devices until the plugin registers again.
    kubelet.restart().await.unwrap();
    wait_status(&api, RES, (Some("0"), Some("0"))).await;
    kubelet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_grace_period_the_resource_is_written_as_0_once_and_the_key_stays() {
    let dir = common::short_dir("fk-ns");
    let api = api_with_node();
    let kubelet = kubelet(dir.path(), &api, Duration::ZERO).await;
    let plugin = OtherPlugin::start(dir.path(), "dev.sock", ids(2)).unwrap();
    plugin.register(RES).await.unwrap();
    wait_status(&api, RES, (Some("2"), Some("2"))).await;

    plugin.stop().await;
    wait_status(&api, RES, (Some("0"), Some("0"))).await;

    // Dropped: a key removed now is not written back, although the kubelet writes the status
    // again (another plugin's resource appears after the removal).
    remove_key(&api).await;
    let other = OtherPlugin::start(dir.path(), "other.sock", ids(1)).unwrap();
    other.register("example.com/other").await.unwrap();
    wait_status(&api, "example.com/other", (Some("1"), Some("1"))).await;
    assert_eq!(status_of(&api, RES), (None, None, true));
    other.stop().await;
    kubelet.shutdown().await;
}
