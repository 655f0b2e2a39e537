//! erdma as an NRI plugin: the container runtime hands every pod sandbox and container to the
//! agent before anything in it runs.
//!
//! - RunPodSandbox: a pod annotated for SMC-R that holds `aliyun/erdma` gets SMC-R in its network
//!   namespace before any of its containers exists (no race with a fast init container).
//! - CreateContainer: a container holding `aliyun/erdma` or an erdma DRA claim (by the kubelet's
//!   pod-resources answer, never by what the container's own environment says) gets
//!   `RLIMIT_MEMLOCK` (`--nri-memlock`,
//!   default unlimited; non-root containers otherwise cannot register RDMA memory) and the rdma
//!   cgroup limit `rdma.max` of its device: its DRA claims' consumed capacity (the agent's
//!   checkpoint) or the operator's `--nri-rdma-max`, which the pod annotation
//!   `network.alibabacloud.com/erdma-rdma-max` may lower (see [`crate::rdma_max`]; the
//!   container's environment is never asked). A bad annotation changes nothing and says why.
//!   On cgroup v2 `rdma.max` goes into the adjustment (`linux.resources.unified`); runc refuses
//!   `unified` on cgroup v1 and hybrid hosts, so there the adjustment carries memlock only and:
//! - StartContainer (subscribed on v1 and hybrid hosts only): runc has created the container's
//!   cgroups and its process waits to be started; the agent writes `rdma.max` into the
//!   container's cgroup of the rdma hierarchy. Where it cannot, the container still starts,
//!   without the limit, and a Warning Event says why.
//! - RemovePodSandbox: the pod's namespace leaves the SMC-R BPF policy.
//!
//! Everything runs within a budget well inside the runtime's (see `erdma_nri::plugin`).

use crate::cluster::{Cluster, PodRef};
use crate::metrics::AgentMetrics;
use crate::rdma_max::{self, ClaimRecords, Records};
use crate::smcr::SmcrHook;
use erdma_host::cgroup::{CgroupFs, CgroupLayout, CgroupVersion, RootedCgroupFs};
use erdma_host::socket_watch::SocketWatch;
use erdma_kubelet::podresources::{Holder, HolderCache, SETTLE_WITHIN, Snapshot};
use erdma_model::cgroup_path::hierarchy_path;
use erdma_model::rdma_limit::{RDMA_MAX_ANNOTATION, RdmaLimit, limits_of_device};
use erdma_model::{NodeDevices, SlotId};
use erdma_nri::api::{self, Event};
use erdma_nri::plugin::Handler;
use erdma_nri::ttrpc::BoxFuture;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::watch;

pub use crate::cli::{NRI_BUDGET as BUDGET, NriPolicy as Policy};

/// Something a user should see: an Event on the pod and a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// `Normal` or `Warning`.
    pub kind: &'static str,
    /// Event reason.
    pub reason: &'static str,
    /// Event message.
    pub message: String,
}

/// The RDMA devices (served names) container `c` of `pod` holds.
///
/// Two authors are believed: the kubelet, through its pod-resources answer `holders` (`None` when
/// the agent has none it can trust: never answered, or its last refresh failed) — the
/// container's device plugin slot IDs and the devices of its DRA claims —, and the runtime,
/// through the device nodes it put into the container (from the kubelet's Allocate answer or a
/// CDI spec; a container cannot add a device node to its own spec, and a privileged one, which
/// gets every node, could raise its own limits anyway). The nodes also cover a kubelet whose
/// answer lacks DRA claims (`KubeletPodResourcesDynamicResources` off). The container's
/// environment (`ERDMA_DEVICES`) is never asked: a container can set any variable itself.
pub fn held_devices(
    pod: &api::PodSandbox,
    c: &api::Container,
    served: &NodeDevices,
    holders: Option<&[Holder]>,
) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    // each device once: two slots of one device are one device, not two (which would withhold
    // the one-device rdma.max)
    let mut add = |n: &str| {
        if served.device(n).is_some() && !names.iter().any(|m| m == n) {
            names.push(n.to_string());
        }
    };
    if let Some(holders) = holders {
        let of_container = holders
            .iter()
            .filter(|h| h.namespace == pod.namespace && h.pod == pod.name && h.container == c.name);
        for h in of_container {
            for id in &h.device_ids {
                match SlotId::parse(id) {
                    Ok(slot) => add(&slot.device),
                    Err(_) => add(id),
                }
            }
            for claimed in &h.claimed {
                if let Some(d) = erdma_dra::slice::find_device(served, &claimed.device) {
                    add(&d.name);
                }
            }
        }
    }
    let nodes = c
        .linux
        .as_ref()
        .map(|l| l.devices.as_slice())
        .unwrap_or(&[]);
    for d in &served.devices {
        let by_node = d.char_devices.uverbs.as_ref().is_some_and(|u| {
            nodes.iter().any(|n| {
                n.path == u.path
                    || (u.major.map(i64::from) == Some(n.major)
                        && u.minor.map(i64::from) == Some(n.minor))
            })
        });
        if by_node {
            add(&d.name);
        }
    }
    names
}

/// The holders [`held_devices`] may trust in `snapshot`: an answer whose last refresh worked.
pub fn trusted_holders(snapshot: &Snapshot) -> Option<&[Holder]> {
    (snapshot.is_answered() && snapshot.error.is_none()).then_some(snapshot.holders.as_slice())
}

/// The cgroup v2 adjustment that writes one `rdma.max` line.
fn rdma_max_adjustment(line: String) -> api::LinuxContainerAdjustment {
    api::LinuxContainerAdjustment {
        resources: Some(api::LinuxResources {
            unified: [("rdma.max".to_string(), line)].into_iter().collect(),
        }),
        ..Default::default()
    }
}

/// What a container holding devices is given, whatever the host's cgroup version.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wanted {
    /// The memlock rlimit (none with `--nri-memlock=off`).
    pub rlimits: Vec<api::PosixRlimit>,
    /// Its `rdma.max` line (`<ibdev> hca_handle=N hca_object=M`), when one applies.
    pub rdma_max: Option<String>,
    /// `ERDMA_RDMA_MAX*` entries of the container's environment that the records do not give
    /// it (`NAME=entry`): ignored, and reported.
    pub env_ignored: Vec<String>,
}

/// The pod's `rdma.max` annotation: `Ok(None)` without one; a bad one is a notice.
fn annotation_limit(
    pod: &api::PodSandbox,
    c: &api::Container,
) -> Result<Option<RdmaLimit>, Notice> {
    let Some(v) = pod.annotations.get(RDMA_MAX_ANNOTATION) else {
        return Ok(None);
    };
    RdmaLimit::parse(v).map(Some).map_err(|e| Notice {
        kind: "Warning",
        reason: "ErdmaRdmaMaxInvalid",
        message: format!(
            "annotation {RDMA_MAX_ANNOTATION} of pod {}/{}: {e}; container {} gets the limit it has without the annotation",
            pod.namespace, pod.name, c.name
        ),
    })
}

/// The notice for an annotation above the ceiling it may only lower.
fn capped_notice(
    pod: &api::PodSandbox,
    c: &api::Container,
    asked: &RdmaLimit,
    ceiling: &str,
    applied: &str,
    fix: &str,
) -> Notice {
    Notice {
        kind: "Warning",
        reason: "ErdmaRdmaMaxCapped",
        message: format!(
            "annotation {RDMA_MAX_ANNOTATION} {:?} of pod {}/{} asks more than {ceiling}; container {} gets {applied:?}{fix}",
            asked.line("").trim_start(),
            pod.namespace,
            pod.name,
            c.name
        ),
    }
}

/// The notice for limits on more devices than one `rdma.max` write takes.
fn many_devices(pod: &api::PodSandbox, c: &api::Container, what: &str, devices: &[&str]) -> Notice {
    Notice {
        kind: "Warning",
        reason: "ErdmaRdmaMaxNotApplied",
        message: format!(
            "container {} of pod {}/{} holds {} RDMA devices{what} ({}); the rdma cgroup takes one device per write, so no rdma limit is applied",
            c.name,
            pod.namespace,
            pod.name,
            devices.len(),
            devices.join(", ")
        ),
    }
}

/// What one container is given (pure): memlock and the `rdma.max` line for containers holding
/// devices (by [`held_devices`] with `records.holders`); the notices say why a limit asked for
/// is not applied as asked. The line is its DRA claims' (`records.claims`), else the operator's
/// (`policy`), either lowered by the pod annotation; see [`crate::rdma_max`].
pub fn wanted_limits(
    pod: &api::PodSandbox,
    c: &api::Container,
    served: &NodeDevices,
    records: Records<'_>,
    policy: &Policy,
) -> (Wanted, Vec<Notice>) {
    let mut wanted = Wanted::default();
    let mut notices = Vec::new();
    let devices = held_devices(pod, c, served, records.holders);
    if devices.is_empty() {
        return (wanted, notices);
    }
    if let Some(v) = policy.memlock.value() {
        wanted.rlimits.push(api::PosixRlimit {
            r#type: "RLIMIT_MEMLOCK".into(),
            hard: v,
            soft: v,
        });
    }
    let asked = annotation_limit(pod, c).unwrap_or_else(|n| {
        notices.push(n);
        None
    });
    let claimed = rdma_max::claim_grants(pod, c, &devices, records).unwrap_or_default();
    let claim_limits: Vec<(&str, RdmaLimit)> = claimed
        .grants
        .iter()
        .filter_map(|(ibdev, g)| Some((ibdev.as_str(), rdma_max::limit_of(*g)?)))
        .collect();
    match claim_limits.as_slice() {
        // A DRA claim's consumed capacity: what the scheduler allocated to this container. The
        // annotation may lower it, never raise it.
        [(ibdev, limit)] => {
            let line = match &asked {
                Some(a) => {
                    let (l, raised) = rdma_max::capped(limit, a);
                    if raised {
                        notices.push(capped_notice(
                            pod,
                            c,
                            a,
                            &format!("its DRA claim's limit {:?}", limit.line(ibdev)),
                            &l.line(ibdev),
                            "; a claim's limit is the capacity the scheduler allocated to it: ask for more in the claim",
                        ));
                    }
                    l.line(ibdev)
                }
                None => limit.line(ibdev),
            };
            wanted.rdma_max = Some(line);
        }
        [_, _, ..] => {
            let names: Vec<&str> = claim_limits.iter().map(|(d, _)| *d).collect();
            let what = format!(
                " with a limit through its DRA claims {}",
                claimed.from.join(", ")
            );
            notices.push(many_devices(pod, c, &what, &names));
        }
        // The device plugin's containers (and DRA claims with admin access, which carry no
        // limit): the operator's limit, which the annotation lowers (or, where the operator
        // allowed it, replaces).
        [] => {
            let limit = match (policy.default_rdma_max, asked) {
                (ceiling, None) => ceiling,
                (None, Some(a)) => Some(a),
                (Some(_), Some(a)) if policy.allow_annotation_raise => Some(a),
                (Some(ceiling), Some(a)) => {
                    let (l, raised) = rdma_max::capped(&ceiling, &a);
                    if raised && let [one] = devices.as_slice() {
                        notices.push(capped_notice(
                            pod,
                            c,
                            &a,
                            &format!("the node's limit {:?} (--nri-rdma-max)", ceiling.line(one)),
                            &l.line(one),
                            "; the cluster operator may allow raising it (--nri-allow-annotation-raise)",
                        ));
                    }
                    Some(l)
                }
            };
            match (limit, devices.as_slice()) {
                (None, _) => {}
                (Some(l), [one]) => wanted.rdma_max = Some(l.line(one)),
                (Some(_), many) => {
                    let names: Vec<&str> = many.iter().map(String::as_str).collect();
                    notices.push(many_devices(pod, c, "", &names));
                }
            }
        }
    }
    let mut given = claimed.hand_off;
    given.extend(wanted.rdma_max.iter().cloned());
    wanted.env_ignored = rdma_max::env_not_given(c, &given);
    (wanted, notices)
}

/// The adjustment of one container on a host of cgroup `version` (pure): memlock, and
/// `rdma.max` through `linux.resources.unified` where the runtime takes it (v2). On v1 and hybrid
/// hosts runc refuses any `unified` key ("cannot use unified on cgroup v1"), failing the
/// container, so the adjustment carries none and the line is written into the container's rdma
/// cgroup at StartContainer ([`write_v1_rdma_max`]).
pub fn adjust_container_on(
    version: CgroupVersion,
    pod: &api::PodSandbox,
    c: &api::Container,
    served: &NodeDevices,
    records: Records<'_>,
    policy: &Policy,
) -> (api::ContainerAdjustment, Vec<Notice>) {
    let (wanted, notices) = wanted_limits(pod, c, served, records, policy);
    (adjustment_on(version, wanted), notices)
}

/// The adjustment that gives `wanted` on a host of cgroup `version` (see [`adjust_container_on`]).
fn adjustment_on(version: CgroupVersion, wanted: Wanted) -> api::ContainerAdjustment {
    let mut adjust = api::ContainerAdjustment {
        rlimits: wanted.rlimits,
        ..Default::default()
    };
    if let Some(line) = wanted.rdma_max
        && version.takes_unified()
    {
        adjust.linux = Some(rdma_max_adjustment(line));
    }
    adjust
}

/// What [`repairs_on`] finds in the runtime's running containers at Synchronize.
#[derive(Debug, Default, PartialEq)]
pub struct Repairs {
    /// `rdma.max` updates for containers that run without the limit they should have.
    pub updates: Vec<api::ContainerUpdate>,
    /// Containers that run without the memlock limit they should have (`pod/container`): an
    /// rlimit is set when the process starts, so only a restart of the container gives it.
    pub without_memlock: Vec<String>,
}

/// The memlock limit in a `/proc/<pid>/limits` text, as the rlimit NRI describes
/// (`unlimited` is `u64::MAX`); `None` when the line is missing or unreadable.
pub fn memlock_of_limits(text: &str) -> Option<api::PosixRlimit> {
    let rest = text
        .lines()
        .find_map(|l| l.strip_prefix("Max locked memory"))?;
    let mut fields = rest.split_whitespace();
    let value = |v: &str| match v {
        "unlimited" => Some(u64::MAX),
        n => n.parse().ok(),
    };
    let soft = value(fields.next()?)?;
    let hard = value(fields.next()?)?;
    Some(api::PosixRlimit {
        r#type: "RLIMIT_MEMLOCK".into(),
        hard,
        soft,
    })
}

/// The containers that run without what [`adjust_container_on`] gives them on a host of cgroup
/// `version` (pure but for `limits_of`, which reads a process's rlimits). They exist when a
/// container was created while no plugin answered for the agent: the agent killed or restarting
/// during the runtime's CreateContainer call (the runtime then creates the container without
/// the plugin's adjustment), or a container older than the agent. The `rdma.max` they miss is
/// written by an update now (the runtime applies it to the running cgroup), on v2 only: runc
/// refuses `unified` updates on v1 and hybrid hosts, where [`v1_repairs`] finds what to write. A
/// missing memlock limit cannot be given to a running process and is reported.
pub fn repairs_on(
    version: CgroupVersion,
    pods: &[api::PodSandbox],
    containers: &[api::Container],
    served: &NodeDevices,
    records: Records<'_>,
    policy: &Policy,
    limits_of: impl Fn(u32) -> Option<Vec<api::PosixRlimit>>,
) -> Repairs {
    let mut out = Repairs::default();
    let reports_rlimits = containers.iter().any(|c| !c.rlimits.is_empty());
    for c in containers {
        let Some(pod) = pods.iter().find(|p| p.id == c.pod_sandbox_id) else {
            continue;
        };
        let (want, _notices) = wanted_limits(pod, c, served, records, policy);
        let have_max = c
            .linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .and_then(|r| r.unified.get("rdma.max"));
        if let Some(line) = want.rdma_max.clone().filter(|_| version.takes_unified())
            && have_max.map(|h| h.trim()) != Some(line.trim())
        {
            out.updates.push(api::ContainerUpdate {
                container_id: c.id.clone(),
                linux: Some(api::LinuxContainerUpdate {
                    resources: Some(api::LinuxResources {
                        unified: [("rdma.max".to_string(), line)].into_iter().collect(),
                    }),
                }),
                // one container the runtime cannot update must not fail the others' repair
                ignore_failure: true,
            });
        }
        // What the container runs with: the rlimits the runtime reports (when it reports any
        // container's: NRI 0.7+), else the
        // process's own limits (by its PID, where the runtime reports one); unknown otherwise,
        // and then nothing is claimed.
        let have = if reports_rlimits {
            Some(c.rlimits.clone())
        } else {
            (c.pid > 0).then(|| limits_of(c.pid)).flatten()
        };
        let memlock_missing = have.is_some_and(|have| {
            want.rlimits.iter().any(|w| {
                !have
                    .iter()
                    .any(|h| h.r#type == w.r#type && h.hard == w.hard && h.soft == w.soft)
            })
        });
        if memlock_missing {
            out.without_memlock
                .push(format!("{}/{}/{}", pod.namespace, pod.name, c.name));
        }
    }
    out
}

/// Why a container's `rdma.max` was not written on a v1 or hybrid host (a closed set: the label
/// of `erdma_agent_rdma_limit_skipped_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitSkipped {
    /// The rdma controller's v1 hierarchy is not mounted on the host.
    NoRdmaHierarchy,
    /// The runtime's `cgroups_path` names no cgroup inside a hierarchy.
    BadCgroupsPath,
    /// The container's `rdma.max` could not be written (or, at Synchronize, read).
    WriteFailed,
}

impl LimitSkipped {
    /// `no_rdma_hierarchy`, `bad_cgroups_path` or `write_failed`.
    pub fn name(self) -> &'static str {
        match self {
            LimitSkipped::NoRdmaHierarchy => "no_rdma_hierarchy",
            LimitSkipped::BadCgroupsPath => "bad_cgroups_path",
            LimitSkipped::WriteFailed => "write_failed",
        }
    }
}

/// How [`write_v1_rdma_max`] ended when it did not skip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V1Write {
    /// The line was written.
    Written,
    /// The cgroup already had the limit (checked first): nothing written.
    AlreadySet,
}

/// The Warning for a limit not applied on a v1 or hybrid host: the node's cgroup version, the
/// container, the limit, why and the fix.
fn limit_not_applied(
    layout: CgroupLayout,
    pod: &api::PodSandbox,
    c: &api::Container,
    line: &str,
    why: &str,
) -> Notice {
    Notice {
        kind: "Warning",
        reason: "ErdmaRdmaLimitNotApplied",
        message: format!(
            "container {} of pod {}/{} runs without its rdma limit {line:?}: this node runs cgroup {}, where the runtime cannot set rdma.max, and {why}. The container runs with its memlock limit",
            c.name,
            pod.namespace,
            pod.name,
            layout.version.name()
        ),
    }
}

/// Writes `line` into the rdma cgroup of container `c` on a cgroup v1 or hybrid host (the
/// runtime created it; its place follows from the container's `cgroups_path`). With
/// `check_first` a cgroup that already holds the limit is left alone. A container whose limit
/// cannot be written is told with the reason and a Warning naming the fix; it is never failed.
pub fn write_v1_rdma_max(
    cgroups: &dyn CgroupFs,
    pod: &api::PodSandbox,
    c: &api::Container,
    line: &str,
    check_first: bool,
) -> Result<V1Write, (LimitSkipped, Notice)> {
    let layout = cgroups.layout();
    let skip = |reason: LimitSkipped, why: String| {
        Err((reason, limit_not_applied(layout, pod, c, line, &why)))
    };
    if !layout.rdma_hierarchy {
        return skip(
            LimitSkipped::NoRdmaHierarchy,
            "the rdma controller's hierarchy is not mounted at /sys/fs/cgroup/rdma; mount it on the node (kernel CONFIG_CGROUP_RDMA; systemd mounts every v1 controller it finds at boot) or move the node to cgroup v2, then recreate the pod".into(),
        );
    }
    let cgroups_path = c
        .linux
        .as_ref()
        .map(|l| l.cgroups_path.as_str())
        .unwrap_or_default();
    let cgroup = match hierarchy_path(cgroups_path) {
        Ok(p) => p,
        Err(e) => {
            return skip(
                LimitSkipped::BadCgroupsPath,
                format!("the runtime gave no usable cgroup: {e}"),
            );
        }
    };
    let file = cgroups.rdma_max_path(&cgroup);
    if check_first {
        let (device, limits) = line.split_once(' ').unwrap_or((line, ""));
        match cgroups.read_rdma_max(&cgroup) {
            Ok(text) => {
                let held = RdmaLimit::parse(limits).ok().is_some_and(|want| {
                    limits_of_device(&text, device).is_some_and(|have| want.held_by(&have))
                });
                if held {
                    return Ok(V1Write::AlreadySet);
                }
            }
            Err(e) => {
                return skip(
                    LimitSkipped::WriteFailed,
                    format!(
                        "reading {} failed: {e}; the agent reaches the host's cgroups through /proc/1/root (hostPID and CAP_SYS_PTRACE, as the chart runs it)",
                        file.display()
                    ),
                );
            }
        }
    }
    match cgroups.write_rdma_max(&cgroup, line) {
        Ok(()) => Ok(V1Write::Written),
        Err(e) => skip(
            LimitSkipped::WriteFailed,
            format!(
                "writing {} failed: {e}; the agent reaches the host's cgroups through /proc/1/root (hostPID and CAP_SYS_PTRACE, as the chart runs it) and writes the limit again when it next synchronizes with the runtime (agent restart)",
                file.display()
            ),
        ),
    }
}

/// The running containers of a v1 or hybrid host that should have an `rdma.max` (pure): pod,
/// container and line, for [`write_v1_rdma_max`] to check and write at Synchronize. A container
/// not running yet (created) is left to its StartContainer.
pub fn v1_repairs<'a>(
    pods: &'a [api::PodSandbox],
    containers: &'a [api::Container],
    served: &NodeDevices,
    records: Records<'_>,
    policy: &Policy,
) -> Vec<(&'a api::PodSandbox, &'a api::Container, String)> {
    let running = |c: &api::Container| {
        c.state == api::ContainerState::ContainerRunning as i32
            || c.state == api::ContainerState::ContainerPaused as i32
    };
    containers
        .iter()
        .filter(|c| running(c))
        .filter_map(|c| {
            let pod = pods.iter().find(|p| p.id == c.pod_sandbox_id)?;
            let line = wanted_limits(pod, c, served, records, policy).0.rdma_max?;
            Some((pod, c, line))
        })
        .collect()
}

/// The agent's NRI handler.
pub struct AgentNri {
    /// Policy.
    pub policy: Policy,
    /// Who holds which device (the process's one owner of the pod-resources answer: device
    /// plugin and DRA claims); read from its published snapshot, never asked here.
    pub holders: Arc<HolderCache>,
    /// The DRA claims this agent prepared: their limits are the containers' `rdma.max`.
    pub claims: ClaimRecords,
    /// The host's `/proc` as the agent sees it.
    pub proc_root: PathBuf,
    /// Served devices.
    pub served: watch::Receiver<NodeDevices>,
    /// SMC-R (absent when SMC-R is not configured on this node).
    pub smcr: Option<Arc<SmcrHook>>,
    /// Pod Events.
    pub cluster: Option<Cluster>,
    /// Counters.
    pub metrics: Arc<AgentMetrics>,
    /// The NRI part of `/healthz`, published by this plugin.
    pub view: watch::Sender<Option<NriView>>,
    /// The host's cgroups: its version decides where `rdma.max` goes (the adjustment on v2, the
    /// container's rdma cgroup at StartContainer on v1 and hybrid hosts).
    pub cgroups: Arc<dyn CgroupFs>,
}

/// The NRI part of `/healthz`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NriView {
    /// `--nri`: auto, on or off.
    pub mode: String,
    /// The runtime's NRI socket.
    pub socket: String,
    /// Whether this agent runs the NRI plugin (auto: the socket existed at start).
    pub used: bool,
    /// How SMC-R pods are configured on this node: `nri` (at sandbox creation), `prestart`
    /// (PreStartContainer) or `none` (the webhook's init container, or SMC-R off).
    pub smcr_path: String,
    /// Whether the plugin is registered with the runtime now.
    pub connected: bool,
    /// The last session error.
    pub last_error: Option<String>,
    /// The host's cgroup version: `v1`, `hybrid` or `v2` (empty until read).
    pub cgroup_version: String,
    /// How containers get their `rdma.max` here: `unified` (the NRI adjustment, cgroup v2),
    /// `rdma-cgroup` (written into the container's v1 rdma cgroup at StartContainer) or `none`
    /// (v1 without the rdma hierarchy: Warning Events, no limit).
    pub rdma_max_route: String,
}

impl NriView {
    /// `cgroup_version` and `rdma_max_route` of a host of `layout`.
    pub fn with_layout(mut self, layout: CgroupLayout) -> Self {
        self.cgroup_version = layout.version.name().into();
        self.rdma_max_route = if layout.version.takes_unified() {
            "unified"
        } else if layout.rdma_hierarchy {
            "rdma-cgroup"
        } else {
            "none"
        }
        .into();
        self
    }
}

pub use crate::smcr::pod_device_ids;

impl AgentNri {
    fn tell(&self, pod: &api::PodSandbox, n: Notice) {
        if n.kind == "Warning" {
            tracing::warn!(reason = n.reason, "{}", n.message);
        } else {
            tracing::info!(reason = n.reason, "{}", n.message);
        }
        if let Some(cluster) = self.cluster.clone() {
            let target = PodRef {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
            };
            // The runtime waits for us: never for the API server.
            tokio::spawn(async move {
                if let Err(e) = cluster
                    .pod_event(&target, n.kind, n.reason, &n.message)
                    .await
                {
                    tracing::warn!("{e}");
                }
            });
        }
    }

    async fn run_pod_sandbox(&self, pod: api::PodSandbox) -> Result<(), String> {
        let Some(hook) = &self.smcr else {
            return Ok(());
        };
        let netns = if pod.pid > 0 {
            Some(self.proc_root.join(pod.pid.to_string()).join("ns/net"))
        } else {
            pod.linux
                .iter()
                .flat_map(|l| &l.namespaces)
                .find(|n| n.r#type == "network" && !n.path.is_empty())
                .map(|n| PathBuf::from(&n.path))
        };
        let target = PodRef {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
        };
        match hook.at_sandbox(target, netns, &pod.annotations).await {
            Some(d) if d.failed_container => Err(d
                .message
                .unwrap_or_else(|| format!("SMC-R for pod {}/{} failed", pod.namespace, pod.name))),
            _ => Ok(()),
        }
    }

    /// The published holders once a pending refresh (an allocation's poke) is in, bounded.
    async fn holders_now(&self) -> Arc<Snapshot> {
        self.holders.settled(SETTLE_WITHIN).await
    }

    /// Counts and tells a limit [`write_v1_rdma_max`] could not apply.
    fn limit_skipped(&self, pod: &api::PodSandbox, reason: LimitSkipped, n: Notice) {
        self.metrics.rdma_limit_skipped(reason.name());
        self.tell(pod, n);
    }

    /// StartContainer on a v1 or hybrid host: runc has created the container's cgroups and its
    /// process has not started; its `rdma.max` goes into its rdma cgroup now. Never fails the
    /// container (the limits it asked for were reported at CreateContainer).
    async fn start_container(&self, pod: &api::PodSandbox, c: &api::Container) {
        if self.cgroups.layout().version.takes_unified() {
            return;
        }
        let snapshot = self.holders_now().await;
        let claims = self.claims.current();
        let records = Records {
            holders: trusted_holders(&snapshot),
            claims: claims.as_deref(),
        };
        let (wanted, _told_at_creation) =
            wanted_limits(pod, c, &self.served.borrow(), records, &self.policy);
        let Some(line) = wanted.rdma_max else {
            return;
        };
        match write_v1_rdma_max(&*self.cgroups, pod, c, &line, false) {
            Ok(_) => {
                self.metrics.rdma_limit_written("StartContainer");
                tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), container = %c.name, rdma_max = %line, "NRI: rdma.max written into the container's v1 rdma cgroup");
            }
            Err((reason, n)) => self.limit_skipped(pod, reason, n),
        }
    }

    /// Synchronize on a v1 or hybrid host: running containers whose rdma cgroup lacks their
    /// limit get it written now; returns how many.
    fn repair_v1(
        &self,
        pods: &[api::PodSandbox],
        containers: &[api::Container],
        records: Records<'_>,
    ) -> usize {
        let todo = v1_repairs(
            pods,
            containers,
            &self.served.borrow(),
            records,
            &self.policy,
        );
        let mut written = 0;
        for (pod, c, line) in todo {
            match write_v1_rdma_max(&*self.cgroups, pod, c, &line, true) {
                Ok(V1Write::AlreadySet) => {}
                Ok(V1Write::Written) => {
                    written += 1;
                    self.metrics.rdma_limit_written("Synchronize");
                    tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), container = %c.name, rdma_max = %line, "NRI: a running container's v1 rdma cgroup lacked its rdma.max (created while the agent was not answering); written now");
                }
                Err((reason, n)) => self.limit_skipped(pod, reason, n),
            }
        }
        written
    }
}

impl Handler for AgentNri {
    fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> BoxFuture<'_, Vec<api::ContainerUpdate>> {
        Box::pin(async move {
            // Synchronize follows every successful registration.
            self.view.send_modify(|v| {
                if let Some(n) = v {
                    n.connected = true;
                    n.last_error = None;
                }
            });
            let proc_root = self.proc_root.clone();
            let limits_of = |pid: u32| {
                let text =
                    std::fs::read_to_string(proc_root.join(pid.to_string()).join("limits")).ok()?;
                memlock_of_limits(&text).map(|m| vec![m])
            };
            let snapshot = self.holders_now().await;
            let claims = self.claims.current();
            let records = Records {
                holders: trusted_holders(&snapshot),
                claims: claims.as_deref(),
            };
            let version = self.cgroups.layout().version;
            let found = repairs_on(
                version,
                &pods,
                &containers,
                &self.served.borrow(),
                records,
                &self.policy,
                limits_of,
            );
            let written_v1 = if version.takes_unified() {
                0
            } else {
                self.repair_v1(&pods, &containers, records)
            };
            for u in &found.updates {
                tracing::warn!(
                    container = %u.container_id,
                    rdma_max = ?u.linux.as_ref().and_then(|l| l.resources.as_ref()).and_then(|r| r.unified.get("rdma.max")),
                    "NRI: a running container lacks its rdma.max (created while the agent was not answering); writing it now"
                );
            }
            if !found.without_memlock.is_empty() {
                tracing::warn!(
                    containers = ?found.without_memlock,
                    "NRI: running containers lack their memlock limit (created while the agent was not answering); an rlimit cannot change in a running process: restart these pods"
                );
            }
            tracing::info!(
                pods = pods.len(),
                containers = containers.len(),
                repaired = found.updates.len() + written_v1,
                "NRI: synchronized with the runtime (running containers keep their limits)"
            );
            found.updates
        })
    }

    fn state_change(
        &self,
        event: Event,
        pod: Option<api::PodSandbox>,
        container: Option<api::Container>,
    ) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let pod = pod.unwrap_or_default();
            match event {
                Event::RunPodSandbox => self.run_pod_sandbox(pod).await,
                Event::StartContainer => {
                    if let Some(c) = &container {
                        self.start_container(&pod, c).await;
                    }
                    Ok(())
                }
                Event::RemovePodSandbox => {
                    if let Some(h) = &self.smcr {
                        h.forget(&format!("{}/{}", pod.namespace, pod.name));
                    }
                    Ok(())
                }
                _ => Ok(()),
            }
        })
    }

    fn create_container(
        &self,
        pod: api::PodSandbox,
        container: api::Container,
    ) -> BoxFuture<'_, Result<api::ContainerAdjustment, String>> {
        Box::pin(async move {
            let snapshot = self.holders_now().await;
            let claims = self.claims.current();
            let records = Records {
                holders: trusted_holders(&snapshot),
                claims: claims.as_deref(),
            };
            let (wanted, notices) = wanted_limits(
                &pod,
                &container,
                &self.served.borrow(),
                records,
                &self.policy,
            );
            for n in notices {
                self.tell(&pod, n);
            }
            if !wanted.env_ignored.is_empty() {
                self.metrics.rdma_max_env_ignored.inc();
                tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), container = %container.name, env = ?wanted.env_ignored, rdma_max = ?wanted.rdma_max, "NRI: the container's environment names rdma limits its DRA claims and the node's policy do not give it; ignored (limits come from the agent's records, never from a container's environment)");
            }
            let adjust = adjustment_on(self.cgroups.layout().version, wanted);
            if adjust != api::ContainerAdjustment::default() {
                tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), container = %container.name, rlimits = adjust.rlimits.len(), rdma_max = ?adjust.linux.as_ref().and_then(|l| l.resources.as_ref()).and_then(|r| r.unified.get("rdma.max")), "NRI: container adjusted");
            }
            Ok(adjust)
        })
    }
}

/// Keeps a plugin session up: reconnects when the runtime restarts, backs off while the socket is
/// missing, shows the state in `/healthz`.
pub async fn run(
    cfg: erdma_nri::plugin::PluginConfig,
    handler: Arc<AgentNri>,
    cancel: tokio_util::sync::CancellationToken,
) {
    let mut backoff = erdma_model::Backoff::new(
        std::time::Duration::from_millis(500),
        std::time::Duration::from_secs(30),
    );
    // The runtime (re)started: connect then, not at the end of the back-off (up to 30 s).
    let mut appeared = SocketWatch::new(&cfg.socket, "NRI socket");
    loop {
        let started = std::time::Instant::now();
        let r = erdma_nri::plugin::run_session(&cfg, handler.clone(), &cancel).await;
        handler.view.send_modify(|v| {
            if let Some(n) = v {
                n.connected = false;
                n.last_error = r.as_ref().err().map(ToString::to_string);
            }
        });
        if started.elapsed() > std::time::Duration::from_secs(30) {
            backoff.reset();
        }
        let delay = backoff.next_delay();
        match &r {
            Ok(()) => {
                tracing::info!("NRI session ended (runtime restart or shutdown); reconnecting")
            }
            Err(e) => tracing::warn!("{e}; retrying in {delay:?} or when the socket is created"),
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
            _ = appeared.created() => {
                // the runtime (re)started: connect now, and retry quickly while it comes up
                tracing::info!(socket = %cfg.socket.display(), "NRI socket created; connecting");
                backoff.reset();
            }
        }
    }
}

/// The events the agent subscribes to on a cgroup v2 host.
pub const EVENTS: &[Event] = &[
    Event::RunPodSandbox,
    Event::RemovePodSandbox,
    Event::CreateContainer,
];

/// The events the agent subscribes to on a host of cgroup `version`: on v1 and hybrid hosts
/// StartContainer too, where `rdma.max` is written (containerd calls it after runc created the
/// container's cgroups, before the process starts; its PostCreateContainer comes before them).
pub fn events(version: CgroupVersion) -> Vec<Event> {
    let mut events = EVENTS.to_vec();
    if !version.takes_unified() {
        events.push(Event::StartContainer);
    }
    events
}

/// Where the agent reads the host's cgroups: the host's own `/sys/fs/cgroup` through PID 1's
/// root (hostPID; the container's `/sys/fs/cgroup` is its own cgroup only).
pub fn host_cgroup_root(proc_root: &Path) -> PathBuf {
    proc_root.join("1/root/sys/fs/cgroup")
}

/// The host's cgroups, read once: through [`host_cgroup_root`]; where that cannot be read, the
/// version from the agent's own `/sys/fs/cgroup` (the same kernel) with no rdma hierarchy to
/// write into; cgroup v2 (today's default) when neither reads.
pub fn detect_cgroups(proc_root: &Path) -> Arc<dyn CgroupFs> {
    let root = host_cgroup_root(proc_root);
    let fs = match RootedCgroupFs::detect(&root) {
        Ok(fs) => fs,
        Err(host) => {
            let own = erdma_host::cgroup::detect(Path::new("/sys/fs/cgroup"));
            let version = match &own {
                Ok(l) => l.version,
                Err(_) => CgroupVersion::V2,
            };
            tracing::warn!(
                "{host}; taking cgroup {} from the agent's own /sys/fs/cgroup ({}), without writing rdma limits on v1",
                version.name(),
                own.as_ref()
                    .map_or_else(|e| e.to_string(), |_| "read".into())
            );
            RootedCgroupFs::with_layout(
                root,
                CgroupLayout {
                    version,
                    rdma_hierarchy: false,
                },
            )
        }
    };
    let layout = fs.layout();
    tracing::info!(
        cgroup = layout.version.name(),
        rdma_hierarchy = layout.rdma_hierarchy,
        "host cgroups: rdma.max goes {}",
        if layout.version.takes_unified() {
            "into the NRI adjustment (linux.resources.unified)"
        } else if layout.rdma_hierarchy {
            "into each container's v1 rdma cgroup at StartContainer"
        } else {
            "nowhere: no rdma hierarchy is mounted (containers asking for a limit get a Warning Event)"
        }
    );
    Arc::new(fs)
}

/// The NRI part of `/healthz`, as the plan decided it; the sender goes to [`start`].
pub fn start_view(
    plan: &crate::plan::AgentPlan,
    view: &mut watch::Receiver<Option<NriView>>,
) -> watch::Sender<Option<NriView>> {
    let (tx, rx) = watch::channel(Some(NriView {
        mode: plan.nri_mode.into(),
        socket: plan.sockets.nri.display().to_string(),
        used: plan.nri,
        smcr_path: plan.smcr.name().into(),
        connected: false,
        last_error: None,
        ..Default::default()
    }));
    *view = rx;
    tx
}

/// The NRI plugin session, when the plan runs it: the install's policy (memlock, rdma limits)
/// for containers holding the served devices, and SMC-R at sandbox creation when `smcr` is
/// given.
pub fn start(
    shared: crate::tasks::Shared<'_>,
    smcr: Option<Arc<SmcrHook>>,
    served: &watch::Receiver<NodeDevices>,
    view: watch::Sender<Option<NriView>>,
    tasks: &mut crate::tasks::Tasks,
) {
    let (plan, s, metrics) = (shared.plan, shared.settings, shared.metrics);
    let proc_root = PathBuf::from("/proc");
    let cgroups = detect_cgroups(&proc_root);
    let layout = cgroups.layout();
    metrics.cgroup_layout(layout.version.name(), layout.rdma_hierarchy);
    view.send_modify(|v| {
        if let Some(n) = v.take() {
            *v = Some(n.with_layout(layout));
        }
    });
    if !plan.nri {
        tasks.keep(view);
        return;
    }
    let handler = Arc::new(AgentNri {
        policy: s.nri_policy.clone(),
        holders: shared.holders.clone(),
        // read on every node: a node moved from DRA to the device plugin keeps its prepared
        // claims' containers until they end
        claims: ClaimRecords::at(erdma_dra::checkpoint::path_under(
            &s.kubelet_root_dir,
            erdma_model::names::DRA_DRIVER,
        )),
        proc_root,
        served: served.clone(),
        smcr,
        cluster: shared.cluster.clone(),
        metrics: metrics.clone(),
        view,
        cgroups,
    });
    let cfg = erdma_nri::plugin::PluginConfig {
        socket: plan.sockets.nri.clone(),
        name: "erdma".into(),
        idx: "10".into(),
        events: events(layout.version),
        budget: s.nri_budget,
        observer: Some(metrics.clone() as Arc<dyn erdma_nri::plugin::HookObserver>),
    };
    tasks.spawn("the NRI plugin", run(cfg, handler, tasks.cancel.clone()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use erdma_dra::cdi::RdmaLimits;
    use erdma_dra::checkpoint::{Checkpoint, PreparedClaim, PreparedDevice};
    use erdma_host::fake::FixedInterfaceAddrs;
    use erdma_host::{RootedDevFs, RootedSysfs, fixtures};
    use erdma_inventory::{Inventory, Sources};
    use erdma_model::rdma_limit::Memlock;
    use std::collections::BTreeMap;

    fn served() -> (erdma_host::fake::NodeTree, NodeDevices) {
        let tree = erdma_host::fake::NodeTree::temp();
        assert!(fixtures::build("erdma-compat", &tree));
        let inv = Inventory::new(Sources {
            sysfs: Arc::new(RootedSysfs::new(tree.sys())),
            devfs: Arc::new(RootedDevFs::new(tree.dev())),
            addrs: Arc::new(FixedInterfaceAddrs(BTreeMap::new())),
        });
        let n = inv.scan();
        (tree, n)
    }

    fn pod(annotation: Option<&str>) -> api::PodSandbox {
        api::PodSandbox {
            name: "p".into(),
            namespace: "ns".into(),
            annotations: annotation
                .map(|a| [(RDMA_MAX_ANNOTATION.to_string(), a.to_string())].into())
                .unwrap_or_default(),
            ..Default::default()
        }
    }

    fn container(env: &[&str], devices: &[(&str, i64, i64)]) -> api::Container {
        api::Container {
            name: "main".into(),
            env: env.iter().map(|s| s.to_string()).collect(),
            linux: Some(api::LinuxContainer {
                devices: devices
                    .iter()
                    .map(|(p, ma, mi)| api::LinuxDevice {
                        path: p.to_string(),
                        r#type: "c".into(),
                        major: *ma,
                        minor: *mi,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The kubelet's answer: container `main` of pod `ns/p` holds a slot of each of `devices`.
    fn holds(devices: &[&str]) -> Vec<Holder> {
        vec![Holder::of_ids(
            "ns",
            "p",
            "main",
            devices.iter().map(|d| format!("{d}/0")).collect(),
        )]
    }

    const POLICY: Policy = Policy {
        memlock: Memlock::Unlimited,
        default_rdma_max: None,
        allow_annotation_raise: false,
    };

    #[test]
    fn devices_are_found_from_the_kubelets_answer_or_the_device_nodes() {
        let (_t, served) = served();
        let names: Vec<&str> = served.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        let p = pod(None);
        let bare = container(&[], &[]);
        // The device plugin's slot IDs in the kubelet's answer; two slots of one device are one.
        let mut h = holds(&[names[1]]);
        h[0].device_ids.push(format!("{}/3", names[1]));
        assert_eq!(held_devices(&p, &bare, &served, Some(&h)), [names[1]]);
        // A DRA claim's device, by its name in the driver's pool.
        let mut claim = Holder::of_ids("ns", "p", "main", vec![]);
        claim
            .claimed
            .push(erdma_kubelet::podresources::ClaimedDevice {
                claim_namespace: "ns".into(),
                claim_name: "rdma".into(),
                pool: "node-1".into(),
                device: erdma_dra::slice::device_name(names[0]).unwrap(),
            });
        assert_eq!(held_devices(&p, &bare, &served, Some(&[claim])), [names[0]]);
        // Another container of the pod, another pod: nothing.
        let mut sidecar = bare.clone();
        sidecar.name = "sidecar".into();
        assert!(held_devices(&p, &sidecar, &served, Some(&h)).is_empty());
        assert!(held_devices(&pod(Some("x")), &bare, &served, Some(&holds(&["nope"]))).is_empty());
        // Without a trusted answer: the device nodes the runtime put in.
        let u = served.devices[0].char_devices.uverbs.clone().unwrap();
        let c = container(
            &[],
            &[(
                "/dev/infiniband/renamed",
                i64::from(u.major.unwrap()),
                i64::from(u.minor.unwrap()),
            )],
        );
        assert_eq!(held_devices(&p, &c, &served, None), [names[0]]);
        assert_eq!(
            held_devices(&p, &c, &served, Some(&[])),
            [names[0]],
            "a node the runtime put in counts beside the kubelet's answer (a DRA claim it lacks)"
        );
        assert_eq!(
            held_devices(&p, &c, &served, Some(&h)),
            [names[1], names[0]]
        );
    }

    /// A container that names devices in its own `ERDMA_DEVICES` holds nothing by it: neither
    /// with the kubelet's answer (which does not list it) nor without one.
    #[test]
    fn a_containers_own_erdma_devices_env_holds_nothing() {
        let (_t, served) = served();
        let dev = served.devices[0].name.clone();
        let policy = Policy {
            memlock: Memlock::Unlimited,
            default_rdma_max: Some(RdmaLimit::parse("hca_handle=1").unwrap()),
            allow_annotation_raise: false,
        };
        let forged = container(
            &[
                &format!("ERDMA_DEVICES={dev}"),
                &format!("ERDMA_RDMA_MAX={dev} hca_handle=max hca_object=max"),
            ],
            &[],
        );
        let mut elsewhere = holds(&[&dev]);
        elsewhere[0].container = "trainer".into();
        for holders in [None, Some(&[][..]), Some(elsewhere.as_slice())] {
            assert!(held_devices(&pod(None), &forged, &served, holders).is_empty());
            let (a, n) = adjust_container_on(
                CgroupVersion::V2,
                &pod(None),
                &forged,
                &served,
                Records::kubelet(holders),
                &policy,
            );
            assert_eq!(a, api::ContainerAdjustment::default(), "{holders:?}");
            assert!(n.is_empty());
        }
    }

    #[test]
    fn memlock_and_rdma_max_for_one_device_nothing_for_others() {
        let (_t, served) = served();
        let dev = served.devices[0].name.clone();
        let c = container(&[], &[]);
        let h = holds(&[&dev]);
        let (a, n) = adjust_container_on(
            CgroupVersion::V2,
            &pod(Some("hca_handle=2 hca_object=500")),
            &c,
            &served,
            Records::kubelet(Some(&h)),
            &POLICY,
        );
        assert!(n.is_empty(), "{n:?}");
        assert_eq!(a.rlimits.len(), 1);
        assert_eq!((a.rlimits[0].hard, a.rlimits[0].soft), (u64::MAX, u64::MAX));
        assert_eq!(
            a.linux.unwrap().resources.unwrap().unified["rdma.max"],
            format!("{dev} hca_handle=2 hca_object=500")
        );
        // A container without the resource is left alone.
        let (a, n) = adjust_container_on(
            CgroupVersion::V2,
            &pod(Some("hca_handle=2")),
            &container(&[], &[]),
            &served,
            Records::kubelet(Some(&[])),
            &POLICY,
        );
        assert_eq!(a, api::ContainerAdjustment::default());
        assert!(n.is_empty());
        // The install default applies without the annotation; memlock off leaves rlimits alone.
        let policy = Policy {
            memlock: Memlock::Off,
            default_rdma_max: Some(RdmaLimit::parse("hca_handle=1").unwrap()),
            allow_annotation_raise: false,
        };
        let (a, _) = adjust_container_on(
            CgroupVersion::V2,
            &pod(None),
            &c,
            &served,
            Records::kubelet(Some(&h)),
            &policy,
        );
        assert!(a.rlimits.is_empty());
        assert_eq!(
            a.linux.unwrap().resources.unwrap().unified["rdma.max"],
            format!("{dev} hca_handle=1")
        );
    }

    /// At Synchronize, a running container that holds a device and lacks its rdma.max (created
    /// while the agent was not answering) gets an update with it; one that has it, or holds no
    /// device, gets none; a missing memlock limit is reported, not updated.
    #[test]
    fn synchronize_repairs_a_missing_rdma_max_and_reports_a_missing_memlock() {
        let (_t, served) = served();
        let dev = served.devices[0].name.clone();
        let mut annotated = pod(Some("hca_handle=2"));
        annotated.id = "sb-1".into();
        let line = format!("{dev} hca_handle=2");
        let h = holds(&[&dev]);
        let with = |id: &str, limit: Option<&str>, memlock: bool| {
            let mut c = container(&[], &[]);
            c.id = id.into();
            c.pod_sandbox_id = "sb-1".into();
            if let (Some(l), Some(linux)) = (limit, c.linux.as_mut()) {
                linux.resources = Some(api::LinuxResources {
                    unified: [("rdma.max".to_string(), l.to_string())]
                        .into_iter()
                        .collect(),
                });
            }
            if memlock {
                c.rlimits.push(api::PosixRlimit {
                    r#type: "RLIMIT_MEMLOCK".into(),
                    hard: u64::MAX,
                    soft: u64::MAX,
                });
            }
            c
        };
        let mut plain = container(&[], &[]);
        plain.name = "sidecar".into();
        plain.id = "c-plain".into();
        plain.pod_sandbox_id = "sb-1".into();
        let containers = [
            with("c-bare", None, false),
            with("c-done", Some(&line), true),
            with("c-other", Some("rxe9 hca_handle=1"), true),
            plain,
        ];
        let no_proc = |_pid: u32| None;
        let r = repairs_on(
            CgroupVersion::V2,
            std::slice::from_ref(&annotated),
            &containers,
            &served,
            Records::kubelet(Some(&h)),
            &POLICY,
            no_proc,
        );
        let updated: Vec<(&str, &str, bool)> = r
            .updates
            .iter()
            .map(|u| {
                let l = u.linux.as_ref().and_then(|l| l.resources.as_ref());
                (
                    u.container_id.as_str(),
                    l.map_or("", |r| r.unified["rdma.max"].as_str()),
                    u.ignore_failure,
                )
            })
            .collect();
        assert_eq!(
            updated,
            [
                ("c-bare", line.as_str(), true),
                ("c-other", line.as_str(), true)
            ]
        );
        assert_eq!(r.without_memlock, ["ns/p/main"]);
        // a container whose pod the runtime did not list is left alone
        assert_eq!(
            repairs_on(
                CgroupVersion::V2,
                &[],
                &containers,
                &served,
                Records::kubelet(Some(&h)),
                &POLICY,
                no_proc
            ),
            Repairs::default()
        );
        // a runtime that reports no rlimits (containerd 1.7): the process's limits decide, and
        // without a PID nothing is claimed
        let mut bare = with("c-bare", Some(&line), false);
        let one = std::slice::from_ref(&annotated);
        assert!(
            repairs_on(
                CgroupVersion::V2,
                one,
                std::slice::from_ref(&bare),
                &served,
                Records::kubelet(Some(&h)),
                &POLICY,
                no_proc
            )
            .without_memlock
            .is_empty()
        );
        bare.pid = 4242;
        let limits = |v: &str| {
            let text = format!(
                "Limit                     Soft Limit           Hard Limit           Units\n\
                 Max locked memory         {v}            {v}            bytes\n"
            );
            move |pid: u32| {
                assert_eq!(pid, 4242);
                memlock_of_limits(&text).map(|m| vec![m])
            }
        };
        let r = repairs_on(
            CgroupVersion::V2,
            one,
            std::slice::from_ref(&bare),
            &served,
            Records::kubelet(Some(&h)),
            &POLICY,
            limits("8388608"),
        );
        assert_eq!(r.without_memlock, ["ns/p/main"]);
        let r = repairs_on(
            CgroupVersion::V2,
            one,
            std::slice::from_ref(&bare),
            &served,
            Records::kubelet(Some(&h)),
            &POLICY,
            limits("unlimited"),
        );
        assert!(r.without_memlock.is_empty());
    }

    /// The agent's DRA checkpoint: each `(uid, claim name, ibdev, hca_handle)` prepared in
    /// namespace `ns` on one device (hca_object 8000; hca_handle 0 stands for admin access).
    fn prepared(claims: &[(&str, &str, &str, u64)]) -> Checkpoint {
        let mut cp = Checkpoint::default();
        for (uid, name, ibdev, handle) in claims {
            let claim = cp
                .claims
                .entry(uid.to_string())
                .or_insert_with(|| PreparedClaim {
                    namespace: "ns".into(),
                    name: name.to_string(),
                    devices: vec![],
                    cdi_spec: PathBuf::from("/var/run/cdi/x.json"),
                });
            claim.devices.push(PreparedDevice {
                request: "rdma".into(),
                pool: "node-1".into(),
                device: erdma_dra::slice::device_name(ibdev).unwrap(),
                ibdev: ibdev.to_string(),
                cdi_ids: vec![],
                share_id: None,
                shares: 1,
                limits: RdmaLimits {
                    hca_handle: *handle,
                    hca_object: 8000,
                },
                admin: *handle == 0,
            });
        }
        cp
    }

    /// The kubelet's answer: container `main` of pod `ns/p` uses each `(claim name, ibdev)`.
    fn uses(claims: &[(&str, &str)]) -> Vec<Holder> {
        let mut h = Holder::of_ids("ns", "p", "main", vec![]);
        for (name, ibdev) in claims {
            h.claimed.push(erdma_kubelet::podresources::ClaimedDevice {
                claim_namespace: "ns".into(),
                claim_name: name.to_string(),
                pool: "node-1".into(),
                device: erdma_dra::slice::device_name(ibdev).unwrap(),
            });
        }
        vec![h]
    }

    fn unified_rdma_max(a: &api::ContainerAdjustment) -> Option<String> {
        a.linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .and_then(|r| r.unified.get("rdma.max").cloned())
    }

    /// A DRA claim's consumed capacity, from the agent's checkpoint for the claim the kubelet
    /// says the container uses, is its `rdma.max`; the container's own `ERDMA_RDMA_MAX` says
    /// nothing (it is reported as ignored); the annotation lowers the claim's limit, never
    /// raises it.
    #[test]
    fn a_dra_claims_limit_comes_from_the_checkpoint_never_from_the_env() {
        let (_t, served) = served();
        let dev = served.devices[0].name.clone();
        let cp = prepared(&[("uid-a", "claim-a", &dev, 4)]);
        let h = uses(&[("claim-a", &dev)]);
        let records = Records {
            holders: Some(&h),
            claims: Some(&cp),
        };
        let claim_line = format!("{dev} hca_handle=4 hca_object=8000");
        let forged = container(
            &[
                &format!("ERDMA_RDMA_MAX={dev} hca_handle=max hca_object=max"),
                &format!("ERDMA_RDMA_MAX_UID_A={claim_line}"),
            ],
            &[],
        );
        let (w, n) = wanted_limits(&pod(None), &forged, &served, records, &POLICY);
        assert!(n.is_empty(), "{n:?}");
        assert_eq!(w.rdma_max.as_deref(), Some(claim_line.as_str()));
        assert_eq!(w.rlimits.len(), 1, "memlock for a DRA container too");
        assert_eq!(
            w.env_ignored,
            [format!(
                "ERDMA_RDMA_MAX={dev} hca_handle=max hca_object=max"
            )],
            "the driver's own hand-off is no disagreement; the forged value is"
        );
        let (a, _) = adjust_container_on(
            CgroupVersion::V2,
            &pod(None),
            &forged,
            &served,
            records,
            &POLICY,
        );
        assert_eq!(unified_rdma_max(&a), Some(claim_line.clone()));

        // the annotation lowers a key; one above the claim is capped, with a Warning
        let (w, n) = wanted_limits(
            &pod(Some("hca_handle=2 hca_object=max")),
            &forged,
            &served,
            records,
            &POLICY,
        );
        assert_eq!(
            w.rdma_max,
            Some(format!("{dev} hca_handle=2 hca_object=8000"))
        );
        assert_eq!(n[0].reason, "ErdmaRdmaMaxCapped");
        assert!(n[0].message.contains("DRA claim"), "{}", n[0].message);
        // the operator's opt-in raises the operator's limit, never a claim's
        let raising = Policy {
            allow_annotation_raise: true,
            default_rdma_max: Some(RdmaLimit::parse("hca_handle=1").unwrap()),
            ..POLICY
        };
        let (w, _) = wanted_limits(
            &pod(Some("hca_handle=max")),
            &forged,
            &served,
            records,
            &raising,
        );
        assert_eq!(w.rdma_max.as_deref(), Some(claim_line.as_str()));
    }

    /// A container that names, in its own env, a claim it does not use (another pod's, or one
    /// of its pod's sibling containers) gets nothing from it; two claims one container uses on
    /// one device add up; limits on two devices cannot be one `rdma.max` write.
    #[test]
    fn a_forged_claim_hand_off_gives_nothing_and_claims_on_one_device_add_up() {
        let (_t, served) = served();
        let dev = served.devices[0].name.clone();
        let other = served.devices[1].name.clone();
        let cp = prepared(&[
            ("uid-a", "claim-a", &dev, 4),
            ("uid-b", "claim-b", &dev, 6),
            ("uid-big", "claim-big", &dev, 500),
            ("uid-o", "claim-o", &other, 3),
        ]);
        let forged = container(
            &[&format!(
                "ERDMA_RDMA_MAX_UID_BIG={dev} hca_handle=500 hca_object=8000"
            )],
            &[],
        );
        let h = uses(&[("claim-a", &dev)]);
        let records = Records {
            holders: Some(&h),
            claims: Some(&cp),
        };
        let (w, n) = wanted_limits(&pod(None), &forged, &served, records, &POLICY);
        assert!(n.is_empty(), "{n:?}");
        assert_eq!(
            w.rdma_max,
            Some(format!("{dev} hca_handle=4 hca_object=8000"))
        );
        assert_eq!(w.env_ignored.len(), 1, "{:?}", w.env_ignored);

        let h = uses(&[("claim-a", &dev), ("claim-b", &dev)]);
        let records = Records {
            holders: Some(&h),
            claims: Some(&cp),
        };
        let (w, n) = wanted_limits(&pod(None), &container(&[], &[]), &served, records, &POLICY);
        assert!(n.is_empty(), "{n:?}");
        assert_eq!(
            w.rdma_max,
            Some(format!("{dev} hca_handle=10 hca_object=16000"))
        );

        let h = uses(&[("claim-a", &dev), ("claim-o", &other)]);
        let records = Records {
            holders: Some(&h),
            claims: Some(&cp),
        };
        let (w, n) = wanted_limits(&pod(None), &container(&[], &[]), &served, records, &POLICY);
        assert_eq!(w.rdma_max, None, "nothing rather than one device's limit");
        assert_eq!(n.len(), 1, "{n:?}");
        assert_eq!(n[0].reason, "ErdmaRdmaMaxNotApplied");
        assert!(
            n[0].message.contains("ns/claim-a, ns/claim-o"),
            "{}",
            n[0].message
        );
    }

    /// Where the kubelet's answer names no DRA claim of the container (its DynamicResources gate
    /// off), the claims prepared in the pod's namespace on the device the runtime put into the
    /// container stand in, and with several the lowest applies; a container the answer lists with
    /// a device-plugin slot, or whose claim has admin access (no limit), gets the operator's.
    #[test]
    fn without_the_kubelets_claims_the_lowest_claim_on_the_held_device_applies() {
        let (_t, served) = served();
        let dev = served.devices[0].name.clone();
        let u = served.devices[0].char_devices.uverbs.clone().unwrap();
        let c = container(
            &[&format!("ERDMA_RDMA_MAX={dev} hca_handle=max")],
            &[(
                u.path.as_str(),
                i64::from(u.major.unwrap()),
                i64::from(u.minor.unwrap()),
            )],
        );
        let cp = prepared(&[("uid-a", "claim-a", &dev, 4), ("uid-b", "claim-b", &dev, 9)]);
        for holders in [None, Some(&[][..])] {
            let records = Records {
                holders,
                claims: Some(&cp),
            };
            let (w, _) = wanted_limits(&pod(None), &c, &served, records, &POLICY);
            assert_eq!(
                w.rdma_max,
                Some(format!("{dev} hca_handle=4 hca_object=8000")),
                "{holders:?}"
            );
        }
        // the kubelet lists the container with a device-plugin slot: no claim is its, the
        // operator's limit applies (a node moving between the two)
        let slot = holds(&[&dev]);
        let records = Records {
            holders: Some(&slot),
            claims: Some(&cp),
        };
        let ceiling = Policy {
            default_rdma_max: Some(RdmaLimit::parse("hca_handle=2").unwrap()),
            ..POLICY
        };
        let (w, _) = wanted_limits(&pod(None), &c, &served, records, &ceiling);
        assert_eq!(w.rdma_max, Some(format!("{dev} hca_handle=2")));
        let admin = prepared(&[("uid-m", "claim-m", &dev, 0)]);
        let policy = Policy {
            default_rdma_max: Some(RdmaLimit::parse("hca_handle=3").unwrap()),
            ..POLICY
        };
        let records = Records {
            holders: None,
            claims: Some(&admin),
        };
        let (w, _) = wanted_limits(&pod(None), &c, &served, records, &policy);
        assert_eq!(w.rdma_max, Some(format!("{dev} hca_handle=3")));
    }

    /// A device-plugin container that sets `ERDMA_RDMA_MAX=<dev> hca_handle=max ...` in its own
    /// spec gets the operator's limit; the annotation lowers it, is capped above it (a Warning
    /// says so), and replaces it only with the operator's opt-in.
    #[test]
    fn the_operators_limit_is_a_ceiling_the_env_cannot_lift() {
        let (_t, served) = served();
        let dev = served.devices[0].name.clone();
        let h = holds(&[&dev]);
        let records = Records::kubelet(Some(&h));
        let policy = Policy {
            default_rdma_max: Some(RdmaLimit::parse("hca_handle=4 hca_object=1000").unwrap()),
            ..POLICY
        };
        let forged = container(
            &[&format!(
                "ERDMA_RDMA_MAX={dev} hca_handle=max hca_object=max"
            )],
            &[],
        );
        let operators = format!("{dev} hca_handle=4 hca_object=1000");
        for version in [CgroupVersion::V2, CgroupVersion::V1] {
            let (w, n) = wanted_limits(&pod(None), &forged, &served, records, &policy);
            assert!(n.is_empty(), "{n:?}");
            assert_eq!(
                w.rdma_max.as_deref(),
                Some(operators.as_str()),
                "{version:?}"
            );
            assert_eq!(w.env_ignored.len(), 1);
        }
        let (a, _) = adjust_container_on(
            CgroupVersion::V2,
            &pod(None),
            &forged,
            &served,
            records,
            &policy,
        );
        assert_eq!(unified_rdma_max(&a), Some(operators.clone()));

        let (w, n) = wanted_limits(
            &pod(Some("hca_handle=2")),
            &forged,
            &served,
            records,
            &policy,
        );
        assert!(n.is_empty(), "lowering is no news: {n:?}");
        assert_eq!(
            w.rdma_max,
            Some(format!("{dev} hca_handle=2 hca_object=1000"))
        );

        let raise = pod(Some("hca_handle=max hca_object=5000"));
        let (w, n) = wanted_limits(&raise, &forged, &served, records, &policy);
        assert_eq!(w.rdma_max.as_deref(), Some(operators.as_str()));
        assert_eq!((n[0].kind, n[0].reason), ("Warning", "ErdmaRdmaMaxCapped"));
        assert!(
            n[0].message.contains("--nri-allow-annotation-raise"),
            "{}",
            n[0].message
        );
        let opted_in = Policy {
            allow_annotation_raise: true,
            ..policy
        };
        let (w, n) = wanted_limits(&raise, &forged, &served, records, &opted_in);
        assert!(n.is_empty(), "{n:?}");
        assert_eq!(
            w.rdma_max,
            Some(format!("{dev} hca_handle=max hca_object=5000"))
        );
    }

    /// `--nri-memlock` with a byte count bounds the container's RLIMIT_MEMLOCK (soft and hard),
    /// on every cgroup version; `off` leaves the runtime's.
    #[test]
    fn a_memlock_bound_is_the_containers_rlimit() {
        let (_t, served) = served();
        let dev = served.devices[0].name.clone();
        let h = holds(&[&dev]);
        let bounded = Policy {
            memlock: Memlock::parse("64G").unwrap(),
            ..POLICY
        };
        for version in [CgroupVersion::V2, CgroupVersion::V1, CgroupVersion::Hybrid] {
            let (a, _) = adjust_container_on(
                version,
                &pod(None),
                &container(&[], &[]),
                &served,
                Records::kubelet(Some(&h)),
                &bounded,
            );
            assert_eq!(
                a.rlimits,
                [api::PosixRlimit {
                    r#type: "RLIMIT_MEMLOCK".into(),
                    hard: 64 << 30,
                    soft: 64 << 30,
                }],
                "{version:?}"
            );
        }
    }

    /// runc refuses any `linux.resources.unified` key on cgroup v1 and hybrid hosts: there the
    /// adjustment carries memlock only, for a device-plugin container with a limit and a DRA
    /// container with its claim's hand-off alike; v2 keeps `rdma.max` in it.
    #[test]
    fn on_cgroup_v1_no_adjustment_carries_unified() {
        let (_t, served) = served();
        let dev = served.devices[0].name.clone();
        let h = holds(&[&dev]);
        let cp = prepared(&[("uid-a", "claim-a", &dev, 4)]);
        let claimed = uses(&[("claim-a", &dev)]);
        let annotated = pod(Some("hca_handle=2"));
        let plugin = Records::kubelet(Some(&h));
        let dra = Records {
            holders: Some(&claimed),
            claims: Some(&cp),
        };
        for records in [plugin, dra] {
            let c = container(&[], &[]);
            for version in [CgroupVersion::V1, CgroupVersion::Hybrid] {
                let (a, n) =
                    adjust_container_on(version, &annotated, &c, &served, records, &POLICY);
                assert!(n.is_empty(), "{n:?}");
                assert_eq!(a.linux, None, "{version:?}: {a:?}");
                assert_eq!(a.rlimits.len(), 1, "memlock on {version:?}");
            }
            let (a, _) =
                adjust_container_on(CgroupVersion::V2, &annotated, &c, &served, records, &POLICY);
            let line = unified_rdma_max(&a).unwrap_or_default();
            assert!(line.starts_with(&format!("{dev} hca_handle=2")), "{line}");
        }
    }

    /// The Synchronize repair on v1 makes no `unified` update (the runtime's UpdateContainer
    /// would fail in runc); the running container is listed for its v1 cgroup instead, and a
    /// missing memlock is still reported.
    #[test]
    fn on_cgroup_v1_the_synchronize_repair_makes_no_unified_update() {
        let (_t, served) = served();
        let dev = served.devices[0].name.clone();
        let h = holds(&[&dev]);
        let mut p = pod(Some("hca_handle=2"));
        p.id = "sb-1".into();
        let mut c = container(&[], &[]);
        c.id = "c-bare".into();
        c.pod_sandbox_id = "sb-1".into();
        c.state = api::ContainerState::ContainerRunning as i32;
        let pods = std::slice::from_ref(&p);
        let cs = std::slice::from_ref(&c);
        let limits = |_pid: u32| None;
        let v2 = repairs_on(
            CgroupVersion::V2,
            pods,
            cs,
            &served,
            Records::kubelet(Some(&h)),
            &POLICY,
            limits,
        );
        assert_eq!(v2.updates.len(), 1, "v2 repairs through unified");
        let v1 = repairs_on(
            CgroupVersion::V1,
            pods,
            cs,
            &served,
            Records::kubelet(Some(&h)),
            &POLICY,
            limits,
        );
        assert_eq!(v1.updates, Vec::new());
        let todo = v1_repairs(pods, cs, &served, Records::kubelet(Some(&h)), &POLICY);
        let listed: Vec<(&str, &str)> = todo
            .iter()
            .map(|(_, c, line)| (c.id.as_str(), line.as_str()))
            .collect();
        assert_eq!(listed, [("c-bare", format!("{dev} hca_handle=2").as_str())]);
        c.state = api::ContainerState::ContainerCreated as i32;
        assert!(
            v1_repairs(
                pods,
                std::slice::from_ref(&c),
                &served,
                Records::kubelet(Some(&h)),
                &POLICY
            )
            .is_empty()
        );
    }

    /// The v1 write: into the cgroup the runtime's path names; left alone when it already holds
    /// the limit (Synchronize); a refused write or a missing hierarchy is a skip with a Warning.
    #[test]
    fn the_v1_write_goes_to_the_containers_cgroup_or_says_why_not() {
        use erdma_host::fake::FixedCgroupFs;
        let layout = CgroupLayout {
            version: CgroupVersion::V1,
            rdma_hierarchy: true,
        };
        let p = pod(None);
        let mut c = container(&[], &[]);
        c.linux.as_mut().unwrap().cgroups_path =
            "kubepods-besteffort-pod12_ab.slice:cri-containerd:c0ffee".into();
        let cgroup = PathBuf::from(
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_ab.slice/cri-containerd-c0ffee.scope",
        );
        let fs = FixedCgroupFs::new(layout);
        fs.files.lock().unwrap().insert(
            cgroup.clone(),
            "erdma_0 hca_handle=2 hca_object=max\n".into(),
        );
        assert_eq!(
            write_v1_rdma_max(&fs, &p, &c, "erdma_0 hca_handle=2", true),
            Ok(V1Write::AlreadySet)
        );
        assert!(fs.writes().is_empty());
        assert_eq!(
            write_v1_rdma_max(&fs, &p, &c, "erdma_0 hca_handle=3", true),
            Ok(V1Write::Written)
        );
        assert_eq!(
            fs.writes(),
            [(cgroup.clone(), "erdma_0 hca_handle=3".to_string())]
        );

        let mut refusing = FixedCgroupFs::new(layout);
        refusing.fail_writes = Some(std::io::ErrorKind::PermissionDenied);
        let (reason, n) =
            write_v1_rdma_max(&refusing, &p, &c, "erdma_0 hca_handle=3", false).unwrap_err();
        assert_eq!(reason, LimitSkipped::WriteFailed);
        assert_eq!((n.kind, n.reason), ("Warning", "ErdmaRdmaLimitNotApplied"));
        assert!(n.message.contains("cgroup v1"), "{}", n.message);
        assert!(
            n.message.contains("container main of pod ns/p"),
            "{}",
            n.message
        );
        assert!(
            n.message.contains(&format!(
                "/sys/fs/cgroup/rdma/{}/rdma.max",
                cgroup.display()
            )),
            "{}",
            n.message
        );

        let bare = FixedCgroupFs::new(CgroupLayout {
            version: CgroupVersion::V1,
            rdma_hierarchy: false,
        });
        let (reason, n) =
            write_v1_rdma_max(&bare, &p, &c, "erdma_0 hca_handle=3", false).unwrap_err();
        assert_eq!(reason, LimitSkipped::NoRdmaHierarchy);
        assert!(
            n.message.contains("move the node to cgroup v2"),
            "{}",
            n.message
        );
        assert!(bare.writes().is_empty());
    }

    #[test]
    fn a_bad_annotation_or_two_devices_apply_no_limit_and_say_why() {
        let (_t, served) = served();
        let dev = served.devices[0].name.clone();
        let c = container(&[], &[]);
        let h = holds(&[&dev]);
        let (a, n) = adjust_container_on(
            CgroupVersion::V2,
            &pod(Some("hca_handle=lots")),
            &c,
            &served,
            Records::kubelet(Some(&h)),
            &POLICY,
        );
        assert!(
            a.linux.is_none(),
            "nothing applied rather than something wrong"
        );
        assert_eq!(a.rlimits.len(), 1, "memlock still applies");
        assert_eq!(n[0].reason, "ErdmaRdmaMaxInvalid");
        assert!(
            n[0].message.contains("\"lots\" is neither a count nor max"),
            "{}",
            n[0].message
        );
        assert!(n[0].message.contains("ns/p"), "{}", n[0].message);
        // a bad annotation never takes the operator's limit away
        let policy = Policy {
            default_rdma_max: Some(RdmaLimit::parse("hca_handle=4").unwrap()),
            ..POLICY
        };
        let (a, n) = adjust_container_on(
            CgroupVersion::V2,
            &pod(Some("hca_handle=lots")),
            &c,
            &served,
            Records::kubelet(Some(&h)),
            &policy,
        );
        assert_eq!(unified_rdma_max(&a), Some(format!("{dev} hca_handle=4")));
        assert_eq!(n[0].reason, "ErdmaRdmaMaxInvalid");
        let both: Vec<&str> = served.devices.iter().map(|d| d.name.as_str()).collect();
        let h = holds(&both);
        let (a, n) = adjust_container_on(
            CgroupVersion::V2,
            &pod(Some("hca_handle=2")),
            &c,
            &served,
            Records::kubelet(Some(&h)),
            &POLICY,
        );
        assert!(a.linux.is_none());
        assert_eq!(n[0].reason, "ErdmaRdmaMaxNotApplied");
    }
}
