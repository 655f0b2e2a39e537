//! Slots in use and the devices the kubelet holds, from the kubelet's pod-resources API.

use erdma_kubelet::podresources::v1 as pr;
use erdma_kubelet::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use erdma_kubelet::uds::{self, ClientAuthority};
use erdma_model::SlotId;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

/// Counts, per device, the distinct slots of `resource` that pods hold now.
pub async fn used_slots(socket: &Path, resource: &str) -> Result<BTreeMap<String, u32>, String> {
    let mut client = client(socket).await?;
    let resp = tokio::time::timeout(
        Duration::from_secs(2),
        client.list(pr::ListPodResourcesRequest {}),
    )
    .await
    .map_err(|_| format!("pod-resources List on {} timed out", socket.display()))?
    .map_err(|e| format!("pod-resources List on {}: {e}", socket.display()))?
    .into_inner();
    let mut slots = BTreeSet::new();
    for pod in resp.pod_resources {
        for c in pod.containers {
            for d in c
                .devices
                .into_iter()
                .filter(|d| d.resource_name == resource)
            {
                slots.extend(d.device_ids.iter().filter_map(|id| SlotId::parse(id).ok()));
            }
        }
    }
    let mut out = BTreeMap::new();
    for s in slots {
        *out.entry(s.device).or_default() += 1;
    }
    Ok(out)
}

/// The device IDs of `resource` the kubelet holds (`GetAllocatableResources`): the device list of
/// whichever plugin fed the kubelet last.
pub async fn allocatable_ids(socket: &Path, resource: &str) -> Result<Vec<String>, String> {
    let mut client = client(socket).await?;
    let resp = tokio::time::timeout(
        Duration::from_secs(2),
        client.get_allocatable_resources(pr::AllocatableResourcesRequest {}),
    )
    .await
    .map_err(|_| {
        format!(
            "pod-resources GetAllocatableResources on {} timed out",
            socket.display()
        )
    })?
    .map_err(|e| {
        format!(
            "pod-resources GetAllocatableResources on {}: {e}",
            socket.display()
        )
    })?
    .into_inner();
    Ok(resp
        .devices
        .into_iter()
        .filter(|d| d.resource_name == resource)
        .flat_map(|d| d.device_ids)
        .collect())
}

async fn client(
    socket: &Path,
) -> Result<PodResourcesListerClient<tonic::transport::Channel>, String> {
    let ch = uds::connect(socket, ClientAuthority::Localhost, Duration::from_secs(1))
        .await
        .map_err(|e| format!("pod-resources socket {}: {e}", socket.display()))?;
    Ok(PodResourcesListerClient::new(ch))
}

/// The device IDs of `resource` that pod `namespace/name` holds, over all its containers.
pub async fn pod_device_ids(
    socket: &Path,
    resource: &str,
    namespace: &str,
    name: &str,
) -> Result<Vec<String>, String> {
    let mut client = client(socket).await?;
    let resp = tokio::time::timeout(
        Duration::from_secs(2),
        client.list(pr::ListPodResourcesRequest {}),
    )
    .await
    .map_err(|_| format!("pod-resources List on {} timed out", socket.display()))?
    .map_err(|e| format!("pod-resources List on {}: {e}", socket.display()))?
    .into_inner();
    Ok(resp
        .pod_resources
        .into_iter()
        .filter(|p| p.namespace == namespace && p.name == name)
        .flat_map(|p| p.containers)
        .flat_map(|c| c.devices)
        .filter(|d| d.resource_name == resource)
        .flat_map(|d| d.device_ids)
        .collect())
}
