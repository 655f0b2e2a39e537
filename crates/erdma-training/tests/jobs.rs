//! Generated PyTorchJobs for representative flag sets (snapshots), and Arena-style refusals.

use erdma_training::{FlagError, JobRequest};

fn req(name: &str, image: &str) -> JobRequest {
    JobRequest {
        name: Some(name.into()),
        image: Some(image.into()),
        command: vec![
            "python".into(),
            "/workspace/train.py".into(),
            "--epochs".into(),
            "1".into(),
        ],
        ..JobRequest::default()
    }
}

fn yaml(r: &JobRequest) -> String {
    serde_saphyr::to_string(&r.build().expect("valid flags")).expect("serialisable")
}

#[test]
fn minimal_cpu_job() {
    insta::assert_snapshot!(
        "minimal",
        yaml(&req(
            "mnist",
            "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"
        ))
    );
}

#[test]
fn erdma_gpu_job_two_workers() {
    let mut r = req("pt-erdma", "registry.example.com/ml/pytorch-erdma:2.4");
    r.gpus = 8;
    r.workers = 2;
    r.erdma = true;
    r.cpu = Some("32".into());
    r.memory = Some("256Gi".into());
    r.shm_size = "64Gi".into();
    r.data = vec!["imagenet:/data".into()];
    r.selectors = vec!["aliyun.accelerator/erdma=true".into()];
    r.tolerations = vec!["nvidia.com/gpu=present:NoSchedule".into()];
    r.image_pull_secrets = vec!["regcred".into()];
    r.clean_task_policy = "All".into();
    r.nproc_per_node = Some("gpu".into());
    insta::assert_snapshot!("erdma_gpu_2_workers", yaml(&r));
}

#[test]
fn arena_style_device_with_smcr_and_user_env_overrides() {
    let mut r = req("smcr-job", "registry.example.com/ml/app:1");
    r.workers = 4;
    r.devices = vec!["aliyun/erdma=1".into()];
    r.smcr = true;
    r.erdma = true;
    r.envs = vec![
        "NCCL_DEBUG=WARN".into(),
        "NCCL_IB_ADDR_RANGE=192.0.2.0/24".into(),
    ];
    r.labels = vec!["team=nlp".into()];
    r.annotations = vec!["example.com/owner=alice".into()];
    r.tolerations = vec!["all".into()];
    r.retry = 3;
    r.running_timeout = "2h".into();
    r.ttl_after_finished = "30m".into();
    r.working_dir = "/workspace".into();
    r.shell = "bash".into();
    let job = r.build().unwrap();
    // User env wins over the --erdma recipe.
    let master = &job.spec.pytorch_replica_specs["Master"];
    let env = master.template.spec.as_ref().unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    let debug: Vec<_> = env.iter().filter(|e| e.name == "NCCL_DEBUG").collect();
    assert_eq!(debug.len(), 1);
    assert_eq!(debug[0].value.as_deref(), Some("WARN"));
    assert_eq!(job.spec.pytorch_replica_specs["Worker"].replicas, 3);
    assert_eq!(job.pod_count(), 4);
    insta::assert_snapshot!("smcr_4_workers", yaml(&r));
}

#[test]
fn json_round_trips_through_the_typed_structs() {
    let mut r = req("rt", "img");
    r.erdma = true;
    r.workers = 3;
    let job = r.build().unwrap();
    let json = serde_json::to_string(&job).unwrap();
    let back: erdma_training::PyTorchJob = serde_json::from_str(&json).unwrap();
    assert_eq!(back, job);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["apiVersion"], "kubeflow.org/v1");
    assert_eq!(v["kind"], "PyTorchJob");
    assert_eq!(v["spec"]["runPolicy"]["cleanPodPolicy"], "Running");
    assert_eq!(v["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"], 2);
    assert_eq!(
        v["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"],
        "Never"
    );
    let c = &v["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0];
    assert_eq!(c["name"], "pytorch");
    assert_eq!(c["resources"]["requests"]["aliyun/erdma"], "1");
    assert_eq!(c["resources"]["limits"]["aliyun/erdma"], "1");
    assert_eq!(c["securityContext"]["capabilities"]["add"][0], "IPC_LOCK");
    assert_eq!(
        c["command"],
        serde_json::json!(["sh", "-c", "python /workspace/train.py --epochs 1"])
    );
}

fn err(r: JobRequest) -> String {
    r.build().expect_err("must be refused").to_string()
}

#[test]
fn arena_like_errors() {
    let mut r = req("x", "img");
    r.devices = vec!["nvidia.com/gpu=1".into()];
    assert_eq!(
        err(r),
        "invalid device 'nvidia.com/gpu=1', please use '--gpus N' instead"
    );

    let mut r = req("x", "img");
    r.devices = vec!["aliyun/erdma".into()];
    assert_eq!(
        err(r),
        "invalid device 'aliyun/erdma', refer to amd.com/gpu=1 (for eRDMA: aliyun/erdma=1)"
    );

    let mut r = req("x", "img");
    r.devices = vec!["aliyun/erdma=one".into()];
    let e = err(r);
    assert!(
        e.starts_with("invalid device 'aliyun/erdma=one', 'one' is not a valid quantity"),
        "{e}"
    );
    assert!(e.ends_with("refer to aliyun/erdma=1"), "{e}");

    let mut r = req("x", "img");
    r.devices = vec!["bad name/x=1".into()];
    assert!(err(r).contains("is not a valid resource name"));

    let mut r = req("x", "img");
    r.memory = Some("8GB".into());
    assert_eq!(
        err(r),
        "invalid --memory '8GB': '8GB' is not a valid quantity: unknown suffix 'GB' (use Ki, Mi, Gi, Ti, Pi, Ei, m, k, M, G, T, P, E or an exponent like e3)"
    );

    let mut r = req("x", "img");
    r.cpu = Some("two".into());
    assert!(err(r).starts_with("invalid --cpu 'two'"));

    let mut r = req("x", "img");
    r.image = None;
    let e = r.build().unwrap_err();
    assert!(matches!(
        e,
        FlagError::Missing {
            flag: "--image",
            ..
        }
    ));
    assert!(e.to_string().starts_with("--image must be set"));

    let mut r = req("x", "img");
    r.name = None;
    assert!(err(r).starts_with("--name must be set"));

    let mut r = req("x", "img");
    r.command.clear();
    assert!(err(r).starts_with("not found command args"));

    let e = err(req("Bad_Name", "img"));
    assert!(
        e.starts_with("invalid --name 'Bad_Name': the job name must consist of lower case"),
        "{e}"
    );
    assert!(err(req(&"a".repeat(50), "img")).contains("at most 49 characters"));

    let mut r = req("x", "img");
    r.workers = 0;
    assert!(err(r).starts_with("invalid --workers '0'"));

    let mut r = req("x", "img");
    r.smcr = true;
    assert!(err(r).contains("add --erdma or --device aliyun/erdma=1"));

    let mut r = req("x", "img");
    r.clean_task_policy = "Sometimes".into();
    assert_eq!(
        err(r),
        "invalid --clean-task-policy 'Sometimes': use None, Running or All"
    );

    let mut r = req("x", "img");
    r.data = vec!["pvc-only".into()];
    assert!(err(r).starts_with("invalid --data 'pvc-only': expected <pvc name>:<mount path>"));

    let mut r = req("x", "img");
    r.tolerations = vec!["k=v:Sometimes".into()];
    assert!(err(r).contains("unknown effect 'Sometimes'"));

    let mut r = req("x", "img");
    r.envs = vec!["NOVALUE".into()];
    assert!(err(r).starts_with("invalid --env 'NOVALUE': expected key=value"));

    let mut r = req("x", "img");
    r.annotations = vec!["network.alibabacloud.com/erdma-smcr=yes".into()];
    r.devices = vec!["aliyun/erdma=1".into()];
    assert!(
        err(r).contains("\"yes\" is not a boolean"),
        "{}",
        "the one SMC-R parser's words"
    );

    // The spellings the agent and the webhook take are taken here too.
    let mut r = req("x", "img");
    r.annotations = vec!["network.alibabacloud.com/erdma-smcr=1".into()];
    r.devices = vec!["aliyun/erdma=1".into()];
    assert!(r.build().is_ok());

    // Negative requests are refused as the API server refuses them (before: rendered).
    let mut r = req("x", "img");
    r.devices = vec!["aliyun/erdma=-1".into()];
    assert!(err(r).contains("'-1' is negative"));
    let mut r = req("x", "img");
    r.memory = Some("-5Gi".into());
    assert!(err(r).contains("'-5Gi' is negative"));

    // --smcr does not silently override an explicit "false".
    let mut r = req("x", "img");
    r.annotations = vec!["network.alibabacloud.com/erdma-smcr=false".into()];
    r.devices = vec!["aliyun/erdma=1".into()];
    r.smcr = true;
    assert!(err(r).contains("--smcr asks for SMC-R but --annotation turns it off"));
}

#[test]
fn tolerations_parse_like_arena() {
    use erdma_training::job::parse_toleration;
    let t = parse_toleration("gpu=true:NoSchedule,Equal").unwrap();
    assert_eq!(
        (
            t.key.as_deref(),
            t.value.as_deref(),
            t.effect.as_deref(),
            t.operator.as_deref()
        ),
        (Some("gpu"), Some("true"), Some("NoSchedule"), Some("Equal"))
    );
    let t = parse_toleration("node-role.kubernetes.io/master:NoSchedule").unwrap();
    assert_eq!(t.operator.as_deref(), Some("Exists"));
    assert_eq!(t.value, None);
    let t = parse_toleration("all").unwrap();
    assert_eq!((t.key, t.operator.as_deref()), (None, Some("Exists")));
    assert!(parse_toleration("k=v,Exists").is_err());
    assert!(parse_toleration("=v").is_err());
}

mod no_panic {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Arbitrary flag values never panic: they build a job or give a FlagError.
        #[test]
        fn build_never_panics(
            name in "\\PC{0,60}",
            image in "\\PC{0,20}",
            device in "\\PC{0,30}",
            env in "\\PC{0,20}",
            toleration in "\\PC{0,30}",
            data in "\\PC{0,20}",
            qty in "\\PC{0,10}",
            duration in "\\PC{0,8}",
            workers in 0u32..5,
            gpus in 0u32..9,
        ) {
            let r = JobRequest {
                name: Some(name),
                image: Some(image),
                devices: vec![device],
                envs: vec![env],
                tolerations: vec![toleration],
                data: vec![data],
                memory: Some(qty),
                running_timeout: duration,
                workers,
                gpus,
                erdma: gpus % 2 == 0,
                command: vec!["x".into()],
                ..JobRequest::default()
            };
            if let Ok(job) = r.build() {
                prop_assert_eq!(job.pod_count(), i32::try_from(workers).unwrap());
            }
        }
    }
}
