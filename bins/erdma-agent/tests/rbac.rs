//! RBAC proven by use (the agent's half; the controller's is `erdma-controller`'s `tests/rbac.rs`),
//! and the agent's node-condition patch against a strategic-merge-patching API server.
//!
//! Every code path of the agent that talks to the API server runs here against
//! `erdma_k8s::fake::FakeApiServer` as the agent's ServiceAccount, with the RBAC objects that
//! `erdma_k8s::install::render` (and, by the chart test, the Helm chart) renders enforced: a
//! missing permission is a 403 and fails the step. Afterwards every recorded request must be
//! allowed and every granted permission must have been used by some step (a surplus permission
//! fails too). The table "permission → steps that need it" is kept in `docs/operations.md`
//! (`UPDATE=1 cargo test -p erdma-agent rbac` regenerates it).

use erdma_agent::cluster::{Cluster, PodRef};
use erdma_driver::{DriverStatus, PendingChange, RunningMode, StatusCode};
use erdma_k8s::fake::FakeApiServer;
use erdma_k8s::install::{Values, render};
use erdma_k8s::rbac::{
    Authorizer, check_doc_section, coverage, markdown_table, service_account_user,
};
use erdma_k8s::{DeviceInfo, ERdmaDevice, ERdmaDeviceSpec};
use erdma_model::DriverMode;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::path::Path;

/// Permissions granted although no step here uses them, each with the reason no test can.
const ALLOWED_UNUSED: &[(&str, &str, &str)] = &[];

fn kubelet_condition(ty: &str, status: &str) -> NodeCondition {
    NodeCondition {
        type_: ty.into(),
        status: status.into(),
        reason: Some(format!("Kubelet{ty}")),
        message: Some(format!("kubelet reports {ty}")),
        ..Default::default()
    }
}

/// A node as the kubelet keeps it: its own four conditions.
fn kubelet_node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            conditions: Some(vec![
                kubelet_condition("MemoryPressure", "False"),
                kubelet_condition("DiskPressure", "False"),
                kubelet_condition("PIDPressure", "False"),
                kubelet_condition("Ready", "True"),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn pending() -> DriverStatus {
    let mut s = DriverStatus::starting(DriverMode::Default);
    s.running = RunningMode::Mode(DriverMode::Compat);
    s.ready = true;
    s.code = StatusCode::ModeChangePending;
    s.reason = "mode change to default refused: pods hold aliyun/erdma".into();
    s.pending = Some(PendingChange {
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

fn conditions(api: &FakeApiServer, node: &str) -> Vec<(String, String, Option<String>)> {
    api.get::<Node>(None, node)
        .and_then(|n| n.status)
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status, c.reason))
        .collect()
}

#[tokio::test]
async fn every_agent_api_call_is_allowed_and_every_permission_is_used() {
    let v = Values::default();
    let objects = render(&v).unwrap();
    let authz = Authorizer::from_manifests(&objects).unwrap();
    let user = service_account_user(&v.namespace, &v.agent_sa());
    let api = FakeApiServer::new();
    api.enforce(authz.clone());
    api.put(&kubelet_node("n1"));
    let cluster = Cluster::new(api.client_as(&user), "n1");
    device_plugin_node_steps(&api, &cluster).await;

    let c = coverage(&authz, &user, &api.audit());
    c.verdict(ALLOWED_UNUSED).unwrap_or_else(|e| panic!("{e}"));
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md");
    let table = format!(
        "Agent, as `{user}` (values: defaults):\n\n{}",
        markdown_table(&c)
    );
    check_doc_section(&doc, "agent", &table).unwrap_or_else(|e| panic!("{e}"));
}

/// With `dra.enabled`: the steps of every agent plus the DRA driver's (node label, condition,
/// ResourceSlice publishing, claim reads, retiring the slices on a device-plugin node).
#[tokio::test]
async fn with_dra_every_agent_api_call_is_allowed_and_every_permission_is_used() {
    use erdma_agent::resource_api;
    use erdma_dra::publish;
    let mut v = Values::default();
    v.dra.enabled = true;
    let objects = render(&v).unwrap();
    let authz = Authorizer::from_manifests(&objects).unwrap();
    let user = service_account_user(&v.namespace, &v.agent_sa());
    let api = FakeApiServer::new();
    api.enforce(authz.clone());
    let mut node = kubelet_node("n1");
    node.metadata.labels = Some(std::collections::BTreeMap::from([(
        resource_api::NODE_LABEL.to_string(),
        "dra".to_string(),
    )]));
    api.put(&node);
    let cluster = Cluster::new(api.client_as(&user), "n1");
    device_plugin_node_steps(&api, &cluster).await;

    api.set_step("DRA: this node's `erdma.alibabacloud.com/resource-api` label");
    let chosen = resource_api::resolve(resource_api::Choice::NodeLabel, Some(&cluster))
        .await
        .unwrap();
    assert_eq!(chosen, resource_api::ResourceApi::Dra);

    api.set_step("DRA: `ERdmaResourceAPI` condition");
    resource_api::publish_condition(&cluster, chosen, "aliyun/erdma")
        .await
        .unwrap();

    api.set_step("DRA: this node's ResourceSlice (create, update, stale slices removed)");
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = erdma_dra::DraConfig::new("n1");
    cfg.kubelet_dir = tmp.path().join("kubelet");
    cfg.cdi_dir = tmp.path().join("cdi");
    cfg.sysfs = tmp.path().join("sys");
    let mut stale = erdma_dra::slice::resource_slice(vec![], &cfg, 1);
    stale.metadata.name = Some("n1-stale".into());
    api.put(&stale);
    let mut dev = erdma_model::RdmaDevice::named("erdma_0", erdma_model::DeviceKind::Erdma);
    let mut inv = erdma_model::NodeDevices::empty();
    inv.devices = vec![dev.clone()];
    let mut memory = erdma_model::DeviceMemory::default();
    let devs = publish::publishable(&mut memory, &inv, &cfg, None);
    publish::sync(&cluster.client, &cfg, devs).await.unwrap();
    dev.health = erdma_model::Health::from_reasons(vec!["port 1 is DOWN".into()]);
    inv.devices = vec![dev];
    let devs = publish::publishable(&mut memory, &inv, &cfg, None);
    publish::sync(&cluster.client, &cfg, devs).await.unwrap();

    api.set_step(
        "DRA: the publisher's watch of this node's ResourceSlices (field selector: node and driver)",
    );
    let (_inv_tx, inv_rx) = tokio::sync::watch::channel(inv.clone());
    let (status_tx, _status) = tokio::sync::watch::channel(Err(String::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let publisher = tokio::spawn(publish::run(
        cluster.client.clone(),
        cfg.clone(),
        inv_rx,
        None,
        status_tx,
        stop.clone(),
    ));
    let slices_watched = || {
        api.audit()
            .iter()
            .any(|r| r.attributes.verb == "watch" && r.attributes.resource == "resourceslices")
    };
    for _ in 0..500 {
        if slices_watched() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(slices_watched(), "the publisher watches the node's slices");
    stop.cancel();
    publisher.await.unwrap();

    api.set_step("DRA: NodePrepareResources reads its ResourceClaim (GET of that claim)");
    let (_tx, rx) = tokio::sync::watch::channel(inv);
    let driver = erdma_dra::Driver::new(cfg.clone(), cluster.client.clone(), rx).unwrap();
    let r = driver
        .prepare(&[erdma_kubelet::dra::v1::Claim {
            namespace: "team-a".into(),
            name: "absent".into(),
            uid: "uid-1".into(),
        }])
        .await;
    let err = &r.claims["uid-1"].error;
    assert!(err.contains("reading the ResourceClaim failed"), "{err:?}");
    assert!(!err.contains("forbidden"), "{err:?}");
    assert!(
        !api.audit()
            .iter()
            .any(|r| r.attributes.resource == "resourceclaims"
                && matches!(r.attributes.verb.as_str(), "list" | "watch")),
        "no list or watch of the cluster's ResourceClaims"
    );

    api.set_step("DRA: a node back on the device plugin removes its ResourceSlices");
    resource_api::retire_dra(&cluster).await;

    let c = coverage(&authz, &user, &api.audit());
    c.verdict(ALLOWED_UNUSED).unwrap_or_else(|e| panic!("{e}"));
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md");
    let table = format!(
        "Agent with `dra.enabled`, as `{user}`:\n\n{}",
        markdown_table(&c)
    );
    check_doc_section(&doc, "agent-dra", &table).unwrap_or_else(|e| panic!("{e}"));
}

/// What every agent in a cluster does with the API server.
async fn device_plugin_node_steps(api: &FakeApiServer, cluster: &Cluster) {
    api.set_step("Driver state: node labels, `ERdmaDriverReady` condition, pending Event");
    cluster.publish_driver(None, &pending()).await.unwrap();
    api.set_step("Driver state: the change is done (Event)");
    cluster
        .publish_driver(Some(&pending()), &converged())
        .await
        .unwrap();

    api.set_step(
        "Another device plugin: `ERdmaDevicePluginConflict` condition, Warning and Normal Events",
    );
    let conflict = erdma_model::coexistence::Conflict {
        evidence: vec![erdma_model::coexistence::Evidence::Socket {
            file: "1700000000-erdma-eni.sock".into(),
            plugin: erdma_model::coexistence::OtherPlugin::Terway,
        }],
    };
    cluster
        .publish_plugin_conflict(None, &conflict, "aliyun/erdma")
        .await
        .unwrap();
    cluster
        .publish_plugin_conflict(
            Some(&conflict),
            &erdma_model::coexistence::Conflict::default(),
            "aliyun/erdma",
        )
        .await
        .unwrap();

    let trainer = PodRef {
        namespace: "team-a".into(),
        name: "trainer-0".into(),
        uid: "uid-trainer-0".into(),
    };
    api.set_step("SMC-R pre-start: Event on the pod");
    cluster
        .pod_event(&trainer, "Normal", "SmcrEnabled", "SMC-R enabled")
        .await
        .unwrap();
    api.set_step("The same Event again: a series on the first one");
    cluster
        .pod_event(&trainer, "Normal", "SmcrEnabled", "SMC-R enabled")
        .await
        .unwrap();

    api.set_step("ERIs: this node's ERdmaDevice (label selector)");
    let mut o = ERdmaDevice::new(
        "n1",
        ERdmaDeviceSpec {
            devices: vec![DeviceInfo {
                instance_id: "i-abc".into(),
                mac: "00:16:3e:00:00:01".into(),
                is_primary_eni: false,
                id: "eni-1".into(),
                network_card_index: 0,
                queue_pair: 8,
            }],
            jumbo_frame: false,
        },
    );
    o.metadata.labels = Some(erdma_k8s::labels::erdma_device_labels("n1", "i-abc"));
    api.put(&o);
    // The agent follows the object with a watch: the first list, then a change.
    let changes = erdma_k8s::agent::watch_node_eris(&cluster.client, "n1");
    futures::pin_mut!(changes);
    let eris = changes
        .next()
        .await
        .expect("the first list")
        .unwrap()
        .expect("found");
    o.spec.jumbo_frame = true;
    api.put(&o);
    let changed = tokio::time::timeout(std::time::Duration::from_secs(10), changes.next())
        .await
        .expect("the change comes through the watch")
        .expect("stream open")
        .unwrap()
        .expect("still there");
    assert!(changed.jumbo_frame);

    api.set_step("ERIs: report devices this node cannot use (status)");
    erdma_k8s::agent::report_device_problems(
        &cluster.client,
        &eris.object_name,
        &[("eni-1".into(), "no local device".into())],
    )
    .await
    .unwrap();
}

/// The agent's condition patch is a strategic merge patch: the API server merges
/// `status.conditions` by `type`, so the kubelet's conditions stay and the agent's is updated in
/// place. (A JSON merge patch would replace the list and drop `Ready`.)
#[tokio::test]
async fn kubelet_conditions_survive_the_agent_condition_patch() {
    let api = FakeApiServer::new();
    api.put(&kubelet_node("n1"));
    let cluster = Cluster::new(api.client(), "n1");
    cluster.publish_driver(None, &pending()).await.unwrap();
    cluster
        .publish_driver(Some(&pending()), &converged())
        .await
        .unwrap();
    let want = |r: &str| Some(format!("Kubelet{r}"));
    assert_eq!(
        conditions(&api, "n1"),
        vec![
            (
                "MemoryPressure".into(),
                "False".into(),
                want("MemoryPressure")
            ),
            ("DiskPressure".into(), "False".into(), want("DiskPressure")),
            ("PIDPressure".into(), "False".into(), want("PIDPressure")),
            ("Ready".into(), "True".into(), want("Ready")),
            (
                "ERdmaDriverReady".into(),
                "True".into(),
                Some("Converged".into())
            ),
        ]
    );
}
