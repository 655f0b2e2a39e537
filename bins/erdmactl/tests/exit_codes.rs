//! The exit-status contract of every subcommand, as `--help` and the README state it: 0 success,
//! 1 a check failed or nothing usable was found, 2 usage, input or access error.

use assert_cmd::Command;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::cargo_bin("erdmactl")
        .unwrap()
        .current_dir(workspace())
        .env_remove("KUBECONFIG")
        .env("HOME", "/nonexistent")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn code(args: &[&str]) -> Option<i32> {
    run(args).0
}

const SUBCOMMANDS: &[&[&str]] = &[
    &["devices"],
    &["doctor"],
    &["install"],
    &["uninstall"],
    &["submit", "pytorch"],
    &["smc", "status"],
    &["smc", "pnet"],
    &["nccl", "analyze"],
    &["nccl", "compare"],
    &["top", "pods"],
    &["top", "devices"],
];

#[test]
fn every_subcommand_documents_its_exit_status_and_usage_errors_exit_2() {
    let (c, top, _) = run(&["--help"]);
    assert_eq!(c, Some(0));
    assert!(
        top.contains("Exit status (every subcommand): 0 success; 1 a check failed"),
        "{top}"
    );
    for sub in SUBCOMMANDS {
        let mut args = sub.to_vec();
        args.push("--help");
        let (c, help, _) = run(&args);
        assert_eq!(c, Some(0), "{sub:?} --help");
        assert!(help.contains("Exit status: 0 "), "{sub:?}: {help}");
        let mut args = sub.to_vec();
        args.push("--no-such-flag");
        assert_eq!(code(&args), Some(2), "{sub:?} with an unknown flag");
    }
    assert_eq!(code(&["no-such-subcommand"]), Some(2));
}

#[test]
fn devices_0_usable_1_none_2_bad_input() {
    let sys = |t: &str| format!("testdata/sysfs/{t}/sys");
    assert_eq!(
        code(&["devices", "--sysfs-root", &sys("erdma-compat")]),
        Some(0)
    );
    assert_eq!(
        code(&["devices", "--sysfs-root", &sys("broken-no-uverbs")]),
        Some(1)
    );
    assert_eq!(
        code(&["devices", "--sysfs-root", &sys("erdma-compat"), "-o", "xml"]),
        Some(2)
    );
}

#[test]
fn doctor_0_pass_or_warn_1_fail_or_strict_warn_2_unreadable_cluster() {
    let plugins = tempfile::tempdir().unwrap();
    let dir = plugins.path().to_str().unwrap();
    let local = |tree: &str, strict: bool| {
        let root = format!("testdata/sysfs/{tree}/sys");
        let mut a = vec![
            "doctor",
            "--agent-addr",
            "off",
            "--kubelet-dir",
            dir,
            "--sysfs-root",
        ];
        a.push(&root);
        if strict {
            a.push("--strict");
        }
        code(&a)
    };
    // erdma-compat passes; erdma-iwarp only warns (iWARP devices and NCCL); rxe has no eRDMA.
    assert_eq!(local("erdma-compat", false), Some(0));
    assert_eq!(local("erdma-compat", true), Some(0));
    assert_eq!(local("erdma-iwarp", false), Some(0));
    assert_eq!(
        local("erdma-iwarp", true),
        Some(1),
        "--strict fails on warnings"
    );
    assert_eq!(local("rxe-6.12", false), Some(1));
    let kc = plugins.path().join("missing-kubeconfig");
    assert_eq!(
        code(&[
            "doctor",
            "--node",
            "n1",
            "--kubeconfig",
            kc.to_str().unwrap()
        ]),
        Some(2)
    );
}

#[test]
fn install_and_uninstall_0_rendered_2_invalid() {
    assert_eq!(
        code(&["install", "--dry-run", "--local-eri-discovery"]),
        Some(0)
    );
    assert_eq!(
        code(&["install", "--dry-run", "--jumbo-frame-mtu", "100"]),
        Some(2)
    );
    assert_eq!(code(&["uninstall", "--dry-run"]), Some(0));
}

#[test]
fn submit_0_rendered_2_invalid() {
    assert_eq!(
        code(&[
            "submit",
            "pytorch",
            "--name",
            "t1",
            "--image",
            "busybox",
            "--dry-run",
            "--",
            "true",
        ]),
        Some(0)
    );
    assert_eq!(
        code(&[
            "submit",
            "pytorch",
            "--name",
            "Not_A_Name",
            "--image",
            "busybox",
            "--dry-run",
            "--",
            "true",
        ]),
        Some(2)
    );
}

#[test]
fn nccl_0_analysed_1_erdma_required_but_unused_2_unreadable() {
    let tcp = "testdata/nccl/synthetic/tcp-2node.log";
    let erdma = "testdata/nccl/synthetic/erdma-2node-gdr.log";
    assert_eq!(
        code(&["nccl", "analyze", erdma, "--require-erdma"]),
        Some(0)
    );
    assert_eq!(code(&["nccl", "analyze", tcp]), Some(0));
    assert_eq!(code(&["nccl", "analyze", tcp, "--require-erdma"]), Some(1));
    assert_eq!(code(&["nccl", "analyze", "no/such.log"]), Some(2));
    assert_eq!(code(&["nccl", "compare", tcp, erdma]), Some(0));
    assert_eq!(code(&["nccl", "compare", tcp, "no/such.log"]), Some(2));
}

/// `smc status` / `smc pnet` exit 1 on a kernel without SMC and 0 with it; either way never 3.
#[test]
fn smc_0_listed_1_unsupported_2_bad_netns() {
    let with_smc = Path::new("/sys/module/smc_diag").exists();
    for sub in ["status", "pnet"] {
        let (c, _, err) = run(&["smc", sub]);
        if with_smc {
            assert_eq!(c, Some(0), "{sub}: {err}");
        } else {
            assert_eq!(c, Some(1), "{sub}: {err}");
            assert!(err.starts_with("SMC unsupported: "), "{sub}: {err}");
        }
    }
    assert_eq!(
        code(&[
            "smc",
            "status",
            "--netns",
            "/var/run/netns/erdma-no-such-ns"
        ]),
        Some(2)
    );
}

/// Bad input that used to be accepted silently (issue 30, item 7): each is refused with exit 2
/// and a message naming the value. (input, words the message must hold)
#[test]
fn silently_accepted_inputs_are_refused_naming_them() {
    let sub = &[
        "submit",
        "pytorch",
        "--dry-run",
        "--name",
        "j",
        "--image",
        "i",
    ];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            [
                &sub[..],
                &["--device", "aliyun/erdma=-1", "--", "python", "t.py"],
            ]
            .concat(),
            "'-1' is negative",
        ),
        (
            [&sub[..], &["--memory", "-5Gi", "--", "python", "t.py"]].concat(),
            "'-5Gi' is negative",
        ),
        (
            [
                &sub[..],
                &[
                    "--smcr",
                    "-a",
                    "network.alibabacloud.com/erdma-smcr=false",
                    "--device",
                    "aliyun/erdma=1",
                    "--",
                    "python",
                    "t.py",
                ],
            ]
            .concat(),
            "--smcr asks for SMC-R but --annotation turns it off",
        ),
        (
            vec![
                "install",
                "--dry-run",
                "--credentials-type",
                "ecs_ram_role",
                "--namespace",
                "",
            ],
            "namespace \"\" is not valid",
        ),
        (
            vec![
                "install",
                "--dry-run",
                "--credentials-type",
                "ecs_ram_role",
                "--release",
                "Bad_Release",
            ],
            "release name \"Bad_Release\" is not valid",
        ),
        (
            vec!["install", "--dry-run", "-f", "/dev/zero"],
            "/dev/zero: larger than 4 MiB",
        ),
        (
            vec![
                "nccl",
                "analyze",
                "--max-line-bytes",
                "100000000000",
                "/dev/null",
            ],
            "--max-line-bytes 100000000000 is too large",
        ),
    ];
    for (args, words) in cases {
        let (code, _, err) = run(&args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(words), "{args:?}: want {words:?} in {err}");
    }
}
