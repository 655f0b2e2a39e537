//! The lab's API server (`erdma-fake-kubelet apiserver`) as a pod's in-cluster client meets it:
//! HTTPS with the CA of `ca.crt`, the service account's token, the `kubernetes.default.svc`
//! name; the objects of a rendered chart file in place as after `helm install`; what the control
//! plane makes (namespaces, default service accounts, `kube-root-ca.crt`).

use erdma_fake_kubelet::apiserver::{self, ApiServerOptions};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, ServiceAccount};
use kube::Api;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

fn chart_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/helm/ci/rendered")
        .join(name)
}

const CONTROLLER_SA: &str = "alibaba-erdma-controller-alibabacloud-erdma-controller";

/// A client configured as `kube`'s in-cluster configuration is: the server URL, the CA file and
/// the token file of the service-account directory, and the name the certificate must carry.
async fn in_cluster_client(url: &str, ca: &Path, token: &Path, server_name: &str) -> kube::Client {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: in-cluster\n  cluster:\n    server: {url}\n    certificate-authority: {}\n    tls-server-name: {server_name}\n\
         contexts:\n- name: in-cluster\n  context: {{cluster: in-cluster, user: sa, namespace: kube-system}}\ncurrent-context: in-cluster\n\
         users:\n- name: sa\n  user:\n    tokenFile: {}\n",
        ca.display(),
        token.display()
    );
    let kc = kube::config::Kubeconfig::from_yaml(&text).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

async fn admin_client(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

fn options(dir: &Path, objects: Vec<PathBuf>) -> ApiServerOptions {
    ApiServerOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        kubeconfig: dir.join("kubeconfig"),
        node: "lab-node".into(),
        tls: true,
        tls_sans: vec!["10.89.0.1".into()],
        service_account_dir: Some(dir.join("sa")),
        objects,
        enforce_rbac: true,
        feature_gates: Default::default(),
        pod_log_dir: None,
    }
}

#[tokio::test]
async fn an_in_cluster_client_reads_the_installed_chart_with_its_token() {
    let d = tempfile::tempdir().unwrap();
    let cancel = CancellationToken::new();
    let file = chart_file("local-webhook.json");
    let started = apiserver::start(&options(d.path(), vec![file.clone()]), cancel.clone())
        .await
        .unwrap();
    let url = format!("https://127.0.0.1:{}", started.addr.port());
    let sa = d.path().join("sa");

    // The files a pod gets: the CA and its service account's token, private.
    let ca = sa.join("ca.crt");
    let ca_pem = std::fs::read_to_string(&ca).unwrap();
    assert!(
        ca_pem.starts_with("-----BEGIN CERTIFICATE-----"),
        "{ca_pem}"
    );
    let token = sa.join("kube-system").join(CONTROLLER_SA).join("token");
    let mode = std::fs::metadata(&token).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(
        sa.join("token").is_file(),
        "default/default's token at DIR/token"
    );
    assert!(sa.join("kube-system/default/token").is_file());
    assert!(
        sa.join("kube-system/alibaba-erdma-controller-agent/token")
            .is_file()
    );

    // The controller's client, by the API server's service name: its ClusterRole lets it get
    // nodes; it has no right to read ConfigMaps (it reads its config from the volume).
    let client = in_cluster_client(&url, &ca, &token, "kubernetes.default.svc").await;
    let nodes: Api<Node> = Api::all(client.clone());
    assert_eq!(
        nodes
            .get("lab-node")
            .await
            .unwrap()
            .metadata
            .name
            .as_deref(),
        Some("lab-node")
    );
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    match cms.get("alibaba-erdma-controller").await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 403);
            assert!(
                s.message.contains(&format!(
                    "system:serviceaccount:kube-system:{CONTROLLER_SA}"
                )),
                "{}",
                s.message
            );
        }
        other => panic!("the chart's RBAC does not grant configmaps: {other:?}"),
    }
    let audit = started.api.audit();
    assert_eq!(audit.len(), 2, "{audit:?}");
    assert!(
        audit
            .iter()
            .all(|r| r.attributes.user
                == format!("system:serviceaccount:kube-system:{CONTROLLER_SA}"))
    );
    // The other names of the kubernetes service and the extra SAN are in the certificate.
    for name in [
        "kubernetes",
        "kubernetes.default.svc.cluster.local",
        "10.89.0.1",
    ] {
        let c = in_cluster_client(&url, &ca, &token, name).await;
        assert!(Api::<Node>::all(c).get("lab-node").await.is_ok(), "{name}");
    }
    let c = in_cluster_client(&url, &ca, &token, "erdma.example").await;
    assert!(
        Api::<Node>::all(c).get("lab-node").await.is_err(),
        "a name the certificate does not carry"
    );
    // Another run's CA is not trusted.
    let other = d.path().join("other-ca.crt");
    std::fs::write(
        &other,
        erdma_k8s::fake::FakeTls::generate().unwrap().ca_pem(),
    )
    .unwrap();
    let c = in_cluster_client(&url, &other, &token, "kubernetes.default.svc").await;
    assert!(Api::<Node>::all(c).get("lab-node").await.is_err());

    // The chart's objects, read back through the written kubeconfig (no token: unrestricted).
    let admin = admin_client(&d.path().join("kubeconfig")).await;
    let dep: Deployment = Api::namespaced(admin.clone(), "kube-system")
        .get("alibabacloud-erdma-controller")
        .await
        .unwrap();
    let spec = dep.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    assert_eq!(
        spec.template.spec.unwrap().service_account_name.as_deref(),
        Some(CONTROLLER_SA)
    );
    let cm: ConfigMap = Api::namespaced(admin.clone(), "kube-system")
        .get("alibaba-erdma-controller")
        .await
        .unwrap();
    let config = &cm.data.unwrap()["config.json"];
    assert!(config.contains("\"enableWebhook\": true"), "{config}");
    let hook: MutatingWebhookConfiguration = Api::all(admin.clone())
        .get("alibabacloud-erdma-controller")
        .await
        .unwrap();
    let w = &hook.webhooks.unwrap()[0];
    assert_eq!(w.name, "alibabacloud-erdma-controller.mutating.k8s.io");
    let svc = w.client_config.service.as_ref().unwrap();
    assert_eq!(
        (
            svc.namespace.as_str(),
            svc.name.as_str(),
            svc.path.as_deref(),
            svc.port
        ),
        (
            "kube-system",
            "alibabacloud-erdma-controller",
            Some("/mutating"),
            Some(443)
        )
    );
    assert!(
        w.client_config.ca_bundle.is_none(),
        "the controller patches it in"
    );

    // What the control plane makes.
    let ns: Namespace = Api::all(admin.clone()).get("kube-system").await.unwrap();
    assert_eq!(
        ns.metadata.labels.unwrap()["kubernetes.io/metadata.name"],
        "kube-system"
    );
    for n in ["default", "kube-public", "kube-node-lease"] {
        assert!(
            Api::<Namespace>::all(admin.clone()).get(n).await.is_ok(),
            "{n}"
        );
    }
    let root: ConfigMap = Api::namespaced(admin.clone(), "kube-system")
        .get("kube-root-ca.crt")
        .await
        .unwrap();
    assert_eq!(root.data.unwrap()["ca.crt"], ca_pem);
    assert!(
        Api::<ServiceAccount>::namespaced(admin.clone(), "default")
            .get("default")
            .await
            .is_ok()
    );

    // The report names what came from where.
    let loaded = started
        .report
        .iter()
        .find(|l| l.starts_with("loaded "))
        .unwrap();
    assert!(
        loaded.starts_with(&format!("loaded 18 objects from {}: ", file.display()))
            && loaded.contains("Deployment kube-system/alibabacloud-erdma-controller")
            && loaded.contains("MutatingWebhookConfiguration alibabacloud-erdma-controller")
            && loaded.contains("ConfigMap kube-system/alibaba-erdma-controller"),
        "{loaded}"
    );
    assert_eq!(started.tokens.len(), 6, "{:?}", started.tokens);
    cancel.cancel();
    started.stopped().await;
}

#[tokio::test]
async fn refusals_name_the_flag_and_the_object() {
    let d = tempfile::tempdir().unwrap();
    let mut o = options(d.path(), Vec::new());
    o.tls = false;
    let e = apiserver::start(&o, CancellationToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("--service-account-dir needs --tls"), "{e}");

    let bad = d.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ok}\n---\napiVersion: batch/v1\nkind: Job\nmetadata: {name: j, namespace: lab}\n",
    )
    .unwrap();
    let e = apiserver::start(
        &options(d.path(), vec![bad.clone()]),
        CancellationToken::new(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains(&format!("{}: Job lab/j", bad.display())) && e.contains("Fix:"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_serves_until_sigterm_and_says_what_it_loaded() {
    let d = tempfile::tempdir().unwrap();
    let kubeconfig = d.path().join("kc");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_erdma-fake-kubelet"))
        .args([
            "apiserver",
            "--listen",
            "127.0.0.1:0",
            "--node",
            "lab-node",
            "--tls",
        ])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--service-account-dir")
        .arg(d.path().join("sa"))
        .arg("--objects")
        .arg(chart_file("local-webhook.json"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !kubeconfig.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "no kubeconfig written"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let admin = admin_client(&kubeconfig).await;
    let hook: MutatingWebhookConfiguration = Api::all(admin)
        .get("alibabacloud-erdma-controller")
        .await
        .unwrap();
    assert_eq!(hook.webhooks.unwrap().len(), 1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = tokio::task::spawn_blocking(move || {
        let _ = child.wait();
        let mut s = String::new();
        use std::io::Read;
        child.stderr.take().unwrap().read_to_string(&mut s).unwrap();
        s
    })
    .await
    .unwrap();
    assert!(out.contains("apiserver: loaded 18 objects from"), "{out}");
    assert!(
        out.contains("apiserver: made a CA and a serving certificate for 127.0.0.1, kubernetes,"),
        "{out}"
    );

    // Without --tls, --service-account-dir is refused by the CLI.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_erdma-fake-kubelet"))
        .args([
            "apiserver",
            "--node",
            "n",
            "--kubeconfig",
            "/nonexistent/kc",
        ])
        .args(["--service-account-dir", "/nonexistent/sa"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls"));
}

/// With feature gates off (`--emulated-version 1.36 --feature-gates …=false`) the lab's API
/// server drops their fields as the API server does: the install's DeviceClass has no
/// `extendedResourceName`, a created ResourceSlice comes back without device taints.
#[tokio::test]
async fn feature_gates_off_drop_their_fields() {
    use erdma_k8s::fake::FeatureGates;
    use k8s_openapi::api::resource::v1::{
        Device, DeviceClass, DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
    };
    let d = tempfile::tempdir().unwrap();
    let cancel = CancellationToken::new();
    let mut opts = options(d.path(), vec![]);
    opts.feature_gates = FeatureGates::release(36)
        .unwrap()
        .with("DRAExtendedResource=false,DRADeviceTaints=false")
        .unwrap();
    let started = apiserver::start(&opts, cancel.clone()).await.unwrap();
    assert!(
        started
            .report
            .iter()
            .any(|l| l.contains("without extendedResourceName: DRAExtendedResource is off")),
        "{:?}",
        started.report
    );
    let client = admin_client(&d.path().join("kubeconfig")).await;
    let class = Api::<DeviceClass>::all(client.clone())
        .get("erdma.alibabacloud.com")
        .await
        .unwrap();
    assert_eq!(class.spec.extended_resource_name, None);
    let slice = ResourceSlice {
        metadata: kube::api::ObjectMeta {
            name: Some("lab-node-erdma.alibabacloud.com".into()),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: "erdma.alibabacloud.com".into(),
            node_name: Some("lab-node".into()),
            pool: ResourcePool {
                name: "lab-node".into(),
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some(vec![Device {
                name: "erdma-0".into(),
                allow_multiple_allocations: Some(true),
                taints: Some(vec![DeviceTaint {
                    key: "erdma.alibabacloud.com/unhealthy".into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }]),
            ..Default::default()
        },
    };
    let stored = Api::<ResourceSlice>::all(client)
        .create(&kube::api::PostParams::default(), &slice)
        .await
        .unwrap();
    let dev = &stored.spec.devices.unwrap()[0];
    assert_eq!(dev.taints, None, "DRADeviceTaints off");
    assert_eq!(
        dev.allow_multiple_allocations,
        Some(true),
        "DRAConsumableCapacity stays on (1.36 default)"
    );
    cancel.cancel();
    started.stopped().await;
}
