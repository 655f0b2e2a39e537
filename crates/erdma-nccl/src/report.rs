//! The machine-readable result of `nccl analyze` (every field of `-o json`) and the verdict logic.

use crate::diagnose::{self, ErrorKind, Severity};
use crate::perf::PerfSummary;
use crate::process::{FileState, ProblemSeen, Process};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Whole result of an analysis.
#[derive(Debug, Clone, Serialize)]
pub struct AnalyzeReport {
    /// Inputs read.
    pub files: Vec<FileSummary>,
    /// Jobs found (processes linked by communicator ids).
    pub jobs: Vec<JobReport>,
    /// Processes beyond the tracking limit (their lines were counted but not analysed).
    pub processes_not_tracked: u64,
}

/// One input.
#[derive(Debug, Clone, Serialize)]
pub struct FileSummary {
    /// Name as given.
    pub name: String,
    /// Lines read.
    pub lines: u64,
    /// NCCL INFO/WARN lines.
    pub nccl_lines: u64,
    /// Lines longer than the limit (cut).
    pub truncated_lines: u64,
    /// Bytes read.
    pub bytes: u64,
}

/// Yes / no / cannot tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Answer {
    /// Confirmed.
    Yes,
    /// Not used.
    No,
    /// The log does not say.
    Unknown,
}

impl Answer {
    /// `yes` / `no` / `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Yes => "yes",
            Answer::No => "no",
            Answer::Unknown => "unknown",
        }
    }
}

/// Is eRDMA carrying the job's traffic?
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// The answer.
    pub erdma_used: Answer,
    /// Stable reason code (`net_ib_on_erdma`, `ib_setup_failed`, `socket_fallback`, `single_node`,
    /// `single_rank`,
    /// `init_failed`, `ib_not_erdma`, `plugin_network`, `no_channels_logged`, `no_nccl_lines`, `socket_selected`, `undetermined`).
    pub reason: &'static str,
    /// Why, in words.
    pub because: String,
}

/// The network NCCL chose.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NetworkReport {
    /// `Using network X` values.
    pub chosen: Vec<String>,
    /// Plugins initialised or assigned.
    pub plugins_ready: Vec<String>,
    /// Plugins that failed to initialise.
    pub plugins_failed: Vec<String>,
}

/// The IB transport's view.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IbReport {
    /// Devices listed by `NET/IB : Using`, as `name:port/linklayer`.
    pub devices: Vec<String>,
    /// Of which eRDMA devices (`erdma_*`).
    pub erdma_devices: Vec<String>,
    /// OOB interfaces.
    pub oob: Vec<String>,
    /// Some process logged `NET/IB : No device found.`
    pub no_device_found: bool,
    /// `[RO]` (PCI relaxed ordering) shown.
    pub relaxed_ordering: bool,
}

/// GID index configuration and use.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GidReport {
    /// `NCCL_IB_GID_INDEX` as reported by NCCL (`set by environment to`).
    pub configured: Option<String>,
    /// GID indexes seen on QP connect lines (NCCL_DEBUG_SUBSYS with NET).
    pub in_use: Vec<i64>,
}

/// GPUDirect RDMA.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GdrReport {
    /// `on` (all network connections with /GDRDMA), `partial`, `off`, `n/a` (no network
    /// connection), or `unknown`.
    pub state: String,
    /// Network channel connections.
    pub net_connections: u64,
    /// Of which with /GDRDMA.
    pub gdr_connections: u64,
    /// HCAs with `GPU Direct RDMA Enabled`.
    pub enabled_for: Vec<String>,
    /// HCAs with `GPU Direct RDMA Disabled`.
    pub disabled_for: Vec<String>,
}

/// Connections of one transport.
#[derive(Debug, Clone, Serialize)]
pub struct TransportReport {
    /// `NET/IB`, `NET/Socket`, `P2P/CUMEM`, `SHM/direct` ...
    pub transport: String,
    /// Channel connection lines.
    pub connections: u64,
    /// Of which with /GDRDMA.
    pub gdr_connections: u64,
    /// Devices behind the NCCL net device indexes used (NET only).
    pub devices: Vec<String>,
}

/// One problem with explanation.
#[derive(Debug, Clone, Serialize)]
pub struct ProblemReport {
    /// Stable identifier.
    pub kind: ErrorKind,
    /// Severity.
    pub severity: Severity,
    /// Title.
    pub title: &'static str,
    /// Meaning.
    pub meaning: &'static str,
    /// Fix.
    pub fix: &'static str,
    /// Occurrences over all processes of the job.
    pub count: u64,
    /// Processes (`host:pid`) whose NCCL lines reported it (0 when only PyTorch/launcher lines did).
    pub processes: usize,
    /// `file:line` of the first occurrence.
    pub first_seen: String,
    /// Index of that file in the report's `files`.
    pub first_file: usize,
    /// That line number (1-based).
    pub first_line: u64,
    /// The first message.
    pub message: String,
}

/// NCCL result code.
#[derive(Debug, Clone, Serialize)]
pub struct ResultCode {
    /// Numeric code.
    pub code: u32,
    /// `ncclInvalidUsage` ...
    pub name: &'static str,
}

/// Everything known about one job.
#[derive(Debug, Clone, Serialize)]
pub struct JobReport {
    /// `job-1`, `job-2` ...
    pub id: String,
    /// Inputs that contributed.
    pub files: Vec<String>,
    /// Communicator ids (hex).
    pub comm_ids: Vec<String>,
    /// NCCL versions.
    pub nccl_versions: Vec<String>,
    /// World size (largest communicator).
    pub ranks: Option<u32>,
    /// Distinct ranks that logged a communicator line.
    pub ranks_seen: usize,
    /// Processes (`host:pid`) seen.
    pub processes: usize,
    /// Host names.
    pub hosts: Vec<String>,
    /// Nodes (`nNodes`, or the number of hosts when NCCL did not say).
    pub nodes: Option<u32>,
    /// Some communicator finished initialisation.
    pub init_complete: bool,
    /// Network choice.
    pub network: NetworkReport,
    /// IB transport.
    pub ib: IbReport,
    /// Socket transport interfaces.
    pub socket_interfaces: Vec<String>,
    /// GID index.
    pub gid_index: GidReport,
    /// GPUDirect RDMA.
    pub gdr: GdrReport,
    /// Per-channel transport mix.
    pub transports: Vec<TransportReport>,
    /// `NCCL_*` variables reported as set.
    pub env: BTreeMap<String, String>,
    /// Problems, most severe first.
    pub problems: Vec<ProblemReport>,
    /// First NCCL error code seen.
    pub nccl_result: Option<ResultCode>,
    /// The verdict.
    pub verdict: Verdict,
    /// Performance figures (`nccl compare` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub perf: Option<PerfSummary>,
}

/// Builds the report from the analyser's state.
pub fn build(
    processes: &[Process],
    files: &[FileState],
    groups: Vec<(Vec<usize>, BTreeSet<usize>)>,
    file_summaries: Vec<FileSummary>,
    dropped: u64,
) -> AnalyzeReport {
    let mut jobs = Vec::new();
    let mut file_owner: BTreeMap<usize, usize> = BTreeMap::new();
    for (n, (members, job_files)) in groups.into_iter().enumerate() {
        // Foreign (non-NCCL) problems and bare versions of a file go to the first job of that file.
        let mut owned = Vec::new();
        for f in &job_files {
            if !file_owner.contains_key(f) {
                file_owner.insert(*f, n);
                owned.push(*f);
            }
        }
        jobs.push(job(n, processes, &members, &job_files, &owned, files));
    }
    AnalyzeReport {
        files: file_summaries,
        jobs,
        processes_not_tracked: dropped,
    }
}

fn names(set: impl IntoIterator<Item = String>) -> Vec<String> {
    set.into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn job(
    n: usize,
    processes: &[Process],
    members: &[usize],
    job_files: &BTreeSet<usize>,
    owned_files: &[usize],
    files: &[FileState],
) -> JobReport {
    let ps: Vec<&Process> = members.iter().filter_map(|&i| processes.get(i)).collect();
    let mut versions: BTreeSet<String> =
        ps.iter().flat_map(|p| p.versions.iter().cloned()).collect();
    for &f in owned_files {
        versions.extend(files[f].versions.iter().cloned());
    }
    let hosts = names(
        ps.iter()
            .filter(|p| !p.key.starts_with('<'))
            .map(|p| p.host.clone()),
    );
    let ranks = ps.iter().filter_map(|p| p.nranks).max();
    let ranks_seen: BTreeSet<u32> = ps.iter().flat_map(|p| p.ranks.iter().copied()).collect();
    let nnodes = ps.iter().filter_map(|p| p.nnodes).max();
    let nodes = nnodes.or_else(|| (!hosts.is_empty()).then_some(hosts.len() as u32));

    let network = NetworkReport {
        chosen: names(ps.iter().flat_map(|p| p.networks.iter().cloned())),
        plugins_ready: names(ps.iter().flat_map(|p| p.plugins_ready.iter().cloned())),
        plugins_failed: names(ps.iter().flat_map(|p| p.plugins_failed.iter().cloned())),
    };
    let devices = names(ps.iter().flat_map(|p| {
        p.ib_devices
            .iter()
            .map(|(_, n, port, ll)| format!("{n}:{port}/{ll}"))
    }));
    let erdma_devices = devices.iter().filter(|d| is_erdma(d)).cloned().collect();
    let ib = IbReport {
        devices,
        erdma_devices,
        oob: names(ps.iter().flat_map(|p| p.ib_oob.iter().cloned())),
        no_device_found: ps
            .iter()
            .any(|p| p.problems.contains_key(&ErrorKind::IbNoDevice)),
        relaxed_ordering: ps.iter().any(|p| p.relaxed_ordering),
    };
    let socket_interfaces = names(ps.iter().flat_map(|p| p.socket_ifaces.iter().cloned()));

    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for p in &ps {
        for (k, v) in &p.env {
            env.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    let gid_index = GidReport {
        configured: env.get("NCCL_IB_GID_INDEX").cloned(),
        in_use: ps
            .iter()
            .flat_map(|p| p.gids_in_use.iter().copied())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
    };

    // Transports with the devices behind net device indexes (per process, since indexes are local).
    let mut transports: BTreeMap<String, TransportReport> = BTreeMap::new();
    for p in &ps {
        for (label, t) in &p.transports {
            let e = transports
                .entry(label.clone())
                .or_insert_with(|| TransportReport {
                    transport: label.clone(),
                    connections: 0,
                    gdr_connections: 0,
                    devices: Vec::new(),
                });
            e.connections += t.connections;
            e.gdr_connections += t.gdr;
            for d in &t.net_devs {
                let name = net_device_name(p, label, *d);
                if !e.devices.contains(&name) {
                    e.devices.push(name);
                }
            }
        }
    }
    let transports: Vec<TransportReport> = transports.into_values().collect();

    let net_connections: u64 = transports
        .iter()
        .filter(|t| t.transport.starts_with("NET"))
        .map(|t| t.connections)
        .sum();
    let gdr_connections: u64 = transports
        .iter()
        .filter(|t| t.transport.starts_with("NET"))
        .map(|t| t.gdr_connections)
        .sum();
    let mut enabled_for = BTreeSet::new();
    let mut disabled_for = BTreeSet::new();
    for p in &ps {
        for ((net, hca), on) in &p.gdr_decisions {
            let name = format!("NET/{net} {hca}");
            if *on {
                enabled_for.insert(name);
            } else {
                disabled_for.insert(name);
            }
        }
    }
    let state = if net_connections > 0 {
        if gdr_connections == net_connections {
            "on"
        } else if gdr_connections == 0 {
            "off"
        } else {
            "partial"
        }
    } else if transports.is_empty() {
        if !enabled_for.is_empty() {
            "on"
        } else if !disabled_for.is_empty() {
            "off"
        } else {
            "unknown"
        }
    } else {
        "n/a"
    };
    let gdr = GdrReport {
        state: state.to_string(),
        net_connections,
        gdr_connections,
        enabled_for: enabled_for.into_iter().collect(),
        disabled_for: disabled_for.into_iter().collect(),
    };

    // Problems: merge per kind over processes (+ the file-level ones this job owns).
    let mut merged: BTreeMap<ErrorKind, (ProblemSeen, usize)> = BTreeMap::new();
    let mut merge = |kind: ErrorKind, seen: &ProblemSeen, process: bool| {
        merged
            .entry(kind)
            .and_modify(|(p, procs)| {
                p.count += seen.count;
                *procs += usize::from(process);
                if (seen.file, seen.line) < (p.file, p.line) {
                    p.file = seen.file;
                    p.line = seen.line;
                    p.message = seen.message.clone();
                }
            })
            .or_insert_with(|| (seen.clone(), usize::from(process)));
    };
    for p in &ps {
        for (k, s) in &p.problems {
            merge(*k, s, true);
        }
    }
    for &f in owned_files {
        for (k, s) in &files[f].problems {
            merge(*k, s, false);
        }
    }
    let mut problems: Vec<ProblemReport> = merged
        .into_iter()
        .map(|(kind, (seen, procs))| {
            let e = kind.explain();
            ProblemReport {
                kind,
                severity: kind.severity(),
                title: e.title,
                meaning: e.meaning,
                fix: e.fix,
                count: seen.count,
                processes: procs,
                first_seen: format!(
                    "{}:{}",
                    files.get(seen.file).map_or("?", |f| f.name.as_str()),
                    seen.line
                ),
                first_file: seen.file,
                first_line: seen.line,
                message: seen.message,
            }
        })
        .collect();
    problems.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(a.kind.is_consequence().cmp(&b.kind.is_consequence()))
            .then((a.first_file, a.first_line).cmp(&(b.first_file, b.first_line)))
    });

    let nccl_result = ps
        .iter()
        .filter_map(|p| p.first_result_code)
        .next()
        .map(|code| ResultCode {
            code,
            name: diagnose::result_name(code),
        });
    let init_complete = ps.iter().any(|p| p.init_complete);
    let nccl_lines: u64 = job_files
        .iter()
        .filter_map(|&f| files.get(f))
        .map(|f| f.nccl_lines)
        .sum();

    let mut report = JobReport {
        id: format!("job-{}", n + 1),
        files: job_files
            .iter()
            .filter_map(|&f| files.get(f))
            .map(|f| f.name.clone())
            .collect(),
        comm_ids: names(
            ps.iter()
                .flat_map(|p| p.comm_ids.iter().map(|c| format!("{c:#018x}"))),
        ),
        nccl_versions: versions.into_iter().collect(),
        ranks,
        ranks_seen: ranks_seen.len(),
        processes: ps.iter().filter(|p| !p.key.starts_with('<')).count(),
        hosts,
        nodes,
        init_complete,
        network,
        ib,
        socket_interfaces,
        gid_index,
        gdr,
        transports,
        env,
        problems,
        nccl_result,
        verdict: Verdict {
            erdma_used: Answer::Unknown,
            reason: "undetermined",
            because: String::new(),
        },
        perf: None,
    };
    report.verdict = verdict(&report, nccl_lines);
    report
}

/// `NET/IB`, or the IB plugin of nccl-rdma-sharp-plugins (`NET/IBext`, `NET/IBext_v8`), which
/// drives the same verbs devices.
fn is_ib_transport(label: &str) -> bool {
    label == "NET/IB" || label.starts_with("NET/IBext")
}

fn is_erdma(device: &str) -> bool {
    device.starts_with("erdma")
}

fn net_device_name(p: &Process, label: &str, dev: u32) -> String {
    if is_ib_transport(label) {
        if let Some((_, name, port, ll)) = p.ib_devices.iter().find(|(i, ..)| *i == dev) {
            return format!("{name}:{port}/{ll}");
        }
    } else if label == "NET/Socket" {
        let prefix = format!("[{dev}]");
        if let Some(i) = p.socket_ifaces.iter().find(|i| i.starts_with(&prefix)) {
            return i[prefix.len()..].to_string();
        }
    }
    format!("{label}/{dev}")
}

/// Decides whether eRDMA carried the job's traffic (`nccl-and-arena.md` §A2: network IB chosen,
/// `erdma_*` devices listed with `/RoCE`, inter-node channels via `NET/IB`).
pub fn verdict(job: &JobReport, nccl_lines: u64) -> Verdict {
    let count = |t: &str| {
        job.transports
            .iter()
            .filter(|x| x.transport == t)
            .map(|x| x.connections)
            .sum::<u64>()
    };
    let ib: u64 = job
        .transports
        .iter()
        .filter(|t| is_ib_transport(&t.transport))
        .map(|t| t.connections)
        .sum();
    let socket = count("NET/Socket");
    let other_net: u64 = job
        .transports
        .iter()
        .filter(|t| {
            t.transport.starts_with("NET/")
                && !is_ib_transport(&t.transport)
                && t.transport != "NET/Socket"
        })
        .map(|t| t.connections)
        .sum();
    let intra: u64 = job
        .transports
        .iter()
        .filter(|t| !t.transport.starts_with("NET"))
        .map(|t| t.connections)
        .sum();
    let ib_devices_used: Vec<&String> = job
        .transports
        .iter()
        .filter(|t| is_ib_transport(&t.transport))
        .flat_map(|t| t.devices.iter())
        .collect();
    let fatal: Vec<&ProblemReport> = job
        .problems
        .iter()
        .filter(|p| p.severity == Severity::Error)
        .collect();
    let fatal_note = match fatal.first() {
        Some(p) => format!("; but the job hit errors: {} ({})", p.title, p.kind_str()),
        None => String::new(),
    };
    let gdr = match job.gdr.state.as_str() {
        "on" => ", GPUDirect RDMA on",
        "off" => ", GPUDirect RDMA off",
        "partial" => ", GPUDirect RDMA on some connections",
        _ => "",
    };
    let v = |a: Answer, reason: &'static str, because: String| Verdict {
        erdma_used: a,
        reason,
        because,
    };

    if nccl_lines == 0 && job.transports.is_empty() {
        if let Some(p) = fatal.first() {
            return v(
                Answer::No,
                "init_failed",
                format!(
                    "the job failed ({}: {}) and the log has no NCCL INFO lines; rerun with NCCL_DEBUG=INFO \
                     NCCL_DEBUG_SUBSYS=INIT,NET,ENV to see the transport",
                    p.kind_str(),
                    p.title
                ),
            );
        }
        return v(
            Answer::Unknown,
            "no_nccl_lines",
            "the log has no NCCL INFO lines; run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV".into(),
        );
    }
    let setup_failure = job.problems.iter().find(|p| {
        matches!(
            p.kind,
            ErrorKind::IbModifyQpFailed
                | ErrorKind::IbRegMrFailed
                | ErrorKind::IbVerbsCallFailed
                | ErrorKind::IbDeviceUnusable
                | ErrorKind::IbIncompatibleDevices
        )
    });
    if ib > 0
        && let Some(p) = setup_failure
    {
        let devs = if ib_devices_used.is_empty() {
            job.ib.devices.join(", ")
        } else {
            join(&ib_devices_used)
        };
        let gid_hint = if job.gid_index.configured.as_deref() == Some("0")
            || p.message.contains("GID fe80")
        {
            "; GID index 0 is eRDMA's link-local fe80:: GID: use NCCL_IB_GID_INDEX=-1 (NCCL >= 2.21.5) or the \
             IPv4 RoCEv2 GID index"
        } else {
            ""
        };
        return v(
            Answer::No,
            "ib_setup_failed",
            format!(
                "NCCL tried NET/IB on {devs} but could not bring the connections up: {} ({}){gid_hint}",
                p.title,
                p.kind_str()
            ),
        );
    }
    if ib > 0 {
        let all_erdma = !ib_devices_used.is_empty() && ib_devices_used.iter().all(|d| is_erdma(d));
        let listed_erdma = !job.ib.erdma_devices.is_empty();
        if all_erdma
            || (ib_devices_used.is_empty()
                && listed_erdma
                && job.ib.devices.iter().all(|d| is_erdma(d)))
        {
            let devs = if ib_devices_used.is_empty() {
                job.ib.erdma_devices.join(", ")
            } else {
                join(&ib_devices_used)
            };
            return v(
                Answer::Yes,
                "net_ib_on_erdma",
                format!("{ib} channel connections went via NET/IB on {devs}{gdr}{fatal_note}"),
            );
        }
        let devs = if ib_devices_used.is_empty() {
            job.ib.devices.join(", ")
        } else {
            join(&ib_devices_used)
        };
        if ib_devices_used.iter().any(|d| is_erdma(d)) {
            return v(
                Answer::Yes,
                "net_ib_on_erdma",
                format!(
                    "{ib} channel connections went via NET/IB, partly on eRDMA ({devs}); restrict NCCL_IB_HCA to \
                     erdma_* to use only eRDMA{gdr}{fatal_note}"
                ),
            );
        }
        return v(
            Answer::No,
            "ib_not_erdma",
            format!(
                "NCCL used NET/IB over {devs}, which is not an eRDMA device (set NCCL_IB_HCA=erdma_0){fatal_note}"
            ),
        );
    }
    if socket > 0 {
        return v(
            Answer::No,
            "socket_fallback",
            format!(
                "NCCL fell back to TCP: {socket} channel connections via NET/Socket{}",
                socket_cause(job)
            ),
        );
    }
    if other_net > 0 {
        let names: Vec<&str> = job
            .transports
            .iter()
            .filter(|t| t.transport.starts_with("NET/") && !is_ib_transport(&t.transport))
            .map(|t| t.transport.as_str())
            .collect();
        return v(
            Answer::No,
            "plugin_network",
            format!(
                "channels went via {} (a network plugin), not NET/IB",
                names.join(", ")
            ),
        );
    }
    if job.ranks == Some(1) && job.transports.is_empty() && (fatal.is_empty() || job.init_complete)
    {
        return v(
            Answer::No,
            "single_rank",
            format!(
                "the job has a single rank: NCCL opens no connection at all (start at least two ranks on two \
                 nodes to use the network){fatal_note}"
            ),
        );
    }
    if let Some(p) = fatal.first()
        && !job.init_complete
    {
        let cause = if job.ib.no_device_found && p.kind == ErrorKind::NetPluginInitFailed {
            "; the IB transport found no device (NET/IB : No device found) and no other network was allowed"
        } else {
            ""
        };
        return v(
            Answer::No,
            "init_failed",
            format!(
                "NCCL did not finish initialising: {} ({}) — {}{cause}",
                p.title,
                p.kind_str(),
                p.message
            ),
        );
    }
    if intra > 0 {
        let mix: Vec<String> = job
            .transports
            .iter()
            .filter(|t| !t.transport.starts_with("NET"))
            .map(|t| t.transport.clone())
            .collect();
        let nodes = job.nodes.map_or(String::new(), |n| {
            format!(" ({n} node{})", if n == 1 { "" } else { "s" })
        });
        return v(
            Answer::No,
            "single_node",
            format!(
                "all ranks talked within one node{nodes} via {}; NCCL needs no network there, eRDMA only carries \
                 inter-node traffic{fatal_note}",
                mix.join(", ")
            ),
        );
    }
    if job.network.chosen.iter().any(|n| n == "IB") {
        let devs = if job.ib.devices.is_empty() {
            "no device listed".to_string()
        } else {
            job.ib.devices.join(", ")
        };
        return v(
            Answer::Unknown,
            "no_channels_logged",
            format!(
                "NCCL chose network IB ({devs}) but the log shows no channel connection (job stopped before \
                 connecting, or NCCL_DEBUG_SUBSYS lacks INIT/NET){fatal_note}"
            ),
        );
    }
    if job.network.chosen.iter().any(|n| n == "Socket") {
        return v(
            Answer::No,
            "socket_selected",
            format!("NCCL chose network Socket (TCP){}", socket_cause(job)),
        );
    }
    if let Some(p) = fatal.first() {
        return v(
            Answer::No,
            "init_failed",
            format!(
                "the job failed: {} ({}) — {}",
                p.title,
                p.kind_str(),
                p.message
            ),
        );
    }
    v(
        Answer::Unknown,
        "undetermined",
        "the log shows no network choice and no channel connection; run with NCCL_DEBUG=INFO \
         NCCL_DEBUG_SUBSYS=INIT,NET,ENV"
            .into(),
    )
}

fn socket_cause(job: &JobReport) -> String {
    if job.env.get("NCCL_IB_DISABLE").is_some_and(|v| v == "1") {
        return " because NCCL_IB_DISABLE=1 is set".into();
    }
    if job
        .env
        .get("NCCL_NET")
        .is_some_and(|v| v.eq_ignore_ascii_case("socket"))
    {
        return " because NCCL_NET=Socket is set".into();
    }
    if job.ib.no_device_found {
        return " because NET/IB found no device (no uverbs device in the container, port down, NCCL_IB_HCA \
                 mismatch, or missing provider library)"
            .into();
    }
    if job.network.plugins_failed.iter().any(|p| p == "IB") {
        return " because the IB plugin failed to initialise".into();
    }
    String::new()
}

fn join(v: &[&String]) -> String {
    v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}

impl ProblemReport {
    /// The serialised identifier of the kind.
    pub fn kind_str(&self) -> String {
        serde_json::to_value(self.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}
