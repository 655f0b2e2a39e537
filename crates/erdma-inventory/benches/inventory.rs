//! Inventory scan time on a fixture tree of 64 eRDMA devices × 2 ports × 16 GIDs.
//!
//! `cargo bench -p erdma-inventory --bench inventory` (add `-- DEVICES PORTS GIDS ITERATIONS` to
//! change the shape). Prints min / median / p99 per full scan, and each figure as
//! `BENCH inventory.KEY=VALUE UNIT` for `scripts/bench.sh`.

use erdma_host::fake::{FixedInterfaceAddrs, NodeTree};
use erdma_host::{RootedDevFs, RootedSysfs, fixtures};
use erdma_inventory::{Inventory, Sources};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let args: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (devices, ports, gids, iters) = match args.as_slice() {
        [d, p, g, n, ..] => (*d, *p, *g, *n),
        _ => (64, 2, 16, 200),
    };
    let tree = NodeTree::temp();
    fixtures::large(&tree, devices, ports, gids);
    let inv = Inventory::new(Sources {
        sysfs: Arc::new(RootedSysfs::new(tree.sys())),
        devfs: Arc::new(RootedDevFs::new(tree.dev())),
        addrs: Arc::new(FixedInterfaceAddrs::default()),
    });
    let first = inv.scan();
    assert_eq!(first.devices.len(), devices as usize);
    assert_eq!(
        first.usable().count(),
        devices as usize,
        "every device must be usable"
    );
    let gid_total: usize = first
        .devices
        .iter()
        .flat_map(|d| &d.ports)
        .map(|p| p.gids.len())
        .sum();
    assert_eq!(gid_total, (devices * ports * gids) as usize);
    let files = files_read_by_a_scan(tree.sys().as_path());
    let shape = format!("{devices} devices x {ports} ports x {gids} GIDs, {iters} runs");
    // Scan and floor alternate, one of each per round, so that both see the same load on a shared
    // machine and their ratio compares like with like.
    let ((scan, scan_cpu), (floor, floor_cpu)) = measure_pair(
        iters,
        || {
            std::hint::black_box(inv.scan());
        },
        || {
            for f in &files {
                std::hint::black_box(std::fs::read(f).ok());
            }
        },
    );
    println!(
        "BENCHCONF inventory {devices} eRDMA devices x {ports} ports x {gids} RoCE v2 GIDs, {iters} runs, synthetic tree (erdma_host::fixtures::large) in a temp dir"
    );
    report("scan", &format!("full scan ({shape})"), &scan);
    let refresh = measure(iters, || {
        std::hint::black_box(inv.refresh(&first));
    });
    report("refresh", &format!("health refresh ({shape})"), &refresh);
    // The floor: reading the same attribute files with plain std::fs::read, no parsing (measured
    // above, alternating with the scan).
    report(
        "floor",
        &format!(
            "floor: std::fs::read of the {} attribute files a scan reads",
            files.len()
        ),
        &floor,
    );
    let ratio = scan[scan.len() / 2] / floor[floor.len() / 2];
    println!("ratio full scan / floor (median): {ratio:.2}");
    println!("BENCH inventory.scan_over_floor={ratio:.3} x");
    println!("BENCH inventory.files={} files", files.len());
    // The scan splits its devices over threads (one per CPU, at most 4); the floor reads on one.
    // CPU time says what the reads cost the node, wall time what start-up waits for.
    let cpu_ratio = scan_cpu / floor_cpu;
    println!(
        "CPU time (user + system, all threads) of the {iters} scans / of the {iters} floors: {:.1} ms / {:.1} ms = {cpu_ratio:.2}",
        scan_cpu, floor_cpu
    );
    println!("BENCH inventory.scan_cpu_over_floor_cpu={cpu_ratio:.3} x");
}

/// Every regular file under the device, port and GID directories the scan reads.
fn files_read_by_a_scan(sys: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![sys.join("devices")];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                out.push(e.path());
            }
        }
    }
    out
}

fn measure(iters: u32, mut f: impl FnMut()) -> Vec<f64> {
    let mut times: Vec<f64> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    times
}

/// CPU time (user + system, every thread) this process has used, in ms.
fn cpu_ms() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    let u = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let ms = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e3 + t.tv_usec() as f64 / 1e3;
    ms(u.user_time()) + ms(u.system_time())
}

/// Wall times of `a` and `b` (sorted, ms) and the CPU time each used in all (ms).
fn measure_pair(
    iters: u32,
    mut a: impl FnMut(),
    mut b: impl FnMut(),
) -> ((Vec<f64>, f64), (Vec<f64>, f64)) {
    let time = |f: &mut dyn FnMut(), cpu: &mut f64| {
        let c = cpu_ms();
        let t = Instant::now();
        f();
        let wall = t.elapsed().as_secs_f64() * 1e3;
        *cpu += cpu_ms() - c;
        wall
    };
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    let (mut ca, mut cb) = (0.0, 0.0);
    for i in 0..iters {
        // Alternate which goes first, so neither always runs on a warmer cache.
        if i % 2 == 0 {
            ta.push(time(&mut a, &mut ca));
            tb.push(time(&mut b, &mut cb));
        } else {
            tb.push(time(&mut b, &mut cb));
            ta.push(time(&mut a, &mut ca));
        }
    }
    ta.sort_by(|x, y| x.total_cmp(y));
    tb.sort_by(|x, y| x.total_cmp(y));
    ((ta, ca), (tb, cb))
}

fn report(key: &str, what: &str, times: &[f64]) {
    let pct = |p: f64| times[((times.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "{what}: min {:.3} ms, median {:.3} ms, p99 {:.3} ms",
        pct(0.0),
        pct(0.5),
        pct(0.99)
    );
    for (name, p) in [("min", 0.0), ("median", 0.5), ("p99", 0.99)] {
        println!("BENCH inventory.{key}_{name}={:.3} ms", pct(p));
    }
}
