//! Node RDMA device inventory.
//!
//! [`Inventory::scan`] reads sysfs and `/dev` through the doors of `erdma-host` and returns an
//! immutable [`NodeDevices`] snapshot. It never fails as a whole: every unreadable or malformed
//! value becomes a [`erdma_model::Finding`] on the device (or the node), and a device that cannot
//! be used carries the reasons in its [`erdma_model::Health`].
//!
//! The walk, per device, is: identity (driver, PCI function, kind) → attributes → ports and GIDs →
//! protocol mode → paired netdev → character devices → health.

mod chardev;
pub mod events;
mod identity;
mod mode;
mod netdev;
mod node;
mod ports;
mod read;

use erdma_host::{DevFs, InterfaceAddrs, Sysfs};
use erdma_model::NodeDevices;
use std::sync::Arc;

pub use node::DEVICE_CLASS;

/// The doors the inventory reads through.
#[derive(Clone)]
pub struct Sources {
    /// sysfs (`/sys` or a fixture tree).
    pub sysfs: Arc<dyn Sysfs>,
    /// The dev directory (`/dev` or a fixture tree).
    pub devfs: Arc<dyn DevFs>,
    /// Interface addresses of this network namespace (use `NoInterfaceAddrs` for fixtures).
    pub addrs: Arc<dyn InterfaceAddrs>,
}

/// Scans a node's RDMA devices.
#[derive(Clone)]
pub struct Inventory {
    sources: Sources,
}

impl Inventory {
    /// An inventory reading through `sources`.
    pub fn new(sources: Sources) -> Self {
        Inventory { sources }
    }

    /// Takes a snapshot of every RDMA device.
    pub fn scan(&self) -> NodeDevices {
        node::scan(&self.sources)
    }

    /// Re-reads only what changes at run time (port states, netdev operstate, char-device presence)
    /// for the devices of `previous`, and recomputes their health. Falls back to a full
    /// [`Inventory::scan`] when the set of devices, the erdma module mode or a device's uverbs
    /// mapping may have changed. About 5 reads per device instead of ~100: cheap enough to poll.
    pub fn refresh(&self, previous: &NodeDevices) -> NodeDevices {
        node::refresh(&self.sources, previous).unwrap_or_else(|| self.scan())
    }

    /// Forgets the attributes the health re-read keeps open, so that the next re-read opens them
    /// by path again. Call it after a link or device event: a netdev renamed, or deleted and
    /// another created under its name, keeps its open attributes but not its path.
    pub fn reopen_attributes(&self) {
        self.sources.sysfs.close_rereads();
    }

    /// `previous` after a link message showed netdev `netdev` down (see
    /// [`events::DownLinks`]): every healthy device on it becomes unhealthy ("netdev … is down"),
    /// without reading anything, as the live link state would have it. Never makes a device
    /// healthy, and leaves unhealthy devices as they are: the re-read that follows tells the
    /// whole truth. `None` when no healthy device is on `netdev`.
    pub fn link_down(previous: &NodeDevices, netdev: &str) -> Option<NodeDevices> {
        node::link_down(previous, netdev)
    }
}
