//! What the analyser keeps while it reads: per process (`host:pid`) and per input file. Filled
//! by [`crate::model`], read by [`crate::report`].

use crate::diagnose::ErrorKind;
use crate::perf::{PerfCollector, PerfSummary};
use std::collections::{BTreeMap, BTreeSet};

/// First occurrence and count of one problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProblemSeen {
    /// Occurrences.
    pub count: u64,
    /// Index of the file of the first occurrence.
    pub file: usize,
    /// Line number (1-based) of the first occurrence.
    pub line: u64,
    /// The first message (bounded).
    pub message: String,
}

/// Per-transport connection counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransportCount {
    /// Channel connection lines.
    pub connections: u64,
    /// Of which with `/GDRDMA`.
    pub gdr: u64,
    /// NCCL net device indexes used (NET only).
    pub net_devs: BTreeSet<u32>,
}

/// What one process (`host:pid`) said.
#[derive(Debug, Clone, Default)]
pub struct Process {
    /// `host:pid`.
    pub key: String,
    /// Which run of `host:pid` this is (0 the first): NCCL prints its version banner once per
    /// process, so a second banner of the same `host:pid` (another run's log, a restart that
    /// reused the pid) starts a new process, never one job with the first.
    pub incarnation: u32,
    /// Host name.
    pub host: String,
    /// Files the process was seen in.
    pub files: BTreeSet<usize>,
    /// NCCL versions.
    pub versions: BTreeSet<String>,
    /// IB devices `(index, name, port, link layer)`.
    pub ib_devices: BTreeSet<(u32, String, u32, String)>,
    /// OOB interfaces of NET/IB.
    pub ib_oob: BTreeSet<String>,
    /// `[RO]` shown.
    pub relaxed_ordering: bool,
    /// Socket interfaces of NET/Socket.
    pub socket_ifaces: BTreeSet<String>,
    /// `Using network X`.
    pub networks: BTreeSet<String>,
    /// Plugins initialised / assigned.
    pub plugins_ready: BTreeSet<String>,
    /// Plugins that failed to initialise.
    pub plugins_failed: BTreeSet<String>,
    /// Ranks held in communicators.
    pub ranks: BTreeSet<u32>,
    /// Largest communicator size.
    pub nranks: Option<u32>,
    /// Largest `nNodes`.
    pub nnodes: Option<u32>,
    /// Communicator ids.
    pub comm_ids: BTreeSet<u64>,
    /// Some communicator reached `Init COMPLETE`.
    pub init_complete: bool,
    /// Channel connections by transport label (`NET/IB`, `P2P/CUMEM`, `SHM/direct`).
    pub transports: BTreeMap<String, TransportCount>,
    /// GPU Direct RDMA decisions: `(net, hca) -> enabled`.
    pub gdr_decisions: BTreeMap<(String, String), bool>,
    /// `NCCL_*` variables reported as set.
    pub env: BTreeMap<String, String>,
    /// GID indexes seen on QP connect lines.
    pub gids_in_use: BTreeSet<i64>,
    /// First NCCL error code returned up the stack.
    pub first_result_code: Option<u32>,
    /// Problems found.
    pub problems: BTreeMap<ErrorKind, ProblemSeen>,
}

/// State of one input file.
#[derive(Debug)]
pub struct FileState {
    /// The name shown in reports.
    pub name: String,
    /// Lines read.
    pub lines: u64,
    /// NCCL lines among them.
    pub nccl_lines: u64,
    /// Over-long lines that were cut.
    pub truncated_lines: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Problems found in non-NCCL lines (PyTorch, launcher).
    pub problems: BTreeMap<ErrorKind, ProblemSeen>,
    /// NCCL versions from lines without a process prefix.
    pub versions: BTreeSet<String>,
    pub(crate) perf: Option<PerfCollector>,
    /// Performance figures (only when collection was asked for).
    pub perf_summary: Option<PerfSummary>,
}
