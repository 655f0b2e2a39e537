//! `pod run --manifest --api-server --service-account-dir`: the pod as the kubelet of a cluster
//! runs it, against the lab API server (over HTTPS with its CA) and the recording fake runtime:
//! the ServiceAccount admission's token volume, configMap/secret volumes written as the atomic
//! writer lays them out, env from ConfigMaps and Secrets, the service variables. Expected files,
//! modes and variables are written from the kubelet's rules, not computed by the code under
//! test.

mod common;

use erdma_cri::fake::{Recorded, RecordingRuntime};
use erdma_cri::runtime::v1 as cri;
use erdma_fake_kubelet::apiserver::{self, ApiServerOptions};
use erdma_fake_kubelet::manifest_pod::{ManifestRun, run_manifest_pod};
use erdma_fake_kubelet::pod_api::{self, ApiAccess};
use erdma_fake_kubelet::pods::{self, CdiForm};
use erdma_fake_kubelet::podspec::manifest;
use erdma_fake_kubelet::podspec::translate::{NodeInfo, PodPlan};
use erdma_kubelet::uds::ClientAuthority;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

fn node() -> NodeInfo {
    common::lab_node("10.77.0.1", 1 << 30)
}

/// The images the pods use.
fn images() -> Vec<cri::Image> {
    vec![
        common::image("sha256:ctl", "ghcr.io/erdma/erdma-controller:0.1.0"),
        common::image("sha256:tools", "lab.local/rdma-tools:1"),
    ]
}

fn run_of(plan: PodPlan, dir: &Path) -> ManifestRun {
    ManifestRun {
        plan,
        cdi: CdiForm::Field,
        authority: ClientAuthority::Localhost,
        log_root: dir.join("logs"),
        ready_timeout: Duration::from_secs(5),
        init_timeout: Duration::from_secs(5),
    }
}

/// The config of the container named `name` that the runtime was asked to create.
fn created(rt: &RecordingRuntime, name: &str) -> cri::ContainerConfig {
    rt.calls()
        .into_iter()
        .find_map(|c| match c {
            Recorded::CreateContainer(_, config)
                if config.metadata.as_ref().is_some_and(|m| m.name == name) =>
            {
                Some(*config)
            }
            _ => None,
        })
        .unwrap()
}

fn mount<'a>(c: &'a cri::ContainerConfig, path: &str) -> &'a cri::Mount {
    c.mounts
        .iter()
        .find(|m| m.container_path == path)
        .unwrap_or_else(|| panic!("no mount at {path}: {:?}", c.mounts))
}

fn env(c: &cri::ContainerConfig) -> BTreeMap<String, String> {
    c.envs
        .iter()
        .map(|e| (e.key.clone(), String::from_utf8(e.value.clone()).unwrap()))
        .collect()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn link(p: &Path) -> String {
    std::fs::read_link(p).unwrap().display().to_string()
}

fn chart_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/helm/ci/rendered")
        .join(name)
}

const CONTROLLER_SA: &str = "alibaba-erdma-controller-alibabacloud-erdma-controller";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_controller_deployment_runs_as_in_a_cluster() {
    let d = common::short_dir("fka");
    let cancel = CancellationToken::new();
    let file = chart_file("local-webhook.json");
    let started = apiserver::start(
        &ApiServerOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            kubeconfig: d.path().join("kubeconfig"),
            node: "lab-node".into(),
            tls: true,
            tls_sans: Vec::new(),
            service_account_dir: Some(d.path().join("sa")),
            objects: vec![file.clone()],
            enforce_rbac: false,
            feature_gates: Default::default(),
            pod_log_dir: None,
        },
        cancel.clone(),
    )
    .await
    .unwrap();
    // A Service with a cluster IP in the pod's namespace (the chart's are headless or have
    // none): the kubelet gives its variables too.
    started.api.put(
        &serde_json::from_value::<Service>(serde_json::json!({
            "metadata": {"name": "lab-metrics", "namespace": "kube-system"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 8080}]}
        }))
        .unwrap(),
    );
    let port = started.addr.port();
    let sa_dir = d.path().join("sa");
    let access = ApiAccess {
        client: pod_api::client("127.0.0.1", port, &sa_dir).await.unwrap(),
        host: "127.0.0.1".into(),
        port,
        service_account_dir: sa_dir.clone(),
    };
    // The controller runs as 65532; a test that is not root runs it as its own user, so that
    // the token file can be given to it.
    let me = std::fs::metadata(d.path()).unwrap().uid();
    let uid = if me == 0 { 65532 } else { me };
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("\"runAsUser\": 65532", &format!("\"runAsUser\": {uid}"));
    let mut m = manifest::parse(
        &text,
        "local-webhook.json",
        Some("Deployment/alibabacloud-erdma-controller"),
    )
    .unwrap();
    let objects = pod_api::prepare(&mut m, &access).await.unwrap();
    let plan = PodPlan::with_api(m, &node(), "uid-ctl".into(), &objects).unwrap();
    let (rt, mut cri) = common::runtime(d.path(), &cancel, images()).await;
    let record = run_manifest_pod(d.path(), &mut cri, &run_of(plan, d.path()))
        .await
        .unwrap();
    let c = created(&rt, "alibabacloud-erdma-controller");

    // The config volume: the ConfigMap's one key as a file, read-only, laid out as the atomic
    // writer does, with the default mode 0644.
    let cfg = mount(&c, "/etc/erdma-controller");
    assert!(cfg.readonly);
    let cfg_dir = PathBuf::from(&cfg.host_path);
    assert_eq!(cfg_dir, d.path().join("pod-volumes/uid-ctl/config"));
    let chart: serde_json::Value = serde_json::from_str(&text).unwrap();
    let want = chart["objects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "ConfigMap")
        .unwrap()["data"]["config.json"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(want.contains("\"enableWebhook\": true"));
    assert_eq!(
        std::fs::read_to_string(cfg_dir.join("config.json")).unwrap(),
        want
    );
    assert_eq!(link(&cfg_dir.join("config.json")), "..data/config.json");
    assert!(link(&cfg_dir.join("..data")).starts_with("..20"));
    assert_eq!(mode(&cfg_dir.join("config.json")), 0o644);

    // The service account's volume: token, ca.crt, namespace, read-only at the in-cluster
    // path. All containers run as one user, so the token is that user's, mode 0600.
    let sa = mount(&c, "/var/run/secrets/kubernetes.io/serviceaccount");
    assert!(sa.readonly);
    let sa_vol = PathBuf::from(&sa.host_path);
    let name = sa_vol.file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with("kube-api-access-") && name.len() == 21,
        "{name}"
    );
    let token = sa_vol.join("token");
    assert_eq!(
        std::fs::read_to_string(&token).unwrap(),
        std::fs::read_to_string(sa_dir.join("kube-system").join(CONTROLLER_SA).join("token"))
            .unwrap()
    );
    assert_eq!(mode(&token), 0o600);
    assert_eq!(std::fs::metadata(&token).unwrap().uid(), uid);
    assert_eq!(
        std::fs::read_to_string(sa_vol.join("ca.crt")).unwrap(),
        std::fs::read_to_string(sa_dir.join("ca.crt")).unwrap()
    );
    assert_eq!(mode(&sa_vol.join("ca.crt")), 0o644);
    assert_eq!(
        std::fs::read_to_string(sa_vol.join("namespace")).unwrap(),
        "kube-system"
    );

    // The env: the template's, then the kubernetes service's and the namespace's services'.
    let e = env(&c);
    let p = port.to_string();
    let want: BTreeMap<String, String> = [
        ("POD_NAME", "alibabacloud-erdma-controller".to_string()),
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1".into()),
        ("KUBERNETES_SERVICE_PORT", p.clone()),
        ("KUBERNETES_SERVICE_PORT_HTTPS", p.clone()),
        ("KUBERNETES_PORT", format!("tcp://127.0.0.1:{p}")),
        (
            &*format!("KUBERNETES_PORT_{p}_TCP"),
            format!("tcp://127.0.0.1:{p}"),
        ),
        (&*format!("KUBERNETES_PORT_{p}_TCP_PROTO"), "tcp".into()),
        (&*format!("KUBERNETES_PORT_{p}_TCP_PORT"), p.clone()),
        (
            &*format!("KUBERNETES_PORT_{p}_TCP_ADDR"),
            "127.0.0.1".into(),
        ),
        ("LAB_METRICS_SERVICE_HOST", "10.96.0.10".into()),
        ("LAB_METRICS_SERVICE_PORT", "8080".into()),
        ("LAB_METRICS_SERVICE_PORT_HTTP", "8080".into()),
        ("LAB_METRICS_PORT", "tcp://10.96.0.10:8080".into()),
        ("LAB_METRICS_PORT_8080_TCP", "tcp://10.96.0.10:8080".into()),
        ("LAB_METRICS_PORT_8080_TCP_PROTO", "tcp".into()),
        ("LAB_METRICS_PORT_8080_TCP_PORT", "8080".into()),
        ("LAB_METRICS_PORT_8080_TCP_ADDR", "10.96.0.10".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(e, want);
    assert_eq!(c.envs[0].key, "POD_NAME", "the pod's own variables first");
    // The record says what came from the API server.
    let kinds: Vec<(&str, &str)> = record
        .volumes
        .iter()
        .map(|v| (v.name.as_str(), v.kind.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [("config", "configMap"), (name.as_str(), "projected")]
    );
    assert!(
        record.notes["service_account"]
            .contains(&format!("the token of kube-system/{CONTROLLER_SA}")),
        "{:?}",
        record.notes
    );
    // The lab kubelet's reads went to the API server without a token (not audited).
    assert!(started.api.audit().is_empty());
    pods::delete_pod(
        d.path(),
        &mut cri,
        "kube-system/alibabacloud-erdma-controller",
        0,
    )
    .await
    .unwrap();
    assert!(
        !d.path().join("pod-volumes/uid-ctl").exists(),
        "the volumes go with the pod"
    );
    cancel.cancel();
    started.stopped().await;
}

const APP: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: app
  namespace: lab
  labels: {tier: web, app: demo}
spec:
  enableServiceLinks: false
  volumes:
    - name: cfg
      configMap:
        name: app-config
        defaultMode: 0440
        items:
          - {key: a.conf, path: conf/a.conf, mode: 0600}
          - {key: b, path: b.txt}
    - name: opt
      configMap: {name: missing, optional: true}
    - name: creds
      secret: {secretName: creds, defaultMode: 0400}
    - name: info
      downwardAPI:
        items:
          - {path: labels, fieldRef: {fieldPath: metadata.labels}}
          - {path: mem, resourceFieldRef: {containerName: c, resource: limits.memory, divisor: 1Mi}}
  containers:
    - name: c
      image: lab.local/rdma-tools:1
      resources: {limits: {memory: 64Mi}}
      envFrom:
        - {configMapRef: {name: app-config}, prefix: CFG_}
        - {secretRef: {name: gone, optional: true}}
      env:
        - {name: LEVEL, valueFrom: {configMapKeyRef: {name: app-config, key: level}}}
        - {name: PASSWORD, valueFrom: {secretKeyRef: {name: creds, key: password}}}
        - {name: MAYBE, valueFrom: {configMapKeyRef: {name: app-config, key: nope, optional: true}}}
        - {name: CFG_b, value: "overridden"}
        - {name: MSG, value: "level $(LEVEL) at $(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"}
      volumeMounts:
        - {name: cfg, mountPath: /etc/app}
        - {name: opt, mountPath: /etc/opt}
        - {name: creds, mountPath: /etc/creds, readOnly: false}
        - {name: info, mountPath: /etc/info}
"#;

/// An in-process lab API server's objects for the `lab` namespace, a token written as
/// `apiserver --service-account-dir` writes it.
fn lab_objects(dir: &Path) -> (erdma_k8s::fake::FakeApiServer, ApiAccess) {
    let api = erdma_k8s::fake::FakeApiServer::new();
    let o = |v: serde_json::Value| v;
    api.put(
        &serde_json::from_value::<ConfigMap>(o(serde_json::json!({
            "metadata": {"name": "app-config", "namespace": "lab"},
            "data": {"a.conf": "x=1\n", "b": "bee", "level": "debug"}
        })))
        .unwrap(),
    );
    api.put(
        &serde_json::from_value::<Secret>(o(serde_json::json!({
            "metadata": {"name": "creds", "namespace": "lab"},
            // "hunter2", "t0ken"
            "data": {"password": "aHVudGVyMg==", "token": "dDBrZW4="}
        })))
        .unwrap(),
    );
    api.put(
        &serde_json::from_value::<ConfigMap>(o(serde_json::json!({
            "metadata": {"name": "kube-root-ca.crt", "namespace": "lab"},
            "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\nlab\n-----END CERTIFICATE-----\n"}
        })))
        .unwrap(),
    );
    api.put(&ServiceAccount {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("default".into()),
            namespace: Some("lab".into()),
            ..Default::default()
        },
        ..Default::default()
    });
    let sa_dir = dir.join("sa");
    std::fs::create_dir_all(sa_dir.join("lab/default")).unwrap();
    std::fs::write(sa_dir.join("lab/default/token"), "tok-lab-default").unwrap();
    let access = ApiAccess {
        client: api.client(),
        host: "10.77.0.1".into(),
        port: 6443,
        service_account_dir: sa_dir,
    };
    (api, access)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_map_and_secret_volumes_and_env_are_read_from_the_api_server() {
    let d = common::short_dir("fkv");
    let (_api, access) = lab_objects(d.path());
    let mut m = manifest::parse(APP, "app.yaml", None).unwrap();
    let objects = pod_api::prepare(&mut m, &access).await.unwrap();
    let plan = PodPlan::with_api(m, &node(), "uid-app".into(), &objects).unwrap();
    let cancel = CancellationToken::new();
    let (rt, mut cri) = common::runtime(d.path(), &cancel, images()).await;
    run_manifest_pod(d.path(), &mut cri, &run_of(plan, d.path()))
        .await
        .unwrap();
    let c = created(&rt, "c");

    // items: only the keys named, at their paths, with their modes (defaultMode 0440 for the
    // one without); the directory of a nested path is a link to ..data.
    let cfg = PathBuf::from(&mount(&c, "/etc/app").host_path);
    assert_eq!(
        std::fs::read_to_string(cfg.join("conf/a.conf")).unwrap(),
        "x=1\n"
    );
    assert_eq!(mode(&cfg.join("conf/a.conf")), 0o600);
    assert_eq!(std::fs::read_to_string(cfg.join("b.txt")).unwrap(), "bee");
    assert_eq!(mode(&cfg.join("b.txt")), 0o440);
    assert_eq!(link(&cfg.join("conf")), "..data/conf");
    assert!(!cfg.join("level").exists() && !cfg.join("a.conf").exists());
    // An optional ConfigMap that is missing: an empty volume.
    let opt = PathBuf::from(&mount(&c, "/etc/opt").host_path);
    let mut names: Vec<String> = std::fs::read_dir(&opt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "..data" && !n.starts_with("..20"))
        .collect();
    names.sort();
    assert!(names.is_empty(), "{names:?}");
    // The Secret's keys, decoded, 0400; read-only although the mount asks otherwise.
    let creds = mount(&c, "/etc/creds");
    assert!(creds.readonly);
    let creds = PathBuf::from(&creds.host_path);
    assert_eq!(
        std::fs::read_to_string(creds.join("password")).unwrap(),
        "hunter2"
    );
    assert_eq!(
        std::fs::read_to_string(creds.join("token")).unwrap(),
        "t0ken"
    );
    assert_eq!(mode(&creds.join("password")), 0o400);
    // The downward API: labels as sorted key="value" lines, the memory limit in MiB.
    let info = PathBuf::from(&mount(&c, "/etc/info").host_path);
    assert_eq!(
        std::fs::read_to_string(info.join("labels")).unwrap(),
        "app=\"demo\"\ntier=\"web\""
    );
    assert_eq!(std::fs::read_to_string(info.join("mem")).unwrap(), "64");
    // No runAsUser: the token keeps the volume's mode 0644.
    let sa = PathBuf::from(&mount(&c, "/var/run/secrets/kubernetes.io/serviceaccount").host_path);
    assert_eq!(
        std::fs::read_to_string(sa.join("token")).unwrap(),
        "tok-lab-default"
    );
    assert_eq!(mode(&sa.join("token")), 0o644);
    assert_eq!(
        std::fs::read_to_string(sa.join("namespace")).unwrap(),
        "lab"
    );

    // envFrom first (keys sorted, prefixed; a missing optional source adds nothing), env over
    // it in order (a missing optional key sets nothing), then the kubernetes service (no
    // service links: no other service).
    let got: Vec<(String, String)> = c
        .envs
        .iter()
        .map(|e| (e.key.clone(), String::from_utf8(e.value.clone()).unwrap()))
        .collect();
    let want: Vec<(String, String)> = [
        ("CFG_a.conf", "x=1\n"),
        ("CFG_b", "overridden"),
        ("CFG_level", "debug"),
        ("LEVEL", "debug"),
        ("PASSWORD", "hunter2"),
        ("MSG", "level debug at 10.77.0.1:6443"),
        ("KUBERNETES_PORT", "tcp://10.77.0.1:6443"),
        ("KUBERNETES_PORT_6443_TCP", "tcp://10.77.0.1:6443"),
        ("KUBERNETES_PORT_6443_TCP_ADDR", "10.77.0.1"),
        ("KUBERNETES_PORT_6443_TCP_PORT", "6443"),
        ("KUBERNETES_PORT_6443_TCP_PROTO", "tcp"),
        ("KUBERNETES_SERVICE_HOST", "10.77.0.1"),
        ("KUBERNETES_SERVICE_PORT", "6443"),
        ("KUBERNETES_SERVICE_PORT_HTTPS", "6443"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(got, want);
    cancel.cancel();
}

#[tokio::test]
async fn what_the_api_server_lacks_is_named() {
    let d = tempfile::tempdir().unwrap();
    let (api, access) = lab_objects(d.path());
    let plan = |text: String| {
        let access = access.clone();
        async move {
            let mut m = manifest::parse(&text, "p.yaml", None).unwrap();
            let o = pod_api::prepare(&mut m, &access).await?;
            PodPlan::with_api(m, &node(), "u".into(), &o)
        }
    };
    let pod = |spec: &str, container: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: lab}}\nspec:\n{spec}  containers:\n    - name: c\n      image: lab.local/rdma-tools:1\n{container}"
        )
    };
    let cases: &[(String, &[&str])] = &[
        (
            pod(
                "  volumes: [{name: v, configMap: {name: missing}}]\n",
                "      volumeMounts: [{name: v, mountPath: /v}]\n",
            ),
            &[
                "spec.volumes[0] \"v\".configMap.name",
                "configmap \"missing\" not found (ConfigMap lab/missing)",
                "Fix:",
            ],
        ),
        (
            pod(
                "  volumes: [{name: v, configMap: {name: app-config, items: [{key: zzz, path: z}]}}]\n",
                "",
            ),
            &[
                "spec.volumes[0] \"v\".configMap.items",
                "configmap references non-existent config key: zzz",
            ],
        ),
        (
            pod(
                "  volumes: [{name: v, secret: {secretName: creds, defaultMode: 4095}}]\n",
                "",
            ),
            &[
                "spec.volumes[0] \"v\".secret.defaultMode",
                "between 0 and 0777",
            ],
        ),
        (
            pod(
                "",
                "      env: [{name: X, valueFrom: {secretKeyRef: {name: creds, key: zzz}}}]\n",
            ),
            &[
                "spec.containers[0].env[0] \"X\".valueFrom.secretKeyRef",
                "couldn't find key zzz in Secret lab/creds",
            ],
        ),
        (
            pod("", "      envFrom: [{secretRef: {name: gone}}]\n"),
            &["spec.containers[0].envFrom[0]", "secret \"gone\" not found"],
        ),
        (
            pod("  serviceAccountName: nobody\n", ""),
            &[
                "spec.serviceAccountName",
                "error looking up service account lab/nobody: serviceaccount \"nobody\" not found",
            ],
        ),
    ];
    for (text, want) in cases {
        let e = plan(text.clone()).await.unwrap_err().to_string();
        for w in *want {
            assert!(e.contains(w), "{w:?} missing in {e}");
        }
    }

    // A service account with automount off: no token volume, and the record says why.
    api.put(&ServiceAccount {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("quiet".into()),
            namespace: Some("lab".into()),
            ..Default::default()
        },
        automount_service_account_token: Some(false),
        ..Default::default()
    });
    let p = plan(pod("  serviceAccountName: quiet\n", ""))
        .await
        .unwrap();
    assert!(p.volumes.is_empty());
    assert!(p.app.mounts.is_empty());
    assert_eq!(
        p.notes["service_account_admission"],
        "no token mounted: automountServiceAccountToken is false on the service account"
    );
    // A service account without a token file: the projection names it.
    api.put(&ServiceAccount {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("later".into()),
            namespace: Some("lab".into()),
            ..Default::default()
        },
        ..Default::default()
    });
    let e = plan(pod("  serviceAccountName: later\n", ""))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(".serviceAccountToken: no token for service account lab/later")
            && e.contains("sa/lab/later/token")
            && e.contains("--objects"),
        "{e}"
    );
}

#[test]
fn the_cli_takes_the_api_server_with_its_service_account_directory() {
    let bin = env!("CARGO_BIN_EXE_erdma-fake-kubelet");
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(bin)
            .args([
                "pod",
                "run",
                "--dir",
                "/nonexistent",
                "--manifest",
                "/nonexistent.yaml",
            ])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = run(&["--api-server", "10.89.0.1:6443"]);
    assert!(!ok && err.contains("--service-account-dir"), "{err}");
    let (ok, err) = run(&["--service-account-dir", "/tmp"]);
    assert!(!ok && err.contains("--api-server"), "{err}");
    // Both: parsed, then the missing manifest is what fails.
    let (ok, err) = run(&[
        "--api-server",
        "10.89.0.1:6443",
        "--service-account-dir",
        "/tmp",
    ]);
    assert!(!ok && err.contains("read the manifest"), "{err}");
    // --kubeconfig with --manifest: the kubelet's client, so only with --api-server.
    let (ok, err) = run(&[
        "--api-server",
        "10.89.0.1:6443",
        "--service-account-dir",
        "/tmp",
        "--kubeconfig",
        "/nonexistent.kubeconfig",
    ]);
    assert!(!ok && err.contains("read the manifest"), "{err}");
    let (ok, err) = run(&["--kubeconfig", "/nonexistent.kubeconfig"]);
    assert!(!ok && err.contains("pass --api-server HOST:PORT"), "{err}");
}
