//! Pod discovery for `PreStartContainer`: the kubelet passes only device IDs, so the owning pod
//! comes from the kubelet's pod-resources API and its sandbox (network namespace, host-network
//! flag, annotations) from the container runtime.

use crate::{CriClient, CriError, SandboxInfo};
use erdma_kubelet::podresources::v1 as pr;
use erdma_kubelet::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use erdma_kubelet::uds::{self, ClientAuthority};
use std::path::Path;
use std::time::Duration;

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

/// Finds the owner of any of `device_ids` of `resource` in a pod-resources `List` answer.
pub fn find_owner(
    pods: &[pr::PodResources],
    resource: &str,
    device_ids: &[String],
) -> Option<DeviceOwner> {
    pods.iter().find_map(|pod| {
        pod.containers.iter().find_map(|c| {
            c.devices
                .iter()
                .any(|d| {
                    d.resource_name == resource
                        && d.device_ids.iter().any(|id| device_ids.contains(id))
                })
                .then(|| DeviceOwner {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    container: c.name.clone(),
                })
        })
    })
}

/// Asks the kubelet's pod-resources API (`socket`) which pod holds `device_ids`.
pub async fn owner_of(
    socket: &Path,
    resource: &str,
    device_ids: &[String],
) -> Result<DeviceOwner, CriError> {
    let ch = uds::connect(socket, ClientAuthority::Localhost, Duration::from_secs(2))
        .await
        .map_err(|e| CriError::Connect {
            what: "kubelet pod-resources",
            path: socket.to_path_buf(),
            detail: e.to_string(),
        })?;
    let mut client = PodResourcesListerClient::new(ch);
    let call = client.list(pr::ListPodResourcesRequest {});
    let pods = tokio::time::timeout(crate::CALL_TIMEOUT, call)
        .await
        .map_err(|_| CriError::Call {
            call: "pod-resources List",
            path: socket.to_path_buf(),
            detail: "timed out".into(),
        })?
        .map_err(|s| CriError::Call {
            call: "pod-resources List",
            path: socket.to_path_buf(),
            detail: s.to_string(),
        })?
        .into_inner()
        .pod_resources;
    find_owner(&pods, resource, device_ids).ok_or_else(|| {
        CriError::NotFound(format!(
            "no pod holds {resource} devices {device_ids:?} according to the kubelet pod-resources API at {}",
            socket.display()
        ))
    })
}

/// Device IDs of a `PreStartContainer` → the pod's sandbox.
pub async fn resolve(
    podresources_socket: &Path,
    cri: &mut CriClient,
    resource: &str,
    device_ids: &[String],
) -> Result<(DeviceOwner, SandboxInfo), CriError> {
    let owner = owner_of(podresources_socket, resource, device_ids).await?;
    let sandbox = cri.find_sandbox(&owner.namespace, &owner.name).await?;
    let info = cri.sandbox(&sandbox.id).await?;
    Ok((owner, info))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let pods = vec![
            pod("default", "other", "c", "nvidia.com/gpu", &["erdma_0/1"]),
            pod(
                "default",
                "web-0",
                "app",
                "aliyun/erdma",
                &["erdma_0/1", "erdma_0/2"],
            ),
        ];
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            find_owner(&pods, "aliyun/erdma", &ids(&["erdma_0/2"])),
            Some(DeviceOwner {
                namespace: "default".into(),
                name: "web-0".into(),
                container: "app".into()
            })
        );
        assert_eq!(
            find_owner(&pods, "aliyun/erdma", &ids(&["erdma_1/0"])),
            None
        );
        assert_eq!(find_owner(&[], "aliyun/erdma", &ids(&["erdma_0/1"])), None);
    }
}
