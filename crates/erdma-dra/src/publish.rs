//! Keeps this node's ResourceSlice in the API server equal to the mapping of the inventory.
//!
//! Only this node's slices of this driver are read: lists and the watch carry the field selector
//! `spec.nodeName=<node>,spec.driver=<driver>` ([`field_selector`]; the API server selects
//! ResourceSlices by those two fields and `metadata.name`, there is none for the pool), so a sync
//! costs one object whatever the size of the cluster. The watch re-syncs when another client
//! changes or deletes the slice (the kubelet deletes a driver's slices when it starts and after
//! the driver was gone for a while) or adds one for this node and driver.
//!
//! The slice is owned by the Node ([`slice::node_owner`], the Node's UID read once by the
//! publisher), so the garbage collector deletes it with the Node; a slice written without the
//! owner (by an older agent) is replaced with it.

use crate::config::DraConfig;
use crate::readback::{self, DroppedField};
use crate::slice::{self, NodeFacts};
use erdma_model::NodeDevices;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What a sync did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncOutcome {
    /// The slice was created, updated, or already as wanted.
    pub action: SliceAction,
    /// Pool generation now published.
    pub generation: i64,
    /// Stale slices of this driver on this node that were deleted.
    pub deleted: Vec<String>,
    /// The resourceVersion of the node's slice as stored after the sync.
    pub resource_version: Option<String>,
    /// The fields the API server dropped from what the driver wrote (their feature gates are
    /// off), read from the stored slice; empty when it stored everything.
    pub dropped: Vec<DroppedField>,
}

/// What happened to the node's slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceAction {
    /// Created.
    Created,
    /// Replaced with a higher pool generation.
    Updated,
    /// Already equal.
    Unchanged,
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> crate::error::DraError {
    let what = what.into();
    move |e| crate::error::DraError::Kube {
        what,
        source: Box::new(e),
    }
}

/// Annotation on the slice with the digest of the devices this driver wrote.
pub const ANNOTATION_DIGEST: &str = "erdma.alibabacloud.com/devices-digest";
/// Annotation on the slice naming the devices this driver wrote with a taint (comma-separated;
/// absent when none): a reader of the stored slice (`erdmactl doctor`) sees a taint the API
/// server dropped.
pub const ANNOTATION_TAINTED: &str = "erdma.alibabacloud.com/tainted-devices";

/// FNV-1a 64 of the devices' JSON (deterministic: maps are ordered), as 16 hex digits.
pub fn digest(devices: &[Device]) -> String {
    let text = serde_json::to_vec(devices).unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn with_digest(mut s: ResourceSlice) -> ResourceSlice {
    let devices = s.spec.devices.as_deref().unwrap_or_default();
    let d = digest(devices);
    let tainted: Vec<&str> = devices
        .iter()
        .filter(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
        .map(|d| d.name.as_str())
        .collect();
    let tainted = tainted.join(",");
    let a = s.metadata.annotations.get_or_insert_with(Default::default);
    a.insert(ANNOTATION_DIGEST.to_string(), d);
    if !tainted.is_empty() {
        a.insert(ANNOTATION_TAINTED.to_string(), tainted);
    }
    s
}

/// The field selector of this node's slices of this driver.
pub fn field_selector(cfg: &DraConfig) -> String {
    format!(
        "spec.nodeName={},spec.driver={}",
        cfg.node_name, cfg.driver_name
    )
}

/// Lists this node's slices of this driver (selected by the API server; [`is_ours`] is checked
/// again in case a server ignored the selector).
async fn list_ours(
    api: &kube::Api<ResourceSlice>,
    cfg: &DraConfig,
) -> crate::error::Result<Vec<ResourceSlice>> {
    let listed = api
        .list(&ListParams::default().fields(&field_selector(cfg)))
        .await
        .map_err(kube_err("list this node's ResourceSlices"))?;
    Ok(listed
        .items
        .into_iter()
        .filter(|s| is_ours(s, cfg))
        .collect())
}

/// True when `s` was written by this driver for `node`.
pub fn is_ours(s: &ResourceSlice, cfg: &DraConfig) -> bool {
    s.spec.driver == cfg.driver_name && s.spec.node_name.as_deref() == Some(cfg.node_name.as_str())
}

/// The owner reference of this node's slices: reads the Node's UID (a missing Node is
/// [`crate::error::DraError::NodeNotFound`]).
pub async fn node_owner(
    client: &kube::Client,
    cfg: &DraConfig,
) -> crate::error::Result<OwnerReference> {
    let api: kube::Api<Node> = kube::Api::all(client.clone());
    let node = match api.get(&cfg.node_name).await {
        Ok(n) => n,
        Err(kube::Error::Api(e)) if e.code == 404 => {
            return Err(crate::error::DraError::NodeNotFound {
                node: cfg.node_name.clone(),
            });
        }
        Err(e) => return Err(kube_err(format!("read Node {}", cfg.node_name))(e)),
    };
    match node.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => Ok(slice::node_owner(&cfg.node_name, uid)),
        _ => Err(crate::error::DraError::Config(format!(
            "Node {} has no metadata.uid in the API server's answer; the ResourceSlice cannot name its owner",
            cfg.node_name
        ))),
    }
}

/// Makes the node's slice carry exactly `devices`: creates it, replaces it (pool generation + 1)
/// when the devices or its owner differ, and deletes other slices of this driver on this node.
/// Reads the Node's UID first ([`node_owner`]).
pub async fn sync(
    client: &kube::Client,
    cfg: &DraConfig,
    devices: Vec<Device>,
) -> crate::error::Result<SyncOutcome> {
    sync_with(client, cfg, devices, false).await
}

/// How often the publisher writes the slice again while the API server drops some of its fields,
/// to see whether the feature gates were turned on (the stored slice would otherwise keep lacking
/// the fields until the devices change).
pub const RECHECK_DROPPED: Duration = Duration::from_secs(300);

/// [`sync`]; with `rewrite_dropped`, a slice whose stored devices lack fields the driver writes
/// (dropped by the API server when it was written) is written again even when its devices did
/// not change.
pub async fn sync_with(
    client: &kube::Client,
    cfg: &DraConfig,
    devices: Vec<Device>,
    rewrite_dropped: bool,
) -> crate::error::Result<SyncOutcome> {
    let owner = node_owner(client, cfg).await?;
    sync_owned(client, cfg, devices, rewrite_dropped, &owner).await
}

/// [`sync_with`] with the owner reference already read.
async fn sync_owned(
    client: &kube::Client,
    cfg: &DraConfig,
    devices: Vec<Device>,
    rewrite_dropped: bool,
    owner: &OwnerReference,
) -> crate::error::Result<SyncOutcome> {
    let owners = Some(vec![owner.clone()]);
    let api: kube::Api<ResourceSlice> = kube::Api::all(client.clone());
    let name = slice::slice_name(&cfg.node_name, &cfg.driver_name);
    let ours = list_ours(&api, cfg).await?;
    let mut deleted = Vec::new();
    for s in &ours {
        let Some(n) = s.metadata.name.as_deref() else {
            continue;
        };
        if n != name {
            match api.delete(n, &DeleteParams::default()).await {
                Ok(_) => deleted.push(n.to_string()),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(kube_err(format!("delete stale ResourceSlice {n}"))(e)),
            }
        }
    }
    let existing = ours
        .into_iter()
        .find(|s| s.metadata.name.as_deref() == Some(name.as_str()));
    let written = devices.clone();
    let (action, generation, stored) = match existing {
        None => {
            let mut want = with_digest(slice::resource_slice(devices, cfg, 1));
            want.metadata.owner_references = owners;
            let stored = api
                .create(&PostParams::default(), &want)
                .await
                .map_err(kube_err(format!("create ResourceSlice {name}")))?;
            (SliceAction::Created, 1, stored)
        }
        Some(have) => {
            let current = have.spec.pool.generation;
            // Compared by the digest of what was written, not field by field: the API server
            // adds fields (a taint's timeAdded) and drops those of features that are off (e.g.
            // consumable capacity without its gate), which must not look like a change.
            let same = have
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_DIGEST))
                .is_some_and(|d| *d == digest(&devices))
                && have.spec.pool.name == cfg.pool_name()
                && have.spec.pool.resource_slice_count == 1
                && have.metadata.owner_references == owners;
            let lacking = rewrite_dropped
                && !readback::dropped_devices(
                    &devices,
                    have.spec.devices.as_deref().unwrap_or_default(),
                )
                .is_empty();
            if same && !lacking {
                (SliceAction::Unchanged, current, have)
            } else {
                let mut want = with_digest(slice::resource_slice(devices, cfg, current + 1));
                want.metadata.owner_references = owners;
                want.metadata.resource_version = have.metadata.resource_version.clone();
                let stored = api
                    .replace(&name, &PostParams::default(), &want)
                    .await
                    .map_err(kube_err(format!("update ResourceSlice {name}")))?;
                (SliceAction::Updated, current + 1, stored)
            }
        }
    };
    // The response of the create or update is the stored object; an unchanged slice was read
    // just now. What it lacks of the devices written, the API server dropped.
    let dropped =
        readback::dropped_devices(&written, stored.spec.devices.as_deref().unwrap_or_default());
    Ok(SyncOutcome {
        action,
        generation,
        deleted,
        resource_version: stored.metadata.resource_version.clone(),
        dropped,
    })
}

/// Deletes every slice of this driver on this node (the node switched back to the device plugin).
pub async fn remove_all(
    client: &kube::Client,
    cfg: &DraConfig,
) -> crate::error::Result<Vec<String>> {
    let api: kube::Api<ResourceSlice> = kube::Api::all(client.clone());
    let mut out = Vec::new();
    for s in list_ours(&api, cfg).await? {
        if let Some(n) = s.metadata.name.as_deref() {
            match api.delete(n, &DeleteParams::default()).await {
                Ok(_) => out.push(n.to_string()),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(kube_err(format!("delete ResourceSlice {n}"))(e)),
            }
        }
    }
    Ok(out)
}

/// The devices to publish for a served snapshot: devices that vanish stay published, tainted
/// (as the device plugin keeps them, Unhealthy), so a claim on them is not silently lost.
pub fn publishable(
    memory: &mut erdma_model::DeviceMemory,
    served: &NodeDevices,
    cfg: &DraConfig,
    instance_id: Option<String>,
) -> Vec<Device> {
    let merged = memory.merge(served);
    let facts = NodeFacts {
        instance_id,
        pcie_roots: slice::pcie_roots(&cfg.sysfs, &merged),
    };
    slice::devices(&merged, cfg, &facts)
}

/// Why the publisher syncs again.
enum Wake {
    Stop,
    Inventory,
    Retry,
    /// Another client changed this node's slices of the driver.
    Slices,
    /// Fields were dropped [`RECHECK_DROPPED`] ago: write again.
    Recheck,
}

/// True when a watch event shows another client's doing: a version of the node's slice other
/// than the one this driver stored last, its deletion, or another slice of this node and driver
/// (other than one this driver just deleted).
fn external(event: &Event<ResourceSlice>, cfg: &DraConfig, last: Option<&SyncOutcome>) -> bool {
    let name = slice::slice_name(&cfg.node_name, &cfg.driver_name);
    let (s, deleted) = match event {
        Event::Apply(s) | Event::InitApply(s) => (s, false),
        Event::Delete(s) => (s, true),
        Event::Init | Event::InitDone => return false,
    };
    if !is_ours(s, cfg) {
        return false;
    }
    let n = s.metadata.name.as_deref().unwrap_or_default();
    if n != name {
        return !last.is_some_and(|o| o.deleted.iter().any(|d| d == n));
    }
    deleted
        || last.and_then(|o| o.resource_version.as_deref())
            != s.metadata.resource_version.as_deref()
}

/// Publishes on every inventory change, and when the watch of this node's slices shows another
/// client's change, until `cancel`; a failed sync is retried with backoff (1 s doubling to 60 s,
/// and never sooner than the API server's `Retry-After`, which also holds back a sync for an
/// inventory change). `status` receives the last outcome or error.
pub async fn run(
    client: kube::Client,
    cfg: DraConfig,
    mut served: watch::Receiver<NodeDevices>,
    instance_id: Option<String>,
    status: watch::Sender<Result<SyncOutcome, String>>,
    cancel: CancellationToken,
) {
    let mut memory = erdma_model::DeviceMemory::default();
    let mut backoff = Duration::from_secs(1);
    let api: kube::Api<ResourceSlice> = kube::Api::all(client.clone());
    // Lazy: it lists (with the selector) when first polled, after the first sync.
    let mut slices = watcher::watcher(
        api,
        watcher::Config::default().fields(&field_selector(&cfg)),
    )
    .default_backoff()
    .boxed();
    let mut last: Option<SyncOutcome> = None;
    // The Node's UID does not change while the agent runs on it: read once, by the first sync
    // that gets it.
    let mut owner: Option<OwnerReference> = None;
    let mut reported: Vec<DroppedField> = Vec::new();
    let mut rewrite = false;
    // the API server's Retry-After: no request before this instant
    let mut not_before: Option<tokio::time::Instant> = None;
    loop {
        if let Some(t) = not_before.take() {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep_until(t) => {}
            }
        }
        let snapshot = served.borrow_and_update().clone();
        let devices = publishable(&mut memory, &snapshot, &cfg, instance_id.clone());
        let synced = match owner.clone() {
            Some(o) => Ok(o),
            None => node_owner(&client, &cfg).await,
        };
        let synced = match synced {
            Ok(o) => {
                owner = Some(o.clone());
                sync_owned(&client, &cfg, devices, rewrite, &o).await
            }
            Err(e) => Err(e),
        };
        let retry = match synced {
            Ok(o) => {
                if o.action != SliceAction::Unchanged || !o.deleted.is_empty() {
                    tracing::info!(action = ?o.action, generation = o.generation, deleted = ?o.deleted, "ResourceSlice published");
                }
                if o.dropped != reported {
                    if o.dropped.is_empty() {
                        tracing::info!(
                            "the API server stores every field of this node's ResourceSlice again"
                        );
                    } else {
                        tracing::warn!(
                            feature_gates = ?readback::gates(&o.dropped),
                            "{}",
                            readback::summary(&o.dropped)
                        );
                    }
                    reported = o.dropped.clone();
                }
                last = Some(o.clone());
                let _previous = status.send_replace(Ok(o));
                backoff = Duration::from_secs(1);
                None
            }
            Err(e) => {
                let told = e.retry_after();
                let wait = told.map_or(backoff, |t| t.max(backoff));
                if let Some(t) = told {
                    backoff = backoff.max(t);
                    not_before = Some(tokio::time::Instant::now() + t);
                }
                tracing::warn!(
                    retry_after = ?told,
                    "publishing the ResourceSlice failed (retrying in {wait:?}): {e}"
                );
                let _previous = status.send_replace(Err(e.to_string()));
                Some(wait)
            }
        };
        let sleep = async {
            match retry {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(sleep);
        let dropping = last.as_ref().is_some_and(|o| !o.dropped.is_empty());
        let recheck = async {
            if dropping {
                tokio::time::sleep(RECHECK_DROPPED).await
            } else {
                std::future::pending().await
            }
        };
        tokio::pin!(recheck);
        let wake = loop {
            tokio::select! {
                _ = cancel.cancelled() => break Wake::Stop,
                changed = served.changed() => {
                    break if changed.is_err() { Wake::Stop } else { Wake::Inventory };
                }
                _ = &mut sleep => break Wake::Retry,
                _ = &mut recheck => break Wake::Recheck,
                event = slices.next() => match event {
                    Some(Ok(e)) if external(&e, &cfg, last.as_ref()) => break Wake::Slices,
                    Some(Ok(_)) => {}
                    Some(Err(e)) => tracing::debug!("watch of this node's ResourceSlices: {e}"),
                    None => break Wake::Stop,
                },
            }
        };
        rewrite = matches!(wake, Wake::Recheck);
        match wake {
            Wake::Stop => return,
            Wake::Recheck => {}
            Wake::Retry => backoff = (backoff * 2).min(Duration::from_secs(60)),
            Wake::Slices => tracing::info!(
                "this node's ResourceSlices were changed by another client: publishing again"
            ),
            Wake::Inventory => {}
        }
    }
}
