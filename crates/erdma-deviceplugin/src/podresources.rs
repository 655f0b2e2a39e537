//! Slots in use, from the kubelet's pod-resources API.

use erdma_kubelet::podresources::v1 as pr;
use erdma_kubelet::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use erdma_kubelet::uds::{self, ClientAuthority};
use erdma_model::SlotId;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

/// Counts, per device, the distinct slots of `resource` that pods hold now.
pub async fn used_slots(socket: &Path, resource: &str) -> Result<BTreeMap<String, u32>, String> {
    let ch = uds::connect(socket, ClientAuthority::Localhost, Duration::from_secs(1))
        .await
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(
        Duration::from_secs(2),
        PodResourcesListerClient::new(ch).list(pr::ListPodResourcesRequest {}),
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
