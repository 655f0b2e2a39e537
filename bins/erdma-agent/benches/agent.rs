//! Benchmarks of the real `erdma-agent` binary (plain harness), in the configuration the install
//! ships: `cargo bench -p erdma-agent --features bpf --bench agent`.
//!
//! The agent runs as a child process with the flags `erdma_k8s::install::agent_args` renders for
//! the default values (so the bench follows the install), `NODE_NAME` set and a kubeconfig that
//! points at the in-memory fake API server (`erdma_k8s::fake`) served over HTTP in this process:
//! it follows this node's `ERdmaDevice` (a watch), patches node labels and the driver condition
//! and records Events, as in a cluster. Host-specific paths are replaced by a fixture node of 8
//! eRDMA devices (sysfs + /dev tree), the fake kubelet in this process, and `--prefer-driver none`
//! (the driver manager, ERI netdev setup and SMC pnet setup act on the real host's kernel
//! module and interfaces, which a benchmark must not touch).
//!
//! Measured:
//! 1. process start → registered with all 8 × 200 slots;
//! 2. idle RSS and CPU after registration (target RSS ≤ 15 MiB);
//! 3. fixture flip (netdev operstate down/up) → ListAndWatch update at the kubelet, through the
//!    inventory poll (target: every flip ≤ 250 ms);
//! 4. kubelet restart → re-registered with all devices (target: every restart ≤ 1 s).
//!
//! Output: human lines, `BENCH key=value unit` lines and `BENCHCONF agent text` lines that
//! `scripts/bench.sh` renders. `ERDMA_AGENT_BIN` overrides the agent binary.

use erdma_fake_kubelet::{FakeKubelet, FakeKubeletConfig};
use erdma_host::fake::NodeTree;
use erdma_host::fixtures;
use erdma_k8s::fake::FakeApiServer;
use erdma_k8s::{DeviceInfo, DeviceState, DeviceStatus, ERdmaDevice, ERdmaDeviceSpec};
use k8s_openapi::api::core::v1::Node;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const RESOURCE: &str = "aliyun/erdma";
const NODE: &str = "bench-node";
const DEVICES: u32 = 8;
const SLOTS: usize = 200;

fn proc_field(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// CPU time of the process (user + system) in nanoseconds, from `/proc/PID/stat` (clock ticks
/// of USER_HZ = 100, fixed by the Linux ABI for /proc).
fn cpu_ns(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at field 3 (state).
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) * 10_000_000)
}

fn pct(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn bench(key: &str, value: f64, unit: &str) {
    println!("BENCH agent.{key}={value:.2} {unit}");
}

fn erdma_device() -> ERdmaDevice {
    // The MACs `fixtures::large` gives device i's netdev.
    let eris: Vec<DeviceInfo> = (0..DEVICES)
        .map(|i| DeviceInfo {
            instance_id: "i-bench".into(),
            mac: format!("00:16:3e:00:00:{i:02x}"),
            is_primary_eni: false,
            id: format!("eni-bench{i}"),
            network_card_index: 0,
            queue_pair: 0,
        })
        .collect();
    let mut o = ERdmaDevice::new(
        NODE,
        ERdmaDeviceSpec {
            devices: eris.clone(),
            jumbo_frame: true,
        },
    );
    o.metadata.labels = Some(erdma_k8s::labels::erdma_device_labels(NODE, "i-bench"));
    o.status = Some(erdma_k8s::ERdmaDeviceStatus {
        devices: eris
            .iter()
            .map(|d| DeviceStatus::new(d.id.clone(), DeviceState::Ready, ""))
            .collect(),
    });
    o
}

/// The shipped agent flags with the host paths replaced by the fixture's.
fn agent_args(dev_root: &std::path::Path) -> Vec<String> {
    let shipped = erdma_k8s::install::agent_args(&erdma_k8s::install::Values::default());
    let mut args: Vec<String> = shipped
        .into_iter()
        .map(|a| {
            if a.starts_with("--dev-root=") {
                format!("--dev-root={}", dev_root.display())
            } else if a.starts_with("--metrics-addr=") {
                "--metrics-addr=127.0.0.1:0".into()
            } else {
                a
            }
        })
        .collect();
    args.retain(|a| !a.starts_with("--prefer-driver"));
    args.push("--prefer-driver=none".into());
    args
}

fn main() {
    let bin = std::env::var("ERDMA_AGENT_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_erdma-agent").to_string());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        let tree = NodeTree::temp();
        fixtures::large(&tree, DEVICES, 1, 2);
        let dir = tempfile::Builder::new()
            .prefix("agb")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let kubelet = FakeKubelet::start(FakeKubeletConfig::new(dir.path()))
            .await
            .expect("fake kubelet");

        let api = FakeApiServer::new();
        api.put(&Node {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(NODE.into()),
                ..Default::default()
            },
            ..Default::default()
        });
        api.put(&erdma_device());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake API server");
        let addr = listener.local_addr().expect("local addr");
        let cancel = CancellationToken::new();
        tokio::spawn(api.clone().serve_http(listener, cancel.clone()));
        let kubeconfig = dir.path().join("kubeconfig");
        erdma_k8s::fake::kubeconfig(&kubeconfig, addr).expect("write kubeconfig");
        let pin_dir = dir.path().join("bpf-pin");
        let log_path = dir.path().join("agent.log");

        let mut args = agent_args(tree.dev().as_path());
        args.extend([
            format!("--sysfs-root={}", tree.sys().display()),
            format!("--kubelet-dir={}", dir.path().display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--bpf-pin-dir={}", pin_dir.display()),
        ]);
        let shown: Vec<String> = args
            .iter()
            .map(|a| {
                a.replace(&tree.root().display().to_string(), "FIXTURE")
                    .replace(&dir.path().display().to_string(), "TMP")
            })
            .collect();
        println!(
            "BENCHCONF agent erdma-agent {} with NODE_NAME={NODE}; {DEVICES} eRDMA devices x {SLOTS} slots (fixture tree); fake kubelet and fake API server (HTTP) in the bench process",
            shown.join(" ")
        );
        println!(
            "BENCHCONF agent built with the bpf feature: {}",
            if cfg!(feature = "bpf") { "yes" } else { "NO" }
        );
        let log = std::fs::File::create(&log_path).expect("agent log");
        let mut child = Command::new(&bin)
            .args(&args)
            .env("NODE_NAME", NODE)
            .env_remove("RUST_LOG")
            .env_remove("KUBECONFIG")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn erdma-agent");
        let pid = child.id();
        let want = DEVICES as usize * SLOTS;
        let t = Instant::now();
        kubelet
            .wait_for(Duration::from_secs(30), |s| {
                s.resources
                    .get(RESOURCE)
                    .is_some_and(|r| r.devices.len() == want)
            })
            .await
            .expect("agent registers 8 x 200 slots (from the ERdmaDevice)");
        let start = t.elapsed();
        println!("agent start -> registered: {:.2} ms", ms(start));
        bench("start_to_registered", ms(start), "ms");

        tokio::time::sleep(Duration::from_secs(3)).await;
        let (cpu0, t0) = (cpu_ns(pid), Instant::now());
        tokio::time::sleep(Duration::from_secs(10)).await;
        let idle_cpu = match (cpu0, cpu_ns(pid)) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64 / t0.elapsed().as_nanos() as f64 * 100.0,
            _ => f64::NAN,
        };
        let rss = proc_field(pid, "VmRSS:").unwrap_or(0);
        println!(
            "idle: RSS {rss} KiB = {:.1} MiB (target <= 15 MiB), CPU {idle_cpu:.1} % of a core over 10 s",
            rss as f64 / 1024.0
        );
        bench("idle_rss", rss as f64 / 1024.0, "MiB");
        bench("idle_cpu", idle_cpu, "%");

        // What the cluster client did so far: ERdmaDevice reads (the agent polls it), node label
        // and condition patches, Events.
        let reads = api.requests_matching("GET", "erdmadevices").len();
        let patches = api.requests_matching("PATCH", "/nodes/").len();
        let events = api.requests_matching("POST", "events").len();
        let policy = std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .lines()
            .find(|l| l.contains("SMC-R BPF socket policy"))
            .map(|l| {
                l.split_once("SMC-R BPF")
                    .map_or(l, |(_, r)| r)
                    .trim()
                    .trim_end_matches('.')
                    .to_string()
            })
            .unwrap_or_else(|| "no log line".into());
        println!(
            "BENCHCONF agent cluster client after start and 13 s idle: {reads} ERdmaDevice read(s) (the agent re-reads it every 10 s), {patches} node patch(es) (driver labels, condition), {events} Event(s) (none is due with the driver unmanaged); pre-start hook on, the agent logged: SMC-R BPF {policy}"
        );
        if reads == 0 || patches == 0 {
            println!(
                "BENCHCONF agent WARNING: the cluster client did not read the ERdmaDevice or patch the node"
            );
        }

        let mut flips = Vec::new();
        for i in 0..20u64 {
            let down = i % 2 == 0;
            // Flip at a varying phase of the 100 ms poll (otherwise every flip lands just after
            // a poll and waits a whole period).
            tokio::time::sleep(Duration::from_millis(i * 37 % 100)).await;
            let t = Instant::now();
            tree.set_operstate("eth1", if down { "down" } else { "up" });
            kubelet
                .wait_for(Duration::from_secs(5), |s| {
                    s.resources[RESOURCE]
                        .devices
                        .iter()
                        .filter(|d| d.id.starts_with("erdma_0/"))
                        .all(|d| (d.health == "Unhealthy") == down)
                })
                .await
                .expect("flip reaches the kubelet");
            flips.push(t.elapsed());
        }
        let (p50, max) = (pct(flips.clone(), 0.5), pct(flips, 1.0));
        println!(
            "fixture flip -> update: n=20 p50 {:.2} ms, max {:.2} ms (target <= 250 ms)",
            ms(p50),
            ms(max)
        );
        bench("flip_p50", ms(p50), "ms");
        bench("flip_max", ms(max), "ms");

        let mut restarts = Vec::new();
        for i in 1..=10u64 {
            let t = Instant::now();
            kubelet.restart().await.expect("restart the fake kubelet");
            kubelet
                .wait_for(Duration::from_secs(5), |s| {
                    s.kubelet_restarts == i
                        && s.resources
                            .get(RESOURCE)
                            .is_some_and(|r| r.connected && r.devices.len() == want)
                })
                .await
                .expect("re-registered");
            restarts.push(t.elapsed());
        }
        let (p50, max) = (pct(restarts.clone(), 0.5), pct(restarts, 1.0));
        println!(
            "kubelet restart -> re-registered: n=10 p50 {:.2} ms, max {:.2} ms (target <= 1 s)",
            ms(p50),
            ms(max)
        );
        bench("restart_p50", ms(p50), "ms");
        bench("restart_max", ms(max), "ms");
        let rss = proc_field(pid, "VmRSS:").unwrap_or(0);
        println!(
            "RSS after flips and restarts: {rss} KiB = {:.1} MiB",
            rss as f64 / 1024.0
        );
        bench("rss_after_restarts", rss as f64 / 1024.0, "MiB");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = child.wait();
        cancel.cancel();
        kubelet.shutdown().await;
    });
}
