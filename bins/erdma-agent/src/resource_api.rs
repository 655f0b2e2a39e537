//! Which kubelet API serves the eRDMA devices on this node: the device plugin (`aliyun/erdma`
//! through the device-plugin API) or the DRA driver (`erdma.alibabacloud.com` ResourceSlices;
//! pods asking `aliyun/erdma` are served through the DeviceClass's `extendedResourceName`).
//! Exactly one per node, never both for one resource; the choice is reported in `/healthz` and
//! in the `ERdmaResourceAPI` node condition.

use crate::cluster::Cluster;
use erdma_dra::publish::{self, SyncOutcome};
use erdma_dra::readback::{self, DroppedField};
use erdma_dra::server::{self, RegistrationState};
use erdma_dra::{DraConfig, Driver};
use erdma_model::NodeDevices;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api as KubeApi, Patch, PatchParams};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Node label that picks the API with `--resource-api=node-label`.
pub const NODE_LABEL: &str = "erdma.alibabacloud.com/resource-api";
/// Node condition naming the API in use.
pub const CONDITION: &str = "ERdmaResourceAPI";

pub use crate::cli::Choice;

pub use crate::plan::ResourceApi;

/// What `/healthz` shows of the DRA driver.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DraView {
    /// Driver name.
    pub driver: String,
    /// `pending`, `registered` or the kubelet's refusal.
    pub registration: String,
    /// The last ResourceSlice sync: `created|updated|unchanged generation N`, or its error.
    pub slice: String,
    /// Prepared claims per DRA device name.
    pub prepared_claims: std::collections::BTreeMap<String, usize>,
    /// The ResourceClaims NodePrepareResources read (one GET per claim not yet prepared) and
    /// how many of those reads failed.
    pub claim_reads: erdma_dra::claims::ClaimReads,
    /// Fields of the ResourceSlice the API server dropped (their feature gates are off): field,
    /// feature gate, devices. Empty when it stores everything.
    pub dropped_fields: Vec<DroppedField>,
}

/// Resolves the choice for this node. `node-label` needs the Kubernetes API (it reads this
/// node's labels once, at start; relabelling takes effect when the agent pod restarts).
pub async fn resolve(choice: Choice, cluster: Option<&Cluster>) -> anyhow::Result<ResourceApi> {
    match choice {
        Choice::DevicePlugin => Ok(ResourceApi::DevicePlugin),
        Choice::Dra => Ok(ResourceApi::Dra),
        Choice::NodeLabel => {
            let c = cluster.ok_or_else(|| {
                anyhow::anyhow!(
                    "--resource-api=node-label needs the Kubernetes API (NODE_NAME and a config)"
                )
            })?;
            let nodes: KubeApi<Node> = KubeApi::all(c.client.clone());
            let node = nodes
                .get(&c.node)
                .await
                .map_err(|e| anyhow::anyhow!("read node {} for label {NODE_LABEL}: {e}", c.node))?;
            let value = node
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(NODE_LABEL))
                .map(String::as_str);
            match value {
                None | Some("device-plugin") => Ok(ResourceApi::DevicePlugin),
                Some("dra") => Ok(ResourceApi::Dra),
                Some(other) => anyhow::bail!(
                    "node {} has {NODE_LABEL}={other:?}; expected dra or device-plugin",
                    c.node
                ),
            }
        }
    }
}

/// The `ERdmaResourceAPI` condition: (type, status, reason, message).
pub fn condition(
    api: ResourceApi,
    resource: &str,
    driver: &str,
) -> (&'static str, &'static str, &'static str, String) {
    match api {
        ResourceApi::DevicePlugin => (
            CONDITION,
            "True",
            "DevicePlugin",
            format!(
                "{resource} is served by the erdma device plugin; the DRA driver {driver} is off on this node"
            ),
        ),
        ResourceApi::Dra => (
            CONDITION,
            "True",
            "DRA",
            format!(
                "eRDMA devices are served by the DRA driver {driver} (ResourceSlices; {resource} requests through the DeviceClass extendedResourceName); the device plugin is off on this node"
            ),
        ),
    }
}

/// Reason of the `ERdmaResourceAPI` condition on a DRA node while the API server drops fields of
/// the ResourceSlice (feature gates off).
pub const REASON_GATES_OFF: &str = "DRAFeatureGatesOff";
/// Event reason when the API server starts dropping fields of the node's ResourceSlice.
pub const EVENT_FIELDS_DROPPED: &str = "ResourceSliceFieldsDropped";
/// Event reason when it stores them all again.
pub const EVENT_FIELDS_STORED: &str = "ResourceSliceFieldsStored";

/// The `ERdmaResourceAPI` condition of a DRA node whose ResourceSlice lost `dropped` (empty: the
/// plain [`condition`]): still True (DRA serves the devices), reason [`REASON_GATES_OFF`], and
/// the message says which gates are off and what erdma does without them.
pub fn dra_condition(
    resource: &str,
    driver: &str,
    dropped: &[DroppedField],
) -> (&'static str, &'static str, &'static str, String) {
    let (ty, st, reason, message) = condition(ResourceApi::Dra, resource, driver);
    if dropped.is_empty() {
        return (ty, st, reason, message);
    }
    (
        ty,
        st,
        REASON_GATES_OFF,
        format!(
            "{message}; {}: {}",
            readback::summary(dropped),
            consequences(dropped)
        ),
    )
}

/// What erdma does without the dropped fields' features.
pub fn consequences(dropped: &[DroppedField]) -> String {
    readback::gates(dropped)
        .iter()
        .map(|g| match *g {
            readback::GATE_DEVICE_TAINTS => "an unhealthy device is not tainted, so new claims may be allocated on it (its prepare goes through as allocated, the health stream reports it)",
            readback::GATE_CONSUMABLE_CAPACITY => "each device is allocated whole to one claim at a time (no sharing by capacity)",
            _ => "the feature's fields are not used",
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Sets the condition on this node (strategic merge by type).
pub async fn publish_condition(
    cluster: &Cluster,
    api: ResourceApi,
    resource: &str,
) -> Result<(), String> {
    let c = condition(api, resource, erdma_model::names::DRA_DRIVER);
    patch_condition(cluster, c).await
}

async fn patch_condition(
    cluster: &Cluster,
    (ty, st, reason, message): (&'static str, &'static str, &'static str, String),
) -> Result<(), String> {
    let now = serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ))
    .unwrap_or(serde_json::Value::Null);
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": ty, "status": st, "reason": reason, "message": message,
        "lastHeartbeatTime": now, "lastTransitionTime": now,
    }]}});
    let nodes: KubeApi<Node> = KubeApi::all(cluster.client.clone());
    nodes
        .patch_status(
            &cluster.node,
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
        .map(drop)
        .map_err(|e| format!("patch condition {ty} of node {}: {e}", cluster.node))
}

/// The DRA driver's settings from the agent's.
pub struct DraSettings {
    /// Kubelet root directory.
    pub kubelet_root_dir: PathBuf,
    /// CDI spec directory.
    pub cdi_dir: PathBuf,
    /// sysfs root.
    pub sysfs: PathBuf,
    /// Called after each NodePrepareResources that prepared a claim.
    pub on_prepare: Option<erdma_dra::claims::PrepareObserver>,
    /// The DRA metrics in the agent's registry: the dropped ResourceSlice fields, and the
    /// kubelet's calls on the driver.
    pub metrics: Option<crate::metrics::DraMetrics>,
    /// The extended resource name (`--resource-name`), for the `ERdmaResourceAPI` condition.
    pub resource_name: String,
    /// The kubelet's device-plugin directory: the device plugin's resource is removed from the
    /// node's status once the kubelet let the plugin go there ([`crate::plugin_resource`]).
    /// `None`: the node's status is left alone.
    pub device_plugin_dir: Option<PathBuf>,
}

/// Runs the DRA driver until `cancel`: the sockets, ResourceSlice publishing, and its state in
/// `/healthz`.
pub async fn run_dra(
    settings: DraSettings,
    cluster: Cluster,
    served: watch::Receiver<NodeDevices>,
    instance_id: Option<String>,
    view_tx: watch::Sender<Option<DraView>>,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let mut cfg = DraConfig::new(cluster.node.clone());
    cfg.kubelet_dir = settings.kubelet_root_dir;
    cfg.cdi_dir = settings.cdi_dir;
    cfg.sysfs = settings.sysfs;
    let metrics = settings.metrics;
    let resource = settings.resource_name;
    let driver = Arc::new(Driver::new(
        cfg.clone(),
        cluster.client.clone(),
        served.clone(),
    )?);
    if let Some(f) = settings.on_prepare {
        driver.on_prepare(f);
    }
    let observer = metrics
        .clone()
        .map(|m| Arc::new(m) as Arc<dyn server::CallObserver>);
    let servers = server::serve_observed(driver.clone(), observer, &cancel)?;
    let (status_tx, mut status_rx) =
        watch::channel::<Result<SyncOutcome, String>>(Err("not published yet".into()));
    let publisher = tokio::spawn(publish::run(
        cluster.client.clone(),
        cfg.clone(),
        served,
        instance_id,
        status_tx,
        cancel.clone(),
    ));
    let retirement = settings.device_plugin_dir.map(|dir| {
        let retirer = crate::plugin_resource::Retirer {
            cluster: cluster.clone(),
            resource: resource.clone(),
            plugin_dir: dir,
        };
        tokio::spawn(crate::plugin_resource::run(
            retirer,
            crate::plugin_resource::RECHECK,
            crate::plugin_resource::QUIET,
            status_rx.clone(),
            cancel.clone(),
        ))
    });
    let mut registration = servers.registration.clone();
    // What was last reported of dropped fields (None: nothing yet).
    let mut reported: Option<Vec<DroppedField>> = None;
    loop {
        let outcome = status_rx.borrow().as_ref().ok().cloned();
        if let Some(o) = outcome
            && reported.as_ref() != Some(&o.dropped)
        {
            report_dropped(
                &cluster,
                &resource,
                reported.as_deref(),
                &o.dropped,
                metrics.as_ref().map(|m| &m.dropped_fields),
            )
            .await;
            reported = Some(o.dropped);
        }
        let prepared = driver.prepared().await;
        let mut per_device = std::collections::BTreeMap::new();
        for c in prepared.claims.values() {
            for d in &c.devices {
                *per_device.entry(d.device.clone()).or_insert(0usize) += 1;
            }
        }
        let reg = match &*registration.borrow() {
            RegistrationState::Pending => "pending".to_string(),
            RegistrationState::Registered => "registered".to_string(),
            RegistrationState::Refused(e) => format!("refused: {e}"),
        };
        let slice = match &*status_rx.borrow() {
            Ok(o) => format!("{:?} generation {}", o.action, o.generation).to_lowercase(),
            Err(e) => e.clone(),
        };
        view_tx.send_replace(Some(DraView {
            driver: cfg.driver_name.clone(),
            registration: reg,
            slice,
            prepared_claims: per_device,
            claim_reads: driver.claim_reads(),
            dropped_fields: reported.clone().unwrap_or_default(),
        }));
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = registration.changed() => {}
            _ = status_rx.changed() => {}
            _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
        }
    }
    servers.shutdown().await;
    let _ = publisher.await;
    if let Some(r) = retirement {
        let _ = r.await;
    }
    Ok(())
}

/// Reports a change of the fields the API server drops from the node's ResourceSlice
/// (`previous`: what was reported before, `None` at start): the gauge of every field checked
/// (devices dropped from, 0 when stored), a Warning Event when fields start being dropped or
/// the set changes, a Normal one when all are stored again, and the `ERdmaResourceAPI`
/// condition (reason [`REASON_GATES_OFF`] while fields are dropped). The driver's publisher
/// logs the change (warn). Best effort: an API error is logged.
pub async fn report_dropped(
    cluster: &Cluster,
    resource: &str,
    previous: Option<&[DroppedField]>,
    now: &[DroppedField],
    gauge: Option<&crate::metrics::DroppedFieldsFamily>,
) {
    if let Some(g) = gauge {
        for (field, feature_gate) in readback::SLICE_FIELDS {
            let n = now
                .iter()
                .find(|d| d.field == *field)
                .map_or(0, |d| d.devices.len());
            g.get_or_create(&crate::metrics::DroppedFieldLabels {
                field,
                feature_gate,
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
    let was = previous.is_some_and(|p| !p.is_empty());
    let event = if !now.is_empty() {
        Some((
            "Warning",
            EVENT_FIELDS_DROPPED,
            format!("{}: {}", readback::summary(now), consequences(now)),
        ))
    } else if was {
        Some((
            "Normal",
            EVENT_FIELDS_STORED,
            "the API server stores every field of this node's ResourceSlice again".to_string(),
        ))
    } else {
        None
    };
    let Some((kind, reason, message)) = event else {
        return;
    };
    if let Err(e) = cluster.dra_event(kind, reason, &message).await {
        tracing::warn!("{e}");
    }
    let c = dra_condition(resource, erdma_model::names::DRA_DRIVER, now);
    if let Err(e) = patch_condition(cluster, c).await {
        tracing::warn!("{e}");
    }
}

/// On a node that moved back to the device plugin: removes this node's ResourceSlices of the
/// driver, so the scheduler stops placing claims here (best effort; logged).
pub async fn retire_dra(cluster: &Cluster) {
    let cfg = DraConfig::new(cluster.node.clone());
    match publish::remove_all(&cluster.client, &cfg).await {
        Ok(gone) if !gone.is_empty() => {
            tracing::info!(
                ?gone,
                "node uses the device plugin: removed its DRA ResourceSlices"
            )
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("removing this node's DRA ResourceSlices failed: {e}"),
    }
}

/// The resource API of this node from `--resource-api` (`node-label` reads the node through
/// `cluster`).
pub async fn choose(
    s: &crate::cli::Settings,
    cluster: Option<&Cluster>,
    pending: &crate::pending::Pending,
) -> anyhow::Result<ResourceApi> {
    let resolving = resolve(s.resource_api, cluster);
    pending.track("choosing the resource API", resolving).await
}

/// Reports the resource API as the node condition and, on a node labelled back to the device
/// plugin, removes its DRA ResourceSlices, as the plan says: beside the start-up, not before
/// it (nothing waits for the API server).
pub fn start_report(
    plan: &crate::plan::AgentPlan,
    s: &crate::cli::Settings,
    cluster: &Option<Cluster>,
    tasks: &mut crate::tasks::Tasks,
) {
    let Some(c) = cluster.clone().filter(|_| plan.report_resource_api) else {
        return;
    };
    let (api, retire, resource) = (plan.resource_api, plan.retire_dra, s.resource_name.clone());
    let stop = tasks.cancel.clone();
    let started_up = tasks.started_up.clone();
    tasks.spawn("reporting the resource API", async move {
        let report = async {
            // The node's condition waits for the kubelet to have the devices.
            started_up.wait().await;
            if let Err(e) = publish_condition(&c, api, &resource).await {
                tracing::warn!("{e}");
            }
            if retire {
                retire_dra(&c).await;
            }
        };
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = report => {}
        }
    });
}

/// The DRA driver of this node, for the agent to await ([`crate::tasks::Serving`]): the
/// sockets, ResourceSlice publishing, the claims' CDI specs; `/healthz` gets its state.
pub fn start_dra(
    shared: crate::tasks::Shared<'_>,
    served: &watch::Receiver<NodeDevices>,
    view: &mut watch::Receiver<Option<DraView>>,
    tasks: &crate::tasks::Tasks,
) -> anyhow::Result<crate::tasks::Serving> {
    use anyhow::Context;
    let (plan, s) = (shared.plan, shared.settings);
    let (dra_tx, dra_rx) = watch::channel(None);
    *view = dra_rx;
    let settings = DraSettings {
        kubelet_root_dir: plan.sockets.kubelet_root_dir.clone(),
        cdi_dir: plan.sockets.dra_cdi.clone(),
        sysfs: s.sysfs_root.clone(),
        on_prepare: Some({
            let h = shared.holders.clone();
            Arc::new(move || h.poke())
        }),
        metrics: Some(shared.metrics.dra.clone()),
        resource_name: s.resource_name.clone(),
        device_plugin_dir: Some(plan.sockets.kubelet_dir.clone()),
    };
    let cluster = shared
        .cluster
        .clone()
        .context("DRA needs the Kubernetes API")?;
    // Held until the agent's tasks stopped.
    let held = tasks.pending.enter("the DRA driver");
    let dra = run_dra(
        settings,
        cluster,
        served.clone(),
        s.instance_id.clone(),
        dra_tx,
        tasks.cancel.clone(),
    );
    Ok(Box::pin(async move {
        (dra.await.context("DRA driver"), Some(held))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices() {
        assert_eq!(Choice::parse("dra"), Ok(Choice::Dra));
        assert_eq!(Choice::parse("device-plugin"), Ok(Choice::DevicePlugin));
        assert_eq!(Choice::parse("node-label"), Ok(Choice::NodeLabel));
        assert!(Choice::parse("both").is_err());
        let (ty, st, reason, msg) =
            condition(ResourceApi::Dra, "aliyun/erdma", "erdma.alibabacloud.com");
        assert_eq!((ty, st, reason), ("ERdmaResourceAPI", "True", "DRA"));
        assert!(msg.contains("device plugin is off"));
    }
}
