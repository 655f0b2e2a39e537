//! Doors to the node.
//!
//! Every way erdma touches the host goes through a small trait here, with one real implementation
//! and, behind the `fake` feature, one fake for tests (the device-plugin directory needs no fake: a
//! temporary directory with real sockets is the test double). Nothing else in the workspace reads host
//! files or calls host APIs directly.

pub mod addrs;
pub mod devfs;
pub mod plugin_dir;
pub mod rooted;
pub mod sysfs;

#[cfg(feature = "fake")]
pub mod fake;
#[cfg(feature = "fake")]
pub mod fixtures;

pub use addrs::{InterfaceAddrs, LiveInterfaceAddrs, NoInterfaceAddrs};
pub use devfs::{DevFs, DevNode, RootedDevFs};
pub use sysfs::{RootedSysfs, Sysfs, SysfsError};
