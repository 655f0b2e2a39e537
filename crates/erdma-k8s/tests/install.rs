//! `install::apply` (server-side apply through discovery) against the fake API server, and the
//! validation of values.

use erdma_k8s::ERdmaDevice;
use erdma_k8s::fake::FakeApiServer;
use erdma_k8s::install::{Values, apply, render};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

fn values() -> Values {
    let mut v = Values::default();
    v.credentials.kind = "ecs_ram_role".into();
    v.config.enable_webhook = true;
    v
}

#[tokio::test]
async fn apply_creates_every_object_and_is_idempotent() {
    let api = FakeApiServer::new();
    let client = api.client();
    let v = values();
    let applied = apply(&client, &v).await.expect("applied");
    assert_eq!(applied.len(), render(&v).unwrap().len());
    assert!(
        applied.contains(&"MutatingWebhookConfiguration/alibabacloud-erdma-controller".to_string())
    );
    let crd: CustomResourceDefinition = api
        .get(None, "erdmadevices.network.alibabacloud.com")
        .expect("CRD");
    assert_eq!(crd.spec.scope, "Cluster");
    let ds: DaemonSet = api
        .get(Some("kube-system"), "alibabacloud-erdma-agent")
        .expect("agent");
    assert_eq!(
        ds.spec.unwrap().template.spec.unwrap().host_network,
        Some(true)
    );
    let dep: Deployment = api
        .get(Some("kube-system"), "alibabacloud-erdma-controller")
        .expect("controller");
    assert_eq!(dep.spec.unwrap().replicas, Some(2));
    assert!(
        api.get::<ClusterRole>(None, "alibaba-erdma-controller-agent")
            .is_some()
    );
    let patches = api.requests_matching("PATCH", "").len();
    assert!(
        api.requests_matching("PATCH", "")
            .iter()
            .all(|r| r.contains("fieldManager") && r.contains("force"))
    );
    // Second apply: same objects, no new ones.
    let again = apply(&client, &v).await.unwrap();
    assert_eq!(again, applied);
    assert_eq!(api.requests_matching("PATCH", "").len(), 2 * patches);
    assert!(
        api.list::<ERdmaDevice>(None).is_empty(),
        "install creates no ERdmaDevice"
    );
}

#[test]
fn invalid_values_name_the_value() {
    let mut v = values();
    v.webhook_failure_policy = "Sometimes".into();
    let e = render(&v).unwrap_err().to_string();
    assert!(e.contains("webhookFailurePolicy"), "{e}");
    let mut v = values();
    v.agent.jumbo_frame_mtu = 100;
    assert!(
        render(&v)
            .unwrap_err()
            .to_string()
            .contains("jumboFrameMTU")
    );
    let mut v = values();
    v.agent.exposed_local_eris = vec!["i-1\terdma_0 extra".into()];
    assert!(
        render(&v)
            .unwrap_err()
            .to_string()
            .contains("exposedLocalERIs")
    );
    // The agent's grammar: device names are letters, digits, '_', '-', '*'; `i-*` and globs pass.
    let mut v = values();
    v.agent.exposed_local_eris = vec!["i-bp1 erdma.0".into()];
    let e = render(&v).unwrap_err().to_string();
    assert!(e.contains("exposedLocalERIs entry 1"), "{e}");
    let mut v = values();
    v.agent.exposed_local_eris = vec!["i-* erdma_*".into(), "i-bp1 erdma_0/erdma_1".into()];
    render(&v).expect("the agent accepts these");
    // The agent's MTU range.
    let mut v = values();
    v.agent.jumbo_frame_mtu = 9001;
    let e = render(&v).unwrap_err().to_string();
    assert!(e.contains("1280..=9000"), "{e}");
}

#[test]
fn missing_credentials_warn_and_still_render() {
    let mut v = Values::default();
    v.credentials.kind = "access_key".into();
    let objs = render(&v).expect("renders without credentials");
    assert!(objs.iter().any(|o| o["kind"] == "Secret"));
    let w = v.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("accessKeyID") && w[0].contains("accessKeySecret"));
    v.credentials.kind = "oidc_role_arn".into();
    assert!(v.warnings()[0].contains("pod-identity.alibabacloud.com/role-name"));
    v.config.local_eri_discovery = true;
    let w = v.warnings();
    assert!(
        !w.iter().any(|w| w.contains("credentials")),
        "local discovery needs no credentials: {w:?}"
    );
    // The only warning left is the original's `i-XXX` placeholder, which local discovery applies.
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("i-XXX"), "{w:?}");
}

#[test]
fn the_original_go_images_are_refused_except_their_copied_default() {
    let mut v = values();
    v.agent.image.repository = "registry.aliyuncs.com/erdma/agent".into();
    v.agent.image.tag = "latest".into();
    let objs = render(&v).expect("the original's default is replaced");
    let ds = objs
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("agent");
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("ghcr.io/erdma/erdma-agent:{}", env!("CARGO_PKG_VERSION"))
    );
    v.agent.image.tag = "v0.1.2".into();
    let e = render(&v).unwrap_err().to_string();
    assert!(
        e.contains("Go image") && e.contains("deploy/docker/agent.Dockerfile"),
        "{e}"
    );
    // The VPC and regional mirrors of the original's registry at the default tag are its
    // default too (a values file pulling the original from a VPC mirror), replaced; pinned, refused.
    for mirror in [
        "registry-vpc.cn-beijing.aliyuncs.com/erdma/controller",
        "registry.cn-hangzhou.aliyuncs.com/erdma/controller",
    ] {
        let mut v = values();
        v.controller.image.repository = mirror.into();
        let objs = render(&v).unwrap_or_else(|e| panic!("{mirror}: {e}"));
        let d = objs
            .iter()
            .find(|o| o["kind"] == "Deployment")
            .expect("controller");
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["image"],
            format!(
                "ghcr.io/erdma/erdma-controller:{}",
                env!("CARGO_PKG_VERSION")
            ),
            "{mirror}"
        );
        v.controller.image.tag = "v0.3.0".into();
        assert!(
            render(&v)
                .unwrap_err()
                .to_string()
                .contains("controller.image"),
            "{mirror}:v0.3.0"
        );
    }
    let mut v = values();
    v.agent.image.repository = "my.registry/aliyuncs.com-mirror/erdma-agent".into();
    assert!(render(&v).is_ok(), "a lookalike name is not the Go image");
}

fn daemonset_args(v: &Values) -> Vec<String> {
    let objs = render(v).expect("renders");
    let ds = objs
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("agent");
    serde_json::from_value(ds["spec"]["template"]["spec"]["containers"][0]["args"].clone())
        .expect("args")
}

/// The agent reads the CRI for the SMC-R pre-start hook (webhook off) and to name the pods of
/// its per-pod RDMA usage; only with neither is the runtime's socket left out of the pod.
#[test]
fn the_cri_socket_is_mounted_where_prestart_or_usage_needs_it() {
    let cri_volume = |v: &Values| -> Option<String> {
        let objs = render(v).expect("renders");
        let ds = objs
            .iter()
            .find(|o| o["kind"] == "DaemonSet")
            .expect("agent");
        let volumes = ds["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .cloned();
        volumes
            .unwrap_or_default()
            .iter()
            .find(|vol| vol["name"] == "cri-socket")
            .map(|vol| {
                vol["hostPath"]["path"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
    };
    let flag = "--cri-socket=/run/k3s/containerd/containerd.sock".to_string();
    for (webhook, usage, mounted) in [
        (false, false, true),
        (false, true, true),
        (true, true, true),
        // The agent does SMC-R with the webhook too (its smcr-init only checks), over CRI.
        (true, false, true),
    ] {
        let mut v = values();
        v.config.enable_webhook = webhook;
        v.agent.rdma_usage.enabled = usage;
        assert_eq!(
            cri_volume(&v).as_deref(),
            mounted.then_some("/run/containerd"),
            "webhook {webhook}, usage {usage}"
        );
        v.agent.cri_socket = "/run/k3s/containerd/containerd.sock".into();
        assert_eq!(
            cri_volume(&v).as_deref(),
            mounted.then_some("/run/k3s/containerd"),
            "webhook {webhook}, usage {usage}, k3s"
        );
        assert_eq!(
            daemonset_args(&v).contains(&flag),
            mounted,
            "webhook {webhook}, usage {usage}: {:?}",
            daemonset_args(&v)
        );
    }
}

#[test]
fn extra_args_come_after_the_charts_own_and_an_empty_one_is_refused() {
    let mut v = values();
    v.agent.prefer_driver = "compat".into();
    let own = daemonset_args(&v);
    v.agent.extra_args = vec![
        "--rdma-driver".into(),
        "rxe".into(),
        "--slots-per-device=8".into(),
    ];
    let args = daemonset_args(&v);
    assert_eq!(args[..own.len()], own[..], "the chart's own args unchanged");
    assert_eq!(
        args[own.len()..],
        ["--rdma-driver", "rxe", "--slots-per-device=8"],
        "{args:?}"
    );
    assert!(own.contains(&"--prefer-driver=compat".to_string()));
    for (bad, index) in [
        (vec!["--rdma-driver=rxe".to_string(), String::new()], 1),
        (vec![" \t".to_string()], 0),
    ] {
        let mut v = values();
        v.agent.extra_args = bad;
        let e = render(&v).unwrap_err().to_string();
        assert!(
            e.contains(&format!("agent.extraArgs[{index}]")) && e.contains("is empty"),
            "{e}"
        );
    }
    let v: Values =
        serde_saphyr::from_str("agent:\n  extraArgs: [\"--instance-id=i-1\"]\n").expect("values");
    assert_eq!(v.agent.extra_args, ["--instance-id=i-1"]);
    assert!(Values::default().agent.extra_args.is_empty());
}

/// A values file that sets one key of an image block keeps the other defaults (Helm merges the
/// block key by key), e.g. the lab's `agent.image.pullPolicy: IfNotPresent`.
#[test]
fn a_partial_image_block_keeps_erdmas_repository_and_tag() {
    let v: Values = serde_saphyr::from_str(
        "agent:\n  image:\n    pullPolicy: IfNotPresent\ncontroller:\n  image:\n    tag: dev\n",
    )
    .expect("values");
    assert_eq!(v.agent.image.repository, "ghcr.io/erdma/erdma-agent");
    assert_eq!(v.agent.image.pull_policy, "IfNotPresent");
    assert_eq!(
        v.agent.image.reference("agent").expect("image"),
        format!("ghcr.io/erdma/erdma-agent:{}", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(
        v.controller.image.repository,
        "ghcr.io/erdma/erdma-controller"
    );
    assert_eq!(v.controller.image.pull_policy, "Always");
    assert_eq!(
        v.controller.image.reference("controller").expect("image"),
        "ghcr.io/erdma/erdma-controller:dev"
    );
    let v: Values =
        serde_saphyr::from_str("agent:\n  image:\n    repository: r.example/a\n").expect("values");
    assert_eq!(
        v.agent.image.reference("agent").expect("image"),
        format!("r.example/a:{}", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(v.agent.image.pull_policy, "Always");
}

fn config_json_image(v: &Values) -> String {
    let objs = render(v).expect("renders");
    let cm = objs
        .iter()
        .find(|o| o["kind"] == "ConfigMap")
        .expect("ConfigMap");
    let cfg: serde_json::Value =
        serde_json::from_str(cm["data"]["config.json"].as_str().expect("config.json"))
            .expect("JSON");
    cfg["smcInitImage"]
        .as_str()
        .expect("smcInitImage")
        .to_string()
}

#[test]
fn the_original_smcr_init_image_at_its_default_tag_becomes_erdmas() {
    let erdma = format!("ghcr.io/erdma/smcr-init:{}", env!("CARGO_PKG_VERSION"));
    for (given, replaced) in [
        ("", true),
        (
            "registry.cn-hangzhou.aliyuncs.com/erdma/smcr_init:latest",
            true,
        ),
        ("registry.cn-hangzhou.aliyuncs.com/erdma/smcr_init", true),
        (
            "registry-vpc.cn-beijing.aliyuncs.com/erdma/smcr_init:latest",
            true,
        ),
        (
            "registry-vpc.ap-southeast-1.aliyuncs.com/erdma/smcr_init",
            true,
        ),
        // A pinned tag of the original's image is the user's choice (same command and SMCR_PNET).
        (
            "registry.cn-hangzhou.aliyuncs.com/erdma/smcr_init:v1.2.0",
            false,
        ),
        ("registry-vpc..aliyuncs.com/erdma/smcr_init", false),
        ("registry-vpc.CN-X.aliyuncs.com/erdma/smcr_init", false),
        (
            "mirror.example/registry.cn-hangzhou.aliyuncs.com/erdma/smcr_init",
            false,
        ),
        ("registry.example/erdma/smcr-init:dev", false),
    ] {
        let mut v = values();
        v.config.smc_init_image = given.into();
        let want = if replaced { erdma.as_str() } else { given };
        assert_eq!(config_json_image(&v), want, "{given:?}");
        assert_eq!(
            v.config.is_original_smc_init_image(),
            replaced && !given.is_empty(),
            "{given:?}"
        );
    }
}

#[test]
fn chart_values_yaml_loads() {
    // The original chart's values.yaml shape (the keys erdma uses; others are ignored by serde).
    let raw = "controller:\n  replicaCount: 3\nagent:\n  preferDriver: compat\n  allocateAllDevices: true\n  jumboFrameMTU: 9000\n  exposedLocalERIs: [\"i-* erdma_0\"]\nconfig:\n  localERIDiscovery: true\n  enableWebhook: true\n  smcInitImage: x/y:z\nnodeSelector:\n  a: b\ntolerations:\n- operator: Exists\n";
    let v: Values = serde_saphyr::from_str(raw).unwrap();
    assert_eq!(v.controller.replica_count, 3);
    assert_eq!(v.agent.prefer_driver, "compat");
    assert_eq!(v.agent.jumbo_frame_mtu, 9000);
    assert_eq!(v.agent.exposed_local_eris, vec!["i-* erdma_0".to_string()]);
    assert!(v.config.local_eri_discovery && v.config.enable_webhook);
    assert_eq!(v.node_selector["a"], "b");
    let objs = render(&v).unwrap();
    assert!(
        objs.iter().any(|o| o["kind"] == "Deployment"),
        "controller kept for the webhook"
    );
    let secrets: Vec<&str> = objs
        .iter()
        .filter(|o| o["kind"] == "Secret")
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        secrets,
        ["alibabacloud-erdma-controller-webhook-tls"],
        "no cloud credentials in local mode, only the webhook certificate's (empty) Secret"
    );
}

#[tokio::test]
async fn delete_removes_what_apply_created_and_the_crd_only_when_asked() {
    let api = FakeApiServer::new();
    let client = api.client();
    let v = values();
    let applied = apply(&client, &v).await.expect("applied");
    let done = erdma_k8s::install::delete(&client, &v, false)
        .await
        .expect("deleted");
    use erdma_k8s::install::Deleted;
    let deleted: Vec<_> = done
        .iter()
        .filter_map(|d| match d {
            Deleted::Deleted(x) => Some(x.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        deleted.len(),
        applied.len() - 1,
        "all but the CRD: {done:?}"
    );
    assert!(done.contains(&Deleted::Kept(
        "CustomResourceDefinition/erdmadevices.network.alibabacloud.com".into()
    )));
    assert!(
        api.get::<DaemonSet>(Some("kube-system"), "alibabacloud-erdma-agent")
            .is_none()
    );
    assert!(
        api.get::<CustomResourceDefinition>(None, "erdmadevices.network.alibabacloud.com")
            .is_some(),
        "CRD kept without include_crd"
    );
    // Again, with the CRD: everything else is already gone.
    let done = erdma_k8s::install::delete(&client, &v, true)
        .await
        .expect("deleted");
    assert!(done.contains(&Deleted::Deleted(
        "CustomResourceDefinition/erdmadevices.network.alibabacloud.com".into()
    )));
    assert!(
        done.iter()
            .filter(|d| matches!(d, Deleted::Absent(_)))
            .count()
            == applied.len() - 1
    );
    assert!(
        api.get::<CustomResourceDefinition>(None, "erdmadevices.network.alibabacloud.com")
            .is_none()
    );
}

/// `apply` reads the stored DeviceClass from the apply's answer: an API server with
/// DRAExtendedResource off (1.36 with the gate turned off) drops `extendedResourceName`, and the
/// line of the DeviceClass says so and names the gate; with the gate on it is stored.
#[tokio::test]
async fn apply_says_when_the_api_server_dropped_the_device_class_extended_resource_name() {
    use erdma_k8s::fake::FeatureGates;
    use k8s_openapi::api::resource::v1::DeviceClass;
    let api = FakeApiServer::new();
    api.set_feature_gates(
        FeatureGates::release(36)
            .unwrap()
            .with("DRAExtendedResource=false")
            .unwrap(),
    );
    let mut v = values();
    v.dra.enabled = true;
    let applied = apply(&api.client(), &v).await.expect("applied");
    let line = applied
        .iter()
        .find(|l| l.starts_with("DeviceClass/erdma.alibabacloud.com"))
        .expect("the DeviceClass");
    assert!(
        line.contains("dropped spec.extendedResourceName: feature gate DRAExtendedResource is off"),
        "{line}"
    );
    let class: DeviceClass = api.get(None, "erdma.alibabacloud.com").expect("class");
    assert_eq!(class.spec.extended_resource_name, None);
    api.set_feature_gates(FeatureGates::default());
    let applied = apply(&api.client(), &v).await.expect("applied");
    assert!(applied.contains(&"DeviceClass/erdma.alibabacloud.com".to_string()));
    let class: DeviceClass = api.get(None, "erdma.alibabacloud.com").expect("class");
    assert_eq!(
        class.spec.extended_resource_name.as_deref(),
        Some("aliyun/erdma")
    );
}

/// `apply` renders for the cluster it talks to: the fake API server says Kubernetes 1.34 and
/// serves neither ValidatingAdmissionPolicy nor ServiceMonitor, so the agent gets the
/// securityContext field (not the pre-1.30 annotation) and no node-scope policy is applied.
#[tokio::test]
async fn apply_renders_for_the_version_and_apis_the_api_server_reports() {
    use erdma_k8s::install::{Cluster, SERVICE_MONITOR, VALIDATING_ADMISSION_POLICY};
    let api = FakeApiServer::new();
    let client = api.client();
    let cluster = Cluster::discover(&client).await.expect("discovered");
    assert_eq!(cluster.version, (1, 34));
    assert!(!cluster.serves(VALIDATING_ADMISSION_POLICY) && !cluster.serves(SERVICE_MONITOR));
    let applied = apply(&client, &values()).await.expect("applied");
    assert!(
        !applied
            .iter()
            .any(|a| a.starts_with("ValidatingAdmissionPolicy")),
        "{applied:?}"
    );
    let ds: DaemonSet = api
        .get(Some("kube-system"), "alibabacloud-erdma-agent")
        .expect("agent");
    let template = ds.spec.expect("spec").template;
    let sc = template.spec.expect("pod").containers[0]
        .security_context
        .clone()
        .expect("securityContext");
    assert_eq!(sc.app_armor_profile.expect("field").type_, "Unconfined");
    let annotations = template
        .metadata
        .and_then(|m| m.annotations)
        .unwrap_or_default();
    assert!(
        !annotations
            .keys()
            .any(|k| k.starts_with("container.apparmor")),
        "{annotations:?}"
    );
}
