//! `erdmactl smc` against the real kernel of the test machine. Without SMC (the CI machines and
//! this build host) both subcommands must say "SMC unsupported: <reason>" and exit 1; with SMC
//! they list (the lab covers real sockets).

use assert_cmd::Command;

fn smc_loaded() -> bool {
    std::path::Path::new("/sys/module/smc_diag").exists()
}

use erdma_smc::testing::require_kernel_without_smc;

#[test]
fn status_reports_unsupported_or_lists() {
    let out = Command::cargo_bin("erdmactl")
        .unwrap()
        .args(["smc", "status"])
        .output()
        .unwrap();
    if smc_loaded() {
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("socket(s):"));
        return;
    }
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("SMC unsupported: ") && err.contains("modprobe smc"),
        "{err}"
    );
}

#[test]
#[ignore = "needs root (enters a network namespace) and a kernel without SMC; run with --ignored by scripts/test.sh on the CI host (root, no smc)"]
fn status_json_is_complete_when_unsupported() {
    require_kernel_without_smc();
    let out = Command::cargo_bin("erdmactl")
        .unwrap()
        .args([
            "smc",
            "status",
            "-o",
            "json",
            "--netns",
            "/proc/self/ns/net",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["supported"], false);
    assert_eq!(v["netns"], "/proc/self/ns/net");
    assert!(
        v["unsupported"]
            .as_str()
            .unwrap()
            .starts_with("SMC unsupported: ")
    );
    assert_eq!(v["sockets"].as_array().unwrap().len(), 0);
    assert_eq!(v["summary"]["total"], 0);
}

#[test]
fn pnet_reports_unsupported_or_lists() {
    let out = Command::cargo_bin("erdmactl")
        .unwrap()
        .args(["smc", "pnet", "-o", "json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    if std::path::Path::new("/sys/module/smc").exists() {
        assert!(out.status.success());
        assert_eq!(v["supported"], true);
        return;
    }
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(v["supported"], false);
    let u = v["unsupported"].as_str().unwrap();
    assert!(
        u.starts_with("SMC unsupported: ") && u.contains("SMC_PNETID"),
        "{u}"
    );
}

#[test]
fn a_missing_netns_is_a_clear_error() {
    let out = Command::cargo_bin("erdmactl")
        .unwrap()
        .args(["smc", "status", "--netns", "/var/run/netns/no-such-pod"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/var/run/netns/no-such-pod") && err.contains("gone"),
        "{err}"
    );
}
