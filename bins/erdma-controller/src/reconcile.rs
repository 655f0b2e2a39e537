//! The reconcilers, following the original's flow:
//!
//! - **Node** ([`reconcile_node`]): wait for Ready (up to `waitNodeReadyTimeoutSeconds`, then
//!   proceed), map the node to its ECS instance (`spec.providerID` `<region>.<i-…>`, else its
//!   InternalIP), check that instance is the node's (in the cluster's VPC, one of its private
//!   IPs an InternalIP of the node; [`crate::verify`]: a mismatch is a Warning Event and
//!   `erdma_controller_instance_mismatch_total`, and no ECS write), and when the node has no `ERdmaDevice` yet select ERIs per network card
//!   ([`crate::eri::plan`]): reuse, convert the primary ENI, or create (with `ClientToken`), tag
//!   them so terway ignores them, read the jumbo-frame attribute and create the `ERdmaDevice`
//!   (owner reference to the Node, the two labels). When the object exists, back-fill the terway
//!   tags once per ENI per process.
//! - **ERdmaDevice** ([`reconcile_device`]): nothing to do when every device is `Ready`;
//!   otherwise describe the ENIs and per device: `InUse`+`HighPerformance` → Ready; an `Available`
//!   secondary → attach (with `NetworkCardIndex` ≠ 0) → Pending; the primary still `Standard` →
//!   convert → Ready; other states → Pending with the state named (the original wrote no entry).
//!   Requeue every 10 s while anything is not Ready. When the node is gone, strip the original's
//!   finalizer and delete the object.

use crate::batch::{BatchError, Batcher};
use crate::config::Config;
use crate::eri::{self, CardPlan, SelectError};
use crate::verify;
use erdma_cloud::ecs::{
    CreateEni, Instance, InstanceType, MAX_ENI_IDS, MAX_INSTANCE_IDS, MAX_INSTANCE_TYPES,
    NetworkInterface,
};
use erdma_cloud::{EcsClient, EcsError};
use erdma_k8s::agent::AGENT_PREFIX;
use erdma_k8s::crd::{
    DeviceInfo, DeviceState, DeviceStatus, ERdmaDevice, ERdmaDeviceSpec, ERdmaDeviceStatus,
};
use erdma_k8s::events::Events;
use erdma_k8s::labels::{
    FINALIZER, LABEL_NODE_NAME, MANAGER, TAG_CREATOR, TAG_CREATOR_VALUE, TAG_INSTANCE_ID,
    erdma_device_labels,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a not-Ready node is looked at again.
pub const NOT_READY_REQUEUE: Duration = Duration::from_secs(30);
/// How often an `ERdmaDevice` with non-Ready devices is looked at again.
pub const PENDING_REQUEUE: Duration = Duration::from_secs(10);

/// Set on an `ERdmaDevice` once its ERIs carry the terway tags, so a restarted controller does
/// not tag them again (the back-fill is for objects written before, e.g. by the original).
pub const ANNOTATION_TAGGED: &str = "erdma.alibabacloud.com/terway-tagged";

/// Shared state of the reconcilers.
pub struct Ctx {
    /// Kubernetes client.
    pub client: Client,
    /// ECS client.
    pub ecs: EcsClient,
    /// Configuration.
    pub cfg: Config,
    /// ENIs whose terway tags were back-filled by this process.
    pub tagged: Mutex<HashSet<String>>,
    /// Events (kube's recorder for those that may repeat).
    pub events: Events,
    /// Counters.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// `DescribeInstanceTypes` answers by type (`None`: ECS does not know it); types do not
    /// change, so each is asked once per process.
    pub types: Mutex<HashMap<String, Option<InstanceType>>>,
    /// `DescribeInstanceTypes` of the types not cached yet, batched.
    type_asks: Batcher<String, InstanceType>,
    /// `DescribeInstances` by ID, batched across reconciles.
    instances: Batcher<String, Instance>,
    /// `DescribeNetworkInterfaces` by ID, batched across reconciles.
    enis: Batcher<String, NetworkInterface>,
    /// The detached ERIs this controller created (any instance), one lookup for every reconcile
    /// of a window.
    detached: Batcher<(), Arc<Vec<NetworkInterface>>>,
    /// The informers' caches while the controllers run ([`run_controllers`]); `None` otherwise
    /// (a reconcile called on its own then asks the API server).
    caches: std::sync::RwLock<Option<Caches>>,
    /// Per ERdmaDevice whose status this process wrote with a device not Ready: the
    /// resourceVersion the write gave the object, and until when that version needs no look
    /// (the write's own watch event would otherwise describe an ERI that cannot be attached
    /// yet, or retry at once a call ECS just throttled).
    own_writes: Mutex<HashMap<String, (String, tokio::time::Instant)>>,
}

/// The controllers' caches of Nodes and ERdmaDevices (stripped: [`strip_node`],
/// [`strip_device`]), so that a reconcile reads the other kind without a request.
#[derive(Clone)]
struct Caches {
    nodes: Store<Node>,
    devices: Store<ERdmaDevice>,
}

/// How long a reconcile waits for a cache's first list before it asks the API server instead.
const CACHE_WAIT: Duration = Duration::from_secs(30);

/// `Some(found)` from `store` once it holds its first list (waited for up to [`CACHE_WAIT`]);
/// `None` when it has none by then.
async fn cached<K>(store: &Store<K>, name: &str) -> Option<Option<Arc<K>>>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    tokio::time::timeout(CACHE_WAIT, store.wait_until_ready())
        .await
        .ok()?
        .ok()?;
    Some(store.get(&ObjectRef::new(name)))
}

/// A Node as the Node reconciler reads it, and no more (an informer's cache of 5 000 kubelet
/// Nodes is mostly managed fields, images, capacity and system info): name, uid,
/// resourceVersion, creation and deletion time, `spec.providerID`, the `Ready` condition's
/// status and the InternalIP addresses.
pub fn strip_node(node: &mut Node) {
    let meta = std::mem::take(&mut node.metadata);
    node.metadata = ObjectMeta {
        name: meta.name,
        uid: meta.uid,
        resource_version: meta.resource_version,
        creation_timestamp: meta.creation_timestamp,
        deletion_timestamp: meta.deletion_timestamp,
        ..Default::default()
    };
    node.spec = node.spec.take().map(|s| NodeSpec {
        provider_id: s.provider_id,
        ..Default::default()
    });
    node.status = node.status.take().map(|s| NodeStatus {
        conditions: s.conditions.map(|cs| {
            cs.into_iter()
                .filter(|c| c.type_ == "Ready")
                .map(|c| NodeCondition {
                    type_: c.type_,
                    status: c.status,
                    ..Default::default()
                })
                .collect()
        }),
        addresses: s
            .addresses
            .map(|a| a.into_iter().filter(|a| a.type_ == "InternalIP").collect()),
        ..Default::default()
    });
}

/// An ERdmaDevice as the reconcilers read it: name, uid, resourceVersion, creation and deletion
/// time, finalizers, the node-name label, the terway-tagged annotation, spec and status (no
/// managed fields, owner references, other labels or annotations).
pub fn strip_device(obj: &mut ERdmaDevice) {
    let meta = std::mem::take(&mut obj.metadata);
    let keep = |m: Option<BTreeMap<String, String>>, key: &str| {
        m.map(|m| m.into_iter().filter(|(k, _)| k == key).collect())
            .filter(|m: &BTreeMap<String, String>| !m.is_empty())
    };
    obj.metadata = ObjectMeta {
        name: meta.name,
        uid: meta.uid,
        resource_version: meta.resource_version,
        creation_timestamp: meta.creation_timestamp,
        deletion_timestamp: meta.deletion_timestamp,
        finalizers: meta.finalizers,
        labels: keep(meta.labels, LABEL_NODE_NAME),
        annotations: keep(meta.annotations, ANNOTATION_TAGGED),
        ..Default::default()
    };
}

/// How long a batch gathers asks before its call.
/// New nodes come at the rate of the write calls (tens a second), so a second gathers enough
/// IDs to fill most calls; a full batch (100) goes at once.
pub const BATCH_WINDOW: Duration = Duration::from_secs(1);
/// The `action` of the controller's Events.
const EVENT_ACTION: &str = "Provision";

/// How soon an ERdmaDevice whose ERI is attaching is looked at again (ECS attaches in seconds).
pub const ATTACHING_REQUEUE: Duration = Duration::from_secs(2);

impl Ctx {
    /// A context.
    pub fn new(client: Client, ecs: EcsClient, cfg: Config) -> Self {
        let instance = std::env::var("POD_NAME").unwrap_or_else(|_| MANAGER.to_string());
        let events = Events::new(client.clone(), MANAGER, &instance);
        Self {
            client,
            ecs,
            cfg,
            tagged: Mutex::new(HashSet::new()),
            events,
            metrics: Arc::default(),
            types: Mutex::new(HashMap::new()),
            type_asks: Batcher::new(Duration::from_millis(100), MAX_INSTANCE_TYPES),
            instances: Batcher::new(BATCH_WINDOW, MAX_INSTANCE_IDS),
            enis: Batcher::new(BATCH_WINDOW, MAX_ENI_IDS),
            detached: Batcher::new(BATCH_WINDOW, 1),
            caches: std::sync::RwLock::new(None),
            own_writes: Mutex::new(HashMap::new()),
        }
    }

    /// This process wrote the status of `name` (giving it `version`) and looks again in `wait`.
    fn wrote_status(&self, name: &str, version: Option<String>, wait: Duration) {
        let mut w = self.own_writes.lock().unwrap_or_else(|p| p.into_inner());
        match version {
            Some(v) => {
                w.insert(name.to_string(), (v, tokio::time::Instant::now() + wait));
            }
            None => {
                w.remove(name);
            }
        }
    }

    /// How long to wait before looking at `name` at `version`: `Some` while `version` is this
    /// process's own status write and its wait ([`wrote_status`](Self::wrote_status)) is not
    /// over. Any other version (a change by someone else) and a past wait are looked at at once.
    fn own_write_wait(&self, name: &str, version: Option<&str>) -> Option<Duration> {
        let mut w = self.own_writes.lock().unwrap_or_else(|p| p.into_inner());
        let (v, until) = w.get(name)?;
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if version == Some(v.as_str()) && !left.is_zero() {
            return Some(left);
        }
        w.remove(name);
        None
    }

    fn caches(&self) -> Option<Caches> {
        self.caches
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the node `name` exists: the cache's answer when it has the node, else the API
    /// server's (a cache that has not seen a node yet must not make its ERdmaDevice go).
    async fn node_exists(&self, name: &str) -> Result<bool, ReconcileError> {
        if let Some(c) = self.caches()
            && let Some(Some(_)) = cached(&c.nodes, name).await
        {
            return Ok(true);
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        Ok(nodes
            .get_opt(name)
            .await
            .map_err(kube_err(format!("get Node {name}")))?
            .is_some())
    }

    /// The ERdmaDevice `name`: the cache's when it has it, else the API server's (a new node's
    /// object may have been created a moment ago and not be cached yet).
    async fn device(&self, name: &str) -> Result<Option<Arc<ERdmaDevice>>, ReconcileError> {
        if let Some(c) = self.caches()
            && let Some(Some(obj)) = cached(&c.devices, name).await
        {
            return Ok(Some(obj));
        }
        let api: Api<ERdmaDevice> = Api::all(self.client.clone());
        Ok(api
            .get_opt(name)
            .await
            .map_err(kube_err(format!("get ERdmaDevice {name}")))?
            .map(Arc::new))
    }

    /// The same context with batches that gather for `window` instead of [`BATCH_WINDOW`]
    /// (tests that reconcile one object at a time have no one to share a call with).
    pub fn with_batch_window(mut self, window: Duration) -> Self {
        self.instances = Batcher::new(window, MAX_INSTANCE_IDS);
        self.enis = Batcher::new(window, MAX_ENI_IDS);
        self.detached = Batcher::new(window, 1);
        self.type_asks = Batcher::new(window.min(Duration::from_millis(100)), MAX_INSTANCE_TYPES);
        self
    }

    /// The instance `id` (batched `DescribeInstances`).
    async fn instance(&self, id: &str) -> Result<Option<Instance>, BatchError> {
        self.instances
            .get(id.to_string(), |ids| async move {
                let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                let found = self.ecs.describe_instances_by_id(&ids).await?;
                Ok(found
                    .into_iter()
                    .map(|i| (i.instance_id.clone(), i))
                    .collect())
            })
            .await
    }

    /// The ENIs `ids` that ECS knows (batched `DescribeNetworkInterfaces`).
    async fn enis_by_id(&self, ids: &[&str]) -> Result<Vec<NetworkInterface>, BatchError> {
        let asks = ids.iter().map(|id| {
            self.enis.get(id.to_string(), |ids| async move {
                let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                let found = self.ecs.describe_network_interfaces_by_id(&ids).await?;
                Ok(found.into_iter().map(|e| (e.id.clone(), e)).collect())
            })
        });
        let mut out = Vec::new();
        for a in futures::future::join_all(asks).await {
            out.extend(a?);
        }
        Ok(out)
    }

    /// The detached ERIs created by this controller for `instance` (one batched lookup of all).
    async fn detached_of(&self, instance: &str) -> Result<Vec<NetworkInterface>, BatchError> {
        let all = self
            .detached
            .get((), |_| async move {
                let ours =
                    BTreeMap::from([(TAG_CREATOR.to_string(), TAG_CREATOR_VALUE.to_string())]);
                let found = self
                    .ecs
                    .describe_network_interfaces_tagged_in(&ours, Some("Available"))
                    .await?;
                Ok(HashMap::from([((), Arc::new(found))]))
            })
            .await?
            .unwrap_or_default();
        Ok(all
            .iter()
            .filter(|e| e.tags.get(TAG_INSTANCE_ID).map(String::as_str) == Some(instance))
            .cloned()
            .collect())
    }

    /// The instance type, from the cache or ECS.
    async fn instance_type(&self, name: &str) -> Result<Option<InstanceType>, ReconcileError> {
        if let Some(t) = self
            .types
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            return Ok(t.clone());
        }
        // Reconciles that miss at once share one call.
        let t = self
            .type_asks
            .get(name.to_string(), |names| async move {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                let found = self.ecs.describe_instance_types(&names).await?;
                Ok(found
                    .into_iter()
                    .map(|t| (t.instance_type_id.clone(), t))
                    .collect())
            })
            .await
            .map_err(|e| match e {
                BatchError::Ecs(e) => ReconcileError::Batch(BatchError::Ecs(e)),
                BatchError::Abandoned => ReconcileError::Batch(BatchError::Abandoned),
            })?;
        self.types
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), t.clone());
        Ok(t)
    }

    /// An Event that may repeat (a failure retried): a series through the recorder.
    async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let r = obj.object_ref(&());
        if let Err(e) = self
            .events
            .publish(&r, warning, reason, EVENT_ACTION, &note)
            .await
        {
            tracing::debug!(error = %e, reason, "could not publish an Event");
        }
    }

    /// An Event that happens once per object (its ERIs selected): created without the
    /// recorder's cache, which would hold one per node for six minutes.
    async fn event_once<K: Resource<DynamicType = ()>>(&self, obj: &K, reason: &str, note: String) {
        let r = obj.object_ref(&());
        if let Err(e) = self
            .events
            .publish_once(&r, false, reason, EVENT_ACTION, &note)
            .await
        {
            tracing::debug!(error = %e, reason, "could not publish an Event");
        }
    }
}

/// Errors of a reconcile pass (logged, Evented, retried by the error policy).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A Kubernetes call failed.
    #[error("{0}: {1}")]
    Kube(String, #[source] kube::Error),
    /// An ECS call failed.
    #[error(transparent)]
    Ecs(#[from] EcsError),
    /// A batched ECS call failed.
    #[error(transparent)]
    Batch(#[from] BatchError),
    /// ERI selection impossible.
    #[error(transparent)]
    Select(#[from] SelectError),
    /// The node cannot be mapped to an instance.
    #[error("{0}")]
    Instance(String),
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ReconcileError {
    let what = what.into();
    move |e| ReconcileError::Kube(what, e)
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The instance ID in `spec.providerID` (`<region>.<i-…>`), if it has one.
pub fn instance_from_provider_id(provider_id: &str) -> Option<String> {
    provider_id
        .rsplit('.')
        .next()
        .filter(|s| erdma_model::names::is_instance_id(s))
        .map(str::to_string)
}

/// The node's InternalIP addresses.
fn internal_ips(node: &Node) -> Vec<String> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .filter(|a| a.type_ == "InternalIP")
                .map(|a| a.address.clone())
                .collect()
        })
        .unwrap_or_default()
}

async fn resolve_instance(node: &Node, ctx: &Ctx) -> Result<Instance, ReconcileError> {
    let ecs = &ctx.ecs;
    let name = node.name_any();
    if let Some(id) = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(instance_from_provider_id)
    {
        if let Some(i) = ctx.instance(&id).await? {
            return Ok(i);
        }
        tracing::warn!(node = %name, instance = %id, "providerID names an instance ECS does not know; trying the InternalIP");
    }
    let ip = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address.clone())
        .ok_or_else(|| ReconcileError::Instance(format!("node {name} has neither an ECS providerID nor an InternalIP; fix: set spec.providerID to <region>.<instance-id>")))?;
    let found = ecs.describe_instances_by_ip(&[&ip]).await?;
    match found.len() {
        1 => Ok(found.into_iter().next().expect("one")),
        n => Err(ReconcileError::Instance(format!(
            "node {name}: {n} ECS instances have private IP {ip} (need exactly 1); fix: set spec.providerID to <region>.<instance-id>"
        ))),
    }
}

/// The Node reconciler.
pub async fn reconcile_node(node: Arc<Node>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let name = node.name_any();
    let devices: Api<ERdmaDevice> = Api::all(ctx.client.clone());
    if node.metadata.deletion_timestamp.is_some() {
        delete_device_object(&devices, &name).await?;
        return Ok(Action::await_change());
    }
    if !node_ready(&node) {
        let age = node
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| {
                k8s_openapi::jiff::Timestamp::now()
                    .duration_since(t.0)
                    .as_secs()
            })
            .unwrap_or(0);
        if age < ctx.cfg.wait_node_ready_timeout_seconds as i64 {
            tracing::info!(node = %name, age_s = age, "node not Ready yet; waiting");
            return Ok(Action::requeue(NOT_READY_REQUEUE));
        }
        tracing::warn!(node = %name, age_s = age, "node still not Ready after the timeout; provisioning anyway");
    }
    match ctx.device(&name).await? {
        Some(existing) => {
            backfill_tags(&ctx, &existing).await;
            Ok(Action::await_change())
        }
        None => {
            let instance = resolve_instance(&node, &ctx).await?;
            let ips = internal_ips(&node);
            if let Err(m) = verify::instance_is_node(&name, &ips, &instance, &ctx.cfg.vpc_id) {
                // Nothing is written to ECS for this node until its object changes.
                tracing::warn!(node = %name, instance = %instance.instance_id, check = m.check(), "{m}");
                ctx.metrics.instance_mismatch(m.check());
                ctx.event(node.as_ref(), true, "InstanceMismatch", m.to_string())
                    .await;
                return Ok(Action::await_change());
            }
            match select_eris(&node, &instance, &ctx).await {
                Ok((spec, tagged)) => {
                    create_device_object(&node, &instance, spec, tagged, &devices, &ctx).await?;
                    Ok(Action::await_change())
                }
                Err(ReconcileError::Select(e @ SelectError::NotSupported(_))) => {
                    tracing::info!(node = %name, "{e}");
                    // Said again at each change of the node: a series through the recorder.
                    ctx.event(node.as_ref(), false, "ERdmaUnsupported", e.to_string())
                        .await;
                    Ok(Action::await_change())
                }
                Err(ReconcileError::Select(e @ SelectError::NoQueuePairs { .. })) => {
                    // Retried with backoff: the budget frees up when an ERI is released.
                    ctx.event(node.as_ref(), true, "ERdmaNoQueuePairs", e.to_string())
                        .await;
                    Err(ReconcileError::Select(e))
                }
                Err(e) => Err(e),
            }
        }
    }
}

/// The spec, and whether every selected ERI carries the terway tags.
async fn select_eris(
    node: &Node,
    instance: &Instance,
    ctx: &Ctx,
) -> Result<(ERdmaDeviceSpec, bool), ReconcileError> {
    let id = &instance.instance_id;
    let t = ctx
        .instance_type(&instance.instance_type)
        .await?
        .ok_or_else(|| SelectError::NotSupported(instance.instance_type.clone()))?;
    let enis = if instance.eni_ids.is_empty() {
        ctx.ecs.describe_network_interfaces_of(id).await?
    } else {
        let ids: Vec<&str> = instance.eni_ids.iter().map(String::as_str).collect();
        ctx.enis_by_id(&ids).await?
    };
    let mut plan = eri::plan(id, &t, &enis, &[], ctx.cfg.manage_non_owned_enis)?;
    if eri::creates(&plan) {
        // Before creating, look for ERIs this controller created for the instance earlier and
        // that were detached since (a restart or re-registration must not leak ENIs).
        let detached = ctx.detached_of(id).await?;
        plan = eri::plan(id, &t, &enis, &detached, ctx.cfg.manage_non_owned_enis)?;
    }
    // ERIs that already carry the terway tags (every one created or reused from this
    // controller's creations) need no TagResources call.
    let want = eri::terway_tags(id);
    let has_tags =
        |e: &erdma_cloud::ecs::NetworkInterface| want.iter().all(|(k, v)| e.tags.get(k) == Some(v));
    let untagged: Vec<String> = plan
        .values()
        .filter_map(|step| match step {
            CardPlan::Reuse(e) | CardPlan::Attach(e) | CardPlan::ConvertPrimary(e, _)
                if !has_tags(e) =>
            {
                Some(e.id.clone())
            }
            _ => None,
        })
        .collect();
    // The creations, the tagging and the jumbo-frame look-up need nothing of each other: they
    // go together (each action has its own rate), so a node waits for the slowest, not the sum.
    let creations = futures::future::try_join_all(
        plan.into_iter()
            .map(|(card, step)| device_info(node, instance, card, step, ctx)),
    );
    let tagging = async {
        let ids: Vec<&str> = untagged.iter().map(String::as_str).collect();
        if ids.is_empty() {
            return true;
        }
        match ctx.ecs.tag_enis(&ids, &want).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(instance = %id, error = %e, "tagging ERIs for terway failed (best-effort)");
                false
            }
        }
    };
    let jumbo = async {
        match ctx.ecs.jumbo_frame_enabled(id).await {
            Ok(j) => j,
            Err(e) => {
                tracing::warn!(instance = %id, error = %e, "DescribeInstanceAttribute failed; assuming no jumbo frames");
                false
            }
        }
    };
    let (devices, tagged, jumbo_frame) = futures::join!(creations, tagging, jumbo);
    let devices = devices?;
    if tagged {
        ctx.tagged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(devices.iter().map(|d| d.id.clone()));
    }
    Ok((
        ERdmaDeviceSpec {
            devices,
            jumbo_frame,
        },
        tagged,
    ))
}

/// The device of `card` as `step` plans it (creating its ERI where planned).
async fn device_info(
    node: &Node,
    instance: &Instance,
    card: i64,
    step: CardPlan,
    ctx: &Ctx,
) -> Result<DeviceInfo, ReconcileError> {
    let id = &instance.instance_id;
    Ok(match step {
        CardPlan::Reuse(e) => DeviceInfo {
            instance_id: id.clone(),
            mac: e.mac.clone(),
            is_primary_eni: e.is_primary(),
            id: e.id.clone(),
            network_card_index: card,
            queue_pair: e.queue_pair_number.unwrap_or(0),
        },
        CardPlan::Attach(e) => {
            tracing::info!(node = %node.name_any(), instance = %id, card, eni = %e.id, "reusing a detached ERI created for this instance earlier");
            DeviceInfo {
                instance_id: id.clone(),
                mac: e.mac.clone(),
                is_primary_eni: false,
                id: e.id.clone(),
                network_card_index: card,
                queue_pair: e.queue_pair_number.unwrap_or(0),
            }
        }
        CardPlan::ConvertPrimary(e, qp) => DeviceInfo {
            instance_id: id.clone(),
            mac: e.mac.clone(),
            is_primary_eni: true,
            id: e.id.clone(),
            network_card_index: card,
            queue_pair: qp,
        },
        CardPlan::Create(qp) => {
            let (eni, mac) = ctx
                .ecs
                .create_network_interface(&CreateEni {
                    vswitch_id: instance.vswitch_id.clone(),
                    security_group_ids: instance.security_group_ids.clone(),
                    name: eri::eri_name(id, card),
                    queue_pair_number: qp,
                    tags: eri::creation_tags(id),
                    client_token: eri::client_token(id, card),
                })
                .await?;
            tracing::info!(node = %node.name_any(), instance = %id, card, eni = %eni, "created ERI");
            DeviceInfo {
                instance_id: id.clone(),
                mac,
                is_primary_eni: false,
                id: eni,
                network_card_index: card,
                queue_pair: qp,
            }
        }
    })
}

async fn create_device_object(
    node: &Node,
    instance: &Instance,
    spec: ERdmaDeviceSpec,
    tagged: bool,
    api: &Api<ERdmaDevice>,
    ctx: &Ctx,
) -> Result<(), ReconcileError> {
    let name = node.name_any();
    let mut obj = ERdmaDevice::new(&name, spec);
    obj.metadata.labels = Some(erdma_device_labels(&name, &instance.instance_id));
    if tagged {
        obj.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_TAGGED.to_string(),
            "true".to_string(),
        )]));
    }
    obj.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: name.clone(),
        uid: node.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    let n = obj.spec.devices.len();
    match api
        .create(
            &PostParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            },
            &obj,
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
        Err(e) => return Err(kube_err(format!("create ERdmaDevice {name}"))(e)),
    }
    tracing::info!(node = %name, instance = %instance.instance_id, devices = n, "created ERdmaDevice");
    ctx.event_once(
        node,
        "ERIsSelected",
        format!(
            "{n} ERI(s) of instance {} recorded in ERdmaDevice {name}",
            instance.instance_id
        ),
    )
    .await;
    Ok(())
}

async fn backfill_tags(ctx: &Ctx, obj: &ERdmaDevice) {
    if obj.annotations().contains_key(ANNOTATION_TAGGED) {
        return;
    }
    let todo: Vec<(String, String)> = {
        let tagged = ctx.tagged.lock().unwrap_or_else(|p| p.into_inner());
        obj.spec
            .devices
            .iter()
            .filter(|d| d.id.starts_with("eni-") && !tagged.contains(&d.id))
            .map(|d| (d.id.clone(), d.instance_id.clone()))
            .collect()
    };
    for (eni, instance) in todo {
        match ctx
            .ecs
            .tag_enis(&[&eni], &eri::terway_tags(&instance))
            .await
        {
            Ok(()) => {
                ctx.tagged
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(eni);
            }
            Err(e) => {
                tracing::warn!(eni = %eni, error = %e, "back-filling terway tags failed (best-effort)")
            }
        }
    }
    let done = {
        let tagged = ctx.tagged.lock().unwrap_or_else(|p| p.into_inner());
        obj.spec
            .devices
            .iter()
            .all(|d| !d.id.starts_with("eni-") || tagged.contains(&d.id))
    };
    if done {
        let api: Api<ERdmaDevice> = Api::all(ctx.client.clone());
        let patch = serde_json::json!({"metadata": {"annotations": {ANNOTATION_TAGGED: "true"}}});
        if let Err(e) = api
            .patch(
                &obj.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            tracing::debug!(error = %e, "recording the terway tags on the ERdmaDevice failed");
        }
    }
}

async fn delete_device_object(api: &Api<ERdmaDevice>, name: &str) -> Result<(), ReconcileError> {
    let Some(obj) = api
        .get_opt(name)
        .await
        .map_err(kube_err(format!("get ERdmaDevice {name}")))?
    else {
        return Ok(());
    };
    strip_finalizer(api, &obj).await?;
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(kube_err(format!("delete ERdmaDevice {name}"))(e)),
    }
}

async fn strip_finalizer(api: &Api<ERdmaDevice>, obj: &ERdmaDevice) -> Result<(), ReconcileError> {
    let name = obj.name_any();
    let finalizers = obj.finalizers();
    if !finalizers.iter().any(|f| f == FINALIZER) {
        return Ok(());
    }
    let rest: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
    let patch = serde_json::json!({"metadata": {"finalizers": rest, "resourceVersion": obj.resource_version()}});
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(kube_err(format!("remove finalizer of ERdmaDevice {name}"))(
            e,
        )),
    }
}

/// The status message of a device whose ERI is being attached (the attach call was accepted,
/// or ECS reports it `Attaching`).
pub const ATTACHING: &str = "attaching";

/// One device's status entry from its ENI as ECS describes it (`None`: ECS does not know it),
/// attaching a detached ERI or converting the primary ENI where needed.
async fn device_entry(
    ctx: &Ctx,
    obj: &ERdmaDevice,
    d: &DeviceInfo,
    eni: Option<&NetworkInterface>,
) -> DeviceStatus {
    match eni {
        None => DeviceStatus::new(
            &d.id,
            DeviceState::Failed,
            format!("ENI {} not found in ECS", d.id),
        ),
        Some(e) if e.status == "InUse" && e.is_high_performance() => {
            DeviceStatus::new(&d.id, DeviceState::Ready, "")
        }
        Some(e) if e.status == "Available" && !d.is_primary_eni => {
            match ctx
                .ecs
                .attach_network_interface(&d.id, &d.instance_id, d.network_card_index)
                .await
            {
                Ok(()) => DeviceStatus::new(&d.id, DeviceState::Pending, ATTACHING),
                Err(err) => {
                    ctx.event(obj, true, "AttachFailed", err.to_string()).await;
                    DeviceStatus::new(&d.id, DeviceState::Failed, err.to_string())
                }
            }
        }
        Some(e) if e.is_primary() && e.status == "InUse" => {
            match ctx
                .ecs
                .make_high_performance(&d.id, d.queue_pair.max(1))
                .await
            {
                Ok(()) => DeviceStatus::new(&d.id, DeviceState::Ready, ""),
                Err(err) => {
                    ctx.event(obj, true, "ConvertFailed", err.to_string()).await;
                    DeviceStatus::new(&d.id, DeviceState::Failed, err.to_string())
                }
            }
        }
        // The same words as right after the attach call, so the status is not written again.
        Some(e) if e.status == "Attaching" => {
            DeviceStatus::new(&d.id, DeviceState::Pending, ATTACHING)
        }
        Some(e) => DeviceStatus::new(&d.id, DeviceState::Pending, format!("ENI is {}", e.status)),
    }
}

/// The ERdmaDevice reconciler.
pub async fn reconcile_device(
    obj: Arc<ERdmaDevice>,
    ctx: Arc<Ctx>,
) -> Result<Action, ReconcileError> {
    let name = obj.name_any();
    if let Some(wait) = ctx.own_write_wait(&name, obj.resource_version().as_deref()) {
        // This event is this process's own status write of a moment ago: an attach under way,
        // or a call that failed (throttled, say) and is due again later, not at once.
        return Ok(Action::requeue(wait));
    }
    let api: Api<ERdmaDevice> = Api::all(ctx.client.clone());
    if obj.metadata.deletion_timestamp.is_some() {
        strip_finalizer(&api, &obj).await?;
        return Ok(Action::await_change());
    }
    let node_name = obj
        .labels()
        .get(LABEL_NODE_NAME)
        .cloned()
        .unwrap_or_else(|| name.clone());
    if !ctx.node_exists(&node_name).await? {
        tracing::info!(object = %name, node = %node_name, "node is gone; deleting its ERdmaDevice");
        delete_device_object(&api, &name).await?;
        return Ok(Action::await_change());
    }
    if obj.all_ready() {
        return Ok(Action::await_change());
    }
    let ids: Vec<&str> = obj.spec.devices.iter().map(|d| d.id.as_str()).collect();
    let enis = ctx.enis_by_id(&ids).await?;
    let old: Vec<DeviceStatus> = obj
        .status
        .as_ref()
        .map(|s| s.devices.clone())
        .unwrap_or_default();
    // The devices' calls (an attach, a conversion) go to different actions: made together.
    let entries = obj.spec.devices.iter().map(|d| {
        let eni = enis.iter().find(|e| e.id == d.id);
        device_entry(&ctx, &obj, d, eni)
    });
    let entries = futures::future::join_all(entries).await;
    let mut new = Vec::new();
    for (d, entry) in obj.spec.devices.iter().zip(entries) {
        // Keep the agent's report while the cloud side is fine (see erdma_k8s::agent).
        let agent = old
            .iter()
            .find(|s| s.id == d.id && s.message.starts_with(AGENT_PREFIX));
        new.push(match agent {
            Some(a) if entry.state() == Some(DeviceState::Ready) => a.clone(),
            _ => entry,
        });
    }
    let pending = new
        .iter()
        .any(|s| s.state() != Some(DeviceState::Ready) && !s.message.starts_with(AGENT_PREFIX));
    let attaching = new
        .iter()
        .any(|s| s.state() == Some(DeviceState::Pending) && s.message == ATTACHING);
    if new != old {
        let patch = serde_json::json!({"status": ERdmaDeviceStatus { devices: new.clone() }});
        let written = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(format!("patch status of ERdmaDevice {name}")))?;
        if attaching {
            ctx.wrote_status(&name, written.resource_version(), ATTACHING_REQUEUE);
        } else if pending {
            ctx.wrote_status(&name, written.resource_version(), PENDING_REQUEUE);
        }
    }
    Ok(if attaching {
        Action::requeue(ATTACHING_REQUEUE)
    } else if pending {
        Action::requeue(PENDING_REQUEUE)
    } else {
        Action::await_change()
    })
}

/// Retry policy for failed reconciles: throttling/5xx sooner, other errors later.
pub fn error_backoff(err: &ReconcileError) -> Duration {
    match err {
        ReconcileError::Ecs(e) if e.is_retryable() => Duration::from_secs(15),
        ReconcileError::Batch(e) if e.is_retryable() => Duration::from_secs(15),
        ReconcileError::Kube(..) => Duration::from_secs(5),
        _ => Duration::from_secs(60),
    }
}

/// Runs both controllers until `cancel` fires.
pub async fn run_controllers(ctx: Arc<Ctx>, cancel: CancellationToken) {
    let metrics = ctx.metrics.clone();
    let sel = ctx.cfg.node_label_selector();
    let wc = if sel.is_empty() {
        watcher::Config::default()
    } else {
        watcher::Config::default().labels(&sel)
    };
    let bounded = kube::runtime::controller::Config::default()
        .concurrency(ctx.cfg.concurrent_reconciles.max(1));
    // Informers as Controller::new builds them, with each object stripped to what the
    // reconcilers read before it is cached; the caches are shared with the reconcilers.
    let (node_cache, node_writer) = reflector::store();
    let node_events = reflector(
        node_writer,
        watcher(Api::<Node>::all(ctx.client.clone()), wc).modify(strip_node),
    )
    .applied_objects();
    let (device_cache, device_writer) = reflector::store();
    let device_events = reflector(
        device_writer,
        watcher(
            Api::<ERdmaDevice>::all(ctx.client.clone()),
            watcher::Config::default(),
        )
        .modify(strip_device),
    )
    .applied_objects();
    *ctx.caches.write().unwrap_or_else(|p| p.into_inner()) = Some(Caches {
        nodes: node_cache.clone(),
        devices: device_cache.clone(),
    });
    let nodes = Controller::for_stream(node_events, node_cache)
        .with_config(bounded.clone())
        .graceful_shutdown_on(cancel.clone().cancelled_owned())
        .run(
            reconcile_node,
            |node, err, ctx| {
                ctx.metrics.reconciled("node", false);
                tracing::warn!(node = %node.name_any(), error = %err, "node reconcile failed");
                Action::requeue(error_backoff(err))
            },
            ctx.clone(),
        )
        .for_each(|r| {
            if r.is_ok() {
                metrics.reconciled("node", true);
            }
            async {}
        });
    let devices = Controller::for_stream(device_events, device_cache)
        .with_config(bounded)
    .graceful_shutdown_on(cancel.clone().cancelled_owned())
    .run(
        reconcile_device,
        |obj, err, ctx| {
            ctx.metrics.reconciled("erdmadevice", false);
            tracing::warn!(object = %obj.name_any(), error = %err, "ERdmaDevice reconcile failed");
            Action::requeue(error_backoff(err))
        },
        ctx.clone(),
    )
    .for_each(|r| {
        if r.is_ok() {
            metrics.reconciled("erdmadevice", true);
        }
        async {}
    });
    futures::join!(nodes, devices);
    *ctx.caches.write().unwrap_or_else(|p| p.into_inner()) = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_erdma_device_keeps_what_the_reconcilers_read() {
        let mut o = ERdmaDevice::new(
            "gpu-1",
            ERdmaDeviceSpec {
                devices: vec![DeviceInfo {
                    instance_id: "i-1".into(),
                    mac: "00:16:3e:00:00:01".into(),
                    is_primary_eni: true,
                    id: "eni-1".into(),
                    network_card_index: 0,
                    queue_pair: 16,
                }],
                jumbo_frame: true,
            },
        );
        o.metadata.uid = Some("u-1".into());
        o.metadata.resource_version = Some("42".into());
        o.metadata.finalizers = Some(vec![FINALIZER.into()]);
        o.metadata.labels = Some(erdma_device_labels("gpu-1", "i-1"));
        o.metadata.annotations = Some(BTreeMap::from([
            (ANNOTATION_TAGGED.to_string(), "true".to_string()),
            ("other".to_string(), "x".to_string()),
        ]));
        o.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: "gpu-1".into(),
            uid: "n-1".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        o.metadata.managed_fields = Some(vec![Default::default()]);
        o.status = Some(ERdmaDeviceStatus {
            devices: vec![DeviceStatus::new("eni-1", DeviceState::Ready, "")],
        });
        let (spec, status) = (o.spec.clone(), o.status.clone());
        strip_device(&mut o);
        assert_eq!(o.metadata.name.as_deref(), Some("gpu-1"));
        assert_eq!(o.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(o.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(o.finalizers(), [FINALIZER.to_string()]);
        assert_eq!(
            o.labels(),
            &BTreeMap::from([(LABEL_NODE_NAME.to_string(), "gpu-1".to_string())])
        );
        assert_eq!(
            o.annotations(),
            &BTreeMap::from([(ANNOTATION_TAGGED.to_string(), "true".to_string())])
        );
        assert!(o.metadata.owner_references.is_none());
        assert!(o.metadata.managed_fields.is_none());
        assert_eq!(o.spec, spec);
        assert_eq!(o.status, status);
        // Without the annotation, none is kept.
        o.metadata.annotations = Some(BTreeMap::from([("other".to_string(), "x".to_string())]));
        strip_device(&mut o);
        assert!(o.metadata.annotations.is_none());
    }

    #[test]
    fn provider_ids() {
        assert_eq!(
            instance_from_provider_id("cn-hangzhou.i-bp1abc").as_deref(),
            Some("i-bp1abc")
        );
        assert_eq!(
            instance_from_provider_id("i-bp1abc").as_deref(),
            Some("i-bp1abc")
        );
        assert_eq!(instance_from_provider_id("aws:///us-east-1a/i-0abc"), None);
        assert_eq!(instance_from_provider_id("cn-hangzhou."), None);
    }
}
