//! The real `erdma-controller` binary's logs on a pipe (as `kubectl logs` reads them): text
//! without ANSI escapes, json one object per line, `--log-level` over `RUST_LOG`, invalid filters
//! exit 2. The run that logs and exits at once: a config file that does not exist (a fatal error
//! line naming the fix, exit 2: a configuration error).

use std::process::{Command, Output};

fn controller(extra: &[&str], env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_erdma-controller"));
    cmd.arg("--config-path")
        .arg(dir.path().join("no-such-config.json"))
        .arg("--credential-path")
        .arg(dir.path().join("no-such-credential.json"))
        .args([
            "--metrics-addr",
            "127.0.0.1:0",
            "--webhook-listen",
            "127.0.0.1:0",
        ])
        .args(extra)
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("KUBECONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    // `output()` pipes stderr: not a terminal.
    cmd.output().expect("run erdma-controller")
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).expect("stderr is UTF-8")
}

#[test]
fn text_logs_on_a_pipe_carry_no_ansi_escapes() {
    for out in [
        controller(&[], &[]),
        controller(&["--log-format", "text"], &[("NO_COLOR", "1")]),
    ] {
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(!out.stderr.contains(&0x1b), "ESC in text logs: {err:?}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(lines[0].contains(" ERROR "), "{err}");
        assert!(
            lines[0].contains("no-such-config.json") && lines[0].contains("fix:"),
            "{err}"
        );
    }
}

#[test]
fn json_logs_are_one_object_per_line() {
    let out = controller(&["--log-format=json"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!out.stderr.contains(&0x1b), "{err:?}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    let v: serde_json::Value =
        serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("not JSON ({e}): {}", lines[0]));
    assert!(v.is_object(), "{err}");
    assert_eq!(v["level"], "ERROR", "{err}");
    assert_eq!(v["target"], "erdma_controller", "{err}");
    let message = v["fields"]["message"].as_str().unwrap();
    assert!(message.contains("no-such-config.json"), "{err}");
}

#[test]
fn log_level_wins_over_rust_log_which_wins_over_info() {
    let out = controller(&[], &[("RUST_LOG", "off")]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out), "", "RUST_LOG=off");
    let out = controller(&["--log-level", "error"], &[("RUST_LOG", "off")]);
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    let out = controller(&["--log-level", "warn,erdma_controller=off"], &[]);
    assert_eq!(stderr(&out), "", "erdma_controller=off");
    // An empty flag (a chart value left empty) falls back to RUST_LOG.
    let out = controller(&["--log-level="], &[("RUST_LOG", "off")]);
    assert_eq!(stderr(&out), "");
}

#[test]
fn an_invalid_filter_exits_2_naming_it() {
    let out = controller(&["--log-level", "info,erdma_k8s=loud"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with(
            "erdma-controller: --log-level \"info,erdma_k8s=loud\" is not a valid log filter"
        ),
        "{err}"
    );
    assert!(
        err.contains("\"info,erdma_nri=debug\""),
        "an example: {err}"
    );
    assert_eq!(err.lines().count(), 1, "nothing else is logged: {err}");

    let out = controller(&[], &[("RUST_LOG", "verbose")]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("RUST_LOG \"verbose\""), "{err}");

    let out = controller(&["--log-format", "xml"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--log-format") && err.contains("\"xml\""),
        "{err}"
    );
}
