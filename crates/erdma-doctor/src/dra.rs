//! DRA on a node: whether the API server stored what erdma's DRA driver writes. The API server
//! drops the fields of a feature whose gate is off and stores the rest, so a cluster whose gates
//! are off looks fine until a pod is placed on an unhealthy device or two claims cannot share
//! one. Read from the objects:
//!
//! - the node's ResourceSlice of `erdma.alibabacloud.com`: every device is written with
//!   `allowMultipleAllocations` and a `requestPolicy` on each capacity (`DRAConsumableCapacity`),
//!   and the devices written with a taint are named in the annotation
//!   `erdma.alibabacloud.com/tainted-devices` (`DRADeviceTaints`);
//! - the DeviceClass `erdma.alibabacloud.com`: written with `extendedResourceName`
//!   (`DRAExtendedResource`), through which pods asking the extended resource are served on DRA
//!   nodes;
//! - the Node's status: no `aliyun/erdma` left in capacity or allocatable by the device plugin
//!   the node used before (the scheduler would take it for a device-plugin node).
//!
//! The three gates are alpha and off by default in 1.34 and 1.35, beta and on from 1.36.

use crate::check::Check;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};

/// The DRA driver (and its DeviceClass's name).
pub const DRIVER: &str = erdma_model::names::DRA_DRIVER;
/// The annotation on the slice naming the devices written with a taint (the DRA driver's
/// `publish::ANNOTATION_TAINTED`).
pub const ANNOTATION_TAINTED: &str = "erdma.alibabacloud.com/tainted-devices";
/// The node label choosing the resource API (`--resource-api=node-label`).
pub const NODE_LABEL: &str = "erdma.alibabacloud.com/resource-api";
/// The node condition naming the resource API in use.
pub const CONDITION: &str = "ERdmaResourceAPI";

/// The field selector of the node's slices of the driver.
pub fn field_selector(node: &str) -> String {
    format!("spec.nodeName={node},spec.driver={DRIVER}")
}

/// True when the node serves eRDMA devices through DRA: its `ERdmaResourceAPI` condition says so
/// (reason `DRA` or `DRAFeatureGatesOff`) or its label asks for it.
pub fn is_dra_node(n: &Node) -> bool {
    let labelled = n
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(NODE_LABEL))
        .is_some_and(|v| v == "dra");
    let condition = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == CONDITION && c.reason.as_deref().is_some_and(|r| r.starts_with("DRA")));
    labelled || condition
}

fn gate_hint(gates: &[&str]) -> String {
    format!(
        "turn on {} in kube-apiserver's --feature-gates (and kube-scheduler's, kube-controller-manager's; on by default from Kubernetes 1.36), or run erdma on the device plugin on this cluster; the agent writes the slice again within 5 minutes and reports it in /healthz (dra.dropped_fields) and erdma_dra_dropped_fields",
        gates
            .iter()
            .map(|g| format!("{g}=true"))
            .collect::<Vec<_>>()
            .join(",")
    )
}

/// `node.dra.slice`: the node's slices of the driver (as listed with [`field_selector`]) hold
/// every field erdma writes.
pub fn slice_check(node: &str, slices: &[ResourceSlice]) -> Check {
    const ID: &str = "node.dra.slice";
    let ours: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.driver == DRIVER && s.spec.node_name.as_deref() == Some(node))
        .collect();
    if ours.is_empty() {
        return Check::warn(
            ID,
            format!("node {node} has no ResourceSlice of {DRIVER}"),
            "the agent on a DRA node publishes it: read its /healthz (erdmactl doctor --local on the node) or its log; it needs list, watch, create, update and delete on resource.k8s.io resourceslices (chart dra.enabled)",
        );
    }
    let mut capacity = Vec::new();
    let mut taints = Vec::new();
    let mut count = 0;
    for s in &ours {
        let tainted: Vec<&str> = s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_TAINTED))
            .map(|v| v.split(',').filter(|d| !d.is_empty()).collect())
            .unwrap_or_default();
        for d in s.spec.devices.iter().flatten() {
            count += 1;
            let policies = d
                .capacity
                .as_ref()
                .is_none_or(|c| c.values().all(|c| c.request_policy.is_some()));
            if d.allow_multiple_allocations.is_none() || !policies {
                capacity.push(d.name.clone());
            }
            if tainted.contains(&d.name.as_str()) && d.taints.as_ref().is_none_or(Vec::is_empty) {
                taints.push(d.name.clone());
            }
        }
    }
    let names: Vec<&str> = ours
        .iter()
        .filter_map(|s| s.metadata.name.as_deref())
        .collect();
    let mut lost = Vec::new();
    let mut gates = Vec::new();
    if !capacity.is_empty() {
        lost.push(format!(
            "allowMultipleAllocations/requestPolicy of {} (DRAConsumableCapacity off: each device is allocated whole to one claim)",
            capacity.join(", ")
        ));
        gates.push("DRAConsumableCapacity");
    }
    if !taints.is_empty() {
        lost.push(format!(
            "the taints of {} (DRADeviceTaints off: an unhealthy device stays allocatable)",
            taints.join(", ")
        ));
        gates.push("DRADeviceTaints");
    }
    if lost.is_empty() {
        return Check::pass(
            ID,
            format!(
                "ResourceSlice {} of node {node}: {count} devices stored with consumable capacity and their taints",
                names.join(", ")
            ),
        );
    }
    Check::warn(
        ID,
        format!(
            "ResourceSlice {} of node {node}: the API server dropped {}",
            names.join(", "),
            lost.join("; ")
        ),
        gate_hint(&gates),
    )
}

/// `node.dra.extended_resource`: a DRA node has no `resource` in its `status.capacity` or
/// `status.allocatable`. The kubelet leaves a device plugin's resource there when the plugin goes
/// (at 0 after its grace period), and the scheduler takes a node with the key, even at 0, for a
/// device-plugin node of that resource: pods asking it are never served there through the
/// DeviceClass's `extendedResourceName` and stay Pending.
pub fn extended_resource_check(n: &Node, node: &str, resource: &str) -> Check {
    const ID: &str = "node.dra.extended_resource";
    let status = n.status.as_ref();
    let value = |m: Option<&std::collections::BTreeMap<String, _>>| {
        m.and_then(|m| m.get(resource))
            .map(|q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| q.0.clone())
    };
    let capacity = value(status.and_then(|s| s.capacity.as_ref()));
    let allocatable = value(status.and_then(|s| s.allocatable.as_ref()));
    if capacity.is_none() && allocatable.is_none() {
        return Check::pass(
            ID,
            format!(
                "node {node} has no {resource} in its status: the scheduler serves pods asking {resource} there through DRA"
            ),
        );
    }
    let path = resource.replace('~', "~0").replace('/', "~1");
    let ops: Vec<String> = [("capacity", &capacity), ("allocatable", &allocatable)]
        .iter()
        .filter(|(_, v)| v.is_some())
        .map(|(m, _)| format!("{{\"op\":\"remove\",\"path\":\"/status/{m}/{path}\"}}"))
        .collect();
    Check::fail(
        ID,
        format!(
            "node {node} serves eRDMA devices through DRA but its status still has {resource} (capacity {}, allocatable {}), left by the device plugin: the scheduler takes it for a device-plugin node of {resource}, so every pod asking {resource} stays Pending here",
            capacity.as_deref().unwrap_or("absent"),
            allocatable.as_deref().unwrap_or("absent"),
        ),
        format!(
            "the agent in DRA mode removes it once the kubelet let the device plugin go (up to 5 minutes after the plugin stopped; its log and the Event DevicePluginResourceRemoved say so), provided it may patch nodes/status; if it stays, check that no device plugin of {resource} still runs on the node, then remove it: kubectl patch node {node} --subresource=status --type=json -p '[{}]'",
            ops.join(",")
        ),
    )
}

/// `node.dra.deviceclass`: the driver's DeviceClass carries `extendedResourceName` (pods asking
/// `resource` are served through DRA on DRA nodes).
pub fn class_check(class: Option<&DeviceClass>, resource: &str) -> Check {
    const ID: &str = "node.dra.deviceclass";
    let Some(c) = class else {
        return Check::warn(
            ID,
            format!("DeviceClass {DRIVER} not found"),
            "install the chart with dra.enabled (or erdmactl install with dra.enabled): claims name the DeviceClass",
        );
    };
    match c.spec.extended_resource_name.as_deref() {
        Some(name) => Check::pass(
            ID,
            format!("DeviceClass {DRIVER}: pods asking {name} are served through DRA on DRA nodes"),
        ),
        None => Check::warn(
            ID,
            format!(
                "DeviceClass {DRIVER} has no extendedResourceName: pods asking {resource} are not served on DRA nodes, only ResourceClaims are (the API server drops the field while DRAExtendedResource is off)"
            ),
            "turn on DRAExtendedResource=true in kube-apiserver's and kube-scheduler's --feature-gates (on by default from Kubernetes 1.36, GA in 1.37), then apply the chart again (helm upgrade, or erdmactl install): the field was dropped when the class was written; until then give DRA pods a ResourceClaim, or keep pods asking the extended resource on device-plugin nodes",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Status;
    use k8s_openapi::api::resource::v1::{
        CapacityRequestPolicy, Device, DeviceCapacity, DeviceClassSpec, DeviceTaint, ResourcePool,
        ResourceSliceSpec,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    fn device(name: &str, stored_capacity: bool, taint: bool) -> Device {
        Device {
            name: name.into(),
            allow_multiple_allocations: stored_capacity.then_some(true),
            capacity: Some(BTreeMap::from([(
                "shares".to_string(),
                DeviceCapacity {
                    value: Quantity("200".into()),
                    request_policy: stored_capacity.then(CapacityRequestPolicy::default),
                },
            )])),
            taints: taint.then(|| {
                vec![DeviceTaint {
                    key: "erdma.alibabacloud.com/unhealthy".into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }
    }

    fn slice(devices: Vec<Device>, tainted: Option<&str>) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some("n1-erdma.alibabacloud.com".into()),
                annotations: tainted
                    .map(|t| BTreeMap::from([(ANNOTATION_TAINTED.to_string(), t.to_string())])),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: DRIVER.into(),
                node_name: Some("n1".into()),
                pool: ResourcePool {
                    name: "n1".into(),
                    generation: 1,
                    resource_slice_count: 1,
                },
                devices: Some(devices),
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_slice_stored_as_written_passes() {
        let c = slice_check(
            "n1",
            &[slice(
                vec![
                    device("erdma-0", true, false),
                    device("erdma-1", true, true),
                ],
                Some("erdma-1"),
            )],
        );
        assert_eq!(c.status, Status::Pass, "{c:?}");
        assert!(c.message.contains("2 devices"), "{}", c.message);
    }

    #[test]
    fn dropped_fields_name_their_gates_and_devices() {
        let c = slice_check(
            "n1",
            &[slice(
                vec![
                    device("erdma-0", false, false),
                    device("erdma-1", false, false),
                ],
                Some("erdma-1"),
            )],
        );
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.message.contains("allowMultipleAllocations/requestPolicy of erdma-0, erdma-1 (DRAConsumableCapacity off")
                && c.message.contains("the taints of erdma-1 (DRADeviceTaints off"),
            "{}",
            c.message
        );
        let hint = c.hint.unwrap_or_default();
        assert!(
            hint.contains("DRAConsumableCapacity=true,DRADeviceTaints=true"),
            "{hint}"
        );
        // Only the taint missing: only that gate.
        let c = slice_check(
            "n1",
            &[slice(vec![device("erdma-1", true, false)], Some("erdma-1"))],
        );
        assert!(
            !c.message.contains("DRAConsumableCapacity"),
            "{}",
            c.message
        );
        assert!(c.message.contains("DRADeviceTaints off"), "{}", c.message);
    }

    #[test]
    fn no_slice_of_the_node_is_a_warning() {
        let mut other = slice(vec![], None);
        other.spec.node_name = Some("n2".into());
        let c = slice_check("n1", &[other]);
        assert_eq!(c.status, Status::Warn);
        assert!(c.message.contains("no ResourceSlice"), "{}", c.message);
    }

    #[test]
    fn a_device_class_without_extended_resource_name_names_the_gate() {
        let mut class = DeviceClass {
            metadata: ObjectMeta {
                name: Some(DRIVER.into()),
                ..Default::default()
            },
            spec: DeviceClassSpec::default(),
        };
        let c = class_check(Some(&class), "aliyun/erdma");
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.message
                .contains("pods asking aliyun/erdma are not served")
                && c.hint
                    .as_deref()
                    .is_some_and(|h| h.contains("DRAExtendedResource=true")),
            "{c:?}"
        );
        class.spec.extended_resource_name = Some("aliyun/erdma".into());
        assert_eq!(
            class_check(Some(&class), "aliyun/erdma").status,
            Status::Pass
        );
        assert_eq!(class_check(None, "aliyun/erdma").status, Status::Warn);
    }

    #[test]
    fn a_dra_node_with_the_device_plugins_resource_left_in_its_status_fails() {
        use k8s_openapi::api::core::v1::NodeStatus;
        let list = |erdma: Option<&str>| {
            let mut m = BTreeMap::from([("cpu".to_string(), Quantity("4".into()))]);
            if let Some(q) = erdma {
                m.insert("aliyun/erdma".to_string(), Quantity(q.into()));
            }
            Some(m)
        };
        let mut n = Node {
            status: Some(NodeStatus {
                capacity: list(Some("0")),
                allocatable: list(Some("0")),
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = extended_resource_check(&n, "n1", "aliyun/erdma");
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.message
                .contains("still has aliyun/erdma (capacity 0, allocatable 0)"),
            "{}",
            c.message
        );
        let hint = c.hint.unwrap_or_default();
        assert!(
            hint.contains(r#"kubectl patch node n1 --subresource=status --type=json -p '[{"op":"remove","path":"/status/capacity/aliyun~1erdma"},{"op":"remove","path":"/status/allocatable/aliyun~1erdma"}]'"#),
            "{hint}"
        );
        n.status = Some(NodeStatus {
            capacity: list(Some("2")),
            allocatable: list(None),
            ..Default::default()
        });
        let c = extended_resource_check(&n, "n1", "aliyun/erdma");
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.message.contains("(capacity 2, allocatable absent)"),
            "{}",
            c.message
        );
        assert!(!c.hint.unwrap_or_default().contains("/status/allocatable/"));
        n.status = Some(NodeStatus {
            capacity: list(None),
            allocatable: list(None),
            ..Default::default()
        });
        assert_eq!(
            extended_resource_check(&n, "n1", "aliyun/erdma").status,
            Status::Pass
        );
    }

    #[test]
    fn dra_nodes_by_condition_or_label() {
        use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
        let mut n = Node::default();
        assert!(!is_dra_node(&n));
        n.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: CONDITION.into(),
                status: "True".into(),
                reason: Some("DRAFeatureGatesOff".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert!(is_dra_node(&n));
        let mut l = Node::default();
        l.metadata.labels = Some(BTreeMap::from([(
            NODE_LABEL.to_string(),
            "dra".to_string(),
        )]));
        assert!(is_dra_node(&l));
    }
}
