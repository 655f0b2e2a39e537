//! The agent's tasks, started from resolved [`Settings`]: the device state owner (inventory
//! scans, published when changed), the driver manager (readiness gate), the ERI source and the
//! instance ID, the publisher of the served snapshot, ERI netdev and SMC-R pnet host setup, the
//! SMC-R pre-start hook, the kubelet device plugin and the watch for another plugin serving the
//! same resource (or the DRA driver), `/metrics` and `/healthz`, as [`AgentPlan`] decides from
//! the settings and what the node offers. Runs until `cancel` fires.
//!
//! Shutdown has one bound: once `cancel` fires, [`run`] returns within [`SHUTDOWN_GRACE`],
//! whatever it was waiting on (an API call, a sysfs read, a task that does not stop), and logs
//! each thing it left unfinished as `abandoned: ...`.

use crate::cli::Settings;
use crate::health::{self, Exposition, HealthSources};
use crate::metrics::AgentMetrics;
use crate::plan::{AgentPlan, NodeOffers};
use crate::resource_api::ResourceApi;
use crate::tasks::{self, Shared, Tasks};
use crate::{cluster, devices, driver, hostsetup, nri, plugin, resource_api, smcr, source};
use erdma_deviceplugin::Metrics;
use erdma_driver::DriverStatus;
use erdma_host::{LiveInterfaceAddrs, RootedDevFs, RootedSysfs};
use erdma_inventory::{Inventory, Sources};
use erdma_kubelet::podresources::{Held, Holders, PodResourcesClient};
use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use crate::pending::{Pending, PendingGuard};

pub use crate::tasks::SHUTDOWN_GRACE;

/// Runs the agent with `s` until `cancel` fires (SIGTERM/SIGINT in the binary) or the device
/// plugin fails. Once `cancel` fired it returns within [`SHUTDOWN_GRACE`]: `Ok` when the
/// shutdown was cut short, after logging each thing abandoned (`abandoned: ...`); sysfs reads
/// still blocked are logged the same way however the agent stopped.
pub async fn run(s: Settings, cancel: CancellationToken) -> anyhow::Result<()> {
    let pending = Pending::default();
    let inventory = Inventory::new(Sources {
        sysfs: Arc::new(RootedSysfs::new(&s.sysfs_root)),
        devfs: Arc::new(RootedDevFs::new(&s.dev_root)),
        addrs: Arc::new(LiveInterfaceAddrs),
    });
    let tasks = Tasks::new(pending.clone(), cancel.clone());
    let serving = serve(s, inventory.clone(), tasks);
    tasks::with_grace(serving, &cancel, &pending, &inventory).await
}

/// The agent's work: one start per concern, as the plan says, then the resource API's run and
/// the one shutdown of every task.
async fn serve(s: Settings, inventory: Inventory, mut tasks: Tasks) -> anyhow::Result<()> {
    // The one metrics registry: every part registers its metrics here.
    let mut registry = prometheus_client::registry::Registry::default();
    let plugin_metrics = Arc::new(Metrics::register(&mut registry));
    let agent_metrics = Arc::new(AgentMetrics::register(&mut registry));
    let connections = erdma_host::http::ConnectionMetrics::register(&mut registry);
    // Started before the API connection: the first scan and the SMC-R BPF probe.
    let first_scan = devices::start_first_scan(&inventory);
    let smcr_probe = smcr::start_probe(AgentPlan::probes_smcr(&s), &s);
    let cluster = cluster::start(&s, &tasks.pending).await;
    let api = resource_api::choose(&s, cluster.as_ref(), &tasks.pending).await?;
    let offers = NodeOffers {
        cluster: cluster.is_some(),
        nri_socket: s.nri_socket.exists(),
        resource_api: api,
    };
    let plan = AgentPlan::new(&s, &offers)?;
    plan.log();
    resource_api::start_report(&plan, &s, &cluster, &mut tasks);
    let mut health = HealthSources {
        resource_api: watch::channel(Some(api)).1,
        ..HealthSources::fixed(DriverStatus::unmanaged())
    };

    // Who holds which device, through either resource API: the one owner of the kubelet's
    // pod-resources answer (the device plugin, the reload guard, SMC-R and the NRI hooks read its
    // published snapshot), refreshed after each allocation, when the kubelet's socket comes back
    // and every 10 s.
    let holders = Holders::new(
        s.pod_resources_socket
            .as_deref()
            .map(PodResourcesClient::new)
            .unwrap_or_default(),
        Held::both(&s.resource_name, erdma_model::names::DRA_DRIVER),
    );
    let refresh = holders.clone().refresh_on_poke(tasks.cancel.clone());
    tasks.spawn("the pod-resources owner", refresh);
    // Per-pod RDMA usage, read when /metrics or /usage asks (collect-on-scrape).
    let usage = plan.rdma_usage.then(|| {
        let u = crate::usage::UsageService::real(
            holders.clone(),
            plan.sockets.cri.clone(),
            s.node_name.clone(),
        );
        // Only the families that name no pod: `/metrics` adds the per-pod ones for the peers
        // that may read them (`UsageService::readable_by`).
        registry.register_collector(Box::new(crate::usage::NodeUsageCollector(u.clone())));
        u.serve_remote_readers(s.usage_remote);
        u
    });

    let shared = Shared {
        settings: &s,
        plan: &plan,
        cluster: &cluster,
        holders: &holders,
        metrics: &agent_metrics,
    };
    let h = &mut health;
    let driver = driver::start_manager(shared, &mut h.driver, &mut tasks);
    let id_views = (&mut h.instance_id, &mut h.instance_id_error);
    let instance_id = source::start_instance_id(shared, id_views.0, id_views.1, &mut tasks)?;
    let Some((raw, complete)) = devices::start(first_scan, inventory, &s, &mut tasks).await? else {
        tasks.stop().await;
        return Ok(());
    };
    let source = source::start(shared, &raw, &mut h.eri_source, &mut tasks);
    let inputs = devices::PublisherInputs {
        raw,
        driver,
        source: source.clone(),
        instance_id,
    };
    let served = devices::start_publish(&s, inputs, &mut h.served, &mut tasks);
    let setup_views = (&mut h.netdev, &mut h.smc_pnet_warnings);
    hostsetup::start(
        shared,
        &served,
        &source,
        setup_views.0,
        setup_views.1,
        &mut tasks,
    )?;
    let nri_view = nri::start_view(&plan, &mut h.nri);
    let (serving, smcr_for_nri) = match plan.resource_api {
        ResourceApi::Dra => {
            let dra = resource_api::start_dra(shared, &served, &mut h.dra, &tasks)?;
            complete.now();
            (dra, None)
        }
        ResourceApi::DevicePlugin => {
            // The GID tables are read once the kubelet has the devices (see
            // `devices::start_first_scan`: nothing it is told depends on them).
            let handed = plugin_metrics.clone();
            complete.after(
                async move { handed.devices_handed_over().await },
                &mut tasks,
            );
            let pm = plugin_metrics.clone();
            plugin::start(shared, &served, pm, smcr_probe, h, &mut tasks).await?
        }
    };
    nri::start(shared, smcr_for_nri, &served, nri_view, &mut tasks);
    let exposition = Exposition {
        registry: Arc::new(registry),
        plugin: plugin_metrics,
        health,
        usage,
    };
    health::start(&s, exposition, connections, &mut tasks);
    tasks.start_release();
    let (result, _held) = serving.await;
    tasks.stop().await;
    result?;
    tracing::info!("erdma-agent stopped");
    Ok(())
}
