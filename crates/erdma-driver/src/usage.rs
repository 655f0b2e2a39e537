//! Who holds the devices: asked before any disruptive driver action.

use std::future::Future;

pub use erdma_model::names::RESOURCE as RESOURCE_NAME;

pub use erdma_kubelet::podresources::{Held, Holder};

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

/// Which containers hold the devices (real implementation: kubelet pod-resources `List`, which
/// lists both the device plugin's and the DRA driver's devices).
pub trait PodResourceUsage: Send + Sync + 'static {
    /// Containers that hold at least one device of `held`, by a fresh answer.
    fn holders(&self, held: &Held) -> impl Future<Output = Result<Vec<Holder>, UsageError>> + Send;
}

impl<T: PodResourceUsage> PodResourceUsage for std::sync::Arc<T> {
    fn holders(&self, held: &Held) -> impl Future<Output = Result<Vec<Holder>, UsageError>> + Send {
        (**self).holders(held)
    }
}
