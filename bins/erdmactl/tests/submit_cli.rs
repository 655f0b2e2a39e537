//! `erdmactl submit pytorch` as a binary: dry-run snapshots, Arena-like refusals, and creation
//! through the real kube client against a recorded-response API server.

mod fake_apiserver;

use assert_cmd::Command;
use fake_apiserver::FakeApiServer;

fn erdmactl() -> Command {
    let mut c = Command::cargo_bin("erdmactl").unwrap();
    c.env_remove("KUBECONFIG");
    c
}

fn out(a: &assert_cmd::assert::Assert) -> (String, String) {
    let o = a.get_output();
    (
        String::from_utf8(o.stdout.clone()).unwrap(),
        String::from_utf8(o.stderr.clone()).unwrap(),
    )
}

#[test]
fn dry_run_yaml_arena_flags() {
    let a = erdmactl()
        .args([
            "submit",
            "pytorch",
            "--name",
            "pt-erdma",
            "--gpus",
            "8",
            "--workers",
            "3",
        ])
        .args([
            "--image",
            "registry.example.com/ml/pytorch-erdma:2.4",
            "--device",
            "aliyun/erdma=1",
        ])
        .args([
            "--cpu",
            "32",
            "--memory",
            "256Gi",
            "-e",
            "NCCL_DEBUG=INFO",
            "--selector",
            "gpu=h20",
        ])
        .args([
            "--toleration",
            "all",
            "--data",
            "imagenet:/data",
            "--shm-size",
            "64Gi",
        ])
        .args([
            "--image-pull-secret",
            "regcred",
            "--clean-task-policy",
            "None",
            "--working-dir",
            "/workspace",
        ])
        .args([
            "--dry-run",
            "-o",
            "yaml",
            "--",
            "torchrun",
            "--nproc_per_node=8",
            "train.py",
        ])
        .assert()
        .success();
    let (stdout, _) = out(&a);
    insta::assert_snapshot!("submit_dry_run_arena_flags_yaml", stdout);
}

#[test]
fn dry_run_json_erdma_smcr() {
    let a = erdmactl()
        .args([
            "submit",
            "pytorchjob",
            "-n",
            "team-a",
            "--name",
            "smcr",
            "--image",
            "img:1",
            "--workers",
            "2",
        ])
        .args([
            "--erdma",
            "--smcr",
            "-a",
            "example.com/owner=alice",
            "-l",
            "team=nlp",
            "--dry-run",
            "-o",
            "json",
        ])
        .args(["--", "python", "train.py"])
        .assert()
        .success();
    let (stdout, _) = out(&a);
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(v["metadata"]["namespace"], "team-a");
    assert_eq!(
        v["metadata"]["annotations"]["network.alibabacloud.com/erdma-smcr"],
        "true"
    );
    let tmpl = &v["spec"]["pytorchReplicaSpecs"]["Worker"]["template"];
    assert_eq!(
        tmpl["metadata"]["annotations"]["network.alibabacloud.com/erdma-smcr"],
        "true"
    );
    assert_eq!(tmpl["metadata"]["labels"]["team"], "nlp");
    insta::assert_snapshot!("submit_dry_run_erdma_smcr_json", stdout);
}

#[test]
fn invalid_flags_give_arena_like_errors() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--image", "i", "--device", "nvidia.com/gpu=1"],
            "erdmactl: invalid device 'nvidia.com/gpu=1', please use '--gpus N' instead\n",
        ),
        (
            &["--image", "i", "--device", "aliyun/erdma"],
            "erdmactl: invalid device 'aliyun/erdma', refer to amd.com/gpu=1 (for eRDMA: aliyun/erdma=1)\n",
        ),
        (
            &["--image", "i", "--cpu", "4 cores"],
            "erdmactl: invalid --cpu '4 cores': '4 cores' is not a valid quantity: unknown suffix ' cores' (use Ki, Mi, Gi, Ti, Pi, Ei, m, k, M, G, T, P, E or an exponent like e3)\n",
        ),
        (
            &[],
            "erdmactl: --image must be set: the training image, with the RDMA user-space libraries for eRDMA (see examples/pytorch-mnist/Dockerfile)\n",
        ),
    ];
    for (flags, expected) in cases {
        let a = erdmactl()
            .args(["submit", "pytorch", "--name", "pt"])
            .args(*flags)
            .args(["--", "python", "x.py"])
            .assert()
            .code(2);
        let (stdout, stderr) = out(&a);
        assert_eq!(stdout, "");
        assert_eq!(&stderr, expected);
    }
    // Arena style: the command as positional arguments, without `--`, flags after it included.
    let a = erdmactl()
        .args([
            "submit",
            "pytorch",
            "--name",
            "pt",
            "--image",
            "i",
            "--dry-run",
            "-o",
            "json",
        ])
        .args(["python train.py", "--epochs", "2"])
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_str(&out(&a).0).unwrap();
    assert_eq!(
        v["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
            [2],
        "python train.py --epochs 2"
    );
    // No command after `--`.
    let a = erdmactl()
        .args([
            "submit",
            "pytorch",
            "--name",
            "pt",
            "--image",
            "i",
            "--dry-run",
        ])
        .assert()
        .code(2);
    assert!(out(&a).1.starts_with("erdmactl: not found command args"));
    // Flag errors come before any cluster access: no kubeconfig needed.
    let a = erdmactl()
        .env("KUBECONFIG", "/nonexistent")
        .args([
            "submit",
            "pytorch",
            "--name",
            "pt",
            "--device",
            "nvidia.com/gpu=1",
            "--image",
            "i",
            "--",
            "x",
        ])
        .assert()
        .code(2);
    assert!(out(&a).1.contains("please use '--gpus N' instead"));
}

const CREATED: &str = r#"{"apiVersion":"kubeflow.org/v1","kind":"PyTorchJob","metadata":{"name":"pt","namespace":"default","uid":"c0ffee00-1234-4abc-8def-0123456789ab","resourceVersion":"1","generation":1,"creationTimestamp":"2026-11-29T16:00:00Z"},"spec":{"runPolicy":{"cleanPodPolicy":"Running"},"pytorchReplicaSpecs":{"Master":{"replicas":1,"restartPolicy":"Never","template":{"spec":{"containers":[{"name":"pytorch","image":"img"}]}}}}}}"#;

#[test]
fn creates_through_the_api_and_prints_arena_style() {
    let server = FakeApiServer::start(vec![(
        "POST",
        "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs".into(),
        201,
        CREATED.into(),
    )]);
    let dir = tempfile::tempdir().unwrap();
    let kc = server.kubeconfig(dir.path());
    let flags = [
        "submit",
        "pytorch",
        "--name",
        "pt",
        "--image",
        "img",
        "--workers",
        "2",
        "--erdma",
    ];
    let a = erdmactl()
        .args(flags)
        .arg("--kubeconfig")
        .arg(&kc)
        .args(["--", "python", "train.py"])
        .assert()
        .success();
    let (stdout, stderr) = out(&a);
    assert_eq!(stdout, "pytorchjob.kubeflow.org/pt created\n");
    let lines: Vec<_> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    assert!(
        lines[0].starts_with("INFO[000")
            && lines[0].ends_with("] The Job pt has been submitted successfully")
    );
    assert!(
        lines[1].ends_with(
            "You can run `kubectl get pytorchjob pt -n default` to check the job status"
        )
    );
    assert!(lines[2].contains("erdmactl doctor --pod pt-master-0 -n default"));

    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].method, "POST");
    let (path, query) = reqs[0].target.split_once('?').unwrap();
    assert_eq!(path, "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs");
    assert!(
        query.split('&').any(|kv| kv == "fieldManager=erdmactl"),
        "{query}"
    );
    // The body sent is exactly the job --dry-run prints.
    let dry = erdmactl()
        .args(flags)
        .args(["--dry-run", "-o", "json", "--", "python", "train.py"])
        .assert()
        .success();
    let sent: serde_json::Value = serde_json::from_str(&reqs[0].body).unwrap();
    let printed: serde_json::Value = serde_json::from_str(&out(&dry).0).unwrap();
    assert_eq!(sent, printed);
}

#[test]
fn existing_job_and_missing_crd_are_explained() {
    let server = FakeApiServer::start(vec![(
        "POST",
        "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs".into(),
        409,
        r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pytorchjobs.kubeflow.org \"pt\" already exists","reason":"AlreadyExists","details":{"name":"pt","group":"kubeflow.org","kind":"pytorchjobs"},"code":409}"#.into(),
    )]);
    let dir = tempfile::tempdir().unwrap();
    let kc = server.kubeconfig(dir.path());
    let a = erdmactl()
        .args([
            "submit",
            "pytorch",
            "--name",
            "pt",
            "--image",
            "img",
            "--kubeconfig",
        ])
        .arg(&kc)
        .args(["--", "python", "train.py"])
        .assert()
        .code(2);
    assert_eq!(
        out(&a).1,
        "erdmactl: the job pt already exists in namespace default, please delete it first: kubectl delete pytorchjob pt -n default\n"
    );
    // No route in team-b: the fake answers 404 like an API server without the CRD.
    let a = erdmactl()
        .args([
            "submit",
            "pytorch",
            "-n",
            "team-b",
            "--name",
            "pt",
            "--image",
            "img",
            "--kubeconfig",
        ])
        .arg(&kc)
        .args(["--", "python", "train.py"])
        .assert()
        .code(2);
    assert!(out(&a).1.contains("install the Kubeflow training operator"));
}
