//! The inventory snapshot of one node.

use crate::device::{CharDevice, RdmaDevice};
use crate::health::Finding;
use serde::Serialize;

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
