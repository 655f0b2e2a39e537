//! The agent's metrics (prefix `erdma_agent`), the SMC-R metrics (prefix `erdma_smc`), the NRI
//! plugin's (prefix `erdma_nri`) and the DRA driver's (prefix `erdma_dra`), registered in the
//! process's one prometheus-client registry next to the device plugin's; each task gets the
//! handles it updates.

use erdma_dra::server::{Call, CallObserver, CallOutcome};
use erdma_driver::DriverStatus;
use erdma_nri::plugin::{Hook, HookObserver, Outcome, SessionEnd};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Duration;

/// Renders `registry` as OpenMetrics text (what `/metrics` serves).
pub fn encode(registry: &Registry) -> String {
    erdma_host::http::encode(registry)
}

/// Labels of the NRI hook histogram, both from closed sets: [`Hook::name`] (Configure,
/// Synchronize, Shutdown, the 14 NRI events) and [`Outcome::name`] (ok, error, over_budget).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NriHookLabels {
    /// What the runtime called.
    pub hook: &'static str,
    /// How it ended.
    pub outcome: &'static str,
}

/// A histogram of NRI hook durations, by hook and outcome.
pub type NriHookFamily = Family<NriHookLabels, Histogram, fn() -> Histogram>;

/// Labels of `erdma_nri_sessions_total`, from a closed set ([`SessionEnd::name`]).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NriSessionLabels {
    /// How the session ended: `ended`, `config_error`, `connect_error`, `register_error`,
    /// `session_error`.
    pub end: &'static str,
}

/// Labels of `erdma_dra_dropped_fields`, from a closed set ([`erdma_dra::readback::SLICE_FIELDS`]).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DroppedFieldLabels {
    /// The ResourceSlice field (`taints`, `allowMultipleAllocations`, `capacity.requestPolicy`).
    pub field: &'static str,
    /// The API server's feature gate that drops it (`DRADeviceTaints`, `DRAConsumableCapacity`).
    pub feature_gate: &'static str,
}

/// `erdma_dra_dropped_fields`: devices of this node's ResourceSlice whose field the API server
/// dropped, by field and feature gate (0 when stored).
pub type DroppedFieldsFamily = Family<DroppedFieldLabels, Gauge>;

/// Labels of `erdma_dra_calls_total`, both from closed sets: [`Call::name`] (`GetInfo`,
/// `NotifyRegistrationStatus`, `NodePrepareResources`, `NodeUnprepareResources`) and
/// [`CallOutcome::name`] (`ok`, `error`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DraCallLabels {
    /// The kubelet's call.
    pub method: &'static str,
    /// How it ended.
    pub outcome: &'static str,
}

/// Labels of the DRA metrics by call alone ([`Call::name`]).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DraMethodLabel {
    /// The kubelet's call.
    pub method: &'static str,
}

/// A histogram of DRA call durations, by call.
pub type DraCallDurationFamily = Family<DraMethodLabel, Histogram, fn() -> Histogram>;

fn dra_call_histogram() -> Histogram {
    // From a claim read from the cache (about a millisecond) to an API server that takes
    // seconds to answer the claim's GET.
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ])
}

/// The DRA driver's metrics (prefix `erdma_dra`): the ResourceSlice fields the API server drops,
/// and the kubelet's calls on the driver's sockets ([`CallObserver`]). Clones share the metrics.
#[derive(Debug, Clone)]
pub struct DraMetrics {
    /// `erdma_dra_dropped_fields{field,feature_gate}`.
    pub dropped_fields: DroppedFieldsFamily,
    /// `erdma_dra_calls_total{method,outcome}`.
    pub calls: Family<DraCallLabels, Counter>,
    /// `erdma_dra_call_duration_seconds{method}`.
    pub call_duration: DraCallDurationFamily,
    /// `erdma_dra_claim_errors_total{method}`: claims answered with an error.
    pub claim_errors: Family<DraMethodLabel, Counter>,
}

impl DraMetrics {
    /// Creates the DRA metrics and registers them in `root` under the `erdma_dra` prefix.
    pub fn register(root: &mut Registry) -> Self {
        let registry = root.sub_registry_with_prefix("erdma_dra");
        let m = DraMetrics {
            dropped_fields: DroppedFieldsFamily::default(),
            calls: Family::default(),
            call_duration: DraCallDurationFamily::new_with_constructor(dra_call_histogram),
            claim_errors: Family::default(),
        };
        registry.register(
            "dropped_fields",
            "Devices of this node's ResourceSlice whose field the API server dropped because its feature gate is off, by field and feature gate (0: stored)",
            m.dropped_fields.clone(),
        );
        registry.register(
            "calls",
            "Calls of the kubelet on the DRA driver, by method (GetInfo, NotifyRegistrationStatus, NodePrepareResources, NodeUnprepareResources) and outcome (ok; error: refused, a claim in it failed, or the kubelet refused the registration)",
            m.calls.clone(),
        );
        registry.register(
            "call_duration_seconds",
            "Time from a kubelet call's arrival at the DRA driver to its answer, by method",
            m.call_duration.clone(),
        );
        registry.register(
            "claim_errors",
            "Claims the DRA driver answered with an error (the kubelet retries them), by method",
            m.claim_errors.clone(),
        );
        m
    }
}

impl CallObserver for DraMetrics {
    fn observe(&self, call: Call, outcome: CallOutcome, elapsed: Duration) {
        let method = call.name();
        self.calls
            .get_or_create(&DraCallLabels {
                method,
                outcome: outcome.name(),
            })
            .inc();
        self.call_duration
            .get_or_create(&DraMethodLabel { method })
            .observe(elapsed.as_secs_f64());
        let failed = outcome.claim_errors();
        if failed > 0 {
            self.claim_errors
                .get_or_create(&DraMethodLabel { method })
                .inc_by(u64::try_from(failed).unwrap_or(u64::MAX));
        }
    }
}

fn nri_hook_histogram() -> Histogram {
    // From a plain answer (sub-millisecond) to the lab's raised 8 s budget.
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

/// The agent's metrics (prefix `erdma_agent`), the SMC-R metrics (prefix `erdma_smc`) and the NRI
/// plugin's (prefix `erdma_nri`).
#[derive(Debug)]
pub struct AgentMetrics {
    /// SMC-R pre-start outcomes and BPF policy size.
    pub smc: erdma_smc::metrics::SmcMetrics,
    /// NRI hook durations by hook and outcome (`erdma_nri_hook_duration_seconds`).
    pub nri_hooks: NriHookFamily,
    /// NRI plugin sessions by how they ended (`erdma_nri_sessions_total`).
    pub nri_sessions: Family<NriSessionLabels, Counter>,
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
    /// The DRA driver's metrics (dropped ResourceSlice fields, the kubelet's calls).
    pub dra: DraMetrics,
    /// "Which devices does this pod hold" answered from the kept pod-resources answer
    /// (`answer="kept"`) or by asking the kubelet (`answer="kubelet"`), on a runtime's clock.
    pub holder_lookups:
        prometheus_client::metrics::family::Family<Vec<(&'static str, &'static str)>, Counter>,
    /// The host's cgroup version and whether the rdma v1 hierarchy is mounted (an info gauge).
    pub cgroup: Family<Vec<(&'static str, &'static str)>, Gauge>,
    /// `rdma.max` lines the agent wrote into v1 rdma cgroups, by hook.
    pub rdma_limits_written: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// Container `rdma.max` limits not applied on a v1 or hybrid host, by reason.
    pub rdma_limit_skipped: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// Containers created with an `ERDMA_RDMA_MAX*` value of their own that the agent ignored.
    pub rdma_max_env_ignored: Counter,
}

impl AgentMetrics {
    /// Creates the agent's and the SMC-R metrics and registers them in `root`, the process's one
    /// registry.
    pub fn register(root: &mut Registry) -> Self {
        let smc = erdma_smc::metrics::SmcMetrics::register(root);
        let nri_hooks = NriHookFamily::new_with_constructor(nri_hook_histogram);
        let nri_sessions = Family::<NriSessionLabels, Counter>::default();
        let nri = root.sub_registry_with_prefix("erdma_nri");
        nri.register(
            "hook_duration_seconds",
            "Time from an NRI call's arrival to its answer, by hook (Configure, Synchronize, the event) and outcome (ok, error, over_budget: cut and answered with no change)",
            nri_hooks.clone(),
        );
        nri.register(
            "sessions",
            "NRI plugin sessions with the container runtime, by how they ended (ended: the runtime closed or restarted; config_error, connect_error: the socket is not there, register_error, session_error); the plugin connects again after each",
            nri_sessions.clone(),
        );
        let dra = DraMetrics::register(root);
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
        let holder_lookups = prometheus_client::metrics::family::Family::default();
        registry.register(
            "holder_lookups",
            "Lookups of the devices a pod holds at sandbox creation, by answer: kept (no call) or kubelet (one pod-resources List)",
            holder_lookups.clone(),
        );
        let cgroup = Family::default();
        registry.register(
            "cgroup",
            "1 for the host's cgroup version (v1, hybrid, v2) and whether the rdma controller's v1 hierarchy is mounted (rdma_hierarchy): where containers' rdma.max goes",
            cgroup.clone(),
        );
        let rdma_limits_written = Family::default();
        registry.register(
            "rdma_limits_written",
            "rdma.max lines the agent wrote into containers' cgroup v1 rdma cgroups, by hook (StartContainer; Synchronize: a running container lacked it)",
            rdma_limits_written.clone(),
        );
        let rdma_limit_skipped = Family::default();
        registry.register(
            "rdma_limit_skipped",
            "Container rdma limits not applied on a cgroup v1 or hybrid host (the container runs without; a Warning Event says why), by reason: no_rdma_hierarchy, bad_cgroups_path, write_failed",
            rdma_limit_skipped.clone(),
        );
        let rdma_max_env_ignored = Counter::default();
        registry.register(
            "rdma_max_env_ignored",
            "Containers created with an ERDMA_RDMA_MAX* environment value that the agent's records (DRA claims, the operator's limit, the annotation) do not give them: ignored, never a limit",
            rdma_max_env_ignored.clone(),
        );
        AgentMetrics {
            cgroup,
            rdma_limits_written,
            rdma_limit_skipped,
            rdma_max_env_ignored,
            nri_hooks,
            nri_sessions,
            dra,
            holder_lookups,
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

    /// Counts one lookup of a pod's devices; `kept`: answered without asking the kubelet.
    pub fn holder_lookups(&self, kept: bool) {
        let answer = if kept { "kept" } else { "kubelet" };
        self.holder_lookups
            .get_or_create(&vec![("answer", answer)])
            .inc();
    }

    /// Sets the host's cgroup layout (once, at start).
    pub fn cgroup_layout(&self, version: &'static str, rdma_hierarchy: bool) {
        let hierarchy = if rdma_hierarchy { "true" } else { "false" };
        self.cgroup
            .get_or_create(&vec![("version", version), ("rdma_hierarchy", hierarchy)])
            .set(1);
    }

    /// Counts one `rdma.max` written into a v1 rdma cgroup at `hook`.
    pub fn rdma_limit_written(&self, hook: &'static str) {
        self.rdma_limits_written
            .get_or_create(&vec![("hook", hook)])
            .inc();
    }

    /// Counts one container limit not applied, by `reason` (a closed set).
    pub fn rdma_limit_skipped(&self, reason: &'static str) {
        self.rdma_limit_skipped
            .get_or_create(&vec![("reason", reason)])
            .inc();
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

impl HookObserver for AgentMetrics {
    fn observe(&self, hook: Hook, outcome: Outcome, elapsed: Duration) {
        self.nri_hooks
            .get_or_create(&NriHookLabels {
                hook: hook.name(),
                outcome: outcome.name(),
            })
            .observe(elapsed.as_secs_f64());
    }

    fn session_ended(&self, end: SessionEnd) {
        self.nri_sessions
            .get_or_create(&NriSessionLabels { end: end.name() })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nri_hooks_are_exported_by_hook_and_outcome() {
        let mut registry = Registry::default();
        let m = AgentMetrics::register(&mut registry);
        let event = Hook::Event(erdma_nri::api::Event::RunPodSandbox);
        m.observe(event, Outcome::Ok, Duration::from_millis(3));
        m.observe(event, Outcome::Ok, Duration::from_millis(30));
        m.observe(event, Outcome::OverBudget, Duration::from_millis(801));
        m.session_ended(SessionEnd::ConnectError);
        m.session_ended(SessionEnd::ConnectError);
        m.session_ended(SessionEnd::Ended);
        let text = encode(&registry);
        for line in [
            "# TYPE erdma_nri_hook_duration_seconds histogram",
            r#"erdma_nri_hook_duration_seconds_count{hook="RunPodSandbox",outcome="ok"} 2"#,
            r#"erdma_nri_hook_duration_seconds_bucket{le="0.005",hook="RunPodSandbox",outcome="ok"} 1"#,
            r#"erdma_nri_hook_duration_seconds_count{hook="RunPodSandbox",outcome="over_budget"} 1"#,
            r#"erdma_nri_hook_duration_seconds_bucket{le="0.5",hook="RunPodSandbox",outcome="over_budget"} 0"#,
            r#"erdma_nri_hook_duration_seconds_bucket{le="1.0",hook="RunPodSandbox",outcome="over_budget"} 1"#,
            "# TYPE erdma_nri_sessions counter",
            r#"erdma_nri_sessions_total{end="connect_error"} 2"#,
            r#"erdma_nri_sessions_total{end="ended"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
