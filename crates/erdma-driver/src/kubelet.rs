//! Real [`PodResourceUsage`]: the kubelet's pod-resources v1 `List` over its Unix socket.

use crate::usage::{Holder, PodResourceUsage, UsageError};
use erdma_kubelet::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use erdma_kubelet::podresources::v1::{
    DEFAULT_SOCKET, ListPodResourcesRequest, ListPodResourcesResponse,
};
use erdma_kubelet::uds::{self, ClientAuthority};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Asks the kubelet which containers hold a resource.
#[derive(Debug, Clone)]
pub struct KubeletPodResources {
    socket: PathBuf,
    timeout: Duration,
}

impl Default for KubeletPodResources {
    fn default() -> Self {
        Self::new(Path::new(DEFAULT_SOCKET))
    }
}

impl KubeletPodResources {
    /// A client of the pod-resources socket at `socket` (default
    /// `/var/lib/kubelet/pod-resources/kubelet.sock`).
    pub fn new(socket: &Path) -> Self {
        KubeletPodResources {
            socket: socket.to_path_buf(),
            timeout: Duration::from_secs(10),
        }
    }

    fn error(&self, resource: &str, detail: String) -> UsageError {
        UsageError {
            resource: resource.to_string(),
            detail: format!("pod-resources List on {}: {detail}", self.socket.display()),
            fix: "mount /var/lib/kubelet/pod-resources into the agent; the reload stays refused until the kubelet answers"
                .to_string(),
        }
    }
}

/// The containers in a `List` answer that have devices of `resource`.
pub fn holders_in(resp: &ListPodResourcesResponse, resource: &str) -> Vec<Holder> {
    let mut out = Vec::new();
    for pod in &resp.pod_resources {
        for c in &pod.containers {
            let device_ids: Vec<String> = c
                .devices
                .iter()
                .filter(|d| d.resource_name == resource)
                .flat_map(|d| d.device_ids.iter().cloned())
                .collect();
            if !device_ids.is_empty() {
                out.push(Holder {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: c.name.clone(),
                    device_ids,
                });
            }
        }
    }
    out
}

impl PodResourceUsage for KubeletPodResources {
    async fn holders(&self, resource: &str) -> Result<Vec<Holder>, UsageError> {
        let channel = uds::connect(&self.socket, ClientAuthority::Localhost, self.timeout)
            .await
            .map_err(|e| self.error(resource, e.to_string()))?;
        let mut client = PodResourcesListerClient::new(channel);
        let resp = tokio::time::timeout(self.timeout, client.list(ListPodResourcesRequest {}))
            .await
            .map_err(|_| self.error(resource, format!("no answer within {:?}", self.timeout)))?
            .map_err(|s| self.error(resource, format!("{}: {}", s.code(), s.message())))?;
        Ok(holders_in(resp.get_ref(), resource))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeHost, FakeState};
    use crate::{DriverConfig, DriverReconciler, StatusCode};
    use erdma_kubelet::podresources::v1::pod_resources_lister_server::{
        PodResourcesLister, PodResourcesListerServer,
    };
    use erdma_kubelet::podresources::v1::{
        AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
        ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, PodResources,
    };
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
        let h = holders_in(&answer(), "aliyun/erdma");
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].to_string(), "team-a/trainer-0 (container main)");
        assert_eq!(h[0].device_ids, ["erdma_0/1", "erdma_0/2"]);
        assert_eq!(
            (h[1].pod.as_str(), h[1].device_ids.as_slice()),
            ("smc", &["erdma_1/0".to_string()][..])
        );
        assert!(holders_in(&answer(), "example.com/none").is_empty());
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
        let h = usage
            .holders("aliyun/erdma")
            .await
            .expect("List over the socket");
        assert_eq!(h, holders_in(&answer(), "aliyun/erdma"));

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

    #[tokio::test]
    async fn missing_socket_is_a_usage_error_naming_it() {
        let usage = KubeletPodResources::new(Path::new("/tmp/erdma-no-such-dir/kubelet.sock"));
        let e = usage.holders("aliyun/erdma").await.unwrap_err();
        let t = e.to_string();
        assert!(
            t.contains("/tmp/erdma-no-such-dir/kubelet.sock") && t.contains("pod-resources"),
            "{t}"
        );
    }
}
