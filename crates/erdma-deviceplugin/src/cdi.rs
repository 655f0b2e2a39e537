//! CDI mode: a Container Device Interface spec file describing the served devices.
//!
//! One spec file `<spec_dir>/<vendor>-<class>.json` (CDI 0.6.0) with one CDI device per RDMA
//! device (its uverbs/umad nodes) and `rdma_cm` in the spec-wide edits, so every container that
//! gets any of these devices also gets `rdma_cm`. Allocate then answers with the fully qualified
//! names `<vendor>/<class>=<ibdev>`.

use crate::config::CdiConfig;
use crate::devices::ServedSet;
use erdma_host::atomic::{self, Durability};
use erdma_model::cdi::{ContainerEdits, Device, DeviceNode, Spec};
use std::path::PathBuf;

/// Errors writing the spec.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// The CDI kind is not `<vendor>/<class>`.
    #[error("CDI kind {0:?} is not <vendor>/<class> (e.g. aliyun.com/erdma)")]
    BadKind(String),
    /// Writing failed.
    #[error("write CDI spec {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Path of the spec file for `cfg`.
pub fn spec_path(cfg: &CdiConfig) -> Result<PathBuf, CdiError> {
    let (vendor, class) = cfg
        .kind
        .split_once('/')
        .ok_or_else(|| CdiError::BadKind(cfg.kind.clone()))?;
    if vendor.is_empty() || class.is_empty() || class.contains('/') {
        return Err(CdiError::BadKind(cfg.kind.clone()));
    }
    Ok(cfg.spec_dir.join(format!("{vendor}-{class}.json")))
}

/// The spec document for a served set.
pub fn spec(cfg: &CdiConfig, set: &ServedSet) -> Spec {
    let mut doc = Spec::new(cfg.kind.clone());
    doc.devices = set
        .devices
        .values()
        .map(|d| Device {
            name: d.name().to_string(),
            annotations: Default::default(),
            container_edits: ContainerEdits {
                device_nodes: d.char_devices().map(DeviceNode::rdma).collect(),
                ..Default::default()
            },
        })
        .collect();
    if let Some(cm) = &set.rdma_cm {
        doc.container_edits.device_nodes = vec![DeviceNode::rdma(cm)];
    }
    doc
}

/// Writes the spec atomically (temporary file + rename) when its content changed. No fsync: the
/// spec directory is tmpfs on a node (`/var/run/cdi`), and the plugin writes the spec again at
/// start.
pub fn write_spec(cfg: &CdiConfig, set: &ServedSet) -> Result<PathBuf, CdiError> {
    let path = spec_path(cfg)?;
    let io = |source| CdiError::Io {
        path: path.clone(),
        source,
    };
    let mut text =
        serde_json::to_vec_pretty(&spec(cfg, set)).map_err(|e| io(std::io::Error::other(e)))?;
    text.push(b'\n');
    if std::fs::read(&path).is_ok_and(|old| old == text) {
        return Ok(path);
    }
    atomic::write(&path, &text, Durability::Boot).map_err(|e| io(e.source))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use erdma_model::{CharDevice, DeviceKind, NodeDevices, RdmaDevice};

    fn char_device(path: &str) -> CharDevice {
        CharDevice {
            path: path.into(),
            major: Some(231),
            minor: Some(0),
            present: true,
        }
    }

    /// The typed spec serialises to the document the agent wrote with `json!` before (recorded in
    /// the lab, `crates/erdma-lab/testdata/cdi`), keys aside.
    #[test]
    fn the_spec_is_the_recorded_one() {
        let mut node = NodeDevices::empty();
        for i in 0..2 {
            let mut d = RdmaDevice::named(format!("rxe{i}"), DeviceKind::Rxe);
            d.char_devices.uverbs = Some(char_device(&format!("/dev/infiniband/uverbs{i}")));
            d.char_devices.umad = vec![char_device(&format!("/dev/infiniband/umad{i}"))];
            node.devices.push(d);
        }
        node.rdma_cm = Some(char_device("/dev/infiniband/rdma_cm"));
        let cfg = CdiConfig {
            spec_dir: "/var/run/cdi".into(),
            kind: "aliyun.com/erdma".into(),
        };
        let written = serde_json::to_value(spec(&cfg, &ServedSet::from_snapshot(&node, 4)))
            .expect("serialises");
        let recorded: serde_json::Value = serde_json::from_str(include_str!(
            "../../erdma-lab/testdata/cdi/aliyun.com-erdma.json"
        ))
        .expect("recorded spec");
        assert_eq!(written, recorded);
        assert_eq!(
            erdma_model::container::cdi_device(&cfg.kind, "rxe0"),
            "aliyun.com/erdma=rxe0",
            "the name Allocate answers with"
        );
    }
}
