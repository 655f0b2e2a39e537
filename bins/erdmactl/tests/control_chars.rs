//! Untrusted text never reaches the terminal as control characters: an NCCL log carrying an
//! OSC 52 clipboard write, a CSI sequence, C1 controls and a bidi override is shown escaped by
//! `erdmactl nccl analyze` in every format.

use assert_cmd::Command;

/// A log line NCCL would print, with what an attacker could put in a hostname or an env value.
const HOSTILE_LOG: &str = "node-a:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda12.9\n\
node-a:1:1 [0] misc/socket.cc:50 NCCL WARN Net : Connect to \x1b]52;c;cm0gLXJmIH4=\x07 \x1b[2J\u{9b}31m \u{202e}txt.exe failed\r\n";

fn analyze(format: &str) -> (Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("hostile\x1b[31m.log");
    std::fs::write(&log, HOSTILE_LOG).expect("log written");
    let out = Command::cargo_bin("erdmactl")
        .expect("erdmactl is built")
        .args(["nccl", "analyze", "-o", format])
        .arg(&log)
        .output()
        .expect("erdmactl runs");
    (out.stdout, out.stderr)
}

/// The controls left in `bytes` (C0 but newline and tab, DEL, C1, bidi overrides/isolates).
fn controls(bytes: &[u8]) -> Vec<char> {
    String::from_utf8_lossy(bytes)
        .chars()
        .filter(|c| {
            (c.is_control() && *c != '\n' && *c != '\t')
                || ('\u{202a}'..='\u{202e}').contains(c)
                || ('\u{2066}'..='\u{2069}').contains(c)
        })
        .collect()
}

#[test]
fn nccl_analyze_table_shows_escape_sequences_escaped() {
    let (stdout, stderr) = analyze("table");
    assert_eq!(controls(&stdout), Vec::<char>::new());
    assert_eq!(controls(&stderr), Vec::<char>::new());
    let text = String::from_utf8(stdout).expect("utf-8");
    assert!(text.contains("hostile\\u001b[31m.log"), "{text}");
    assert!(
        text.contains(
            "Connect to \\u001b]52;c;cm0gLXJmIH4=\\u0007 \\u001b[2J\\u009b31m \\u202etxt.exe failed"
        ),
        "{text}"
    );
}

#[test]
fn nccl_analyze_json_and_yaml_carry_no_raw_controls() {
    for format in ["json", "yaml"] {
        let (stdout, _) = analyze(format);
        assert_eq!(controls(&stdout), Vec::<char>::new(), "{format}");
    }
    let (json, _) = analyze("json");
    let v: serde_json::Value = serde_json::from_slice(&json).expect("still valid JSON");
    assert!(
        v["files"][0]["name"]
            .as_str()
            .is_some_and(|p| p.ends_with("hostile\x1b[31m.log")),
        "{v}"
    );
}
