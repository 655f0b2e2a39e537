//! Fuzzing what the agent's NRI handler does with the pods and containers a hostile or broken
//! runtime hands it: `CreateContainer` requests decoded with prost from arbitrary bytes and from a
//! real request with bytes mutated, and well-formed containers with hostile contents (device
//! lists naming served, unserved and repeated devices, device nodes of any path and numbers,
//! `ERDMA_RDMA_MAX` hand-offs and `erdma-rdma-max` / `erdma-smcr` annotations of any text).
//!
//! `adjust_container_on` (the whole CreateContainer answer), `held_devices`, `pod_device_ids` and
//! the SMC-R annotation reading must not panic, and must agree with oracles written here: a container
//! that holds no served device (by the kubelet's pod-resources answer about it — slot IDs or DRA
//! claim devices —, or by a served uverbs node the runtime put in; never by its own
//! `ERDMA_DEVICES`) gets nothing; one that does gets exactly the policy's memlock; an `rdma.max`
//! line always names a device the container holds and reads back as a valid limit, never above the
//! operator's `--nri-rdma-max` (unless the operator lets the annotation raise it), and is the
//! same whatever the container's environment says; notices quote bounded text; on a cgroup v1 or
//! hybrid host the answer is the same without any `linux` adjustment (runc refuses `unified`
//! there).

use erdma_agent::nri::{Policy, adjust_container_on, held_devices, pod_device_ids};
use erdma_agent::rdma_max::Records;
use erdma_host::CgroupVersion;
use erdma_kubelet::podresources::{ClaimedDevice, Holder};
use erdma_model::rdma_limit::{Limit, Memlock, RDMA_MAX_ANNOTATION, RdmaLimit};
use erdma_model::{CharDevice, DeviceKind, NodeDevices, RdmaDevice, SlotId};
use erdma_nri::api;
use erdma_smc::annotation::{SMCR_ANNOTATION, SmcRequest};
use proptest::prelude::*;
use proptest::sample::Index;
use prost::Message;
use std::collections::BTreeSet;

const SERVED: [&str; 2] = ["erdma_0", "erdma_1"];

fn served() -> NodeDevices {
    let mut node = NodeDevices::empty();
    for (i, name) in SERVED.iter().enumerate() {
        let mut d = RdmaDevice::named(*name, DeviceKind::Erdma);
        d.char_devices.uverbs = Some(CharDevice {
            path: format!("/dev/infiniband/uverbs{i}"),
            major: Some(231),
            minor: Some(192 + i as u32),
            present: true,
        });
        node.devices.push(d);
    }
    node
}

/// The oracle of "holds a served device": in the kubelet's answer, a holder entry of exactly
/// this container naming a served device (a slot of it, the ID itself, or its DRA device name);
/// or a device node of a served uverbs (by path, or by major and minor). The container's
/// environment never counts.
fn holds_any(pod: &api::PodSandbox, c: &api::Container, holders: Option<&[Holder]>) -> bool {
    let by_answer = match holders {
        Some(hs) => hs
            .iter()
            .filter(|h| h.namespace == pod.namespace && h.pod == pod.name && h.container == c.name)
            .any(|h| {
                h.device_ids.iter().any(|id| {
                    let dev = SlotId::parse(id).map_or(id.clone(), |s| s.device);
                    SERVED.contains(&dev.as_str())
                }) || h.claimed.iter().any(|d| {
                    SERVED
                        .iter()
                        .any(|n| erdma_dra::slice::device_name(n).as_deref() == Some(&d.device))
                })
            }),
        None => false,
    };
    let by_node = c.linux.iter().flat_map(|l| &l.devices).any(|d| {
        (0..2).any(|i| {
            d.path == format!("/dev/infiniband/uverbs{i}") || (d.major == 231 && d.minor == 192 + i)
        })
    });
    by_answer || by_node
}

/// The kubelet's answer, if any: entries of the checked container (`true`) or of another one,
/// with device IDs and DRA device names of any text.
type HolderSeeds = Option<Vec<(bool, Vec<String>, Vec<String>)>>;

fn holder_seeds() -> impl Strategy<Value = HolderSeeds> {
    let id = prop_oneof![
        Just("erdma_0/1".to_string()),
        Just("erdma_1/0".to_string()),
        Just("erdma_9/0".to_string()),
        Just("erdma-0".to_string()),
        text(),
    ];
    prop::option::of(prop::collection::vec(
        (
            any::<bool>(),
            prop::collection::vec(id.clone(), 0..3),
            prop::collection::vec(id, 0..2),
        ),
        0..3,
    ))
}

fn holders_of(
    seeds: &HolderSeeds,
    pod: &api::PodSandbox,
    c: &api::Container,
) -> Option<Vec<Holder>> {
    seeds.as_ref().map(|seeds| {
        seeds
            .iter()
            .map(|(this, ids, claimed)| Holder {
                namespace: pod.namespace.clone(),
                pod: pod.name.clone(),
                container: if *this {
                    c.name.clone()
                } else {
                    format!("{}~other", c.name)
                },
                device_ids: ids.clone(),
                claimed: claimed
                    .iter()
                    .map(|device| ClaimedDevice {
                        claim_namespace: pod.namespace.clone(),
                        claim_name: "rdma".into(),
                        pool: "node-a".into(),
                        device: device.clone(),
                    })
                    .collect(),
            })
            .collect()
    })
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("erdma_0".to_string()),
        Just("erdma_0,erdma_1".to_string()),
        Just("erdma_0,erdma_0".to_string()),
        Just("erdma_9".to_string()),
        Just("hca_handle=2 hca_object=2000".to_string()),
        Just("erdma_0 hca_handle=2".to_string()),
        Just("erdma_0 hca_handle=1;erdma_1 hca_handle=1".to_string()),
        Just("true".to_string()),
        Just("yes".to_string()),
        "[a-z_0-9=,; ]{0,30}",
        any::<String>(),
    ]
}

fn env() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        (
            prop::sample::select(vec![
                "ERDMA_DEVICES",
                "ERDMA_RDMA_MAX",
                "PATH",
                "ERDMA_DEVICES ",
            ]),
            text(),
        )
            .prop_map(|(k, v)| format!("{k}={v}")),
        0..5,
    )
}

fn device_node() -> impl Strategy<Value = api::LinuxDevice> {
    (
        prop_oneof![
            Just("/dev/infiniband/uverbs0".to_string()),
            Just("/dev/infiniband/uverbs1".to_string()),
            Just("/dev/infiniband/uverbs7".to_string()),
            any::<String>()
        ],
        prop_oneof![Just(231i64), any::<i64>()],
        prop_oneof![Just(192i64), Just(193i64), any::<i64>()],
    )
        .prop_map(|(path, major, minor)| api::LinuxDevice {
            path,
            r#type: "c".into(),
            major,
            minor,
            ..Default::default()
        })
}

fn container() -> impl Strategy<Value = api::Container> {
    (text(), env(), prop::collection::vec(device_node(), 0..4)).prop_map(|(name, env, devices)| {
        api::Container {
            name,
            env,
            linux: Some(api::LinuxContainer {
                devices,
                ..Default::default()
            }),
            ..Default::default()
        }
    })
}

fn pod() -> impl Strategy<Value = api::PodSandbox> {
    (
        text(),
        text(),
        prop::option::of(text()),
        prop::option::of(text()),
    )
        .prop_map(|(name, namespace, rdma_max, smcr)| {
            let mut annotations = std::collections::BTreeMap::new();
            if let Some(v) = rdma_max {
                annotations.insert(RDMA_MAX_ANNOTATION.to_string(), v);
            }
            if let Some(v) = smcr {
                annotations.insert(SMCR_ANNOTATION.to_string(), v);
            }
            api::PodSandbox {
                name,
                namespace,
                annotations,
                ..Default::default()
            }
        })
}

fn policy() -> impl Strategy<Value = Policy> {
    (
        prop_oneof![
            Just(Memlock::Off),
            Just(Memlock::Unlimited),
            any::<u64>().prop_map(Memlock::Bytes)
        ],
        prop_oneof![
            Just(None),
            Just(RdmaLimit::parse("hca_handle=2 hca_object=100").ok()),
        ],
        any::<bool>(),
    )
        .prop_map(
            |(memlock, default_rdma_max, allow_annotation_raise)| Policy {
                memlock,
                default_rdma_max,
                allow_annotation_raise,
            },
        )
}

/// Every string a pod and container carry, for the bound of what notices may quote.
fn input_len(pod: &api::PodSandbox, c: &api::Container) -> usize {
    pod.name.len()
        + pod.namespace.len()
        + pod.annotations.values().map(String::len).sum::<usize>()
        + c.name.len()
        + c.env.iter().map(String::len).sum::<usize>()
}

fn check(
    pod: &api::PodSandbox,
    c: &api::Container,
    holders: Option<&[Holder]>,
    policy: &Policy,
) -> Result<(), TestCaseError> {
    let node = served();
    let held = held_devices(pod, c, &node, holders);
    for h in &held {
        prop_assert!(SERVED.contains(&h.as_str()), "{} is not served", h);
    }
    let distinct: BTreeSet<&String> = held.iter().collect();
    prop_assert_eq!(distinct.len(), held.len(), "each device once: {:?}", held);
    prop_assert_eq!(
        !held.is_empty(),
        holds_any(pod, c, holders),
        "held {:?}",
        held
    );

    let records = Records::kubelet(holders);
    let (adjust, notices) = adjust_container_on(CgroupVersion::V2, pod, c, &node, records, policy);
    // The container's environment never changes its answer.
    let mut no_env = c.clone();
    no_env.env.clear();
    let (without_env, _) =
        adjust_container_on(CgroupVersion::V2, pod, &no_env, &node, records, policy);
    prop_assert_eq!(
        &without_env,
        &adjust,
        "the env changed the answer: {:?}",
        c.env
    );
    if held.is_empty() {
        prop_assert_eq!(adjust, api::ContainerAdjustment::default());
        prop_assert!(notices.is_empty());
        return Ok(());
    }
    let memlock: Vec<&api::PosixRlimit> = adjust
        .rlimits
        .iter()
        .filter(|r| r.r#type == "RLIMIT_MEMLOCK")
        .collect();
    match policy.memlock.value() {
        None => prop_assert!(memlock.is_empty()),
        Some(v) => {
            prop_assert_eq!(memlock.len(), 1);
            prop_assert!(memlock[0].hard == v && memlock[0].soft == v);
        }
    }
    if let Some(line) = adjust
        .linux
        .as_ref()
        .and_then(|l| l.resources.as_ref())
        .and_then(|r| r.unified.get("rdma.max"))
    {
        let (dev, limits) = line.split_once(' ').expect("<device> <limits>");
        prop_assert!(
            held.iter().any(|h| h == dev),
            "{} not held ({:?})",
            dev,
            held
        );
        let got = RdmaLimit::parse(limits);
        prop_assert!(got.is_ok(), "{}", line);
        // Under the operator's ceiling, key by key, unless the operator let the annotation
        // raise it.
        if let (Some(ceiling), Ok(got), false) =
            (policy.default_rdma_max, got, policy.allow_annotation_raise)
        {
            let within = |g: Option<Limit>, c: Option<Limit>| match (g, c) {
                (_, None | Some(Limit::Max)) => true,
                (Some(Limit::Count(g)), Some(Limit::Count(c))) => g <= c,
                _ => false,
            };
            prop_assert!(
                within(got.hca_handle, ceiling.hca_handle)
                    && within(got.hca_object, ceiling.hca_object),
                "{} above the ceiling {:?}",
                line,
                ceiling
            );
        }
    }
    // On cgroup v1 and hybrid hosts runc refuses any `unified` key: the same container gets the
    // same rlimits and notices, and no `linux` adjustment at all.
    for version in [CgroupVersion::V1, CgroupVersion::Hybrid] {
        let (on_v1, v1_notices) = adjust_container_on(version, pod, c, &node, records, policy);
        prop_assert_eq!(on_v1.linux.as_ref(), None, "{:?}: {:?}", version, on_v1);
        prop_assert_eq!(&on_v1.rlimits, &adjust.rlimits);
        prop_assert_eq!(&v1_notices, &notices);
    }
    let bound = 1024 + 4 * input_len(pod, c) + 64 * held.len();
    for n in &notices {
        prop_assert!(n.kind == "Warning" || n.kind == "Normal");
        prop_assert!(n.message.len() <= bound, "{} > {}", n.message.len(), bound);
    }
    // The SMC-R annotation of the same pod: a problem exactly when the value is not a boolean.
    let req = SmcRequest::from_annotations(&pod.annotations);
    prop_assert_eq!(
        req.problem(&format!("{}/{}", pod.namespace, pod.name))
            .is_some(),
        matches!(req, SmcRequest::Invalid(_))
    );
    Ok(())
}

/// The request as containerd sends it for a pod holding `erdma_0`.
fn real_request() -> Vec<u8> {
    api::CreateContainerRequest {
        pod: Some(api::PodSandbox {
            id: "sb-1".into(),
            name: "trainer-0".into(),
            namespace: "team-a".into(),
            annotations: [
                (
                    RDMA_MAX_ANNOTATION.to_string(),
                    "hca_handle=2 hca_object=2000".to_string(),
                ),
                (SMCR_ANNOTATION.to_string(), "true".to_string()),
            ]
            .into(),
            ..Default::default()
        }),
        container: Some(api::Container {
            id: "c-1".into(),
            name: "main".into(),
            env: vec![
                "ERDMA_DEVICES=erdma_0".into(),
                "ERDMA_NCCL_IB_HCA==erdma_0".into(),
            ],
            linux: Some(api::LinuxContainer {
                devices: vec![api::LinuxDevice {
                    path: "/dev/infiniband/uverbs0".into(),
                    r#type: "c".into(),
                    major: 231,
                    minor: 192,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..512),
        prop::collection::vec((any::<Index>(), any::<u8>(), 0u8..3), 1..8).prop_map(|edits| {
            let mut b = real_request();
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
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// CreateContainer requests from bytes, handled as the handler does (a missing pod or
    /// container is an empty one).
    #[test]
    fn create_container_from_bytes(body in bytes(), seeds in holder_seeds(), policy in policy()) {
        if let Ok(req) = api::CreateContainerRequest::decode(body.as_slice()) {
            let (pod, c) = (req.pod.unwrap_or_default(), req.container.unwrap_or_default());
            let holders = holders_of(&seeds, &pod, &c);
            check(&pod, &c, holders.as_deref(), &policy)?;
        }
    }

    #[test]
    fn hostile_pods_and_containers(pod in pod(), c in container(), seeds in holder_seeds(), policy in policy()) {
        let holders = holders_of(&seeds, &pod, &c);
        check(&pod, &c, holders.as_deref(), &policy)?;
    }

    /// The devices a pod holds over its containers (device-plugin slots, then DRA devices):
    /// each once, each from a holder of that pod.
    #[test]
    fn pod_devices_of_any_holders(holders in prop::collection::vec(
        (prop::sample::select(vec!["a", "b"]), prop::collection::vec(text(), 0..4), prop::collection::vec(text(), 0..3)),
        0..6)) {
        let holders: Vec<Holder> = holders
            .into_iter()
            .map(|(pod, ids, claimed)| Holder {
                namespace: "ns".into(),
                pod: pod.into(),
                container: "c".into(),
                device_ids: ids,
                claimed: claimed
                    .into_iter()
                    .map(|device| ClaimedDevice {
                        claim_namespace: "ns".into(),
                        claim_name: "claim".into(),
                        pool: "node-a".into(),
                        device,
                    })
                    .collect(),
            })
            .collect();
        let got = pod_device_ids(&holders, "ns", "a");
        let distinct: BTreeSet<&String> = got.iter().collect();
        prop_assert_eq!(distinct.len(), got.len());
        for id in &got {
            prop_assert!(holders.iter().filter(|h| h.pod == "a").any(|h| h.device_ids.contains(id) || h.claimed.iter().any(|c| &c.device == id)));
        }
    }
}

/// The real request of a container that holds `erdma_0`: by the kubelet's answer, and by its
/// device node when there is no answer.
#[test]
fn the_real_request_gets_memlock_and_its_limit() {
    let req = api::CreateContainerRequest::decode(real_request().as_slice()).expect("decodes");
    let policy = Policy {
        memlock: Memlock::Unlimited,
        default_rdma_max: None,
        allow_annotation_raise: false,
    };
    let (pod, c) = (req.pod.expect("pod"), req.container.expect("container"));
    let answer = [Holder::of_ids(
        "team-a",
        "trainer-0",
        "main",
        vec!["erdma_0/3".into()],
    )];
    for holders in [Some(&answer[..]), None] {
        let (adjust, notices) = adjust_container_on(
            CgroupVersion::V2,
            &pod,
            &c,
            &served(),
            Records::kubelet(holders),
            &policy,
        );
        assert!(notices.is_empty(), "{notices:?}");
        assert_eq!(adjust.rlimits[0].hard, u64::MAX);
        assert_eq!(
            adjust.linux.unwrap().resources.unwrap().unified["rdma.max"],
            "erdma_0 hca_handle=2 hca_object=2000"
        );
    }
}

/// The same request from a container that holds nothing by the kubelet's answer (another
/// container of the pod holds `erdma_0`) and sets `ERDMA_DEVICES=erdma_0` itself: no memlock,
/// no `rdma.max`.
#[test]
fn a_container_that_sets_erdma_devices_itself_gets_nothing() {
    let req = api::CreateContainerRequest::decode(real_request().as_slice()).expect("decodes");
    let policy = Policy {
        memlock: Memlock::Unlimited,
        default_rdma_max: RdmaLimit::parse("hca_handle=1").ok(),
        allow_annotation_raise: false,
    };
    let pod = req.pod.expect("pod");
    let mut c = req.container.expect("container");
    c.linux = None; // no device node: nothing the runtime granted
    let answer = [Holder::of_ids(
        "team-a",
        "trainer-0",
        "trainer",
        vec!["erdma_0/3".into()],
    )];
    for holders in [Some(&answer[..]), Some(&[][..]), None] {
        assert!(held_devices(&pod, &c, &served(), holders).is_empty());
        let (adjust, notices) = adjust_container_on(
            CgroupVersion::V2,
            &pod,
            &c,
            &served(),
            Records::kubelet(holders),
            &policy,
        );
        assert_eq!(adjust, api::ContainerAdjustment::default(), "{holders:?}");
        assert!(notices.is_empty(), "{notices:?}");
    }
}
