//! The agents' node-scope ValidatingAdmissionPolicy and its binding (the chart's
//! `agent-admission-policy.yaml`): RBAC cannot name "the caller's node", so the agent's
//! ClusterRole grants patch on every Node; this policy, keyed on the node claim of the agent
//! pod's bound token, lets each agent change only its own Node (erdma's labels and conditions,
//! and the removal of the device plugin's resource), its node's ResourceSlices and ERdmaDevice.
//! Rendered where the API server serves the kind (Kubernetes 1.30+) and
//! `agent.admissionPolicy.enabled`.

use super::*;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation, Variable,
};

/// The policy's and binding's name: `<release>-agent-node-scope`.
pub fn node_scope_name(v: &Values) -> String {
    format!("{}-agent-node-scope", v.name)
}

/// Whether the policy is rendered for `cluster`.
pub fn renders_node_scope(v: &Values, cluster: &Cluster) -> bool {
    v.agent.admission_policy.enabled && cluster.serves(VALIDATING_ADMISSION_POLICY)
}

/// Node status fields the agent never writes: each must stay as it was (conditions, capacity
/// and allocatable have rules of their own).
const UNTOUCHED_STATUS: [&str; 9] = [
    "phase",
    "addresses",
    "daemonEndpoints",
    "nodeInfo",
    "images",
    "volumesInUse",
    "volumesAttached",
    "config",
    "runtimeHandlers",
];

/// `(name, CEL)` of the policy's variables, in order (later ones use earlier ones).
const VARIABLES: [(&str, &str); 17] = [
    (
        "nodeName",
        "has(request.userInfo.extra) && 'authentication.kubernetes.io/node-name' in request.userInfo.extra && size(request.userInfo.extra['authentication.kubernetes.io/node-name']) == 1 ? request.userInfo.extra['authentication.kubernetes.io/node-name'][0] : ''",
    ),
    (
        "isNode",
        "request.resource.group == '' && request.resource.resource == 'nodes'",
    ),
    ("isSlice", "request.resource.group == 'resource.k8s.io'"),
    (
        "isDevice",
        "request.resource.group == 'network.alibabacloud.com'",
    ),
    // The node labels the agent writes (erdma-driver's LABEL_DRIVER_*).
    (
        "erdmaLabels",
        "['erdma.alibabacloud.com/driver-mode', 'erdma.alibabacloud.com/driver-ready', 'erdma.alibabacloud.com/driver-pending-mode']",
    ),
    // The node conditions the agent writes.
    (
        "erdmaConditions",
        "['ERdmaDriverReady', 'ERdmaDevicePluginConflict', 'ERdmaResourceAPI']",
    ),
    // The device plugin's resource, which the agent removes once its node moved to DRA.
    ("erdmaResource", "'aliyun/erdma'"),
    (
        "newLabels",
        "object != null && has(object.metadata.labels) ? object.metadata.labels : {}",
    ),
    (
        "oldLabels",
        "oldObject != null && has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}",
    ),
    (
        "newStatus",
        "variables.isNode && has(object.status) ? object.status : {}",
    ),
    (
        "oldStatus",
        "variables.isNode && has(oldObject.status) ? oldObject.status : {}",
    ),
    (
        "newOtherConditions",
        "has(variables.newStatus.conditions) ? variables.newStatus.conditions.filter(c, !(c.type in variables.erdmaConditions)) : []",
    ),
    (
        "oldOtherConditions",
        "has(variables.oldStatus.conditions) ? variables.oldStatus.conditions.filter(c, !(c.type in variables.erdmaConditions)) : []",
    ),
    (
        "newCapacity",
        "has(variables.newStatus.capacity) ? variables.newStatus.capacity : {}",
    ),
    (
        "oldCapacity",
        "has(variables.oldStatus.capacity) ? variables.oldStatus.capacity : {}",
    ),
    (
        "newAllocatable",
        "has(variables.newStatus.allocatable) ? variables.newStatus.allocatable : {}",
    ),
    (
        "oldAllocatable",
        "has(variables.oldStatus.allocatable) ? variables.oldStatus.allocatable : {}",
    ),
];

/// `(CEL that must hold, CEL of the denial's message)`, in order.
fn validations() -> Vec<(String, &'static str)> {
    let untouched = UNTOUCHED_STATUS
        .iter()
        .map(|f| {
            format!(
                "has(variables.newStatus.{f}) == has(variables.oldStatus.{f}) && (!has(variables.newStatus.{f}) || variables.newStatus.{f} == variables.oldStatus.{f})"
            )
        })
        .collect::<Vec<_>>()
        .join(" && ");
    vec![
        (
            "variables.nodeName != ''".into(),
            "'erdma agent ' + request.userInfo.username + ': its token carries no node claim (authentication.kubernetes.io/node-name), so erdma cannot tell which node it runs on and denies ' + request.operation + ' of ' + request.resource.resource + ' ' + request.name + '; fix: run the agent with a projected service account token on Kubernetes >= 1.30 (feature ServiceAccountTokenPodNodeInfo on), or set agent.admissionPolicy.enabled=false'",
        ),
        (
            "!variables.isNode || request.name == variables.nodeName".into(),
            "'erdma agent of node ' + variables.nodeName + ' may not change Node ' + request.name + ' (an agent writes only its own Node)'",
        ),
        (
            "!variables.isNode || (variables.newLabels.all(k, k in variables.erdmaLabels || (k in variables.oldLabels && variables.oldLabels[k] == variables.newLabels[k])) && variables.oldLabels.all(k, k in variables.erdmaLabels || k in variables.newLabels))".into(),
            "'erdma agent of node ' + variables.nodeName + ' may change only the labels erdma.alibabacloud.com/driver-mode, driver-ready and driver-pending-mode of Node ' + request.name",
        ),
        (
            "!variables.isNode || ((has(object.metadata.annotations) ? object.metadata.annotations : {}) == (has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}) && (has(object.metadata.finalizers) ? object.metadata.finalizers : []) == (has(oldObject.metadata.finalizers) ? oldObject.metadata.finalizers : []) && (has(object.metadata.ownerReferences) ? object.metadata.ownerReferences : []) == (has(oldObject.metadata.ownerReferences) ? oldObject.metadata.ownerReferences : []) && (has(object.spec) ? object.spec : {}) == (has(oldObject.spec) ? oldObject.spec : {}))".into(),
            "'erdma agent of node ' + variables.nodeName + ' may not change the annotations, finalizers, owners or spec (taints included) of Node ' + request.name",
        ),
        (
            "!variables.isNode || variables.newOtherConditions == variables.oldOtherConditions"
                .into(),
            "'erdma agent of node ' + variables.nodeName + ' may change only the conditions ERdmaDriverReady, ERdmaDevicePluginConflict and ERdmaResourceAPI of Node ' + request.name",
        ),
        (
            "!variables.isNode || (variables.newCapacity.all(k, k in variables.oldCapacity && variables.oldCapacity[k] == variables.newCapacity[k]) && variables.oldCapacity.all(k, k == variables.erdmaResource || k in variables.newCapacity) && variables.newAllocatable.all(k, k in variables.oldAllocatable && variables.oldAllocatable[k] == variables.newAllocatable[k]) && variables.oldAllocatable.all(k, k == variables.erdmaResource || k in variables.newAllocatable))".into(),
            "'erdma agent of node ' + variables.nodeName + ' may only remove ' + variables.erdmaResource + ' from the capacity and allocatable of Node ' + request.name",
        ),
        (
            format!("!variables.isNode || ( {untouched})"),
            "'erdma agent of node ' + variables.nodeName + ' may not change the status of Node ' + request.name + ' beyond its conditions and the removal of ' + variables.erdmaResource",
        ),
        (
            "!variables.isSlice || ((object == null || (has(object.spec.nodeName) && object.spec.nodeName == variables.nodeName)) && (oldObject == null || (has(oldObject.spec.nodeName) && oldObject.spec.nodeName == variables.nodeName)))".into(),
            "'erdma agent of node ' + variables.nodeName + ' may write only ResourceSlices whose spec.nodeName is its node; denied: ' + request.operation + ' of ResourceSlice ' + request.name",
        ),
        (
            "!variables.isDevice || ('alibabacloud.com/nodename' in variables.oldLabels && variables.oldLabels['alibabacloud.com/nodename'] == variables.nodeName && 'alibabacloud.com/nodename' in variables.newLabels && variables.newLabels['alibabacloud.com/nodename'] == variables.nodeName)".into(),
            "'erdma agent of node ' + variables.nodeName + ' may write only the ERdmaDevice labelled alibabacloud.com/nodename=' + variables.nodeName + '; denied: ERdmaDevice ' + request.name",
        ),
    ]
}

fn resource_rule(group: &str, operations: &[&str], resources: &[&str]) -> NamedRuleWithOperations {
    let strings = |s: &[&str]| Some(s.iter().map(|x| x.to_string()).collect());
    NamedRuleWithOperations {
        api_groups: strings(&[group]),
        api_versions: strings(&[if group.is_empty() { "v1" } else { "*" }]),
        operations: strings(operations),
        resources: strings(resources),
        ..Default::default()
    }
}

/// The policy: the agent's own requests only (its ServiceAccount's username), denied unless
/// each validation holds.
pub fn node_scope_policy(v: &Values) -> ValidatingAdmissionPolicy {
    ValidatingAdmissionPolicy {
        metadata: meta(&node_scope_name(v), None, labels(v, "agent")),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![
                    resource_rule("", &["UPDATE"], &["nodes", "nodes/status"]),
                    resource_rule(
                        "resource.k8s.io",
                        &["CREATE", "UPDATE", "DELETE"],
                        &["resourceslices"],
                    ),
                    resource_rule(
                        "network.alibabacloud.com",
                        &["UPDATE"],
                        &["erdmadevices", "erdmadevices/status"],
                    ),
                ]),
                ..Default::default()
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "erdma-agent".into(),
                expression: format!(
                    "request.userInfo.username == 'system:serviceaccount:{}:{}'",
                    v.namespace,
                    v.agent_sa()
                ),
            }]),
            variables: Some(
                VARIABLES
                    .iter()
                    .map(|(name, expression)| Variable {
                        name: name.to_string(),
                        expression: expression.to_string(),
                    })
                    .collect(),
            ),
            validations: Some(
                validations()
                    .into_iter()
                    .map(|(expression, message)| Validation {
                        expression,
                        message_expression: Some(message.into()),
                        reason: Some("Forbidden".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The binding: the policy for every request it matches, denials enforced.
pub fn node_scope_binding(v: &Values) -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata: meta(&node_scope_name(v), None, labels(v, "agent")),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(node_scope_name(v)),
            validation_actions: Some(vec!["Deny".into()]),
            ..Default::default()
        }),
    }
}
