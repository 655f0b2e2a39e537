//! The chart's node-scope admission policy for the agents
//! (`deploy/helm/templates/agent-admission-policy.yaml`, as the real Helm engine renders it into
//! `deploy/helm/ci/agent-admission-policy.json` for a cluster serving ValidatingAdmissionPolicy;
//! `deploy/helm/ci/check.sh` keeps that file equal to the render).
//!
//! The policy's CEL (match conditions, variables in order, validations and their message
//! expressions) is evaluated by cel-rust, a third-party CEL engine, not by the API server. The
//! admission requests are built from the agent's own writes: the agent's code runs against
//! `erdma_k8s::fake::FakeApiServer`, and each object it changed is taken from the server's store
//! before and after the step (`oldObject`, `object`), with the subresource the agent's request
//! named. Only standard CEL is used by the policy (no Kubernetes library functions), so both
//! engines read it alike.

use erdma_agent::cluster::Cluster;
use erdma_agent::plugin_resource::{Retirer, Step};
use erdma_agent::resource_api;
use erdma_driver::{DriverStatus, RunningMode, StatusCode};
use erdma_k8s::fake::FakeApiServer;
use erdma_k8s::install::Values;
use erdma_k8s::rbac::service_account_user;
use erdma_k8s::{DeviceInfo, ERdmaDevice, ERdmaDeviceSpec};
use erdma_model::DriverMode;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

const NODE_CLAIM: &str = "authentication.kubernetes.io/node-name";

/// The rendered ValidatingAdmissionPolicy and its binding.
struct Policy {
    spec: Value,
}

fn policy() -> Policy {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/helm/ci/agent-admission-policy.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; the chart renders no agent admission policy (deploy/helm/ci/check.sh --update writes it)",
            path.display()
        )
    });
    let doc: Value = serde_json::from_str(&text).expect("the rendered policy is JSON");
    let objects = doc["objects"].as_array().cloned().unwrap_or_default();
    let find = |kind: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} in {}", path.display()))
    };
    let vap = find("ValidatingAdmissionPolicy");
    let binding = find("ValidatingAdmissionPolicyBinding");
    same_in_typed_form::<ValidatingAdmissionPolicy>(&vap);
    same_in_typed_form::<ValidatingAdmissionPolicyBinding>(&binding);
    assert_eq!(binding["spec"]["policyName"], vap["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert_eq!(vap["spec"]["failurePolicy"], "Fail");
    Policy {
        spec: vap["spec"].clone(),
    }
}

/// `obj` survives its k8s-openapi type unchanged: no misspelt or misplaced field (the API server
/// would refuse or drop it).
fn same_in_typed_form<T: serde::de::DeserializeOwned + serde::Serialize>(obj: &Value) {
    let typed: T = serde_json::from_value(obj.clone())
        .unwrap_or_else(|e| panic!("{} does not deserialise: {e}", obj["kind"]));
    let back = serde_json::to_value(&typed).expect("serialise");
    assert_eq!(
        &back, obj,
        "{} changes in its k8s-openapi type",
        obj["kind"]
    );
}

/// One admission request as the policy sees it.
#[derive(Clone, Debug)]
struct Request {
    user: String,
    /// The token's node claim (`None`: a token without one).
    claim: Option<String>,
    group: String,
    resource: String,
    subresource: String,
    operation: &'static str,
    name: String,
    object: Value,
    old_object: Value,
}

impl Request {
    fn as_user(&self, user: &str, claim: Option<&str>) -> Request {
        Request {
            user: user.into(),
            claim: claim.map(str::to_string),
            ..self.clone()
        }
    }

    fn cel(&self) -> Value {
        let mut user = json!({"username": self.user, "groups": ["system:serviceaccounts", "system:authenticated"]});
        if let Some(node) = &self.claim {
            user["extra"] = json!({ NODE_CLAIM: [node], "authentication.kubernetes.io/pod-name": ["erdma-agent-x"] });
        }
        json!({
            "operation": self.operation,
            "name": self.name,
            "resource": {"group": self.group, "version": "v1", "resource": self.resource},
            "subResource": self.subresource,
            "userInfo": user,
        })
    }
}

#[derive(Debug, PartialEq)]
enum Verdict {
    /// Outside the policy's match constraints or conditions.
    NotMatched,
    Allowed,
    /// Denied, with each failed validation's message.
    Denied(Vec<String>),
}

impl Verdict {
    fn denied_saying(&self, words: &str) -> bool {
        matches!(self, Verdict::Denied(m) if m.iter().any(|m| m.contains(words)))
    }
}

fn listed(list: &Value, item: &str) -> bool {
    list.as_array()
        .is_some_and(|l| l.iter().any(|x| x == item || x == "*"))
}

fn eval(src: &str, ctx: &cel::Context) -> Result<cel::Value, String> {
    let program = cel::Program::compile(src)
        .unwrap_or_else(|e| panic!("the policy's CEL does not compile: {src}: {e}"));
    program.execute(ctx).map_err(|e| e.to_string())
}

fn to_cel(v: &Value) -> cel::Value {
    cel::to_value(v).unwrap_or_else(|e| panic!("{v} as CEL: {e}"))
}

impl Policy {
    /// What the API server does with `req` (failurePolicy Fail: an expression that errors denies).
    fn admit(&self, req: &Request) -> Verdict {
        let full = if req.subresource.is_empty() {
            req.resource.clone()
        } else {
            format!("{}/{}", req.resource, req.subresource)
        };
        let rules = self.spec["matchConstraints"]["resourceRules"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let matched = rules.iter().any(|r| {
            listed(&r["apiGroups"], &req.group)
                && listed(&r["apiVersions"], "v1")
                && listed(&r["operations"], req.operation)
                && listed(&r["resources"], &full)
        });
        if !matched {
            return Verdict::NotMatched;
        }
        let mut ctx = cel::Context::default();
        ctx.add_variable_from_value("request", to_cel(&req.cel()));
        ctx.add_variable_from_value("object", to_cel(&req.object));
        ctx.add_variable_from_value("oldObject", to_cel(&req.old_object));
        for c in self.spec["matchConditions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let expr = c["expression"].as_str().unwrap_or_default();
            match eval(expr, &ctx) {
                Ok(cel::Value::Bool(true)) => {}
                Ok(cel::Value::Bool(false)) => return Verdict::NotMatched,
                other => {
                    return Verdict::Denied(vec![format!("match condition {expr}: {other:?}")]);
                }
            }
        }
        // Variables in order, each seeing the ones before it; one that fails is left out, so an
        // expression using it fails (the API server evaluates them lazily, with the same result).
        let mut variables: HashMap<String, cel::Value> = HashMap::new();
        for v in self.spec["variables"].as_array().into_iter().flatten() {
            ctx.add_variable_from_value("variables", cel::Value::from(variables.clone()));
            let name = v["name"].as_str().unwrap_or_default().to_string();
            if let Ok(value) = eval(v["expression"].as_str().unwrap_or_default(), &ctx) {
                variables.insert(name, value);
            }
        }
        ctx.add_variable_from_value("variables", cel::Value::from(variables));
        let mut denied = Vec::new();
        for v in self.spec["validations"].as_array().into_iter().flatten() {
            let expr = v["expression"].as_str().unwrap_or_default();
            match eval(expr, &ctx) {
                Ok(cel::Value::Bool(true)) => {}
                Ok(cel::Value::Bool(false)) => {
                    let message = v["messageExpression"]
                        .as_str()
                        .and_then(|m| match eval(m, &ctx) {
                            Ok(cel::Value::String(s)) => Some(s.to_string()),
                            _ => None,
                        })
                        .or_else(|| v["message"].as_str().map(str::to_string))
                        .unwrap_or_else(|| format!("failed expression: {expr}"));
                    denied.push(message);
                }
                other => denied.push(format!("expression {expr}: {other:?}")),
            }
        }
        if denied.is_empty() {
            Verdict::Allowed
        } else {
            Verdict::Denied(denied)
        }
    }
}

/// The chart's agent ServiceAccount (default values: release alibaba-erdma-controller in
/// kube-system, as the policy was rendered).
fn agent_user() -> String {
    let v = Values::default();
    service_account_user(&v.namespace, &v.agent_sa())
}

fn condition(ty: &str, status: &str) -> NodeCondition {
    NodeCondition {
        type_: ty.into(),
        status: status.into(),
        reason: Some(format!("Kubelet{ty}")),
        message: Some(format!("kubelet reports {ty}")),
        ..Default::default()
    }
}

fn quantities(erdma: bool) -> BTreeMap<String, Quantity> {
    let mut q = BTreeMap::from([
        ("cpu".to_string(), Quantity("16".into())),
        ("memory".to_string(), Quantity("65536Mi".into())),
    ]);
    if erdma {
        q.insert("aliyun/erdma".into(), Quantity("4".into()));
    }
    q
}

/// A node as the kubelet and the cloud keep it.
fn node(name: &str, erdma_capacity: bool) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), name.to_string()),
                (resource_api::NODE_LABEL.to_string(), "dra".to_string()),
            ])),
            annotations: Some(BTreeMap::from([(
                "node.alpha.kubernetes.io/ttl".to_string(),
                "0".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("cn-hangzhou.i-{name}")),
            pod_cidr: Some("10.244.1.0/24".into()),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![
                condition("MemoryPressure", "False"),
                condition("DiskPressure", "False"),
                condition("PIDPressure", "False"),
                condition("Ready", "True"),
            ]),
            capacity: Some(quantities(erdma_capacity)),
            allocatable: Some(quantities(erdma_capacity)),
            phase: None,
            ..Default::default()
        }),
    }
}

fn pending() -> DriverStatus {
    let mut s = DriverStatus::starting(DriverMode::Default);
    s.running = RunningMode::Mode(DriverMode::Compat);
    s.ready = true;
    s.code = StatusCode::ModeChangePending;
    s.reason = "mode change to default refused: pods hold aliyun/erdma".into();
    s.pending = Some(erdma_driver::PendingChange {
        from: s.running,
        to: DriverMode::Default,
        holders: vec![],
        blocked_by: "pods hold aliyun/erdma".into(),
    });
    s
}

fn converged() -> DriverStatus {
    let mut s = DriverStatus::starting(DriverMode::Default);
    s.running = RunningMode::Mode(DriverMode::Default);
    s.ready = true;
    s.code = StatusCode::Converged;
    s.reason = "driver in mode default".into();
    s
}

/// `/api/v1/nodes` → ("", "nodes"); `/apis/<group>/<version>/<resource>` → (group, resource);
/// namespaced collections keep their last segment as the resource.
fn group_resource(collection: &str) -> (String, String) {
    let segs: Vec<&str> = collection.trim_matches('/').split('/').collect();
    let resource = segs.last().copied().unwrap_or_default().to_string();
    match segs.as_slice() {
        ["api", ..] => (String::new(), resource),
        ["apis", group, ..] => (group.to_string(), resource),
        _ => panic!("unexpected collection {collection}"),
    }
}

/// Runs one step of the agent against `api` as the agent's ServiceAccount of node `claim`, and
/// returns an admission request for each object the step changed, for each subresource the
/// step's writes of that resource named (from the server's audit).
async fn writes<F: std::future::Future<Output = ()>>(api: &FakeApiServer, step: F) -> Vec<Request> {
    let before = api.state().objects.clone();
    let audited = api.state().audit.len();
    step.await;
    let after = api.state().objects.clone();
    let audit: Vec<_> = api.state().audit[audited..].to_vec();
    let mut out = Vec::new();
    let collections: std::collections::BTreeSet<&String> =
        before.keys().chain(after.keys()).collect();
    for coll in collections {
        let (group, resource) = group_resource(coll);
        let empty = BTreeMap::new();
        let old = before.get(coll).unwrap_or(&empty);
        let new = after.get(coll).unwrap_or(&empty);
        let names: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
        for name in names {
            let (o, n) = (old.get(name), new.get(name));
            if o == n {
                continue;
            }
            let operation = match (o, n) {
                (None, Some(_)) => "CREATE",
                (Some(_), None) => "DELETE",
                _ => "UPDATE",
            };
            let verbs: &[&str] = match operation {
                "CREATE" => &["create"],
                "DELETE" => &["delete"],
                _ => &["patch", "update"],
            };
            let mut subresources: Vec<String> = audit
                .iter()
                .map(|r| &r.attributes)
                .filter(|a| a.resource == resource && verbs.contains(&a.verb.as_str()))
                .map(|a| a.subresource.clone())
                .collect();
            subresources.sort();
            subresources.dedup();
            assert!(
                !subresources.is_empty(),
                "{operation} of {coll}/{name} without a request the audit names"
            );
            for subresource in subresources {
                out.push(Request {
                    user: agent_user(),
                    claim: None,
                    group: group.clone(),
                    resource: resource.clone(),
                    subresource,
                    operation,
                    name: name.clone(),
                    object: n.cloned().unwrap_or(Value::Null),
                    old_object: o.cloned().unwrap_or(Value::Null),
                });
            }
        }
    }
    out
}

/// The agent's node writes of one node: driver labels and condition, the pending change done,
/// the device-plugin conflict condition, the resource API condition.
async fn node_writes(api: &FakeApiServer, cluster: &Cluster) -> Vec<Request> {
    let mut out = writes(api, async {
        cluster.publish_driver(None, &pending()).await.unwrap();
    })
    .await;
    out.extend(
        writes(api, async {
            cluster
                .publish_driver(Some(&pending()), &converged())
                .await
                .unwrap();
        })
        .await,
    );
    let conflict = erdma_model::coexistence::Conflict {
        evidence: vec![erdma_model::coexistence::Evidence::Socket {
            file: "1700000000-erdma-eni.sock".into(),
            plugin: erdma_model::coexistence::OtherPlugin::Terway,
        }],
    };
    out.extend(
        writes(api, async {
            cluster
                .publish_plugin_conflict(None, &conflict, "aliyun/erdma")
                .await
                .unwrap();
        })
        .await,
    );
    out.extend(
        writes(api, async {
            resource_api::publish_condition(
                cluster,
                resource_api::ResourceApi::Dra,
                "aliyun/erdma",
            )
            .await
            .unwrap();
        })
        .await,
    );
    out
}

fn node_requests(all: &[Request]) -> Vec<&Request> {
    all.iter().filter(|r| r.resource == "nodes").collect()
}

/// The agent of node-a writing node-a: labels, conditions (both subresources) are allowed; its
/// Events are outside the policy.
#[tokio::test]
async fn the_agent_writing_its_own_node_is_allowed() {
    let policy = policy();
    let api = FakeApiServer::new();
    api.put(&node("node-a", false));
    let cluster = Cluster::new(api.client_as(&agent_user()), "node-a");
    let all = node_writes(&api, &cluster).await;
    let nodes = node_requests(&all);
    let subresources: std::collections::BTreeSet<_> =
        nodes.iter().map(|r| r.subresource.as_str()).collect();
    assert_eq!(subresources, ["", "status"].into(), "{nodes:#?}");
    for r in &all {
        let r = r.as_user(&agent_user(), Some("node-a"));
        let want = if r.resource == "nodes" {
            Verdict::Allowed
        } else {
            Verdict::NotMatched
        };
        assert_eq!(
            policy.admit(&r),
            want,
            "{} {}/{} {}",
            r.operation,
            r.resource,
            r.subresource,
            r.name
        );
    }
    // The writes changed what the policy guards: erdma's labels and conditions.
    let last = &nodes.last().expect("node writes").object;
    assert_eq!(
        last["metadata"]["labels"]["erdma.alibabacloud.com/driver-mode"],
        "default"
    );
    let types: Vec<_> = last["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap_or_default())
        .collect();
    for t in [
        "Ready",
        "ERdmaDriverReady",
        "ERdmaDevicePluginConflict",
        "ERdmaResourceAPI",
    ] {
        assert!(types.contains(&t), "{types:?}");
    }
}

/// The agent's code run for node-b with the token of node-a's agent: every write is denied,
/// naming both nodes.
#[tokio::test]
async fn the_agent_of_node_a_patching_node_b_is_denied() {
    let policy = policy();
    let api = FakeApiServer::new();
    api.put(&node("node-b", false));
    let cluster = Cluster::new(api.client_as(&agent_user()), "node-b");
    let all = node_writes(&api, &cluster).await;
    let nodes = node_requests(&all);
    assert!(nodes.len() >= 5, "{nodes:#?}");
    for r in nodes {
        let v = policy.admit(&r.as_user(&agent_user(), Some("node-a")));
        assert!(
            v.denied_saying("erdma agent of node node-a may not change Node node-b"),
            "{} {}/{}: {v:?}",
            r.operation,
            r.resource,
            r.subresource
        );
        // The same write by node-b's own agent is fine.
        assert_eq!(
            policy.admit(&r.as_user(&agent_user(), Some("node-b"))),
            Verdict::Allowed
        );
    }
}

/// The agent's own label write with one more change that is not erdma's.
#[tokio::test]
async fn other_labels_annotations_taints_and_conditions_of_its_own_node_are_denied() {
    let policy = policy();
    let api = FakeApiServer::new();
    api.put(&node("node-a", false));
    let cluster = Cluster::new(api.client_as(&agent_user()), "node-a");
    let all = node_writes(&api, &cluster).await;
    let own = node_requests(&all)[0].as_user(&agent_user(), Some("node-a"));
    assert_eq!(policy.admit(&own), Verdict::Allowed);
    type Change = fn(&mut Value);
    let cases: [(&str, Change, &str); 8] = [
        (
            "a NodeRestriction label added",
            |o| o["metadata"]["labels"]["node-restriction.kubernetes.io/pool"] = json!("gpu"),
            "may change only the labels",
        ),
        (
            "a kubelet label removed",
            |o| {
                drop(
                    o["metadata"]["labels"]
                        .as_object_mut()
                        .unwrap()
                        .remove("kubernetes.io/hostname"),
                )
            },
            "may change only the labels",
        ),
        (
            "the operator's resource-api label changed",
            |o| o["metadata"]["labels"][resource_api::NODE_LABEL] = json!("device-plugin"),
            "may change only the labels",
        ),
        (
            "a taint added",
            |o| {
                o["spec"]["taints"] =
                    json!([{"key": "dedicated", "value": "x", "effect": "NoSchedule"}])
            },
            "spec (taints included)",
        ),
        (
            "an annotation changed",
            |o| o["metadata"]["annotations"]["node.alpha.kubernetes.io/ttl"] = json!("30"),
            "may not change the annotations",
        ),
        (
            "the kubelet's Ready condition flipped",
            |o| {
                for c in o["status"]["conditions"].as_array_mut().unwrap() {
                    if c["type"] == "Ready" {
                        c["status"] = json!("False");
                    }
                }
            },
            "may change only the conditions",
        ),
        (
            "a condition of another type added",
            |o| {
                o["status"]["conditions"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"type": "NetworkUnavailable", "status": "True"}))
            },
            "may change only the conditions",
        ),
        (
            "the node's addresses changed",
            |o| o["status"]["addresses"] = json!([{"type": "InternalIP", "address": "192.0.2.7"}]),
            "may not change the status",
        ),
    ];
    for (what, change, words) in cases {
        let mut r = own.clone();
        change(&mut r.object);
        let v = policy.admit(&r);
        assert!(v.denied_saying(words), "{what}: {v:?}");
        assert!(v.denied_saying("node-a"), "{what}: {v:?}");
    }
    // erdma's own label removed (the pending mode done) is allowed: in the writes above.
    assert!(
        all.iter().any(|r| r.resource == "nodes"
            && r.old_object["metadata"]["labels"]["erdma.alibabacloud.com/driver-pending-mode"]
                .is_string()
            && r.object["metadata"]["labels"]["erdma.alibabacloud.com/driver-pending-mode"]
                .is_null()),
        "a write removed the pending-mode label"
    );
}

/// The Retirer's removal of aliyun/erdma from its node's capacity and allocatable is allowed;
/// adding or changing a resource is not, nor the removal on another node.
#[tokio::test]
async fn the_retirers_capacity_removal_is_allowed_and_nothing_else_in_capacity() {
    let policy = policy();
    let api = FakeApiServer::new();
    api.put(&node("node-a", true));
    let tmp = tempfile::tempdir().unwrap();
    let retirer = Retirer {
        cluster: Cluster::new(api.client_as(&agent_user()), "node-a"),
        resource: "aliyun/erdma".into(),
        plugin_dir: tmp.path().to_path_buf(),
    };
    let all = writes(&api, async {
        let step = retirer.step().await.unwrap();
        assert!(matches!(step, Step::Removed { .. }), "{step:?}");
    })
    .await;
    let removal = node_requests(&all);
    assert_eq!(removal.len(), 1, "{all:#?}");
    let removal = removal[0].as_user(&agent_user(), Some("node-a"));
    assert_eq!(removal.subresource, "status");
    assert!(removal.old_object["status"]["capacity"]["aliyun/erdma"].is_string());
    assert!(removal.object["status"]["capacity"]["aliyun/erdma"].is_null());
    assert_eq!(policy.admit(&removal), Verdict::Allowed);
    assert!(
        policy
            .admit(&removal.as_user(&agent_user(), Some("node-b")))
            .denied_saying("may not change Node node-a")
    );
    // Reversed: the agent putting aliyun/erdma back.
    let mut added = removal.clone();
    std::mem::swap(&mut added.object, &mut added.old_object);
    assert!(
        policy
            .admit(&added)
            .denied_saying("may only remove aliyun/erdma from the capacity and allocatable")
    );
    let mut cpu = removal.clone();
    cpu.object["status"]["allocatable"]["cpu"] = json!("64");
    assert!(
        policy
            .admit(&cpu)
            .denied_saying("may only remove aliyun/erdma")
    );
    let mut other = removal.clone();
    other.object["status"]["capacity"]
        .as_object_mut()
        .unwrap()
        .remove("memory");
    assert!(
        policy
            .admit(&other)
            .denied_saying("may only remove aliyun/erdma")
    );
}

fn dra_config(node: &str, tmp: &Path) -> erdma_dra::DraConfig {
    let mut cfg = erdma_dra::DraConfig::new(node);
    cfg.kubelet_dir = tmp.join("kubelet");
    cfg.cdi_dir = tmp.join("cdi");
    cfg.sysfs = tmp.join("sys");
    cfg
}

/// The DRA publisher's create, update and removal of its node's ResourceSlice are allowed; the
/// same writes by another node's agent are denied, and so is moving a slice to another node.
#[tokio::test]
async fn resource_slices_of_another_node_are_denied() {
    use erdma_dra::publish;
    let policy = policy();
    let api = FakeApiServer::new();
    api.put(&node("node-a", false));
    let cluster = Cluster::new(api.client_as(&agent_user()), "node-a");
    let tmp = tempfile::tempdir().unwrap();
    let cfg = dra_config("node-a", tmp.path());
    let mut dev = erdma_model::RdmaDevice::named("erdma_0", erdma_model::DeviceKind::Erdma);
    let mut inv = erdma_model::NodeDevices::empty();
    inv.devices = vec![dev.clone()];
    let mut memory = erdma_model::DeviceMemory::default();
    let mut slices = writes(&api, async {
        let devs = publish::publishable(&mut memory, &inv, &cfg, None);
        publish::sync(&cluster.client, &cfg, devs).await.unwrap();
    })
    .await;
    dev.health = erdma_model::Health::from_reasons(vec!["port 1 is DOWN".into()]);
    inv.devices = vec![dev];
    slices.extend(
        writes(&api, async {
            let devs = publish::publishable(&mut memory, &inv, &cfg, None);
            publish::sync(&cluster.client, &cfg, devs).await.unwrap();
        })
        .await,
    );
    slices.extend(writes(&api, resource_api::retire_dra(&cluster)).await);
    let ops: Vec<_> = slices
        .iter()
        .filter(|r| r.resource == "resourceslices")
        .map(|r| r.operation)
        .collect();
    assert_eq!(ops, ["CREATE", "UPDATE", "DELETE"], "{slices:#?}");
    for r in slices.iter().filter(|r| r.resource == "resourceslices") {
        assert_eq!(r.group, "resource.k8s.io");
        let own = r.as_user(&agent_user(), Some("node-a"));
        assert_eq!(policy.admit(&own), Verdict::Allowed, "{}", r.operation);
        let other = policy.admit(&r.as_user(&agent_user(), Some("node-b")));
        assert!(
            other.denied_saying("erdma agent of node node-b may write only ResourceSlices whose spec.nodeName is its node"),
            "{}: {other:?}",
            r.operation
        );
    }
    let update = slices.iter().find(|r| r.operation == "UPDATE").unwrap();
    let mut moved = update.as_user(&agent_user(), Some("node-a"));
    moved.object["spec"]["nodeName"] = json!("node-b");
    assert!(
        policy
            .admit(&moved)
            .denied_saying("may write only ResourceSlices")
    );
    let mut taken = update.as_user(&agent_user(), Some("node-b"));
    taken.object["spec"]["nodeName"] = json!("node-b");
    assert!(
        policy
            .admit(&taken)
            .denied_saying("may write only ResourceSlices")
    );
}

fn erdma_device(node: &str) -> ERdmaDevice {
    let mut o = ERdmaDevice::new(
        node,
        ERdmaDeviceSpec {
            devices: vec![DeviceInfo {
                instance_id: format!("i-{node}"),
                mac: "00:16:3e:00:00:01".into(),
                is_primary_eni: false,
                id: "eni-1".into(),
                network_card_index: 0,
                queue_pair: 8,
            }],
            jumbo_frame: false,
        },
    );
    o.metadata.labels = Some(erdma_k8s::labels::erdma_device_labels(
        node,
        &format!("i-{node}"),
    ));
    o
}

/// The agent's report of unusable devices in its node's ERdmaDevice status is allowed; in
/// another node's, denied.
#[tokio::test]
async fn erdma_device_status_of_another_node_is_denied() {
    let policy = policy();
    let api = FakeApiServer::new();
    api.put(&erdma_device("node-a"));
    let client = api.client_as(&agent_user());
    let all = writes(&api, async {
        erdma_k8s::agent::report_device_problems(
            &client,
            "node-a",
            &[("eni-1".into(), "no local device".into())],
        )
        .await
        .unwrap();
    })
    .await;
    assert_eq!(all.len(), 1, "{all:#?}");
    let r = &all[0];
    assert_eq!(
        (
            r.group.as_str(),
            r.resource.as_str(),
            r.subresource.as_str()
        ),
        ("network.alibabacloud.com", "erdmadevices", "status")
    );
    assert_eq!(
        policy.admit(&r.as_user(&agent_user(), Some("node-a"))),
        Verdict::Allowed
    );
    let v = policy.admit(&r.as_user(&agent_user(), Some("node-b")));
    assert!(
        v.denied_saying("erdma agent of node node-b may write only the ERdmaDevice labelled alibabacloud.com/nodename=node-b"),
        "{v:?}"
    );
}

/// Users other than the agent's ServiceAccount are outside the policy: the controller, a
/// kubelet, an administrator, and an agent of another release's ServiceAccount name.
#[tokio::test]
async fn other_users_are_not_matched() {
    let policy = policy();
    let api = FakeApiServer::new();
    api.put(&node("node-b", false));
    let cluster = Cluster::new(api.client_as(&agent_user()), "node-b");
    let all = node_writes(&api, &cluster).await;
    let controller = {
        let v = Values::default();
        service_account_user(&v.namespace, &v.controller_sa())
    };
    for r in node_requests(&all) {
        for user in [
            controller.as_str(),
            "system:node:node-a",
            "kubernetes-admin",
            "system:serviceaccount:default:alibaba-erdma-controller-agent",
        ] {
            assert_eq!(
                policy.admit(&r.as_user(user, Some("node-a"))),
                Verdict::NotMatched,
                "{user}"
            );
        }
    }
}

/// A token without the node claim (a legacy Secret token, or the API server's
/// ServiceAccountTokenPodNodeInfo off) is denied, and the message names the fix.
#[tokio::test]
async fn a_token_without_a_node_claim_is_denied() {
    let policy = policy();
    let api = FakeApiServer::new();
    api.put(&node("node-a", false));
    let cluster = Cluster::new(api.client_as(&agent_user()), "node-a");
    let all = node_writes(&api, &cluster).await;
    let r = node_requests(&all)[0].as_user(&agent_user(), None);
    let v = policy.admit(&r);
    assert!(v.denied_saying("its token carries no node claim"), "{v:?}");
    assert!(
        v.denied_saying("agent.admissionPolicy.enabled=false"),
        "{v:?}"
    );
    let mut empty = r.clone();
    empty.claim = Some(String::new());
    assert!(policy.admit(&empty).denied_saying("no node claim"));
}
