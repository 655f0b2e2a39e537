//! Benchmarks of the real `erdma-agent` binary (plain harness):
//! `cargo bench -p erdma-agent --bench agent`.
//!
//! A fixture node with 8 eRDMA devices (sysfs + /dev tree), the fake kubelet in this process,
//! the agent as a child process with 200 slots per device:
//! 1. idle RSS after registration (target ≤ 15 MiB);
//! 2. fixture flip (netdev operstate down/up) → ListAndWatch update at the kubelet, through the
//!    real inventory poll (target ≤ 250 ms);
//! 3. kubelet restart → re-registered with all devices (target ≤ 1 s).
//!
//! `ERDMA_AGENT_BIN` overrides the agent binary (to run a copied build elsewhere).

use erdma_fake_kubelet::{FakeKubelet, FakeKubeletConfig};
use erdma_host::fake::NodeTree;
use erdma_host::fixtures;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RESOURCE: &str = "aliyun/erdma";

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn pct(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let bin = std::env::var("ERDMA_AGENT_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_erdma-agent").to_string());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let tree = NodeTree::temp();
        fixtures::large(&tree, 8, 1, 2);
        let dir = tempfile::Builder::new().prefix("agb").tempdir_in("/tmp").unwrap();
        let kubelet = FakeKubelet::start(FakeKubeletConfig::new(dir.path())).await.unwrap();
        let mut child = Command::new(&bin)
            .arg("--sysfs-root")
            .arg(tree.sys())
            .arg("--dev-root")
            .arg(tree.dev())
            .arg("--kubelet-dir")
            .arg(dir.path())
            .args([
                "--prefer-driver",
                "none",
                "--local-eri-discovery",
                "--metrics-addr",
                "127.0.0.1:0",
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn erdma-agent");
        let want = 8 * 200;
        let t = Instant::now();
        kubelet
            .wait_for(Duration::from_secs(20), |s| s.resources.get(RESOURCE).is_some_and(|r| r.devices.len() == want))
            .await
            .expect("agent registers 8 x 200 slots");
        println!("agent_start_to_registered    {}", ms(t.elapsed()));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let rss = rss_kib(child.id());
        println!("agent_idle_rss_8x200         {rss} KiB = {:.1} MiB (target <= 15 MiB)", rss as f64 / 1024.0);

        let mut flips = Vec::new();
        for i in 0..20 {
            let down = i % 2 == 0;
            // Flip at a varying phase of the 100 ms poll (otherwise every flip lands just after
            // a poll and waits a whole period).
            tokio::time::sleep(Duration::from_millis((i * 37 % 100) as u64)).await;
            let t = Instant::now();
            tree.set_operstate("eth1", if down { "down" } else { "up" });
            kubelet
                .wait_for(Duration::from_secs(2), |s| {
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
        println!(
            "fixture_flip_to_update       n=20 p50={} max={} (fixture file: seen by the 100 ms poll; target <= 250 ms)",
            ms(pct(flips.clone(), 0.5)),
            ms(pct(flips, 1.0))
        );

        let mut restarts = Vec::new();
        for i in 1..=10u64 {
            let t = Instant::now();
            kubelet.restart().await.unwrap();
            kubelet
                .wait_for(Duration::from_secs(2), |s| {
                    s.kubelet_restarts == i && s.resources.get(RESOURCE).is_some_and(|r| r.connected && r.devices.len() == want)
                })
                .await
                .expect("re-registered");
            restarts.push(t.elapsed());
        }
        println!(
            "agent_kubelet_restart_to_registered n=10 p50={} max={} (target <= 1 s)",
            ms(pct(restarts.clone(), 0.5)),
            ms(pct(restarts, 1.0))
        );
        let rss = rss_kib(child.id());
        println!("agent_rss_after_restarts     {rss} KiB = {:.1} MiB", rss as f64 / 1024.0);
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let _ = child.wait();
        kubelet.shutdown().await;
    });
}
