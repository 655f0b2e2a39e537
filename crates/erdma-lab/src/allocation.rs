//! The allocation a pod starts with: the JSON that `erdma-fake-kubelet allocate -o json` prints
//! (one container's `ContainerAllocateResponse` plus the pod and the device IDs it got).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Why an allocation file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum AllocationError {
    /// The file could not be read.
    #[error(
        "cannot read allocation file {path}: {cause}; pass the JSON printed by `erdma-fake-kubelet allocate -o json`"
    )]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// The file is not an allocation in the expected shape.
    #[error(
        "allocation file {path} is not valid allocation JSON: {cause}; expected the output of `erdma-fake-kubelet allocate -o json`"
    )]
    Parse {
        /// The file.
        path: String,
        /// The JSON error, with line and column.
        cause: serde_json::Error,
    },
}

/// A bind mount of the Allocate response (`Mount` in the device-plugin API).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedMount {
    /// Where the mount appears inside the pod.
    pub container_path: String,
    /// What is mounted, on the node.
    pub host_path: String,
    /// Whether the pod may only read it.
    #[serde(default)]
    pub read_only: bool,
}

/// A device node of the Allocate response (`DeviceSpec` in the device-plugin API).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedDevice {
    /// Where the node appears inside the pod.
    pub container_path: String,
    /// The node on the node (its type and major:minor are copied).
    pub host_path: String,
    /// cgroup-style permissions, any of `r`, `w`, `m`; empty means `rwm`.
    #[serde(default)]
    pub permissions: String,
}

/// A CDI device reference: either a bare string or `{"name": ...}` as in the gRPC message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CdiReference {
    /// `"vendor.com/class=name"`.
    Name(String),
    /// `{"name": "vendor.com/class=name"}`.
    Object {
        /// The fully qualified CDI device name.
        name: String,
    },
}

impl CdiReference {
    /// The fully qualified CDI device name.
    pub fn name(&self) -> &str {
        match self {
            CdiReference::Name(n) | CdiReference::Object { name: n } => n,
        }
    }
}

/// What one container was given by the device plugin.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// `namespace/name` of the pod the allocation was made for.
    #[serde(default)]
    pub pod: String,
    /// The device (slot) IDs the kubelet chose.
    #[serde(default)]
    pub device_ids: Vec<String>,
    /// Environment variables for the container.
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    /// Bind mounts.
    #[serde(default)]
    pub mounts: Vec<AllocatedMount>,
    /// Device nodes.
    #[serde(default)]
    pub devices: Vec<AllocatedDevice>,
    /// Annotations (recorded, not applied: a pod has no runtime annotations here).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// CDI devices to resolve against the CDI spec directories.
    #[serde(default)]
    pub cdi_devices: Vec<CdiReference>,
}

impl Allocation {
    /// Parses allocation JSON.
    pub fn from_json(text: &str, origin: &str) -> Result<Self, AllocationError> {
        serde_json::from_str(text).map_err(|cause| AllocationError::Parse {
            path: origin.to_owned(),
            cause,
        })
    }

    /// Reads and parses an allocation file.
    pub fn from_file(path: &Path) -> Result<Self, AllocationError> {
        let text = std::fs::read_to_string(path).map_err(|cause| AllocationError::Read {
            path: path.display().to_string(),
            cause,
        })?;
        Self::from_json(&text, &path.display().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The shape `erdma-fake-kubelet allocate -o json` prints, written out by hand.
    const SAMPLE: &str = r#"{
      "pod": "lab/pod-a",
      "device_ids": ["rxe0/3"],
      "envs": {"ERDMA_DEVICES": "rxe0", "SMCR_PNET": "525400E70001"},
      "mounts": [{"container_path": "/etc/erdma", "host_path": "/run/erdma", "read_only": true}],
      "devices": [
        {"container_path": "/dev/infiniband/uverbs0", "host_path": "/dev/infiniband/uverbs0", "permissions": "rw"},
        {"container_path": "/dev/infiniband/rdma_cm", "host_path": "/dev/infiniband/rdma_cm", "permissions": "rw"}
      ],
      "annotations": {},
      "cdi_devices": ["erdma.aliyun.com/rdma=rxe0", {"name": "erdma.aliyun.com/rdma=rxe1"}]
    }"#;

    #[test]
    fn parses_the_fake_kubelet_output() {
        let a = Allocation::from_json(SAMPLE, "sample").expect("sample parses");
        assert_eq!(a.pod, "lab/pod-a");
        assert_eq!(a.device_ids, vec!["rxe0/3".to_owned()]);
        assert_eq!(
            a.envs.get("ERDMA_DEVICES").map(String::as_str),
            Some("rxe0")
        );
        assert_eq!(a.devices.len(), 2);
        assert_eq!(a.devices[1].container_path, "/dev/infiniband/rdma_cm");
        assert!(a.mounts[0].read_only);
        let names: Vec<&str> = a.cdi_devices.iter().map(CdiReference::name).collect();
        assert_eq!(
            names,
            ["erdma.aliyun.com/rdma=rxe0", "erdma.aliyun.com/rdma=rxe1"]
        );
    }

    #[test]
    fn missing_fields_default_to_empty() {
        let a = Allocation::from_json(r#"{"pod":"lab/c"}"#, "x").expect("parses");
        assert!(a.devices.is_empty() && a.mounts.is_empty() && a.envs.is_empty());
    }

    #[test]
    fn garbage_names_the_file_and_the_fix() {
        let err = Allocation::from_json(r#"{"devices": 7}"#, "/tmp/a.json").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("/tmp/a.json"), "{msg}");
        assert!(msg.contains("erdma-fake-kubelet allocate -o json"), "{msg}");
    }
}
