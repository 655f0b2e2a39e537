//! The CRD: generated from the Rust type, checked in under `deploy/crds/`, compatible with the
//! original's objects.

use erdma_k8s::crd::{CRD_NAME, crd_yaml};
use erdma_k8s::{DeviceInfo, DeviceState, DeviceStatus, ERdmaDevice};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

const CHECKED_IN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/crds/network.alibabacloud.com_erdmadevices.yaml"
);

#[test]
fn checked_in_crd_is_fresh() {
    let generated = crd_yaml().expect("renders");
    if std::env::var_os("ERDMA_UPDATE_CRD").is_some() {
        std::fs::write(CHECKED_IN, &generated).expect("write the CRD");
    }
    let on_disk = std::fs::read_to_string(CHECKED_IN).unwrap_or_default();
    assert!(
        on_disk == generated,
        "{CHECKED_IN} is stale: regenerate it with `ERDMA_UPDATE_CRD=1 cargo test -p erdma-k8s --test crd`"
    );
    // And it is a valid CRD manifest.
    let parsed: CustomResourceDefinition =
        serde_saphyr::from_str(&on_disk).expect("parses as a CRD");
    assert_eq!(parsed.metadata.name.as_deref(), Some(CRD_NAME));
}

#[test]
fn crd_matches_the_original_contract() {
    let crd = ERdmaDevice::crd();
    assert_eq!(crd.spec.group, "network.alibabacloud.com");
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.names.kind, "ERdmaDevice");
    assert_eq!(crd.spec.names.plural, "erdmadevices");
    let v = &crd.spec.versions[0];
    assert_eq!(v.name, "v1");
    assert!(
        v.subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
    let schema = serde_json::to_value(
        v.schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap();
    let spec = &schema["properties"]["spec"];
    assert_eq!(spec["required"], serde_json::json!(["devices"]));
    let dev = &spec["properties"]["devices"]["items"]["properties"];
    let mut fields: Vec<&str> = dev
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "id",
            "instanceID",
            "isPrimaryENI",
            "mac",
            "networkCardIndex",
            "queuePair"
        ]
    );
    assert_eq!(dev["networkCardIndex"]["type"], "integer");
    assert_eq!(dev["isPrimaryENI"]["type"], "boolean");
    assert_eq!(spec["properties"]["jumboFrame"]["type"], "boolean");
    let st = &schema["properties"]["status"]["properties"]["devices"]["items"]["properties"];
    let mut fields: Vec<&str> = st.as_object().unwrap().keys().map(String::as_str).collect();
    fields.sort();
    assert_eq!(fields, ["id", "message", "status"]);
}

/// An object as the Go controller writes it (omitempty drops zero values) reads fine, and ours
/// uses the same JSON names.
#[test]
fn objects_round_trip_with_the_original_json_names() {
    let go = serde_json::json!({
        "apiVersion": "network.alibabacloud.com/v1", "kind": "ERdmaDevice",
        "metadata": {"name": "node-a", "labels": {"alibabacloud.com/nodename": "node-a"}},
        "spec": {"devices": [
            {"instanceID": "i-1", "mac": "00:16:3e:00:00:01", "isPrimaryENI": true, "id": "eni-1", "queuePair": 8},
            {"instanceID": "i-1", "mac": "00:16:3e:00:00:02", "id": "eni-2", "networkCardIndex": 1}
        ], "jumboFrame": true},
        "status": {"devices": [{"id": "eni-1", "status": "Ready"}, {"id": "eni-2", "status": "Weird"}]}
    });
    let obj: ERdmaDevice = serde_json::from_value(go).expect("decodes");
    assert_eq!(
        obj.spec.devices[1],
        DeviceInfo {
            instance_id: "i-1".into(),
            mac: "00:16:3e:00:00:02".into(),
            is_primary_eni: false,
            id: "eni-2".into(),
            network_card_index: 1,
            queue_pair: 0,
        }
    );
    assert!(obj.spec.jumbo_frame);
    let st = obj.status.as_ref().unwrap();
    assert_eq!(st.devices[0].state(), Some(DeviceState::Ready));
    assert_eq!(
        st.devices[1].state(),
        None,
        "unknown values are kept, not fatal"
    );
    assert!(!obj.all_ready());
    let back = serde_json::to_value(&obj).unwrap();
    assert_eq!(back["spec"]["devices"][0]["isPrimaryENI"], true);
    assert_eq!(back["spec"]["devices"][0]["instanceID"], "i-1");
    assert_eq!(back["spec"]["jumboFrame"], true);
    let s = serde_json::to_value(DeviceStatus::new("eni-1", DeviceState::Failed, "boom")).unwrap();
    assert_eq!(
        s,
        serde_json::json!({"id": "eni-1", "status": "Failed", "message": "boom"})
    );
}

/// The schema the API server gets (the checked-in CRD) refuses fields that are not what they
/// say (an escape sequence in an ID, a MAC with a newline, a path) and admits what the
/// original controller and erdma write. Checked with the JSON-schema checker of the chart's
/// values (RE2-style patterns, as the API server's Go regexp).
#[test]
fn the_crd_schema_refuses_fields_that_are_not_ids_macs_or_words() {
    let on_disk = std::fs::read_to_string(CHECKED_IN).expect("checked-in CRD");
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&on_disk).expect("parses");
    let schema = serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("a schema"),
    )
    .unwrap();
    let object = |device: serde_json::Value, status: serde_json::Value| {
        serde_json::json!({
            "apiVersion": "network.alibabacloud.com/v1", "kind": "ERdmaDevice",
            "metadata": {"name": "node-a"},
            "spec": {"devices": [device], "jumboFrame": true},
            "status": {"devices": [status]},
        })
    };
    let good_device = serde_json::json!({"instanceID": "i-bp1abcdefghijk", "mac": "00:16:3e:0a:1b:2c",
        "isPrimaryENI": true, "id": "eni-bp1primary0000", "networkCardIndex": 1, "queuePair": 8});
    let good_status = serde_json::json!({"id": "eni-bp1primary0000", "status": "Pending",
        "message": "agent: netdev eth1 is down"});
    let problems = erdma_k8s::install::check_schema(
        &schema,
        &object(good_device.clone(), good_status.clone()),
    );
    assert!(problems.is_empty(), "{problems:?}");
    // The original's omitempty objects, an ibdev name in local-discovery mode, upper-case MACs.
    for device in [
        serde_json::json!({"instanceID": "i-1", "id": "eni-2", "networkCardIndex": 1}),
        serde_json::json!({"id": "erdma_0", "mac": "00:16:3E:0A:1B:2C"}),
        serde_json::json!({"instanceID": "", "mac": "", "id": ""}),
    ] {
        let problems =
            erdma_k8s::install::check_schema(&schema, &object(device.clone(), good_status.clone()));
        assert!(problems.is_empty(), "{device}: {problems:?}");
    }
    let with = |field: &str, value: serde_json::Value| {
        let mut d = good_device.clone();
        d[field] = value;
        object(d, good_status.clone())
    };
    let with_status = |field: &str, value: serde_json::Value| {
        let mut s = good_status.clone();
        s[field] = value;
        object(good_device.clone(), s)
    };
    let bad = [
        (
            "instanceID",
            with("instanceID", "i-a\u{1b}]52;c;cm0gLXJmIH4=\u{7}".into()),
        ),
        ("instanceID", with("instanceID", "eni-bp1".into())),
        (
            "instanceID",
            with("instanceID", format!("i-{}", "a".repeat(63)).into()),
        ),
        ("mac", with("mac", "00:16:3e:0a:1b:2c\n".into())),
        ("mac", with("mac", "00-16-3e-0a-1b-2c".into())),
        ("id", with("id", "eni-1 --privileged".into())),
        ("id", with("id", "a".repeat(65).into())),
        ("id", with("id", "../etc".into())),
        ("status", with_status("status", "Ready\u{1b}[2J".into())),
        ("id", with_status("id", "eni-1\r".into())),
        ("message", with_status("message", "x".repeat(4097).into())),
    ];
    for (field, obj) in bad {
        let problems = erdma_k8s::install::check_schema(&schema, &obj);
        assert!(
            problems.iter().any(|p| p.contains(field)),
            "{field} in {obj} admitted: {problems:?}"
        );
    }
    // Lists are bounded too (the checker does not read maxItems; the API server does).
    assert_eq!(
        schema["properties"]["spec"]["properties"]["devices"]["maxItems"],
        64
    );
    assert_eq!(
        schema["properties"]["status"]["properties"]["devices"]["maxItems"],
        64
    );
}
