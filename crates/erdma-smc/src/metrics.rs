//! Prometheus metrics of the SMC-R pod path, for the agent's registry.

use crate::prestart::PreStartOutcome;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Label of the pod-configuration counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `not_requested`, `invalid_annotation`, `host_network`, `configured`, `unsupported` or
    /// `failed`.
    pub outcome: String,
}

/// SMC-R metrics.
#[derive(Debug, Default, Clone)]
pub struct SmcMetrics {
    /// `erdma_smc_pod_configurations_total{outcome}`: PreStart / init decisions.
    pub pods: Family<OutcomeLabel, Counter>,
    /// `erdma_smc_policy_namespaces`: namespaces in the BPF policy now.
    pub policy_namespaces: Gauge,
}

impl SmcMetrics {
    /// Creates the metrics and registers them under `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = SmcMetrics::default();
        registry.register(
            "erdma_smc_pod_configurations",
            "SMC-R decisions for pods, by outcome",
            m.pods.clone(),
        );
        registry.register(
            "erdma_smc_policy_namespaces",
            "Network namespaces whose TCP sockets the BPF policy turns into SMC sockets",
            m.policy_namespaces.clone(),
        );
        m
    }

    /// Counts one outcome.
    pub fn record(&self, outcome: &PreStartOutcome) {
        let name = outcome.label();
        self.pods
            .get_or_create(&OutcomeLabel {
                outcome: name.to_string(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_counted_in_the_text_format() {
        let mut r = Registry::default();
        let m = SmcMetrics::register(&mut r);
        m.record(&PreStartOutcome::NotRequested);
        m.record(&PreStartOutcome::HostNetwork { pod: "a/b".into() });
        m.record(&PreStartOutcome::HostNetwork { pod: "a/c".into() });
        m.policy_namespaces.set(3);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        assert!(
            text.contains("erdma_smc_pod_configurations_total{outcome=\"host_network\"} 2"),
            "{text}"
        );
        assert!(text.contains("erdma_smc_pod_configurations_total{outcome=\"not_requested\"} 1"));
        assert!(text.contains("erdma_smc_policy_namespaces 3"), "{text}");
    }
}
