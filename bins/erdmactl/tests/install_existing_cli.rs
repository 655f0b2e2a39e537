//! `erdmactl install` / `uninstall` against a cluster, end to end: the real binary, its real kube
//! client reaching the repository's in-memory API server (`erdma_k8s::fake`) over HTTP through
//! `--kubeconfig`/`--context`. Another eRDMA installation makes install refuse before anything is
//! applied; the original's release in kube-system is upgraded in place; `--allow-existing`
//! installs anyway with a warning.

mod fake_cluster;

use fake_cluster::Cluster;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{Value, json};
use std::process::Output;

/// The fake API server on a loopback port, and a kubeconfig (context `fake`) pointing at it.
fn cluster() -> Cluster {
    fake_cluster::start()
}

fn erdmactl(args: &[&str]) -> Output {
    assert_cmd::Command::cargo_bin("erdmactl")
        .unwrap()
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("ERDMA_ACCESS_KEY_ID")
        .env_remove("ERDMA_ACCESS_KEY_SECRET")
        .env("HOME", "/nonexistent")
        .args(args)
        .output()
        .unwrap()
}

impl Cluster {
    /// `erdmactl <sub> --kubeconfig <this cluster> <args>`.
    fn run(&self, sub: &str, args: &[&str]) -> Output {
        let kc = self.kubeconfig.to_str().unwrap();
        let mut all = vec![sub, "--kubeconfig", kc];
        all.extend_from_slice(args);
        erdmactl(&all)
    }

    /// Requests that write (create, apply, update, delete).
    fn writes(&self) -> Vec<String> {
        ["POST", "PATCH", "PUT", "DELETE"]
            .iter()
            .flat_map(|m| self.api.requests_matching(m, ""))
            .collect()
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A DaemonSet of the console add-on, as its namespace holds it.
fn addon_agent() -> DaemonSet {
    let labels = json!({"app": "ack-erdma-agent"});
    serde_json::from_value(json!({
        "metadata": {"namespace": "ack-erdma-controller", "name": "ack-erdma-agent", "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "agent", "image": "registry-cn-hangzhou-vpc.ack.aliyuncs.com/acs/erdma-agent:v0.3"}]},
            },
        },
    }))
    .unwrap()
}

/// The original chart's agent DaemonSet of release `alibaba-erdma-controller` in kube-system.
fn original_agent() -> DaemonSet {
    let labels = json!({
        "app.kubernetes.io/name": "alibabacloud-erdma-controller",
        "app.kubernetes.io/instance": "alibaba-erdma-controller",
        "tier": "agent",
    });
    serde_json::from_value(json!({
        "metadata": {
            "namespace": "kube-system", "name": "alibabacloud-erdma-agent", "labels": labels,
            "annotations": {"meta.helm.sh/release-name": "alibaba-erdma-controller", "meta.helm.sh/release-namespace": "kube-system"},
        },
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{
                    "name": "alibabacloud-erdma-controller",
                    "image": "registry.aliyuncs.com/erdma/agent:latest",
                    "command": ["/usr/local/bin/agent"],
                    "args": ["--prefer-driver=", "--allocate-all-devices=false"],
                }]},
            },
        },
    }))
    .unwrap()
}

const CREDS: &[&str] = &["--credentials-type", "ecs_ram_role"];

#[test]
fn a_console_addon_daemonset_makes_install_refuse_and_apply_nothing() {
    let c = cluster();
    c.api.put(&addon_agent());
    let out = c.run("install", CREDS);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("DaemonSet ack-erdma-controller/ack-erdma-agent")
            && err.contains("ACK console (Operations > Add-ons)")
            && err.contains("`helm -n ack-erdma-controller uninstall ack-erdma-controller`")
            && err.contains("ERdmaDevice objects and the ERIs in ECS survive")
            && err.contains("Nothing was applied")
            && err.contains("--allow-existing"),
        "{err}"
    );
    assert!(text(&out.stdout).is_empty(), "{}", text(&out.stdout));
    assert_eq!(c.writes(), Vec::<String>::new());
    assert!(
        c.api
            .get::<DaemonSet>(Some("kube-system"), "alibabacloud-erdma-agent")
            .is_none()
    );

    // -o json: the refusal as an object on stdout.
    let out = c.run("install", &[CREDS, &["-o", "json"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("a JSON refusal on stdout");
    assert_eq!(v["refused"], true);
    assert_eq!(v["release"], "alibaba-erdma-controller");
    assert_eq!(v["namespace"], "kube-system");
    let conflicts = v["conflicts"].as_array().unwrap();
    assert_eq!(conflicts.len(), 1, "{v}");
    assert_eq!(conflicts[0]["kind"], "DaemonSet");
    assert_eq!(conflicts[0]["namespace"], "ack-erdma-controller");
    assert_eq!(conflicts[0]["name"], "ack-erdma-agent");
    assert!(
        conflicts[0]["what"]
            .as_str()
            .unwrap()
            .contains("ACK console add-on")
    );
    assert!(
        conflicts[0]["fix"]
            .as_str()
            .unwrap()
            .contains("Operations > Add-ons")
    );

    // --dry-run reaches the cluster too, and refuses without rendering.
    let out = c.run("install", &["--dry-run"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stdout).is_empty());
    assert!(text(&out.stderr).contains("DaemonSet ack-erdma-controller/ack-erdma-agent"));
    assert_eq!(c.writes(), Vec::<String>::new());
}

#[test]
fn the_original_release_in_kube_system_is_upgraded_in_place_and_uninstalled() {
    let c = cluster();
    c.api.put(&original_agent());
    let out = c.run("install", &[CREDS, &["--context", "fake"]].concat());
    let (stdout, err) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        stdout.contains("applied DaemonSet/alibabacloud-erdma-agent"),
        "{stdout}"
    );
    assert!(!err.contains("another eRDMA installation"), "{err}");
    let ds: DaemonSet = c
        .api
        .get(Some("kube-system"), "alibabacloud-erdma-agent")
        .unwrap();
    let image = ds.spec.unwrap().template.spec.unwrap().containers[0]
        .image
        .clone()
        .unwrap();
    assert!(image.starts_with("ghcr.io/erdma/erdma-agent:"), "{image}");
    // Running install again (erdma's own install now) is not a conflict either.
    let again = c.run("install", CREDS);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));

    // uninstall through the same kubeconfig and context.
    let out = c.run("uninstall", &["--context", "fake"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("deleted DaemonSet/alibabacloud-erdma-agent"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        c.api
            .get::<DaemonSet>(Some("kube-system"), "alibabacloud-erdma-agent")
            .is_none()
    );
}

#[test]
fn allow_existing_installs_next_to_terway_with_a_warning() {
    let c = cluster();
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"namespace": "kube-system", "name": "eni-config"},
        "data": {"eni_conf": "{\"version\": \"1\", \"enable_erdma\": true}"},
    }))
    .unwrap();
    c.api.put(&cm);
    let refused = c.run("install", CREDS);
    let err = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(
        err.contains("ConfigMap kube-system/eni-config eni_conf.enable_erdma=true")
            && err.contains("\"enable_erdma\": false"),
        "{err}"
    );
    assert_eq!(c.writes(), Vec::<String>::new());

    // The chart's value in a values file does what the flag does (one values contract).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, "allowExistingInstallation: true\n").unwrap();
    let out = c.run(
        "install",
        &[CREDS, &["--dry-run", "-f", file.to_str().unwrap()]].concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("installing next to ConfigMap kube-system/eni-config"));

    let out = c.run("install", &[CREDS, &["--allow-existing"]].concat());
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("warning: --allow-existing: installing next to ConfigMap kube-system/eni-config eni_conf.enable_erdma=true"),
        "{err}"
    );
    assert!(
        c.api
            .get::<DaemonSet>(Some("kube-system"), "alibabacloud-erdma-agent")
            .is_some()
    );
}

#[test]
fn kubeconfig_and_context_errors_and_offline_dry_run() {
    let c = cluster();
    // A context the kubeconfig does not have: exit 2, naming it; nothing is read or written.
    let out = c.run("install", &[CREDS, &["--context", "nope"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("nope"), "{}", text(&out.stderr));
    let out = c.run("uninstall", &["--context", "nope"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(c.api.requests_matching("", "").is_empty());
    // An unreadable --kubeconfig, even with --dry-run (it was asked for).
    let out = erdmactl(&["install", "--dry-run", "--kubeconfig", "/nonexistent/kc"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("/nonexistent/kc"));
    // No cluster configured at all: --dry-run just renders.
    let out = erdmactl(&["install", "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("kind: DaemonSet"));
    assert!(!text(&out.stderr).contains("another eRDMA installation"));
}

/// The migration docs/operations.md describes ("Taking over the ACK console add-on"): install is
/// refused while the add-on runs; once it is uninstalled (its workloads go, the CRD and every
/// ERdmaDevice stay, as the console's uninstall leaves them), install goes through and leaves the
/// ERdmaDevices as they were, for the erdma controller to adopt.
#[test]
fn the_console_addon_migration_keeps_the_erdmadevices() {
    use erdma_k8s::crd::ERdmaDevice;
    let c = cluster();
    c.api.put(&addon_agent());
    let device: ERdmaDevice = serde_json::from_value(json!({
        "apiVersion": "network.alibabacloud.com/v1",
        "kind": "ERdmaDevice",
        "metadata": {"name": "cn-beijing.192.168.0.7"},
        "spec": {"devices": [{"id": "eni-abc", "mac": "00:16:3e:00:00:01", "instanceID": "i-abc",
                               "isPrimaryENI": false, "networkCardIndex": 0, "queuePair": 8}]},
    }))
    .unwrap();
    c.api.put(&device);
    let before = serde_json::to_value(
        c.api
            .get::<ERdmaDevice>(None, "cn-beijing.192.168.0.7")
            .unwrap(),
    )
    .unwrap();

    let out = c.run("install", CREDS);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("DaemonSet ack-erdma-controller/ack-erdma-agent"));

    // The console's uninstall: the add-on's workloads go, its CRD and ERdmaDevices stay.
    c.api
        .remove::<DaemonSet>(Some("ack-erdma-controller"), "ack-erdma-agent");
    let out = c.run("install", CREDS);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        c.api
            .get::<DaemonSet>(Some("kube-system"), "alibabacloud-erdma-agent")
            .is_some()
    );
    let after = serde_json::to_value(
        c.api
            .get::<ERdmaDevice>(None, "cn-beijing.192.168.0.7")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        after["spec"], before["spec"],
        "the ERdmaDevice is left for the controller to adopt"
    );
}
