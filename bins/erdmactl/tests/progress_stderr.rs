//! Progress on stderr (issue 30, item 3): a request to the API server unanswered after a second
//! is reported on stderr ("erdmactl: waiting for the API server at …: <what> (1 s)…", again at
//! 2, 4 … s), for every command that talks to a cluster; stdout keeps only the command's output,
//! byte for byte what a fast server gives. The process guard only keeps a regression from
//! hanging the test run; nothing here measures time.

mod fake_apiserver;

use fake_apiserver::{FakeApiServer, Route};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

const GUARD: Duration = Duration::from_secs(120);
const PREFIX: &str = "erdmactl: waiting for the API server at ";

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kubeconfig(dir: &Path, url: &str) -> PathBuf {
    let path = dir.join(format!(
        "kubeconfig-{}",
        url.rsplit(':').next().unwrap_or("x")
    ));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{url}\"}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u, namespace: default}}}}]\ncurrent-context: c\nusers: [{{name: u, user: {{}}}}]\n"
        ),
    )
    .unwrap();
    path
}

fn erdmactl(args: &[&str]) -> std::process::Output {
    assert_cmd::Command::cargo_bin("erdmactl")
        .unwrap()
        .env_remove("KUBECONFIG")
        .env("HOME", "/nonexistent")
        .current_dir(workspace())
        .args(args)
        .timeout(GUARD)
        .output()
        .unwrap()
}

/// Accepts every connection and holds it without a byte of answer.
fn silent() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in listener.incoming().flatten() {
            held.push(c);
        }
    });
    url
}

/// Passes connections to `upstream`, the first one only after `delay`.
fn delaying_proxy(upstream: u16, delay: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for (n, client) in listener.incoming().flatten().enumerate() {
            std::thread::spawn(move || {
                if n == 0 {
                    std::thread::sleep(delay);
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    return;
                };
                let pipe = |mut from: TcpStream, mut to: TcpStream| {
                    let mut buf = [0u8; 8192];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 || to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Write);
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let up = std::thread::spawn(move || pipe(c2, s2));
                pipe(server, client);
                let _ = up.join();
            });
        }
    });
    url
}

fn waiting_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.starts_with(PREFIX)).collect()
}

#[test]
fn every_cluster_command_reports_a_silent_api_server_on_stderr_only() {
    let url = silent();
    let dir = tempfile::tempdir().unwrap();
    let kc = kubeconfig(dir.path(), &url);
    let kc = kc.to_str().unwrap();
    let t = ["--kubeconfig", kc, "--request-timeout", "3s"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            [&["doctor", "--node", "n1"][..], &t].concat(),
            "getting nodes/n1",
        ),
        (
            [&["doctor", "--pod", "p1", "-n", "team"][..], &t].concat(),
            "in namespace team",
        ),
        (
            [&["install", "--credentials-type", "ecs_ram_role"][..], &t].concat(),
            "",
        ),
        ([&["uninstall"][..], &t].concat(), ""),
        (
            [
                &["submit", "pytorch", "--name", "j", "--image", "i"][..],
                &t,
                &["--", "python", "t.py"],
            ]
            .concat(),
            "",
        ),
    ];
    for (args, what) in cases {
        let out = erdmactl(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            out.stdout.is_empty(),
            "{args:?}: stdout must stay clean: {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        let lines = waiting_lines(&stderr);
        assert!(!lines.is_empty(), "{args:?}: no progress line: {stderr}");
        let first = lines[0];
        assert!(
            first.starts_with(&format!("{PREFIX}{url}: ")) && first.ends_with(" (1 s)…"),
            "{args:?}: {first}"
        );
        assert!(
            first.contains(what),
            "{args:?}: {first:?} should name {what:?}"
        );
        assert!(
            lines.len() <= 2,
            "{args:?}: reports at 1 and 2 s, none at the 3 s deadline: {lines:?}"
        );
        assert!(stderr.contains("--request-timeout"), "{args:?}: {stderr}");
    }
}

fn routes() -> Vec<Route> {
    let fixture =
        |name: &str| std::fs::read_to_string(workspace().join("testdata/k8s").join(name)).unwrap();
    vec![
        (
            "GET",
            "/api/v1/nodes/cn-hangzhou.192.0.2.23".into(),
            200,
            fixture("node-erdma-ready.json"),
        ),
        (
            "GET",
            "/api/v1/pods?".into(),
            200,
            fixture("pods-on-node-agent-running.json"),
        ),
    ]
}

#[test]
fn a_slow_answer_is_reported_and_stdout_is_what_a_fast_one_gives() {
    let server = FakeApiServer::start(routes());
    let dir = tempfile::tempdir().unwrap();
    let direct = server.kubeconfig(dir.path());
    let run = |kc: &Path, format: &str| {
        erdmactl(&[
            "doctor",
            "--node",
            "cn-hangzhou.192.0.2.23",
            "-o",
            format,
            "--kubeconfig",
            kc.to_str().unwrap(),
        ])
    };
    for format in ["table", "json"] {
        // A proxy per run: only its first connection is held back.
        let slow = delaying_proxy(server.port, Duration::from_millis(2500));
        let fast = run(&direct, format);
        let late = run(&kubeconfig(dir.path(), &slow), format);
        let late_err = String::from_utf8_lossy(&late.stderr);
        assert_eq!(fast.status.code(), Some(0), "{format}");
        assert_eq!(late.status.code(), Some(0), "{format}: {late_err}");
        assert_eq!(
            String::from_utf8_lossy(&late.stdout),
            String::from_utf8_lossy(&fast.stdout),
            "{format}: stdout is the same, however slow the server"
        );
        assert!(
            waiting_lines(&String::from_utf8_lossy(&fast.stderr)).is_empty(),
            "{format}: nothing reported for a fast server"
        );
        let lines = waiting_lines(&late_err);
        assert!(
            lines
                .first()
                .is_some_and(|l| l.starts_with(&format!("{PREFIX}{slow}: "))
                    && l.contains("getting nodes/cn-hangzhou.192.0.2.23")
                    && l.ends_with(" (1 s)…")),
            "{format}: {late_err}"
        );
        if format == "json" {
            let v: serde_json::Value =
                serde_json::from_slice(&late.stdout).expect("stdout is one JSON document");
            assert!(v.is_object(), "{v}");
        }
    }
    let node_gets = server
        .requests()
        .iter()
        .filter(|r| {
            r.method == "GET"
                && r.target == "/api/v1/nodes/cn-hangzhou.192.0.2.23"
                && r.body.is_empty()
        })
        .count();
    assert_eq!(node_gets, 4, "both runs of both formats read the node once");
}
