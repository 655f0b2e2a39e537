//! Fuzzing the NCCL log analyser with what a hostile or broken node can hand `erdmactl nccl`:
//! arbitrary bytes (invalid UTF-8, NULs, `\r`, lines far over the line limit) and the real and
//! synthetic logs of `testdata/nccl/` with bytes flipped, inserted, deleted, duplicated and cut.
//!
//! Every case must: not panic; count the input exactly (bytes, lines and cut lines, checked against
//! counts made here from the raw bytes); keep what it retains bounded (problem samples at most
//! `MAX_SAMPLE` bytes, small lists at most `MAX_ITEMS`, the whole JSON report linear in the input
//! with a generous constant); and `compare` two such inputs without panicking.
//!
//! Time is bounded structurally: the analyser reads each byte once (`bytes` equals the input
//! length) and the proptest cases are at most a few hundred KiB. `PROPTEST_CASES` raises the case
//! count (scripts/test.sh's `fuzz` stage does).

use erdma_nccl::compare::compare;
use erdma_nccl::model::{MAX_ITEMS, MAX_SAMPLE};
use erdma_nccl::{AnalyzeReport, Analyzer, Options};
use proptest::prelude::*;
use proptest::sample::Index;

/// Every captured or synthetic log in testdata/nccl.
const LOGS: &[&[u8]] = &[
    include_bytes!("../../../testdata/nccl/real/h200x1-nccl2.28.9/train-1gpu-nccl.log"),
    include_bytes!("../../../testdata/nccl/real/h200x1-nccl2.28.9/train-1gpu-net-ib-warn.log"),
    include_bytes!("../../../testdata/nccl/real/h200x1-nccl2.28.9/train-1gpu-subsys-all.log"),
    include_bytes!("../../../testdata/nccl/real/h200x1-nccl2.28.9/two-ranks-one-gpu.log"),
    include_bytes!("../../../testdata/nccl/real/h200x1-nccl2.28.9/watchdog-timeout.log"),
    include_bytes!("../../../testdata/nccl/real/h200x2-nccl2.28.9/nccl-net-ib-no-device.log"),
    include_bytes!("../../../testdata/nccl/real/h200x2-nccl2.28.9/nccl-p2p.log"),
    include_bytes!("../../../testdata/nccl/real/h200x2-nccl2.28.9/nccl-socket.log"),
    include_bytes!("../../../testdata/nccl/real/h200x2-nccl2.28.9/train-2gpu-nccl.log"),
    include_bytes!("../../../testdata/nccl/synthetic/erdma-2node-gdr.log"),
    include_bytes!("../../../testdata/nccl/synthetic/erdma-completion-error-timeout.log"),
    include_bytes!("../../../testdata/nccl/synthetic/erdma-nccl2.18-gid0-modify-qp.log"),
    include_bytes!("../../../testdata/nccl/synthetic/ib-mlx5-not-erdma.log"),
    include_bytes!("../../../testdata/nccl/synthetic/tcp-2node.log"),
];

/// One edit of a byte string; positions are relative to its length at the time of the edit.
#[derive(Debug, Clone)]
enum Edit {
    Flip(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
    Truncate(Index),
    Duplicate(Index, usize),
    /// A line of `n` bytes without a newline (beyond the default 64 KiB limit when n > 65536).
    LongLine(Index, usize, u8),
}

/// Bytes that break parsers: NUL, invalid and cut UTF-8, line ends, huge and negative numbers.
fn nasty() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..16),
        prop::sample::select(vec![
            b"\0".to_vec(),
            b"\xff\xfe".to_vec(),
            b"\xc3".to_vec(),
            b"\xe2\x80".to_vec(),
            b"\n".to_vec(),
            b"\r\n".to_vec(),
            b"\r".to_vec(),
            b" NCCL INFO ".to_vec(),
            b" NCCL WARN ".to_vec(),
            b"18446744073709551616".to_vec(),
            b"-9223372036854775809".to_vec(),
            b"nan".to_vec(),
            b"1e999".to_vec(),
            b"0x".to_vec(),
            b"[".to_vec(),
            b"{\"".to_vec(),
        ]),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Flip(i, b)),
        4 => (any::<Index>(), nasty()).prop_map(|(i, b)| Edit::Insert(i, b)),
        2 => (any::<Index>(), 0usize..512).prop_map(|(i, n)| Edit::Delete(i, n)),
        1 => any::<Index>().prop_map(Edit::Truncate),
        1 => (any::<Index>(), 0usize..2048).prop_map(|(i, n)| Edit::Duplicate(i, n)),
        1 => (any::<Index>(), 60_000usize..140_000, any::<u8>())
            .prop_map(|(i, n, b)| Edit::LongLine(i, n, b)),
    ]
}

fn apply(data: &mut Vec<u8>, e: &Edit) {
    let at = |i: &Index, len: usize| if len == 0 { 0 } else { i.index(len + 1) };
    match e {
        Edit::Flip(i, b) => {
            if !data.is_empty() {
                let p = i.index(data.len());
                data[p] ^= b | 1;
            }
        }
        Edit::Insert(i, bytes) => {
            let p = at(i, data.len());
            data.splice(p..p, bytes.iter().copied());
        }
        Edit::Delete(i, n) => {
            let p = at(i, data.len());
            let end = (p + n).min(data.len());
            data.drain(p..end);
        }
        Edit::Truncate(i) => {
            let p = at(i, data.len());
            data.truncate(p);
        }
        Edit::Duplicate(i, n) => {
            let p = at(i, data.len());
            let end = (p + n).min(data.len());
            let copy = data[p..end].to_vec();
            data.splice(end..end, copy);
        }
        Edit::LongLine(i, n, b) => {
            let p = at(i, data.len());
            // Never a newline: the point is one endless line.
            let b = if *b == b'\n' { b'x' } else { *b };
            data.splice(p..p, std::iter::repeat_n(b, *n));
        }
    }
}

/// A real log with 1-8 edits.
fn mutated_log() -> impl Strategy<Value = Vec<u8>> {
    (0..LOGS.len(), prop::collection::vec(edit(), 1..8)).prop_map(|(n, edits)| {
        let mut data = LOGS[n].to_vec();
        for e in &edits {
            apply(&mut data, e);
        }
        data
    })
}

/// Lines and cut lines of `data` as a line reader must count them: pieces between `\n`, the last
/// one only when not empty; a piece longer than `max` is cut.
fn expected_lines(data: &[u8], max: usize) -> (u64, u64) {
    let mut pieces: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
    if pieces.last().is_some_and(|p| p.is_empty()) {
        pieces.pop();
    }
    let cut = pieces.iter().filter(|p| p.len() > max).count();
    (pieces.len() as u64, cut as u64)
}

/// Analyses `inputs` as separate files and checks what must hold for any input.
fn analyse(
    inputs: &[Vec<u8>],
    opts: Options,
) -> Result<(AnalyzeReport, Vec<erdma_nccl::perf::PerfSummary>), TestCaseError> {
    let mut an = Analyzer::new(opts);
    for (i, data) in inputs.iter().enumerate() {
        an.add_input(&format!("in-{i}"), &data[..])
            .expect("reading from memory cannot fail");
    }
    let (report, perfs) = an.finish_with_perf();
    prop_assert_eq!(report.files.len(), inputs.len());
    prop_assert_eq!(perfs.len(), inputs.len());
    let total: usize = inputs.iter().map(Vec::len).sum();
    for (f, data) in report.files.iter().zip(inputs) {
        prop_assert_eq!(f.bytes, data.len() as u64);
        let (lines, cut) = expected_lines(data, opts.max_line.max(1));
        prop_assert_eq!(f.lines, lines);
        prop_assert_eq!(f.truncated_lines, cut);
        prop_assert!(f.nccl_lines <= f.lines);
    }
    for j in &report.jobs {
        for p in &j.problems {
            // MAX_SAMPLE bytes and the ellipsis.
            prop_assert!(
                p.message.len() <= MAX_SAMPLE + '…'.len_utf8(),
                "{}",
                p.message.len()
            );
            prop_assert!(p.first_file < inputs.len());
        }
        for list in [
            &j.ib.devices,
            &j.ib.oob,
            &j.network.chosen,
            &j.socket_interfaces,
            &j.nccl_versions,
        ] {
            // Per process at most MAX_ITEMS; a job has at most one process per input line.
            prop_assert!(list.len() <= MAX_ITEMS * j.processes.max(1));
        }
        prop_assert!(j.files.len() <= inputs.len());
    }
    // Retained output is linear in the input: at most 64 KiB of fixed text (titles, meanings,
    // fixes of the problem kinds) per job plus a generous factor of the bytes read. A job needs at
    // least one byte of input, except for the job of an empty file.
    let json = serde_json::to_string(&report).expect("the report serialises");
    let bound = 64 * 1024 * (inputs.len() + report.jobs.len()) + 32 * total;
    prop_assert!(json.len() <= bound, "{} > {}", json.len(), bound);
    Ok((report, perfs))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Raw bytes, in both reading modes (the fast marked-line path and the perf path that reads
    /// every line as text), with a small line limit so that cutting is exercised.
    #[test]
    fn arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..16_384),
                       max_line in prop_oneof![Just(0usize), 1usize..300, Just(65_536)],
                       perf in any::<bool>()) {
        analyse(&[data], Options { max_line, collect_perf: perf })?;
    }

    /// Lines built from NUL, invalid UTF-8, CR and NCCL markers only.
    #[test]
    fn marker_soup(parts in prop::collection::vec(nasty(), 0..400), perf in any::<bool>()) {
        analyse(&[parts.concat()], Options { collect_perf: perf, ..Options::default() })?;
    }

    /// Real logs, mutated, one to three files analysed together (ranks of one job spread over
    /// files), in both reading modes.
    #[test]
    fn mutated_real_logs(inputs in prop::collection::vec(mutated_log(), 1..4), perf in any::<bool>()) {
        analyse(&inputs, Options { collect_perf: perf, ..Options::default() })?;
    }

    /// `erdmactl nccl compare` of two mutated logs: both sides analysed with figures, then
    /// compared either way round; a ratio is only given for a positive finite denominator, so it
    /// is never NaN.
    #[test]
    fn compare_mutated_logs(a in mutated_log(), b in mutated_log(), in_place in any::<bool>()) {
        let opts = Options { collect_perf: true, ..Options::default() };
        let (ra, mut pa) = analyse(std::slice::from_ref(&a), opts)?;
        let (rb, mut pb) = analyse(std::slice::from_ref(&b), opts)?;
        let (pa, pb) = (pa.remove(0), pb.remove(0));
        let ab = compare("a", &ra, pa.clone(), "b", &rb, pb.clone(), in_place);
        let ba = compare("b", &rb, pb, "a", &ra, pa, in_place);
        for c in [&ab, &ba] {
            prop_assert!(c.rows.len() <= c.a.perf.rows.len());
            for r in &c.rows {
                for x in [r.busbw_ratio, r.speedup].into_iter().flatten() {
                    prop_assert!(!x.is_nan());
                }
            }
            serde_json::to_string(c).expect("the comparison serialises");
        }
    }
}

/// One endless line (no newline at all, 8 MiB): read in one pass, counted as one cut line.
#[test]
fn one_endless_line() {
    let data = vec![b'A'; 8 << 20];
    for perf in [false, true] {
        let mut an = Analyzer::new(Options {
            collect_perf: perf,
            ..Options::default()
        });
        an.add_input("endless", &data[..]).expect("read");
        let r = an.finish();
        assert_eq!(r.files[0].bytes, 8 << 20);
        assert_eq!(r.files[0].lines, 1);
        assert_eq!(r.files[0].truncated_lines, 1);
        assert_eq!(r.files[0].nccl_lines, 0);
    }
}
