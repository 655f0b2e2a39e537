//! Keeps this node's ResourceSlice in the API server equal to the mapping of the inventory.

use crate::config::DraConfig;
use crate::slice::{self, NodeFacts};
use erdma_deviceplugin::devices::DeviceMemory;
use erdma_model::NodeDevices;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::api::{DeleteParams, ListParams, PostParams};
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

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> crate::DraError {
    let what = what.into();
    move |e| crate::DraError::Kube {
        what,
        source: Box::new(e),
    }
}

/// Annotation on the slice with the digest of the devices this driver wrote.
pub const ANNOTATION_DIGEST: &str = "erdma.alibabacloud.com/devices-digest";

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
    let d = digest(s.spec.devices.as_deref().unwrap_or_default());
    s.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION_DIGEST.to_string(), d);
    s
}

/// True when `s` was written by this driver for `node`.
pub fn is_ours(s: &ResourceSlice, cfg: &DraConfig) -> bool {
    s.spec.driver == cfg.driver_name && s.spec.node_name.as_deref() == Some(cfg.node_name.as_str())
}

/// Makes the node's slice carry exactly `devices`: creates it, replaces it (pool generation + 1)
/// when the devices differ, and deletes other slices of this driver on this node.
pub async fn sync(
    client: &kube::Client,
    cfg: &DraConfig,
    devices: Vec<Device>,
) -> crate::Result<SyncOutcome> {
    let api: kube::Api<ResourceSlice> = kube::Api::all(client.clone());
    let name = slice::slice_name(&cfg.node_name, &cfg.driver_name);
    let all = api
        .list(&ListParams::default())
        .await
        .map_err(kube_err("list ResourceSlices"))?;
    let ours: Vec<ResourceSlice> = all.items.into_iter().filter(|s| is_ours(s, cfg)).collect();
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
    let (action, generation) = match existing {
        None => {
            let want = with_digest(slice::resource_slice(devices, cfg, 1));
            api.create(&PostParams::default(), &want)
                .await
                .map_err(kube_err(format!("create ResourceSlice {name}")))?;
            (SliceAction::Created, 1)
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
                && have.spec.pool.resource_slice_count == 1;
            if same {
                (SliceAction::Unchanged, current)
            } else {
                let mut want = with_digest(slice::resource_slice(devices, cfg, current + 1));
                want.metadata.resource_version = have.metadata.resource_version.clone();
                api.replace(&name, &PostParams::default(), &want)
                    .await
                    .map_err(kube_err(format!("update ResourceSlice {name}")))?;
                (SliceAction::Updated, current + 1)
            }
        }
    };
    Ok(SyncOutcome {
        action,
        generation,
        deleted,
    })
}

/// Deletes every slice of this driver on this node (the node switched back to the device plugin).
pub async fn remove_all(client: &kube::Client, cfg: &DraConfig) -> crate::Result<Vec<String>> {
    let api: kube::Api<ResourceSlice> = kube::Api::all(client.clone());
    let all = api
        .list(&ListParams::default())
        .await
        .map_err(kube_err("list ResourceSlices"))?;
    let mut out = Vec::new();
    for s in all.items.iter().filter(|s| is_ours(s, cfg)) {
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
    memory: &mut DeviceMemory,
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

/// Publishes on every inventory change until `cancel`; a failed sync is retried with backoff
/// (1 s doubling to 60 s). `status` receives the last outcome or error.
pub async fn run(
    client: kube::Client,
    cfg: DraConfig,
    mut served: watch::Receiver<NodeDevices>,
    instance_id: Option<String>,
    status: watch::Sender<Result<SyncOutcome, String>>,
    cancel: CancellationToken,
) {
    let mut memory = DeviceMemory::default();
    let mut backoff = Duration::from_secs(1);
    loop {
        let snapshot = served.borrow_and_update().clone();
        let devices = publishable(&mut memory, &snapshot, &cfg, instance_id.clone());
        let retry = match sync(&client, &cfg, devices).await {
            Ok(o) => {
                if o.action != SliceAction::Unchanged || !o.deleted.is_empty() {
                    tracing::info!(action = ?o.action, generation = o.generation, deleted = ?o.deleted, "ResourceSlice published");
                }
                let _previous = status.send_replace(Ok(o));
                backoff = Duration::from_secs(1);
                None
            }
            Err(e) => {
                tracing::warn!(
                    "publishing the ResourceSlice failed (retrying in {backoff:?}): {e}"
                );
                let _previous = status.send_replace(Err(e.to_string()));
                Some(backoff)
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = served.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = async {
                match retry {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            } => {
                backoff = (backoff * 2).min(Duration::from_secs(60));
            }
        }
    }
}
