//! The pod-resources v1 API, answered from the fake's allocation ledger, registered devices, and
//! the DRA claims prepared for the pods it ran (listed as the kubelet lists them: under
//! `dynamic_resources` of the container that uses the claim, one `ClaimResource` per device).

use crate::state::{self, AllocationRecord, ResourceState};
use erdma_kubelet::podresources::v1 as pr;
use erdma_kubelet::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// What the answers are read from: the daemon's state directory and registered resources.
pub(crate) trait Source: Send + Sync + 'static {
    /// The state directory (the allocation ledger lives there).
    fn dir(&self) -> &Path;
    /// The registered resources now.
    fn resources(&self) -> BTreeMap<String, ResourceState>;
}

pub(crate) fn server(shared: Arc<dyn Source>) -> PodResourcesListerServer<Lister> {
    PodResourcesListerServer::new(Lister { shared })
}

pub(crate) struct Lister {
    shared: Arc<dyn Source>,
}

impl Lister {
    /// The ledger as last written. No lock: the file is replaced atomically, and an admission in
    /// progress holds the lock while it calls the plugin, which may ask us (as a real kubelet
    /// answers pod-resources during admission).
    async fn ledger(&self) -> Result<(Vec<AllocationRecord>, Vec<ClaimUse>), Status> {
        let dir = self.shared.dir().to_path_buf();
        tokio::task::spawn_blocking(move || {
            let ledger = state::read_ledger(&dir)?;
            Ok::<_, crate::FakeKubeletError>((ledger, claim_uses(&dir)))
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| Status::internal(e.to_string()))
    }

    fn topology(&self, resource: &str, ids: &[String]) -> Option<pr::TopologyInfo> {
        let resources = self.shared.resources();
        let r = resources.get(resource)?;
        let mut nodes: Vec<i64> = r
            .devices
            .iter()
            .filter(|d| ids.contains(&d.id))
            .flat_map(|d| d.numa.clone())
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        (!nodes.is_empty()).then(|| pr::TopologyInfo {
            nodes: nodes.into_iter().map(|id| pr::NumaNode { id }).collect(),
        })
    }

    fn pods(&self, ledger: &[AllocationRecord], claims: &[ClaimUse]) -> Vec<pr::PodResources> {
        // pod -> container -> devices
        let mut pods: BTreeMap<&str, BTreeMap<&str, Vec<&AllocationRecord>>> = BTreeMap::new();
        for a in ledger {
            pods.entry(a.pod.as_str())
                .or_default()
                .entry(a.container.as_str())
                .or_default()
                .push(a);
        }
        for c in claims {
            pods.entry(c.pod.as_str())
                .or_default()
                .entry(c.container.as_str())
                .or_default();
        }
        pods.into_iter()
            .map(|(pod, containers)| {
                let (namespace, name) = pod.split_once('/').unwrap_or(("default", pod));
                pr::PodResources {
                    name: name.to_string(),
                    namespace: namespace.to_string(),
                    containers: containers
                        .into_iter()
                        .map(|(c, recs)| pr::ContainerResources {
                            name: c.to_string(),
                            devices: recs
                                .into_iter()
                                .map(|a| pr::ContainerDevices {
                                    resource_name: a.resource.clone(),
                                    device_ids: a.device_ids.clone(),
                                    topology: self.topology(&a.resource, &a.device_ids),
                                })
                                .collect(),
                            dynamic_resources: claims
                                .iter()
                                .filter(|u| u.pod == pod && u.container == c)
                                .map(|u| u.resource.clone())
                                .collect(),
                            ..Default::default()
                        })
                        .collect(),
                }
            })
            .collect()
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        let (ledger, claims) = self.ledger().await?;
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources: self.pods(&ledger, &claims),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<pr::AllocatableResourcesRequest>,
    ) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        let mut devices = Vec::new();
        for (name, r) in self.shared.resources() {
            for d in r.devices.iter().filter(|d| d.health == "Healthy") {
                devices.push(pr::ContainerDevices {
                    resource_name: name.clone(),
                    device_ids: vec![d.id.clone()],
                    topology: (!d.numa.is_empty()).then(|| pr::TopologyInfo {
                        nodes: d.numa.iter().map(|&id| pr::NumaNode { id }).collect(),
                    }),
                });
            }
        }
        Ok(Response::new(pr::AllocatableResourcesResponse {
            devices,
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        request: Request<pr::GetPodResourcesRequest>,
    ) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
        let r = request.into_inner();
        let (ledger, claims) = self.ledger().await?;
        let pod = self
            .pods(&ledger, &claims)
            .into_iter()
            .find(|p| p.name == r.pod_name && p.namespace == r.pod_namespace)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "pod {}/{} has no resources",
                    r.pod_namespace, r.pod_name
                ))
            })?;
        Ok(Response::new(pr::GetPodResourcesResponse {
            pod_resources: Some(pod),
        }))
    }
}

/// A DRA claim a recorded pod's container uses, as pod-resources lists it.
struct ClaimUse {
    /// `namespace/name`.
    pod: String,
    container: String,
    resource: pr::DynamicResource,
}

/// The DRA claims of the pods this kubelet ran (`<dir>/pods/`); a record that cannot be read is
/// skipped (the pod is being started or removed).
fn claim_uses(dir: &Path) -> Vec<ClaimUse> {
    let pods = crate::pods::recorded_pods(dir).unwrap_or_default();
    let mut out = Vec::new();
    for pod in pods {
        let Ok(record) = crate::pods::read_record(dir, &pod) else {
            continue;
        };
        for claim in &record.dra_claims {
            let claim_resources = claim
                .devices
                .iter()
                .filter_map(|d| d.split_once('/'))
                .map(|(pool, device)| pr::ClaimResource {
                    // The CDI IDs of this device; erdma's end in `-<ibdev>`, and with one device
                    // every ID is its.
                    cdi_devices: claim
                        .cdi_devices
                        .iter()
                        .filter(|id| {
                            claim.devices.len() == 1 || id.ends_with(&format!("-{device}"))
                        })
                        .map(|name| pr::CdiDevice { name: name.clone() })
                        .collect(),
                    driver_name: claim.driver.clone(),
                    pool_name: pool.to_string(),
                    device_name: device.to_string(),
                })
                .collect();
            out.push(ClaimUse {
                pod: record.pod.clone(),
                container: record.container.clone(),
                resource: pr::DynamicResource {
                    claim_name: claim.name.clone(),
                    claim_namespace: claim.namespace.clone(),
                    claim_resources,
                },
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod the lab kubelet ran with a DRA claim is listed as the kubelet lists it: the claim
    /// under the container's `dynamic_resources`, one `ClaimResource` per device with its CDI IDs.
    #[test]
    fn prepared_claims_of_recorded_pods_are_listed_under_dynamic_resources() {
        let dir = tempfile::tempdir().unwrap();
        let record: crate::pods::PodRecord = serde_json::from_value(serde_json::json!({
            "pod": "lab/pod-a", "uid": "u1", "sandbox_id": "s1", "container": "c",
            "container_id": "c1", "ip": null, "netns": null, "allocation": null,
            "cdi_devices": [], "cdi_form": "field", "timings_ms": {},
            "dra_claims": [{
                "namespace": "lab", "name": "claim-a", "uid": "uid-a",
                "driver": "erdma.alibabacloud.com",
                "cdi_devices": ["erdma.alibabacloud.com/claim=uid-a-rxe0",
                                "erdma.alibabacloud.com/claim=uid-a-rxe1"],
                "devices": ["lab-node/rxe0", "lab-node/rxe1"]
            }]
        }))
        .unwrap();
        let path = crate::pods::record_path(dir.path(), "lab/pod-a").unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        crate::pods::write_record(&path, &record).unwrap();
        let uses = claim_uses(dir.path());
        assert_eq!(uses.len(), 1);
        assert_eq!(
            (uses[0].pod.as_str(), uses[0].container.as_str()),
            ("lab/pod-a", "c")
        );
        let r = &uses[0].resource;
        assert_eq!(
            (r.claim_namespace.as_str(), r.claim_name.as_str()),
            ("lab", "claim-a")
        );
        let devices: Vec<(&str, &str, Vec<&str>)> = r
            .claim_resources
            .iter()
            .map(|c| {
                (
                    c.pool_name.as_str(),
                    c.device_name.as_str(),
                    c.cdi_devices.iter().map(|d| d.name.as_str()).collect(),
                )
            })
            .collect();
        assert_eq!(
            devices,
            [
                (
                    "lab-node",
                    "rxe0",
                    vec!["erdma.alibabacloud.com/claim=uid-a-rxe0"]
                ),
                (
                    "lab-node",
                    "rxe1",
                    vec!["erdma.alibabacloud.com/claim=uid-a-rxe1"]
                ),
            ]
        );
        assert!(
            r.claim_resources
                .iter()
                .all(|c| c.driver_name == "erdma.alibabacloud.com")
        );
        // The pod is listed with its container even without a device-plugin allocation.
        let lister = Lister {
            shared: Arc::new(Fixed(dir.path().to_path_buf())),
        };
        let pods = lister.pods(&[], &uses);
        assert_eq!(pods.len(), 1);
        assert_eq!(
            (pods[0].namespace.as_str(), pods[0].name.as_str()),
            ("lab", "pod-a")
        );
        assert_eq!(
            pods[0].containers[0].dynamic_resources,
            std::slice::from_ref(r)
        );
        assert!(pods[0].containers[0].devices.is_empty());
    }

    struct Fixed(std::path::PathBuf);

    impl Source for Fixed {
        fn dir(&self) -> &Path {
            &self.0
        }
        fn resources(&self) -> BTreeMap<String, ResourceState> {
            BTreeMap::new()
        }
    }
}
