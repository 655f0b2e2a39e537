//! Pure domain model of erdma.
//!
//! Everything here is plain data and pure functions: what an RDMA device, a port, a GID, a protocol
//! mode, a PNET ID or a device-plugin slot *is*, and the decisions that depend only on those values.
//! No module in this crate touches the file system, the network or the clock.

pub mod address;
pub mod allocation;
pub mod backoff;
pub mod cdi;
pub mod cgroup_path;
pub mod coexistence;
pub mod container;
pub mod device;
pub mod driver;
pub mod eri_selector;
pub mod health;
pub mod installer;
pub mod names;
pub mod node;
pub mod pnet;
pub mod port;
pub mod quantity;
pub mod rdma_limit;
pub mod selection;
pub mod settings;
pub mod slot;

pub use address::{MacAddr, NodeGuid};
pub use backoff::Backoff;
pub use device::{CharDevice, CharDevices, DeviceKind, NetDev, PciInfo, RdmaDevice};
pub use driver::{DeviceMode, DriverMode};
pub use eri_selector::EriSelector;
pub use health::{Finding, Health, Severity};
pub use node::{DeviceMemory, NodeDevices};
pub use pnet::PnetId;
pub use port::{Gid, GidType, LinkLayer, NodeType, PhysState, Port, PortState};
pub use selection::{DeviceSelection, Excluded};
pub use slot::SlotId;
