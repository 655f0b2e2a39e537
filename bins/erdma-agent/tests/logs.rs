//! The real `erdma-agent` binary's logs on a pipe (as `kubectl logs` reads them): text without
//! ANSI escapes, json one object per line, `--log-level` over `RUST_LOG`, invalid filters exit 2.
//!
//! The run that logs and exits at once: `NODE_NAME` with a kubeconfig that does not exist (an
//! error line: labels and Events are only logged) and `--resource-api dra`, which needs the API
//! (a fatal error line, exit 1).

use std::process::{Command, Output};

fn agent(extra: &[&str], env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-kubeconfig");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_erdma-agent"));
    cmd.arg("--sysfs-root")
        .arg(dir.path())
        .arg("--dev-root")
        .arg(dir.path())
        .arg("--kubelet-dir")
        .arg(dir.path())
        .arg("--kubeconfig")
        .arg(&missing)
        .args(["--prefer-driver", "none", "--metrics-addr", "off"])
        .args(["--resource-api", "dra"])
        .args(extra)
        .env("NODE_NAME", "node-a")
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("ERDMA_LOG_FORMAT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    // `output()` pipes stderr: not a terminal.
    cmd.output().expect("run erdma-agent")
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).expect("stderr is UTF-8")
}

#[test]
fn text_logs_on_a_pipe_carry_no_ansi_escapes() {
    let out = agent(&[], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!out.stderr.contains(&0x1b), "ESC in text logs: {err:?}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].contains(" ERROR ") && lines[0].contains("no-such-kubeconfig"),
        "{err}"
    );
    assert!(
        lines[1].contains(" ERROR ") && lines[1].contains("--resource-api dra needs"),
        "{err}"
    );
    // The same with --log-format=text spelt out, and with NO_COLOR set.
    let out = agent(&["--log-format=text"], &[("NO_COLOR", "1")]);
    assert!(!out.stderr.contains(&0x1b), "{:?}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 2, "{}", stderr(&out));
}

/// Every line is a JSON object with `level`, `target` and `fields.message`.
fn assert_json_lines(out: &Output) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!out.stderr.contains(&0x1b), "{err:?}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v.is_object(), "{line}");
        assert_eq!(v["level"], "ERROR", "{line}");
        assert!(v["fields"]["message"].is_string(), "{line}");
        assert!(
            v["target"].as_str().unwrap().starts_with("erdma_agent"),
            "{line}"
        );
    }
    let last: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    assert!(
        last["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("--resource-api dra needs"),
        "{err}"
    );
}

#[test]
fn json_logs_are_one_object_per_line() {
    assert_json_lines(&agent(&["--log-format", "json"], &[]));
    // Never ANSI, even where text would have colours (NO_COLOR empty does not turn them off).
    assert_json_lines(&agent(&["--log-format=json"], &[("NO_COLOR", "")]));
    // The config file's key (the Helm name), and the flag over the file.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.yaml");
    std::fs::write(&cfg, "logFormat: json\n").unwrap();
    let c = cfg.to_str().unwrap();
    assert_json_lines(&agent(&["--config", c], &[]));
    let out = agent(&["--config", c, "--log-format", "text"], &[]);
    assert!(
        stderr(&out).lines().all(|l| !l.starts_with('{')),
        "{}",
        stderr(&out)
    );
}

#[test]
fn log_level_wins_over_rust_log_which_wins_over_info() {
    // RUST_LOG=off silences the default.
    let out = agent(&[], &[("RUST_LOG", "off")]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out), "", "RUST_LOG=off");
    // --log-level beats RUST_LOG.
    let out = agent(&["--log-level", "error"], &[("RUST_LOG", "off")]);
    assert_eq!(stderr(&out).lines().count(), 2, "{}", stderr(&out));
    // Per-target directives.
    let out = agent(&["--log-level", "off,erdma_agent=error"], &[]);
    assert_eq!(stderr(&out).lines().count(), 2, "{}", stderr(&out));
    let out = agent(&["--log-level", "error,erdma_agent=off"], &[]);
    assert_eq!(stderr(&out), "", "erdma_agent=off");
    // An empty flag (a chart value left empty) falls back to RUST_LOG.
    let out = agent(&["--log-level="], &[("RUST_LOG", "off")]);
    assert_eq!(stderr(&out), "");
}

#[test]
fn an_invalid_filter_exits_2_naming_it() {
    let out = agent(&["--log-level", "info,erdma_nri=loud"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with(
            "erdma-agent: --log-level \"info,erdma_nri=loud\" is not a valid log filter"
        ),
        "{err}"
    );
    assert!(
        err.contains("\"info,erdma_nri=debug\""),
        "an example: {err}"
    );
    assert_eq!(err.lines().count(), 1, "nothing else is logged: {err}");

    let out = agent(&[], &[("RUST_LOG", "verbose")]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("RUST_LOG \"verbose\""), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.yaml");
    std::fs::write(&cfg, "logLevel: warning\n").unwrap();
    let out = agent(&["--config", cfg.to_str().unwrap()], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("\"warning\""), "{err}");

    let out = agent(&["--log-format", "xml"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--log-format") && err.contains("\"xml\""),
        "{err}"
    );
}
