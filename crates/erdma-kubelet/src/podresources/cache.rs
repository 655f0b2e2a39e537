//! Who holds which device, owned once per process: [`Holders`] keeps the kubelet's pod-resources
//! answer (the device plugin's extended resource in `devices`, the DRA driver's devices in
//! `dynamic_resources`, as its [`Held`] says) and publishes it as an immutable [`Snapshot`] on a
//! `tokio::sync::watch` channel. Its refresher ([`Holders::refresh_on_poke`], or
//! [`Holders::start`] which spawns it) is the only code that asks the kubelet; it asks
//!
//! - once at start,
//! - [`POKE_DELAY`] after each [`Holders::poke`] (the device plugin's `Allocate`, the DRA driver's
//!   `NodePrepareResources`: the kubelet records an allocation right after the answer),
//! - when the kubelet's pod-resources socket is created again (a kubelet restart; inotify on its
//!   directory, and the socket's inode compared at every safety refresh),
//! - every [`SAFETY_REFRESH`] (pods deleted since, a missed event), sooner while it fails,
//! - when a reader needs an answer newer than its question ([`Holders::fresh`]).
//!
//! Readers do no pod-resources I/O: they read [`Holders::snapshot`] or [`Holders::subscribe`];
//! one that must see a refresh already asked for (a poke pending) waits for it, bounded
//! ([`Holders::settled`]). Concurrent refreshes share one `List` call. Without a running refresher
//! (tests, a one-shot tool) [`Holders::fresh`] makes the call itself through the owner's one
//! connection and publishes it the same way.

use super::client::{Held, Holder, ListError, PodResourcesClient, TIMEOUT};
use erdma_host::socket_watch::SocketWatch;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long after a poke the refresher asks the kubelet: the kubelet records an allocation right
/// after the plugin's `Allocate` answer, not before it.
pub const POKE_DELAY: Duration = Duration::from_millis(20);

/// How often the refresher asks when nothing else made it ask: pods deleted since (no poke
/// tells), a kubelet restart the socket watch missed.
pub const SAFETY_REFRESH: Duration = Duration::from_secs(10);

/// The first wait after a failed refresh (doubling up to [`SAFETY_REFRESH`]).
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(500);

/// How long after the socket was created the refresher asks (the kubelet binds it a moment
/// before it listens).
pub const SOCKET_SETTLE: Duration = Duration::from_millis(50);

/// How long [`Holders::fresh`] waits for its answer: connecting and the call ([`TIMEOUT`] each),
/// and a second.
pub const FRESH_WITHIN: Duration = Duration::from_secs(2 * TIMEOUT.as_secs() + 1);

/// How long [`Holders::pod`] waits for a refresh already asked for (a poke after an allocation)
/// before it asks for one of its own.
pub const SETTLE_WITHIN: Duration = Duration::from_millis(300);

/// One published state of who holds which device. Immutable: a new one replaces it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The holders of the last answer (kept when a later attempt failed; empty before any).
    pub holders: Arc<Vec<Holder>>,
    /// When the kubelet gave `holders`; `None` when it never answered.
    pub answered: Option<Instant>,
    /// Why the last attempt failed (`holders` are then from an older answer, if any).
    pub error: Option<ListError>,
    /// Counts attempts: a higher one is newer (0: none yet).
    pub generation: u64,
    /// The asks made before this attempt began: it answers all of them.
    served: u64,
}

impl Snapshot {
    fn empty() -> Self {
        Snapshot {
            holders: Arc::new(Vec::new()),
            answered: None,
            error: None,
            generation: 0,
            served: 0,
        }
    }

    /// Whether the kubelet has answered at least once.
    pub fn is_answered(&self) -> bool {
        self.answered.is_some()
    }

    /// The containers of pod `namespace/name` that hold devices.
    pub fn of_pod(&self, namespace: &str, name: &str) -> Vec<Holder> {
        self.holders
            .iter()
            .filter(|h| h.namespace == namespace && h.pod == name)
            .cloned()
            .collect()
    }

    /// Container `container` of pod `namespace/pod`, when it holds devices.
    pub fn of_container(&self, namespace: &str, pod: &str, container: &str) -> Option<&Holder> {
        self.holders
            .iter()
            .find(|h| h.namespace == namespace && h.pod == pod && h.container == container)
    }

    /// The first container that holds any of the extended resource's `device_ids`.
    pub fn holding(&self, device_ids: &[String]) -> Option<&Holder> {
        self.holders
            .iter()
            .find(|h| h.device_ids.iter().any(|id| device_ids.contains(id)))
    }
}

/// An ask for a refresh: `seq` counts them, `urgent` is the last one that wants no delay.
#[derive(Debug, Clone, Copy, Default)]
struct Asks {
    seq: u64,
    urgent: u64,
}

/// Where an answer about a pod came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    /// The published snapshot had the pod (possibly after waiting for a pending refresh).
    Kept,
    /// It did not: a refresh was asked for and waited for.
    Kubelet,
}

/// The one owner of the pod-resources answer about one [`Held`].
#[derive(Debug)]
pub struct Holders {
    client: PodResourcesClient,
    held: Held,
    published: watch::Sender<Arc<Snapshot>>,
    asks: watch::Sender<Asks>,
    /// Serializes `List` calls; a caller that waited here reuses the answer that came meanwhile.
    in_flight: tokio::sync::Mutex<()>,
    /// Refresher loops running now.
    refreshers: AtomicUsize,
}

/// The name agent wiring knows the owner by.
pub type HolderCache = Holders;

impl Holders {
    /// The owner of `client`'s answers about `held`; nothing is asked until its refresher runs
    /// ([`Self::refresh_on_poke`]) or a reader needs a fresh answer. The first answer counts as
    /// asked for: [`Self::settled`] waits for it.
    pub fn new(client: PodResourcesClient, held: Held) -> Arc<Self> {
        Arc::new(Holders {
            client,
            held,
            published: watch::channel(Arc::new(Snapshot::empty())).0,
            asks: watch::channel(Asks { seq: 1, urgent: 1 }).0,
            in_flight: tokio::sync::Mutex::new(()),
            refreshers: AtomicUsize::new(0),
        })
    }

    /// [`Self::new`] with its refresher spawned until `cancel` fires.
    pub fn start(client: PodResourcesClient, held: Held, cancel: CancellationToken) -> Arc<Self> {
        let h = Self::new(client, held);
        tokio::spawn(h.clone().refresh_on_poke(cancel));
        h
    }

    /// What counts as holding.
    pub fn held(&self) -> &Held {
        &self.held
    }

    /// The pod-resources socket asked.
    pub fn socket(&self) -> &Path {
        self.client.socket()
    }

    /// The owner's client, for the calls it does not keep (`GetAllocatableResources`): one
    /// connection for every pod-resources question of the process.
    pub fn client(&self) -> &PodResourcesClient {
        &self.client
    }

    /// The published snapshot now (no I/O, no wait).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.published.borrow().clone()
    }

    /// Every snapshot as it is published.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.published.subscribe()
    }

    /// The last answer, if the kubelet ever gave one.
    pub fn kept(&self) -> Option<Snapshot> {
        let s = self.snapshot();
        s.is_answered().then(|| (*s).clone())
    }

    fn ask(&self, urgent: bool) -> u64 {
        let mut seq = 0;
        self.asks.send_modify(|a| {
            a.seq += 1;
            if urgent {
                a.urgent = a.seq;
            }
            seq = a.seq;
        });
        seq
    }

    fn running(&self) -> bool {
        self.refreshers.load(Ordering::SeqCst) > 0
    }

    /// Asks for a refresh soon (after an allocation): the refresher makes it [`POKE_DELAY`]
    /// later; pokes that come meanwhile share it.
    pub fn poke(&self) {
        self.ask(false);
    }

    /// The published snapshot once the refreshes asked for before this call are published
    /// (a poke after an allocation, the first answer), waiting at most `within`; at once when none
    /// is pending or no refresher runs. No I/O.
    pub async fn settled(&self, within: Duration) -> Arc<Snapshot> {
        let asked = self.asks.borrow().seq;
        let now = self.snapshot();
        if now.served >= asked || !self.running() {
            return now;
        }
        let mut rx = self.published.subscribe();
        match tokio::time::timeout(within, rx.wait_for(|s| s.served >= asked)).await {
            Ok(Ok(s)) => s.clone(),
            _ => self.snapshot(),
        }
    }

    /// A snapshot the kubelet answered after this call began, waiting at most `within`: the
    /// refresher makes the call at once (shared with concurrent askers), or, when none runs, this
    /// call makes it on the owner's connection. The error of a failed attempt, or of no answer in
    /// time.
    pub async fn fresh_within(&self, within: Duration) -> Result<Arc<Snapshot>, ListError> {
        let asked = self.ask(true);
        let late = || ListError::Call {
            call: "List",
            socket: self.socket().to_path_buf(),
            detail: format!("no answer within {within:?}"),
        };
        let s = if self.running() {
            let mut rx = self.published.subscribe();
            match tokio::time::timeout(within, rx.wait_for(|s| s.served >= asked)).await {
                Ok(Ok(s)) => s.clone(),
                _ => return Err(late()),
            }
        } else {
            tokio::time::timeout(within, self.attempt(asked))
                .await
                .map_err(|_| late())?
        };
        match &s.error {
            Some(e) => Err(e.clone()),
            None => Ok(s),
        }
    }

    /// The holders of an answer the kubelet gave after this call began ([`Self::fresh_within`]
    /// with [`FRESH_WITHIN`]).
    pub async fn fresh(&self) -> Result<Arc<Vec<Holder>>, ListError> {
        Ok(self.fresh_within(FRESH_WITHIN).await?.holders.clone())
    }

    /// The containers of pod `namespace/name` that hold devices: from the published snapshot when
    /// it has the pod (after waiting up to [`SETTLE_WITHIN`] for a pending refresh), else from a
    /// fresh one (empty when the pod holds none).
    pub async fn pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<(Vec<Holder>, Answered), ListError> {
        let found = self.snapshot().of_pod(namespace, name);
        if !found.is_empty() {
            return Ok((found, Answered::Kept));
        }
        let found = self.settled(SETTLE_WITHIN).await.of_pod(namespace, name);
        if !found.is_empty() {
            return Ok((found, Answered::Kept));
        }
        let s = self.fresh_within(FRESH_WITHIN).await?;
        Ok((s.of_pod(namespace, name), Answered::Kubelet))
    }

    /// One `List` answering every ask up to `asked`, unless a published one already does; the
    /// result is published.
    async fn attempt(&self, asked: u64) -> Arc<Snapshot> {
        let _turn = self.in_flight.lock().await;
        let now = self.snapshot();
        if now.served >= asked && now.generation > 0 {
            return now;
        }
        let serving = self.asks.borrow().seq;
        let answer = self.client.list(&self.held).await;
        let mut published = None;
        self.published.send_modify(|cur| {
            let next = match answer {
                Ok(holders) => Snapshot {
                    holders: Arc::new(holders),
                    answered: Some(Instant::now()),
                    error: None,
                    generation: cur.generation + 1,
                    served: serving,
                },
                Err(e) => Snapshot {
                    holders: cur.holders.clone(),
                    answered: cur.answered,
                    error: Some(e),
                    generation: cur.generation + 1,
                    served: serving,
                },
            };
            *cur = Arc::new(next);
            published = Some(cur.clone());
        });
        published.unwrap_or_else(|| self.snapshot())
    }

    /// The refresher: asks the kubelet at start, [`POKE_DELAY`] after each poke, at once for
    /// [`Self::fresh`], when the socket is created again, and every [`SAFETY_REFRESH`] (sooner
    /// while failing), until `cancel` fires. A failed refresh is published (its error) and logged
    /// at debug.
    pub async fn refresh_on_poke(self: Arc<Self>, cancel: CancellationToken) {
        struct Running<'a>(&'a AtomicUsize);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.refreshers.fetch_add(1, Ordering::SeqCst);
        let _running = Running(&self.refreshers);
        let mut asks = self.asks.subscribe();
        let mut watch = SocketWatch::new(self.socket(), "pod-resources socket");
        let mut inode = socket_id(self.socket());
        let mut retry = RETRY_AFTER_FAILURE;
        loop {
            let asked = asks.borrow_and_update().seq;
            let s = self.attempt(asked).await;
            let wait = match &s.error {
                None => {
                    retry = RETRY_AFTER_FAILURE;
                    SAFETY_REFRESH
                }
                Some(e) => {
                    tracing::debug!("pod-resources refresh: {e}");
                    let w = retry;
                    retry = (retry * 2).min(SAFETY_REFRESH);
                    w
                }
            };
            let served = s.served;
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    r = asks.changed() => {
                        if r.is_err() {
                            return;
                        }
                        let a = *asks.borrow();
                        if a.seq <= served {
                            continue;
                        }
                        if a.urgent <= served {
                            // a poke: the kubelet records the allocation after the answer
                            tokio::select! {
                                _ = cancel.cancelled() => return,
                                _ = tokio::time::sleep(POKE_DELAY) => {}
                            }
                        }
                    }
                    _ = watch.created() => {
                        tracing::debug!(socket = %self.socket().display(), "pod-resources socket created; refreshing");
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            _ = tokio::time::sleep(SOCKET_SETTLE) => {}
                        }
                        self.ask(true);
                    }
                    _ = tokio::time::sleep(wait) => {
                        let now = socket_id(self.socket());
                        if now != inode {
                            tracing::debug!(socket = %self.socket().display(), "pod-resources socket replaced; refreshing");
                            inode = now;
                        }
                        self.ask(false);
                    }
                }
                break;
            }
        }
    }
}

/// Identity of a file (device, inode).
fn socket_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}
