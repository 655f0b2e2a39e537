//! `erdmactl doctor --pod` and the agent's `/usage`: a pod that holds aliyun/erdma, its node's
//! agent (a fake serving `/usage`, reached through the fake API server's pod proxy) and its log
//! (the fake API server's container logs) give `pod.rdma_usage`; for a pod that asks for SMC-R,
//! the SMC summary in the same answer gives `pod.smcr.connections`.

mod fake_cluster;

use assert_cmd::Command;
use fake_cluster::Cluster;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, Pod, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};

/// A fake agent answering every `/usage` with `body`.
fn agent(body: String) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 2048];
            let _ = s.read(&mut buf);
            let _ = s.write_all(
                format!("HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{body}")
                    .as_bytes(),
            );
        }
    });
    addr
}

fn usage(qps: u64, containers: &[&str]) -> String {
    serde_json::json!({
        "node": "node-a", "collectedAtUnixMs": 1, "available": true,
        "pods": [{"namespace": "ml", "name": "trainer-0", "uid": "u0", "containers": containers,
                  "devices": [{"device": "erdma_0", "allocated": true, "qps": qps,
                               "qpsByState": {"RTS": qps}, "mrs": qps, "mrBytes": qps << 20,
                               "cqs": qps, "pds": if containers.is_empty() { 0 } else { 1 }}]}],
        "devices": [{"device": "erdma_0", "holders": ["ml/trainer-0"], "traffic": "pod",
                     "trafficPod": "ml/trainer-0", "ports": []}]
    })
    .to_string()
}

fn cluster(agent_body: String, log: &str, ib_hca: Option<&str>) -> Cluster {
    cluster_with(agent_body, log, ib_hca, None)
}

fn cluster_with(
    agent_body: String,
    log: &str,
    ib_hca: Option<&str>,
    smcr: Option<&str>,
) -> Cluster {
    let cluster = fake_cluster::start();
    let api = &cluster.api;
    let meta = |ns: &str, name: &str| kube::api::ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        ..Default::default()
    };
    api.put(&Pod {
        metadata: meta("erdma-system", "erdma-agent-x"),
        spec: Some(PodSpec {
            node_name: Some("node-a".into()),
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
            phase: Some("Running".into()),
            pod_ip: Some("10.0.0.1".into()),
            ..Default::default()
        }),
    });
    api.proxy_pod("erdma-system", "erdma-agent-x", 9101, agent(agent_body));
    let erdma = [("aliyun/erdma".to_string(), Quantity("1".into()))]
        .into_iter()
        .collect();
    let mut trainer = meta("ml", "trainer-0");
    trainer.annotations = smcr.map(|v| {
        [(
            "network.alibabacloud.com/erdma-smcr".to_string(),
            v.to_string(),
        )]
        .into_iter()
        .collect()
    });
    api.put(&Pod {
        metadata: trainer,
        spec: Some(PodSpec {
            node_name: Some("node-a".into()),
            containers: vec![Container {
                name: "trainer".into(),
                image: Some("pytorch:latest".into()),
                env: ib_hca.map(|v| {
                    vec![EnvVar {
                        name: "NCCL_IB_HCA".into(),
                        value: Some(v.into()),
                        ..Default::default()
                    }]
                }),
                resources: Some(ResourceRequirements {
                    limits: Some(erdma),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        }),
    });
    api.set_pod_log("ml", "trainer-0", "trainer", log);
    cluster
}

/// `pod.rdma_usage` of `doctor --pod ml/trainer-0 -o json`, and the exit status.
fn rdma_usage(c: &Cluster) -> (serde_json::Value, i32) {
    check_of(c, "pod.rdma_usage")
}

/// Check `id` of `doctor --pod ml/trainer-0 -o json` (null when absent), and the exit status.
fn check_of(c: &Cluster, id: &str) -> (serde_json::Value, i32) {
    let out = Command::cargo_bin("erdmactl")
        .unwrap()
        .env_remove("KUBECONFIG")
        .args([
            "doctor",
            "--pod",
            "trainer-0",
            "-n",
            "ml",
            "-o",
            "json",
            "--kubeconfig",
        ])
        .arg(&c.kubeconfig)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    let check = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    assert!(
        id != "pod.rdma_usage" || !check.is_null(),
        "no pod.rdma_usage: {v}"
    );
    (check, out.status.code().unwrap())
}

const FALLBACK: &str = "trainer-0:31:40 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>\ntrainer-0:31:40 [0] NCCL INFO Using network Socket\n";

#[test]
fn no_qp_and_a_socket_fallback_fail_naming_memlock() {
    let log = format!(
        "libibverbs: Warning: RLIMIT_MEMLOCK is 65536 bytes.\n    This will severely limit memory registrations.\n{FALLBACK}"
    );
    let c = cluster(usage(0, &["c0"]), &log, None);
    let (check, code) = rdma_usage(&c);
    assert_eq!(check["status"], "FAIL", "{check}");
    assert!(
        check["message"].as_str().unwrap().contains(
            "ml/trainer-0 holds eRDMA (aliyun/erdma=1) but the agent on node node-a sees no QP of it and NCCL fell back to sockets: the locked-memory limit is too low"
        ),
        "{check}"
    );
    assert!(check["hint"].as_str().unwrap().contains("NRI"), "{check}");
    assert_eq!(code, 1);
    let proxied = c.api.requests_matching("GET", "/proxy/usage");
    assert!(
        proxied
            .iter()
            .any(|r| r.contains("/namespaces/erdma-system/pods/erdma-agent-x:9101/proxy/usage")),
        "{proxied:?}"
    );
}

#[test]
fn nccl_ib_hca_not_matching_the_allocated_device() {
    let log = format!("trainer-0:31:40 [0] NCCL INFO NET/IB : No device found.\n{FALLBACK}");
    let c = cluster(usage(0, &[]), &log, Some("mlx5_0"));
    let (check, _) = rdma_usage(&c);
    assert_eq!(check["status"], "FAIL", "{check}");
    assert!(
        check["message"].as_str().unwrap().ends_with(
            "NCCL_IB_HCA=mlx5_0 matches none of the devices allocated to the pod (erdma_0)"
        ),
        "{check}"
    );
}

#[test]
fn a_pod_holding_qps_passes() {
    let c = cluster(usage(4, &["c0"]), "NCCL INFO Using network IB\n", None);
    let (check, _) = rdma_usage(&c);
    assert_eq!(check["status"], "PASS", "{check}");
    assert_eq!(
        check["message"],
        "the agent on node node-a sees ml/trainer-0 hold 4 QPs (4 in RTS) and 4.0 MiB of registered memory on erdma_0"
    );
}

/// The agent's answer with an SMC summary of the pod, and the kernel's `smc` QPs on erdma_0.
fn usage_with_smc(smc: serde_json::Value) -> String {
    let mut v: serde_json::Value = serde_json::from_str(&usage(0, &["c0"])).unwrap();
    v["pods"][0]["smc"] = smc;
    v["others"] = serde_json::json!([
        {"kind": "kernel", "device": "erdma_0", "qps": 3, "qpsByState": {"RTS": 2, "ERR": 1},
         "mrs": 2, "mrBytes": 65536, "cqs": 2, "pds": 1, "owners": ["smc"]},
        {"kind": "kernel", "device": "erdma_1", "qps": 1, "qpsByState": {"RTS": 1},
         "mrs": 0, "mrBytes": 0, "cqs": 1, "pds": 1, "owners": ["ib_core"]}
    ]);
    v.to_string()
}

#[test]
fn smcr_connections_beside_the_link_groups_rdma_usage() {
    let smc = serde_json::json!({"smcr": 2, "smcd": 0, "fallbackTcp": 1, "listening": 1,
        "fallbackReasons": [{"code": "0x03010000", "name": "PEERNOSMC",
                             "meaning": "peer did not offer SMC", "connections": 1}],
        "devices": ["erdma_0"]});
    let c = cluster_with(usage_with_smc(smc), "", None, Some("true"));
    let (check, _) = check_of(&c, "pod.smcr.connections");
    assert_eq!(check["status"], "PASS", "{check}");
    assert_eq!(
        check["message"],
        "ml/trainer-0: 2 connections on SMC-R over erdma_0, 1 fell back to TCP (reason: PEERNOSMC ×1); link group RDMA usage erdma_0: 3 smc QPs (1 ERR, 2 RTS)"
    );
}

#[test]
fn smcr_connections_that_all_fell_back_warn_with_the_reason() {
    let smc = serde_json::json!({"smcr": 0, "fallbackTcp": 2,
        "fallbackReasons": [{"code": "0x03030002", "name": "NOSMCRDEV",
                             "meaning": "no SMC-R device", "connections": 2}]});
    let c = cluster_with(usage_with_smc(smc), "", None, Some("true"));
    let (check, _) = check_of(&c, "pod.smcr.connections");
    assert_eq!(check["status"], "WARN", "{check}");
    assert_eq!(
        check["message"],
        "ml/trainer-0: all 2 SMC connections fell back to TCP (reason: NOSMCRDEV ×2)"
    );
    assert!(check["hint"].as_str().unwrap().contains("pnet"), "{check}");
}

#[test]
fn smcr_connections_from_an_agent_without_the_summary_warn() {
    // An older agent: no `smc` field.
    let c = cluster_with(usage(0, &["c0"]), "", None, Some("true"));
    let (check, _) = check_of(&c, "pod.smcr.connections");
    assert_eq!(check["status"], "WARN", "{check}");
    assert_eq!(
        check["message"],
        "the agent on node node-a reports no SMC connections of ml/trainer-0"
    );
    // A pod that does not ask for SMC-R gets no such check.
    let c = cluster(usage(0, &["c0"]), "", None);
    assert!(check_of(&c, "pod.smcr.connections").0.is_null());
}
