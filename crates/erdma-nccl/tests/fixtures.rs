//! Acceptance: every real and synthetic fixture gives the right transport and error verdicts.
//! Expected values are written from reading the logs (see testdata/nccl/*/README.md), not computed.

use erdma_nccl::diagnose::ErrorKind;
use erdma_nccl::{AnalyzeReport, Analyzer, Answer, JobReport, Options};
use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;

fn testdata(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/nccl")
        .join(rel)
}

fn analyze(rels: &[&str]) -> AnalyzeReport {
    let mut an = Analyzer::new(Options::default());
    for rel in rels {
        let path = testdata(rel);
        let f = File::open(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()));
        an.add_input(rel, BufReader::new(f)).expect("read fixture");
    }
    an.finish()
}

fn only_job(r: &AnalyzeReport) -> &JobReport {
    assert_eq!(
        r.jobs.len(),
        1,
        "expected one job, got {:#?}",
        r.jobs.iter().map(|j| &j.files).collect::<Vec<_>>()
    );
    &r.jobs[0]
}

fn kinds(j: &JobReport) -> Vec<ErrorKind> {
    j.problems.iter().map(|p| p.kind).collect()
}

fn transport(j: &JobReport, t: &str) -> u64 {
    j.transports
        .iter()
        .find(|x| x.transport == t)
        .map_or(0, |x| x.connections)
}

#[test]
fn real_p2p_single_node() {
    let r = analyze(&["real/h200x2-nccl2.28.9/nccl-p2p.log"]);
    let j = only_job(&r);
    assert_eq!(j.nccl_versions, vec!["2.28.9+cuda13.0"]);
    assert_eq!(j.ranks, Some(2));
    assert_eq!(j.ranks_seen, 2);
    assert_eq!(j.processes, 2);
    assert_eq!(j.nodes, Some(1));
    assert_eq!(j.network.chosen, vec!["Socket"]);
    assert_eq!(j.network.plugins_failed, vec!["IB"]);
    assert!(j.ib.devices.is_empty());
    assert!(j.ib.no_device_found);
    assert_eq!(transport(j, "P2P/CUMEM"), 48);
    assert_eq!(j.transports.len(), 1);
    assert_eq!(j.gdr.state, "n/a");
    assert_eq!(kinds(j), vec![ErrorKind::IbNoDevice]);
    assert_eq!(j.verdict.erdma_used, Answer::No);
    assert_eq!(j.verdict.reason, "single_node");
    assert!(j.init_complete);
    assert_eq!(j.comm_ids, vec!["0x856452113e1e50a1"]);
}

#[test]
fn real_socket_fallback() {
    let r = analyze(&["real/h200x2-nccl2.28.9/nccl-socket.log"]);
    let j = only_job(&r);
    assert_eq!(
        j.nodes,
        Some(2),
        "NCCL says nNodes 2 when P2P and SHM are disabled"
    );
    assert_eq!(transport(j, "NET/Socket"), 8);
    assert_eq!(j.transports[0].devices, vec!["lo:127.0.0.1<0>"]);
    assert_eq!(j.socket_interfaces, vec!["[0]lo:127.0.0.1<0>"]);
    assert_eq!(j.gdr.state, "off");
    assert_eq!(j.env.get("NCCL_P2P_DISABLE").map(String::as_str), Some("1"));
    assert_eq!(
        j.env.get("NCCL_SOCKET_IFNAME").map(String::as_str),
        Some("lo")
    );
    assert_eq!(j.verdict.erdma_used, Answer::No);
    assert_eq!(j.verdict.reason, "socket_fallback");
    assert!(
        j.verdict.because.contains("NET/IB found no device"),
        "{}",
        j.verdict.because
    );
    assert!(j.gdr.disabled_for.contains(&"NET/Socket lo".to_string()));
}

#[test]
fn real_forced_ib_without_device_fails_init() {
    let r = analyze(&["real/h200x2-nccl2.28.9/nccl-net-ib-no-device.log"]);
    let j = only_job(&r);
    assert_eq!(j.processes, 2);
    assert_eq!(j.ranks, None);
    assert!(!j.init_complete);
    assert!(j.transports.is_empty());
    let k = kinds(j);
    assert_eq!(
        k[0],
        ErrorKind::NetPluginInitFailed,
        "most severe first: {k:?}"
    );
    assert!(k.contains(&ErrorKind::NcclErrorReported));
    assert!(k.contains(&ErrorKind::IbNoDevice));
    let plugin = &j.problems[0];
    // 2 NCCL WARN lines + 2 PyTorch "Last error" lines.
    assert_eq!(plugin.count, 4);
    assert_eq!(plugin.processes, 2);
    assert!(
        plugin.first_seen.ends_with("nccl-net-ib-no-device.log:21"),
        "{}",
        plugin.first_seen
    );
    assert_eq!(
        j.nccl_result.as_ref().map(|r| (r.code, r.name)),
        Some((5, "ncclInvalidUsage"))
    );
    assert_eq!(j.verdict.erdma_used, Answer::No);
    assert_eq!(j.verdict.reason, "init_failed");
}

#[test]
fn real_logs_of_different_runs_are_different_jobs() {
    let r = analyze(&[
        "real/h200x2-nccl2.28.9/nccl-p2p.log",
        "real/h200x2-nccl2.28.9/nccl-socket.log",
    ]);
    assert_eq!(r.jobs.len(), 2);
    assert_eq!(r.jobs[0].verdict.reason, "single_node");
    assert_eq!(r.jobs[1].verdict.reason, "socket_fallback");
}

#[test]
fn synthetic_erdma_with_gdr() {
    let r = analyze(&["synthetic/erdma-2node-gdr.log"]);
    let j = only_job(&r);
    assert_eq!(j.nccl_versions, vec!["2.27.7+cuda13.0"]);
    assert_eq!(j.hosts, vec!["host-a", "host-b"]);
    assert_eq!(j.nodes, Some(2));
    assert_eq!(j.network.chosen, vec!["IB"]);
    assert_eq!(j.ib.devices, vec!["erdma_0:1/RoCE"]);
    assert_eq!(j.ib.erdma_devices, vec!["erdma_0:1/RoCE"]);
    assert!(j.ib.relaxed_ordering);
    assert_eq!(j.gid_index.configured.as_deref(), Some("-1"));
    assert_eq!(j.gid_index.in_use, vec![3]);
    assert_eq!(transport(j, "NET/IB"), 8);
    assert_eq!(j.gdr.state, "on");
    assert_eq!(j.transports[0].devices, vec!["erdma_0:1/RoCE"]);
    assert!(j.problems.is_empty());
    assert_eq!(j.verdict.erdma_used, Answer::Yes);
    assert_eq!(j.verdict.reason, "net_ib_on_erdma");
}

#[test]
fn synthetic_tcp_and_mlx5_are_not_erdma() {
    let j = analyze(&["synthetic/tcp-2node.log"]).jobs.remove(0);
    assert_eq!(j.verdict.reason, "socket_fallback");
    assert!(j.verdict.because.contains("NCCL_IB_DISABLE=1"));
    let j = analyze(&["synthetic/ib-mlx5-not-erdma.log"]).jobs.remove(0);
    assert_eq!(j.verdict.erdma_used, Answer::No);
    assert_eq!(j.verdict.reason, "ib_not_erdma");
}

#[test]
fn synthetic_completion_error_and_timeout() {
    let r = analyze(&["synthetic/erdma-completion-error-timeout.log"]);
    let j = only_job(&r);
    let k = kinds(j);
    assert!(k.contains(&ErrorKind::IbCompletionError), "{k:?}");
    assert!(k.contains(&ErrorKind::CollectiveTimeout), "{k:?}");
    assert_eq!(
        j.nccl_result.as_ref().map(|r| r.name),
        Some("ncclRemoteError")
    );
    assert_eq!(j.verdict.erdma_used, Answer::Yes);
    assert!(j.verdict.because.contains("ib_completion_error"));
}

#[test]
fn synthetic_old_nccl_gid0_modify_qp() {
    let r = analyze(&["synthetic/erdma-nccl2.18-gid0-modify-qp.log"]);
    let j = only_job(&r);
    assert_eq!(j.nccl_versions, vec!["2.18.3+cuda12.2"]);
    assert_eq!(j.comm_ids, vec!["0x1b2c3d4e5f607182"]);
    assert_eq!(transport(j, "NET/IB"), 2);
    let k = kinds(j);
    assert!(
        k.contains(&ErrorKind::IbModifyQpFailed) && k.contains(&ErrorKind::IbCompletionError),
        "{k:?}"
    );
    assert_eq!(j.verdict.erdma_used, Answer::No);
    assert_eq!(j.verdict.reason, "ib_setup_failed");
    assert!(j.verdict.because.contains("GID index 0"));
}

#[test]
fn ranks_in_separate_files_form_one_job() {
    // Split the 2-rank socket log into one file per process, as `kubectl logs` per pod would give.
    let text = std::fs::read_to_string(testdata("real/h200x2-nccl2.28.9/nccl-socket.log"))
        .expect("fixture");
    let (r0, r1): (Vec<&str>, Vec<&str>) = text.lines().partition(|l| !l.starts_with("vm:805:"));
    let mut an = Analyzer::new(Options::default());
    an.add_input("rank0.log", r0.join("\n").as_bytes())
        .expect("read");
    an.add_input("rank1.log", r1.join("\n").as_bytes())
        .expect("read");
    let r = an.finish();
    let j = only_job(&r);
    assert_eq!(j.files, vec!["rank0.log", "rank1.log"]);
    assert_eq!(j.ranks_seen, 2);
    assert_eq!(transport(j, "NET/Socket"), 8);
}

#[test]
fn no_nccl_lines_is_unknown() {
    let mut an = Analyzer::new(Options::default());
    an.add_input("empty.log", &b"hello\nworld\n"[..])
        .expect("read");
    let r = an.finish();
    assert_eq!(r.jobs.len(), 1);
    assert_eq!(r.jobs[0].verdict.erdma_used, Answer::Unknown);
    assert_eq!(r.jobs[0].verdict.reason, "no_nccl_lines");
}

#[test]
fn real_two_gpu_training_stays_on_nvlink() {
    let r = analyze(&["real/h200x2-nccl2.28.9/train-2gpu-nccl.log"]);
    let j = only_job(&r);
    assert_eq!(j.nccl_versions, vec!["2.28.9+cuda13.0"]);
    assert_eq!(j.ranks, Some(2));
    assert_eq!(j.processes, 2);
    assert_eq!(j.nodes, Some(1));
    assert_eq!(j.network.chosen, vec!["Socket"]);
    assert!(j.ib.no_device_found);
    assert_eq!(transport(j, "P2P/CUMEM"), 48);
    assert_eq!(j.transports.len(), 1);
    assert_eq!(kinds(j), vec![ErrorKind::IbNoDevice]);
    assert_eq!(j.verdict.erdma_used, Answer::No);
    assert_eq!(j.verdict.reason, "single_node");
}

#[test]
fn real_single_gpu_training_is_single_rank() {
    for f in [
        "real/h200x1-nccl2.28.9/train-1gpu-nccl.log",
        "real/h200x1-nccl2.28.9/train-1gpu-subsys-all.log",
    ] {
        let r = analyze(&[f]);
        let j = only_job(&r);
        assert_eq!(j.ranks, Some(1), "{f}");
        assert_eq!(j.network.chosen, vec!["Socket"], "{f}");
        assert!(j.ib.no_device_found, "{f}");
        assert_eq!(j.verdict.erdma_used, Answer::No, "{f}");
        assert_eq!(j.verdict.reason, "single_rank", "{f}");
        assert_eq!(kinds(j), vec![ErrorKind::IbNoDevice], "{f}");
    }
}

#[test]
fn real_forced_ib_at_warn_level() {
    let r = analyze(&["real/h200x1-nccl2.28.9/train-1gpu-net-ib-warn.log"]);
    let j = only_job(&r);
    assert_eq!(
        j.nccl_versions,
        vec!["2.28.9+cuda13.0"],
        "bare `NCCL version` line of NCCL_DEBUG=WARN"
    );
    assert_eq!(
        kinds(j),
        vec![ErrorKind::NetPluginInitFailed, ErrorKind::NcclErrorReported]
    );
    assert_eq!(j.verdict.reason, "init_failed");
    assert!(
        j.verdict
            .because
            .contains("Failed to initialize any NET plugin")
    );
}

#[test]
fn real_two_ranks_on_one_gpu() {
    let r = analyze(&["real/h200x1-nccl2.28.9/two-ranks-one-gpu.log"]);
    let j = only_job(&r);
    assert_eq!(j.processes, 2);
    assert_eq!(j.ranks, Some(2));
    assert_eq!(j.problems[0].kind, ErrorKind::DuplicateGpu);
    assert_eq!(j.problems[0].processes, 2);
    assert_eq!(j.verdict.erdma_used, Answer::No);
    assert_eq!(j.verdict.reason, "init_failed");
}

#[test]
fn plugin_network_and_non_utf8_lines() {
    let mut text = Vec::new();
    text.extend_from_slice(
        b"a:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v8)\n",
    );
    text.extend_from_slice(b"a:1:1 [0] NCCL INFO Using network AWS Libfabric\n");
    text.extend_from_slice(b"a:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 10 commId 0xab - Init COMPLETE\n");
    // A corrupted byte in the middle of a channel line must not hide it.
    text.extend_from_slice(b"a:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/AWS Libfabric/0/GDRDMA \xff\xfe\n");
    let mut an = Analyzer::new(Options::default());
    an.add_input("efa.log", &text[..]).expect("read");
    let r = an.finish();
    let j = only_job(&r);
    assert_eq!(j.network.plugins_ready, vec!["AWS Libfabric"]);
    assert_eq!(transport(j, "NET/AWS Libfabric"), 1);
    assert_eq!(j.gdr.state, "on");
    assert_eq!(j.verdict.erdma_used, Answer::No);
    assert_eq!(j.verdict.reason, "plugin_network");
}

#[test]
fn ibext_plugin_on_erdma_counts_as_ib() {
    let text = "a:1:1 [0] NCCL INFO NET/IBext_v8 : Using [0]erdma_0:1/RoCE [RO]; OOB eth0:10.0.0.1<0>\n\
                a:1:1 [0] NCCL INFO Using network IBext_v8\n\
                a:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IBext_v8/0/GDRDMA\n";
    let mut an = Analyzer::new(Options::default());
    an.add_input("ibext.log", text.as_bytes()).expect("read");
    let r = an.finish();
    let j = only_job(&r);
    assert_eq!(j.ib.devices, vec!["erdma_0:1/RoCE"]);
    assert_eq!(j.transports[0].devices, vec!["erdma_0:1/RoCE"]);
    assert_eq!(j.verdict.erdma_used, Answer::Yes);
}

#[test]
fn real_watchdog_timeout() {
    let r = analyze(&["real/h200x1-nccl2.28.9/watchdog-timeout.log"]);
    let j = only_job(&r);
    let t = j
        .problems
        .iter()
        .find(|p| p.kind == ErrorKind::CollectiveTimeout)
        .expect("timeout found");
    assert!(
        t.first_seen.ends_with("watchdog-timeout.log:96"),
        "{}",
        t.first_seen
    );
    assert!(t.message.contains("OpType=ALLREDUCE") && t.message.contains("Timeout(ms)=5000"));
    assert_eq!(j.verdict.reason, "single_rank");
    assert!(
        j.verdict.because.contains("collective_timeout"),
        "{}",
        j.verdict.because
    );
}

/// A TCP run and an eRDMA run of the same job on the same hosts (the comparison users make; the
/// synthetic pair even reuses the pids and the communicator id) are two jobs, never one that
/// "used eRDMA": each `host:pid` prints its NCCL version banner once per run, and one job never
/// holds two runs of one `host:pid`.
#[test]
fn two_runs_of_one_job_are_two_jobs_even_with_the_same_pids() {
    let r = analyze(&["synthetic/tcp-2node.log", "synthetic/erdma-2node-gdr.log"]);
    assert_eq!(r.jobs.len(), 2, "{:#?}", r.jobs);
    let used: Vec<Answer> = r.jobs.iter().map(|j| j.verdict.erdma_used).collect();
    assert!(
        used.contains(&Answer::No) && used.contains(&Answer::Yes),
        "{used:?}"
    );
    // Each run alone gives the same verdict as together.
    let tcp = analyze(&["synthetic/tcp-2node.log"]);
    let erdma = analyze(&["synthetic/erdma-2node-gdr.log"]);
    assert_eq!(only_job(&tcp).verdict.erdma_used, Answer::No);
    assert_eq!(only_job(&erdma).verdict.erdma_used, Answer::Yes);
}

/// A process restarted with the same pid inside one log (two version banners) is two processes.
#[test]
fn a_restart_with_the_same_pid_in_one_log_starts_a_new_process() {
    let text = std::fs::read_to_string(testdata("synthetic/tcp-2node.log")).unwrap();
    let twice = format!("{text}\n{text}");
    let mut an = Analyzer::new(Options::default());
    an.add_input("restarted.log", twice.as_bytes()).unwrap();
    let r = an.finish();
    let once = analyze(&["synthetic/tcp-2node.log"]);
    assert_eq!(r.jobs.len(), 2, "{:#?}", r.jobs);
    // Everything but where it was read from is the single run's: counted once, not doubled.
    fn what(j: &JobReport) -> serde_json::Value {
        fn strip(v: &mut serde_json::Value) {
            match v {
                serde_json::Value::Object(m) => {
                    for k in ["id", "files", "first_seen", "first_file", "first_line"] {
                        m.remove(k);
                    }
                    m.values_mut().for_each(strip);
                }
                serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
                _ => {}
            }
        }
        let mut v = serde_json::to_value(j).unwrap();
        strip(&mut v);
        v
    }
    for j in &r.jobs {
        assert_eq!(j.verdict.erdma_used, Answer::No);
        assert_eq!(what(j), what(only_job(&once)));
    }
}
