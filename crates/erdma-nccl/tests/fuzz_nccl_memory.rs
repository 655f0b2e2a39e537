//! Bounded memory of the NCCL analyser, measured: a counting global allocator records the peak
//! heap held by the test's own thread while inputs of many megabytes are analysed.
//!
//! The model (crates/erdma-nccl/src/model.rs): the line reader holds at most one line (64 KiB by
//! default); the analyser keeps a small state per process (`host:pid`, and each new run of it:
//! a second version banner), at most `MAX_PROCESSES` of them, whose capped lists hold only text
//! that was in the input. So the peak is at most a constant, plus a per-process cost times
//! min(processes, `MAX_PROCESSES`), plus the input's size; an endless line costs a constant and
//! more processes than the cap cost nothing more.

use erdma_nccl::model::MAX_PROCESSES;
use erdma_nccl::{Analyzer, Options};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static HELD: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn add(n: usize) {
    let _ = HELD.try_with(|h| {
        let now = h.get().saturating_add(n);
        h.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

fn sub(n: usize) {
    let _ = HELD.try_with(|h| h.set(h.get().saturating_sub(n)));
}

// SAFETY: every call is forwarded to the system allocator unchanged; the bookkeeping only touches
// const-initialised thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size());
        // SAFETY: same layout, as the caller promised.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        sub(layout.size());
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(layout.size());
        // SAFETY: as for alloc.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size);
        sub(layout.size());
        // SAFETY: `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak heap (bytes above what was held before) of analysing `data` with `opts`, and the
/// report's count of lines of untracked processes; the input itself is allocated before the
/// measurement starts.
fn peak_of(data: &[u8], opts: Options) -> (usize, u64) {
    let base = HELD.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let mut an = Analyzer::new(opts);
    an.add_input("in", data).expect("read");
    let report = an.finish();
    assert_eq!(report.files[0].bytes, data.len() as u64);
    let untracked = report.processes_not_tracked;
    drop(report);
    (PEAK.with(Cell::get) - base, untracked)
}

const MIB: usize = 1 << 20;
/// The constant: a 64 KiB line buffer, its copy as text, the report's fixed text.
const BASE: usize = 4 * MIB;
/// Per tracked process: measured ~1.2 KiB for banner-only processes and ~2.7 KiB for a process
/// that starts a new run on every line (a version banner per line: each run's sets hold a B-tree
/// leaf of their own), in a debug build. With `MAX_PROCESSES` that caps the analyser at ~260 MiB.
const PER_PROCESS: usize = 4 * 1024;

/// The bound above: `BASE + PER_PROCESS * min(lines, MAX_PROCESSES) + 2 * input`; every process
/// needs a line of its own, so the line count (counted here) bounds the processes.
fn bound(data: &[u8]) -> usize {
    let lines = data.split(|b| *b == b'\n').count();
    BASE + PER_PROCESS * lines.min(MAX_PROCESSES) + 2 * data.len()
}

fn both_modes() -> [Options; 2] {
    [
        Options::default(),
        Options {
            collect_perf: true,
            ..Options::default()
        },
    ]
}

#[test]
fn an_endless_line_is_held_up_to_the_line_limit() {
    let data = vec![b'N'; 8 * MIB];
    for opts in both_modes() {
        let (peak, _) = peak_of(&data, opts);
        assert!(peak < BASE, "peak {peak} for one 8 MiB line");
    }
}

#[test]
fn binary_garbage_of_8_mib() {
    // A fixed xorshift stream: bytes of every value, a newline about every 256 bytes.
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..8 * MIB)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    for opts in both_modes() {
        let (peak, _) = peak_of(&data, opts);
        // No NCCL marker in random bytes: one anonymous process, nothing grows.
        assert!(peak < BASE, "peak {peak} for 8 MiB of random bytes");
    }
}

#[test]
fn a_real_log_repeated_to_8_mib_stays_under_its_size() {
    // Every copy repeats the version banners, so every copy is a new run of its two processes:
    // memory grows with the copies, but stays below the bytes read.
    let log = include_bytes!("../../../testdata/nccl/real/h200x2-nccl2.28.9/train-2gpu-nccl.log");
    let data: Vec<u8> = log.iter().copied().cycle().take(8 * MIB).collect();
    for opts in both_modes() {
        let (peak, _) = peak_of(&data, opts);
        assert!(peak < data.len(), "peak {peak} for 8 MiB of a real log");
        assert!(peak <= bound(&data));
    }
}

/// `n` one-line processes, each with its own `host:pid` and a version banner.
fn banners(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| format!("h{i}:{i}:1 [0] NCCL INFO NCCL version 2.18.1\n").into_bytes())
        .collect()
}

#[test]
fn processes_past_the_cap_cost_nothing_more() {
    let at_cap = banners(MAX_PROCESSES);
    let (peak_cap, untracked) = peak_of(&at_cap, Options::default());
    assert_eq!(untracked, 0);
    assert!(peak_cap <= bound(&at_cap), "peak {peak_cap}");
    // Twice the cap: the second half is counted, not tracked, and costs no memory.
    let twice = banners(2 * MAX_PROCESSES);
    let (peak_twice, untracked) = peak_of(&twice, Options::default());
    assert_eq!(untracked, MAX_PROCESSES as u64);
    assert!(
        peak_twice <= peak_cap + MIB,
        "peak {peak_twice} at twice the cap vs {peak_cap} at the cap"
    );
}

/// Pieces of NCCL lines, so that repeated chunks create processes, communicators and problems.
fn piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..24),
        prop::sample::select(vec![
            &b"h:1:2 [0] NCCL INFO "[..],
            b"[2026-01-01 00:00:00] x:9:9 [3] a.cc:1 NCCL WARN ",
            b"NCCL version 2.18.1",
            b"NET/IB : Using [0]erdma_0:1/RoCE [RO]; OOB eth0:10.0.0.1<0>",
            b"Channel 00/0 : 0[0] -> 1[1] via NET/IB/0/GDRDMA",
            b"ncclCommInitRank comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1 commId 0x2 - Init COMPLETE",
            b"NCCL_IB_HCA set by environment to erdma",
            b"step_ms=12.5",
            b"\n",
            b"\0",
            b"\xff",
        ])
        .prop_map(<[u8]>::to_vec),
    ]
}

/// Cases: 24, or `PROPTEST_CASES` / 40 (each case analyses 2 MiB: the fuzz stage's 2000 cases
/// give 50 here, a few seconds).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .map_or(24, |n| (n / 40).max(24))
}

/// A random chunk of NCCL-ish pieces repeated to 2 MiB: the peak stays within the bound. Found
/// with 1000 cases: `"\nh:1:2 [0] NCCL INFO NCCL version 2.18.1"` repeated is 52 000 runs of one
/// process, ~2.7 KiB each (the per-process cost above was first estimated too low).
#[test]
fn any_chunk_repeated() {
    let strategy = (prop::collection::vec(piece(), 1..24), any::<bool>());
    let mut runner = TestRunner::new(ProptestConfig::with_cases(cases()));
    let result = runner.run(&strategy, |(chunk, perf)| {
        let chunk = chunk.concat();
        prop_assume!(!chunk.is_empty());
        let data: Vec<u8> = chunk.iter().copied().cycle().take(2 * MIB).collect();
        let opts = Options {
            collect_perf: perf,
            ..Options::default()
        };
        let (peak, _) = peak_of(&data, opts);
        prop_assert!(
            peak <= bound(&data),
            "peak {} > {} for a chunk of {} bytes",
            peak,
            bound(&data),
            chunk.len()
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The case found above, kept.
#[test]
fn one_process_restarting_on_every_line() {
    let data: Vec<u8> = b"\nh:1:2 [0] NCCL INFO NCCL version 2.18.1"
        .iter()
        .copied()
        .cycle()
        .take(2 * MIB)
        .collect();
    let (peak, _) = peak_of(&data, Options::default());
    assert!(peak <= bound(&data), "peak {peak} > {}", bound(&data));
}
