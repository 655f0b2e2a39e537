//! Benchmarks of the real `erdma-agent` binary (plain harness), in the configuration the install
//! ships: `cargo bench -p erdma-agent --features bpf --bench agent`.
//!
//! The agent runs as a child process with the flags `erdma_k8s::install::agent_args` renders for
//! the default values (so the bench follows the install), `NODE_NAME` set and a kubeconfig that
//! points at the in-memory fake API server (`erdma_k8s::fake`) served over HTTPS in this process
//! (the kubeconfig carries its CA, as an in-cluster client has the service account's `ca.crt`):
//! it reads this node's `ERdmaDevice`, patches node labels and the driver condition and records
//! Events, as in a cluster. Host-specific paths are replaced by a fixture node of eRDMA devices
//! (sysfs + /dev tree), the fake kubelet in this process, and `--prefer-driver none` (the driver
//! manager, ERI netdev setup and SMC pnet setup act on the real host's kernel module and
//! interfaces, which a benchmark must not touch).
//!
//! Three agents, one after the other:
//! 1. 64 devices × 200 slots: process start → registered with every slot (target ≤ 25 ms; the
//!    median of five starts, four of them with their own fake kubelet and stopped once
//!    registered: one start on a shared 2-core machine is one draw of its noise), idle
//!    CPU over 60 s (target ≤ 0.1 % of a core), RSS; the idle window starts 13 s after the
//!    process start, 3 s after the agent gave back the pages only its start-up used;
//! 2. 8 devices × 200 slots: the same start (five) and idle figures (idle CPU target ≤ 0.1 %, idle RSS
//!    target ≤ 6 MiB, peak RSS — `VmHWM` at the end of the idle window, so start-up included —
//!    target ≤ 10 MiB), then 20 device flips through the event path (the uverbs node of `erdma_0`
//!    removed and created again in the fixture's `/dev/infiniband`, which the agent watches with
//!    inotify; target: every flip ≤ 250 ms), then 10 kubelet restarts (target ≤ 1 s each);
//! 3. 8 devices × 1 200 slots: idle RSS, for the RSS growth per 1 000 slots against run 2.
//!
//! Output: human lines, `BENCH key=value unit` lines and `BENCHCONF agent text` lines that
//! `scripts/bench.sh` renders. `ERDMA_AGENT_BIN` overrides the agent binary (`scripts/bench.sh`
//! passes the shipped one, cargo profile `agent`: optimised for size, fat LTO);
//! `ERDMA_BENCH_IDLE_S` the idle window (default 60 s); `ERDMA_BENCH_AGENT_LOGS=DIR` keeps each
//! agent's log there, and `ERDMA_BENCH_RUST_LOG` sets its `RUST_LOG` (default `info`, shipped).

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
/// When the idle window starts, counted from the agent's process start: 3 s after the agent's
/// start-up page release (10 s after its start).
const STARTUP_SETTLED: Duration = Duration::from_secs(13);
/// The slots per device the install ships (`--slots-per-device` default).
const SHIPPED_SLOTS: u32 = 200;

fn proc_field(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Resident KiB per mapped file (anonymous mappings and stacks under their bracketed names or
/// `[anon]`), largest first, from `/proc/PID/smaps`: where the idle RSS lives.
fn rss_by_mapping(pid: u32) -> Vec<(String, u64)> {
    let Ok(smaps) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) else {
        return Vec::new();
    };
    let mut by: std::collections::BTreeMap<String, u64> = Default::default();
    let mut current = String::new();
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            // Header: address perms offset dev inode [pathname]
            current = words.nth(4).unwrap_or("[anon]").to_string();
        } else if first == "Rss:" {
            let kib: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            *by.entry(current.clone()).or_default() += kib;
        }
    }
    let mut v: Vec<(String, u64)> = by.into_iter().filter(|(_, k)| *k > 0).collect();
    v.sort_by_key(|m| std::cmp::Reverse(m.1));
    v
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

/// One thread's scheduler figures from `/proc/PID/task/TID/{schedstat,comm}`.
#[derive(Clone, Default)]
struct ThreadCpu {
    /// Run time in nanoseconds (the scheduler's exact figure, not tick samples).
    ns: u64,
    /// Time slices run on a CPU: about the number of times the thread woke up.
    runs: u64,
    name: String,
}

/// CPU time of each of the process's threads, by thread ID.
fn thread_cpu(pid: u32) -> std::collections::BTreeMap<u32, ThreadCpu> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("schedstat")) else {
            continue;
        };
        let f: Vec<u64> = stat
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        if let (Some(&ns), Some(&runs)) = (f.first(), f.get(2)) {
            let name = std::fs::read_to_string(e.path().join("comm"))
                .map(|n| n.trim().to_string())
                .unwrap_or_default();
            out.insert(tid, ThreadCpu { ns, runs, name });
        }
    }
    out
}

/// CPU time between two [`thread_cpu`] readings: threads in both count their difference,
/// threads born in between all of theirs; returns the time and how many threads ended in between
/// (their time is lost, so the bench reports it).
fn cpu_between(
    a: &std::collections::BTreeMap<u32, ThreadCpu>,
    b: &std::collections::BTreeMap<u32, ThreadCpu>,
) -> (u64, usize) {
    let used = by_thread_name(a, b).values().map(|(ns, _)| ns).sum();
    let ended = a.keys().filter(|t| !b.contains_key(t)).count();
    (used, ended)
}

/// CPU time and time slices between two readings, summed by thread name: where idle time goes.
fn by_thread_name(
    a: &std::collections::BTreeMap<u32, ThreadCpu>,
    b: &std::collections::BTreeMap<u32, ThreadCpu>,
) -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut out = std::collections::BTreeMap::<String, (u64, u64)>::new();
    for (tid, now) in b {
        let before = a.get(tid).cloned().unwrap_or_default();
        let e = out.entry(now.name.clone()).or_default();
        e.0 += now.ns.saturating_sub(before.ns);
        e.1 += now.runs.saturating_sub(before.runs);
    }
    out
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

fn erdma_device(devices: u32) -> ERdmaDevice {
    // The MACs `fixtures::large` gives device i's netdev.
    let eris: Vec<DeviceInfo> = (0..devices)
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

/// Spawns the agent with `args`, the shipped environment (`RUST_LOG` from
/// `ERDMA_BENCH_RUST_LOG`, default `info`) and its log to `log`, and waits until `kubelet` lists
/// `want` slots; returns the agent, when it was spawned, and the time from the spawn to the
/// kubelet's receipt of that list (the fake kubelet stamps each decoded `ListAndWatch` message
/// with `CLOCK_MONOTONIC`, the clock `Instant` reads: the bench's own look at the kubelet's state,
/// a copy of 12 800 entries, is not the agent's time). An agent that never registers is stopped
/// before the panic.
async fn spawn_registered(
    bin: &str,
    args: &[String],
    log: std::fs::File,
    kubelet: &FakeKubelet,
    want: usize,
) -> (std::process::Child, Instant, Duration) {
    let t = Instant::now();
    let spawned_us = erdma_fake_kubelet::state::monotonic_us();
    let mut child = Command::new(bin)
        .args(args)
        .env("NODE_NAME", NODE)
        // The shipped log level, unless ERDMA_BENCH_RUST_LOG asks for more (to see phases).
        .env(
            "RUST_LOG",
            std::env::var("ERDMA_BENCH_RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .env_remove("KUBECONFIG")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn erdma-agent");
    let registered = kubelet
        .wait_for(Duration::from_secs(30), |s| {
            s.resources
                .get(RESOURCE)
                .is_some_and(|r| r.devices.len() == want)
        })
        .await;
    let observed = t.elapsed();
    if registered.is_err() {
        stop_agent(&mut child);
    }
    let state = registered.expect("agent registers every slot (from the ERdmaDevice)");
    let received_us = state
        .resources
        .get(RESOURCE)
        .map_or(0, |r| r.received_monotonic_us);
    let took = match received_us.checked_sub(spawned_us) {
        Some(us) if us > 0 => Duration::from_micros(us),
        _ => {
            println!(
                "BENCHCONF agent WARNING: no receipt time from the fake kubelet; start time as observed"
            );
            observed
        }
    };
    (child, t, took)
}

/// SIGTERM, then waits for the agent to exit.
fn stop_agent(child: &mut std::process::Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}

/// The cluster client's requests so far: `ERdmaDevice` reads, node patches, Events.
fn client_requests(api: &FakeApiServer) -> [usize; 3] {
    [
        api.requests_matching("GET", "erdmadevices").len(),
        api.requests_matching("PATCH", "/nodes/").len(),
        api.requests_matching("POST", "events").len(),
    ]
}

/// Starts the agent with `args` but its own fake kubelet, waits until the kubelet lists `want`
/// slots, stops the agent; returns the time from the spawn to the listing.
async fn start_once(bin: &str, args: &[String], want: usize) -> Duration {
    let dir = tempfile::Builder::new()
        .prefix("ags")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let kubelet = FakeKubelet::start(FakeKubeletConfig::new(dir.path()))
        .await
        .expect("fake kubelet");
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            if a.starts_with("--kubelet-dir=") {
                format!("--kubelet-dir={}", dir.path().display())
            } else {
                a.clone()
            }
        })
        .collect();
    // The measured start's environment and a log file like its own.
    let log = std::fs::File::create(dir.path().join("agent.log")).expect("agent log");
    let (mut child, _, took) = spawn_registered(bin, &args, log, &kubelet, want).await;
    stop_agent(&mut child);
    kubelet.shutdown().await;
    took
}

/// One agent run's node and what to measure.
struct Run {
    devices: u32,
    slots: u32,
    idle: Duration,
    flips_and_restarts: bool,
    /// Adds `--pod-resources-socket` (not in the shipped configuration): the slots-in-use gauge,
    /// a pod-resources `List` every 10 s.
    usage_gauge: bool,
    /// Extra starts before the measured one (each with its own fake kubelet, the agent stopped
    /// once registered): the start-up figure is the median of them and the measured start.
    extra_starts: u32,
}

/// What one run measured.
#[derive(Default)]
struct Measured {
    start_ms: f64,
    idle_cpu_pct: f64,
    idle_rss_mib: f64,
    /// VmRSS when registered, before the agent gives back the pages only start-up used.
    start_rss_mib: f64,
    /// Anonymous memory (heap, stacks) of the RSS when registered.
    start_rss_anon_mib: f64,
    /// File-backed pages of the RSS when registered.
    start_rss_file_mib: f64,
    /// Peak RSS (VmHWM) at the end of the idle window: the most the process held from its
    /// start through its start-up and the idle window.
    peak_rss_mib: f64,
    /// Anonymous memory (heap, stacks) of the idle RSS.
    idle_rss_anon_mib: f64,
    /// File-backed pages (the binary's and libraries' touched pages) of the idle RSS.
    idle_rss_file_mib: f64,
    idle_threads: u64,
    idle_threads_ended: u64,
    idle_cpu_ticks_pct: f64,
}

/// Reports one figure of run `tag` (`d64`, `d8`, `d8s1200`).
fn report(tag: &str, m: &Measured) {
    bench(&format!("{tag}.start_to_registered"), m.start_ms, "ms");
    bench(&format!("{tag}.idle_cpu"), m.idle_cpu_pct, "%");
    bench(&format!("{tag}.idle_rss"), m.idle_rss_mib, "MiB");
    bench(&format!("{tag}.start_rss"), m.start_rss_mib, "MiB");
    bench(
        &format!("{tag}.start_rss_anon"),
        m.start_rss_anon_mib,
        "MiB",
    );
    bench(
        &format!("{tag}.start_rss_file"),
        m.start_rss_file_mib,
        "MiB",
    );
    bench(&format!("{tag}.peak_rss"), m.peak_rss_mib, "MiB");
    bench(&format!("{tag}.idle_rss_anon"), m.idle_rss_anon_mib, "MiB");
    bench(&format!("{tag}.idle_rss_file"), m.idle_rss_file_mib, "MiB");
    bench(
        &format!("{tag}.idle_threads"),
        m.idle_threads as f64,
        "threads",
    );
    bench(
        &format!("{tag}.idle_threads_ended"),
        m.idle_threads_ended as f64,
        "threads",
    );
    bench(&format!("{tag}.idle_cpu_ticks"), m.idle_cpu_ticks_pct, "%");
}

async fn run_agent(bin: &str, run: &Run) -> Measured {
    // sysfs is memory-backed: the fixture goes on tmpfs where there is one, so that no journal
    // commit or writeback of the tree just written runs beside the start being measured.
    let tree = if std::path::Path::new("/dev/shm").is_dir() {
        NodeTree::temp_in("/dev/shm")
    } else {
        NodeTree::temp()
    };
    fixtures::large(&tree, run.devices, 1, 2);
    let dir = tempfile::Builder::new()
        .prefix("agb")
        .tempdir_in("/tmp")
        .expect("temp dir");
    // The fake kubelet serves pod-resources; the agent is pointed at it only for the run with the
    // slots-in-use gauge. The shipped agent reads the default path only for its device-plugin
    // coexistence look (at start and every 5 min, outside the idle window), which the bench
    // cannot serve without writing under /var/lib/kubelet.
    let pod_resources = dir.path().join("pod-resources.sock");
    let mut kubelet_cfg = FakeKubeletConfig::new(dir.path());
    kubelet_cfg.pod_resources_socket = Some(pod_resources.clone());
    let kubelet = FakeKubelet::start(kubelet_cfg).await.expect("fake kubelet");

    let api = FakeApiServer::new();
    api.put(&Node {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(NODE.into()),
            ..Default::default()
        },
        ..Default::default()
    });
    api.put(&erdma_device(run.devices));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind fake API server");
    let addr = listener.local_addr().expect("local addr");
    let cancel = CancellationToken::new();
    // HTTPS with the CA in the kubeconfig, as in a cluster (the service account's ca.crt): the
    // client trusts that CA only and never loads the system's root certificates.
    let tls = erdma_k8s::fake::FakeTls::generate().expect("fake API server TLS");
    tokio::spawn(
        api.clone()
            .serve_https(listener, tls.clone(), cancel.clone()),
    );
    let kubeconfig = dir.path().join("kubeconfig");
    erdma_k8s::fake::kubeconfig_tls(&kubeconfig, addr, &tls).expect("write kubeconfig");
    let pin_dir = dir.path().join("bpf-pin");
    let log_path = dir.path().join("agent.log");

    let mut args = agent_args(tree.dev().as_path());
    args.extend([
        format!("--sysfs-root={}", tree.sys().display()),
        format!("--kubelet-dir={}", dir.path().display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--bpf-pin-dir={}", pin_dir.display()),
    ]);
    if run.usage_gauge {
        args.push(format!(
            "--pod-resources-socket={}",
            pod_resources.display()
        ));
    }
    if run.slots != SHIPPED_SLOTS {
        args.push(format!("--slots-per-device={}", run.slots));
    }
    let shown: Vec<String> = args
        .iter()
        .map(|a| {
            a.replace(&tree.root().display().to_string(), "FIXTURE")
                .replace(&dir.path().display().to_string(), "TMP")
        })
        .collect();
    println!(
        "BENCHCONF agent {} devices x {} slots: erdma-agent {} with NODE_NAME={NODE}",
        run.devices,
        run.slots,
        shown.join(" ")
    );
    let want = (run.devices * run.slots) as usize;
    let mut starts = Vec::new();
    for _ in 0..run.extra_starts {
        starts.push(start_once(bin, &args, want).await);
    }
    // The cluster client's requests of the measured agent alone (the extra starts made theirs).
    let before = client_requests(&api);
    let log = std::fs::File::create(&log_path).expect("agent log");
    let (mut child, t, took) = spawn_registered(bin, &args, log, &kubelet, want).await;
    let pid = child.id();
    starts.push(took);
    let mut m = Measured {
        start_ms: ms(pct(starts.clone(), 0.5)),
        start_rss_mib: proc_field(pid, "VmRSS:").unwrap_or(0) as f64 / 1024.0,
        start_rss_anon_mib: proc_field(pid, "RssAnon:").unwrap_or(0) as f64 / 1024.0,
        start_rss_file_mib: proc_field(pid, "RssFile:").unwrap_or(0) as f64 / 1024.0,
        ..Default::default()
    };
    let where_start: Vec<String> = rss_by_mapping(pid)
        .iter()
        .take(8)
        .map(|(name, kib)| format!("{name} {kib} KiB"))
        .collect();
    println!(
        "{} x {}: RSS by mapping when registered: {}",
        run.devices,
        run.slots,
        where_start.join(", ")
    );
    let each: Vec<String> = starts.iter().map(|d| format!("{:.2}", ms(*d))).collect();
    println!(
        "{} x {}: agent start -> registered: {:.2} ms (median of {} start(s): {} ms)",
        run.devices,
        run.slots,
        m.start_ms,
        starts.len(),
        each.join(", ")
    );

    // Let the start-up work settle: the agent gives back the pages only start-up used 10 s
    // after its start (erdma_host::resident; then every 10 min, a few ms each), which ends its
    // start-up; the idle window starts 3 s after that.
    tokio::time::sleep_until((t + STARTUP_SETTLED).into()).await;
    let (cpu0, threads0, t0) = (cpu_ns(pid), thread_cpu(pid), Instant::now());
    tokio::time::sleep(run.idle).await;
    let (threads1, cpu1) = (thread_cpu(pid), cpu_ns(pid));
    let window = t0.elapsed().as_nanos() as f64;
    let (used, ended) = cpu_between(&threads0, &threads1);
    let per_thread: Vec<String> = by_thread_name(&threads0, &threads1)
        .iter()
        .map(|(name, (ns, runs))| format!("{name} {:.2} ms in {runs} run(s)", *ns as f64 / 1e6))
        .collect();
    println!(
        "{} x {}: idle CPU by thread: {}",
        run.devices,
        run.slots,
        per_thread.join(", ")
    );
    m.idle_cpu_pct = used as f64 / window * 100.0;
    m.idle_threads_ended = ended as u64;
    m.idle_cpu_ticks_pct = match (cpu0, cpu1) {
        (Some(a), Some(b)) => b.saturating_sub(a) as f64 / window * 100.0,
        _ => f64::NAN,
    };
    m.idle_rss_mib = proc_field(pid, "VmRSS:").unwrap_or(0) as f64 / 1024.0;
    // Read before the flips and restarts: the peak of the start-up and the idle window.
    m.peak_rss_mib = proc_field(pid, "VmHWM:").unwrap_or(0) as f64 / 1024.0;
    m.idle_rss_anon_mib = proc_field(pid, "RssAnon:").unwrap_or(0) as f64 / 1024.0;
    m.idle_rss_file_mib = proc_field(pid, "RssFile:").unwrap_or(0) as f64 / 1024.0;
    m.idle_threads = proc_field(pid, "Threads:").unwrap_or(0);
    let where_rss: Vec<String> = rss_by_mapping(pid)
        .iter()
        .take(8)
        .map(|(name, kib)| format!("{name} {kib} KiB"))
        .collect();
    println!(
        "{} x {}: idle RSS by mapping: {}",
        run.devices,
        run.slots,
        where_rss.join(", ")
    );
    println!(
        "{} x {}: idle over {} s: CPU {:.3} % of a core ({:.3} % from /proc/PID/stat ticks; {} thread(s) ended), RSS {:.2} MiB (anon {:.2}, file {:.2}), peak RSS (VmHWM) {:.2} MiB, {} threads",
        run.devices,
        run.slots,
        run.idle.as_secs(),
        m.idle_cpu_pct,
        m.idle_cpu_ticks_pct,
        m.idle_threads_ended,
        m.idle_rss_mib,
        m.idle_rss_anon_mib,
        m.idle_rss_file_mib,
        m.peak_rss_mib,
        m.idle_threads
    );

    if run.flips_and_restarts {
        // What the cluster client did so far: ERdmaDevice requests (a list, then one watch held open), node label
        // and condition patches, Events.
        let [reads, patches, events] = {
            let now = client_requests(&api);
            [now[0] - before[0], now[1] - before[1], now[2] - before[2]]
        };
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
            "BENCHCONF agent cluster client of the 8-device agent after start and {} s idle: {reads} ERdmaDevice request(s) (the first list and the watch the agent holds open, not a poll), {patches} node patch(es) (driver labels, condition), {events} Event(s) (none is due with the driver unmanaged); pre-start hook on, the agent logged: SMC-R BPF {policy}",
            run.idle.as_secs() + 3
        );
        if reads == 0 || patches == 0 {
            println!(
                "BENCHCONF agent WARNING: the cluster client did not read the ERdmaDevice or patch the node"
            );
        }
        flips(&tree, &kubelet).await;
        restarts(&kubelet, want).await;
        let rss = proc_field(pid, "VmRSS:").unwrap_or(0);
        println!(
            "RSS after flips and restarts: {rss} KiB = {:.1} MiB",
            rss as f64 / 1024.0
        );
        bench("rss_after_restarts", rss as f64 / 1024.0, "MiB");
    }
    stop_agent(&mut child);
    if let Ok(keep) = std::env::var("ERDMA_BENCH_AGENT_LOGS") {
        let to =
            std::path::Path::new(&keep).join(format!("agent-{}x{}.log", run.devices, run.slots));
        if let Err(e) = std::fs::copy(&log_path, &to) {
            eprintln!("could not keep the agent log at {}: {e}", to.display());
        }
    }
    cancel.cancel();
    kubelet.shutdown().await;
    m
}

/// 20 flips of `erdma_0` through the event path: its uverbs node goes (the device turns
/// `Unhealthy`: the kernel removes the node when the device goes) and comes back.
async fn flips(tree: &NodeTree, kubelet: &FakeKubelet) {
    let mut flips = Vec::new();
    for i in 0..20u64 {
        let down = i % 2 == 0;
        // Vary the phase against the agent's timers.
        tokio::time::sleep(Duration::from_millis(50 + i * 37 % 100)).await;
        let t = Instant::now();
        if down {
            tree.remove_dev("infiniband/uverbs0");
        } else {
            tree.char_node("infiniband/uverbs0", 231, 192);
        }
        kubelet
            .wait_for(Duration::from_secs(15), |s| {
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
        "device flip (uverbs node, inotify) -> update: n=20 p50 {:.2} ms, max {:.2} ms (target <= 250 ms)",
        ms(p50),
        ms(max)
    );
    bench("flip_p50", ms(p50), "ms");
    bench("flip_max", ms(max), "ms");
}

/// 10 kubelet restarts, each until the agent registered again with every slot.
async fn restarts(kubelet: &FakeKubelet, want: usize) {
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
}

/// How many of the functions `link-order.txt` names the binary has (`nm`): the build places
/// those first, in the file's order; one the code no longer has is skipped by the linker.
fn link_order_coverage(bin: &str) -> String {
    let order = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("link-order.txt");
    let named: Vec<String> = match std::fs::read_to_string(&order) {
        Ok(text) => text.lines().map(str::to_owned).collect(),
        Err(e) => return format!("{} not read: {e}", order.display()),
    };
    let symbols = match Command::new("nm").args(["--defined-only", bin]).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        Ok(out) => return format!("nm {bin} failed: {}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => return format!("nm not run: {e}"),
    };
    let have: std::collections::HashSet<&str> = symbols
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    let found = named.iter().filter(|n| have.contains(n.as_str())).count();
    format!(
        "{found} of the {} functions link-order.txt names are in the binary",
        named.len()
    )
}

fn main() {
    let bin = std::env::var("ERDMA_AGENT_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_erdma-agent").to_string());
    let idle = Duration::from_secs(
        std::env::var("ERDMA_BENCH_IDLE_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        println!(
            "BENCHCONF agent built with the bpf feature: {}",
            if cfg!(feature = "bpf") { "yes" } else { "NO" }
        );
        // The cargo profile is the binary's directory under the target directory: `agent` is
        // the shipped build (scripts/bench.sh passes it), `release` this bench's own.
        let profile = std::path::Path::new(&bin)
            .parent()
            .and_then(|d| d.file_name())
            .map_or_else(
                || "unknown".to_string(),
                |p| p.to_string_lossy().into_owned(),
            );
        println!("BENCHCONF agent binary of the cargo profile: {profile}");
        println!("BENCHCONF agent link order: {}", link_order_coverage(&bin));
        let d64 = run_agent(
            &bin,
            &Run {
                devices: 64,
                slots: SHIPPED_SLOTS,
                idle,
                flips_and_restarts: false,
                usage_gauge: false,
                extra_starts: 4,
            },
        )
        .await;
        report("d64", &d64);
        let d8 = run_agent(
            &bin,
            &Run {
                devices: 8,
                slots: SHIPPED_SLOTS,
                idle,
                flips_and_restarts: true,
                usage_gauge: false,
                extra_starts: 4,
            },
        )
        .await;
        report("d8", &d8);
        let big = run_agent(
            &bin,
            &Run {
                devices: 8,
                slots: 1200,
                // The same window as the 200-slot run: the growth compares like with like.
                idle,
                flips_and_restarts: false,
                usage_gauge: false,
                extra_starts: 0,
            },
        )
        .await;
        report("d8s1200", &big);
        let gauge = run_agent(
            &bin,
            &Run {
                devices: 8,
                slots: SHIPPED_SLOTS,
                idle,
                flips_and_restarts: false,
                usage_gauge: true,
                extra_starts: 0,
            },
        )
        .await;
        report("d8gauge", &gauge);
        let growth = (big.idle_rss_mib - d8.idle_rss_mib) / (8.0 * (1200.0 - 200.0) / 1000.0);
        println!("RSS growth per 1 000 slots: {growth:.3} MiB");
        bench("rss_per_1000_slots", growth, "MiB");
    });
}
