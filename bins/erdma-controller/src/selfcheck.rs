//! `erdma-controller --check-install NAMESPACE`: what `helm test` runs. It reads the installation
//! the chart made in NAMESPACE and says, as one JSON object on stdout, whether it serves:
//! the agent DaemonSet ready on every node it is scheduled to (and on at least one), the
//! controller Deployment available (when the install runs one), and every webhook entry carrying
//! a `caBundle` (when the webhook is on; without it the API server cannot call the controller).
//! Exit status 0 when every check passes, 1 otherwise.

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::Api;
use serde::Serialize;

/// The agent DaemonSet's name (fixed by the chart, as in the original).
pub const AGENT_DAEMONSET: &str = "alibabacloud-erdma-agent";
/// The controller Deployment's, Service's and webhook configuration's name.
pub const CONTROLLER_NAME: &str = "alibabacloud-erdma-controller";

/// One check's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// What was checked (`agent`, `controller`, `webhook`).
    pub name: &'static str,
    /// Whether it passed.
    pub ok: bool,
    /// What was seen, and the fix when it failed.
    pub detail: String,
}

/// The whole verdict, as printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Namespace checked.
    pub namespace: String,
    /// Every check.
    pub checks: Vec<Check>,
    /// All passed.
    pub ok: bool,
}

/// The verdict over what was read (`None`: the object does not exist).
pub fn judge(
    namespace: &str,
    agent: Option<&DaemonSet>,
    controller: Option<&Deployment>,
    webhook: Option<&MutatingWebhookConfiguration>,
) -> Report {
    let mut checks = Vec::new();
    checks.push(match agent.and_then(|d| d.status.as_ref()) {
        None => Check {
            name: "agent",
            ok: false,
            detail: format!(
                "DaemonSet {namespace}/{AGENT_DAEMONSET} not found or without status: is the chart installed in {namespace}?"
            ),
        },
        Some(s) if s.desired_number_scheduled == 0 => Check {
            name: "agent",
            ok: false,
            detail: format!(
                "DaemonSet {namespace}/{AGENT_DAEMONSET} is scheduled to no node: check nodeSelector, affinity and tolerations against your eRDMA nodes"
            ),
        },
        Some(s) => Check {
            name: "agent",
            ok: s.number_ready == s.desired_number_scheduled,
            detail: format!(
                "{} of {} agents ready{}",
                s.number_ready,
                s.desired_number_scheduled,
                if s.number_ready == s.desired_number_scheduled {
                    String::new()
                } else {
                    format!(
                        "; see kubectl -n {namespace} get pods -l tier=agent and erdmactl doctor --node NODE"
                    )
                }
            ),
        },
    });
    if let Some(d) = controller {
        let available = d
            .status
            .as_ref()
            .and_then(|s| s.available_replicas)
            .unwrap_or(0);
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        checks.push(Check {
            name: "controller",
            ok: available >= 1,
            detail: format!(
                "{available} of {want} controller replicas available{}",
                if available >= 1 {
                    String::new()
                } else {
                    format!("; see kubectl -n {namespace} logs deploy/{CONTROLLER_NAME}")
                }
            ),
        });
    }
    if let Some(w) = webhook {
        let entries = w.webhooks.clone().unwrap_or_default();
        let missing: Vec<String> = entries
            .iter()
            .filter(|e| {
                e.client_config
                    .ca_bundle
                    .as_ref()
                    .is_none_or(|b| b.0.is_empty())
            })
            .map(|e| e.name.clone())
            .collect();
        checks.push(Check {
            name: "webhook",
            ok: !entries.is_empty() && missing.is_empty(),
            detail: if entries.is_empty() {
                format!("MutatingWebhookConfiguration {CONTROLLER_NAME} has no entries")
            } else if missing.is_empty() {
                format!("{} entries, each with its caBundle", entries.len())
            } else {
                format!(
                    "entries without a caBundle (the controller has not published its CA yet; see its log): {}",
                    missing.join(", ")
                )
            },
        });
    }
    let ok = checks.iter().all(|c| c.ok);
    Report {
        namespace: namespace.to_string(),
        checks,
        ok,
    }
}

/// Reads the installation in `namespace` and judges it.
pub async fn check_install(client: kube::Client, namespace: &str) -> anyhow::Result<Report> {
    let agent = Api::<DaemonSet>::namespaced(client.clone(), namespace)
        .get_opt(AGENT_DAEMONSET)
        .await?;
    let controller = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get_opt(CONTROLLER_NAME)
        .await?;
    let webhook = Api::<MutatingWebhookConfiguration>::all(client)
        .get_opt(CONTROLLER_NAME)
        .await?;
    Ok(judge(
        namespace,
        agent.as_ref(),
        controller.as_ref(),
        webhook.as_ref(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, WebhookClientConfig};
    use k8s_openapi::api::apps::v1::{DaemonSetStatus, DeploymentSpec, DeploymentStatus};

    fn ds(desired: i32, ready: i32) -> DaemonSet {
        DaemonSet {
            status: Some(DaemonSetStatus {
                desired_number_scheduled: desired,
                number_ready: ready,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn deploy(available: i32) -> Deployment {
        Deployment {
            spec: Some(DeploymentSpec {
                replicas: Some(2),
                ..Default::default()
            }),
            status: Some(DeploymentStatus {
                available_replicas: Some(available),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn hook(bundle: &[u8]) -> MutatingWebhookConfiguration {
        MutatingWebhookConfiguration {
            webhooks: Some(vec![MutatingWebhook {
                name: "alibabacloud-erdma-controller.mutating.k8s.io".into(),
                client_config: WebhookClientConfig {
                    ca_bundle: (!bundle.is_empty()).then(|| ByteString(bundle.to_vec())),
                    ..Default::default()
                },
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn a_ready_install_passes_and_each_gap_fails_naming_the_fix() {
        let r = judge(
            "kube-system",
            Some(&ds(3, 3)),
            Some(&deploy(2)),
            Some(&hook(b"CA")),
        );
        assert!(r.ok, "{r:?}");
        assert_eq!(r.checks.len(), 3);

        let r = judge("kube-system", Some(&ds(3, 2)), None, None);
        assert!(!r.ok);
        assert_eq!(
            r.checks[0].detail,
            "2 of 3 agents ready; see kubectl -n kube-system get pods -l tier=agent and erdmactl doctor --node NODE"
        );

        let r = judge("kube-system", Some(&ds(0, 0)), None, None);
        assert!(
            !r.ok && r.checks[0].detail.contains("scheduled to no node"),
            "{r:?}"
        );

        let r = judge("kube-system", None, None, None);
        assert!(!r.ok && r.checks[0].detail.contains("not found"), "{r:?}");

        let r = judge("kube-system", Some(&ds(1, 1)), Some(&deploy(0)), None);
        assert!(
            !r.ok
                && r.checks[1]
                    .detail
                    .starts_with("0 of 2 controller replicas available")
        );

        let r = judge("kube-system", Some(&ds(1, 1)), None, Some(&hook(b"")));
        assert!(!r.ok);
        assert!(
            r.checks[1]
                .detail
                .contains("alibabacloud-erdma-controller.mutating.k8s.io")
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["ok"], false);
        assert_eq!(json["checks"][1]["name"], "webhook");
    }
}
