//! The fake API server behaves like one where erdma depends on it: strategic merge patches,
//! optimistic concurrency, expired watches, validation on write, and RBAC with identities. Each
//! expectation is the documented behaviour of the Kubernetes API server, written out here.

use erdma_k8s::fake::FakeApiServer;
use erdma_k8s::install::{Values, render};
use erdma_k8s::rbac::{Attributes, Authorizer, service_account_user};
use erdma_k8s::{ERdmaDevice, ERdmaDeviceSpec};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus, Secret};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use std::time::Duration;

fn node(name: &str, conditions: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            conditions: Some(
                conditions
                    .iter()
                    .map(|(t, s)| NodeCondition {
                        type_: (*t).into(),
                        status: (*s).into(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn conditions(api: &FakeApiServer, name: &str) -> Vec<(String, String)> {
    api.get::<Node>(None, name)
        .and_then(|n| n.status?.conditions)
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

fn api_code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn strategic_merge_patch_merges_conditions_by_type_and_merge_patch_replaces_them() {
    let api = FakeApiServer::new();
    api.put(&node("n1", &[("Ready", "True"), ("DiskPressure", "False")]));
    let nodes: Api<Node> = Api::all(api.client());
    let smp = json!({"status": {"conditions": [
        {"type": "DiskPressure", "status": "True"},
        {"type": "ERdmaDriverReady", "status": "False"}]}});
    nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(&smp))
        .await
        .unwrap();
    assert_eq!(
        conditions(&api, "n1"),
        pairs(&[
            ("Ready", "True"),
            ("DiskPressure", "True"),
            ("ERdmaDriverReady", "False")
        ])
    );
    // `$patch: delete` removes one element by its key.
    let del = json!({"status": {"conditions": [{"type": "DiskPressure", "$patch": "delete"}]}});
    nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(&del))
        .await
        .unwrap();
    assert_eq!(
        conditions(&api, "n1"),
        pairs(&[("Ready", "True"), ("ERdmaDriverReady", "False")])
    );
    // A JSON merge patch replaces the list (RFC 7386).
    let merge = json!({"status": {"conditions": [{"type": "ERdmaDriverReady", "status": "True"}]}});
    nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(&merge))
        .await
        .unwrap();
    assert_eq!(
        conditions(&api, "n1"),
        pairs(&[("ERdmaDriverReady", "True")])
    );
    // Finalizers merge as a set.
    let f = json!({"metadata": {"finalizers": ["a", "b"]}});
    nodes
        .patch("n1", &PatchParams::default(), &Patch::Strategic(&f))
        .await
        .unwrap();
    let f = json!({"metadata": {"finalizers": ["b", "c"]}});
    nodes
        .patch("n1", &PatchParams::default(), &Patch::Strategic(&f))
        .await
        .unwrap();
    assert_eq!(
        api.get::<Node>(None, "n1").unwrap().metadata.finalizers,
        Some(vec!["a".to_string(), "b".into(), "c".into()])
    );
}

#[tokio::test]
async fn strategic_merge_patch_on_a_custom_resource_is_unsupported_media_type() {
    let api = FakeApiServer::new();
    api.put(&ERdmaDevice::new("n1", ERdmaDeviceSpec::default()));
    let crs: Api<ERdmaDevice> = Api::all(api.client());
    let e = crs
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(&json!({"spec": {"jumboFrame": true}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(e), 415);
}

#[tokio::test]
async fn a_stale_resource_version_conflicts_on_update_and_patch() {
    let api = FakeApiServer::new();
    let secrets: Api<Secret> = Api::namespaced(api.client(), "ns");
    let mut s = Secret {
        metadata: ObjectMeta {
            name: Some("s".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let created = secrets.create(&PostParams::default(), &s).await.unwrap();
    s.metadata.resource_version = created.metadata.resource_version.clone();
    s.string_data = None;
    secrets
        .replace("s", &PostParams::default(), &s)
        .await
        .unwrap();
    // `s` still carries the first resourceVersion: another writer came in between.
    assert_eq!(
        api_code(
            secrets
                .replace("s", &PostParams::default(), &s)
                .await
                .unwrap_err()
        ),
        409
    );
    let stale = json!({"metadata": {"resourceVersion": created.metadata.resource_version}});
    assert_eq!(
        api_code(
            secrets
                .patch("s", &PatchParams::default(), &Patch::Merge(&stale))
                .await
                .unwrap_err()
        ),
        409
    );
}

#[tokio::test]
async fn writes_that_do_not_deserialise_into_their_type_are_invalid() {
    let api = FakeApiServer::new();
    api.put(&node("n1", &[("Ready", "True")]));
    let nodes: Api<Node> = Api::all(api.client());
    // NodeCondition.status is a string.
    let bad = json!({"status": {"conditions": [{"type": "X", "status": 1}]}});
    let e = nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(&bad))
        .await
        .unwrap_err();
    assert_eq!(api_code(e), 422);
    assert_eq!(
        conditions(&api, "n1"),
        pairs(&[("Ready", "True")]),
        "unchanged"
    );
    // An ERdmaDevice whose devices are not a list.
    let crs: Api<ERdmaDevice> = Api::all(api.client());
    api.put(&ERdmaDevice::new("n1", ERdmaDeviceSpec::default()));
    let e = crs
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"devices": "eni-1"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(e), 422);
}

type NodeEvents = futures::stream::BoxStream<'static, Result<watcher::Event<Node>, watcher::Error>>;

/// Reads watcher events until a node named `want` was applied.
async fn until_seen(stream: &mut NodeEvents, seen: &mut Vec<String>, want: &str) {
    while !seen.iter().any(|n| n == want) {
        let ev = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("an event")
            .expect("stream open");
        if let Ok(watcher::Event::InitApply(n) | watcher::Event::Apply(n)) = ev {
            seen.push(n.metadata.name.unwrap_or_default());
        }
    }
}

/// After compaction a watch from an older resourceVersion gets 410 Gone; kube's watcher then lists
/// again and so still sees the object created meanwhile.
#[tokio::test]
async fn an_expired_watch_makes_the_client_list_again() {
    let api = FakeApiServer::new();
    api.put(&node("a", &[]));
    let nodes: Api<Node> = Api::all(api.client_as("watcher"));
    let mut stream: NodeEvents = watcher(nodes, watcher::Config::default()).boxed();
    let mut seen: Vec<String> = Vec::new();
    until_seen(&mut stream, &mut seen, "a").await;
    let lists = |api: &FakeApiServer| {
        api.audit()
            .iter()
            .filter(|r| r.attributes.verb == "list" && r.attributes.resource == "nodes")
            .count()
    };
    assert_eq!(lists(&api), 1);
    // b is created, then the history is compacted and open watches end: the watcher's next watch
    // starts from the list's resourceVersion, which is now too old.
    api.put(&node("b", &[]));
    api.compact();
    api.close_watches();
    until_seen(&mut stream, &mut seen, "b").await;
    assert_eq!(lists(&api), 2, "re-listed after 410 Gone");
}

type ConfigMapEvents = futures::stream::BoxStream<
    'static,
    watcher::Result<watcher::Event<k8s_openapi::api::core::v1::ConfigMap>>,
>;

/// The next added, modified (`namespace/name`) or deleted (`deleted name`) object of a watch.
async fn next_change(s: &mut ConfigMapEvents) -> String {
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(5), s.next())
            .await
            .expect("an event")
            .expect("stream open")
            .expect("no error");
        match ev {
            watcher::Event::InitApply(c) | watcher::Event::Apply(c) => {
                let ns = c.metadata.namespace.unwrap_or_default();
                return format!("{ns}/{}", c.metadata.name.unwrap_or_default());
            }
            watcher::Event::Delete(c) => {
                return format!("deleted {}", c.metadata.name.unwrap_or_default());
            }
            _ => {}
        }
    }
}

/// A list and a watch without a namespace of a namespaced resource span every namespace (as
/// `Api::all` and the DRA driver's ResourceClaim watch use them); a namespaced watch sees only its
/// namespace.
#[tokio::test]
async fn a_watch_across_namespaces_sees_every_namespace() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let cm = |ns: &str, name: &str| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let api = FakeApiServer::new();
    api.put(&cm("one", "listed"));
    let all: Api<ConfigMap> = Api::all(api.client());
    let one: Api<ConfigMap> = Api::namespaced(api.client(), "one");
    let mut every = watcher(all, watcher::Config::default()).boxed();
    let mut only_one = watcher(one, watcher::Config::default()).boxed();
    assert_eq!(next_change(&mut every).await, "one/listed");
    assert_eq!(next_change(&mut only_one).await, "one/listed");
    api.put(&cm("two", "a"));
    api.put(&cm("one", "b"));
    api.remove::<ConfigMap>(Some("two"), "a");
    assert_eq!(next_change(&mut every).await, "two/a");
    assert_eq!(next_change(&mut every).await, "one/b");
    assert_eq!(next_change(&mut every).await, "deleted a");
    assert_eq!(
        next_change(&mut only_one).await,
        "one/b",
        "namespace two is not in this watch"
    );
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
    let s = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(s(groups)),
        resources: Some(s(resources)),
        verbs: s(verbs),
        resource_names: (!names.is_empty()).then(|| s(names)),
        ..Default::default()
    }
}

fn attrs(
    user: &str,
    verb: &str,
    group: &str,
    res: &str,
    sub: &str,
    ns: &str,
    name: &str,
) -> Attributes {
    Attributes {
        user: user.into(),
        verb: verb.into(),
        api_group: group.into(),
        resource: res.into(),
        subresource: sub.into(),
        namespace: ns.into(),
        name: name.into(),
    }
}

#[test]
fn rbac_rules_are_evaluated_as_the_api_server_does() {
    let sa = service_account_user("ops", "bot");
    let meta = |name: &str, ns: Option<&str>| ObjectMeta {
        name: Some(name.into()),
        namespace: ns.map(str::to_string),
        ..Default::default()
    };
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: "bot".into(),
        namespace: Some("ops".into()),
        ..Default::default()
    };
    let objs = vec![
        serde_json::to_value(ClusterRole {
            metadata: meta("cr", None),
            rules: Some(vec![
                rule(&[""], &["nodes"], &["get"], &[]),
                rule(&["apps"], &["*"], &["*"], &[]),
                rule(&[""], &["*/log"], &["get"], &[]),
            ]),
            ..Default::default()
        })
        .unwrap(),
        serde_json::to_value(ClusterRoleBinding {
            metadata: meta("crb", None),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: "cr".into(),
            },
            subjects: Some(vec![subject.clone()]),
        })
        .unwrap(),
        serde_json::to_value(Role {
            metadata: meta("r", Some("ops")),
            rules: Some(vec![rule(
                &[""],
                &["secrets"],
                &["get", "update"],
                &["mine"],
            )]),
        })
        .unwrap(),
        serde_json::to_value(RoleBinding {
            metadata: meta("rb", Some("ops")),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: "r".into(),
            },
            subjects: Some(vec![subject]),
        })
        .unwrap(),
    ];
    let a = Authorizer::from_manifests(&objs).unwrap();
    let allowed = |x: Attributes| !a.authorize(&x).is_empty();
    assert!(allowed(attrs(&sa, "get", "", "nodes", "", "", "n1")));
    assert!(
        !allowed(attrs(&sa, "get", "", "nodes", "status", "", "n1")),
        "subresource needs its own rule"
    );
    assert!(
        !allowed(attrs(&sa, "list", "", "nodes", "", "", "")),
        "verb"
    );
    assert!(
        allowed(attrs(
            &sa,
            "delete",
            "apps",
            "deployments",
            "scale",
            "x",
            "d"
        )),
        "* resource and verb"
    );
    assert!(
        allowed(attrs(&sa, "get", "", "pods", "log", "x", "p")),
        "*/subresource"
    );
    assert!(
        !allowed(attrs(&sa, "get", "", "pods", "", "x", "p")),
        "*/subresource is not the resource"
    );
    assert!(allowed(attrs(
        &sa, "update", "", "secrets", "", "ops", "mine"
    )));
    assert!(
        !allowed(attrs(&sa, "get", "", "secrets", "", "ops", "other")),
        "resourceNames"
    );
    assert!(
        !allowed(attrs(&sa, "get", "", "secrets", "", "kube-system", "mine")),
        "RoleBinding is namespaced"
    );
    assert!(
        !allowed(attrs(&sa, "create", "", "secrets", "", "ops", "")),
        "a create has no name"
    );
    assert!(
        !allowed(attrs(
            "system:serviceaccount:other:bot",
            "get",
            "",
            "nodes",
            "",
            "",
            "n1"
        )),
        "subject"
    );
}

#[tokio::test]
async fn an_identified_client_is_denied_what_its_rbac_does_not_allow() {
    let v = Values::default();
    let api = FakeApiServer::new();
    api.enforce(Authorizer::from_manifests(&render(&v).unwrap()).unwrap());
    api.put(&node("n1", &[]));
    let agent = service_account_user(&v.namespace, &v.agent_sa());
    let nodes: Api<Node> = Api::all(api.client_as(&agent));
    let e = nodes.delete("n1", &Default::default()).await.unwrap_err();
    match e {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 403);
            assert_eq!(
                s.message,
                format!(
                    "nodes \"n1\" is forbidden: User \"{agent}\" cannot delete resource \"nodes\" in API group \"\" at the cluster scope"
                )
            );
        }
        other => panic!("{other}"),
    }
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .expect("the agent may label nodes");
    let recorded = api.audit();
    assert_eq!(
        recorded
            .iter()
            .map(|r| r.attributes.clone())
            .collect::<Vec<_>>(),
        vec![
            attrs(&agent, "delete", "", "nodes", "", "", "n1"),
            attrs(&agent, "patch", "", "nodes", "", "", "n1"),
        ]
    );
}

#[tokio::test]
async fn a_list_without_a_namespace_spans_every_namespace() {
    let api = FakeApiServer::new();
    let secret = |ns: &str, name: &str| Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    for (ns, name) in [("a", "s1"), ("b", "s2"), ("b", "s3")] {
        Api::<Secret>::namespaced(api.client(), ns)
            .create(&PostParams::default(), &secret(ns, name))
            .await
            .unwrap();
    }
    let mut all: Vec<String> = Api::<Secret>::all(api.client())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| {
            format!(
                "{}/{}",
                s.metadata.namespace.unwrap(),
                s.metadata.name.unwrap()
            )
        })
        .collect();
    all.sort();
    assert_eq!(all, ["a/s1", "b/s2", "b/s3"]);
    let in_b = Api::<Secret>::namespaced(api.client(), "b")
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    assert_eq!(in_b.len(), 2);
}

fn slice(
    name: &str,
    node: Option<&str>,
    driver: &str,
) -> k8s_openapi::api::resource::v1::ResourceSlice {
    use k8s_openapi::api::resource::v1::{ResourcePool, ResourceSlice, ResourceSliceSpec};
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: driver.into(),
            node_name: node.map(str::to_string),
            all_nodes: node.is_none().then_some(true),
            pool: ResourcePool {
                name: node.unwrap_or("cluster").into(),
                generation: 1,
                resource_slice_count: 1,
            },
            ..Default::default()
        },
    }
}

/// ResourceSlices select by `spec.nodeName` and `spec.driver` (and `metadata.name`), with `=`,
/// `==` and `!=`; a slice without a node name selects as `spec.nodeName=""`; any other label is
/// a 400 naming it, as the API server's field label conversion for ResourceSlice answers.
#[tokio::test]
async fn resource_slices_select_by_node_and_driver_and_refuse_other_field_labels() {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use kube::api::ListParams;
    let api = FakeApiServer::new();
    api.put(&slice("a-x", Some("node-a"), "x.example.com"));
    api.put(&slice("a-y", Some("node-a"), "y.example.com"));
    api.put(&slice("b-x", Some("node-b"), "x.example.com"));
    api.put(&slice("all-x", None, "x.example.com"));
    let slices: Api<ResourceSlice> = Api::all(api.client());
    let names = |sel: &'static str| {
        let slices = slices.clone();
        async move {
            let mut n: Vec<String> = slices
                .list(&ListParams::default().fields(sel))
                .await
                .expect("list")
                .items
                .into_iter()
                .filter_map(|s| s.metadata.name)
                .collect();
            n.sort();
            n
        }
    };
    assert_eq!(
        names("spec.nodeName=node-a,spec.driver=x.example.com").await,
        ["a-x"]
    );
    assert_eq!(names("spec.nodeName==node-a").await, ["a-x", "a-y"]);
    assert_eq!(
        names("spec.driver=x.example.com,spec.nodeName!=node-a").await,
        ["all-x", "b-x"]
    );
    assert_eq!(names("spec.nodeName=").await, ["all-x"]);
    assert_eq!(names("metadata.name=b-x").await, ["b-x"]);
    for bad in [
        "spec.pool.name=node-a",
        "metadata.namespace=default",
        "spec.nodeName=node-a,status.x=1",
    ] {
        match slices.list(&ListParams::default().fields(bad)).await {
            Err(kube::Error::Api(s)) => {
                assert_eq!((s.code, s.reason.as_str()), (400, "BadRequest"), "{bad}");
                let label = bad
                    .rsplit(',')
                    .next()
                    .and_then(|t| t.split('=').next())
                    .unwrap_or_default();
                assert_eq!(
                    s.message,
                    format!(
                        "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: {label}"
                    )
                );
            }
            other => panic!("{bad}: expected 400, got {other:?}"),
        }
    }
    // A watch selects the same way and refuses the same labels.
    let mut events = watcher::watcher(
        slices.clone(),
        watcher::Config::default().fields("spec.nodeName=node-a,spec.driver=x.example.com"),
    )
    .boxed();
    api.put(&slice("b-x2", Some("node-b"), "x.example.com"));
    api.put(&slice("a-x2", Some("node-a"), "x.example.com"));
    let mut seen = Vec::new();
    while !seen.contains(&"a-x2".to_string()) {
        let e = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("an event in time")
            .expect("stream open")
            .expect("no watch error");
        match e {
            watcher::Event::Apply(s) | watcher::Event::InitApply(s) => seen.extend(s.metadata.name),
            _ => {}
        }
    }
    seen.sort();
    assert_eq!(seen, ["a-x", "a-x2"]);
    let mut bad = watcher::watcher(
        slices,
        watcher::Config::default().fields("spec.pool.name=node-a"),
    )
    .boxed();
    let e = loop {
        let e = tokio::time::timeout(Duration::from_secs(10), bad.next())
            .await
            .expect("an answer in time")
            .expect("stream open");
        if let Err(e) = e {
            break e;
        }
    };
    assert!(
        format!("{e:?}").contains("field label not supported"),
        "{e:?}"
    );
    // The request carries the selector as sent.
    let q = api.queries_matching("GET", "/apis/resource.k8s.io/v1/resourceslices");
    assert_eq!(
        q[0].get("fieldSelector").map(String::as_str),
        Some("spec.nodeName=node-a,spec.driver=x.example.com")
    );
}

/// The feature gates per release and `--feature-gates` as the API server parses it.
#[test]
fn feature_gates_default_per_release_and_refuse_what_the_api_server_refuses() {
    use erdma_k8s::fake::FeatureGates;
    let on = |g: &FeatureGates| {
        (
            g.dra_device_taints,
            g.dra_consumable_capacity,
            g.dra_extended_resource,
        )
    };
    assert_eq!(on(&FeatureGates::default()), (true, true, true));
    assert_eq!(FeatureGates::default().release, 37);
    for (minor, want) in [
        (34, (false, false, false)),
        (35, (false, false, false)),
        (36, (true, true, true)),
        (37, (true, true, true)),
    ] {
        assert_eq!(
            on(&FeatureGates::release(minor).expect("modelled")),
            want,
            "1.{minor}"
        );
    }
    assert!(FeatureGates::release(33).is_none());
    let g = FeatureGates::default()
        .with("DRADeviceTaints=false, DRAConsumableCapacity=False")
        .expect("parsed");
    assert_eq!(on(&g), (false, false, true));
    let e = FeatureGates::default()
        .with("DRAExtendedResource=false")
        .expect_err("GA and locked in 1.37");
    assert_eq!(
        e,
        "cannot set feature gate DRAExtendedResource to false, feature is locked to true"
    );
    let g = FeatureGates::release(36)
        .expect("1.36")
        .with("DRAExtendedResource=false")
        .expect("beta in 1.36: may be turned off");
    assert!(!g.dra_extended_resource);
    assert!(
        FeatureGates::default()
            .with("NoSuchGate=true")
            .expect_err("unknown")
            .starts_with("unrecognized feature gate: NoSuchGate")
    );
    assert!(FeatureGates::default().with("DRADeviceTaints").is_err());
    assert!(
        FeatureGates::default()
            .with("DRADeviceTaints=maybe")
            .is_err()
    );
}

fn full_slice(name: &str, tainted: bool) -> k8s_openapi::api::resource::v1::ResourceSlice {
    use k8s_openapi::api::resource::v1::{
        CapacityRequestPolicy, Device, DeviceCapacity, DeviceTaint,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let mut s = slice(name, Some("node-a"), "x.example.com");
    s.spec.devices = Some(vec![Device {
        name: "d0".into(),
        allow_multiple_allocations: Some(true),
        taints: tainted.then(|| {
            vec![DeviceTaint {
                key: "x.example.com/unhealthy".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]
        }),
        capacity: Some(std::collections::BTreeMap::from([(
            "shares".to_string(),
            DeviceCapacity {
                value: Quantity("4".into()),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(Quantity("1".into())),
                    ..Default::default()
                }),
            },
        )])),
        ..Default::default()
    }]);
    s
}

/// With a gate off the API server stores the object without the gate's fields, and the
/// create's answer is the stored object; an update keeps a field the stored object already has.
#[tokio::test]
async fn disabled_feature_gates_drop_their_fields_on_create_and_update_unless_in_use() {
    use erdma_k8s::fake::FeatureGates;
    use k8s_openapi::api::resource::v1::{DeviceClass, DeviceClassSpec, ResourceSlice};
    let api = FakeApiServer::new();
    api.set_feature_gates(
        FeatureGates::default()
            .with("DRADeviceTaints=false,DRAConsumableCapacity=false")
            .expect("gates"),
    );
    let slices: Api<ResourceSlice> = Api::all(api.client());
    let stored = slices
        .create(&PostParams::default(), &full_slice("s", true))
        .await
        .expect("created");
    let d = &stored.spec.devices.as_ref().expect("devices")[0];
    assert_eq!(d.taints, None);
    assert_eq!(d.allow_multiple_allocations, None);
    assert!(
        d.capacity.as_ref().expect("capacity")["shares"]
            .request_policy
            .is_none()
    );
    assert_eq!(
        d.capacity.as_ref().expect("capacity")["shares"].value.0,
        "4"
    );
    assert_eq!(
        api.get::<ResourceSlice>(None, "s").map(|s| s.spec.devices),
        Some(stored.spec.devices.clone()),
        "the answer is what is stored"
    );
    // An update of a slice stored with the fields (before the gates went off) keeps them.
    api.put(&full_slice("kept", true));
    let updated = slices
        .replace("kept", &PostParams::default(), &full_slice("kept", true))
        .await
        .expect("updated");
    let d = &updated.spec.devices.as_ref().expect("devices")[0];
    assert!(d.taints.is_some());
    assert_eq!(d.allow_multiple_allocations, Some(true));
    // With the gates on (the newest release's defaults) everything is stored.
    api.set_feature_gates(FeatureGates::default());
    let stored = slices
        .create(&PostParams::default(), &full_slice("on", true))
        .await
        .expect("created");
    assert!(
        stored.spec.devices.as_ref().expect("devices")[0]
            .taints
            .is_some()
    );

    // DeviceClass extendedResourceName, by create and by server-side apply.
    api.set_feature_gates(
        FeatureGates::release(36)
            .expect("1.36")
            .with("DRAExtendedResource=false")
            .expect("gates"),
    );
    let classes: Api<DeviceClass> = Api::all(api.client());
    let class = |name: &str| DeviceClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: DeviceClassSpec {
            extended_resource_name: Some("example.com/x".into()),
            ..Default::default()
        },
    };
    let c = classes
        .create(&PostParams::default(), &class("a"))
        .await
        .expect("created");
    assert_eq!(c.spec.extended_resource_name, None);
    let c = classes
        .patch(
            "b",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&class("b")),
        )
        .await
        .expect("applied");
    assert_eq!(c.spec.extended_resource_name, None);
}

/// Lists come in pages as the API server serves `limit` and `continue`: at most `limit` items in
/// key order, a `continue` token and `remainingItemCount` while more remain, every page at the
/// first page's resourceVersion, the last page without a token; a token that is not one is
/// 400; without `limit` one answer holds everything.
#[tokio::test]
async fn lists_come_in_pages_of_limit_with_a_continue_token() {
    let api = FakeApiServer::new();
    for i in (0..7).rev() {
        api.put(&node(&format!("n{i}"), &[("Ready", "True")]));
    }
    let nodes: Api<Node> = Api::all(api.client());
    let mut names = Vec::new();
    let mut token: Option<String> = None;
    let mut rvs = Vec::new();
    let mut pages = 0;
    loop {
        let mut lp = kube::api::ListParams::default().limit(3);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = nodes.list(&lp).await.expect("a page");
        pages += 1;
        assert!(page.items.len() <= 3);
        names.extend(
            page.items
                .iter()
                .map(|n| n.metadata.name.clone().unwrap_or_default()),
        );
        rvs.push(page.metadata.resource_version.clone());
        token = page.metadata.continue_.clone().filter(|t| !t.is_empty());
        match &token {
            Some(_) => assert_eq!(
                page.metadata.remaining_item_count,
                Some(7 - names.len() as i64)
            ),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(names, ["n0", "n1", "n2", "n3", "n4", "n5", "n6"]);
    assert!(rvs.iter().all(|rv| *rv == rvs[0]), "{rvs:?}");
    let bad = nodes
        .list(
            &kube::api::ListParams::default()
                .limit(3)
                .continue_token("not-a-token"),
        )
        .await
        .expect_err("an invalid token");
    assert_eq!(api_code(bad), 400);
    let all = nodes
        .list(&kube::api::ListParams::default())
        .await
        .expect("a list");
    assert_eq!(all.items.len(), 7);
    assert_eq!(all.metadata.continue_, None);
}
