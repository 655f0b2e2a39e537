//! The RBAC rules of the controller and the agent (each justified in `docs/operations.md`).

use super::*;

pub(super) fn rule(
    groups: &[&str],
    resources: &[&str],
    verbs: &[&str],
    names: &[&str],
) -> PolicyRule {
    let s = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(s(groups)),
        resources: Some(s(resources)),
        verbs: s(verbs),
        resource_names: if names.is_empty() {
            None
        } else {
            Some(s(names))
        },
        ..Default::default()
    }
}

/// The controller's cluster-wide rules (each justified in `docs/operations.md`; that every one
/// is used, and nothing else is needed, is proven by `erdma-controller`'s `tests/rbac.rs`).
pub fn controller_cluster_rules() -> Vec<PolicyRule> {
    vec![
        rule(&[""], &["nodes"], &["get", "list", "watch"], &[]),
        rule(
            &["network.alibabacloud.com"],
            &["erdmadevices"],
            &["get", "list", "watch", "create", "patch", "delete"],
            &[],
        ),
        rule(
            &["network.alibabacloud.com"],
            &["erdmadevices/status"],
            &["patch"],
            &[],
        ),
        rule(&["events.k8s.io"], &["events"], &["create", "patch"], &[]),
        rule(
            &["admissionregistration.k8s.io"],
            &["mutatingwebhookconfigurations"],
            &["get", "update"],
            &[CONTROLLER_NAME],
        ),
    ]
}

/// The controller's rules in its namespace.
pub fn controller_namespace_rules() -> Vec<PolicyRule> {
    let cert = format!("{CONTROLLER_NAME}-webhook-tls");
    vec![
        rule(&["coordination.k8s.io"], &["leases"], &["create"], &[]),
        rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "update"],
            &["26dc1c71.alibabacloud.com"],
        ),
        // No `create`: RBAC cannot limit it by name, so the install creates this Secret (empty)
        // and the controller may only read and fill it.
        rule(&[""], &["secrets"], &["get", "update"], &[cert.as_str()]),
    ]
}

/// The agent's cluster-wide rules (proven exactly needed by `erdma-agent`'s `rbac_tests`).
pub fn agent_cluster_rules() -> Vec<PolicyRule> {
    vec![
        rule(
            &["network.alibabacloud.com"],
            &["erdmadevices"],
            &["list", "watch"],
            &[],
        ),
        rule(
            &["network.alibabacloud.com"],
            &["erdmadevices/status"],
            &["get", "patch"],
            &[],
        ),
        rule(&[""], &["nodes"], &["patch"], &[]),
        rule(&[""], &["nodes/status"], &["patch"], &[]),
        // patch: a repeated Event becomes a series on the first one (kube's Recorder).
        rule(&["events.k8s.io"], &["events"], &["create", "patch"], &[]),
    ]
}

/// The agent's extra cluster-wide rules with `dra.enabled` (proven by the RBAC-by-use tests): read
/// its Node (the `erdma.alibabacloud.com/resource-api` label), publish this node's ResourceSlice,
/// read each claim it prepares (get only: no watch of the cluster's claims, whose only field
/// selectors are name and namespace).
pub fn agent_dra_rules() -> Vec<PolicyRule> {
    vec![
        rule(&[""], &["nodes"], &["get"], &[]),
        rule(
            &["resource.k8s.io"],
            &["resourceslices"],
            &["list", "watch", "create", "update", "delete"],
            &[],
        ),
        rule(&["resource.k8s.io"], &["resourceclaims"], &["get"], &[]),
    ]
}
