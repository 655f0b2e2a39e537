//! Another device plugin serving `aliyun/erdma` on a node: from the agent's node condition, and on
//! the node itself from the sockets in the kubelet's device-plugin directory.

use crate::check::Check;
use erdma_model::coexistence::{self, Conflict, Evidence};
use k8s_openapi::api::core::v1::Node;

/// `deviceplugin.conflict` from the `ERdmaDevicePluginConflict` node condition the agent sets.
pub fn node(node: &Node) -> Check {
    const ID: &str = "deviceplugin.conflict";
    let n = node.metadata.name.as_deref().unwrap_or("?");
    let cond = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == coexistence::CONDITION_TYPE));
    let Some(c) = cond else {
        return Check::skip(
            ID,
            format!(
                "node {n} has no {} condition (the agent has not looked yet, or is older)",
                coexistence::CONDITION_TYPE
            ),
        );
    };
    let message = c.message.clone().unwrap_or_default();
    match c.status.as_str() {
        "False" => Check::pass(ID, format!("node {n}: {message}")),
        "True" => {
            // The agent writes "<what was seen> Fix: <how>".
            let (seen, fix) = message
                .split_once(" Fix: ")
                .unwrap_or((message.as_str(), "find the other device plugin serving aliyun/erdma on this node and let only one serve it"));
            Check::fail(ID, format!("node {n}: {seen}"), fix)
        }
        other => Check::warn(
            ID,
            format!(
                "node {n}: {} is {other:?}: {message}",
                coexistence::CONDITION_TYPE
            ),
            "read the agent log on that node",
        ),
    }
}

/// `local.device-plugins`: the sockets found in `dir` (name, whether something listens), or why
/// the directory could not be read.
pub fn local(dir: &str, sockets: Result<Vec<(String, bool)>, String>) -> Check {
    const ID: &str = "local.device-plugins";
    let sockets = match sockets {
        Ok(s) => s,
        Err(e) => {
            return Check::skip(
                ID,
                format!("cannot read {dir}: {e} (run on the node as root, or pass --kubelet-dir)"),
            );
        }
    };
    let mut live = Vec::new();
    let mut stale = Vec::new();
    for (name, listening) in sockets {
        if let Some(plugin) = coexistence::classify_socket(&name, "") {
            if listening {
                live.push(Evidence::Socket { file: name, plugin });
            } else {
                stale.push(format!("{name} ({})", plugin.describe()));
            }
        }
    }
    if !live.is_empty() {
        let c = Conflict { evidence: live };
        return Check::fail(ID, c.message("aliyun/erdma"), c.fix("aliyun/erdma"));
    }
    if !stale.is_empty() {
        return Check::warn(
            ID,
            format!(
                "{dir} holds stale sockets of other aliyun/erdma plugins that nobody serves: {}",
                stale.join(", ")
            ),
            "harmless while nothing listens on them; delete them to keep the directory clear",
        );
    }
    Check::pass(
        ID,
        format!("no other device plugin for aliyun/erdma in {dir}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Status;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};

    fn with_condition(status: &str, message: &str) -> Node {
        Node {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("n1".into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "ERdmaDevicePluginConflict".into(),
                    status: status.into(),
                    message: Some(message.into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn node_condition_true_fails_with_the_agents_fix() {
        let c = node(&with_condition(
            "True",
            "another device plugin serves aliyun/erdma on this node: terway. Fix: set enable_erdma false",
        ));
        assert_eq!(c.status, Status::Fail);
        assert!(c.message.contains("terway"), "{c:?}");
        assert_eq!(c.hint.as_deref(), Some("set enable_erdma false"));
        assert_eq!(node(&with_condition("False", "alone")).status, Status::Pass);
        assert_eq!(node(&Node::default()).status, Status::Skip);
    }

    #[test]
    fn local_sockets_live_stale_and_unrelated() {
        let c = local(
            "/d",
            Ok(vec![
                ("1700000000-erdma-eni.sock".into(), true),
                ("kubelet.sock".into(), true),
            ]),
        );
        assert_eq!(c.status, Status::Fail);
        assert!(c.message.contains("terway"), "{c:?}");
        assert!(
            c.hint
                .as_deref()
                .is_some_and(|f| f.contains("enable_erdma"))
        );
        let c = local("/d", Ok(vec![("1600000000-erdma.sock".into(), false)]));
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.message.contains("original alibabacloud-erdma-agent"),
            "{c:?}"
        );
        let c = local(
            "/d",
            Ok(vec![("erdma-aliyun_erdma-erdma.sock".into(), true)]),
        );
        assert_eq!(c.status, Status::Pass);
        assert_eq!(local("/d", Err("denied".into())).status, Status::Skip);
    }
}
