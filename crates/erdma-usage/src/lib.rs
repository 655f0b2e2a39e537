//! Per-pod RDMA usage, read from the kernel and attributed to pods.
//!
//! **What it reads.** The kernel tracks every RDMA object, whatever the driver (`erdma`, `mlx5`,
//! Soft-RoCE `rxe` alike: the core's resource tracking, `drivers/infiniband/core/restrack.c`), and
//! reports them over RDMA netlink (`NETLINK_RDMA`, the "nldev" client, as `rdma resource show`
//! reads them): queue pairs with their state and type, memory regions with the bytes they pin,
//! completion queues and protection domains, each with the PID that created it (or the kernel
//! user's name), and each port's hardware counters (`rdma statistic`, sysfs `hw_counters/`).
//! Nothing needs the driver's cooperation or a device opened by us, so the same code reads eRDMA
//! on a node and `rxe` in the lab.
//!
//! **Why.** Which pod holds how many QPs in which state, how much memory it pins, and whose a
//! device's traffic is, are what `erdmactl top`, the agent's metrics and doctor's verdicts need
//! (issue 32): this crate is that foundation, with no Kubernetes or RPC dependency.
//!
//! - [`nldev`]: the request encoder and the answer parser (bounded, never panics).
//! - [`source`]: the [`source::UsageSource`] door, the netlink implementation with a receive
//!   timeout, a fake, and [`source::Snapshot`].
//! - [`cgroup`]: a PID's pod and container from `/proc/<pid>/cgroup`.
//! - [`sysfs`]: a port's `hw_counters/` and `counters/` from sysfs.
//! - [`attribution`]: usage per pod and device, and whose each device's traffic is (a pod's only
//!   when it is the device's only holder; never a made-up split).
//! - [`report`]: the agent's usage answer as it travels (`GET /usage`, JSON), built from
//!   [`Usage`] and the pods' names; what `erdmactl top` and doctor read.
pub mod attribution;
pub mod cgroup;
#[cfg(test)]
mod kernel_tests;
pub mod nldev;
pub mod report;
pub mod source;
pub mod sysfs;

pub use attribution::{PidPods, PodDevices, Traffic, Usage, attribute};
pub use cgroup::{ContainerId, PodUid};
pub use nldev::{
    CqEntry, DeviceEntry, MrEntry, Owner, PdEntry, PortCounters, QpEntry, QpState, QpType,
};
pub use source::{FakeSource, NetlinkSource, Snapshot, UsageError, UsageSource};

/// The whole read, as the agent will do it: a [`Snapshot`] of `src`, each owner PID's pod from
/// `<proc_root>/<pid>/cgroup` (`/proc` on a host, read from the host's PID namespace), and the
/// attribution with the kubelet's allocations `pod_devices`.
pub fn read_usage(
    src: &dyn UsageSource,
    proc_root: &std::path::Path,
    pod_devices: &PodDevices,
) -> Result<(Snapshot, Usage), UsageError> {
    let snap = Snapshot::read(src)?;
    let pid_pods = cgroup::read_pid_pods(proc_root, &snap.pids());
    let usage = attribute(&snap, &pid_pods, pod_devices);
    Ok((snap, usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_read_over_a_fake_and_a_fake_proc() {
        let uid = "6a0b2c3d-1e2f-4a5b-8c7d-9e0f1a2b3c4d";
        let cid = "ab".repeat(32);
        let proc_root =
            std::env::temp_dir().join(format!("erdma-usage-read-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&proc_root);
        std::fs::create_dir_all(proc_root.join("42")).unwrap();
        std::fs::write(
            proc_root.join("42/cgroup"),
            format!(
                "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{cid}.scope\n",
                uid.replace('-', "_")
            ),
        )
        .unwrap();
        let src = FakeSource {
            devices: vec![DeviceEntry {
                index: 0,
                name: "erdma_0".into(),
                ports: 1,
            }],
            qps: vec![QpEntry {
                dev_index: 0,
                dev_name: "erdma_0".into(),
                port: Some(1),
                lqpn: 17,
                state: QpState::Rts,
                qp_type: QpType::Rc,
                pid: Some(42),
                kern_name: None,
            }],
            mrs: vec![MrEntry {
                dev_index: 0,
                dev_name: "erdma_0".into(),
                mrn: Some(1),
                mr_len: 1 << 30,
                pdn: Some(1),
                pid: Some(42),
                kern_name: None,
            }],
            port_counters: vec![PortCounters {
                dev_index: 0,
                dev_name: "erdma_0".into(),
                port: 1,
                ..Default::default()
            }],
            ..Default::default()
        };
        let pod = PodUid(uid.into());
        let alloc = [(pod.clone(), ["erdma_0".to_string()].into_iter().collect())]
            .into_iter()
            .collect();
        let (snap, usage) = read_usage(&src, &proc_root, &alloc).unwrap();
        std::fs::remove_dir_all(&proc_root).unwrap();
        assert_eq!(snap.qps.len(), 1);
        let p = &usage.pods[&pod];
        assert_eq!(p.containers.iter().next(), Some(&ContainerId(cid)));
        assert_eq!(p.devices["erdma_0"].mr_bytes, 1 << 30);
        assert_eq!(usage.devices["erdma_0"].traffic, Traffic::Pod(pod));
    }
}
