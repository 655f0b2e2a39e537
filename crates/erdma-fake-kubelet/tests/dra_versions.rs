//! The fake kubelet's DRA registration as each release plays it, against stand-in plugins
//! listing chosen services: which health stream it opens (1.34 to 1.36: `v1alpha1` whatever is
//! listed, with `ResourceHealthStatus` on; 1.37: the listed one it prefers, or none), and what it
//! does with a second plugin of the same driver.

use erdma_fake_kubelet::dra::{DraKubelet, HealthRecord, KubeletVersion};
use erdma_fake_kubelet::dra_plugin::StandInDraPlugin;
use std::path::Path;
use std::time::Duration;

const DRIVER: &str = "stand-in.example.com";

fn short_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dv")
        .tempdir_in("/tmp")
        .expect("tmp")
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Gives a kubelet that would open a stream the time to do it (used before asserting none).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(300)).await;
}

fn registry(dir: &Path) -> std::path::PathBuf {
    dir.join("plugins_registry")
}

/// The device names of a stream's first update (the stand-in names the API version it serves).
fn first_update(r: &HealthRecord) -> Vec<String> {
    r.updates
        .first()
        .map(|u| {
            u.iter()
                .map(|d| format!("{}/{}", d.pool, d.device))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_plugin_listing_no_health_service_gets_v1alpha1_from_older_kubelets_and_none_from_1_37() {
    for (version, gate, want) in [
        (KubeletVersion::V1_34, None, None),
        (
            KubeletVersion::V1_34,
            Some(true),
            Some("v1alpha1.DRAResourceHealth"),
        ),
        (KubeletVersion::V1_35, None, None),
        (
            KubeletVersion::V1_36,
            None,
            Some("v1alpha1.DRAResourceHealth"),
        ),
        (KubeletVersion::V1_37, None, None),
    ] {
        let dir = short_dir();
        let plugin =
            StandInDraPlugin::start(dir.path(), DRIVER, "a", &["v1.DRAPlugin"]).expect("plugin");
        let mut kubelet = DraKubelet::new(version);
        if let Some(on) = gate {
            kubelet = kubelet.with_resource_health_status(on);
        }
        let client = kubelet
            .register(&registry(dir.path()), DRIVER)
            .await
            .expect("registered");
        assert_eq!(client.plugin_service, "v1.DRAPlugin", "{version}");
        assert_eq!(plugin.notified(), [(true, String::new())], "{version}");
        assert_eq!(client.health_service, want, "{version} gate {gate:?}");
        match want {
            Some(service) => {
                until(&format!("{version}: the {service} stream"), || {
                    plugin.health_opened() == [service]
                        && kubelet
                            .open_health_streams(DRIVER)
                            .iter()
                            .any(|r| r.received > 0)
                })
                .await;
                let streams = kubelet.open_health_streams(DRIVER);
                assert_eq!(streams.len(), 1, "{version}");
                assert_eq!(streams[0].service, service);
                assert_eq!(first_update(&streams[0]), ["stand-in/v1alpha1"]);
            }
            None => {
                settle().await;
                assert!(
                    plugin.health_opened().is_empty(),
                    "{version}: opened {:?}",
                    plugin.health_opened()
                );
                assert!(kubelet.health_streams().is_empty(), "{version}");
            }
        }
        plugin.stop().await;
    }
}

#[tokio::test]
async fn kubelet_1_37_opens_the_listed_health_service_it_prefers() {
    for (listed, want) in [
        (
            vec![
                "v1.DRAPlugin",
                "v1alpha1.DRAResourceHealth",
                "v1.DRAResourceHealth",
            ],
            "v1.DRAResourceHealth",
        ),
        (
            vec!["v1.DRAPlugin", "v1alpha1.DRAResourceHealth"],
            "v1alpha1.DRAResourceHealth",
        ),
    ] {
        let dir = short_dir();
        let plugin = StandInDraPlugin::start(dir.path(), DRIVER, "a", &listed).expect("plugin");
        let kubelet = DraKubelet::new(KubeletVersion::V1_37);
        let client = kubelet
            .register(&registry(dir.path()), DRIVER)
            .await
            .expect("registered");
        assert_eq!(client.health_service, Some(want), "{listed:?}");
        until(&format!("the {want} stream"), || {
            kubelet
                .open_health_streams(DRIVER)
                .iter()
                .any(|r| r.received > 0)
        })
        .await;
        assert_eq!(plugin.health_opened(), [want]);
        let stream = &kubelet.open_health_streams(DRIVER)[0];
        let device = want.split('.').next().unwrap_or_default();
        assert_eq!(first_update(stream), [format!("stand-in/{device}")]);
        plugin.stop().await;
    }
}

#[tokio::test]
async fn a_second_plugin_of_a_driver_is_kept_by_endpoint_and_called_and_streams_follow_the_release()
{
    for version in [KubeletVersion::V1_36, KubeletVersion::V1_37] {
        let dir = short_dir();
        let reg = registry(dir.path());
        let both = [
            "v1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ];
        let a = StandInDraPlugin::start(dir.path(), DRIVER, "a", &both).expect("plugin a");
        let kubelet = DraKubelet::new(version);
        let first = kubelet.register(&reg, DRIVER).await.expect("a registered");
        assert_eq!(first.info.endpoint, a.endpoint.display().to_string());
        let b = StandInDraPlugin::start(dir.path(), DRIVER, "b", &both).expect("plugin b");
        let now = kubelet.register(&reg, DRIVER).await.expect("b registered");
        assert_eq!(
            now.info.endpoint,
            b.endpoint.display().to_string(),
            "{version}: the latest plugin is called"
        );
        assert_eq!(
            kubelet.endpoints(DRIVER),
            [
                a.endpoint.display().to_string(),
                b.endpoint.display().to_string()
            ],
            "{version}: both kept, in registration order"
        );
        // The same endpoint registering again (its socket re-created) is refused and told why.
        let e = kubelet
            .register_socket(&a.registration_socket)
            .await
            .expect_err("an endpoint registers once");
        assert!(e.to_string().contains("already registered"), "{e}");
        let told = a.notified();
        assert_eq!(told.len(), 2, "{told:?}");
        assert!(
            !told[1].0 && told[1].1.contains("already registered"),
            "{told:?}"
        );
        assert_eq!(kubelet.endpoints(DRIVER).len(), 2);

        if version == KubeletVersion::V1_36 {
            // One v1alpha1 stream per plugin.
            until("a stream on each plugin", || {
                a.health_opened() == ["v1alpha1.DRAResourceHealth"]
                    && b.health_opened() == ["v1alpha1.DRAResourceHealth"]
            })
            .await;
            let open: Vec<String> = kubelet
                .open_health_streams(DRIVER)
                .into_iter()
                .map(|r| r.endpoint)
                .collect();
            assert_eq!(
                open,
                [
                    a.endpoint.display().to_string(),
                    b.endpoint.display().to_string()
                ]
            );
        } else {
            // One stream per driver, moved to the newest plugin, on the v1 service.
            until("the stream on b", || {
                b.health_opened() == ["v1.DRAResourceHealth"]
            })
            .await;
            let open = kubelet.open_health_streams(DRIVER);
            assert_eq!(open.len(), 1, "{open:?}");
            assert_eq!(open[0].endpoint, b.endpoint.display().to_string());
            assert_eq!(open[0].service, "v1.DRAResourceHealth");
            let ended: Vec<HealthRecord> = kubelet
                .health_streams()
                .into_iter()
                .filter(|r| r.ended.is_some())
                .collect();
            assert_eq!(ended.len(), 1);
            assert_eq!(ended[0].endpoint, a.endpoint.display().to_string());
        }

        // The newest plugin goes: the older one is called again.
        let b_reg = b.registration_socket.clone();
        b.stop().await;
        kubelet.deregister(&b_reg);
        assert_eq!(
            kubelet.get(DRIVER).map(|c| c.info.endpoint),
            Some(a.endpoint.display().to_string())
        );
        let open = kubelet.open_health_streams(DRIVER);
        if version == KubeletVersion::V1_36 {
            assert_eq!(open.len(), 1, "a's own stream stays");
            assert_eq!(open[0].endpoint, a.endpoint.display().to_string());
        } else {
            assert!(open.is_empty(), "no stream moves back to a: {open:?}");
        }
        a.stop().await;
    }
}

#[tokio::test]
async fn kubelet_1_37_ends_the_stream_when_the_newest_plugin_lists_no_health_service() {
    let dir = short_dir();
    let reg = registry(dir.path());
    let a = StandInDraPlugin::start(
        dir.path(),
        DRIVER,
        "a",
        &["v1.DRAPlugin", "v1.DRAResourceHealth"],
    )
    .expect("plugin a");
    let kubelet = DraKubelet::new(KubeletVersion::V1_37);
    kubelet.register(&reg, DRIVER).await.expect("a registered");
    until("a's stream", || {
        a.health_opened() == ["v1.DRAResourceHealth"]
    })
    .await;
    let b = StandInDraPlugin::start(dir.path(), DRIVER, "b", &["v1.DRAPlugin"]).expect("plugin b");
    let now = kubelet.register(&reg, DRIVER).await.expect("b registered");
    assert_eq!(now.health_service, None);
    settle().await;
    assert!(kubelet.open_health_streams(DRIVER).is_empty());
    assert!(b.health_opened().is_empty());
    let streams = kubelet.health_streams();
    assert_eq!(streams.len(), 1);
    assert_eq!(
        streams[0].ended.as_deref(),
        Some("a newer plugin of the driver registered")
    );
    a.stop().await;
    b.stop().await;
}
