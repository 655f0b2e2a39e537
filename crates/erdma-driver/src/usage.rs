//! Who holds the devices: asked before any disruptive driver action.

use serde::Serialize;
use std::fmt;
use std::future::Future;

/// The extended resource erdma serves.
pub const RESOURCE_NAME: &str = "aliyun/erdma";

/// A container that has devices of the resource allocated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Device IDs it holds.
    pub device_ids: Vec<String>,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} (container {})",
            self.namespace, self.pod, self.container
        )
    }
}

/// The usage could not be determined.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot tell which pods hold {resource}: {detail}. Fix: {fix}")]
pub struct UsageError {
    /// The resource asked about.
    pub resource: String,
    /// What went wrong.
    pub detail: String,
    /// What an operator can do about it.
    pub fix: String,
}

/// Which containers hold a resource (real implementation: kubelet pod-resources `List`).
pub trait PodResourceUsage: Send + Sync + 'static {
    /// Containers that have at least one device of `resource` allocated.
    fn holders(
        &self,
        resource: &str,
    ) -> impl Future<Output = Result<Vec<Holder>, UsageError>> + Send;
}

impl<T: PodResourceUsage> PodResourceUsage for std::sync::Arc<T> {
    fn holders(
        &self,
        resource: &str,
    ) -> impl Future<Output = Result<Vec<Holder>, UsageError>> + Send {
        (**self).holders(resource)
    }
}
