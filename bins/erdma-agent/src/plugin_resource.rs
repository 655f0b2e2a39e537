//! On a DRA node: the device plugin's extended resource (`aliyun/erdma`) left in the Node's
//! `status.capacity` and `status.allocatable`.
//!
//! The kubelet never deletes a device-plugin resource from the node status: when the plugin goes
//! it keeps the resource (its devices unhealthy) for a 5-minute grace period, then writes it as 0
//! once; a kubelet restart within that period brings it back from the kubelet's checkpoint. The
//! scheduler's DRA plugin takes a node with the key in allocatable, even at 0, for a
//! device-plugin node of that resource and never serves `aliyun/erdma` there through the
//! DeviceClass's `extendedResourceName`: every such pod stays Pending on a node switched to DRA.
//! So the DRA node removes the key, once the kubelet no longer holds our device plugin (its
//! socket accepts no connection and the kubelet's checkpoint registers no device of the
//! resource), and looks again: every [`RECHECK`] until it has seen the key absent and the plugin
//! gone for [`QUIET`], then at each ResourceSlice sync.

use crate::cluster::Cluster;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often the node is looked at while the kubelet may still write the key.
pub const RECHECK: Duration = Duration::from_secs(30);
/// How long the key must have stayed away, with the plugin gone, before the periodic look stops:
/// the kubelet's grace period for a plugin that went (5 minutes) and a node-status update.
pub const QUIET: Duration = Duration::from_secs(6 * 60);
/// The kubelet's device-manager checkpoint, in the device-plugin directory.
pub const KUBELET_CHECKPOINT: &str = "kubelet_internal_checkpoint";
/// Event reason when the key was removed.
pub const EVENT_REMOVED: &str = "DevicePluginResourceRemoved";
/// Conflicts in a row (the kubelet wrote between the read and the patch) before a look gives up.
const ATTEMPTS: usize = 3;

/// What one look did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The node's status has no such key.
    Absent,
    /// The key was removed; its values before (`None`: not in that map).
    Removed {
        /// `status.capacity` before.
        capacity: Option<String>,
        /// `status.allocatable` before.
        allocatable: Option<String>,
    },
    /// Left alone: the kubelet still holds the device plugin (why), and would write it back.
    PluginHeld(String),
}

/// Removes the device plugin's resource from one node's status.
#[derive(Debug, Clone)]
pub struct Retirer {
    /// The API and this node.
    pub cluster: Cluster,
    /// The extended resource (`--resource-name`).
    pub resource: String,
    /// The kubelet's device-plugin directory (`--kubelet-dir`).
    pub plugin_dir: PathBuf,
}

impl Retirer {
    /// One look: leaves the node alone while the kubelet holds the plugin, else removes the key
    /// from `status.capacity` and `status.allocatable` where present (nothing written when absent).
    pub async fn step(&self) -> Result<Step, String> {
        if let Some(why) = plugin_held(&self.plugin_dir, &self.resource) {
            return Ok(Step::PluginHeld(why));
        }
        let nodes: Api<Node> = Api::all(self.cluster.client.clone());
        let node = &self.cluster.node;
        for _ in 0..ATTEMPTS {
            let n = nodes
                .get(node)
                .await
                .map_err(|e| format!("read node {node} for {}: {e}", self.resource))?;
            let status = n.status.unwrap_or_default();
            let value = |m: Option<&std::collections::BTreeMap<_, _>>| {
                m.and_then(|m| m.get(&self.resource))
                    .map(|q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| q.0.clone())
            };
            let capacity = value(status.capacity.as_ref());
            let allocatable = value(status.allocatable.as_ref());
            if capacity.is_none() && allocatable.is_none() {
                return Ok(Step::Absent);
            }
            // A merge patch's null removes the key; the resourceVersion makes it apply only to
            // the status read here (the kubelet writes the same maps).
            let mut patch = serde_json::json!({
                "status": {
                    "capacity": {&self.resource: null},
                    "allocatable": {&self.resource: null},
                },
            });
            if let Some(rv) = n.metadata.resource_version {
                patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
            }
            match nodes
                .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    return Ok(Step::Removed {
                        capacity,
                        allocatable,
                    });
                }
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => {
                    return Err(format!(
                        "remove {} from the status of node {node}: {e}; the agent needs patch on nodes/status",
                        self.resource
                    ));
                }
            }
        }
        Err(format!(
            "remove {} from the status of node {node}: the node changed under each of {ATTEMPTS} patches; looking again later",
            self.resource
        ))
    }
}

/// Why the kubelet still holds a device plugin of `resource` (`None`: it does not): the plugin's
/// socket in `dir` accepts connections, or the kubelet's checkpoint registers the resource (it
/// keeps a plugin that went for its grace period, and brings it back after a restart within it).
/// An unreadable checkpoint is no evidence (logged at debug).
pub fn plugin_held(dir: &Path, resource: &str) -> Option<String> {
    let socket = erdma_deviceplugin::config::socket_name(resource);
    let path = dir.join(&socket);
    if std::os::unix::net::UnixStream::connect(&path).is_ok() {
        return Some(format!(
            "the device plugin's socket {} accepts connections",
            path.display()
        ));
    }
    let checkpoint = dir.join(KUBELET_CHECKPOINT);
    match std::fs::read(&checkpoint) {
        Ok(text) => match registers(&text, resource) {
            Ok(true) => Some(format!(
                "the kubelet's checkpoint {} still registers {resource} (the kubelet keeps a device plugin that went for 5 minutes)",
                checkpoint.display()
            )),
            Ok(false) => None,
            Err(e) => {
                tracing::debug!(checkpoint = %checkpoint.display(), "{e}");
                None
            }
        },
        Err(e) => {
            tracing::debug!(checkpoint = %checkpoint.display(), "kubelet checkpoint unreadable: {e}");
            None
        }
    }
}

/// Whether the kubelet's device-manager checkpoint (`{"Data": {"RegisteredDevices": {resource:
/// [ids]}}, "Checksum": n}`) registers `resource` (with or without devices).
pub fn registers(checkpoint: &[u8], resource: &str) -> Result<bool, String> {
    let v: serde_json::Value = serde_json::from_slice(checkpoint)
        .map_err(|e| format!("the kubelet's device-manager checkpoint is not JSON: {e}"))?;
    Ok(v.pointer("/Data/RegisteredDevices")
        .and_then(serde_json::Value::as_object)
        .is_some_and(|m| m.contains_key(resource)))
}

/// Looks until `cancel`: at once, every [`RECHECK`] until the key stayed away [`QUIET`], and at
/// each change of `synced` (a ResourceSlice sync). A removal is logged and recorded as an Event.
pub async fn run<T: Send + Sync>(
    retirer: Retirer,
    recheck: Duration,
    quiet: Duration,
    mut synced: watch::Receiver<T>,
    cancel: CancellationToken,
) {
    let node = retirer.cluster.node.clone();
    let resource = retirer.resource.clone();
    let mut unsettled_since = tokio::time::Instant::now();
    let mut held_reported = false;
    loop {
        match retirer.step().await {
            Ok(Step::Absent) => held_reported = false,
            Ok(Step::Removed {
                capacity,
                allocatable,
            }) => {
                unsettled_since = tokio::time::Instant::now();
                held_reported = false;
                let message = format!(
                    "removed {resource} from the status of node {node} (capacity {}, allocatable {}): the node serves it through DRA, and the scheduler routes {resource} pods to DRA only on nodes without the key",
                    capacity.as_deref().unwrap_or("absent"),
                    allocatable.as_deref().unwrap_or("absent"),
                );
                tracing::info!("{message}");
                if let Err(e) = retirer
                    .cluster
                    .dra_event("Normal", EVENT_REMOVED, &message)
                    .await
                {
                    tracing::warn!("{e}");
                }
            }
            Ok(Step::PluginHeld(why)) => {
                unsettled_since = tokio::time::Instant::now();
                if !held_reported {
                    tracing::info!(
                        "{resource} stays in the status of node {node} for now: {why}; removed once the kubelet lets the device plugin go"
                    );
                    held_reported = true;
                }
            }
            Err(e) => {
                unsettled_since = tokio::time::Instant::now();
                tracing::warn!("{e}");
            }
        }
        let periodic = unsettled_since.elapsed() < quiet;
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(recheck), if periodic => {}
            r = synced.changed() => if r.is_err() {
                // No more syncs: only the periodic look (or nothing) is left.
                if !periodic {
                    cancel.cancelled().await;
                    return;
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(recheck) => {}
                }
            },
        }
    }
}
