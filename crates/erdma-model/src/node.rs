//! The inventory snapshot of one node.

use crate::device::{CharDevice, RdmaDevice};
use crate::health::Finding;
use serde::Serialize;
use std::collections::BTreeMap;

/// Everything discovery found on a node at one moment. Immutable: a new scan makes a new value, and
/// consumers compare snapshots.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeDevices {
    /// RDMA devices, sorted by name.
    pub devices: Vec<RdmaDevice>,
    /// `/dev/infiniband/rdma_cm`, shared by all devices, when present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdma_cm: Option<CharDevice>,
    /// `compat_mode` of the loaded out-of-tree `erdma` module (`Some(true)` = `Y`), when readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub erdma_compat_mode: Option<bool>,
    /// Node-level findings (missing class directory, unreadable module parameter, …).
    pub findings: Vec<Finding>,
}

impl NodeDevices {
    /// An empty snapshot.
    pub fn empty() -> Self {
        NodeDevices {
            devices: Vec::new(),
            rdma_cm: None,
            erdma_compat_mode: None,
            findings: Vec::new(),
        }
    }

    /// The device with this name.
    pub fn device(&self, name: &str) -> Option<&RdmaDevice> {
        self.devices.iter().find(|d| d.name == name)
    }

    /// Devices that can be handed to pods now.
    pub fn usable(&self) -> impl Iterator<Item = &RdmaDevice> {
        self.devices.iter().filter(|d| d.health.is_healthy())
    }
}

/// Remembers every device served since start. A device that vanishes from the inventory (driver
/// unloaded, module reloading for a mode switch, device removed) stays advertised as Unhealthy, so
/// the kubelet keeps its capacity and stops allocating it (device plugin), or stays published with
/// a taint (DRA); it turns Healthy when it comes back.
#[derive(Debug, Default)]
pub struct DeviceMemory {
    known: BTreeMap<String, RdmaDevice>,
}

impl DeviceMemory {
    /// The snapshot plus every remembered device that is missing from it, marked unhealthy.
    pub fn merge(&mut self, node: &NodeDevices) -> NodeDevices {
        for d in &node.devices {
            self.known.insert(d.name.clone(), d.clone());
        }
        let mut out = node.clone();
        for (name, d) in &self.known {
            if node.device(name).is_none() {
                let mut gone = d.clone();
                gone.health = crate::Health::from_reasons(vec![format!(
                    "{name} is gone from the node (driver unloaded or device removed); it is served again when it reappears"
                )]);
                out.devices.push(gone);
            }
        }
        out.devices.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceKind;

    #[test]
    fn a_vanished_device_stays_unhealthy_until_it_returns() {
        let mut memory = DeviceMemory::default();
        let mut both = NodeDevices::empty();
        both.devices = vec![
            RdmaDevice::named("erdma_0", DeviceKind::Erdma),
            RdmaDevice::named("erdma_1", DeviceKind::Erdma),
        ];
        assert_eq!(memory.merge(&both), both);
        let mut one = NodeDevices::empty();
        one.devices = vec![RdmaDevice::named("erdma_1", DeviceKind::Erdma)];
        let merged = memory.merge(&one);
        let names: Vec<&str> = merged.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["erdma_0", "erdma_1"]);
        assert!(merged.devices[0].health.reasons()[0].contains("erdma_0 is gone"));
        assert!(merged.devices[1].health.is_healthy());
        assert_eq!(memory.merge(&both), both);
    }
}
