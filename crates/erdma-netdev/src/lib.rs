//! ERI netdev setup (the original's `EnsureNetDevice`, seed-system.md §9), done with rtnetlink.
//!
//! For each selected ERI that is not the primary ENI: link up, MTU (jumbo frames when asked,
//! `--jumbo-frame-mtu`, 8500 when ≤ 0), the ENI's primary IPv4 address from the instance metadata
//! service (IMDSv2), a scope-link subnet route and a default route whose metrics are one more than
//! any other link's route to the same destination (at least 200), so the primary ENI always wins.
//!
//! * the ENI addressing comes through erdma-cloud's [`Metadata`] trait (real client:
//!   `erdma_cloud::imds::ImdsClient`);
//! * [`plan`](mod@plan): pure planning of [`Change`] values from the kernel's [`NetState`];
//! * [`RouteNetlink`]: reads the state and applies the changes, in any network namespace.

mod netlink;
pub mod plan;

pub use erdma_cloud::imds::{EniAddressing, Metadata, MetadataError};
pub use netlink::{EriSetup, NetdevError, RouteNetlink};
pub use plan::{
    Change, DEFAULT_JUMBO_MTU, EriNetdev, METRIC_FLOOR, NetState, PlanError, jumbo_mtu,
    route_metric,
};
