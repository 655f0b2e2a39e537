//! CDI mode: a Container Device Interface spec file describing the served devices.
//!
//! One spec file `<spec_dir>/<vendor>-<class>.json` (CDI 0.6.0) with one CDI device per RDMA
//! device (its uverbs/umad nodes) and `rdma_cm` in the spec-wide edits, so every container that
//! gets any of these devices also gets `rdma_cm`. Allocate then answers with the fully qualified
//! names `<vendor>/<class>=<ibdev>`.

use crate::config::CdiConfig;
use crate::devices::ServedSet;
use serde_json::{Value, json};
use std::path::PathBuf;

/// CDI specification version written.
pub const CDI_VERSION: &str = "0.6.0";

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

/// The fully qualified CDI name of a device.
pub fn qualified_name(cfg: &CdiConfig, device: &str) -> String {
    format!("{}={device}", cfg.kind)
}

/// The spec document for a served set.
pub fn spec(cfg: &CdiConfig, set: &ServedSet) -> Value {
    let devices: Vec<Value> = set
        .devices
        .values()
        .map(|d| {
            let nodes: Vec<Value> = d
                .char_devices()
                .map(|c| json!({"path": c.path, "permissions": "rw"}))
                .collect();
            json!({"name": d.name(), "containerEdits": {"deviceNodes": nodes}})
        })
        .collect();
    let mut doc = json!({"cdiVersion": CDI_VERSION, "kind": cfg.kind, "devices": devices});
    if let Some(cm) = &set.rdma_cm {
        doc["containerEdits"] = json!({"deviceNodes": [{"path": cm.path, "permissions": "rw"}]});
    }
    doc
}

/// Writes the spec atomically (temporary file + rename) when its content changed.
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
    std::fs::create_dir_all(&cfg.spec_dir).map_err(io)?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, &text).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(path)
}
