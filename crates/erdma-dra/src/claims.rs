//! NodePrepareResources / NodeUnprepareResources.
//!
//! Prepare reads the claim by a GET (the kubelet sends only the claim's identity; as the upstream
//! kubelet-plugin helper does, and no watch of the cluster's claims: the API server selects
//! ResourceClaims by `metadata.name` and `metadata.namespace` only, so a watch could not be
//! limited to this node), checks its UID is the one the kubelet named, keeps the results of this
//! driver in this node's pool ([`crate::allocation`], which refuses opaque configuration for
//! this driver), checks each device against the served inventory and against its capacity (the
//! scheduler's accounting should already ensure it; this is the node's own guard, so an
//! over-booked device is refused with a clear error rather than silently oversubscribed),
//! writes the claim's CDI spec, records the claim in the checkpoint, and answers with the CDI
//! IDs under the container-visible request names (`main` of a `main/sub` result). A device
//! allocated for admin access consumes no share and gets no rdma limit. A claim already in the
//! checkpoint is answered from it. Unprepare removes the spec and the record; an unknown claim is
//! already unprepared.

use crate::allocation;
use crate::cdi::{self, ClaimDevice, RdmaLimits};
use crate::checkpoint::{Checkpoint, PreparedClaim, PreparedDevice, Used};
use crate::config::DraConfig;
use crate::journal::Journal;
use crate::slice::{CAP_HCA_HANDLE, CAP_HCA_OBJECT, CAP_SHARES, find_device};
use erdma_kubelet::dra::v1 as api;
use erdma_model::NodeDevices;
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{Mutex, watch};

/// The driver's claim handling: configuration, API client, the served inventory, the claim
/// reads' counters, and the checkpoint (guarded: one prepare or unprepare at a time).
pub struct Driver {
    cfg: DraConfig,
    client: kube::Client,
    served: watch::Receiver<NodeDevices>,
    reads: Reads,
    state: Mutex<State>,
    on_prepare: std::sync::OnceLock<PrepareObserver>,
}

/// Called after a NodePrepareResources call that prepared at least one claim; it must not block.
pub type PrepareObserver = Arc<dyn Fn() + Send + Sync>;

/// The prepared claims and the file that records them.
struct State {
    cp: Checkpoint,
    journal: Journal,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("driver", &self.cfg.driver_name)
            .field("node", &self.cfg.node_name)
            .finish()
    }
}

/// The amounts one allocation result consumes; `limits` is `None` for admin access (no rdma
/// limit, nothing counted against the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Consumed {
    shares: u64,
    limits: Option<RdmaLimits>,
}

/// Counters of the claim reads of NodePrepareResources, for `/healthz`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClaimReads {
    /// ResourceClaims read by GET (one per claim not yet prepared).
    pub gets: u64,
    /// Reads that failed (API error, claim gone, or a different UID).
    pub failed: u64,
}

#[derive(Debug, Default)]
struct Reads {
    gets: AtomicU64,
    failed: AtomicU64,
}

impl Driver {
    /// Loads the checkpoint (creating the plugin directory), rewrites it as one snapshot, and
    /// removes CDI specs of this driver that no prepared claim owns (left by a crash between
    /// writing a spec and the checkpoint).
    pub fn new(
        cfg: DraConfig,
        client: kube::Client,
        served: watch::Receiver<NodeDevices>,
    ) -> crate::error::Result<Driver> {
        cfg.validate().map_err(crate::error::DraError::Config)?;
        let dir = cfg.plugin_dir();
        std::fs::create_dir_all(&dir).map_err(crate::error::io_err("create directory", &dir))?;
        let cp = Checkpoint::load(&cfg.checkpoint_path())?;
        let journal = Journal::open(&cfg.checkpoint_path(), &cp)?;
        remove_orphan_specs(&cfg, &cp);
        Ok(Driver {
            cfg,
            client,
            served,
            reads: Reads::default(),
            state: Mutex::new(State { cp, journal }),
            on_prepare: std::sync::OnceLock::new(),
        })
    }

    /// Calls `f` after each NodePrepareResources that prepared a claim (the agent refreshes who
    /// holds which device); the first one set stays.
    pub fn on_prepare(&self, f: PrepareObserver) {
        let _ = self.on_prepare.set(f);
    }

    /// The counters of the claim reads.
    pub fn claim_reads(&self) -> ClaimReads {
        ClaimReads {
            gets: self.reads.gets.load(Ordering::Relaxed),
            failed: self.reads.failed.load(Ordering::Relaxed),
        }
    }

    /// The served devices this driver prepares from.
    pub fn served(&self) -> watch::Receiver<NodeDevices> {
        self.served.clone()
    }

    /// The configuration.
    pub fn config(&self) -> &DraConfig {
        &self.cfg
    }

    /// A copy of the prepared claims.
    pub async fn prepared(&self) -> Checkpoint {
        self.state.lock().await.cp.clone()
    }

    /// Prepares each claim; every claim gets an entry (a failure is that claim's `error`).
    pub async fn prepare(&self, claims: &[api::Claim]) -> api::NodePrepareResourcesResponse {
        let mut out = BTreeMap::new();
        for c in claims {
            let r = match self.prepare_one(c).await {
                Ok(devices) => api::NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(error) => {
                    tracing::warn!(claim = %format!("{}/{}", c.namespace, c.name), uid = %c.uid, "prepare refused: {error}");
                    api::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    }
                }
            };
            out.insert(c.uid.clone(), r);
        }
        if out.values().any(|r| r.error.is_empty())
            && let Some(f) = self.on_prepare.get()
        {
            f();
        }
        api::NodePrepareResourcesResponse { claims: out }
    }

    /// Unprepares each claim; every claim gets an entry.
    pub async fn unprepare(&self, claims: &[api::Claim]) -> api::NodeUnprepareResourcesResponse {
        let mut out = BTreeMap::new();
        for c in claims {
            let error = match self.unprepare_one(&c.uid).await {
                Ok(()) => String::new(),
                Err(e) => e,
            };
            out.insert(c.uid.clone(), api::NodeUnprepareResourceResponse { error });
        }
        api::NodeUnprepareResourcesResponse { claims: out }
    }

    fn answer(prepared: &PreparedClaim) -> Vec<api::Device> {
        prepared
            .devices
            .iter()
            .map(|d| api::Device {
                request_names: vec![allocation::base_request(&d.request).to_string()],
                pool_name: d.pool.clone(),
                device_name: d.device.clone(),
                cdi_device_ids: d.cdi_ids.clone(),
                share_id: d.share_id.clone(),
            })
            .collect()
    }

    async fn prepare_one(&self, c: &api::Claim) -> Result<Vec<api::Device>, String> {
        let who = format!("claim {}/{} (uid {})", c.namespace, c.name, c.uid);
        if !cdi::valid_uid(&c.uid) || c.namespace.is_empty() || c.name.is_empty() {
            return Err(format!(
                "{who}: namespace, name and a UID of letters, digits, '-', '_' or '.' are required"
            ));
        }
        if let Some(answer) = self.prepared_answer(&who, &c.uid).await {
            return Ok(answer);
        }
        // The claim is read without the checkpoint lock, so that a GET does not hold up the
        // prepares and unprepares of other claims.
        let claim = self.fetch(c).await.map_err(|e| format!("{who}: {e}"))?;
        let results = allocation::our_results(&claim, &self.cfg.driver_name, self.cfg.pool_name())
            .map_err(|e| format!("{who}: {e}"))?;
        let mut state = self.state.lock().await;
        if let Some(p) = state.cp.claims.get(&c.uid)
            && p.cdi_spec.exists()
        {
            // Prepared by a concurrent call for the same claim while this one read it.
            return Ok(Self::answer(p));
        }
        let served = self.served.borrow().clone();
        let mut used = state.cp.used(Some(&c.uid));
        let mut devices: Vec<PreparedDevice> = Vec::new();
        // `None`: a device of the claim allocated for admin access (no rdma limit for it).
        let mut per_ibdev: BTreeMap<String, Option<RdmaLimits>> = BTreeMap::new();
        for r in &results {
            let dev = find_device(&served, &r.device).ok_or_else(|| {
                format!(
                    "{who}: device {} is not served on node {} (served: {})",
                    r.device,
                    self.cfg.node_name,
                    served
                        .devices
                        .iter()
                        .filter_map(|d| crate::slice::device_name(&d.name))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
            // Prepared all the same: the scheduler allocated the device (a taint keeps new
            // claims off it), the kubelet's health stream reports it on the pod, and a refusal
            // would fail the pod's start for a momentary flip (a link flap).
            if !dev.health.is_healthy() {
                tracing::warn!(
                    "{who}: device {} ({}) is unhealthy now ({}); prepared as allocated",
                    r.device,
                    dev.name,
                    dev.health.reasons().join("; ")
                );
            }
            let want = self.consumed(r).map_err(|e| format!("{who}: {e}"))?;
            let u = used.entry(r.device.clone()).or_default();
            let counted = want.limits.unwrap_or(RdmaLimits {
                hca_handle: 0,
                hca_object: 0,
            });
            if want.limits.is_some() {
                self.check_capacity(&who, &r.device, u, want.shares, &counted)?;
            }
            u.shares += want.shares;
            u.hca_handle += counted.hca_handle;
            u.hca_object += counted.hca_object;
            let l = per_ibdev
                .entry(dev.name.clone())
                .or_insert(Some(RdmaLimits {
                    hca_handle: 0,
                    hca_object: 0,
                }));
            match (l.as_mut(), want.limits) {
                (Some(l), Some(w)) => {
                    l.hca_handle += w.hca_handle;
                    l.hca_object += w.hca_object;
                }
                // Admin access to a device is unrestricted, also beside a regular request of the
                // same claim on it: the container's rdma.max cannot tell the two apart.
                _ => *l = None,
            }
            devices.push(PreparedDevice {
                request: r.request.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
                ibdev: dev.name.clone(),
                cdi_ids: vec![cdi::qualified_name(
                    &self.cfg.driver_name,
                    &c.uid,
                    &dev.name,
                )],
                share_id: r.share_id.clone(),
                shares: want.shares,
                limits: counted,
                admin: want.limits.is_none(),
            });
        }
        let claim_devices: Vec<ClaimDevice<'_>> = per_ibdev
            .iter()
            .filter_map(|(ibdev, limits)| {
                Some(ClaimDevice {
                    device: served.device(ibdev)?,
                    limits: *limits,
                })
            })
            .collect();
        let spec_path = cdi::spec_path(&self.cfg.cdi_dir, &self.cfg.driver_name, &c.uid);
        let doc = cdi::spec(
            &self.cfg.driver_name,
            &c.uid,
            &claim_devices,
            served.rdma_cm.as_ref().filter(|cm| cm.present),
        );
        cdi::write(&spec_path, &doc).map_err(|e| format!("{who}: {e}"))?;
        let prepared = PreparedClaim {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            devices,
            cdi_spec: spec_path.clone(),
        };
        let answer = Self::answer(&prepared);
        let state = &mut *state;
        state.cp.claims.insert(c.uid.clone(), prepared.clone());
        if let Err(e) = state.journal.prepared(&state.cp, &c.uid, &prepared) {
            state.cp.claims.remove(&c.uid);
            let _ = cdi::remove(&spec_path);
            return Err(format!("{who}: {e}"));
        }
        tracing::info!(%who, devices = ?answer.iter().map(|d| &d.device_name).collect::<Vec<_>>(), "prepared");
        Ok(answer)
    }

    /// The checkpoint's answer for a claim already prepared whose CDI spec is still there.
    async fn prepared_answer(&self, who: &str, uid: &str) -> Option<Vec<api::Device>> {
        let state = self.state.lock().await;
        let p = state.cp.claims.get(uid)?;
        if p.cdi_spec.exists() {
            tracing::debug!(%who, "already prepared; answering from the checkpoint");
            return Some(Self::answer(p));
        }
        tracing::warn!(%who, spec = %p.cdi_spec.display(), "prepared claim lost its CDI spec; preparing it again");
        None
    }

    async fn unprepare_one(&self, uid: &str) -> Result<(), String> {
        if !cdi::valid_uid(uid) {
            return Err(format!("claim UID {uid:?} is not a valid UID"));
        }
        let mut state = self.state.lock().await;
        let state = &mut *state;
        let spec = match state.cp.claims.get(uid) {
            Some(p) => p.cdi_spec.clone(),
            None => cdi::spec_path(&self.cfg.cdi_dir, &self.cfg.driver_name, uid),
        };
        cdi::remove(&spec).map_err(|e| e.to_string())?;
        if let Some(old) = state.cp.claims.remove(uid) {
            if let Err(e) = state.journal.unprepared(&state.cp, uid) {
                state.cp.claims.insert(uid.to_string(), old);
                return Err(e.to_string());
            }
            tracing::info!(uid, "unprepared");
        }
        Ok(())
    }

    async fn fetch(&self, c: &api::Claim) -> Result<ResourceClaim, String> {
        self.reads.gets.fetch_add(1, Ordering::Relaxed);
        let read = self.read_claim(c).await;
        if read.is_err() {
            self.reads.failed.fetch_add(1, Ordering::Relaxed);
        }
        read
    }

    async fn read_claim(&self, c: &api::Claim) -> Result<ResourceClaim, String> {
        let api: kube::Api<ResourceClaim> =
            kube::Api::namespaced(self.client.clone(), &c.namespace);
        let claim = api
            .get(&c.name)
            .await
            .map_err(|e| format!("reading the ResourceClaim failed: {e}"))?;
        let uid = claim.metadata.uid.as_deref().unwrap_or("");
        if uid != c.uid {
            return Err(format!(
                "the ResourceClaim now has UID {uid:?} (deleted and re-created?); not preparing"
            ));
        }
        Ok(claim)
    }

    fn consumed(&self, r: &DeviceRequestAllocationResult) -> Result<Consumed, String> {
        if allocation::is_admin(r) {
            return Ok(Consumed {
                shares: 0,
                limits: None,
            });
        }
        let cap = &self.cfg.capacity;
        let get = |name: &str, default: u64| -> Result<u64, String> {
            match r.consumed_capacity.as_ref().and_then(|m| m.get(name)) {
                Some(q) => erdma_model::quantity::parse(&q.0)
                    .map_err(|e| format!("consumed capacity {name} of device {}: {e}", r.device)),
                None => Ok(default),
            }
        };
        Ok(Consumed {
            shares: get(CAP_SHARES, 1)?,
            limits: Some(RdmaLimits {
                hca_handle: get(CAP_HCA_HANDLE, cap.hca_handles_default)?,
                hca_object: get(CAP_HCA_OBJECT, cap.hca_objects_default)?,
            }),
        })
    }

    fn check_capacity(
        &self,
        who: &str,
        device: &str,
        used: &Used,
        shares: u64,
        limits: &RdmaLimits,
    ) -> Result<(), String> {
        let cap = &self.cfg.capacity;
        let checks = [
            (CAP_SHARES, used.shares, shares, cap.shares),
            (
                CAP_HCA_HANDLE,
                used.hca_handle,
                limits.hca_handle,
                cap.hca_handles,
            ),
            (
                CAP_HCA_OBJECT,
                used.hca_object,
                limits.hca_object,
                cap.hca_objects,
            ),
        ];
        for (name, have, ask, total) in checks {
            if have.saturating_add(ask) > total {
                return Err(format!(
                    "{who}: device {device} has {name}={total}; {} prepared claim(s) hold {have} and this claim asks {ask}, which exceeds the capacity (refused; the scheduler's accounting and the node disagree)",
                    used.claims
                ));
            }
        }
        Ok(())
    }
}

/// Removes `<cdi_dir>/<driver>-claim_*.json` files that no prepared claim owns.
fn remove_orphan_specs(cfg: &DraConfig, cp: &Checkpoint) {
    let prefix = format!("{}-claim_", cfg.driver_name);
    let Ok(entries) = std::fs::read_dir(&cfg.cdi_dir) else {
        return;
    };
    let owned: std::collections::BTreeSet<&std::path::Path> =
        cp.claims.values().map(|c| c.cdi_spec.as_path()).collect();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        if name.starts_with(&prefix) && name.ends_with(".json") && !owned.contains(path.as_path()) {
            tracing::info!(spec = %path.display(), "removing a CDI spec no prepared claim owns");
            let _ = std::fs::remove_file(&path);
        }
    }
}
