//! `erdma-labprobe`: timing probes for the lab scenarios.
//!
//! - `link`: sets a network interface up or down (one ioctl, no fork) and measures how long it
//!   takes until the fake kubelet has seen every slot of an RDMA device change health;
//! - `wait`: waits until every slot of a device has a health (optionally after N registrations).
//!
//! Both print `elapsed_ms=<ms>` and `started_utc=<hh:mm:ss.micros>` (the wall-clock moment
//! timing started, to line up with the agent's log) and exit 0 when the condition held, or print
//! why and exit 1; `link` also prints `ioctl_us=<us>`, how long the kernel took to return from
//! the ioctl (its link message goes out before it returns).
//!
//! Two resource probes run inside containers (libibverbs through `dlopen`, see
//! `erdma_lab::verbs`):
//! - `contexts`: opens N device contexts one after the other and holds them (each is an
//!   `hca_handle` of the rdma cgroup); prints `opened=<k>` and, when one fails, the errno;
//! - `reg-mr`: registers a buffer of a given size; prints the process's `RLIMIT_MEMLOCK` and
//!   `registered=<bytes>` or the errno.
//!
//! Both exit 0 when everything asked for succeeded and 1 otherwise.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use erdma_lab::probe::{Condition, KubeletState, wait_for_state};

#[derive(Parser)]
#[command(
    name = "erdma-labprobe",
    version,
    about = "Timing probes for the erdma lab"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct Watch {
    /// The fake kubelet's state file (DIR/fake-kubelet-state.json).
    #[arg(long)]
    state: PathBuf,
    /// Resource name.
    #[arg(long, default_value = "aliyun/erdma")]
    resource: String,
    /// RDMA device whose slots are watched.
    #[arg(long)]
    ibdev: String,
    /// Health every slot must reach.
    #[arg(long, value_parser = ["Healthy", "Unhealthy"])]
    expect: String,
    /// Registrations that must have happened (re-registration after a kubelet restart).
    #[arg(long, default_value_t = 0)]
    min_registrations: u64,
    /// Give up after this many milliseconds.
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
}

#[derive(Subcommand)]
enum Command {
    /// Set NETDEV up or down, then time until the device's slots reach the expected health.
    Link {
        /// Interface to change.
        #[arg(long)]
        netdev: String,
        /// New administrative state.
        #[arg(long, value_parser = ["up", "down"])]
        set: String,
        #[command(flatten)]
        watch: Watch,
    },
    /// Wait until the device's slots reach the expected health.
    Wait {
        #[command(flatten)]
        watch: Watch,
    },
    /// Open COUNT contexts on DEVICE and hold them; prints `opened=<k>` and the errno of the
    /// first failure.
    Contexts {
        /// RDMA device.
        #[arg(long)]
        device: String,
        /// Contexts to open.
        #[arg(long)]
        count: usize,
        /// Keep the contexts open this long after opening them (to read `rdma.current`).
        #[arg(long, default_value_t = 0)]
        hold_ms: u64,
    },
    /// Register SIZE bytes on DEVICE (`ibv_reg_mr`); prints `RLIMIT_MEMLOCK` and the outcome.
    RegMr {
        /// RDMA device.
        #[arg(long)]
        device: String,
        /// Bytes, with an optional K, M or G.
        #[arg(long, value_parser = erdma_lab::verbs::parse_size)]
        size: usize,
    },
}

/// `contexts`: opens up to `count` contexts, holds them `hold_ms`, reports.
fn contexts(device: &str, count: usize, hold_ms: u64) -> anyhow::Result<()> {
    let verbs = erdma_lab::verbs::Verbs::load()?;
    let mut held = Vec::with_capacity(count);
    let mut failure = None;
    for i in 1..=count {
        match verbs.open(device) {
            Ok(c) => held.push(c),
            Err(e) => {
                failure = Some((i, e));
                break;
            }
        }
    }
    println!("opened={} requested={count}", held.len());
    if hold_ms > 0 {
        println!("holding_ms={hold_ms}");
        std::thread::sleep(Duration::from_millis(hold_ms));
    }
    drop(held);
    match failure {
        None => Ok(()),
        Some((i, e)) => {
            println!("failed_at={i} errno={}", e.errno().unwrap_or(0));
            anyhow::bail!("context {i} of {count} on {device}: {e}")
        }
    }
}

/// `reg-mr`: one registration of `size` bytes.
fn reg_mr(device: &str, size: usize) -> anyhow::Result<()> {
    let show = |v: Option<u64>| v.map_or_else(|| "unlimited".to_string(), |b| b.to_string());
    let (soft, hard) = erdma_lab::verbs::memlock_limit();
    println!("memlock_soft={} memlock_hard={}", show(soft), show(hard));
    let verbs = erdma_lab::verbs::Verbs::load()?;
    let ctx = verbs.open(device)?;
    match ctx.register(size) {
        Ok(()) => {
            println!("registered={size}");
            Ok(())
        }
        Err(e) => {
            println!("errno={}", e.errno().unwrap_or(0));
            anyhow::bail!("registering {size} bytes on {device}: {e}")
        }
    }
}

/// How often the state file is re-read when no inotify event came.
const FALLBACK_REREAD: Duration = Duration::from_millis(100);

fn watch(w: &Watch, start: Instant) -> anyhow::Result<Duration> {
    watch_state(w, start).map(|(elapsed, _)| elapsed)
}

/// [`watch`], with the state file in which the condition held.
fn watch_state(w: &Watch, start: Instant) -> anyhow::Result<(Duration, KubeletState)> {
    let cond = Condition {
        resource: w.resource.clone(),
        ibdev: w.ibdev.clone(),
        health: w.expect.clone(),
        min_registrations: w.min_registrations,
    };
    Ok(wait_for_state(
        &w.state,
        &cond,
        start,
        Duration::from_millis(w.timeout_ms),
        // inotify wakes the wait at once; this re-read is a safety net only. A short one (it was
        // 2 ms) made the probe parse the state file hundreds of times a second, taking CPU from
        // the agent and kubelet it times in a 2-vCPU emulated VM.
        FALLBACK_REREAD,
    )?)
}

/// Now, in microseconds of `CLOCK_MONOTONIC` (the fake kubelet's receipt clock).
fn monotonic_us() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0) / 1_000
    })
}

/// Time of day (UTC) with microseconds, as the agent's log timestamps show it.
fn utc_time_of_day(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        d.subsec_micros()
    )
}

/// Starts the clock: `started_utc=` (wall time, to line up with the agent's log) and the
/// monotonic start the elapsed time is measured from, taken together.
fn start_clock() -> Instant {
    let start = Instant::now();
    println!(
        "started_utc={}",
        utc_time_of_day(std::time::SystemTime::now())
    );
    start
}

fn main() {
    let result = match Cli::parse().command {
        Command::Link {
            netdev,
            set,
            watch: w,
        } => {
            let start = start_clock();
            let start_us = monotonic_us();
            let set = erdma_lab::link::set_link(&netdev, set == "up");
            // The kernel's own part: the ioctl returns after the link message went out and the
            // netdev notifiers (the RDMA driver's port change among them) ran.
            let ioctl = start.elapsed();
            set.map_err(anyhow::Error::from)
                .and_then(|()| watch_state(&w, start))
                .map(|(elapsed, state)| {
                    println!("ioctl_us={}", ioctl.as_micros());
                    // When the fake kubelet received the ListAndWatch message that made the
                    // condition true: the flip without the state file's write and this probe's
                    // read of it.
                    let received = state
                        .resources
                        .get(&w.resource)
                        .map_or(0, |r| r.received_monotonic_us);
                    if received >= start_us && start_us > 0 {
                        println!("kubelet_us={}", received - start_us);
                    }
                    elapsed
                })
        }
        Command::Wait { watch: w } => watch(&w, start_clock()),
        Command::Contexts {
            device,
            count,
            hold_ms,
        } => return finish(contexts(&device, count, hold_ms)),
        Command::RegMr { device, size } => return finish(reg_mr(&device, size)),
    };
    match result {
        Ok(elapsed) => println!("elapsed_ms={}", elapsed.as_millis()),
        Err(e) => {
            eprintln!("erdma-labprobe: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Exit status of a resource probe: 0, or 1 with the reason on stderr.
fn finish(r: anyhow::Result<()>) {
    if let Err(e) = r {
        eprintln!("erdma-labprobe: {e:#}");
        std::process::exit(1);
    }
}
