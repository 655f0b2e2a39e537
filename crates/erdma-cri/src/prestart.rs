//! Pod discovery for `PreStartContainer`: the kubelet passes only device IDs, so the owning pod
//! comes from who holds which device (the kubelet's pod-resources answer, as the process's one
//! owner of it publishes it: no call here) and its sandbox (network namespace, host-network flag,
//! annotations) from the container runtime.

use crate::{CriClient, CriError, SandboxInfo};
use erdma_kubelet::podresources::Holder;

/// The pod and container holding some of the devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceOwner {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Container name.
    pub container: String,
}

/// Finds the owner of any of `device_ids` among the holders of one resource (first match).
pub fn find_owner(holders: &[Holder], device_ids: &[String]) -> Option<DeviceOwner> {
    holders
        .iter()
        .find(|h| h.device_ids.iter().any(|id| device_ids.contains(id)))
        .map(|h| DeviceOwner {
            namespace: h.namespace.clone(),
            name: h.pod.clone(),
            container: h.container.clone(),
        })
}

/// The pod that holds `device_ids` of `resource` among `holders`, or [`CriError::NotFound`]
/// naming them.
pub fn owner_of(
    holders: &[Holder],
    resource: &str,
    device_ids: &[String],
) -> Result<DeviceOwner, CriError> {
    find_owner(holders, device_ids).ok_or_else(|| {
        CriError::NotFound(format!(
            "no pod holds {resource} devices {device_ids:?} according to the kubelet's pod-resources answer"
        ))
    })
}

/// Device IDs of a `PreStartContainer` → the pod (among `holders`) → its newest ready sandbox.
pub async fn resolve(
    holders: &[Holder],
    cri: &mut CriClient,
    resource: &str,
    device_ids: &[String],
) -> Result<(DeviceOwner, SandboxInfo), CriError> {
    let owner = owner_of(holders, resource, device_ids)?;
    let sandbox = cri.find_sandbox(&owner.namespace, &owner.name).await?;
    let info = cri.sandbox(&sandbox.id).await?;
    Ok((owner, info))
}

#[cfg(test)]
mod tests {
    use super::*;
    use erdma_kubelet::podresources::v1 as pr;
    use erdma_kubelet::podresources::{Held, holders_in};

    fn pod(ns: &str, name: &str, container: &str, res: &str, ids: &[&str]) -> pr::PodResources {
        pr::PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: vec![pr::ContainerResources {
                name: container.into(),
                devices: vec![pr::ContainerDevices {
                    resource_name: res.into(),
                    device_ids: ids.iter().map(|s| s.to_string()).collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn owner_matches_resource_and_any_id() {
        let answer = pr::ListPodResourcesResponse {
            pod_resources: vec![
                pod("default", "other", "c", "nvidia.com/gpu", &["erdma_0/1"]),
                pod(
                    "default",
                    "web-0",
                    "app",
                    "aliyun/erdma",
                    &["erdma_0/1", "erdma_0/2"],
                ),
            ],
        };
        let holders = holders_in(&answer, &Held::resource("aliyun/erdma"));
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            find_owner(&holders, &ids(&["erdma_0/2"])),
            Some(DeviceOwner {
                namespace: "default".into(),
                name: "web-0".into(),
                container: "app".into()
            })
        );
        assert_eq!(find_owner(&holders, &ids(&["erdma_1/0"])), None);
        assert_eq!(find_owner(&[], &ids(&["erdma_0/1"])), None);
        let e = owner_of(&holders, "aliyun/erdma", &ids(&["erdma_1/0"])).unwrap_err();
        assert!(matches!(e, CriError::NotFound(_)), "{e}");
        assert!(e.to_string().contains("erdma_1/0"), "{e}");
    }
}
