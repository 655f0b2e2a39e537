//! Per-pod RDMA usage through the real `erdma-agent` binary: a fake kernel answer
//! (`ERDMA_AGENT_FAKE_RDMA`), a fake `/proc` (`ERDMA_AGENT_PROC_ROOT`), the fake kubelet's
//! pod-resources answer, a fake container runtime and fake SMC sockets (`ERDMA_AGENT_FAKE_SMC`);
//! `/metrics` and `/usage` scraped over HTTP.

use erdma_cri::fake::FakeRuntime;
use erdma_cri::runtime::v1 as cri;
use erdma_cri::runtime::v1::runtime_service_server::RuntimeServiceServer;
use erdma_fake_kubelet::{AllocationRecord, FakeKubelet, FakeKubeletConfig};
use erdma_host::fake::NodeTree;
use erdma_host::fixtures;
use erdma_kubelet::uds;
use erdma_usage::report::{NodeUsage, TrafficKind};
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const RESOURCE: &str = "aliyun/erdma";
const DEADLINE: Duration = Duration::from_secs(20);
const UID: &str = "6a0b2c3d-1e2f-4a5b-8c7d-9e0f1a2b3c4d";

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

/// `(status, body)` of `GET path`.
async fn http_get(port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return (0, String::new());
    };
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    // Chunked or not: the JSON object or the exposition is what is left.
    let body = match (body.find('{'), path) {
        (Some(i), "/usage") => body[i..body.rfind('}').map_or(body.len(), |j| j + 1)].to_string(),
        _ => body.to_string(),
    };
    (status, body)
}

/// A ready sandbox that asks for SMC-R, its process `pid` (the runtime's verbose info).
fn sandbox(uid: &str, name: &str, pid: u32) -> (cri::PodSandboxStatus, String) {
    (
        cri::PodSandboxStatus {
            id: format!("sb-{name}"),
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: "ml".into(),
                attempt: 0,
            }),
            state: cri::PodSandboxState::SandboxReady as i32,
            created_at: 1,
            network: None,
            linux: None,
            labels: BTreeMap::new(),
            annotations: [(
                "network.alibabacloud.com/erdma-smcr".to_string(),
                "true".to_string(),
            )]
            .into_iter()
            .collect(),
            runtime_handler: String::new(),
        },
        format!(r#"{{"pid": {pid}}}"#),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_serves_usage_per_pod_in_metrics_and_usage() {
    let tree = NodeTree::temp();
    assert!(fixtures::build("erdma-iwarp", &tree));
    let dir = tempfile::Builder::new()
        .prefix("us")
        .tempdir_in("/tmp")
        .unwrap();
    let podres = dir.path().join("pod-resources.sock");
    let mut cfg = FakeKubeletConfig::new(dir.path());
    cfg.pod_resources_socket = Some(podres.clone());
    let _kubelet = FakeKubelet::start(cfg).await.unwrap();
    erdma_fake_kubelet::state::write_ledger(
        dir.path(),
        &[AllocationRecord {
            pod: "ml/trainer-0".into(),
            container: "main".into(),
            resource: RESOURCE.into(),
            device_ids: vec!["erdma_0/0".into()],
        }],
    )
    .unwrap();
    // The runtime knows the pod.
    let cri_sock = dir.path().join("containerd.sock");
    let stop = CancellationToken::new();
    let l = uds::bind(&cri_sock).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::new(FakeRuntime(vec![sandbox(
                UID,
                "trainer-0",
                4242,
            )])))
            .serve_with_incoming_shutdown(uds::incoming(l), stop.clone().cancelled_owned()),
    );
    // The kernel: the pod's process 4242 on erdma_0, a host process on erdma_1.
    let proc_root = dir.path().join("proc");
    std::fs::create_dir_all(proc_root.join("4242")).unwrap();
    std::fs::write(
        proc_root.join("4242/cgroup"),
        format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{}.scope\n",
            UID.replace('-', "_"),
            "cd".repeat(32)
        ),
    )
    .unwrap();
    // Its SMC sockets: two on SMC-R over erdma_0, one fell back (the peer offered no SMC).
    let netns = proc_root.join("4242/ns/net");
    let smc = dir.path().join("smc.txt");
    std::fs::write(
        &smc,
        format!(
            "{0} ACTIVE SMCR erdma_0\n{0} ACTIVE SMCR erdma_0\n{0} LISTEN SMCR\n{0} ACTIVE TCP 0x03010000\n",
            netns.display()
        ),
    )
    .unwrap();
    let kernel = dir.path().join("kernel.txt");
    let mut text = String::from(
        "device erdma_0 1\ndevice erdma_1 1\n\
         qp erdma_0 1 RTS kernel:ib_core\n\
         qp erdma_0 17 RTS 4242\nqp erdma_0 18 ERR 4242\nmr erdma_0 2097152 4242\n\
         qp erdma_1 20 RTS 9\n\
         counter erdma_0 1 tx_bytes_cnt 123456\ncounter erdma_0 1 rx_bytes_cnt 654321\n\
         counter erdma_0 1 tx_packets_cnt 100\ncounter erdma_0 1 rx_packets_cnt 200\n\
         counter erdma_0 1 rx_pps_limit_drop_cnt 5\n",
    );
    std::fs::write(&kernel, &text).unwrap();

    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _agent = Agent(
        Command::new(env!("CARGO_BIN_EXE_erdma-agent"))
            .arg("--sysfs-root")
            .arg(tree.sys())
            .arg("--dev-root")
            .arg(tree.dev())
            .arg("--kubelet-dir")
            .arg(dir.path())
            .arg("--pod-resources-socket")
            .arg(&podres)
            .arg("--cri-socket")
            .arg(&cri_sock)
            .args([
                "--local-eri-discovery",
                "--prefer-driver",
                "none",
                "--metrics-addr",
                &addr,
            ])
            .env("ERDMA_AGENT_FAKE_RDMA", &kernel)
            .env("ERDMA_AGENT_PROC_ROOT", &proc_root)
            .env("ERDMA_AGENT_FAKE_SMC", &smc)
            .env_remove("NODE_NAME")
            .env_remove("KUBECONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn erdma-agent"),
    );

    // /usage: the pod by name, its objects, the device's traffic its own. The pod-resources
    // answer comes with the owner's first refresh: wait for the allocation to show.
    let start = Instant::now();
    let usage = loop {
        let (status, body) = http_get(port, "/usage").await;
        if status == 200 {
            let u: NodeUsage =
                serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
            if u.pod("ml/trainer-0")
                .is_some_and(|p| p.devices.iter().any(|d| d.allocated))
            {
                break u;
            }
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no usage with the allocation: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(usage.available);
    let p = usage.pod("ml/trainer-0").unwrap();
    assert_eq!(p.uid, UID);
    assert_eq!(p.containers, vec!["cd".repeat(32)]);
    let d = p.devices.iter().find(|d| d.device == "erdma_0").unwrap();
    assert_eq!((d.counts.qps, d.counts.mr_bytes), (2, 2 << 20));
    assert_eq!(d.counts.qps_by_state["ERR"], 1);
    let e0 = usage.device("erdma_0").unwrap();
    assert_eq!(e0.traffic, TrafficKind::Pod);
    assert_eq!(e0.ports[0].tx_bytes, Some(123456));
    assert_eq!(
        usage.device("erdma_1").unwrap().traffic,
        TrafficKind::Shared
    );
    // The pod asks for SMC-R: its SMC sockets, read in its network namespace.
    let s = p.smc.as_ref().expect("an SMC summary");
    assert_eq!(
        (s.smcr, s.fallback_tcp, s.listening, s.error.as_deref()),
        (2, 1, 1, None),
        "{s:?}"
    );
    assert_eq!(s.devices, vec!["erdma_0"]);
    assert_eq!(s.fallback_reasons[0].name, "PEERNOSMC");

    // /metrics: the same read, as metrics.
    let (status, m) = http_get(port, "/metrics").await;
    assert_eq!(status, 200);
    for line in [
        r#"erdma_pod_qps{namespace="ml",pod="trainer-0",device="erdma_0",state="RTS"} 1"#,
        r#"erdma_pod_qps{namespace="ml",pod="trainer-0",device="erdma_0",state="ERR"} 1"#,
        r#"erdma_pod_mr_bytes{namespace="ml",pod="trainer-0",device="erdma_0"} 2097152"#,
        r#"erdma_device_tx_bytes_total{device="erdma_0",port="1"} 123456"#,
        r#"erdma_device_rx_bytes_total{device="erdma_0",port="1"} 654321"#,
        r#"erdma_device_errors_total{device="erdma_0",port="1",counter="rx_pps_limit_drop_cnt"} 5"#,
        r#"erdma_device_traffic_pod{device="erdma_0",namespace="ml",pod="trainer-0"} 1"#,
        r#"erdma_device_holders{device="erdma_1"} 0"#,
        "erdma_usage_available 1",
    ] {
        assert!(m.contains(line), "{line} missing from /metrics:\n{m}");
    }
    // The rest of the registry is still there.
    assert!(m.contains("erdma_deviceplugin_"), "{m}");

    // The pod's process ends: its objects leave the kernel's answer, and after the 2 s reuse the
    // pod's objects leave the metrics (it stays allocated, with nothing).
    text = text
        .lines()
        .filter(|l| !l.contains("4242"))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&kernel, &text).unwrap();
    std::fs::remove_dir_all(proc_root.join("4242")).unwrap();
    let start = Instant::now();
    loop {
        let (_, m) = http_get(port, "/metrics").await;
        if !m.contains("erdma_pod_qps{") {
            assert!(
                m.contains(
                    r#"erdma_pod_mr_bytes{namespace="ml",pod="trainer-0",device="erdma_0"} 0"#
                ),
                "{m}"
            );
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the ended process's QPs stay:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_off_answers_503_and_writes_no_usage_metrics() {
    let tree = NodeTree::temp();
    assert!(fixtures::build("erdma-iwarp", &tree));
    let dir = tempfile::Builder::new()
        .prefix("uo")
        .tempdir_in("/tmp")
        .unwrap();
    let _kubelet = FakeKubelet::start(FakeKubeletConfig::new(dir.path()))
        .await
        .unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _agent = Agent(
        Command::new(env!("CARGO_BIN_EXE_erdma-agent"))
            .arg("--sysfs-root")
            .arg(tree.sys())
            .arg("--dev-root")
            .arg(tree.dev())
            .arg("--kubelet-dir")
            .arg(dir.path())
            .args([
                "--local-eri-discovery",
                "--prefer-driver",
                "none",
                "--rdma-usage=false",
                "--metrics-addr",
                &addr,
            ])
            .env_remove("NODE_NAME")
            .env_remove("KUBECONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn erdma-agent"),
    );
    let start = Instant::now();
    let (status, body) = loop {
        let (status, body) = http_get(port, "/usage").await;
        if status != 0 {
            break (status, body);
        }
        assert!(start.elapsed() < DEADLINE, "the agent does not answer");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status, 503, "{body}");
    let u: NodeUsage = serde_json::from_str(&body).unwrap();
    assert!(!u.available);
    assert!(u.error.unwrap().contains("--rdma-usage=false"));
    let (_, m) = http_get(port, "/metrics").await;
    assert!(
        !m.contains("erdma_usage_") && !m.contains("erdma_pod_"),
        "{m}"
    );
}
