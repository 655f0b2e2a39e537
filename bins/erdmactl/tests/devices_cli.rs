//! `erdmactl devices` driven as a binary against the checked-in fixture trees.

use assert_cmd::Command;
use predicates::prelude::*;
use std::path::PathBuf;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn devices(fixture: &str, extra: &[&str]) -> assert_cmd::assert::Assert {
    Command::cargo_bin("erdmactl")
        .unwrap()
        .current_dir(workspace())
        .args([
            "devices",
            "--sysfs-root",
            &format!("testdata/sysfs/{fixture}/sys"),
        ])
        .args(extra)
        .assert()
}

fn stdout(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8(a.get_output().stdout.clone()).unwrap()
}

#[test]
fn json_snapshots_of_every_fixture() {
    for fixture in [
        "rxe-6.12",
        "erdma-iwarp",
        "erdma-compat",
        "broken-garbage",
        "broken-missing",
        "broken-links",
        "broken-no-uverbs",
    ] {
        let a = devices(fixture, &["-o", "json"]);
        let out = stdout(&a);
        let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
        assert!(v["devices"].is_array());
        insta::assert_snapshot!(format!("devices_json_{fixture}"), out);
    }
}

#[test]
fn table_for_the_real_rxe_capture() {
    let a = devices("rxe-6.12", &[]).success();
    let out = stdout(&a);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("DEVICE"));
    for col in [
        "MODE", "STATE", "NUMA", "NETDEV", "MAC", "PNETID", "CHARDEVS", "HEALTH",
    ] {
        assert!(lines[0].contains(col), "missing column {col}");
    }
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        row,
        [
            "rxe0",
            "rxe",
            "roce",
            "ACTIVE",
            "unknown",
            "veth0",
            "12:59:d8:34:6b:1b",
            "1259D8346B1B",
            "uverbs0,umad0",
            "healthy"
        ]
    );
}

#[test]
fn table_for_erdma_iwarp_shows_numa_and_uverbs_mapping() {
    let a = devices("erdma-iwarp", &[]).success();
    let out = stdout(&a);
    assert!(
        out.contains(
            "erdma_0  erdma   iwarp  ACTIVE  0     eth1    00:16:3e:0a:1b:2c  00163E0A1B2C  uverbs1"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "erdma_1  erdma   iwarp  ACTIVE  1     eth2    00:16:3e:0a:1b:2d  00163E0A1B2D  uverbs0"
        ),
        "{out}"
    );
    assert!(out.contains("rdma_cm: /dev/infiniband/rdma_cm"));
}

#[test]
fn yaml_has_the_same_fields() {
    let a = devices("erdma-compat", &["-o", "yaml"]).success();
    let out = stdout(&a);
    assert!(out.contains("gid_index: 2"), "{out}");
    assert!(out.contains("pnet_id: 00163E0A1B2C"), "{out}");
}

#[test]
fn no_usable_device_exits_non_zero_and_says_what_to_check() {
    devices("broken-no-uverbs", &[])
        .code(1)
        .stderr(predicate::str::contains("no usable RDMA devices found"))
        .stderr(predicate::str::contains("modprobe ib_uverbs"));
    let empty = tempfile::tempdir().unwrap();
    Command::cargo_bin("erdmactl")
        .unwrap()
        .args(["devices", "--sysfs-root"])
        .arg(empty.path())
        .assert()
        .code(1)
        .stderr(predicate::str::contains("is the driver loaded"))
        .stderr(predicate::str::contains("compat_mode"));
}

#[test]
fn driver_filter() {
    // The agent's flag name, and the old spelling.
    devices("rxe-6.12", &["--rdma-driver", "erdma"])
        .code(1)
        .stderr(predicate::str::contains("no usable erdma devices"));
    devices("rxe-6.12", &["--rdma-driver", "rxe"]).success();
    devices("rxe-6.12", &["--driver", "erdma"]).code(1);
}

#[test]
fn unknown_output_format_is_rejected_by_name() {
    devices("rxe-6.12", &["-o", "xml"])
        .code(2)
        .stderr(predicate::str::contains("xml"));
}
