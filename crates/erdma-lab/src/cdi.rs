//! Container Device Interface (CDI) specs: the part a pod runtime needs to resolve
//! `cdi_devices` of an Allocate response into device nodes, mounts and environment. Specs are
//! read as [`erdma_model::cdi::Spec`], the types the agent writes them with.
//!
//! Supported container edits: `env`, `deviceNodes`, `mounts`. Specs with `hooks` are refused
//! (the lab runtime does not run hooks, and silently skipping one would fake a working pod).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use erdma_model::cdi::{ContainerEdits, Spec};

use crate::allocation::{AllocatedDevice, AllocatedMount};

/// The directories CDI specs are read from when none are given.
pub const DEFAULT_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// Why CDI devices could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// A spec file could not be read.
    #[error("cannot read CDI spec {path}: {cause}")]
    Read {
        /// The spec file.
        path: String,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// A spec file is not a CDI spec.
    #[error("CDI spec {path} is invalid: {reason}; fix or remove the file")]
    Parse {
        /// The spec file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A device name is not of the form `vendor/class=name`.
    #[error("CDI device name {name:?} is not fully qualified; expected vendor.com/class=name")]
    BadName {
        /// The name as given.
        name: String,
    },
    /// No spec defines the device.
    #[error(
        "CDI device {name} is not defined by any spec in {dirs}; is the agent's CDI spec written there?"
    )]
    Unknown {
        /// The device asked for.
        name: String,
        /// The directories searched.
        dirs: String,
    },
    /// The spec needs something this runtime does not do.
    #[error(
        "CDI device {name} (spec {path}) uses {feature}, which the lab pod runtime does not support"
    )]
    Unsupported {
        /// The device.
        name: String,
        /// The spec file.
        path: String,
        /// The unsupported edit.
        feature: String,
    },
}

/// What resolving CDI devices adds to a pod.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CdiEdits {
    /// Environment variables.
    pub env: BTreeMap<String, String>,
    /// Device nodes.
    pub devices: Vec<AllocatedDevice>,
    /// Bind mounts.
    pub mounts: Vec<AllocatedMount>,
}

/// The CDI specs found in a set of directories.
#[derive(Debug, Default)]
pub struct CdiRegistry {
    specs: Vec<(PathBuf, Spec)>,
    dirs: Vec<PathBuf>,
}

impl CdiRegistry {
    /// Loads every `*.json`, `*.yaml` and `*.yml` spec in `dirs` (missing directories are empty).
    pub fn load(dirs: &[PathBuf]) -> Result<Self, CdiError> {
        let mut specs = Vec::new();
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut paths: Vec<PathBuf> =
                entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            paths.sort();
            for path in paths {
                let ext = path
                    .extension()
                    .and_then(|e| e.to_str())
                    .unwrap_or_default();
                if !matches!(ext, "json" | "yaml" | "yml") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).map_err(|cause| CdiError::Read {
                    path: path.display().to_string(),
                    cause,
                })?;
                specs.push((path.clone(), parse_spec(&text, &path)?));
            }
        }
        Ok(Self {
            specs,
            dirs: dirs.to_vec(),
        })
    }

    /// Resolves fully qualified device names into the edits they apply, spec-wide edits first.
    pub fn resolve(&self, names: &[&str]) -> Result<CdiEdits, CdiError> {
        let mut out = CdiEdits::default();
        for name in names {
            let (kind, dev) = split_name(name)?;
            let found = self.specs.iter().find_map(|(path, spec)| {
                (spec.kind == kind)
                    .then(|| {
                        spec.devices
                            .iter()
                            .find(|d| d.name == dev)
                            .map(|d| (path, spec, d))
                    })
                    .flatten()
            });
            let Some((path, spec, device)) = found else {
                return Err(CdiError::Unknown {
                    name: (*name).to_owned(),
                    dirs: self
                        .dirs
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            };
            for edits in [&spec.container_edits, &device.container_edits] {
                apply(edits, name, path, &mut out)?;
            }
        }
        Ok(out)
    }
}

fn parse_spec(text: &str, path: &Path) -> Result<Spec, CdiError> {
    let is_json = path.extension().is_some_and(|e| e == "json");
    let parsed = if is_json {
        serde_json::from_str::<Spec>(text).map_err(|e| e.to_string())
    } else {
        serde_saphyr::from_str::<Spec>(text).map_err(|e| e.to_string())
    };
    parsed.map_err(|reason| CdiError::Parse {
        path: path.display().to_string(),
        reason,
    })
}

fn split_name(name: &str) -> Result<(&str, &str), CdiError> {
    let bad = || CdiError::BadName {
        name: name.to_owned(),
    };
    let (kind, dev) = name.split_once('=').ok_or_else(bad)?;
    let (vendor, class) = kind.split_once('/').ok_or_else(bad)?;
    if vendor.is_empty() || class.is_empty() || dev.is_empty() {
        return Err(bad());
    }
    Ok((kind, dev))
}

fn apply(
    edits: &ContainerEdits,
    name: &str,
    path: &Path,
    out: &mut CdiEdits,
) -> Result<(), CdiError> {
    if !edits.hooks.is_empty() {
        return Err(CdiError::Unsupported {
            name: name.to_owned(),
            path: path.display().to_string(),
            feature: "hooks".to_owned(),
        });
    }
    for kv in &edits.env {
        let (k, v) = kv.split_once('=').ok_or_else(|| CdiError::Parse {
            path: path.display().to_string(),
            reason: format!("env entry {kv:?} of device {name} is not KEY=VALUE"),
        })?;
        out.env.insert(k.to_owned(), v.to_owned());
    }
    for node in &edits.device_nodes {
        out.devices.push(AllocatedDevice {
            container_path: node.path.clone(),
            host_path: node.host_path.clone().unwrap_or_else(|| node.path.clone()),
            permissions: node.permissions.clone().unwrap_or_default(),
        });
    }
    for m in &edits.mounts {
        out.mounts.push(AllocatedMount {
            container_path: m.container_path.clone(),
            host_path: m.host_path.clone(),
            read_only: m.options.iter().any(|o| o == "ro"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON_SPEC: &str = r#"{
      "cdiVersion": "0.6.0",
      "kind": "aliyun.com/erdma",
      "containerEdits": {"env": ["ERDMA_CDI=1"]},
      "devices": [
        {"name": "rxe0", "containerEdits": {
           "env": ["ERDMA_DEVICES=rxe0"],
           "deviceNodes": [{"path": "/dev/infiniband/uverbs0", "type": "c", "major": 231, "minor": 192, "permissions": "rw"}],
           "mounts": [{"hostPath": "/run/erdma/rxe0", "containerPath": "/run/erdma", "options": ["bind", "ro"]}]}},
        {"name": "hooked", "containerEdits": {"hooks": [{"hookName": "createContainer", "path": "/bin/true"}]}}
      ]
    }"#;

    const YAML_SPEC: &str = "cdiVersion: 0.6.0\nkind: example.com/nic\ndevices:\n  - name: n1\n    containerEdits:\n      deviceNodes:\n        - path: /dev/n1\n          hostPath: /dev/null\n";

    fn registry() -> (tempfile::TempDir, CdiRegistry) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("erdma.json"), JSON_SPEC).expect("write");
        std::fs::write(dir.path().join("nic.yaml"), YAML_SPEC).expect("write");
        std::fs::write(dir.path().join("README"), "not a spec").expect("write");
        let reg = CdiRegistry::load(&[dir.path().to_path_buf(), dir.path().join("missing")])
            .expect("loads");
        (dir, reg)
    }

    #[test]
    fn resolves_json_and_yaml_devices() {
        let (_dir, reg) = registry();
        let e = reg
            .resolve(&["aliyun.com/erdma=rxe0", "example.com/nic=n1"])
            .expect("resolves");
        assert_eq!(e.env.get("ERDMA_CDI").map(String::as_str), Some("1"));
        assert_eq!(e.env.get("ERDMA_DEVICES").map(String::as_str), Some("rxe0"));
        assert_eq!(e.devices[0].container_path, "/dev/infiniband/uverbs0");
        assert_eq!(
            e.devices[0].host_path, "/dev/infiniband/uverbs0",
            "hostPath defaults to path"
        );
        assert_eq!(e.devices[1].host_path, "/dev/null");
        assert_eq!(e.mounts[0].container_path, "/run/erdma");
        assert!(e.mounts[0].read_only);
    }

    #[test]
    fn unknown_bad_and_hooked_devices_are_refused_with_reasons() {
        let (_dir, reg) = registry();
        let unknown = reg
            .resolve(&["aliyun.com/erdma=rxe9"])
            .unwrap_err()
            .to_string();
        assert!(
            unknown.contains("rxe9") && unknown.contains("not defined"),
            "{unknown}"
        );
        let bad = reg.resolve(&["rxe0"]).unwrap_err().to_string();
        assert!(bad.contains("vendor.com/class=name"), "{bad}");
        let hooked = reg
            .resolve(&["aliyun.com/erdma=hooked"])
            .unwrap_err()
            .to_string();
        assert!(hooked.contains("hooks"), "{hooked}");
    }

    #[test]
    fn a_broken_spec_names_its_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("bad.json"), "{\"kind\": 3}").expect("write");
        let err = CdiRegistry::load(&[dir.path().to_path_buf()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("bad.json"), "{err}");
    }
}
