//! The agent's usage answer (`GET /usage` on its metrics address) as it travels: what
//! `erdmactl top` and doctor read. JSON, camelCase field names as Kubernetes writes them; absent
//! optional fields are left out, and unknown fields are ignored when read (a newer agent may add
//! some).
//!
//! [`build`] makes it from an [`Usage`] and the names of the pods (the agent knows a pod by its UID
//! from the cgroup, and by namespace and name from the kubelet and the container runtime). Pure.
//!
//! Shape:
//!
//! ```json
//! {"node": "node-1", "collectedAtUnixMs": 1764921600000, "available": true,
//!  "pods": [{"namespace": "ml", "name": "trainer-0", "uid": "6a0b…",
//!            "containers": ["ab12…"],
//!            "devices": [{"device": "erdma_0", "allocated": true, "qps": 3,
//!                         "qpsByState": {"RTS": 2, "INIT": 1}, "mrs": 2,
//!                         "mrBytes": 1052672, "cqs": 2, "pds": 1}],
//!            "smc": {"smcr": 3, "smcd": 0, "fallbackTcp": 1, "listening": 1,
//!                    "fallbackReasons": [{"code": "0x03010000", "name": "PEERNOSMC",
//!                                         "meaning": "peer did not offer SMC: …",
//!                                         "connections": 1}],
//!                    "devices": ["erdma_0"]}}],
//!  "devices": [{"device": "erdma_0", "holders": ["ml/trainer-0"], "traffic": "pod",
//!               "trafficPod": "ml/trainer-0",
//!               "ports": [{"port": 1, "txBytes": 4096, "rxBytes": 8192, "txPackets": 4,
//!                          "rxPackets": 8, "counters": {"tx_bytes_cnt": 4096, …}}]}],
//!  "others": [{"kind": "kernel", "device": "erdma_0", "qps": 1, "qpsByState": {"RTS": 1},
//!              "mrs": 0, "mrBytes": 0, "cqs": 1, "pds": 1, "owners": ["ib_core"]}]}
//! ```

use crate::attribution::{Bucket, Counts, Traffic, Usage};
use crate::cgroup::PodUid;
use crate::nldev::PortCounters;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The node's usage: the whole answer of `GET /usage`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeUsage {
    /// The node's name, when the agent knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// When the kernel was read (milliseconds since the Unix epoch).
    pub collected_at_unix_ms: u64,
    /// Whether usage could be read; when false, `error` says why and the lists are empty.
    pub available: bool,
    /// Why usage could not be read (RDMA netlink missing, usage collection off, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Pods with an RDMA device allocated or seen using one, by namespace and name (UID for
    /// pods whose name is unknown).
    #[serde(default)]
    pub pods: Vec<PodReport>,
    /// Every RDMA device: holders, whose its traffic is, its ports' counters.
    #[serde(default)]
    pub devices: Vec<DeviceReport>,
    /// Objects not of a pod, per kind and device.
    #[serde(default)]
    pub others: Vec<OtherReport>,
}

/// One pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodReport {
    /// Namespace, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The pod's UID (empty for a pod known only by name: allocated a device, UID unknown).
    pub uid: String,
    /// Container IDs seen owning objects.
    #[serde(default)]
    pub containers: Vec<String>,
    /// Per device: the pod's objects.
    #[serde(default)]
    pub devices: Vec<PodDeviceReport>,
    /// The pod's SMC sockets (`smc_diag` in its network namespace), for a pod that asks for
    /// SMC-R; absent for other pods and from agents older than this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smc: Option<SmcSummary>,
}

/// A pod's SMC sockets by mode, as `smc_diag` (what `smcss` and `erdmactl smc status` read)
/// reports them in the pod's network namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SmcSummary {
    /// Why the sockets could not be read (no SMC in the kernel, the pod's sandbox or network
    /// namespace not found, ...); the counts are then zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Connections on SMC-R (RDMA).
    #[serde(default)]
    pub smcr: u64,
    /// Connections on SMC-D.
    #[serde(default)]
    pub smcd: u64,
    /// Connections that fell back to TCP.
    #[serde(default)]
    pub fallback_tcp: u64,
    /// Listening sockets (not counted as connections).
    #[serde(default)]
    pub listening: u64,
    /// Why connections fell back, one entry per reason, most connections first.
    #[serde(default)]
    pub fallback_reasons: Vec<SmcFallbackReason>,
    /// The RDMA devices the SMC-R connections' links use (`erdma_0`), sorted.
    #[serde(default)]
    pub devices: Vec<String>,
}

impl SmcSummary {
    /// Connections (not listening) in any mode.
    pub fn connections(&self) -> u64 {
        self.smcr + self.smcd + self.fallback_tcp
    }
}

/// One reason SMC connections fell back to TCP (`SMC_CLC_DECL_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SmcFallbackReason {
    /// The code as `smcss` prints it (`0x03030002`).
    pub code: String,
    /// Its name as `erdmactl smc status` prints it (`NOSMCRDEV`, `UNKNOWN`).
    pub name: String,
    /// What the peer reported, when it sent a diagnosis (`TIMEOUT_CL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// What it means and the usual cause.
    #[serde(default)]
    pub meaning: String,
    /// Connections that fell back for it.
    pub connections: u64,
}

impl SmcFallbackReason {
    /// `NAME` or `NAME (peer: PEER)`, as `erdmactl smc status` prints it.
    pub fn label(&self) -> String {
        match &self.peer {
            Some(p) => format!("{} (peer: {p})", self.name),
            None => self.name.clone(),
        }
    }
}

impl PodReport {
    /// `namespace/name`, or the UID when the name is unknown.
    pub fn key(&self) -> String {
        match (&self.namespace, &self.name) {
            (Some(ns), Some(n)) => format!("{ns}/{n}"),
            _ => self.uid.clone(),
        }
    }
}

/// Object counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectCounts {
    /// Queue pairs.
    pub qps: u64,
    /// Queue pairs by state ("RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", "UNKNOWN").
    #[serde(default)]
    pub qps_by_state: BTreeMap<String, u64>,
    /// Memory regions.
    pub mrs: u64,
    /// Bytes registered in memory regions (memory pinned for RDMA).
    pub mr_bytes: u64,
    /// Completion queues.
    pub cqs: u64,
    /// Protection domains.
    pub pds: u64,
}

impl From<&Counts> for ObjectCounts {
    fn from(c: &Counts) -> Self {
        Self {
            qps: c.qps,
            qps_by_state: c
                .qps_by_state
                .iter()
                .map(|(s, n)| (s.as_str().to_string(), *n))
                .collect(),
            mrs: c.mrs,
            mr_bytes: c.mr_bytes,
            cqs: c.cqs,
            pds: c.pds,
        }
    }
}

/// One pod's objects on one device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodDeviceReport {
    /// The RDMA device's name (`erdma_0`).
    pub device: String,
    /// Whether the kubelet allocated the device to the pod (false: the pod uses a device it was
    /// not given).
    pub allocated: bool,
    /// The objects.
    #[serde(flatten)]
    pub counts: ObjectCounts,
}

/// Whose a device's traffic is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TrafficKind {
    /// One pod holds the device and nothing else uses it: the counters are that pod's.
    Pod,
    /// Several holders, or a holder and other users: the counters are the device's only.
    #[default]
    Shared,
    /// Nobody holds or uses the device.
    Unused,
}

/// One device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceReport {
    /// The RDMA device's name.
    pub device: String,
    /// Pods allocated the device or seen using it (`namespace/name`, or the UID).
    #[serde(default)]
    pub holders: Vec<String>,
    /// A host process uses it.
    #[serde(default)]
    pub host_users: bool,
    /// Objects without a visible owner are on it.
    #[serde(default)]
    pub unknown_users: bool,
    /// Kernel users other than the RDMA core's own management objects (`smc`, `rds`, ...).
    #[serde(default)]
    pub kernel_users: Vec<String>,
    /// Whose the traffic is.
    pub traffic: TrafficKind,
    /// The pod whose the traffic is, when `traffic` is `pod`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_pod: Option<String>,
    /// Per port: the counters.
    #[serde(default)]
    pub ports: Vec<PortReport>,
}

/// One port's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortReport {
    /// Port number (from 1).
    pub port: u32,
    /// Bytes sent, when the driver counts them (see [`TX_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    /// Bytes received, when the driver counts them (see [`RX_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    /// Packets sent, when the driver counts them (see [`TX_PACKETS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_packets: Option<u64>,
    /// Packets received, when the driver counts them (see [`RX_PACKETS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_packets: Option<u64>,
    /// Every hardware counter of the port, by the driver's name.
    #[serde(default)]
    pub counters: BTreeMap<String, u64>,
}

/// Which bucket of objects not of a pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OtherKind {
    /// A process outside any pod.
    Host,
    /// A kernel user (`ib_core`'s management objects, `smc`, ...).
    Kernel,
    /// No visible owner (the task is gone or in a PID namespace the agent cannot see).
    #[default]
    Unknown,
}

/// Objects not of a pod on one device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OtherReport {
    /// The bucket.
    pub kind: OtherKind,
    /// The RDMA device's name.
    pub device: String,
    /// The objects.
    #[serde(flatten)]
    pub counts: ObjectCounts,
    /// Owners (PIDs in decimal, kernel users' names), at most
    /// [`crate::attribution::MAX_BUCKET_OWNERS`].
    #[serde(default)]
    pub owners: Vec<String>,
    /// Owners left out of `owners`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub owners_left_out: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// A pod's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodName {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for PodName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Hardware counter names of bytes sent, as drivers name them: `erdma` (`tx_bytes_cnt`; its
/// out-of-tree build `hw_tx_bytes_cnt`), `bnxt_re` (`tx_bytes`), Soft-RoCE (`rxe`: `sent_bytes`,
/// in its `hw_counters/` on the lab's 7.3 kernel, beside `sent_pkts`). `mlx5` counts no bytes in
/// `hw_counters/`.
pub const TX_BYTES: &[&str] = &["tx_bytes_cnt", "hw_tx_bytes_cnt", "tx_bytes", "sent_bytes"];
/// Names of bytes received: `erdma`, its out-of-tree build, `bnxt_re`, `rxe` (`rcvd_bytes`).
pub const RX_BYTES: &[&str] = &["rx_bytes_cnt", "hw_rx_bytes_cnt", "rx_bytes", "rcvd_bytes"];
/// Names of packets sent: `erdma`, its out-of-tree build, `rxe` (`sent_pkts`), `bnxt_re`.
pub const TX_PACKETS: &[&str] = &[
    "tx_packets_cnt",
    "hw_tx_packets_cnt",
    "sent_pkts",
    "tx_pkts",
];
/// Names of packets received: `erdma`, its out-of-tree build, `rxe` (`rcvd_pkts`), `bnxt_re`.
pub const RX_PACKETS: &[&str] = &[
    "rx_packets_cnt",
    "hw_rx_packets_cnt",
    "rcvd_pkts",
    "rx_pkts",
];

/// Hardware counters that count trouble (drops, retransmits, NAKs, congestion notifications), by
/// the drivers' names: `erdma`'s drops (`drivers/infiniband/hw/erdma/erdma_verbs.c`, and the
/// `hw_` names of its out-of-tree build), `rxe`'s errors and retries
/// (`drivers/infiniband/sw/rxe/rxe_hw_counters.c`), `mlx5`'s retransmit, NAK and CNP counters.
/// The agent exports exactly these as `erdma_device_errors_total{counter}`: a fixed list bounds
/// the label's values.
pub const ERROR_COUNTERS: &[&str] = &[
    // erdma
    "tx_disable_drop_cnt",
    "tx_bps_limit_drop_cnt",
    "tx_pps_limit_drop_cnt",
    "rx_disable_drop_cnt",
    "rx_bps_limit_drop_cnt",
    "rx_pps_limit_drop_cnt",
    "hw_disable_drop_cnt",
    "hw_bps_limit_drop_cnt",
    "hw_pps_limit_drop_cnt",
    "hw_rx_disable_drop_cnt",
    "hw_rx_bps_limit_drop_cnt",
    "hw_rx_pps_limit_drop_cnt",
    // rxe
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_rnr_err",
    "send_rnr_err",
    "rcvd_seq_err",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "completer_retry_err",
    "send_err",
    "link_downed",
    // mlx5
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "rnr_nak_retry_err",
    "implied_nak_seq_err",
    "out_of_buffer",
    "np_cnp_sent",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
];

/// The first of `names` the counters have.
pub fn first_counter(counters: &BTreeMap<String, u64>, names: &[&str]) -> Option<u64> {
    names.iter().find_map(|n| counters.get(*n).copied())
}

impl From<&PortCounters> for PortReport {
    fn from(c: &PortCounters) -> Self {
        Self {
            port: c.port,
            tx_bytes: first_counter(&c.counters, TX_BYTES),
            rx_bytes: first_counter(&c.counters, RX_BYTES),
            tx_packets: first_counter(&c.counters, TX_PACKETS),
            rx_packets: first_counter(&c.counters, RX_PACKETS),
            counters: c.counters.clone(),
        }
    }
}

fn pod_key(uid: &PodUid, names: &BTreeMap<PodUid, PodName>) -> String {
    names
        .get(uid)
        .map(|n| n.to_string())
        .unwrap_or_else(|| uid.0.clone())
}

fn others(kind: OtherKind, b: &Bucket, out: &mut Vec<OtherReport>) {
    for (dev, c) in &b.devices {
        out.push(OtherReport {
            kind,
            device: dev.clone(),
            counts: c.into(),
            owners: b
                .owners
                .get(dev)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default(),
            owners_left_out: b.owners_left_out.get(dev).copied().unwrap_or(0),
        });
    }
}

/// The answer for `usage`, read at `collected_at_unix_ms`; `names` gives pods' namespaces and
/// names by UID (pods missing from it are shown by UID). Pods are sorted by namespace, name and
/// UID, those of unknown name last; devices by name.
pub fn build(
    usage: &Usage,
    names: &BTreeMap<PodUid, PodName>,
    node: Option<String>,
    collected_at_unix_ms: u64,
) -> NodeUsage {
    let mut pods: Vec<PodReport> = usage
        .pods
        .iter()
        .map(|(uid, p)| {
            let n = names.get(uid);
            PodReport {
                namespace: n.map(|n| n.namespace.clone()),
                name: n.map(|n| n.name.clone()),
                uid: uid.0.clone(),
                containers: p.containers.iter().map(|c| c.0.clone()).collect(),
                devices: p
                    .devices
                    .iter()
                    .map(|(d, c)| PodDeviceReport {
                        device: d.clone(),
                        allocated: p.allocated.contains(d),
                        counts: c.into(),
                    })
                    .collect(),
                smc: None,
            }
        })
        .collect();
    pods.sort_by(|a, b| {
        let k = |p: &PodReport| {
            (
                p.namespace.is_none(),
                p.namespace.clone(),
                p.name.clone(),
                p.uid.clone(),
            )
        };
        k(a).cmp(&k(b))
    });
    let devices = usage
        .devices
        .iter()
        .map(|(d, u)| {
            let (traffic, traffic_pod) = match &u.traffic {
                Traffic::Pod(p) => (TrafficKind::Pod, Some(pod_key(p, names))),
                Traffic::Shared => (TrafficKind::Shared, None),
                Traffic::Unused => (TrafficKind::Unused, None),
            };
            let mut holders: Vec<String> = u.holders.iter().map(|h| pod_key(h, names)).collect();
            holders.sort();
            DeviceReport {
                device: d.clone(),
                holders,
                host_users: u.host_users,
                unknown_users: u.unknown_users,
                kernel_users: u.kernel_users.iter().cloned().collect(),
                traffic,
                traffic_pod,
                ports: u.counters.iter().map(PortReport::from).collect(),
            }
        })
        .collect();
    let mut o = Vec::new();
    others(OtherKind::Host, &usage.host, &mut o);
    others(OtherKind::Kernel, &usage.kernel, &mut o);
    others(OtherKind::Unknown, &usage.unknown, &mut o);
    NodeUsage {
        node,
        collected_at_unix_ms,
        available: true,
        error: None,
        pods,
        devices,
        others: o,
    }
}

impl NodeUsage {
    /// The answer when usage cannot be read: `available` false and `error` the reason.
    pub fn unavailable(node: Option<String>, collected_at_unix_ms: u64, error: String) -> Self {
        Self {
            node,
            collected_at_unix_ms,
            available: false,
            error: Some(error),
            ..Default::default()
        }
    }

    /// The pod of that `namespace/name` (or UID).
    pub fn pod(&self, key: &str) -> Option<&PodReport> {
        self.pods.iter().find(|p| p.key() == key || p.uid == key)
    }

    /// The device of that name.
    pub fn device(&self, name: &str) -> Option<&DeviceReport> {
        self.devices.iter().find(|d| d.device == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::attribute;
    use crate::cgroup::ContainerId;
    use crate::nldev::{DeviceEntry, MrEntry, QpEntry, QpState, QpType};
    use crate::source::Snapshot;

    fn world() -> (Usage, BTreeMap<PodUid, PodName>) {
        let mut s = Snapshot::default();
        for (i, d) in ["erdma_0", "erdma_1"].iter().enumerate() {
            s.devices.push(DeviceEntry {
                index: i as u32,
                name: d.to_string(),
                ports: 1,
            });
            s.port_counters.push(PortCounters {
                dev_index: i as u32,
                dev_name: d.to_string(),
                port: 1,
                counters: [
                    ("tx_bytes_cnt".to_string(), 4096),
                    ("rx_bytes_cnt".to_string(), 8192),
                    ("tx_packets_cnt".to_string(), 4),
                    ("rx_packets_cnt".to_string(), 8),
                    ("tx_bps_limit_drop_cnt".to_string(), 1),
                ]
                .into_iter()
                .collect(),
            });
        }
        let qp = |dev: &str, lqpn, state, pid: Option<u32>, k: Option<&str>| QpEntry {
            dev_index: 0,
            dev_name: dev.into(),
            port: Some(1),
            lqpn,
            state,
            qp_type: if k.is_some() { QpType::Gsi } else { QpType::Rc },
            pid,
            kern_name: k.map(Into::into),
        };
        s.qps = vec![
            qp("erdma_0", 1, QpState::Rts, None, Some("ib_core")),
            qp("erdma_0", 17, QpState::Rts, Some(100), None),
            qp("erdma_0", 18, QpState::Init, Some(100), None),
            qp("erdma_1", 19, QpState::Rts, Some(7), None),
        ];
        s.mrs = vec![MrEntry {
            dev_index: 0,
            dev_name: "erdma_0".into(),
            mrn: None,
            mr_len: 1 << 20,
            pdn: None,
            pid: Some(100),
            kern_name: None,
        }];
        let a = PodUid("uid-a".into());
        let b = PodUid("uid-b".into());
        let pid_pods = [(100, (a.clone(), ContainerId("c1".into())))]
            .into_iter()
            .collect();
        let alloc = [
            (a.clone(), ["erdma_0".to_string()].into_iter().collect()),
            (b.clone(), ["erdma_1".to_string()].into_iter().collect()),
        ]
        .into_iter()
        .collect();
        let names = [(
            a,
            PodName {
                namespace: "ml".into(),
                name: "trainer-0".into(),
            },
        )]
        .into_iter()
        .collect();
        (attribute(&s, &pid_pods, &alloc), names)
    }

    #[test]
    fn built_from_usage() {
        let (u, names) = world();
        let r = build(&u, &names, Some("node-1".into()), 42);
        assert!(r.available);
        assert_eq!(r.pods.len(), 2);
        let a = r.pod("ml/trainer-0").unwrap();
        assert_eq!(a.containers, vec!["c1".to_string()]);
        let d = &a.devices[0];
        assert_eq!((d.device.as_str(), d.allocated), ("erdma_0", true));
        assert_eq!((d.counts.qps, d.counts.mr_bytes), (2, 1 << 20));
        assert_eq!(d.counts.qps_by_state["RTS"], 1);
        assert_eq!(d.counts.qps_by_state["INIT"], 1);
        // A pod whose name is unknown is shown by UID.
        let b = r.pod("uid-b").unwrap();
        assert_eq!(b.namespace, None);
        assert_eq!(b.devices[0].counts.qps, 0);
        let e0 = r.device("erdma_0").unwrap();
        assert_eq!(e0.traffic, TrafficKind::Pod);
        assert_eq!(e0.traffic_pod.as_deref(), Some("ml/trainer-0"));
        assert_eq!(e0.holders, vec!["ml/trainer-0".to_string()]);
        let p = &e0.ports[0];
        assert_eq!(
            (p.tx_bytes, p.rx_bytes, p.tx_packets, p.rx_packets),
            (Some(4096), Some(8192), Some(4), Some(8))
        );
        assert_eq!(p.counters["tx_bps_limit_drop_cnt"], 1);
        // erdma_1: pod B is allocated it, a host process uses it.
        let e1 = r.device("erdma_1").unwrap();
        assert_eq!(e1.traffic, TrafficKind::Shared);
        assert!(e1.host_users);
        let host = r.others.iter().find(|o| o.kind == OtherKind::Host).unwrap();
        assert_eq!(
            (host.device.as_str(), host.counts.qps, host.owners.clone()),
            ("erdma_1", 1, vec!["7".to_string()])
        );
        assert!(
            r.others
                .iter()
                .any(|o| o.kind == OtherKind::Kernel && o.owners == vec!["ib_core".to_string()])
        );
    }

    #[test]
    fn json_round_trip_and_field_names() {
        let (u, names) = world();
        let r = build(&u, &names, Some("node-1".into()), 42);
        let j = serde_json::to_string(&r).unwrap();
        let back: NodeUsage = serde_json::from_str(&j).unwrap();
        assert_eq!(back, r);
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["collectedAtUnixMs"], 42);
        assert_eq!(v["pods"][0]["devices"][0]["qpsByState"]["RTS"], 1);
        assert_eq!(v["pods"][0]["devices"][0]["mrBytes"], 1 << 20);
        assert_eq!(v["devices"][0]["traffic"], "pod");
        assert_eq!(v["devices"][0]["trafficPod"], "ml/trainer-0");
        assert_eq!(v["devices"][0]["ports"][0]["txBytes"], 4096);
        assert_eq!(v["devices"][1]["hostUsers"], true);
        assert!(v.get("error").is_none());
        // Unavailable: the error, empty lists; unknown fields are ignored when read.
        let un = NodeUsage::unavailable(None, 7, "no RDMA netlink".into());
        let mut v = serde_json::to_value(&un).unwrap();
        assert_eq!(v["available"], false);
        assert_eq!(v["error"], "no RDMA netlink");
        v["someNewField"] = serde_json::json!(1);
        let back: NodeUsage = serde_json::from_value(v).unwrap();
        assert_eq!(back, un);
        // The least an answer needs.
        let min: NodeUsage =
            serde_json::from_str(r#"{"collectedAtUnixMs": 1, "available": false}"#).unwrap();
        assert!(min.pods.is_empty());
    }

    #[test]
    fn smc_summary_on_the_wire() {
        let (u, names) = world();
        let mut r = build(&u, &names, None, 1);
        let j = serde_json::to_value(&r).unwrap();
        assert!(j["pods"][0].get("smc").is_none(), "absent when not read");
        r.pods[0].smc = Some(SmcSummary {
            smcr: 3,
            fallback_tcp: 1,
            listening: 1,
            fallback_reasons: vec![SmcFallbackReason {
                code: "0x05030000".into(),
                name: "PEERDECL".into(),
                peer: Some("TIMEOUT_CL".into()),
                meaning: "peer declined".into(),
                connections: 1,
            }],
            devices: vec!["erdma_0".into()],
            ..Default::default()
        });
        let j = serde_json::to_value(&r).unwrap();
        let smc = &j["pods"][0]["smc"];
        assert_eq!(smc["smcr"], 3);
        assert_eq!(smc["fallbackTcp"], 1);
        assert_eq!(smc["fallbackReasons"][0]["peer"], "TIMEOUT_CL");
        assert_eq!(smc["devices"][0], "erdma_0");
        assert!(smc.get("error").is_none());
        let back: NodeUsage = serde_json::from_value(j).unwrap();
        assert_eq!(back, r);
        let s = back.pods[0].smc.as_ref().unwrap();
        assert_eq!(s.connections(), 4);
        assert_eq!(s.fallback_reasons[0].label(), "PEERDECL (peer: TIMEOUT_CL)");
        // An error alone is a whole summary.
        let e: SmcSummary =
            serde_json::from_str(r#"{"error": "SMC unsupported: no smc_diag"}"#).unwrap();
        assert_eq!((e.connections(), e.error.is_some()), (0, true));
    }

    #[test]
    fn rxe_byte_counters() {
        // rxe's hw_counters as the lab's 7.3 kernel has them (rdma statistic, sysfs).
        let c = PortCounters {
            dev_index: 0,
            dev_name: "rxe0".into(),
            port: 1,
            counters: [
                ("sent_pkts", 160_473),
                ("rcvd_pkts", 170_768),
                ("sent_bytes", 168_743_056),
                ("rcvd_bytes", 179_908_004),
                ("ack_deferred", 2_465),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        };
        let p = PortReport::from(&c);
        assert_eq!(
            (p.tx_bytes, p.rx_bytes, p.tx_packets, p.rx_packets),
            (
                Some(168_743_056),
                Some(179_908_004),
                Some(160_473),
                Some(170_768)
            )
        );
    }

    #[test]
    fn ports_without_byte_counters() {
        let c = PortCounters {
            dev_index: 0,
            dev_name: "rxe0".into(),
            port: 1,
            counters: [("sent_pkts".to_string(), 3), ("rcvd_pkts".to_string(), 5)]
                .into_iter()
                .collect(),
        };
        let p = PortReport::from(&c);
        assert_eq!((p.tx_bytes, p.rx_bytes), (None, None));
        assert_eq!((p.tx_packets, p.rx_packets), (Some(3), Some(5)));
        let v = serde_json::to_value(&p).unwrap();
        assert!(v.get("txBytes").is_none());
    }
}
