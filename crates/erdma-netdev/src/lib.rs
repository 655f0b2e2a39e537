//! ERI netdev setup (the original's `EnsureNetDevice`, seed-system.md §9), done with rtnetlink.
//!
//! For each selected ERI that is not the primary ENI: link up, MTU (jumbo frames when asked,
//! `--jumbo-frame-mtu`, 8500 when ≤ 0), the ENI's primary IPv4 address from the instance metadata
//! service (IMDSv2), a scope-link subnet route and a default route whose metrics are one more than
//! any other link's route to the same destination (at least 200), so the primary ENI always wins.
//!
//! * [`metadata`]: the metadata-service client ([`ImdsClient`]) behind the [`Metadata`] trait;
//! * [`emulator`]: a local metadata-service emulator serving the same paths and formats;
//! * [`plan`](mod@plan): pure planning of [`Change`] values from the kernel's [`NetState`];
//! * [`RouteNetlink`]: reads the state and applies the changes, in any network namespace.

pub mod emulator;
pub mod metadata;
mod netlink;
pub mod plan;

pub use metadata::{EniAddressing, ImdsClient, Metadata, MetadataError};
pub use netlink::{EriSetup, NetdevError, RouteNetlink};
pub use plan::{
    Change, DEFAULT_JUMBO_MTU, EriNetdev, METRIC_FLOOR, NetState, PlanError, jumbo_mtu,
    route_metric,
};
