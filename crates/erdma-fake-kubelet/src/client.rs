//! Kubelet admission for one container: choose devices, ask the plugin, record the allocation.

use crate::error::{FakeKubeletError, Result};
use crate::state::{self, AllocationRecord, ResourceState};
use erdma_kubelet::deviceplugin::v1beta1 as api;
use erdma_kubelet::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use erdma_kubelet::uds::{self, ClientAuthority};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What to allocate.
#[derive(Debug, Clone)]
pub struct AllocateOptions {
    /// Resource name (`aliyun/erdma`).
    pub resource: String,
    /// How many device IDs.
    pub count: usize,
    /// `namespace/name` of the pod.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// `:authority` sent to the plugin.
    pub authority: ClientAuthority,
}

/// A mount in the JSON output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountOut {
    /// Path in the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Read-only.
    pub read_only: bool,
}

/// A device node in the JSON output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceOut {
    /// Path in the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// `rwm` subset.
    pub permissions: String,
}

/// The result of one allocation, printed by `erdma-fake-kubelet allocate -o json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationOutput {
    /// `namespace/name`.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Resource name.
    pub resource: String,
    /// Device IDs given to the container.
    pub device_ids: Vec<String>,
    /// IDs reused from an init container of the same pod (sent as `must_include_deviceIDs`).
    pub reused: Vec<String>,
    /// IDs offered to `GetPreferredAllocation` as `available_deviceIDs`, in the order sent (empty
    /// when it was not called).
    pub offered: Vec<String>,
    /// IDs the plugin preferred (empty when it does not offer preferred allocation).
    pub preferred: Vec<String>,
    /// Whether PreStartContainer was called.
    pub pre_start_called: bool,
    /// Environment variables.
    pub envs: BTreeMap<String, String>,
    /// Mounts.
    pub mounts: Vec<MountOut>,
    /// Device nodes.
    pub devices: Vec<DeviceOut>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// CDI device names.
    pub cdi_devices: Vec<String>,
}

fn rpc(call: &'static str, endpoint: &Path) -> impl FnOnce(tonic::Status) -> FakeKubeletError {
    let endpoint = endpoint.display().to_string();
    move |status| FakeKubeletError::Rpc {
        call,
        endpoint,
        status: Box::new(status),
    }
}

pub(crate) async fn take_lock(dir: &Path) -> Result<state::DirLock> {
    let d = dir.to_path_buf();
    tokio::task::spawn_blocking(move || state::lock(&d))
        .await
        .map_err(|e| FakeKubeletError::Refused(format!("lock task failed: {e}")))?
}

async fn ledger_io<T: Send + 'static>(
    dir: &Path,
    f: impl FnOnce(&Path) -> Result<T> + Send + 'static,
) -> Result<T> {
    let d: PathBuf = dir.to_path_buf();
    tokio::task::spawn_blocking(move || f(&d))
        .await
        .map_err(|e| FakeKubeletError::Refused(format!("file task failed: {e}")))?
}

/// One-shot allocation reading the registered resources from the state file of a running
/// fake kubelet in `dir`.
pub async fn allocate(dir: &Path, opts: &AllocateOptions) -> Result<AllocationOutput> {
    allocate_reusing(dir, opts, None).await
}

/// Like [`allocate`], for an app container that may reuse the devices of `init_container`, an
/// init container of the same pod, as the kubelet does: the init container's devices that no
/// other container of the pod holds are taken first, and the plugin's `GetPreferredAllocation`
/// gets them as `must_include_deviceIDs` (and among `available_deviceIDs`).
pub async fn allocate_reusing(
    dir: &Path,
    opts: &AllocateOptions,
    init_container: Option<&str>,
) -> Result<AllocationOutput> {
    let _lock = take_lock(dir).await?;
    let st = ledger_io(dir, state::read_state).await?;
    let reuse: Vec<String> = init_container.map(str::to_string).into_iter().collect();
    allocate_locked(dir, &st.resources, opts, &reuse, true, true).await
}

/// The kubelet's admission step alone: `Allocate` (recorded in the ledger and on pod-resources),
/// without `PreStartContainer`. The kubelet allocates a pod's devices when it admits the pod,
/// before `RunPodSandbox`; it calls [`pre_start`] later, just before creating the container.
pub async fn admit(dir: &Path, opts: &AllocateOptions) -> Result<AllocationOutput> {
    admit_reusing(dir, opts, &[]).await
}

/// [`admit`] for a container of a pod with init containers, as the kubelet's device manager
/// admits them in order (init containers first): the devices of the pod's containers named in
/// `reuse_from` (the init containers admitted before it, which have run by the time it runs)
/// that no other container of the pod holds are reused first.
pub async fn admit_reusing(
    dir: &Path,
    opts: &AllocateOptions,
    reuse_from: &[String],
) -> Result<AllocationOutput> {
    let _lock = take_lock(dir).await?;
    let st = ledger_io(dir, state::read_state).await?;
    allocate_locked(dir, &st.resources, opts, reuse_from, true, false).await
}

/// `PreStartContainer` for an allocation made by [`admit`], when the plugin registered
/// `pre_start_required` (sets `pre_start_called`). On a refusal the container's devices go back
/// to the pool, as the kubelet fails the container.
pub async fn pre_start(
    dir: &Path,
    allocation: &mut AllocationOutput,
    authority: ClientAuthority,
) -> Result<()> {
    let st = ledger_io(dir, state::read_state).await?;
    let resource = st.resources.get(&allocation.resource).ok_or_else(|| {
        FakeKubeletError::Refused(format!(
            "resource {} is no longer registered; is the device plugin running?",
            allocation.resource
        ))
    })?;
    if !resource.options.pre_start_required {
        return Ok(());
    }
    let path = dir.join(&resource.endpoint);
    let channel = uds::connect(&path, authority, Duration::from_secs(10)).await?;
    let r = DevicePluginClient::new(channel)
        .pre_start_container(api::PreStartContainerRequest {
            devices_ids: allocation.device_ids.clone(),
        })
        .await;
    if let Err(status) = r {
        if let Err(e) = release(dir, &allocation.pod).await {
            tracing::warn!(pod = %allocation.pod, "cannot remove the failed container's allocation: {e}");
        }
        return Err(rpc("PreStartContainer", &path)(status));
    }
    allocation.pre_start_called = true;
    Ok(())
}

/// The kubelet's choice of devices for one container (`devicesToAllocate` in the kubelet's
/// device manager, without a topology-manager hint): reusable devices first (those of the pod's
/// containers in `reuse_from` that no other container of the pod holds, as the device manager's
/// `devicesToReuse` pool: the devices of the init containers admitted so far, less those an app
/// container took); then, when the plugin
/// offers it, `GetPreferredAllocation` over the free devices plus the reused ones (the reused
/// ones as `must_include`), whose answer is used as far as it names free devices; the rest comes
/// from the free devices. Where the kubelet walks a Go set (unspecified order), this takes the
/// advertised order.
pub(crate) async fn allocate_locked(
    dir: &Path,
    resources: &BTreeMap<String, ResourceState>,
    opts: &AllocateOptions,
    reuse_from: &[String],
    update_state_file: bool,
    with_pre_start: bool,
) -> Result<AllocationOutput> {
    let resource = resources.get(&opts.resource).ok_or_else(|| {
        FakeKubeletError::Refused(format!(
            "resource {} is not registered (registered: {:?}); is the device plugin running?",
            opts.resource,
            resources.keys().collect::<Vec<_>>()
        ))
    })?;
    let mut ledger = ledger_io(dir, state::read_ledger).await?;
    let of_resource = || ledger.iter().filter(|a| a.resource == opts.resource);
    let taken: BTreeSet<&str> = of_resource()
        .flat_map(|a| a.device_ids.iter().map(String::as_str))
        .collect();
    // Devices of the reused containers that no other container of the pod holds yet.
    let held: BTreeSet<&str> = of_resource()
        .filter(|a| a.pod == opts.pod && !reuse_from.contains(&a.container))
        .flat_map(|a| a.device_ids.iter().map(String::as_str))
        .collect();
    let mut reusable: Vec<String> = Vec::new();
    for id in of_resource()
        .filter(|a| a.pod == opts.pod && reuse_from.contains(&a.container))
        .flat_map(|a| a.device_ids.iter())
    {
        if !held.contains(id.as_str()) && !reusable.contains(id) {
            reusable.push(id.clone());
        }
    }
    let mut chosen: Vec<String> = reusable.iter().take(opts.count).cloned().collect();
    let needed = opts.count - chosen.len();
    let healthy: Vec<&str> = resource.healthy_ids().collect();
    let free: Vec<String> = healthy
        .iter()
        .filter(|id| !taken.contains(**id))
        .map(|s| s.to_string())
        .collect();
    if free.len() < needed {
        return Err(FakeKubeletError::Refused(format!(
            "not enough {}: requested {}, {} free ({} advertised, {} healthy, {} allocated{})",
            opts.resource,
            opts.count,
            free.len(),
            resource.devices.len(),
            healthy.len(),
            taken.len(),
            if chosen.is_empty() {
                String::new()
            } else {
                format!(", {} reused from init containers", chosen.len())
            }
        )));
    }
    let path = dir.join(&resource.endpoint);
    let channel = uds::connect(&path, opts.authority.clone(), Duration::from_secs(10)).await?;
    let mut client = DevicePluginClient::new(channel);

    let mut offered = Vec::new();
    let mut preferred = Vec::new();
    if needed > 0 && resource.options.get_preferred_allocation_available {
        // available ∪ reused, in advertised order
        offered = resource
            .devices
            .iter()
            .map(|d| d.id.clone())
            .filter(|id| free.contains(id) || chosen.contains(id))
            .collect();
        let resp = client
            .get_preferred_allocation(api::PreferredAllocationRequest {
                container_requests: vec![api::ContainerPreferredAllocationRequest {
                    available_device_i_ds: offered.clone(),
                    must_include_device_i_ds: chosen.clone(),
                    allocation_size: i32::try_from(opts.count).unwrap_or(i32::MAX),
                }],
            })
            .await
            .map_err(rpc("GetPreferredAllocation", &path))?
            .into_inner();
        preferred = resp
            .container_responses
            .into_iter()
            .next()
            .map(|r| r.device_i_ds)
            .unwrap_or_default();
        if preferred.len() != opts.count || preferred.iter().any(|id| !offered.contains(id)) {
            tracing::warn!(
                ?preferred,
                size = opts.count,
                "plugin's preferred allocation has the wrong size or names devices not offered; \
                 using what it names among the free devices, then the first free ones"
            );
        }
    }
    // Like the kubelet: the preferred devices that are free first, then the other free ones.
    for id in preferred.iter().chain(free.iter()) {
        if chosen.len() == opts.count {
            break;
        }
        if free.contains(id) && !chosen.contains(id) {
            chosen.push(id.clone());
        }
    }
    let resp = client
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: chosen.clone(),
            }],
        })
        .await
        .map_err(rpc("Allocate", &path))?
        .into_inner();
    let c = resp.container_responses.into_iter().next().ok_or_else(|| {
        FakeKubeletError::Refused(format!(
            "plugin at {} answered Allocate with no container response",
            path.display()
        ))
    })?;
    // Like the kubelet: the devices are recorded for the container when Allocate succeeds, before
    // PreStartContainer, so a pre-start hook can find its pod through pod-resources.
    ledger.push(AllocationRecord {
        pod: opts.pod.clone(),
        container: opts.container.clone(),
        resource: opts.resource.clone(),
        device_ids: chosen.clone(),
    });
    save_ledger(dir, ledger.clone(), update_state_file).await?;
    let mut pre_start_called = false;
    if with_pre_start && resource.options.pre_start_required {
        let pre_start = client
            .pre_start_container(api::PreStartContainerRequest {
                devices_ids: chosen.clone(),
            })
            .await;
        if let Err(status) = pre_start {
            // The kubelet fails the container, and its devices go back to the pool.
            ledger.pop();
            if let Err(e) = save_ledger(dir, ledger, update_state_file).await {
                tracing::warn!(pod = %opts.pod, "cannot remove the failed container's allocation: {e}");
            }
            return Err(rpc("PreStartContainer", &path)(status));
        }
        pre_start_called = true;
    }
    Ok(AllocationOutput {
        pod: opts.pod.clone(),
        container: opts.container.clone(),
        resource: opts.resource.clone(),
        device_ids: chosen,
        reused: reusable.into_iter().take(opts.count).collect(),
        offered,
        preferred,
        pre_start_called,
        envs: c.envs,
        mounts: c
            .mounts
            .into_iter()
            .map(|m| MountOut {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        devices: c
            .devices
            .into_iter()
            .map(|d| DeviceOut {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
        annotations: c.annotations,
        cdi_devices: c.cdi_devices.into_iter().map(|d| d.name).collect(),
    })
}

/// Writes the ledger (and, for one-shot commands, the state file's copy of it).
async fn save_ledger(
    dir: &Path,
    ledger: Vec<AllocationRecord>,
    update_state_file: bool,
) -> Result<()> {
    ledger_io(dir, move |d| {
        state::write_ledger(d, &ledger)?;
        if update_state_file {
            let mut st = state::read_state(d)?;
            st.allocations = ledger;
            state::write_state(d, &st)?;
        }
        Ok(())
    })
    .await
}

/// Removes every allocation of `pod` (`namespace/name`) from the ledger and the state file;
/// returns how many container allocations were removed.
pub async fn release(dir: &Path, pod: &str) -> Result<usize> {
    let _lock = take_lock(dir).await?;
    let pod = pod.to_string();
    ledger_io(dir, move |d| {
        let mut ledger = state::read_ledger(d)?;
        let before = ledger.len();
        ledger.retain(|a| a.pod != pod);
        state::write_ledger(d, &ledger)?;
        let mut st = state::read_state(d)?;
        st.allocations = ledger.clone();
        state::write_state(d, &st)?;
        Ok(before - ledger.len())
    })
    .await
}
