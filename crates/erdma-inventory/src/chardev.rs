//! Character devices: `uverbsN`, `umadN` and `rdma_cm`.

use erdma_host::{DevFs, DevNode, Sysfs};
use erdma_model::{CharDevice, Finding};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A class device (`uverbs0`, `umad0`) and what it belongs to.
pub(crate) struct ClassNode {
    pub name: String,
    /// `major:minor` from the class device's `dev` attribute.
    pub dev: Option<(u32, u32)>,
    /// Port number (umad only).
    pub port: Option<u32>,
}

/// Lists `class/<class>/<prefix>*` grouped by their `ibdev`.
pub(crate) fn class_nodes(
    sysfs: &dyn Sysfs,
    class: &str,
    prefix: &str,
    findings: &mut Vec<Finding>,
) -> BTreeMap<String, Vec<ClassNode>> {
    let mut out: BTreeMap<String, Vec<ClassNode>> = BTreeMap::new();
    let dir = PathBuf::from("class").join(class);
    let Ok(names) = sysfs.list_dir(&dir) else {
        return out;
    };
    for name in names.into_iter().filter(|n| n.starts_with(prefix)) {
        let base = dir.join(&name);
        let ibdev = match sysfs.read_attr(&base.join("ibdev")) {
            Ok(d) if !d.is_empty() => d,
            Ok(_) | Err(_) => {
                findings.push(Finding::warning(format!(
                    "{}/{}/ibdev is missing or empty: cannot tell which RDMA device {name} belongs to",
                    sysfs.describe(),
                    base.display()
                )));
                continue;
            }
        };
        let dev = sysfs
            .read_attr(&base.join("dev"))
            .ok()
            .and_then(|d| parse_dev(&d));
        let port = sysfs
            .read_attr(&base.join("port"))
            .ok()
            .and_then(|p| p.trim().parse().ok());
        out.entry(ibdev)
            .or_default()
            .push(ClassNode { name, dev, port });
    }
    out
}

fn parse_dev(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// The node the kernel announced for `name`, marked missing: listed with the kernel's numbers so
/// users see what was expected where.
pub(crate) fn missing(devfs: &dyn DevFs, name: &str, expected: Option<(u32, u32)>) -> CharDevice {
    CharDevice {
        path: devfs.container_path(&Path::new("infiniband").join(name)),
        major: expected.map(|e| e.0),
        minor: expected.map(|e| e.1),
        present: false,
    }
}

/// Looks up `/dev/infiniband/<name>`. Returns the char device, or the reason it is unusable.
pub(crate) fn lookup(
    devfs: &dyn DevFs,
    name: &str,
    expected: Option<(u32, u32)>,
    findings: &mut Vec<Finding>,
) -> Result<CharDevice, String> {
    let rel = Path::new("infiniband").join(name);
    let path = devfs.container_path(&rel);
    match devfs.node(&rel) {
        Ok(DevNode::Char { major, minor }) => {
            if let Some((emaj, emin)) = expected
                && (emaj, emin) != (major, minor)
            {
                return Err(format!(
                    "{} is {major}:{minor} but the kernel says {name} is {emaj}:{emin}: stale device node, recreate it (udev or mknod)",
                    devfs.host_path(&rel).display()
                ));
            }
            Ok(CharDevice {
                path,
                major: Some(major),
                minor: Some(minor),
                present: true,
            })
        }
        Ok(DevNode::NotChar) => {
            findings.push(Finding::info(format!(
                "{} exists but is not a character device (a fixture tree?); numbers taken from sysfs",
                devfs.host_path(&rel).display()
            )));
            Ok(CharDevice {
                path,
                major: expected.map(|e| e.0),
                minor: expected.map(|e| e.1),
                present: true,
            })
        }
        Ok(DevNode::Missing) => Err(format!(
            "char device {} is missing: is /dev from the host mounted, and did udev create it?",
            devfs.host_path(&rel).display()
        )),
        Err(e) => Err(format!(
            "cannot inspect {}: {e}",
            devfs.host_path(&rel).display()
        )),
    }
}
