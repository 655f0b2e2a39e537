//! Who holds the devices: asked before any disruptive driver action.

use std::future::Future;

pub use erdma_model::names::RESOURCE as RESOURCE_NAME;

pub use erdma_kubelet::podresources::Holder;

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
