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

/// The plain way, sharing nothing with the reader or the scanner: the input cut at every `\n`,
/// each line cut to `max_line` bytes, a trailing `\r` dropped, read lossily and fed to
/// `Analyzer::line` one by one; the file's byte and cut-line counts filled in from the same cut.
fn reference_report(data: &[u8], max_line: usize) -> String {
    let mut an = Analyzer::new(Options {
        max_line,
        collect_perf: false,
    });
    let mut cut = 0u64;
    for name in ["a", "b"] {
        let file = an.begin_file(name);
        let mut pieces: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
        if pieces.last().is_some_and(|l| l.is_empty()) {
            pieces.pop();
        }
        for (i, piece) in pieces.into_iter().enumerate() {
            let mut line = piece;
            if line.len() > max_line {
                line = &line[..max_line];
                cut += 1;
            }
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            an.line(file, i as u64 + 1, &String::from_utf8_lossy(line));
        }
    }
    let report = an.finish();
    let mut json = serde_json::to_value(&report).expect("serialisable");
    for f in json["files"].as_array_mut().expect("files") {
        f["bytes"] = serde_json::json!(data.len());
        f["truncated_lines"] = serde_json::json!(cut / 2);
    }
    serde_json::to_string_pretty(&json).expect("serialisable")
}

/// The fast path's report (both stages, any read buffer) through a JSON value, as the reference's.
fn fast_report(data: &[u8], max_line: usize, cap: usize) -> String {
    let report: serde_json::Value =
        serde_json::from_str(&report(data, max_line, cap, true)).expect("own JSON");
    serde_json::to_string_pretty(&report).expect("serialisable")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn fast_path_equals_a_plain_line_by_line_reference(
        data in log(),
        max_line in prop::sample::select(vec![1usize, 40, 80, 65_536]),
        cap in 1usize..300,
    ) {
        prop_assert_eq!(fast_report(&data, max_line, cap), reference_report(&data, max_line));
    }

    #[test]
    fn fast_path_equals_the_reference_on_random_bytes(
        data in prop::collection::vec(prop::sample::select(vec![b'N', b'C', b'L', b' ', b'\n', b'\r', b'I', b'F', b'O', b'x', b':', 0xff]), 0..2000),
        cap in 1usize..300,
    ) {
        prop_assert_eq!(fast_report(&data, 80, cap), reference_report(&data, 80));
    }
}

#[test]
fn fast_path_equals_the_reference_on_every_fixture_and_a_mixed_log() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/nccl");
    let mut all = Vec::new();
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
            for cap in [61, 64 * 1024] {
                assert_eq!(
                    fast_report(&data, 65_536, cap),
                    reference_report(&data, 65_536),
                    "{} with a {cap}-byte buffer",
                    path.display()
                );
            }
            all.extend_from_slice(&data);
        }
    }
    // Every fixture in one input, many times: more kept lines than one batch of the fast path.
    let many = all.repeat(8);
    assert_eq!(
        fast_report(&many, 65_536, 64 * 1024),
        reference_report(&many, 65_536)
    );
}
