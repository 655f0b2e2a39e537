//! The node-level scan: every device under `class/infiniband`, plus node-wide facts.

use crate::chardev::{self, ClassNode};
use crate::netdev::{self, Interfaces};
use crate::read::Notes;
use crate::{Sources, identity, mode, ports};
use erdma_model::port::iboe_active_mtu;
use erdma_model::{
    CharDevices, DeviceKind, DeviceMode, Finding, Health, LinkLayer, NodeDevices, NodeGuid,
    NodeType, PnetId, PortState, RdmaDevice,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The sysfs class directory of RDMA devices.
pub const DEVICE_CLASS: &str = "class/infiniband";

/// Most devices inventoried; more is not a real node.
const MAX_DEVICES: usize = 1024;

/// Node-wide facts every device scan needs.
struct NodeContext {
    compat_mode: Option<bool>,
    uverbs: BTreeMap<String, Vec<ClassNode>>,
    umad: BTreeMap<String, Vec<ClassNode>>,
    ifaces: Interfaces,
}

/// How much of each device a scan reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Everything but the GID tables (see [`crate::Inventory::scan_identity`]).
    Identity,
    /// Everything.
    Full,
}

/// How many threads a scan reads its devices on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Threads {
    /// One per CPU the process may use, as the node's size warrants ([`workers_for`]).
    Split,
    /// The calling thread alone.
    One,
}

pub(crate) fn scan(sources: &Sources, pass: Pass, threads: Threads) -> NodeDevices {
    let sysfs = sources.sysfs.as_ref();
    sysfs.refresh();
    sysfs.close_rereads();
    let mut node = NodeDevices::empty();

    node.erdma_compat_mode = match sysfs.read_attr(Path::new("module/erdma/parameters/compat_mode"))
    {
        Ok(v) if v == "Y" || v == "1" => Some(true),
        Ok(v) if v == "N" || v == "0" => Some(false),
        Ok(v) => {
            node.findings.push(Finding::error(format!(
                "{}/module/erdma/parameters/compat_mode is {v:?} (expected Y or N)",
                sysfs.describe()
            )));
            None
        }
        Err(_) => None,
    };

    let names = match sysfs.list_dir(Path::new(DEVICE_CLASS)) {
        Ok(n) => n,
        Err(e) => {
            node.findings.push(Finding::error(format!(
                "no RDMA devices: {e} (is ib_core loaded? is the host's /sys mounted?)"
            )));
            Vec::new()
        }
    };
    if names.len() > MAX_DEVICES {
        node.findings.push(Finding::error(format!(
            "{} RDMA devices found; only the first {MAX_DEVICES} are inventoried",
            names.len()
        )));
    }

    let uverbs = chardev::class_nodes(sysfs, "infiniband_verbs", "uverbs", &mut node.findings);
    let umad = chardev::class_nodes(sysfs, "infiniband_mad", "umad", &mut node.findings);
    let ipv4 = match sources.addrs.ipv4_by_interface() {
        Ok(m) => m,
        Err(e) => {
            node.findings.push(Finding::warning(format!(
                "interface addresses unavailable: {e}"
            )));
            BTreeMap::new()
        }
    };
    let ctx = NodeContext {
        compat_mode: node.erdma_compat_mode,
        uverbs,
        umad,
        ifaces: Interfaces::read(sysfs, ipv4),
    };

    node.rdma_cm = if names.is_empty() {
        None
    } else {
        let mut scratch = Vec::new();
        chardev::lookup(sources.devfs.as_ref(), "rdma_cm", None, &mut scratch).ok()
    };

    let names: Vec<String> = names.into_iter().take(MAX_DEVICES).collect();
    let workers = match threads {
        Threads::Split => workers_for(names.len()),
        Threads::One => 1,
    };
    node.devices = scan_devices(sources, &ctx, &names, workers, pass);
    node.devices.sort_by_key(|d| natural_key(&d.name));
    node
}

/// Fewest devices worth a thread of their own: a thread costs about what reading one device
/// costs, and a node with a few devices scans in a few milliseconds anyway.
const DEVICES_PER_WORKER: usize = 8;
/// Most threads one scan uses. Every read is a system call; threads past the cores only queue.
const MAX_WORKERS: usize = 4;

/// The CPUs this process may use (cgroup quota included), read once.
fn cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Threads for a scan of `devices` devices.
fn workers_for(devices: usize) -> usize {
    cpus()
        .min(MAX_WORKERS)
        .min(devices / DEVICES_PER_WORKER)
        .max(1)
}

/// Scans `names`, split over `workers` threads when there are enough devices and
/// CPUs: devices are independent and a scan is bound by the cost of its system calls, so the
/// start-up scan of a large node takes a fraction of the time. Order follows `names`. A thread
/// that cannot be started leaves its share to the calling thread.
fn scan_devices(
    sources: &Sources,
    ctx: &NodeContext,
    names: &[String],
    workers: usize,
    pass: Pass,
) -> Vec<RdmaDevice> {
    let scan_all = |part: &[String]| -> Vec<RdmaDevice> {
        part.iter()
            .map(|n| scan_device(sources, ctx, n, pass))
            .collect()
    };
    if workers <= 1 || names.len() < 2 {
        return scan_all(names);
    }
    let chunk = names.len().div_ceil(workers);
    std::thread::scope(|scope| {
        let mut parts = names.chunks(chunk);
        let own = parts.next().unwrap_or_default();
        let spawned: Vec<_> = parts
            .map(|part| {
                let started = std::thread::Builder::new()
                    .name("inventory-scan".into())
                    .spawn_scoped(scope, move || scan_all(part));
                (part, started)
            })
            .collect();
        let mut devices = scan_all(own);
        for (part, started) in spawned {
            match started {
                Ok(handle) => match handle.join() {
                    Ok(scanned) => devices.extend(scanned),
                    Err(panic) => std::panic::resume_unwind(panic),
                },
                Err(_) => devices.extend(scan_all(part)),
            }
        }
        devices
    })
}

/// Sorts `erdma_2` before `erdma_10`.
fn natural_key(name: &str) -> (String, u64, String) {
    let digits_at = name
        .rfind(|c: char| !c.is_ascii_digit())
        .map(|i| i + 1)
        .unwrap_or(0);
    let (stem, num) = name.split_at(digits_at);
    (
        stem.to_string(),
        num.parse().unwrap_or(u64::MAX),
        name.to_string(),
    )
}

fn scan_device(sources: &Sources, ctx: &NodeContext, name: &str, pass: Pass) -> RdmaDevice {
    let sysfs = sources.sysfs.as_ref();
    let base = PathBuf::from(DEVICE_CLASS).join(name);
    let mut notes = Notes::default();

    let node_type = notes.parsed(sysfs, &base.join("node_type"), false, NodeType::parse);
    let id = identity::read(sysfs, &base, node_type, &mut notes);
    let mut dev = RdmaDevice::named(name, id.kind.clone());
    dev.driver = id.driver;
    dev.pci = id.pci;
    dev.numa_node = id.numa;
    dev.node_type = node_type;
    dev.node_guid = notes.parsed(sysfs, &base.join("node_guid"), false, |s| {
        s.parse::<NodeGuid>()
    });
    dev.node_desc = notes
        .attr(sysfs, &base.join("node_desc"), true)
        .filter(|s| !s.is_empty());
    dev.fw_ver = notes
        .attr(sysfs, &base.join("fw_ver"), true)
        .filter(|s| !s.is_empty());
    dev.ports = ports::read_ports(sysfs, &base, pass == Pass::Full, &mut notes);
    dev.gid_index = dev.first_port().and_then(|p| p.ipv4_rocev2_gid_index());
    dev.mode = mode::detect(
        &dev.kind,
        ctx.compat_mode,
        node_type,
        &dev.ports,
        &mut notes.findings,
    );

    dev.netdev = netdev::pair(
        sysfs,
        &base,
        &dev.kind,
        dev.node_guid,
        id.parent.as_deref(),
        &dev.ports,
        &ctx.ifaces,
        &mut notes,
    );
    if pass == Pass::Identity && dev.netdev.is_none() {
        // Pairing fell through to its last way, a GID entry's `ndev`, which needs the GID
        // tables: this device is read whole, so that its netdev (and its health) is the full
        // pass's.
        return scan_device(sources, ctx, name, Pass::Full);
    }
    if let Some(mtu) = dev.netdev.as_ref().and_then(|n| n.mtu) {
        for port in &mut dev.ports {
            if port.link_layer == Some(LinkLayer::Ethernet) {
                port.active_mtu = iboe_active_mtu(mtu);
            }
        }
    }
    let mac = dev.netdev.as_ref().and_then(|n| n.mac).or_else(|| {
        (dev.kind == DeviceKind::Erdma)
            .then(|| dev.node_guid.and_then(|g| g.to_mac_eui64()))
            .flatten()
    });
    dev.pnet_id = mac.map(PnetId::from_mac);

    let mut reasons = Vec::new();
    dev.char_devices = char_devices(
        sources,
        ctx,
        name,
        dev.mode,
        &mut reasons,
        &mut notes.findings,
    );
    health_reasons(&dev, &mut reasons);
    dev.health = Health::from_reasons(reasons);
    dev.findings = notes.findings;
    dev
}

/// The cheap re-read behind [`crate::Inventory::refresh`], updating `previous` in place; `None`
/// asks for a full scan.
pub(crate) fn refresh(sources: &Sources, previous: NodeDevices) -> Option<NodeDevices> {
    let sysfs = sources.sysfs.as_ref();
    sysfs.refresh();
    let mut names = sysfs.list_dir(Path::new(DEVICE_CLASS)).ok()?;
    let mut before: Vec<&str> = previous.devices.iter().map(|d| d.name.as_str()).collect();
    names.sort();
    before.sort_unstable();
    if names != before {
        return None;
    }
    let compat = sysfs
        .reread_attr(Path::new("module/erdma/parameters/compat_mode"))
        .ok();
    let compat = compat.as_deref().map(|v| v == "Y" || v == "1");
    if compat != previous.erdma_compat_mode {
        return None;
    }
    let mut next = previous;
    for dev in &mut next.devices {
        let uverbs = dev.char_devices.uverbs.clone()?;
        let base = PathBuf::from(DEVICE_CLASS).join(&dev.name);
        for port in &mut dev.ports {
            let dir = base.join("ports").join(port.number.to_string());
            port.state = sysfs
                .reread_attr(&dir.join("state"))
                .ok()
                .and_then(|s| PortState::parse(&s).ok());
            port.phys_state = sysfs
                .reread_attr(&dir.join("phys_state"))
                .ok()
                .and_then(|s| erdma_model::PhysState::parse(&s).ok());
        }
        if let Some(n) = &mut dev.netdev {
            n.operstate = sysfs
                .reread_attr(&PathBuf::from("class/net").join(&n.name).join("operstate"))
                .ok();
            n.link_up = crate::netdev::live_link(sysfs, &n.name);
        }
        let mut reasons = Vec::new();
        let name = uverbs
            .path
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let expected = uverbs.major.zip(uverbs.minor);
        let mut scratch = Vec::new();
        match chardev::lookup(sources.devfs.as_ref(), &name, expected, &mut scratch) {
            Ok(c) => dev.char_devices.uverbs = Some(c),
            Err(why) => {
                dev.char_devices.uverbs =
                    Some(chardev::missing(sources.devfs.as_ref(), &name, expected));
                reasons.push(why);
            }
        }
        health_reasons(dev, &mut reasons);
        dev.health = Health::from_reasons(reasons);
    }
    Some(next)
}

/// The pure judgement behind [`crate::Inventory::link_down`].
pub(crate) fn link_down(previous: &NodeDevices, netdev: &str) -> Option<NodeDevices> {
    let on_link = |d: &RdmaDevice| {
        d.health.is_healthy() && d.netdev.as_ref().is_some_and(|n| n.name == netdev)
    };
    if !previous.devices.iter().any(on_link) {
        return None;
    }
    let mut next = previous.clone();
    for dev in next.devices.iter_mut().filter(|d| on_link(d)) {
        if let Some(n) = &mut dev.netdev {
            n.link_up = Some(false);
        }
        let mut reasons = Vec::new();
        health_reasons(dev, &mut reasons);
        dev.health = Health::from_reasons(reasons);
    }
    Some(next)
}

fn char_devices(
    sources: &Sources,
    ctx: &NodeContext,
    name: &str,
    mode: Option<DeviceMode>,
    reasons: &mut Vec<String>,
    findings: &mut Vec<Finding>,
) -> CharDevices {
    let devfs = sources.devfs.as_ref();
    let mut out = CharDevices::default();
    match ctx.uverbs.get(name).and_then(|v| v.first()) {
        Some(node) => match chardev::lookup(devfs, &node.name, node.dev, findings) {
            Ok(c) => out.uverbs = Some(c),
            Err(why) => {
                out.uverbs = Some(chardev::missing(devfs, &node.name, node.dev));
                reasons.push(why);
            }
        },
        None => reasons.push(format!(
            "no uverbs device for {name} in {}/class/infiniband_verbs: load ib_uverbs (modprobe ib_uverbs)",
            sources.sysfs.describe()
        )),
    }
    if mode.is_some_and(|m| m.has_umad()) {
        let mut nodes: Vec<&ClassNode> = ctx
            .umad
            .get(name)
            .map(|v| v.iter().collect())
            .unwrap_or_default();
        nodes.sort_by_key(|n| n.port);
        for node in nodes {
            match chardev::lookup(devfs, &node.name, node.dev, findings) {
                Ok(c) => out.umad.push(c),
                Err(why) => findings.push(Finding::warning(why)),
            }
        }
    }
    out
}

fn health_reasons(dev: &RdmaDevice, reasons: &mut Vec<String>) {
    if dev.ports.is_empty() {
        reasons.push(format!("{} has no ports in sysfs", dev.name));
    }
    for port in &dev.ports {
        match port.state {
            Some(PortState::Active) => {}
            Some(s) => {
                let hint = match &dev.netdev {
                    Some(n) if !n.is_up() => format!(
                        " because netdev {} is {}: bring it up (ip link set {} up)",
                        n.name,
                        n.operstate
                            .as_deref()
                            .filter(|_| n.link_up.is_none())
                            .unwrap_or("down"),
                        n.name
                    ),
                    _ => String::new(),
                };
                reasons.push(format!("port {} is {}{hint}", port.number, s.name()));
            }
            None => reasons.push(format!("port {} state is unreadable", port.number)),
        }
    }
    // The live link state decides when it was read: operstate lags it by up to a second.
    if let Some(n) = &dev.netdev
        && n.link_up
            .map_or(n.operstate.as_deref() == Some("down"), |up| !up)
        && !reasons.iter().any(|r| r.contains("netdev"))
    {
        reasons.push(format!(
            "netdev {} is down: bring it up (ip link set {} up)",
            n.name, n.name
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::natural_key;

    /// A scan split over threads gives what one thread gives, device for device, in order.
    #[test]
    fn a_scan_split_over_threads_is_the_scan_of_one_thread() {
        use super::*;
        use erdma_host::fake::{FixedInterfaceAddrs, NodeTree};
        use std::sync::Arc;
        let tree = NodeTree::temp();
        erdma_host::fixtures::large(&tree, 37, 2, 3);
        let sources = Sources {
            sysfs: Arc::new(erdma_host::RootedSysfs::new(tree.sys())),
            devfs: Arc::new(erdma_host::RootedDevFs::new(tree.dev())),
            addrs: Arc::new(FixedInterfaceAddrs::default()),
        };
        let sysfs = sources.sysfs.as_ref();
        let mut findings = Vec::new();
        let ctx = NodeContext {
            compat_mode: Some(true),
            uverbs: chardev::class_nodes(sysfs, "infiniband_verbs", "uverbs", &mut findings),
            umad: chardev::class_nodes(sysfs, "infiniband_mad", "umad", &mut findings),
            ifaces: Interfaces::read(sysfs, Default::default()),
        };
        let names = sysfs.list_dir(Path::new(DEVICE_CLASS)).unwrap();
        assert_eq!(names.len(), 37);
        let one = scan_devices(&sources, &ctx, &names, 1, Pass::Full);
        for workers in [2, 3, 4, 36, 37, 80] {
            let split = scan_devices(&sources, &ctx, &names, workers, Pass::Full);
            let got: Vec<&str> = split.iter().map(|d| d.name.as_str()).collect();
            assert_eq!(got, names, "{workers} workers: order");
            assert_eq!(
                serde_json::to_value(&split).unwrap(),
                serde_json::to_value(&one).unwrap(),
                "{workers} workers"
            );
            assert!(
                split
                    .iter()
                    .all(|d| d.ports.len() == 2 && d.health.is_healthy())
            );
        }
    }

    #[test]
    fn natural_order() {
        let mut v = vec!["erdma_10", "erdma_2", "rxe0", "erdma_1"];
        v.sort_by_key(|n| natural_key(n));
        assert_eq!(v, ["erdma_1", "erdma_2", "erdma_10", "rxe0"]);
    }
}
