//! Where the served ERIs come from: local discovery, or this node's `ERdmaDevice` (matched to
//! local devices by MAC); and the ECS instance ID for the `exposedLocalERIs` allow-list, retried
//! in the background until the metadata service answers.

use crate::cluster::{self, Cluster};
use erdma_cloud::imds::ImdsClient;
use erdma_k8s::agent::{NodeEris, report_device_problems, watch_node_eris};
use erdma_model::Backoff;
use erdma_model::NodeDevices;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The metadata path of the instance ID.
pub const INSTANCE_ID_PATH: &str = "/latest/meta-data/instance-id";

/// The ERIs this node may serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EriSource {
    /// `--local-eri-discovery`: every device the selection keeps.
    Local,
    /// This node's `ERdmaDevice`: only its ERIs found locally.
    Cluster(ClusterEris),
    /// Not known yet (no ERdmaDevice, no cluster): nothing is served; the text says why.
    Waiting(String),
}

impl EriSource {
    /// Short description for `/healthz`.
    pub fn describe(&self) -> String {
        match self {
            EriSource::Local => "local discovery (--local-eri-discovery)".into(),
            EriSource::Cluster(c) => format!(
                "ERdmaDevice {}: {} matched, {} missing",
                c.object,
                c.matched.len(),
                c.missing.len()
            ),
            EriSource::Waiting(why) => format!("waiting: {why}"),
        }
    }
}

/// The matched ERIs of this node's `ERdmaDevice`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterEris {
    /// The object's name.
    pub object: String,
    /// Local ibdev name → whether it is the primary ENI.
    pub matched: BTreeMap<String, bool>,
    /// ERIs without a local device: `(eni id, message)`.
    pub missing: Vec<(String, String)>,
    /// Jumbo frames requested.
    pub jumbo_frame: bool,
}

/// `(netdev MAC, ibdev)` pairs of the inventory.
pub fn local_pairs(raw: &NodeDevices) -> Vec<(String, String)> {
    raw.devices
        .iter()
        .filter_map(|d| {
            let mac = d.netdev.as_ref()?.mac?;
            Some((mac.to_string(), d.name.clone()))
        })
        .collect()
}

/// Matches the object's ERIs against the inventory.
pub fn match_eris(eris: &NodeEris, raw: &NodeDevices) -> ClusterEris {
    let m = eris.match_local(&local_pairs(raw));
    ClusterEris {
        object: eris.object_name.clone(),
        matched: m
            .matched
            .iter()
            .map(|(info, name)| (name.clone(), info.is_primary_eni))
            .collect(),
        missing: m.missing,
        jumbo_frame: eris.jumbo_frame,
    }
}

/// The message naming the fix when the ERdmaDevice cannot be read.
pub fn no_cluster_message(detail: &str) -> String {
    format!(
        "no Kubernetes API to read this node's ERdmaDevice ({detail}); fix: run in-cluster with NODE_NAME set (or pass --kubeconfig), or pass --local-eri-discovery to serve local devices"
    )
}

/// How the ERdmaDevice is followed.
#[derive(Debug, Clone)]
pub struct ClusterSourceConfig {
    /// Node name (`NODE_NAME`), for retried connection attempts.
    pub node_name: Option<String>,
    /// `--kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `--request-timeout`: the deadline of API requests that are not watches.
    pub request_timeout: Option<Duration>,
    /// How long after a failed status report it is tried again (10 s); the object itself is
    /// watched, not polled.
    pub report_retry: Duration,
    /// Period of connection retries without a cluster.
    pub retry: Duration,
    /// The status report waits for the urgent part of the start (the kubelet having the
    /// devices); serving the match does not.
    pub report_after: crate::tasks::StartedUp,
}

/// Follows this node's `ERdmaDevice` until `cancel` fires: without a cluster, logs the fix and
/// retries; with one, waits for the object (all ERIs Ready), matches it to the inventory on every
/// change of either, publishes the result, and reports ERIs without a local device in the
/// object's status (cleared again when found) once `cfg.report_after` is set.
pub async fn follow_cluster(
    mut cluster: Option<Cluster>,
    cfg: ClusterSourceConfig,
    mut raw_rx: watch::Receiver<NodeDevices>,
    tx: watch::Sender<EriSource>,
    cancel: CancellationToken,
) {
    let publish = |s: EriSource| {
        tx.send_if_modified(|cur| {
            if *cur == s {
                return false;
            }
            *cur = s;
            true
        });
    };
    let cluster = loop {
        if let Some(c) = cluster.take() {
            break c;
        }
        let detect = cluster::detect(
            cfg.node_name.as_deref(),
            cfg.kubeconfig.as_deref(),
            cfg.request_timeout,
        );
        let detected = tokio::select! {
            _ = cancel.cancelled() => return,
            r = detect => r,
        };
        let why = match detected {
            Ok(Some(c)) => {
                cluster = Some(c);
                continue;
            }
            Ok(None) => "NODE_NAME is not set".to_string(),
            Err(e) => e,
        };
        let msg = no_cluster_message(&why);
        tracing::error!(retry_in = ?cfg.retry, "{msg}; serving no devices");
        publish(EriSource::Waiting(msg));
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(cfg.retry) => {}
        }
    };
    let node = cluster.node.clone();
    let waiting = EriSource::Waiting(format!(
        "waiting for the Ready ERdmaDevice of node {node} (created by erdma-controller)"
    ));
    publish(waiting.clone());
    let changes = watch_node_eris(&cluster.client, &node);
    tokio::pin!(changes);
    // The object in use: set once every ERI is Ready, then followed as it changes.
    let mut eris: Option<NodeEris> = None;
    let mut reported: Option<Vec<(String, String)>> = None;
    // A failed status report is retried after this long, or earlier on any change.
    let mut report_retry: Option<tokio::time::Instant> = None;
    let mut may_report = false;
    loop {
        if let Some(current) = &eris {
            let matched = {
                let raw = raw_rx.borrow_and_update();
                match_eris(current, &raw)
            };
            let missing = matched.missing.clone();
            // Served first: the status report is for people reading the ERdmaDevice, and its
            // read and write of the object wait on the API server (at start, the kubelet would
            // wait for them).
            publish(EriSource::Cluster(matched));
            if may_report && reported.as_ref() != Some(&missing) {
                for (id, why) in &missing {
                    tracing::warn!(eri = %id, "{why}");
                }
                let report =
                    report_device_problems(&cluster.client, &current.object_name, &missing);
                let reported_now = tokio::select! {
                    _ = cancel.cancelled() => return,
                    r = report => r,
                };
                match reported_now {
                    Ok(()) => {
                        reported = Some(missing);
                        report_retry = None;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?cfg.report_retry, "reporting ERI problems failed");
                        report_retry = Some(tokio::time::Instant::now() + cfg.report_retry);
                    }
                }
            }
        }
        let retry = async {
            match report_retry {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = cfg.report_after.wait(), if !may_report => may_report = true,
            r = raw_rx.changed() => if r.is_err() { return },
            _ = retry => report_retry = None,
            change = changes.next() => match change {
                None => return,
                Some(Ok(Some(e))) => match &eris {
                    Some(cur) => {
                        if e.devices != cur.devices || e.jumbo_frame != cur.jumbo_frame {
                            tracing::info!(object = %e.object_name, "ERdmaDevice changed");
                        }
                        eris = Some(e);
                    }
                    None if e.all_ready() => {
                        tracing::info!(object = %e.object_name, eris = e.devices.len(), "ERdmaDevice found");
                        eris = Some(e);
                    }
                    None => tracing::info!(node = %node, object = %e.object_name, "waiting for the ERIs to become Ready"),
                },
                Some(Ok(None)) => {
                    if eris.take().is_some() {
                        tracing::warn!(node = %node, "the ERdmaDevice of this node is gone; serving nothing until it is back");
                        reported = None;
                        publish(waiting.clone());
                    } else {
                        tracing::info!(node = %node, "waiting for the controller to create this node's ERdmaDevice");
                    }
                }
                Some(Err(e @ erdma_k8s::Error::Invalid(_))) => {
                    tracing::warn!(node = %node, error = %e, "cannot use the ERdmaDevices; keeping the last one")
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "watching the ERdmaDevice failed (retried with back-off); keeping the last one")
                }
            },
        }
    }
}

/// Asks the metadata service for the instance ID until it answers (backoff from `initial`
/// doubling to 60 s), then publishes it on `tx`; why it is not known yet goes to `errors`.
/// Never gives up; the agent serves only `i-*` allow-list entries meanwhile.
pub async fn fetch_instance_id(
    metadata: ImdsClient,
    tx: watch::Sender<Option<String>>,
    errors: watch::Sender<Option<String>>,
    initial: Duration,
    cancel: CancellationToken,
) {
    let mut backoff = Backoff::new(initial, Duration::from_secs(60));
    loop {
        let got = tokio::select! {
            _ = cancel.cancelled() => return,
            r = metadata.get(INSTANCE_ID_PATH) => r,
        };
        let err = match got {
            Ok(body) if erdma_model::names::is_instance_id(body.trim()) => {
                let id = body.trim().to_string();
                tracing::info!(instance_id = %id, "instance ID from the metadata service; applying --exposed-local-eris");
                errors.send_replace(None);
                tx.send_replace(Some(id));
                return;
            }
            Ok(body) => format!(
                "the metadata service answered {INSTANCE_ID_PATH} with {:?}, not an ECS instance ID",
                body.chars().take(64).collect::<String>()
            ),
            Err(e) => e.to_string(),
        };
        let delay = backoff.next_delay();
        let msg = format!(
            "--exposed-local-eris needs the instance ID: {err}; serving only i-* entries until it is known (retry in {delay:?}; pass --instance-id to skip the metadata service)"
        );
        tracing::warn!("{msg}");
        errors.send_replace(Some(msg));
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// The metadata service client of `--metadata-endpoint`.
pub fn metadata(s: &crate::cli::Settings) -> anyhow::Result<ImdsClient> {
    use anyhow::Context;
    ImdsClient::new(&s.metadata_endpoint)
        .with_context(|| format!("metadata endpoint {}", s.metadata_endpoint))
}

/// The instance ID for `--exposed-local-eris`: the flag's, or asked of the metadata service
/// when the plan says so; `/healthz` gets it and why it is not known yet.
pub fn start_instance_id(
    shared: crate::tasks::Shared<'_>,
    id_view: &mut watch::Receiver<Option<String>>,
    id_error_view: &mut watch::Receiver<Option<String>>,
    tasks: &mut crate::tasks::Tasks,
) -> anyhow::Result<watch::Receiver<Option<String>>> {
    let (plan, s) = (shared.plan, shared.settings);
    let (id_tx, id_rx) = watch::channel(s.instance_id.clone());
    let (err_tx, err_rx) = watch::channel(None);
    (*id_view, *id_error_view) = (id_rx.clone(), err_rx);
    if plan.fetch_instance_id {
        let cancel = tasks.cancel.clone();
        let fetch = fetch_instance_id(metadata(s)?, id_tx, err_tx, Duration::from_secs(1), cancel);
        tasks.spawn("asking the metadata service for the instance ID", fetch);
    }
    Ok(id_rx)
}

/// The ERI source of the plan: the local devices, or this node's ERdmaDevice followed in the
/// cluster; `/healthz` gets it.
pub fn start(
    shared: crate::tasks::Shared<'_>,
    raw_rx: &watch::Receiver<NodeDevices>,
    view: &mut watch::Receiver<EriSource>,
    tasks: &mut crate::tasks::Tasks,
) -> watch::Receiver<EriSource> {
    let s = shared.settings;
    let rx = match shared.plan.eri_source {
        crate::plan::EriSourcePlan::Local => {
            let (tx, rx) = watch::channel(EriSource::Local);
            tasks.keep(tx);
            rx
        }
        crate::plan::EriSourcePlan::Cluster => {
            let (tx, rx) = watch::channel(EriSource::Waiting(
                "looking for this node's ERdmaDevice".into(),
            ));
            let cfg = ClusterSourceConfig {
                node_name: s.node_name.clone(),
                kubeconfig: s.kubeconfig.clone(),
                request_timeout: s.request_timeout,
                report_retry: Duration::from_secs(10),
                retry: Duration::from_secs(30),
                report_after: tasks.started_up.clone(),
            };
            let follow = follow_cluster(
                shared.cluster.clone(),
                cfg,
                raw_rx.clone(),
                tx,
                tasks.cancel.clone(),
            );
            tasks.spawn("following this node's ERdmaDevice", follow);
            rx
        }
    };
    *view = rx.clone();
    rx
}
