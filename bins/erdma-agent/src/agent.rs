//! The agent's tasks, started from resolved [`Settings`]: the device state owner (inventory
//! scans, published when changed), the driver manager (readiness gate), the ERI source and the
//! instance ID, the publisher of the served snapshot, ERI netdev and SMC-R pnet host setup, the
//! SMC-R pre-start hook, the kubelet device plugin and the watch for another plugin serving the
//! same resource, `/metrics` and `/healthz`. Runs until `cancel` fires.
//!
//! Shutdown has one bound: once `cancel` fires, [`run`] returns within [`SHUTDOWN_GRACE`],
//! whatever it was waiting on (an API call, a sysfs read, a task that does not stop), and logs
//! each thing it left unfinished as `abandoned: ...`.

use crate::cli::{MetricsAddr, Settings};
use crate::health::{self, Exposition, HealthSources};
use crate::metrics::AgentMetrics;
use crate::source::{self, EriSource};
use crate::{cli, cluster, coexistence, devices, driver, hostsetup, nri, resource_api, smcr};
use anyhow::Context;
use erdma_cloud::imds::ImdsClient;
use erdma_deviceplugin::{CdiConfig, Metrics, Plugin, PluginConfig};
use erdma_driver::{DriverStatus, KubeletPodResources, NodeHost};
use erdma_host::{LiveInterfaceAddrs, RootedDevFs, RootedSysfs};
use erdma_inventory::{Inventory, Sources};
use erdma_kubelet::podresources::{Held, HolderCache, PodResourcesClient};
use erdma_model::DeviceSelection;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long the agent's graceful shutdown may take once `cancel` fired: what has not finished by
/// then is abandoned (and logged). The binary leaves its runtime half a second more, so that the
/// process ends within 5 s of SIGTERM (the README's shutdown contract).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(4);

/// What the agent is waiting on or running, by name: what a shutdown cut short abandoned.
#[derive(Debug, Clone, Default)]
pub struct Pending {
    next: Arc<AtomicU64>,
    names: Arc<Mutex<BTreeMap<u64, String>>>,
}

/// Removes its name from [`Pending`] when dropped.
#[derive(Debug)]
pub struct PendingGuard {
    id: u64,
    names: Arc<Mutex<BTreeMap<u64, String>>>,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

impl Pending {
    /// Records `what` until the guard is dropped.
    pub fn enter(&self, what: impl Into<String>) -> PendingGuard {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, what.into());
        PendingGuard {
            id,
            names: self.names.clone(),
        }
    }

    /// `fut`, recorded as `what` until it ends or is dropped.
    pub fn track<F: Future>(&self, what: &str, fut: F) -> impl Future<Output = F::Output> + use<F> {
        let guard = self.enter(what);
        async move {
            let out = fut.await;
            drop(guard);
            out
        }
    }

    /// What is recorded now, oldest first.
    pub fn list(&self) -> Vec<String> {
        self.names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

/// Runs the agent with `s` until `cancel` fires (SIGTERM/SIGINT in the binary) or the device
/// plugin fails. Once `cancel` fired it returns within [`SHUTDOWN_GRACE`]: `Ok` when the
/// shutdown was cut short, after logging each thing abandoned (`abandoned: ...`); sysfs reads
/// still blocked are logged the same way however the agent stopped.
pub async fn run(s: Settings, cancel: CancellationToken) -> anyhow::Result<()> {
    let pending = Pending::default();
    let sources = Sources {
        sysfs: Arc::new(RootedSysfs::new(&s.sysfs_root)),
        devfs: Arc::new(RootedDevFs::new(&s.dev_root)),
        addrs: Arc::new(LiveInterfaceAddrs),
    };
    let inventory = Inventory::new(sources);
    let serving = serve(s, inventory.clone(), cancel.clone(), pending.clone());
    let deadline = async {
        cancel.cancelled().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    let result = tokio::select! {
        r = serving => r,
        () = deadline => {
            tracing::warn!(
                grace = ?SHUTDOWN_GRACE,
                "the graceful shutdown did not finish in time; exiting without it"
            );
            for what in pending.list() {
                tracing::warn!("abandoned: {what}");
            }
            Ok(())
        }
    };
    for read in inventory.pending_reads() {
        let how = if read.blocked {
            "blocked, its thread left behind: a driver stuck in it?"
        } else {
            "in flight"
        };
        tracing::warn!("abandoned: sysfs {read} ({how})");
    }
    result
}

/// The agent's work, until `cancel` fires or the device plugin fails; `pending` names what it
/// waits on, for the shutdown report.
async fn serve(
    s: Settings,
    inventory: Inventory,
    cancel: CancellationToken,
    pending: Pending,
) -> anyhow::Result<()> {
    // The one metrics registry: every part registers its metrics here.
    let mut registry = prometheus_client::registry::Registry::default();
    let plugin_metrics = Arc::new(Metrics::register(&mut registry));
    let agent_metrics = Arc::new(AgentMetrics::register(&mut registry));
    let registry = Arc::new(registry);
    let mut tasks = Vec::new();

    // The first inventory scan reads every device's sysfs files (tens of ms for 64 devices): it
    // starts now, beside the API client and the SMC-R probe, and is awaited when it is needed.
    let first_scan = {
        let inv = inventory.clone();
        tokio::task::spawn_blocking(move || inv.scan())
    };
    // The SMC-R BPF policy: its kernel probe reads /proc/kallsyms (tens of ms), so it runs
    // beside the inventory scan instead of before the device plugin starts.
    let smcr_policy = s.prestart_container.then(|| {
        let pin_dir = s.bpf_pin_dir.clone();
        tokio::task::spawn_blocking(move || smcr::open_policy(&pin_dir))
    });

    // Kubernetes API: only with a node name and a config.
    let detect = cluster::detect(
        s.node_name.as_deref(),
        s.kubeconfig.as_deref(),
        s.request_timeout,
    );
    let cluster = match pending
        .track("connecting to the Kubernetes API", detect)
        .await
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e}; node labels and Events are only logged");
            None
        }
    };

    // Device plugin or DRA on this node (never both).
    let api = pending
        .track(
            "choosing the resource API",
            resource_api::resolve(s.resource_api, cluster.as_ref()),
        )
        .await?;
    if api == resource_api::ResourceApi::Dra && cluster.is_none() {
        anyhow::bail!(
            "--resource-api dra needs the Kubernetes API (NODE_NAME and in-cluster config or --kubeconfig) to publish ResourceSlices and read claims"
        );
    }
    tracing::info!(
        resource_api = api.name(),
        "serving eRDMA devices through {}",
        api.name()
    );
    if let Some(c) = cluster.clone() {
        // Reported beside the start-up, not before it: nothing below waits for the API server.
        let (resource, choice, stop) = (s.resource_name.clone(), s.resource_api, cancel.clone());
        tasks.push(tokio::spawn(pending.track(
            "reporting the resource API",
            async move {
                let report = async {
                    if let Err(e) = resource_api::publish_condition(&c, api, &resource).await {
                        tracing::warn!("{e}");
                    }
                    if api == resource_api::ResourceApi::DevicePlugin
                        && choice == resource_api::Choice::NodeLabel
                    {
                        resource_api::retire_dra(&c).await;
                    }
                };
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = report => {}
                }
            },
        )));
    }

    // Who holds which device, through either resource API: one kept pod-resources answer for
    // the reload guard, SMC-R and the NRI hooks, refreshed after each allocation.
    let holders = HolderCache::new(
        s.pod_resources_socket
            .as_deref()
            .map(PodResourcesClient::new)
            .unwrap_or_default(),
        Held::both(&s.resource_name, erdma_model::names::DRA_DRIVER),
    );
    tasks.push(tokio::spawn(pending.track(
        "the pod-resources cache",
        holders.clone().refresh_on_poke(cancel.clone()),
    )));

    // Driver manager (readiness gate).
    let mut driver_cfg = s.driver.clone();
    driver_cfg.resource = holders.held().clone();
    let usage = KubeletPodResources::from_cache(holders.clone());
    if driver_cfg.installer_trust.allow_insecure_http {
        tracing::warn!(
            "INSECURE: --allow-insecure-driver-download is set; a driver installer may be downloaded over plain HTTP (its SHA-256 pin is still checked)"
        );
    }
    let host = NodeHost::new().with_installer_trust(driver_cfg.installer_trust.clone());
    let (driver_rx, _driver_tx, reconciler) =
        driver::start(host, usage, driver_cfg, cancel.clone());
    tasks.push(tokio::spawn(pending.track(
        "reporting the driver state",
        driver::observe(
            driver_rx.clone(),
            agent_metrics.clone(),
            cluster.clone(),
            cancel.clone(),
        ),
    )));

    // Instance ID for --exposed-local-eris.
    let mut allocate_all = s.allocate_all_devices;
    if !s.exposed_local_eris.is_empty() && s.local_eri_discovery && !allocate_all {
        // Kept from the original agent: a local allow-list implies all-devices mode.
        tracing::info!(
            "--exposed-local-eris with --local-eri-discovery: every container gets every exposed device"
        );
        allocate_all = true;
    }
    let metadata = || {
        ImdsClient::new(&s.metadata_endpoint)
            .with_context(|| format!("metadata endpoint {}", s.metadata_endpoint))
    };
    let (id_tx, id_rx) = watch::channel(s.instance_id.clone());
    let (id_err_tx, id_err_rx) = watch::channel(None);
    if s.instance_id.is_none() && !s.exposed_local_eris.is_empty() {
        tasks.push(tokio::spawn(pending.track(
            "asking the metadata service for the instance ID",
            source::fetch_instance_id(
                metadata()?,
                id_tx,
                id_err_tx,
                Duration::from_secs(1),
                cancel.clone(),
            ),
        )));
    } else {
        drop(id_tx);
    }

    // Inventory. The scan runs on a thread of its own, each sysfs read with a time limit; a
    // shutdown does not wait for it.
    let scanned = {
        let _waiting = pending.enter("the initial inventory scan");
        tokio::select! {
            r = first_scan => Some(r),
            _ = cancel.cancelled() => None,
        }
    };
    let Some(raw) = scanned else {
        tracing::warn!("abandoned: the initial inventory scan");
        stop_tasks(&cancel, reconciler, tasks).await;
        return Ok(());
    };
    let raw = raw.context("initial inventory scan")?;
    tracing::info!(
        devices = ?raw.devices.iter().map(|d| (&d.name, d.health.is_healthy())).collect::<Vec<_>>(),
        drivers = ?s.rdma_drivers,
        "initial inventory"
    );
    let (raw_tx, raw_rx) = watch::channel(raw);
    let wake = devices::Wake::default();
    erdma_inventory::events::watch_links(
        wake.refresh.clone(),
        wake.rescan.clone(),
        wake.down.clone(),
        cancel.clone(),
    );
    let _dev_watcher = erdma_inventory::events::watch_dev(&s.dev_root, wake.refresh.clone());
    tasks.push(tokio::spawn(pending.track(
        "the device inventory",
        devices::run(
            inventory,
            raw_tx,
            s.poll_interval,
            devices::FULL_SCAN_EVERY,
            wake,
            cancel.clone(),
        ),
    )));

    // ERI source.
    let (source_tx, source_rx) = if s.local_eri_discovery {
        let (tx, rx) = watch::channel(EriSource::Local);
        (Some(tx), rx)
    } else {
        let (tx, rx) = watch::channel(EriSource::Waiting(
            "looking for this node's ERdmaDevice".into(),
        ));
        tasks.push(tokio::spawn(pending.track(
            "following this node's ERdmaDevice",
            source::follow_cluster(
                cluster.clone(),
                source::ClusterSourceConfig {
                    node_name: s.node_name.clone(),
                    kubeconfig: s.kubeconfig.clone(),
                    request_timeout: s.request_timeout,
                    report_retry: Duration::from_secs(10),
                    retry: Duration::from_secs(30),
                },
                raw_rx.clone(),
                tx,
                cancel.clone(),
            ),
        )));
        (None, rx)
    };

    // The served snapshot, computed once now so that the plugin's first list is already right.
    let selection = DeviceSelection {
        drivers: s.rdma_drivers.clone(),
        eris: s.exposed_local_eris.clone(),
        instance_id: s.instance_id.clone(),
    };
    let (first, _) = devices::compose(&devices::Inputs {
        raw: &raw_rx.borrow(),
        selection: &selection,
        driver: &driver_rx.borrow(),
        source: &source_rx.borrow(),
    });
    let (served_tx, served_rx) = watch::channel(first);
    let (served_view_tx, served_view_rx) = watch::channel(devices::ServedView::default());
    let mut health = HealthSources {
        driver: driver_rx.clone(),
        instance_id: id_rx.clone(),
        instance_id_error: id_err_rx,
        eri_source: source_rx.clone(),
        served: served_view_rx,
        resource_api: watch::channel(Some(api)).1,
        ..HealthSources::fixed(DriverStatus::unmanaged())
    };
    tasks.push(tokio::spawn(pending.track(
        "publishing the served devices",
        devices::publish(
            devices::PublisherInputs {
                raw: raw_rx,
                driver: driver_rx,
                source: source_rx.clone(),
                instance_id: id_rx,
            },
            selection,
            served_tx,
            served_view_tx,
            cancel.clone(),
        ),
    )));

    // Host setup.
    if s.setup_eri_netdev {
        tracing::info!(
            mtu = s.jumbo_frame_mtu,
            "ERI netdev setup enabled (never touches the primary interface)"
        );
        let (tx, rx) = watch::channel(Default::default());
        health.netdev = rx;
        tasks.push(tokio::spawn(pending.track(
            "ERI netdev setup",
            hostsetup::run_netdev(
                erdma_netdev::RouteNetlink::connect,
                metadata()?,
                served_rx.clone(),
                source_rx,
                s.jumbo_frame_mtu,
                hostsetup::NetdevReport {
                    failures: agent_metrics.netdev_setup_failures.clone(),
                    report: tx,
                },
                cancel.clone(),
            ),
        )));
    } else {
        tracing::info!("ERI netdev setup disabled (--setup-eri-netdev)");
    }
    if s.setup_smc_pnet {
        let (tx, rx) = watch::channel(Vec::new());
        health.smc_pnet_warnings = rx;
        tasks.push(tokio::spawn(pending.track(
            "SMC pnet setup",
            hostsetup::run_smc_pnet(served_rx.clone(), tx, cancel.clone()),
        )));
    }

    let mut cfg = PluginConfig::new(&s.kubelet_dir);
    cfg.resource_name = s.resource_name.clone();
    cfg.slots_per_device = s.slots_per_device;
    cfg.allocate_all_devices = allocate_all;
    let use_nri = match s.nri {
        cli::NriMode::Off => false,
        cli::NriMode::On => true,
        cli::NriMode::Auto => s.nri_socket.exists(),
    };
    // With NRI, SMC-R happens at sandbox creation: the kubelet need not call PreStartContainer.
    cfg.pre_start_required = s.prestart_container && !use_nri;
    let (nri_tx, nri_rx) = watch::channel(Some(nri::NriView {
        mode: format!("{:?}", s.nri).to_lowercase(),
        socket: s.nri_socket.display().to_string(),
        used: use_nri,
        smcr_path: match (s.prestart_container, use_nri) {
            // A DRA node has no pre-start call and no pod-resources device IDs for the PNET ID.
            _ if api == resource_api::ResourceApi::Dra => "none".into(),
            (false, _) => "none".into(),
            (true, true) => "nri".into(),
            (true, false) => "prestart".into(),
        },
        connected: false,
        last_error: None,
    }));
    health.nri = nri_rx;
    cfg.pod_resources_socket = s.pod_resources_socket.clone();
    cfg.cdi = s.cdi_spec_dir.clone().map(|spec_dir| CdiConfig {
        spec_dir,
        kind: "aliyun.com/erdma".into(),
    });
    let observer = erdma_deviceplugin::coexistence::Observer::new(&cfg);
    let poke = holders.clone();
    let mut plugin = Plugin::new(cfg, served_rx.clone(), plugin_metrics.clone())
        .on_allocate(Arc::new(move || poke.poke()));
    if api == resource_api::ResourceApi::Dra {
        let (dra_tx, dra_rx) = watch::channel(None);
        health.dra = dra_rx;
        if let MetricsAddr::On(addr) = s.metrics_addr {
            tasks.push(tokio::spawn(pending.track(
                "serving /metrics",
                serve_metrics(
                    addr,
                    Exposition {
                        registry: registry.clone(),
                        plugin: plugin_metrics.clone(),
                        health: health.clone(),
                    },
                    cancel.clone(),
                ),
            )));
        }
        // NRI on a DRA node: memlock and the claims' rdma limits (the driver's CDI specs hand
        // them over in the container's environment).
        if use_nri {
            tasks.push(spawn_nri(
                &pending,
                &s,
                nri_handler(
                    &s,
                    &served_rx,
                    None,
                    &cluster,
                    &agent_metrics,
                    &holders,
                    nri_tx.clone(),
                ),
                &cancel,
            ));
        }
        tasks.push(tokio::spawn(release_startup_pages(cancel.clone())));
        let _dra = pending.enter("the DRA driver");
        let dra = resource_api::run_dra(
            resource_api::DraSettings {
                kubelet_root_dir: s.kubelet_root_dir.clone(),
                cdi_dir: s
                    .cdi_spec_dir
                    .clone()
                    .unwrap_or_else(|| "/var/run/cdi".into()),
                sysfs: s.sysfs_root.clone(),
                claim_watch: s.dra_claim_watch,
                on_prepare: Some({
                    let h = holders.clone();
                    Arc::new(move || h.poke())
                }),
                dropped_fields: Some(agent_metrics.dra_dropped_fields.clone()),
                resource_name: s.resource_name.clone(),
            },
            cluster.clone().context("DRA needs the Kubernetes API")?,
            served_rx.clone(),
            s.instance_id.clone(),
            dra_tx,
            cancel.clone(),
        )
        .await;
        stop_tasks(&cancel, reconciler, tasks).await;
        drop(source_tx);
        dra.context("DRA driver")?;
        tracing::info!("erdma-agent stopped");
        return Ok(());
    }
    let (conflict_tx, conflict_rx) = watch::channel(None);
    health.device_plugin_conflict = conflict_rx;
    tasks.push(tokio::spawn(pending.track(
        "watching for another device plugin",
        coexistence::run(
            coexistence::Config {
                observer,
                reclaimer: plugin.reclaimer(),
                every: coexistence::EVERY,
                recheck: coexistence::RECHECK,
            },
            served_rx.clone(),
            cluster.clone(),
            agent_metrics.clone(),
            conflict_tx,
            cancel.clone(),
        ),
    )));
    let mut smcr_for_nri = None;
    if let Some(policy) = smcr_policy {
        let policy = pending
            .track("loading the SMC-R BPF policy", policy)
            .await
            .context("loading the SMC-R BPF policy")?;
        let smc = smcr::Smc::new(smcr::pod_options(s.smcr_keep_ipv6), policy);
        let hook = Arc::new(smcr::SmcrHook::new(
            smcr::HookConfig {
                resource: s.resource_name.clone(),
                holders: holders.clone(),
                cri_socket: s.cri_socket.clone(),
                host_root: "/".into(),
                proc_root: "/proc".into(),
                strict: s.smcr_strict,
            },
            Arc::new(smc),
            served_rx.clone(),
            cluster.clone(),
            agent_metrics.clone(),
        ));
        health.smcr = hook.decisions();
        tracing::info!(
            strict = s.smcr_strict,
            keep_ipv6 = s.smcr_keep_ipv6,
            "SMC-R pre-start hook enabled for pods annotated {}=\"true\"",
            erdma_smc::annotation::SMCR_ANNOTATION
        );
        tasks.push(tokio::spawn(pending.track(
            "the SMC-R hook's reaper",
            hook.clone().reap(smcr::REAP_EVERY, cancel.clone()),
        )));
        if use_nri {
            smcr_for_nri = Some(hook);
        } else {
            plugin = plugin.with_pre_start(hook);
        }
    }
    if use_nri {
        let handler = nri_handler(
            &s,
            &served_rx,
            smcr_for_nri,
            &cluster,
            &agent_metrics,
            &holders,
            nri_tx,
        );
        tasks.push(spawn_nri(&pending, &s, handler, &cancel));
    }
    if let MetricsAddr::On(addr) = s.metrics_addr {
        tasks.push(tokio::spawn(pending.track(
            "serving /metrics",
            serve_metrics(
                addr,
                Exposition {
                    registry,
                    plugin: plugin_metrics,
                    health,
                },
                cancel.clone(),
            ),
        )));
    }
    tasks.push(tokio::spawn(release_startup_pages(cancel.clone())));
    let plugin = pending
        .track("the device plugin", plugin.run(cancel.clone()))
        .await;
    stop_tasks(&cancel, reconciler, tasks).await;
    drop(source_tx);
    plugin.context("device plugin")?;
    tracing::info!("erdma-agent stopped");
    Ok(())
}

/// The agent's NRI handler: the install's policy, the served devices, SMC-R when this node
/// configures it through NRI.
fn nri_handler(
    s: &Settings,
    served: &watch::Receiver<erdma_model::NodeDevices>,
    smcr: Option<Arc<smcr::SmcrHook>>,
    cluster: &Option<cluster::Cluster>,
    metrics: &Arc<crate::metrics::AgentMetrics>,
    holders: &Arc<HolderCache>,
    view: watch::Sender<Option<nri::NriView>>,
) -> Arc<nri::AgentNri> {
    Arc::new(nri::AgentNri {
        policy: s.nri_policy.clone(),
        holders: holders.clone(),
        proc_root: "/proc".into(),
        served: served.clone(),
        smcr,
        cluster: cluster.clone(),
        metrics: metrics.clone(),
        view,
    })
}

/// Runs the NRI plugin session until `cancel`.
fn spawn_nri(
    pending: &Pending,
    s: &Settings,
    handler: Arc<nri::AgentNri>,
    cancel: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(pending.track(
        "the NRI plugin",
        nri::run(
            erdma_nri::plugin::PluginConfig {
                socket: s.nri_socket.clone(),
                name: "erdma".into(),
                idx: "10".into(),
                events: nri::EVENTS.to_vec(),
                budget: s.nri_budget,
                observer: Some(handler.metrics.clone() as Arc<dyn erdma_nri::plugin::HookObserver>),
            },
            handler,
            cancel.clone(),
        ),
    ))
}

/// How long after the start the agent gives back the pages only start-up needed: registration,
/// the first scan and the first ERdmaDevice read are over by then on any node.
const STARTUP_SETTLES: Duration = Duration::from_secs(10);
/// The release is repeated this often, so that a burst (a kubelet restart, many allocations)
/// leaves the resident set at the idle loop's again.
const RELEASE_EVERY: Duration = Duration::from_secs(600);

/// Gives back the resident pages start-up left behind (text pages only the start used, freed
/// heap), once start-up settled and then every [`RELEASE_EVERY`]: see
/// [`erdma_host::resident`]. The idle agent's own pages come back on their next use.
async fn release_startup_pages(cancel: CancellationToken) {
    let mut wait = STARTUP_SETTLES;
    let mut first = true;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        // Logged before the release: logging afterwards would map the formatting code again.
        match erdma_host::resident::own_releasable_mappings() {
            Ok(text) => {
                let kib = text.iter().map(|m| (m.end - m.start) / 1024).sum::<usize>();
                if first {
                    tracing::info!(
                        mappings = text.len(),
                        mapped_kib = kib,
                        "giving back the pages only start-up used (read-only file mappings, free heap)"
                    );
                }
                let r = erdma_host::resident::release(&text);
                if !r.refused.is_empty() {
                    tracing::warn!("giving back start-up pages: {r}");
                }
            }
            Err(e) => tracing::warn!("{e}"),
        }
        first = false;
        wait = RELEASE_EVERY;
    }
}

/// Cancels every task and waits for them, the driver reconciler first: the one shutdown of the
/// device-plugin and the DRA paths.
async fn stop_tasks(
    cancel: &CancellationToken,
    reconciler: Option<tokio::task::JoinHandle<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) {
    cancel.cancel();
    if let Some(r) = reconciler {
        let _ = r.await;
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// Serves /metrics, /healthz and /readyz; a busy or forbidden address is logged and retried every
/// 10 s, never a reason to stop serving devices.
async fn serve_metrics(addr: std::net::SocketAddr, what: Exposition, cancel: CancellationToken) {
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                tracing::info!(%addr, "serving /metrics and /healthz");
                if let Err(e) = health::serve_on(listener, what.clone(), cancel.clone()).await {
                    tracing::error!(%addr, "metrics server failed: {e}");
                }
                if cancel.is_cancelled() {
                    return;
                }
            }
            Err(e) => {
                tracing::error!(%addr, "cannot bind --metrics-addr ({e}); retrying in 10 s, devices are served meanwhile")
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_secs(10)) => {}
        }
    }
}
