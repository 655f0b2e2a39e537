//! The kubelet's node-status writes for device-plugin resources, against the lab's API server.
//!
//! What the kubelet does (device manager `GetCapacity`, node status `MachineInfo`):
//! - a registered plugin's resource is in `status.capacity` with all its devices (healthy and
//!   unhealthy) and in `status.allocatable` with its healthy ones;
//! - when the plugin's stream ends every device turns unhealthy: capacity stays, allocatable 0;
//! - once the plugin has been gone for the stop grace period (5 minutes) the kubelet drops the
//!   resource and writes it as `0` in capacity (and so in allocatable) once: the key stays, so
//!   that the node still reads as a device-plugin node of that resource;
//! - after a kubelet restart a resource comes back with no devices until its plugin registers
//!   again (0 and 0), and goes the same way when it does not;
//! - every status update re-writes the values of the resources the device manager still holds
//!   (a key someone else removed comes back); a dropped resource is never written again.

use crate::state::ResourceState;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The kubelet's `endpointStopGracePeriod`.
pub const STOP_GRACE: Duration = Duration::from_secs(5 * 60);
/// The kubelet's default `nodeStatusUpdateFrequency`.
pub const UPDATE_EVERY: Duration = Duration::from_secs(10);

/// Where and how the kubelet writes the node's status.
#[derive(Clone)]
pub struct NodeStatusConfig {
    /// Client of the API server.
    pub client: kube::Client,
    /// This node's name.
    pub node: String,
    /// How long a plugin that went is kept (its devices unhealthy) before its resource is
    /// dropped and written as 0 ([`STOP_GRACE`] in the kubelet).
    pub stop_grace: Duration,
    /// How often the status is written without a change ([`UPDATE_EVERY`]).
    pub update_every: Duration,
}

/// One resource's values in the node's status, as quantities of devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Amounts {
    /// `status.capacity`: every device.
    pub capacity: u64,
    /// `status.allocatable`: the healthy devices.
    pub allocatable: u64,
}

impl Amounts {
    const ZERO: Amounts = Amounts {
        capacity: 0,
        allocatable: 0,
    };
}

/// What the device manager reports at one status update.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Resources the device manager holds, with their values (written at every update).
    pub held: BTreeMap<String, Amounts>,
    /// Resources dropped at this update (their plugin gone longer than the grace period): written
    /// as 0 once.
    pub dropped: BTreeSet<String>,
}

/// The device manager's memory of resources across updates: when each plugin went.
#[derive(Debug, Default)]
pub struct DeviceManager {
    /// Resources it holds; `Some(t)`: no plugin stream open since `t`.
    held: BTreeMap<String, Option<Instant>>,
}

impl DeviceManager {
    /// The report at `now` for the registrations in `resources` (the fake kubelet's state: a
    /// resource without open streams is a plugin that went; one missing after having been held
    /// was forgotten by a kubelet restart).
    pub fn report(
        &mut self,
        resources: &BTreeMap<String, ResourceState>,
        now: Instant,
        stop_grace: Duration,
    ) -> Report {
        let mut report = Report::default();
        for (name, r) in resources {
            let serving = !r.streams.is_empty();
            if !serving && !self.held.contains_key(name) {
                // Dropped earlier, or never seen serving: nothing to report.
                continue;
            }
            let gone_since = self.held.entry(name.clone()).or_insert(None);
            if serving {
                *gone_since = None;
            } else {
                gone_since.get_or_insert(now);
            }
            report.held.insert(
                name.clone(),
                Amounts {
                    capacity: u64::try_from(r.devices.len()).unwrap_or(u64::MAX),
                    allocatable: u64::try_from(r.healthy_ids().count()).unwrap_or(u64::MAX),
                },
            );
        }
        let restored: Vec<String> = self
            .held
            .keys()
            .filter(|name| !resources.contains_key(*name))
            .cloned()
            .collect();
        for name in restored {
            if let Some(gone_since) = self.held.get_mut(&name) {
                gone_since.get_or_insert(now);
            }
            report.held.insert(name, Amounts::ZERO);
        }
        let expired: Vec<String> = self
            .held
            .iter()
            .filter(|(_, gone)| gone.is_some_and(|t| now.duration_since(t) >= stop_grace))
            .map(|(name, _)| name.clone())
            .collect();
        for name in expired {
            self.held.remove(&name);
            report.held.remove(&name);
            report.dropped.insert(name);
        }
        report
    }

    /// When the next held resource's grace period ends (`None`: every plugin is serving).
    pub fn next_drop(&self, stop_grace: Duration) -> Option<Instant> {
        self.held.values().flatten().map(|t| *t + stop_grace).min()
    }
}

/// The merge patch that brings `node`'s status to `want` (`None`: it already holds it). Only
/// the keys in `want` are touched; their values are decimal device counts.
pub fn patch_for(node: &Node, want: &BTreeMap<String, Amounts>) -> Option<serde_json::Value> {
    let status = node.status.clone().unwrap_or_default();
    let capacity = status.capacity.unwrap_or_default();
    let allocatable = status.allocatable.unwrap_or_default();
    let mut cap_patch = serde_json::Map::new();
    let mut alloc_patch = serde_json::Map::new();
    for (name, amounts) in want {
        let c = amounts.capacity.to_string();
        if capacity.get(name).map(|q| q.0.as_str()) != Some(c.as_str()) {
            cap_patch.insert(name.clone(), c.into());
        }
        let a = amounts.allocatable.to_string();
        if allocatable.get(name).map(|q| q.0.as_str()) != Some(a.as_str()) {
            alloc_patch.insert(name.clone(), a.into());
        }
    }
    if cap_patch.is_empty() && alloc_patch.is_empty() {
        return None;
    }
    Some(serde_json::json!({
        "status": {"capacity": cap_patch, "allocatable": alloc_patch},
    }))
}

/// Brings the node's status to `want`; returns whether it wrote.
async fn write(cfg: &NodeStatusConfig, want: &BTreeMap<String, Amounts>) -> Result<bool, String> {
    let nodes: Api<Node> = Api::all(cfg.client.clone());
    let node = nodes
        .get(&cfg.node)
        .await
        .map_err(|e| format!("read node {}: {e}", cfg.node))?;
    let Some(patch) = patch_for(&node, want) else {
        return Ok(false);
    };
    nodes
        .patch_status(&cfg.node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| format!("patch the status of node {}: {e}", cfg.node))?;
    tracing::info!(node = %cfg.node, %patch, "node status written");
    Ok(true)
}

/// Writes the device-plugin resources into the node's status until `cancel`: at every change of
/// the registrations, every [`NodeStatusConfig::update_every`] and when a grace period ends.
/// `resources` reads the registrations; `changes` ticks at every change of them.
pub(crate) async fn run(
    cfg: NodeStatusConfig,
    resources: impl Fn() -> BTreeMap<String, ResourceState>,
    mut changes: tokio::sync::watch::Receiver<u64>,
    cancel: CancellationToken,
) {
    let mut manager = DeviceManager::default();
    // Dropped resources whose 0 is not written yet (a failed write is tried again).
    let mut dropped_unwritten: BTreeSet<String> = BTreeSet::new();
    loop {
        let report = manager.report(&resources(), Instant::now(), cfg.stop_grace);
        dropped_unwritten.extend(report.dropped);
        let mut want = report.held;
        for name in &dropped_unwritten {
            want.entry(name.clone()).or_insert(Amounts::ZERO);
        }
        if !want.is_empty() {
            match write(&cfg, &want).await {
                Ok(_) => dropped_unwritten.clear(),
                Err(e) => tracing::warn!("{e}; trying again at the next status update"),
            }
        }
        let next_update = Instant::now() + cfg.update_every;
        let wake = manager
            .next_drop(cfg.stop_grace)
            .map_or(next_update, |t| t.min(next_update));
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = changes.changed() => if r.is_err() { return },
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::DeviceState;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    const R: &str = "aliyun/erdma";
    const GRACE: Duration = Duration::from_secs(300);

    fn resource(healthy: &[&str], unhealthy: &[&str], serving: bool) -> ResourceState {
        let device = |id: &&str, health: &str| DeviceState {
            id: id.to_string(),
            health: health.into(),
            numa: vec![],
        };
        ResourceState {
            endpoint: "p.sock".into(),
            devices: healthy
                .iter()
                .map(|id| device(id, "Healthy"))
                .chain(unhealthy.iter().map(|id| device(id, "Unhealthy")))
                .collect(),
            connected: serving,
            streams: if serving {
                vec!["p.sock".into()]
            } else {
                vec![]
            },
            ..Default::default()
        }
    }

    fn one(r: ResourceState) -> BTreeMap<String, ResourceState> {
        BTreeMap::from([(R.to_string(), r)])
    }

    fn held(capacity: u64, allocatable: u64) -> Report {
        Report {
            held: BTreeMap::from([(
                R.to_string(),
                Amounts {
                    capacity,
                    allocatable,
                },
            )]),
            dropped: BTreeSet::new(),
        }
    }

    fn dropped() -> Report {
        Report {
            held: BTreeMap::new(),
            dropped: BTreeSet::from([R.to_string()]),
        }
    }

    #[test]
    fn capacity_counts_every_device_and_allocatable_the_healthy_ones() {
        let mut m = DeviceManager::default();
        let t = Instant::now();
        let r = one(resource(&["a", "b", "c"], &["d"], true));
        assert_eq!(m.report(&r, t, GRACE), held(4, 3));
        assert_eq!(m.next_drop(GRACE), None);
    }

    #[test]
    fn a_plugin_that_went_keeps_capacity_then_is_written_as_0_once_after_the_grace_period() {
        let mut m = DeviceManager::default();
        let t = Instant::now();
        m.report(&one(resource(&["a", "b"], &[], true)), t, GRACE);
        let gone = one(resource(&[], &["a", "b"], false));
        assert_eq!(
            m.report(&gone, t + Duration::from_secs(1), GRACE),
            held(2, 0)
        );
        assert_eq!(m.next_drop(GRACE), Some(t + Duration::from_secs(1) + GRACE));
        assert_eq!(
            m.report(&gone, t + Duration::from_secs(300), GRACE),
            held(2, 0)
        );
        assert_eq!(
            m.report(&gone, t + Duration::from_secs(301), GRACE),
            dropped()
        );
        assert_eq!(
            m.report(&gone, t + Duration::from_secs(400), GRACE),
            Report::default()
        );
    }

    #[test]
    fn a_plugin_back_within_the_grace_period_is_held_again() {
        let mut m = DeviceManager::default();
        let t = Instant::now();
        m.report(&one(resource(&["a"], &[], true)), t, GRACE);
        m.report(&one(resource(&[], &["a"], false)), t, GRACE);
        let back = one(resource(&["a"], &[], true));
        assert_eq!(
            m.report(&back, t + Duration::from_secs(200), GRACE),
            held(1, 1)
        );
        assert_eq!(
            m.report(&back, t + Duration::from_secs(600), GRACE),
            held(1, 1)
        );
    }

    #[test]
    fn after_a_kubelet_restart_a_resource_is_0_until_its_plugin_registers_or_the_grace_ends() {
        let mut m = DeviceManager::default();
        let t = Instant::now();
        m.report(&one(resource(&["a", "b"], &[], true)), t, GRACE);
        let restarted = BTreeMap::new();
        assert_eq!(m.report(&restarted, t, GRACE), held(0, 0));
        assert_eq!(m.report(&restarted, t + GRACE, GRACE), dropped());
        assert_eq!(
            m.report(&restarted, t + GRACE * 2, GRACE),
            Report::default()
        );
    }

    #[test]
    fn a_resource_never_seen_serving_is_not_reported() {
        let mut m = DeviceManager::default();
        let r = one(resource(&[], &["a"], false));
        assert_eq!(m.report(&r, Instant::now(), GRACE), Report::default());
    }

    fn node(capacity: &[(&str, &str)], allocatable: &[(&str, &str)]) -> Node {
        let list = |l: &[(&str, &str)]| {
            l.iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect()
        };
        Node {
            status: Some(NodeStatus {
                capacity: Some(list(capacity)),
                allocatable: Some(list(allocatable)),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_patch_sets_only_the_values_that_differ_and_leaves_other_keys() {
        let want = BTreeMap::from([(
            R.to_string(),
            Amounts {
                capacity: 2,
                allocatable: 0,
            },
        )]);
        let n = node(&[("cpu", "4"), (R, "2")], &[("cpu", "4"), (R, "2")]);
        assert_eq!(
            patch_for(&n, &want),
            Some(serde_json::json!({"status": {"capacity": {}, "allocatable": {R: "0"}}}))
        );
        let n = node(&[("cpu", "4")], &[("cpu", "4")]);
        assert_eq!(
            patch_for(&n, &want),
            Some(serde_json::json!({"status": {"capacity": {R: "2"}, "allocatable": {R: "0"}}}))
        );
        let n = node(&[(R, "2")], &[(R, "0")]);
        assert_eq!(patch_for(&n, &want), None);
    }
}
