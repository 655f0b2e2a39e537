//! The real `smcr-init` binary's logs on a pipe (as `kubectl logs` reads an init container):
//! text without ANSI escapes, json through `--log-format` or `ERDMA_LOG_FORMAT`, `--log-level`
//! over `RUST_LOG`, invalid filters exit 2. The run that logs and exits at once: a namespace that
//! does not exist, with a pin directory that holds no BPF policy (an INFO line; the report line
//! "... is gone" on stderr is the tool's own output, not a log).

use std::process::{Command, Output};

fn smcr_init(extra: &[&str], env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_smcr-init"));
    cmd.arg("--netns")
        .arg(dir.path().join("no-such-netns"))
        .arg("--bpf-pin-dir")
        .arg(dir.path())
        .args(["--pnet", "abc"])
        .args(extra)
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("ERDMA_LOG_FORMAT")
        .env_remove("SMCR_PNET");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run smcr-init")
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).expect("stderr is UTF-8")
}

/// The log lines: what is not the tool's own `smcr-init: ...` message.
fn log_lines(err: &str) -> Vec<&str> {
    err.lines()
        .filter(|l| !l.starts_with("smcr-init: "))
        .collect()
}

#[test]
#[cfg(feature = "bpf")]
fn text_logs_on_a_pipe_carry_no_ansi_escapes_and_json_is_one_object_per_line() {
    let out = smcr_init(&["--log-level", "info"], &[]);
    let err = stderr(&out);
    assert!(!out.stderr.contains(&0x1b), "ESC in text logs: {err:?}");
    let lines = log_lines(&err);
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains(" INFO ") && lines[0].contains("no BPF socket policy"),
        "{err}"
    );

    for out in [
        smcr_init(&["--log-format", "json"], &[("RUST_LOG", "info")]),
        smcr_init(
            &[],
            &[("ERDMA_LOG_FORMAT", "json"), ("RUST_LOG", "smcr_init=info")],
        ),
    ] {
        let err = stderr(&out);
        assert!(!out.stderr.contains(&0x1b), "{err:?}");
        let lines = log_lines(&err);
        assert_eq!(lines.len(), 1, "{err}");
        let v: serde_json::Value = serde_json::from_str(lines[0])
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", lines[0]));
        assert_eq!(v["level"], "INFO", "{err}");
        assert_eq!(
            v["fields"]["message"], "smcr-init: no BPF socket policy",
            "{err}"
        );
    }
}

#[test]
fn the_default_is_errors_only_and_the_flag_wins_over_rust_log() {
    let out = smcr_init(&[], &[]);
    assert!(log_lines(&stderr(&out)).is_empty(), "{}", stderr(&out));
    let out = smcr_init(&["--log-level", "off"], &[("RUST_LOG", "info")]);
    assert!(log_lines(&stderr(&out)).is_empty(), "{}", stderr(&out));
}

#[test]
fn an_invalid_filter_or_format_exits_2_naming_it() {
    let out = smcr_init(&["--log-level", "verbose"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("smcr-init: --log-level \"verbose\" is not a valid log filter"),
        "{err}"
    );
    assert!(err.contains("\"info,erdma_nri=debug\""), "{err}");
    let out = smcr_init(&[], &[("ERDMA_LOG_FORMAT", "xml")]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("\"xml\""), "{err}");
}
