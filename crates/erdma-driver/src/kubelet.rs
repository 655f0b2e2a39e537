//! Real [`PodResourceUsage`]: who holds the devices, from the process's one owner of the
//! pod-resources answer ([`Holders`]). A reload check asks it for an answer newer than the check
//! (the owner's refresher makes the call); this module opens no connection of its own.

use crate::usage::{Held, Holder, PodResourceUsage, UsageError};
use erdma_kubelet::podresources::{HolderCache, Holders, PodResourcesClient};
use std::path::Path;
use std::sync::Arc;

/// Asks the owner of the pod-resources answer which containers hold the devices.
#[derive(Debug, Clone)]
pub struct KubeletPodResources {
    holders: Arc<Holders>,
}

impl KubeletPodResources {
    /// An owner of its own for the pod-resources socket at `socket`, about `held` (a tool or test
    /// without the agent's owner; without its refresher each check makes one call on the owner's
    /// connection).
    pub fn new(socket: &Path, held: Held) -> Self {
        Self::from_holders(Holders::new(PodResourcesClient::new(socket), held))
    }

    /// Asks `holders`, the process's owner of the pod-resources answer.
    pub fn from_holders(holders: Arc<Holders>) -> Self {
        KubeletPodResources { holders }
    }

    /// [`Self::from_holders`] under the owner's older name.
    pub fn from_cache(cache: Arc<HolderCache>) -> Self {
        Self::from_holders(cache)
    }
}

/// `holders` (of `kept`) narrowed to `asked`: the same, or the extended resource alone of a kept
/// answer that counts a DRA driver too. `None` when `kept` cannot answer for `asked`.
fn narrowed(holders: &[Holder], kept: &Held, asked: &Held) -> Option<Vec<Holder>> {
    if asked == kept {
        return Some(holders.to_vec());
    }
    if asked.resource != kept.resource || asked.dra_driver.is_some() {
        return None;
    }
    Some(
        holders
            .iter()
            .filter(|h| !h.device_ids.is_empty())
            .map(|h| Holder {
                claimed: Vec::new(),
                ..h.clone()
            })
            .collect(),
    )
}

impl PodResourceUsage for KubeletPodResources {
    async fn holders(&self, held: &Held) -> Result<Vec<Holder>, UsageError> {
        let error = |detail: String| {
            UsageError {
            resource: held.to_string(),
            detail,
            fix: "mount /var/lib/kubelet/pod-resources into the agent; the reload stays refused until the kubelet answers"
                .to_string(),
        }
        };
        let kept = self.holders.held();
        if narrowed(&[], kept, held).is_none() {
            return Err(error(format!(
                "the agent keeps who holds {kept}, not {held}"
            )));
        }
        let fresh = self
            .holders
            .fresh()
            .await
            .map_err(|e| error(e.to_string()))?;
        Ok(narrowed(&fresh, kept, held).unwrap_or_default())
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

    /// The owner keeps both APIs: a question about the extended resource alone is answered from
    /// it (claims left out); a question about another resource is not.
    #[test]
    fn a_kept_answer_is_narrowed_only_to_what_it_counts() {
        let both = Held::both("aliyun/erdma", "erdma.alibabacloud.com");
        let mut claimed = holders_in(&answer(), &Held::resource("aliyun/erdma"));
        claimed[1].device_ids.clear();
        claimed[1]
            .claimed
            .push(erdma_kubelet::podresources::ClaimedDevice {
                claim_namespace: "team-c".into(),
                claim_name: "c".into(),
                pool: "node-1".into(),
                device: "erdma-1".into(),
            });
        let only = narrowed(&claimed, &both, &Held::resource("aliyun/erdma")).unwrap();
        assert_eq!(only.len(), 1, "{only:?}");
        assert!(only[0].claimed.is_empty());
        assert_eq!(narrowed(&claimed, &both, &both).unwrap(), claimed);
        assert!(narrowed(&claimed, &both, &Held::resource("nvidia.com/gpu")).is_none());
        assert!(
            narrowed(&claimed, &Held::resource("aliyun/erdma"), &both).is_none(),
            "an owner without the DRA driver cannot answer for it"
        );
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
        let held = Held::resource("aliyun/erdma");
        // the reconciler asks about both APIs; this check about the extended resource alone
        let usage = KubeletPodResources::new(&path, DriverConfig::default().resource);
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
            KubeletPodResources::new(&path, DriverConfig::default().resource),
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
        let usage = KubeletPodResources::new(
            Path::new("/tmp/erdma-no-such-dir/kubelet.sock"),
            Held::resource("aliyun/erdma"),
        );
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
