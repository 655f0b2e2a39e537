//! `erdmactl top pods|devices` as a binary: against fake agents serving `/usage` on local ports,
//! read directly (`--agent-addr`) and through the fake API server's pod proxy.

mod fake_cluster;

use assert_cmd::Command;
use fake_cluster::Cluster;
use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodSpec, PodStatus};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

fn erdmactl() -> Command {
    let mut c = Command::cargo_bin("erdmactl").unwrap();
    c.env_remove("KUBECONFIG");
    c
}

/// A fake agent: the n-th request for `/usage` gets `bodies[n]` (the last one from then on).
fn agent(bodies: Vec<String>) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 2048];
            let n = s.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]).to_string();
            let answer = if req.starts_with("GET /usage ") {
                let i = count.fetch_add(1, Ordering::SeqCst).min(bodies.len() - 1);
                if bodies[i].starts_with("HTTP/1.0 ") {
                    // A whole answer (another status).
                    bodies[i].clone()
                } else {
                    format!(
                        "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{}",
                        bodies[i]
                    )
                }
            } else {
                "HTTP/1.0 404 Not Found\r\n\r\nnot found\n".to_string()
            };
            let _ = s.write_all(answer.as_bytes());
        }
    });
    (addr, served)
}

fn usage(node: &str, at: u64, tx: u64, rx: u64) -> String {
    serde_json::json!({
        "node": node, "collectedAtUnixMs": at, "available": true,
        "pods": [
            {"namespace": "ml", "name": "trainer-0", "uid": "u0", "containers": ["c0"],
             "devices": [{"device": "erdma_0", "allocated": true, "qps": 3,
                          "qpsByState": {"RTS": 2, "INIT": 1}, "mrs": 2,
                          "mrBytes": 1048576, "cqs": 2, "pds": 1}]},
            {"namespace": "web", "name": "cache-1", "uid": "u1", "containers": [],
             "devices": [{"device": "erdma_1", "allocated": true, "qps": 0,
                          "qpsByState": {}, "mrs": 0, "mrBytes": 0, "cqs": 0, "pds": 0}]}
        ],
        "devices": [
            {"device": "erdma_0", "holders": ["ml/trainer-0"], "traffic": "pod",
             "trafficPod": "ml/trainer-0",
             "ports": [{"port": 1, "txBytes": tx, "rxBytes": rx, "txPackets": 10, "rxPackets": 20,
                        "counters": {"tx_bytes_cnt": tx, "rx_bytes_cnt": rx}}]},
            {"device": "erdma_1", "holders": ["web/cache-1"], "traffic": "unused", "ports": []}
        ],
        "others": []
    })
    .to_string()
}

fn stdout(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8(a.get_output().stdout.clone()).unwrap()
}

fn stderr(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8(a.get_output().stderr.clone()).unwrap()
}

fn closed_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[test]
fn top_pods_from_one_agent_table_and_json() {
    let (addr, _) = agent(vec![usage("node-a", 1000, 0, 0)]);
    let a = erdmactl()
        .args(["top", "pods", "--agent-addr", &addr.to_string()])
        .assert()
        .code(0);
    let out = stdout(&a);
    let lines: Vec<&str> = out.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAMESPACE",
            "POD",
            "NODE",
            "DEVICE",
            "QPS(RTS/TOTAL)",
            "MR-BYTES",
            "CQS",
            "PDS"
        ]
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        row,
        [
            "ml",
            "trainer-0",
            "node-a",
            "erdma_0",
            "2/3",
            "1.0MiB",
            "2",
            "1"
        ]
    );
    assert_eq!(lines.len(), 3, "{out}");
    // -n keeps one namespace; --sort-by qps puts the most QPs first.
    let a = erdmactl()
        .args([
            "top",
            "pods",
            "-n",
            "web",
            "--agent-addr",
            &addr.to_string(),
        ])
        .assert()
        .code(0);
    let out = stdout(&a);
    assert!(
        out.contains("cache-1") && !out.contains("trainer-0"),
        "{out}"
    );
    // JSON: the raw bytes.
    let a = erdmactl()
        .args([
            "top",
            "pods",
            "-o",
            "json",
            "--agent-addr",
            &addr.to_string(),
        ])
        .assert()
        .code(0);
    let v: serde_json::Value = serde_json::from_str(&stdout(&a)).unwrap();
    assert_eq!(v["kind"], "UsageList");
    assert_eq!(v["items"][0]["node"], "node-a");
    assert_eq!(v["items"][0]["pods"][0]["devices"][0]["mrBytes"], 1048576);
    assert_eq!(
        v["items"][0]["pods"][0]["devices"][0]["qpsByState"]["RTS"],
        2
    );
    assert_eq!(v["unreachable"], serde_json::json!([]));
}

#[test]
fn top_devices_rates_from_two_samples_over_the_agents_interval() {
    // Two samples 2 s apart by the agent's clock: 4000 bytes sent, 2048 received.
    let (addr, served) = agent(vec![
        usage("node-a", 10_000, 1_000, 0),
        usage("node-a", 12_000, 5_000, 2_048),
    ]);
    let a = erdmactl()
        .args([
            "top",
            "devices",
            "--interval",
            "100ms",
            "-o",
            "json",
            "--agent-addr",
            &addr.to_string(),
        ])
        .assert()
        .code(0);
    assert_eq!(served.load(Ordering::SeqCst), 2);
    let v: serde_json::Value = serde_json::from_str(&stdout(&a)).unwrap();
    let d = &v["items"][0];
    assert_eq!(d["device"], "erdma_0");
    assert_eq!(d["txBytes"], 5_000);
    assert_eq!(d["rxBytes"], 2_048);
    assert_eq!(d["txBytesPerSecond"], 2_000.0);
    assert_eq!(d["rxBytesPerSecond"], 1_024.0);
    assert_eq!(d["txPacketsPerSecond"], 0.0);
    assert_eq!(d["intervalSeconds"], 2.0);
    assert_eq!(d["traffic"], "pod");
    assert_eq!(d["ports"][0]["counters"]["tx_bytes_cnt"], 5_000);
    // erdma_1 counts no bytes: no rate.
    assert_eq!(v["items"][1]["txBytesPerSecond"], serde_json::Value::Null);

    let (addr, _) = agent(vec![
        usage("node-a", 10_000, 1_000, 0),
        usage("node-a", 12_000, 5_000, 2_048),
    ]);
    let a = erdmactl()
        .args([
            "top",
            "devices",
            "--interval",
            "100ms",
            "--agent-addr",
            &addr.to_string(),
        ])
        .assert()
        .code(0);
    let out = stdout(&a);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "NODE",
            "DEVICE",
            "HOLDERS",
            "TRAFFIC",
            "TX-BYTES/s",
            "RX-BYTES/s"
        ]
    );
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        [
            "node-a",
            "erdma_0",
            "ml/trainer-0",
            "pod",
            "ml/trainer-0",
            "2.0KiB/s",
            "1.0KiB/s"
        ]
    );
    assert_eq!(
        lines[2].split_whitespace().collect::<Vec<_>>(),
        ["node-a", "erdma_1", "web/cache-1", "unused", "-", "-"]
    );
}

#[test]
fn watch_on_a_pipe_prints_one_block_per_sample() {
    let (addr, served) = agent(vec![
        usage("node-a", 1_000, 0, 0),
        usage("node-a", 2_000, 1_024, 0),
        usage("node-a", 3_000, 3_072, 0),
    ]);
    let a = erdmactl()
        .args([
            "top",
            "devices",
            "--watch",
            "--count",
            "2",
            "--interval",
            "50ms",
            "--agent-addr",
            &addr.to_string(),
        ])
        .assert()
        .code(0);
    let out = stdout(&a);
    assert!(
        !out.contains('\x1b'),
        "no screen clearing on a pipe: {out:?}"
    );
    let blocks: Vec<&str> = out.split("\n\n").collect();
    assert_eq!(blocks.len(), 2, "{out}");
    assert!(blocks[0].contains("1.0KiB/s"), "{out}");
    assert!(blocks[1].contains("2.0KiB/s"), "{out}");
    assert_eq!(served.load(Ordering::SeqCst), 3);
}

#[test]
fn an_unreachable_agent_is_named_on_stderr_and_exits_1() {
    let addr = closed_port().to_string();
    let a = erdmactl()
        .args(["top", "pods", "--agent-addr", &addr])
        .assert()
        .code(1);
    let err = stderr(&a);
    assert!(
        err.contains(&format!(
            "erdmactl: node {addr}: agent {addr}: connect {addr}"
        )),
        "{err}"
    );
    // An agent that cannot read usage fails too, with its reason (it answers 503 with its JSON).
    let (addr, _) = agent(vec![
        "HTTP/1.0 503 Service Unavailable\r\n\r\n{\"collectedAtUnixMs\": 1, \"available\": false, \"error\": \"RDMA netlink unavailable\"}".into(),
    ]);
    let a = erdmactl()
        .args(["top", "pods", "--agent-addr", &addr.to_string()])
        .assert()
        .code(1);
    assert!(
        stderr(&a).contains("the agent cannot read RDMA usage: RDMA netlink unavailable"),
        "{}",
        stderr(&a)
    );
}

#[test]
fn usage_errors_exit_2() {
    let a = erdmactl()
        .args([
            "top",
            "pods",
            "--sort-by",
            "tx",
            "--agent-addr",
            "127.0.0.1:1",
        ])
        .assert()
        .code(2);
    assert!(stderr(&a).contains("--sort-by tx|rx is for top devices"));
    erdmactl()
        .args([
            "top",
            "pods",
            "--interval",
            "soon",
            "--agent-addr",
            "127.0.0.1:1",
        ])
        .assert()
        .code(2);
    erdmactl()
        .args(["top", "pods", "--node", "n", "--agent-addr", "127.0.0.1:1"])
        .assert()
        .code(2);
}

fn cluster() -> Cluster {
    fake_cluster::start()
}

fn agent_pod(name: &str, node: &str, ip: &str, phase: &str) -> Pod {
    Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("erdma-system".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "agent".into(),
                image: Some("registry.example/erdma/erdma-agent:v1".into()),
                ports: Some(vec![ContainerPort {
                    name: Some("metrics".into()),
                    container_port: 9101,
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some(phase.into()),
            pod_ip: Some(ip.into()),
            ..Default::default()
        }),
    }
}

#[test]
fn top_through_the_api_servers_pod_proxy() {
    let c = cluster();
    let (a_addr, _) = agent(vec![usage("ignored-name", 1_000, 0, 0)]);
    c.api
        .put(&agent_pod("erdma-agent-a", "node-a", "10.0.0.1", "Running"));
    c.api
        .proxy_pod("erdma-system", "erdma-agent-a", 9101, a_addr);
    // node-b's agent: its IP answers nothing on 9101 (the proxy's dial fails).
    c.api.put(&agent_pod(
        "erdma-agent-b",
        "node-b",
        "127.0.0.1",
        "Running",
    ));
    c.api
        .proxy_pod("erdma-system", "erdma-agent-b", 9101, closed_port());
    c.api
        .put(&agent_pod("erdma-agent-c", "node-c", "10.0.0.3", "Pending"));
    // node-d's agent has usage off: 503 with its JSON, reported at once (no retries).
    let (d_addr, d_served) = agent(vec![
        "HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n\r\n{\"collectedAtUnixMs\": 0, \"available\": false, \"error\": \"RDMA usage is off on this agent (--rdma-usage=false)\"}".to_string(),
    ]);
    c.api
        .put(&agent_pod("erdma-agent-d", "node-d", "10.0.0.4", "Running"));
    c.api
        .proxy_pod("erdma-system", "erdma-agent-d", 9101, d_addr);
    let a = erdmactl()
        .args(["top", "pods", "-A", "--kubeconfig"])
        .arg(&c.kubeconfig)
        .assert()
        .code(1);
    let out = stdout(&a);
    let err = stderr(&a);
    // The node is the agent pod's node, not what the agent calls itself.
    assert!(
        out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == [
                "ml",
                "trainer-0",
                "node-a",
                "erdma_0",
                "2/3",
                "1.0MiB",
                "2",
                "1"
            ]),
        "{out}"
    );
    assert!(
        err.contains(
            "erdmactl: node node-b: agent erdma-system/erdma-agent-b: the API server's pod proxy answered 500: error trying to reach service: dial tcp"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "erdmactl: node node-c: agent erdma-system/erdma-agent-c: the agent pod is Pending, not Running"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "erdmactl: node node-d: agent erdma-system/erdma-agent-d: the agent cannot read RDMA usage: RDMA usage is off on this agent (--rdma-usage=false)"
        ),
        "{err}"
    );
    assert_eq!(d_served.load(Ordering::SeqCst), 1, "a 503 is not retried");
    let proxied = c.api.requests_matching("GET", "/proxy/usage");
    assert!(
        proxied
            .iter()
            .any(|r| r
                .contains("/api/v1/namespaces/erdma-system/pods/erdma-agent-a:9101/proxy/usage")),
        "{proxied:?}"
    );
    // --node reads one node; without -A only the context's namespace (default) is shown.
    let a = erdmactl()
        .args(["top", "pods", "--node", "node-a", "--kubeconfig"])
        .arg(&c.kubeconfig)
        .assert()
        .code(0);
    assert_eq!(stdout(&a), "No pods hold or use an RDMA device.\n");
    let a = erdmactl()
        .args([
            "top",
            "pods",
            "--node",
            "node-a",
            "-n",
            "ml",
            "-o",
            "json",
            "--kubeconfig",
        ])
        .arg(&c.kubeconfig)
        .assert()
        .code(0);
    let v: serde_json::Value = serde_json::from_str(&stdout(&a)).unwrap();
    assert_eq!(v["items"][0]["node"], "node-a");
    assert_eq!(v["items"][0]["pods"].as_array().unwrap().len(), 1);
    // A node without an agent pod is named.
    let a = erdmactl()
        .args(["top", "pods", "--node", "node-z", "--kubeconfig"])
        .arg(&c.kubeconfig)
        .assert()
        .code(1);
    assert!(
        stderr(&a).contains("erdmactl: node node-z: no erdma agent pod runs on this node"),
        "{}",
        stderr(&a)
    );
}

#[test]
fn an_agent_answering_its_previous_read_is_asked_again_for_rates() {
    // The agent reads the kernel at most every 2 s: the second answer is the first one again.
    let (addr, served) = agent(vec![
        usage("node-a", 10_000, 1_000, 0),
        usage("node-a", 10_000, 1_000, 0),
        usage("node-a", 12_000, 3_000, 0),
    ]);
    let a = erdmactl()
        .args([
            "top",
            "devices",
            "--interval",
            "50ms",
            "-o",
            "json",
            "--agent-addr",
            &addr.to_string(),
        ])
        .assert()
        .code(0);
    assert_eq!(served.load(Ordering::SeqCst), 3);
    let v: serde_json::Value = serde_json::from_str(&stdout(&a)).unwrap();
    assert_eq!(v["items"][0]["txBytesPerSecond"], 1_000.0);
    assert_eq!(v["items"][0]["intervalSeconds"], 2.0);
}
