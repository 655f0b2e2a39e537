//! `erdmactl top pods|devices`: per-pod RDMA objects and per-device traffic, read from the
//! agents' `GET /usage` (like `kubectl top`), through the API server's pod proxy
//! (`/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/usage`, no network path to the nodes
//! needed) or from one agent directly (`--agent-addr`).

use crate::exit;
use crate::output::{self, Format};
use crate::submit::{KubeArgs, kube_client, kube_client_with_retry, runtime};
use erdma_usage::report::{DeviceReport, NodeUsage, PodReport, TrafficKind};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde::Serialize;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The agent's metrics port when its pod names none (`--metrics-addr`'s default).
pub const DEFAULT_AGENT_PORT: u16 = 9101;

/// `erdmactl top`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to show.
    #[command(subcommand)]
    pub what: What,
}

/// Subcommands of `top`.
#[derive(Debug, clap::Subcommand)]
pub enum What {
    /// Per pod and device: QPs (RTS/total), bytes of memory registered (pinned), CQs, PDs.
    #[command(after_help = exit::TOP)]
    Pods(TopArgs),
    /// Per node and device: the pods holding it, whose its traffic is, bytes per second sent and
    /// received (two samples --interval apart).
    #[command(after_help = exit::TOP)]
    Devices(TopArgs),
}

/// Columns to sort by (`--sort-by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SortBy {
    /// Namespace, pod, node, device (pods); node, device (devices). The default.
    Name,
    /// QPs, most first (pods).
    Qps,
    /// Bytes registered, most first (pods).
    MrBytes,
    /// CQs, most first (pods).
    Cqs,
    /// PDs, most first (pods).
    Pds,
    /// Bytes sent per second, most first (devices).
    Tx,
    /// Bytes received per second, most first (devices).
    Rx,
}

/// Flags of `top pods` and `top devices`.
#[derive(Debug, Clone, clap::Args)]
pub struct TopArgs {
    /// Only this node's agent.
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// Read one agent directly at HOST:PORT (its metrics address, default port 9101) instead of
    /// through the API server; no kubeconfig is read.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "node")]
    pub agent_addr: Option<String>,
    /// Only pods of this namespace (default: the kubeconfig context's; with --agent-addr, all).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Pods of every namespace.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    pub all_namespaces: bool,
    /// Sort rows by this column (numbers: most first).
    #[arg(long, value_enum, default_value = "name")]
    pub sort_by: SortBy,
    /// Output format (json/yaml: raw counters and bytes; rates per second).
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Format,
    /// Print again every --interval (rates from consecutive samples); the screen is cleared
    /// first on a terminal, a pipe gets one block per sample.
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Time between samples (500ms, 1s, 2m).
    #[arg(long, default_value = "1s", value_parser = interval, value_name = "DURATION")]
    pub interval: Duration,
    /// With --watch: stop after this many blocks.
    #[arg(long, value_name = "N", requires = "watch")]
    pub count: Option<u64>,
    /// Label selector of the agent pods (default: recognised by the erdma-agent DaemonSet or image).
    #[arg(long, value_name = "SELECTOR")]
    pub agent_selector: Option<String>,
    /// The agents' metrics port (default: the agent container's port named `metrics`, else 9101).
    #[arg(long, value_name = "PORT")]
    pub agent_port: Option<u16>,
    /// Kubernetes API access.
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// `--interval`: a positive duration in ms, s or m (a bare number is seconds).
fn interval(s: &str) -> Result<Duration, String> {
    let err = || format!("'{s}' is not a valid interval: use e.g. 500ms, 1s, 2m");
    let (num, factor) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num.parse().map_err(|_| err())?;
    let d = Duration::try_from_secs_f64(v * factor).map_err(|_| err())?;
    if d < Duration::from_millis(1) {
        return Err(format!("'{s}' is too short: at least 1ms"));
    }
    Ok(d)
}

/// How an agent is reached.
#[derive(Debug, Clone)]
enum Via {
    /// Directly at this address.
    Direct(String),
    /// Through the API server's pod proxy.
    Proxy {
        namespace: String,
        pod: String,
        port: u16,
    },
}

/// One agent to read.
#[derive(Debug, Clone)]
struct Target {
    /// The node (the address with --agent-addr until the agent names its node).
    node: String,
    via: Via,
}

/// A node that could not be read, and why.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Unreachable {
    /// The node.
    pub node: String,
    /// The agent (`namespace/pod`, or the address).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Why.
    pub reason: String,
}

/// One round of reads.
#[derive(Debug, Default)]
struct Sample {
    nodes: Vec<NodeUsage>,
    unreachable: Vec<Unreachable>,
    /// When the round ended (the interval when agents give no collection time).
    at: Option<Instant>,
}

/// The agent's metrics port: its container port named `metrics`, else [`DEFAULT_AGENT_PORT`].
pub fn agent_port(pod: &Pod) -> u16 {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("metrics"))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .unwrap_or(DEFAULT_AGENT_PORT)
}

/// An agent's `/usage`, parsed; an agent that cannot read usage (`available: false`) is an
/// error naming its reason.
fn parse_usage(body: &str) -> Result<NodeUsage, String> {
    let u: NodeUsage = serde_json::from_str(body.trim()).map_err(|e| {
        format!(
            "the answer to /usage is not the agent's usage JSON ({e}); is the agent older than /usage, or another service on this port?"
        )
    })?;
    if !u.available {
        return Err(format!(
            "{CANNOT_READ}: {}",
            u.error.as_deref().unwrap_or("no reason given")
        ));
    }
    Ok(u)
}

/// GET `/usage` of the agent at `addr` (plain HTTP/1.0), within `timeout`.
pub async fn usage_direct(addr: &str, timeout: Duration) -> Result<NodeUsage, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        s.write_all(format!("GET /usage HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .map_err(|e| format!("send to {addr}: {e}"))?;
        let mut raw = Vec::new();
        (&mut s)
            .take(64 << 20)
            .read_to_end(&mut raw)
            .await
            .map_err(|e| format!("read from {addr}: {e}"))?;
        Ok::<_, String>(raw)
    };
    let raw = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("{addr} did not answer within {timeout:?}"))??;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr}: not an HTTP response"))?;
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("{addr}: not an HTTP response"))?;
    if code != 200 {
        // The agent answers 503 with its usage JSON when it cannot read usage: its reason.
        if let Err(why) = parse_usage(body)
            && why.starts_with(CANNOT_READ)
        {
            return Err(why);
        }
        return Err(format!(
            "the agent answered HTTP {code} to /usage: {}",
            first_line(body)
        ));
    }
    parse_usage(body)
}

fn first_line(s: &str) -> &str {
    s.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
}

/// The start of the error of an agent that cannot read usage.
const CANNOT_READ: &str = "the agent cannot read RDMA usage";

/// GET `/usage` of agent pod `namespace/pod` on `port` through the API server's pod proxy.
/// `client` should not retry 503s (see [`crate::submit::kube_client_with_retry`]): the agent
/// answers 503 with its usage JSON when it cannot read usage.
pub async fn usage_proxy(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    port: u16,
) -> Result<NodeUsage, String> {
    let path = format!("/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/usage");
    let req = hyper::Request::get(&path)
        .body(kube::client::Body::from(Vec::new()))
        .map_err(|e| e.to_string())?;
    let res = client.send(req).await.map_err(|e| e.to_string())?;
    let code = res.status().as_u16();
    let body = res
        .into_body()
        .collect_bytes()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?;
    let body = String::from_utf8_lossy(&body);
    if code == 200 {
        return parse_usage(&body);
    }
    if let Err(why) = parse_usage(&body)
        && why.starts_with(CANNOT_READ)
    {
        return Err(why);
    }
    let status = serde_json::from_str::<serde_json::Value>(body.trim())
        .ok()
        .filter(|v| v["kind"] == "Status");
    let message = status
        .as_ref()
        .and_then(|v| v["message"].as_str())
        .unwrap_or_else(|| first_line(&body))
        .to_string();
    if code == 403 && status.is_some() {
        return Err(format!(
            "the API server refused the pod proxy ({message}): allow get on pods/proxy to your user"
        ));
    }
    Err(format!(
        "the API server's pod proxy answered {code}: {message}"
    ))
}

fn is_running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The agent pods to read: `node`'s, or every node's; nodes whose agent is not running are
/// unreachable.
async fn targets(
    client: &kube::Client,
    args: &TopArgs,
) -> anyhow::Result<(Vec<Target>, Vec<Unreachable>)> {
    let pods: Vec<Pod> = match &args.node {
        Some(n) => erdma_doctor::cluster::agent_pods(client, n, args.agent_selector.as_deref())
            .await
            .map_err(anyhow::Error::from)?,
        None => {
            let mut lp = ListParams::default();
            if let Some(s) = &args.agent_selector {
                lp = lp.labels(s);
            }
            let listed = Api::<Pod>::all(client.clone()).list(&lp).await.map_err(|e| {
                anyhow::anyhow!(
                    "listing the agent pods failed: {e} (check your kubeconfig, --context and RBAC: top needs list on pods and get on pods/proxy)"
                )
            })?;
            listed
                .items
                .into_iter()
                .filter(|p| args.agent_selector.is_some() || erdma_doctor::node::is_agent_pod(p))
                .collect()
        }
    };
    let mut by_node: std::collections::BTreeMap<String, Vec<Pod>> = Default::default();
    for p in pods {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        // The field selector names the node already; a server that ignored it does no harm.
        if !node.is_empty() && args.node.as_ref().is_none_or(|n| *n == node) {
            by_node.entry(node).or_default().push(p);
        }
    }
    let (mut out, mut unreachable) = (Vec::new(), Vec::new());
    if let Some(n) = &args.node
        && !by_node.contains_key(n)
    {
        unreachable.push(Unreachable {
            node: n.clone(),
            agent: None,
            reason: "no erdma agent pod runs on this node (kubectl get pods -A -o wide | grep erdma-agent; --agent-selector if its pods are labelled otherwise)".into(),
        });
    }
    for (node, pods) in by_node {
        let name = |p: &Pod| {
            format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or("default"),
                p.metadata.name.as_deref().unwrap_or_default()
            )
        };
        match pods.iter().find(|p| is_running(p)) {
            Some(p) => out.push(Target {
                node,
                via: Via::Proxy {
                    namespace: p
                        .metadata
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".into()),
                    pod: p.metadata.name.clone().unwrap_or_default(),
                    port: args.agent_port.unwrap_or_else(|| agent_port(p)),
                },
            }),
            None => {
                let p = &pods[0];
                let phase = p
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_else(|| "Unknown".into());
                unreachable.push(Unreachable {
                    node,
                    agent: Some(name(p)),
                    reason: format!("the agent pod is {phase}, not Running"),
                });
            }
        }
    }
    Ok((out, unreachable))
}

/// Reads every target once, in parallel.
async fn sample(
    client: Option<&kube::Client>,
    targets: &[Target],
    not_found: &[Unreachable],
    timeout: Duration,
) -> Sample {
    let mut set = tokio::task::JoinSet::new();
    for (i, t) in targets.iter().cloned().enumerate() {
        let client = client.cloned();
        set.spawn(async move {
            let r = match (&t.via, client) {
                (Via::Direct(addr), _) => usage_direct(addr, timeout).await,
                (
                    Via::Proxy {
                        namespace,
                        pod,
                        port,
                    },
                    Some(c),
                ) => usage_proxy(&c, namespace, pod, *port).await,
                (Via::Proxy { .. }, None) => Err("no API client".into()),
            };
            (i, t, r)
        });
    }
    let mut answers = Vec::new();
    while let Some(joined) = set.join_next().await {
        if let Ok(a) = joined {
            answers.push(a);
        }
    }
    answers.sort_by_key(|(i, _, _)| *i);
    let mut s = Sample {
        unreachable: not_found.to_vec(),
        ..Default::default()
    };
    for (_, t, r) in answers {
        let agent = match &t.via {
            Via::Direct(a) => a.clone(),
            Via::Proxy { namespace, pod, .. } => format!("{namespace}/{pod}"),
        };
        match r {
            Ok(mut u) => {
                if u.node.is_none() || matches!(t.via, Via::Proxy { .. }) {
                    u.node = Some(t.node.clone());
                }
                s.nodes.push(u);
            }
            Err(reason) => s.unreachable.push(Unreachable {
                node: t.node.clone(),
                agent: Some(agent),
                reason,
            }),
        }
    }
    s.nodes.sort_by(|a, b| a.node.cmp(&b.node));
    s.unreachable.sort_by(|a, b| a.node.cmp(&b.node));
    s.at = Some(Instant::now());
    s
}

/// Which pods `top pods` shows.
#[derive(Debug, Clone)]
enum Namespaces {
    All,
    One(String),
}

impl Namespaces {
    fn shows(&self, p: &PodReport) -> bool {
        match self {
            Namespaces::All => true,
            Namespaces::One(ns) => p.namespace.as_deref() == Some(ns.as_str()),
        }
    }
}

/// `top pods -o json|yaml`: each node's usage (its pods filtered to the namespaces asked), and
/// the nodes that could not be read. `nccl compare --usage-a/--usage-b` read it back.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageList {
    /// `UsageList`.
    pub kind: &'static str,
    /// Per node.
    pub items: Vec<NodeUsage>,
    /// Nodes that could not be read.
    pub unreachable: Vec<Unreachable>,
}

/// One row of `top pods`.
struct PodRow<'a> {
    node: &'a str,
    pod: &'a PodReport,
    device: Option<&'a erdma_usage::report::PodDeviceReport>,
}

fn rts(d: &erdma_usage::report::PodDeviceReport) -> u64 {
    d.counts.qps_by_state.get("RTS").copied().unwrap_or(0)
}

fn pod_rows<'a>(nodes: &'a [NodeUsage], sort: SortBy) -> Vec<PodRow<'a>> {
    let mut rows = Vec::new();
    for n in nodes {
        let node = n.node.as_deref().unwrap_or("");
        for p in &n.pods {
            if p.devices.is_empty() {
                rows.push(PodRow {
                    node,
                    pod: p,
                    device: None,
                });
            }
            for d in &p.devices {
                rows.push(PodRow {
                    node,
                    pod: p,
                    device: Some(d),
                });
            }
        }
    }
    let num = |r: &PodRow<'_>| -> u64 {
        let Some(d) = r.device else { return 0 };
        match sort {
            SortBy::Qps => d.counts.qps,
            SortBy::MrBytes => d.counts.mr_bytes,
            SortBy::Cqs => d.counts.cqs,
            SortBy::Pds => d.counts.pds,
            _ => 0,
        }
    };
    rows.sort_by(|a, b| {
        num(b).cmp(&num(a)).then_with(|| {
            (
                a.pod.namespace.as_deref(),
                a.pod.name.as_deref().unwrap_or(&a.pod.uid),
                a.node,
                a.device.map(|d| d.device.as_str()),
            )
                .cmp(&(
                    b.pod.namespace.as_deref(),
                    b.pod.name.as_deref().unwrap_or(&b.pod.uid),
                    b.node,
                    b.device.map(|d| d.device.as_str()),
                ))
        })
    });
    rows
}

/// Bytes in binary units (`512B`, `1.5KiB`, `2.0GiB`).
pub fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024.0 {
        return format!("{}B", b.round() as u64);
    }
    let mut v = b / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1}{}", UNITS[i])
}

/// The `top pods` table.
fn pods_table(nodes: &[NodeUsage], sort: SortBy) -> String {
    let rows: Vec<Vec<String>> = pod_rows(nodes, sort)
        .iter()
        .map(|r| {
            let mut row = vec![
                r.pod.namespace.clone().unwrap_or_else(|| "-".into()),
                r.pod.name.clone().unwrap_or_else(|| r.pod.uid.clone()),
                r.node.to_string(),
            ];
            match r.device {
                Some(d) => row.extend([
                    if d.allocated {
                        d.device.clone()
                    } else {
                        format!("{} (not allocated)", d.device)
                    },
                    format!("{}/{}", rts(d), d.counts.qps),
                    human_bytes(d.counts.mr_bytes as f64),
                    d.counts.cqs.to_string(),
                    d.counts.pds.to_string(),
                ]),
                None => row.extend(["-", "0/0", "0B", "0", "0"].map(String::from)),
            }
            row
        })
        .collect();
    if rows.is_empty() {
        return "No pods hold or use an RDMA device.\n".into();
    }
    output::table(
        &[
            "NAMESPACE",
            "POD",
            "NODE",
            "DEVICE",
            "QPS(RTS/TOTAL)",
            "MR-BYTES",
            "CQS",
            "PDS",
        ],
        &rows,
    )
}

/// One row of `top devices -o json|yaml`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRow {
    /// The node.
    pub node: String,
    /// The RDMA device.
    pub device: String,
    /// Pods allocated the device or seen using it.
    pub holders: Vec<String>,
    /// A host process uses it.
    pub host_users: bool,
    /// Whose the traffic is (`pod`, `shared`, `unused`).
    pub traffic: TrafficKind,
    /// The pod whose the traffic is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_pod: Option<String>,
    /// Bytes sent, all ports (absent when the driver counts none).
    pub tx_bytes: Option<u64>,
    /// Bytes received, all ports.
    pub rx_bytes: Option<u64>,
    /// Packets sent, all ports.
    pub tx_packets: Option<u64>,
    /// Packets received, all ports.
    pub rx_packets: Option<u64>,
    /// Bytes sent per second since the previous sample.
    pub tx_bytes_per_second: Option<f64>,
    /// Bytes received per second since the previous sample.
    pub rx_bytes_per_second: Option<f64>,
    /// Packets sent per second since the previous sample.
    pub tx_packets_per_second: Option<f64>,
    /// Packets received per second since the previous sample.
    pub rx_packets_per_second: Option<f64>,
    /// The seconds the rates are over (the agents' collection times apart).
    pub interval_seconds: Option<f64>,
    /// Per port: the raw counters.
    pub ports: Vec<erdma_usage::report::PortReport>,
}

/// `top devices -o json|yaml`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceList {
    /// `DeviceUsageList`.
    pub kind: &'static str,
    /// Per node and device.
    pub items: Vec<DeviceRow>,
    /// Nodes that could not be read.
    pub unreachable: Vec<Unreachable>,
}

fn sum(d: &DeviceReport, f: fn(&erdma_usage::report::PortReport) -> Option<u64>) -> Option<u64> {
    d.ports
        .iter()
        .filter_map(f)
        .fold(None, |acc: Option<u64>, v| {
            Some(acc.unwrap_or(0).saturating_add(v))
        })
}

/// Rates from `prev` to `cur` over `secs`; `None` for a counter missing in either, or reset.
fn rate(prev: Option<u64>, cur: Option<u64>, secs: Option<f64>) -> Option<f64> {
    let (p, c, s) = (prev?, cur?, secs?);
    (c >= p && s > 0.0).then(|| (c - p) as f64 / s)
}

/// The device rows of `cur`, with rates from `prev` (the same node's earlier usage).
pub fn device_rows(
    prev: Option<&[NodeUsage]>,
    cur: &[NodeUsage],
    wall: Option<Duration>,
) -> Vec<DeviceRow> {
    let mut rows = Vec::new();
    for n in cur {
        let node = n.node.clone().unwrap_or_default();
        let before = prev.and_then(|p| p.iter().find(|b| b.node == n.node));
        let secs = before.and_then(|b| {
            let ms = n
                .collected_at_unix_ms
                .saturating_sub(b.collected_at_unix_ms);
            if ms > 0 {
                Some(ms as f64 / 1000.0)
            } else if n.collected_at_unix_ms == 0 {
                wall.map(|w| w.as_secs_f64())
            } else {
                None
            }
        });
        for d in &n.devices {
            let old = before.and_then(|b| b.device(&d.device));
            let pick = |f: fn(&erdma_usage::report::PortReport) -> Option<u64>| {
                (sum(d, f), old.and_then(|o| sum(o, f)))
            };
            let (tx, tx0) = pick(|p| p.tx_bytes);
            let (rx, rx0) = pick(|p| p.rx_bytes);
            let (txp, txp0) = pick(|p| p.tx_packets);
            let (rxp, rxp0) = pick(|p| p.rx_packets);
            rows.push(DeviceRow {
                node: node.clone(),
                device: d.device.clone(),
                holders: d.holders.clone(),
                host_users: d.host_users,
                traffic: d.traffic,
                traffic_pod: d.traffic_pod.clone(),
                tx_bytes: tx,
                rx_bytes: rx,
                tx_packets: txp,
                rx_packets: rxp,
                tx_bytes_per_second: rate(tx0, tx, secs),
                rx_bytes_per_second: rate(rx0, rx, secs),
                tx_packets_per_second: rate(txp0, txp, secs),
                rx_packets_per_second: rate(rxp0, rxp, secs),
                interval_seconds: old.and(secs),
                ports: d.ports.clone(),
            });
        }
    }
    rows
}

fn sort_devices(rows: &mut [DeviceRow], sort: SortBy) {
    let num = |r: &DeviceRow| match sort {
        SortBy::Tx => r.tx_bytes_per_second.unwrap_or(-1.0),
        SortBy::Rx => r.rx_bytes_per_second.unwrap_or(-1.0),
        _ => 0.0,
    };
    rows.sort_by(|a, b| {
        num(b)
            .total_cmp(&num(a))
            .then_with(|| (&a.node, &a.device).cmp(&(&b.node, &b.device)))
    });
}

fn devices_table(rows: &[DeviceRow]) -> String {
    if rows.is_empty() {
        return "No RDMA devices reported.\n".into();
    }
    let per_s = |r: Option<f64>| r.map_or("-".to_string(), |v| format!("{}/s", human_bytes(v)));
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut holders = r.holders.join(",");
            if r.host_users {
                holders = if holders.is_empty() {
                    "(host)".into()
                } else {
                    format!("{holders},(host)")
                };
            }
            if holders.is_empty() {
                holders = "-".into();
            }
            let traffic = match (r.traffic, &r.traffic_pod) {
                (TrafficKind::Pod, Some(p)) => format!("pod {p}"),
                (TrafficKind::Pod, None) => "pod".into(),
                (TrafficKind::Shared, _) => "shared".into(),
                (TrafficKind::Unused, _) => "unused".into(),
            };
            vec![
                r.node.clone(),
                r.device.clone(),
                holders,
                traffic,
                per_s(r.tx_bytes_per_second),
                per_s(r.rx_bytes_per_second),
            ]
        })
        .collect();
    output::table(
        &[
            "NODE",
            "DEVICE",
            "HOLDERS",
            "TRAFFIC",
            "TX-BYTES/s",
            "RX-BYTES/s",
        ],
        &rows,
    )
}

/// What a command prints for one block.
fn render_pods(s: &Sample, ns: &Namespaces, args: &TopArgs) -> anyhow::Result<String> {
    if !matches!(
        args.sort_by,
        SortBy::Name | SortBy::Qps | SortBy::MrBytes | SortBy::Cqs | SortBy::Pds
    ) {
        anyhow::bail!(
            "--sort-by tx|rx is for top devices; top pods sorts by name, qps, mr-bytes, cqs or pds"
        );
    }
    let nodes: Vec<NodeUsage> = s
        .nodes
        .iter()
        .map(|n| {
            let mut n = n.clone();
            n.pods.retain(|p| ns.shows(p));
            n
        })
        .collect();
    match args.output {
        Format::Table => Ok(pods_table(&nodes, args.sort_by)),
        f => output::render(
            &UsageList {
                kind: "UsageList",
                items: nodes,
                unreachable: s.unreachable.clone(),
            },
            f,
        ),
    }
}

fn render_devices(prev: Option<&Sample>, s: &Sample, args: &TopArgs) -> anyhow::Result<String> {
    if !matches!(args.sort_by, SortBy::Name | SortBy::Tx | SortBy::Rx) {
        anyhow::bail!(
            "--sort-by qps|mr-bytes|cqs|pds is for top pods; top devices sorts by name, tx or rx"
        );
    }
    let wall = prev
        .and_then(|p| p.at)
        .zip(s.at)
        .map(|(a, b)| b.saturating_duration_since(a));
    let mut rows = device_rows(prev.map(|p| p.nodes.as_slice()), &s.nodes, wall);
    sort_devices(&mut rows, args.sort_by);
    match args.output {
        Format::Table => Ok(devices_table(&rows)),
        f => output::render(
            &DeviceList {
                kind: "DeviceUsageList",
                items: rows,
                unreachable: s.unreachable.clone(),
            },
            f,
        ),
    }
}

fn report_unreachable(s: &Sample) {
    for u in &s.unreachable {
        match &u.agent {
            Some(a) => crate::output::warn(&format!(
                "erdmactl: node {}: agent {a}: {}",
                u.node, u.reason
            )),
            None => crate::output::warn(&format!("erdmactl: node {}: {}", u.node, u.reason)),
        }
    }
}

/// Prints one block: on a terminal with --watch the screen is cleared first; on a pipe blocks
/// are separated by a blank line.
fn print_block(text: &str, watch: bool, first: bool) -> anyhow::Result<()> {
    if watch && std::io::stdout().is_terminal() {
        output::clear_screen()?;
        output::emit(text)
    } else if watch && !first {
        output::emit(&format!("\n{text}"))
    } else {
        output::emit(text)
    }
}

/// One round: the agents to read (listed again each round) and their answers.
async fn read(
    a: &TopArgs,
    clients: Option<(&kube::Client, &kube::Client)>,
    timeout: Duration,
) -> anyhow::Result<Sample> {
    let (found, not_found) = match (&a.agent_addr, clients) {
        (Some(addr), _) => (
            vec![Target {
                node: addr.clone(),
                via: Via::Direct(addr.clone()),
            }],
            Vec::new(),
        ),
        (None, Some((c, _))) => targets(c, a).await?,
        (None, None) => anyhow::bail!("no Kubernetes client and no --agent-addr"),
    };
    Ok(sample(clients.map(|(_, proxy)| proxy), &found, &not_found, timeout).await)
}

/// Whether an agent answered `s` with the same read as `prev` (same collection time).
fn stale(prev: &Sample, s: &Sample) -> bool {
    s.nodes.iter().any(|n| {
        n.collected_at_unix_ms != 0
            && prev
                .nodes
                .iter()
                .any(|p| p.node == n.node && p.collected_at_unix_ms == n.collected_at_unix_ms)
    })
}

/// Runs `erdmactl top …`; see [`crate::exit::TOP`].
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let (a, devices) = match &args.what {
        What::Pods(a) => (a, false),
        What::Devices(a) => (a, true),
    };
    let rt = runtime()?;
    rt.block_on(run_async(a, devices))
}

async fn run_async(a: &TopArgs, devices: bool) -> anyhow::Result<ExitCode> {
    // A wrong --sort-by is a usage error before anything is read.
    let probe = Sample::default();
    if devices {
        render_devices(
            None,
            &probe,
            &TopArgs {
                output: Format::Json,
                ..a.clone()
            },
        )?;
    } else {
        render_pods(
            &probe,
            &Namespaces::All,
            &TopArgs {
                output: Format::Json,
                ..a.clone()
            },
        )?;
    }
    let timeout = if a.kube.request_timeout.is_zero() {
        Duration::from_secs(3600)
    } else {
        a.kube.request_timeout
    };
    let (client, ns) = match &a.agent_addr {
        Some(_) => (
            None,
            a.namespace.clone().map_or(Namespaces::All, Namespaces::One),
        ),
        None => {
            let c = kube_client(&a.kube).await?;
            let proxy = kube_client_with_retry(&a.kube, false).await?;
            let ns = if a.all_namespaces {
                Namespaces::All
            } else {
                Namespaces::One(
                    a.namespace
                        .clone()
                        .unwrap_or_else(|| c.default_namespace().to_string()),
                )
            };
            (Some((c, proxy)), ns)
        }
    };
    let mut failed = false;
    let mut prev: Option<Sample> = None;
    let mut blocks = 0u64;
    let clients = client.as_ref().map(|(c, proxy)| (c, proxy));
    loop {
        let mut s = read(a, clients, timeout).await?;
        // An agent reads the kernel at most every 2 s and answers the same read until then: a
        // second sample that soon would have no rate. Read again (a few times at most) until
        // every agent has read anew.
        let mut again = 0;
        while devices && again < 3 && prev.as_ref().is_some_and(|p| stale(p, &s)) {
            tokio::time::sleep(a.interval.min(Duration::from_secs(1))).await;
            s = read(a, clients, timeout).await?;
            again += 1;
        }
        report_unreachable(&s);
        failed |= !s.unreachable.is_empty();
        if devices && prev.is_none() {
            // Rates need two samples: the first block comes after the second.
            prev = Some(s);
            tokio::time::sleep(a.interval).await;
            continue;
        }
        let text = if devices {
            render_devices(prev.as_ref(), &s, a)?
        } else {
            render_pods(&s, &ns, a)?
        };
        print_block(&text, a.watch, blocks == 0)?;
        blocks += 1;
        if !a.watch || a.count.is_some_and(|c| blocks >= c) {
            break;
        }
        prev = Some(s);
        tokio::time::sleep(a.interval).await;
    }
    Ok(if failed {
        ExitCode::from(exit::CHECK_FAILED)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use erdma_usage::report::PortReport;

    fn node(name: &str, at: u64, tx: u64, rx: u64) -> NodeUsage {
        NodeUsage {
            node: Some(name.into()),
            collected_at_unix_ms: at,
            available: true,
            devices: vec![DeviceReport {
                device: "erdma_0".into(),
                holders: vec!["ml/trainer-0".into()],
                traffic: TrafficKind::Pod,
                traffic_pod: Some("ml/trainer-0".into()),
                ports: vec![PortReport {
                    port: 1,
                    tx_bytes: Some(tx),
                    rx_bytes: Some(rx),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn rates_over_the_agents_collection_times() {
        let a = [node("n1", 10_000, 1_000, 0)];
        let b = [node("n1", 12_000, 5_000, 2_048)];
        let rows = device_rows(Some(&a), &b, Some(Duration::from_secs(9)));
        assert_eq!(rows[0].tx_bytes_per_second, Some(2_000.0));
        assert_eq!(rows[0].rx_bytes_per_second, Some(1_024.0));
        assert_eq!(rows[0].interval_seconds, Some(2.0));
        // A reset counter, or one sample only: no rate.
        let reset = [node("n1", 14_000, 10, 10)];
        assert_eq!(
            device_rows(Some(&b), &reset, None)[0].tx_bytes_per_second,
            None
        );
        assert_eq!(device_rows(None, &b, None)[0].tx_bytes_per_second, None);
        let t = devices_table(&rows);
        assert!(t.contains("pod ml/trainer-0"), "{t}");
        assert!(t.contains("2.0KiB/s"), "{t}");
    }

    #[test]
    fn intervals_and_units() {
        assert_eq!(interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(interval("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(interval("3"), Ok(Duration::from_secs(3)));
        assert!(interval("0s").is_err());
        assert!(interval("soon").is_err());
        assert_eq!(human_bytes(512.0), "512B");
        assert_eq!(human_bytes(1536.0), "1.5KiB");
        assert_eq!(human_bytes((1u64 << 30) as f64), "1.0GiB");
    }
}
