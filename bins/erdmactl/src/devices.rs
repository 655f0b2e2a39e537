//! `erdmactl devices`: the node's RDMA device inventory.

use crate::output::{self, Format};
use erdma_host::{InterfaceAddrs, LiveInterfaceAddrs, NoInterfaceAddrs, RootedDevFs, RootedSysfs};
use erdma_inventory::{Inventory, Sources};
use erdma_model::{Health, NodeDevices, RdmaDevice, Severity};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

/// Arguments of `erdmactl devices`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// sysfs root to read (a captured tree for offline inspection).
    #[arg(long, default_value = "/sys", value_name = "DIR")]
    pub sysfs_root: PathBuf,
    /// Device directory holding `infiniband/uverbsN`. Default: `/dev` for the live `/sys`; for
    /// another sysfs root, the `dev` folder beside it when there is one.
    #[arg(long, value_name = "DIR")]
    pub dev_root: Option<PathBuf>,
    /// Show only devices of these drivers (`erdma`, `rxe`, `siw`, `mlx5_core`, …), comma-separated
    /// (the agent's flag of the same name; `--driver` is accepted too).
    #[arg(
        long = "rdma-driver",
        alias = "driver",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    pub driver: Vec<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Format,
    /// The kubelet's root directory, for the DRA driver's prepared claims
    /// (`plugins/erdma.alibabacloud.com/checkpoint.json`). Default: `/var/lib/kubelet` for the
    /// live `/sys`; not read for another sysfs root unless given.
    #[arg(long, value_name = "DIR")]
    pub kubelet_root_dir: Option<PathBuf>,
}

/// The DRA driver's state on this node, from its checkpoint (no API server needed).
#[derive(Debug, Serialize)]
pub struct DraLocal {
    /// The checkpoint file read.
    pub checkpoint: String,
    /// Prepared claims (`namespace/name`) per ib device.
    pub prepared: std::collections::BTreeMap<String, Vec<String>>,
    /// Why the checkpoint could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The machine-readable result of `erdmactl devices`.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The sysfs root that was read.
    pub sysfs_root: String,
    /// The dev root that was checked.
    pub dev_root: String,
    /// How many devices are usable (healthy).
    pub usable: usize,
    /// The inventory.
    #[serde(flatten)]
    pub node: NodeDevices,
    /// The DRA driver's prepared claims, when its checkpoint exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dra: Option<DraLocal>,
}

/// Reads the DRA checkpoint under `kubelet_root`, when it exists.
pub fn dra_local(kubelet_root: &Path) -> Option<DraLocal> {
    let path = erdma_dra::checkpoint::path_under(kubelet_root, erdma_model::names::DRA_DRIVER);
    if !path.exists() {
        return None;
    }
    let (prepared, error) = match erdma_dra::checkpoint::Checkpoint::load(&path) {
        Ok(cp) => (erdma_dra::checkpoint::claims_by_device(&cp), None),
        Err(e) => (Default::default(), Some(e.to_string())),
    };
    Some(DraLocal {
        checkpoint: path.display().to_string(),
        prepared,
        error,
    })
}

/// Picks the dev root: explicit, `/dev` for the live sysfs, or `<sysfs-root>/../dev` for a tree.
pub fn dev_root_for(sysfs_root: &Path, explicit: Option<&Path>) -> PathBuf {
    if let Some(d) = explicit {
        return d.to_path_buf();
    }
    if is_live(sysfs_root) {
        return PathBuf::from("/dev");
    }
    match sysfs_root.parent().map(|p| p.join("dev")) {
        Some(d) if d.is_dir() => d,
        _ => PathBuf::from("/dev"),
    }
}

fn is_live(sysfs_root: &Path) -> bool {
    std::fs::canonicalize(sysfs_root)
        .map(|p| p == Path::new("/sys"))
        .unwrap_or(false)
}

/// Scans and builds the report.
pub fn scan(args: &Args) -> Report {
    let dev_root = dev_root_for(&args.sysfs_root, args.dev_root.as_deref());
    let addrs: Arc<dyn InterfaceAddrs> = if is_live(&args.sysfs_root) {
        Arc::new(LiveInterfaceAddrs)
    } else {
        Arc::new(NoInterfaceAddrs)
    };
    let inventory = Inventory::new(Sources {
        sysfs: Arc::new(RootedSysfs::new(&args.sysfs_root)),
        devfs: Arc::new(RootedDevFs::new(&dev_root)),
        addrs,
    });
    let mut node = inventory.scan();
    if !args.driver.is_empty() {
        node.devices.retain(|d| {
            args.driver
                .iter()
                .any(|f| f == d.driver_key() || Some(f.as_str()) == d.driver.as_deref())
        });
    }
    let kubelet_root = args
        .kubelet_root_dir
        .clone()
        .or_else(|| is_live(&args.sysfs_root).then(|| PathBuf::from("/var/lib/kubelet")));
    Report {
        sysfs_root: args.sysfs_root.display().to_string(),
        dev_root: dev_root.display().to_string(),
        usable: node.usable().count(),
        node,
        dra: kubelet_root.as_deref().and_then(dra_local),
    }
}

/// Runs the command.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let report = scan(args);
    match args.output {
        Format::Table => crate::output::emit(&render_table(&report))?,
        f => crate::output::emit(&output::render(&report, f)?)?,
    }
    if report.usable == 0 {
        crate::output::warn(&no_usable_message(&report, &args.driver));
        return Ok(ExitCode::from(crate::exit::CHECK_FAILED));
    }
    Ok(ExitCode::SUCCESS)
}

fn no_usable_message(report: &Report, drivers: &[String]) -> String {
    let which = if drivers.is_empty() {
        "RDMA devices".to_string()
    } else {
        format!("{} devices", drivers.join("/"))
    };
    let mut msg = format!(
        "erdmactl: no usable {which} found (looked in {}/class/infiniband and {}/infiniband).\n",
        report.sysfs_root, report.dev_root
    );
    if report.node.devices.is_empty() {
        msg.push_str(
            "Check: is the driver loaded (lsmod | grep erdma; modprobe erdma)? Does this instance have ERIs attached?\n\
             For eRDMA, the mode comes from the erdma module parameter compat_mode (Y = RoCE-compat, N = iWARP).",
        );
    } else {
        msg.push_str("Check each device's health reason above: char devices (modprobe ib_uverbs; is the host's /dev mounted?), port state (is the ERI's netdev up?), module mode.");
    }
    msg
}

fn health_cell(h: &Health) -> String {
    match h {
        Health::Healthy => "healthy".into(),
        Health::Unhealthy { reasons } => format!("unhealthy: {}", reasons.join("; ")),
    }
}

fn row(d: &RdmaDevice) -> Vec<String> {
    let dash = || "-".to_string();
    let state = d
        .first_port()
        .and_then(|p| p.state)
        .map(|s| s.name().to_string())
        .unwrap_or_else(dash);
    let numa = match d.numa_node.0 {
        Some(n) => n.to_string(),
        None => "unknown".into(),
    };
    let chars: Vec<String> = d
        .char_devices
        .uverbs
        .iter()
        .chain(d.char_devices.umad.iter())
        .map(|c| {
            let name = c.path.rsplit('/').next().unwrap_or(&c.path);
            if c.present {
                name.to_string()
            } else {
                format!("{name}(missing)")
            }
        })
        .collect();
    vec![
        d.name.clone(),
        d.driver_key().to_string(),
        d.mode.map(|m| m.name().to_string()).unwrap_or_else(dash),
        state,
        numa,
        d.netdev
            .as_ref()
            .map(|n| n.name.clone())
            .unwrap_or_else(dash),
        d.netdev
            .as_ref()
            .and_then(|n| n.mac)
            .map(|m| m.to_string())
            .unwrap_or_else(dash),
        d.pnet_id
            .as_ref()
            .map(|p| p.to_string())
            .unwrap_or_else(dash),
        if chars.is_empty() {
            dash()
        } else {
            chars.join(",")
        },
        health_cell(&d.health),
    ]
}

/// The human-readable table, followed by findings.
pub fn render_table(report: &Report) -> String {
    let header = [
        "DEVICE", "DRIVER", "MODE", "STATE", "NUMA", "NETDEV", "MAC", "PNETID", "CHARDEVS",
        "HEALTH",
    ];
    let rows: Vec<Vec<String>> = report.node.devices.iter().map(row).collect();
    let mut out = output::table(&header, &rows);
    if let Some(cm) = &report.node.rdma_cm {
        out.push_str(&format!("rdma_cm: {}\n", cm.path));
    }
    if let Some(dra) = &report.dra {
        out.push_str(&format!("DRA claims prepared ({}):", dra.checkpoint));
        if let Some(e) = &dra.error {
            out.push_str(&format!(" unreadable: {e}\n"));
        } else if dra.prepared.is_empty() {
            out.push_str(" none\n");
        } else {
            out.push('\n');
            for (dev, claims) in &dra.prepared {
                out.push_str(&format!(
                    "  {dev}: {} ({})\n",
                    claims.len(),
                    claims.join(", ")
                ));
            }
        }
    }
    let mut findings = Vec::new();
    // Info-level findings (e.g. placeholder device nodes in fixture trees) are in -o json/yaml only.
    for f in report
        .node
        .findings
        .iter()
        .filter(|f| f.severity > Severity::Info)
    {
        findings.push(format!("  node: {}: {}", severity(f.severity), f.message));
    }
    for d in &report.node.devices {
        for f in d.findings.iter().filter(|f| f.severity > Severity::Info) {
            findings.push(format!(
                "  {}: {}: {}",
                d.name,
                severity(f.severity),
                f.message
            ));
        }
    }
    if !findings.is_empty() {
        out.push_str("findings:\n");
        out.push_str(&findings.join("\n"));
        out.push('\n');
    }
    out
}

fn severity(s: Severity) -> &'static str {
    match s {
        Severity::Info => "info",
        Severity::Warning => "warning",
        Severity::Error => "error",
    }
}
