//! The claim cache: this node's allocated ResourceClaims, fed by a watch of ResourceClaims, so
//! that `NodePrepareResources` reads a claim's allocation from memory instead of a GET to the
//! API server on the runtime's critical path.
//!
//! Only claims whose allocation has a result of this driver in this node's pool, that are
//! reserved for a consumer and not being deleted, are kept, and of each only its identity and
//! this driver's allocation results: memory stays proportional to this node's claims, not the
//! cluster's. Every other claim the watch reports is dropped at once.
//!
//! Correctness never depends on the watch: a lookup that misses (claim not seen yet, watch not
//! synced or broken, UID or name different, the UID fenced) falls back to the GET the driver
//! always made. Why a hit cannot prepare the wrong devices:
//! - the key is the claim's UID, which the API server never reuses, and the kubelet's namespace
//!   and name must match too; a claim deleted and re-created under the same name has a new UID
//!   and misses;
//! - the API server lets `status.allocation` be set once and only cleared, never changed, and
//!   not cleared while `status.reservedFor` names a consumer; the kubelet prepares only claims
//!   reserved for its pod. A cached, reserved object of that UID therefore carries the one
//!   allocation the claim has, unless it was deallocated and allocated again since the version
//!   the watch delivered;
//! - watch events of one resource arrive in resourceVersion order, so once the watch shows the
//!   claim deallocated (or allocated to another node), no older allocation can come back;
//! - a reallocation on this node after the claim was used here goes through our own
//!   `NodeUnprepareResources` first: unprepare fences the UID, and a fenced UID is answered by a
//!   GET until the watch shows it deallocated or deleted (the proof that what the cache holds
//!   next is newer than the allocation that was prepared);
//! - while the watch is not in sync (before its first complete list, after an error until the
//!   next list or event) every lookup misses.
//!
//! What remains is a watch connected but lagging by a whole cycle of one user-created claim
//! (unreserve, deallocate, allocate again on this node, reserve, bind, kubelet start) for a claim
//! whose earlier allocation here was never prepared: then the earlier allocation would be
//! prepared, with the devices the scheduler first chose on this node. Claims from
//! ResourceClaimTemplates are never reallocated (deleted with their pod); `--dra-claim-watch=false`
//! turns the cache off for operators who prefer a GET per prepare.

use erdma_kubelet::dra::v1 as api;
use futures::StreamExt;
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio_util::sync::CancellationToken;

/// The part of a claim the driver prepares from.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedClaim {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The allocation results of this driver (at least one in this node's pool).
    pub results: Vec<DeviceRequestAllocationResult>,
}

/// Counters and state for `/healthz`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// The watch runs (`--dra-claim-watch`).
    pub enabled: bool,
    /// The watch is in sync (listed, no error since).
    pub synced: bool,
    /// Claims held.
    pub claims: usize,
    /// Prepares answered from the cache.
    pub hits: u64,
    /// Prepares that fell back to a GET.
    pub misses: u64,
}

#[derive(Debug, Default)]
struct Inner {
    enabled: bool,
    synced: bool,
    claims: HashMap<String, Arc<CachedClaim>>,
    /// UIDs unprepared here and not seen deallocated since (answered by GET).
    fenced: HashSet<String>,
    /// The list in progress after [`Event::Init`], swapped in at [`Event::InitDone`].
    listing: Option<HashMap<String, Arc<CachedClaim>>>,
    /// UIDs seen in the list in progress (fences of others are dropped: those claims are gone).
    listed: HashSet<String>,
}

/// This node's allocated, reserved claims by UID. See the module documentation.
#[derive(Debug)]
pub struct ClaimCache {
    driver: String,
    pool: String,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// What the cache does with one version of a claim.
enum Verdict {
    /// Keep it (reserved, allocated here by this driver, not being deleted).
    Keep(CachedClaim),
    /// Allocated here but not usable now (unreserved or being deleted): drop, keep any fence.
    Drop,
    /// Not allocated to this driver on this node: drop, and lift a fence.
    Unrelated,
}

impl ClaimCache {
    /// An empty cache for `driver` on `pool`; not synced until a watch feeds it.
    pub fn new(driver: impl Into<String>, pool: impl Into<String>) -> Self {
        ClaimCache {
            driver: driver.into(),
            pool: pool.into(),
            inner: Mutex::new(Inner::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn verdict(&self, claim: &ResourceClaim) -> Verdict {
        let results: Vec<DeviceRequestAllocationResult> = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .map(|r| {
                r.iter()
                    .filter(|r| r.driver == self.driver)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if !results.iter().any(|r| r.pool == self.pool) {
            return Verdict::Unrelated;
        }
        let reserved = claim
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.as_ref())
            .is_some_and(|r| !r.is_empty());
        if !reserved || claim.metadata.deletion_timestamp.is_some() {
            return Verdict::Drop;
        }
        match (&claim.metadata.namespace, &claim.metadata.name) {
            (Some(ns), Some(name)) => Verdict::Keep(CachedClaim {
                namespace: ns.clone(),
                name: name.clone(),
                results,
            }),
            _ => Verdict::Drop,
        }
    }

    /// Takes one version of a claim from the watch (added or modified).
    pub fn apply(&self, claim: &ResourceClaim) {
        let Some(uid) = claim.metadata.uid.clone() else {
            return;
        };
        let verdict = self.verdict(claim);
        let mut inner = self.lock();
        let inner = &mut *inner;
        let listing = inner.listing.is_some();
        if listing {
            inner.listed.insert(uid.clone());
        }
        let target = inner.listing.as_mut().unwrap_or(&mut inner.claims);
        match verdict {
            Verdict::Keep(c) if !inner.fenced.contains(&uid) => {
                target.insert(uid, Arc::new(c));
            }
            Verdict::Keep(_) | Verdict::Drop => {
                target.remove(&uid);
            }
            Verdict::Unrelated => {
                target.remove(&uid);
                inner.fenced.remove(&uid);
            }
        }
    }

    /// Takes a deletion from the watch.
    pub fn delete(&self, claim: &ResourceClaim) {
        let Some(uid) = claim.metadata.uid.as_deref() else {
            return;
        };
        let mut inner = self.lock();
        inner.claims.remove(uid);
        if let Some(l) = inner.listing.as_mut() {
            l.remove(uid);
        }
        inner.fenced.remove(uid);
    }

    /// The watch (re)starts listing: lookups miss until [`ClaimCache::list_done`].
    pub fn list_started(&self) {
        let mut inner = self.lock();
        inner.synced = false;
        inner.listing = Some(HashMap::new());
        inner.listed.clear();
    }

    /// The list is complete: it replaces the cache and lookups may hit.
    pub fn list_done(&self) {
        let mut inner = self.lock();
        let inner = &mut *inner;
        if let Some(l) = inner.listing.take() {
            inner.claims = l;
        }
        let listed = std::mem::take(&mut inner.listed);
        inner.fenced.retain(|uid| listed.contains(uid));
        inner.synced = true;
    }

    /// The watch failed: lookups miss until it lists again or delivers an event.
    pub fn watch_failed(&self) {
        self.lock().synced = false;
    }

    /// The watch delivered an event after a failure (it resumed from the last resourceVersion,
    /// so nothing was lost): lookups may hit again.
    fn resumed(&self) {
        let mut inner = self.lock();
        if inner.listing.is_none() {
            inner.synced = true;
        }
    }

    /// Marks the cache as fed by a running watch (for [`CacheStats::enabled`]).
    pub fn set_enabled(&self, on: bool) {
        let mut inner = self.lock();
        inner.enabled = on;
        if !on {
            inner.synced = false;
        }
    }

    /// `claim`'s allocation results of this driver, when the cache holds the same UID, namespace
    /// and name and is in sync; counts the hit or miss.
    pub fn lookup(&self, claim: &api::Claim) -> Option<Arc<CachedClaim>> {
        let found = {
            let inner = self.lock();
            if !inner.enabled {
                return None;
            }
            inner
                .synced
                .then(|| inner.claims.get(&claim.uid))
                .flatten()
                .filter(|c| c.namespace == claim.namespace && c.name == claim.name)
                .cloned()
        };
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// The claim was unprepared on this node: forget it and answer it by GET until the watch
    /// shows it deallocated or deleted (see the module documentation).
    pub fn unprepared(&self, uid: &str) {
        let mut inner = self.lock();
        if !inner.enabled {
            return;
        }
        inner.claims.remove(uid);
        if let Some(l) = inner.listing.as_mut() {
            l.remove(uid);
        }
        inner.fenced.insert(uid.to_string());
    }

    /// True when the cache holds `uid` and is in sync (the driver has seen the claim).
    pub fn holds(&self, uid: &str) -> bool {
        let inner = self.lock();
        inner.synced && inner.claims.contains_key(uid)
    }

    /// Counters and state.
    pub fn stats(&self) -> CacheStats {
        let inner = self.lock();
        CacheStats {
            enabled: inner.enabled,
            synced: inner.synced,
            claims: inner.claims.len(),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }

    /// Feeds the cache from a watch of every ResourceClaim until `cancel` (list, then watch
    /// from its resourceVersion; errors back off and resume, a 410 lists again).
    pub async fn run(self: Arc<Self>, client: kube::Client, cancel: CancellationToken) {
        self.set_enabled(true);
        let api: kube::Api<ResourceClaim> = kube::Api::all(client);
        let mut events = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut failed = false;
        loop {
            let ev = tokio::select! {
                _ = cancel.cancelled() => break,
                ev = events.next() => ev,
            };
            match ev {
                None => break,
                Some(Err(e)) => {
                    if !failed {
                        tracing::warn!(
                            "ResourceClaim watch failed ({e}); prepares read claims by GET until it recovers"
                        );
                    }
                    failed = true;
                    self.watch_failed();
                }
                Some(Ok(ev)) => {
                    match ev {
                        Event::Init => self.list_started(),
                        Event::InitApply(c) => self.apply(&c),
                        Event::InitDone => self.list_done(),
                        Event::Apply(c) => {
                            self.apply(&c);
                            self.resumed();
                        }
                        Event::Delete(c) => {
                            self.delete(&c);
                            self.resumed();
                        }
                    }
                    if failed {
                        tracing::info!("ResourceClaim watch recovered");
                        failed = false;
                    }
                }
            }
        }
        self.set_enabled(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, ResourceClaimConsumerReference,
        ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    const DRIVER: &str = "erdma.alibabacloud.com";
    const NODE: &str = "node-a";

    /// A claim version: `alloc` is (driver, pool, device) of each result; `reserved` adds one
    /// consumer.
    fn claim(name: &str, uid: &str, alloc: &[(&str, &str, &str)], reserved: bool) -> ResourceClaim {
        let results = alloc
            .iter()
            .map(|(driver, pool, device)| DeviceRequestAllocationResult {
                driver: (*driver).into(),
                pool: (*pool).into(),
                device: (*device).into(),
                request: "rdma".into(),
                ..Default::default()
            })
            .collect::<Vec<_>>();
        ResourceClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            status: Some(ResourceClaimStatus {
                allocation: (!results.is_empty()).then(|| AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(results),
                        config: None,
                    }),
                    ..Default::default()
                }),
                reserved_for: reserved.then(|| {
                    vec![ResourceClaimConsumerReference {
                        api_group: None,
                        resource: "pods".into(),
                        name: format!("pod-{name}"),
                        uid: format!("pod-{uid}"),
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ask(name: &str, uid: &str) -> api::Claim {
        api::Claim {
            namespace: "default".into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    fn devices(c: &CachedClaim) -> Vec<&str> {
        c.results.iter().map(|r| r.device.as_str()).collect()
    }

    /// A cache as the watch leaves it after listing `claims`.
    fn synced(claims: &[ResourceClaim]) -> ClaimCache {
        let cache = ClaimCache::new(DRIVER, NODE);
        cache.set_enabled(true);
        cache.list_started();
        for c in claims {
            cache.apply(c);
        }
        cache.list_done();
        cache
    }

    #[test]
    fn keeps_only_reserved_claims_allocated_here_by_this_driver() {
        let here = claim("a", "uid-a", &[(DRIVER, NODE, "erdma-0")], true);
        let mixed = claim(
            "m",
            "uid-m",
            &[
                ("gpu.example.com", NODE, "gpu-0"),
                (DRIVER, NODE, "erdma-1"),
            ],
            true,
        );
        let other_node = claim("b", "uid-b", &[(DRIVER, "node-b", "erdma-0")], true);
        let other_driver = claim("c", "uid-c", &[("dra.net", NODE, "eth0")], true);
        let unreserved = claim("d", "uid-d", &[(DRIVER, NODE, "erdma-0")], false);
        let unallocated = claim("e", "uid-e", &[], false);
        let mut deleting = claim("f", "uid-f", &[(DRIVER, NODE, "erdma-0")], true);
        deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
        let cache = synced(&[
            here,
            mixed,
            other_node,
            other_driver,
            unreserved,
            unallocated,
            deleting,
        ]);
        assert_eq!(cache.stats().claims, 2, "only a and m are kept");
        let a = cache.lookup(&ask("a", "uid-a")).expect("a is held");
        assert_eq!(devices(&a), ["erdma-0"]);
        let m = cache.lookup(&ask("m", "uid-m")).expect("m is held");
        assert_eq!(
            devices(&m),
            ["erdma-1"],
            "only this driver's results are kept"
        );
        for (name, uid) in [
            ("b", "uid-b"),
            ("c", "uid-c"),
            ("d", "uid-d"),
            ("f", "uid-f"),
        ] {
            assert!(
                cache.lookup(&ask(name, uid)).is_none(),
                "{name} is not held"
            );
        }
        let s = cache.stats();
        assert_eq!((s.hits, s.misses), (2, 4));
    }

    #[test]
    fn a_lookup_needs_the_same_uid_namespace_and_name() {
        let cache = synced(&[claim("a", "uid-a", &[(DRIVER, NODE, "erdma-0")], true)]);
        assert!(cache.lookup(&ask("a", "uid-other")).is_none());
        assert!(cache.lookup(&ask("b", "uid-a")).is_none());
        let mut elsewhere = ask("a", "uid-a");
        elsewhere.namespace = "kube-system".into();
        assert!(cache.lookup(&elsewhere).is_none());
        assert!(cache.lookup(&ask("a", "uid-a")).is_some());
    }

    #[test]
    fn misses_until_listed_and_after_a_watch_error_until_it_resumes() {
        let cache = ClaimCache::new(DRIVER, NODE);
        let a = claim("a", "uid-a", &[(DRIVER, NODE, "erdma-0")], true);
        cache.apply(&a);
        assert!(cache.lookup(&ask("a", "uid-a")).is_none(), "not enabled");
        assert_eq!(cache.stats().misses, 0, "a disabled cache counts nothing");
        cache.set_enabled(true);
        cache.list_started();
        cache.apply(&a);
        assert!(cache.lookup(&ask("a", "uid-a")).is_none(), "still listing");
        cache.list_done();
        assert!(cache.lookup(&ask("a", "uid-a")).is_some());
        cache.watch_failed();
        assert!(cache.lookup(&ask("a", "uid-a")).is_none(), "watch broken");
        cache.apply(&claim("z", "uid-z", &[], false));
        cache.resumed();
        assert!(cache.lookup(&ask("a", "uid-a")).is_some(), "watch resumed");
    }

    #[test]
    fn a_new_list_replaces_the_cache() {
        let cache = synced(&[
            claim("a", "uid-a", &[(DRIVER, NODE, "erdma-0")], true),
            claim("b", "uid-b", &[(DRIVER, NODE, "erdma-0")], true),
        ]);
        cache.list_started();
        cache.apply(&claim("b", "uid-b", &[(DRIVER, NODE, "erdma-1")], true));
        cache.list_done();
        assert!(cache.lookup(&ask("a", "uid-a")).is_none(), "a is gone");
        let b = cache.lookup(&ask("b", "uid-b")).expect("b is held");
        assert_eq!(devices(&b), ["erdma-1"]);
    }

    #[test]
    fn deletion_and_a_name_reused_under_a_new_uid() {
        let cache = synced(&[claim("a", "uid-1", &[(DRIVER, NODE, "erdma-0")], true)]);
        cache.delete(&claim("a", "uid-1", &[(DRIVER, NODE, "erdma-0")], true));
        assert!(cache.lookup(&ask("a", "uid-1")).is_none());
        cache.apply(&claim("a", "uid-2", &[(DRIVER, NODE, "erdma-1")], true));
        assert!(
            cache.lookup(&ask("a", "uid-1")).is_none(),
            "the old UID misses"
        );
        let a = cache.lookup(&ask("a", "uid-2")).expect("the new UID hits");
        assert_eq!(devices(&a), ["erdma-1"]);
    }

    #[test]
    fn an_unprepared_claim_is_fenced_until_the_watch_shows_it_deallocated() {
        let old = claim("a", "uid-a", &[(DRIVER, NODE, "erdma-0")], true);
        let cache = synced(std::slice::from_ref(&old));
        assert!(cache.lookup(&ask("a", "uid-a")).is_some());
        cache.unprepared("uid-a");
        assert!(cache.lookup(&ask("a", "uid-a")).is_none(), "fenced");
        // A lagging watch delivers versions of the old allocation: still answered by GET.
        cache.apply(&old);
        assert!(cache.lookup(&ask("a", "uid-a")).is_none(), "old version");
        cache.apply(&claim("a", "uid-a", &[(DRIVER, NODE, "erdma-0")], false));
        assert!(cache.lookup(&ask("a", "uid-a")).is_none(), "unreserved");
        // Deallocated, then allocated again (another device) and reserved.
        cache.apply(&claim("a", "uid-a", &[], false));
        cache.apply(&claim("a", "uid-a", &[(DRIVER, NODE, "erdma-1")], true));
        let a = cache
            .lookup(&ask("a", "uid-a"))
            .expect("the new allocation hits");
        assert_eq!(devices(&a), ["erdma-1"]);
    }

    #[test]
    fn a_fence_survives_a_relist_only_while_the_claim_exists() {
        let cache = synced(&[
            claim("a", "uid-a", &[(DRIVER, NODE, "erdma-0")], true),
            claim("b", "uid-b", &[(DRIVER, NODE, "erdma-0")], true),
        ]);
        cache.unprepared("uid-a");
        cache.unprepared("uid-b");
        cache.list_started();
        cache.apply(&claim("a", "uid-a", &[(DRIVER, NODE, "erdma-0")], true));
        cache.list_done();
        assert!(cache.lookup(&ask("a", "uid-a")).is_none(), "a still fenced");
        assert_eq!(cache.lock().fenced.len(), 1, "b's fence went with b");
    }
}
