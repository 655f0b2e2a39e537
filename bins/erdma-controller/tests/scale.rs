//! 200 GPU nodes appear at once; the running reconcilers provision them through an ECS emulator
//! that throttles every action below the controller's own rate (so `Throttling.User` answers
//! come). Asserted by counts, never by time: every node gets its ERIs and is Ready, no ERI is
//! created twice, no call is tried more often in a row than the retry policy allows, and every
//! retry follows a refusal.

use erdma_cloud::ecs::{EcsObserver, Outcome};
use erdma_cloud::emulator::{EMU_VPC, EcsEmulator, EmuInstance, EmuInstanceType, Throttle};
use erdma_cloud::{
    CredentialProvider, CredentialSource, Credentials, EcsClient, EcsConfig, RateLimit,
    RetryPolicy, SignatureVersion,
};
use erdma_controller::config::Config;
use erdma_controller::reconcile::{Ctx, run_controllers};
use erdma_k8s::ERdmaDevice;
use erdma_k8s::fake::FakeApiServer;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const NODES: usize = 200;
const RETRY: RetryPolicy = RetryPolicy {
    max_attempts: 6,
    base: Duration::from_millis(50),
    max: Duration::from_secs(1),
};

/// One call: its action and parameters.
type CallKey = (String, Vec<(String, String)>);

/// Where one call's current series of attempts stands: refusals in a row, and whether the last
/// refusal is being retried (otherwise the next attempt of this call starts a new series: a later
/// reconcile asking again after the client gave up).
#[derive(Debug, Default)]
struct Series {
    refused_in_a_row: u32,
    retrying: bool,
}

#[derive(Debug, Default)]
struct Seen {
    throttled: AtomicU64,
    retries: AtomicU64,
    series: std::sync::Mutex<BTreeMap<CallKey, Series>>,
    /// The most attempts one series of one call was refused.
    longest: AtomicU64,
}

impl EcsObserver for Seen {
    fn answered(&self, action: &str, params: &[(String, String)], outcome: Outcome) {
        if outcome != Outcome::Ok {
            self.throttled.fetch_add(1, Ordering::SeqCst);
        }
        let mut series = self.series.lock().expect("series lock");
        let s = series
            .entry((action.to_string(), params.to_vec()))
            .or_default();
        if !s.retrying {
            s.refused_in_a_row = 0;
        }
        s.retrying = false;
        if outcome == Outcome::Ok {
            s.refused_in_a_row = 0;
        } else {
            s.refused_in_a_row += 1;
            self.longest
                .fetch_max(u64::from(s.refused_in_a_row), Ordering::SeqCst);
        }
    }
    fn retried(&self, action: &str, params: &[(String, String)]) {
        self.retries.fetch_add(1, Ordering::SeqCst);
        let mut series = self.series.lock().expect("series lock");
        series
            .entry((action.to_string(), params.to_vec()))
            .or_default()
            .retrying = true;
    }
}

fn node(i: usize) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(format!("gpu-{i:03}")),
            uid: Some(format!("uid-{i}")),
            creation_timestamp: Some(Time(Timestamp::now())),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("r.i-n{i:03}")),
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
                address: format!("10.2.{}.{}", i / 256, i % 256),
            }]),
            ..Default::default()
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_nodes_through_a_throttling_ecs() {
    let emu = EcsEmulator::start().await.unwrap();
    {
        let mut st = emu.state();
        st.add_key("AKID", "secret");
        st.attach_latency = Duration::from_millis(200);
        st.add_type(EmuInstanceType {
            id: "ecs.ebmgn8v.48xlarge".into(),
            eri_quantity: Some(2),
            network_cards: 2,
            queue_pairs: 16,
            gpus: 8,
        });
        for i in 0..NODES {
            st.add_instance(EmuInstance {
                id: format!("i-n{i:03}"),
                instance_type: "ecs.ebmgn8v.48xlarge".into(),
                private_ip: format!("10.2.{}.{}", i / 256, i % 256),
                vswitch_id: "vsw-a".into(),
                security_groups: vec!["sg-a".into()],
                jumbo_frame: Some(true),
            });
        }
        // Half the controller's rate: the quota runs out and Throttling.User answers come.
        st.throttle = Some(Throttle {
            per_second: 20.0,
            burst: 5,
        });
    }
    let seen = Arc::new(Seen::default());
    let ecs = EcsClient::new(
        EcsConfig {
            endpoint: emu.endpoint(),
            region: "emu-region".into(),
            signature: SignatureVersion::V3,
            retry: RETRY,
        },
        Arc::new(CredentialProvider::new(CredentialSource::AccessKey(
            Credentials::access_key("AKID", "secret"),
        ))),
    )
    .unwrap()
    .with_rate_limit(RateLimit {
        per_second: 40.0,
        burst: 10,
    })
    .with_observer(seen.clone());
    let api = FakeApiServer::new();
    let cfg = Config {
        vpc_id: EMU_VPC.into(),
        ..Config::default()
    };
    let ctx = Arc::new(Ctx::new(api.client(), ecs, cfg));
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(run_controllers(ctx, cancel.clone()));
    for i in 0..NODES {
        api.put(&node(i));
    }
    // A hang guard only (the assertions are on counts): 200 nodes need about 10 s at 20 calls/s.
    let mut ready = 0;
    for _ in 0..1200 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        ready = api
            .list::<ERdmaDevice>(None)
            .iter()
            .filter(|o| o.all_ready() && o.spec.devices.len() == 2)
            .count();
        if ready == NODES {
            break;
        }
    }
    cancel.cancel();
    let _ = task.await;
    assert_eq!(ready, NODES, "every node has both ERIs Ready");

    let st = emu.state();
    // Every node got its ERI on card 1, created once (the ClientToken makes a repeat a no-op).
    for i in 0..NODES {
        let name = format!("eri-i-n{i:03}-1");
        let created: Vec<_> = st.enis.values().filter(|e| e.name == name).collect();
        assert_eq!(created.len(), 1, "{name}");
        assert_eq!(created[0].status, "InUse", "{name}");
    }
    let throttled: u64 = st.throttled.values().sum();
    assert!(
        throttled > 0,
        "the emulator throttled (else this proves nothing)"
    );
    // No call was tried more often in a row than the retry policy allows: a series of attempts
    // of one call (action and parameters) ends with an answer the client does not retry; a later
    // reconcile asking again starts a new series, with the policy's attempts again.
    let longest = seen.longest.load(Ordering::SeqCst);
    assert!(
        longest <= u64::from(RETRY.max_attempts),
        "a call was refused {longest} times in a row (the policy allows {} attempts)",
        RETRY.max_attempts
    );
    // Every retry followed a refusal.
    let refusals = seen.throttled.load(Ordering::SeqCst);
    let retries = seen.retries.load(Ordering::SeqCst);
    assert!(
        retries <= refusals,
        "{retries} retries, {refusals} refusals"
    );
    assert_eq!(refusals, throttled, "the client saw each refusal");
}
