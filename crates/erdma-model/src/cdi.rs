//! The Container Device Interface (CDI) spec, version 0.6.0, as typed data: what the device plugin
//! (CDI mode) and the DRA driver (per-claim specs) write under `/var/run/cdi`, and what the lab's
//! pod runtime reads. Field names and omission follow the CDI project's Go types
//! (`specs-go/config.go`, `omitempty`): empty lists, maps and unset optional fields are left out;
//! `cdiVersion`, `kind`, `devices`, a device's `name` and `containerEdits` are always written.
//! Reading is lenient as the runtimes are: missing lists are empty, unknown fields are ignored.

use crate::device::CharDevice;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The CDI specification version erdma writes.
pub const CDI_VERSION: &str = "0.6.0";

/// A CDI spec file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// `cdiVersion`.
    #[serde(rename = "cdiVersion")]
    pub version: String,
    /// `<vendor>/<class>`.
    pub kind: String,
    /// Spec annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The devices.
    #[serde(default)]
    pub devices: Vec<Device>,
    /// Edits applied with any device of the spec.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

impl Spec {
    /// An empty spec of [`CDI_VERSION`] for `kind`.
    pub fn new(kind: impl Into<String>) -> Self {
        Spec {
            version: CDI_VERSION.to_string(),
            kind: kind.into(),
            annotations: BTreeMap::new(),
            devices: Vec::new(),
            container_edits: ContainerEdits::default(),
        }
    }
}

/// One CDI device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Name, unique in the spec.
    pub name: String,
    /// Device annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// What the device adds to a container.
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// Edits to a container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `KEY=VALUE` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// OCI hooks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

impl ContainerEdits {
    /// True when the edits change nothing.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
    }

    /// `env` from variables keyed by name, as `KEY=VALUE` entries in key order.
    pub fn env_from<K: AsRef<str>, V: AsRef<str>>(
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Vec<String> {
        vars.into_iter()
            .map(|(k, v)| format!("{}={}", k.as_ref(), v.as_ref()))
            .collect()
    }
}

/// A device node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host, when not `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c`, `b`, `u` or `p`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Major number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// File mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Cgroup permissions, `r`, `w`, `m` combined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// Owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

impl DeviceNode {
    /// How erdma hands an RDMA character device to a container: same path inside, read-write
    /// (the runtime takes type and numbers from the host node).
    pub fn rdma(c: &CharDevice) -> Self {
        DeviceNode {
            path: c.path.clone(),
            permissions: Some("rw".to_string()),
            ..DeviceNode::default()
        }
    }
}

/// A mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Target in the container.
    pub container_path: String,
    /// Mount options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// File system type.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// An OCI hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// `createRuntime`, `createContainer`, `startContainer`, `poststart`, `poststop`, ...
    pub hook_name: String,
    /// The executable.
    pub path: String,
    /// Arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// `KEY=VALUE` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Timeout in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CDI 0.6.0 spec written by hand after the CDI project's SPEC.md (every field of the types
    /// above, none empty), not by erdma's code.
    const HAND_WRITTEN: &str = r#"{
      "cdiVersion": "0.6.0",
      "kind": "vendor.com/device",
      "annotations": {"vendor.com/owner": "lab"},
      "devices": [
        {
          "name": "myDevice",
          "annotations": {"vendor.com/slot": "3"},
          "containerEdits": {
            "env": ["FOO=VALID_SPEC", "BAR=BARVALUE1"],
            "deviceNodes": [
              {"path": "/dev/vfio/71", "hostPath": "/dev/vfio/71", "type": "c", "major": 241,
               "minor": 71, "fileMode": 432, "permissions": "rw", "uid": 1000, "gid": 1000},
              {"path": "/dev/card1"}
            ],
            "mounts": [
              {"hostPath": "/bin/vendorBin", "containerPath": "/bin/vendorBin"},
              {"hostPath": "/usr/lib/libVendor.so.0", "containerPath": "/usr/lib/libVendor.so.0",
               "type": "bind", "options": ["ro", "nosuid"]}
            ],
            "hooks": [
              {"hookName": "createContainer", "path": "/bin/vendor-hook", "args": ["vendor-hook", "--x"],
               "env": ["HOOK=1"], "timeout": 5}
            ]
          }
        },
        {"name": "bare", "containerEdits": {"deviceNodes": [{"path": "/dev/card2"}]}}
      ],
      "containerEdits": {
        "env": ["FOO=VALID_SPEC"],
        "hooks": [{"hookName": "createContainer", "path": "/bin/vendor-hook"}],
        "mounts": [{"hostPath": "/bin/vendorBin", "containerPath": "/bin/vendorBin"}]
      }
    }"#;

    #[test]
    fn a_hand_written_spec_round_trips() {
        let doc: serde_json::Value = serde_json::from_str(HAND_WRITTEN).expect("json");
        let spec: Spec = serde_json::from_value(doc.clone()).expect("a CDI spec");
        assert_eq!(spec.version, CDI_VERSION);
        assert_eq!(
            spec.devices[0].container_edits.device_nodes[0].file_mode,
            Some(0o660)
        );
        assert_eq!(
            spec.devices[0].container_edits.mounts[1].kind.as_deref(),
            Some("bind")
        );
        assert_eq!(spec.devices[0].container_edits.hooks[0].timeout, Some(5));
        assert_eq!(
            crate::container::cdi_device(&spec.kind, "bare"),
            "vendor.com/device=bare"
        );
        let back = serde_json::to_value(&spec).expect("serialises");
        assert_eq!(back, doc, "every field written back as read");
    }

    #[test]
    fn empties_are_left_out_and_read_back_as_empty() {
        let mut spec = Spec::new("aliyun.com/erdma");
        spec.devices.push(Device {
            name: "erdma_0".into(),
            annotations: BTreeMap::new(),
            container_edits: ContainerEdits::default(),
        });
        let doc = serde_json::to_value(&spec).expect("serialises");
        assert_eq!(
            doc,
            serde_json::json!({
                "cdiVersion": "0.6.0",
                "kind": "aliyun.com/erdma",
                "devices": [{"name": "erdma_0", "containerEdits": {}}],
            })
        );
        let back: Spec = serde_json::from_value(doc).expect("reads");
        assert_eq!(back, spec);
        let minimal: Spec =
            serde_json::from_str(r#"{"cdiVersion": "0.6.0", "kind": "a.com/b", "x": 1}"#)
                .expect("missing lists are empty, unknown fields ignored");
        assert!(minimal.devices.is_empty() && minimal.container_edits.is_empty());
    }

    #[test]
    fn rdma_nodes_and_env_entries() {
        let c = CharDevice {
            path: "/dev/infiniband/uverbs0".into(),
            major: Some(231),
            minor: Some(192),
            present: true,
        };
        assert_eq!(
            serde_json::to_value(DeviceNode::rdma(&c)).expect("serialises"),
            serde_json::json!({"path": "/dev/infiniband/uverbs0", "permissions": "rw"})
        );
        assert_eq!(
            ContainerEdits::env_from([("A", "1"), ("B", "=x")]),
            ["A=1", "B==x"]
        );
    }
}
