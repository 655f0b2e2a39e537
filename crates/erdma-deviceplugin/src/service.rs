//! The `v1beta1.DevicePlugin` service.

use crate::config::PluginConfig;
use crate::devices::{ServedDevice, ServedSet};
use crate::metrics::Metrics;
use erdma_kubelet::deviceplugin::v1beta1 as api;
use erdma_kubelet::podresources::{Holders, SETTLE_WITHIN};
use erdma_model::allocation::{DeviceLoad, PreferenceRequest, preferred_allocation};
use erdma_model::container::container_env;
use erdma_model::{CharDevice, SlotId};
use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// Most container requests / IDs accepted in one call (a kubelet sends one container and a few
/// IDs; anything far larger is malformed).
const MAX_CONTAINERS: usize = 256;
const MAX_IDS: usize = 100_000;

/// What PreStartContainer does when the pre-start mode is configured: the agent's SMC-R hook
/// (`erdma-agent`'s `SmcrHook`), or [`NoopPreStart`], which succeeds without doing anything.
#[tonic::async_trait]
pub trait PreStartHook: Send + Sync + 'static {
    /// Called with the slot IDs of a container about to start.
    async fn pre_start(&self, device_ids: &[String]) -> Result<(), Status>;
}

/// The default hook: logs and succeeds.
#[derive(Debug, Default)]
pub struct NoopPreStart;

#[tonic::async_trait]
impl PreStartHook for NoopPreStart {
    async fn pre_start(&self, device_ids: &[String]) -> Result<(), Status> {
        tracing::debug!(?device_ids, "PreStartContainer: nothing to do");
        Ok(())
    }
}

/// Shared plugin state: configuration, the current served set, metrics.
pub struct PluginState {
    /// Configuration.
    pub cfg: PluginConfig,
    /// The served set, rebuilt on every inventory change.
    pub served: watch::Receiver<Arc<ServedSet>>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// PreStartContainer hook.
    pub pre_start: Arc<dyn PreStartHook>,
    /// Wakes the runner to register again (see [`crate::runner::Reclaimer`]).
    pub reclaim: Arc<tokio::sync::Notify>,
    /// Called after each successful Allocate (the agent refreshes who holds which device).
    pub on_allocate: Option<AllocateObserver>,
    /// Who holds which device (the process's one owner of the pod-resources answer), when the
    /// plugin has one: GetPreferredAllocation counts the slots in use from its snapshot.
    pub holders: Option<Arc<Holders>>,
}

/// A callback after a successful Allocate; it must not block.
pub type AllocateObserver = Arc<dyn Fn() + Send + Sync>;

/// One server instance of the DevicePlugin service. `stop` ends its ListAndWatch streams so a
/// graceful server shutdown completes.
#[derive(Clone)]
pub struct DevicePluginService {
    state: Arc<PluginState>,
    stop: CancellationToken,
}

impl DevicePluginService {
    /// A service instance whose streams end when `stop` fires.
    pub fn new(state: Arc<PluginState>, stop: CancellationToken) -> Self {
        DevicePluginService { state, stop }
    }
}

fn bad(msg: String) -> Status {
    Status::invalid_argument(msg)
}

/// Validates one container's IDs against the served set; the error names the ID and the fix.
/// A served device is valid healthy or not (see [`unhealthy_granted`]).
pub fn validate_ids<'a>(
    cfg: &PluginConfig,
    set: &'a ServedSet,
    ids: &[String],
) -> Result<Vec<(SlotId, &'a ServedDevice)>, Status> {
    if ids.is_empty() {
        return Err(bad(format!(
            "container request has no device IDs; ask for at least one {}",
            cfg.resource_name
        )));
    }
    if ids.len() > MAX_IDS {
        return Err(bad(format!(
            "container request has {} device IDs (at most {MAX_IDS})",
            ids.len()
        )));
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let slot =
            SlotId::parse(id).map_err(|e| bad(format!("{} request: {e}", cfg.resource_name)))?;
        if !seen.insert(slot.clone()) {
            return Err(bad(format!(
                "device ID {id:?} appears twice in one container request"
            )));
        }
        let dev = set.slot_device(&slot).ok_or_else(|| {
            bad(format!(
                "device ID {id:?} is not advertised by {} on this node (devices: {:?}, slots 0..{})",
                cfg.resource_name,
                set.devices.keys().collect::<Vec<_>>(),
                set.slots_per_device
            ))
        })?;
        // An unhealthy device is granted: the kubelet asks only for IDs that were healthy at its
        // last ListAndWatch update, so this one turned since (a link flap) and the kubelet has
        // the change on its way; an error here would fail the pod's admission for good.
        out.push((slot, dev));
    }
    Ok(out)
}

/// The devices among `slots` that are unhealthy now, each once, with their reasons: granted all
/// the same (the kubelet offered them healthy), logged and counted by Allocate.
pub fn unhealthy_granted(slots: &[(SlotId, &ServedDevice)]) -> BTreeMap<String, String> {
    slots
        .iter()
        .filter(|(_, d)| !d.healthy())
        .map(|(_, d)| (d.name().to_string(), d.device.health.reasons().join("; ")))
        .collect()
}

/// Builds the response for one container from its validated slots.
pub fn container_response(
    cfg: &PluginConfig,
    set: &ServedSet,
    slots: &[(SlotId, &ServedDevice)],
) -> api::ContainerAllocateResponse {
    let devices: Vec<&ServedDevice> = if cfg.allocate_all_devices {
        set.healthy().collect()
    } else {
        let names: BTreeSet<&str> = slots.iter().map(|(s, _)| s.device.as_str()).collect();
        names
            .into_iter()
            .filter_map(|n| set.devices.get(n))
            .collect()
    };
    let envs = container_env(devices.iter().map(|d| &d.device), None)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let mut resp = api::ContainerAllocateResponse {
        envs,
        ..Default::default()
    };
    if let Some(cdi_cfg) = &cfg.cdi {
        resp.cdi_devices = devices
            .iter()
            .map(|d| api::CdiDevice {
                name: erdma_model::container::cdi_device(&cdi_cfg.kind, d.name()),
            })
            .collect();
        return resp;
    }
    let spec = |c: &CharDevice| api::DeviceSpec {
        container_path: c.path.clone(),
        host_path: c.path.clone(),
        permissions: "rw".into(),
    };
    let mut seen = BTreeSet::new();
    for d in &devices {
        for c in d.char_devices() {
            if seen.insert(c.path.clone()) {
                resp.devices.push(spec(c));
            }
        }
    }
    // rdma_cm serves connection setup in every mode (iWARP needs it; RoCE rdma_cm apps too).
    if let Some(cm) = &set.rdma_cm
        && !devices.is_empty()
    {
        resp.devices.push(spec(cm));
    }
    resp
}

type ListAndWatchStream =
    Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl api::device_plugin_server::DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::DevicePluginOptions {
            pre_start_required: self.state.cfg.pre_start_required,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = ListAndWatchStream;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let rx = self.state.served.clone();
        let stop = self.stop.clone();
        let metrics = self.state.metrics.clone();
        tracing::info!("kubelet opened ListAndWatch");
        // State: the receiver, what was last advertised (None before the first message), the
        // stop token. Only a change of what the kubelet sees produces a message.
        let stream = futures::stream::unfold(
            (rx, None::<Vec<crate::devices::Advertised>>, stop, metrics),
            |(mut rx, last, stop, metrics)| async move {
                // Asked for the next message: the transport took the last one into its send
                // buffer (the kubelet may not have read it yet).
                if last.as_ref().is_some_and(|l| !l.is_empty()) {
                    metrics.observe_devices_handed_over();
                }
                loop {
                    let current = rx.borrow_and_update().clone();
                    if last.as_ref() != Some(&current.advertised) {
                        metrics.list_and_watch_updates.inc();
                        let msg = current.message();
                        tracing::debug!(devices = msg.devices.len(), "ListAndWatch message built");
                        return Some((
                            Ok(msg),
                            (rx, Some(current.advertised.clone()), stop, metrics),
                        ));
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return None,
                        r = rx.changed() => if r.is_err() { return None },
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let req = request.into_inner();
        let set = self.state.served.borrow().clone();
        let cfg = &self.state.cfg;
        if req.container_requests.len() > MAX_CONTAINERS {
            return Err(bad(format!(
                "{} container requests in one call (at most {MAX_CONTAINERS})",
                req.container_requests.len()
            )));
        }
        // The published snapshot, once the refresh after the last Allocate is in (bounded): the
        // pods admitted just before this one count. No pod-resources call here.
        let pod_used = match &self.state.holders {
            Some(h) => {
                let s = h.settled(SETTLE_WITHIN).await;
                if let Some(e) = &s.error {
                    tracing::warn!(
                        "pod-resources unavailable ({e}), counting from the kubelet's offer and the last answer"
                    );
                }
                crate::podresources::used_slots(&s.holders)
            }
            None => BTreeMap::new(),
        };
        let mut responses = Vec::with_capacity(req.container_requests.len());
        for c in req.container_requests {
            let parse = |ids: &[String]| -> Result<Vec<SlotId>, Status> {
                ids.iter()
                    .map(|id| {
                        SlotId::parse(id)
                            .map_err(|e| bad(format!("{} request: {e}", cfg.resource_name)))
                    })
                    .collect()
            };
            if c.available_device_i_ds.len() > MAX_IDS {
                return Err(bad(format!(
                    "{} available IDs (at most {MAX_IDS})",
                    c.available_device_i_ds.len()
                )));
            }
            let available = parse(&c.available_device_i_ds)?;
            let must_include = parse(&c.must_include_device_i_ds)?;
            let size = usize::try_from(c.allocation_size)
                .map_err(|_| bad(format!("allocation_size {} is negative", c.allocation_size)))?;
            // Slots the kubelet does not offer are in use (it offers only free ones).
            let mut offered: BTreeMap<&str, u32> = BTreeMap::new();
            for s in &available {
                *offered.entry(s.device.as_str()).or_default() += 1;
            }
            let loads: Vec<DeviceLoad> = set
                .devices
                .values()
                .map(|d| {
                    let from_offer = set
                        .slots_per_device
                        .saturating_sub(offered.get(d.name()).copied().unwrap_or(0));
                    let from_pods = pod_used.get(d.name()).copied().unwrap_or(0);
                    DeviceLoad {
                        device: d.name().to_string(),
                        numa: d.numa(),
                        used: from_offer.max(from_pods),
                    }
                })
                .collect();
            let chosen = preferred_allocation(
                &PreferenceRequest {
                    available,
                    must_include,
                    size,
                },
                &loads,
            );
            responses.push(api::ContainerPreferredAllocationResponse {
                device_i_ds: chosen.iter().map(ToString::to_string).collect(),
            });
        }
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses: responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let cfg = &self.state.cfg;
        let result = (|| {
            if req.container_requests.is_empty() {
                return Err(bad("AllocateRequest has no container requests; the kubelet sends one per container".into()));
            }
            if req.container_requests.len() > MAX_CONTAINERS {
                return Err(bad(format!(
                    "{} container requests in one call (at most {MAX_CONTAINERS})",
                    req.container_requests.len()
                )));
            }
            let set = self.state.served.borrow().clone();
            let mut responses = Vec::with_capacity(req.container_requests.len());
            let mut all_slots = Vec::new();
            let mut unhealthy = BTreeMap::new();
            for c in &req.container_requests {
                let slots = validate_ids(cfg, &set, &c.devices_ids)?;
                responses.push(container_response(cfg, &set, &slots));
                unhealthy.extend(unhealthy_granted(&slots));
                all_slots.extend(slots.into_iter().map(|(s, _)| s));
            }
            Ok((responses, all_slots, unhealthy))
        })();
        let elapsed = started.elapsed();
        self.state
            .metrics
            .allocate_seconds
            .observe(elapsed.as_secs_f64());
        match result {
            Ok((responses, slots, unhealthy)) => {
                for (device, why) in &unhealthy {
                    tracing::warn!(
                        device = %device,
                        "Allocate granted {device} although it is unhealthy now ({why}): the kubelet offered it healthy at its last ListAndWatch update and has the change now; the container starts with it"
                    );
                    self.state
                        .metrics
                        .allocated_unhealthy
                        .get_or_create(&crate::metrics::DeviceName {
                            device: device.clone(),
                        })
                        .inc();
                }
                self.state.metrics.observe_allocated(&slots);
                if let Some(h) = &self.state.holders {
                    h.poke();
                }
                if let Some(f) = &self.state.on_allocate {
                    f();
                }
                tracing::info!(ids = ?req.container_requests.iter().map(|c| &c.devices_ids).collect::<Vec<_>>(), ?elapsed, "Allocate");
                Ok(Response::new(api::AllocateResponse {
                    container_responses: responses,
                }))
            }
            Err(status) => {
                tracing::warn!("Allocate rejected: {}", status.message());
                Err(status)
            }
        }
    }

    async fn pre_start_container(
        &self,
        request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        let req = request.into_inner();
        if self.state.cfg.pre_start_required {
            let timeout = Duration::from_secs(api::PRE_START_CONTAINER_TIMEOUT_SECS);
            tokio::time::timeout(timeout, self.state.pre_start.pre_start(&req.devices_ids))
                .await
                .map_err(|_| {
                    Status::deadline_exceeded("PreStartContainer hook did not finish in 30 s")
                })??;
        } else {
            tracing::debug!(ids = ?req.devices_ids, "PreStartContainer called although not requested; nothing to do");
        }
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}
