//! The SMC-R decision for a pod's sandbox (at NRI `RunPodSandbox`, or in the device plugin's
//! `PreStartContainer` once the agent found the pod and its sandbox): configure its namespace
//! when the annotation asks for it.
//! The container fails only in strict mode; otherwise every problem is an outcome to report
//! (Event + metric) and the pod starts on TCP.

use crate::annotation::SmcRequest;
use crate::configure::{PodReport, SmcConfigurator};
use erdma_model::PnetId;
use serde::Serialize;
use std::path::PathBuf;

/// What the SMC-R decision knows about a pod's sandbox (from the NRI `RunPodSandbox` event or from
/// the container runtime in `PreStartContainer`), built by [`PodSandbox::new`] only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSandbox {
    /// `namespace/name`, for messages.
    pub pod: String,
    /// The pod's network namespace as seen from the agent; `None`: the pod uses the node's.
    pub netns: Option<PathBuf>,
    /// What the pod's annotation asks for, read once ([`SmcRequest::from_annotations`]).
    pub request: SmcRequest,
    /// The devices the pod holds (device plugin slot IDs, or DRA device names), for messages.
    pub devices: Vec<String>,
}

impl PodSandbox {
    /// The sandbox of pod `namespace/name`: its network namespace (`None` for a host-network
    /// pod), the request its annotation made, the devices it holds.
    pub fn new(
        namespace: &str,
        name: &str,
        netns: Option<PathBuf>,
        request: SmcRequest,
        devices: Vec<String>,
    ) -> Self {
        PodSandbox {
            pod: format!("{namespace}/{name}"),
            netns,
            request,
            devices,
        }
    }
}

/// The kind of a pre-start decision: the metric label and the `/healthz` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    /// No annotation, or `"false"`.
    NotRequested,
    /// Annotation value other than true/false.
    InvalidAnnotation,
    /// Host-network pod.
    HostNetwork,
    /// SMC-R is on for the pod.
    Configured,
    /// The kernel cannot do SMC-R.
    Unsupported,
    /// Configuring failed.
    Failed,
    /// The pod could not be looked up (pod-resources or CRI unavailable): no decision was made.
    LookupFailed,
}

impl OutcomeKind {
    /// The stable snake_case name, for metric labels and logs.
    pub fn label(self) -> &'static str {
        match self {
            OutcomeKind::NotRequested => "not_requested",
            OutcomeKind::InvalidAnnotation => "invalid_annotation",
            OutcomeKind::HostNetwork => "host_network",
            OutcomeKind::Configured => "configured",
            OutcomeKind::Unsupported => "unsupported",
            OutcomeKind::Failed => "failed",
            OutcomeKind::LookupFailed => "lookup_failed",
        }
    }
}

/// The type of a Kubernetes Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// `Normal`.
    Normal,
    /// `Warning`.
    Warning,
}

impl EventType {
    /// The API value.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PreStartOutcome {
    /// No annotation, or `"false"`.
    NotRequested,
    /// Annotation value other than true/false: treated as false.
    InvalidAnnotation {
        /// The problem, naming the pod and the value.
        problem: String,
    },
    /// Host-network pod: never touched.
    HostNetwork {
        /// The pod.
        pod: String,
    },
    /// SMC-R is on for the pod.
    Configured {
        /// The report.
        report: PodReport,
    },
    /// The kernel cannot do SMC-R; the pod runs on TCP.
    Unsupported {
        /// The report (its `unsupported` says why).
        report: PodReport,
    },
    /// Configuring failed (namespace gone, pnet conflict, policy error).
    Failed {
        /// The pod.
        pod: String,
        /// The error.
        error: String,
    },
}

impl PreStartOutcome {
    /// The kind of the outcome.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            PreStartOutcome::NotRequested => OutcomeKind::NotRequested,
            PreStartOutcome::InvalidAnnotation { .. } => OutcomeKind::InvalidAnnotation,
            PreStartOutcome::HostNetwork { .. } => OutcomeKind::HostNetwork,
            PreStartOutcome::Configured { .. } => OutcomeKind::Configured,
            PreStartOutcome::Unsupported { .. } => OutcomeKind::Unsupported,
            PreStartOutcome::Failed { .. } => OutcomeKind::Failed,
        }
    }

    /// A stable snake_case name of the outcome, for metric labels and logs.
    pub fn label(&self) -> &'static str {
        self.kind().label()
    }

    /// The type and reason of the pod Event for this outcome (sent when
    /// [`Self::event_message`] has something to say).
    pub fn event_reason(&self) -> (EventType, &'static str) {
        match self {
            PreStartOutcome::Configured { .. } => (EventType::Normal, "SmcrEnabled"),
            PreStartOutcome::InvalidAnnotation { .. } => {
                (EventType::Warning, "SmcrInvalidAnnotation")
            }
            PreStartOutcome::Unsupported { .. } => (EventType::Warning, "SmcrUnsupported"),
            _ => (EventType::Warning, "SmcrFailed"),
        }
    }

    /// Whether `PreStartContainer` must return an error (fail the container): only in strict
    /// mode, when SMC-R was requested and is not on.
    pub fn fails_container(&self, strict: bool) -> bool {
        strict
            && matches!(
                self,
                PreStartOutcome::Unsupported { .. } | PreStartOutcome::Failed { .. }
            )
    }

    /// A one-line message for a Kubernetes Event / log, `None` when there is nothing to say.
    pub fn event_message(&self) -> Option<String> {
        match self {
            PreStartOutcome::NotRequested | PreStartOutcome::HostNetwork { .. } => None,
            PreStartOutcome::InvalidAnnotation { problem } => Some(problem.clone()),
            PreStartOutcome::Configured { report } => Some(format!(
                "SMC-R enabled ({})",
                report
                    .mechanism
                    .map(|m| format!("{m:?}"))
                    .unwrap_or_default()
            )),
            PreStartOutcome::Unsupported { report } => report.unsupported.clone(),
            PreStartOutcome::Failed { pod, error } => {
                Some(format!("pod {pod}: SMC-R not enabled: {error}"))
            }
        }
    }
}

impl SmcConfigurator {
    /// The `PreStartContainer` step for SMC-R (blocking; run it in `spawn_blocking`). `pnetid`
    /// is the PNET ID of the granted device (`None`: none of them has one, and SMC-R cannot pair
    /// the pod's interface with an RDMA device).
    pub fn prestart(&self, pod: &PodSandbox, pnetid: Option<&PnetId>) -> PreStartOutcome {
        let request = &pod.request;
        if let Some(problem) = request.problem(&pod.pod) {
            tracing::warn!(pod = %pod.pod, %problem, "smc: invalid annotation");
            return PreStartOutcome::InvalidAnnotation { problem };
        }
        if !request.enabled() {
            return PreStartOutcome::NotRequested;
        }
        let Some(netns) = &pod.netns else {
            return PreStartOutcome::HostNetwork {
                pod: pod.pod.clone(),
            };
        };
        let Some(pnetid) = pnetid else {
            return PreStartOutcome::Failed {
                pod: pod.pod.clone(),
                error: format!(
                    "none of the granted devices {:?} has a PNET ID (sysfs ports/1/pnetid or the ERI's MAC); SMC-R needs one to pair the pod's eth0 with the RDMA device",
                    pod.devices
                ),
            };
        };
        match self.configure_pod(netns, pnetid) {
            Ok(report) if report.skipped.is_some() => PreStartOutcome::HostNetwork {
                pod: pod.pod.clone(),
            },
            Ok(report) if report.unsupported.is_some() => PreStartOutcome::Unsupported { report },
            Ok(report) => PreStartOutcome::Configured { report },
            Err(e) => PreStartOutcome::Failed {
                pod: pod.pod.clone(),
                error: e.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotation::SMCR_ANNOTATION;
    use crate::configure::PodOptions;

    fn sandbox(value: Option<&str>, host: bool, netns: Option<&str>) -> PodSandbox {
        let annotations: std::collections::BTreeMap<String, String> = value
            .map(|v| [(SMCR_ANNOTATION.to_string(), v.to_string())].into())
            .unwrap_or_default();
        PodSandbox::new(
            "default",
            "web-0",
            netns.filter(|_| !host).map(PathBuf::from),
            SmcRequest::from_annotations(&annotations),
            vec!["erdma_0/1".into()],
        )
    }

    fn configurator() -> SmcConfigurator {
        SmcConfigurator::new(
            PodOptions {
                host_netns: PathBuf::from("/proc/self/ns/net"),
                ..PodOptions::default()
            },
            None,
        )
    }

    #[test]
    fn decisions_before_touching_anything() {
        let c = configurator();
        let id = PnetId::parse("ABC").unwrap();
        assert_eq!(
            c.prestart(&sandbox(None, false, Some("/x")), Some(&id)),
            PreStartOutcome::NotRequested
        );
        assert_eq!(
            c.prestart(&sandbox(Some("false"), false, Some("/x")), Some(&id)),
            PreStartOutcome::NotRequested
        );
        let o = c.prestart(&sandbox(Some("yes"), false, Some("/x")), Some(&id));
        let msg = o.event_message().unwrap();
        assert!(
            msg.contains("default/web-0") && msg.contains("\"yes\""),
            "{msg}"
        );
        assert!(
            !o.fails_container(true),
            "an invalid value is treated as false"
        );
        let o = c.prestart(&sandbox(Some("true"), true, None), Some(&id));
        assert!(matches!(o, PreStartOutcome::HostNetwork { .. }), "{o:?}");
        assert_eq!(o.event_message(), None);
        // A sandbox that claims its own netns but is the host's: skipped too.
        let o = c.prestart(
            &sandbox(Some("true"), false, Some("/proc/self/ns/net")),
            Some(&id),
        );
        assert!(matches!(o, PreStartOutcome::HostNetwork { .. }), "{o:?}");
    }

    #[test]
    fn no_pnet_id_fails_an_annotated_pod_naming_its_devices() {
        let c = configurator();
        assert_eq!(
            c.prestart(&sandbox(None, false, Some("/x")), None),
            PreStartOutcome::NotRequested
        );
        let o = c.prestart(&sandbox(Some("true"), true, None), None);
        assert!(matches!(o, PreStartOutcome::HostNetwork { .. }), "{o:?}");
        let o = c.prestart(&sandbox(Some("true"), false, Some("/x")), None);
        assert_eq!(o.kind(), OutcomeKind::Failed);
        assert_eq!(o.label(), "failed");
        assert_eq!(o.event_reason(), (EventType::Warning, "SmcrFailed"));
        let msg = o.event_message().unwrap();
        assert!(
            msg.contains("PNET ID") && msg.contains("erdma_0/1"),
            "{msg}"
        );
        assert!(!o.fails_container(false) && o.fails_container(true));
    }

    #[test]
    fn gone_namespace_fails_only_in_strict_mode() {
        let c = configurator();
        let id = PnetId::parse("ABC").unwrap();
        let o = c.prestart(
            &sandbox(
                Some("true"),
                false,
                Some("/proc/self/task/999999999/ns/net"),
            ),
            Some(&id),
        );
        assert!(matches!(o, PreStartOutcome::Failed { .. }), "{o:?}");
        assert!(o.event_message().unwrap().contains("is gone"));
        assert!(!o.fails_container(false));
        assert!(o.fails_container(true));
    }

    /// A kernel without SMC: an annotated pod in a real namespace is "unsupported", the pod starts
    /// on TCP unless strict.
    #[test]
    #[ignore = "needs root and a kernel without SMC; run with --ignored by scripts/test.sh on the CI host (its kernel has no smc) and by crates/erdma-smc/lab/run-smcr.sh in the 7.3 VM"]
    fn real_namespace_without_smc_is_unsupported() {
        crate::testing::require_kernel_without_smc();
        let (ns, stop) = crate::testing::private_netns();
        let o = configurator().prestart(
            &sandbox(Some("true"), false, Some(ns.to_str().unwrap())),
            Some(&PnetId::parse("ABC").unwrap()),
        );
        assert!(matches!(o, PreStartOutcome::Unsupported { .. }), "{o:?}");
        assert!(o.event_message().unwrap().starts_with("SMC unsupported: "));
        assert!(!o.fails_container(false) && o.fails_container(true));
        drop(stop);
    }
}
