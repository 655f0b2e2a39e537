//! The agent's metrics (prefix `erdma_agent`) and the SMC-R metrics (prefix `erdma_smc`),
//! registered in the process's one prometheus-client registry next to the device plugin's; each
//! task gets the handles it updates.

use erdma_driver::DriverStatus;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Renders `registry` as OpenMetrics text.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// The agent's metrics (prefix `erdma_agent`) and the SMC-R metrics (prefix `erdma_smc`).
#[derive(Debug)]
pub struct AgentMetrics {
    /// SMC-R pre-start outcomes and BPF policy size.
    pub smc: erdma_smc::metrics::SmcMetrics,
    /// SMC-R pre-starts whose pod could not be looked up (pod-resources or CRI unavailable).
    pub smcr_lookup_failures: Counter,
    /// 1 while the driver is ready (devices may be advertised).
    pub driver_ready: Gauge,
    /// 1 while a driver mode change is pending (refused because pods hold the devices).
    pub driver_pending_change: Gauge,
    /// Driver reloads refused because pods held the devices.
    pub driver_reload_refusals: Counter,
    /// ERI netdevs whose setup failed in the last run.
    pub netdev_setup_failures: Gauge,
    /// 1 while another device plugin serves the resource on this node.
    pub device_plugin_conflict: Gauge,
    /// Re-registrations after another device plugin for the resource had gone.
    pub device_plugin_reclaims: Counter,
}

impl AgentMetrics {
    /// Creates the agent's and the SMC-R metrics and registers them in `root`, the process's one
    /// registry.
    pub fn register(root: &mut Registry) -> Self {
        let smc = erdma_smc::metrics::SmcMetrics::register(root);
        let registry = root.sub_registry_with_prefix("erdma_agent");
        let smcr_lookup_failures = Counter::default();
        registry.register(
            "smcr_lookup_failures",
            "SMC-R pre-starts whose pod could not be looked up (kubelet pod-resources or container runtime unavailable)",
            smcr_lookup_failures.clone(),
        );
        let driver_ready = Gauge::default();
        let driver_pending_change = Gauge::default();
        let driver_reload_refusals = Counter::default();
        let netdev_setup_failures = Gauge::default();
        registry.register(
            "driver_ready",
            "1 while the erdma driver is ready and devices may be advertised",
            driver_ready.clone(),
        );
        registry.register(
            "driver_pending_change",
            "1 while a driver mode change is pending because pods hold aliyun/erdma",
            driver_pending_change.clone(),
        );
        registry.register(
            "driver_reload_refusals",
            "Driver reloads refused because pods held aliyun/erdma",
            driver_reload_refusals.clone(),
        );
        registry.register(
            "eri_netdev_setup_failures",
            "ERI netdevs whose setup failed in the last run",
            netdev_setup_failures.clone(),
        );
        let device_plugin_conflict = Gauge::default();
        let device_plugin_reclaims = Counter::default();
        registry.register(
            "device_plugin_conflict",
            "1 while another device plugin (terway's eRDMA ENI plugin, the original agent) serves the same resource on this node",
            device_plugin_conflict.clone(),
        );
        registry.register(
            "device_plugin_reclaims",
            "Re-registrations with the kubelet after another device plugin for the resource had gone",
            device_plugin_reclaims.clone(),
        );
        AgentMetrics {
            smc,
            smcr_lookup_failures,
            driver_ready,
            driver_pending_change,
            driver_reload_refusals,
            netdev_setup_failures,
            device_plugin_conflict,
            device_plugin_reclaims,
        }
    }

    /// Counts a driver status: readiness, a pending change, and a newly refused reload (once per
    /// pending change; `previous` is the status before).
    pub fn observe_driver(&self, previous: Option<&DriverStatus>, now: &DriverStatus) {
        self.driver_ready.set(i64::from(now.ready));
        self.driver_pending_change
            .set(i64::from(now.pending.is_some()));
        if let Some(p) = &now.pending {
            let same = previous
                .and_then(|s| s.pending.as_ref())
                .is_some_and(|q| q.to == p.to && q.from == p.from);
            if !same {
                self.driver_reload_refusals.inc();
            }
        }
    }
}
