//! Real [`PodResourceUsage`]: the kubelet's pod-resources `List`, through erdma-kubelet's one
//! client, or through the agent's kept answer ([`HolderCache`]), which a reload check refreshes.

use crate::usage::{Held, Holder, PodResourceUsage, UsageError};
use erdma_kubelet::podresources::{HolderCache, PodResourcesClient};
use std::path::Path;
use std::sync::Arc;

/// Asks the kubelet which containers hold the devices.
#[derive(Debug, Clone, Default)]
pub struct KubeletPodResources {
    client: PodResourcesClient,
    cache: Option<Arc<HolderCache>>,
}

impl KubeletPodResources {
    /// A client of the pod-resources socket at `socket` (default
    /// `/var/lib/kubelet/pod-resources/kubelet.sock`).
    pub fn new(socket: &Path) -> Self {
        KubeletPodResources {
            client: PodResourcesClient::new(socket),
            cache: None,
        }
    }

    /// Asks through `cache` (whose answer it refreshes) when asked about what the cache keeps.
    pub fn from_cache(cache: Arc<HolderCache>) -> Self {
        KubeletPodResources {
            client: PodResourcesClient::new(cache.socket()),
            cache: Some(cache),
        }
    }
}

impl PodResourceUsage for KubeletPodResources {
    async fn holders(&self, held: &Held) -> Result<Vec<Holder>, UsageError> {
        let answer = match self.cache.as_ref().filter(|c| c.held() == held) {
            Some(c) => c.fresh().await.map(|h| h.as_ref().clone()),
            None => self.client.list(held).await,
        };
        answer.map_err(|e| UsageError {
            resource: held.to_string(),
            detail: e.to_string(),
            fix: "mount /var/lib/kubelet/pod-resources into the agent; the reload stays refused until the kubelet answers"
                .to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeHost, FakeState};
    use crate::{DriverConfig, DriverReconciler, StatusCode};
    use erdma_kubelet::podresources::holders_in;
    use erdma_kubelet::podresources::v1::pod_resources_lister_server::{
        PodResourcesLister, PodResourcesListerServer,
    };
    use erdma_kubelet::podresources::v1::{
        AllocatableResourcesRequest, AllocatableResourcesResponse, CdiDevice, ClaimResource,
        ContainerDevices, ContainerResources, DynamicResource, GetPodResourcesRequest,
        GetPodResourcesResponse, PodResources,
    };
    use erdma_kubelet::podresources::v1::{ListPodResourcesRequest, ListPodResourcesResponse};
    use erdma_kubelet::uds;
    use erdma_model::DriverMode;
    use std::sync::Arc;
    use tokio_util::sync::CancellationToken;
    use tonic::{Request, Response, Status};

    /// `(container, [(resource, [device ids])])`.
    type Containers<'a> = Vec<(&'a str, Vec<(&'a str, Vec<&'a str>)>)>;

    fn pod(ns: &str, name: &str, containers: Containers<'_>) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: containers
                .into_iter()
                .map(|(c, devs)| ContainerResources {
                    name: c.into(),
                    devices: devs
                        .into_iter()
                        .map(|(r, ids)| ContainerDevices {
                            resource_name: r.into(),
                            device_ids: ids.into_iter().map(String::from).collect(),
                            topology: None,
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn answer() -> ListPodResourcesResponse {
        ListPodResourcesResponse {
            pod_resources: vec![
                pod(
                    "team-a",
                    "trainer-0",
                    vec![
                        (
                            "main",
                            vec![
                                ("aliyun/erdma", vec!["erdma_0/1", "erdma_0/2"]),
                                ("nvidia.com/gpu", vec!["GPU-1"]),
                            ],
                        ),
                        ("sidecar", vec![]),
                    ],
                ),
                pod(
                    "team-b",
                    "web",
                    vec![("app", vec![("nvidia.com/gpu", vec!["GPU-2"])])],
                ),
                pod(
                    "team-c",
                    "smc",
                    vec![("init", vec![("aliyun/erdma", vec!["erdma_1/0"])])],
                ),
            ],
        }
    }

    #[test]
    fn picks_only_containers_with_the_resource() {
        let h = holders_in(&answer(), &Held::resource("aliyun/erdma"));
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].to_string(), "team-a/trainer-0 (container main)");
        assert_eq!(h[0].device_ids, ["erdma_0/1", "erdma_0/2"]);
        assert_eq!(
            (h[1].pod.as_str(), h[1].device_ids.as_slice()),
            ("smc", &["erdma_1/0".to_string()][..])
        );
        assert!(holders_in(&answer(), &Held::resource("example.com/none")).is_empty());
    }

    struct Kubelet(ListPodResourcesResponse);

    #[tonic::async_trait]
    impl PodResourcesLister for Kubelet {
        async fn list(
            &self,
            _: Request<ListPodResourcesRequest>,
        ) -> Result<Response<ListPodResourcesResponse>, Status> {
            Ok(Response::new(self.0.clone()))
        }
        async fn get_allocatable_resources(
            &self,
            _: Request<AllocatableResourcesRequest>,
        ) -> Result<Response<AllocatableResourcesResponse>, Status> {
            Err(Status::unimplemented("not needed"))
        }
        async fn get(
            &self,
            _: Request<GetPodResourcesRequest>,
        ) -> Result<Response<GetPodResourcesResponse>, Status> {
            Err(Status::unimplemented("not needed"))
        }
    }

    #[tokio::test]
    async fn reload_is_refused_from_a_real_pod_resources_answer() {
        let dir = tempfile::Builder::new()
            .prefix("ed")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let path = dir.path().join("kubelet.sock");
        let listener = uds::bind(&path).expect("bind");
        let cancel = CancellationToken::new();
        let c2 = cancel.clone();
        let server = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(Kubelet(answer())))
                .serve_with_incoming_shutdown(uds::incoming(listener), c2.cancelled())
                .await
        });
        let usage = KubeletPodResources::new(&path);
        let held = Held::resource("aliyun/erdma");
        let h = usage.holders(&held).await.expect("List over the socket");
        assert_eq!(h, holders_in(&answer(), &held));

        let mut state = FakeState::default();
        state.loaded.insert("erdma".into());
        state.compat = true;
        let host = Arc::new(FakeHost::new(state));
        let r = DriverReconciler::new(
            Arc::clone(&host),
            usage,
            DriverConfig {
                mode: DriverMode::Default,
                ..DriverConfig::default()
            },
        );
        let pass = r.reconcile_once().await;
        assert_eq!(pass.status.code, StatusCode::ModeChangePending);
        assert!(
            pass.status.reason.contains("team-a/trainer-0")
                && pass.status.reason.contains("team-c/smc")
        );
        assert_eq!(host.actions(), ["modprobe smc"]);
        cancel.cancel();
        server.await.expect("join").expect("server");
    }

    /// A pod whose container holds an erdma device only through a DRA claim (the kubelet lists
    /// it under `dynamic_resources`, not `devices`) blocks a reload as well.
    #[tokio::test]
    async fn reload_is_refused_while_a_pod_holds_a_device_through_a_claim() {
        let dir = tempfile::Builder::new()
            .prefix("ed")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let path = dir.path().join("kubelet.sock");
        let listener = uds::bind(&path).expect("bind");
        let mut with_claim = pod("team-d", "trainer-dra", vec![("main", vec![])]);
        with_claim.containers[0].dynamic_resources = vec![DynamicResource {
            claim_name: "rdma-claim".into(),
            claim_namespace: "team-d".into(),
            claim_resources: vec![ClaimResource {
                cdi_devices: vec![CdiDevice {
                    name: "erdma.alibabacloud.com/claim=uid-1-erdma_0".into(),
                }],
                driver_name: "erdma.alibabacloud.com".into(),
                pool_name: "node-1".into(),
                device_name: "erdma-0".into(),
            }],
        }];
        // A claim of another driver does not count.
        let mut other = pod("team-e", "gpu", vec![("main", vec![])]);
        other.containers[0].dynamic_resources = vec![DynamicResource {
            claim_name: "gpu".into(),
            claim_namespace: "team-e".into(),
            claim_resources: vec![ClaimResource {
                driver_name: "gpu.example.com".into(),
                pool_name: "node-1".into(),
                device_name: "gpu-0".into(),
                ..Default::default()
            }],
        }];
        let kubelet_answer = ListPodResourcesResponse {
            pod_resources: vec![with_claim, other],
        };
        let cancel = CancellationToken::new();
        let c2 = cancel.clone();
        let served = kubelet_answer.clone();
        let server = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(Kubelet(served)))
                .serve_with_incoming_shutdown(uds::incoming(listener), c2.cancelled())
                .await
        });
        assert!(
            holders_in(&kubelet_answer, &Held::resource("aliyun/erdma")).is_empty(),
            "the extended resource alone does not see the claim"
        );
        let mut state = FakeState::default();
        state.loaded.insert("erdma".into());
        state.compat = true;
        let host = Arc::new(FakeHost::new(state));
        let r = DriverReconciler::new(
            Arc::clone(&host),
            KubeletPodResources::new(&path),
            DriverConfig {
                mode: DriverMode::Default,
                ..DriverConfig::default()
            },
        );
        let pass = r.reconcile_once().await;
        assert_eq!(pass.status.code, StatusCode::ModeChangePending);
        assert!(
            pass.status
                .reason
                .contains("team-d/trainer-dra (container main, claim team-d/rdma-claim)"),
            "{}",
            pass.status.reason
        );
        assert!(
            !pass.status.reason.contains("team-e"),
            "{}",
            pass.status.reason
        );
        assert_eq!(host.actions(), ["modprobe smc"], "no reload");
        let pending = pass.status.pending.expect("the refused change");
        assert_eq!(pending.holders.len(), 1);
        assert_eq!(pending.holders[0].claimed[0].device, "erdma-0");
        cancel.cancel();
        server.await.expect("join").expect("server");
    }

    #[tokio::test]
    async fn missing_socket_is_a_usage_error_naming_it() {
        let usage = KubeletPodResources::new(Path::new("/tmp/erdma-no-such-dir/kubelet.sock"));
        let e = usage
            .holders(&Held::resource("aliyun/erdma"))
            .await
            .unwrap_err();
        let t = e.to_string();
        assert!(
            t.contains("/tmp/erdma-no-such-dir/kubelet.sock") && t.contains("pod-resources"),
            "{t}"
        );
    }
}
