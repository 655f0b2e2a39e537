//! Fuzzing the device plugin's handlers with what a broken or hostile kubelet can send: the
//! `Allocate`, `GetPreferredAllocation` and `PreStartContainer` requests decoded with prost from
//! arbitrary bytes, from real requests with bytes mutated, and built from hostile device IDs
//! (not slot IDs, slots out of range, devices not served or unhealthy, duplicates, leading zeros,
//! huge counts and sizes), then handed to the service's own handlers as tonic would.
//!
//! `Allocate` must grant exactly the requests whose every ID is a distinct slot of a served
//! device, healthy or not (the kubelet offered it healthy; refusing would fail the pod's
//! admission for good; the rule is written here again, from the slot-ID format, as the oracle), and
//! refuse the others with InvalidArgument; a grant names only served devices. A preferred
//! allocation picks only offered IDs and never more than asked. Nothing panics.

use erdma_deviceplugin::devices::ServedSet;
use erdma_deviceplugin::podresources::used_slots;
use erdma_deviceplugin::service::{DevicePluginService, PluginState};
use erdma_deviceplugin::{CdiConfig, Metrics, NoopPreStart, PluginConfig};
use erdma_kubelet::deviceplugin::v1beta1 as api;
use erdma_kubelet::deviceplugin::v1beta1::device_plugin_server::DevicePlugin;
use erdma_kubelet::podresources::Holder;
use erdma_model::container::ENV_ERDMA_DEVICES;
use erdma_model::{CharDevice, DeviceKind, Health, NodeDevices, RdmaDevice};
use proptest::prelude::*;
use proptest::sample::Index;
use prost::Message;
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const SLOTS: u32 = 16;
/// Served and healthy.
const HEALTHY: &str = "erdma_0";
/// Served, unhealthy.
const SICK: &str = "erdma_1";

fn node() -> NodeDevices {
    let mut node = NodeDevices::empty();
    for (i, name) in [HEALTHY, SICK].into_iter().enumerate() {
        let mut d = RdmaDevice::named(name, DeviceKind::Erdma);
        d.char_devices.uverbs = Some(CharDevice {
            path: format!("/dev/infiniband/uverbs{i}"),
            major: Some(231),
            minor: Some(192 + i as u32),
            present: true,
        });
        if name == SICK {
            d.health = Health::from_reasons(vec!["port 1 is DOWN".into()]);
        }
        node.devices.push(d);
    }
    node.rdma_cm = Some(CharDevice {
        path: "/dev/infiniband/rdma_cm".into(),
        major: Some(10),
        minor: Some(58),
        present: true,
    });
    node
}

struct Plugin {
    svc: DevicePluginService,
    _served: watch::Sender<Arc<ServedSet>>,
}

fn plugin(cdi: bool, all: bool) -> Plugin {
    let (tx, rx) = watch::channel(Arc::new(ServedSet::from_snapshot(&node(), SLOTS)));
    let mut cfg = PluginConfig::new("/nonexistent/device-plugins");
    cfg.slots_per_device = SLOTS;
    cfg.allocate_all_devices = all;
    cfg.cdi = cdi.then(|| CdiConfig {
        spec_dir: "/nonexistent/cdi".into(),
        kind: "aliyun.com/erdma".into(),
    });
    let state = PluginState {
        cfg,
        served: rx,
        metrics: Arc::new(Metrics::new()),
        pre_start: Arc::new(NoopPreStart),
        reclaim: Arc::new(tokio::sync::Notify::new()),
        on_allocate: None,
        holders: None,
    };
    Plugin {
        svc: DevicePluginService::new(Arc::new(state), CancellationToken::new()),
        _served: tx,
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The oracle's slot rule: `<device>/<index>`, the device served (healthy or not), the index a
/// decimal below the slot count, without sign or leading zeros.
fn grantable(id: &str) -> bool {
    let Some((dev, idx)) = id.rsplit_once('/') else {
        return false;
    };
    (dev == HEALTHY || dev == SICK)
        && !idx.is_empty()
        && idx.bytes().all(|b| b.is_ascii_digit())
        && (idx == "0" || !idx.starts_with('0'))
        && idx.parse::<u32>().is_ok_and(|n| n < SLOTS)
}

fn allocatable(req: &api::AllocateRequest) -> bool {
    !req.container_requests.is_empty()
        && req.container_requests.len() <= 256
        && req.container_requests.iter().all(|c| {
            let distinct: BTreeSet<&String> = c.devices_ids.iter().collect();
            !c.devices_ids.is_empty()
                && distinct.len() == c.devices_ids.len()
                && c.devices_ids.iter().all(|id| grantable(id))
        })
}

fn check_allocate(p: &Plugin, req: api::AllocateRequest) -> Result<(), TestCaseError> {
    let want = allocatable(&req);
    let n = req.container_requests.len();
    let r = rt().block_on(p.svc.allocate(tonic::Request::new(req)));
    match r {
        Ok(resp) => {
            prop_assert!(want, "granted a request the slot rule refuses");
            let resp = resp.into_inner();
            prop_assert_eq!(resp.container_responses.len(), n);
            for c in &resp.container_responses {
                let names = c.envs.get(ENV_ERDMA_DEVICES).expect("device list env");
                for name in names.split(',').filter(|n| !n.is_empty()) {
                    prop_assert!(name == HEALTHY || name == SICK, "{}", name);
                }
                for d in &c.devices {
                    prop_assert!(d.host_path.starts_with("/dev/infiniband/"));
                }
            }
        }
        Err(status) => {
            prop_assert!(!want, "refused a grantable request: {}", status.message());
            prop_assert_eq!(status.code(), tonic::Code::InvalidArgument);
        }
    }
    Ok(())
}

fn check_preferred(p: &Plugin, req: api::PreferredAllocationRequest) -> Result<(), TestCaseError> {
    let asks: Vec<(BTreeSet<String>, usize)> = req
        .container_requests
        .iter()
        .map(|c| {
            let offered: BTreeSet<String> = c
                .available_device_i_ds
                .iter()
                .chain(&c.must_include_device_i_ds)
                .cloned()
                .collect();
            (offered, usize::try_from(c.allocation_size).unwrap_or(0))
        })
        .collect();
    if let Ok(resp) = rt().block_on(p.svc.get_preferred_allocation(tonic::Request::new(req))) {
        let resp = resp.into_inner();
        prop_assert_eq!(resp.container_responses.len(), asks.len());
        for (c, (offered, size)) in resp.container_responses.iter().zip(&asks) {
            let chosen: BTreeSet<&String> = c.device_i_ds.iter().collect();
            prop_assert_eq!(chosen.len(), c.device_i_ds.len(), "chosen twice");
            for id in &c.device_i_ds {
                prop_assert!(offered.contains(id), "{} was not offered", id);
            }
            prop_assert!(c.device_i_ds.len() <= *size);
        }
    }
    Ok(())
}

/// Device IDs: valid slots, slots of the unhealthy or unknown devices, out of range, and broken.
fn id() -> impl Strategy<Value = String> {
    prop_oneof![
        (0..SLOTS + 2).prop_map(|i| format!("{HEALTHY}/{i}")),
        (0..SLOTS).prop_map(|i| format!("{SICK}/{i}")),
        Just(format!("{HEALTHY}/01")),
        Just(format!("{HEALTHY}/+1")),
        Just(format!("{HEALTHY}/4294967296")),
        Just("erdma_9/0".to_string()),
        Just(format!("/{HEALTHY}/0")),
        Just(format!("{HEALTHY}/0 ")),
        Just(String::new()),
        any::<String>(),
    ]
}

fn allocate_request() -> impl Strategy<Value = api::AllocateRequest> {
    // Half the containers ask for distinct healthy slots (grantable), some of them with one
    // hostile ID slipped in; the others for any IDs.
    let good = prop::sample::subsequence((0..SLOTS).collect::<Vec<_>>(), 1..5).prop_map(|s| {
        s.iter()
            .map(|i| format!("{HEALTHY}/{i}"))
            .collect::<Vec<_>>()
    });
    let spoiled = (good.clone(), id(), any::<Index>()).prop_map(|(mut ids, bad, at)| {
        ids.insert(at.index(ids.len() + 1), bad);
        ids
    });
    let container = prop_oneof![
        3 => good,
        1 => spoiled,
        2 => prop::collection::vec(id(), 0..5),
    ]
    .prop_map(|devices_ids| api::ContainerAllocateRequest { devices_ids });
    prop::collection::vec(container, 0..4)
        .prop_map(|container_requests| api::AllocateRequest { container_requests })
}

fn preferred_request() -> impl Strategy<Value = api::PreferredAllocationRequest> {
    prop::collection::vec(
        (
            prop::collection::vec(id(), 0..8),
            prop::collection::vec(id(), 0..3),
            prop_oneof![0i32..6, any::<i32>()],
        )
            .prop_map(
                |(available, must, size)| api::ContainerPreferredAllocationRequest {
                    available_device_i_ds: available,
                    must_include_device_i_ds: must,
                    allocation_size: size,
                },
            ),
        0..3,
    )
    .prop_map(|container_requests| api::PreferredAllocationRequest { container_requests })
}

/// Real requests as the kubelet encodes them, bytes mutated.
fn mutated_body() -> impl Strategy<Value = Vec<u8>> {
    let real = vec![
        api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![format!("{HEALTHY}/3"), format!("{HEALTHY}/4")],
            }],
        }
        .encode_to_vec(),
        api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: (0..SLOTS).map(|i| format!("{HEALTHY}/{i}")).collect(),
                must_include_device_i_ds: vec![format!("{HEALTHY}/1")],
                allocation_size: 2,
            }],
        }
        .encode_to_vec(),
    ];
    (
        prop::sample::select(real),
        prop::collection::vec((any::<Index>(), any::<u8>(), 0u8..3), 1..6),
    )
        .prop_map(|(mut b, edits)| {
            for (i, byte, op) in edits {
                let p = i.index(b.len() + 1);
                match op {
                    0 if p < b.len() => b[p] = byte,
                    1 if p < b.len() => {
                        b.remove(p);
                    }
                    _ => b.insert(p, byte),
                }
            }
            b
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn allocate_any_request(req in allocate_request(), cdi in any::<bool>(), all in any::<bool>()) {
        check_allocate(&plugin(cdi, all), req)?;
    }

    #[test]
    fn preferred_allocation_any_request(req in preferred_request()) {
        check_preferred(&plugin(false, false), req)?;
    }

    /// Arbitrary and mutated bytes, decoded as each request and handed to its handler.
    #[test]
    fn requests_from_bytes(body in prop_oneof![prop::collection::vec(any::<u8>(), 0..512), mutated_body()]) {
        let p = plugin(false, false);
        if let Ok(req) = api::AllocateRequest::decode(body.as_slice()) {
            check_allocate(&p, req)?;
        }
        if let Ok(req) = api::PreferredAllocationRequest::decode(body.as_slice()) {
            check_preferred(&p, req)?;
        }
        if let Ok(req) = api::PreStartContainerRequest::decode(body.as_slice()) {
            // Not asked for (pre-start off): answered without doing anything.
            prop_assert!(rt().block_on(p.svc.pre_start_container(tonic::Request::new(req))).is_ok());
        }
    }

    /// Slots in use from any pod-resources holders: each distinct slot ID counted once.
    #[test]
    fn used_slots_of_any_holders(ids in prop::collection::vec(prop::collection::vec(id(), 0..6), 0..6)) {
        let holders: Vec<Holder> = ids
            .iter()
            .enumerate()
            .map(|(i, ids)| Holder::of_ids("ns", &format!("pod-{i}"), "c", ids.clone()))
            .collect();
        let used = used_slots(&holders);
        let distinct: BTreeSet<&String> = ids.iter().flatten().collect();
        prop_assert!(used.values().map(|n| *n as usize).sum::<usize>() <= distinct.len());
    }
}
