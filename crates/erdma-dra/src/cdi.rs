//! Per-claim CDI specs.
//!
//! Each prepared claim gets its own spec file `<cdi_dir>/<driver>-claim_<uid>.json` (CDI 0.6.0,
//! kind `<driver>/claim`) with one CDI device per allocated RDMA device, named
//! `<claim uid>-<device>`, so two claims sharing one device have separate specs, separate CDI
//! IDs and separate limits. A device's container edits carry its char devices (uverbs, umad) and
//! `rdma_cm`, the env variables the device plugin sets, and the rdma cgroup limits the claim
//! consumed: as the env `ERDMA_RDMA_MAX` and as the CDI device annotation
//! `erdma.alibabacloud.com/rdma.max` (the hand-off to the runtime-side NRI plugin, which writes
//! them into the container's `rdma.max`).
//!
//! The env variables are set under the claim's own names
//! ([`erdma_model::container::claim_env_name`]: `ERDMA_DEVICES_<UID>`, `ERDMA_RDMA_MAX_<UID>`…):
//! the runtime merges the env of every CDI device a container gets, a later variable replacing an
//! earlier one of the same name, so a container with two claims would otherwise see only the
//! last claim's devices and limits. A device prepared for admin access has no limit (no
//! annotation, no `ERDMA_RDMA_MAX` entry).

use crate::error::{DraError, Result, io_err};
use erdma_host::atomic::{self, Durability};
use erdma_model::CharDevice;
use erdma_model::RdmaDevice;
use erdma_model::cdi::{ContainerEdits, Device, DeviceNode, Spec};
use erdma_model::container::{ANNOTATION_RDMA_MAX, ClaimEnv, ENV_RDMA_MAX, claim_env_name};
use std::path::{Path, PathBuf};

/// Spec annotation with the claim UID.
pub const ANNOTATION_CLAIM_UID: &str = "erdma.alibabacloud.com/claim-uid";

/// rdma cgroup limits one claim consumed on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RdmaLimits {
    /// `hca_handle`.
    pub hca_handle: u64,
    /// `hca_object`.
    pub hca_object: u64,
}

impl RdmaLimits {
    /// The `rdma.max` line for `ibdev`.
    pub fn line(&self, ibdev: &str) -> String {
        format!(
            "{ibdev} hca_handle={} hca_object={}",
            self.hca_handle, self.hca_object
        )
    }
}

/// One device of a claim as the spec needs it.
#[derive(Debug, Clone)]
pub struct ClaimDevice<'a> {
    /// The inventoried device.
    pub device: &'a RdmaDevice,
    /// The limits the claim consumed on it; `None`: admin access, no limit.
    pub limits: Option<RdmaLimits>,
}

/// The CDI kind of the per-claim specs: `<driver>/claim`.
pub fn kind(driver: &str) -> String {
    format!("{driver}/claim")
}

/// The spec file of a claim.
pub fn spec_path(cdi_dir: &Path, driver: &str, claim_uid: &str) -> PathBuf {
    cdi_dir.join(format!("{driver}-claim_{claim_uid}.json"))
}

/// The CDI device name of a device of a claim (`<uid>-<ibdev>`).
pub fn device_name(claim_uid: &str, ibdev: &str) -> String {
    format!("{claim_uid}-{ibdev}")
}

/// The fully qualified CDI ID of a device of a claim.
pub fn qualified_name(driver: &str, claim_uid: &str, ibdev: &str) -> String {
    erdma_model::container::cdi_device(&kind(driver), &device_name(claim_uid, ibdev))
}

/// True when a claim UID can be part of a file name and a CDI device name (letters, digits,
/// `-`, `_`, `.`; as API-server UIDs are).
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 128
        && uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && uid.as_bytes()[0].is_ascii_alphanumeric()
}

/// The spec document of a claim. `devices` is sorted by ib device name by the caller.
pub fn spec(
    driver: &str,
    claim_uid: &str,
    devices: &[ClaimDevice<'_>],
    rdma_cm: Option<&CharDevice>,
) -> Spec {
    let lines: Vec<Option<String>> = devices
        .iter()
        .map(|d| d.limits.map(|l| l.line(&d.device.name)))
        .collect();
    let rdma_max: Vec<String> = lines.iter().flatten().cloned().collect();
    let mut env = erdma_model::container::claim_env(
        devices.iter().map(|d| d.device),
        ClaimEnv {
            uid: claim_uid,
            rdma_max: &rdma_max,
        },
    );
    if rdma_max.is_empty() {
        env.remove(&claim_env_name(ENV_RDMA_MAX, claim_uid));
    }
    let mut doc = Spec::new(kind(driver));
    doc.annotations
        .insert(ANNOTATION_CLAIM_UID.to_string(), claim_uid.to_string());
    doc.devices = devices
        .iter()
        .zip(lines)
        .map(|(d, line)| Device {
            name: device_name(claim_uid, &d.device.name),
            annotations: line
                .map(|l| (ANNOTATION_RDMA_MAX.to_string(), l))
                .into_iter()
                .collect(),
            container_edits: ContainerEdits {
                device_nodes: d.device.char_devices.all().map(DeviceNode::rdma).collect(),
                ..ContainerEdits::default()
            },
        })
        .collect();
    doc.container_edits = ContainerEdits {
        env: ContainerEdits::env_from(env),
        device_nodes: rdma_cm.map(DeviceNode::rdma).into_iter().collect(),
        ..ContainerEdits::default()
    };
    doc
}

/// Writes a claim's spec atomically. No fsync (see [`crate::checkpoint::Checkpoint::save`]).
pub fn write(path: &Path, doc: &Spec) -> Result<()> {
    let mut text = serde_json::to_vec_pretty(doc).map_err(|source| DraError::Json {
        what: "CDI spec",
        path: path.to_path_buf(),
        source,
    })?;
    text.push(b'\n');
    atomic::write(path, &text, Durability::Boot)?;
    Ok(())
}

/// Removes a claim's spec; a missing file is fine.
pub fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("remove CDI spec", path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use erdma_model::DeviceKind;
    use erdma_model::cdi::CDI_VERSION;
    use std::collections::BTreeMap;

    #[test]
    fn claim_spec_has_devices_envs_and_limits() {
        let mut d = RdmaDevice::named("erdma_0", DeviceKind::Erdma);
        d.char_devices.uverbs = Some(CharDevice {
            path: "/dev/infiniband/uverbs0".into(),
            major: Some(231),
            minor: Some(192),
            present: true,
        });
        let cm = CharDevice {
            path: "/dev/infiniband/rdma_cm".into(),
            major: Some(10),
            minor: Some(58),
            present: true,
        };
        let limits = RdmaLimits {
            hca_handle: 4,
            hca_object: 8000,
        };
        let doc = serde_json::to_value(spec(
            "erdma.alibabacloud.com",
            "uid-1",
            &[ClaimDevice {
                device: &d,
                limits: Some(limits),
            }],
            Some(&cm),
        ))
        .expect("serialises");
        assert_eq!(doc["cdiVersion"], CDI_VERSION);
        assert_eq!(doc["kind"], "erdma.alibabacloud.com/claim");
        assert_eq!(doc["annotations"][ANNOTATION_CLAIM_UID], "uid-1");
        assert_eq!(doc["devices"][0]["name"], "uid-1-erdma_0");
        assert_eq!(
            doc["devices"][0]["containerEdits"]["deviceNodes"][0]["path"],
            "/dev/infiniband/uverbs0"
        );
        assert_eq!(
            doc["devices"][0]["annotations"][ANNOTATION_RDMA_MAX],
            "erdma_0 hca_handle=4 hca_object=8000"
        );
        let env: Vec<&str> = doc["containerEdits"]["env"]
            .as_array()
            .expect("env")
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert!(env.contains(&"ERDMA_DEVICES_UID_1=erdma_0"));
        assert!(env.contains(&"ERDMA_NCCL_IB_HCA_UID_1==erdma_0"));
        assert!(env.contains(&"ERDMA_RDMA_MAX_UID_1=erdma_0 hca_handle=4 hca_object=8000"));
        assert_eq!(
            doc["containerEdits"]["deviceNodes"][0]["path"],
            "/dev/infiniband/rdma_cm"
        );
        assert_eq!(
            qualified_name("erdma.alibabacloud.com", "uid-1", "erdma_0"),
            "erdma.alibabacloud.com/claim=uid-1-erdma_0"
        );
        // The whole document (the env entries in name order, under the claim's names).
        assert_eq!(
            doc,
            serde_json::json!({
                "cdiVersion": "0.6.0",
                "kind": "erdma.alibabacloud.com/claim",
                "annotations": {"erdma.alibabacloud.com/claim-uid": "uid-1"},
                "devices": [{
                    "name": "uid-1-erdma_0",
                    "annotations": {"erdma.alibabacloud.com/rdma.max": "erdma_0 hca_handle=4 hca_object=8000"},
                    "containerEdits": {"deviceNodes": [{"path": "/dev/infiniband/uverbs0", "permissions": "rw"}]},
                }],
                "containerEdits": {
                    "env": [
                        "ERDMA_DEVICES_UID_1=erdma_0",
                        "ERDMA_DRA_CLAIM_UID_UID_1=uid-1",
                        "ERDMA_NCCL_IB_HCA_UID_1==erdma_0",
                        "ERDMA_RDMA_MAX_UID_1=erdma_0 hca_handle=4 hca_object=8000",
                    ],
                    "deviceNodes": [{"path": "/dev/infiniband/rdma_cm", "permissions": "rw"}],
                },
            })
        );
    }

    /// The env a container gets from CDI devices of several specs, merged as the runtime does:
    /// in order, a later variable replacing an earlier one of the same name.
    fn merged_env(specs: &[&Spec]) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        for s in specs {
            for e in &s.container_edits.env {
                let (k, v) = e.split_once('=').expect("KEY=VALUE");
                env.insert(k.to_string(), v.to_string());
            }
        }
        env
    }

    fn device(name: &str, minor: u32) -> RdmaDevice {
        let mut d = RdmaDevice::named(name, DeviceKind::Erdma);
        d.char_devices.uverbs = Some(CharDevice {
            path: format!("/dev/infiniband/uverbs{minor}"),
            major: Some(231),
            minor: Some(192 + minor),
            present: true,
        });
        d
    }

    #[test]
    fn two_claims_in_one_container_keep_both_device_lists_and_limits() {
        let (a, b) = (device("erdma_0", 0), device("erdma_1", 1));
        let limits = |h| {
            Some(RdmaLimits {
                hca_handle: h,
                hca_object: 8000,
            })
        };
        let claim_a = spec(
            "erdma.alibabacloud.com",
            "uid-a",
            &[ClaimDevice {
                device: &a,
                limits: limits(4),
            }],
            None,
        );
        let claim_b = spec(
            "erdma.alibabacloud.com",
            "uid-b",
            &[ClaimDevice {
                device: &b,
                limits: limits(6),
            }],
            None,
        );
        let env = merged_env(&[&claim_a, &claim_b]);
        assert_eq!(env["ERDMA_DEVICES_UID_A"], "erdma_0");
        assert_eq!(env["ERDMA_DEVICES_UID_B"], "erdma_1");
        assert_eq!(env["ERDMA_NCCL_IB_HCA_UID_A"], "=erdma_0");
        assert_eq!(env["ERDMA_NCCL_IB_HCA_UID_B"], "=erdma_1");
        assert_eq!(
            env["ERDMA_RDMA_MAX_UID_A"],
            "erdma_0 hca_handle=4 hca_object=8000"
        );
        assert_eq!(
            env["ERDMA_RDMA_MAX_UID_B"],
            "erdma_1 hca_handle=6 hca_object=8000"
        );
        assert_eq!(env["ERDMA_DRA_CLAIM_UID_UID_A"], "uid-a");
        assert_eq!(env["ERDMA_DRA_CLAIM_UID_UID_B"], "uid-b");
        assert_eq!(
            merged_env(&[&claim_b, &claim_a]),
            env,
            "the order of the claims does not matter"
        );
    }

    #[test]
    fn an_admin_device_has_no_limit() {
        let (a, b) = (device("erdma_0", 0), device("erdma_1", 1));
        let doc = spec(
            "erdma.alibabacloud.com",
            "uid-m",
            &[
                ClaimDevice {
                    device: &a,
                    limits: None,
                },
                ClaimDevice {
                    device: &b,
                    limits: Some(RdmaLimits {
                        hca_handle: 4,
                        hca_object: 8000,
                    }),
                },
            ],
            None,
        );
        assert!(doc.devices[0].annotations.is_empty(), "admin: no rdma.max");
        assert_eq!(
            doc.devices[1].annotations[ANNOTATION_RDMA_MAX],
            "erdma_1 hca_handle=4 hca_object=8000"
        );
        let env = merged_env(&[&doc]);
        assert_eq!(env["ERDMA_DEVICES_UID_M"], "erdma_0,erdma_1");
        assert_eq!(
            env["ERDMA_RDMA_MAX_UID_M"],
            "erdma_1 hca_handle=4 hca_object=8000"
        );

        let only_admin = spec(
            "erdma.alibabacloud.com",
            "uid-m",
            &[ClaimDevice {
                device: &a,
                limits: None,
            }],
            None,
        );
        let env = merged_env(&[&only_admin]);
        assert_eq!(env["ERDMA_DEVICES_UID_M"], "erdma_0");
        assert!(
            !env.contains_key("ERDMA_RDMA_MAX_UID_M"),
            "no limit to hand over: {env:?}"
        );
    }

    #[test]
    fn uids_safe_for_files() {
        assert!(valid_uid("0b1c6f5e-1f6b-4a57-9d0e-1a2b3c4d5e6f"));
        assert!(!valid_uid("../etc"));
        assert!(!valid_uid(""));
        assert!(!valid_uid("a/b"));
    }
}
