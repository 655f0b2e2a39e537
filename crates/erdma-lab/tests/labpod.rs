//! Runs the real `erdma-labpod` binary: namespaces, private /dev, mounts, env, exit codes.
//! Creating namespaces needs root: those tests are `#[ignore]`d and `scripts/test.sh` runs them
//! with `--ignored` on the CI host (root); without root they fail, and so does any `run` error.

use std::path::Path;
use std::process::{Command, Output};

fn labpod(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_erdma-labpod"))
        .args(args)
        .output()
        .expect("erdma-labpod runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Fails the calling test unless it runs as root (namespaces, mounts and device nodes need it).
fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root to create namespaces; run with --ignored as root (scripts/test.sh does on CI)"
    );
}

fn write_alloc(dir: &Path, data: &Path) -> String {
    let json = serde_json::json!({
        "pod": "lab/pod-a",
        "device_ids": ["rxe0/0"],
        "envs": {"ERDMA_DEVICES": "rxe0"},
        "mounts": [{"container_path": data.join("ro").display().to_string(), "host_path": data.join("src").display().to_string(), "read_only": true}],
        "devices": [{"container_path": "/dev/infiniband/uverbs0", "host_path": "/dev/null", "permissions": "rw"}],
        "annotations": {},
        "cdi_devices": []
    });
    let path = dir.join("alloc.json");
    std::fs::write(&path, json.to_string()).expect("write alloc");
    path.display().to_string()
}

#[test]
#[ignore = "needs root (namespaces, mounts); run with --ignored by scripts/test.sh on the CI host, which runs as root"]
fn a_pod_sees_only_its_devices_mounts_and_env() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("src")).expect("mkdir");
    std::fs::create_dir_all(dir.path().join("ro")).expect("mkdir");
    std::fs::write(dir.path().join("src/hello"), "from the node\n").expect("write");
    let alloc = write_alloc(dir.path(), dir.path());
    let ro = dir.path().join("ro").display().to_string();
    let script = format!(
        "echo devs: $(cd /dev && find . -path ./pts -prune -o -type c -print | sort | tr '\\n' ' '); \
         stat -c 'uverbs0 %t:%T' /dev/infiniband/uverbs0; \
         echo host: $(hostname); echo env: $ERDMA_DEVICES $EXTRA; echo pid: $$; \
         echo net: $(ls /sys/class/net); cat {ro}/hello; \
         touch {ro}/x 2>/dev/null && echo ro: writable || echo ro: read-only; \
         touch /pod-root-write 2>/dev/null && echo root: writable || echo root: read-only; \
         touch /tmp/pod-tmp-file && echo tmp: writable"
    );
    let out = labpod(&[
        "run",
        "--name",
        "pod-a",
        "--alloc",
        &alloc,
        "--env",
        "EXTRA=yes",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {}",
        text(&out.stderr)
    );
    assert!(
        stdout
            .contains("devs: ./full ./infiniband/uverbs0 ./null ./random ./tty ./urandom ./zero\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("uverbs0 1:3"),
        "the node keeps the host's major:minor: {stdout}"
    );
    assert!(stdout.contains("host: pod-a"), "{stdout}");
    assert!(stdout.contains("env: rxe0 yes"), "{stdout}");
    assert!(
        stdout.contains("pid: 2"),
        "the command runs under the pod's own init: {stdout}"
    );
    assert!(
        stdout.contains("net: lo\n"),
        "a new network namespace has only lo: {stdout}"
    );
    assert!(stdout.contains("from the node"), "{stdout}");
    assert!(stdout.contains("ro: read-only"), "{stdout}");
    assert!(
        stdout.contains("root: read-only"),
        "the node's root is read-only in a pod: {stdout}"
    );
    assert!(stdout.contains("tmp: writable"), "{stdout}");
    assert!(!Path::new("/pod-root-write").exists());
    assert!(
        !Path::new("/tmp/pod-tmp-file").exists(),
        "the pod's /tmp is private"
    );
    assert!(!dir.path().join("src/x").exists());
}

#[test]
#[ignore = "needs root (namespaces, mounts); run with --ignored by scripts/test.sh on the CI host, which runs as root"]
fn a_pod_without_allocation_has_no_infiniband_and_exit_codes_pass_through() {
    require_root();
    let out = labpod(&[
        "run",
        "--name",
        "pod-c",
        "--",
        "sh",
        "-c",
        "test -e /dev/infiniband && exit 3; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "stderr: {}", text(&out.stderr));
    let out = labpod(&["run", "--name", "pod-c", "--", "/nonexistent/cmd"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        text(&out.stderr).contains("/nonexistent/cmd"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn bad_input_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"devices":[{"container_path":"/etc/shadow","host_path":"/dev/null","permissions":"rw"}]}"#)
        .expect("write");
    let out = labpod(&[
        "plan",
        "--name",
        "pod-a",
        "--alloc",
        bad.to_str().expect("utf8"),
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("/etc/shadow"),
        "{}",
        text(&out.stderr)
    );

    let out = labpod(&[
        "plan",
        "--name",
        "pod-a",
        "--alloc",
        "/nonexistent.json",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("/nonexistent.json"),
        "{}",
        text(&out.stderr)
    );

    let out = labpod(&[
        "run",
        "--name",
        "pod-a",
        "--netns",
        "no-such-ns-erdma",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.contains("no-such-ns-erdma") || err.contains("root"),
        "{err}"
    );
}

#[test]
fn plan_prints_the_pod_as_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("src")).expect("mkdir");
    let alloc = write_alloc(dir.path(), dir.path());
    let out = labpod(&[
        "plan",
        "--name",
        "pod-a",
        "--netns",
        "pod-a",
        "--alloc",
        &alloc,
        "--",
        "ibv_devices",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(plan["network"]["named"], "pod-a");
    assert_eq!(plan["device_ids"][0], "rxe0/0");
    assert_eq!(
        plan["devices"][6]["container_path"],
        "/dev/infiniband/uverbs0"
    );
    assert_eq!(plan["env"]["ERDMA_DEVICES"], "rxe0");
    assert_eq!(plan["command"][0], "ibv_devices");
}

#[test]
#[ignore = "needs root (namespaces, mounts); run with --ignored by scripts/test.sh on the CI host, which runs as root"]
fn sigterm_reaches_the_command_through_the_pods_init() {
    require_root();
    let mut child = Command::new(env!("CARGO_BIN_EXE_erdma-labpod"))
        .args(["run", "--name", "pod-t", "--", "sleep", "30"])
        .spawn()
        .expect("spawn");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let started = std::time::Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal erdma-labpod");
    let status = child.wait().expect("wait");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "the pod ignored SIGTERM"
    );
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "sleep was killed by SIGTERM: {status:?}"
    );
}
