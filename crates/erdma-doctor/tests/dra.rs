//! `erdmactl doctor --node` on a DRA node whose API server has the DRA feature gates off: the
//! slice the DRA driver published (through its own publisher, against the fake API server that
//! drops the fields as the API server does) is read back and the gates named.

use erdma_doctor::Status;
use erdma_doctor::cluster::node_checks;
use erdma_k8s::fake::{FakeApiServer, FeatureGates};
use erdma_model::{DeviceKind, Health, NodeDevices, RdmaDevice};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

fn node() -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            labels: Some(BTreeMap::from([(
                "erdma.alibabacloud.com/resource-api".to_string(),
                "dra".to_string(),
            )])),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn served() -> NodeDevices {
    let mut sick = RdmaDevice::named("erdma_1", DeviceKind::Erdma);
    sick.health = Health::from_reasons(vec!["port 1 is DOWN".into()]);
    let mut n = NodeDevices::empty();
    n.devices = vec![RdmaDevice::named("erdma_0", DeviceKind::Erdma), sick];
    n
}

async fn publish(api: &FakeApiServer) {
    let cfg = erdma_dra::DraConfig::new("n1");
    let devices = erdma_dra::slice::devices(&served(), &cfg, &Default::default());
    erdma_dra::publish::sync(&api.client(), &cfg, devices)
        .await
        .expect("published");
}

fn find<'a>(checks: &'a [erdma_doctor::Check], id: &str) -> &'a erdma_doctor::Check {
    checks
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no {id} in {checks:?}"))
}

#[tokio::test]
async fn the_gates_the_api_server_has_off_are_named_from_the_stored_slice_and_class() {
    let api = FakeApiServer::new();
    api.set_feature_gates(FeatureGates::release(35).expect("1.35"));
    api.put(&node());
    publish(&api).await;
    // The install's DeviceClass as an API server with DRAExtendedResource off stores it.
    let mut values = erdma_k8s::install::Values::default();
    values.dra.enabled = true;
    let mut class = erdma_k8s::install::dra_device_class(&values);
    class.spec.extended_resource_name = None;
    api.put(&class);

    let checks = node_checks(&api.client(), "n1", None)
        .await
        .expect("checks");
    let s = find(&checks, "node.dra.slice");
    assert_eq!(s.status, Status::Warn, "{s:?}");
    assert!(
        s.message.contains("DRAConsumableCapacity off")
            && s.message
                .contains("the taints of erdma-1 (DRADeviceTaints off"),
        "{}",
        s.message
    );
    let c = find(&checks, "node.dra.deviceclass");
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(
        c.hint
            .as_deref()
            .unwrap_or_default()
            .contains("DRAExtendedResource=true")
    );
    // Only this node's slices of the driver were asked for.
    let q = api.queries_matching("GET", "/apis/resource.k8s.io/v1/resourceslices");
    assert!(
        q.iter().all(|q| q.get("fieldSelector").map(String::as_str)
            == Some("spec.nodeName=n1,spec.driver=erdma.alibabacloud.com")),
        "{q:?}"
    );
}

#[tokio::test]
async fn with_the_newest_releases_gates_everything_is_stored() {
    let api = FakeApiServer::new();
    api.put(&node());
    publish(&api).await;
    let mut values = erdma_k8s::install::Values::default();
    values.dra.enabled = true;
    api.put(&erdma_k8s::install::dra_device_class(&values));
    let checks = node_checks(&api.client(), "n1", None)
        .await
        .expect("checks");
    assert_eq!(find(&checks, "node.dra.slice").status, Status::Pass);
    assert_eq!(find(&checks, "node.dra.deviceclass").status, Status::Pass);
}

/// A node switched from the device plugin to DRA whose status still has `aliyun/erdma` at 0
/// (what the kubelet leaves): the scheduler keeps every pod asking it Pending there.
#[tokio::test]
async fn a_dra_node_that_kept_the_device_plugins_resource_fails() {
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let api = FakeApiServer::new();
    let mut n = node();
    let left = BTreeMap::from([
        ("cpu".to_string(), Quantity("4".into())),
        ("aliyun/erdma".to_string(), Quantity("0".into())),
    ]);
    n.status = Some(NodeStatus {
        capacity: Some(left.clone()),
        allocatable: Some(left),
        ..Default::default()
    });
    api.put(&n);
    publish(&api).await;
    let checks = node_checks(&api.client(), "n1", None)
        .await
        .expect("checks");
    let c = find(&checks, "node.dra.extended_resource");
    assert_eq!(c.status, Status::Fail, "{c:?}");
    assert!(
        c.message
            .contains("still has aliyun/erdma (capacity 0, allocatable 0)"),
        "{}",
        c.message
    );
    // Removed (as the agent does): passes.
    n.status = None;
    api.put(&n);
    let checks = node_checks(&api.client(), "n1", None)
        .await
        .expect("checks");
    assert_eq!(
        find(&checks, "node.dra.extended_resource").status,
        Status::Pass
    );
}

#[tokio::test]
async fn a_device_plugin_node_gets_no_dra_checks() {
    let api = FakeApiServer::new();
    let mut n = node();
    n.metadata.labels = None;
    api.put(&n);
    let checks = node_checks(&api.client(), "n1", None)
        .await
        .expect("checks");
    assert!(
        !checks.iter().any(|c| c.id.starts_with("node.dra")),
        "{checks:?}"
    );
}
