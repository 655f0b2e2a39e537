//! DRA (Dynamic Resource Allocation, `resource.k8s.io/v1`) kubelet plugin for eRDMA.
//!
//! - [`slice`]: the pure mapping inventory → ResourceSlice devices: one device per eRDMA device
//!   (same [`erdma_model::DeviceSelection`] rules as the device plugin), attributes, consumable
//!   capacity (`shares`, `hcaHandle`, `hcaObject`; KEP-5075) with `allowMultipleAllocations`, and
//!   a device taint (KEP-5055) instead of vanishing when a device is unhealthy.
//! - [`publish`]: keeps this node's ResourceSlice in the API server equal to the mapping
//!   (create / update on change, stale slices of this driver on this node removed), and reads
//!   back from the stored slice which fields the API server dropped ([`readback`]: the feature
//!   gates that are off).
//! - [`claims`]: NodePrepareResources / NodeUnprepareResources: reads a claim by GET, keeps its
//!   allocation results of this driver on this node ([`allocation`]: subrequests, admin access,
//!   opaque configuration refused), checks them against the inventory and the device's capacity,
//!   writes a per-claim CDI spec
//!   ([`cdi`]) and records the claim in a checkpoint file ([`checkpoint`], appended by
//!   [`journal`]) so repeated calls and restarts of the kubelet or the agent are idempotent.
//! - [`server`]: the plugin-watcher registration socket and the DRA service socket.
//!
//! Driver name: `erdma.alibabacloud.com` ([`erdma_model::names::DRA_DRIVER`]) — the domain of
//! the eRDMA product's owner, the same domain as erdma's CRD group (`network.alibabacloud.com`),
//! and distinct from dranet's `dra.net`, so both can run on one cluster without claiming each
//! other's devices. The env and CDI types of the per-claim specs are erdma-model's
//! ([`erdma_model::container`], [`erdma_model::cdi`]), shared with the device plugin; errors are
//! in [`error`].

pub mod allocation;
pub mod cdi;
pub mod checkpoint;
pub mod claims;
pub mod config;
pub mod error;
pub mod health;
pub mod journal;
pub mod publish;
pub mod readback;
pub mod server;
pub mod slice;

pub use claims::Driver;
pub use config::{CapacityModel, DraConfig};
pub use error::{DraError, Result};
