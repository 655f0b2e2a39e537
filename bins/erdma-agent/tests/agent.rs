//! The real `erdma-agent` binary against a fixture node tree and the fake kubelet.

use erdma_fake_kubelet::{AllocateOptions, FakeKubelet, FakeKubeletConfig};
use erdma_host::fake::NodeTree;
use erdma_host::fixtures;
use erdma_kubelet::uds::{self, ClientAuthority};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const RESOURCE: &str = "aliyun/erdma";
/// How long a test waits for something that must happen: generous (CI shares two cores with other
/// builds); latency targets are gates in `scripts/bench.sh`, not test assertions.
const DEADLINE: Duration = Duration::from_secs(10);

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn_agent(tree: &NodeTree, dir: &std::path::Path, extra: &[&str]) -> Agent {
    let mut args = vec!["--local-eri-discovery"];
    args.extend_from_slice(extra);
    spawn_agent_with(tree, dir, &args)
}

/// The agent outside a cluster (`NODE_NAME` unset) with `--prefer-driver none` and `extra`.
fn spawn_agent_with(tree: &NodeTree, dir: &std::path::Path, extra: &[&str]) -> Agent {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_erdma-agent"));
    cmd.arg("--sysfs-root")
        .arg(tree.sys())
        .arg("--dev-root")
        .arg(tree.dev())
        .arg("--kubelet-dir")
        .arg(dir)
        .args(["--slots-per-device", "5", "--prefer-driver", "none"])
        .args(extra)
        .env_remove("NODE_NAME")
        .env_remove("KUBECONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    Agent(cmd.spawn().expect("spawn erdma-agent"))
}

async fn http_get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_serves_fixture_devices_follows_health_survives_restarts_and_stops_on_sigterm() {
    let tree = NodeTree::temp();
    assert!(fixtures::build("erdma-iwarp", &tree));
    let dir = tempfile::Builder::new()
        .prefix("ag")
        .tempdir_in("/tmp")
        .unwrap();
    let kubelet = FakeKubelet::start(FakeKubeletConfig::new(dir.path()))
        .await
        .unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    // The fixture's operstate is a plain file, which sends no netlink event: the flip below is
    // seen by the safety poll, shortened here from its 10 s default.
    let mut agent = spawn_agent(
        &tree,
        dir.path(),
        &["--metrics-addr", &addr, "--poll-interval-ms", "100"],
    );

    // Registration and ListAndWatch contents from the real inventory of the fixture.
    let s = kubelet
        .wait_for(DEADLINE, |s| {
            s.resources
                .get(RESOURCE)
                .is_some_and(|r| r.devices.len() == 10)
        })
        .await
        .expect("agent registers");
    let r = &s.resources[RESOURCE];
    assert_eq!(r.endpoint, "erdma-aliyun_erdma-erdma.sock");
    for d in &r.devices {
        let expect = if d.id.starts_with("erdma_0/") { 0 } else { 1 };
        assert_eq!(d.numa, vec![expect], "{}", d.id);
        assert_eq!(d.health, "Healthy", "{}", d.id);
    }

    // Allocate through the socket-path authority like an old kubelet.
    let out = kubelet
        .allocate(&AllocateOptions {
            resource: RESOURCE.into(),
            count: 1,
            pod: "default/p".into(),
            container: "c".into(),
            authority: ClientAuthority::SocketPath,
        })
        .await
        .unwrap();
    let dev = out.device_ids[0].split('/').next().unwrap().to_string();
    // Fixture: erdma_0 is uverbs1 with MAC 00:16:3e:0a:1b:2c, erdma_1 is uverbs0 with ...:2d.
    let (uverbs, pnet) = if dev == "erdma_0" {
        ("uverbs1", "00163E0A1B2C")
    } else {
        ("uverbs0", "00163E0A1B2D")
    };
    let paths: Vec<&str> = out.devices.iter().map(|d| d.host_path.as_str()).collect();
    assert_eq!(
        paths,
        [
            format!("/dev/infiniband/{uverbs}").as_str(),
            "/dev/infiniband/rdma_cm"
        ]
    );
    assert_eq!(out.envs["SMCR_PNET"], pnet);
    assert_eq!(out.envs["ERDMA_DEVICES"], dev);

    // Health: netdev of erdma_0 goes down, then up again.
    let t = Instant::now();
    tree.set_operstate("eth1", "down");
    kubelet
        .wait_for(DEADLINE, |s| {
            s.resources[RESOURCE]
                .devices
                .iter()
                .filter(|d| d.id.starts_with("erdma_0/"))
                .all(|d| d.health == "Unhealthy")
        })
        .await
        .expect("unhealthy after operstate down");
    let down = t.elapsed();
    let t = Instant::now();
    tree.set_operstate("eth1", "up");
    kubelet
        .wait_for(DEADLINE, |s| {
            s.resources[RESOURCE]
                .devices
                .iter()
                .all(|d| d.health == "Healthy")
        })
        .await
        .expect("healthy again");
    let up = t.elapsed();
    // Printed, not asserted: the 250 ms target is a gate in scripts/bench.sh (the agent
    // benchmark, 20 flips on an otherwise idle machine); here the deadline only proves it happens.
    eprintln!("operstate flip -> ListAndWatch: down {down:?}, up {up:?}");

    // Kubelet restart: re-registered (the 1 s target is a scripts/bench.sh gate).
    let t = Instant::now();
    kubelet.restart().await.unwrap();
    kubelet
        .wait_for(DEADLINE, |s| {
            s.kubelet_restarts == 1
                && s.resources
                    .get(RESOURCE)
                    .is_some_and(|r| r.connected && r.devices.len() == 10)
        })
        .await
        .expect("re-registered");
    eprintln!("kubelet restart -> re-registered: {:?}", t.elapsed());

    // Metrics and health endpoints.
    let m = http_get(port, "/metrics").await;
    assert!(
        m.contains("erdma_deviceplugin_kubelet_restarts_total 1"),
        "{m}"
    );
    assert!(
        m.contains("erdma_deviceplugin_devices{health=\"healthy\",mode=\"iwarp\"} 2"),
        "{m}"
    );
    let mut healthz = String::new();
    for _ in 0..100 {
        healthz = http_get(port, "/healthz").await;
        if healthz.contains("\"registered\":true") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(healthz.contains("\"registered\":true"), "{healthz}");

    // SIGTERM: exit 0, socket removed.
    let sock = dir.path().join("erdma-aliyun_erdma-erdma.sock");
    assert!(uds::is_socket(&sock));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(st) = agent.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "agent did not exit within 5 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
    assert!(!sock.exists(), "socket removed on SIGTERM");
    kubelet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_filter_and_allow_list_select_devices() {
    let tree = NodeTree::temp();
    assert!(fixtures::build("erdma-iwarp", &tree));
    let dir = tempfile::Builder::new()
        .prefix("ag")
        .tempdir_in("/tmp")
        .unwrap();
    let kubelet = FakeKubelet::start(FakeKubeletConfig::new(dir.path()))
        .await
        .unwrap();
    // The metrics port is taken: logged, retried, and the devices are served anyway.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_addr = busy.local_addr().unwrap().to_string();
    let _agent = spawn_agent(
        &tree,
        dir.path(),
        &[
            "--metrics-addr",
            &busy_addr,
            "--instance-id",
            "i-test",
            "--exposed-local-eris",
            "i-test erdma_1",
        ],
    );
    let s = kubelet
        .wait_for(DEADLINE, |s| {
            s.resources.get(RESOURCE).is_some_and(|r| r.updates > 0)
        })
        .await
        .unwrap();
    let ids: Vec<&str> = s.resources[RESOURCE]
        .devices
        .iter()
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(
        ids,
        [
            "erdma_1/0",
            "erdma_1/1",
            "erdma_1/2",
            "erdma_1/3",
            "erdma_1/4"
        ]
    );
    kubelet.shutdown().await;

    // Serving rxe only: the erdma fixture has none, so the resource is advertised with no devices.
    let dir = tempfile::Builder::new()
        .prefix("ag")
        .tempdir_in("/tmp")
        .unwrap();
    let kubelet = FakeKubelet::start(FakeKubeletConfig::new(dir.path()))
        .await
        .unwrap();
    let _agent = spawn_agent(
        &tree,
        dir.path(),
        &["--metrics-addr", "off", "--rdma-driver", "rxe"],
    );
    let s = kubelet
        .wait_for(DEADLINE, |s| {
            s.resources.get(RESOURCE).is_some_and(|r| r.updates > 0)
        })
        .await
        .unwrap();
    assert!(s.resources[RESOURCE].devices.is_empty());
    kubelet.shutdown().await;
}

#[test]
fn bad_flags_exit_2_with_a_clear_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_erdma-agent"))
        .args(["--prefer-driver", "fake"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"fake\"") && err.contains("expected one of"),
        "{err}"
    );
}

async fn healthz_until(
    port: u16,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    for _ in 0..200 {
        let resp = tokio::time::timeout(Duration::from_secs(2), http_get(port, "/healthz")).await;
        let parsed = resp.ok().and_then(|r| {
            r.split_once("\r\n\r\n")
                .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(body).ok())
        });
        if let Some(v) = parsed {
            if ok(&v) {
                return v;
            }
            last = v;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("/healthz never showed {what}: {last}");
}

/// Without a cluster and without --local-eri-discovery: the resource is registered with no
/// devices, /healthz names the fix, and the agent keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cluster_or_local_discovery_nothing_is_served_and_the_fix_is_named() {
    let tree = NodeTree::temp();
    assert!(fixtures::build("erdma-iwarp", &tree));
    let dir = tempfile::Builder::new()
        .prefix("ag")
        .tempdir_in("/tmp")
        .unwrap();
    let kubelet = FakeKubelet::start(FakeKubeletConfig::new(dir.path()))
        .await
        .unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut agent = spawn_agent_with(&tree, dir.path(), &["--metrics-addr", &addr]);
    let s = kubelet
        .wait_for(DEADLINE, |s| {
            s.resources.get(RESOURCE).is_some_and(|r| r.updates > 0)
        })
        .await
        .unwrap();
    assert!(s.resources[RESOURCE].devices.is_empty());
    let h = healthz_until(port, "the ERI source error", |v| {
        v["eri_source"]
            .as_str()
            .is_some_and(|s| s.contains("--local-eri-discovery"))
    })
    .await;
    assert_eq!(h["eri_source_ready"], false);
    assert_eq!(h["driver"]["ready"], true);
    assert_eq!(h["excluded"].as_array().map(Vec::len), Some(2), "{h}");
    assert!(
        agent.0.try_wait().unwrap().is_none(),
        "the agent keeps running"
    );
    kubelet.shutdown().await;
}

/// --exposed-local-eris without --instance-id and no metadata service: the agent stays up,
/// serves only the i-* entries, and says why in /healthz.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_instance_id_serves_only_wildcard_entries_and_keeps_retrying() {
    let tree = NodeTree::temp();
    assert!(fixtures::build("erdma-iwarp", &tree));
    let dir = tempfile::Builder::new()
        .prefix("ag")
        .tempdir_in("/tmp")
        .unwrap();
    let kubelet = FakeKubelet::start(FakeKubeletConfig::new(dir.path()))
        .await
        .unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let dead = format!("http://127.0.0.1:{}", free_port());
    let mut agent = spawn_agent(
        &tree,
        dir.path(),
        &[
            "--metrics-addr",
            &addr,
            "--metadata-endpoint",
            &dead,
            "--exposed-local-eris",
            "i-* erdma_0",
        ],
    );
    let s = kubelet
        .wait_for(DEADLINE, |s| {
            s.resources
                .get(RESOURCE)
                .is_some_and(|r| r.devices.len() == 5)
        })
        .await
        .expect("the i-* entry is served");
    assert!(
        s.resources[RESOURCE]
            .devices
            .iter()
            .all(|d| d.id.starts_with("erdma_0/"))
    );
    let h = healthz_until(port, "the instance ID error", |v| {
        v["instance_id_error"].is_string()
    })
    .await;
    assert!(
        h["instance_id_error"]
            .as_str()
            .is_some_and(|e| e.contains("serving only i-* entries")),
        "{h}"
    );
    assert!(h["instance_id"].is_null());
    assert!(
        agent.0.try_wait().unwrap().is_none(),
        "the agent keeps running"
    );
    kubelet.shutdown().await;
}
