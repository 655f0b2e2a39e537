//! Property tests: arbitrary input never panics, memory stays bounded, and mangling does not
//! invent an eRDMA verdict.

use erdma_nccl::{Analyzer, Answer, Options};
use proptest::prelude::*;

const REAL: &str = include_str!("../../../testdata/nccl/real/h200x2-nccl2.28.9/nccl-socket.log");
const SYNTH: &str =
    include_str!("../../../testdata/nccl/synthetic/erdma-nccl2.18-gid0-modify-qp.log");

fn fragments() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "vm:1:1 [0] NCCL INFO ",
        "[2026-11-29 13:51:19] h:2:3 [1] x.cc:9 NCCL WARN ",
        "NCCL INFO ",
        "NET/IB : Using ",
        "[0]erdma_0:1/RoCE",
        "[x]:/",
        " [RO]; OOB ",
        "Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/",
        " via ",
        "NET/",
        "P2P/",
        "(3)/GDRDMA",
        "ncclCommInitRank comm 0x1 rank ",
        "nranks 99999999999 commId 0xzz",
        "commId 0x",
        "init.cc:1 -> ",
        "Using network ",
        "GID ",
        " -> ",
        "PROBE_RESULT {\"a\": [{\"bytes\": 1, \"time_us\": ",
        "TRAIN_RESULT {",
        "step_ms=",
        "# Collective test starting: ",
        "   8   2  float  sum  -1  1.0  2.0  3.0  0  1.0  2.0  3.0  N/A",
        "Watchdog caught collective operation timeout",
        "\u{fffd}",
        "é",
        "\t",
        "\r",
        "\n",
        "[",
        "]",
        ":",
        "0",
        "-1",
        "18446744073709551616",
    ]);
    prop::collection::vec(pieces, 0..60).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..4096), max in 1usize..200) {
        let mut an = Analyzer::new(Options { max_line: max, collect_perf: true });
        an.add_input("fuzz", &data[..]).expect("in-memory read");
        let (report, perfs) = an.finish_with_perf();
        prop_assert_eq!(report.files[0].bytes, data.len() as u64);
        prop_assert_eq!(perfs.len(), 1);
        serde_json::to_string(&report).expect("serialisable");
    }

    #[test]
    fn nccl_like_garbage_never_panics(text in fragments()) {
        let mut an = Analyzer::new(Options { collect_perf: true, ..Options::default() });
        an.add_input("fuzz", text.as_bytes()).expect("in-memory read");
        let (report, _) = an.finish_with_perf();
        for j in &report.jobs {
            prop_assert!(j.problems.len() <= 32);
            let _ = &j.verdict.because;
        }
    }

    #[test]
    fn truncated_or_corrupted_real_logs_never_claim_erdma(cut in 0usize..REAL.len(), flip in 0usize..REAL.len(), byte in any::<u8>()) {
        let mut data = REAL.as_bytes()[..cut].to_vec();
        if flip < data.len() {
            data[flip] = byte;
        }
        let mut an = Analyzer::new(Options::default());
        an.add_input("cut", &data[..]).expect("read");
        let r = an.finish();
        for j in &r.jobs {
            prop_assert_ne!(j.verdict.erdma_used, Answer::Yes);
        }
    }

    #[test]
    fn interleaving_order_does_not_change_the_verdict(seed in any::<u64>()) {
        // Shuffle whole lines (ranks interleave arbitrarily); verdict and counts must not change.
        let mut lines: Vec<&str> = SYNTH.lines().collect();
        let mut s = seed | 1;
        for i in (1..lines.len()).rev() {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            lines.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let text = lines.join("\n");
        let mut an = Analyzer::new(Options::default());
        an.add_input("shuffled", text.as_bytes()).expect("read");
        let r = an.finish();
        prop_assert_eq!(r.jobs.len(), 1);
        prop_assert_eq!(r.jobs[0].verdict.reason, "ib_setup_failed");
        prop_assert_eq!(r.jobs[0].transports[0].connections, 2);
    }
}
