//! stdout that fails: a full device ends every subcommand with exit 2 and a message naming it
//! (never a panic, never a silent success); a reader that goes away (`| head`) ends it quietly
//! with 141, as a process SIGPIPE ends. Before: exit 101, "failed printing to stdout".

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn erdmactl(args: &[&str], stdout: Stdio) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_erdmactl"))
        .current_dir(workspace())
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", "/nonexistent")
        .args(args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn dev_full() -> Stdio {
    Stdio::from(
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap(),
    )
}

/// A pipe whose reading end is already closed: the first write fails with EPIPE.
fn closed_pipe() -> Stdio {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Stdio::from(writer)
}

const FIXTURE: &str = "testdata/sysfs/erdma-compat/sys";
const NCCL_LOG: &str = "testdata/nccl/synthetic/tcp-2node.log";

fn commands() -> Vec<Vec<&'static str>> {
    vec![
        vec!["devices", "--sysfs-root", FIXTURE],
        vec!["devices", "--sysfs-root", FIXTURE, "-o", "json"],
        vec!["nccl", "analyze", NCCL_LOG],
        vec!["install", "--dry-run", "--credentials-type", "ecs_ram_role"],
        vec![
            "submit",
            "pytorch",
            "--dry-run",
            "--name",
            "job",
            "--image",
            "img",
            "--",
            "python",
            "t.py",
        ],
        vec!["--help"],
        vec!["devices", "--help"],
        vec!["--version"],
    ]
}

#[test]
fn a_full_stdout_is_exit_2_naming_it() {
    for args in commands() {
        let (code, err) = erdmactl(&args, dev_full());
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(
            err.contains("cannot write the output to stdout")
                && err.contains("No space left on device"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn a_closed_pipe_ends_quietly_with_141() {
    for args in commands() {
        let (code, err) = erdmactl(&args, closed_pipe());
        assert_eq!(code, Some(141), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
    }
}
