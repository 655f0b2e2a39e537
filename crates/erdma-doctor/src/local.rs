//! Local-mode checks on the node's own device inventory (`erdma_inventory::Inventory::scan`):
//! eRDMA devices present, their ports active, their char devices present, the mode.

use crate::check::Check;
use erdma_model::{DeviceKind, DeviceMode, NodeDevices};

/// Checks on a scanned inventory.
pub fn checks(node: &NodeDevices) -> Vec<Check> {
    let erdma: Vec<_> = node
        .devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Erdma)
        .collect();
    let mut out = Vec::new();
    if erdma.is_empty() {
        let others: Vec<_> = node.devices.iter().map(|d| d.name.as_str()).collect();
        out.push(Check::fail(
            "local.devices",
            format!(
                "no eRDMA device in /sys/class/infiniband{}",
                if others.is_empty() { String::new() } else { format!(" (other RDMA devices: {})", others.join(", ")) }
            ),
            "load the driver (lsmod | grep erdma; modprobe erdma) and check the instance has ERIs attached (ECS console or the \
             ERdmaDevice of this node)",
        ));
        return out;
    }
    let names: Vec<_> = erdma.iter().map(|d| d.name.as_str()).collect();
    out.push(Check::pass(
        "local.devices",
        format!("{} eRDMA device(s): {}", erdma.len(), names.join(", ")),
    ));
    for d in &erdma {
        let id = format!("local.{}", d.name);
        let mode = d.mode.map(|m| m.name()).unwrap_or("unknown");
        let state = d
            .first_port()
            .and_then(|p| p.state)
            .map(|s| s.name().to_string())
            .unwrap_or_else(|| "unknown".into());
        let netdev = d
            .netdev
            .as_ref()
            .map(|n| n.name.clone())
            .unwrap_or_else(|| "-".into());
        let uverbs = d.char_devices.uverbs.as_ref().map(|c| {
            if c.present {
                c.path.clone()
            } else {
                format!("{} (node missing)", c.path)
            }
        });
        let summary = format!(
            "mode {mode}, port 1 {state}, netdev {netdev}, uverbs {}",
            uverbs.as_deref().unwrap_or("missing")
        );
        let reasons = d.health.reasons();
        if !reasons.is_empty() {
            out.push(Check::fail(
                &id,
                format!("{}: {summary}: {}", d.name, reasons.join("; ")),
                "each reason above names its fix; erdmactl devices shows the full inventory",
            ));
        } else if d.mode == Some(DeviceMode::Iwarp) {
            out.push(Check::warn(
                &id,
                format!("{}: {summary}", d.name),
                "iWARP mode: SMC-R works, NCCL NET/IB does not; for NCCL use driver mode compat or ofed (RoCEv2)",
            ));
        } else {
            out.push(Check::pass(&id, format!("{}: {summary}", d.name)));
        }
    }
    let iwarp = erdma.iter().any(|d| d.mode == Some(DeviceMode::Iwarp));
    out.push(match (&node.rdma_cm, iwarp) {
        (Some(c), _) => Check::pass("local.rdma_cm", format!("{} present", c.path)),
        (None, true) => Check::fail(
            "local.rdma_cm",
            "/dev/infiniband/rdma_cm missing; iWARP connection setup needs it",
            "modprobe rdma_ucm on the host",
        ),
        (None, false) => Check::warn(
            "local.rdma_cm",
            "/dev/infiniband/rdma_cm missing (only rdma_cm applications need it in RoCE mode)",
            "modprobe rdma_ucm on the host if your application uses librdmacm",
        ),
    });
    out
}
