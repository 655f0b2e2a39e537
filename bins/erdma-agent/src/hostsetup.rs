//! Host setup for the served devices once the driver is ready: ERI netdevs (link, MTU, address,
//! routes; never the primary interface) and the SMC-R pnet table (best effort).

use crate::source::EriSource;
use erdma_model::{Backoff, DeviceKind, DeviceMode, NodeDevices, PnetId};
use erdma_netdev::{EriNetdev, Metadata, NetdevError, RouteNetlink};
use prometheus_client::metrics::gauge::Gauge;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The interface treated as primary when no ERdmaDevice says otherwise.
pub const PRIMARY_IFNAME: &str = "eth0";

/// The ERI netdevs of the served devices: eRDMA devices with a paired netdev and MAC. `primary`
/// is set for `eth0` and for the ERdmaDevice's isPrimaryENI (set up never touches those).
pub fn eri_netdevs(served: &NodeDevices, source: &EriSource) -> Vec<EriNetdev> {
    let (jumbo, cr) = match source {
        EriSource::Cluster(c) => (c.jumbo_frame, Some(c)),
        _ => (false, None),
    };
    served
        .devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Erdma)
        .filter_map(|d| {
            let n = d.netdev.as_ref()?;
            let mac = n.mac?;
            let primary = n.name == PRIMARY_IFNAME
                || cr.is_some_and(|c| c.matched.get(&d.name).copied().unwrap_or(false));
            Some(EriNetdev {
                ifname: n.name.clone(),
                mac,
                primary,
                jumbo_frame: jumbo,
            })
        })
        .collect()
}

/// `(PNET ID, ibdev, port 1)` of the served devices whose mode supports SMC-R: eRDMA in default
/// (iWARP) or compat (RoCE) mode, and RoCE devices.
pub fn smc_ports(served: &NodeDevices) -> Vec<(PnetId, String, u8)> {
    served
        .devices
        .iter()
        .filter(|d| {
            matches!(
                (&d.kind, d.mode),
                (
                    DeviceKind::Erdma,
                    Some(DeviceMode::Iwarp | DeviceMode::Roce)
                ) | (_, Some(DeviceMode::Roce))
            )
        })
        .filter_map(|d| Some((d.pnet_id.clone()?, d.name.clone(), 1u8)))
        .collect()
}

/// Sets up the ERI netdevs whenever the set changes (served snapshot and ERI source), retrying
/// failures with backoff (5 s doubling to 5 min), until `cancel` fires. Per-ERI results go to
/// the logs and `/healthz`. `connect` opens the rtnetlink connection ([`RouteNetlink::connect`]
/// in the agent; a test namespace in tests).
pub async fn run_netdev<M: Metadata>(
    connect: impl Fn() -> Result<RouteNetlink, NetdevError>,
    metadata: M,
    mut served: watch::Receiver<NodeDevices>,
    mut source: watch::Receiver<EriSource>,
    jumbo_frame_mtu: u32,
    out: NetdevReport,
    cancel: CancellationToken,
) {
    let mut done: Option<Vec<EriNetdev>> = None;
    let mut backoff = Backoff::new(Duration::from_secs(5), Duration::from_secs(300));
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut nl: Option<RouteNetlink> = None;
    loop {
        let eris = {
            let s = served.borrow_and_update();
            let src = source.borrow_and_update();
            eri_netdevs(&s, &src)
        };
        let due = retry_at.is_some_and(|t| t <= tokio::time::Instant::now());
        if done.as_ref() != Some(&eris) || due {
            if done.as_ref() != Some(&eris) {
                backoff.reset();
            }
            let mut failures = 0i64;
            let mut report = BTreeMap::new();
            if nl.is_none() {
                match connect() {
                    Ok(c) => nl = Some(c),
                    Err(e) => {
                        tracing::warn!("ERI netdev setup: {e}");
                        for eri in eris.iter().filter(|e| !e.primary) {
                            report.insert(eri.ifname.clone(), e.to_string());
                            failures += 1;
                        }
                    }
                }
            }
            if let Some(c) = &nl {
                for (ifname, r) in c
                    .ensure_eris(&metadata, &eris, i64::from(jumbo_frame_mtu))
                    .await
                {
                    let text = match r {
                        Ok(s) if s.skipped_primary => "primary (untouched)".to_string(),
                        Ok(s) => {
                            if !s.changes.is_empty() {
                                tracing::info!(ifname = %ifname, changes = s.changes.len(), "ERI netdev set up");
                            }
                            "ok".to_string()
                        }
                        Err(e) => {
                            failures += 1;
                            e.to_string()
                        }
                    };
                    report.insert(ifname, text);
                }
            }
            out.failures.set(failures);
            out.report.send_replace(report);
            done = Some(eris);
            retry_at = if failures > 0 {
                let delay = backoff.next_delay();
                tracing::warn!(failures, retry_in = ?delay, "ERI netdev setup incomplete; retrying");
                Some(tokio::time::Instant::now() + delay)
            } else {
                None
            };
        }
        let wait = async {
            match retry_at {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = served.changed() => if r.is_err() { return },
            r = source.changed() => if r.is_err() { return },
            _ = wait => {}
        }
    }
}

/// Where ERI netdev setup reports: the failure gauge, and the per-interface result for
/// `/healthz` (`ok`, `primary (untouched)`, or the error).
pub struct NetdevReport {
    /// ERI netdevs whose setup failed in the last run.
    pub failures: Gauge,
    /// The per-interface result.
    pub report: watch::Sender<BTreeMap<String, String>>,
}

/// Maps the served devices' PNET IDs in the host's SMC-R pnet table whenever that set changes,
/// until `cancel` fires. Best effort: problems (SMC unavailable, conflicts) are warnings.
pub async fn run_smc_pnet(
    mut served: watch::Receiver<NodeDevices>,
    warnings: watch::Sender<Vec<String>>,
    cancel: CancellationToken,
) {
    let mut done: Option<Vec<(PnetId, String, u8)>> = None;
    loop {
        let ports = smc_ports(&served.borrow_and_update());
        if done.as_ref() != Some(&ports) {
            if !ports.is_empty() {
                let wanted = ports.clone();
                match tokio::task::spawn_blocking(move || erdma_smc::pnet::ensure_ib_ports(&wanted))
                    .await
                {
                    Ok(report) => {
                        if !report.warnings.is_empty() {
                            tracing::warn!(warnings = ?report.warnings, "SMC-R pnet setup incomplete: SMC-R may be unavailable on this host (load the smc module); RDMA devices are served anyway");
                        } else {
                            tracing::info!(added = ?report.added, unchanged = report.unchanged.len(), "SMC-R pnet table set");
                        }
                        warnings.send_replace(report.warnings);
                    }
                    Err(e) => tracing::warn!("SMC-R pnet setup task failed: {e}"),
                }
            }
            done = Some(ports);
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = served.changed() => if r.is_err() { return },
        }
    }
}

/// The host setup of the plan: ERI netdevs (never the primary interface) and the SMC-R pnet
/// table, each following the served devices; `/healthz` gets their reports.
pub fn start(
    shared: crate::tasks::Shared<'_>,
    served: &watch::Receiver<NodeDevices>,
    source: &watch::Receiver<EriSource>,
    netdev_view: &mut watch::Receiver<std::collections::BTreeMap<String, String>>,
    pnet_view: &mut watch::Receiver<Vec<String>>,
    tasks: &mut crate::tasks::Tasks,
) -> anyhow::Result<()> {
    let (plan, s) = (shared.plan, shared.settings);
    if plan.netdev {
        tracing::info!(
            mtu = s.jumbo_frame_mtu,
            "ERI netdev setup enabled (never touches the primary interface)"
        );
        let (tx, rx) = watch::channel(Default::default());
        *netdev_view = rx;
        let report = NetdevReport {
            failures: shared.metrics.netdev_setup_failures.clone(),
            report: tx,
        };
        let setup = run_netdev(
            RouteNetlink::connect,
            crate::source::metadata(s)?,
            served.clone(),
            source.clone(),
            s.jumbo_frame_mtu,
            report,
            tasks.cancel.clone(),
        );
        tasks.spawn("ERI netdev setup", setup);
    } else {
        tracing::info!("ERI netdev setup disabled (--setup-eri-netdev)");
    }
    if plan.smc_pnet {
        let (tx, rx) = watch::channel(Vec::new());
        *pnet_view = rx;
        let setup = run_smc_pnet(served.clone(), tx, tasks.cancel.clone());
        tasks.spawn("SMC pnet setup", setup);
    }
    Ok(())
}
