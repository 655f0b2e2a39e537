//! Prometheus metrics of the plugin, registered in the process's registry (the agent serves it).

use crate::devices::ServedSet;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Labels of the device gauge.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabels {
    /// `healthy` or `unhealthy`.
    pub health: String,
    /// Protocol mode (`iwarp`, `roce`, `infiniband`, `unknown`).
    pub mode: String,
}

/// Labels with a device name.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceName {
    /// RDMA device name.
    pub device: String,
}

/// Labels with a result.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `ok` or `error`.
    pub result: String,
}

/// Labels with what prompted a registration attempt.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabel {
    /// `served` (the first attempt after serving the socket), `kubelet_socket` (`kubelet.sock`
    /// appeared), `kubelet_socket_retry` (a new `kubelet.sock` that did not accept yet, retried
    /// at short steps) or `backoff` (the back-off timer).
    pub trigger: String,
}

/// All plugin metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Devices by health and mode.
    pub devices: Family<DeviceLabels, Gauge>,
    /// Distinct slots handed out by Allocate, per device.
    pub slots_allocated: Family<DeviceName, Gauge>,
    /// Allocate latency in seconds.
    pub allocate_seconds: Histogram,
    /// Register calls by result.
    pub registrations: Family<ResultLabel, Counter>,
    /// Register attempts by what prompted them.
    pub registration_attempts: Family<TriggerLabel, Counter>,
    /// Kubelet restarts noticed.
    pub kubelet_restarts: Counter,
    /// ListAndWatch messages sent.
    pub list_and_watch_updates: Counter,
    /// Device snapshots taken in from the inventory (changed or not).
    pub inventory_snapshots: Counter,
    /// Devices granted by Allocate while unhealthy (offered by the kubelet before they turned).
    pub allocated_unhealthy: Family<DeviceName, Counter>,
    /// Whether the plugin is registered with the kubelet now.
    registered: AtomicBool,
    /// Set once a ListAndWatch stream has handed the kubelet's transport a device list with at
    /// least one device ([`Metrics::devices_handed_over`]).
    devices_handed: tokio::sync::SetOnce<()>,
    allocated: Mutex<BTreeSet<erdma_model::SlotId>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates every metric in a registry of its own (prefix `erdma_deviceplugin`), which
    /// [`Self::encode`] renders: for the plugin alone and its tests.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let mut m = Self::register(&mut registry);
        m.registry = Mutex::new(registry);
        m
    }

    /// Creates every metric and registers it in `root` under the `erdma_deviceplugin` prefix: the
    /// process's one registry, which its HTTP server renders ([`Self::encode`] is then empty).
    pub fn register(root: &mut Registry) -> Self {
        let registry = root.sub_registry_with_prefix("erdma_deviceplugin");
        let devices = Family::<DeviceLabels, Gauge>::default();
        let slots_allocated = Family::<DeviceName, Gauge>::default();
        let allocate_seconds = Histogram::new([
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25,
        ]);
        let registrations = Family::<ResultLabel, Counter>::default();
        let registration_attempts = Family::<TriggerLabel, Counter>::default();
        let kubelet_restarts = Counter::default();
        let list_and_watch_updates = Counter::default();
        let inventory_snapshots = Counter::default();
        let allocated_unhealthy = Family::<DeviceName, Counter>::default();
        registry.register(
            "devices",
            "RDMA devices served, by health and protocol mode",
            devices.clone(),
        );
        registry.register(
            "slots_allocated",
            "Slots in use per device: from the kubelet's pod resources when configured (every 10 s), else distinct slots handed out by Allocate",
            slots_allocated.clone(),
        );
        registry.register(
            "allocate_duration_seconds",
            "Allocate latency",
            allocate_seconds.clone(),
        );
        registry.register(
            "registrations",
            "Register calls to the kubelet, by result",
            registrations.clone(),
        );
        registry.register(
            "registration_attempts",
            "Register attempts, by what prompted them: served, kubelet_socket, kubelet_socket_retry, backoff",
            registration_attempts.clone(),
        );
        registry.register(
            "kubelet_restarts",
            "Kubelet restarts noticed",
            kubelet_restarts.clone(),
        );
        registry.register(
            "list_and_watch_updates",
            "ListAndWatch messages sent",
            list_and_watch_updates.clone(),
        );
        registry.register(
            "inventory_snapshots",
            "Device snapshots taken in from the inventory, changed or not",
            inventory_snapshots.clone(),
        );
        registry.register(
            "allocated_unhealthy",
            "Devices granted by Allocate while unhealthy: the kubelet offered them at its last ListAndWatch update and has the change now; refusing would fail the pod's admission for good",
            allocated_unhealthy.clone(),
        );
        Metrics {
            registry: Mutex::new(Registry::default()),
            devices,
            slots_allocated,
            allocate_seconds,
            registrations,
            registration_attempts,
            kubelet_restarts,
            list_and_watch_updates,
            inventory_snapshots,
            allocated_unhealthy,
            registered: AtomicBool::new(false),
            devices_handed: tokio::sync::SetOnce::new(),
            allocated: Mutex::new(BTreeSet::new()),
        }
    }

    /// Refreshes the device gauges from a served set.
    pub fn observe_devices(&self, set: &ServedSet) {
        self.devices.clear();
        for d in set.devices.values() {
            let labels = DeviceLabels {
                health: if d.healthy() { "healthy" } else { "unhealthy" }.to_string(),
                mode: d
                    .device
                    .mode
                    .map(|m| m.name().to_string())
                    .unwrap_or_else(|| "unknown".into()),
            };
            self.devices.get_or_create(&labels).inc();
        }
    }

    /// Records slots handed out by Allocate.
    pub fn observe_allocated(&self, slots: &[erdma_model::SlotId]) {
        let mut all = self.allocated.lock().unwrap_or_else(|p| p.into_inner());
        for s in slots {
            if all.insert(s.clone()) {
                self.slots_allocated
                    .get_or_create(&DeviceName {
                        device: s.device.clone(),
                    })
                    .inc();
            }
        }
    }

    /// Replaces the per-device slot gauge with what the kubelet's pod-resources API reports as in
    /// use now (more accurate than the Allocate history: it drops when pods go away).
    pub fn set_slots_in_use(&self, used: &std::collections::BTreeMap<String, u32>) {
        self.slots_allocated.clear();
        for (device, n) in used {
            self.slots_allocated
                .get_or_create(&DeviceName {
                    device: device.clone(),
                })
                .set(i64::from(*n));
        }
    }

    /// Records a Register outcome.
    pub fn observe_registration(&self, ok: bool) {
        self.registrations
            .get_or_create(&ResultLabel {
                result: if ok { "ok" } else { "error" }.into(),
            })
            .inc();
        self.registered.store(ok, Ordering::Relaxed);
    }

    /// Records a Register attempt and what prompted it (a [`TriggerLabel`] value).
    pub fn observe_registration_attempt(&self, trigger: &str) {
        self.registration_attempts
            .get_or_create(&TriggerLabel {
                trigger: trigger.into(),
            })
            .inc();
    }

    /// Marks the plugin as not registered (its server is being re-created).
    pub fn set_unregistered(&self) {
        self.registered.store(false, Ordering::Relaxed);
    }

    /// Whether the last registration succeeded and still stands.
    pub fn is_registered(&self) -> bool {
        self.registered.load(Ordering::Relaxed)
    }

    /// Records that a ListAndWatch stream's transport took a device list with at least one
    /// device and asked for the next message (the list may still be crossing the socket).
    pub fn observe_devices_handed_over(&self) {
        let _ = self.devices_handed.set(());
    }

    /// Returns once a ListAndWatch stream handed the kubelet a device list with at least one
    /// device (at once when one did): the start-up work that can wait for the kubelet to have
    /// the devices waits for this.
    pub async fn devices_handed_over(&self) {
        self.devices_handed.wait().await;
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_gauge_follows_allocate_then_pod_resources() {
        let m = Metrics::new();
        m.observe_allocated(&[
            erdma_model::SlotId::new("erdma_0", 1),
            erdma_model::SlotId::new("erdma_0", 2),
        ]);
        m.observe_allocated(&[erdma_model::SlotId::new("erdma_0", 1)]);
        assert!(
            m.encode()
                .contains("erdma_deviceplugin_slots_allocated{device=\"erdma_0\"} 2")
        );
        let used = [("erdma_1".to_string(), 5u32)].into_iter().collect();
        m.set_slots_in_use(&used);
        let text = m.encode();
        assert!(
            text.contains("erdma_deviceplugin_slots_allocated{device=\"erdma_1\"} 5"),
            "{text}"
        );
        assert!(!text.contains("device=\"erdma_0\""), "{text}");
    }
}
