//! Fuzzing the mutating webhook's request parsing (`webhook::review`, which the HTTPS server
//! hands every request body of at most 4 MiB): arbitrary bytes, a real AdmissionReview with its
//! JSON mutated byte by byte, deeply nested JSON, and well-formed reviews of hostile pods (any
//! apiVersion and uid, requests and limits of any resources, any `erdma-smcr` value, an
//! `smcr-init` already there, containers that are not objects).
//!
//! The answer is always an AdmissionReview that allows the pod (the webhook never blocks a pod),
//! echoes the request's uid, and patches only when the oracle here says so: the device plugin
//! and injection are on, some container requests or limits `aliyun/erdma`, the annotation reads
//! true, the pod is not `hostNetwork`, and no `smcr-init` init container exists. The answer's
//! size is linear in the request.

use base64::Engine as _;
use erdma_controller::webhook::{InjectOptions, review};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Value, json};

fn opts(device_plugin: bool, inject: bool) -> InjectOptions {
    InjectOptions {
        device_plugin,
        inject,
        image: "registry.example/smcr_init:v1".into(),
        metrics: Default::default(),
        events: None,
    }
}

const SMCR: &str = "network.alibabacloud.com/erdma-smcr";

/// A review as the API server sends it for a pod asking for SMC-R.
fn real_review() -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "team-a",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"generateName": "trainer-", "namespace": "team-a",
                             "annotations": {SMCR: "true"}},
                "spec": {"containers": [{
                    "name": "main",
                    "image": "registry.example/train:v1",
                    "resources": {"limits": {"aliyun/erdma": "1", "cpu": "4"}}
                }]}
            }
        }
    })
}

/// The oracle: whether the webhook must inject into `object` (a JSON Pod).
fn must_inject(object: &Value, o: &InjectOptions) -> bool {
    let asks = |c: &Value| {
        ["requests", "limits"].iter().any(|k| {
            c.pointer(&format!("/resources/{k}"))
                .and_then(Value::as_object)
                .is_some_and(|m| m.contains_key("aliyun/erdma"))
        })
    };
    let list = |k: &str| {
        object
            .pointer(&format!("/spec/{k}"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let containers = list("containers");
    let inits = list("initContainers");
    let annotation = object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(SMCR))
        .and_then(Value::as_str)
        .map(str::trim);
    let host_network = object.pointer("/spec/hostNetwork") == Some(&json!(true));
    o.device_plugin
        && o.inject
        && !host_network
        && containers.iter().chain(&inits).any(asks)
        && matches!(annotation, Some("1" | "t" | "T" | "TRUE" | "true" | "True"))
        && !inits
            .iter()
            .any(|c| c.get("name").and_then(Value::as_str) == Some("smcr-init"))
}

/// Checks the answer to `body`; `inject` is the oracle's verdict when the body is a review of a
/// well-formed Pod (None: no claim).
fn check(body: &[u8], o: &InjectOptions, inject: Option<bool>) -> Result<(), TestCaseError> {
    let answer = review(body, o);
    prop_assert_eq!(answer["kind"].as_str(), Some("AdmissionReview"));
    prop_assert!(answer["apiVersion"].is_string());
    let resp = &answer["response"];
    prop_assert_eq!(resp["allowed"].as_bool(), Some(true));
    let sent: Option<Value> = serde_json::from_slice(body).ok();
    let uid = sent
        .as_ref()
        .and_then(|v| v.pointer("/request/uid"))
        .and_then(Value::as_str)
        .unwrap_or("");
    prop_assert_eq!(resp["uid"].as_str(), Some(uid));
    let patched = resp.get("patch").is_some();
    if let Some(want) = inject {
        prop_assert_eq!(patched, want, "{}", String::from_utf8_lossy(body));
    }
    if patched {
        prop_assert_eq!(resp["patchType"].as_str(), Some("JSONPatch"));
        let raw = base64::engine::general_purpose::STANDARD
            .decode(resp["patch"].as_str().expect("patch text"))
            .expect("base64");
        let patch: Value = serde_json::from_slice(&raw).expect("patch JSON");
        let ops = patch.as_array().expect("a JSON Patch");
        prop_assert_eq!(ops.len(), 1);
        prop_assert_eq!(ops[0]["op"].as_str(), Some("add"));
    }
    // Linear in the request: fixed text, the init container, and what is quoted from the
    // request (uid, apiVersion, an error naming a value), escaped at most 6x.
    let len = answer.to_string().len();
    prop_assert!(
        len <= 8192 + 6 * body.len(),
        "{} bytes for {}",
        len,
        body.len()
    );
    Ok(())
}

fn resources() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => Just(json!({"limits": {"aliyun/erdma": "1"}})),
        2 => Just(json!({"requests": {"aliyun/erdma": "2"}})),
        1 => Just(json!({"limits": {"aliyun/erdma ": "1"}})),
        1 => Just(json!({"limits": {"nvidia.com/gpu": "1"}})),
        1 => Just(json!({"limits": "aliyun/erdma"})),
        1 => Just(json!({"limits": {"aliyun/erdma": 1}})),
        1 => Just(json!(null)),
        1 => Just(json!({})),
    ]
}

fn annotation() -> impl Strategy<Value = Option<Value>> {
    prop::option::of(prop_oneof![
        prop::sample::select(vec![
            "true", " true ", "True", "1", "false", "yes", "tRUE", ""
        ])
        .prop_map(|s| json!(s)),
        any::<String>().prop_map(Value::String),
        Just(json!(true)),
        Just(json!(1)),
    ])
}

fn container() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["main", "smcr-init", "", "sidecar"]),
        resources(),
    )
        .prop_map(|(name, r)| json!({"name": name, "image": "x", "resources": r}))
}

/// A review of a hostile pod (well-formed enough to be a Pod, or not), and whether the oracle
/// can judge it (`object` decodes as a Pod: only then a patch may be given).
fn hostile_review() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            Just(json!("admission.k8s.io/v1")),
            Just(json!("admission.k8s.io/v1beta1")),
            any::<String>().prop_map(Value::String),
            Just(json!(7)),
        ],
        prop_oneof![any::<String>().prop_map(Value::String), Just(json!(null)), Just(json!(42))],
        annotation(),
        prop::collection::vec(container(), 0..3),
        prop::option::of(prop::collection::vec(container(), 0..3)),
        prop::bool::weighted(0.9),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(api, uid, ann, containers, inits, spec_is_object, host_network)| {
            let mut meta = json!({"name": "p", "namespace": "ns"});
            if let Some(a) = ann {
                meta["annotations"] = json!({SMCR: a});
            }
            let mut spec = json!({"containers": containers});
            if host_network {
                spec["hostNetwork"] = json!(true);
            }
            if let Some(i) = inits {
                spec["initContainers"] = json!(i);
            }
            let spec = if spec_is_object { spec } else { json!([spec]) };
            json!({"apiVersion": api, "kind": "AdmissionReview",
                   "request": {"uid": uid, "object": {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}}})
        })
}

/// The oracle's verdict for a hostile review: only when its object is a Pod to Kubernetes (the
/// webhook reads it typed); annotation values that are not strings make it no Pod.
fn verdict(review: &Value, o: &InjectOptions) -> Option<bool> {
    let object = review.pointer("/request/object")?;
    serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(object.clone()).ok()?;
    Some(must_inject(object, o))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..1024), dp in any::<bool>(), inj in any::<bool>()) {
        check(&body, &opts(dp, inj), None)?;
    }

    #[test]
    fn mutated_real_review(edits in prop::collection::vec((any::<Index>(), any::<u8>(), 0u8..3), 1..8)) {
        let mut body = real_review().to_string().into_bytes();
        for (i, byte, op) in edits {
            let p = i.index(body.len() + 1);
            match op {
                0 if p < body.len() => body[p] = byte,
                1 if p < body.len() => { body.remove(p); }
                _ => body.insert(p, byte),
            }
        }
        let o = opts(true, true);
        let judged = serde_json::from_slice::<Value>(&body).ok().and_then(|v| verdict(&v, &o));
        check(&body, &o, judged)?;
    }

    #[test]
    fn hostile_reviews(r in hostile_review(), dp in prop::bool::weighted(0.8), inj in prop::bool::weighted(0.8)) {
        let o = opts(dp, inj);
        let judged = verdict(&r, &o);
        check(r.to_string().as_bytes(), &o, judged)?;
    }
}

#[test]
fn the_real_review_is_patched() {
    let o = opts(true, true);
    let body = real_review().to_string();
    check(body.as_bytes(), &o, Some(true)).expect("patched");
}

#[test]
fn deep_nesting_is_answered_not_overflowed() {
    // serde_json refuses nesting deeper than 128: the review is answered without a patch.
    for open in ["[", "{\"a\":"] {
        let body = format!(
            "{{\"apiVersion\":\"admission.k8s.io/v1\",\"request\":{{\"uid\":\"u\",\"object\":{}",
            open.repeat(100_000)
        );
        let answer = review(body.as_bytes(), &opts(true, true));
        assert_eq!(answer["response"]["allowed"], true);
        assert!(answer["response"].get("patch").is_none());
    }
}
