//! `erdmactl smc`: SMC sockets (`status`, an `smcss` equivalent over `smc_diag`) and the pnet
//! table (`pnet`, an `smc_pnet -s` equivalent over `SMC_PNETID`), of this or another network
//! namespace.

use crate::output::{self, Format};
use erdma_smc::diag::{self, DiagError, SmcSocket};
use erdma_smc::pnet::{PnetClient, PnetEntry, PnetError};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit status when the kernel has no SMC: nothing usable was found.
pub const EXIT_UNSUPPORTED: u8 = crate::exit::CHECK_FAILED;

/// Arguments of `erdmactl smc`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: SmcCommand,
}

#[derive(Debug, clap::Subcommand)]
enum SmcCommand {
    /// List SMC sockets (like `smcss -R`): state, addresses, mode (SMCR/SMCD/TCP), decoded
    /// fallback reasons, RDMA link.
    #[command(after_help = crate::exit::SMC)]
    Status(StatusArgs),
    /// Show the SMC pnet table (like `smc_pnet -s`).
    #[command(after_help = crate::exit::SMC)]
    Pnet(PnetArgs),
}

/// Where to look.
#[derive(Debug, clap::Args)]
struct Target {
    /// Network namespace to inspect (`/proc/PID/ns/net`, `/var/run/netns/NAME`); default: ours.
    #[arg(long, value_name = "PATH")]
    netns: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    output: Format,
}

#[derive(Debug, clap::Args)]
struct StatusArgs {
    #[command(flatten)]
    target: Target,
    /// Only listening sockets.
    #[arg(short = 'l', long)]
    listening: bool,
}

#[derive(Debug, clap::Args)]
struct PnetArgs {
    #[command(flatten)]
    target: Target,
}

/// `erdmactl smc status -o json`.
#[derive(Debug, Serialize)]
pub struct StatusReport {
    /// The namespace inspected (`self` for ours).
    pub netns: String,
    /// False when the kernel has no SMC / smc_diag.
    pub supported: bool,
    /// "SMC unsupported: …" when not supported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsupported: Option<String>,
    /// Counts per mode.
    pub summary: Summary,
    /// The sockets.
    pub sockets: Vec<SmcSocket>,
}

/// Socket counts.
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct Summary {
    /// All sockets listed.
    pub total: usize,
    /// In SMC-R mode (not listening).
    pub smcr: usize,
    /// In SMC-D mode.
    pub smcd: usize,
    /// Fell back to TCP.
    pub fallback_tcp: usize,
    /// Listening.
    pub listening: usize,
}

/// `erdmactl smc pnet -o json`.
#[derive(Debug, Serialize)]
pub struct PnetReport {
    /// The namespace inspected.
    pub netns: String,
    /// False when the kernel has no SMC.
    pub supported: bool,
    /// "SMC unsupported: …" when not supported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsupported: Option<String>,
    /// The entries.
    pub entries: Vec<PnetEntry>,
}

fn in_target<T: Send + 'static>(
    netns: &Option<PathBuf>,
    f: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<T> {
    Ok(match netns {
        Some(p) => erdma_smc::netns::run_in(p, f)?,
        None => f(),
    })
}

fn netns_label(t: &Target) -> String {
    t.netns
        .as_ref()
        .map_or_else(|| "self".to_string(), |p| p.display().to_string())
}

/// Runs `erdmactl smc`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        SmcCommand::Status(a) => status(a),
        SmcCommand::Pnet(a) => pnet(a),
    }
}

fn summarise(sockets: &[SmcSocket]) -> Summary {
    let mut s = Summary {
        total: sockets.len(),
        ..Summary::default()
    };
    for k in sockets {
        if k.state == "LISTEN" {
            s.listening += 1;
            continue;
        }
        match k.mode {
            diag::Mode::Smcr => s.smcr += 1,
            diag::Mode::Smcd => s.smcd += 1,
            diag::Mode::FallbackTcp => s.fallback_tcp += 1,
            diag::Mode::Unknown(_) => {}
        }
    }
    s
}

fn status(a: &StatusArgs) -> anyhow::Result<ExitCode> {
    let listening = a.listening;
    let result = in_target(&a.target.netns, diag::dump)?;
    let (sockets, unsupported) = match result {
        Ok(s) => (s, None),
        Err(e @ DiagError::Unsupported) => (Vec::new(), Some(e.to_string())),
        Err(e) => return Err(e.into()),
    };
    let sockets: Vec<SmcSocket> = sockets
        .into_iter()
        .filter(|s| !listening || s.state == "LISTEN")
        .collect();
    let report = StatusReport {
        netns: netns_label(&a.target),
        supported: unsupported.is_none(),
        unsupported,
        summary: summarise(&sockets),
        sockets,
    };
    print_report(&report, a.target.output, render_status, &report.unsupported)
}

fn print_report<T: Serialize>(
    report: &T,
    format: Format,
    table: fn(&T) -> String,
    unsupported: &Option<String>,
) -> anyhow::Result<ExitCode> {
    match format {
        Format::Table => match unsupported {
            Some(u) => crate::output::warn(u),
            None => crate::output::emit(&table(report))?,
        },
        f => crate::output::emit(&output::render(report, f)?)?,
    }
    Ok(if unsupported.is_some() {
        ExitCode::from(EXIT_UNSUPPORTED)
    } else {
        ExitCode::SUCCESS
    })
}

/// The table of `erdmactl smc status`.
pub fn render_status(r: &StatusReport) -> String {
    let rows: Vec<Vec<String>> = r
        .sockets
        .iter()
        .map(|s| {
            let (link, gids) = match &s.link {
                Some(l) => (
                    format!("{}/{} {}", l.ibdev, l.ibport, l.role),
                    format!("{} -> {}", l.gid, l.peer_gid),
                ),
                None => ("-".into(), "-".into()),
            };
            let reason = match &s.fallback {
                Some(f) => match &f.peer_diagnosis {
                    Some(p) => format!("{} (peer: {})", f.reason.name, p.name),
                    None => format!("{}: {}", f.reason.name, f.reason.meaning),
                },
                None => "-".into(),
            };
            vec![
                s.state.clone(),
                s.uid.to_string(),
                s.inode.to_string(),
                s.local.clone(),
                s.peer.clone(),
                s.ifindex.to_string(),
                s.mode_text(),
                link,
                gids,
                reason,
            ]
        })
        .collect();
    let mut out = output::table(
        &[
            "STATE", "UID", "INODE", "LOCAL", "PEER", "INTF", "MODE", "LINK", "GIDS", "REASON",
        ],
        &rows,
    );
    let s = &r.summary;
    out.push_str(&format!(
        "{} socket(s): {} SMCR, {} SMCD, {} TCP fallback, {} listening\n",
        s.total, s.smcr, s.smcd, s.fallback_tcp, s.listening
    ));
    out
}

fn pnet(a: &PnetArgs) -> anyhow::Result<ExitCode> {
    let result = in_target(&a.target.netns, || PnetClient::open()?.list())?;
    let (entries, unsupported) = match result {
        Ok(e) => (e, None),
        Err(PnetError::SmcUnavailable) => (
            Vec::new(),
            Some(PnetError::SmcUnavailable.to_string().replacen(
                "SMC unavailable",
                "SMC unsupported",
                1,
            )),
        ),
        Err(e) => return Err(e.into()),
    };
    let report = PnetReport {
        netns: netns_label(&a.target),
        supported: unsupported.is_none(),
        unsupported,
        entries,
    };
    print_report(&report, a.target.output, render_pnet, &report.unsupported)
}

/// The table of `erdmactl smc pnet` (`smc_pnet -s` columns).
pub fn render_pnet(r: &PnetReport) -> String {
    let rows: Vec<Vec<String>> = r
        .entries
        .iter()
        .map(|e| {
            vec![
                e.pnetid.clone(),
                e.ethname.clone().unwrap_or_else(|| "n/a".into()),
                e.ibname.clone().unwrap_or_else(|| "n/a".into()),
                e.ibport.map_or_else(|| "n/a".into(), |p| p.to_string()),
            ]
        })
        .collect();
    output::table(&["PNETID", "NETDEV", "IBDEV", "IBPORT"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use erdma_smc::decline;
    use erdma_smc::diag::{Fallback, Link, Mode};

    fn sock(state: &str, mode: Mode) -> SmcSocket {
        SmcSocket {
            family: 43,
            state: state.into(),
            state_code: 1,
            mode,
            local: "192.168.79.2:8080".into(),
            peer: "192.168.79.1:40000".into(),
            ifindex: 2,
            uid: 0,
            inode: 77,
            shutdown: 0,
            fallback: None,
            link: None,
            conn: None,
        }
    }

    #[test]
    fn status_table_and_summary() {
        let mut r = sock("ACTIVE", Mode::Smcr);
        r.link = Some(Link {
            link_id: 1,
            ibdev: "erdma_0".into(),
            ibport: 1,
            gid: "g1".into(),
            peer_gid: "g2".into(),
            role: "CLIENT",
        });
        let mut t = sock("ACTIVE", Mode::FallbackTcp);
        t.fallback = Some(Fallback {
            reason: decline::decode(0x0303_0002),
            peer_diagnosis: None,
        });
        let sockets = vec![r, t, sock("LISTEN", Mode::Smcr)];
        let report = StatusReport {
            netns: "self".into(),
            supported: true,
            unsupported: None,
            summary: summarise(&sockets),
            sockets,
        };
        assert_eq!(
            report.summary,
            Summary {
                total: 3,
                smcr: 1,
                smcd: 0,
                fallback_tcp: 1,
                listening: 1
            }
        );
        let text = render_status(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("STATE"), "{text}");
        assert!(
            lines[1].contains("SMCR") && lines[1].contains("erdma_0/1 CLIENT"),
            "{text}"
        );
        assert!(
            lines[2].contains("TCP 0x03030002") && lines[2].contains("NOSMCRDEV: no SMC-R device"),
            "{text}"
        );
        assert!(lines[4].starts_with("3 socket(s): 1 SMCR, 0 SMCD, 1 TCP fallback, 1 listening"));
        let json: serde_json::Value =
            serde_json::from_str(&output::render(&report, Format::Json).unwrap()).unwrap();
        assert_eq!(json["sockets"][1]["mode"], "TCP");
        assert_eq!(
            json["sockets"][1]["fallback"]["reason"]["name"],
            "NOSMCRDEV"
        );
        assert_eq!(
            json["sockets"][1]["fallback"]["reason"]["code"],
            0x0303_0002
        );
        assert_eq!(json["sockets"][0]["link"]["ibdev"], "erdma_0");
    }

    #[test]
    fn pnet_table() {
        let r = PnetReport {
            netns: "self".into(),
            supported: true,
            unsupported: None,
            entries: vec![PnetEntry {
                pnetid: "00163E0A1B2C".into(),
                ethname: Some("eth0".into()),
                ibname: None,
                ibport: None,
            }],
        };
        assert_eq!(
            render_pnet(&r),
            "PNETID        NETDEV  IBDEV  IBPORT\n00163E0A1B2C  eth0    n/a    n/a\n"
        );
    }
}
