//! The Helm chart (`deploy/helm`) as the real Helm engine renders it: `deploy/helm/ci/check.sh`
//! renders every values file of `deploy/helm/ci/values/` into `deploy/helm/ci/rendered/<case>.json`
//! (committed; the script fails when a fresh render differs). Here every rendered object must
//! deserialise into its k8s-openapi type without losing a field, and `erdma_k8s::install::render`
//! (what `erdmactl install` applies) must produce the same objects for the same values file.

use erdma_k8s::install::{Cluster, VALIDATING_ADMISSION_POLICY, Values, render, render_for};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm")
}

struct Case {
    name: String,
    values: String,
    objects: Vec<Value>,
    notes: String,
}

fn cases() -> Vec<Case> {
    let dir = chart_dir().join("ci/rendered");
    let mut out = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    for p in paths {
        let raw = std::fs::read_to_string(&p).expect("rendered case");
        let v: Value = serde_json::from_str(&raw).expect("rendered case is JSON");
        let values_file = v["values"].as_str().expect("values name").to_string();
        let values = std::fs::read_to_string(chart_dir().join("ci/values").join(&values_file))
            .expect("values file of the case");
        out.push(Case {
            name: values_file,
            values,
            objects: v["objects"].as_array().expect("objects").clone(),
            notes: v["notes"].as_str().unwrap_or_default().to_string(),
        });
    }
    assert!(
        out.len() >= 10,
        "the render matrix is missing; run deploy/helm/ci/check.sh --update"
    );
    out
}

/// Drops JSON nulls and empty objects the typed round trip cannot keep apart from absent ones,
/// and writes whole floats as integers (a CRD schema's `maximum: 255` is an `f64` in its type).
fn prune(v: &Value) -> Value {
    match v {
        Value::Number(n)
            if n.is_f64()
                && n.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.abs() < 9.0e15) =>
        {
            Value::from(n.as_f64().unwrap_or_default() as i64)
        }
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, x)| !x.is_null())
                .map(|(k, x)| (k.clone(), prune(x)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(prune).collect()),
        x => x.clone(),
    }
}

fn round_trip<T: DeserializeOwned + Serialize>(case: &str, obj: &Value) {
    let typed: T = serde_json::from_value(obj.clone()).unwrap_or_else(|e| {
        panic!(
            "{case}: {} {} does not deserialise: {e}",
            obj["kind"], obj["metadata"]["name"]
        )
    });
    let back = prune(&serde_json::to_value(&typed).expect("serialise"));
    assert_eq!(
        back,
        prune(obj),
        "{case}: {} {} loses or changes fields in its k8s-openapi type (a misspelt or misplaced field)",
        obj["kind"],
        obj["metadata"]["name"]
    );
}

#[test]
fn every_rendered_object_deserialises_into_its_k8s_openapi_type() {
    let mut n = 0;
    for case in cases() {
        for obj in &case.objects {
            let c = case.name.as_str();
            match obj["kind"].as_str().unwrap_or_default() {
                "CustomResourceDefinition" => round_trip::<CustomResourceDefinition>(c, obj),
                "ServiceAccount" => round_trip::<ServiceAccount>(c, obj),
                "ConfigMap" => round_trip::<ConfigMap>(c, obj),
                "Secret" => round_trip::<Secret>(c, obj),
                "ClusterRole" => round_trip::<ClusterRole>(c, obj),
                "DeviceClass" => round_trip::<DeviceClass>(c, obj),
                "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>(c, obj),
                "Role" => round_trip::<Role>(c, obj),
                "RoleBinding" => round_trip::<RoleBinding>(c, obj),
                "Deployment" => round_trip::<Deployment>(c, obj),
                "DaemonSet" => round_trip::<DaemonSet>(c, obj),
                "Service" => round_trip::<Service>(c, obj),
                "Namespace" => round_trip::<Namespace>(c, obj),
                "Pod" => round_trip::<Pod>(c, obj),
                "MutatingWebhookConfiguration" => {
                    round_trip::<MutatingWebhookConfiguration>(c, obj)
                }
                "PodDisruptionBudget" => round_trip::<PodDisruptionBudget>(c, obj),
                // The Prometheus Operator's CRD (no k8s-openapi type): its required shape.
                "ServiceMonitor" => {
                    assert_eq!(obj["apiVersion"], "monitoring.coreos.com/v1", "{c}");
                    let ep = &obj["spec"]["endpoints"][0];
                    assert!(
                        ep["port"].is_string() && ep["path"] == "/metrics",
                        "{c}: {obj}"
                    );
                    assert!(
                        obj["spec"]["selector"]["matchLabels"]["tier"].is_string(),
                        "{c}: a ServiceMonitor selects one tier's metrics Service: {obj}"
                    );
                }
                other => panic!("{c}: unexpected kind {other} in the chart"),
            }
            n += 1;
        }
    }
    assert!(n > 100, "only {n} objects checked");
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

fn agent_args(objects: &[Value]) -> Vec<String> {
    let ds = find(objects, "DaemonSet", "alibabacloud-erdma-agent").expect("agent DaemonSet");
    let ds: DaemonSet = serde_json::from_value(ds.clone()).expect("DaemonSet");
    let pod = ds.spec.expect("spec").template.spec.expect("pod spec");
    pod.containers[0].args.clone().unwrap_or_default()
}

#[test]
fn the_original_values_file_renders_an_erdma_install_that_serves_devices_in_cluster_mode() {
    let all = cases();
    let case = all
        .iter()
        .find(|c| c.name == "original.yaml")
        .expect("original case");
    let args = agent_args(&case.objects);
    // Cluster mode: the placeholder allow-list of the original's values.yaml is not passed (the
    // original applied it only with local discovery), so the agent serves its ERdmaDevice's ERIs.
    assert!(
        !args.iter().any(|a| a.starts_with("--exposed-local-eris")),
        "{args:?}"
    );
    assert!(!args.iter().any(|a| a == "--local-eri-discovery"));
    assert!(args.contains(&"--jumbo-frame-mtu=8500".to_string()));
    // erdma's images, never the Go ones with erdma's flags.
    for (kind, name) in [
        ("DaemonSet", "alibabacloud-erdma-agent"),
        ("Deployment", "alibabacloud-erdma-controller"),
    ] {
        let o = find(&case.objects, kind, name).expect("workload");
        let image = o["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .expect("image");
        assert!(image.starts_with("ghcr.io/erdma/erdma-"), "{image}");
        assert!(
            image.ends_with(&format!(":{}", env!("CARGO_PKG_VERSION"))),
            "{image}"
        );
    }
    assert!(
        case.notes.contains("original chart's default Go image"),
        "{}",
        case.notes
    );
    assert!(
        case.notes.contains("credentials.accessKeyID"),
        "missing credentials are named: {}",
        case.notes
    );
}

#[test]
fn local_discovery_applies_exposed_local_eris_and_jumbo_mtu_zero_omits_the_flag() {
    let all = cases();
    let local = all.iter().find(|c| c.name == "local.yaml").expect("local");
    assert!(
        agent_args(&local.objects)
            .contains(&"--exposed-local-eris=i-* erdma_0,i-abc erdma_1/erdma_2".to_string())
    );
    assert!(
        find(
            &local.objects,
            "Deployment",
            "alibabacloud-erdma-controller"
        )
        .is_none()
    );
    let placement = all
        .iter()
        .find(|c| c.name == "placement.yaml")
        .expect("placement");
    let args = agent_args(&placement.objects);
    assert!(
        !args.iter().any(|a| a.starts_with("--jumbo-frame-mtu")),
        "{args:?}"
    );
    assert!(args.contains(&"--cri-socket=/run/k3s/containerd/containerd.sock".to_string()));
}

fn chart_app_version() -> String {
    let chart = std::fs::read_to_string(chart_dir().join("Chart.yaml")).expect("Chart.yaml");
    chart
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .map(|v| v.trim().trim_matches('"').to_string())
        .expect("appVersion in Chart.yaml")
}

fn config_json(objects: &[Value]) -> Value {
    let cm = find(objects, "ConfigMap", "alibaba-erdma-controller").expect("controller ConfigMap");
    let raw = cm["data"]["config.json"].as_str().expect("config.json");
    serde_json::from_str(raw).expect("config.json is JSON")
}

/// The lab's `chart` scenario runs this DaemonSet on rxe devices: its own flags come last, after
/// every flag the chart sets, and none of them is one the chart sets too (the agent refuses a
/// repeated one-value flag).
#[test]
fn the_lab_case_runs_the_agent_on_rxe_with_its_extra_args_last() {
    let all = cases();
    let lab = all.iter().find(|c| c.name == "lab.yaml").expect("lab case");
    let args = agent_args(&lab.objects);
    let extra = [
        "--rdma-driver=rxe",
        "--prefer-driver=none",
        "--instance-id=i-lab",
    ];
    assert_eq!(&args[args.len() - 3..], extra, "{args:?}");
    let chart_own = &args[..args.len() - 3];
    assert_eq!(
        chart_own.last().map(String::as_str),
        Some("--metrics-addr=0.0.0.0:9101"),
        "{args:?}"
    );
    assert!(chart_own.contains(&"--local-eri-discovery".to_string()));
    // An empty allow-list: no --exposed-local-eris at all (every rxe device is served).
    assert!(
        !args.iter().any(|a| a.starts_with("--exposed-local-eris")),
        "{args:?}"
    );
    for flag in ["--rdma-driver", "--prefer-driver", "--instance-id"] {
        assert!(
            !chart_own.iter().any(|a| a.split('=').next() == Some(flag)),
            "{flag} is set by the chart too: {args:?}"
        );
    }
    let ds = find(&lab.objects, "DaemonSet", "alibabacloud-erdma-agent").expect("agent");
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    assert_eq!(
        c["image"],
        format!("ghcr.io/erdma/erdma-agent:{}", chart_app_version())
    );
    assert!(
        find(&lab.objects, "Deployment", "alibabacloud-erdma-controller").is_none(),
        "no controller in the lab (local discovery, no webhook)"
    );
    assert!(!lab.notes.contains("WARNING"), "{}", lab.notes);
}

/// What the controller injects is visible in what the chart deploys: erdma's smcr-init image at
/// the chart's appVersion, also for the original's smcr_init image named in a copied values file.
#[test]
fn config_json_names_erdmas_smcr_init_image_pinned_to_the_app_version() {
    let want = format!("ghcr.io/erdma/smcr-init:{}", chart_app_version());
    let all = cases();
    let mut seen = 0;
    for case in &all {
        if find(&case.objects, "ConfigMap", "alibaba-erdma-controller").is_none() {
            continue;
        }
        let cfg = config_json(&case.objects);
        assert_eq!(cfg["smcInitImage"], want.as_str(), "{}", case.name);
        seen += 1;
    }
    assert!(seen >= 10, "only {seen} cases render config.json");
    let orig = all
        .iter()
        .find(|c| c.name == "original-smcr-init.yaml")
        .expect("original-smcr-init case");
    assert!(
        orig.values
            .contains("registry.cn-hangzhou.aliyuncs.com/erdma/smcr_init:latest"),
        "the case names the original's image"
    );
    assert!(
        orig.notes.contains(&format!(
            "NOTE: config.smcInitImage registry.cn-hangzhou.aliyuncs.com/erdma/smcr_init:latest is the original chart's smcr_init image; erdma's {want} runs instead."
        )),
        "{}",
        orig.notes
    );
}

#[test]
fn chart_crd_and_app_version_follow_the_workspace() {
    let chart_crd = std::fs::read_to_string(chart_dir().join("files/erdmadevices.yaml"))
        .expect("chart CRD file");
    let crd = std::fs::read_to_string(
        chart_dir().join("../crds/network.alibabacloud.com_erdmadevices.yaml"),
    )
    .expect("deploy/crds");
    assert_eq!(
        chart_crd, crd,
        "deploy/helm/files/erdmadevices.yaml must equal deploy/crds/ (copy it after regenerating)"
    );
    let chart = std::fs::read_to_string(chart_dir().join("Chart.yaml")).expect("Chart.yaml");
    let app = chart
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .map(|v| v.trim().trim_matches('"').to_string());
    assert_eq!(app.as_deref(), Some(env!("CARGO_PKG_VERSION")));
}

/// Labels that differ by installer on purpose (`helm.sh/chart`, `managed-by`).
fn normalise(obj: &Value) -> Value {
    let mut o = prune(obj);
    if let Some(labels) = o
        .get_mut("metadata")
        .and_then(|m| m.get_mut("labels"))
        .and_then(Value::as_object_mut)
    {
        labels.remove("helm.sh/chart");
        labels.remove("app.kubernetes.io/managed-by");
    }
    if o["kind"] == "ConfigMap"
        && let Some(data) = o.get_mut("data").and_then(Value::as_object_mut)
    {
        for v in data.values_mut() {
            if let Some(s) = v.as_str()
                && let Ok(j) = serde_json::from_str::<Value>(s)
            {
                *v = j;
            }
        }
    }
    o
}

#[test]
fn erdmactl_install_renders_the_same_objects_as_the_chart() {
    for case in cases() {
        let mut v =
            Values::from_values_file(&case.values).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        v.name = "alibaba-erdma-controller".into();
        v.namespace = "kube-system".into();
        let mine = render(&v).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let key = |o: &Value| {
            format!(
                "{}/{}/{}",
                o["kind"].as_str().unwrap_or_default(),
                o["metadata"]["namespace"].as_str().unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or_default()
            )
        };
        // `helm test` hooks are the chart's own (erdmactl install applies no hooks).
        let mut a: Vec<_> = case
            .objects
            .iter()
            .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"].is_null())
            .map(|o| (key(o), normalise(o)))
            .collect();
        let mut b: Vec<_> = mine.iter().map(|o| (key(o), normalise(o))).collect();
        a.sort_by(|x, y| x.0.cmp(&y.0));
        b.sort_by(|x, y| x.0.cmp(&y.0));
        let ka: Vec<_> = a.iter().map(|x| &x.0).collect();
        let kb: Vec<_> = b.iter().map(|x| &x.0).collect();
        assert_eq!(ka, kb, "{}: chart vs erdmactl objects", case.name);
        for ((k, x), (_, y)) in a.iter().zip(&b) {
            assert_eq!(
                x,
                y,
                "{}: {k} differs (left: chart, right: erdmactl)\nchart:    {}\nerdmactl: {}",
                case.name,
                serde_json::to_string(x).unwrap_or_default(),
                serde_json::to_string(y).unwrap_or_default()
            );
        }
    }
}

#[test]
fn the_chart_notes_and_erdmactl_warn_about_the_same_things() {
    let mut warned = 0;
    for case in cases() {
        let v = Values::from_values_file(&case.values).expect("values");
        let w = v.warnings();
        for x in &w {
            assert!(
                case.notes.contains(&format!("WARNING: {x}.")),
                "{}: the chart's NOTES.txt lacks erdmactl's warning {x:?}:\n{}",
                case.name,
                case.notes
            );
        }
        assert_eq!(
            case.notes.matches("WARNING:").count(),
            w.len(),
            "{}: {}",
            case.name,
            case.notes
        );
        warned += w.len();
    }
    assert!(warned >= 3, "the matrix exercises the warnings");
}

/// `helm install -f` (the real Helm engine, recorded by deploy/helm/ci/check.py in
/// ci/contract.json) and `erdmactl install -f` accept and refuse the same values files.
#[test]
fn erdmactl_and_helm_accept_and_refuse_the_same_values_files() {
    let path = chart_dir().join("ci/contract.json");
    let raw = std::fs::read_to_string(&path)
        .expect("ci/contract.json (deploy/helm/ci/check.sh --update)");
    let entries: Vec<Value> = serde_json::from_str(&raw).expect("contract is JSON");
    assert!(entries.len() >= 40, "only {} values files", entries.len());
    let (mut accepted, mut refused) = (0, 0);
    for e in &entries {
        let name = e["name"].as_str().unwrap_or_default();
        let text = serde_json::to_string(&e["values"]).expect("values");
        let mine = Values::from_values_file(&text).and_then(|v| v.validate().map(|()| v));
        match (e["helm"].as_str(), &mine) {
            (Some("accepted"), Ok(_)) => accepted += 1,
            (Some("refused"), Err(_)) => refused += 1,
            (helm, mine) => panic!(
                "{name}: Helm {helm:?} ({}) but erdmactl {mine:?}",
                e["error"].as_str().unwrap_or_default()
            ),
        }
    }
    assert!(
        accepted >= 20 && refused >= 20,
        "{accepted} accepted, {refused} refused"
    );
}

/// CEL ignores whitespace outside string literals, and the chart folds its long expressions over
/// lines: runs of whitespace in `expression` and `messageExpression` compare as one space.
fn fold_cel(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| match (k.as_str(), x) {
                    ("expression" | "messageExpression", Value::String(s)) => (
                        k.clone(),
                        Value::String(s.split_whitespace().collect::<Vec<_>>().join(" ")),
                    ),
                    _ => (k.clone(), fold_cel(x)),
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(fold_cel).collect()),
        x => x.clone(),
    }
}

/// The agents' node-scope policy as Helm renders it for a 1.30 cluster serving
/// ValidatingAdmissionPolicy (`deploy/helm/ci/agent-admission-policy.json`, kept by check.sh) is
/// what `erdmactl install` applies to such a cluster; with the kind not served (an offline
/// render, as `helm template`) or the value off, neither renders one.
#[test]
fn erdmactl_install_renders_the_charts_node_scope_policy_where_the_cluster_serves_it() {
    let path = chart_dir().join("ci/agent-admission-policy.json");
    let raw = std::fs::read_to_string(&path).expect("ci/agent-admission-policy.json");
    let chart: Value = serde_json::from_str(&raw).expect("JSON");
    let chart = chart["objects"].as_array().expect("objects");
    let kinds = [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    for o in chart {
        match o["kind"].as_str().unwrap_or_default() {
            "ValidatingAdmissionPolicy" => round_trip::<ValidatingAdmissionPolicy>("policy", o),
            "ValidatingAdmissionPolicyBinding" => {
                round_trip::<ValidatingAdmissionPolicyBinding>("policy", o)
            }
            other => panic!("unexpected kind {other} in {}", path.display()),
        }
    }
    let cluster = Cluster::with((1, 30), &[VALIDATING_ADMISSION_POLICY]);
    let v = Values::default();
    let mine: Vec<Value> = render_for(&v, &cluster)
        .expect("render")
        .into_iter()
        .filter(|o| kinds.contains(&o["kind"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(mine.len(), 2, "a policy and its binding: {mine:?}");
    for (x, y) in chart.iter().zip(&mine) {
        assert_eq!(
            fold_cel(&normalise(x)),
            fold_cel(&normalise(y)),
            "{} differs (left: chart, right: erdmactl)",
            x["kind"]
        );
    }
    let off = Values {
        agent: erdma_k8s::install::AgentValues {
            admission_policy: erdma_k8s::install::AdmissionPolicyValues { enabled: false },
            ..Default::default()
        },
        ..Default::default()
    };
    for (values, cluster) in [(&v, Cluster::offline()), (&off, cluster)] {
        let kinds_rendered: Vec<Value> = render_for(values, &cluster)
            .expect("render")
            .into_iter()
            .filter(|o| kinds.contains(&o["kind"].as_str().unwrap_or_default()))
            .collect();
        assert!(kinds_rendered.is_empty(), "{cluster:?}: {kinds_rendered:?}");
    }
    assert!(
        render(&v)
            .expect("render")
            .iter()
            .all(|o| !kinds.contains(&o["kind"].as_str().unwrap_or_default()))
    );
}
