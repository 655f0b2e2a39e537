//! Fetching what the checks need from the Kubernetes API (user's kubeconfig), then running them.

use crate::check::Check;
use crate::libs::{self, PROBE_PATHS};
use crate::node;
use crate::pod::{self, LibsProbe};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams};

/// Why the objects could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The named object does not exist.
    #[error("{kind} {name} not found{hint}")]
    NotFound {
        /// `node` or `pod`.
        kind: &'static str,
        /// Name (`ns/name` for pods).
        name: String,
        /// Extra guidance.
        hint: String,
    },
    /// The API server refused or could not be reached.
    #[error(
        "reading {what} from the Kubernetes API failed: {source} (check your kubeconfig, --context and RBAC: doctor needs get/list on nodes, pods and events)"
    )]
    Api {
        /// What was being read.
        what: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> FetchError {
    let what = what.into();
    move |source| FetchError::Api { what, source }
}

/// Runs a listing command inside a container (`doctor pod --exec`); the real one is `kubectl exec`.
pub trait Exec {
    /// Runs `ls -1 <paths>` in `namespace/pod` container `container`; returns stdout (missing
    /// paths are not an error) or why it could not run.
    fn list(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        paths: &[&str],
    ) -> Result<String, String>;
}

/// Agent pods on `node_name`: by label selector when given, else recognised by DaemonSet/image.
pub async fn agent_pods(
    client: &kube::Client,
    node_name: &str,
    selector: Option<&str>,
) -> Result<Vec<Pod>, FetchError> {
    let mut lp = ListParams::default().fields(&format!("spec.nodeName={node_name}"));
    if let Some(s) = selector {
        lp = lp.labels(s);
    }
    let pods = Api::<Pod>::all(client.clone())
        .list(&lp)
        .await
        .map_err(api_err(format!("pods on node {node_name}")))?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| selector.is_some() || node::is_agent_pod(p))
        .collect())
}

/// The node checks for `node_name`.
pub async fn node_checks(
    client: &kube::Client,
    node_name: &str,
    agent_selector: Option<&str>,
) -> Result<Vec<Check>, FetchError> {
    let n = Api::<Node>::all(client.clone())
        .get_opt(node_name)
        .await
        .map_err(api_err(format!("node {node_name}")))?
        .ok_or_else(|| FetchError::NotFound {
            kind: "node",
            name: node_name.into(),
            hint: ": list nodes with kubectl get nodes".into(),
        })?;
    let agents = agent_pods(client, node_name, agent_selector).await?;
    let mut checks = node::checks(&n, &agents);
    checks.extend(dra_checks(client, &n, node_name).await);
    Ok(checks)
}

/// The DRA checks of a node that serves eRDMA devices through DRA (or has slices of the
/// driver): what the API server stored of its ResourceSlice and of the DeviceClass. An object
/// that cannot be read is a warning naming the permission.
async fn dra_checks(client: &kube::Client, n: &Node, node_name: &str) -> Vec<Check> {
    use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
    let listed = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&crate::dra::field_selector(node_name)))
        .await;
    let dra_node = crate::dra::is_dra_node(n);
    let slices = match listed {
        Ok(l) => l.items,
        Err(e) if dra_node => {
            return vec![Check::warn(
                "node.dra.slice",
                format!("cannot read the ResourceSlices of node {node_name}: {e}"),
                "allow list on resourceslices (resource.k8s.io) to the doctor's user",
            )];
        }
        // Not a DRA node, and no DRA API to ask (an older cluster): nothing to check.
        Err(_) => return Vec::new(),
    };
    if !dra_node && slices.is_empty() {
        return Vec::new();
    }
    let mut out = vec![
        crate::dra::slice_check(node_name, &slices),
        crate::dra::extended_resource_check(n, node_name, "aliyun/erdma"),
    ];
    match Api::<DeviceClass>::all(client.clone())
        .get_opt(crate::dra::DRIVER)
        .await
    {
        Ok(c) => out.push(crate::dra::class_check(c.as_ref(), "aliyun/erdma")),
        Err(e) => out.push(Check::warn(
            "node.dra.deviceclass",
            format!("cannot read DeviceClass {}: {e}", crate::dra::DRIVER),
            "allow get on deviceclasses (resource.k8s.io) to the doctor's user",
        )),
    }
    out
}

/// What `doctor --pod` needs besides the pod name.
pub struct PodTarget<'a> {
    /// Namespace.
    pub namespace: &'a str,
    /// Pod name.
    pub name: &'a str,
    /// The other end for the SMC-R check (`ns/name` or `name` in the same namespace).
    pub peer: Option<&'a str>,
    /// Label selector of agent pods (else recognised by DaemonSet/image).
    pub agent_selector: Option<&'a str>,
}

/// The pod checks, followed by the node checks of the pod's node when it is scheduled.
pub async fn pod_checks(
    client: &kube::Client,
    target: &PodTarget<'_>,
    exec: Option<&dyn Exec>,
) -> Result<Vec<Check>, FetchError> {
    let (ns, name) = (target.namespace, target.name);
    let p = Api::<Pod>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(api_err(format!("pod {ns}/{name}")))?
        .ok_or_else(|| FetchError::NotFound {
            kind: "pod",
            name: format!("{ns}/{name}"),
            hint: format!(": kubectl get pods -n {ns} (a PyTorchJob's pods are <job>-master-0, <job>-worker-N)"),
        })?;
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind=Pod,involvedObject.name={name}"
    ));
    let events: Vec<Event> = Api::<Event>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .map_err(api_err(format!("events of pod {ns}/{name}")))?
        .items;
    let node_name = p
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty());
    let node_obj = match &node_name {
        Some(n) => Api::<Node>::all(client.clone())
            .get_opt(n)
            .await
            .map_err(api_err(format!("node {n}")))?,
        None => None,
    };
    let peer = match target.peer {
        Some(peer) => {
            let (pns, pname) = peer.split_once('/').unwrap_or((ns, peer));
            Some(
                Api::<Pod>::namespaced(client.clone(), pns)
                    .get_opt(pname)
                    .await
                    .map_err(api_err(format!("peer pod {pns}/{pname}")))?
                    .ok_or_else(|| FetchError::NotFound {
                        kind: "pod",
                        name: format!("{pns}/{pname}"),
                        hint: " (the --peer pod)".into(),
                    })?,
            )
        }
        None => None,
    };
    let (claims, unread) = pod_claims(client, ns, &p).await;
    let probe = match exec {
        None => LibsProbe::NotRequested,
        Some(exec) => probe_libs(&p, &pod::Holding::of(&p, &claims), exec),
    };
    let mut checks = pod::checks_with_claims(
        &p,
        &claims,
        &events,
        node_obj.as_ref(),
        peer.as_ref(),
        &probe,
    );
    if !unread.is_empty() {
        checks.push(Check::warn(
            "pod.claims",
            format!("cannot read the pod's ResourceClaims: {}", unread.join("; ")),
            "eRDMA devices held through DRA claims are not seen by these checks: allow get on resourceclaims (resource.k8s.io) to the doctor's user",
        ));
    }
    if let Some(n) = &node_obj {
        let agents = agent_pods(
            client,
            n.metadata.name.as_deref().unwrap_or_default(),
            target.agent_selector,
        )
        .await?;
        checks.extend(node::checks(n, &agents));
    }
    Ok(checks)
}

/// The pod's ResourceClaims (named in `status.resourceClaimStatuses`), and why the ones that could
/// not be read (no permission, an API server without resource.k8s.io/v1) were not: the checks
/// then see only the extended resource.
async fn pod_claims(client: &kube::Client, ns: &str, p: &Pod) -> (Vec<ResourceClaim>, Vec<String>) {
    let names: Vec<String> = p
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|s| s.resource_claim_name.clone())
        .collect();
    let api = Api::<ResourceClaim>::namespaced(client.clone(), ns);
    let (mut out, mut unread) = (Vec::new(), Vec::new());
    for name in names {
        match api.get_opt(&name).await {
            Ok(Some(c)) => out.push(c),
            // Deleted with the pod, or not created yet: nothing is held through it.
            Ok(None) => {}
            Err(e) => unread.push(format!("ResourceClaim {ns}/{name}: {e}")),
        }
    }
    (out, unread)
}

/// Lists the RDMA libraries in the pod's eRDMA container through `exec`.
pub fn probe_libs(p: &Pod, held: &pod::Holding, exec: &dyn Exec) -> LibsProbe {
    let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    let Some(container) = pod::erdma_container(p, held) else {
        return LibsProbe::Failed("the pod has no containers".into());
    };
    if !running {
        return LibsProbe::Failed(format!(
            "pod is not Running, cannot exec into container {}",
            container.name
        ));
    }
    let ns = p.metadata.namespace.as_deref().unwrap_or("default");
    let name = p.metadata.name.as_deref().unwrap_or_default();
    match exec.list(ns, name, &container.name, PROBE_PATHS) {
        Ok(out) => LibsProbe::Listed(libs::parse_ls(&out)),
        Err(e) => LibsProbe::Failed(e),
    }
}

/// Lines of the eRDMA container's log `pod.rdma_usage` reads (NCCL prints its transport choice
/// at start, libibverbs its warnings before that; a long run's tail may have lost them).
pub const LOG_TAIL_LINES: i64 = 20_000;

/// What `pod.rdma_usage` needs from the API for a pod that holds eRDMA and is scheduled.
#[derive(Debug, Clone)]
pub struct UsageInputs {
    /// `namespace/name`.
    pub pod: String,
    /// The node.
    pub node: String,
    /// How the pod holds eRDMA (`aliyun/erdma=1`, `claim rdma (erdma-0)`).
    pub held: String,
    /// The node's agent pod (a Running one first), if any.
    pub agent: Option<Pod>,
    /// The eRDMA container's log tail, or why it could not be read.
    pub log: Result<String, String>,
    /// `NCCL_IB_HCA` of that container's spec (a literal value).
    pub ib_hca: Option<String>,
    /// The pod asks for SMC-R (its annotation is true): `pod.smcr.connections` runs too.
    pub smcr: bool,
}

/// The inputs of `pod.rdma_usage`, or `None` when the pod does not hold eRDMA or is not
/// scheduled (the other pod checks say so).
pub async fn usage_inputs(
    client: &kube::Client,
    target: &PodTarget<'_>,
) -> Result<Option<UsageInputs>, FetchError> {
    let (ns, name) = (target.namespace, target.name);
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let Some(p) = api
        .get_opt(name)
        .await
        .map_err(api_err(format!("pod {ns}/{name}")))?
    else {
        return Ok(None);
    };
    let (claims, _) = pod_claims(client, ns, &p).await;
    let held = pod::Holding::of(&p, &claims);
    if held.containers.is_empty() {
        return Ok(None);
    }
    let Some(node) = p
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
    else {
        return Ok(None);
    };
    let mut agents = agent_pods(client, &node, target.agent_selector).await?;
    agents.sort_by_key(|a| a.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running"));
    let container = pod::erdma_container(&p, &held);
    let ib_hca = container.and_then(|c| {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == "NCCL_IB_HCA")
            .and_then(|e| e.value.clone())
    });
    let log = match container {
        Some(c) => api
            .logs(
                name,
                &kube::api::LogParams {
                    container: Some(c.name.clone()),
                    tail_lines: Some(LOG_TAIL_LINES),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| format!("kubectl logs -c {}: {e}", c.name)),
        None => Err("the pod has no containers".into()),
    };
    Ok(Some(UsageInputs {
        pod: format!("{ns}/{name}"),
        node,
        held: held
            .containers
            .iter()
            .map(|(_, how)| how.as_str())
            .collect::<Vec<_>>()
            .join("; "),
        agent: agents.into_iter().next(),
        log,
        ib_hca,
        smcr: p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(erdma_model::names::SMCR_ANNOTATION))
            .is_some_and(|v| erdma_model::names::parse_smcr(v) == Ok(true)),
    }))
}
