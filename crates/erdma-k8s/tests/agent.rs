//! The agent API against the fake API server (real kube client over HTTP; only the API server is
//! in memory).

use erdma_k8s::agent::{AGENT_PREFIX, NodeEris, report_device_problems};
use erdma_k8s::fake::FakeApiServer;
use erdma_k8s::labels::erdma_device_labels;
use erdma_k8s::{
    DeviceInfo, DeviceState, DeviceStatus, ERdmaDevice, ERdmaDeviceSpec, ERdmaDeviceStatus, Error,
};
use std::time::Duration;

fn device(id: &str, mac: &str) -> DeviceInfo {
    DeviceInfo {
        instance_id: "i-1".into(),
        mac: mac.into(),
        id: id.into(),
        queue_pair: 8,
        ..Default::default()
    }
}

fn cr(node: &str, devices: Vec<DeviceInfo>, ready: &[&str]) -> ERdmaDevice {
    let mut o = ERdmaDevice::new(
        node,
        ERdmaDeviceSpec {
            devices,
            jumbo_frame: true,
        },
    );
    o.metadata.labels = Some(erdma_device_labels(node, "i-1"));
    o.status = Some(ERdmaDeviceStatus {
        devices: ready
            .iter()
            .map(|id| DeviceStatus::new(*id, DeviceState::Ready, ""))
            .collect(),
    });
    o
}

/// The next update of a node's watch (within 10 s; the stream never ends).
async fn next_update(
    changes: &mut (impl futures::Stream<Item = Result<Option<NodeEris>, Error>> + Unpin),
) -> Result<Option<NodeEris>, Error> {
    use futures::StreamExt;
    tokio::time::timeout(Duration::from_secs(10), changes.next())
        .await
        .expect("an update within 10 s")
        .expect("the stream stays open")
}

/// An API error while listing is yielded (for the agent to log) and the watch goes on: the
/// object still arrives.
#[tokio::test]
async fn watch_yields_an_api_error_and_goes_on() {
    use erdma_k8s::agent::watch_node_eris;
    let api = FakeApiServer::new();
    api.put(&cr(
        "node-a",
        vec![device("eni-1", "00:16:3e:00:00:01")],
        &[],
    ));
    api.fail_once("GET", "erdmadevices", 500);
    let mut changes = Box::pin(watch_node_eris(&api.client(), "node-a"));
    let mut next = async || next_update(&mut changes).await;
    match next().await {
        Err(Error::Watch { what, message }) => {
            assert!(what.contains("node-a"), "{what}");
            assert!(!message.is_empty());
        }
        other => panic!("the failed list first: {other:?}"),
    }
    let eris = next().await.unwrap().expect("the object after the retry");
    assert_eq!(eris.devices.len(), 1);
    let lists = api.requests_matching("GET", "/apis/network.alibabacloud.com/v1/erdmadevices");
    assert!(
        lists.iter().all(|r| r.contains("labelSelector")),
        "{lists:?}"
    );
}

#[tokio::test]
async fn agent_problems_are_written_and_cleared_without_touching_controller_entries() {
    let api = FakeApiServer::new();
    api.put(&cr(
        "node-a",
        vec![device("eni-1", "m1"), device("eni-2", "m2")],
        &["eni-1", "eni-2"],
    ));
    let client = api.client();
    report_device_problems(
        &client,
        "node-a",
        &[("eni-2".into(), "no netdev with MAC m2".into())],
    )
    .await
    .unwrap();
    let o: ERdmaDevice = api.get(None, "node-a").unwrap();
    let st = o.status.unwrap().devices;
    assert_eq!(st.len(), 2);
    assert_eq!(st[0], DeviceStatus::new("eni-1", DeviceState::Ready, ""));
    assert_eq!(st[1].state(), Some(DeviceState::Failed));
    assert_eq!(
        st[1].message,
        format!("{AGENT_PREFIX}no netdev with MAC m2")
    );
    assert!(
        api.requests_matching("PATCH", "/erdmadevices/node-a/status")
            .len()
            == 1
    );

    report_device_problems(&client, "node-a", &[])
        .await
        .unwrap();
    let o: ERdmaDevice = api.get(None, "node-a").unwrap();
    assert_eq!(
        o.status.unwrap().devices,
        vec![DeviceStatus::new("eni-1", DeviceState::Ready, "")]
    );
}

#[test]
fn local_devices_are_matched_by_mac_and_missing_ones_reported() {
    let eris = erdma_k8s::agent::NodeEris {
        object_name: "node-a".into(),
        devices: vec![
            device("eni-1", "00:16:3e:00:00:01"),
            device("eni-2", "00:16:3e:00:00:02"),
        ],
        jumbo_frame: false,
        status: vec![],
    };
    let local = vec![
        ("00:16:3E:00:00:01".to_string(), "erdma_0".to_string()),
        ("00:16:3e:00:00:09".to_string(), "erdma_1".to_string()),
    ];
    let m = eris.match_local(&local);
    assert_eq!(m.matched.len(), 1);
    assert_eq!(
        (m.matched[0].0.id.as_str(), m.matched[0].1.as_str()),
        ("eni-1", "erdma_0")
    );
    assert_eq!(m.missing.len(), 1);
    assert_eq!(m.missing[0].0, "eni-2");
    assert!(m.missing[0].1.contains("00:16:3e:00:00:02"));
}

/// The agent follows its node's object with a watch: the first list (nothing yet), the object
/// once created, each change, a second object for the node (an error naming both), and the
/// object gone. Objects of other nodes never show.
#[tokio::test]
async fn watch_follows_the_node_object_through_its_life() {
    use erdma_k8s::agent::watch_node_eris;
    let api = FakeApiServer::new();
    api.put(&cr(
        "node-b",
        vec![device("eni-9", "00:16:3e:aa:bb:09")],
        &["eni-9"],
    ));
    let mut changes = Box::pin(watch_node_eris(&api.client(), "node-a"));
    let mut next = async || next_update(&mut changes).await;
    assert_eq!(
        next().await.unwrap(),
        None,
        "first list: no object for node-a"
    );

    api.put(&cr(
        "node-a",
        vec![device("eni-1", "00:16:3e:aa:bb:01")],
        &[],
    ));
    let eris = next().await.unwrap().expect("created");
    assert_eq!(eris.object_name, "node-a");
    assert!(!eris.all_ready());

    api.put(&cr(
        "node-a",
        vec![device("eni-1", "00:16:3e:aa:bb:01")],
        &["eni-1"],
    ));
    let eris = next().await.unwrap().expect("still there");
    assert!(eris.all_ready());
    assert!(eris.jumbo_frame);
    assert_eq!(eris.devices[0].id, "eni-1");
    assert_eq!(
        eris.by_mac("00-16-3E-AA-BB-01").map(|d| d.id.as_str()),
        Some("eni-1"),
        "MACs match whatever their case and separator"
    );
    assert_eq!(eris.by_mac("00:16:3e:aa:bb:02"), None);

    let mut twin = cr(
        "node-a-old",
        vec![device("eni-2", "00:16:3e:aa:bb:02")],
        &[],
    );
    twin.metadata.labels = Some(erdma_device_labels("node-a", "i-1"));
    api.put(&twin);
    match next().await {
        Err(Error::Invalid(msg)) => {
            assert!(msg.contains("node-a, node-a-old"), "{msg}");
            assert!(msg.contains("fix:"), "{msg}");
        }
        other => panic!("two objects for one node: {other:?}"),
    }
    api.remove::<ERdmaDevice>(None, "node-a-old");
    assert!(next().await.unwrap().is_some(), "one object again");

    api.remove::<ERdmaDevice>(None, "node-a");
    assert_eq!(next().await.unwrap(), None, "deleted");
}
