//! RBAC proven by use (the controller's half; the agent's is `erdma-agent`'s `rbac_tests`).
//!
//! Every code path of the controller that talks to the API server runs here against
//! `erdma_k8s::fake::FakeApiServer` as the controller's ServiceAccount, with the RBAC objects that
//! `erdma_k8s::install::render` (and, by the chart test, the Helm chart) renders enforced: a
//! missing permission is a 403 and fails the step. Afterwards every recorded request must be
//! allowed and every granted permission must have been used by some step (a surplus permission
//! fails too). The table "permission → steps that need it" is kept in `docs/operations.md`
//! (`UPDATE=1 cargo test -p erdma-controller --test rbac` regenerates it).

use erdma_cloud::credentials::{SecretSource, aes_cbc_encrypt};
use erdma_cloud::emulator::{EMU_VPC, EcsEmulator, EmuInstance, EmuInstanceType};
use erdma_cloud::{
    CredentialProvider, CredentialSource, Credentials, EcsClient, EcsConfig, RetryPolicy,
    SignatureVersion,
};
use erdma_controller::cert::{CertManager, dns_names};
use erdma_controller::config::{Config, KubeSecretSource};
use erdma_controller::leader::LeaderElector;
use erdma_controller::reconcile::{Ctx, reconcile_device, reconcile_node, run_controllers};
use erdma_controller::webhook::CertSlot;
use erdma_k8s::ERdmaDevice;
use erdma_k8s::fake::FakeApiServer;
use erdma_k8s::install::{CONTROLLER_NAME, Values, render};
use erdma_k8s::labels::FINALIZER;
use erdma_k8s::rbac::{
    Authorizer, check_doc_section, coverage, markdown_table, service_account_user,
};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Permissions granted although no step here uses them, each with the reason no test can.
const ALLOWED_UNUSED: &[(&str, &str, &str)] = &[];

fn node(name: &str, instance: &str, ip: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            creation_timestamp: Some(Time(Timestamp::now() - SignedDuration::from_secs(10))),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("r.{instance}")),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
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

fn values() -> Values {
    let mut v = Values::default();
    // Renders every controller rule, including the kube-system Role of the STS token.
    v.credentials.kind = "ram_role_sts".into();
    v
}

async fn emulator() -> EcsEmulator {
    let emu = EcsEmulator::start().await.unwrap();
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
        id: "ecs.g7.large".into(),
        eri_quantity: None,
        network_cards: 1,
        queue_pairs: 0,
        gpus: 0,
    });
    for (id, ty, ip) in [
        ("i-a", "ecs.g8ae.4xlarge", "10.0.0.1"),
        ("i-u", "ecs.g7.large", "10.0.0.2"),
        ("i-e", "ecs.g8ae.4xlarge", "10.0.0.3"),
    ] {
        st.add_instance(EmuInstance {
            id: id.into(),
            instance_type: ty.into(),
            private_ip: ip.into(),
            vswitch_id: "vsw-a".into(),
            security_groups: vec!["sg-a".into()],
            jumbo_frame: Some(false),
        });
    }
    drop(st);
    emu
}

#[tokio::test]
async fn every_controller_api_call_is_allowed_and_every_permission_is_used() {
    let v = values();
    let objects = render(&v).unwrap();
    let authz = Authorizer::from_manifests(&objects).unwrap();
    let user = service_account_user(&v.namespace, &v.controller_sa());
    let api = FakeApiServer::new();
    api.enforce(authz.clone());
    let client = api.client_as(&user);
    let emu = emulator().await;
    let ecs = EcsClient::new(
        EcsConfig {
            endpoint: emu.endpoint(),
            region: "emu-region".into(),
            signature: SignatureVersion::V3,
            retry: RetryPolicy {
                max_attempts: 2,
                base: Duration::from_millis(1),
                max: Duration::from_millis(2),
            },
        },
        Arc::new(CredentialProvider::new(CredentialSource::AccessKey(
            Credentials::access_key("AKID", "secret"),
        ))),
    )
    .unwrap();
    let cfg = Config {
        controller_namespace: v.namespace.clone(),
        vpc_id: EMU_VPC.into(),
        ..Config::default()
    };
    let ctx = Arc::new(Ctx::new(client.clone(), ecs, cfg));

    api.set_step("Node reconciler: a new node gets its ERdmaDevice (and an Event)");
    let a = node("node-a", "i-a", "10.0.0.1");
    api.put(&a);
    reconcile_node(Arc::new(a.clone()), ctx.clone())
        .await
        .unwrap();
    let obj: ERdmaDevice = api.get(None, "node-a").expect("created");

    api.set_step("ERdmaDevice reconciler: per-device status, node still there");
    reconcile_device(Arc::new(obj), ctx.clone()).await.unwrap();
    assert!(api.get::<ERdmaDevice>(None, "node-a").unwrap().all_ready());

    api.set_step("Event recorder: the same Event again (series count)");
    let u = node("node-u", "i-u", "10.0.0.2");
    api.put(&u);
    for _ in 0..2 {
        reconcile_node(Arc::new(u.clone()), ctx.clone())
            .await
            .unwrap();
    }

    api.set_step("Node deleted: strip the original's finalizer, delete the ERdmaDevice");
    let mut o: ERdmaDevice = api.get(None, "node-a").unwrap();
    o.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    api.put(&o);
    let mut deleting = a.clone();
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    reconcile_node(Arc::new(deleting), ctx.clone())
        .await
        .unwrap();
    assert!(api.get::<ERdmaDevice>(None, "node-a").is_none());

    api.set_step("Controllers: Node and ERdmaDevice watches");
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(run_controllers(ctx.clone(), cancel.clone()));
    api.put(&node("node-e", "i-e", "10.0.0.3"));
    let mut ready = false;
    for _ in 0..400 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if api
            .get::<ERdmaDevice>(None, "node-e")
            .is_some_and(|o| o.all_ready())
        {
            ready = true;
            break;
        }
    }
    assert!(ready, "the watch-driven controllers provisioned node-e");
    cancel.cancel();
    task.await.unwrap();

    api.set_step("Leader election: create, then renew the Lease");
    let le = LeaderElector::new(client.clone(), &v.namespace, "replica-a");
    assert!(le.try_acquire_or_renew().await.unwrap());
    assert!(le.try_acquire_or_renew().await.unwrap());

    api.set_step("Webhook certificate: fill the installed Secret, rotate it before expiry");
    api.put(&MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(CONTROLLER_NAME.into()),
            ..Default::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: "erdma-smcr.network.alibabacloud.com".into(),
            client_config: WebhookClientConfig::default(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            ..Default::default()
        }]),
    });
    let secret_name = format!("{CONTROLLER_NAME}-webhook-tls");
    // The install creates the Secret empty; the controller may create no Secret at all (RBAC
    // cannot limit `create` by name: a create grant could mint token Secrets).
    let installed = objects
        .iter()
        .find(|o| o["kind"] == "Secret" && o["metadata"]["name"] == secret_name.as_str())
        .expect("the install renders the webhook certificate's Secret");
    let installed: Secret = serde_json::from_value(installed.clone()).unwrap();
    assert!(installed.data.is_none() && installed.string_data.is_none());
    api.put(&installed);
    for name in ["", "minted-token"] {
        let create = erdma_k8s::rbac::Attributes {
            user: user.clone(),
            verb: "create".into(),
            api_group: String::new(),
            resource: "secrets".into(),
            subresource: String::new(),
            namespace: v.namespace.clone(),
            name: name.into(),
        };
        assert!(
            authz.authorize(&create).is_empty(),
            "the controller may create a Secret: {:?}",
            authz.authorize(&create)
        );
    }
    let mgr = CertManager::new(
        client.clone(),
        &v.namespace,
        &secret_name,
        CONTROLLER_NAME,
        dns_names(CONTROLLER_NAME, &v.namespace, "cluster.local"),
        "controller-pod-a",
    );
    // The certificate is written into the installed Secret on first use (its labels kept); the
    // replica serves it, records that it does and puts the CA into the
    // MutatingWebhookConfiguration.
    let first = mgr.current().await.unwrap();
    let filled: Secret = api.get(Some(&v.namespace), &secret_name).unwrap();
    assert_eq!(filled.metadata.labels, installed.metadata.labels);
    assert_eq!(filled.type_, installed.type_);
    let slot = CertSlot::new(&first.cert_pem, &first.key_pem).unwrap();
    mgr.tick(&slot).await.unwrap();

    api.set_step("Webhook certificate: rotation (CA bundle into the MutatingWebhookConfiguration)");
    mgr.request_rotation().await.unwrap();
    for _ in 0..10 {
        mgr.tick(&slot).await.unwrap();
    }
    let rotated = mgr.current().await.unwrap();
    assert_ne!(rotated.cert_pem, first.cert_pem, "the rotation completed");

    api.set_step("Credentials ram_role_sts: the ACK add-on token Secret");
    let key = b"0123456789abcdef";
    let enc = |s: &str| aes_cbc_encrypt(s.as_bytes(), key, [1; 16]).unwrap();
    let token = serde_json::json!({"access.key.id": enc("STS.x"), "access.key.secret": enc("x"),
        "security.token": enc("t"), "expiration": "2099-01-01T00:00:00Z", "keyring": "0123456789abcdef"});
    api.put(&Secret {
        metadata: ObjectMeta {
            name: Some("addon.network.token".into()),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "addon.token.config".to_string(),
            k8s_openapi::ByteString(token.to_string().into_bytes()),
        )])),
        ..Default::default()
    });
    KubeSecretSource::new(client.clone(), "kube-system", "addon.network.token")
        .read()
        .await
        .unwrap();

    let c = coverage(&authz, &user, &api.audit());
    c.verdict(ALLOWED_UNUSED).unwrap_or_else(|e| panic!("{e}"));
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md");
    let table = format!(
        "Controller, as `{user}` (values: defaults with `credentials.type: ram_role_sts`):\n\n{}",
        markdown_table(&c)
    );
    check_doc_section(&doc, "controller", &table).unwrap_or_else(|e| panic!("{e}"));
}
