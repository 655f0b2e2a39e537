//! What `--erdma` adds: one `aliyun/erdma` unit, `IPC_LOCK`, and the NCCL settings for eRDMA.
//! Every value is justified in `docs/training.md` from `nccl-and-arena.md` (NCCL source and the
//! seed's benchmark recipe); nothing here is folklore. `NCCL_IB_TIMEOUT` / `NCCL_IB_RETRY_CNT` are
//! deliberately absent: in every eRDMA driver source we could read (upstream, out-of-tree r0.2.37)
//! they do not reach the device (docs/training.md has the evidence and the vendor's advice).

pub use erdma_model::names::{RESOURCE, SMCR_ANNOTATION};
/// The capability `ibv_reg_mr` needs unless the memlock limit is raised.
pub const IPC_LOCK: &str = "IPC_LOCK";

/// One recommended environment variable with the reason it is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclSetting {
    /// Variable name.
    pub name: &'static str,
    /// Value.
    pub value: &'static str,
    /// Why (one line, for `--help`-style listings and docs).
    pub why: &'static str,
}

const COMMON: &[NcclSetting] = &[
    NcclSetting {
        name: "NCCL_SOCKET_IFNAME",
        value: "eth0",
        why: "bootstrap and IB out-of-band interface; the pod's CNI interface is eth0",
    },
    NcclSetting {
        name: "NCCL_IB_HCA",
        value: "erdma",
        why: "prefix match: use the eRDMA devices (erdma_0, erdma_1, ...) and no other HCA",
    },
    NcclSetting {
        name: "NCCL_IB_GID_INDEX",
        value: "-1",
        why: "auto-select the RoCEv2 IPv4 GID per device; index 0 is the fe80:: GID and the IPv4 index differs per ERI",
    },
    NcclSetting {
        name: "NCCL_IB_ADDR_FAMILY",
        value: "AF_INET",
        why: "ERIs have IPv4 GIDs only (no IPv6 on ERIs)",
    },
    NcclSetting {
        name: "NCCL_IB_ROCE_VERSION_NUM",
        value: "2",
        why: "eRDMA's RoCE-compat mode is RoCEv2 only",
    },
    NcclSetting {
        name: "NCCL_DEBUG",
        value: "INFO",
        why: "log the transport decision (`NET/IB : Using erdma_0:1/RoCE`) for `erdmactl nccl analyze`",
    },
    NcclSetting {
        name: "NCCL_DEBUG_SUBSYS",
        value: "INIT,NET,GRAPH,ENV",
        why: "the subsystems that show device, network and GDR selection",
    },
];

const GPU: &[NcclSetting] = &[NcclSetting {
    name: "NCCL_NET_GDR_LEVEL",
    value: "SYS",
    why: "on eRDMA GPU instances the GPU-NIC path is SYS; the default PXB turns GPUDirect RDMA off",
}];

/// The recommended NCCL settings for eRDMA; GPU pods also get the GDR level.
pub fn nccl_settings(gpus: u32) -> Vec<NcclSetting> {
    let mut v = COMMON.to_vec();
    if gpus > 0 {
        v.extend_from_slice(GPU);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_cargo_cult_settings() {
        for gpus in [0, 8] {
            let names: Vec<_> = nccl_settings(gpus).iter().map(|s| s.name).collect();
            assert!(!names.contains(&"NCCL_IB_TIMEOUT"));
            assert!(!names.contains(&"NCCL_IB_RETRY_CNT"));
            assert!(names.contains(&"NCCL_IB_GID_INDEX"));
        }
        assert!(
            nccl_settings(1)
                .iter()
                .any(|s| s.name == "NCCL_NET_GDR_LEVEL" && s.value == "SYS")
        );
        assert!(
            !nccl_settings(0)
                .iter()
                .any(|s| s.name == "NCCL_NET_GDR_LEVEL")
        );
    }
}
