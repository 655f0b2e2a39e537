//! `erdmactl devices` when a sysfs attribute never answers (a driver stuck in it; here a FIFO in
//! place of a port's `state`, whose read waits for a writer that never comes): the read is given
//! up after its 2 s limit, the device is listed unhealthy with a finding naming the file, the
//! other devices as they are, and the exit status follows the contract (0 while a device is
//! usable, 1 when none is).

use erdma_host::fake::NodeTree;
use erdma_host::fixtures;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The read limit is 2 s per blocked directory (two here at most); generous for a loaded CI
/// machine. Before the fix the command never ended.
const HANG: Duration = Duration::from_secs(30);

/// The erdma-iwarp fixture with the port state of `devices` FIFOs.
fn tree_with_fifos(devices: &[&str]) -> NodeTree {
    let tree = NodeTree::temp();
    assert!(fixtures::build("erdma-iwarp", &tree));
    for dev in devices {
        let state = tree
            .sys()
            .join(format!("class/infiniband/{dev}/ports/1/state"));
        std::fs::remove_file(&state).expect("the fixture has the state file");
        let made = Command::new("mkfifo").arg(&state).status().expect("mkfifo");
        assert!(made.success(), "mkfifo {}", state.display());
    }
    tree
}

/// Runs `erdmactl devices` on `tree`, killed (and failing the test) after [`HANG`].
fn devices(tree: &NodeTree, extra: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_erdmactl"))
        .arg("devices")
        .arg("--sysfs-root")
        .arg(tree.sys())
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn erdmactl");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > HANG {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "erdmactl devices did not end within {HANG:?}; stdout:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn findings(dev: &serde_json::Value) -> Vec<String> {
    dev["findings"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f["message"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_port_state_that_never_answers_is_reported_naming_the_file() {
    let tree = tree_with_fifos(&["erdma_0"]);
    let out = devices(&tree, &["-o", "json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "erdma_1 is usable: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let devs = report["devices"].as_array().expect("devices");
    let dev = |name: &str| {
        devs.iter()
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("{name} listed: {stdout}"))
    };
    assert_eq!(report["usable"], 1, "{stdout}");
    let state = tree.sys().join("class/infiniband/erdma_0/ports/1/state");
    let found = findings(dev("erdma_0"));
    assert!(
        found.contains(&format!(
            "cannot read {}: no answer within 2s: the read is still blocked (a driver stuck in this attribute?)",
            state.display()
        )),
        "{found:#?}"
    );
    let health = dev("erdma_0")["health"].to_string();
    assert!(health.contains("port 1 state is unreadable"), "{health}");
    assert!(
        findings(dev("erdma_1"))
            .iter()
            .all(|f| !f.contains("no answer"))
    );
    assert_eq!(dev("erdma_1")["ports"][0]["state"], "active", "{stdout}");

    // The table says it too.
    let out = devices(&tree, &[]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{table}");
    assert!(
        table.contains(&format!(
            "erdma_0: error: cannot read {}: no answer within 2s",
            state.display()
        )),
        "{table}"
    );
}

#[test]
fn when_no_device_answers_the_status_is_1() {
    let tree = tree_with_fifos(&["erdma_0", "erdma_1"]);
    let out = devices(&tree, &["-o", "json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("no usable RDMA devices found"), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    for d in report["devices"].as_array().expect("devices") {
        assert!(
            findings(d)
                .iter()
                .any(|f| f.contains("/ports/1/state: no answer within 2s")),
            "{d}"
        );
    }
}
