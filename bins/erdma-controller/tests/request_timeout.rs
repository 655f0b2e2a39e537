//! The controller's deadlines (issue 30, item 3): `kubeRequestTimeoutSeconds` on the Kubernetes
//! client, `ecsConnectTimeoutSeconds`/`ecsReadTimeoutSeconds` on the ECS client. An API server or
//! ECS endpoint that accepts and never answers fails the reconcile with an error naming what was
//! being done and the deadline, and the error policy requeues it; a hung ECS attempt does not
//! stop the controllers. `GUARD` only keeps a regression from hanging the test run; nothing here
//! measures how fast anything is.

use erdma_cloud::emulator::{EcsEmulator, EmuInstance, EmuInstanceType};
use erdma_cloud::http::Timeouts;
use erdma_cloud::{
    CredentialProvider, CredentialSource, Credentials, EcsClient, EcsConfig, RetryPolicy,
    SignatureVersion,
};
use erdma_controller::config::Config;
use erdma_controller::reconcile::{
    Ctx, ReconcileError, error_backoff, reconcile_node, run_controllers,
};
use erdma_k8s::ERdmaDevice;
use erdma_k8s::fake::FakeApiServer;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Far beyond every deadline below: reaching it means something hung.
const GUARD: Duration = Duration::from_secs(90);

const FAST: RetryPolicy = RetryPolicy {
    max_attempts: 2,
    base: Duration::from_millis(1),
    max: Duration::from_millis(5),
};

fn node(name: &str, instance: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            creation_timestamp: Some(Time(Timestamp::now())),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("emu-region.{instance}")),
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
                address: "10.0.0.1".into(),
            }]),
            ..Default::default()
        }),
    }
}

/// The controller's config with 1 s deadlines everywhere.
fn short_config() -> Config {
    serde_json::from_str(
        r#"{"kubeRequestTimeoutSeconds": 1, "ecsConnectTimeoutSeconds": 1, "ecsReadTimeoutSeconds": 1, "vpcId": "vpc-emu"}"#,
    )
    .expect("config")
}

fn ecs(endpoint: &str, cfg: &Config) -> EcsClient {
    EcsClient::new(
        EcsConfig {
            endpoint: endpoint.to_string(),
            region: "emu-region".into(),
            signature: SignatureVersion::V3,
            retry: FAST,
        },
        Arc::new(CredentialProvider::new(CredentialSource::AccessKey(
            Credentials::access_key("AKID", "secret"),
        ))),
    )
    .expect("ECS client")
    .with_timeouts(cfg.ecs_timeouts())
}

/// Accepts connections and holds them without a byte of answer; the first `held` of them only
/// when `upstream` is set (later ones are passed to it). Its `http://` address and a count.
async fn holding(held: usize, upstream: Option<String>) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((mut s, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst);
            match &upstream {
                Some(up) if n >= held => {
                    let up = up.clone();
                    tokio::spawn(async move {
                        if let Ok(mut u) = TcpStream::connect(&up).await {
                            let _ = tokio::io::copy_bidirectional(&mut s, &mut u).await;
                        }
                    });
                }
                _ => kept.push(s),
            }
        }
    });
    (url, accepted)
}

#[test]
fn the_deadlines_come_from_config_json_with_documented_defaults() {
    let d = Config::default();
    assert_eq!(d.kube_request_timeout(), Some(Duration::from_secs(70)));
    assert_eq!(d.ecs_timeouts(), Timeouts::default());
    assert_eq!(
        d.ecs_timeouts(),
        Timeouts {
            connect: Some(Duration::from_secs(5)),
            read: Some(Duration::from_secs(10)),
        }
    );
    let c = short_config();
    assert_eq!(c.kube_request_timeout(), Some(Duration::from_secs(1)));
    assert_eq!(
        c.kube_client_options().request_timeout,
        Some(Duration::from_secs(1))
    );
    assert_eq!(c.ecs_timeouts().read, Some(Duration::from_secs(1)));
    let none: Config = serde_json::from_str(
        r#"{"kubeRequestTimeoutSeconds": 0, "ecsConnectTimeoutSeconds": 0, "ecsReadTimeoutSeconds": 0}"#,
    )
    .expect("config");
    assert_eq!(none.kube_request_timeout(), None);
    assert_eq!(
        none.ecs_timeouts(),
        Timeouts {
            connect: None,
            read: None
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_api_server_fails_the_reconcile_naming_the_deadline() {
    let cfg = short_config();
    let (api_url, _) = holding(0, None).await;
    let (ecs_url, ecs_calls) = holding(0, None).await;
    let client = erdma_k8s::client::build(
        kube::Config::new(api_url.parse().expect("url")),
        &cfg.kube_client_options(),
    )
    .expect("client");
    let ctx = Arc::new(Ctx::new(client, ecs(&ecs_url, &cfg), cfg));
    let err = tokio::time::timeout(GUARD, reconcile_node(Arc::new(node("node-a", "i-a")), ctx))
        .await
        .expect("the reconcile ends instead of hanging")
        .expect_err("the API server never answered");
    assert!(matches!(err, ReconcileError::Kube(..)), "{err:?}");
    let msg = format!("{err}");
    assert!(
        msg.contains("get ERdmaDevice node-a") && msg.contains("did not answer within 1s"),
        "{msg}"
    );
    assert_eq!(
        error_backoff(&err),
        Duration::from_secs(5),
        "requeued by the error policy"
    );
    assert_eq!(ecs_calls.load(Ordering::SeqCst), 0, "ECS was not reached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_ecs_endpoint_fails_the_reconcile_naming_the_action_and_deadline() {
    let cfg = short_config();
    let api = FakeApiServer::new();
    let n = node("node-a", "i-a");
    api.put(&n);
    let (ecs_url, ecs_calls) = holding(0, None).await;
    let ctx = Arc::new(Ctx::new(api.client(), ecs(&ecs_url, &cfg), cfg));
    let err = tokio::time::timeout(GUARD, reconcile_node(Arc::new(n), ctx))
        .await
        .expect("the reconcile ends instead of hanging")
        .expect_err("ECS never answered");
    let msg = format!("{err}");
    for part in [
        "ECS DescribeInstances",
        "no answer within 1s",
        "2 attempt(s)",
        "ecsReadTimeoutSeconds",
    ] {
        assert!(msg.contains(part), "{part:?} missing: {msg}");
    }
    // DescribeInstances is batched across reconciles: its ECS error comes through the batch.
    assert!(
        matches!(
            &err,
            ReconcileError::Batch(erdma_controller::batch::BatchError::Ecs(_))
        ),
        "{err:?}"
    );
    assert_eq!(
        error_backoff(&err),
        Duration::from_secs(15),
        "retryable: requeued soon"
    );
    assert_eq!(ecs_calls.load(Ordering::SeqCst), 2, "one per attempt");
    assert!(
        api.get::<ERdmaDevice>(None, "node-a").is_none(),
        "nothing recorded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controllers_go_on_past_a_hung_ecs_call() {
    let emu = EcsEmulator::start().await.expect("emulator");
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
        st.add_instance(EmuInstance {
            id: "i-a".into(),
            instance_type: "ecs.g8ae.4xlarge".into(),
            private_ip: "10.0.0.1".into(),
            vswitch_id: "vsw-a".into(),
            security_groups: vec!["sg-a".into()],
            jumbo_frame: Some(false),
        });
    }
    let upstream = emu
        .endpoint()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    // The first ECS connection hangs; the retry and everything after reach the emulator.
    let (ecs_url, ecs_calls) = holding(1, Some(upstream)).await;
    let cfg = short_config();
    let api = FakeApiServer::new();
    api.put(&node("node-a", "i-a"));
    let ctx = Arc::new(Ctx::new(api.client(), ecs(&ecs_url, &cfg), cfg));
    let cancel = CancellationToken::new();
    let run = tokio::spawn(run_controllers(ctx, cancel.clone()));
    let created = tokio::time::timeout(GUARD, async {
        loop {
            if let Some(o) = api.get::<ERdmaDevice>(None, "node-a") {
                return o;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the node is provisioned after the hung ECS call");
    assert_eq!(created.spec.devices.len(), 1);
    assert_eq!(created.spec.devices[0].instance_id, "i-a");
    assert!(
        ecs_calls.load(Ordering::SeqCst) >= 2,
        "the hung call was retried"
    );
    cancel.cancel();
    tokio::time::timeout(GUARD, run)
        .await
        .expect("the controllers stop")
        .expect("no panic");
}
