//! Who holds which device, kept: the last pod-resources answer, refreshed when asked for a fresh
//! one, when a pod is asked about that the answer does not have yet, and shortly after an
//! allocation ([`HolderCache::poke`]). Concurrent refreshes share one `List` call.
//!
//! A hook on a runtime's clock (NRI `RunPodSandbox`) asks [`HolderCache::pod`]: a pod admitted
//! after an allocation is usually in the kept answer already (the refresher ran after its
//! `Allocate`), so the hook does no I/O; a pod that is not costs one `List`. A caller that must not
//! act on an old answer (the driver-reload guard) asks [`HolderCache::fresh`].

use super::client::{Held, Holder, ListError, PodResourcesClient};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How long after a poke the refresher asks the kubelet: the kubelet records an allocation right
/// after the plugin's `Allocate` answer, not before it.
pub const POKE_DELAY: Duration = Duration::from_millis(20);

/// One pod-resources answer.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The holders in it.
    pub holders: Arc<Vec<Holder>>,
    /// When the kubelet answered.
    pub taken: Instant,
    /// Counts answers: a higher one is newer.
    pub generation: u64,
}

/// Where an answer about a pod came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    /// The kept answer had the pod: no call.
    Kept,
    /// The kept answer did not have the pod: one `List` call.
    Kubelet,
}

/// The kept pod-resources answer of one [`Held`].
#[derive(Debug)]
pub struct HolderCache {
    client: PodResourcesClient,
    held: Held,
    last: Mutex<Option<Snapshot>>,
    /// Serializes `List` calls; a caller that waited here reuses the answer that came meanwhile.
    in_flight: tokio::sync::Mutex<()>,
    poked: Notify,
}

impl HolderCache {
    /// A cache of `client`'s answers about `held`; nothing is asked until someone needs it.
    pub fn new(client: PodResourcesClient, held: Held) -> Arc<Self> {
        Arc::new(HolderCache {
            client,
            held,
            last: Mutex::new(None),
            in_flight: tokio::sync::Mutex::new(()),
            poked: Notify::new(),
        })
    }

    /// What counts as holding.
    pub fn held(&self) -> &Held {
        &self.held
    }

    /// The pod-resources socket asked.
    pub fn socket(&self) -> &std::path::Path {
        self.client.socket()
    }

    /// The kept answer, if any.
    pub fn kept(&self) -> Option<Snapshot> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn generation(&self) -> u64 {
        self.kept().map_or(0, |s| s.generation)
    }

    /// An answer the kubelet gave after this call began: one `List`, shared with concurrent
    /// callers.
    pub async fn fresh(&self) -> Result<Arc<Vec<Holder>>, ListError> {
        let before = self.generation();
        let _turn = self.in_flight.lock().await;
        if let Some(s) = self.kept().filter(|s| s.generation > before) {
            return Ok(s.holders);
        }
        let holders = Arc::new(self.client.list(&self.held).await?);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let generation = last.as_ref().map_or(0, |s| s.generation) + 1;
        *last = Some(Snapshot {
            holders: holders.clone(),
            taken: Instant::now(),
            generation,
        });
        Ok(holders)
    }

    /// The containers of pod `namespace/name` that hold devices: from the kept answer when it
    /// has the pod, else from a fresh one (empty when the pod holds none).
    pub async fn pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<(Vec<Holder>, Answered), ListError> {
        let of_pod = |all: &[Holder]| -> Vec<Holder> {
            all.iter()
                .filter(|h| h.namespace == namespace && h.pod == name)
                .cloned()
                .collect()
        };
        if let Some(s) = self.kept() {
            let found = of_pod(&s.holders);
            if !found.is_empty() {
                return Ok((found, Answered::Kept));
            }
        }
        let all = self.fresh().await?;
        Ok((of_pod(&all), Answered::Kubelet))
    }

    /// Asks for a refresh soon (after an allocation): [`Self::refresh_on_poke`] makes it.
    pub fn poke(&self) {
        self.poked.notify_one();
    }

    /// Refreshes [`POKE_DELAY`] after each poke until `cancel` fires; pokes that come while one
    /// is pending share its refresh. A failed refresh is logged and leaves the kept answer.
    pub async fn refresh_on_poke(self: Arc<Self>, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.poked.notified() => {}
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(POKE_DELAY) => {}
            }
            if let Err(e) = self.fresh().await {
                tracing::debug!("pod-resources refresh after an allocation: {e}");
            }
        }
    }
}
