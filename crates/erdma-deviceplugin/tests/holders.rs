//! GetPreferredAllocation reads who holds which device from the process's one owner of the
//! pod-resources answer: its calls open no pod-resources connection and make no call, and an
//! allocation's poke brings the new holder into the next preference.

use erdma_deviceplugin::devices::ServedSet;
use erdma_deviceplugin::service::{DevicePluginService, PluginState};
use erdma_deviceplugin::{Metrics, NoopPreStart, PluginConfig};
use erdma_kubelet::deviceplugin::v1beta1 as api;
use erdma_kubelet::deviceplugin::v1beta1::device_plugin_server::DevicePlugin;
use erdma_kubelet::podresources::v1 as pr;
use erdma_kubelet::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use erdma_kubelet::podresources::{Held, Holders, PodResourcesClient};
use erdma_kubelet::uds;
use erdma_model::{CharDevice, DeviceKind, NodeDevices, RdmaDevice};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

const RESOURCE: &str = "aliyun/erdma";
const SLOTS: u32 = 4;

#[derive(Clone, Default)]
struct Kubelet {
    calls: Arc<AtomicUsize>,
    pods: Arc<Mutex<Vec<pr::PodResources>>>,
}

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources: self.pods.lock().unwrap().clone(),
        }))
    }
    async fn get_allocatable_resources(
        &self,
        _: Request<pr::AllocatableResourcesRequest>,
    ) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }
    async fn get(
        &self,
        _: Request<pr::GetPodResourcesRequest>,
    ) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }
}

fn pod(name: &str, ids: &[&str]) -> pr::PodResources {
    pr::PodResources {
        name: name.into(),
        namespace: "default".into(),
        containers: vec![pr::ContainerResources {
            name: "app".into(),
            devices: vec![pr::ContainerDevices {
                resource_name: RESOURCE.into(),
                device_ids: ids.iter().map(|s| s.to_string()).collect(),
                topology: None,
            }],
            ..Default::default()
        }],
    }
}

fn node() -> NodeDevices {
    let mut node = NodeDevices::empty();
    for (i, name) in ["erdma_0", "erdma_1"].into_iter().enumerate() {
        let mut d = RdmaDevice::named(name, DeviceKind::Erdma);
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

/// One slot wanted out of every slot of both devices: only the holders tell them apart.
async fn preferred(svc: &DevicePluginService) -> String {
    let all: Vec<String> = ["erdma_0", "erdma_1"]
        .iter()
        .flat_map(|d| (0..SLOTS).map(move |i| format!("{d}/{i}")))
        .collect();
    let r = svc
        .get_preferred_allocation(Request::new(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: all,
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        }))
        .await
        .unwrap()
        .into_inner();
    let id = &r.container_responses[0].device_i_ds[0];
    id.split('/').next().unwrap().to_string()
}

#[tokio::test]
async fn preferred_allocations_read_the_owner_and_open_no_connection() {
    let dir = tempfile::Builder::new()
        .prefix("dph")
        .tempdir_in("/tmp")
        .unwrap();
    let path = dir.path().join("kubelet.sock");
    let kubelet = Kubelet::default();
    *kubelet.pods.lock().unwrap() = vec![pod("a", &["erdma_0/0", "erdma_0/1"])];
    let conns = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    {
        let (k, c, s) = (kubelet.clone(), conns.clone(), stop.clone());
        let listener = uds::bind(&path).unwrap();
        let incoming = tokio_stream::StreamExt::map(uds::incoming(listener), move |x| {
            c.fetch_add(1, Ordering::SeqCst);
            x
        });
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(k))
                .serve_with_incoming_shutdown(incoming, s.cancelled())
                .await
                .unwrap();
        });
    }
    let holders = Holders::start(
        PodResourcesClient::new(&path),
        Held::both(RESOURCE, erdma_model::names::DRA_DRIVER),
        stop.clone(),
    );
    let mut rx = holders.subscribe();
    tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|s| s.is_answered()))
        .await
        .unwrap()
        .unwrap();

    let (_tx, served) = watch::channel(Arc::new(ServedSet::from_snapshot(&node(), SLOTS)));
    let mut cfg = PluginConfig::new("/nonexistent/device-plugins");
    cfg.resource_name = RESOURCE.into();
    cfg.slots_per_device = SLOTS;
    let poke = holders.clone();
    let state = PluginState {
        cfg,
        served,
        metrics: Arc::new(Metrics::new()),
        pre_start: Arc::new(NoopPreStart),
        reclaim: Arc::new(tokio::sync::Notify::new()),
        on_allocate: Some(Arc::new(move || poke.poke())),
        holders: Some(holders.clone()),
    };
    let svc = DevicePluginService::new(Arc::new(state), CancellationToken::new());
    for _ in 0..20 {
        assert_eq!(
            preferred(&svc).await,
            "erdma_1",
            "pod a holds two slots of erdma_0"
        );
    }
    assert_eq!(
        conns.load(Ordering::SeqCst),
        1,
        "the owner's one connection"
    );
    assert_eq!(
        kubelet.calls.load(Ordering::SeqCst),
        1,
        "the owner's first answer"
    );

    // Pods b and c take three slots of erdma_1; the allocation's poke (the plugin's Allocate
    // observer) refreshes the owner, and the next preference sees them.
    kubelet
        .pods
        .lock()
        .unwrap()
        .push(pod("b", &["erdma_1/0", "erdma_1/1", "erdma_1/2"]));
    let r = svc
        .allocate(Request::new(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec!["erdma_1/2".into()],
            }],
        }))
        .await;
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(preferred(&svc).await, "erdma_0");
    assert_eq!(conns.load(Ordering::SeqCst), 1, "still one connection");
    assert_eq!(
        kubelet.calls.load(Ordering::SeqCst),
        2,
        "one call for the poke"
    );
    stop.cancel();
}
