//! The Kubernetes side of erdma (kube-rs): the `ERdmaDevice` CRD with the original's fields, the
//! binaries' clients and their request deadlines ([`client`]), the agent's view of the CRD
//! ([`agent`]), shared names ([`labels`]), typed install manifests ([`install`]) and, with the
//! `fake` feature, an in-memory API server for tests ([`fake`]) and RBAC evaluated as the API
//! server does ([`rbac`]).
//!
//! This library does not pick a k8s-openapi version feature; binaries do.

pub mod agent;
pub mod client;
pub mod crd;
#[cfg(feature = "fake")]
pub mod dial_guard;
mod error;
pub mod events;
#[cfg(feature = "fake")]
pub mod fake;
pub mod install;
pub mod labels;
#[cfg(feature = "fake")]
pub mod rbac;
pub mod yaml;

pub use crd::{
    DeviceInfo, DeviceState, DeviceStatus, ERdmaDevice, ERdmaDeviceSpec, ERdmaDeviceStatus,
};
pub use error::Error;
