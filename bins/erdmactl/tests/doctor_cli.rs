//! `erdmactl doctor` as a binary: node and pod diagnosis through the real kube client against
//! recorded API objects (`testdata/k8s/`), and local mode on the sysfs fixture trees.

mod fake_apiserver;

use assert_cmd::Command;
use fake_apiserver::{FakeApiServer, Route};
use std::path::PathBuf;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(workspace().join("testdata/k8s").join(name)).unwrap()
}

fn erdmactl() -> Command {
    let mut c = Command::cargo_bin("erdmactl").unwrap();
    c.env_remove("KUBECONFIG").current_dir(workspace());
    c
}

fn stdout(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8(a.get_output().stdout.clone()).unwrap()
}

const NODE: &str = "cn-hangzhou.192.0.2.23";

fn routes(node: &str, pods_on_node: &str) -> Vec<Route> {
    vec![
        ("GET", format!("/api/v1/nodes/{NODE}"), 200, fixture(node)),
        ("GET", "/api/v1/pods?".into(), 200, fixture(pods_on_node)),
        (
            "GET",
            "/api/v1/namespaces/default/pods/pt-erdma-master-0".into(),
            200,
            fixture("pod-pending-insufficient-erdma.json"),
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/smc-server-6d5f7c9b8-x2kq4".into(),
            200,
            fixture("pod-running-smcr.json"),
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/smc-client-7b9c8d6f5-mn3vz".into(),
            200,
            fixture("pod-running-no-smcr-peer.json"),
        ),
        (
            "GET",
            "/api/v1/namespaces/default/events?".into(),
            200,
            fixture("events-pending-insufficient-erdma.json"),
        ),
    ]
}

#[test]
fn node_doctor_passes_on_a_healthy_node_and_uses_the_right_selectors() {
    let server = FakeApiServer::start(routes(
        "node-erdma-ready.json",
        "pods-on-node-agent-running.json",
    ));
    let dir = tempfile::tempdir().unwrap();
    let kc = server.kubeconfig(dir.path());
    let a = erdmactl()
        .args(["doctor", "--node", NODE, "--kubeconfig"])
        .arg(&kc)
        .assert()
        .success();
    let out = stdout(&a);
    assert!(out.starts_with(&format!("doctor node/{NODE}\n")));
    assert!(out.contains("PASS  agent.pod"), "{out}");
    assert!(
        out.ends_with("6 passed, 0 warnings, 0 failed, 0 skipped\n"),
        "{out}"
    );
    let reqs = server.requests();
    // doctor only reads.
    assert!(
        reqs.iter().all(|r| r.method == "GET" && r.body.is_empty()),
        "{reqs:?}"
    );
    let list = reqs
        .iter()
        .find(|r| r.target.starts_with("/api/v1/pods?"))
        .expect("pod list");
    assert!(
        list.target
            .contains(&format!("fieldSelector=spec.nodeName={NODE}")),
        "{}",
        list.target
    );
}

#[test]
fn node_doctor_json_on_a_broken_node_exits_1() {
    let server = FakeApiServer::start(routes(
        "node-erdma-driver-failed.json",
        "pods-on-node-agent-crashloop.json",
    ));
    let dir = tempfile::tempdir().unwrap();
    let kc = server.kubeconfig(dir.path());
    let a = erdmactl()
        .args(["doctor", "--node", NODE, "-o", "json", "--kubeconfig"])
        .arg(&kc)
        .assert()
        .code(1);
    let v: serde_json::Value = serde_json::from_str(&stdout(&a)).unwrap();
    assert_eq!(v["summary"]["fail"], 4);
    insta::assert_json_snapshot!("doctor_node_driver_failed", v);
}

#[test]
fn pod_doctor_reports_the_pending_reasons() {
    let server = FakeApiServer::start(routes(
        "node-erdma-ready.json",
        "pods-on-node-agent-running.json",
    ));
    let dir = tempfile::tempdir().unwrap();
    let kc = server.kubeconfig(dir.path());
    let a = erdmactl()
        .args(["doctor", "--pod", "pt-erdma-master-0", "--kubeconfig"])
        .arg(&kc)
        .assert()
        .code(1);
    insta::assert_snapshot!("doctor_pod_pending_text", stdout(&a));
    let reqs = server.requests();
    let ev = reqs
        .iter()
        .find(|r| r.target.contains("/events?"))
        .expect("events listed");
    assert!(
        ev.target.contains(
            "fieldSelector=involvedObject.kind=Pod,involvedObject.name=pt-erdma-master-0"
        ),
        "{}",
        ev.target
    );
}

#[test]
fn pod_doctor_smcr_peer_and_node_checks() {
    let server = FakeApiServer::start(routes(
        "node-erdma-ready.json",
        "pods-on-node-agent-running.json",
    ));
    let dir = tempfile::tempdir().unwrap();
    let kc = server.kubeconfig(dir.path());
    let a = erdmactl()
        .args([
            "doctor",
            "-n",
            "default",
            "--pod",
            "smc-server-6d5f7c9b8-x2kq4",
            "--peer",
            "smc-client-7b9c8d6f5-mn3vz",
        ])
        .args(["-o", "json", "--kubeconfig"])
        .arg(&kc)
        .assert()
        .code(1);
    let v: serde_json::Value = serde_json::from_str(&stdout(&a)).unwrap();
    let ids: Vec<(String, String)> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(ids.contains(&("pod.smcr".into(), "FAIL".into())));
    assert!(ids.contains(&("pod.smcr.peer".into(), "FAIL".into())));
    // The pod's node is checked too.
    assert!(ids.contains(&("node.allocatable".into(), "PASS".into())));
    assert!(ids.contains(&("agent.pod".into(), "PASS".into())));
}

#[test]
fn missing_objects_and_unreachable_api_are_errors_not_panics() {
    let server = FakeApiServer::start(vec![]);
    let dir = tempfile::tempdir().unwrap();
    let kc = server.kubeconfig(dir.path());
    let a = erdmactl()
        .args(["doctor", "--node", "nope", "--kubeconfig"])
        .arg(&kc)
        .assert()
        .code(2);
    let err = String::from_utf8(a.get_output().stderr.clone()).unwrap();
    assert_eq!(
        err,
        "erdmactl: node nope not found: list nodes with kubectl get nodes\n"
    );
    let a = erdmactl()
        .args(["doctor", "--pod", "ghost", "--kubeconfig"])
        .arg(&kc)
        .assert()
        .code(2);
    let err = String::from_utf8(a.get_output().stderr.clone()).unwrap();
    assert!(
        err.starts_with("erdmactl: pod default/ghost not found"),
        "{err}"
    );
    drop(server);
    let a = erdmactl()
        .args([
            "doctor",
            "--node",
            "x",
            "--kubeconfig",
            "/nonexistent/kubeconfig",
        ])
        .assert()
        .code(2);
    let err = String::from_utf8(a.get_output().stderr.clone()).unwrap();
    assert!(
        err.contains("reading kubeconfig /nonexistent/kubeconfig"),
        "{err}"
    );
}

#[test]
fn local_mode_on_fixture_trees() {
    let plugins = tempfile::tempdir().unwrap();
    let run = |tree: &str| {
        let a = erdmactl()
            .args([
                "doctor",
                "--local",
                "--agent-addr",
                "off",
                "-o",
                "json",
                "--sysfs-root",
                &format!("testdata/sysfs/{tree}/sys"),
            ])
            .arg("--kubelet-dir")
            .arg(plugins.path())
            .arg("--nri-socket")
            .arg(plugins.path().join("nri.sock"))
            .assert();
        let code = a.get_output().status.code();
        let v: serde_json::Value = serde_json::from_str(&stdout(&a)).unwrap();
        (code, v)
    };
    let (code, v) = run("erdma-compat");
    assert_eq!(code, Some(0));
    assert_eq!(v["summary"]["fail"], 0);
    let (code, v) = run("erdma-iwarp");
    assert_eq!(code, Some(0));
    assert_eq!(v["summary"]["warn"], 2, "iWARP devices warn about NCCL");
    let (code, v) = run("rxe-6.12");
    assert_eq!(code, Some(1));
    assert_eq!(v["checks"][0]["id"], "local.devices");
    assert!(
        v["checks"][0]["message"]
            .as_str()
            .unwrap()
            .contains("no eRDMA device")
    );
    let (code, v) = run("broken-no-uverbs");
    let dir = plugins.path().display().to_string();
    let v: serde_json::Value =
        serde_json::from_str(&v.to_string().replace(&dir, "<kubelet-dir>")).unwrap();
    insta::assert_json_snapshot!("doctor_local_broken_no_uverbs", (code, v));
}

/// `--exec` runs `kubectl exec … ls -1 <paths>` with the same kubeconfig; a stand-in `kubectl` on
/// PATH records its arguments and prints a recorded listing.
#[test]
fn exec_probe_lists_the_rdma_libraries_through_kubectl() {
    use std::os::unix::fs::PermissionsExt;
    let server = FakeApiServer::start(routes(
        "node-erdma-ready.json",
        "pods-on-node-agent-running.json",
    ));
    let dir = tempfile::tempdir().unwrap();
    let kc = server.kubeconfig(dir.path());
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let args_file = dir.path().join("kubectl-args");
    let listing = workspace().join("testdata/k8s/exec-ls-stock-jammy.txt");
    let script = format!(
        "#!/bin/sh\necho \"$@\" > '{}'\ncat '{}'\necho 'ls: cannot access /usr/lib64/libibverbs: No such file or directory' >&2\nexit 2\n",
        args_file.display(),
        listing.display()
    );
    let kubectl = bin.join("kubectl");
    std::fs::write(&kubectl, script).unwrap();
    std::fs::set_permissions(&kubectl, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let a = erdmactl()
        .env("PATH", path)
        .args([
            "doctor",
            "--pod",
            "smc-server-6d5f7c9b8-x2kq4",
            "--exec",
            "-o",
            "json",
            "--kubeconfig",
        ])
        .arg(&kc)
        .assert()
        .code(1);
    let v: serde_json::Value = serde_json::from_str(&stdout(&a)).unwrap();
    let libs = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "pod.rdma_libs")
        .unwrap()
        .clone();
    assert_eq!(libs["status"], "FAIL");
    assert!(
        libs["message"]
            .as_str()
            .unwrap()
            .contains("eRDMA provider (liberdma-rdmav*.so) is missing")
    );
    let args = std::fs::read_to_string(&args_file).unwrap();
    assert!(
        args.starts_with(&format!(
            "--kubeconfig {} exec -n default smc-server-6d5f7c9b8-x2kq4 -c server -- ls -1 /usr/lib/x86_64-linux-gnu/libibverbs.so.1",
            kc.display()
        )),
        "{args}"
    );
}

#[test]
fn local_mode_asks_the_agent_healthz() {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"ok\":true,\"registered\":false}\n");
        }
    });
    let plugins = tempfile::tempdir().unwrap();
    let a = erdmactl()
        .args([
            "doctor",
            "--agent-addr",
            &addr,
            "--sysfs-root",
            "testdata/sysfs/erdma-compat/sys",
        ])
        .arg("--kubelet-dir")
        .arg(plugins.path())
        .assert()
        .code(1);
    let out = stdout(&a);
    let line = out
        .lines()
        .find(|l| l.starts_with("FAIL  local.agent "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.ends_with(&format!(
            "agent on {addr} is up but its device plugin is not registered with the kubelet"
        )),
        "{out}"
    );
    assert!(out.contains("PASS  local.device-plugins "), "{out}");
    let a = erdmactl()
        .args([
            "doctor",
            "--agent-addr",
            "nowhere",
            "--sysfs-root",
            "testdata/sysfs/erdma-compat/sys",
        ])
        .arg("--kubelet-dir")
        .arg(plugins.path())
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert!(
        err.contains("--agent-addr \"nowhere\" is not HOST:PORT"),
        "a malformed --agent-addr is a usage error (exit 2), not a WARN: {err}"
    );
    // HOST:PORT with a name, as the help says: resolved and asked (here nothing listens).
    let a = erdmactl()
        .args([
            "doctor",
            "--agent-addr",
            "localhost:1",
            "--sysfs-root",
            "testdata/sysfs/erdma-compat/sys",
        ])
        .arg("--kubelet-dir")
        .arg(plugins.path())
        .assert()
        .code(0);
    let out = stdout(&a);
    assert!(
        out.lines().any(|l| l.starts_with("WARN  local.agent ")
            && l.contains("no erdma agent answered on localhost:1: connect ")),
        "{out}"
    );
}

/// Terway's eRDMA ENI plugin listening in the device-plugin directory fails the local doctor with
/// terway's fix; its socket left behind by a stopped terway only warns.
#[test]
fn local_mode_finds_terways_erdma_plugin() {
    let plugins = tempfile::tempdir().unwrap();
    let sock = plugins.path().join("1700000000-erdma-eni.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let run = || {
        let a = erdmactl()
            .args([
                "doctor",
                "--agent-addr",
                "off",
                "-o",
                "json",
                "--sysfs-root",
                "testdata/sysfs/erdma-compat/sys",
            ])
            .arg("--kubelet-dir")
            .arg(plugins.path())
            .assert();
        let code = a.get_output().status.code();
        let v: serde_json::Value = serde_json::from_str(&stdout(&a)).unwrap();
        let c = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == "local.device-plugins")
            .cloned()
            .unwrap();
        (code, c)
    };
    let (code, c) = run();
    assert_eq!(code, Some(1));
    assert_eq!(c["status"], "FAIL");
    assert!(c["message"].as_str().unwrap().contains("terway's eRDMA ENI device plugin is running (socket 1700000000-erdma-eni.sock accepts connections)"), "{c}");
    assert!(
        c["hint"]
            .as_str()
            .unwrap()
            .contains("\"enable_erdma\": false"),
        "{c}"
    );
    drop(listener);
    let (code, c) = run();
    assert_eq!(code, Some(0));
    assert_eq!(c["status"], "WARN", "{c}");
}
