//! Protocol mode detection and its cross-checks.

use erdma_model::{DeviceKind, DeviceMode, Finding, GidType, LinkLayer, NodeType, Port};

/// Decides a device's mode from the `erdma` module parameter (eRDMA only), the node type and the
/// link layer, and reports disagreements between them as findings.
pub(crate) fn detect(
    kind: &DeviceKind,
    compat_mode_param: Option<bool>,
    node_type: Option<NodeType>,
    ports: &[Port],
    findings: &mut Vec<Finding>,
) -> Option<DeviceMode> {
    let link_layer = ports.first().and_then(|p| p.link_layer.clone());
    let from_node_type = match node_type {
        Some(NodeType::Rnic) => Some(DeviceMode::Iwarp),
        Some(NodeType::Ca) if link_layer == Some(LinkLayer::Infiniband) => {
            Some(DeviceMode::Infiniband)
        }
        Some(NodeType::Ca) => Some(DeviceMode::Roce),
        _ => None,
    };
    let from_param = match (kind, compat_mode_param) {
        (DeviceKind::Erdma, Some(true)) => Some(DeviceMode::Roce),
        (DeviceKind::Erdma, Some(false)) => Some(DeviceMode::Iwarp),
        _ => None,
    };
    let mode = from_param.or(from_node_type);
    if let (Some(p), Some(n)) = (from_param, from_node_type)
        && p != n
    {
        findings.push(Finding::warning(format!(
            "mode mismatch: erdma module parameter compat_mode={} means {p}, but node_type says {n}; \
             the module was probably reloaded without re-probing the device: reload the erdma module \
             (rmmod erdma; modprobe erdma compat_mode={}) when no pod uses it",
            if compat_mode_param == Some(true) { "Y" } else { "N" },
            if p == DeviceMode::Roce { "Y" } else { "N" },
        )));
    }
    if mode == Some(DeviceMode::Roce) && *kind == DeviceKind::Erdma {
        let v1 = ports
            .iter()
            .flat_map(|p| &p.gids)
            .filter(|g| g.gid_type == Some(GidType::IbRoceV1))
            .count();
        let v2 = ports
            .iter()
            .flat_map(|p| &p.gids)
            .filter(|g| g.gid_type == Some(GidType::RoceV2))
            .count();
        if v1 > 0 && v2 == 0 {
            findings.push(Finding::warning(
                "mode mismatch: RoCE-compat eRDMA should have RoCE v2 GIDs, but every typed GID is IB/RoCE v1",
            ));
        }
    }
    if mode.is_none() {
        findings.push(Finding::warning(
            "protocol mode unknown: node_type unreadable and no erdma compat_mode parameter",
        ));
    }
    mode
}
