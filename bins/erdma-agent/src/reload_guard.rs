//! The driver reload guard's view of DRA claims when the kubelet does not report them.
//!
//! The guard refuses a driver reload while pods hold the devices, asking the kubelet's
//! pod-resources `List`. A kubelet with its feature gate `KubeletPodResourcesDynamicResources`
//! off answers without `dynamic_resources`: every DRA pod then looks like it holds nothing, and a
//! node full of running RDMA pods would look idle. The DRA driver's own record of the claims it
//! prepared (its checkpoint) says otherwise; while it holds claims and the kubelet names none,
//! the node is taken as busy and the reload is refused (an error naming the claims and the fix).

use erdma_driver::{PodResourceUsage, UsageError};
use erdma_kubelet::podresources::{Held, Holder};
use std::path::PathBuf;

/// [`PodResourceUsage`] that also counts the DRA driver's prepared claims.
#[derive(Debug, Clone)]
pub struct WithPreparedClaims<U> {
    /// The kubelet's answer.
    pub inner: U,
    /// The DRA driver's checkpoint (`<kubelet root>/plugins/<driver>/checkpoint.json`).
    pub checkpoint: PathBuf,
}

/// The claims the DRA driver's checkpoint records as prepared, `namespace/name`; none when the
/// file does not exist. An unreadable or corrupt file is an error (the guard then refuses).
pub fn prepared_claims(checkpoint: &std::path::Path) -> Result<Vec<String>, String> {
    let text = match std::fs::read(checkpoint) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("read {}: {e}", checkpoint.display())),
    };
    let cp = erdma_dra::checkpoint::Checkpoint::parse(&text)
        .map_err(|e| format!("parse {}: {e}", checkpoint.display()))?;
    Ok(cp
        .claims
        .values()
        .map(|c| format!("{}/{}", c.namespace, c.name))
        .collect())
}

impl<U: PodResourceUsage> PodResourceUsage for WithPreparedClaims<U> {
    async fn holders(&self, held: &Held) -> Result<Vec<Holder>, UsageError> {
        let holders = self.inner.holders(held).await?;
        if held.dra_driver.is_none() || holders.iter().any(|h| !h.claimed.is_empty()) {
            return Ok(holders);
        }
        let error = |detail: String| {
            UsageError {
            resource: held.to_string(),
            detail,
            fix: "turn on the kubelet's feature gate KubeletPodResourcesDynamicResources so that it reports the pods' claims, or delete the pods using these claims; the reload stays refused while the DRA driver has prepared claims".into(),
        }
        };
        match prepared_claims(&self.checkpoint) {
            Ok(claims) if claims.is_empty() => Ok(holders),
            Ok(claims) => Err(error(format!(
                "the kubelet's pod-resources answer names no DRA claim, but the DRA driver has {} prepared claim(s) ({}) in {}: the kubelet does not report claims",
                claims.len(),
                claims.join(", "),
                self.checkpoint.display()
            ))),
            Err(e) => Err(error(format!(
                "the kubelet's pod-resources answer names no DRA claim and the DRA driver's record of prepared claims cannot be read: {e}"
            ))),
        }
    }
}
