//! Usage and configuration errors end `erdma-controller` with exit 2 and a message naming the
//! value, before anything starts (before: exit 1, as a runtime failure). (flags, words)

use std::process::Command;

#[test]
fn bad_flags_and_config_exit_2_naming_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{ not json").unwrap();
    let missing = dir.path().join("missing.json");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--config-path".into(), missing.display().to_string()],
            "missing.json",
        ),
        (
            vec!["--config-path".into(), broken.display().to_string()],
            "broken.json",
        ),
        (
            vec!["--metrics-addr".into(), "garbage".into()],
            "--metrics-addr \"garbage\" is not an IP:PORT address",
        ),
        (
            vec!["--webhook-listen".into(), "localhost".into()],
            "--webhook-listen \"localhost\" is not an IP:PORT address",
        ),
    ];
    for (args, words) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_erdma-controller"))
            .args(&args)
            .env_remove("RUST_LOG")
            .env_remove("KUBECONFIG")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(words), "{args:?}: want {words:?} in {err}");
    }
}
