//! The Kubernetes API, used only in a cluster (a node name and in-cluster config or
//! `--kubeconfig`): driver node labels, the `ERdmaDriverReady` and `ERdmaDevicePluginConflict`
//! node conditions and Events.

use erdma_driver::DriverStatus;
use erdma_k8s::events::Events;
use erdma_model::coexistence::{self, Conflict};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use std::path::Path;
use std::time::Duration;

/// The agent's Kubernetes API access.
#[derive(Clone)]
pub struct Cluster {
    /// The client.
    pub client: Client,
    /// This node.
    pub node: String,
    /// Events, reported as `alibabacloud.com/erdma-agent` by `erdma-agent-<node>`.
    events: Events,
}

impl Cluster {
    /// Access as `client` for `node`.
    pub fn new(client: Client, node: impl Into<String>) -> Self {
        let node = node.into();
        let events = Events::new(
            client.clone(),
            &format!("alibabacloud.com/{MANAGER}"),
            &format!("{MANAGER}-{node}"),
        );
        Cluster {
            client,
            node,
            events,
        }
    }
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Connects when a node name is known and a kube config is available (`--kubeconfig`, else
/// in-cluster / `KUBECONFIG`). `Ok(None)` without a node name; `Err` names the fix. Each API
/// request that is not a watch fails after `request_timeout` (`--request-timeout`; see
/// [`erdma_k8s::client`]), so a silent API server delays labels, conditions and Events instead of
/// holding the loops that publish them.
pub async fn detect(
    node_name: Option<&str>,
    kubeconfig: Option<&Path>,
    request_timeout: Option<Duration>,
) -> Result<Option<Cluster>, String> {
    let Some(node) = node_name else {
        return Ok(None);
    };
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            format!("NODE_NAME={node} is set but no Kubernetes config was found ({e}); run in-cluster with a service account or pass --kubeconfig")
        })?,
    };
    let options = erdma_k8s::client::ClientOptions::with_deadline(request_timeout);
    let client = erdma_k8s::client::build(config, &options)
        .map_err(|e| format!("Kubernetes client: {e}"))?;
    Ok(Some(Cluster::new(client, node)))
}

const MANAGER: &str = "erdma-agent";

impl Cluster {
    /// Publishes the driver state: node labels (`None` removes), the node condition, and an
    /// Event when a mode change becomes pending or stops being pending.
    pub async fn publish_driver(
        &self,
        previous: Option<&DriverStatus>,
        status: &DriverStatus,
    ) -> Result<(), String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let labels: serde_json::Map<String, serde_json::Value> = status
            .node_labels()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.map_or(serde_json::Value::Null, Into::into)))
            .collect();
        let patch = serde_json::json!({"metadata": {"labels": labels}});
        nodes
            .patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| format!("patch labels of node {}: {e}", self.node))?;
        let (ty, st, reason, message) = status.node_condition();
        self.condition(ty, st, reason, message).await?;
        let was = previous.and_then(|p| p.pending.as_ref());
        match (&status.pending, was) {
            (Some(p), w) if w.is_none_or(|w| w.to != p.to) => {
                self.event("Warning", "DriverModeChangePending", &status.reason)
                    .await?
            }
            (None, Some(w)) => {
                self.event(
                    "Normal",
                    "DriverModeChangeDone",
                    &format!(
                        "driver mode change to {} no longer pending: {}",
                        w.to.name(),
                        status.reason
                    ),
                )
                .await?
            }
            _ => {}
        }
        Ok(())
    }

    /// Sets one node condition (strategic merge by type).
    async fn condition(
        &self,
        ty: &str,
        st: &str,
        reason: &str,
        message: impl Into<String>,
    ) -> Result<(), String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let now = chrono_now();
        let cond = serde_json::json!({"status": {"conditions": [{
            "type": ty, "status": st, "reason": reason, "message": message.into(),
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }]}});
        nodes
            .patch_status(
                &self.node,
                &PatchParams::default(),
                &Patch::Strategic(&cond),
            )
            .await
            .map_err(|e| format!("patch condition {ty} of node {}: {e}", self.node))?;
        Ok(())
    }

    /// Publishes whether another device plugin serves `resource`: the
    /// `ERdmaDevicePluginConflict` condition, and an Event when a conflict starts or ends.
    pub async fn publish_plugin_conflict(
        &self,
        previous: Option<&Conflict>,
        now: &Conflict,
        resource: &str,
    ) -> Result<(), String> {
        let (ty, st, reason, message) = now.condition(resource);
        self.condition(ty, st, reason, message.clone()).await?;
        let was = previous.is_some_and(Conflict::is_conflict);
        match (was, now.is_conflict()) {
            (false, true) => {
                self.event_for(
                    "Warning",
                    coexistence::EVENT_CONFLICT,
                    "DevicePluginRegistration",
                    &message,
                )
                .await
            }
            (true, false) => {
                self.event_for(
                    "Normal",
                    coexistence::EVENT_RESOLVED,
                    "DevicePluginRegistration",
                    &now.message(resource),
                )
                .await
            }
            _ => Ok(()),
        }
    }

    /// Records an `events.k8s.io/v1` Event regarding this node (namespace `default`, as kubelet
    /// does for nodes), from the driver reconciler.
    pub async fn event(&self, kind: &str, reason: &str, message: &str) -> Result<(), String> {
        self.event_for(kind, reason, "DriverReconcile", message)
            .await
    }

    /// Records an `events.k8s.io/v1` Event regarding this node from the DRA driver's
    /// ResourceSlice publisher (action `PublishResourceSlice`).
    pub async fn dra_event(&self, kind: &str, reason: &str, message: &str) -> Result<(), String> {
        self.event_for(kind, reason, "PublishResourceSlice", message)
            .await
    }

    /// Records an `events.k8s.io/v1` Event regarding this node, for `action`.
    async fn event_for(
        &self,
        kind: &str,
        reason: &str,
        action: &str,
        message: &str,
    ) -> Result<(), String> {
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.node.clone()),
            uid: Some(self.node.clone()),
            ..ObjectReference::default()
        };
        self.post(regarding, kind, reason, action, message)
            .await
            .map_err(|e| format!("create Event {reason} for node {}: {e}", self.node))
    }

    /// Records an `events.k8s.io/v1` Event regarding a pod, in the pod's namespace (seen in
    /// `kubectl describe pod`).
    pub async fn pod_event(
        &self,
        pod: &PodRef,
        kind: &str,
        reason: &str,
        message: &str,
    ) -> Result<(), String> {
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(pod.namespace.clone()),
            name: Some(pod.name.clone()),
            uid: (!pod.uid.is_empty()).then(|| pod.uid.clone()),
            ..ObjectReference::default()
        };
        self.post(regarding, kind, reason, "PreStartContainer", message)
            .await
            .map_err(|e| {
                format!(
                    "create Event {reason} for pod {}/{}: {e}",
                    pod.namespace, pod.name
                )
            })
    }

    async fn post(
        &self,
        regarding: ObjectReference,
        kind: &str,
        reason: &str,
        action: &str,
        message: &str,
    ) -> Result<(), kube::Error> {
        self.events
            .publish(&regarding, kind == "Warning", reason, action, message)
            .await
    }
}

/// A pod an Event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (empty when unknown).
    pub uid: String,
}

/// Now, serialised as Kubernetes does for condition timestamps.
fn chrono_now() -> serde_json::Value {
    serde_json::to_value(Time(k8s_openapi::jiff::Timestamp::now()))
        .unwrap_or(serde_json::Value::Null)
}

/// The Kubernetes API for the agent: only with a node name and a config; a failure is logged
/// and the agent runs without it (node labels and Events are then only logged).
pub async fn start(s: &crate::cli::Settings, pending: &crate::pending::Pending) -> Option<Cluster> {
    let found = detect(
        s.node_name.as_deref(),
        s.kubeconfig.as_deref(),
        s.request_timeout,
    );
    match pending
        .track("connecting to the Kubernetes API", found)
        .await
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e}; node labels and Events are only logged");
            None
        }
    }
}
