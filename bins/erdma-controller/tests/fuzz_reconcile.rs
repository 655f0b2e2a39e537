//! Fuzzing the controller's `ERdmaDevice` reconciler with nonsense objects, as anyone with write
//! access to the CRD (or an older or broken implementation) can leave them: ERIs with empty,
//! unknown, duplicated, huge and non-ASCII IDs and instance IDs, any card index and queue-pair
//! count, primary or not, and any status entries. Real pieces: the reconciler, the kube client
//! and the ECS client against the in-memory API server and the ECS emulator (as tests/reconcile.rs).
//!
//! Each reconcile must end with `Ok` or an error (ECS refusing nonsense is fine), never a panic;
//! a status it writes has exactly one entry per spec ERI, in spec order, each `Pending`, `Ready`
//! or `Failed` (or an agent's entry it keeps); a second reconcile of what it wrote ends the same
//! way.

use erdma_cloud::emulator::{EMU_VPC, EcsEmulator, EmuInstance, EmuInstanceType};
use erdma_cloud::{
    CredentialProvider, CredentialSource, Credentials, EcsClient, EcsConfig, RetryPolicy,
    SignatureVersion,
};
use erdma_controller::config::Config;
use erdma_controller::reconcile::{Ctx, reconcile_device};
use erdma_k8s::crd::{DeviceInfo, DeviceStatus, ERdmaDeviceSpec, ERdmaDeviceStatus};
use erdma_k8s::fake::FakeApiServer;
use erdma_k8s::{DeviceState, ERdmaDevice};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const NODE: &str = "node-a";

struct World {
    api: FakeApiServer,
    emu: EcsEmulator,
    ctx: Arc<Ctx>,
    /// The primary ENI of the node's instance.
    primary: String,
}

async fn world() -> World {
    let emu = EcsEmulator::start().await.expect("ECS emulator");
    let primary = {
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
            jumbo_frame: Some(true),
        })
    };
    let api = FakeApiServer::new();
    let values = erdma_k8s::install::Values::default();
    let objects = erdma_k8s::install::render(&values).expect("render");
    api.enforce(erdma_k8s::rbac::Authorizer::from_manifests(&objects).expect("rbac"));
    api.put(&Node {
        metadata: ObjectMeta {
            name: Some(NODE.into()),
            uid: Some("uid-node-a".into()),
            ..Default::default()
        },
        ..Default::default()
    });
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
    .expect("ECS client");
    let user = erdma_k8s::rbac::service_account_user(&values.namespace, &values.controller_sa());
    // One reconcile at a time: a batch window would only add its wait to every case.
    let ctx = Arc::new(
        Ctx::new(
            api.client_as(&user),
            ecs,
            Config {
                vpc_id: EMU_VPC.into(),
                ..Config::default()
            },
        )
        .with_batch_window(Duration::ZERO),
    );
    World {
        api,
        emu,
        ctx,
        primary,
    }
}

/// IDs: the real primary ENI, unknown, empty, huge, non-ASCII.
fn id(primary: String) -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just(primary),
        1 => Just("eni-unknown0000".to_string()),
        1 => Just(String::new()),
        1 => Just("eni-".repeat(300)),
        1 => "[ -~]{0,20}",
        1 => any::<String>(),
    ]
}

fn spec(primary: String) -> impl Strategy<Value = (ERdmaDeviceSpec, Option<ERdmaDeviceStatus>)> {
    let device = (
        id(primary.clone()),
        prop_oneof![
            Just("i-a".to_string()),
            Just(String::new()),
            Just("i-zzz".to_string()),
            any::<String>()
        ],
        "[0-9a-f:]{0,17}",
        any::<bool>(),
        prop_oneof![Just(0i64), Just(1i64), Just(-1i64), any::<i64>()],
        prop_oneof![Just(8i64), Just(0i64), Just(-5i64), any::<i64>()],
    )
        .prop_map(
            |(id, instance_id, mac, is_primary_eni, network_card_index, queue_pair)| DeviceInfo {
                instance_id,
                mac,
                is_primary_eni,
                id,
                network_card_index,
                queue_pair,
            },
        );
    let status = (
        id(primary),
        prop::sample::select(vec!["Ready", "Pending", "Failed", "", "ready", "?"]),
        prop_oneof![
            Just(String::new()),
            Just("agent: no local RDMA device".to_string()),
            any::<String>()
        ],
    )
        .prop_map(|(id, status, message)| DeviceStatus {
            id,
            status: status.into(),
            message,
        });
    (
        prop::collection::vec(device, 0..5),
        any::<bool>(),
        prop::option::of(prop::collection::vec(status, 0..4)),
    )
        .prop_map(|(devices, jumbo_frame, status)| {
            (
                ERdmaDeviceSpec {
                    devices,
                    jumbo_frame,
                },
                status.map(|devices| ERdmaDeviceStatus { devices }),
            )
        })
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

fn check_status(o: &ERdmaDevice) -> Result<(), TestCaseError> {
    let Some(status) = &o.status else {
        return Ok(());
    };
    if status.devices.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = status.devices.iter().map(|s| s.id.as_str()).collect();
    let want: Vec<&str> = o.spec.devices.iter().map(|d| d.id.as_str()).collect();
    prop_assert_eq!(ids, want);
    for s in &status.devices {
        // An agent's entry (its message prefixed `agent: `) is kept as it was while the cloud
        // side is Ready, whatever it says; every entry of the controller's own is a state.
        if s.message.starts_with(erdma_k8s::agent::AGENT_PREFIX) {
            continue;
        }
        prop_assert!(
            matches!(
                DeviceState::parse(&s.status),
                Some(DeviceState::Pending | DeviceState::Ready | DeviceState::Failed)
            ),
            "{:?}",
            s.status
        );
    }
    Ok(())
}

#[test]
fn nonsense_erdma_devices_are_reconciled_without_panic() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let w = rt.block_on(world());
    let mut runner = TestRunner::new(ProptestConfig::with_cases(cases()));
    let result = runner.run(&spec(w.primary.clone()), |(spec, status)| {
        let mut obj = ERdmaDevice::new(NODE, spec);
        obj.metadata.labels = Some(BTreeMap::from([(
            "alibabacloud.com/nodename".to_string(),
            NODE.to_string(),
        )]));
        obj.status = status;
        w.api.put(&obj);
        let stored: ERdmaDevice = w.api.get(None, NODE).expect("stored");
        let written_before = stored.status.clone();
        let r = rt.block_on(reconcile_device(Arc::new(stored), w.ctx.clone()));
        let after: ERdmaDevice = w.api.get(None, NODE).expect("still there");
        if r.is_ok() && after.status != written_before {
            check_status(&after)?;
        }
        // A second pass over what the first one wrote.
        let _ = rt.block_on(reconcile_device(Arc::new(after), w.ctx.clone()));
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // The nonsense reached ECS (the reconciler did not stop before the cloud).
    assert!(
        !w.emu
            .state()
            .calls_of("DescribeNetworkInterfaces")
            .is_empty()
    );
}
