//! The kubelet's DRA manager for one container of a pod: which claims the container uses (read
//! from the Pod object in the API server, as the kubelet reads it), `NodePrepareResources` for
//! them through each claim's driver, the CDI device IDs the container gets, and
//! `NodeUnprepareResources` when the pod goes.
//!
//! A container's claims are its `resources.claims` entries, resolved through the pod's
//! `spec.resourceClaims` (a `resourceClaimName`, or for a template the name in
//! `status.resourceClaimStatuses`), plus the requests that `status.extendedResourceClaimStatus`
//! maps to it (the special claim the scheduler made for an extended resource such as
//! `aliyun/erdma`, KEP-5004). A reference with a `request` (and every extended-resource
//! mapping) gives the container only the devices of that request; without one, all of the claim's.

use crate::dra::{self, DraDriverClient};
use crate::error::{FakeKubeletError, Result};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// API access and the kubelet's plugin registry.
#[derive(Clone)]
pub struct DraAccess {
    /// Client of the API server.
    pub client: kube::Client,
    /// The kubelet's `plugins_registry` directory.
    pub registry: PathBuf,
    /// The kubelet release that registers the drivers (`--kubelet-version`).
    pub kubelet_version: dra::KubeletVersion,
}

impl std::fmt::Debug for DraAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraAccess")
            .field("registry", &self.registry)
            .field("kubelet_version", &self.kubelet_version)
            .finish_non_exhaustive()
    }
}

/// A claim a container uses, and which of its requests (`None`: all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimUse {
    /// Claim name (in the pod's namespace).
    pub claim: String,
    /// Only the devices of this request.
    pub request: Option<String>,
    /// Where the reference came from: `resources.claims` or `extendedResourceClaimStatus`.
    pub source: &'static str,
}

/// A claim the lab kubelet prepared for a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedPodClaim {
    /// Namespace.
    pub namespace: String,
    /// Claim name.
    pub name: String,
    /// Claim UID.
    pub uid: String,
    /// Driver that prepared it.
    pub driver: String,
    /// The CDI device IDs of the devices the container got from it.
    pub cdi_devices: Vec<String>,
    /// The devices (`pool/device`) the driver answered for the container.
    pub devices: Vec<String>,
}

/// The claims container `container` of `pod` uses.
pub fn container_claims(pod: &Pod, container: &str) -> Result<Vec<ClaimUse>> {
    let who = format!(
        "pod {}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    );
    let spec = pod
        .spec
        .as_ref()
        .ok_or_else(|| FakeKubeletError::Refused(format!("{who} has no spec")))?;
    let c = spec
        .containers
        .iter()
        .find(|c| c.name == container)
        .ok_or_else(|| FakeKubeletError::Refused(format!("{who} has no container {container}")))?;
    let statuses: BTreeMap<&str, Option<&str>> = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.as_str(), s.resource_claim_name.as_deref()))
        .collect();
    let mut out = Vec::new();
    for r in c
        .resources
        .as_ref()
        .and_then(|r| r.claims.as_ref())
        .into_iter()
        .flatten()
    {
        let entry = spec
            .resource_claims
            .iter()
            .flatten()
            .find(|p| p.name == r.name)
            .ok_or_else(|| {
                FakeKubeletError::Refused(format!(
                    "{who}: container {container} uses claim {:?}, which spec.resourceClaims does not list",
                    r.name
                ))
            })?;
        let name = match (&entry.resource_claim_name, &entry.resource_claim_template_name) {
            (Some(n), _) => n.clone(),
            (None, Some(_)) => statuses
                .get(r.name.as_str())
                .copied()
                .flatten()
                .ok_or_else(|| {
                    FakeKubeletError::Refused(format!(
                        "{who}: the claim of template entry {:?} is not generated yet (status.resourceClaimStatuses)",
                        r.name
                    ))
                })?
                .to_string(),
            (None, None) => {
                return Err(FakeKubeletError::Refused(format!(
                    "{who}: spec.resourceClaims entry {:?} names neither a claim nor a template",
                    r.name
                )));
            }
        };
        out.push(ClaimUse {
            claim: name,
            request: r.request.clone().filter(|q| !q.is_empty()),
            source: "resources.claims",
        });
    }
    if let Some(ext) = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
    {
        for m in ext
            .request_mappings
            .iter()
            .filter(|m| m.container_name == container)
        {
            out.push(ClaimUse {
                claim: ext.resource_claim_name.clone(),
                request: Some(m.request_name.clone()),
                source: "extendedResourceClaimStatus",
            });
        }
    }
    Ok(out)
}

fn drivers_of(claim: &ResourceClaim) -> Vec<String> {
    let mut d: Vec<String> = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .map(|r| r.driver.clone())
        .collect();
    d.sort();
    d.dedup();
    d
}

/// Prepares the claims of `container` of pod `namespace/name` (read from the API server) and
/// returns them with the CDI device IDs the container gets. A claim that is not allocated, or
/// that a driver refuses, fails the call; claims prepared before the failure are unprepared
/// again.
pub async fn prepare_container(
    access: &DraAccess,
    namespace: &str,
    name: &str,
    container: &str,
) -> Result<Vec<PreparedPodClaim>> {
    let pod = kube::Api::<Pod>::namespaced(access.client.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| FakeKubeletError::Refused(format!("read pod {namespace}/{name}: {e}")))?;
    let uses = container_claims(&pod, container)?;
    if uses.is_empty() {
        return Err(FakeKubeletError::Refused(format!(
            "pod {namespace}/{name} container {container} uses no ResourceClaim (resources.claims or extendedResourceClaimStatus)"
        )));
    }
    let mut done: Vec<PreparedPodClaim> = Vec::new();
    let mut drivers: BTreeMap<String, DraDriverClient> = BTreeMap::new();
    for u in &uses {
        match prepare_one(access, namespace, u, &mut drivers).await {
            Ok(p) => done.push(p),
            Err(e) => {
                if let Err(u) = unprepare(access, &done).await {
                    tracing::warn!("unpreparing after a failed prepare: {u}");
                }
                return Err(e);
            }
        }
    }
    Ok(done)
}

async fn driver<'a>(
    access: &DraAccess,
    drivers: &'a mut BTreeMap<String, DraDriverClient>,
    name: &str,
) -> Result<&'a DraDriverClient> {
    if !drivers.contains_key(name) {
        let c = dra::register_as(&access.registry, name, access.kubelet_version).await?;
        drivers.insert(name.to_string(), c);
    }
    drivers
        .get(name)
        .ok_or_else(|| FakeKubeletError::Refused(format!("DRA driver {name} not registered")))
}

async fn prepare_one(
    access: &DraAccess,
    namespace: &str,
    u: &ClaimUse,
    drivers: &mut BTreeMap<String, DraDriverClient>,
) -> Result<PreparedPodClaim> {
    let claim = kube::Api::<ResourceClaim>::namespaced(access.client.clone(), namespace)
        .get(&u.claim)
        .await
        .map_err(|e| {
            FakeKubeletError::Refused(format!("read ResourceClaim {namespace}/{}: {e}", u.claim))
        })?;
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let names = drivers_of(&claim);
    let [driver_name] = names.as_slice() else {
        return Err(FakeKubeletError::Refused(format!(
            "ResourceClaim {namespace}/{} is allocated to {} drivers ({names:?}); the lab kubelet prepares claims of exactly one",
            u.claim,
            names.len()
        )));
    };
    let d = driver(access, drivers, driver_name).await?;
    let resp = d
        .prepare(vec![dra::claim(namespace, &u.claim, &uid)])
        .await?;
    let r = resp.claims.get(&uid).ok_or_else(|| {
        FakeKubeletError::Refused(format!("NodePrepareResources answered without claim {uid}"))
    })?;
    if !r.error.is_empty() {
        return Err(FakeKubeletError::Refused(format!(
            "NodePrepareResources for ResourceClaim {namespace}/{} (uid {uid}) failed: {}",
            u.claim, r.error
        )));
    }
    let mine: Vec<_> = r
        .devices
        .iter()
        .filter(|dev| {
            u.request
                .as_ref()
                .is_none_or(|q| dev.request_names.iter().any(|n| n == q))
        })
        .collect();
    Ok(PreparedPodClaim {
        namespace: namespace.into(),
        name: u.claim.clone(),
        uid,
        driver: driver_name.clone(),
        cdi_devices: mine.iter().flat_map(|d| d.cdi_device_ids.clone()).collect(),
        devices: mine
            .iter()
            .map(|d| format!("{}/{}", d.pool_name, d.device_name))
            .collect(),
    })
}

/// `NodeUnprepareResources` for each claim, through its driver (registered again from
/// `access.registry`); an error names the claim and the driver's answer.
pub async fn unprepare(access: &DraAccess, claims: &[PreparedPodClaim]) -> Result<()> {
    unprepare_at(&access.registry, claims).await
}

/// [`unprepare`] with only the plugin registry (the pod record keeps it).
pub async fn unprepare_at(registry: &Path, claims: &[PreparedPodClaim]) -> Result<()> {
    let mut by_driver: BTreeMap<&str, Vec<&PreparedPodClaim>> = BTreeMap::new();
    for c in claims {
        by_driver.entry(c.driver.as_str()).or_default().push(c);
    }
    for (name, list) in by_driver {
        let d = dra::register(registry, name).await?;
        let resp = d
            .unprepare(
                list.iter()
                    .map(|c| dra::claim(&c.namespace, &c.name, &c.uid))
                    .collect(),
            )
            .await?;
        for c in list {
            if let Some(r) = resp.claims.get(&c.uid)
                && !r.error.is_empty()
            {
                return Err(FakeKubeletError::Refused(format!(
                    "NodeUnprepareResources for ResourceClaim {}/{} failed: {}",
                    c.namespace, c.name, r.error
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, ContainerExtendedResourceRequest, PodExtendedResourceClaimStatus,
        PodResourceClaim, PodResourceClaimStatus, PodSpec, PodStatus,
        ResourceClaim as ContainerClaim, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod() -> Pod {
        let refs = |names: &[(&str, Option<&str>)]| ResourceRequirements {
            claims: Some(
                names
                    .iter()
                    .map(|(n, r)| ContainerClaim {
                        name: n.to_string(),
                        request: r.map(str::to_string),
                    })
                    .collect(),
            ),
            ..Default::default()
        };
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("lab".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![
                    Container {
                        name: "c".into(),
                        resources: Some(refs(&[("direct", None), ("tmpl", Some("rdma"))])),
                        ..Default::default()
                    },
                    Container {
                        name: "other".into(),
                        ..Default::default()
                    },
                ],
                resource_claims: Some(vec![
                    PodResourceClaim {
                        name: "direct".into(),
                        resource_claim_name: Some("claim-a".into()),
                        ..Default::default()
                    },
                    PodResourceClaim {
                        name: "tmpl".into(),
                        resource_claim_template_name: Some("t".into()),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            status: Some(PodStatus {
                resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                    name: "tmpl".into(),
                    resource_claim_name: Some("p-tmpl-x1".into()),
                }]),
                extended_resource_claim_status: Some(PodExtendedResourceClaimStatus {
                    request_mappings: vec![ContainerExtendedResourceRequest {
                        container_name: "other".into(),
                        request_name: "container-1-request-0".into(),
                        resource_name: "aliyun/erdma".into(),
                    }],
                    resource_claim_name: "p-extended-resources-abcde".into(),
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_containers_claims_come_from_its_references_and_the_extended_mapping() {
        let p = pod();
        assert_eq!(
            container_claims(&p, "c").unwrap(),
            [
                ClaimUse {
                    claim: "claim-a".into(),
                    request: None,
                    source: "resources.claims"
                },
                ClaimUse {
                    claim: "p-tmpl-x1".into(),
                    request: Some("rdma".into()),
                    source: "resources.claims"
                },
            ]
        );
        assert_eq!(
            container_claims(&p, "other").unwrap(),
            [ClaimUse {
                claim: "p-extended-resources-abcde".into(),
                request: Some("container-1-request-0".into()),
                source: "extendedResourceClaimStatus"
            }]
        );
        assert!(container_claims(&p, "nope").is_err());
    }

    #[test]
    fn a_reference_to_an_unlisted_claim_is_refused() {
        let mut p = pod();
        if let Some(s) = p.spec.as_mut() {
            s.resource_claims = None;
        }
        let e = container_claims(&p, "c").unwrap_err().to_string();
        assert!(e.contains("which spec.resourceClaims does not list"), "{e}");
    }
}
