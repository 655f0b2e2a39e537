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

/// Errors of this crate; messages name the object and the fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was attempted, naming the object.
        what: String,
        /// The client error.
        source: kube::Error,
    },
    /// A watch failed (the watch is retried with back-off).
    #[error("{what}: {message}")]
    Watch {
        /// What was watched.
        what: String,
        /// The watcher's error.
        message: String,
    },
    /// Serialisation of a manifest failed.
    #[error("serialising: {0}")]
    Serialize(String),
    /// Invalid input (options, objects), with the fix.
    #[error("{0}")]
    Invalid(String),
}
