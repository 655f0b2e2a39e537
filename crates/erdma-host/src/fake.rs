//! Test support: a declarative builder of node trees (`sys/` and `dev/`) laid out like the kernel's
//! sysfs, a converter from the project's sysfs capture format, and a fixed interface-address source.
//!
//! Trees are real directories with real symlinks, read by the real [`crate::RootedSysfs`]; only
//! the content is synthetic. Character devices are created with `mknod` when the process may (root),
//! and as empty placeholder files otherwise (the inventory reports those as an info finding).

use crate::addrs::InterfaceAddrs;
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Component, Path, PathBuf};

/// A node tree: `<root>/sys` and `<root>/dev`.
pub struct NodeTree {
    _tmp: Option<tempfile::TempDir>,
    root: PathBuf,
    mknod: bool,
}

/// A PCI function.
#[derive(Debug, Clone)]
pub struct PciFn {
    /// Bus address, `0000:00:05.0`.
    pub address: String,
    /// `vendor` file content (`0x1ded`).
    pub vendor: String,
    /// `device` file content (`0x107f`).
    pub device: String,
    /// `numa_node` content (`-1`, `0`, `1`).
    pub numa_node: String,
    /// Bound driver name.
    pub driver: Option<String>,
}

/// A network interface.
#[derive(Debug, Clone)]
pub struct NetdevSpec {
    /// Name (`eth1`).
    pub name: String,
    /// `address` content.
    pub mac: String,
    /// `mtu` content.
    pub mtu: u32,
    /// `operstate` content.
    pub operstate: String,
    /// PCI function carrying the netdev through a virtio device (`None` = virtual netdev).
    pub pci: Option<String>,
}

/// One port.
#[derive(Debug, Clone)]
pub struct PortSpec {
    /// `state` content (`4: ACTIVE`).
    pub state: String,
    /// `phys_state` content.
    pub phys_state: String,
    /// `link_layer` content.
    pub link_layer: String,
    /// `rate` content.
    pub rate: String,
    /// GID entries: (index, gid text, type text, ndev).
    pub gids: Vec<(u32, String, Option<String>, Option<String>)>,
}

/// An RDMA device.
#[derive(Debug, Clone)]
pub struct RdmaSpec {
    /// ib device name.
    pub name: String,
    /// PCI function (`None` for software devices).
    pub pci: Option<String>,
    /// `parent` content for software devices.
    pub parent: Option<String>,
    /// `node_type` content.
    pub node_type: String,
    /// `node_guid` content.
    pub node_guid: String,
    /// `node_desc` content.
    pub node_desc: String,
    /// `fw_ver` content.
    pub fw_ver: String,
    /// Ports, numbered from 1.
    pub ports: Vec<PortSpec>,
    /// uverbs index (`uverbsN`), `None` for no verbs device.
    pub uverbs: Option<u32>,
    /// Create the `/dev/infiniband/uverbsN` node.
    pub uverbs_node: bool,
    /// umad index for port 1 (`umadN`), `None` for none.
    pub umad: Option<u32>,
}

impl Default for PortSpec {
    fn default() -> Self {
        PortSpec {
            state: "4: ACTIVE".into(),
            phys_state: "5: LinkUp".into(),
            link_layer: "Ethernet".into(),
            rate: "100 Gb/sec (4X EDR)".into(),
            gids: Vec::new(),
        }
    }
}

/// The relative symlink target that points from the link at `link` to `target` (both relative to
/// the same root).
pub fn relative_target(link: &Path, target: &Path) -> PathBuf {
    let from: Vec<Component> = link
        .parent()
        .unwrap_or(Path::new(""))
        .components()
        .collect();
    let to: Vec<Component> = target.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for c in &to[common..] {
        out.push(c);
    }
    out
}

impl NodeTree {
    /// A tree in a new temporary directory (removed on drop).
    pub fn temp() -> Self {
        Self::temp_in(std::env::temp_dir())
    }

    /// A tree in a fresh temporary directory under `parent` (removed on drop). Benchmarks put it
    /// on a tmpfs such as `/dev/shm`: memory-backed like sysfs, with no journal or writeback
    /// of the freshly written tree competing with what is measured.
    pub fn temp_in(parent: impl AsRef<Path>) -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("erdma-node")
            .tempdir_in(parent)
            .expect("create temp dir");
        let root = tmp.path().to_path_buf();
        let mut t = NodeTree::at(root);
        t._tmp = Some(tmp);
        t
    }

    /// A tree at `root` (created if needed, kept after drop).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        fs::create_dir_all(root.join("sys")).expect("create sys");
        fs::create_dir_all(root.join("dev")).expect("create dev");
        NodeTree {
            _tmp: None,
            root,
            mknod: nix::unistd::geteuid().is_root(),
        }
    }

    /// Never create real device nodes (placeholders only), e.g. for trees committed to git.
    pub fn placeholders_only(mut self) -> Self {
        self.mknod = false;
        self
    }

    /// The tree's root.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// `<root>/sys`.
    pub fn sys(&self) -> PathBuf {
        self.root.join("sys")
    }
    /// `<root>/dev`.
    pub fn dev(&self) -> PathBuf {
        self.root.join("dev")
    }

    /// Writes a file under `sys/` (parents created).
    pub fn write(&self, rel: impl AsRef<Path>, content: impl AsRef<[u8]>) -> &Self {
        let p = self.sys().join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).expect("create dirs");
        }
        fs::write(&p, content).expect("write file");
        self
    }

    /// Creates a directory under `sys/`.
    pub fn mkdir(&self, rel: impl AsRef<Path>) -> &Self {
        fs::create_dir_all(self.sys().join(rel)).expect("create dir");
        self
    }

    /// Creates a relative symlink under `sys/` from `link` to `target` (both relative to `sys/`).
    pub fn link(&self, link: impl AsRef<Path>, target: impl AsRef<Path>) -> &Self {
        self.raw_link(
            link.as_ref(),
            &relative_target(link.as_ref(), target.as_ref()),
        )
    }

    /// Creates a symlink under `sys/` with a verbatim target.
    pub fn raw_link(&self, link: &Path, target: &Path) -> &Self {
        let p = self.sys().join(link);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).expect("create dirs");
        }
        let _ = fs::remove_file(&p);
        std::os::unix::fs::symlink(target, &p).expect("symlink");
        self
    }

    /// Removes a path under `sys/` (file, link or directory).
    pub fn remove(&self, rel: impl AsRef<Path>) -> &Self {
        let p = self.sys().join(rel);
        let _ = fs::remove_file(&p).or_else(|_| fs::remove_dir_all(&p));
        self
    }

    /// Creates a character device node under `dev/` (a placeholder file when mknod is unavailable).
    pub fn char_node(&self, rel: impl AsRef<Path>, major: u32, minor: u32) -> &Self {
        let p = self.dev().join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).expect("create dirs");
        }
        let _ = fs::remove_file(&p);
        let made = self.mknod
            && nix::sys::stat::mknod(
                &p,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                nix::sys::stat::makedev(major.into(), minor.into()),
            )
            .is_ok();
        if !made {
            fs::write(&p, b"").expect("placeholder");
        }
        self
    }

    /// Removes a node under `dev/`.
    pub fn remove_dev(&self, rel: impl AsRef<Path>) -> &Self {
        let _ = fs::remove_file(self.dev().join(rel));
        self
    }

    fn pci_dir(address: &str) -> PathBuf {
        PathBuf::from("devices/pci0000:00").join(address)
    }

    /// Adds a PCI function.
    pub fn pci(&self, f: &PciFn) -> &Self {
        let dir = Self::pci_dir(&f.address);
        self.write(dir.join("vendor"), format!("{}\n", f.vendor));
        self.write(dir.join("device"), format!("{}\n", f.device));
        self.write(dir.join("numa_node"), format!("{}\n", f.numa_node));
        self.link(PathBuf::from("bus/pci/devices").join(&f.address), &dir);
        if let Some(driver) = &f.driver {
            let drv = PathBuf::from("bus/pci/drivers").join(driver);
            self.write(drv.join("uevent"), "");
            self.link(dir.join("driver"), &drv);
        }
        self
    }

    /// Adds a network interface (through a virtio device on its PCI function, or virtual).
    pub fn netdev(&self, n: &NetdevSpec) -> &Self {
        let dir = match &n.pci {
            Some(addr) => {
                let virtio = Self::pci_dir(addr).join(format!("virtio-{}", n.name));
                self.link(virtio.join("net").join(&n.name).join("device"), &virtio);
                virtio.join("net").join(&n.name)
            }
            None => PathBuf::from("devices/virtual/net").join(&n.name),
        };
        self.write(dir.join("address"), format!("{}\n", n.mac));
        self.write(dir.join("mtu"), format!("{}\n", n.mtu));
        self.link(PathBuf::from("class/net").join(&n.name), &dir);
        self.set_operstate(&n.name, &n.operstate)
    }

    /// Sets a netdev's operstate, and `flags` and `carrier` to match: `down` is an interface set
    /// down (no `IFF_UP`; `carrier` cannot be read then, so the file is absent),
    /// `lowerlayerdown` one that is up without a carrier, anything else one that is up with a
    /// carrier. (The kernel says `down` for a NIC that is up without a carrier too; write
    /// `flags` and `carrier` after this call for that case.)
    pub fn set_operstate(&self, netdev: &str, state: &str) -> &Self {
        let dir = PathBuf::from("class/net").join(netdev);
        self.write(dir.join("operstate"), format!("{state}\n"));
        let (flags, carrier) = match state {
            "down" => ("0x1002", None),
            "lowerlayerdown" => ("0x1003", Some("0")),
            _ => ("0x1003", Some("1")),
        };
        self.write(dir.join("flags"), format!("{flags}\n"));
        match carrier {
            Some(c) => self.write(dir.join("carrier"), format!("{c}\n")),
            None => self.remove(dir.join("carrier")),
        }
    }

    /// Adds an RDMA device with its ports, GIDs and char devices.
    pub fn rdma(&self, d: &RdmaSpec) -> &Self {
        let (dir, verbs_parent) = match &d.pci {
            Some(addr) => {
                let pci = Self::pci_dir(addr);
                let dir = pci.join("infiniband").join(&d.name);
                self.link(dir.join("device"), &pci);
                (dir, pci)
            }
            None => (
                PathBuf::from("devices/virtual/infiniband").join(&d.name),
                PathBuf::from("devices/virtual"),
            ),
        };
        self.write(dir.join("node_type"), format!("{}\n", d.node_type));
        self.write(dir.join("node_guid"), format!("{}\n", d.node_guid));
        self.write(dir.join("sys_image_guid"), format!("{}\n", d.node_guid));
        self.write(dir.join("node_desc"), format!("{}\n", d.node_desc));
        self.write(dir.join("fw_ver"), format!("{}\n", d.fw_ver));
        if let Some(p) = &d.parent {
            self.write(dir.join("parent"), format!("{p}\n"));
        }
        for (i, port) in d.ports.iter().enumerate() {
            let pd = dir.join("ports").join((i + 1).to_string());
            self.write(pd.join("state"), format!("{}\n", port.state));
            self.write(pd.join("phys_state"), format!("{}\n", port.phys_state));
            self.write(pd.join("link_layer"), format!("{}\n", port.link_layer));
            self.write(pd.join("rate"), format!("{}\n", port.rate));
            self.mkdir(pd.join("gids"));
            for (idx, gid, ty, ndev) in &port.gids {
                self.write(pd.join("gids").join(idx.to_string()), format!("{gid}\n"));
                if let Some(t) = ty {
                    self.write(
                        pd.join("gid_attrs/types").join(idx.to_string()),
                        format!("{t}\n"),
                    );
                }
                if let Some(n) = ndev {
                    self.write(
                        pd.join("gid_attrs/ndevs").join(idx.to_string()),
                        format!("{n}\n"),
                    );
                }
            }
        }
        self.link(PathBuf::from("class/infiniband").join(&d.name), &dir);
        if let Some(n) = d.uverbs {
            let name = format!("uverbs{n}");
            let vd = verbs_parent.join("infiniband_verbs").join(&name);
            self.write(vd.join("ibdev"), format!("{}\n", d.name));
            self.write(vd.join("dev"), format!("231:{}\n", 192 + n));
            self.link(PathBuf::from("class/infiniband_verbs").join(&name), &vd);
            if d.uverbs_node {
                self.char_node(PathBuf::from("infiniband").join(&name), 231, 192 + n);
            }
        }
        if let Some(n) = d.umad {
            let name = format!("umad{n}");
            let md = verbs_parent.join("infiniband_mad").join(&name);
            self.write(md.join("ibdev"), format!("{}\n", d.name));
            self.write(md.join("port"), "1\n");
            self.write(md.join("dev"), format!("231:{n}\n"));
            self.link(PathBuf::from("class/infiniband_mad").join(&name), &md);
            self.char_node(PathBuf::from("infiniband").join(&name), 231, n);
        }
        self
    }

    /// Writes `/sys/module/erdma/parameters/compat_mode` (`Y`/`N`).
    pub fn erdma_module(&self, compat_mode: bool) -> &Self {
        self.write(
            "module/erdma/parameters/compat_mode",
            if compat_mode { "Y\n" } else { "N\n" },
        )
    }

    /// Creates `/dev/infiniband/rdma_cm`.
    pub fn rdma_cm(&self) -> &Self {
        self.char_node("infiniband/rdma_cm", 10, 260)
    }

    /// Rebuilds a sysfs subtree from the project's capture format (see
    /// `testdata/sysfs/README.md`): `## /sys/<class link> -> /sys/<target>` starts a section whose
    /// `PATH: CONTENT` lines (`|` = newline), `PATH -> TARGET` links and `PATH/` directories are
    /// relative to the target. Sections that are command output (`## ls`, `## rdma …`) are skipped.
    pub fn import_capture(&self, capture: &str) -> io::Result<()> {
        let mut base: Option<PathBuf> = None;
        for line in capture.lines() {
            if let Some(header) = line.strip_prefix("## ") {
                base = header.split_once(" -> ").and_then(|(link, target)| {
                    let link = link.trim().strip_prefix("/sys/")?;
                    let target = target.trim().strip_prefix("/sys/")?;
                    if link != target {
                        self.link(link, target);
                    }
                    Some(PathBuf::from(target))
                });
                continue;
            }
            let Some(base) = &base else { continue };
            if line.starts_with('#') || line.trim().is_empty() || line.starts_with(' ') {
                continue;
            }
            if let Some((path, target)) = line.split_once(" -> ") {
                self.raw_link(&base.join(path.trim()), Path::new(target.trim()));
            } else if let Some(dir) = line.strip_suffix('/') {
                self.mkdir(base.join(dir));
            } else if let Some((path, content)) = line.split_once(": ") {
                if path.contains(['*', ' ']) {
                    continue;
                }
                self.write(base.join(path), format!("{}\n", content.replace('|', "\n")));
            } else if let Some(path) = line.strip_suffix(':') {
                self.write(base.join(path), "\n");
            }
        }
        Ok(())
    }
}

/// A fixed address table standing in for the kernel's interface list.
#[derive(Debug, Clone, Default)]
pub struct FixedInterfaceAddrs(pub BTreeMap<String, Vec<Ipv4Addr>>);

impl InterfaceAddrs for FixedInterfaceAddrs {
    fn ipv4_by_interface(&self) -> Result<BTreeMap<String, Vec<Ipv4Addr>>, String> {
        Ok(self.0.clone())
    }
}

/// A cgroup file system of a fixed layout: `rdma.max` texts in memory, every write recorded,
/// and writes refused with `fail_writes` when it is set (a read-only mount, a cgroup gone).
#[derive(Debug)]
pub struct FixedCgroupFs {
    /// The layout it reports.
    pub layout: crate::cgroup::CgroupLayout,
    /// `rdma.max` text by cgroup; a cgroup not in it does not exist.
    pub files: std::sync::Mutex<BTreeMap<PathBuf, String>>,
    /// Every write, in order: cgroup and line (refused ones too).
    pub writes: std::sync::Mutex<Vec<(PathBuf, String)>>,
    /// The error every write gets, when set.
    pub fail_writes: Option<io::ErrorKind>,
}

impl FixedCgroupFs {
    /// A host of `layout` with no cgroups.
    pub fn new(layout: crate::cgroup::CgroupLayout) -> Self {
        FixedCgroupFs {
            layout,
            files: Default::default(),
            writes: Default::default(),
            fail_writes: None,
        }
    }

    /// The writes so far.
    pub fn writes(&self) -> Vec<(PathBuf, String)> {
        self.writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl crate::cgroup::CgroupFs for FixedCgroupFs {
    fn layout(&self) -> crate::cgroup::CgroupLayout {
        self.layout
    }

    fn read_rdma_max(&self, cgroup: &Path) -> io::Result<String> {
        let files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        files
            .get(cgroup)
            .cloned()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn write_rdma_max(&self, cgroup: &Path, line: &str) -> io::Result<()> {
        self.writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((cgroup.to_path_buf(), line.to_string()));
        if let Some(kind) = self.fail_writes {
            return Err(io::Error::from(kind));
        }
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        let file = files
            .get_mut(cgroup)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        *file = line.to_string();
        Ok(())
    }

    fn rdma_max_path(&self, cgroup: &Path) -> PathBuf {
        Path::new("/sys/fs/cgroup/rdma")
            .join(cgroup)
            .join("rdma.max")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_targets() {
        assert_eq!(
            relative_target(
                Path::new("class/net/eth0"),
                Path::new("devices/virtual/net/eth0")
            ),
            PathBuf::from("../../devices/virtual/net/eth0")
        );
        assert_eq!(
            relative_target(
                Path::new("devices/p/0000:00:05.0/infiniband/erdma_0/device"),
                Path::new("devices/p/0000:00:05.0")
            ),
            PathBuf::from("../..")
        );
    }
}
