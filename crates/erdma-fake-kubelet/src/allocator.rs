//! A minimal DRA allocator for the lab: **not the scheduler**. It writes what the scheduler's DRA
//! plugin would write into a ResourceClaim's status for the simple claims the lab makes, so the
//! kubelet side (prepare, CDI devices, unprepare) runs against a real driver:
//!
//! - one request per claim, `exactly` one device class, `ExactCount` devices; or a
//!   `firstAvailable` list of one subrequest of that form, allocated as `<request>/<subrequest>`
//!   (the container then names the request: `resources.claims[].request`);
//! - the class's selectors are understood only in the form the erdma install renders,
//!   `device.driver == "<driver>"` (anything else is refused: no CEL evaluation here);
//! - devices of the node's ResourceSlices of that driver; a device with a `NoSchedule` or
//!   `NoExecute` taint is skipped (the lab's claims carry no tolerations);
//! - consumable capacity (KEP-5075): what a request consumes of each capacity is its
//!   `capacity.requests` amount, else the capacity's `requestPolicy.default`, else the whole
//!   capacity; raised to `validRange.min` and rounded up to its `step`; a device takes the claim
//!   only when, for every capacity, what the allocated claims consumed plus this amount fits its
//!   value. A device without `allowMultipleAllocations` is taken by one claim only. Each result of
//!   a shared device gets a `shareID`;
//! - the extended-resource mapping (KEP-5004): for a container's `aliyun/erdma: N` the claim the
//!   scheduler makes (`<pod>-extended-resources-<suffix>`, annotation
//!   `resource.kubernetes.io/extended-resource-claim: "true"`, owned by the pod, request
//!   `container-<i>-request-<j>` for the DeviceClass whose `extendedResourceName` is the resource)
//!   and the pod's `status.extendedResourceClaimStatus` that tells the kubelet which request is
//!   whose; none on a node whose `status.allocatable` has the resource, even at 0 (the scheduler
//!   takes it for a device-plugin node and the pod stays Pending: [`device_plugin_node`]).
//!
//! - the reservation: the claim's `status.reservedFor` names the pod, written with the allocation
//!   in one status update, as the scheduler does before it binds the pod (the DRA driver's claim
//!   cache keeps only reserved claims).
//!
//! Not modelled: CEL, constraints, first-available lists of several entries, admin access, tolerations, binding
//! conditions, several pools, a claim shared by several pods. `overcommit` writes an allocation without the
//! capacity check, as a scheduler with another view of the device would: the driver's own
//! guard at prepare is then what refuses it.

use crate::error::{FakeKubeletError, Result};
use k8s_openapi::api::core::v1::{
    Container, ContainerExtendedResourceRequest, Node, Pod, PodExtendedResourceClaimStatus,
    PodResourceClaim, PodSpec, PodStatus, ResourceClaim as ContainerClaim, ResourceRequirements,
};
use k8s_openapi::api::resource::v1::{
    AllocationResult, CapacityRequirements, Device, DeviceAllocationResult, DeviceClaim,
    DeviceClass, DeviceRequest, DeviceRequestAllocationResult, DeviceSubRequest,
    ExactDeviceRequest, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimSpec,
    ResourceClaimStatus, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;

/// The annotation of the claim the scheduler makes for extended resources (KEP-5004).
pub const EXTENDED_RESOURCE_CLAIM_ANNOTATION: &str =
    "resource.kubernetes.io/extended-resource-claim";
/// The request name of the lab's ordinary claims.
pub const REQUEST: &str = "rdma";

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> FakeKubeletError {
    let what = what.into();
    move |e| FakeKubeletError::Refused(format!("{what}: {e}"))
}

/// Parses a whole-number quantity (`200`, `4k`, `2M`, `1Gi`, ...) as erdma's DRA driver does.
pub fn quantity(q: &str) -> Result<u64> {
    erdma_model::quantity::parse(q).map_err(FakeKubeletError::Refused)
}

/// The driver a DeviceClass selects, from its one selector `device.driver == "<driver>"`.
pub fn class_driver(class: &DeviceClass) -> Result<String> {
    let name = class.metadata.name.as_deref().unwrap_or("?");
    let exprs: Vec<&str> = class
        .spec
        .selectors
        .iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref().map(|c| c.expression.trim()))
        .collect();
    let refuse = || {
        FakeKubeletError::Refused(format!(
            "DeviceClass {name}: the lab allocator understands exactly one selector `device.driver == \"NAME\"`, not {exprs:?}"
        ))
    };
    let [e] = exprs.as_slice() else {
        return Err(refuse());
    };
    let rest = e
        .strip_prefix("device.driver")
        .map(str::trim_start)
        .and_then(|r| r.strip_prefix("=="))
        .map(str::trim)
        .ok_or_else(refuse)?;
    let driver = rest
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .filter(|d| !d.is_empty() && !d.contains('"'))
        .ok_or_else(refuse)?;
    Ok(driver.to_string())
}

/// What one request of a claim consumes of each capacity of `device`.
pub fn consumption(
    device: &Device,
    requested: &BTreeMap<String, u64>,
) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for (name, cap) in device.capacity.iter().flatten() {
        let total = quantity(&cap.value.0)?;
        let policy = cap.request_policy.as_ref();
        let mut amount = match (requested.get(name), policy.and_then(|p| p.default.as_ref())) {
            (Some(a), _) => *a,
            (None, Some(d)) => quantity(&d.0)?,
            (None, None) => total,
        };
        if let Some(range) = policy.and_then(|p| p.valid_range.as_ref()) {
            let min = quantity(&range.min.0)?;
            amount = amount.max(min);
            if let Some(step) = range.step.as_ref().map(|s| quantity(&s.0)).transpose()?
                && step > 0
            {
                let over = (amount - min) % step;
                if over != 0 {
                    amount += step - over;
                }
            }
            if let Some(max) = range.max.as_ref().map(|m| quantity(&m.0)).transpose()?
                && amount > max
            {
                return Err(FakeKubeletError::Refused(format!(
                    "device {}: {name} request {amount} is above the policy's maximum {max}",
                    device.name
                )));
            }
        }
        out.insert(name.clone(), amount);
    }
    if let Some(unknown) = requested.keys().find(|k| !out.contains_key(*k)) {
        return Err(FakeKubeletError::Refused(format!(
            "device {} has no capacity {unknown:?} (it has: {})",
            device.name,
            out.keys().cloned().collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(out)
}

/// What the allocated claims hold per device (`pool/device`): consumed capacity sums and the
/// number of allocations.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct InUse {
    /// Allocations of the device.
    pub allocations: usize,
    /// Consumed capacity summed over them.
    pub consumed: BTreeMap<String, u64>,
}

/// Sums what the claims' allocations of `driver` hold, per `pool/device`.
pub fn in_use(claims: &[ResourceClaim], driver: &str) -> Result<BTreeMap<String, InUse>> {
    let mut out: BTreeMap<String, InUse> = BTreeMap::new();
    for c in claims {
        let results = c
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref());
        for r in results.iter().flat_map(|r| r.iter()) {
            if r.driver != driver {
                continue;
            }
            let u = out.entry(format!("{}/{}", r.pool, r.device)).or_default();
            u.allocations += 1;
            for (k, q) in r.consumed_capacity.iter().flatten() {
                *u.consumed.entry(k.clone()).or_default() += quantity(&q.0)?;
            }
        }
    }
    Ok(out)
}

/// What to allocate for one request.
#[derive(Debug, Clone)]
pub struct Want {
    /// Driver the class selects.
    pub driver: String,
    /// The node whose slices are used.
    pub node: String,
    /// Request name.
    pub request: String,
    /// Number of devices.
    pub count: usize,
    /// Capacity amounts asked (`capacity.requests`).
    pub capacity: BTreeMap<String, u64>,
    /// Only this device (ResourceSlice device name).
    pub device: Option<String>,
    /// Skip the capacity check (see the module doc).
    pub overcommit: bool,
}

fn blocking_taint(d: &Device) -> Option<String> {
    d.taints
        .iter()
        .flatten()
        .find(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .map(|t| {
            format!(
                "{}={}:{}",
                t.key,
                t.value.as_deref().unwrap_or(""),
                t.effect
            )
        })
}

/// Picks devices for `want` from the node's `slices` given what `claims` hold; the error names
/// every device and why it did not fit.
pub fn pick(
    slices: &[ResourceSlice],
    claims: &[ResourceClaim],
    want: &Want,
) -> Result<Vec<DeviceRequestAllocationResult>> {
    let mut used = in_use(claims, &want.driver)?;
    let mut out = Vec::new();
    let mut why = Vec::new();
    let candidates = slices
        .iter()
        .filter(|s| {
            s.spec.driver == want.driver && s.spec.node_name.as_deref() == Some(want.node.as_str())
        })
        .flat_map(|s| {
            s.spec
                .devices
                .iter()
                .flatten()
                .map(move |d| (s.spec.pool.name.clone(), d))
        });
    for (pool, d) in candidates {
        if out.len() == want.count {
            break;
        }
        if want.device.as_deref().is_some_and(|n| n != d.name) {
            continue;
        }
        if let Some(t) = blocking_taint(d) {
            why.push(format!("{}: tainted {t}", d.name));
            continue;
        }
        let key = format!("{pool}/{}", d.name);
        let u = used.entry(key).or_default();
        let shared = d.allow_multiple_allocations == Some(true);
        if !shared && u.allocations > 0 && !want.overcommit {
            why.push(format!("{}: allocated and not shareable", d.name));
            continue;
        }
        let amounts = consumption(d, &want.capacity)?;
        let mut full = Vec::new();
        for (name, amount) in &amounts {
            let total = d
                .capacity
                .as_ref()
                .and_then(|c| c.get(name))
                .map(|c| quantity(&c.value.0))
                .transpose()?
                .unwrap_or(0);
            let have = u.consumed.get(name).copied().unwrap_or(0);
            if have.saturating_add(*amount) > total {
                full.push(format!("{name}={total}, allocated {have}, asked {amount}"));
            }
        }
        if !full.is_empty() && !want.overcommit {
            why.push(format!("{}: {}", d.name, full.join("; ")));
            continue;
        }
        u.allocations += 1;
        for (name, amount) in &amounts {
            *u.consumed.entry(name.clone()).or_default() += amount;
        }
        out.push(DeviceRequestAllocationResult {
            driver: want.driver.clone(),
            pool,
            device: d.name.clone(),
            request: want.request.clone(),
            share_id: shared.then(share_id),
            consumed_capacity: shared.then(|| {
                amounts
                    .iter()
                    .map(|(k, v)| (k.clone(), Quantity(v.to_string())))
                    .collect()
            }),
            ..Default::default()
        });
    }
    if out.len() < want.count {
        return Err(FakeKubeletError::Refused(format!(
            "lab allocator: {} device(s) of driver {} on node {} wanted for request {}, {} fit ({})",
            want.count,
            want.driver,
            want.node,
            want.request,
            out.len(),
            if why.is_empty() {
                "no such device".to_string()
            } else {
                why.join("; ")
            }
        )));
    }
    Ok(out)
}

/// A fresh share ID (a UID-shaped random string, as the scheduler generates).
fn share_id() -> String {
    let mut b = [0u8; 16];
    if getrandom(&mut b).is_err() {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        b = n.to_le_bytes();
    }
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// The lab's ordinary claim: one request [`REQUEST`] of `class` for `count` devices with
/// `capacity` amounts asked; with `first_available`, the request is a `firstAvailable` list of
/// one subrequest of that name asking the same.
pub fn claim_object(
    namespace: &str,
    name: &str,
    class: &str,
    count: usize,
    capacity: &BTreeMap<String, u64>,
    first_available: Option<&str>,
) -> ResourceClaim {
    let request = match first_available {
        None => exact_request(REQUEST, class, count, capacity),
        Some(sub) => {
            let exact = exact_request(sub, class, count, capacity)
                .exactly
                .unwrap_or_default();
            DeviceRequest {
                name: REQUEST.into(),
                exactly: None,
                first_available: Some(vec![DeviceSubRequest {
                    name: sub.into(),
                    device_class_name: exact.device_class_name,
                    allocation_mode: exact.allocation_mode,
                    count: exact.count,
                    capacity: exact.capacity,
                    ..Default::default()
                }]),
            }
        }
    };
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![request]),
                ..Default::default()
            }),
        },
        status: None,
    }
}

fn exact_request(
    name: &str,
    class: &str,
    count: usize,
    capacity: &BTreeMap<String, u64>,
) -> DeviceRequest {
    DeviceRequest {
        name: name.into(),
        exactly: Some(ExactDeviceRequest {
            device_class_name: class.into(),
            allocation_mode: Some("ExactCount".into()),
            count: Some(i64::try_from(count).unwrap_or(i64::MAX)),
            capacity: (!capacity.is_empty()).then(|| CapacityRequirements {
                requests: Some(
                    capacity
                        .iter()
                        .map(|(k, v)| (k.clone(), Quantity(v.to_string())))
                        .collect(),
                ),
            }),
            ..Default::default()
        }),
        first_available: None,
    }
}

/// The lab allocator's API access.
#[derive(Clone)]
pub struct Allocator {
    client: kube::Client,
    node: String,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// A claim to make and allocate for a pod.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// Pod `namespace/name` (the claim is in its namespace).
    pub pod: String,
    /// Container that uses the claim.
    pub container: String,
    /// Claim name.
    pub claim: String,
    /// DeviceClass name.
    pub class: String,
    /// Devices.
    pub count: usize,
    /// Capacity amounts asked.
    pub capacity: BTreeMap<String, u64>,
    /// Only this device.
    pub device: Option<String>,
    /// Skip the capacity check.
    pub overcommit: bool,
    /// Ask through a `firstAvailable` list of one subrequest of this name (allocated as
    /// `rdma/<name>`; the container names the request `rdma`).
    pub first_available: Option<String>,
}

/// The scheduler's rule for an extended resource backed by DRA (`filterExtendedResources`): a node
/// whose `status.allocatable` has the resource, even at 0, is a device-plugin node for it, and the
/// DRA route is skipped there. `Some(the refusal)` for such a node.
pub fn device_plugin_node(node: &Node, resource: &str) -> Option<String> {
    let name = node.metadata.name.as_deref().unwrap_or("");
    let q = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(resource))?;
    Some(format!(
        "node {name} has {resource} in status.allocatable ({:?}): the scheduler takes it for a device-plugin node of {resource} and does not allocate it through DRA; the pod stays Pending (remove the key from the node's status, as the agent on a DRA node does)",
        q.0
    ))
}

fn split_pod(pod: &str) -> Result<(&str, &str)> {
    match pod.split_once('/') {
        Some((ns, n)) if !ns.is_empty() && !n.is_empty() && !n.contains('/') => Ok((ns, n)),
        _ => Err(FakeKubeletError::Refused(format!(
            "pod {pod:?} must be NAMESPACE/NAME"
        ))),
    }
}

impl Allocator {
    /// Allocates on `node` through `client`.
    pub fn new(client: kube::Client, node: impl Into<String>) -> Self {
        Allocator {
            client,
            node: node.into(),
        }
    }

    async fn class(&self, name: &str) -> Result<DeviceClass> {
        kube::Api::<DeviceClass>::all(self.client.clone())
            .get(name)
            .await
            .map_err(kube_err(format!("read DeviceClass {name}")))
    }

    async fn allocate(&self, want: &Want) -> Result<Vec<DeviceRequestAllocationResult>> {
        let slices = kube::Api::<ResourceSlice>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(kube_err("list ResourceSlices"))?
            .items;
        let claims = kube::Api::<ResourceClaim>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(kube_err("list ResourceClaims"))?
            .items;
        pick(&slices, &claims, want)
    }

    /// Writes the allocation and the reservation for `pod` in one status update.
    async fn write_status(
        &self,
        namespace: &str,
        name: &str,
        results: Vec<DeviceRequestAllocationResult>,
        pod: &Pod,
    ) -> Result<ResourceClaim> {
        let status = ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: None,
                }),
                ..Default::default()
            }),
            reserved_for: Some(vec![ResourceClaimConsumerReference {
                api_group: None,
                resource: "pods".into(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                uid: pod.metadata.uid.clone().unwrap_or_default(),
            }]),
            ..Default::default()
        };
        let patch = serde_json::json!({ "status": status });
        kube::Api::<ResourceClaim>::namespaced(self.client.clone(), namespace)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(format!(
                "write the allocation of ResourceClaim {namespace}/{name}"
            )))
    }

    /// The pod object, created (one container) when the API server does not have it yet.
    async fn pod(&self, pod: &str, container: &str) -> Result<Pod> {
        let (ns, name) = split_pod(pod)?;
        let api = kube::Api::<Pod>::namespaced(self.client.clone(), ns);
        if let Some(p) = api
            .get_opt(name)
            .await
            .map_err(kube_err(format!("read pod {pod}")))?
        {
            return Ok(p);
        }
        let p = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(self.node.clone()),
                containers: vec![Container {
                    name: container.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        };
        api.create(&PostParams::default(), &p)
            .await
            .map_err(kube_err(format!("create pod {pod}")))
    }

    async fn replace_pod(&self, pod: &Pod) -> Result<Pod> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or("");
        let mut p = pod.clone();
        p.metadata.resource_version = None;
        kube::Api::<Pod>::namespaced(self.client.clone(), ns)
            .replace(name, &PostParams::default(), &p)
            .await
            .map_err(kube_err(format!("update pod {ns}/{name}")))
    }

    /// Makes claim `r.claim` for the pod's container (the pod's `spec.resourceClaims` entry and
    /// the container's `resources.claims` reference, as a user writes them) and allocates it.
    pub async fn claim(&self, r: &ClaimRequest) -> Result<ResourceClaim> {
        let (ns, _) = split_pod(&r.pod)?;
        let class = self.class(&r.class).await?;
        let want = Want {
            driver: class_driver(&class)?,
            node: self.node.clone(),
            request: match &r.first_available {
                Some(sub) => format!("{REQUEST}/{sub}"),
                None => REQUEST.into(),
            },
            count: r.count,
            capacity: r.capacity.clone(),
            device: r.device.clone(),
            overcommit: r.overcommit,
        };
        let results = self.allocate(&want).await?;
        let mut pod = self.pod(&r.pod, &r.container).await?;
        let spec = pod.spec.get_or_insert_with(Default::default);
        let entry = format!("claim-{}", r.claim);
        let claims = spec.resource_claims.get_or_insert_with(Vec::new);
        if !claims.iter().any(|c| c.name == entry) {
            claims.push(PodResourceClaim {
                name: entry.clone(),
                resource_claim_name: Some(r.claim.clone()),
                ..Default::default()
            });
        }
        let c = container_mut(spec, &r.container)?;
        let refs = c
            .resources
            .get_or_insert_with(ResourceRequirements::default)
            .claims
            .get_or_insert_with(Vec::new);
        if !refs.iter().any(|c| c.name == entry) {
            refs.push(ContainerClaim {
                name: entry,
                // A prioritized list's container names the request, never a subrequest.
                request: r.first_available.as_ref().map(|_| REQUEST.to_string()),
            });
        }
        let pod = self.replace_pod(&pod).await?;
        let obj = claim_object(
            ns,
            &r.claim,
            &r.class,
            r.count,
            &r.capacity,
            r.first_available.as_deref(),
        );
        kube::Api::<ResourceClaim>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), &obj)
            .await
            .map_err(kube_err(format!("create ResourceClaim {ns}/{}", r.claim)))?;
        self.write_status(ns, &r.claim, results, &pod).await
    }

    /// What the scheduler does for a container's extended resource `resource: count` (KEP-5004):
    /// finds the DeviceClass whose `extendedResourceName` is `resource`, makes the pod's special
    /// claim, allocates it and records the mapping in the pod's status.
    pub async fn extended(
        &self,
        pod: &str,
        container: &str,
        resource: &str,
        count: usize,
    ) -> Result<ResourceClaim> {
        let (ns, name) = split_pod(pod)?;
        let node = kube::Api::<Node>::all(self.client.clone())
            .get(&self.node)
            .await
            .map_err(kube_err(format!("read node {}", self.node)))?;
        if let Some(refusal) = device_plugin_node(&node, resource) {
            return Err(FakeKubeletError::Refused(refusal));
        }
        let classes = kube::Api::<DeviceClass>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(kube_err("list DeviceClasses"))?
            .items;
        let class = classes
            .iter()
            .find(|c| c.spec.extended_resource_name.as_deref() == Some(resource))
            .ok_or_else(|| {
                FakeKubeletError::Refused(format!(
                    "no DeviceClass has extendedResourceName {resource} (classes: {}); the scheduler would leave the pod to a device plugin",
                    classes
                        .iter()
                        .filter_map(|c| c.metadata.name.clone())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
        let class_name = class.metadata.name.clone().unwrap_or_default();
        let mut pod_obj = self.pod(pod, container).await?;
        let spec = pod_obj.spec.get_or_insert_with(Default::default);
        let index = spec
            .containers
            .iter()
            .position(|c| c.name == container)
            .ok_or_else(|| {
                FakeKubeletError::Refused(format!("pod {pod} has no container {container}"))
            })?;
        let c = &mut spec.containers[index];
        let n = Quantity(count.to_string());
        let res = c.resources.get_or_insert_with(Default::default);
        res.requests
            .get_or_insert_with(Default::default)
            .insert(resource.into(), n.clone());
        res.limits
            .get_or_insert_with(Default::default)
            .insert(resource.into(), n);
        let mut pod_obj = self.replace_pod(&pod_obj).await?;
        let request = format!("container-{index}-request-0");
        let want = Want {
            driver: class_driver(class)?,
            node: self.node.clone(),
            request: request.clone(),
            count,
            capacity: BTreeMap::new(),
            device: None,
            overcommit: false,
        };
        let results = self.allocate(&want).await?;
        let claim_name = format!("{name}-extended-resources-{}", &share_id()[..5]);
        let mut obj = claim_object(ns, &claim_name, &class_name, count, &BTreeMap::new(), None);
        if let Some(reqs) = obj.spec.devices.as_mut().and_then(|d| d.requests.as_mut()) {
            reqs[0] = exact_request(&request, &class_name, count, &BTreeMap::new());
        }
        obj.metadata.annotations = Some(BTreeMap::from([(
            EXTENDED_RESOURCE_CLAIM_ANNOTATION.to_string(),
            "true".to_string(),
        )]));
        obj.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: name.into(),
            uid: pod_obj.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        kube::Api::<ResourceClaim>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), &obj)
            .await
            .map_err(kube_err(format!("create ResourceClaim {ns}/{claim_name}")))?;
        let claim = self
            .write_status(ns, &claim_name, results, &pod_obj)
            .await?;
        let status = pod_obj.status.get_or_insert_with(PodStatus::default);
        status.extended_resource_claim_status = Some(PodExtendedResourceClaimStatus {
            request_mappings: vec![ContainerExtendedResourceRequest {
                container_name: container.into(),
                request_name: request,
                resource_name: resource.into(),
            }],
            resource_claim_name: claim_name,
        });
        let patch = serde_json::json!({"status": {"extendedResourceClaimStatus": status.extended_resource_claim_status}});
        kube::Api::<Pod>::namespaced(self.client.clone(), ns)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(format!(
                "write extendedResourceClaimStatus of pod {pod}"
            )))?;
        Ok(claim)
    }
}

fn container_mut<'a>(spec: &'a mut PodSpec, name: &str) -> Result<&'a mut Container> {
    if !spec.containers.iter().any(|c| c.name == name) {
        spec.containers.push(Container {
            name: name.into(),
            ..Default::default()
        });
    }
    spec.containers
        .iter_mut()
        .find(|c| c.name == name)
        .ok_or_else(|| FakeKubeletError::Refused(format!("no container {name}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        CELDeviceSelector, CapacityRequestPolicy, CapacityRequestPolicyRange, DeviceCapacity,
        DeviceClassSpec, DeviceSelector, DeviceTaint, ResourcePool, ResourceSliceSpec,
    };

    fn cap(total: u64, default: u64) -> DeviceCapacity {
        DeviceCapacity {
            value: Quantity(total.to_string()),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(Quantity(default.to_string())),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: Quantity("1".into()),
                    max: Some(Quantity(total.to_string())),
                    step: Some(Quantity("1".into())),
                }),
                valid_values: None,
            }),
        }
    }

    fn device(name: &str) -> Device {
        Device {
            name: name.into(),
            capacity: Some(BTreeMap::from([
                ("shares".to_string(), cap(200, 1)),
                ("hcaHandle".to_string(), cap(1000, 4)),
            ])),
            allow_multiple_allocations: Some(true),
            ..Default::default()
        }
    }

    fn slice(devices: Vec<Device>) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta::default(),
            spec: ResourceSliceSpec {
                driver: "d.example.com".into(),
                node_name: Some("n1".into()),
                pool: ResourcePool {
                    name: "n1".into(),
                    generation: 1,
                    resource_slice_count: 1,
                },
                devices: Some(devices),
                ..Default::default()
            },
        }
    }

    fn want(shares: u64) -> Want {
        Want {
            driver: "d.example.com".into(),
            node: "n1".into(),
            request: "r".into(),
            count: 1,
            capacity: BTreeMap::from([("shares".to_string(), shares)]),
            device: None,
            overcommit: false,
        }
    }

    fn allocated(results: Vec<DeviceRequestAllocationResult>) -> ResourceClaim {
        ResourceClaim {
            metadata: ObjectMeta::default(),
            spec: Default::default(),
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(results),
                        config: None,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_node_with_the_resource_in_allocatable_even_at_0_gets_no_dra_allocation() {
        use k8s_openapi::api::core::v1::NodeStatus;
        let node = |alloc: Option<&str>| Node {
            metadata: ObjectMeta {
                name: Some("lab-node".into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                allocatable: Some(
                    [("cpu", Some("4")), ("aliyun/erdma", alloc)]
                        .into_iter()
                        .filter_map(|(k, v)| Some((k.to_string(), Quantity(v?.to_string()))))
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let refusal = device_plugin_node(&node(Some("0")), "aliyun/erdma").expect("refused");
        assert!(
            refusal.contains("node lab-node has aliyun/erdma in status.allocatable (\"0\")")
                && refusal.contains("the pod stays Pending"),
            "{refusal}"
        );
        assert!(device_plugin_node(&node(Some("2")), "aliyun/erdma").is_some());
        assert_eq!(device_plugin_node(&node(None), "aliyun/erdma"), None);
        assert_eq!(device_plugin_node(&Node::default(), "aliyun/erdma"), None);
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity("200").unwrap(), 200);
        assert_eq!(quantity("2k").unwrap(), 2000);
        assert_eq!(quantity("1Ki").unwrap(), 1024);
        assert!(quantity("1.5").is_err());
        assert!(quantity("-1").is_err());
    }

    #[test]
    fn class_selector_of_the_install_form_only() {
        let class = |e: &str| DeviceClass {
            metadata: ObjectMeta {
                name: Some("c".into()),
                ..Default::default()
            },
            spec: DeviceClassSpec {
                selectors: Some(vec![DeviceSelector {
                    cel: Some(CELDeviceSelector {
                        expression: e.into(),
                    }),
                }]),
                ..Default::default()
            },
        };
        assert_eq!(
            class_driver(&class("device.driver == \"erdma.alibabacloud.com\"")).unwrap(),
            "erdma.alibabacloud.com"
        );
        let e = class_driver(&class("device.attributes[\"x\"].numaNode == 0")).unwrap_err();
        assert!(
            e.to_string().contains("understands exactly one selector"),
            "{e}"
        );
    }

    #[test]
    fn shares_are_consumed_and_a_full_device_is_skipped() {
        let slices = vec![slice(vec![device("a"), device("b")])];
        let first = pick(&slices, &[], &want(120)).unwrap();
        assert_eq!(first[0].device, "a");
        let cc = first[0].consumed_capacity.as_ref().unwrap();
        assert_eq!(cc["shares"].0, "120");
        assert_eq!(cc["hcaHandle"].0, "4", "the policy default");
        assert!(first[0].share_id.is_some());
        let claims = vec![allocated(first)];
        // 80 more fit on a (120 + 80 = 200); 81 would not and go to b.
        assert_eq!(pick(&slices, &claims, &want(80)).unwrap()[0].device, "a");
        assert_eq!(pick(&slices, &claims, &want(81)).unwrap()[0].device, "b");
        let mut only_a = want(81);
        only_a.device = Some("a".into());
        let e = pick(&slices, &claims, &only_a).unwrap_err().to_string();
        assert!(e.contains("shares=200, allocated 120, asked 81"), "{e}");
        only_a.overcommit = true;
        assert_eq!(pick(&slices, &claims, &only_a).unwrap()[0].device, "a");
    }

    #[test]
    fn tainted_and_exclusive_devices_are_skipped() {
        let mut a = device("a");
        a.taints = Some(vec![DeviceTaint {
            key: "k".into(),
            value: Some("link-down".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }]);
        let mut b = device("b");
        b.allow_multiple_allocations = None;
        let slices = vec![slice(vec![a, b])];
        let got = pick(&slices, &[], &want(1)).unwrap();
        assert_eq!(got[0].device, "b");
        assert!(got[0].share_id.is_none() && got[0].consumed_capacity.is_none());
        let e = pick(&slices, &[allocated(got)], &want(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a: tainted k=link-down:NoSchedule"), "{e}");
        assert!(e.contains("b: allocated and not shareable"), "{e}");
    }

    #[test]
    fn unknown_capacity_is_refused() {
        let mut w = want(1);
        w.capacity.insert("bandwidth".into(), 1);
        let e = pick(&[slice(vec![device("a")])], &[], &w)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no capacity \"bandwidth\""), "{e}");
    }
}
