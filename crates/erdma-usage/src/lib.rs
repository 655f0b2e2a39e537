//! Per-pod RDMA usage, read from the kernel and attributed to pods.
//!
//! **What it reads.** The kernel tracks every RDMA object, whatever the driver (`erdma`, `mlx5`,
//! Soft-RoCE `rxe` alike: the core's resource tracking, `drivers/infiniband/core/restrack.c`), and
//! reports them over RDMA netlink (`NETLINK_RDMA`, the "nldev" client, as `rdma resource show`
//! reads them): queue pairs with their state and type, memory regions with the bytes they pin,
//! completion queues and protection domains, each with the PID that created it (or the kernel
//! user's name), and each port's hardware counters (`rdma statistic`, sysfs `hw_counters/`).
//! Nothing needs the driver's cooperation or a device opened by us, so the same code reads eRDMA
//! on a node and `rxe` in the lab.
//!
//! **Why.** Which pod holds how many QPs in which state, how much memory it pins, and whose a
//! device's traffic is, are what `erdmactl top`, the agent's metrics and doctor's verdicts need
//! (issue 32): this crate is that foundation, with no Kubernetes or RPC dependency.
//!
//! - [`nldev`]: the request encoder and the answer parser (bounded, never panics).
//! - [`source`]: the [`source::UsageSource`] door, the netlink implementation with a receive
//!   timeout, a fake, and [`source::Snapshot`].
//! - [`cgroup`]: a PID's pod and container from `/proc/<pid>/cgroup`.
//! - [`sysfs`]: a port's `hw_counters/` and `counters/` from sysfs.
//! - [`attribution`]: usage per pod and device, and whose each device's traffic is (a pod's only
//!   when it is the device's only holder; never a made-up split).
pub mod attribution;
pub mod cgroup;
pub mod nldev;
pub mod source;
pub mod sysfs;

pub use attribution::{PidPods, PodDevices, Traffic, Usage, attribute};
pub use cgroup::{ContainerId, PodUid};
pub use nldev::{
    CqEntry, DeviceEntry, MrEntry, Owner, PdEntry, PortCounters, QpEntry, QpState, QpType,
};
pub use source::{FakeSource, NetlinkSource, Snapshot, UsageError, UsageSource};
