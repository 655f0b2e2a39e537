//! Pod checks: scheduling (from Events and the PodScheduled condition), admission, requested
//! resources, containers, `IPC_LOCK`, the image's RDMA libraries and SMC-R on both ends.

use crate::check::Check;
use crate::libs::RdmaLibs;
use crate::node::{LABEL_DRIVER_MODE, RESOURCE};
use crate::scheduling::{self, Reason};
use k8s_openapi::api::core::v1::{Container, Event, Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;

pub use erdma_model::names::SMCR_ANNOTATION;
use erdma_model::names::{SMCR_VALUES, parse_smcr};
/// The GPU resource.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Result of looking for the RDMA libraries inside the pod's container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LibsProbe {
    /// Not asked for (`--exec` not given).
    NotRequested,
    /// The exec failed (forbidden, no `ls` in the image, container not running).
    Failed(String),
    /// The listing.
    Listed(RdmaLibs),
}

/// `<namespace>/<name>` of a pod.
pub fn pod_ref(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("<unnamed>")
    )
}

fn request(c: &Container, resource: &str) -> Option<String> {
    let r = c.resources.as_ref()?;
    r.limits
        .as_ref()
        .and_then(|l| l.get(resource))
        .or_else(|| r.requests.as_ref().and_then(|q| q.get(resource)))
        .map(|q| q.0.clone())
}

/// Which app containers of a pod get eRDMA devices, and how: by requesting `aliyun/erdma` (the
/// device plugin, or DRA's extended-resource mapping), or through a ResourceClaim that erdma's DRA
/// driver allocated. The agent answers the same question on the node from pod-resources.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holding {
    /// `(container, how)`: `aliyun/erdma=1`, `claim rdma (erdma-0)`; in the pod's order.
    pub containers: Vec<(String, String)>,
}

impl Holding {
    /// From the pod and its ResourceClaims (`claims`: those `status.resourceClaimStatuses`
    /// names; others are ignored).
    pub fn of(pod: &Pod, claims: &[ResourceClaim]) -> Holding {
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref());
        let claim_of = |pod_claim: &str| -> Option<&ResourceClaim> {
            let generated = statuses?
                .iter()
                .find(|s| s.name == pod_claim)?
                .resource_claim_name
                .as_deref()?;
            claims
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(generated))
        };
        let mut containers = Vec::new();
        for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
            let mut how = Vec::new();
            if let Some(q) = request(c, RESOURCE) {
                how.push(format!("{RESOURCE}={q}"));
            }
            let refs = c
                .resources
                .as_ref()
                .and_then(|r| r.claims.as_ref())
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            for r in refs {
                let Some(claim) = claim_of(&r.name) else {
                    continue;
                };
                let devices: Vec<&str> = claim
                    .status
                    .as_ref()
                    .and_then(|s| s.allocation.as_ref())
                    .and_then(|a| a.devices.as_ref())
                    .and_then(|d| d.results.as_ref())
                    .into_iter()
                    .flatten()
                    .filter(|res| res.driver == erdma_model::names::DRA_DRIVER)
                    .filter(|res| r.request.as_ref().is_none_or(|want| &res.request == want))
                    .map(|res| res.device.as_str())
                    .collect();
                if !devices.is_empty() {
                    how.push(format!("claim {} ({})", r.name, devices.join(", ")));
                }
            }
            if !how.is_empty() {
                containers.push((c.name.clone(), how.join(", ")));
            }
        }
        Holding { containers }
    }

    /// Whether any container gets eRDMA devices.
    pub fn any(&self) -> bool {
        !self.containers.is_empty()
    }

    /// The first container of `pod` that gets eRDMA devices.
    pub fn first<'a>(&self, pod: &'a Pod) -> Option<&'a Container> {
        let (name, _) = self.containers.first()?;
        pod.spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .find(|c| &c.name == name)
    }
}

/// The app container that gets eRDMA devices (the one to inspect), else the first one.
pub fn erdma_container<'a>(pod: &'a Pod, held: &Holding) -> Option<&'a Container> {
    held.first(pod).or(pod.spec.as_ref()?.containers.first())
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn is_scheduled(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

/// `pod.resources`: what each container requests of `aliyun/erdma` (or holds through an eRDMA
/// DRA claim), GPUs, CPU and memory.
pub fn resources(pod: &Pod, held: &Holding) -> Check {
    let mut parts = Vec::new();
    for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        let mut r = Vec::new();
        if let Some((_, how)) = held.containers.iter().find(|(n, _)| n == &c.name) {
            r.push(how.clone());
        }
        for res in [GPU_RESOURCE, "cpu", "memory"] {
            if let Some(q) = request(c, res) {
                r.push(format!("{res}={q}"));
            }
        }
        parts.push(format!(
            "{}: {}",
            c.name,
            if r.is_empty() {
                "nothing".into()
            } else {
                r.join(", ")
            }
        ));
    }
    let msg = format!("pod {} requests {}", pod_ref(pod), parts.join("; "));
    if held.any() {
        Check::pass("pod.resources", msg)
    } else {
        Check::warn(
            "pod.resources",
            msg,
            format!(
                "no container requests {RESOURCE} or holds an eRDMA DRA claim, so the pod gets no RDMA device and NCCL falls back to TCP: add \
                 resources.limits {RESOURCE}: 1 (erdmactl submit pytorch --erdma, or --device {RESOURCE}=1)"
            ),
        )
    }
}

fn scheduling_hint(reason: &Reason) -> String {
    match reason {
        Reason::Insufficient(r) if r == RESOURCE => format!(
            "no node has a free {RESOURCE}: run erdmactl doctor --node <node> on the eRDMA nodes (allocatable {RESOURCE} > 0 needs \
             the agent running and the driver ready); request {RESOURCE}: 1 per pod"
        ),
        Reason::Insufficient(r) if r == GPU_RESOURCE => {
            "not enough free GPUs: lower --gpus, wait for other jobs, or add GPU nodes (kubectl describe nodes | grep -A8 Allocated)".into()
        }
        Reason::Insufficient(r) => format!("not enough free {r}: lower the request or free capacity"),
        Reason::Selector => {
            "the nodeSelector/affinity matches no eligible node: compare the pod's nodeSelector with kubectl get nodes --show-labels".into()
        }
        Reason::Taint(t) => format!("tolerate the taint {t} (e.g. --toleration key=value:NoSchedule) or schedule elsewhere"),
        Reason::Unschedulable => "nodes are cordoned: kubectl uncordon <node>".into(),
        Reason::Volume(_) => "bind the PersistentVolumeClaims (kubectl get pvc) before the pod can be scheduled".into(),
        Reason::Other(_) => "see kubectl describe pod for the scheduler's full message".into(),
    }
}

fn describe(reason: &Reason) -> String {
    match reason {
        Reason::Insufficient(r) => format!("Insufficient {r}"),
        Reason::Selector => "didn't match the pod's node affinity/selector".into(),
        Reason::Taint(t) => format!("untolerated taint {t}"),
        Reason::Unschedulable => "unschedulable (cordoned)".into(),
        Reason::Volume(v) | Reason::Other(v) => v.clone(),
    }
}

/// `pod.scheduling`: scheduled, or one FAIL per scheduler reason with a fix.
pub fn scheduling(pod: &Pod, events: &[Event]) -> Vec<Check> {
    let pr = pod_ref(pod);
    if is_scheduled(pod) {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        return vec![Check::pass(
            "pod.scheduling",
            format!("pod {pr} is scheduled on node {node}"),
        )];
    }
    // The newest FailedScheduling event, else the PodScheduled condition (events expire after 1 h).
    let latest = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
        .max_by_key(|e| {
            e.last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or_else(|| e.event_time.as_ref().map(|t| t.0))
        })
        .and_then(|e| e.message.clone());
    let cond = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        })
        .and_then(|c| c.message.clone());
    let Some(message) = latest.or(cond) else {
        return vec![Check::warn(
            "pod.scheduling",
            format!("pod {pr} is not scheduled yet and no scheduler message was found"),
            "wait a few seconds; if it stays Pending, check the scheduler (schedulerName) and kubectl describe pod",
        )];
    };
    match scheduling::parse(&message) {
        Some(u) if !u.reasons.is_empty() => u
            .reasons
            .iter()
            .map(|c| {
                let nodes = c
                    .nodes
                    .map(|n| format!("{n} node(s): "))
                    .unwrap_or_default();
                let total = u
                    .total
                    .map(|t| format!(" (of {t} nodes)"))
                    .unwrap_or_default();
                Check::fail(
                    "pod.scheduling",
                    format!("pod {pr} is Pending: {nodes}{}{total}", describe(&c.reason)),
                    scheduling_hint(&c.reason),
                )
            })
            .collect(),
        _ => vec![Check::fail(
            "pod.scheduling",
            format!("pod {pr} is Pending: {message}"),
            "see kubectl describe pod for details",
        )],
    }
}

/// `pod.admission` and `pod.containers`: kubelet admission failures (device allocation) and
/// container states.
pub fn runtime(pod: &Pod, events: &[Event]) -> Vec<Check> {
    let pr = pod_ref(pod);
    let status = pod.status.as_ref();
    let mut out = Vec::new();
    if status.and_then(|s| s.reason.as_deref()) == Some("UnexpectedAdmissionError") {
        out.push(Check::fail(
            "pod.admission",
            format!(
                "pod {pr} failed admission: {}",
                status.and_then(|s| s.message.as_deref()).unwrap_or("UnexpectedAdmissionError")
            ),
            format!(
                "the kubelet could not allocate {RESOURCE} (device plugin restarting or devices unhealthy when the pod started): \
                 check erdmactl doctor --node <node>, then delete the pod so its controller recreates it"
            ),
        ));
    }
    if !is_scheduled(pod) {
        return out;
    }
    let mut problems = Vec::new();
    let statuses = status.into_iter().flat_map(|s| {
        s.init_container_statuses
            .iter()
            .flatten()
            .chain(s.container_statuses.iter().flatten())
    });
    for cs in statuses {
        if let Some(w) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            let reason = w.reason.as_deref().unwrap_or("Waiting");
            if reason != "ContainerCreating" && reason != "PodInitializing" {
                problems.push(format!(
                    "{}: {reason}{}",
                    cs.name,
                    w.message
                        .as_deref()
                        .map(|m| format!(" ({m})"))
                        .unwrap_or_default()
                ));
            }
        }
        if let Some(t) = cs.state.as_ref().and_then(|s| s.terminated.as_ref())
            && t.exit_code != 0
        {
            problems.push(format!(
                "{}: exited {} ({})",
                cs.name,
                t.exit_code,
                t.reason.as_deref().unwrap_or("Error")
            ));
        }
    }
    for e in events
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
    {
        let reason = e.reason.as_deref().unwrap_or("");
        if matches!(
            reason,
            "FailedCreatePodSandBox"
                | "FailedMount"
                | "FailedAttachVolume"
                | "UnexpectedAdmissionError"
                | "Failed"
        ) {
            let line = format!("{reason}: {}", e.message.as_deref().unwrap_or(""));
            if !problems.contains(&line) {
                problems.push(line);
            }
        }
    }
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Unknown");
    if problems.is_empty() {
        out.push(Check::pass(
            "pod.containers",
            format!("pod {pr} is {phase}; no container problems"),
        ));
    } else {
        out.push(Check::fail(
            "pod.containers",
            format!("pod {pr} is {phase}: {}", problems.join("; ")),
            "fix the first problem listed (image pull: check --image and --image-pull-secret; crash: kubectl logs --previous)",
        ));
    }
    out
}

/// `pod.ipc_lock`: the container that uses eRDMA can pin memory (`ibv_reg_mr`).
pub fn ipc_lock(pod: &Pod, held: &Holding) -> Check {
    let pr = pod_ref(pod);
    let Some(c) = held.first(pod) else {
        return Check::skip("pod.ipc_lock", format!("pod {pr} uses no {RESOURCE}"));
    };
    let sc = c.security_context.as_ref();
    let privileged = sc.and_then(|s| s.privileged).unwrap_or(false);
    let cap = sc
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|c| c.add.as_ref())
        .is_some_and(|a| {
            a.iter()
                .any(|c| c == "IPC_LOCK" || c == "CAP_IPC_LOCK" || c == "ALL")
        });
    if privileged || cap {
        Check::pass(
            "pod.ipc_lock",
            format!(
                "container {} of pod {pr} can lock memory (IPC_LOCK{})",
                c.name,
                if privileged { ", privileged" } else { "" }
            ),
        )
    } else {
        Check::warn(
            "pod.ipc_lock",
            format!(
                "container {} of pod {pr} has no IPC_LOCK capability",
                c.name
            ),
            "memory registration (ibv_reg_mr) fails under the default memlock limit (NCCL: 'Call to ibv_reg_mr failed'): add \
             securityContext.capabilities.add [IPC_LOCK] (erdmactl submit --erdma does) or raise the memlock limit",
        )
    }
}

/// `pod.rdma_libs`: the image has libibverbs and the eRDMA provider.
pub fn rdma_libs(pod: &Pod, probe: &LibsProbe) -> Check {
    let pr = pod_ref(pod);
    let provider_hint = "install the eRDMA user-space packages in the image (libibverbs1 ibverbs-providers from the eRDMA apt \
                         repository, see examples/pytorch-mnist/Dockerfile); stock Ubuntu 22.04 providers lack erdma";
    match probe {
        LibsProbe::NotRequested => Check::skip(
            "pod.rdma_libs",
            format!(
                "image of pod {pr} not inspected (add --exec to list the RDMA libraries in the container)"
            ),
        ),
        LibsProbe::Failed(e) => Check::warn(
            "pod.rdma_libs",
            format!("could not list the RDMA libraries in pod {pr}: {e}"),
            "exec needs the pod running, `ls` in the image and RBAC create on pods/exec",
        ),
        LibsProbe::Listed(l) => match (&l.libibverbs, &l.erdma_provider) {
            (Some(v), Some(p)) => Check::pass(
                "pod.rdma_libs",
                format!("pod {pr} has {v} and the eRDMA provider {p}"),
            ),
            (None, _) => Check::fail(
                "pod.rdma_libs",
                format!("pod {pr}: libibverbs.so.1 not found in the image"),
                format!(
                    "NCCL cannot use NET/IB without it (NET/IB : No device found): {provider_hint}"
                ),
            ),
            (Some(_), None) => Check::fail(
                "pod.rdma_libs",
                format!(
                    "pod {pr}: libibverbs is present but the eRDMA provider (liberdma-rdmav*.so) is missing{}",
                    if l.other_providers.is_empty() {
                        String::new()
                    } else {
                        format!("; providers found: {}", l.other_providers.join(", "))
                    }
                ),
                format!(
                    "without the provider the device cannot be opened and NCCL falls back to TCP: {provider_hint}"
                ),
            ),
        },
    }
}

/// `pod.smcr`: the SMC-R annotation is valid and usable here, and present on the peer too.
pub fn smcr(pod: &Pod, held: &Holding, node: Option<&Node>, peer: Option<&Pod>) -> Vec<Check> {
    let pr = pod_ref(pod);
    let mine = annotation(pod, SMCR_ANNOTATION);
    let asks = |v: Option<&str>| v.is_some_and(|v| parse_smcr(v) == Ok(true));
    let peer_asks = peer.map(|p| (pod_ref(p), asks(annotation(p, SMCR_ANNOTATION))));
    let mut out = Vec::new();
    match mine.map(|v| (v, parse_smcr(v))) {
        None => {
            if let Some((peer_ref, true)) = &peer_asks {
                out.push(Check::fail(
                    "pod.smcr",
                    format!("peer {peer_ref} asks for SMC-R but pod {pr} does not"),
                    format!("both ends must be SMC-enabled, otherwise every connection falls back to TCP: annotate {pr} with {SMCR_ANNOTATION}: \"true\""),
                ));
            } else {
                out.push(Check::skip(
                    "pod.smcr",
                    format!("pod {pr} does not ask for SMC-R ({SMCR_ANNOTATION} not set)"),
                ));
            }
            return out;
        }
        Some((_, Ok(true))) => {}
        Some((v, Ok(false))) => {
            out.push(Check::skip(
                "pod.smcr",
                format!("pod {pr} has {SMCR_ANNOTATION}: {v:?} (off)"),
            ));
            return out;
        }
        Some((v, Err(_))) => {
            out.push(Check::fail(
                "pod.smcr",
                format!("pod {pr} has {SMCR_ANNOTATION}: {v:?}, which is not a boolean"),
                format!("use \"true\" or \"false\" (accepted: {SMCR_VALUES}); the agent and the webhook leave SMC-R off for this pod and report the value in an Event"),
            ));
            return out;
        }
    }
    let mut problems: Vec<(String, String)> = Vec::new();
    if !held.any() {
        problems.push((
            format!(
                "pod {pr} asks for SMC-R but requests no {RESOURCE} (nor holds an eRDMA DRA claim)"
            ),
            format!("SMC-R is set up only for pods that get an eRDMA device: add {RESOURCE}: 1"),
        ));
    }
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
    {
        problems.push((
            format!("pod {pr} uses hostNetwork"),
            "SMC-R is configured in the pod's own network namespace; host-network pods are skipped"
                .into(),
        ));
    }
    let mode = node.and_then(|n| n.metadata.labels.as_ref()?.get(LABEL_DRIVER_MODE));
    if mode.is_some_and(|m| m == "ofed") {
        problems.push((
            format!("pod {pr} runs on a node in driver mode ofed, which has no SMC-R"),
            "schedule SMC-R pods on nodes in default or compat mode (nodeSelector on the driver-mode label)".into(),
        ));
    }
    if problems.is_empty() {
        out.push(Check::pass(
            "pod.smcr",
            format!("pod {pr} asks for SMC-R and can get it"),
        ));
    }
    for (m, h) in problems {
        out.push(Check::fail("pod.smcr", m, h));
    }
    out.push(match peer_asks {
        None => Check::skip("pod.smcr.peer", "peer not checked (pass --peer <pod> to check the other end)".to_string()),
        Some((peer_ref, true)) => Check::pass("pod.smcr.peer", format!("peer {peer_ref} asks for SMC-R too")),
        Some((peer_ref, _)) => Check::fail(
            "pod.smcr.peer",
            format!("peer {peer_ref} does not ask for SMC-R"),
            format!(
                "both ends must be SMC-enabled, otherwise connections fall back to TCP (fallback reason 0x03010000): annotate \
                 {peer_ref} with {SMCR_ANNOTATION}: \"true\""
            ),
        ),
    });
    out
}

/// The last literal `value` the container sets for `name` (values from ConfigMaps or fields are
/// not read).
fn literal_env<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env
        .iter()
        .flatten()
        .rev()
        .filter(|e| e.name == name)
        .find_map(|e| e.value.as_deref())
}

/// `pod.nccl_env`: NCCL settings in the eRDMA container that keep NCCL off eRDMA
/// (`nccl-and-arena.md` A1). Only literal `value`s are read.
pub fn nccl_env(pod: &Pod, held: &Holding) -> Check {
    let pr = pod_ref(pod);
    let Some(c) = held.first(pod) else {
        return Check::skip("pod.nccl_env", format!("pod {pr} uses no {RESOURCE}"));
    };
    let get = |k: &str| literal_env(c, k);
    let mut fails = Vec::new();
    if get("NCCL_IB_DISABLE").is_some_and(|v| v.trim() == "1") {
        fails.push("NCCL_IB_DISABLE=1 forces the socket transport".to_string());
    }
    if let Some(net) = get("NCCL_NET").filter(|v| !v.eq_ignore_ascii_case("IB")) {
        fails.push(format!("NCCL_NET={net} selects a transport other than IB"));
    }
    if let Some(hca) = get("NCCL_IB_HCA") {
        // `^` excludes the listed prefixes, `=` makes them exact; `:port` is optional.
        let (exclude, list) = match hca.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, hca),
        };
        let exact = list.starts_with('=');
        let matches_erdma = list.trim_start_matches('=').split(',').any(|h| {
            let h = h.split(':').next().unwrap_or(h).trim();
            !h.is_empty()
                && if exact {
                    h.starts_with("erdma_")
                } else {
                    h.starts_with("erdma") || "erdma_".starts_with(h)
                }
        });
        if matches_erdma == exclude {
            fails.push(format!(
                "NCCL_IB_HCA={hca} does not select the erdma devices"
            ));
        }
    }
    if get("NCCL_IB_GID_INDEX").is_some_and(|v| v.trim() == "0") {
        fails.push(
            "NCCL_IB_GID_INDEX=0 is eRDMA's link-local fe80:: GID; use -1 (auto, NCCL >= 2.21.5)"
                .to_string(),
        );
    }
    let hint = "see docs/training.md (the --erdma recipe): drop the settings named above or fix their values";
    if !fails.is_empty() {
        Check::fail(
            "pod.nccl_env",
            format!("container {} of pod {pr}: {}", c.name, fails.join("; ")),
            hint,
        )
    } else {
        Check::pass(
            "pod.nccl_env",
            format!(
                "container {} of pod {pr}: no NCCL setting keeps it off eRDMA",
                c.name
            ),
        )
    }
}

/// What the eRDMA driver sources say about `NCCL_IB_TIMEOUT` / `NCCL_IB_RETRY_CNT`, cited in
/// `pod.nccl_retry`, `docs/training.md` and the NCCL analyzer.
pub const NCCL_RETRY_EVIDENCE: &str = "in the eRDMA driver sources erdma has read they do not reach the hardware: upstream Linux \
     (erdma_modify_qp_rocev2) and the vendor's out-of-tree driver r0.2.37 (alibaba/elastic-rdma-drivers, \
     erdma_modify_qp + erdma_handle_compat_attr) pass only the QP state, address vector, PSNs and \
     destination QPN to the device; timeout and retry_cnt are used only by r0.2.37's software GSI QP, \
     and eRDMA retransmits in hardware";

/// `pod.nccl_retry` (INFO, only when set): `NCCL_IB_TIMEOUT` / `NCCL_IB_RETRY_CNT` in the eRDMA
/// container. Alibaba Cloud advises `NCCL_IB_TIMEOUT=23` and `NCCL_IB_RETRY_CNT=10` against NCCL
/// timeouts; the driver sources we can read ignore both ([`NCCL_RETRY_EVIDENCE`]). Which driver
/// build a node runs (the installer's) is not visible from here, so this informs and never warns.
pub fn nccl_retry(pod: &Pod, held: &Holding) -> Option<Check> {
    let pr = pod_ref(pod);
    let c = held.first(pod)?;
    let get = |k: &str| literal_env(c, k);
    let mut set = Vec::new();
    if let Some(v) = get("NCCL_IB_TIMEOUT") {
        set.push(format!("NCCL_IB_TIMEOUT={v}"));
    }
    if let Some(v) = get("NCCL_IB_RETRY_CNT") {
        let out_of_range = v.trim().parse::<u32>().map_or(true, |n| n > 7);
        set.push(format!(
            "NCCL_IB_RETRY_CNT={v}{}",
            if out_of_range {
                " (outside the InfiniBand range 0-7)"
            } else {
                ""
            }
        ));
    }
    if set.is_empty() {
        return None;
    }
    Some(Check::info(
        "pod.nccl_retry",
        format!(
            "container {} of pod {pr} sets {}: {NCCL_RETRY_EVIDENCE}. Whether the driver build on the node \
             (deployed by the eRDMA installer) does the same is not known here; Alibaba Cloud recommends \
             NCCL_IB_TIMEOUT=23 and NCCL_IB_RETRY_CNT=10 for NCCL timeouts",
            c.name,
            set.join(", ")
        ),
        "nothing to change: harmless on eRDMA; if NCCL times out, look at the path and the peer (erdmactl nccl analyze) \
         rather than these values (docs/training.md)",
    ))
}

/// Every pod check, in troubleshooting order, for a pod that holds no DRA claims.
pub fn checks(
    pod: &Pod,
    events: &[Event],
    node: Option<&Node>,
    peer: Option<&Pod>,
    probe: &LibsProbe,
) -> Vec<Check> {
    checks_with_claims(pod, &[], events, node, peer, probe)
}

/// Every pod check, in troubleshooting order; `claims` are the pod's ResourceClaims.
pub fn checks_with_claims(
    pod: &Pod,
    claims: &[ResourceClaim],
    events: &[Event],
    node: Option<&Node>,
    peer: Option<&Pod>,
    probe: &LibsProbe,
) -> Vec<Check> {
    let held = Holding::of(pod, claims);
    let mut v = scheduling(pod, events);
    v.extend(runtime(pod, events));
    v.push(resources(pod, &held));
    v.push(ipc_lock(pod, &held));
    v.push(nccl_env(pod, &held));
    v.extend(nccl_retry(pod, &held));
    v.push(rdma_libs(pod, probe));
    v.extend(smcr(pod, &held, node, peer));
    v
}
