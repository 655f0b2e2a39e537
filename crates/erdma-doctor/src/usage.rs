//! `pod.rdma_usage`: is a pod that holds eRDMA devices using them? The node agent's `/usage`
//! (the kernel's RDMA objects per pod) says whether the pod holds queue pairs; when it holds none
//! and its NCCL log says NCCL fell back to sockets, the check fails naming the cause the log and
//! the usage show.
//!
//! The log lines matched, and where they come from:
//!
//! - [`NO_LIBIBVERBS`]: NCCL `src/misc/ibvsymbols.cc`, `INFO(NCCL_INIT, "Failed to open
//!   libibverbs.so[.1]")` when neither `libibverbs.so` nor `libibverbs.so.1` loads.
//! - [`NO_PROVIDER`], [`PROVIDER_NOT_LOADED`]: rdma-core `libibverbs/init.c` ("Warning: no
//!   userspace device-specific driver found for %s", printed with `IBV_SHOW_WARNINGS`) and
//!   `libibverbs/dynamic_driver.c` ("Warning: couldn't load driver '%s': %s").
//! - [`MEMLOCK_LOW`]: rdma-core `libibverbs/init.c` `check_memlock_limit` ("Warning:
//!   RLIMIT_MEMLOCK is %llu bytes.\n    This will severely limit memory registrations.", for a
//!   non-root process with at most 32 KiB); [`REG_MR_FAILED`]: NCCL `src/misc/ibvwrap.cc`
//!   (`WARN("Call to ibv_reg_mr failed with error %s", strerror(errno))`, `Cannot allocate
//!   memory` when the locked-memory limit is hit).
//! - [`IB_NO_DEVICE`]: NCCL `src/transport/net_ib.cc`, `INFO(NCCL_INIT|NCCL_NET, "NET/IB : No
//!   device found.")`: libibverbs listed no device NCCL_IB_HCA lets through.
//! - [`SOCKET_FALLBACK`]: NCCL `src/init.cc` `"Using network %s"` with `Socket`, and
//!   `src/transport/net_socket.cc` `"NET/Socket : Using …"`.
//! - NCCL_IB_HCA as NCCL reads it (`src/transport/net_ib.cc`, `parseStringList`/`matchIfList`):
//!   a comma-separated list of `name[:port]`, a leading `^` excludes the listed devices, a leading
//!   `=` asks for exact names (else a name is a prefix).

use crate::check::Check;

/// NCCL could not load libibverbs.
pub const NO_LIBIBVERBS: &str = "Failed to open libibverbs.so";
/// libibverbs found no provider for a device.
pub const NO_PROVIDER: &str = "no userspace device-specific driver found";
/// libibverbs found a provider but could not load it.
pub const PROVIDER_NOT_LOADED: &str = "couldn't load driver";
/// libibverbs warns about a low locked-memory limit.
pub const MEMLOCK_LOW: &str = "RLIMIT_MEMLOCK is";
/// A memory registration failed.
pub const REG_MR_FAILED: &str = "Call to ibv_reg_mr failed";
/// NCCL's IB transport found no device.
pub const IB_NO_DEVICE: &str = "NET/IB : No device found";
/// NCCL uses its socket transport.
pub const SOCKET_FALLBACK: &[&str] = &["Using network Socket", "NET/Socket : Using"];

/// The check's id.
pub const ID: &str = "pod.rdma_usage";

/// What the node's agent reports of one pod (its `/usage` entry).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodUsageView {
    /// Devices the kubelet allocated to the pod, as the agent sees them.
    pub allocated: Vec<String>,
    /// Queue pairs on all devices.
    pub qps: u64,
    /// Queue pairs in RTS (ready to send).
    pub qps_rts: u64,
    /// Bytes registered in memory regions.
    pub mr_bytes: u64,
    /// Any RDMA object (QP, MR, CQ, PD) of the pod.
    pub objects: bool,
    /// Containers of the pod seen owning RDMA objects.
    pub containers_seen: usize,
}

/// What the check judges.
#[derive(Debug, Clone)]
pub struct Evidence<'a> {
    /// `namespace/name`.
    pub pod: &'a str,
    /// The pod's node.
    pub node: &'a str,
    /// How the pod holds eRDMA (`aliyun/erdma=1`, `claim rdma (erdma-0)`).
    pub held: &'a str,
    /// The agent's report of the pod (`None`: the agent lists no usage or allocation of it), or
    /// why it could not be read.
    pub usage: Result<Option<PodUsageView>, String>,
    /// The eRDMA container's log (its tail), or why it could not be read.
    pub log: Result<&'a str, String>,
    /// `NCCL_IB_HCA` of the container (its spec's env; else as the NCCL log reports it).
    pub ib_hca: Option<&'a str>,
}

/// Why a pod that holds eRDMA fell back to sockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// The image has no libibverbs.
    NoLibibverbs,
    /// libibverbs has no (loadable) provider for erdma.
    NoProvider,
    /// The locked-memory limit stops memory registration.
    Memlock,
    /// NCCL_IB_HCA lets none of the allocated devices through.
    HcaMismatch {
        /// The variable's value.
        hca: String,
        /// The devices allocated.
        allocated: Vec<String>,
    },
    /// Devices were allocated but none reached the container.
    NotMounted {
        /// The devices allocated.
        allocated: Vec<String>,
    },
    /// None of the above shows.
    Unknown,
}

impl Cause {
    /// The verdict's cause and its fix.
    pub fn explain(&self) -> (String, String) {
        match self {
            Cause::NoLibibverbs => (
                "the image has no libibverbs (NCCL: \"Failed to open libibverbs.so[.1]\")".into(),
                "install the RDMA user-space libraries in the image (Debian/Ubuntu: libibverbs1 ibverbs-providers; RHEL/Alibaba Cloud Linux: libibverbs rdma-core), or mount them from the host".into(),
            ),
            Cause::NoProvider => (
                "libibverbs in the image has no provider for erdma (libibverbs: no userspace device-specific driver / couldn't load driver)".into(),
                "install an rdma-core (ibverbs-providers) with the erdma provider (liberdma, rdma-core 45+ or Alibaba Cloud's package) in the image".into(),
            ),
            Cause::Memlock => (
                "the locked-memory limit is too low to register memory (libibverbs: RLIMIT_MEMLOCK warning / NCCL: Call to ibv_reg_mr failed)".into(),
                "the agent's NRI plugin raises memlock for containers holding aliyun/erdma: check it is on (erdmactl doctor --node, check nri) and that containerd has NRI enabled; else give the container IPC_LOCK or ulimit -l unlimited".into(),
            ),
            Cause::HcaMismatch { hca, allocated } => (
                format!(
                    "NCCL_IB_HCA={hca} matches none of the devices allocated to the pod ({})",
                    allocated.join(", ")
                ),
                format!(
                    "unset NCCL_IB_HCA or set it to the allocated devices (NCCL_IB_HCA={}); device names differ per node, so prefer a prefix such as erdma",
                    allocated.join(",")
                ),
            ),
            Cause::NotMounted { allocated } => (
                format!(
                    "{} allocated to the pod, but no process of it opened an RDMA device and NCCL found none (NET/IB : No device found): /dev/infiniband is not in the container",
                    allocated.join(", ")
                ),
                "the device plugin's Allocate (or the DRA driver's CDI spec) did not reach the container: check the agent's log for the pod, that the runtime applies CDI (containerd enable_cdi) and the container's /dev/infiniband (kubectl exec … ls /dev/infiniband). If the device nodes are there, the image's libibverbs lacks the erdma provider instead: it skips such devices silently unless IBV_SHOW_WARNINGS=1 is set (then it names them)".into(),
            ),
            Cause::Unknown => (
                "the log and the usage show no cause".into(),
                "run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET and erdmactl nccl analyze on its log".into(),
            ),
        }
    }
}

/// Whether the log says NCCL uses its socket transport.
pub fn fell_back(log: &str) -> bool {
    SOCKET_FALLBACK.iter().any(|s| log.contains(s))
}

/// `NCCL_IB_HCA` as the NCCL log reports it (`NCCL_IB_HCA set by environment to X`).
pub fn ib_hca_from_log(log: &str) -> Option<&str> {
    log.lines().rev().find_map(|l| {
        let (_, rest) = l.split_once("NCCL_IB_HCA set by environment to ")?;
        Some(rest.trim().trim_end_matches('.'))
    })
}

/// Whether NCCL_IB_HCA `hca` lets `device` through.
pub fn hca_allows(hca: &str, device: &str) -> bool {
    let hca = hca.trim();
    let (exclude, rest) = match hca.strip_prefix('^') {
        Some(r) => (true, r),
        None => (false, hca),
    };
    let (exact, rest) = match rest.strip_prefix('=') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let listed = rest
        .split(',')
        .map(|e| e.split(':').next().unwrap_or("").trim())
        .filter(|e| !e.is_empty())
        .any(|name| {
            if exact {
                device == name
            } else {
                device.starts_with(name)
            }
        });
    listed != exclude
}

/// The cause the log and the usage show.
pub fn cause(log: &str, usage: &PodUsageView, ib_hca: Option<&str>) -> Cause {
    if log.contains(NO_LIBIBVERBS) {
        return Cause::NoLibibverbs;
    }
    if log.contains(NO_PROVIDER) || log.contains(PROVIDER_NOT_LOADED) {
        return Cause::NoProvider;
    }
    if log.contains(MEMLOCK_LOW) || log.contains(REG_MR_FAILED) {
        return Cause::Memlock;
    }
    if let Some(hca) = ib_hca.filter(|h| !h.trim().is_empty())
        && !usage.allocated.is_empty()
        && !usage.allocated.iter().any(|d| hca_allows(hca, d))
    {
        return Cause::HcaMismatch {
            hca: hca.to_string(),
            allocated: usage.allocated.clone(),
        };
    }
    if log.contains(IB_NO_DEVICE)
        && !usage.allocated.is_empty()
        && !usage.objects
        && usage.containers_seen == 0
    {
        return Cause::NotMounted {
            allocated: usage.allocated.clone(),
        };
    }
    Cause::Unknown
}

fn size(bytes: u64) -> String {
    if bytes < 1 << 20 {
        // a small registration (one page of a ping-pong) would read "0.0 MiB"
        return format!("{:.1} KiB", bytes as f64 / 1024.0);
    }
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// `pod.rdma_usage`.
pub fn check(e: &Evidence<'_>) -> Check {
    let (pod, node) = (e.pod, e.node);
    let usage = match &e.usage {
        Ok(u) => u.clone().unwrap_or_default(),
        Err(reason) => {
            return Check::warn(
                ID,
                format!(
                    "cannot read the RDMA usage of {pod} from the agent on node {node}: {reason}"
                ),
                "the agent serves /usage on its metrics port (erdma-agent with usage collection on); doctor reads it through the API server's pod proxy: allow get on pods/proxy to your user",
            );
        }
    };
    if usage.qps > 0 {
        return Check::pass(
            ID,
            format!(
                "the agent on node {node} sees {pod} hold {} QPs ({} in RTS) and {} of registered memory{}",
                usage.qps,
                usage.qps_rts,
                size(usage.mr_bytes),
                if usage.allocated.is_empty() {
                    String::new()
                } else {
                    format!(" on {}", usage.allocated.join(", "))
                }
            ),
        );
    }
    let log = match &e.log {
        Ok(l) => *l,
        Err(reason) => {
            return Check::info(
                ID,
                format!(
                    "{pod} holds eRDMA ({}) but the agent on node {node} sees no QP of it; its log could not be read ({reason})",
                    e.held
                ),
                "without the NCCL log doctor cannot tell a job that has not started communicating from one that fell back to sockets: run with NCCL_DEBUG=INFO and check again",
            );
        }
    };
    if !fell_back(log) {
        return Check::info(
            ID,
            format!(
                "{pod} holds eRDMA ({}) but the agent on node {node} sees no QP of it; its log shows no NCCL socket fallback",
                e.held
            ),
            "a job that has not started communicating holds no QP yet: check again while it runs (erdmactl top pods), with NCCL_DEBUG=INFO in the pod",
        );
    }
    let hca = e.ib_hca.or_else(|| ib_hca_from_log(log));
    let (why, fix) = cause(log, &usage, hca).explain();
    Check::fail(
        ID,
        format!(
            "{pod} holds eRDMA ({}) but the agent on node {node} sees no QP of it and NCCL fell back to sockets: {why}",
            e.held
        ),
        fix,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Status;

    const FALLBACK: &str = "host:1:9 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>\nhost:1:9 [0] NCCL INFO Using network Socket\n";

    fn allocated(objects: bool, containers: usize) -> PodUsageView {
        PodUsageView {
            allocated: vec!["erdma_0".into()],
            objects,
            containers_seen: containers,
            ..Default::default()
        }
    }

    fn verdict(log: &str, usage: PodUsageView, hca: Option<&str>) -> Check {
        check(&Evidence {
            pod: "ml/trainer-0",
            node: "node-a",
            held: "aliyun/erdma=1",
            usage: Ok(Some(usage)),
            log: Ok(log),
            ib_hca: hca,
        })
    }

    /// One row per cause: the log's lines and the usage give the verdict's text.
    #[test]
    fn each_cause_from_a_log_snippet_and_the_usage() {
        let rows: &[(&str, PodUsageView, Option<&str>, &str)] = &[
            (
                "host:1:9 [0] NCCL INFO Failed to open libibverbs.so[.1]\n",
                allocated(false, 0),
                None,
                "the image has no libibverbs",
            ),
            (
                "libibverbs: Warning: no userspace device-specific driver found for /sys/class/infiniband_verbs/uverbs0\nhost:1:9 [0] NCCL INFO NET/IB : No device found.\n",
                allocated(false, 0),
                None,
                "libibverbs in the image has no provider for erdma",
            ),
            (
                "libibverbs: Warning: couldn't load driver 'liberdma-rdmav34.so': cannot open shared object file\n",
                allocated(false, 0),
                None,
                "libibverbs in the image has no provider for erdma",
            ),
            (
                "libibverbs: Warning: RLIMIT_MEMLOCK is 8192 bytes.\n    This will severely limit memory registrations.\n",
                allocated(true, 1),
                None,
                "the locked-memory limit is too low",
            ),
            (
                "host:1:9 [0] NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory\n",
                allocated(true, 1),
                None,
                "the locked-memory limit is too low",
            ),
            (
                "host:1:9 [0] NCCL INFO NET/IB : No device found.\n",
                allocated(false, 0),
                Some("mlx5"),
                "NCCL_IB_HCA=mlx5 matches none of the devices allocated to the pod (erdma_0)",
            ),
            (
                "host:1:9 [0] NCCL INFO NCCL_IB_HCA set by environment to =erdma_1\nhost:1:9 [0] NCCL INFO NET/IB : No device found.\n",
                allocated(false, 0),
                None,
                "NCCL_IB_HCA==erdma_1 matches none of the devices allocated to the pod (erdma_0)",
            ),
            (
                "host:1:9 [0] NCCL INFO NET/IB : No device found.\n",
                allocated(false, 0),
                Some("erdma"),
                "erdma_0 allocated to the pod, but no process of it opened an RDMA device and NCCL found none (NET/IB : No device found): /dev/infiniband is not in the container",
            ),
            (
                "",
                allocated(true, 1),
                None,
                "the log and the usage show no cause",
            ),
        ];
        for (log, usage, hca, want) in rows {
            let log = format!("{log}{FALLBACK}");
            let c = verdict(&log, usage.clone(), *hca);
            assert_eq!(c.status, Status::Fail, "{log}");
            assert!(
                c.message.starts_with(
                    "ml/trainer-0 holds eRDMA (aliyun/erdma=1) but the agent on node node-a sees no QP of it and NCCL fell back to sockets: "
                ),
                "{}",
                c.message
            );
            assert!(c.message.contains(want), "{log:?}: {}", c.message);
        }
    }

    #[test]
    fn qps_pass_and_no_fallback_is_information() {
        let busy = PodUsageView {
            allocated: vec!["erdma_0".into()],
            qps: 3,
            qps_rts: 2,
            mr_bytes: 3 << 20,
            objects: true,
            containers_seen: 1,
        };
        let c = verdict(FALLBACK, busy, None);
        assert_eq!(c.status, Status::Pass);
        assert_eq!(
            c.message,
            "the agent on node node-a sees ml/trainer-0 hold 3 QPs (2 in RTS) and 3.0 MiB of registered memory on erdma_0"
        );
        let c = verdict("NCCL INFO Using network IB\n", allocated(false, 0), None);
        assert_eq!(c.status, Status::Info);
        let unread = check(&Evidence {
            pod: "ml/trainer-0",
            node: "node-a",
            held: "aliyun/erdma=1",
            usage: Err("connection refused".into()),
            log: Ok(FALLBACK),
            ib_hca: None,
        });
        assert_eq!(unread.status, Status::Warn);
        assert!(unread.message.contains("connection refused"));
    }

    #[test]
    fn nccl_ib_hca_as_nccl_matches_it() {
        assert!(hca_allows("erdma", "erdma_0"));
        assert!(hca_allows("erdma_0:1,erdma_1:1", "erdma_1"));
        assert!(!hca_allows("=erdma", "erdma_0"));
        assert!(hca_allows("=erdma_0", "erdma_0"));
        assert!(!hca_allows("^erdma", "erdma_0"));
        assert!(hca_allows("^mlx5", "erdma_0"));
        assert!(!hca_allows("^=erdma_0", "erdma_0"));
    }

    #[test]
    fn registered_memory_reads_in_kib_below_a_mib() {
        assert_eq!(size(4096), "4.0 KiB");
        assert_eq!(size((1 << 20) - 512), "1023.5 KiB");
        assert_eq!(size(1 << 20), "1.0 MiB");
        assert_eq!(size(3 << 20), "3.0 MiB");
    }
}
