//! The node agent's side of the `ERdmaDevice` contract: follow the node's object with a watch
//! (selected by the `alibabacloud.com/nodename` label, as the original), match its ERIs to local netdevs by
//! MAC, and report per-device problems back into the status.
//!
//! Status ownership: the controller writes `Pending`/`Ready`/`Failed` from the cloud's point of
//! view; the agent only writes `Failed` entries whose message starts with [`AGENT_PREFIX`] (a
//! device the cloud calls ready but the node cannot use) and clears them again. The controller
//! keeps such entries while the cloud side is ready, so the two never fight.

use crate::Error;
use crate::crd::{DeviceInfo, DeviceState, DeviceStatus, ERdmaDevice, ERdmaDeviceStatus};
use crate::labels::LABEL_NODE_NAME;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

/// Messages of agent-written status entries start with this.
pub const AGENT_PREFIX: &str = "agent: ";

/// The ERIs assigned to a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEris {
    /// The `ERdmaDevice` name (the node name when written by a controller).
    pub object_name: String,
    /// The ERIs.
    pub devices: Vec<DeviceInfo>,
    /// Set the ERI MTU to the jumbo-frame MTU.
    pub jumbo_frame: bool,
    /// The status entries at the time of reading.
    pub status: Vec<DeviceStatus>,
}

impl NodeEris {
    /// The ERI with `mac` (case-insensitive; `-` or `:` separators).
    pub fn by_mac(&self, mac: &str) -> Option<&DeviceInfo> {
        let norm = |m: &str| m.to_ascii_lowercase().replace('-', ":");
        let want = norm(mac);
        self.devices.iter().find(|d| norm(&d.mac) == want)
    }

    /// Matches the ERIs to local devices given as `(mac, name)` pairs (e.g. netdev MAC and ibdev
    /// name from the inventory): the matched pairs, and for each ERI without a local device an
    /// `(eni id, message)` problem ready for [`report_device_problems`].
    pub fn match_local<'a>(&'a self, local: &[(String, String)]) -> EriMatch<'a> {
        let norm = |m: &str| m.to_ascii_lowercase().replace('-', ":");
        let mut out = EriMatch::default();
        for d in &self.devices {
            match local.iter().find(|(mac, _)| norm(mac) == norm(&d.mac)) {
                Some((_, name)) => out.matched.push((d, name.clone())),
                None => out.missing.push((
                    d.id.clone(),
                    format!(
                        "no local RDMA device with MAC {} (ERI {}): check that the ENI is attached and the erdma driver is loaded",
                        d.mac, d.id
                    ),
                )),
            }
        }
        out
    }

    /// Whether every ERI has a `Ready` status entry.
    pub fn all_ready(&self) -> bool {
        self.devices.iter().all(|d| {
            self.status
                .iter()
                .any(|s| s.id == d.id && s.state() == Some(DeviceState::Ready))
        })
    }
}

/// The result of [`NodeEris::match_local`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct EriMatch<'a> {
    /// ERIs found locally, with the local device name.
    pub matched: Vec<(&'a DeviceInfo, String)>,
    /// ERIs not found: `(eni id, message)`.
    pub missing: Vec<(String, String)>,
}

/// The label selector of `node`'s `ERdmaDevice`.
fn node_selector(node: &str) -> String {
    format!("{LABEL_NODE_NAME}={node}")
}

/// `node`'s ERIs from the objects labelled for it: objects being deleted do not count, an
/// object without devices is none, more than one is an error naming them.
pub fn node_eris_of<'a>(
    node: &str,
    objects: impl Iterator<Item = &'a ERdmaDevice>,
) -> Result<Option<NodeEris>, Error> {
    let mut items: Vec<&ERdmaDevice> = objects
        .filter(|o| o.metadata.deletion_timestamp.is_none())
        .collect();
    if items.len() > 1 {
        let names: Vec<String> = items
            .iter()
            .filter_map(|o| o.metadata.name.clone())
            .collect();
        return Err(Error::Invalid(format!(
            "node {node} has {} ERdmaDevices ({}); fix: delete all but the one named after the node",
            names.len(),
            names.join(", ")
        )));
    }
    Ok(items
        .pop()
        .filter(|o| !o.spec.devices.is_empty())
        .map(|o| NodeEris {
            object_name: o.metadata.name.clone().unwrap_or_default(),
            devices: o.spec.devices.clone(),
            jumbo_frame: o.spec.jumbo_frame,
            status: o
                .status
                .as_ref()
                .map(|s| s.devices.clone())
                .unwrap_or_default(),
        }))
}

/// Follows `node`'s `ERdmaDevice` with a watch (one list, then changes as the API server sends
/// them; re-listed after a 410, retried with back-off after errors): yields
/// [`node_eris_of`] of the objects labelled for the node after the first list and after every
/// change. An idle watch costs neither the API server nor the agent anything, where a poll
/// would list every few seconds on every node. Errors are yielded (to be logged); the stream
/// goes on after them.
pub fn watch_node_eris(
    client: &Client,
    node: &str,
) -> impl futures::Stream<Item = Result<Option<NodeEris>, Error>> + Send + 'static {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let api: Api<ERdmaDevice> = Api::all(client.clone());
    let selector = node_selector(node);
    let node = node.to_string();
    let mut objects: std::collections::BTreeMap<String, ERdmaDevice> = Default::default();
    let mut listing: Option<std::collections::BTreeMap<String, ERdmaDevice>> = None;
    watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .filter_map(move |event| {
            let out = match event {
                Ok(watcher::Event::Init) => {
                    listing = Some(Default::default());
                    None
                }
                Ok(watcher::Event::InitApply(o)) => {
                    if let Some(l) = listing.as_mut() {
                        l.insert(o.metadata.name.clone().unwrap_or_default(), o);
                    }
                    None
                }
                Ok(watcher::Event::InitDone) => {
                    objects = listing.take().unwrap_or_default();
                    Some(node_eris_of(&node, objects.values()))
                }
                Ok(watcher::Event::Apply(o)) => {
                    objects.insert(o.metadata.name.clone().unwrap_or_default(), o);
                    Some(node_eris_of(&node, objects.values()))
                }
                Ok(watcher::Event::Delete(o)) => {
                    objects.remove(o.metadata.name.as_deref().unwrap_or_default());
                    Some(node_eris_of(&node, objects.values()))
                }
                Err(e) => Some(Err(Error::Watch {
                    what: format!("watch ERdmaDevices labelled {selector}"),
                    message: e.to_string(),
                })),
            };
            std::future::ready(out)
        })
}

/// Records the agent's view of devices in the status of `object`: `problems` are
/// `(eni id, message)` pairs written as `Failed` with [`AGENT_PREFIX`]; agent entries for other
/// devices are removed (problem fixed). Controller-written entries are left alone. Uses the
/// object's resourceVersion, so a concurrent controller write makes this fail with a conflict
/// (retry).
pub async fn report_device_problems(
    client: &Client,
    object: &str,
    problems: &[(String, String)],
) -> Result<(), Error> {
    let api: Api<ERdmaDevice> = Api::all(client.clone());
    let current = api.get_status(object).await.map_err(|source| Error::Kube {
        what: format!("get ERdmaDevice {object}"),
        source,
    })?;
    let mut devices: Vec<DeviceStatus> = current.status.map(|s| s.devices).unwrap_or_default();
    devices.retain(|s| !s.message.starts_with(AGENT_PREFIX));
    for (id, msg) in problems {
        devices.retain(|s| &s.id != id);
        devices.push(DeviceStatus::new(
            id.clone(),
            DeviceState::Failed,
            format!("{AGENT_PREFIX}{msg}"),
        ));
    }
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "status": ERdmaDeviceStatus { devices },
    });
    api.patch_status(object, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Kube {
            what: format!("patch status of ERdmaDevice {object}"),
            source,
        })?;
    Ok(())
}
