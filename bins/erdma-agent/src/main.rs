//! `erdma-agent`: the erdma node agent.
//!
//! Thin wiring: flags and config file → settings; the device state owner (inventory scans,
//! filtered by driver and ERI allow-list, published on a watch channel when changed); the kubelet
//! device plugin; `/metrics` and `/healthz`; SIGTERM/SIGINT → graceful shutdown.

mod cli;
mod devices;
mod metadata;

use anyhow::Context;
use clap::Parser;
use cli::{Flags, MetricsAddr, Settings};
use devices::DeviceFilter;
use erdma_deviceplugin::{CdiConfig, Metrics, Plugin, PluginConfig};
use erdma_host::{LiveInterfaceAddrs, RootedDevFs, RootedSysfs};
use erdma_inventory::{Inventory, Sources};
use erdma_model::DriverMode;
use metadata::{HttpMetadata, InstanceMetadata};
use std::process::ExitCode;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

fn init_logs(json: bool) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        b.json().init();
    } else {
        b.init();
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    let settings = match Settings::resolve(flags) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("erdma-agent: {e:#}");
            return ExitCode::from(2);
        }
    };
    init_logs(settings.json_logs);
    match run(settings).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(s: Settings) -> anyhow::Result<()> {
    let cancel = CancellationToken::new();
    spawn_signal_handler(cancel.clone())?;
    match s.prefer_driver {
        DriverMode::None => tracing::info!(
            "--prefer-driver none: serving devices as found, never touching the driver"
        ),
        other => {
            tracing::info!(mode = %other, "driver mode is handled by the driver manager; this build serves devices as found")
        }
    }
    if s.jumbo_frame_mtu != 8500 {
        tracing::info!(
            mtu = s.jumbo_frame_mtu,
            "--jumbo-frame-mtu accepted (applied by the ERI netdev setup)"
        );
    }
    let mut allocate_all = s.allocate_all_devices;
    let instance_id = if s.exposed_local_eris.is_empty() {
        s.instance_id.clone().unwrap_or_default()
    } else {
        if s.local_eri_discovery && !allocate_all {
            // Kept from the original agent: a local allow-list implies all-devices mode.
            tracing::info!(
                "--exposed-local-eris with --local-eri-discovery: every container gets every exposed device"
            );
            allocate_all = true;
        }
        match &s.instance_id {
            Some(id) => id.clone(),
            None => HttpMetadata::default()
                .instance_id()
                .await
                .map_err(|e| anyhow::anyhow!("--exposed-local-eris needs the instance ID: {e}"))?,
        }
    };
    let sources = Sources {
        sysfs: Arc::new(RootedSysfs::new(&s.sysfs_root)),
        devfs: Arc::new(RootedDevFs::new(&s.dev_root)),
        addrs: Arc::new(LiveInterfaceAddrs),
    };
    let inventory = Inventory::new(sources);
    let filter = DeviceFilter {
        drivers: s.rdma_drivers.clone(),
        selector: s.exposed_local_eris.clone(),
        instance_id,
    };
    let (raw, served) = {
        let (inv, f) = (inventory.clone(), filter.clone());
        tokio::task::spawn_blocking(move || devices::initial(&inv, &f))
            .await
            .context("initial inventory scan")?
    };
    tracing::info!(
        devices = ?served.devices.iter().map(|d| (&d.name, d.health.is_healthy())).collect::<Vec<_>>(),
        drivers = ?s.rdma_drivers,
        "initial inventory"
    );
    let (tx, rx) = tokio::sync::watch::channel(served);
    let wake = Arc::new(tokio::sync::Notify::new());
    devices::watch_links(wake.clone(), cancel.clone());
    let _dev_watcher = devices::watch_dev(&s.dev_root, wake.clone());
    let owner = tokio::spawn(devices::run(
        inventory,
        filter,
        raw,
        tx,
        s.poll_interval,
        wake,
        cancel.clone(),
    ));

    let metrics = Arc::new(Metrics::new());
    let metrics_task = match s.metrics_addr {
        MetricsAddr::Off => None,
        MetricsAddr::On(addr) => Some(tokio::spawn(serve_metrics(
            addr,
            metrics.clone(),
            cancel.clone(),
        ))),
    };

    let mut cfg = PluginConfig::new(&s.kubelet_dir);
    cfg.resource_name = s.resource_name.clone();
    cfg.slots_per_device = s.slots_per_device;
    cfg.allocate_all_devices = allocate_all;
    cfg.pre_start_required = s.prestart_container;
    cfg.pod_resources_socket = s.pod_resources_socket.clone();
    cfg.cdi = s.cdi_spec_dir.clone().map(|spec_dir| CdiConfig {
        spec_dir,
        kind: "aliyun.com/erdma".into(),
    });
    let plugin = Plugin::new(cfg, rx, metrics).run(cancel.clone()).await;
    cancel.cancel();
    let _ = owner.await;
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    plugin.context("device plugin")?;
    tracing::info!("erdma-agent stopped");
    Ok(())
}

/// Serves /metrics and /healthz; a busy or forbidden address is logged and retried every 10 s,
/// never a reason to stop serving devices.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                tracing::info!(%addr, "serving /metrics and /healthz");
                if let Err(e) =
                    erdma_deviceplugin::metrics::serve_on(listener, metrics.clone(), cancel.clone())
                        .await
                {
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

fn spawn_signal_handler(cancel: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            _ = cancel.cancelled() => return,
        }
        cancel.cancel();
    });
    Ok(())
}
