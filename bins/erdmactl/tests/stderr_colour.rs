//! `erdmactl` writes no ANSI escapes to a stderr that is not a terminal (clap's usage errors
//! follow the same rule as the daemons' logs: colours only on a terminal without `NO_COLOR`;
//! erdmactl's own messages are plain text).

use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_erdmactl"))
        .args(args)
        .env_remove("NO_COLOR")
        .env_remove("CLICOLOR_FORCE")
        .output()
        .expect("run erdmactl")
}

#[test]
fn usage_and_runtime_errors_on_a_pipe_carry_no_ansi_escapes() {
    let dir = tempfile::tempdir().unwrap();
    let sysfs = dir.path().to_str().unwrap();
    for (args, code) in [
        (vec!["no-such-command"], 2),
        (
            vec!["devices", "--sysfs-root", sysfs, "--dev-root", sysfs],
            1,
        ),
    ] {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(!err.trim().is_empty(), "{args:?} says why on stderr");
        assert!(!out.stderr.contains(&0x1b), "{args:?}: ESC in {err:?}");
    }
}
