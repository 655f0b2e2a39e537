//! `erdmactl nccl analyze|compare` driven as a binary: argument parsing, text and JSON output,
//! exit codes.

use assert_cmd::Command;
use std::path::PathBuf;

fn testdata(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/nccl")
        .join(rel)
        .display()
        .to_string()
}

/// Runs `erdmactl nccl <args>`: (exit status, stdout).
fn run(args: &[&str]) -> (i32, String) {
    let out = Command::cargo_bin("erdmactl")
        .expect("erdmactl is built")
        .arg("nccl")
        .args(args)
        .output()
        .expect("erdmactl runs");
    let code = out.status.code().expect("exited, not killed");
    (code, String::from_utf8(out.stdout).expect("utf-8 output"))
}

#[test]
fn analyze_table_has_verdict_line() {
    let (code, out) = run(&["analyze", &testdata("synthetic/erdma-2node-gdr.log")]);
    assert_eq!(code, 0);
    assert!(
        out.contains(
            "eRDMA used: yes, because 8 channel connections went via NET/IB on erdma_0:1/RoCE"
        ),
        "{out}"
    );
    assert!(out.contains("IB devices       erdma_0:1/RoCE"), "{out}");
}

#[test]
fn analyze_json_is_complete() {
    let (_, out) = run(&[
        "analyze",
        "-o",
        "json",
        &testdata("real/h200x2-nccl2.28.9/nccl-socket.log"),
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    let job = &v["jobs"][0];
    assert_eq!(job["verdict"]["erdma_used"], "no");
    assert_eq!(job["verdict"]["reason"], "socket_fallback");
    assert_eq!(job["transports"][0]["transport"], "NET/Socket");
    assert_eq!(job["transports"][0]["connections"], 8);
    assert_eq!(job["problems"][0]["kind"], "ib_no_device");
    assert_eq!(job["problems"][0]["severity"], "info");
    assert_eq!(v["files"][0]["lines"], 176);
    for key in [
        "nccl_versions",
        "ranks",
        "nodes",
        "network",
        "ib",
        "gid_index",
        "gdr",
        "env",
        "nccl_result",
    ] {
        assert!(job.get(key).is_some(), "missing {key}");
    }
}

#[test]
fn require_erdma_sets_exit_code() {
    let (code, _) = run(&[
        "analyze",
        "--require-erdma",
        &testdata("real/h200x2-nccl2.28.9/nccl-p2p.log"),
    ]);
    assert_eq!(code, 1);
    let (code, _) = run(&[
        "analyze",
        "--require-erdma",
        &testdata("synthetic/erdma-2node-gdr.log"),
    ]);
    assert_eq!(code, 0);
}

#[test]
fn missing_file_is_an_error_naming_it() {
    let out = Command::cargo_bin("erdmactl")
        .expect("erdmactl is built")
        .args(["nccl", "analyze", "/nonexistent/x.log"])
        .output()
        .expect("erdmactl runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/x.log"), "{err}");
}

#[test]
fn compare_says_erdma_helped_on_synthetic_pair() {
    let (_, out) = run(&[
        "compare",
        &testdata("synthetic/tcp-2node.log"),
        &testdata("synthetic/erdma-2node-gdr.log"),
    ]);
    assert!(out.contains("eRDMA helped: B is faster"), "{out}");
    let (_, out) = run(&[
        "compare",
        "-o",
        "json",
        &testdata("synthetic/tcp-2node.log"),
        &testdata("synthetic/erdma-2node-gdr.log"),
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(v["erdma_helped"], "yes");
    assert_eq!(v["a"]["erdma_used"], "no");
    assert_eq!(v["b"]["erdma_used"], "yes");
    // 64 MiB: 3.10 vs 20.80 GB/s in the tables.
    let row = v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["size_bytes"] == 67108864)
        .expect("64 MiB row");
    assert_eq!(row["a_busbw_gbps"], 3.1);
    assert_eq!(row["b_busbw_gbps"], 20.8);
    let ratio = row["busbw_ratio"].as_f64().expect("ratio");
    assert!((ratio - 20.8 / 3.1).abs() < 1e-9);
}

#[test]
fn compare_real_probe_results() {
    let (_, out) = run(&[
        "compare",
        "-o",
        "json",
        &testdata("real/h200x2-nccl2.28.9/nccl-socket.log"),
        &testdata("real/h200x2-nccl2.28.9/nccl-p2p.log"),
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 4);
    let big = rows
        .iter()
        .find(|r| r["size_bytes"] == 536870912)
        .expect("512 MiB");
    assert_eq!(big["a_busbw_gbps"], 3.04012112530502);
    assert_eq!(big["b_busbw_gbps"], 313.6903009579644);
    assert_eq!(v["steps"]["a_ms"], 2.5559138450000063);
    // Neither side used eRDMA: the tool must not credit it.
    assert_eq!(v["erdma_helped"], "unknown");
}

/// `--require-erdma` over a TCP run and an eRDMA run of one job: the TCP run did not use eRDMA,
/// so the exit status is 1 (before: the two runs were merged into one job "eRDMA used: yes", 0).
/// The same file given twice is read once (before: every count doubled).
#[test]
fn require_erdma_judges_each_run_and_a_repeated_file_is_read_once() {
    let tcp = testdata("synthetic/tcp-2node.log");
    let erdma = testdata("synthetic/erdma-2node-gdr.log");
    let (code, out) = run(&["analyze", "--require-erdma", &tcp, &erdma, "-o", "json"]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["jobs"].as_array().unwrap().len(), 2);
    let (_, once) = run(&["analyze", &erdma, "-o", "json"]);
    let (code, twice) = run(&["analyze", &erdma, &erdma, "-o", "json"]);
    assert_eq!(code, 0);
    let jobs = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap()["jobs"].clone();
    assert_eq!(jobs(&once), jobs(&twice));
}

#[test]
fn compare_adds_each_runs_rdma_usage() {
    let dir = tempfile::tempdir().expect("dir");
    // A: the TCP run, one agent's /usage with an allocated but unused device.
    let a = dir.path().join("a.json");
    std::fs::write(
        &a,
        r#"{"node": "n1", "collectedAtUnixMs": 1, "available": true,
            "pods": [{"namespace": "ml", "name": "tcp-0", "uid": "u0",
                      "devices": [{"device": "erdma_0", "allocated": true, "qps": 0,
                                   "mrs": 0, "mrBytes": 0, "cqs": 0, "pds": 0}]}]}"#,
    )
    .expect("write");
    // B: the eRDMA run, saved by `top pods -o json` over two nodes.
    let b = dir.path().join("b.json");
    let pod = |name: &str| {
        serde_json::json!({"namespace": "ml", "name": name, "uid": name,
            "devices": [{"device": "erdma_0", "allocated": true, "qps": 12,
                         "qpsByState": {"RTS": 10, "INIT": 2}, "mrs": 4,
                         "mrBytes": 3u64 << 29, "cqs": 3, "pds": 1}]})
    };
    let list = serde_json::json!({"kind": "UsageList", "unreachable": [], "items": [
        {"node": "n1", "collectedAtUnixMs": 1, "available": true, "pods": [pod("w-0")]},
        {"node": "n2", "collectedAtUnixMs": 1, "available": true, "pods": [pod("w-1")]}]});
    std::fs::write(&b, list.to_string()).expect("write");
    let (a, b) = (a.display().to_string(), b.display().to_string());
    let logs = [
        testdata("synthetic/tcp-2node.log"),
        testdata("synthetic/erdma-2node-gdr.log"),
    ];
    let (code, out) = run(&[
        "compare",
        "-o",
        "json",
        &logs[0],
        &logs[1],
        "--usage-a",
        &a,
        "--usage-b",
        &b,
    ]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(v["a"]["rdma"]["qps"], 0);
    assert_eq!(v["a"]["rdma"]["pods"], 1);
    assert_eq!(v["b"]["rdma"]["nodes"], 2);
    assert_eq!(v["b"]["rdma"]["pods"], 2);
    assert_eq!(v["b"]["rdma"]["qps"], 24);
    assert_eq!(v["b"]["rdma"]["qps_rts"], 20);
    assert_eq!(v["b"]["rdma"]["mr_bytes"], 3u64 << 30);
    assert_eq!(v["b"]["rdma"]["cqs"], 6);
    let (_, out) = run(&["compare", &logs[0], &logs[1], "--usage-b", &b]);
    assert!(
        out.contains("   RDMA (")
            && out
                .contains("): 2 pods on 2 nodes, 24 QPs (20 RTS), 3.0GiB registered, 6 CQs, 2 PDs"),
        "{out}"
    );
    // Without usage files the JSON has no rdma key.
    let (_, out) = run(&["compare", "-o", "json", &logs[0], &logs[1]]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert!(v["a"].get("rdma").is_none());
    // An unreadable usage file is an input error.
    let (code, _) = run(&[
        "compare",
        &logs[0],
        &logs[1],
        "--usage-a",
        "/nonexistent.json",
    ]);
    assert_eq!(code, 2);
}
