//! Known NCCL / PyTorch failure signatures with their meaning and fix (`nccl-and-arena.md` §A3).

use serde::Serialize;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Explains a choice NCCL made (for example a fallback) but did not stop the job by itself.
    Info,
    /// Degrades or endangers the job.
    Warning,
    /// Stops the job.
    Error,
}

/// A recognised problem. The serialised names are stable identifiers for `-o json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// `Failed to initialize any NET plugin`.
    NetPluginInitFailed,
    /// `NET/IB : No device found.`
    IbNoDevice,
    /// `NET/IB : Unable to open device` / `Unable to query device|port`.
    IbDeviceUnusable,
    /// `NET/IB : No IP interface found.`
    IbNoIpInterface,
    /// `Bootstrap : no socket interface found` / `NET/Socket : No usable listening interface found`.
    SocketNoInterface,
    /// `Call to ibv_reg_mr failed`.
    IbRegMrFailed,
    /// `Call to ibv_modify_qp failed`.
    IbModifyQpFailed,
    /// Another failed verbs call.
    IbVerbsCallFailed,
    /// `NET/IB: Got completion from peer ... with status=...` / `with error`.
    IbCompletionError,
    /// `async fatal event` / `GID table changed`.
    IbAsyncEvent,
    /// `Attempted to connect incompatible devices`.
    IbIncompatibleDevices,
    /// PyTorch `Watchdog caught collective operation timeout`.
    CollectiveTimeout,
    /// Socket connect timeouts / refusals reported as WARN.
    ConnectTimeout,
    /// `Connection closed by remote peer` / `remote process exited`.
    PeerConnectionClosed,
    /// `Duplicate GPU detected`.
    DuplicateGpu,
    /// `Cuda failure ...`.
    CudaFailure,
    /// PyTorch `NCCL error in: ...` (DistBackendError).
    NcclErrorReported,
    /// A WARN line none of the above matches.
    OtherWarning,
}

/// Human explanation of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Explanation {
    /// Short title.
    pub title: &'static str,
    /// What it means.
    pub meaning: &'static str,
    /// What to do.
    pub fix: &'static str,
}

impl ErrorKind {
    /// Severity of the kind.
    pub fn severity(self) -> Severity {
        match self {
            ErrorKind::IbNoDevice => Severity::Info,
            ErrorKind::OtherWarning | ErrorKind::IbAsyncEvent => Severity::Warning,
            _ => Severity::Error,
        }
    }

    /// True for kinds that are only an error when NCCL reports them at WARN level (NCCL logs
    /// connection retries at INFO level while peers start).
    pub fn requires_warn_level(self) -> bool {
        matches!(
            self,
            ErrorKind::ConnectTimeout | ErrorKind::PeerConnectionClosed
        )
    }

    /// True for kinds that only report the effect of an earlier error (PyTorch's wrapper, a peer
    /// that went away, a timeout); the root cause is listed before them.
    pub fn is_consequence(self) -> bool {
        matches!(
            self,
            ErrorKind::NcclErrorReported
                | ErrorKind::PeerConnectionClosed
                | ErrorKind::CollectiveTimeout
        )
    }

    /// Meaning and fix.
    pub fn explain(self) -> Explanation {
        match self {
            ErrorKind::NetPluginInitFailed => Explanation {
                title: "no usable NCCL network",
                meaning: "NCCL could not initialise any network transport; with NCCL_NET=IB (or a plugin) forced, a \
                          missing or unusable RDMA device ends here and PyTorch reports ncclInvalidUsage",
                fix: "give the pod an RDMA device (resources: aliyun/erdma: 1), make sure the image has the RDMA \
                      user-space libraries (libibverbs1, ibverbs-providers with the erdma provider), check the port \
                      is ACTIVE (ibv_devinfo), or unset NCCL_NET to allow the socket fallback",
            },
            ErrorKind::IbNoDevice => Explanation {
                title: "NET/IB found no device",
                meaning: "no RDMA port with link layer IB or Ethernet was usable: no /dev/infiniband/uverbs* in the \
                          container, port DOWN, NCCL_IB_HCA not matching, or the provider library missing",
                fix: "request aliyun/erdma in the pod, install the eRDMA user-space provider in the image, check \
                      NCCL_IB_HCA (e.g. erdma_0) and `erdmactl doctor --pod`",
            },
            ErrorKind::IbDeviceUnusable => Explanation {
                title: "RDMA device visible but cannot be opened",
                meaning: "uverbs is present but ibv_open_device/ibv_query_* failed: permissions or a provider/ABI \
                          mismatch between the image's rdma-core and the host driver",
                fix: "use the eRDMA apt repository's rdma-core packages in the image and check the device node \
                      permissions",
            },
            ErrorKind::IbNoIpInterface => Explanation {
                title: "no out-of-band interface for NET/IB",
                meaning: "the interface named by NCCL_SOCKET_IFNAME does not exist",
                fix: "set NCCL_SOCKET_IFNAME=eth0 (the pod interface)",
            },
            ErrorKind::SocketNoInterface => Explanation {
                title: "no socket interface",
                meaning: "NCCL_SOCKET_IFNAME matches no interface, so bootstrap (and the socket transport) cannot \
                          start",
                fix: "set NCCL_SOCKET_IFNAME to an existing interface (eth0 in pods)",
            },
            ErrorKind::IbRegMrFailed => Explanation {
                title: "memory registration failed",
                meaning: "ibv_reg_mr failed, usually because of the locked-memory limit",
                fix: "add the IPC_LOCK capability to the container or raise memlock (ulimit -l unlimited); for GPU \
                      buffers load nvidia_peermem",
            },
            ErrorKind::IbModifyQpFailed => Explanation {
                title: "queue pair setup failed",
                meaning: "ibv_modify_qp rejected the attributes: on eRDMA a wrong GID index or address \
                          family (eRDMA's driver does not pass NCCL_IB_TIMEOUT/NCCL_IB_RETRY_CNT to the device, so \
                          Alibaba Cloud's advised 23/10 is harmless there); on InfiniBand NICs also an \
                          out-of-range value such as NCCL_IB_RETRY_CNT > 7",
                fix: "use NCCL_IB_GID_INDEX=-1 (auto, NCCL >= 2.21.5) with NCCL_IB_ADDR_FAMILY=AF_INET and \
                      NCCL_IB_ADDR_RANGE=<ERI subnet>; on older NCCL set the IPv4 RoCEv2 GID index explicitly; \
                      eRDMA must be in RoCE (compat/ofed) mode; on non-eRDMA NICs keep NCCL_IB_RETRY_CNT within 0-7",
            },
            ErrorKind::IbVerbsCallFailed => Explanation {
                title: "verbs call failed",
                meaning: "an ibv_* call failed while setting up the RDMA transport",
                fix: "check the device state (ibv_devinfo) and the user-space provider version",
            },
            ErrorKind::IbCompletionError => Explanation {
                title: "RDMA work completion error",
                meaning: "a send or receive completed with an error; `transport retry counter exceeded` (12) means \
                          the path or the peer is gone",
                fix: "check that the peer process is alive and both ERIs are up and in the same VPC/security group; \
                      on eRDMA, NCCL_IB_TIMEOUT/NCCL_IB_RETRY_CNT (Alibaba Cloud advises 23/10) do not reach the \
                      hardware in the driver sources read (upstream, out-of-tree r0.2.37): eRDMA retransmits \
                      itself, so look at the path, not at these values",
            },
            ErrorKind::IbAsyncEvent => Explanation {
                title: "RDMA device event",
                meaning: "the device reported a fatal async event or its GID table changed (device reset, ERI IP \
                          changed while running)",
                fix: "check the node's eRDMA driver and ERI state (erdma-agent health) and restart the job",
            },
            ErrorKind::IbIncompatibleDevices => Explanation {
                title: "incompatible RDMA devices",
                meaning: "ranks use different link layers (IB vs RoCE)",
                fix: "put all ranks on eRDMA in RoCE (compat/ofed) mode, or restrict NCCL_IB_HCA to erdma_*",
            },
            ErrorKind::CollectiveTimeout => Explanation {
                title: "collective timed out",
                meaning: "a collective did not finish within the process-group timeout (PyTorch default 10 min): a \
                          peer hung, crashed or cannot reach this rank",
                fix: "find the first rank that failed (its log has the root cause), check the network path; raise \
                      the timeout only for known slow steps",
            },
            ErrorKind::ConnectTimeout => Explanation {
                title: "connection failed or timed out",
                meaning: "a socket connection to a peer (bootstrap or NET/Socket) was refused or timed out",
                fix: "check that all ranks started, MASTER_ADDR/port reachability, and NCCL_SOCKET_IFNAME",
            },
            ErrorKind::PeerConnectionClosed => Explanation {
                title: "peer closed the connection",
                meaning: "a remote rank exited or dropped its connection; this rank is a victim",
                fix: "look at the other ranks' logs for the first error",
            },
            ErrorKind::DuplicateGpu => Explanation {
                title: "two ranks on one GPU",
                meaning: "two ranks of one communicator use the same CUDA device, which NCCL refuses",
                fix: "give each rank its own GPU (torch.cuda.set_device(LOCAL_RANK)) and request as many GPUs as \
                      processes per pod",
            },
            ErrorKind::CudaFailure => Explanation {
                title: "CUDA failure",
                meaning: "a CUDA call inside NCCL failed",
                fix: "check the CUDA error text (out of memory, driver mismatch) and the GPU state (nvidia-smi)",
            },
            ErrorKind::NcclErrorReported => Explanation {
                title: "PyTorch reported an NCCL error",
                meaning: "a collective returned an NCCL error to PyTorch (DistBackendError)",
                fix: "see the NCCL WARN lines before it; run with NCCL_DEBUG=INFO for details",
            },
            ErrorKind::OtherWarning => Explanation {
                title: "NCCL warning",
                meaning: "an NCCL WARN line that erdmactl does not classify",
                fix: "read the message; search the NCCL troubleshooting guide",
            },
        }
    }
}

/// Name of an NCCL result code (`ncclResult_t`).
pub fn result_name(code: u32) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "unknown",
    }
}

/// Recognises problems in lines that are not NCCL lines (PyTorch / launcher output), with
/// precompiled substring searches (these lines can be most of a log).
#[derive(Debug)]
pub struct ForeignMatcher {
    patterns: Vec<(memchr::memmem::Finder<'static>, ErrorKind)>,
    version: memchr::memmem::Finder<'static>,
}

impl Default for ForeignMatcher {
    fn default() -> Self {
        let p = |s: &'static str, k| (memchr::memmem::Finder::new(s), k);
        Self {
            patterns: vec![
                p(
                    "Watchdog caught collective operation timeout",
                    ErrorKind::CollectiveTimeout,
                ),
                p("NCCL error in:", ErrorKind::NcclErrorReported),
                p("Duplicate GPU detected", ErrorKind::DuplicateGpu),
                p(
                    "Failed to initialize any NET plugin",
                    ErrorKind::NetPluginInitFailed,
                ),
            ],
            version: memchr::memmem::Finder::new("NCCL version "),
        }
    }
}

impl ForeignMatcher {
    /// The problem `line` reports, if any.
    pub fn classify(&self, line: &str) -> Option<ErrorKind> {
        let b = line.as_bytes();
        self.patterns
            .iter()
            .find(|(f, _)| f.find(b).is_some())
            .map(|(_, k)| *k)
    }

    /// Whether a non-NCCL line can say anything: it holds one of the patterns or `NCCL version `
    /// (all ASCII, so the raw bytes hold one exactly when the lossy text does). Every pattern
    /// begins with `N`, `W`, `D` or `F`: only where those bytes are is a pattern compared, and
    /// they are found 16 bytes at a time ([`crate::scan::any_of4`]) instead of one substring
    /// search per pattern.
    pub fn may_match(&self, line: &[u8]) -> bool {
        crate::scan::any_of4(line, *b"NWDF", |i| {
            let rest = &line[i..];
            let starts = |n: &[u8]| n.first() == rest.first() && rest.starts_with(n);
            starts(self.version.needle()) || self.patterns.iter().any(|(f, _)| starts(f.needle()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The modify-QP advice agrees with doctor's `pod.nccl_retry` and docs/training.md: on eRDMA
    /// the advised NCCL_IB_RETRY_CNT=10 changes nothing, so it is not the fix there (before: "drop
    /// out-of-range NCCL_IB_* values" such as RETRY_CNT > 7, contradicting the vendor's 10).
    #[test]
    fn modify_qp_advice_does_not_tell_erdma_users_to_drop_the_advised_retry_count() {
        let e = ErrorKind::IbModifyQpFailed.explain();
        assert!(e.meaning.contains("harmless there"), "{}", e.meaning);
        assert!(!e.fix.contains("drop out-of-range"), "{}", e.fix);
        assert!(
            e.fix
                .contains("on non-eRDMA NICs keep NCCL_IB_RETRY_CNT within 0-7"),
            "{}",
            e.fix
        );
    }

    /// What `may_match` must answer: one substring search per pattern.
    fn reference(m: &ForeignMatcher, line: &[u8]) -> bool {
        m.version.find(line).is_some() || m.patterns.iter().any(|(f, _)| f.find(line).is_some())
    }

    #[test]
    fn every_pattern_starts_with_a_byte_that_may_match_looks_at() {
        let m = ForeignMatcher::default();
        for (f, _) in &m.patterns {
            assert!(
                matches!(f.needle().first(), Some(b'N' | b'W' | b'D' | b'F')),
                "{:?}",
                String::from_utf8_lossy(f.needle())
            );
            assert!(m.may_match(f.needle()));
        }
        assert!(m.may_match(b"  NCCL version 2.18.5+cuda12.2"));
        assert!(!m.may_match(b"  File \"/opt/torch/api.py\", line 170, in __call__"));
    }

    proptest::proptest! {
        #[test]
        fn may_match_equals_substring_search(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                "NCCL version ", "NCCL version", "NCCL error in:", "NCCL error", "Watchdog caught collective operation timeout",
                "Watchdog", "Duplicate GPU detected", "Duplicate", "Failed to initialize any NET plugin",
                "Failed to initialize", "N", "W", "D", "F", " ", "x", "é",
            ]), 0..10),
        ) {
            let m = ForeignMatcher::default();
            let line = pieces.concat();
            proptest::prop_assert_eq!(m.may_match(line.as_bytes()), reference(&m, line.as_bytes()));
        }
    }
}
