//! The cluster side at scale: the real `erdma-controller` binary against the workspace's fake API
//! server (over HTTP) and the ECS emulator (over HTTP, signed requests, per-action flow control
//! answering `Throttling.User`), with N GPU nodes (2 network cards: the primary ENI converted on
//! card 0, an ERI created and attached on card 1) appearing at once.
//!
//! Per N (`ERDMA_SCALE_NODES`, default `1000,5000`) it prints `BENCH scale.nN.KEY=VALUE UNIT`:
//! the time until every node's ERdmaDevice is Ready and its floor (the calls one action needs
//! at the emulator's rate), ECS calls per node by action and the floor of calls per node,
//! throttled calls and retries, the nodes left behind at the deadline, the controller's peak RSS
//! and CPU seconds; then the same after a restart of the controller with every node Ready (ECS
//! calls, writes, describes, API server requests, time until every object was reconciled).
//!
//! Environment: `ERDMA_SCALE_RATE` (calls per second per action at the emulator, default 50;
//! the controller is configured with the same rate), `ERDMA_SCALE_DEADLINE_S` (per phase,
//! default 600), `ERDMA_SCALE_ATTACH_MS` (the emulator's attach latency, default 1000),
//! `ERDMA_SCALE_CONTROLLER` (another controller binary to run, e.g. an earlier commit's).

use erdma_cloud::emulator::{EcsEmulator, EmuInstance, EmuInstanceType, Throttle};
use erdma_k8s::ERdmaDevice;
use erdma_k8s::fake::FakeApiServer;
use k8s_openapi::api::core::v1::{
    ContainerImage, Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, ObjectMeta, Time,
};
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const GPU_TYPE: &str = "ecs.ebmgn8v.48xlarge";
const WRITES: [&str; 4] = [
    "CreateNetworkInterface",
    "AttachNetworkInterface",
    "ModifyNetworkInterfaceAttribute",
    "TagResources",
];

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn bench(key: &str, value: f64, unit: &str) {
    println!("BENCH scale.{key}={value:.4} {unit}");
}

/// A node as a kubelet registers it: the fields the controller reads plus what a real Node
/// carries that it does not (images, capacity, system info, annotations, managed fields).
fn node(i: usize) -> Node {
    let name = format!("gpu-{i:05}");
    let q = |s: &str| Quantity(s.to_string());
    let resources: BTreeMap<String, Quantity> = [
        ("cpu", "192"),
        ("memory", "1980Gi"),
        ("ephemeral-storage", "2Ti"),
        ("nvidia.com/gpu", "8"),
        ("aliyun/erdma", "0"),
        ("pods", "110"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), q(v)))
    .collect();
    let images = (0..20)
        .map(|j| ContainerImage {
            names: Some(vec![
                format!(
                    "registry-vpc.cn-hangzhou.aliyuncs.com/acs/training-image-{j}@sha256:{:064x}",
                    i * 31 + j
                ),
                format!("registry-vpc.cn-hangzhou.aliyuncs.com/acs/training-image-{j}:v1.{j}.0"),
            ]),
            size_bytes: Some(1_000_000_000 + j as i64),
        })
        .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            uid: Some(format!("uid-{name}")),
            creation_timestamp: Some(Time(Timestamp::now())),
            labels: Some(
                [
                    ("kubernetes.io/hostname", name.as_str()),
                    ("kubernetes.io/os", "linux"),
                    ("kubernetes.io/arch", "amd64"),
                    ("node.kubernetes.io/instance-type", GPU_TYPE),
                    ("topology.kubernetes.io/region", "cn-hangzhou"),
                    ("topology.kubernetes.io/zone", "cn-hangzhou-k"),
                    ("alibabacloud.com/nodepool-id", "np0123456789abcdef"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ),
            annotations: Some(
                [
                    ("node.alpha.kubernetes.io/ttl", "0"),
                    ("volumes.kubernetes.io/controller-managed-attach-detach", "true"),
                    ("csi.volume.kubernetes.io/nodeid", "{\"diskplugin.csi.alibabacloud.com\":\"i-0123456789\",\"nasplugin.csi.alibabacloud.com\":\"i-0123456789\"}"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ),
            managed_fields: Some(
                ["kubelet", "kube-controller-manager", "node-problem-detector"]
                    .into_iter()
                    .map(|m| ManagedFieldsEntry {
                        manager: Some(m.into()),
                        operation: Some("Update".into()),
                        api_version: Some("v1".into()),
                        fields_type: Some("FieldsV1".into()),
                        fields_v1: Some(FieldsV1(serde_json::json!({
                            "f:metadata": {"f:annotations": {"f:node.alpha.kubernetes.io/ttl": {}}, "f:labels": {"f:kubernetes.io/hostname": {}, "f:kubernetes.io/os": {}}},
                            "f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {"f:lastHeartbeatTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}}},
                                "f:images": {}, "f:nodeInfo": {"f:bootID": {}, "f:kernelVersion": {}}}
                        }))),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("cn-hangzhou.{}", instance_id(i))),
            pod_cidr: Some(format!("10.{}.{}.0/24", 64 + i / 256, i % 256)),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(
                ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
                    .into_iter()
                    .map(|t| NodeCondition {
                        type_: t.into(),
                        status: if t == "Ready" { "True" } else { "False" }.into(),
                        reason: Some(format!("Kubelet{t}")),
                        message: Some(format!("kubelet reports {t}")),
                        last_heartbeat_time: Some(Time(Timestamp::now())),
                        last_transition_time: Some(Time(Timestamp::now())),
                    })
                    .collect(),
            ),
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: ip(i),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: name.clone(),
                },
            ]),
            capacity: Some(resources.clone()),
            allocatable: Some(resources),
            images: Some(images),
            node_info: Some(NodeSystemInfo {
                architecture: "amd64".into(),
                boot_id: format!("{:032x}", i),
                container_runtime_version: "containerd://1.6.28".into(),
                kernel_version: "5.10.134-16.3.al8.x86_64".into(),
                kube_proxy_version: "v1.31.1-aliyun.1".into(),
                kubelet_version: "v1.31.1-aliyun.1".into(),
                machine_id: format!("{:032x}", i * 7),
                operating_system: "linux".into(),
                os_image: "Alibaba Cloud Linux 3.2104 U10 (OpenAnolis Edition)".into(),
                system_uuid: format!("{:032x}", i * 13),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn instance_id(i: usize) -> String {
    format!("i-scale{i:06}")
}

fn ip(i: usize) -> String {
    format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256)
}

struct Controller {
    child: Child,
    metrics: SocketAddr,
}

impl Controller {
    fn spawn(dir: &std::path::Path, emu: &str, log: &str) -> Controller {
        let metrics = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            l.local_addr().expect("its address")
        };
        let log = std::fs::File::create(dir.join(log)).expect("controller log");
        // ERDMA_SCALE_CONTROLLER: another build of the binary (an earlier commit's, to compare).
        let bin = std::env::var("ERDMA_SCALE_CONTROLLER")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_erdma-controller").to_string());
        let child = Command::new(bin)
            .arg("--config-path")
            .arg(dir.join("config.json"))
            .arg("--credential-path")
            .arg(dir.join("credential.json"))
            .args(["--metrics-addr", &metrics.to_string()])
            .args(["--webhook-listen", "127.0.0.1:0", "--ecs-endpoint", emu])
            .args(["--log-format", "text", "--log-level", "warn"])
            .env("KUBECONFIG", dir.join("kubeconfig"))
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start erdma-controller");
        Controller { child, metrics }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `/metrics` as (name{labels}, value).
    fn metrics(&self) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        let Ok(mut s) = std::net::TcpStream::connect_timeout(&self.metrics, Duration::from_secs(2))
        else {
            return out;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            if let Some((k, v)) = line.rsplit_once(' ')
                && let Ok(v) = v.parse::<f64>()
            {
                out.insert(k.to_string(), v);
            }
        }
        out
    }

    fn stop(mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = self.child.wait();
    }
}

fn status_kib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0.0)
}

fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime: fields 14 and 15 of stat, 12 and 13 after the command.
    (ticks(11) + ticks(12)) / 100.0
}

fn metric(m: &BTreeMap<String, f64>, prefix: &str) -> f64 {
    m.iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(_, v)| v)
        .sum()
}

fn calls_by_action(emu: &EcsEmulator, from: usize) -> BTreeMap<String, (u64, u64)> {
    let st = emu.state();
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for c in &st.calls[from.min(st.calls.len())..] {
        let e = out.entry(c.action.clone()).or_default();
        e.0 += 1;
        if c.status != 200 {
            e.1 += 1;
        }
    }
    out
}

fn ready_count(api: &FakeApiServer) -> usize {
    api.list::<ERdmaDevice>(None)
        .iter()
        .filter(|o| o.all_ready() && o.spec.devices.len() == 2)
        .count()
}

async fn wait_leader(c: &Controller, deadline: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < deadline {
        if c.metrics().get("erdma_controller_leader") == Some(&1.0) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

async fn run(n: usize, rate: f64, deadline: Duration, attach: Duration) {
    let p = format!("n{n}");
    let emu = EcsEmulator::start().await.expect("ECS emulator");
    {
        let mut st = emu.state();
        st.add_key("ak", "sk");
        st.attach_latency = attach;
        st.add_type(EmuInstanceType {
            id: GPU_TYPE.into(),
            eri_quantity: Some(2),
            network_cards: 2,
            queue_pairs: 16,
            gpus: 8,
        });
        for i in 0..n {
            st.add_instance(EmuInstance {
                id: instance_id(i),
                instance_type: GPU_TYPE.into(),
                private_ip: ip(i),
                vswitch_id: "vsw-scale".into(),
                security_groups: vec!["sg-scale".into()],
                jumbo_frame: Some(true),
            });
        }
        st.throttle = Some(Throttle {
            per_second: rate,
            burst: rate.max(1.0) as u32,
        });
    }
    let api = FakeApiServer::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let cancel = CancellationToken::new();
    let serving = tokio::spawn(api.clone().serve_http(listener, cancel.clone()));
    let dir = tempfile::tempdir().expect("temp dir");
    erdma_k8s::fake::kubeconfig(&dir.path().join("kubeconfig"), addr).expect("kubeconfig");
    let cfg = serde_json::json!({
        "region": "emu-region", "enableWebhook": false,
        "ecsRequestsPerSecond": rate as u32, "ecsBurst": rate.max(1.0) as u32,
    });
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).expect("config");
    std::fs::write(
        dir.path().join("credential.json"),
        r#"{"accessKeyID": "ak", "accessKeySecret": "sk"}"#,
    )
    .expect("credentials");
    println!(
        "BENCHCONF scale {n} nodes of {GPU_TYPE} (2 network cards: primary converted, one ERI created and attached) appearing at once; ECS emulator: {rate} calls/s per action (burst {}), attach latency {} ms; controller: erdma-controller binary, config {cfg}",
        rate.max(1.0) as u32,
        attach.as_millis()
    );

    // Phase 1: N new nodes.
    let c = Controller::spawn(dir.path(), &emu.endpoint(), "controller-1.log");
    assert!(
        wait_leader(&c, Duration::from_secs(60)).await,
        "the controller leads"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls0 = emu.state().calls.len();
    let t0 = Instant::now();
    for i in 0..n {
        api.put(&node(i));
    }
    let mut ready = 0;
    let mut last_progress = Instant::now();
    while t0.elapsed() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let r = ready_count(&api);
        if r != ready {
            ready = r;
            last_progress = Instant::now();
        }
        if ready >= n {
            break;
        }
        if last_progress.elapsed() > Duration::from_secs(5) {
            println!(
                "{n} nodes: {ready} Ready after {:.0} s",
                t0.elapsed().as_secs_f64()
            );
            last_progress = Instant::now();
        }
    }
    let took = t0.elapsed().as_secs_f64();
    let rss_peak = status_kib(c.pid(), "VmHWM:") / 1024.0;
    let rss = status_kib(c.pid(), "VmRSS:") / 1024.0;
    let cpu = cpu_s(c.pid());
    let m = c.metrics();
    let by = calls_by_action(&emu, calls0);
    let total: u64 = by.values().map(|v| v.0).sum();
    let refused: u64 = by.values().map(|v| v.1).sum();
    let throttled: u64 = emu.state().throttled.values().sum();
    let per_node = |a: &str| by.get(a).map_or(0, |v| v.0) as f64 / n as f64;
    for (a, (k, bad)) in &by {
        println!(
            "{n} nodes: {a}: {k} calls ({bad} refused), {:.3} per node",
            *k as f64 / n as f64
        );
        bench(&format!("{p}.calls.{a}"), *k as f64 / n as f64, "per-node");
    }
    // The floor: per node one Create, Attach, Modify (primary), TagResources (the primary's
    // terway tags, whose instance-id value is per instance) and DescribeInstanceAttribute (one
    // InstanceId per call); plus the describes, 100 IDs a call: the instances, their ENIs, and
    // the two ERIs of each node once attached.
    let hundreds = |x: usize| x.div_ceil(100) as f64;
    let floor_calls = 5.0 * n as f64 + hundreds(n) * 2.0 + hundreds(2 * n);
    let floor_s = n as f64 / rate + attach.as_secs_f64();
    bench(&format!("{p}.nodes"), n as f64, "nodes");
    bench(&format!("{p}.ready_s"), took, "s");
    bench(&format!("{p}.floor_s"), floor_s, "s");
    bench(
        &format!("{p}.left_behind"),
        (n - ready.min(n)) as f64,
        "nodes",
    );
    bench(
        &format!("{p}.calls_per_node"),
        total as f64 / n as f64,
        "calls",
    );
    bench(
        &format!("{p}.floor_calls_per_node"),
        floor_calls / n as f64,
        "calls",
    );
    bench(
        &format!("{p}.writes_per_node"),
        WRITES.iter().map(|a| per_node(a)).sum(),
        "calls",
    );
    bench(&format!("{p}.throttled"), throttled as f64, "calls");
    bench(&format!("{p}.refused"), refused as f64, "calls");
    bench(
        &format!("{p}.retries"),
        metric(&m, "erdma_ecs_retries_total"),
        "calls",
    );
    bench(&format!("{p}.rss_peak_mib"), rss_peak, "MiB");
    bench(&format!("{p}.rss_mib"), rss, "MiB");
    bench(&format!("{p}.cpu_s"), cpu, "s");
    c.stop();

    // Phase 2: a restart with every node Ready.
    let calls1 = emu.state().calls.len();
    let api1 = api.state().requests.len();
    let t1 = Instant::now();
    let c = Controller::spawn(dir.path(), &emu.endpoint(), "controller-2.log");
    let led = wait_leader(&c, Duration::from_secs(60)).await;
    let mut done = false;
    while led && t1.elapsed() < deadline {
        let m = c.metrics();
        if metric(&m, "erdma_controller_reconciles_total{controller=\"node\"") >= n as f64
            && metric(
                &m,
                "erdma_controller_reconciles_total{controller=\"erdmadevice\"",
            ) >= n as f64
        {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let restart_s = t1.elapsed().as_secs_f64();
    // What follows the last reconcile (a back-fill, a late describe) is counted too.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let by = calls_by_action(&emu, calls1);
    let writes: u64 = by
        .iter()
        .filter(|(a, _)| WRITES.contains(&a.as_str()))
        .map(|(_, v)| v.0)
        .sum();
    let all: u64 = by.values().map(|v| v.0).sum();
    for (a, (k, _)) in &by {
        println!("{n} nodes, restart: {a}: {k} calls");
    }
    let requests: Vec<String> = api.state().requests[api1..].to_vec();
    let watches = requests.iter().filter(|r| r.contains("watch")).count();
    println!(
        "{n} nodes, restart: {} API requests ({watches} watches); every object reconciled: {done}",
        requests.len()
    );
    bench(&format!("{p}.restart.reconciled_s"), restart_s, "s");
    bench(
        &format!("{p}.restart.done"),
        f64::from(u8::from(done)),
        "bool",
    );
    bench(&format!("{p}.restart.ecs_calls"), all as f64, "calls");
    bench(&format!("{p}.restart.ecs_writes"), writes as f64, "calls");
    bench(
        &format!("{p}.restart.ecs_describes"),
        (all - writes) as f64,
        "calls",
    );
    bench(&format!("{p}.restart.describe_floor"), hundreds(n), "calls");
    bench(
        &format!("{p}.restart.api_requests"),
        requests.len() as f64,
        "requests",
    );
    bench(
        &format!("{p}.restart.api_requests_not_watch"),
        (requests.len() - watches) as f64,
        "requests",
    );
    bench(
        &format!("{p}.restart.rss_peak_mib"),
        status_kib(c.pid(), "VmHWM:") / 1024.0,
        "MiB",
    );
    bench(&format!("{p}.restart.cpu_s"), cpu_s(c.pid()), "s");
    c.stop();
    cancel.cancel();
    let _ = serving.await;
}

#[tokio::main]
async fn main() {
    let nodes: Vec<usize> = std::env::var("ERDMA_SCALE_NODES")
        .unwrap_or_else(|_| "1000,5000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let rate: f64 = env_or("ERDMA_SCALE_RATE", 50.0);
    let deadline = Duration::from_secs(env_or("ERDMA_SCALE_DEADLINE_S", 600));
    let attach = Duration::from_millis(env_or("ERDMA_SCALE_ATTACH_MS", 1000));
    for n in nodes {
        run(n, rate, deadline, attach).await;
    }
}
