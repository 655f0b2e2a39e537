//! Fuzzing the kubelet's protobuf messages as erdma receives them: the device-plugin requests
//! (Allocate, GetPreferredAllocation, PreStartContainer), the pod-resources answers (List,
//! GetAllocatableResources), the DRA requests (NodePrepareResources, NodeUnprepareResources,
//! NodeWatchResources) and the plugin-registration calls, each decoded with prost from arbitrary
//! bytes and from real messages with bytes mutated; then `holders_in`, the one reading of the
//! pod-resources answer, over any decoded answer.
//!
//! Decoding gives `Ok` or `Err`, never a panic, and keeps what is linear in the input (the
//! message encoded again is at most twice as long: unknown fields are dropped, only a negative
//! int32 sent as a 5-byte varint grows, to 10 bytes). `holders_in` reports only containers of the
//! answer, each with exactly the device IDs of the held resource and the claims of the held DRA
//! driver, counted here from the answer itself.

use erdma_kubelet::deviceplugin::v1beta1 as dp;
use erdma_kubelet::dra::v1 as dra;
use erdma_kubelet::dra_health::{v1 as health_v1, v1alpha1 as health_v1alpha1};
use erdma_kubelet::pluginregistration::v1 as reg;
use erdma_kubelet::podresources::v1 as pr;
use erdma_kubelet::podresources::{Held, holders_in};
use proptest::prelude::*;
use proptest::sample::Index;
use prost::Message;

const RESOURCE: &str = "aliyun/erdma";
const DRIVER: &str = "erdma.alibabacloud.com";

/// A List answer as a kubelet gives it: a device-plugin pod, a DRA pod, another resource.
fn real_list() -> pr::ListPodResourcesResponse {
    pr::ListPodResourcesResponse {
        pod_resources: vec![
            pr::PodResources {
                name: "trainer-0".into(),
                namespace: "team-a".into(),
                containers: vec![pr::ContainerResources {
                    name: "main".into(),
                    devices: vec![
                        pr::ContainerDevices {
                            resource_name: RESOURCE.into(),
                            device_ids: vec!["erdma_0/3".into(), "erdma_1/0".into()],
                            topology: Some(pr::TopologyInfo {
                                nodes: vec![pr::NumaNode { id: 0 }],
                            }),
                        },
                        pr::ContainerDevices {
                            resource_name: "nvidia.com/gpu".into(),
                            device_ids: vec!["GPU-1234".into()],
                            topology: None,
                        },
                    ],
                    cpu_ids: vec![2, 3],
                    ..Default::default()
                }],
            },
            pr::PodResources {
                name: "dra-0".into(),
                namespace: "team-b".into(),
                containers: vec![pr::ContainerResources {
                    name: "main".into(),
                    dynamic_resources: vec![pr::DynamicResource {
                        claim_name: "rdma".into(),
                        claim_namespace: "team-b".into(),
                        claim_resources: vec![pr::ClaimResource {
                            cdi_devices: vec![pr::CdiDevice {
                                name: "erdma.alibabacloud.com/claim=uid-1-erdma-0".into(),
                            }],
                            driver_name: DRIVER.into(),
                            pool_name: "node-a".into(),
                            device_name: "erdma-0".into(),
                        }],
                    }],
                    ..Default::default()
                }],
            },
        ],
    }
}

/// Real messages of every kind erdma receives, encoded.
fn real_messages() -> Vec<Vec<u8>> {
    vec![
        real_list().encode_to_vec(),
        pr::AllocatableResourcesResponse {
            devices: vec![pr::ContainerDevices {
                resource_name: RESOURCE.into(),
                device_ids: (0..16).map(|i| format!("erdma_0/{i}")).collect(),
                topology: None,
            }],
            cpu_ids: vec![0, 1, 2, 3],
            ..Default::default()
        }
        .encode_to_vec(),
        dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: vec!["erdma_0/3".into()],
            }],
        }
        .encode_to_vec(),
        dp::PreferredAllocationRequest {
            container_requests: vec![dp::ContainerPreferredAllocationRequest {
                available_device_i_ds: vec!["erdma_0/0".into(), "erdma_1/0".into()],
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        }
        .encode_to_vec(),
        dp::PreStartContainerRequest {
            devices_ids: vec!["erdma_0/3".into()],
        }
        .encode_to_vec(),
        dra::NodePrepareResourcesRequest {
            claims: vec![dra::Claim {
                namespace: "team-b".into(),
                uid: "uid-1".into(),
                name: "rdma".into(),
            }],
        }
        .encode_to_vec(),
        reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        }
        .encode_to_vec(),
    ]
}

/// Decodes `body` as `M`; a decoded message re-encodes within twice the input's length.
fn decodes<M: Message + Default>(body: &[u8]) -> Result<Option<M>, TestCaseError> {
    match M::decode(body) {
        Ok(m) => {
            prop_assert!(
                m.encoded_len() <= 2 * body.len(),
                "{} bytes from {}",
                m.encoded_len(),
                body.len()
            );
            Ok(Some(m))
        }
        Err(_) => Ok(None),
    }
}

/// Every message type erdma receives from the kubelet (or from a fake one).
fn decode_all(body: &[u8]) -> Result<(), TestCaseError> {
    decodes::<dp::AllocateRequest>(body)?;
    decodes::<dp::PreferredAllocationRequest>(body)?;
    decodes::<dp::PreStartContainerRequest>(body)?;
    decodes::<dp::Empty>(body)?;
    decodes::<dp::RegisterRequest>(body)?;
    decodes::<dp::ListAndWatchResponse>(body)?;
    decodes::<dp::AllocateResponse>(body)?;
    decodes::<pr::ListPodResourcesResponse>(body)?;
    decodes::<pr::AllocatableResourcesResponse>(body)?;
    decodes::<pr::GetPodResourcesResponse>(body)?;
    decodes::<dra::NodePrepareResourcesRequest>(body)?;
    decodes::<dra::NodeUnprepareResourcesRequest>(body)?;
    decodes::<dra::NodePrepareResourcesResponse>(body)?;
    decodes::<reg::InfoRequest>(body)?;
    decodes::<reg::RegistrationStatus>(body)?;
    decodes::<reg::PluginInfo>(body)?;
    decodes::<health_v1::NodeWatchResourcesRequest>(body)?;
    decodes::<health_v1alpha1::NodeWatchResourcesRequest>(body)?;
    Ok(())
}

/// Real messages with bytes replaced, inserted, deleted and lengths broken.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(real_messages()),
        prop::collection::vec((any::<Index>(), any::<u8>(), 0u8..3), 1..8),
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

/// What `holders_in` must find, counted from the answer: per container holding anything, the
/// held resource's device IDs and the held driver's claimed devices (with a device name).
fn expected(resp: &pr::ListPodResourcesResponse, held: &Held) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    for p in &resp.pod_resources {
        for c in &p.containers {
            let ids: usize = c
                .devices
                .iter()
                .filter(|d| d.resource_name == held.resource)
                .map(|d| d.device_ids.len())
                .sum();
            let claimed: usize = match &held.dra_driver {
                None => 0,
                Some(driver) => c
                    .dynamic_resources
                    .iter()
                    .flat_map(|d| &d.claim_resources)
                    .filter(|r| &r.driver_name == driver && !r.device_name.is_empty())
                    .count(),
            };
            if ids + claimed > 0 {
                out.push((
                    format!("{}/{}/{}", p.namespace, p.name, c.name),
                    ids,
                    claimed,
                ));
            }
        }
    }
    out
}

fn check_holders(resp: &pr::ListPodResourcesResponse) -> Result<(), TestCaseError> {
    for held in [Held::resource(RESOURCE), Held::both(RESOURCE, DRIVER)] {
        let got: Vec<(String, usize, usize)> = holders_in(resp, &held)
            .iter()
            .map(|h| {
                (
                    format!("{}/{}/{}", h.namespace, h.pod, h.container),
                    h.device_ids.len(),
                    h.claimed.len(),
                )
            })
            .collect();
        prop_assert_eq!(got, expected(resp, &held));
    }
    Ok(())
}

/// A List answer with hostile contents: empty and odd names, the resource under near names,
/// claims of other drivers and without device names.
fn list() -> impl Strategy<Value = pr::ListPodResourcesResponse> {
    let name = prop_oneof![
        Just(String::new()),
        Just(RESOURCE.to_string()),
        Just("aliyun/erdma ".to_string()),
        Just(DRIVER.to_string()),
        Just("erdma_0/0".to_string()),
        any::<String>(),
    ];
    let devices = (name.clone(), prop::collection::vec(name.clone(), 0..4)).prop_map(
        |(resource_name, device_ids)| pr::ContainerDevices {
            resource_name,
            device_ids,
            topology: None,
        },
    );
    let claim = (name.clone(), name.clone(), name.clone()).prop_map(
        |(driver_name, pool_name, device_name)| pr::ClaimResource {
            cdi_devices: vec![],
            driver_name,
            pool_name,
            device_name,
        },
    );
    let dynamic = (name.clone(), prop::collection::vec(claim, 0..3)).prop_map(
        |(claim_name, claim_resources)| pr::DynamicResource {
            claim_name,
            claim_namespace: "ns".into(),
            claim_resources,
        },
    );
    let container = (
        name.clone(),
        prop::collection::vec(devices, 0..3),
        prop::collection::vec(dynamic, 0..2),
    )
        .prop_map(
            |(name, devices, dynamic_resources)| pr::ContainerResources {
                name,
                devices,
                dynamic_resources,
                ..Default::default()
            },
        );
    let pod = (name.clone(), name, prop::collection::vec(container, 0..3)).prop_map(
        |(name, namespace, containers)| pr::PodResources {
            name,
            namespace,
            containers,
        },
    );
    prop::collection::vec(pod, 0..5)
        .prop_map(|pod_resources| pr::ListPodResourcesResponse { pod_resources })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..1024)) {
        decode_all(&body)?;
        if let Some(resp) = decodes::<pr::ListPodResourcesResponse>(&body)? {
            check_holders(&resp)?;
        }
    }

    #[test]
    fn mutated_real_messages(body in mutated()) {
        decode_all(&body)?;
        if let Some(resp) = decodes::<pr::ListPodResourcesResponse>(&body)? {
            check_holders(&resp)?;
        }
    }

    /// Well-formed answers with hostile contents, through the wire and back.
    #[test]
    fn hostile_list_answers(resp in list()) {
        let back = pr::ListPodResourcesResponse::decode(resp.encode_to_vec().as_slice()).expect("round trip");
        prop_assert_eq!(&back, &resp);
        check_holders(&back)?;
    }
}

#[test]
fn the_real_answer_gives_its_holders() {
    let h = holders_in(&real_list(), &Held::both(RESOURCE, DRIVER));
    assert_eq!(h.len(), 2);
    assert_eq!(h[0].device_ids, ["erdma_0/3", "erdma_1/0"]);
    assert_eq!(h[1].claimed[0].device, "erdma-0");
}
