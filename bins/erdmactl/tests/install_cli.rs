//! `erdmactl install --dry-run`: snapshot of the rendered manifests for the main option sets,
//! every document deserialised into its k8s-openapi type, and the security-relevant fields
//! (agent capabilities, host paths, RBAC) asserted explicitly.

use assert_cmd::Command;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

fn render(args: &[&str]) -> String {
    let out = Command::cargo_bin("erdmactl")
        .unwrap()
        // No cluster: --dry-run renders without looking for another installation.
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", "/nonexistent")
        .env_remove("ERDMA_ACCESS_KEY_ID")
        .env_remove("ERDMA_ACCESS_KEY_SECRET")
        .args(["install", "--dry-run"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Splits the stream and deserialises every document into its typed k8s-openapi struct.
fn typed(yaml: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for doc in yaml.split("---\n").filter(|d| !d.trim().is_empty()) {
        let v: Value = serde_saphyr::from_str(doc).expect("YAML document");
        let kind = v["kind"].as_str().unwrap().to_string();
        let ok = match kind.as_str() {
            "Namespace" => serde_json::from_value::<Namespace>(v.clone()).map(|_| ()),
            "CustomResourceDefinition" => {
                serde_json::from_value::<CustomResourceDefinition>(v.clone()).map(|_| ())
            }
            "ServiceAccount" => serde_json::from_value::<ServiceAccount>(v.clone()).map(|_| ()),
            "ConfigMap" => serde_json::from_value::<ConfigMap>(v.clone()).map(|_| ()),
            "Secret" => serde_json::from_value::<Secret>(v.clone()).map(|_| ()),
            "ClusterRole" => serde_json::from_value::<ClusterRole>(v.clone()).map(|_| ()),
            "ClusterRoleBinding" => {
                serde_json::from_value::<ClusterRoleBinding>(v.clone()).map(|_| ())
            }
            "Role" => serde_json::from_value::<Role>(v.clone()).map(|_| ()),
            "RoleBinding" => serde_json::from_value::<RoleBinding>(v.clone()).map(|_| ()),
            "Deployment" => serde_json::from_value::<Deployment>(v.clone()).map(|_| ()),
            "DaemonSet" => serde_json::from_value::<DaemonSet>(v.clone()).map(|_| ()),
            "Service" => serde_json::from_value::<Service>(v.clone()).map(|_| ()),
            "MutatingWebhookConfiguration" => {
                serde_json::from_value::<MutatingWebhookConfiguration>(v.clone()).map(|_| ())
            }
            "PodDisruptionBudget" => {
                serde_json::from_value::<PodDisruptionBudget>(v.clone()).map(|_| ())
            }
            other => panic!("unexpected kind {other}"),
        };
        ok.unwrap_or_else(|e| panic!("{kind} does not deserialise: {e}"));
        out.push((kind, v));
    }
    out
}

fn kinds(docs: &[(String, Value)]) -> Vec<String> {
    docs.iter()
        .map(|(k, v)| format!("{k}/{}", v["metadata"]["name"].as_str().unwrap()))
        .collect()
}

fn find<'a>(docs: &'a [(String, Value)], kind: &str) -> &'a Value {
    &docs
        .iter()
        .find(|(k, _)| k == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
        .1
}

#[test]
fn default_install_with_access_key() {
    let yaml = render(&["--access-key-id", "AKID", "--access-key-secret", "SK"]);
    insta::assert_snapshot!("install_default", yaml);
    let docs = typed(&yaml);
    assert_eq!(
        kinds(&docs),
        [
            "CustomResourceDefinition/erdmadevices.network.alibabacloud.com",
            // The original chart's names for release alibaba-erdma-controller; the agent's
            // ServiceAccount and RBAC are erdma's (least privilege).
            "ServiceAccount/alibaba-erdma-controller-alibabacloud-erdma-controller",
            "ServiceAccount/alibaba-erdma-controller-agent",
            "ConfigMap/alibaba-erdma-controller",
            "Secret/alibaba-erdma-controller",
            // Empty; the controller writes its webhook certificate into it.
            "Secret/alibabacloud-erdma-controller-webhook-tls",
            "ClusterRole/alibaba-erdma-controller",
            "ClusterRoleBinding/alibaba-erdma-controller",
            "Role/alibaba-erdma-controller",
            "RoleBinding/alibaba-erdma-controller",
            "ClusterRole/alibaba-erdma-controller-agent",
            "ClusterRoleBinding/alibaba-erdma-controller-agent",
            "Deployment/alibabacloud-erdma-controller",
            "PodDisruptionBudget/alibabacloud-erdma-controller",
            "Service/alibabacloud-erdma-controller",
            "Service/alibabacloud-erdma-controller-metrics",
            "DaemonSet/alibabacloud-erdma-agent",
            "Service/alibabacloud-erdma-agent-metrics",
        ]
    );
    let ds = find(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["hostPID"], true);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    let c = &pod["containers"][0];
    assert_eq!(c["securityContext"]["privileged"], false);
    assert_eq!(
        c["securityContext"]["capabilities"]["add"],
        serde_json::json!([
            "SYS_MODULE",
            "SYS_ADMIN",
            "SYS_CHROOT",
            "SYS_PTRACE",
            "NET_ADMIN"
        ])
    );
    assert_eq!(
        c["securityContext"]["capabilities"]["drop"],
        serde_json::json!(["NET_RAW"])
    );
    // (host path, type, mount path, read-only, propagation) of every volume.
    let mounts = c["volumeMounts"].as_array().unwrap();
    let paths: Vec<(&str, &str, &str, bool, &str)> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .zip(mounts)
        .map(|(v, m)| {
            assert_eq!(v["name"], m["name"]);
            (
                v["hostPath"]["path"].as_str().unwrap(),
                v["hostPath"]["type"].as_str().unwrap(),
                m["mountPath"].as_str().unwrap(),
                m["readOnly"].as_bool().unwrap(),
                m["mountPropagation"].as_str().unwrap_or("None"),
            )
        })
        .collect();
    assert_eq!(
        paths,
        [
            (
                "/var/lib/kubelet/device-plugins",
                "DirectoryOrCreate",
                "/var/lib/kubelet/device-plugins",
                false,
                "None"
            ),
            (
                "/var/lib/kubelet/pod-resources",
                "DirectoryOrCreate",
                "/var/lib/kubelet/pod-resources",
                true,
                "None"
            ),
            ("/dev", "Directory", "/host/dev", true, "None"),
            (
                "/var/run/nri",
                "DirectoryOrCreate",
                "/var/run/nri",
                true,
                "None"
            ),
            (
                "/run/containerd",
                "DirectoryOrCreate",
                "/run/containerd",
                true,
                "None"
            ),
            (
                "/var/run/netns",
                "DirectoryOrCreate",
                "/var/run/netns",
                true,
                "HostToContainer"
            ),
            ("/sys/fs/bpf", "Directory", "/sys/fs/bpf", false, "None"),
        ]
    );
    // Probes on the agent's /healthz, on the port --metrics-addr names.
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["httpGet"]["path"], "/healthz", "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    assert_eq!(c["ports"][0]["name"], "metrics");
    assert_eq!(c["ports"][0]["containerPort"], 9101);
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--jumbo-frame-mtu=8500"));
    assert!(
        args.contains(&"--deviceplugin-prestart-container"),
        "no webhook: PreStart mode"
    );
    assert_eq!(
        c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    // The webhook Service: headless as the original's; selects only controller pods.
    let svc = find(&docs, "Service");
    assert_eq!(svc["spec"]["selector"]["tier"], "controller");
    assert_eq!(svc["spec"]["clusterIP"], "None");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "webhook");
    // The original's selectors (immutable), so that an upgrade keeps the workloads.
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        serde_json::json!({"app.kubernetes.io/name": "alibabacloud-erdma-controller",
            "app.kubernetes.io/instance": "alibaba-erdma-controller", "tier": "agent"})
    );
    // Controller hardening.
    let dep = find(&docs, "Deployment");
    let sc = &dep["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    assert_eq!(
        (
            sc["runAsNonRoot"].clone(),
            sc["readOnlyRootFilesystem"].clone()
        ),
        (Value::Bool(true), Value::Bool(true))
    );
    assert_eq!(dep["spec"]["replicas"], 2);
    let cfg: Value = serde_json::from_str(
        find(&docs, "ConfigMap")["data"]["config.json"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(cfg["enableWebhook"], false);
    assert_eq!(cfg["controllerNamespace"], "kube-system");
}

#[test]
fn webhook_rrsa_and_node_selection() {
    let yaml = render(&[
        "--enable-webhook",
        "--credentials-type",
        "oidc_role_arn",
        "--rrsa-role-name",
        "erdma-role",
        "--node-selector",
        "aliyun.accelerator/erdma=true",
        "--toleration",
        "gpu=true:NoSchedule",
        "--prefer-driver",
        "compat",
        "--allocate-all-devices",
        "--jumbo-frame-mtu",
        "9000",
        "--smc-init-image",
        "registry.example/smcr_init:v2",
        "-n",
        "erdma-system",
    ]);
    insta::assert_snapshot!("install_webhook_rrsa", yaml);
    let docs = typed(&yaml);
    assert_eq!(docs[0].0, "Namespace");
    let mwc = find(&docs, "MutatingWebhookConfiguration");
    let w = &mwc["webhooks"][0];
    assert_eq!(w["failurePolicy"], "Ignore");
    // At most 5 s: every pod creation in scope waits for the webhook.
    assert_eq!(w["timeoutSeconds"], 5);
    assert_eq!(w["sideEffects"], "None");
    assert_eq!(w["clientConfig"]["service"]["path"], "/mutating");
    assert_eq!(w["clientConfig"]["service"]["namespace"], "erdma-system");
    assert_eq!(w["rules"][0]["operations"], serde_json::json!(["CREATE"]));
    let sa = &docs
        .iter()
        .find(|(k, v)| {
            k == "ServiceAccount"
                && v["metadata"]["name"] == "alibaba-erdma-controller-alibabacloud-erdma-controller"
        })
        .unwrap()
        .1;
    assert_eq!(
        sa["metadata"]["annotations"]["pod-identity.alibabacloud.com/role-name"],
        "erdma-role"
    );
    let ds = find(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["aliyun.accelerator/erdma"], "true");
    assert_eq!(pod["tolerations"][0]["effect"], "NoSchedule");
    let args: Vec<&str> = pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args,
        [
            "--prefer-driver=compat",
            "--allocate-all-devices",
            "--jumbo-frame-mtu=9000",
            "--deviceplugin-prestart-container",
            "--dev-root=/host/dev",
            "--metrics-addr=0.0.0.0:9101"
        ]
    );
    // With the webhook too, the agent does SMC-R (the injected smcr-init is unprivileged and
    // only checks): the CRI socket's directory, the host's netns and bpffs.
    let paths: Vec<&str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["hostPath"]["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "/var/lib/kubelet/device-plugins",
            "/var/lib/kubelet/pod-resources",
            "/dev",
            "/var/run/nri",
            "/run/containerd",
            "/var/run/netns",
            "/sys/fs/bpf"
        ]
    );
    let cfg: Value = serde_json::from_str(
        find(&docs, "ConfigMap")["data"]["config.json"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(cfg["smcInitImage"], "registry.example/smcr_init:v2");
    assert_eq!(cfg["nodeSelector"]["aliyun.accelerator/erdma"], "true");
}

#[test]
fn local_discovery_needs_no_cloud_and_no_controller() {
    let yaml = render(&[
        "--local-eri-discovery",
        "--exposed-local-eris",
        "i-* erdma_0,i-bp1 erdma_0/erdma_1",
    ]);
    insta::assert_snapshot!("install_local", yaml);
    let docs = typed(&yaml);
    assert!(
        !docs.iter().any(|(k, _)| k == "Deployment"
            || k == "Secret"
            || k == "MutatingWebhookConfiguration")
    );
    let ds = find(&docs, "DaemonSet");
    let args: Vec<&str> = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--local-eri-discovery"));
    assert!(args.contains(&"--exposed-local-eris=i-* erdma_0,i-bp1 erdma_0/erdma_1"));
}

#[test]
fn json_output_is_a_list_of_the_same_objects() {
    let json = render(&["-o", "json", "--credentials-type", "ecs_ram_role"]);
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["kind"], "List");
    // With the webhook certificate's empty Secret (the controller may not create Secrets) and
    // the controller's PodDisruptionBudget (two replicas).
    assert_eq!(v["items"].as_array().unwrap().len(), 18);
}

/// The driver installer's version, pins and mirror reach the agent under the agent's own flag names.
#[test]
fn driver_installer_flags_reach_the_agent() {
    let pin = "0123456789abcdef".repeat(4);
    let docs = typed(&render(&[
        "--local-eri-discovery",
        "--erdma-installer-version",
        "1.6.0",
        "--driver-installer-sha256",
        &pin,
        "--driver-installer-base-url",
        "http://10.0.0.1/erdma",
        "--allow-insecure-driver-download",
    ]));
    let ds = find(&docs, "DaemonSet");
    let args: Vec<&str> = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for want in [
        "--erdma-installer-version=1.6.0".to_string(),
        format!("--driver-installer-sha256={pin}"),
        "--driver-installer-base-url=http://10.0.0.1/erdma".into(),
        "--allow-insecure-driver-download".into(),
    ] {
        assert!(args.contains(&want.as_str()), "{want} in {args:?}");
    }
    assert!(!args.iter().any(|a| a.starts_with("--gpu-installer-sha256")));
}

#[test]
fn values_file_in_chart_format_and_bad_values_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("values.yaml");
    std::fs::write(&f, "agent:\n  preferDriver: ofed\n  jumboFrameMTU: 8000\nconfig:\n  enableWebhook: true\ncredentials:\n  type: ram_role_sts\n").unwrap();
    let docs = typed(&render(&["-f", f.to_str().unwrap()]));
    assert!(
        docs.iter()
            .any(|(k, v)| k == "Role"
                && v["metadata"]["name"] == "alibaba-erdma-controller-sts-token")
    );
    assert!(
        docs.iter()
            .any(|(k, _)| k == "MutatingWebhookConfiguration")
    );

    // Missing credentials: rendered anyway, with a warning naming what is missing.
    for (args, needle) in [
        (vec!["--credentials-type", "access_key"], "accessKeyID"),
        (vec!["--credentials-type", "oidc_role_arn"], "role-name"),
    ] {
        let out = Command::cargo_bin("erdmactl")
            .unwrap()
            // No cluster: --dry-run renders without looking for another installation.
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("HOME", "/nonexistent")
            .env_remove("ERDMA_ACCESS_KEY_ID")
            .env_remove("ERDMA_ACCESS_KEY_SECRET")
            .args(["install", "--dry-run"])
            .args(&args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("warning") && err.contains(needle),
            "{args:?}: {err}"
        );
        assert!(!typed(&String::from_utf8_lossy(&out.stdout)).is_empty());
    }

    for (args, needle) in [
        (vec!["--prefer-driver", "fast"], "agent.preferDriver"),
        (
            vec!["--local-eri-discovery", "--exposed-local-eris", "erdma_0"],
            "exposedLocalERIs",
        ),
        (
            vec!["--agent-image", "registry.aliyuncs.com/erdma/agent:v1.0.0"],
            "Go image",
        ),
        (
            vec!["--driver-installer-sha256", "deadbeef"],
            "agent.driverInstaller.sha256",
        ),
        (
            vec!["--driver-installer-base-url", "http://10.0.0.1/erdma"],
            "agent.driverInstaller.baseURL",
        ),
    ] {
        let out = Command::cargo_bin("erdmactl")
            .unwrap()
            // No cluster: --dry-run renders without looking for another installation.
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("HOME", "/nonexistent")
            .env_remove("ERDMA_ACCESS_KEY_ID")
            .env_remove("ERDMA_ACCESS_KEY_SECRET")
            .args(["install", "--dry-run"])
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// `agent.criSocket` (k3s, CRI-O): passed as --cri-socket and only its directory is mounted; a
/// socket directly in /run is refused (mounting /run would put the ServiceAccount token mount point into the host's /run).
#[test]
fn cri_socket_value_mounts_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("values.yaml");
    std::fs::write(
        &f,
        "agent:\n  criSocket: /run/k3s/containerd/containerd.sock\nconfig:\n  localERIDiscovery: true\n",
    )
    .unwrap();
    let docs = typed(&render(&["-f", f.to_str().unwrap()]));
    let pod = &find(&docs, "DaemonSet")["spec"]["template"]["spec"];
    let args = pod["containers"][0]["args"].as_array().unwrap();
    assert!(args.contains(&Value::from(
        "--cri-socket=/run/k3s/containerd/containerd.sock"
    )));
    let cri = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "cri-socket")
        .unwrap();
    assert_eq!(cri["hostPath"]["path"], "/run/k3s/containerd");
    assert_eq!(cri["hostPath"]["type"], "Directory");
    for bad in ["/var/run/cri-dockerd.sock", "run/crio/crio.sock"] {
        std::fs::write(
            &f,
            format!("agent:\n  criSocket: {bad}\nconfig:\n  localERIDiscovery: true\n"),
        )
        .unwrap();
        let out = Command::cargo_bin("erdmactl")
            .unwrap()
            // No cluster: --dry-run renders without looking for another installation.
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("HOME", "/nonexistent")
            .env_remove("ERDMA_ACCESS_KEY_ID")
            .env_remove("ERDMA_ACCESS_KEY_SECRET")
            .args(["install", "--dry-run", "-f", f.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("agent.criSocket") && err.contains(bad),
            "{bad}: {err}"
        );
    }
}

/// `erdmactl uninstall --dry-run` lists exactly what `install` renders, CRD kept unless asked.
#[test]
fn uninstall_lists_what_install_created() {
    let installed = kinds(&typed(&render(&["--credentials-type", "ecs_ram_role"])));
    let run = |extra: &[&str]| {
        let out = Command::cargo_bin("erdmactl")
            .unwrap()
            // No cluster: --dry-run renders without looking for another installation.
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("HOME", "/nonexistent")
            .args(["uninstall", "--dry-run"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("values.yaml");
    std::fs::write(&f, "credentials:\n  type: ecs_ram_role\n").unwrap();
    let listed = run(&["-f", f.to_str().unwrap()]);
    let mut deleted: Vec<String> = listed
        .lines()
        .filter_map(|l| l.strip_prefix("delete "))
        .map(str::to_string)
        .collect();
    deleted.reverse();
    let mut expected = installed.clone();
    expected.retain(|k| !k.starts_with("CustomResourceDefinition/"));
    assert_eq!(deleted, expected);
    assert!(listed.contains("keep CustomResourceDefinition/erdmadevices.network.alibabacloud.com"));
    let with_crd = run(&["-f", f.to_str().unwrap(), "--include-crd"]);
    assert!(
        with_crd.contains("delete CustomResourceDefinition/erdmadevices.network.alibabacloud.com")
    );
}

/// The original's smcr_init image named in a values file (the chart CI's fixture): config.json
/// gets erdma's smcr-init image at this version, with a note saying so.
#[test]
fn the_original_smcr_init_image_is_replaced_with_a_note() {
    let f = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/helm/ci/values/original-smcr-init.yaml"
    );
    let out = Command::cargo_bin("erdmactl")
        .unwrap()
        // No cluster: --dry-run renders without looking for another installation.
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", "/nonexistent")
        .args(["install", "--dry-run", "-o", "json", "-f", f])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let erdma = format!("ghcr.io/erdma/smcr-init:{}", env!("CARGO_PKG_VERSION"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("note: config.smcInitImage registry.cn-hangzhou.aliyuncs.com/erdma/smcr_init:latest is the original chart's smcr_init image; erdma's {erdma} runs instead")),
        "{err}"
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cm = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "ConfigMap")
        .expect("ConfigMap");
    let cfg: serde_json::Value =
        serde_json::from_str(cm["data"]["config.json"].as_str().unwrap()).unwrap();
    assert_eq!(cfg["smcInitImage"], erdma.as_str());
    // An image of the user's own is kept, without a note.
    let out = Command::cargo_bin("erdmactl")
        .unwrap()
        // No cluster: --dry-run renders without looking for another installation.
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", "/nonexistent")
        .args([
            "install",
            "--dry-run",
            "-f",
            f,
            "--smc-init-image",
            "registry.example/erdma/smcr-init:dev",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("smcr_init image"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("registry.example/erdma/smcr-init:dev"));
}

/// The original chart's values.yaml (the chart CI's fixture) renders with erdma's images, a note
/// about the replaced Go image and a warning naming the missing access key.
#[test]
fn the_original_values_file_renders_with_notes() {
    let f = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/helm/ci/values/original.yaml"
    );
    let out = Command::cargo_bin("erdmactl")
        .unwrap()
        // No cluster: --dry-run renders without looking for another installation.
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", "/nonexistent")
        .env_remove("ERDMA_ACCESS_KEY_ID")
        .env_remove("ERDMA_ACCESS_KEY_SECRET")
        .args(["install", "--dry-run", "-f", f])
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("note: agent.image is the original chart's default Go image"),
        "{err}"
    );
    assert!(
        err.contains("warning") && err.contains("accessKeyID"),
        "{err}"
    );
    let docs = typed(&String::from_utf8_lossy(&out.stdout));
    let ds = find(&docs, "DaemonSet");
    let image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap();
    assert!(image.starts_with("ghcr.io/erdma/erdma-agent:"), "{image}");
}

/// `erdmactl install --dry-run -f FILE` gives Helm's verdict on the same file (recorded by the
/// chart CI with the real Helm engine in deploy/helm/ci/contract.json): the original chart's
/// values, a typo (named, with the key meant), every convention key, and the rest of the corpus.
#[test]
fn dry_run_accepts_and_refuses_the_files_helm_does() {
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm");
    let raw = std::fs::read_to_string(chart.join("ci/contract.json")).expect("contract.json");
    let entries: Vec<Value> = serde_json::from_str(&raw).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut seen = Vec::new();
    for e in &entries {
        let name = e["name"].as_str().unwrap();
        let file = dir.path().join("values.json");
        std::fs::write(&file, serde_json::to_string(&e["values"]).unwrap()).unwrap();
        let out = Command::cargo_bin("erdmactl")
            .unwrap()
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("HOME", "/nonexistent")
            .args(["install", "--dry-run", "-f", file.to_str().unwrap()])
            .output()
            .unwrap();
        let helm_accepts = e["helm"] == "accepted";
        assert_eq!(
            out.status.success(),
            helm_accepts,
            "{name}: Helm {} ({}), erdmactl exit {:?}: {}",
            e["helm"],
            e["error"],
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        if !helm_accepts {
            assert_eq!(out.status.code(), Some(2), "{name}");
        }
        if name == "contract/typo.yaml" {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("agent.preferDrvier: unknown key; did you mean agent.preferDriver?"),
                "{err}"
            );
        }
        seen.push(name.to_string());
    }
    for must in [
        "values/original.yaml",
        "contract/typo.yaml",
        "values/conventions.yaml",
    ] {
        assert!(seen.iter().any(|s| s == must), "{must} not in the contract");
    }
}
