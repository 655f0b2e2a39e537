//! Reconciler tests. Real: the reconcilers, the kube client (HTTP, JSON, errors), the ECS client
//! (signing, retries, JSON) and the credential providers. Mocked at the HTTP boundary: the
//! Kubernetes API server (`erdma_k8s::fake::FakeApiServer`, in memory) and the ECS/STS/metadata
//! services (`erdma_cloud::emulator::EcsEmulator`, `erdma_cloud::imds_emulator::MetadataEmulator`).
//! The reconcilers talk to the API server as the controller's ServiceAccount, with the RBAC that
//! the install renders enforced (a missing permission is a 403, as in a cluster).

use erdma_cloud::credentials::{OidcRole, aes_cbc_encrypt};
use erdma_cloud::emulator::{EMU_VPC, EcsEmulator, EmuInstance, EmuInstanceType};
use erdma_cloud::{
    CredentialProvider, CredentialSource, Credentials, EcsClient, EcsConfig, RetryPolicy,
    SignatureVersion,
};
use erdma_controller::config::{Config, KubeSecretSource};
use erdma_controller::reconcile::{
    Ctx, ReconcileError, error_backoff, reconcile_device, reconcile_node, run_controllers,
};
use erdma_k8s::fake::FakeApiServer;
use erdma_k8s::labels::FINALIZER;
use erdma_k8s::{DeviceState, ERdmaDevice};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::controller::Action;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const FAST: RetryPolicy = RetryPolicy {
    max_attempts: 4,
    base: Duration::from_millis(1),
    max: Duration::from_millis(4),
};

fn node(name: &str, provider: Option<&str>, ip: &str, ready: bool, age_s: i64) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            creation_timestamp: Some(Time(Timestamp::now() - SignedDuration::from_secs(age_s))),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/hostname".to_string(),
                name.to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: provider.map(str::to_string),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: ip.into(),
            }]),
            ..Default::default()
        }),
    }
}

struct World {
    api: FakeApiServer,
    emu: EcsEmulator,
}

async fn world() -> World {
    let emu = EcsEmulator::start().await.unwrap();
    {
        let mut st = emu.state();
        st.add_key("AKID", "secret");
        st.add_type(EmuInstanceType {
            id: "ecs.g8ae.4xlarge".into(),
            eri_quantity: Some(1),
            network_cards: 1,
            queue_pairs: 8,
            gpus: 0,
        });
        st.add_type(EmuInstanceType {
            id: "ecs.ebmgn8v.48xlarge".into(),
            eri_quantity: Some(2),
            network_cards: 2,
            queue_pairs: 16,
            gpus: 8,
        });
        st.add_type(EmuInstanceType {
            id: "ecs.g7.large".into(),
            eri_quantity: None,
            network_cards: 1,
            queue_pairs: 0,
            gpus: 0,
        });
    }
    let api = FakeApiServer::new();
    let mut v = erdma_k8s::install::Values::default();
    v.credentials.kind = "ram_role_sts".into();
    let objects = erdma_k8s::install::render(&v).unwrap();
    api.enforce(erdma_k8s::rbac::Authorizer::from_manifests(&objects).unwrap());
    World { api, emu }
}

fn instance(w: &World, id: &str, ty: &str, ip: &str, jumbo: Option<bool>) -> String {
    w.emu.state().add_instance(EmuInstance {
        id: id.into(),
        instance_type: ty.into(),
        private_ip: ip.into(),
        vswitch_id: "vsw-a".into(),
        security_groups: vec!["sg-a".into()],
        jumbo_frame: jumbo,
    })
}

fn ctx_with(w: &World, source: CredentialSource) -> Arc<Ctx> {
    let ecs = EcsClient::new(
        EcsConfig {
            endpoint: w.emu.endpoint(),
            region: "emu-region".into(),
            signature: SignatureVersion::V3,
            retry: FAST,
        },
        Arc::new(CredentialProvider::new(source)),
    )
    .unwrap();
    Arc::new(Ctx::new(
        w.api.client_as(&controller()),
        ecs,
        Config {
            vpc_id: EMU_VPC.into(),
            ..Config::default()
        },
    ))
}

/// The controller's ServiceAccount as the install renders it.
fn controller() -> String {
    let v = erdma_k8s::install::Values::default();
    erdma_k8s::rbac::service_account_user(&v.namespace, &v.controller_sa())
}

fn ctx(w: &World) -> Arc<Ctx> {
    ctx_with(
        w,
        CredentialSource::AccessKey(Credentials::access_key("AKID", "secret")),
    )
}

fn cr(w: &World, name: &str) -> Option<ERdmaDevice> {
    w.api.get::<ERdmaDevice>(None, name)
}

fn states(o: &ERdmaDevice) -> Vec<(String, String)> {
    o.status
        .as_ref()
        .map(|s| {
            s.devices
                .iter()
                .map(|d| (d.id.clone(), d.status.clone()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn new_single_card_node_without_eris_gets_its_primary_converted() {
    let w = world().await;
    let primary = instance(&w, "i-a", "ecs.g8ae.4xlarge", "10.0.0.1", Some(true));
    let n = node("node-a", Some("emu-region.i-a"), "10.0.0.1", true, 10);
    w.api.put(&n);
    let c = ctx(&w);
    assert_eq!(
        reconcile_node(Arc::new(n.clone()), c.clone())
            .await
            .unwrap(),
        Action::await_change()
    );

    let o = cr(&w, "node-a").expect("ERdmaDevice created");
    assert_eq!(o.spec.devices.len(), 1);
    let d = &o.spec.devices[0];
    assert_eq!(
        (
            d.id.as_str(),
            d.is_primary_eni,
            d.network_card_index,
            d.queue_pair
        ),
        (primary.as_str(), true, 0, 8)
    );
    assert_eq!(d.instance_id, "i-a");
    assert!(d.mac.starts_with("00:16:3e:"));
    assert!(o.spec.jumbo_frame);
    let labels = o.metadata.labels.clone().unwrap();
    assert_eq!(labels["alibabacloud.com/instance-id"], "i-a");
    assert_eq!(labels["alibabacloud.com/nodename"], "node-a");
    let owner = &o.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Node", "node-a", "uid-node-a")
    );
    {
        let st = w.emu.state();
        assert!(st.calls_of("CreateNetworkInterface").is_empty());
        let tag = &st.calls_of("TagResources")[0].params;
        assert_eq!(tag["ResourceId.1"], primary);
        let tags: BTreeMap<&str, &str> = (1..=2)
            .map(|i| {
                (
                    tag[&format!("Tag.{i}.Key")].as_str(),
                    tag[&format!("Tag.{i}.Value")].as_str(),
                )
            })
            .collect();
        assert_eq!(
            tags,
            BTreeMap::from([
                ("instance-id", "i-a"),
                ("terway.alibabacloud.com/excluded", "true")
            ]),
            "never creator"
        );
        assert_eq!(
            st.calls_of("DescribeInstances")[0].params["InstanceIds"],
            "[\"i-a\"]",
            "providerID used"
        );
    }

    // The ERdmaDevice reconciler converts the primary ENI and marks it Ready.
    assert_eq!(
        reconcile_device(Arc::new(o), c.clone()).await.unwrap(),
        Action::await_change()
    );
    let o = cr(&w, "node-a").unwrap();
    assert_eq!(states(&o), vec![(primary.clone(), "Ready".to_string())]);
    {
        let st = w.emu.state();
        let m = &st.calls_of("ModifyNetworkInterfaceAttribute")[0].params;
        assert_eq!(
            (
                m["NetworkInterfaceTrafficConfig.NetworkInterfaceTrafficMode"].as_str(),
                m["NetworkInterfaceTrafficConfig.QueuePairNumber"].as_str()
            ),
            ("HighPerformance", "8")
        );
        assert_eq!(st.enis[&primary].traffic_mode, "HighPerformance");
    }
    // All Ready: nothing more is asked of ECS.
    let calls = w.emu.state().calls.len();
    reconcile_device(Arc::new(o), c.clone()).await.unwrap();
    assert_eq!(w.emu.state().calls.len(), calls);
    // The node reconciler now only back-fills (already tagged: no call).
    reconcile_node(Arc::new(n), c).await.unwrap();
    assert_eq!(w.emu.state().calls.len(), calls);
}

#[tokio::test]
async fn new_node_with_existing_eris_reuses_them_by_internal_ip() {
    let w = world().await;
    instance(&w, "i-b", "ecs.g8ae.4xlarge", "10.0.0.2", Some(false));
    let eri = w.emu.state().add_secondary_eni(
        "i-b",
        0,
        "HighPerformance",
        "InUse",
        &[("creator", "alibabacloud-erdma-controller")],
    );
    let n = node("node-b", None, "10.0.0.2", true, 10);
    w.api.put(&n);
    let c = ctx(&w);
    reconcile_node(Arc::new(n), c.clone()).await.unwrap();
    let o = cr(&w, "node-b").unwrap();
    assert_eq!(o.spec.devices.len(), 1);
    assert_eq!(
        (
            o.spec.devices[0].id.as_str(),
            o.spec.devices[0].is_primary_eni
        ),
        (eri.as_str(), false)
    );
    assert!(!o.spec.jumbo_frame);
    reconcile_device(Arc::new(o), c).await.unwrap();
    assert_eq!(
        states(&cr(&w, "node-b").unwrap()),
        vec![(eri, "Ready".to_string())]
    );
    let st = w.emu.state();
    assert_eq!(
        st.calls_of("DescribeInstances")[0].params["PrivateIpAddresses"],
        "[\"10.0.0.2\"]"
    );
    assert!(st.calls_of("CreateNetworkInterface").is_empty());
    assert!(st.calls_of("ModifyNetworkInterfaceAttribute").is_empty());
    assert!(st.calls_of("AttachNetworkInterface").is_empty());
}

#[tokio::test]
async fn multiple_network_cards_create_attach_and_wait_for_attaching() {
    let w = world().await;
    w.emu.state().attach_latency = Duration::from_millis(5000);
    let primary = instance(&w, "i-g", "ecs.ebmgn8v.48xlarge", "10.0.0.3", Some(true));
    let n = node("gpu-1", Some("emu-region.i-g"), "10.0.0.3", true, 10);
    w.api.put(&n);
    let c = ctx(&w);
    reconcile_node(Arc::new(n.clone()), c.clone())
        .await
        .unwrap();
    let o = cr(&w, "gpu-1").unwrap();
    assert_eq!(o.spec.devices.len(), 2);
    assert_eq!(o.spec.devices[0].id, primary);
    assert_eq!(o.spec.devices[0].queue_pair, 16);
    let created = o.spec.devices[1].clone();
    assert_eq!(
        (
            created.network_card_index,
            created.queue_pair,
            created.is_primary_eni
        ),
        (1, 16, false)
    );
    {
        let st = w.emu.state();
        let create = &st.calls_of("CreateNetworkInterface")[0].params;
        assert_eq!(create["NetworkInterfaceName"], "eri-i-g-1");
        assert_eq!(create["NetworkInterfaceTrafficMode"], "HighPerformance");
        assert_eq!(create["VSwitchId"], "vsw-a");
        assert_eq!(create["SecurityGroupIds.1"], "sg-a");
        assert_eq!(create["ClientToken"], "erdma-i-g-1");
        let eni = &st.enis[&created.id];
        assert_eq!(eni.tags["creator"], "alibabacloud-erdma-controller");
        assert_eq!(eni.tags["terway.alibabacloud.com/excluded"], "true");
        assert_eq!(eni.tags["instance-id"], "i-g");
    }
    // First pass: primary converted (Ready), card 1 attached (Pending), requeue in 2 s.
    let a = reconcile_device(Arc::new(o), c.clone()).await.unwrap();
    assert_eq!(a, Action::requeue(Duration::from_secs(2)));
    let o = cr(&w, "gpu-1").unwrap();
    assert_eq!(
        states(&o),
        vec![
            (primary.clone(), "Ready".into()),
            (created.id.clone(), "Pending".into())
        ]
    );
    assert_eq!(
        w.emu.state().calls_of("AttachNetworkInterface")[0].params["NetworkCardIndex"],
        "1"
    );
    // The watch event of that status write, a moment later: nothing to look at before the
    // attach can be done, so no describe and no write, another look within 2 s.
    let describes = w.emu.state().calls_of("DescribeNetworkInterfaces").len();
    let a = reconcile_device(Arc::new(o), c.clone()).await.unwrap();
    assert!(
        a != Action::await_change() && a != Action::requeue(Duration::from_secs(10)),
        "{a:?}"
    );
    assert_eq!(
        w.emu.state().calls_of("DescribeNetworkInterfaces").len(),
        describes
    );
    // Past the wait (and a batch window), ECS still attaching (5 s): Pending, still "attaching", nothing written.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let before = cr(&w, "gpu-1").unwrap();
    let a = reconcile_device(Arc::new(before.clone()), c.clone())
        .await
        .unwrap();
    assert_eq!(a, Action::requeue(Duration::from_secs(2)));
    assert_eq!(
        w.emu.state().calls_of("DescribeNetworkInterfaces").len(),
        describes + 1
    );
    let o = cr(&w, "gpu-1").unwrap();
    assert_eq!(o.status.as_ref().unwrap().devices[1].message, "attaching");
    assert_eq!(
        o.metadata.resource_version,
        before.metadata.resource_version
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        reconcile_device(Arc::new(o), c.clone()).await.unwrap(),
        Action::await_change()
    );
    assert!(cr(&w, "gpu-1").unwrap().all_ready());
    assert_eq!(
        w.emu.state().calls_of("AttachNetworkInterface").len(),
        1,
        "attached once"
    );

    // Losing the object and reconciling again creates no second ENI (ClientToken, reuse).
    w.api.remove::<ERdmaDevice>(None, "gpu-1");
    reconcile_node(Arc::new(n), c).await.unwrap();
    let st = w.emu.state();
    assert_eq!(
        st.enis.values().filter(|e| e.name == "eri-i-g-1").count(),
        1
    );
    assert_eq!(cr(&w, "gpu-1").unwrap().spec.devices[1].id, created.id);
}

#[tokio::test]
async fn a_detached_eri_created_earlier_for_the_instance_is_attached_not_recreated() {
    let w = world().await;
    let primary = instance(&w, "i-r", "ecs.ebmgn8v.48xlarge", "10.0.0.7", Some(true));
    // What an earlier run left: an ERI it created for i-r (tags), detached since; plus one for
    // another instance and an untagged one, which must not be taken.
    let (mine, theirs, untagged) = {
        let mut st = w.emu.state();
        let ours = [
            ("creator", "alibabacloud-erdma-controller"),
            ("instance-id", "i-r"),
        ];
        let mine = st.add_secondary_eni("i-r", 0, "HighPerformance", "Available", &ours);
        let theirs = st.add_secondary_eni(
            "i-r",
            0,
            "HighPerformance",
            "Available",
            &[
                ("creator", "alibabacloud-erdma-controller"),
                ("instance-id", "i-other"),
            ],
        );
        let untagged = st.add_secondary_eni("i-r", 0, "HighPerformance", "Available", &[]);
        (mine, theirs, untagged)
    };
    let n = node("gpu-r", Some("emu-region.i-r"), "10.0.0.7", true, 10);
    w.api.put(&n);
    let c = ctx(&w);
    reconcile_node(Arc::new(n), c.clone()).await.unwrap();
    let o = cr(&w, "gpu-r").unwrap();
    let ids: Vec<(&str, i64)> = o
        .spec
        .devices
        .iter()
        .map(|d| (d.id.as_str(), d.network_card_index))
        .collect();
    assert_eq!(ids, vec![(primary.as_str(), 0), (mine.as_str(), 1)]);
    {
        let st = w.emu.state();
        assert!(
            st.calls_of("CreateNetworkInterface").is_empty(),
            "no new ENI"
        );
        let lookup = st
            .calls_of("DescribeNetworkInterfaces")
            .into_iter()
            .find(|c| c.params.contains_key("Tag.1.Key"))
            .expect("looked the tagged ERIs up");
        // One lookup of every detached ERI of this controller, filtered per instance here.
        assert_eq!(
            lookup.params["Tag.1.Value"],
            "alibabacloud-erdma-controller"
        );
        assert_eq!(lookup.params["Status"], "Available");
    }
    // The device reconciler attaches it on card 1.
    reconcile_device(Arc::new(o), c).await.unwrap();
    let st = w.emu.state();
    let attach = &st.calls_of("AttachNetworkInterface")[0].params;
    assert_eq!(
        (
            attach["NetworkInterfaceId"].as_str(),
            attach["NetworkCardIndex"].as_str()
        ),
        (mine.as_str(), "1")
    );
    assert_eq!(st.enis[&theirs].status, "Available");
    assert_eq!(st.enis[&untagged].status, "Available");
}

#[tokio::test]
async fn a_used_up_queue_pair_budget_creates_nothing_and_says_so() {
    let w = world().await;
    instance(&w, "i-q", "ecs.g8ae.4xlarge", "10.0.0.8", Some(false));
    // A HighPerformance ENI someone else attached holds the type's 8 queue pairs, and the
    // controller is told not to adopt ENIs it did not create.
    w.emu.state().add_secondary_eni(
        "i-q",
        0,
        "HighPerformance",
        "InUse",
        &[("owner", "someone")],
    );
    let n = node("node-q", Some("emu-region.i-q"), "10.0.0.8", true, 10);
    w.api.put(&n);
    let ecs = EcsClient::new(
        EcsConfig {
            endpoint: w.emu.endpoint(),
            region: "emu-region".into(),
            signature: SignatureVersion::V3,
            retry: FAST,
        },
        Arc::new(CredentialProvider::new(CredentialSource::AccessKey(
            Credentials::access_key("AKID", "secret"),
        ))),
    )
    .unwrap();
    let cfg = Config {
        manage_non_owned_enis: false,
        vpc_id: EMU_VPC.into(),
        ..Config::default()
    };
    let c = Arc::new(Ctx::new(w.api.client(), ecs, cfg));
    let err = reconcile_node(Arc::new(n), c).await.unwrap_err();
    assert!(err.to_string().contains("queue pairs"), "{err}");
    assert!(cr(&w, "node-q").is_none());
    let st = w.emu.state();
    assert!(st.calls_of("CreateNetworkInterface").is_empty());
    assert!(st.calls_of("ModifyNetworkInterfaceAttribute").is_empty());
}

#[tokio::test]
async fn node_not_ready_waits_then_proceeds_after_the_timeout() {
    let w = world().await;
    instance(&w, "i-n", "ecs.g8ae.4xlarge", "10.0.0.4", Some(false));
    let young = node("node-n", Some("r.i-n"), "10.0.0.4", false, 5);
    w.api.put(&young);
    let c = ctx(&w);
    assert_eq!(
        reconcile_node(Arc::new(young), c.clone()).await.unwrap(),
        Action::requeue(Duration::from_secs(30))
    );
    assert!(cr(&w, "node-n").is_none());
    assert!(
        w.emu.state().calls.is_empty(),
        "no cloud calls for a node that is not Ready"
    );
    let old = node("node-n", Some("r.i-n"), "10.0.0.4", false, 301);
    reconcile_node(Arc::new(old), c).await.unwrap();
    assert!(
        cr(&w, "node-n").is_some(),
        "provisioned after waitNodeReadyTimeoutSeconds"
    );
}

#[tokio::test]
async fn node_deleted_removes_its_object_and_the_original_finalizer() {
    let w = world().await;
    instance(&w, "i-d", "ecs.g8ae.4xlarge", "10.0.0.5", Some(false));
    let n = node("node-d", Some("r.i-d"), "10.0.0.5", true, 10);
    w.api.put(&n);
    let c = ctx(&w);
    reconcile_node(Arc::new(n.clone()), c.clone())
        .await
        .unwrap();
    // An object written by the Go controller may carry its finalizer.
    let mut o = cr(&w, "node-d").unwrap();
    o.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    w.api.put(&o);

    // (a) The Node is being deleted.
    let mut deleting = n.clone();
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    reconcile_node(Arc::new(deleting), c.clone()).await.unwrap();
    assert!(
        cr(&w, "node-d").is_none(),
        "finalizer stripped and object deleted"
    );

    // (b) The Node vanished while the controller was down: the ERdmaDevice reconciler cleans up.
    reconcile_node(Arc::new(n), c.clone()).await.unwrap();
    let o = cr(&w, "node-d").unwrap();
    w.api.remove::<Node>(None, "node-d");
    reconcile_device(Arc::new(o), c).await.unwrap();
    assert!(cr(&w, "node-d").is_none());
}

#[tokio::test]
async fn ecs_throttling_is_retried_and_failures_surface_without_partial_objects() {
    let w = world().await;
    instance(&w, "i-t", "ecs.g8ae.4xlarge", "10.0.0.6", None);
    let n = node("node-t", Some("r.i-t"), "10.0.0.6", true, 10);
    w.api.put(&n);
    let c = ctx(&w);
    // Throttled twice, then fine; DescribeInstanceAttribute fails for good (jumbo → false).
    w.emu
        .state()
        .inject_error(Some("DescribeNetworkInterfaces"), 400, "Throttling.User", 2);
    reconcile_node(Arc::new(n.clone()), c.clone())
        .await
        .expect("retried through throttling");
    let o = cr(&w, "node-t").unwrap();
    assert!(
        !o.spec.jumbo_frame,
        "jumbo-frame lookup failure means false"
    );
    assert_eq!(w.emu.state().calls_of("DescribeNetworkInterfaces").len(), 3);

    // Persistent 5xx: a retryable error, no object written.
    w.api.remove::<ERdmaDevice>(None, "node-t");
    w.emu
        .state()
        .inject_error(Some("DescribeInstances"), 503, "ServiceUnavailable", 10);
    let err = reconcile_node(Arc::new(n.clone()), c.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ReconcileError::Batch(e) if e.is_retryable()),
        "{err}"
    );
    assert_eq!(error_backoff(&err), Duration::from_secs(15));
    assert!(cr(&w, "node-t").is_none());
    w.emu.state().inject.clear();

    // A failing attach is reported as Failed with the cloud's message, and retried later.
    reconcile_node(Arc::new(n), c.clone()).await.unwrap();
    let mut o = cr(&w, "node-t").unwrap();
    let eri = w
        .emu
        .state()
        .add_secondary_eni("i-t", 0, "HighPerformance", "Available", &[]);
    o.spec.devices[0].id = eri.clone();
    o.spec.devices[0].is_primary_eni = false;
    w.api.put(&o);
    w.emu.state().inject_error(
        Some("AttachNetworkInterface"),
        403,
        "InvalidOperation.Conflict",
        1,
    );
    let a = reconcile_device(Arc::new(cr(&w, "node-t").unwrap()), c.clone())
        .await
        .unwrap();
    assert_eq!(a, Action::requeue(Duration::from_secs(10)));
    let o = cr(&w, "node-t").unwrap();
    let s = &o.status.as_ref().unwrap().devices[0];
    assert_eq!(s.state(), Some(DeviceState::Failed));
    assert!(
        s.message.contains("InvalidOperation.Conflict"),
        "{}",
        s.message
    );
    // The watch event of that write: not retried at once (the wait honours the cloud's
    // refusal), only asked to come back within the 10 s.
    let attaches = w.emu.state().calls_of("AttachNetworkInterface").len();
    let a = reconcile_device(Arc::new(o.clone()), c.clone())
        .await
        .unwrap();
    assert!(
        a != Action::await_change() && a != Action::requeue(Duration::from_secs(15)),
        "{a:?}"
    );
    assert_eq!(
        w.emu.state().calls_of("AttachNetworkInterface").len(),
        attaches
    );
    // A change by someone else (a new resourceVersion) is looked at at once: retried.
    w.api.put(&o);
    let changed = cr(&w, "node-t").unwrap();
    assert_ne!(
        changed.metadata.resource_version,
        o.metadata.resource_version
    );
    reconcile_device(Arc::new(changed), c).await.unwrap();
    assert_eq!(
        w.emu.state().calls_of("AttachNetworkInterface").len(),
        attaches + 1
    );
    assert_eq!(
        states(&cr(&w, "node-t").unwrap()),
        vec![(eri, "Pending".into())]
    );
}

#[tokio::test]
async fn unsupported_instance_types_get_no_object() {
    let w = world().await;
    instance(&w, "i-u", "ecs.g7.large", "10.0.0.7", Some(false));
    let n = node("node-u", Some("r.i-u"), "10.0.0.7", true, 10);
    w.api.put(&n);
    assert_eq!(
        reconcile_node(Arc::new(n), ctx(&w)).await.unwrap(),
        Action::await_change()
    );
    assert!(cr(&w, "node-u").is_none());
    assert!(
        !w.api.requests_matching("POST", "/events").is_empty(),
        "an Event explains why"
    );
}

#[tokio::test]
async fn every_credential_type_provisions_a_node() {
    let w = world().await;
    // oidc_role_arn
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "jwt").unwrap();
    w.emu
        .state()
        .oidc_tokens
        .insert("jwt".into(), "acs:ram::1:role/erdma".into());
    let oidc = CredentialSource::OidcRole(OidcRole {
        role_arn: "acs:ram::1:role/erdma".into(),
        provider_arn: "acs:ram::1:oidc-provider/ack".into(),
        token_file: token,
        session_name: "erdma-controller".into(),
        sts_endpoint: w.emu.endpoint(),
    });
    // ecs_ram_role
    w.emu.state().keys.insert(
        "STS.role".into(),
        ("role-secret".into(), Some("role-token".into())),
    );
    let md = erdma_cloud::imds_emulator::MetadataEmulator::start()
        .await
        .unwrap();
    md.set("/latest/meta-data/ram/security-credentials/", "node-role");
    md.set("/latest/meta-data/ram/security-credentials/node-role",
        r#"{"Code":"Success","AccessKeyId":"STS.role","AccessKeySecret":"role-secret","SecurityToken":"role-token","Expiration":"2099-01-01T00:00:00Z"}"#);
    let ram = CredentialSource::EcsRamRole {
        metadata_endpoint: md.endpoint(),
        role_name: None,
    };
    // ram_role_sts: the Secret kube-system/addon.network.token read through the API server.
    w.emu.state().keys.insert(
        "STS.addon".into(),
        ("addon-secret".into(), Some("addon-token".into())),
    );
    let key = b"0123456789abcdef";
    let enc = |s: &str, iv: u8| aes_cbc_encrypt(s.as_bytes(), key, [iv; 16]).unwrap();
    let token_cfg = serde_json::json!({"access.key.id": enc("STS.addon", 1), "access.key.secret": enc("addon-secret", 2),
        "security.token": enc("addon-token", 3), "expiration": "2099-01-01T00:00:00Z", "keyring": "0123456789abcdef"});
    w.api.put(&Secret {
        metadata: ObjectMeta {
            name: Some("addon.network.token".into()),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "addon.token.config".to_string(),
            k8s_openapi::ByteString(token_cfg.to_string().into_bytes()),
        )])),
        ..Default::default()
    });
    let sts = CredentialSource::StsSecret(Arc::new(KubeSecretSource::new(
        w.api.client_as(&controller()),
        "kube-system",
        "addon.network.token",
    )));
    let ak = CredentialSource::AccessKey(Credentials::access_key("AKID", "secret"));

    for (i, (kind, source, key_id)) in [
        ("access_key", ak, "AKID"),
        ("oidc_role_arn", oidc, "STS.emu"),
        ("ecs_ram_role", ram, "STS.role"),
        ("ram_role_sts", sts, "STS.addon"),
    ]
    .into_iter()
    .enumerate()
    {
        let id = format!("i-c{i}");
        let ip = format!("10.1.0.{i}");
        instance(&w, &id, "ecs.g8ae.4xlarge", &ip, Some(false));
        let n = node(
            &format!("cred-{i}"),
            Some(&format!("r.{id}")),
            &ip,
            true,
            10,
        );
        w.api.put(&n);
        reconcile_node(Arc::new(n), ctx_with(&w, source))
            .await
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert!(cr(&w, &format!("cred-{i}")).is_some(), "{kind}");
        let st = w.emu.state();
        let last = st
            .calls_of("DescribeInstances")
            .last()
            .map(|c| c.access_key_id.clone())
            .unwrap();
        assert!(last.starts_with(key_id), "{kind} signed with {last}");
    }
}

#[tokio::test]
async fn the_running_controllers_provision_a_new_node_end_to_end() {
    let w = world().await;
    let primary = instance(&w, "i-e", "ecs.g8ae.4xlarge", "10.0.0.9", Some(false));
    let c = ctx(&w);
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(run_controllers(c, cancel.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    w.api
        .put(&node("node-e", Some("r.i-e"), "10.0.0.9", true, 10));
    let mut ready = false;
    // Up to 20 s: generous, CI shares two cores with other builds (this proves it happens).
    for _ in 0..400 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if cr(&w, "node-e").is_some_and(|o| o.all_ready()) {
            ready = true;
            break;
        }
    }
    assert!(
        ready,
        "the watch-driven controllers created and readied the ERdmaDevice"
    );
    assert_eq!(cr(&w, "node-e").unwrap().spec.devices[0].id, primary);
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("graceful shutdown")
        .unwrap();
}

#[tokio::test]
async fn agent_reported_problems_are_kept_while_the_cloud_side_is_ready() {
    let w = world().await;
    let primary = instance(&w, "i-p", "ecs.g8ae.4xlarge", "10.0.0.8", Some(false));
    let n = node("node-p", Some("r.i-p"), "10.0.0.8", true, 10);
    w.api.put(&n);
    let c = ctx(&w);
    reconcile_node(Arc::new(n), c.clone()).await.unwrap();
    reconcile_device(Arc::new(cr(&w, "node-p").unwrap()), c.clone())
        .await
        .unwrap();
    assert!(cr(&w, "node-p").unwrap().all_ready());
    // The agent cannot find the device locally and says so.
    erdma_k8s::agent::report_device_problems(
        &w.api.client(),
        "node-p",
        &[(primary.clone(), "no netdev".into())],
    )
    .await
    .unwrap();
    let a = reconcile_device(Arc::new(cr(&w, "node-p").unwrap()), c.clone())
        .await
        .unwrap();
    assert_eq!(
        a,
        Action::await_change(),
        "no 10 s requeue for a node-side problem"
    );
    let o = cr(&w, "node-p").unwrap();
    let s = &o.status.unwrap().devices[0];
    assert_eq!(s.state(), Some(DeviceState::Failed));
    assert_eq!(s.message, "agent: no netdev");
}

/// A node can rewrite its own Node object: a providerID naming another node's instance, or an
/// instance of another VPC at the node's own IP, must change nothing in ECS.
#[tokio::test]
async fn a_node_naming_an_instance_that_is_not_it_gets_no_ecs_write() {
    let w = world().await;
    // Two cards: a match would create an ERI and attach it.
    instance(
        &w,
        "i-victim",
        "ecs.ebmgn8v.48xlarge",
        "10.0.0.20",
        Some(true),
    );
    instance(
        &w,
        "i-evil",
        "ecs.ebmgn8v.48xlarge",
        "10.0.0.21",
        Some(true),
    );
    // Same private IP as the node, other VPC.
    instance(
        &w,
        "i-elsewhere",
        "ecs.ebmgn8v.48xlarge",
        "10.0.0.21",
        Some(true),
    );
    w.emu
        .state()
        .instance_vpcs
        .insert("i-elsewhere".into(), "vpc-other".into());
    let c = ctx(&w);
    for (node_name, provider, check) in [
        ("node-evil", "emu-region.i-victim", "private_ip"),
        ("node-evil2", "emu-region.i-elsewhere", "vpc"),
    ] {
        let n = node(node_name, Some(provider), "10.0.0.21", true, 10);
        w.api.put(&n);
        assert_eq!(
            reconcile_node(Arc::new(n), c.clone()).await.unwrap(),
            Action::await_change()
        );
        assert!(
            cr(&w, node_name).is_none(),
            "no ERdmaDevice for {node_name}"
        );
        let events: Vec<k8s_openapi::api::events::v1::Event> = w.api.list(Some("default"));
        let e = events
            .iter()
            .find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node_name)
                    && e.reason.as_deref() == Some("InstanceMismatch")
            })
            .unwrap_or_else(|| panic!("a Warning Event on {node_name}: {events:?}"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        let note = e.note.as_deref().unwrap_or_default();
        assert!(
            note.contains(node_name) && note.contains("providerID"),
            "{note}"
        );
        let metrics = c.metrics.render();
        assert!(
            metrics.contains(&format!(
                "erdma_controller_instance_mismatch_total{{check=\"{check}\"}} 1"
            )),
            "{metrics}"
        );
    }
    // ECS was only read.
    let st = w.emu.state();
    let actions: std::collections::BTreeSet<&str> =
        st.calls.iter().map(|c| c.action.as_str()).collect();
    assert_eq!(
        actions,
        std::collections::BTreeSet::from(["DescribeInstances"]),
        "only reads"
    );
    assert!(
        st.enis
            .values()
            .all(|e| e.traffic_mode != "HighPerformance")
    );
}
