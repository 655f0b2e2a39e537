//! Fuzzing the `ERdmaDevice` objects a broken controller, an older or newer implementation, or
//! anyone with write access to the CRD can leave in the cluster: arbitrary bytes, a real-shaped
//! object (as the original controller writes it) with its JSON mutated, and objects whose fields
//! are well-typed but nonsense (empty, duplicated and huge IDs, MACs in every spelling, negative
//! and huge card indexes and queue pairs, unknown status values, several objects per node).
//!
//! Decoding must give `Ok` or `Err`; what the agent and the controller then do with a decoded
//! object (`all_ready`, `node_eris_of`, `match_local`, `DeviceStatus::state`) must not panic and
//! must account for every ERI: each is matched to a local device or reported missing, once.

use erdma_k8s::agent::{NodeEris, node_eris_of};
use erdma_k8s::crd::{DeviceInfo, DeviceStatus, ERdmaDevice, ERdmaDeviceSpec, ERdmaDeviceStatus};
use erdma_model::names::LABEL_NODE_NAME;
use proptest::prelude::*;
use proptest::sample::Index;

/// An object as the original controller writes it (field names and shapes of its Go types).
const REAL: &str = r#"{
  "apiVersion": "network.alibabacloud.com/v1",
  "kind": "ERdmaDevice",
  "metadata": {
    "name": "cn-hangzhou.10.0.0.12",
    "labels": {"alibabacloud.com/nodename": "cn-hangzhou.10.0.0.12", "alibabacloud.com/instance-id": "i-bp1abcdefghijk"},
    "finalizers": ["network.alibabacloud.com/erdma-controller"],
    "resourceVersion": "123456",
    "uid": "0d6f5c8e-1a2b-4c3d-9e8f-001122334455"
  },
  "spec": {
    "devices": [
      {"instanceID": "i-bp1abcdefghijk", "mac": "00:16:3e:0a:1b:2c", "isPrimaryENI": true, "id": "eni-bp1primary0000", "networkCardIndex": 0, "queuePair": 8},
      {"instanceID": "i-bp1abcdefghijk", "mac": "00:16:3e:0a:1b:2d", "isPrimaryENI": false, "id": "eni-bp1second00000", "networkCardIndex": 1, "queuePair": 8}
    ],
    "jumboFrame": true
  },
  "status": {
    "devices": [
      {"id": "eni-bp1primary0000", "status": "Ready"},
      {"id": "eni-bp1second00000", "status": "Pending", "message": "attaching"}
    ]
  }
}"#;

#[derive(Debug, Clone)]
enum Edit {
    Flip(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
    Duplicate(Index, usize),
}

fn nasty() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..6),
        prop::sample::select(vec![
            &b"null"[..],
            b"[",
            b"]",
            b"{",
            b"}",
            b",",
            b":",
            b"\"",
            b"\\u0000",
            b"\\ud800",
            b"-1",
            b"1e999",
            b"18446744073709551616",
            b"true",
            b"\"\"",
            b"[]",
            b"{}",
        ])
        .prop_map(<[u8]>::to_vec),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<Index>(), nasty()).prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<Index>(), 0usize..16).prop_map(|(i, n)| Edit::Delete(i, n)),
        (any::<Index>(), 0usize..200).prop_map(|(i, n)| Edit::Duplicate(i, n)),
    ]
}

fn apply(mut data: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    let at = |i: &Index, len: usize| i.index(len + 1);
    for e in edits {
        match e {
            Edit::Flip(i, b) => {
                if !data.is_empty() {
                    let p = i.index(data.len());
                    data[p] ^= b | 1;
                }
            }
            Edit::Insert(i, bytes) => {
                let p = at(i, data.len());
                data.splice(p..p, bytes.iter().copied());
            }
            Edit::Delete(i, n) => {
                let p = at(i, data.len());
                data.drain(p..(p + n).min(data.len()));
            }
            Edit::Duplicate(i, n) => {
                let p = at(i, data.len());
                let end = (p + n).min(data.len());
                let copy = data[p..end].to_vec();
                data.splice(end..end, copy);
            }
        }
    }
    data
}

/// IDs, MACs and names: real-looking, empty, blank, non-ASCII, long.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("eni-bp1primary0000".to_string()),
        Just("00:16:3e:0a:1b:2c".to_string()),
        Just("00-16-3E-0A-1B-2C".to_string()),
        Just("00:16:3E:0A:1B:2C ".to_string()),
        "[0-9a-fA-F:-]{0,20}",
        any::<String>(),
        (1usize..5000).prop_map(|n| "e".repeat(n)),
    ]
}

fn device() -> impl Strategy<Value = DeviceInfo> {
    (
        text(),
        text(),
        any::<bool>(),
        text(),
        any::<i64>(),
        any::<i64>(),
    )
        .prop_map(
            |(instance_id, mac, is_primary_eni, id, network_card_index, queue_pair)| DeviceInfo {
                instance_id,
                mac,
                is_primary_eni,
                id,
                network_card_index,
                queue_pair,
            },
        )
}

fn status() -> impl Strategy<Value = DeviceStatus> {
    (
        text(),
        prop_oneof![
            Just("Ready".to_string()),
            Just("Pending".to_string()),
            Just("Failed".to_string()),
            Just("ready".to_string()),
            text()
        ],
        text(),
    )
        .prop_map(|(id, status, message)| DeviceStatus {
            id,
            status,
            message,
        })
}

/// A well-typed object with nonsense in it, labelled for `node` (or not).
fn object(node: &'static str) -> impl Strategy<Value = ERdmaDevice> {
    (
        prop::collection::vec(device(), 0..8),
        any::<bool>(),
        prop::option::of(prop::collection::vec(status(), 0..8)),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(move |(devices, jumbo_frame, status, labelled, deleting)| {
            let mut o = ERdmaDevice::new(
                node,
                ERdmaDeviceSpec {
                    devices,
                    jumbo_frame,
                },
            );
            o.status = status.map(|devices| ERdmaDeviceStatus { devices });
            if labelled {
                o.metadata.labels = Some([(LABEL_NODE_NAME.to_string(), node.to_string())].into());
            }
            if deleting {
                o.metadata.deletion_timestamp = Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
                );
            }
            o
        })
}

/// Local `(mac, ibdev)` pairs, some of them matching the objects' MACs.
fn local() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec((text(), "[a-z_0-9]{1,10}"), 0..6)
}

/// What the agent does with the objects of its node: pick the one, match it, check readiness.
fn use_objects(objects: &[ERdmaDevice], local: &[(String, String)]) -> Result<(), TestCaseError> {
    for o in objects {
        let _ = o.all_ready();
        for s in o.status.iter().flat_map(|s| &s.devices) {
            let _ = s.state();
        }
    }
    let live = objects
        .iter()
        .filter(|o| o.metadata.deletion_timestamp.is_none())
        .count();
    match node_eris_of("node-a", objects.iter()) {
        Ok(Some(eris)) => {
            prop_assert!(live == 1);
            check_match(&eris, local)?;
        }
        Ok(None) => prop_assert!(live <= 1),
        Err(e) => {
            prop_assert!(live > 1);
            prop_assert!(!e.to_string().is_empty());
        }
    }
    Ok(())
}

fn check_match(eris: &NodeEris, local: &[(String, String)]) -> Result<(), TestCaseError> {
    let _ = eris.all_ready();
    let m = eris.match_local(local);
    // Every ERI is accounted for exactly once: matched to a local device, or missing.
    prop_assert_eq!(m.matched.len() + m.missing.len(), eris.devices.len());
    for (_, name) in &m.matched {
        prop_assert!(local.iter().any(|(_, n)| n == name));
    }
    for (id, message) in &m.missing {
        prop_assert!(eris.devices.iter().any(|d| &d.id == id));
        // The message names the ERI and its MAC, nothing more: bounded by them.
        prop_assert!(
            message.len()
                <= 300 + 2 * id.len() + eris.devices.iter().map(|d| d.mac.len()).max().unwrap_or(0)
        );
    }
    for d in &eris.devices {
        let _ = eris.by_mac(&d.mac);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..2048), local in local()) {
        if let Ok(o) = serde_json::from_slice::<ERdmaDevice>(&data) {
            use_objects(&[o], &local)?;
        }
    }

    /// The real-shaped object with its JSON mutated; an object that still decodes is used, and
    /// encodes back to JSON that decodes to the same object.
    #[test]
    fn mutated_real_object(edits in prop::collection::vec(edit(), 1..8), local in local()) {
        let data = apply(REAL.as_bytes().to_vec(), &edits);
        if let Ok(mut o) = serde_json::from_slice::<ERdmaDevice>(&data) {
            let again: ERdmaDevice = serde_json::from_str(&serde_json::to_string(&o).expect("encodes")).expect("decodes");
            prop_assert_eq!(&again, &o);
            // Labelled for the test's node, as the agent's watch selects it.
            o.metadata.labels = Some([(LABEL_NODE_NAME.to_string(), "node-a".to_string())].into());
            use_objects(&[o], &local)?;
        }
    }

    /// The real-shaped object with nodes of its JSON tree replaced (by a value of the same type,
    /// any JSON scalar, an empty list or map) or removed: mostly still objects of the right shape, with nonsense values.
    #[test]
    fn tree_mutated_real_object(changes in prop::collection::vec((any::<Index>(), any::<bool>(), text(), any::<i64>(), json_leaf()), 1..6), local in local()) {
        let mut v: serde_json::Value = serde_json::from_str(REAL).expect("real object");
        for (at, same_kind, s, n, leaf) in &changes {
            let paths = pointers(&v);
            let p = &paths[at.index(paths.len())];
            // Half the changes keep the node's JSON type (a string stays a string), so that most
            // objects still decode and carry the nonsense on into the agent's use of them.
            if *same_kind && let Some(slot) = v.pointer_mut(p) {
                match slot {
                    serde_json::Value::String(_) => *slot = serde_json::Value::String(s.clone()),
                    serde_json::Value::Number(_) => *slot = serde_json::Value::from(*n),
                    serde_json::Value::Bool(b) => *b = !*b,
                    _ => {}
                }
                continue;
            }
            match leaf {
                None => remove(&mut v, p),
                Some(leaf) => {
                    if let Some(slot) = v.pointer_mut(p) {
                        *slot = leaf.clone();
                    }
                }
            }
        }
        if let Ok(mut o) = serde_json::from_value::<ERdmaDevice>(v) {
            o.metadata.labels = Some([(LABEL_NODE_NAME.to_string(), "node-a".to_string())].into());
            use_objects(&[o], &local)?;
        }
    }

    /// Well-typed nonsense: one to three objects for the node, through JSON as the API server
    /// hands them over.
    #[test]
    fn nonsense_objects(objects in prop::collection::vec(object("node-a"), 1..4), local in local()) {
        let objects: Vec<ERdmaDevice> = objects
            .iter()
            .map(|o| serde_json::from_value(serde_json::to_value(o).expect("encodes")).expect("decodes"))
            .collect();
        use_objects(&objects, &local)?;
    }
}

/// A JSON scalar or empty container to put somewhere, or `None` to remove the node.
fn json_leaf() -> impl Strategy<Value = Option<serde_json::Value>> {
    use serde_json::Value;
    prop::option::weighted(
        0.8,
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            text().prop_map(Value::String),
            Just(Value::Array(Vec::new())),
            Just(Value::Object(Default::default())),
        ],
    )
}

/// JSON pointers of every node below the root.
fn pointers(v: &serde_json::Value) -> Vec<String> {
    fn walk(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, c) in m {
                    let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                    out.push(p.clone());
                    walk(c, p, out);
                }
            }
            serde_json::Value::Array(a) => {
                for (i, c) in a.iter().enumerate() {
                    let p = format!("{at}/{i}");
                    out.push(p.clone());
                    walk(c, p, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, String::new(), &mut out);
    out
}

/// Removes the node at pointer `p` (a key of its map, an element of its list).
fn remove(v: &mut serde_json::Value, p: &str) {
    let Some((parent, last)) = p.rsplit_once('/') else {
        return;
    };
    match v.pointer_mut(parent) {
        Some(serde_json::Value::Object(m)) => {
            m.remove(&last.replace("~1", "/").replace("~0", "~"));
        }
        Some(serde_json::Value::Array(a)) => {
            if let Ok(i) = last.parse::<usize>()
                && i < a.len()
            {
                a.remove(i);
            }
        }
        _ => {}
    }
}

#[test]
fn the_real_object_decodes() {
    let o: ERdmaDevice = serde_json::from_str(REAL).expect("decodes");
    assert_eq!(o.spec.devices.len(), 2);
    assert!(!o.all_ready());
}
