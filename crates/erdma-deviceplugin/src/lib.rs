//! The kubelet device plugin for `aliyun/erdma`.
//!
//! - [`config`]: resource name, socket name (stable, `…-erdma.sock`), slots, modes.
//! - [`devices`]: the served devices and the ListAndWatch message (`"<ibdev>/<i>"` slots with the
//!   device's NUMA node, omitted when unknown).
//! - [`service`]: the `v1beta1.DevicePlugin` service (options, ListAndWatch, preferred
//!   allocation, Allocate with validation, PreStartContainer).
//! - [`runner`]: serve-before-register, kubelet-restart detection, backoff, graceful shutdown.
//! - [`metrics`]: Prometheus metrics, registered in the process's one registry.
//! - [`cdi`]: the CDI spec file of CDI mode.
//! - [`coexistence`]: evidence that another plugin serves the same resource on the node.

pub mod cdi;
pub mod coexistence;
pub mod config;
pub mod devices;
mod dirwatch;
pub mod metrics;
pub mod podresources;
pub mod runner;
pub mod service;

pub use config::{CdiConfig, PluginConfig};
pub use metrics::Metrics;
pub use runner::{Plugin, PluginError};
pub use service::{NoopPreStart, PreStartHook};
