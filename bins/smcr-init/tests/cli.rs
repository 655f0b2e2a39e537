//! `smcr-init` as the init container and the manual/lab tool, against this machine's real kernel.
//! Every run targets a fresh network namespace (`unshare --net`) or a namespace the test names,
//! never the host's own.

use assert_cmd::Command;

use erdma_smc::testing::require_kernel_without_smc;

/// `smcr-init ARGS` in a fresh network namespace, with a clean environment.
fn in_fresh_netns(args: &[&str], env_pnet: Option<&str>) -> std::process::Output {
    let bin = assert_cmd::cargo::cargo_bin("smcr-init");
    let mut c = Command::new("unshare");
    c.arg("--net").arg(bin).args(args).env_remove("SMCR_PNET");
    if let Some(p) = env_pnet {
        c.env("SMCR_PNET", p);
    }
    c.output().unwrap()
}

#[test]
fn missing_or_bad_pnet_is_a_clear_error() {
    let out = in_fresh_netns(&[], None);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SMCR_PNET is empty") && err.contains("Fix"),
        "{err}"
    );
    let out = in_fresh_netns(&[], Some("not a pnet id!"));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"not a pnet id!\""), "{err}");
}

#[test]
#[ignore = "needs root (unshare --net) and a kernel without SMC; run with --ignored by scripts/test.sh on the CI host (root, no smc)"]
fn unsupported_kernel_starts_the_pod_on_tcp_unless_strict() {
    require_kernel_without_smc();
    let out = in_fresh_netns(&[], Some("00163E0A1B2C"));
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.lines().any(|l| l.starts_with("SMC unsupported: ")) && err.contains("modprobe smc"),
        "{err}"
    );
    assert!(stdout.contains("the pod runs on TCP"), "{stdout}");
    // The agent's flag name, and the old spelling.
    for strict in ["--smcr-strict", "--strict"] {
        let out = in_fresh_netns(&[strict], Some("00163E0A1B2C"));
        assert_eq!(out.status.code(), Some(1), "{strict}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("SMC unsupported: "));
    }
    let out = in_fresh_netns(&["-o", "json", "--pnet", "ABC"], None);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["netns"], "self");
    assert_eq!(v["capabilities"]["smc"], false);
    assert!(
        v["unsupported"]
            .as_str()
            .unwrap()
            .starts_with("SMC unsupported: ")
    );
    assert_eq!(v["steps"].as_array().unwrap().len(), 0);
}

#[test]
fn host_network_namespace_is_skipped_and_gone_namespace_fails() {
    let out = Command::cargo_bin("smcr-init")
        .unwrap()
        .args(["--pnet", "ABC", "--netns", "/proc/self/ns/net"])
        .args(["--host-netns", "/proc/self/ns/net"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout.contains("host-network pods are never configured"),
        "{stdout}"
    );
    let out = Command::cargo_bin("smcr-init")
        .unwrap()
        .args([
            "--pnet",
            "ABC",
            "--netns",
            "/var/run/netns/erdma-no-such-pod",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("erdma-no-such-pod") && err.contains("is gone"),
        "{err}"
    );
}

#[test]
fn policy_commands_without_a_loaded_policy() {
    let d = tempfile::tempdir().unwrap();
    let out = Command::cargo_bin("smcr-init")
        .unwrap()
        .args(["policy", "list", "--bpf-pin-dir"])
        .arg(d.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("has not loaded the policy"), "{err}");
    let out = Command::cargo_bin("smcr-init")
        .unwrap()
        .args(["policy", "unload", "--pin-dir"])
        .arg(d.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "unload is idempotent");
}

#[test]
fn usage_errors_exit_2_and_help_documents_the_exit_status() {
    let out = Command::cargo_bin("smcr-init")
        .unwrap()
        .args(["--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::cargo_bin("smcr-init")
        .unwrap()
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Exit status: 0 configured"), "{help}");
    assert!(help.contains("--bpf-pin-dir"), "{help}");
    assert!(help.contains("--smcr-keep-ipv6"), "{help}");
    assert!(
        !help.lines().any(|l| l.trim_start().starts_with("--pin-dir")
            || l.trim_start().starts_with("--strict")
            || l.trim_start().starts_with("--keep-ipv6")),
        "old spellings are not listed as options: {help}"
    );
}

/// `smcr-init ARGS` in a fresh network namespace with the downward-API variables the webhook
/// sets (`ERDMA_POD_IP`, `ERDMA_HOST_IP`).
fn in_fresh_netns_as_pod(args: &[&str], pod_ip: &str, host_ip: &str) -> std::process::Output {
    let bin = assert_cmd::cargo::cargo_bin("smcr-init");
    Command::new("unshare")
        .arg("--net")
        .arg(bin)
        .args(args)
        .env("SMCR_PNET", "00163E0A1B2C")
        .env("ERDMA_POD_IP", pod_ip)
        .env("ERDMA_HOST_IP", host_ip)
        .output()
        .unwrap()
}

/// Issue 45 item 1: a hostNetwork pod has its node's IP. smcr-init, injected or run as the
/// original's privileged init container, refuses to touch that namespace (exit 3, the fix
/// named) instead of turning IPv6 off and SMC on for the whole node.
#[test]
fn the_nodes_network_namespace_is_refused_with_exit_3() {
    for args in [&["verify"][..], &[][..]] {
        let out = in_fresh_netns_as_pod(args, "192.0.2.7", "192.0.2.7");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
        assert!(
            err.contains("refusing to act on the node's network namespace")
                && err.contains("192.0.2.7")
                && err.contains("Fix"),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: nothing reported as done");
    }
    // The same namespace named by --host-netns.
    let out = Command::cargo_bin("smcr-init")
        .unwrap()
        .args(["verify", "--host-netns", "/proc/self/ns/net"])
        .env_remove("ERDMA_POD_IP")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("(the node's)"));
}

/// Issue 45 item 1: the injected `verify` changes nothing and reports on its own namespace. A
/// fresh namespace the agent never configured runs on TCP: exit 0, or 1 with --smcr-strict.
#[test]
fn verify_reports_a_namespace_the_agent_did_not_configure() {
    let out = in_fresh_netns_as_pod(&["verify"], "198.51.100.9", "192.0.2.7");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("the pod runs on TCP")
            && (stdout.starts_with("SMC unsupported: ") || stdout.starts_with("SMC-R not enabled")),
        "{stdout}"
    );
    let out = in_fresh_netns_as_pod(
        &["verify", "--smcr-strict", "-o", "json"],
        "198.51.100.9",
        "192.0.2.7",
    );
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mechanism"], serde_json::Value::Null);
}
