//! Doors to the node.
//!
//! The device side of the node: sysfs, `/dev` and interface addresses, each behind a small trait
//! with one real implementation and, behind the `fake` feature, one fake for tests (the
//! device-plugin directory needs no fake: a temporary directory with real sockets is the test
//! double). Inventory and health read the node only through these. Other host access has its own
//! door in the crate that owns the concern: kernel modules and the driver installer
//! (`erdma-driver`'s `Host`), SMC netlink, namespaces, sysctls and the BPF policy (`erdma-smc`),
//! routes and addresses (`erdma-netdev`); the agent's flag parsing and the lab read a few `/proc`
//! files directly. [`atomic`] replaces files (and sockets) without a reader ever seeing a part.
//! [`watched`] gives sysfs attribute reads a time limit (a stuck driver never
//! answers one). [`cgroup`] tells the host's cgroup version and writes v1 `rdma.max` files.
//! [`resident`] gives the process's start-up pages back to the kernel; `logs` (feature `logs`)
//! sets up every binary's logs on stderr; `http` (feature `http`) serves their HTTP endpoints.

pub mod addrs;
pub mod atomic;
pub mod cgroup;
pub mod devfs;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "logs")]
pub mod logs;
pub mod plugin_dir;
pub mod resident;
pub mod rooted;
#[cfg(feature = "socket-watch")]
pub mod socket_watch;
pub mod sysfs;
pub mod watched;

#[cfg(feature = "fake")]
pub mod fake;
#[cfg(feature = "fake")]
pub mod fixtures;

pub use addrs::{InterfaceAddrs, LiveInterfaceAddrs, NoInterfaceAddrs};
pub use cgroup::{CgroupFs, CgroupLayout, CgroupVersion, RootedCgroupFs};
pub use devfs::{DevFs, DevNode, RootedDevFs};
pub use sysfs::{RootedSysfs, Sysfs, SysfsError};
pub use watched::WatchedSysfs;
