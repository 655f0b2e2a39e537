//! The byte-level fast path of `Analyzer::add_input` (whole-buffer line and marker scan, INFO
//! pre-filter, prefix cache) gives exactly the report of the plain text path, line by line, for
//! any input and any read-buffer size. The text path is the one `collect_perf` takes: every line
//! turned into text, split, classified and parsed in full.

use erdma_nccl::{Analyzer, Options};
use proptest::prelude::*;
use std::io::BufReader;

const LOGS: [&str; 4] = [
    include_str!("../../../testdata/nccl/synthetic/erdma-2node-gdr.log"),
    include_str!("../../../testdata/nccl/synthetic/erdma-completion-error-timeout.log"),
    include_str!("../../../testdata/nccl/real/h200x2-nccl2.28.9/nccl-net-ib-no-device.log"),
    include_str!("../../../testdata/nccl/real/h200x1-nccl2.28.9/watchdog-timeout.log"),
];

/// The report as JSON, from the fast path (`fast`) or the text path, reading through a buffer
/// of `cap` bytes.
fn report(data: &[u8], max_line: usize, cap: usize, fast: bool) -> String {
    let mut an = Analyzer::new(Options {
        max_line,
        collect_perf: !fast,
    });
    an.add_input("a", BufReader::with_capacity(cap, data))
        .expect("in-memory read");
    an.add_input("b", BufReader::with_capacity(cap, data))
        .expect("in-memory read");
    let (report, _) = an.finish_with_perf();
    serde_json::to_string_pretty(&report).expect("serialisable")
}

/// Real lines, some of them mangled with bytes that matter to the scanner and the classifier.
fn log() -> impl Strategy<Value = Vec<u8>> {
    let lines: Vec<&'static str> = LOGS.iter().flat_map(|l| l.lines()).collect();
    let line = (
        prop::sample::select(lines),
        prop::option::of((
            any::<prop::sample::Index>(),
            prop::sample::select(vec![
                &b" NCCL INFO "[..],
                b" NCCL WARN ",
                b"NCCL ",
                b"\r",
                b"\n",
                b"\t",
                &[0xff],
                &[0xc3],
                "\u{a0}".as_bytes(),
                b" via ",
                b"->",
                b"init.cc:9 -> 3",
                b"Channel ",
                b"comm 0x1 rank 3 nranks 4 commId 0x2",
                b"[1,0]<stdout>:",
                b"NCCL error in:",
            ]),
        )),
    )
        .prop_map(|(line, edit)| {
            let mut l = line.as_bytes().to_vec();
            if let Some((at, piece)) = edit {
                let at = at.index(l.len() + 1);
                l.splice(at..at, piece.iter().copied());
            }
            l.push(b'\n');
            l
        });
    (prop::collection::vec(line, 0..120), any::<bool>()).prop_map(|(lines, cut_last)| {
        let mut data = lines.concat();
        if cut_last {
            data.pop();
        }
        data
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn fast_path_equals_text_path_whatever_the_buffer(
        data in log(),
        max_line in prop::sample::select(vec![1usize, 40, 80, 65_536]),
        cap in 1usize..300,
    ) {
        let text = report(&data, max_line, 8192, false);
        prop_assert_eq!(&report(&data, max_line, cap, true), &text);
        prop_assert_eq!(&report(&data, max_line, 256 * 1024, true), &text);
    }
}

#[test]
fn fast_path_equals_text_path_on_every_fixture() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/nccl");
    let mut seen = 0;
    for sub in [
        "real/h200x1-nccl2.28.9",
        "real/h200x2-nccl2.28.9",
        "synthetic",
    ] {
        for entry in std::fs::read_dir(dir.join(sub)).expect("fixture dir") {
            let path = entry.expect("dir entry").path();
            if path.extension().is_none_or(|e| e != "log") {
                continue;
            }
            let data = std::fs::read(&path).expect("fixture");
            for cap in [1, 61, 4096, 256 * 1024] {
                assert_eq!(
                    report(&data, 65_536, cap, true),
                    report(&data, 65_536, 8192, false),
                    "{} with a {cap}-byte buffer",
                    path.display()
                );
            }
            seen += 1;
        }
    }
    assert!(seen >= 10, "only {seen} fixtures");
}
