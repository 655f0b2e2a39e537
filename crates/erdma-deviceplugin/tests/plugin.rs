//! The real plugin server over Unix sockets, driven by the fake kubelet.

mod common;

use common::*;
use erdma_fake_kubelet::AllocateOptions;
use erdma_kubelet::deviceplugin::v1beta1 as api;
use erdma_kubelet::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use erdma_kubelet::uds::{self, ClientAuthority};
use erdma_model::Health;
use std::time::{Duration, Instant};

fn alloc(pod: &str, count: usize) -> AllocateOptions {
    AllocateOptions {
        resource: RESOURCE.into(),
        count,
        pod: pod.into(),
        container: "c".into(),
        authority: ClientAuthority::Localhost,
    }
}

/// Polls `done` until it holds, failing the test after [`DEADLINE`].
async fn wait_until(done: impl Fn() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(
            t.elapsed() < DEADLINE,
            "condition not reached within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn plugin_client(
    h: &Harness,
    authority: ClientAuthority,
) -> DevicePluginClient<tonic::transport::Channel> {
    let ch = uds::connect(&h.cfg.socket_path(), authority, Duration::from_secs(5))
        .await
        .expect("connect to plugin");
    DevicePluginClient::new(ch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_and_lists_slots_with_topology() {
    let h = start(
        node(vec![
            device("erdma_0", 0, Some(1), 1),
            device("erdma_1", 1, None, 2),
        ]),
        |_, _| {},
    )
    .await;
    let s = h.wait_registered(1).await;
    let r = &s.resources[RESOURCE];
    assert_eq!(r.endpoint, "erdma-aliyun_erdma-erdma.sock");
    assert!(r.options.get_preferred_allocation_available);
    assert!(!r.options.pre_start_required);
    let ids: Vec<&str> = r.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "erdma_0/0",
            "erdma_0/1",
            "erdma_0/2",
            "erdma_0/3",
            "erdma_1/0",
            "erdma_1/1",
            "erdma_1/2",
            "erdma_1/3"
        ]
    );
    assert!(r.devices.iter().all(|d| d.health == "Healthy"));
    assert!(r.devices[..4].iter().all(|d| d.numa == vec![1]));
    assert!(
        r.devices[4..].iter().all(|d| d.numa.is_empty()),
        "unknown NUMA must be omitted, never 0"
    );
    // The plugin learns of its registration when Register returns, just after the kubelet
    // has already opened ListAndWatch.
    for _ in 0..100 {
        if h.metrics.is_registered() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(h.metrics.is_registered());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_gives_the_chosen_devices_and_rdma_cm() {
    let h = start(two_numa_node(), |_, _| {}).await;
    let out = h
        .kubelet
        .allocate(&alloc("default/p1", 1))
        .await
        .expect("allocate");
    assert_eq!(out.device_ids.len(), 1);
    let dev = out.device_ids[0].split('/').next().unwrap().to_string();
    let n: u32 = dev.trim_start_matches("erdma_").parse().unwrap();
    let paths: Vec<&str> = out.devices.iter().map(|d| d.host_path.as_str()).collect();
    assert_eq!(
        paths,
        [
            format!("/dev/infiniband/uverbs{n}").as_str(),
            "/dev/infiniband/rdma_cm"
        ]
    );
    assert!(
        out.devices
            .iter()
            .all(|d| d.permissions == "rw" && d.container_path == d.host_path)
    );
    assert_eq!(out.envs["ERDMA_DEVICES"], dev);
    assert_eq!(out.envs["ERDMA_NCCL_IB_HCA"], format!("={dev}"));
    assert_eq!(out.envs["SMCR_PNET"], format!("00163E0A1B{:02X}", n + 1));
    assert!(out.cdi_devices.is_empty() && out.mounts.is_empty());
    // Two slots of two devices in one container: both devices, SMCR_PNET of the first by name.
    let mut c = plugin_client(&h, ClientAuthority::Localhost).await;
    let r = c
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec!["erdma_2/0".into(), "erdma_0/3".into()],
            }],
        })
        .await
        .expect("allocate")
        .into_inner();
    let c0 = &r.container_responses[0];
    assert_eq!(c0.envs["ERDMA_DEVICES"], "erdma_0,erdma_2");
    assert_eq!(c0.envs["SMCR_PNET"], "00163E0A1B01");
    let paths: Vec<&str> = c0.devices.iter().map(|d| d.host_path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/dev/infiniband/uverbs0",
            "/dev/infiniband/uverbs2",
            "/dev/infiniband/rdma_cm"
        ]
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_all_devices_mode_gives_every_healthy_device_to_every_container() {
    let mut n = two_numa_node();
    n.devices[2].health = Health::from_reasons(vec!["port 1 DOWN".into()]);
    let h = start(n, |c, _| c.allocate_all_devices = true).await;
    let mut c = plugin_client(&h, ClientAuthority::Localhost).await;
    let r = c
        .allocate(api::AllocateRequest {
            container_requests: vec![
                api::ContainerAllocateRequest {
                    devices_ids: vec!["erdma_1/0".into()],
                },
                api::ContainerAllocateRequest {
                    devices_ids: vec!["erdma_0/1".into()],
                },
            ],
        })
        .await
        .expect("allocate")
        .into_inner();
    assert_eq!(r.container_responses.len(), 2);
    for c in &r.container_responses {
        // The original starved the second container; here both get the same full set.
        let paths: Vec<&str> = c.devices.iter().map(|d| d.host_path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/dev/infiniband/uverbs0",
                "/dev/infiniband/uverbs1",
                "/dev/infiniband/rdma_cm"
            ]
        );
        assert_eq!(c.envs["ERDMA_DEVICES"], "erdma_0,erdma_1");
        assert_eq!(c.envs["SMCR_PNET"], "00163E0A1B01");
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocation_on_two_numa_nodes() {
    let h = start(two_numa_node(), |_, _| {}).await;
    // NUMA 1 has two devices (8 free slots) against NUMA 0's 4: the first goes to NUMA 1,
    // least-used device first, and the next spreads to the other device of NUMA 1.
    let a = h.kubelet.allocate(&alloc("default/a", 1)).await.unwrap();
    assert_eq!(a.preferred, vec!["erdma_1/0"]);
    assert_eq!(a.device_ids, a.preferred);
    let b = h.kubelet.allocate(&alloc("default/b", 1)).await.unwrap();
    assert_eq!(b.device_ids, vec!["erdma_2/0"]);
    // Two slots: one device suffices, so both come from one device.
    let c = h.kubelet.allocate(&alloc("default/c", 2)).await.unwrap();
    let devs: std::collections::BTreeSet<&str> = c
        .device_ids
        .iter()
        .map(|i| i.split('/').next().unwrap())
        .collect();
    assert_eq!(devs.len(), 1, "{:?}", c.device_ids);
    // must_include pins the NUMA node (0 here).
    let mut client = plugin_client(&h, ClientAuthority::Localhost).await;
    let all: Vec<String> = ["erdma_0", "erdma_1", "erdma_2"]
        .iter()
        .flat_map(|d| (0..4).map(move |i| format!("{d}/{i}")))
        .collect();
    let r = client
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: all,
                must_include_device_i_ds: vec!["erdma_0/2".into()],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.container_responses[0].device_i_ds,
        vec!["erdma_0/2", "erdma_0/0"]
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_ids_are_invalid_argument_naming_the_id_and_the_plugin_keeps_serving() {
    let h = start(two_numa_node(), |_, _| {}).await;
    let mut c = plugin_client(&h, ClientAuthority::Localhost).await;
    let cases: Vec<(Vec<Vec<&str>>, &str)> = vec![
        (vec![], "no container requests"),
        (vec![vec![]], "no device IDs"),
        (vec![vec!["garbage"]], "\"garbage\""),
        (vec![vec!["erdma_9/0"]], "\"erdma_9/0\""),
        (vec![vec!["erdma_0/4"]], "\"erdma_0/4\""),
        (vec![vec!["erdma_0/01"]], "\"erdma_0/01\""),
        (vec![vec!["erdma_0/1", "erdma_0/1"]], "appears twice"),
        (vec![vec!["nvidia.com/gpu-0"]], "\"nvidia.com/gpu-0\""),
        (vec![vec!["erdma_0/0"], vec!["erdma_0/x"]], "\"erdma_0/x\""),
    ];
    for (containers, needle) in cases {
        let req = api::AllocateRequest {
            container_requests: containers
                .iter()
                .map(|ids| api::ContainerAllocateRequest {
                    devices_ids: ids.iter().map(|s| s.to_string()).collect(),
                })
                .collect(),
        };
        let e = c.allocate(req).await.expect_err(needle);
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{needle}: {e:?}");
        assert!(
            e.message().contains(needle),
            "{needle} not in {:?}",
            e.message()
        );
    }
    let e = c
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: vec!["bad id".into()],
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    // Still serving.
    let ok = c
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec!["erdma_0/0".into()],
            }],
        })
        .await;
    assert!(ok.is_ok());
    h.stop().await;
}

/// The kubelet asks Allocate only for IDs that were healthy at its last ListAndWatch update, and
/// a failed Allocate fails the pod's admission for good: a device that turned unhealthy in
/// between (a link flap) is granted, logged and counted, and the container gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_turned_unhealthy_after_the_kubelets_last_list_is_granted_and_counted() {
    let h = start(two_numa_node(), |_, _| {}).await;
    let mut c = plugin_client(&h, ClientAuthority::Localhost).await;
    let mut n = two_numa_node();
    n.devices[1].health = Health::from_reasons(vec!["port 1 is DOWN".into()]);
    h.devices.send(n).unwrap();
    // The kubelet hears of it (its next offer would leave erdma_1 out) ...
    h.kubelet
        .wait_for(DEADLINE, |s| {
            s.resources[RESOURCE]
                .devices
                .iter()
                .filter(|d| d.id.starts_with("erdma_1/"))
                .all(|d| d.health == "Unhealthy")
        })
        .await
        .expect("unhealthy");
    // ... but had already admitted a pod on an offer from before.
    let r = c
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec!["erdma_1/0".into(), "erdma_1/1".into()],
            }],
        })
        .await
        .expect("granted: the kubelet offered erdma_1 healthy")
        .into_inner();
    let resp = &r.container_responses[0];
    assert_eq!(resp.envs["ERDMA_DEVICES"], "erdma_1");
    let paths: Vec<&str> = resp.devices.iter().map(|d| d.host_path.as_str()).collect();
    assert!(paths.contains(&"/dev/infiniband/uverbs1"), "{paths:?}");
    let text = h.metrics.encode();
    assert!(
        text.contains(r#"erdma_deviceplugin_allocated_unhealthy_total{device="erdma_1"} 1"#),
        "{text}"
    );
    c.allocate(api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: vec!["erdma_0/0".into()],
        }],
    })
    .await
    .unwrap();
    assert!(
        !h.metrics
            .encode()
            .contains(r#"allocated_unhealthy_total{device="erdma_0"}"#),
        "a healthy grant is not counted"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_changes_reach_the_kubelet() {
    let h = start(two_numa_node(), |_, _| {}).await;
    for round in 0..3 {
        let mut n = two_numa_node();
        n.devices[0].health = Health::from_reasons(vec![format!("port 1 DOWN (round {round})")]);
        let t = Instant::now();
        h.devices.send(n).unwrap();
        h.kubelet
            .wait_for(DEADLINE, |s| {
                s.resources[RESOURCE]
                    .devices
                    .iter()
                    .filter(|d| d.id.starts_with("erdma_0/"))
                    .all(|d| d.health == "Unhealthy")
            })
            .await
            .expect("unhealthy");
        let down = t.elapsed();
        let t = Instant::now();
        h.devices.send(two_numa_node()).unwrap();
        h.kubelet
            .wait_for(DEADLINE, |s| {
                s.resources[RESOURCE]
                    .devices
                    .iter()
                    .all(|d| d.health == "Healthy")
            })
            .await
            .expect("healthy again");
        eprintln!("health down {down:?}, up {:?}", t.elapsed());
    }
    // The same snapshot again sends nothing new.
    // Proven by order, not by a sleep: once the plugin counted the snapshot, the served set is
    // settled, and an update it caused would already be on its way to ListAndWatch.
    let before = h.kubelet.state().resources[RESOURCE].updates;
    let sent = h.metrics.list_and_watch_updates.get();
    let seen = h.metrics.inventory_snapshots.get();
    h.devices.send(two_numa_node()).unwrap();
    wait_until(|| h.metrics.inventory_snapshots.get() > seen).await;
    assert_eq!(h.metrics.list_and_watch_updates.get(), sent);
    assert_eq!(h.kubelet.state().resources[RESOURCE].updates, before);
    // A device that disappears (driver unloaded) stays advertised, unhealthy, and comes back.
    h.devices
        .send(node(vec![common::device("erdma_0", 0, Some(0), 1)]))
        .unwrap();
    h.kubelet
        .wait_for(DEADLINE, |s| {
            let d = &s.resources[RESOURCE].devices;
            d.len() == 12 && d.iter().filter(|d| d.health == "Unhealthy").count() == 8
        })
        .await
        .unwrap();
    // A pod the kubelet admitted on an offer from before gets it all the same (refused, its
    // admission would fail for good); its container starts once the device is back.
    let mut c = plugin_client(&h, ClientAuthority::Localhost).await;
    c.allocate(api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: vec!["erdma_2/0".into()],
        }],
    })
    .await
    .expect("granted");
    assert!(
        h.metrics
            .encode()
            .contains(r#"erdma_deviceplugin_allocated_unhealthy_total{device="erdma_2"} 1"#)
    );
    h.devices.send(two_numa_node()).unwrap();
    h.kubelet
        .wait_for(DEADLINE, |s| {
            s.resources[RESOURCE]
                .devices
                .iter()
                .all(|d| d.health == "Healthy")
        })
        .await
        .unwrap();
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_kubelet_restarts_in_a_row_never_lose_the_resource() {
    let h = start(two_numa_node(), |_, _| {}).await;
    h.kubelet.allocate(&alloc("default/keep", 1)).await.unwrap();
    let mut worst = Duration::ZERO;
    for i in 1..=10u64 {
        let t = Instant::now();
        h.kubelet.restart().await.unwrap();
        let s = h
            .kubelet
            .wait_for(DEADLINE, |s| {
                s.kubelet_restarts == i
                    && s.resources.get(RESOURCE).is_some_and(|r| {
                        r.connected && r.devices.len() == 12 && r.healthy_ids().count() == 12
                    })
            })
            .await
            .unwrap_or_else(|e| panic!("restart {i}: not re-registered within {DEADLINE:?}: {e}"));
        worst = worst.max(t.elapsed());
        assert_eq!(s.registrations, i + 1);
        assert_eq!(s.allocations.len(), 1, "the checkpoint survives restarts");
    }
    eprintln!("worst restart -> re-registered: {worst:?}");
    // Allocation still works after the restarts.
    h.kubelet
        .allocate(&alloc("default/after", 1))
        .await
        .unwrap();
    assert!(
        h.metrics
            .encode()
            .contains("erdma_deviceplugin_kubelet_restarts_total 10")
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_path_authority_is_accepted_for_dial_back_and_calls() {
    let h = start(two_numa_node(), |_, k| {
        k.dial_authority = ClientAuthority::SocketPath
    })
    .await;
    let mut o = alloc("default/old-kubelet", 1);
    o.authority = ClientAuthority::SocketPath;
    let out = h
        .kubelet
        .allocate(&o)
        .await
        .expect("allocate with the socket path as :authority");
    assert_eq!(out.device_ids.len(), 1);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_start_is_requested_only_in_pre_start_mode_and_is_a_no_op() {
    let h = start(two_numa_node(), |c, _| c.pre_start_required = true).await;
    assert!(
        h.kubelet.state().resources[RESOURCE]
            .options
            .pre_start_required
    );
    let out = h.kubelet.allocate(&alloc("default/smc", 1)).await.unwrap();
    assert!(out.pre_start_called);
    h.stop().await;
    let h = start(two_numa_node(), |_, _| {}).await;
    let out = h
        .kubelet
        .allocate(&alloc("default/plain", 1))
        .await
        .unwrap();
    assert!(!out.pre_start_called);
    // Called anyway (not requested): still succeeds without effect.
    let mut c = plugin_client(&h, ClientAuthority::Localhost).await;
    c.pre_start_container(api::PreStartContainerRequest {
        devices_ids: vec!["erdma_0/0".into()],
    })
    .await
    .unwrap();
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdi_mode_writes_a_spec_and_returns_cdi_devices() {
    let cdi_dir = short_tempdir();
    let spec_dir = cdi_dir.path().to_path_buf();
    let h = start(two_numa_node(), move |c, _| {
        c.cdi = Some(erdma_deviceplugin::CdiConfig {
            spec_dir,
            kind: "aliyun.com/erdma".into(),
        })
    })
    .await;
    let out = h.kubelet.allocate(&alloc("default/cdi", 1)).await.unwrap();
    let dev = out.device_ids[0].split('/').next().unwrap();
    assert_eq!(out.cdi_devices, vec![format!("aliyun.com/erdma={dev}")]);
    assert!(out.devices.is_empty());
    assert!(out.envs.contains_key("SMCR_PNET"));
    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(cdi_dir.path().join("aliyun.com-erdma.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(spec["kind"], "aliyun.com/erdma");
    assert_eq!(spec["devices"].as_array().unwrap().len(), 3);
    assert_eq!(spec["devices"][1]["name"], "erdma_1");
    assert_eq!(
        spec["devices"][1]["containerEdits"]["deviceNodes"][0]["path"],
        "/dev/infiniband/uverbs1"
    );
    assert_eq!(
        spec["containerEdits"]["deviceNodes"][0]["path"],
        "/dev/infiniband/rdma_cm"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaces_only_its_own_stale_socket_and_removes_it_on_shutdown() {
    let dir = short_tempdir();
    // Another plugin's socket and a stale socket of ours from a previous run.
    let other = dir.path().join("1700000000-erdma-eni.sock");
    let _other_listener = std::os::unix::net::UnixListener::bind(&other).unwrap();
    let own = dir.path().join("erdma-aliyun_erdma-erdma.sock");
    drop(std::os::unix::net::UnixListener::bind(&own).unwrap());
    let kubelet = erdma_fake_kubelet::FakeKubelet::start(
        erdma_fake_kubelet::FakeKubeletConfig::new(dir.path()),
    )
    .await
    .unwrap();
    let (_tx, rx) = tokio::sync::watch::channel(two_numa_node());
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut cfg = erdma_deviceplugin::PluginConfig::new(dir.path());
    cfg.slots_per_device = 2;
    let task = tokio::spawn(
        erdma_deviceplugin::Plugin::new(
            cfg,
            rx,
            std::sync::Arc::new(erdma_deviceplugin::Metrics::new()),
        )
        .run(cancel.clone()),
    );
    kubelet
        .wait_for(Duration::from_secs(5), |s| {
            s.resources
                .get(RESOURCE)
                .is_some_and(|r| r.devices.len() == 6)
        })
        .await
        .unwrap();
    assert!(
        uds::is_socket(&other),
        "another plugin's socket must survive"
    );
    assert!(uds::is_socket(&own));
    cancel.cancel();
    task.await.unwrap().unwrap();
    assert!(!own.exists(), "socket removed on shutdown");
    assert!(uds::is_socket(&other));
    // The kubelet saw the stream end and marked the devices unhealthy, as a real kubelet does.
    kubelet
        .wait_for(Duration::from_secs(2), |s| {
            s.resources[RESOURCE]
                .devices
                .iter()
                .all(|d| d.health == "Unhealthy")
        })
        .await
        .unwrap();
    kubelet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_retrying_while_the_kubelet_is_down_and_registers_when_it_appears() {
    let dir = short_tempdir();
    let (_tx, rx) = tokio::sync::watch::channel(two_numa_node());
    let cancel = tokio_util::sync::CancellationToken::new();
    let metrics = std::sync::Arc::new(erdma_deviceplugin::Metrics::new());
    let task = tokio::spawn(
        erdma_deviceplugin::Plugin::new(
            erdma_deviceplugin::PluginConfig::new(dir.path()),
            rx,
            metrics.clone(),
        )
        .run(cancel.clone()),
    );
    // A regular file where kubelet.sock should be: an error, not a crash.
    std::fs::write(dir.path().join("kubelet.sock"), b"not a socket").unwrap();
    wait_until(|| {
        metrics
            .encode()
            .contains("registrations_total{result=\"error\"}")
    })
    .await;
    assert!(!metrics.is_registered());
    assert!(!task.is_finished());
    std::fs::remove_file(dir.path().join("kubelet.sock")).unwrap();
    let t = Instant::now();
    let kubelet = erdma_fake_kubelet::FakeKubelet::start(
        erdma_fake_kubelet::FakeKubeletConfig::new(dir.path()),
    )
    .await
    .unwrap();
    kubelet
        .wait_for(DEADLINE, |s| {
            s.resources
                .get(RESOURCE)
                .is_some_and(|r| r.devices.len() == 600)
        })
        .await
        .unwrap();
    eprintln!("kubelet up -> registered: {:?}", t.elapsed());
    assert!(metrics.encode().contains("result=\"error\""));
    cancel.cancel();
    task.await.unwrap().unwrap();
    kubelet.shutdown().await;
}

/// The plugin's count of kubelet restarts it has seen.
fn restarts_seen(metrics: &erdma_deviceplugin::Metrics) -> u64 {
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix("erdma_deviceplugin_kubelet_restarts_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the restarts counter is exported")
}

/// The plugin directory removed with everything in it and made again (the inotify watch goes
/// with the directory): the new kubelet in it still gets the resource, and its restart is found
/// by the 1 s check that takes over from the lost watch until the watch is armed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_directory_made_anew_still_gets_the_resource() {
    let dir = short_tempdir();
    let first = erdma_fake_kubelet::FakeKubelet::start(erdma_fake_kubelet::FakeKubeletConfig::new(
        dir.path(),
    ))
    .await
    .unwrap();
    let (_tx, rx) = tokio::sync::watch::channel(two_numa_node());
    let cancel = tokio_util::sync::CancellationToken::new();
    let metrics = std::sync::Arc::new(erdma_deviceplugin::Metrics::new());
    let mut cfg = erdma_deviceplugin::PluginConfig::new(dir.path());
    // No safety poll while the watch is live: only events, or the 1 s check that runs while no
    // watch is, can find a restart.
    cfg.safety_poll = Duration::from_secs(3600);
    let task =
        tokio::spawn(erdma_deviceplugin::Plugin::new(cfg, rx, metrics.clone()).run(cancel.clone()));
    first
        .wait_for(DEADLINE, |s| {
            s.resources.get(RESOURCE).is_some_and(|r| r.connected)
        })
        .await
        .unwrap();
    first.shutdown().await;
    // The plugin may serve its socket again while the directory goes (it sees its socket
    // removed): remove until nothing is left, as `rm -rf` run again would.
    let t = Instant::now();
    while let Err(e) = std::fs::remove_dir_all(dir.path()) {
        assert!(
            t.elapsed() < DEADLINE,
            "cannot remove {}: {e}",
            dir.path().display()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    std::fs::create_dir(dir.path()).unwrap();
    let second = erdma_fake_kubelet::FakeKubelet::start(
        erdma_fake_kubelet::FakeKubeletConfig::new(dir.path()),
    )
    .await
    .unwrap();
    let s = second
        .wait_for(DEADLINE, |s| {
            s.resources
                .get(RESOURCE)
                .is_some_and(|r| r.connected && r.devices.len() == 600)
        })
        .await
        .unwrap_or_else(|e| panic!("not registered with the kubelet in the new directory: {e}"));
    assert!(s.registrations >= 1, "the new kubelet saw a registration");
    let own = erdma_deviceplugin::PluginConfig::new(dir.path()).socket_path();
    assert!(
        uds::is_socket(&own),
        "the plugin serves {} in the new directory",
        own.display()
    );
    // The kubelet lists the resource once the plugin's stream is up, a moment before the
    // plugin's Register call returns.
    wait_until(|| metrics.is_registered()).await;
    // The watch went with the old directory: a kubelet restart now is found by the 1 s check,
    // or by the watch armed again on the new directory.
    let seen = restarts_seen(&metrics);
    let registrations = second.state().registrations;
    second.restart().await.unwrap();
    second
        .wait_for(DEADLINE, |s| {
            s.registrations > registrations
                && s.resources
                    .get(RESOURCE)
                    .is_some_and(|r| r.connected && r.devices.len() == 600)
        })
        .await
        .unwrap_or_else(|e| panic!("the restart in the new directory was not seen: {e}"));
    assert!(
        restarts_seen(&metrics) > seen,
        "the plugin counted the restart"
    );
    cancel.cancel();
    task.await.unwrap().unwrap();
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_registration_is_retried_and_the_plugin_keeps_serving() {
    let dir = short_tempdir();
    let kubelet = erdma_fake_kubelet::FakeKubelet::start(
        erdma_fake_kubelet::FakeKubeletConfig::new(dir.path()),
    )
    .await
    .unwrap();
    kubelet.set_reject_register(Some("simulated rejection".into()));
    let (_tx, rx) = tokio::sync::watch::channel(two_numa_node());
    let cancel = tokio_util::sync::CancellationToken::new();
    let metrics = std::sync::Arc::new(erdma_deviceplugin::Metrics::new());
    let mut cfg = erdma_deviceplugin::PluginConfig::new(dir.path());
    cfg.slots_per_device = 1;
    let task = tokio::spawn(
        erdma_deviceplugin::Plugin::new(cfg.clone(), rx, metrics.clone()).run(cancel.clone()),
    );
    wait_until(|| {
        metrics
            .encode()
            .contains("registrations_total{result=\"error\"}")
    })
    .await;
    assert!(!task.is_finished());
    assert!(!metrics.is_registered());
    assert!(
        metrics
            .encode()
            .contains("registrations_total{result=\"error\"}")
    );
    // Still serving its socket meanwhile.
    let ch = uds::connect(
        &cfg.socket_path(),
        ClientAuthority::Localhost,
        Duration::from_secs(2),
    )
    .await
    .unwrap();
    DevicePluginClient::new(ch)
        .get_device_plugin_options(api::Empty {})
        .await
        .unwrap();
    kubelet.set_reject_register(None);
    kubelet
        .wait_for(Duration::from_secs(6), |s| {
            s.resources
                .get(RESOURCE)
                .is_some_and(|r| r.devices.len() == 3)
        })
        .await
        .unwrap();
    for _ in 0..100 {
        if metrics.is_registered() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(metrics.is_registered());
    cancel.cancel();
    task.await.unwrap().unwrap();
    kubelet.shutdown().await;
}

#[tokio::test]
async fn invalid_configuration_is_reported_before_serving() {
    let dir = short_tempdir();
    let (_tx, rx) = tokio::sync::watch::channel(two_numa_node());
    let mut cfg = erdma_deviceplugin::PluginConfig::new(dir.path());
    cfg.resource_name = "kubernetes.io/erdma".into();
    let r = erdma_deviceplugin::Plugin::new(
        cfg,
        rx,
        std::sync::Arc::new(erdma_deviceplugin::Metrics::new()),
    )
    .run(tokio_util::sync::CancellationToken::new())
    .await;
    assert!(r.unwrap_err().to_string().contains("kubernetes.io/erdma"));
}

/// The plugin's metrics after an allocation (the agent serves them over HTTP: its wiring tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_after_an_allocation() {
    let h = start(two_numa_node(), |_, _| {}).await;
    h.kubelet.allocate(&alloc("default/m", 1)).await.unwrap();
    // The plugin counts its registration when the kubelet's answer is back, which may be after
    // the kubelet already serves (and answered the Allocate above).
    let registered = "erdma_deviceplugin_registrations_total{result=\"ok\"} 1";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !h.metrics.encode().contains(registered) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let m = h.metrics.encode();
    for needle in [
        "erdma_deviceplugin_devices{health=\"healthy\",mode=\"iwarp\"} 3",
        "erdma_deviceplugin_slots_allocated{device=\"erdma_1\"} 1",
        "erdma_deviceplugin_allocate_duration_seconds_count 1",
        "erdma_deviceplugin_registrations_total{result=\"ok\"} 1",
        "erdma_deviceplugin_kubelet_restarts_total 0",
    ] {
        assert!(m.contains(needle), "{needle} missing in\n{m}");
    }
    assert!(h.metrics.is_registered());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocation_counts_use_from_pod_resources() {
    let pr_dir = short_tempdir();
    let pr_sock = pr_dir.path().join("pr.sock");
    let pr2 = pr_sock.clone();
    let h = start(two_numa_node(), move |c, k| {
        c.pod_resources_socket = Some(pr2.clone());
        k.pod_resources_socket = Some(pr2);
    })
    .await;
    let first = h.kubelet.allocate(&alloc("default/a", 1)).await.unwrap();
    assert_eq!(first.device_ids, vec!["erdma_1/0"]);
    let second = h.kubelet.allocate(&alloc("default/b", 1)).await.unwrap();
    assert_eq!(
        second.device_ids,
        vec!["erdma_2/0"],
        "spread to the other NUMA-1 device"
    );
    let third = h.kubelet.allocate(&alloc("default/c", 1)).await.unwrap();
    assert_eq!(
        third.device_ids,
        vec!["erdma_1/1"],
        "tie on NUMA 1: erdma_1 by name"
    );
    // Pod resources now say erdma_1 holds 2 slots and erdma_2 holds 1. Offer every slot of both
    // (so the offer itself says nothing about use): only pod resources can tell them apart, and
    // without them the tie would go to erdma_1 by name.
    let mut c = plugin_client(&h, ClientAuthority::Localhost).await;
    let all: Vec<String> = ["erdma_1", "erdma_2"]
        .iter()
        .flat_map(|d| (0..4).map(move |i| format!("{d}/{i}")))
        .collect();
    let r = c
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: all,
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.container_responses[0].device_i_ds[0].split('/').next(),
        Some("erdma_2")
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_are_rejected_and_the_plugin_keeps_serving() {
    let h = start(two_numa_node(), |_, _| {}).await;
    let mut c = plugin_client(&h, ClientAuthority::Localhost).await;
    let many: Vec<String> = (0..100_001).map(|i| format!("erdma_0/{i}")).collect();
    let e = c
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest { devices_ids: many }],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("at most 100000"), "{}", e.message());
    let mut c = plugin_client(&h, ClientAuthority::Localhost).await;
    c.allocate(api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: vec!["erdma_0/0".into()],
        }],
    })
    .await
    .unwrap();
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_a_missing_plugin_directory() {
    let base = short_tempdir();
    let dir = base.path().join("dp");
    let (_tx, rx) = tokio::sync::watch::channel(two_numa_node());
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut cfg = erdma_deviceplugin::PluginConfig::new(&dir);
    cfg.slots_per_device = 1;
    let task = tokio::spawn(
        erdma_deviceplugin::Plugin::new(
            cfg,
            rx,
            std::sync::Arc::new(erdma_deviceplugin::Metrics::new()),
        )
        .run(cancel.clone()),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished());
    let kubelet =
        erdma_fake_kubelet::FakeKubelet::start(erdma_fake_kubelet::FakeKubeletConfig::new(&dir))
            .await
            .unwrap();
    kubelet
        .wait_for(Duration::from_secs(6), |s| {
            s.resources
                .get(RESOURCE)
                .is_some_and(|r| r.devices.len() == 3)
        })
        .await
        .unwrap();
    cancel.cancel();
    task.await.unwrap().unwrap();
    kubelet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_takes_over_without_a_socket_fight() {
    let _ = tracing_subscriber::fmt().with_env_filter("info").try_init();
    let h = start(two_numa_node(), |_, _| {}).await;
    let sock = h.cfg.socket_path();
    // A second instance (rolling update with surge) binds the same socket name and registers.
    let (_tx, rx) = tokio::sync::watch::channel(two_numa_node());
    let cancel_b = tokio_util::sync::CancellationToken::new();
    let metrics_b = std::sync::Arc::new(erdma_deviceplugin::Metrics::new());
    let b = tokio::spawn(
        erdma_deviceplugin::Plugin::new(h.cfg.clone(), rx, metrics_b.clone()).run(cancel_b.clone()),
    );
    h.kubelet
        .wait_for(Duration::from_secs(5), |s| s.registrations == 2)
        .await
        .unwrap();
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(&sock).unwrap().ino();
    // The first one stands down: no re-binding, no re-registration, no counted kubelet restart.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        std::fs::metadata(&sock).unwrap().ino(),
        ino,
        "the socket must not flip between instances"
    );
    let s = h.kubelet.state();
    assert_eq!(s.registrations, 2);
    assert!(s.resources[RESOURCE].connected);
    assert!(!h.plugin.is_finished());
    assert!(h.metrics.encode().contains("kubelet_restarts_total 0"));
    // The second one stops (and removes its socket): the first serves and registers again.
    cancel_b.cancel();
    b.await.unwrap().unwrap();
    h.kubelet
        .wait_for(Duration::from_secs(3), |s| {
            s.registrations == 3 && s.resources[RESOURCE].connected
        })
        .await
        .unwrap();
    assert!(uds::is_socket(&sock));
    h.stop().await;
}

/// Sends raw bytes as the request body of a gRPC call (malformed protobuf).
struct GarbageCodec;
struct GarbageEncoder;
struct DiscardDecoder;

impl tonic::codec::Codec for GarbageCodec {
    type Encode = Vec<u8>;
    type Decode = ();
    type Encoder = GarbageEncoder;
    type Decoder = DiscardDecoder;
    fn encoder(&mut self) -> GarbageEncoder {
        GarbageEncoder
    }
    fn decoder(&mut self) -> DiscardDecoder {
        DiscardDecoder
    }
}

impl tonic::codec::Encoder for GarbageEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use prost::bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for DiscardDecoder {
    type Item = ();
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<()>, tonic::Status> {
        use prost::bytes::Buf;
        let n = src.remaining();
        src.advance(n);
        Ok(Some(()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bytes_and_protobuf_are_rejected_and_the_plugin_keeps_serving() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = start(two_numa_node(), |_, _| {}).await;
    let sock = h.cfg.socket_path();
    // Not HTTP/2 at all.
    let mut s = tokio::net::UnixStream::connect(&sock).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff garbage")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf)).await;
    // HTTP/2 preface followed by a broken frame.
    let mut s = tokio::net::UnixStream::connect(&sock).await.unwrap();
    s.write_all(
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x05\x01\x04\x00\x00\x00\x01\xff\xff\xff\xff\xff",
    )
    .await
    .unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf)).await;
    // A well-formed call whose body is not a valid AllocateRequest.
    let ch = uds::connect(&sock, ClientAuthority::Localhost, Duration::from_secs(5))
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(ch);
    grpc.ready().await.unwrap();
    let e = grpc
        .unary(
            tonic::Request::new(vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01]),
            tonic::codegen::http::uri::PathAndQuery::from_static("/v1beta1.DevicePlugin/Allocate"),
            GarbageCodec,
        )
        .await
        .unwrap_err();
    assert!(e.message().to_lowercase().contains("decode"), "{e:?}");
    // Still serving.
    let mut c = plugin_client(&h, ClientAuthority::Localhost).await;
    c.allocate(api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: vec!["erdma_0/0".into()],
        }],
    })
    .await
    .unwrap();
    assert!(h.kubelet.state().resources[RESOURCE].connected);
    h.stop().await;
}

/// `kubelet.sock` made as the kubelet's `net.Listen` makes it: `bind()` (the file appears, and
/// the directory watch reports it) before `listen()`. Returns the socket, not listening yet.
fn bind_without_listening(path: &std::path::Path) -> std::os::fd::OwnedFd {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, bind, socket};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket");
    bind(fd.as_raw_fd(), &UnixAddr::new(path).expect("socket path")).expect("bind");
    fd
}

/// Listens on a socket from [`bind_without_listening`].
fn listen_now(fd: std::os::fd::OwnedFd) -> tokio::net::UnixListener {
    use nix::sys::socket::{Backlog, listen};
    listen(&fd, Backlog::new(128).unwrap()).expect("listen");
    let l = std::os::unix::net::UnixListener::from(fd);
    l.set_nonblocking(true).unwrap();
    tokio::net::UnixListener::from_std(l).unwrap()
}

/// A counter of the plugin's metrics: the value on the line that starts with `name` (0 when the
/// line is not there yet).
fn counter(metrics: &erdma_deviceplugin::Metrics, name: &str) -> u64 {
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn attempts(metrics: &erdma_deviceplugin::Metrics, trigger: &str) -> u64 {
    counter(
        metrics,
        &format!("erdma_deviceplugin_registration_attempts_total{{trigger=\"{trigger}\"}} "),
    )
}

fn all_attempts(metrics: &erdma_deviceplugin::Metrics) -> u64 {
    [
        "served",
        "kubelet_socket",
        "kubelet_socket_retry",
        "backoff",
    ]
    .iter()
    .map(|t| attempts(metrics, t))
    .sum()
}

fn registrations(metrics: &erdma_deviceplugin::Metrics, result: &str) -> u64 {
    counter(
        metrics,
        &format!("erdma_deviceplugin_registrations_total{{result=\"{result}\"}} "),
    )
}

/// The restart order of issue 30: the kubelet goes away and removes `kubelet.sock`; the plugin's
/// own socket is removed (the kubelet's cleanup) while `kubelet.sock` stays absent for `absent`,
/// long enough for the registration back-off to grow; then `kubelet.sock` appears, bound before it
/// listens like the kubelet's own, and the attempt its appearance prompts is refused; then the
/// kubelet listens. The Register that follows must come from the plugin trying the new socket
/// again at once, not from the back-off timer (grown to 0.8 s after 0.7 s, 3.2 s after 3 s).
async fn registers_promptly_when_kubelet_sock_listens_after(absent: Duration) {
    let h = start(two_numa_node(), |_, _| {}).await;
    wait_until(|| h.metrics.is_registered()).await;
    let registered = h.kubelet.state().registrations;
    h.kubelet.go_down().await;
    std::fs::remove_file(h.cfg.socket_path()).expect("the plugin's socket is there to remove");
    tokio::time::sleep(absent).await;
    let ok = registrations(&h.metrics, "ok");
    let before = all_attempts(&h.metrics);
    let fd = bind_without_listening(&h.kubelet.socket());
    // An attempt started after kubelet.sock appeared and none is under way: it was refused.
    // (Attempts are counted when they start, results when they end: read in that order.)
    wait_until(|| {
        let a = all_attempts(&h.metrics);
        a > before && a == registrations(&h.metrics, "error") + ok
    })
    .await;
    h.kubelet.come_back_on(listen_now(fd));
    let listening = Instant::now();
    let backoff = attempts(&h.metrics, "backoff");
    h.kubelet
        .wait_for(DEADLINE, |s| s.registrations > registered)
        .await
        .unwrap_or_else(|e| panic!("no Register after {absent:?} without kubelet.sock: {e}"));
    let took = listening.elapsed();
    let m = &h.metrics;
    eprintln!(
        "kubelet.sock absent {absent:?}: listening -> Register {took:?}; attempts by trigger: kubelet_socket {}, kubelet_socket_retry {}, backoff {} ({backoff} when it listened)",
        attempts(m, "kubelet_socket"),
        attempts(m, "kubelet_socket_retry"),
        attempts(m, "backoff"),
    );
    assert_eq!(
        attempts(m, "backoff"),
        backoff,
        "kubelet.sock absent {absent:?}: the back-off timer, not the kubelet's socket, decided when the plugin registered ({took:?} after it listened)"
    );
    h.wait_registered(registered + 1).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_promptly_when_kubelet_sock_listens_after_700ms_away() {
    registers_promptly_when_kubelet_sock_listens_after(Duration::from_millis(700)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_promptly_when_kubelet_sock_listens_after_1500ms_away() {
    registers_promptly_when_kubelet_sock_listens_after(Duration::from_millis(1500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_promptly_when_kubelet_sock_listens_after_3s_away() {
    registers_promptly_when_kubelet_sock_listens_after(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_handed_over_waits_for_a_list_with_devices() {
    use futures::FutureExt;
    let h = start(node(vec![]), |_, _| {}).await;
    let s = h.wait_registered(1).await;
    assert!(s.resources[RESOURCE].devices.is_empty());
    assert!(
        h.metrics.devices_handed_over().now_or_never().is_none(),
        "an empty list is not the devices handed over"
    );
    h.devices
        .send(node(vec![device("erdma_0", 0, Some(0), 1)]))
        .expect("plugin holds the receiver");
    h.kubelet
        .wait_for(DEADLINE, |s| {
            s.resources
                .get(RESOURCE)
                .is_some_and(|r| r.devices.len() == 4)
        })
        .await
        .expect("the kubelet gets the device's slots");
    tokio::time::timeout(DEADLINE, h.metrics.devices_handed_over())
        .await
        .expect("the hand-over is signalled once the transport took the list");
    // Already signalled: returns at once for any later waiter.
    assert!(h.metrics.devices_handed_over().now_or_never().is_some());
    h.stop().await;
}
