//! Init containers as the kubelet runs them: translated like app containers (their own env,
//! mounts, security context, resources; the pod's QoS class counts them), run one after the
//! other in the pod's sandbox to completion before the app container (CRI against the recording
//! fake runtime, which lets a container exit), a failed one failing the pod with its exit code
//! and log, and their extended resources allocated with the device manager's reuse rules.
//! Expected values are written from the kubelet's rules, not computed by the code under test.

mod common;

use erdma_cri::fake::{Recorded, RecordingRuntime};
use erdma_cri::runtime::v1 as cri;
use erdma_fake_kubelet::manifest_pod::{ManifestRun, run_manifest_pod};
use erdma_fake_kubelet::pods::{self, CdiForm};
use erdma_fake_kubelet::podspec::manifest;
use erdma_fake_kubelet::podspec::translate::{ContainerInputs, NodeInfo, PodPlan, QosClass};
use erdma_kubelet::uds::ClientAuthority;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

fn node() -> NodeInfo {
    common::lab_node("10.77.0.1", 1_610_612_736)
}

/// A pod as the erdma webhook leaves it: the app container asks `aliyun/erdma` with CPU and
/// memory limits (alone, a Guaranteed pod), and `smcr-init` was added as the webhook makes it.
const SMCR_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: nccl-0
  namespace: lab
  annotations: {network.alibabacloud.com/erdma-smcr: "true"}
spec:
  initContainers:
    - name: smcr-init
      image: ghcr.io/erdma/smcr-init:0.1.0
      imagePullPolicy: Always
      command: [/usr/local/bin/smcr_init]
      env:
        - name: APP_CPU_M
          valueFrom: {resourceFieldRef: {containerName: app, resource: limits.cpu, divisor: 1m}}
      resources:
        requests: {aliyun/erdma: "1"}
        limits: {aliyun/erdma: "1"}
      securityContext: {privileged: true}
      volumeMounts: [{name: scratch, mountPath: /work}]
  containers:
    - name: app
      image: lab.local/rdma-tools:1
      command: [sleep, infinity]
      resources:
        limits: {cpu: "1", memory: 512Mi, aliyun/erdma: "1"}
  volumes:
    - name: scratch
      emptyDir: {}
"#;

fn plan(text: &str, uid: &str) -> PodPlan {
    let m = manifest::parse(text, "pod.yaml", None).unwrap();
    PodPlan::new(m, &node(), uid.into()).unwrap()
}

#[test]
fn an_init_container_is_translated_as_the_kubelet_translates_containers() {
    let p = plan(SMCR_POD, "uid-1");
    assert_eq!(p.init_containers.len(), 1);
    let init = &p.init_containers[0];
    assert_eq!(
        (init.name(), init.field.as_str(), init.init),
        ("smcr-init", "spec.initContainers[0]", true)
    );
    assert_eq!(init.extended, Some(("aliyun/erdma".to_string(), 1)));
    assert_eq!(p.app.extended, Some(("aliyun/erdma".to_string(), 1)));
    // GetPodQOS counts init containers: smcr-init has no CPU or memory limits, so the pod is
    // Burstable, not Guaranteed. The app container's OOM score is then from its memory
    // request: 1000 - 1000 * 512 MiB / 1.5 GiB = 1000 - 333 = 667; smcr-init requests no
    // memory: 1000, which the kubelet lowers to 999.
    assert_eq!(p.qos_class(), QosClass::Burstable);
    assert_eq!(p.oom_score_adj(), 667);
    assert_eq!(p.oom_score_adj_of(init), 999);
    // A privileged init container makes the sandbox privileged (HasPrivilegedContainer).
    let sb = p.sandbox_config(Path::new("/logs"), "t");
    assert!(
        sb.linux
            .as_ref()
            .unwrap()
            .security_context
            .as_ref()
            .unwrap()
            .privileged
    );

    let paths = BTreeMap::from([("scratch".to_string(), "/vol/scratch".into())]);
    let c = p
        .config_for(
            init,
            &ContainerInputs {
                pod_ip: "10.89.0.2",
                image_id: "sha256:smcr",
                image_uid: Some(0),
                image_username: "",
                allocation: None,
                volume_paths: &paths,
            },
        )
        .unwrap();
    assert_eq!(c.metadata.as_ref().unwrap().name, "smcr-init");
    assert_eq!(c.log_path, "smcr-init/0.log");
    assert_eq!(c.labels["io.kubernetes.container.name"], "smcr-init");
    assert_eq!(c.labels["io.kubernetes.pod.name"], "nccl-0");
    assert_eq!(c.command, ["/usr/local/bin/smcr_init"]);
    let image = c.image.as_ref().unwrap();
    assert_eq!(
        (image.image.as_str(), image.user_specified_image.as_str()),
        ("sha256:smcr", "ghcr.io/erdma/smcr-init:0.1.0")
    );
    // Its env: the app container's CPU limit (1 CPU) in millicores.
    assert_eq!(
        c.envs
            .iter()
            .map(|e| (e.key.as_str(), std::str::from_utf8(&e.value).unwrap()))
            .collect::<Vec<_>>(),
        [("APP_CPU_M", "1000")]
    );
    assert_eq!(c.mounts.len(), 1);
    assert_eq!(
        (
            c.mounts[0].container_path.as_str(),
            c.mounts[0].host_path.as_str()
        ),
        ("/work", "/vol/scratch")
    );
    let linux = c.linux.unwrap();
    assert!(linux.security_context.unwrap().privileged);
    let r = linux.resources.unwrap();
    // No CPU request or limit: 2 shares, no quota; no memory limit.
    assert_eq!(
        (
            r.cpu_shares,
            r.cpu_quota,
            r.memory_limit_in_bytes,
            r.oom_score_adj
        ),
        (2, 0, 0, 999)
    );

    // Without smcr-init the same app container is Guaranteed: -997.
    let mut alone = SMCR_POD.to_string();
    let (from, to) = (
        alone.find("  initContainers:").unwrap(),
        alone.find("  containers:").unwrap(),
    );
    alone.replace_range(from..to, "");
    let p = plan(&alone, "uid-2");
    assert!(p.init_containers.is_empty());
    assert_eq!(p.qos_class(), QosClass::Guaranteed);
    assert_eq!(p.oom_score_adj(), -997);
}

/// The images the pods use.
fn images() -> Vec<cri::Image> {
    vec![
        common::image("sha256:tools", "lab.local/rdma-tools:1"),
        common::image("sha256:smcr", "ghcr.io/erdma/smcr-init:0.1.0"),
    ]
}

/// Plays the init containers' processes: each container named in `codes` exits with its code
/// once the runtime started it (the recording runtime names container `cN` after its
/// `CreateContainer`, the N-th request).
fn exit_when_started(
    rt: &RecordingRuntime,
    codes: &[(&str, i32)],
    cancel: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let rt = rt.clone();
    let codes: BTreeMap<String, i32> = codes.iter().map(|(n, c)| (n.to_string(), *c)).collect();
    let cancel = cancel.clone();
    tokio::spawn(async move {
        let mut done = Vec::new();
        while !cancel.is_cancelled() {
            let calls = rt.calls();
            let mut names = BTreeMap::new();
            for (i, c) in calls.iter().enumerate() {
                match c {
                    Recorded::CreateContainer(_, config) => {
                        let name = config.metadata.as_ref().unwrap().name.clone();
                        names.insert(format!("c{}", i + 1), name);
                    }
                    Recorded::StartContainer(id) if !done.contains(id) => {
                        if let Some(code) = names.get(id).and_then(|n| codes.get(n)) {
                            rt.exit_container(id, *code);
                            done.push(id.clone());
                        }
                    }
                    _ => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

/// The requests as `Kind name` (`CreateContainer first`), the container named by its config or,
/// for later requests, by the id `CreateContainer` gave it.
fn calls(rt: &RecordingRuntime) -> Vec<String> {
    let mut names = BTreeMap::new();
    rt.calls()
        .iter()
        .enumerate()
        .map(|(i, c)| match c {
            Recorded::RunPodSandbox(_) => "RunPodSandbox".to_string(),
            Recorded::CreateContainer(_, config) => {
                let name = config.metadata.as_ref().unwrap().name.clone();
                names.insert(format!("c{}", i + 1), name.clone());
                format!("CreateContainer {name}")
            }
            Recorded::StartContainer(id) => format!("StartContainer {}", names[id]),
            Recorded::StopContainer(id) => format!("StopContainer {}", names[id]),
            Recorded::RemoveContainer(id) => format!("RemoveContainer {}", names[id]),
            Recorded::ImageStatus(i) => format!("ImageStatus {i}"),
            Recorded::StopPodSandbox(_) => "StopPodSandbox".to_string(),
            Recorded::RemovePodSandbox(_) => "RemovePodSandbox".to_string(),
            Recorded::ExecSync(..) => "ExecSync".to_string(),
        })
        .collect()
}

fn run_of(yaml: &str, dir: &Path) -> ManifestRun {
    ManifestRun {
        plan: plan(yaml, "uid-1"),
        cdi: CdiForm::Field,
        authority: ClientAuthority::Localhost,
        log_root: dir.join("logs"),
        ready_timeout: Duration::from_secs(5),
        init_timeout: Duration::from_secs(5),
    }
}

const TWO_INITS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: lab}
spec:
  initContainers:
    - {name: first, image: lab.local/rdma-tools:1, command: [sh, -c, "echo 1"]}
    - {name: second, image: ghcr.io/erdma/smcr-init:0.1.0, imagePullPolicy: Always}
  containers:
    - {name: app, image: lab.local/rdma-tools:1, command: [sleep, infinity]}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_in_order_to_completion_before_the_app_container() {
    let d = common::short_dir("fki");
    let cancel = CancellationToken::new();
    let (rt, mut cri) = common::runtime(d.path(), &cancel, images()).await;
    let player = exit_when_started(&rt, &[("first", 0), ("second", 0)], &cancel);
    let record = run_manifest_pod(d.path(), &mut cri, &run_of(TWO_INITS, d.path()))
        .await
        .unwrap();
    assert_eq!(
        calls(&rt),
        [
            "RunPodSandbox",
            "ImageStatus lab.local/rdma-tools:1",
            "CreateContainer first",
            "StartContainer first",
            "ImageStatus ghcr.io/erdma/smcr-init:0.1.0",
            "CreateContainer second",
            "StartContainer second",
            "ImageStatus lab.local/rdma-tools:1",
            "CreateContainer app",
            "StartContainer app",
        ],
        "each init container exits before the next container is created"
    );
    assert_eq!(record.container, "app");
    assert_eq!(record.ready, Some(true));
    let inits: Vec<(&str, i32)> = record
        .init_containers
        .iter()
        .map(|i| (i.name.as_str(), i.exit_code))
        .collect();
    assert_eq!(inits, [("first", 0), ("second", 0)]);
    assert_eq!(record.init_containers[0].container_id, "c3");
    assert_eq!(record.init_containers[1].container_id, "c6");
    assert_eq!(record.container_id, "c9");
    for i in &record.init_containers {
        for step in ["image", "create", "start", "run"] {
            assert!(i.timings_ms.contains_key(step), "{step} of {}", i.name);
        }
    }
    assert_eq!(record.init_containers[1].image.id, "sha256:smcr");
    assert_eq!(
        record.notes.get("image_pull/second").map(String::as_str),
        Some("not pulled (pullPolicy Always; the lab has no registry)")
    );
    // The record keeps them; `pod delete` removes them with the pod.
    let kept = pods::read_record(d.path(), "lab/p").unwrap();
    assert_eq!(kept.init_containers, record.init_containers);
    let before = rt.calls().len();
    pods::delete_pod(d.path(), &mut cri, "lab/p", 0)
        .await
        .unwrap();
    assert_eq!(
        calls(&rt)[before..],
        [
            "StopContainer app",
            "RemoveContainer app",
            "RemoveContainer first",
            "RemoveContainer second",
            "StopPodSandbox",
            "RemovePodSandbox"
        ]
    );
    assert!(rt.containers().is_empty() && rt.sandboxes().is_empty());
    cancel.cancel();
    player.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_init_container_fails_the_pod_with_its_exit_code_and_log() {
    let d = common::short_dir("fki");
    let cancel = CancellationToken::new();
    let (rt, mut cri) = common::runtime(d.path(), &cancel, images()).await;
    let played = CancellationToken::new();
    let player = exit_when_started(&rt, &[("first", 0), ("second", 3)], &played);
    // The runtime writes the container's log in the pod's log directory (CRI log format).
    let log_dir = d.path().join("logs/lab_p_uid-1/second");
    std::fs::create_dir_all(&log_dir).unwrap();
    std::fs::write(
        log_dir.join("0.log"),
        "2026-12-01T00:00:00.000000001Z stdout F smc_pnet: adding rxe0\n\
         2026-12-01T00:00:00.000000002Z stderr F smc_pnet: no such device eth9\n",
    )
    .unwrap();
    let e = run_manifest_pod(d.path(), &mut cri, &run_of(TWO_INITS, d.path()))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "pod lab/p: init container \"second\" (spec.initContainers[1]) exited with code 3"
        ),
        "{e}"
    );
    assert!(
        e.contains("  smc_pnet: adding rxe0\n  smc_pnet: no such device eth9"),
        "the log's tail: {e}"
    );
    let seen = calls(&rt);
    assert!(
        !seen.iter().any(|c| c == "CreateContainer app"),
        "the app container is never created: {seen:?}"
    );
    assert!(
        seen.contains(&"RemoveContainer first".to_string()),
        "{seen:?}"
    );
    assert!(
        seen.contains(&"RemoveContainer second".to_string()),
        "{seen:?}"
    );
    assert!(rt.containers().is_empty() && rt.sandboxes().is_empty());
    assert!(
        pods::read_record(d.path(), "lab/p").is_err(),
        "nothing recorded"
    );

    played.cancel();
    player.await.unwrap();

    // One that does not exit within the init timeout (nothing makes it exit now).
    let mut run = run_of(TWO_INITS, d.path());
    run.init_timeout = Duration::from_millis(300);
    let e = run_manifest_pod(d.path(), &mut cri, &run)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("init container \"first\" (spec.initContainers[0]) did not exit within 300 ms")
            && e.contains("still CONTAINER_RUNNING")
            && e.contains("--init-timeout"),
        "{e}"
    );
    assert!(rt.containers().is_empty() && rt.sandboxes().is_empty());
    cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_container_reuses_the_init_containers_devices() {
    let d = common::short_dir("fkd");
    let (kubelet, plugin) =
        common::kubelet_with_plugin(d.path(), "aliyun/erdma", &["d0", "d1", "d2"]).await;
    let cancel = CancellationToken::new();
    let (rt, mut cri) = common::runtime(d.path(), &cancel, images()).await;
    let player = exit_when_started(&rt, &[("smcr-init", 0)], &cancel);
    // smcr-init asks 1 device, the app container 2: the app container gets smcr-init's
    // device back first, then one more, so the pod holds 2 of the 3 (max(1, 2)).
    let yaml = SMCR_POD.replace(
        "limits: {cpu: \"1\", memory: 512Mi, aliyun/erdma: \"1\"}",
        "limits: {cpu: \"1\", memory: 512Mi, aliyun/erdma: \"2\"}",
    );
    let record = run_manifest_pod(d.path(), &mut cri, &run_of(&yaml, d.path()))
        .await
        .unwrap();
    let init = record.init_containers[0].allocation.clone().unwrap();
    let app = record.allocation.clone().unwrap();
    assert_eq!(
        (init.container.as_str(), init.device_ids.len()),
        ("smcr-init", 1)
    );
    assert!(init.reused.is_empty());
    assert_eq!(app.device_ids.len(), 2);
    assert_eq!(
        app.reused, init.device_ids,
        "the init container's device first"
    );
    assert!(app.device_ids.contains(&init.device_ids[0]));
    let ledger = erdma_fake_kubelet::state::read_ledger(d.path()).unwrap();
    let containers: Vec<&str> = ledger.iter().map(|a| a.container.as_str()).collect();
    assert_eq!(containers, ["smcr-init", "app"]);
    pods::delete_pod(d.path(), &mut cri, "lab/nccl-0", 0)
        .await
        .unwrap();
    assert!(
        erdma_fake_kubelet::state::read_ledger(d.path())
            .unwrap()
            .is_empty()
    );
    cancel.cancel();
    player.await.unwrap();
    plugin.stop().await;
    kubelet.shutdown().await;
}
