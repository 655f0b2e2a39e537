//! Usage per pod and device, from a [`Snapshot`], the PID → pod map ([`crate::cgroup`]) and the
//! devices the kubelet allocated to each pod (its pod-resources API). Pure.
//!
//! Rules:
//! - An object whose creator PID belongs to a pod counts for that pod on the object's device,
//!   also when the pod was not allocated that device (it is then listed in
//!   [`PodUsage::unallocated`]: doctor's concern).
//! - Other objects go to one of three buckets, per device, that never grow with the number of
//!   processes: `host` (a visible PID outside any pod), `kernel` (a kernel user, by its
//!   `RES_KERN_NAME`) and `unknown` (no PID: the task is gone or in a PID namespace the reader
//!   cannot see). Each keeps at most [`MAX_BUCKET_OWNERS`] owner names as examples.
//! - A device's holders are the pods allocated it plus the pods seen using it. Its traffic
//!   counters are a pod's only when that pod is its only holder and nothing else uses it (no host
//!   process, no unknown owner, no kernel user other than the RDMA core's own management objects:
//!   `ib_core`'s PD/CQ/MR and the SMI/GSI QPs every port has). Otherwise the traffic is
//!   [`Traffic::Shared`] and is given to nobody: there is no per-pod split of a port's counters
//!   to be had, so none is made up.

use crate::cgroup::{ContainerId, PodUid};
use crate::nldev::{Owner, PortCounters, QpEntry, QpState, QpType, Resource};
use crate::source::Snapshot;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// PID → pod and container (from [`crate::cgroup::read_pid_pods`]).
pub type PidPods = BTreeMap<u32, (PodUid, ContainerId)>;

/// Pod → the device names the kubelet allocated it (from its pod-resources API).
pub type PodDevices = BTreeMap<PodUid, BTreeSet<String>>;

/// Most owner names a bucket keeps per device.
pub const MAX_BUCKET_OWNERS: usize = 16;

/// The kernel user whose objects are the RDMA core's own (the MAD layer's PD, CQs, QP0/QP1).
pub const CORE_KERN_NAME: &str = "ib_core";

/// Object counts on one device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// QPs.
    pub qps: u64,
    /// QPs by state.
    pub qps_by_state: BTreeMap<QpState, u64>,
    /// MRs.
    pub mrs: u64,
    /// Bytes registered in MRs (memory pinned for RDMA).
    pub mr_bytes: u64,
    /// CQs.
    pub cqs: u64,
    /// PDs.
    pub pds: u64,
}

impl Counts {
    fn add_qp(&mut self, q: &QpEntry) {
        self.qps += 1;
        *self.qps_by_state.entry(q.state).or_default() += 1;
    }

    /// Whether nothing is counted.
    pub fn is_empty(&self) -> bool {
        self.qps == 0 && self.mrs == 0 && self.cqs == 0 && self.pds == 0
    }
}

/// One pod's usage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PodUsage {
    /// Containers of the pod seen owning objects.
    pub containers: BTreeSet<ContainerId>,
    /// Devices the kubelet allocated to the pod.
    pub allocated: BTreeSet<String>,
    /// Per device (each allocated one, used or not, and each used one): the pod's objects.
    pub devices: BTreeMap<String, Counts>,
    /// Devices the pod uses without having been allocated them.
    pub unallocated: BTreeSet<String>,
    /// Port counters of the devices this pod holds alone (see [`Traffic`]).
    pub traffic: BTreeMap<String, Vec<PortCounters>>,
}

/// Objects not of a pod, per device, with up to [`MAX_BUCKET_OWNERS`] owners named.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// Per device: the objects.
    pub devices: BTreeMap<String, Counts>,
    /// Per device: owners (PIDs as decimal, kernel names), at most [`MAX_BUCKET_OWNERS`].
    pub owners: BTreeMap<String, BTreeSet<String>>,
    /// Per device: owners left out of `owners`.
    pub owners_left_out: BTreeMap<String, u64>,
}

impl Bucket {
    fn counts(&mut self, dev: &str, owner: Option<String>) -> &mut Counts {
        if let Some(o) = owner {
            let set = self.owners.entry(dev.to_string()).or_default();
            if !set.contains(&o) {
                if set.len() < MAX_BUCKET_OWNERS {
                    set.insert(o);
                } else {
                    *self.owners_left_out.entry(dev.to_string()).or_default() += 1;
                }
            }
        }
        self.devices.entry(dev.to_string()).or_default()
    }
}

/// Whose a device's traffic is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "pod")]
pub enum Traffic {
    /// One pod holds the device and nothing else uses it.
    Pod(PodUid),
    /// Several holders, or a holder and other users: the counters are the device's only.
    Shared,
    /// Nobody holds or uses the device (apart from the RDMA core itself).
    Unused,
}

/// One device's holders and traffic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceUsage {
    /// Pods allocated the device or seen using it.
    pub holders: BTreeSet<PodUid>,
    /// A host process uses it.
    pub host_users: bool,
    /// Objects without a visible owner are on it.
    pub unknown_users: bool,
    /// Kernel users other than the RDMA core's management objects (at most
    /// [`MAX_BUCKET_OWNERS`]).
    pub kernel_users: BTreeSet<String>,
    /// Whose the traffic is.
    pub traffic: Traffic,
    /// The device's port counters.
    pub counters: Vec<PortCounters>,
}

/// The whole picture.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Per pod (every pod with an allocation or seen using a device).
    pub pods: BTreeMap<PodUid, PodUsage>,
    /// Host processes.
    pub host: Bucket,
    /// Kernel users (the RDMA core's own objects included).
    pub kernel: Bucket,
    /// Objects without a visible owner.
    pub unknown: Bucket,
    /// Per device (every device in the snapshot, every allocated one, every used one).
    pub devices: BTreeMap<String, DeviceUsage>,
}

enum Who<'a> {
    Pod(&'a PodUid, &'a ContainerId),
    Host(u32),
    Kernel(String),
    Unknown,
}

fn who(owner: Owner, pid_pods: &PidPods) -> Who<'_> {
    match owner {
        Owner::Pid(p) => match pid_pods.get(&p) {
            Some((pod, c)) => Who::Pod(pod, c),
            None => Who::Host(p),
        },
        Owner::Kernel(k) => Who::Kernel(k),
        Owner::Unknown => Who::Unknown,
    }
}

/// Computes the usage. `pid_pods`: PID → pod and container; `pod_devices`: pod → allocated
/// device names.
pub fn attribute(snap: &Snapshot, pid_pods: &PidPods, pod_devices: &PodDevices) -> Usage {
    let mut u = Usage::default();
    for (pod, devs) in pod_devices {
        let p = u.pods.entry(pod.clone()).or_default();
        p.allocated = devs.clone();
        for d in devs {
            p.devices.entry(d.clone()).or_default();
        }
    }
    let mut others: BTreeMap<String, (bool, bool, BTreeSet<String>)> = BTreeMap::new();

    // Each object: the owner's counts on the device, and what it says about the device's users.
    let mut account = |dev: &str, owner: Owner, infra: bool, add: &dyn Fn(&mut Counts)| {
        let o = others.entry(dev.to_string()).or_default();
        match who(owner, pid_pods) {
            Who::Pod(pod, c) => {
                let p = u.pods.entry(pod.clone()).or_default();
                p.containers.insert(c.clone());
                add(p.devices.entry(dev.to_string()).or_default());
            }
            Who::Host(pid) => {
                o.0 = true;
                add(u.host.counts(dev, Some(pid.to_string())));
            }
            Who::Unknown => {
                o.1 = true;
                add(u.unknown.counts(dev, None));
            }
            Who::Kernel(k) => {
                if !infra && k != CORE_KERN_NAME && o.2.len() < MAX_BUCKET_OWNERS {
                    o.2.insert(k.clone());
                }
                add(u.kernel.counts(dev, Some(k)));
            }
        }
    };
    for q in &snap.qps {
        let infra = matches!(q.qp_type, QpType::Smi | QpType::Gsi);
        account(q.dev_name(), q.owner(), infra, &|c| c.add_qp(q));
    }
    for m in &snap.mrs {
        account(m.dev_name(), m.owner(), false, &|c| {
            c.mrs += 1;
            c.mr_bytes = c.mr_bytes.saturating_add(m.mr_len);
        });
    }
    for e in &snap.cqs {
        account(e.dev_name(), e.owner(), false, &|c| c.cqs += 1);
    }
    for e in &snap.pds {
        account(e.dev_name(), e.owner(), false, &|c| c.pds += 1);
    }

    // Devices: holders, other users, traffic.
    let mut names: BTreeSet<String> = snap.devices.iter().map(|d| d.name.clone()).collect();
    names.extend(others.keys().cloned());
    for p in u.pods.values_mut() {
        p.unallocated = p
            .devices
            .iter()
            .filter(|(d, c)| !c.is_empty() && !p.allocated.contains(*d))
            .map(|(d, _)| d.clone())
            .collect();
        names.extend(p.devices.keys().cloned());
    }
    for name in names {
        let holders: BTreeSet<PodUid> = u
            .pods
            .iter()
            .filter(|(_, p)| {
                p.allocated.contains(&name) || p.devices.get(&name).is_some_and(|c| !c.is_empty())
            })
            .map(|(k, _)| k.clone())
            .collect();
        let (host_users, unknown_users, kernel_users) = others.remove(&name).unwrap_or_default();
        let alone = !host_users && !unknown_users && kernel_users.is_empty();
        let traffic = match (holders.len(), alone) {
            (1, true) => Traffic::Pod(
                holders
                    .iter()
                    .next()
                    .cloned()
                    .unwrap_or(PodUid(String::new())),
            ),
            (0, true) => Traffic::Unused,
            _ => Traffic::Shared,
        };
        let counters: Vec<PortCounters> = snap
            .port_counters
            .iter()
            .filter(|c| c.dev_name == name)
            .cloned()
            .collect();
        if let Traffic::Pod(pod) = &traffic
            && let Some(p) = u.pods.get_mut(pod)
        {
            p.traffic.insert(name.clone(), counters.clone());
        }
        u.devices.insert(
            name,
            DeviceUsage {
                holders,
                host_users,
                unknown_users,
                kernel_users,
                traffic,
                counters,
            },
        );
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nldev::{CqEntry, DeviceEntry, MrEntry, PdEntry};

    fn pod(s: &str) -> PodUid {
        PodUid(s.into())
    }

    fn ctr(s: &str) -> ContainerId {
        ContainerId(s.into())
    }

    fn qp(
        dev: &str,
        lqpn: u32,
        state: QpState,
        ty: QpType,
        pid: Option<u32>,
        k: Option<&str>,
    ) -> QpEntry {
        QpEntry {
            dev_index: 0,
            dev_name: dev.into(),
            port: Some(1),
            lqpn,
            state,
            qp_type: ty,
            pid,
            kern_name: k.map(Into::into),
        }
    }

    fn mr(dev: &str, len: u64, pid: Option<u32>) -> MrEntry {
        MrEntry {
            dev_index: 0,
            dev_name: dev.into(),
            mrn: None,
            mr_len: len,
            pdn: None,
            pid,
            kern_name: None,
        }
    }

    fn cq(dev: &str, pid: Option<u32>, k: Option<&str>) -> CqEntry {
        CqEntry {
            dev_index: 0,
            dev_name: dev.into(),
            cqn: None,
            cqe: None,
            users: None,
            pid,
            kern_name: k.map(Into::into),
        }
    }

    fn pd(dev: &str, pid: Option<u32>, k: Option<&str>) -> PdEntry {
        PdEntry {
            dev_index: 0,
            dev_name: dev.into(),
            pdn: None,
            users: None,
            pid,
            kern_name: k.map(Into::into),
        }
    }

    fn counters(dev: &str, v: u64) -> PortCounters {
        PortCounters {
            dev_index: 0,
            dev_name: dev.into(),
            port: 1,
            counters: [("sent_pkts".to_string(), v)].into_iter().collect(),
        }
    }

    /// Devices a, b, c, d; the core's management objects on each; pod A (pids 100, 101: two
    /// containers) alone on a; pods B and C share b; a host process on c; smc on d.
    fn world() -> (Snapshot, PidPods, PodDevices) {
        let mut s = Snapshot::default();
        for (i, d) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            s.devices.push(DeviceEntry {
                index: i as u32,
                name: d.to_string(),
                ports: 1,
            });
            s.qps
                .push(qp(d, 1, QpState::Rts, QpType::Gsi, None, Some("ib_core")));
            s.cqs.push(cq(d, None, Some("ib_core")));
            s.pds.push(pd(d, None, Some("ib_core")));
            s.port_counters.push(counters(d, 10 * (i as u64 + 1)));
        }
        s.qps.extend([
            qp("a", 17, QpState::Rts, QpType::Rc, Some(100), None),
            qp("a", 18, QpState::Rts, QpType::Rc, Some(101), None),
            qp("a", 19, QpState::Init, QpType::Rc, Some(100), None),
            qp("b", 17, QpState::Rts, QpType::Ud, Some(200), None),
            qp("b", 18, QpState::Err, QpType::Rc, Some(300), None),
            qp("c", 20, QpState::Rts, QpType::Rc, Some(999), None),
            qp("d", 21, QpState::Rts, QpType::Rc, None, Some("smc")),
            // Pod C also opened device e, which it was not allocated.
            qp("e", 22, QpState::Rtr, QpType::Rc, Some(300), None),
        ]);
        s.mrs.extend([
            mr("a", 1 << 20, Some(100)),
            mr("a", 4096, Some(101)),
            mr("b", 8192, Some(200)),
            mr("c", 1, Some(999)),
        ]);
        s.cqs.extend([
            cq("a", Some(100), None),
            cq("a", Some(101), None),
            cq("c", None, None),
        ]);
        s.pds.extend([pd("a", Some(100), None)]);
        let pid_pods = [
            (100, (pod("A"), ctr("c1"))),
            (101, (pod("A"), ctr("c2"))),
            (200, (pod("B"), ctr("c3"))),
            (300, (pod("C"), ctr("c4"))),
        ]
        .into_iter()
        .collect();
        let pod_devices = [
            (pod("A"), ["a".to_string()].into_iter().collect()),
            (pod("B"), ["b".to_string()].into_iter().collect()),
            (pod("C"), ["b".to_string()].into_iter().collect()),
            (pod("D"), ["d".to_string()].into_iter().collect()),
        ]
        .into_iter()
        .collect();
        (s, pid_pods, pod_devices)
    }

    #[test]
    fn pods_get_their_objects_by_device_and_state() {
        let (s, pp, pd) = world();
        let u = attribute(&s, &pp, &pd);
        let a = &u.pods[&pod("A")];
        assert_eq!(a.containers, [ctr("c1"), ctr("c2")].into_iter().collect());
        let c = &a.devices["a"];
        assert_eq!(
            (c.qps, c.mrs, c.mr_bytes, c.cqs, c.pds),
            (3, 2, (1 << 20) + 4096, 2, 1)
        );
        assert_eq!(
            c.qps_by_state,
            [(QpState::Rts, 2), (QpState::Init, 1)]
                .into_iter()
                .collect()
        );
        assert!(a.unallocated.is_empty());
        // An allocated device without objects is listed, empty.
        let d = &u.pods[&pod("D")];
        assert!(d.devices["d"].is_empty());
        assert!(d.containers.is_empty());
    }

    #[test]
    fn traffic_goes_to_a_sole_holder_only() {
        let (s, pp, pd) = world();
        let u = attribute(&s, &pp, &pd);
        // a: pod A alone (the core's GSI QP, CQ and PD do not count).
        assert_eq!(u.devices["a"].traffic, Traffic::Pod(pod("A")));
        assert_eq!(u.pods[&pod("A")].traffic["a"], vec![counters("a", 10)]);
        // b: pods B and C.
        assert_eq!(u.devices["b"].traffic, Traffic::Shared);
        assert_eq!(
            u.devices["b"].holders,
            [pod("B"), pod("C")].into_iter().collect()
        );
        assert!(u.pods[&pod("B")].traffic.is_empty());
        // c: a host process and an object of unknown owner, no pod.
        assert_eq!(u.devices["c"].traffic, Traffic::Shared);
        assert!(u.devices["c"].host_users && u.devices["c"].unknown_users);
        // d: pod D is allocated it, but the kernel's smc uses it too.
        assert_eq!(u.devices["d"].traffic, Traffic::Shared);
        assert_eq!(
            u.devices["d"].kernel_users,
            ["smc".to_string()].into_iter().collect()
        );
        // e: pod C uses it without an allocation; it is e's only holder.
        assert_eq!(u.devices["e"].traffic, Traffic::Pod(pod("C")));
        assert_eq!(
            u.pods[&pod("C")].unallocated,
            ["e".to_string()].into_iter().collect()
        );
    }

    #[test]
    fn unused_devices_and_buckets() {
        let (mut s, pp, pd) = world();
        s.devices.push(DeviceEntry {
            index: 9,
            name: "idle".into(),
            ports: 1,
        });
        s.qps.push(qp(
            "idle",
            1,
            QpState::Rts,
            QpType::Gsi,
            None,
            Some("ib_core"),
        ));
        let u = attribute(&s, &pp, &pd);
        assert_eq!(u.devices["idle"].traffic, Traffic::Unused);
        assert!(u.devices["idle"].holders.is_empty());
        assert_eq!(u.host.devices["c"].qps, 1);
        assert_eq!(u.host.devices["c"].mr_bytes, 1);
        assert_eq!(
            u.host.owners["c"],
            ["999".to_string()].into_iter().collect()
        );
        assert_eq!(u.unknown.devices["c"].cqs, 1);
        assert_eq!(u.kernel.devices["d"].qps, 2);
        assert_eq!(
            u.kernel.owners["d"],
            ["ib_core".to_string(), "smc".to_string()]
                .into_iter()
                .collect()
        );
    }

    #[test]
    fn buckets_stay_bounded() {
        let mut s = Snapshot::default();
        for pid in 0..1000u32 {
            s.qps
                .push(qp("a", pid, QpState::Rts, QpType::Rc, Some(pid + 1), None));
        }
        let u = attribute(&s, &BTreeMap::new(), &BTreeMap::new());
        assert_eq!(u.host.devices["a"].qps, 1000);
        assert_eq!(u.host.owners["a"].len(), MAX_BUCKET_OWNERS);
        assert_eq!(u.host.owners_left_out["a"], 1000 - MAX_BUCKET_OWNERS as u64);
        assert_eq!(u.devices["a"].traffic, Traffic::Shared);
    }

    #[test]
    fn nothing_in_nothing_out() {
        let u = attribute(&Snapshot::default(), &BTreeMap::new(), &BTreeMap::new());
        assert_eq!(u, Usage::default());
    }
}
