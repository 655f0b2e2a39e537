//! `pod run --manifest` end to end against CRI on a real Unix socket (the recording fake
//! runtime of erdma-cri, serving `ImageStatus` too), with real HTTP/TCP listeners for the
//! probes, real hostPath checks and emptyDirs in a temporary directory, and, for an extended
//! resource, the fake kubelet with a stand-in device plugin.

mod common;

use common::call_names;
use erdma_cri::fake::Recorded;
use erdma_cri::runtime::v1 as cri;
use erdma_fake_kubelet::manifest_pod::{ManifestRun, run_manifest_pod};
use erdma_fake_kubelet::pods::{self, CdiForm};
use erdma_fake_kubelet::podspec::manifest;
use erdma_fake_kubelet::podspec::probe::{self, Outcome, ProbeTarget, Probes};
use erdma_fake_kubelet::podspec::translate::{NodeInfo, PodPlan};
use erdma_fake_kubelet::podspec::volumes::HostPathOutcome;
use erdma_kubelet::uds::ClientAuthority;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

fn short_dir() -> tempfile::TempDir {
    common::short_dir("fkm")
}

/// An HTTP server on 127.0.0.1 that answers the n-th request with `codes[n]` (the last code
/// once they run out) and keeps every request's head.
struct Http {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Http {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn http(codes: Vec<u16>) -> Http {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = requests.clone();
    let task = tokio::spawn(async move {
        let mut n = 0usize;
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(k) => head.extend_from_slice(&buf[..k]),
                }
            }
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&head).into_owned());
            let code = codes.get(n).or(codes.last()).copied().unwrap_or(200);
            n += 1;
            let _ = s
                .write_all(
                    format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await;
        }
    });
    Http {
        addr,
        requests,
        task,
    }
}

#[tokio::test]
async fn http_and_tcp_probes_as_the_prober_judges_them() {
    let s = http(vec![200, 503, 302]).await;
    let t = Duration::from_secs(2);
    let headers = vec![("X-Probe".to_string(), "lab".to_string())];
    let port = s.addr.port();
    assert_eq!(
        probe::http_get("127.0.0.1", port, "/healthz", &headers, t).await,
        Outcome::Success("HTTP 200".into())
    );
    assert_eq!(
        probe::http_get("127.0.0.1", port, "/healthz", &[], t).await,
        Outcome::Failure("HTTP probe failed with statuscode: 503".into())
    );
    assert_eq!(
        probe::http_get("127.0.0.1", port, "/", &[], t).await,
        Outcome::Success("HTTP 302".into()),
        "a redirect not followed is a success"
    );
    let first = s.requests.lock().unwrap()[0].to_ascii_lowercase();
    assert!(first.starts_with("get /healthz http/1.1\r\n"), "{first}");
    for h in [
        "user-agent: kube-probe/1.34\r\n",
        "accept: */*\r\n",
        "x-probe: lab\r\n",
        &format!("host: 127.0.0.1:{port}\r\n"),
    ] {
        assert!(first.contains(h), "{h:?} missing in {first}");
    }

    // Nothing listens: connection refused.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = l.local_addr().unwrap().port();
    drop(l);
    match probe::http_get("127.0.0.1", closed, "/", &[], t).await {
        Outcome::Failure(m) => assert!(
            m.contains("dial tcp 127.0.0.1:") && m.contains("refused"),
            "{m}"
        ),
        o => panic!("{o:?}"),
    }
    match probe::tcp_connect("127.0.0.1", closed, t).await {
        Outcome::Failure(m) => assert!(
            m.starts_with(&format!("dial tcp 127.0.0.1:{closed}")),
            "{m}"
        ),
        o => panic!("{o:?}"),
    }
    assert_eq!(
        probe::tcp_connect("127.0.0.1", port, t).await,
        Outcome::Success(format!("connected to 127.0.0.1:{port}"))
    );

    // A server that accepts and never answers: the timeout fails the probe.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sport = silent.local_addr().unwrap().port();
    let hold = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((c, _)) = silent.accept().await {
            kept.push(c);
        }
    });
    let at = Instant::now();
    match probe::http_get("127.0.0.1", sport, "/", &[], Duration::from_secs(1)).await {
        Outcome::Failure(m) => assert!(m.contains("deadline exceeded"), "{m}"),
        o => panic!("{o:?}"),
    }
    assert!(at.elapsed() >= Duration::from_secs(1));
    hold.abort();
}

/// The image the pods use, with its digest.
fn images() -> Vec<cri::Image> {
    vec![cri::Image {
        repo_digests: vec!["lab.local/erdma-agent@sha256:feed".into()],
        ..common::image("sha256:agent", "lab.local/erdma-agent:1")
    }]
}

fn node() -> NodeInfo {
    common::lab_node("127.0.0.1", 1 << 30)
}

fn run_of(yaml: &str, dir: &Path, timeout: Duration) -> ManifestRun {
    let m = manifest::parse(yaml, "pod.yaml", None).unwrap();
    ManifestRun {
        plan: PodPlan::new(m, &node(), "uid-1".into()).unwrap(),
        cdi: CdiForm::Field,
        authority: ClientAuthority::Localhost,
        log_root: dir.join("logs"),
        ready_timeout: timeout,
        init_timeout: timeout,
    }
}

/// A host-network DaemonSet like the agent: readiness and liveness over HTTP on its named
/// port, hostPath volumes of two types, an emptyDir with a subPath.
fn agent(root: &Path, port: u16, policy: &str, probe_path: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: erdma-agent, namespace: kube-system}}
spec:
  selector: {{matchLabels: {{app: agent}}}}
  template:
    metadata: {{labels: {{app: agent}}}}
    spec:
      hostNetwork: true
      hostPID: true
      containers:
        - name: agent
          image: lab.local/erdma-agent:1
          imagePullPolicy: {policy}
          args: [--node-name=$(NODE_NAME)]
          env:
            - name: NODE_NAME
              valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}
          ports: [{{name: metrics, containerPort: {port}}}]
          readinessProbe:
            httpGet: {{path: {probe_path}, port: metrics}}
            periodSeconds: 1
          livenessProbe:
            tcpSocket: {{port: {port}}}
          volumeMounts:
            - {{name: plugins, mountPath: /var/lib/kubelet/device-plugins}}
            - {{name: dev, mountPath: /host/dev, readOnly: true}}
            - {{name: scratch, mountPath: /scratch, subPath: a/b}}
      volumes:
        - name: plugins
          hostPath: {{path: {root}/made/device-plugins, type: DirectoryOrCreate}}
        - name: dev
          hostPath: {{path: {root}/dev, type: Directory}}
        - name: scratch
          emptyDir: {{}}
"#,
        root = root.display()
    )
}

#[tokio::test]
async fn the_agent_daemonset_runs_becomes_ready_and_is_deleted() {
    let d = short_dir();
    let cancel = CancellationToken::new();
    let (rt, mut cri) = common::runtime(d.path(), &cancel, images()).await;
    std::fs::create_dir(d.path().join("dev")).unwrap();
    // Not ready once, then ready.
    let s = http(vec![503, 200]).await;
    let run = run_of(
        &agent(d.path(), s.addr.port(), "IfNotPresent", "/healthz"),
        d.path(),
        Duration::from_secs(20),
    );
    let record = run_manifest_pod(d.path(), &mut cri, &run).await.unwrap();

    assert_eq!(record.pod, "kube-system/erdma-agent");
    assert_eq!(record.ready, Some(true));
    assert_eq!(record.not_ready_reason, None);
    let after = record.ready_after_ms.unwrap();
    assert!(
        (1000..10_000).contains(&after),
        "one failed readiness probe, the next a period (1 s) later passes: {after} ms"
    );
    assert_eq!(record.probes.len(), 2);
    let (r, l) = (&record.probes[0], &record.probes[1]);
    assert_eq!(
        (
            r.kind.as_str(),
            r.attempts,
            r.successes,
            r.passed,
            r.last_result.as_str()
        ),
        ("readiness", 2, 1, true, "success")
    );
    assert_eq!(
        r.description,
        format!(
            "http-get http://:{}/healthz delay=0s timeout=1s period=1s #success=1 #failure=3",
            s.addr.port()
        )
    );
    assert_eq!(
        (l.kind.as_str(), l.attempts, l.passed),
        ("liveness", 1, true),
        "one liveness check after ready"
    );
    assert_eq!(s.requests.lock().unwrap().len(), 2);
    assert_eq!(record.node_name.as_deref(), Some("lab-node"));
    assert_eq!(record.host_ip.as_deref(), Some("127.0.0.1"));
    assert_eq!(record.ip, None, "host network: no pod IP from CNI");
    let image = record.image.clone().unwrap();
    assert_eq!(
        (image.reference.as_str(), image.id.as_str()),
        ("lab.local/erdma-agent:1", "sha256:agent")
    );
    assert_eq!(image.repo_digests, ["lab.local/erdma-agent@sha256:feed"]);
    assert!(
        !record.notes.contains_key("image_pull"),
        "IfNotPresent and present"
    );
    assert_eq!(
        record.notes["service_account"],
        "not mounted (no API server)"
    );
    assert_eq!(
        record.source.as_deref(),
        Some("DaemonSet kube-system/erdma-agent in pod.yaml")
    );

    // Volumes: the DirectoryOrCreate path was made, the Directory one found, the emptyDir and
    // its subPath made under <dir>/pod-volumes/<uid>.
    let checks: Vec<(&str, &str, Option<HostPathOutcome>)> = record
        .volumes
        .iter()
        .map(|v| (v.name.as_str(), v.kind.as_str(), v.check))
        .collect();
    assert_eq!(
        checks,
        [
            ("plugins", "hostPath", Some(HostPathOutcome::Created)),
            ("dev", "hostPath", Some(HostPathOutcome::Exists)),
            ("scratch", "emptyDir", None),
        ]
    );
    assert!(d.path().join("made/device-plugins").is_dir());
    let empty = d.path().join("pod-volumes/uid-1/scratch");
    assert!(empty.join("a/b").is_dir(), "the subPath is made");
    assert_eq!(
        record.pod_volume_dir.as_deref(),
        Some(d.path().join("pod-volumes/uid-1").as_path())
    );

    // The kubelet's order, and what CreateContainer got.
    assert_eq!(
        call_names(&rt),
        [
            "RunPodSandbox",
            "ImageStatus",
            "CreateContainer",
            "StartContainer"
        ]
    );
    let calls = rt.calls();
    assert_eq!(
        calls[1],
        Recorded::ImageStatus("lab.local/erdma-agent:1".into())
    );
    let Recorded::CreateContainer(_, config) = &calls[2] else {
        panic!("{calls:?}");
    };
    let image_spec = config.image.clone().unwrap();
    assert_eq!(
        (
            image_spec.image.as_str(),
            image_spec.user_specified_image.as_str()
        ),
        ("sha256:agent", "lab.local/erdma-agent:1")
    );
    assert_eq!(config.args, ["--node-name=lab-node"]);
    let mounts: Vec<(String, String)> = config
        .mounts
        .iter()
        .map(|m| (m.container_path.clone(), m.host_path.clone()))
        .collect();
    assert_eq!(
        mounts,
        [
            (
                "/var/lib/kubelet/device-plugins".to_string(),
                d.path().join("made/device-plugins").display().to_string()
            ),
            (
                "/host/dev".to_string(),
                d.path().join("dev").display().to_string()
            ),
            (
                "/scratch".to_string(),
                empty.join("a/b").display().to_string()
            ),
        ]
    );

    // The record is kept, and the pod is deleted as the kubelet does, emptyDirs included.
    assert_eq!(
        pods::read_record(d.path(), "kube-system/erdma-agent").unwrap(),
        record
    );
    pods::delete_pod(d.path(), &mut cri, "kube-system/erdma-agent", 0)
        .await
        .unwrap();
    assert!(
        !d.path().join("pod-volumes/uid-1").exists(),
        "emptyDirs removed"
    );
    assert!(
        d.path().join("made/device-plugins").is_dir(),
        "hostPaths stay"
    );
    assert!(rt.sandboxes().is_empty() && rt.containers().is_empty());
    cancel.cancel();
}

#[tokio::test]
async fn an_always_image_that_is_present_is_noted_and_an_absent_one_fails_the_pod() {
    let d = short_dir();
    let cancel = CancellationToken::new();
    let (rt, mut cri) = common::runtime(d.path(), &cancel, images()).await;
    std::fs::create_dir(d.path().join("dev")).unwrap();
    let s = http(vec![200]).await;
    let run = run_of(
        &agent(d.path(), s.addr.port(), "Always", "/"),
        d.path(),
        Duration::from_secs(20),
    );
    let record = run_manifest_pod(d.path(), &mut cri, &run).await.unwrap();
    assert_eq!(
        record.notes["image_pull"],
        "not pulled (pullPolicy Always; the lab has no registry)"
    );
    pods::delete_pod(d.path(), &mut cri, "kube-system/erdma-agent", 0)
        .await
        .unwrap();

    let absent = agent(d.path(), s.addr.port(), "Never", "/")
        .replace("lab.local/erdma-agent:1", "lab.local/missing:2");
    let before = rt.calls().len();
    let e = run_manifest_pod(
        d.path(),
        &mut cri,
        &run_of(&absent, d.path(), Duration::from_secs(5)),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("ErrImageNeverPull: Container image \"lab.local/missing:2\" is not present with pull policy of Never")
            && e.contains("no registry"),
        "{e}"
    );
    let names = call_names(&rt)[before..].to_vec();
    assert_eq!(
        names,
        [
            "RunPodSandbox",
            "ImageStatus",
            "StopPodSandbox",
            "RemovePodSandbox"
        ],
        "the sandbox is undone"
    );
    assert!(
        pods::read_record(d.path(), "kube-system/erdma-agent").is_err(),
        "no record"
    );
    assert!(
        !d.path().join("pod-volumes/uid-1").exists(),
        "the emptyDir is undone"
    );
    cancel.cancel();
}

#[tokio::test]
async fn a_failed_host_path_check_fails_the_pod_before_the_sandbox() {
    let d = short_dir();
    let cancel = CancellationToken::new();
    let (rt, mut cri) = common::runtime(d.path(), &cancel, images()).await;
    // `<root>/dev` is missing: the Directory volume fails.
    let run = run_of(
        &agent(d.path(), 1, "IfNotPresent", "/"),
        d.path(),
        Duration::from_secs(5),
    );
    let e = run_manifest_pod(d.path(), &mut cri, &run)
        .await
        .unwrap_err()
        .to_string();
    let dev = d.path().join("dev");
    assert!(
        e.contains(&format!(
            "pod kube-system/erdma-agent: MountVolume.SetUp failed for volume \"dev\" (hostPath {}, type Directory): hostPath type check failed: {} is not a directory",
            dev.display(),
            dev.display()
        )),
        "{e}"
    );
    assert!(rt.calls().is_empty(), "no sandbox: {:?}", rt.calls());
    assert!(!d.path().join("pod-volumes").join("uid-1").exists());
    cancel.cancel();
}

fn exec_pod(startup: &str, readiness: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: p, namespace: lab}}
spec:
  containers:
    - name: c
      image: lab.local/erdma-agent:1
{startup}{readiness}"#
    )
}

#[tokio::test]
async fn a_container_that_never_becomes_ready_stays_recorded() {
    let d = short_dir();
    let cancel = CancellationToken::new();
    let (rt, mut cri) = common::runtime(d.path(), &cancel, images()).await;
    rt.answer_exec("check-ready", 1, "not yet");
    let yaml = exec_pod(
        "",
        "      readinessProbe:\n        exec: {command: [check-ready]}\n        periodSeconds: 1\n        failureThreshold: 1\n",
    );
    let at = Instant::now();
    let record = run_manifest_pod(
        d.path(),
        &mut cri,
        &run_of(&yaml, d.path(), Duration::from_secs(3)),
    )
    .await
    .unwrap();
    assert!(
        at.elapsed() >= Duration::from_secs(2),
        "probed until the timeout"
    );
    assert_eq!(record.ready, Some(false));
    assert_eq!(record.ready_after_ms, None);
    let why = record.not_ready_reason.clone().unwrap();
    assert!(
        why.contains("the readiness probe did not pass within the ready timeout")
            && why.contains("exited with 1: not yet"),
        "{why}"
    );
    let r = &record.probes[0];
    assert!(r.attempts >= 2 && r.successes == 0 && !r.passed, "{r:?}");
    assert_eq!(r.last_result, "failure");
    // Readiness failures beyond the threshold only keep it not ready: the pod stays.
    assert_eq!(pods::read_record(d.path(), "lab/p").unwrap(), record);
    assert!(rt.containers().len() == 1);
    pods::delete_pod(d.path(), &mut cri, "lab/p", 0)
        .await
        .unwrap();

    // A startup probe past its failure threshold is where the kubelet restarts the container.
    rt.answer_exec("check-started", 1, "");
    let yaml = exec_pod(
        "      startupProbe:\n        exec: {command: [check-started]}\n        periodSeconds: 1\n        failureThreshold: 2\n",
        "      readinessProbe:\n        exec: {command: [ready-cmd]}\n",
    );
    let record = run_manifest_pod(
        d.path(),
        &mut cri,
        &run_of(&yaml, d.path(), Duration::from_secs(20)),
    )
    .await
    .unwrap();
    assert_eq!(record.ready, Some(false));
    let why = record.not_ready_reason.clone().unwrap();
    assert!(
        why.contains("the startup probe failed 2 times in a row") && why.contains("restart"),
        "{why}"
    );
    assert_eq!(
        record.probes.len(),
        1,
        "readiness never ran: {:?}",
        record.probes
    );
    assert_eq!(record.probes[0].attempts, 2);
    pods::delete_pod(d.path(), &mut cri, "lab/p", 0)
        .await
        .unwrap();

    // Startup then readiness pass (exec answers exit 0 by default); the exec probe ran in the
    // container by ExecSync.
    let yaml = exec_pod(
        "      startupProbe:\n        exec: {command: [started]}\n",
        "      readinessProbe:\n        exec: {command: [ready-cmd, --quick]}\n        successThreshold: 2\n        periodSeconds: 1\n",
    );
    let record = run_manifest_pod(
        d.path(),
        &mut cri,
        &run_of(&yaml, d.path(), Duration::from_secs(20)),
    )
    .await
    .unwrap();
    assert_eq!(record.ready, Some(true), "{:?}", record.not_ready_reason);
    assert_eq!(
        record
            .probes
            .iter()
            .map(|p| (p.kind.as_str(), p.attempts))
            .collect::<Vec<_>>(),
        [("startup", 1), ("readiness", 2)],
        "successThreshold 2: two passes in a row"
    );
    let execs: Vec<Vec<String>> = rt
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Recorded::ExecSync(id, cmd) if id == record.container_id => Some(cmd),
            _ => None,
        })
        .collect();
    assert_eq!(
        execs,
        [
            vec!["started".to_string()],
            vec!["ready-cmd".to_string(), "--quick".to_string()],
            vec!["ready-cmd".to_string(), "--quick".to_string()],
        ]
    );

    // The container exits: probing stops and says why.
    rt.exit_container(&record.container_id, 3);
    let probes = Probes {
        readiness: run_of(&yaml, d.path(), Duration::from_secs(5))
            .plan
            .probes
            .readiness,
        ..Default::default()
    };
    let mut target = ProbeTarget {
        cri: &mut cri,
        container_id: &record.container_id,
        pod_ip: "127.0.0.1",
    };
    let r = probe::wait_ready(&probes, &mut target, Instant::now(), Duration::from_secs(5)).await;
    assert!(!r.ready);
    let why = r.reason.unwrap();
    assert!(why.contains("CONTAINER_EXITED (exit code 3"), "{why}");
    cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_resource_in_the_limits_is_allocated_through_the_device_plugin() {
    let d = short_dir();
    let (kubelet, plugin) =
        common::kubelet_with_plugin(d.path(), "example.com/dev", &["d0", "d1", "d2"]).await;
    let cancel = CancellationToken::new();
    let (rt, mut cri) = common::runtime(d.path(), &cancel, images()).await;
    let yaml = exec_pod(
        "      resources:\n        limits: {example.com/dev: \"2\"}\n",
        "",
    );
    let record = run_manifest_pod(
        d.path(),
        &mut cri,
        &run_of(&yaml, d.path(), Duration::from_secs(10)),
    )
    .await
    .unwrap();
    assert_eq!(record.ready, Some(true), "no probe: ready once running");
    let a = record.allocation.clone().expect("allocated at admission");
    assert_eq!(
        (
            a.resource.as_str(),
            a.device_ids.len(),
            a.container.as_str()
        ),
        ("example.com/dev", 2, "c")
    );
    assert!(record.timings_ms.contains_key("allocate"));
    let ledger = erdma_fake_kubelet::state::read_ledger(d.path()).unwrap();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0].pod, "lab/p");
    assert_eq!(
        call_names(&rt),
        [
            "RunPodSandbox",
            "ImageStatus",
            "CreateContainer",
            "StartContainer"
        ]
    );
    pods::delete_pod(d.path(), &mut cri, "lab/p", 0)
        .await
        .unwrap();
    assert!(
        erdma_fake_kubelet::state::read_ledger(d.path())
            .unwrap()
            .is_empty()
    );
    cancel.cancel();
    plugin.stop().await;
    kubelet.shutdown().await;
}

#[test]
fn records_written_before_manifests_still_parse() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("pods")).unwrap();
    // A record as `pod run` wrote it before --manifest (no image, volumes, probes, ...).
    std::fs::write(
        d.path().join("pods/lab_old.json"),
        r#"{"pod": "lab/old", "uid": "lab-old-1", "sandbox_id": "s1", "container": "c",
            "container_id": "c2", "ip": "10.89.0.2", "netns": "/var/run/netns/cni-1",
            "allocation": null, "cdi_devices": [], "cdi_form": "field",
            "timings_ms": {"total": 12}}"#,
    )
    .unwrap();
    let r = pods::read_record(d.path(), "lab/old").unwrap();
    assert_eq!((r.container_id.as_str(), r.ready), ("c2", None));
    assert!(r.volumes.is_empty() && r.probes.is_empty() && r.notes.is_empty());
    assert_eq!(r.pod_volume_dir, None);
    // And a flag-path record prints as before: none of the manifest fields.
    let json = serde_json::to_value(&r).unwrap();
    let keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "allocation",
            "cdi_devices",
            "cdi_form",
            "container",
            "container_id",
            "ip",
            "netns",
            "pod",
            "sandbox_id",
            "timings_ms",
            "uid"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_exits_non_zero_for_a_pod_that_is_not_ready_and_keeps_it() {
    let d = short_dir();
    let cancel = CancellationToken::new();
    let (rt, _cri) = common::runtime(d.path(), &cancel, images()).await;
    rt.answer_exec("never", 1, "");
    let file = d.path().join("pod.yaml");
    std::fs::write(
        &file,
        exec_pod(
            "",
            "      readinessProbe:\n        exec: {command: [never]}\n        periodSeconds: 1\n",
        ),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_erdma-fake-kubelet");
    // The runtime is served on this process's tokio threads; the CLI runs beside them.
    let output = |mut c: std::process::Command| async move {
        tokio::task::spawn_blocking(move || c.output().unwrap())
            .await
            .unwrap()
    };
    let common = |extra: &[&str]| {
        let mut c = std::process::Command::new(bin);
        c.args(["pod", "run", "--dir"])
            .arg(d.path())
            .arg("--cri-socket")
            .arg(d.path().join("cri.sock"))
            .arg("--log-root")
            .arg(d.path().join("logs"))
            .args(["--node-name", "lab-node"])
            .args(extra)
            .env("RUST_BACKTRACE", "0");
        c
    };
    let out = output(common(&[
        "--manifest",
        file.to_str().unwrap(),
        "--pod",
        "lab/probe-me",
        "--ready-timeout",
        "2",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(1));
    let record: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(record["pod"], "lab/probe-me", "--pod names the pod");
    assert_eq!(record["ready"], false);
    assert_eq!(record["node_name"], "lab-node");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pod lab/probe-me did not become ready within 2 s")
            && err.contains("pod delete"),
        "{err}"
    );
    assert!(
        pods::read_record(d.path(), "lab/probe-me").is_ok(),
        "kept for inspection"
    );

    // A refused manifest: nothing runs, the error names the field.
    let bad = d.path().join("bad.yaml");
    std::fs::write(
        &bad,
        exec_pod(
            "",
            "    - name: second\n      image: lab.local/erdma-agent:1\n",
        ),
    )
    .unwrap();
    let before = rt.calls().len();
    let out = output(common(&["--manifest", bad.to_str().unwrap()])).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pod lab/p") && err.contains("2 containers"),
        "{err}"
    );
    assert_eq!(rt.calls().len(), before);

    // Flags that describe the pod themselves do not go with a manifest.
    let out = output(common(&[
        "--manifest",
        bad.to_str().unwrap(),
        "--image",
        "x",
    ]))
    .await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    cancel.cancel();
}
