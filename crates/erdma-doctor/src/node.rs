//! Node-side checks: `aliyun/erdma` in allocatable, the agent pod on the node, the driver mode and
//! readiness the agent publishes as node labels and a node condition.

use crate::check::Check;
use k8s_openapi::api::core::v1::{Node, Pod};

pub use erdma_model::names::RESOURCE;
/// Node label with the running driver mode (published by the agent's driver manager,
/// `erdma_driver::status::LABEL_DRIVER_MODE`).
pub const LABEL_DRIVER_MODE: &str = "erdma.alibabacloud.com/driver-mode";
/// Node label `true`/`false`: whether the device plugin may advertise devices
/// (`erdma_driver::status::LABEL_DRIVER_READY`).
pub const LABEL_DRIVER_READY: &str = "erdma.alibabacloud.com/driver-ready";
/// Node label naming a refused mode change (`erdma_driver::status::LABEL_DRIVER_PENDING`).
pub const LABEL_DRIVER_PENDING: &str = "erdma.alibabacloud.com/driver-pending-mode";
/// Node condition type with the driver's reason (`erdma_driver::status::CONDITION_TYPE`).
pub const CONDITION_DRIVER: &str = "ERdmaDriverReady";
/// DaemonSet names of the agent: ours, and the seed's (ACK eRDMA Controller).
pub const AGENT_DAEMONSETS: &[&str] = &["erdma-agent", "alibabacloud-erdma-agent"];

fn name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or("<unnamed>")
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// Whether `pod` is an erdma agent pod: owned by a DaemonSet named like the agent, or running an
/// agent image.
pub fn is_agent_pod(pod: &Pod) -> bool {
    let owned = pod.metadata.owner_references.iter().flatten().any(|o| {
        o.kind == "DaemonSet"
            && AGENT_DAEMONSETS
                .iter()
                .any(|n| o.name == *n || o.name.ends_with(&format!("-{n}")))
    });
    let image = pod.spec.iter().flat_map(|s| &s.containers).any(|c| {
        c.image
            .as_deref()
            .is_some_and(|i| i.contains("erdma-agent") || i.contains("erdma/agent"))
    });
    owned || image
}

fn count(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> Option<i64> {
    q.and_then(|q| q.0.parse::<i64>().ok())
}

/// `node.ready`: the node's Ready condition.
pub fn ready(node: &Node) -> Check {
    let cond = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    match cond {
        Some(c) if c.status == "True" => {
            Check::pass("node.ready", format!("node {} is Ready", name(node)))
        }
        Some(c) => Check::fail(
            "node.ready",
            format!(
                "node {} is not Ready ({}: {})",
                name(node),
                c.reason.as_deref().unwrap_or("no reason"),
                c.message.as_deref().unwrap_or("")
            ),
            format!(
                "fix the kubelet first: kubectl describe node {}",
                name(node)
            ),
        ),
        None => Check::warn(
            "node.ready",
            format!("node {} reports no Ready condition", name(node)),
            "the kubelet has not posted status; check it is running",
        ),
    }
}

/// `node.allocatable`: the node advertises `aliyun/erdma` and some of it is allocatable.
pub fn allocatable(node: &Node) -> Check {
    let status = node.status.as_ref();
    let cap = count(
        status
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get(RESOURCE)),
    );
    let alloc = count(
        status
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|c| c.get(RESOURCE)),
    );
    let n = name(node);
    match (cap, alloc) {
        (_, Some(a)) if a > 0 => Check::pass(
            "node.allocatable",
            format!(
                "node {n} has {RESOURCE}: {a} allocatable of {} capacity",
                cap.unwrap_or(a)
            ),
        ),
        (Some(c), _) if c > 0 => Check::fail(
            "node.allocatable",
            format!(
                "node {n} has {RESOURCE} capacity {c} but 0 allocatable: the kubelet marked every device unhealthy"
            ),
            "the device plugin stopped (ListAndWatch ended) or reports all devices unhealthy: check the agent pod on this node \
             (kubectl logs) and the devices (erdmactl devices on the node)",
        ),
        _ => Check::fail(
            "node.allocatable",
            format!("node {n} does not advertise {RESOURCE}"),
            format!(
                "no device plugin registered {RESOURCE} here: make sure the agent runs on this node (see agent.pod), the driver is ready \
                 (driver.ready), and the instance has ERIs attached; then kubectl get node {n} -o jsonpath='{{.status.allocatable}}'"
            ),
        ),
    }
}

/// `agent.pod`: an agent pod runs on the node and is ready.
pub fn agent(node: &Node, agent_pods: &[Pod]) -> Check {
    let n = name(node);
    let Some(pod) = agent_pods
        .iter()
        .max_by_key(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    else {
        return Check::fail(
            "agent.pod",
            format!("no erdma agent pod runs on node {n}"),
            "check the agent DaemonSet's nodeSelector and tolerations match this node: kubectl get ds -A | grep erdma-agent; \
             install with erdmactl install",
        );
    };
    let pname = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("<unnamed>")
    );
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Unknown");
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if phase == "Running" && ready {
        return Check::pass(
            "agent.pod",
            format!("agent pod {pname} is Running and Ready on node {n}"),
        );
    }
    let mut why = Vec::new();
    for cs in status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
    {
        if let Some(w) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            why.push(format!(
                "{}: {}",
                cs.name,
                w.reason.as_deref().unwrap_or("waiting")
            ));
        }
        if let Some(t) = cs.last_state.as_ref().and_then(|s| s.terminated.as_ref()) {
            let msg = t
                .message
                .as_deref()
                .unwrap_or("")
                .lines()
                .last()
                .unwrap_or("")
                .to_string();
            why.push(format!(
                "last exit {} ({}){}",
                t.exit_code,
                t.reason.as_deref().unwrap_or("?"),
                if msg.is_empty() {
                    String::new()
                } else {
                    format!(": {msg}")
                }
            ));
        }
        if cs.restart_count > 0 {
            why.push(format!("{} restarts", cs.restart_count));
        }
    }
    let why = if why.is_empty() {
        String::new()
    } else {
        format!(" ({})", why.join(", "))
    };
    Check::fail(
        "agent.pod",
        format!(
            "agent pod {pname} is {phase}{}{why}",
            if ready { "" } else { ", not Ready" }
        ),
        format!(
            "read its log: kubectl logs -n {} {} --previous; the agent names the failing step (driver, netdev, plugin registration)",
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            pod.metadata.name.as_deref().unwrap_or("<unnamed>")
        ),
    )
}

fn driver_condition(node: &Node) -> Option<(String, String)> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION_DRIVER)?;
    Some((
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    ))
}

/// `driver.mode`: the running driver mode, and whether NCCL (`NET/IB`, RoCE) and SMC-R can use it.
pub fn driver_mode(node: &Node) -> Check {
    let n = name(node);
    match label(node, LABEL_DRIVER_MODE) {
        None => Check::warn(
            "driver.mode",
            format!("node {n} has no {LABEL_DRIVER_MODE} label"),
            "the agent has not published the driver state (agent not running, still starting, or an agent that does not label nodes); \
             run erdmactl devices on the node to see the mode",
        ),
        Some(m @ ("missing" | "not-loaded")) => Check::fail(
            "driver.mode",
            format!("node {n}: erdma driver is {m}"),
            "the agent installs/loads the driver (see its log); on the host: lsmod | grep erdma, modprobe erdma",
        ),
        Some("default") => Check::warn(
            "driver.mode",
            format!(
                "node {n}: driver mode default (iWARP): SMC-R works, NCCL NET/IB cannot bring QPs up in iWARP mode"
            ),
            "for NCCL training use preferDriver compat (CPU nodes) or ofed (GPU nodes) so the devices run RoCEv2",
        ),
        Some("ofed") => Check::pass(
            "driver.mode",
            format!(
                "node {n}: driver mode ofed (RoCE, GPU stack): NCCL NET/IB usable; no SMC-R in this mode"
            ),
        ),
        Some(m) => Check::pass("driver.mode", format!("node {n}: driver mode {m}")),
    }
}

/// `driver.ready`: the agent says the driver is ready (devices may be advertised).
pub fn driver_ready(node: &Node) -> Check {
    let n = name(node);
    let cond = driver_condition(node);
    let detail = cond
        .as_ref()
        .map(|(r, m)| format!(" ({r}: {m})"))
        .unwrap_or_default();
    let pending = label(node, LABEL_DRIVER_PENDING);
    match label(node, LABEL_DRIVER_READY) {
        Some("true") => match pending {
            Some(to) => Check::warn(
                "driver.ready",
                format!("node {n}: driver ready, but a switch to mode {to} is pending{detail}"),
                "the agent refuses to reload the driver while pods hold aliyun/erdma: drain those pods (kubectl drain) to let it switch",
            ),
            None => Check::pass("driver.ready", format!("node {n}: driver ready{detail}")),
        },
        Some(v) => Check::fail(
            "driver.ready",
            format!("node {n}: driver not ready ({LABEL_DRIVER_READY}={v}){detail}"),
            "no devices are advertised until the driver is ready: read the reason above and the agent log",
        ),
        None => Check::skip(
            "driver.ready",
            format!("node {n} has no {LABEL_DRIVER_READY} label (agent has not published it)"),
        ),
    }
}

/// All node checks, in troubleshooting order.
pub fn checks(node: &Node, agent_pods: &[Pod]) -> Vec<Check> {
    vec![
        ready(node),
        allocatable(node),
        agent(node, agent_pods),
        driver_mode(node),
        driver_ready(node),
        crate::coexistence::node(node),
    ]
}
