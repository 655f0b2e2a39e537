//! `smcr-init`: turns SMC-R on for a pod network namespace.
//!
//! - `smcr-init verify` (the init container the webhook injects, unprivileged): reports whether
//!   the agent turned SMC-R on for its own namespace; changes nothing.
//! - `smcr-init` (the original's init container, privileged): configures its own namespace with
//!   the PNET ID from `SMCR_PNET` (set by the device plugin's Allocate).
//! - `smcr-init --netns PATH --pnet ID`: the same for another namespace (manual / lab).
//! - `smcr-init policy load|unload|list|release`: the BPF socket policy pinned in bpffs, which
//!   the agent owns on upstream kernels (6.11+); `smcr-init` adds its namespace to it.
//!
//! An unsupported kernel prints "SMC unsupported: <reason>" and exits 0 (the pod starts with
//! plain TCP) unless `--smcr-strict`. Exit status: 0 configured, not requested, or unsupported
//! without `--smcr-strict`; 1 configuration failed (or unsupported with `--smcr-strict`): the pod
//! does not start; 2 usage error; 3 refused: the namespace is the node's (a `hostNetwork` pod,
//! told by `ERDMA_POD_IP` = `ERDMA_HOST_IP` or `--host-netns`).
//!
//! Logs go to stderr through `erdma_host::logs`: `--log-format text|json` (or
//! `ERDMA_LOG_FORMAT`), `--log-level FILTER`, else `RUST_LOG`, else `error`; colours only on a
//! terminal without `NO_COLOR`.

use anyhow::bail;
use clap::{Parser, Subcommand};
use erdma_host::logs::{self, LogFormat};
use erdma_model::PnetId;
use erdma_smc::configure::{PodOptions, PodReport, SmcConfigurator, SocketPolicy};
use erdma_smc::probe::MechanismChoice;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

mod verify;

use erdma_model::names::BPF_PIN_DIR as PIN_DIR;

#[derive(Debug, Parser)]
#[command(
    name = "smcr-init",
    version,
    about,
    long_about = None,
    after_help = "Exit status: 0 configured, not requested, or SMC unsupported without --smcr-strict (the pod starts on TCP); 1 configuration failed, or SMC unsupported with --smcr-strict (the pod does not start); 2 usage error; 3 refused: this is the node's network namespace (a hostNetwork pod: ERDMA_POD_IP = ERDMA_HOST_IP, or --host-netns)."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    pod: PodArgs,
    /// Log format on stderr: `text` (ANSI colours only when stderr is a terminal and NO_COLOR is
    /// unset or empty) or `json` (one JSON object per line) [default: text].
    #[arg(
        long,
        env = "ERDMA_LOG_FORMAT",
        global = true,
        value_name = "text|json"
    )]
    log_format: Option<String>,
    /// Log filter in tracing's EnvFilter syntax (`info`, `debug`, `error,erdma_smc=debug`)
    /// [default: $RUST_LOG, else error: the init container's output is its report].
    #[arg(long, global = true, value_name = "FILTER")]
    log_level: Option<String>,
}

/// The filter when neither `--log-level` nor `RUST_LOG` is given: the report on stdout (and
/// "SMC unsupported: ...") says what happened; logs are for debugging.
const DEFAULT_LOG_FILTER: &str = "error";

#[derive(Debug, clap::Args)]
struct PodArgs {
    /// PNET ID of the pod's RDMA device (the device plugin sets SMCR_PNET).
    #[arg(long, env = "SMCR_PNET", value_name = "ID")]
    pnet: Option<String>,
    /// Network namespace to configure (`/proc/PID/ns/net`, `/var/run/netns/NAME`). Default: ours.
    #[arg(long, value_name = "PATH")]
    netns: Option<PathBuf>,
    /// The pod interface that carries the SMC handshake.
    #[arg(long, default_value = "eth0", value_name = "NAME")]
    ifname: String,
    /// Keep IPv6 on (default: `disable_ipv6=1`, as eRDMA SMC falls back on IPv6). The agent's
    /// flag of the same name; `--keep-ipv6` is accepted too.
    #[arg(long = "smcr-keep-ipv6", alias = "keep-ipv6")]
    keep_ipv6: bool,
    /// Mechanism: `auto` (tcp2smc if present, else the BPF policy), `tcp2smc` or `bpf`.
    #[arg(long, default_value = "auto", value_name = "MECH")]
    mechanism: MechanismChoice,
    /// Fail (exit 1) when the kernel cannot do SMC-R, instead of starting the pod on TCP. The
    /// agent's flag of the same name; `--strict` is accepted too.
    #[arg(long = "smcr-strict", alias = "strict")]
    strict: bool,
    /// The host's network namespace, to refuse host-network pods. Default with `--netns`:
    /// `/proc/1/ns/net`; without `--netns` no check (inside a pod, /proc/1 is the pod's).
    #[arg(long, value_name = "PATH")]
    host_netns: Option<PathBuf>,
    /// Lab only: allow configuring the host's namespace.
    #[arg(long)]
    allow_host_netns: bool,
    /// `/proc/sys` to write.
    #[arg(long, default_value = "/proc/sys", value_name = "DIR")]
    sysctl_root: PathBuf,
    /// bpffs directory of the agent's pinned BPF policy (the agent's `--bpf-pin-dir`;
    /// `--pin-dir` is accepted too).
    #[arg(long = "bpf-pin-dir", alias = "pin-dir", default_value = PIN_DIR, value_name = "DIR")]
    pin_dir: PathBuf,
    /// Output: `text` or `json` (the full report).
    #[arg(short = 'o', long = "output", default_value = "text", value_parser = ["text", "json"])]
    output: String,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Report whether the agent turned SMC-R on for this namespace (what the webhook injects;
    /// unprivileged, changes nothing). Exit 0, or 1 with --smcr-strict when SMC-R is not on.
    Verify {
        /// Fail (exit 1) when SMC-R is not on for this namespace.
        #[arg(long = "smcr-strict", alias = "strict")]
        strict: bool,
        /// The node's network namespace, to refuse it (default: only the downward API check).
        #[arg(long, value_name = "PATH")]
        host_netns: Option<PathBuf>,
        /// `/proc/sys` to read.
        #[arg(long, default_value = "/proc/sys", value_name = "DIR")]
        sysctl_root: PathBuf,
        /// Output: `text` or `json`.
        #[arg(short = 'o', long = "output", default_value = "text", value_parser = ["text", "json"])]
        output: String,
    },
    /// Manage the BPF socket policy (upstream kernels 6.11+).
    Policy {
        #[command(subcommand)]
        action: PolicyAction,
        /// bpffs directory of the pins (`--pin-dir` is accepted too).
        #[arg(long = "bpf-pin-dir", alias = "pin-dir", default_value = PIN_DIR, value_name = "DIR", global = true)]
        pin_dir: PathBuf,
    },
    /// The node side of the pnet table: map a PNET ID to an RDMA device port (what the agent does
    /// at startup for every ERI; for nodes without the agent and the lab).
    IbPnet {
        /// PNET ID.
        pnet: String,
        /// RDMA device (`erdma_0`).
        ibdev: String,
        /// Port.
        #[arg(default_value_t = 1)]
        port: u8,
    },
    /// SMC-Rv2 user EIDs of the node (SMC-Rv2 needs the same UEID on both peers).
    Ueid {
        #[command(subcommand)]
        action: UeidAction,
    },
}

#[derive(Debug, Subcommand)]
enum UeidAction {
    /// Add a UEID (idempotent).
    Add {
        /// The EID (1-32 characters A-Z 0-9 . -; upper-cased).
        eid: String,
    },
    /// Remove a UEID.
    Remove {
        /// The EID.
        eid: String,
    },
    /// List the UEIDs.
    List,
}

#[derive(Debug, Subcommand)]
enum PolicyAction {
    /// Load, attach and pin the policy (idempotent).
    Load,
    /// Remove the pins (the program detaches when nothing holds it).
    Unload,
    /// List the namespace cookies in the policy.
    List,
    /// Remove a namespace from the policy (pod deleted).
    Release {
        /// The namespace.
        #[arg(long, value_name = "PATH", required_unless_present = "cookie")]
        netns: Option<PathBuf>,
        /// Or its cookie.
        #[arg(long)]
        cookie: Option<u64>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let set_up = LogFormat::parse(cli.log_format.as_deref().unwrap_or_default())
        .map_err(|e| format!("--log-format: {e}"))
        .and_then(|format| {
            logs::init(format, cli.log_level.as_deref(), DEFAULT_LOG_FILTER)
                .map_err(|e| e.to_string())
        });
    if let Err(e) = set_up {
        eprintln!("smcr-init: {e}");
        return ExitCode::from(2);
    }
    let result = match &cli.command {
        None => configure(&cli.pod),
        Some(Command::Verify {
            strict,
            host_netns,
            sysctl_root,
            output,
        }) => verify(*strict, host_netns.as_deref(), sysctl_root, output),
        Some(Command::Policy { action, pin_dir }) => policy(action, pin_dir),
        Some(Command::Ueid { action }) => ueid(action),
        Some(Command::IbPnet { pnet, ibdev, port }) => ib_pnet(pnet, ibdev, *port),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("smcr-init: {e:#}");
            ExitCode::from(1)
        }
    }
}

thread_local! {
    /// Why the pinned policy could not be opened, for the "unsupported" message.
    static NO_POLICY: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// The pinned policy, when the agent loaded one (and this build has BPF support).
fn pinned_policy(pin_dir: &Path) -> Option<Arc<dyn SocketPolicy>> {
    #[cfg(feature = "bpf")]
    match erdma_smc::policy::BpfSocketPolicy::open_pinned(pin_dir) {
        Ok(p) => return Some(Arc::new(p)),
        Err(e) => {
            tracing::info!(error = %e, "smcr-init: no BPF socket policy");
            NO_POLICY.with(|n| *n.borrow_mut() = Some(e.to_string()));
        }
    }
    #[cfg(not(feature = "bpf"))]
    let _ = pin_dir;
    None
}

fn configure(a: &PodArgs) -> anyhow::Result<ExitCode> {
    let Some(raw) = a.pnet.as_deref().filter(|p| !p.trim().is_empty()) else {
        bail!(
            "no PNET ID: SMCR_PNET is empty. Fix: request an aliyun/erdma device in this container (the device plugin sets SMCR_PNET) or pass --pnet"
        );
    };
    let pnet = PnetId::parse(raw.trim())
        .map_err(|e| anyhow::anyhow!("SMCR_PNET {raw:?} is not a valid PNET ID: {e}"))?;
    let options = PodOptions {
        ifname: a.ifname.clone(),
        disable_ipv6: !a.keep_ipv6,
        mechanism: a.mechanism,
        strict: a.strict,
        allow_host_netns: a.allow_host_netns,
        host_netns: a
            .host_netns
            .clone()
            .unwrap_or_else(|| PathBuf::from("/proc/1/ns/net")),
        sysctl_root: a.sysctl_root.clone(),
    };
    let configurator = SmcConfigurator::new(options, pinned_policy(&a.pin_dir));
    let report = match &a.netns {
        Some(path) => configurator.configure_pod(path, &pnet)?,
        None => {
            if !a.allow_host_netns
                && let Some(why) = own_host_network(a.host_netns.as_deref())?
            {
                eprintln!("smcr-init: {}", verify::refusal(&why));
                return Ok(ExitCode::from(verify::EXIT_HOST_NETNS));
            }
            configurator.configure_current(&pnet, SmcConfigurator::report_for("self"))?
        }
    };
    print_report(&report, &a.output)?;
    Ok(ExitCode::SUCCESS)
}

/// Why our own namespace is the node's, when it is (see [`verify::host_network`]).
fn own_host_network(host_netns: Option<&Path>) -> anyhow::Result<Option<String>> {
    let pod_ip = std::env::var(verify::ENV_POD_IP).ok();
    let host_ip = std::env::var(verify::ENV_HOST_IP).ok();
    verify::host_network(pod_ip.as_deref(), host_ip.as_deref(), host_netns)
}

fn verify(
    strict: bool,
    host_netns: Option<&Path>,
    sysctl_root: &Path,
    output: &str,
) -> anyhow::Result<ExitCode> {
    if let Some(why) = own_host_network(host_netns)? {
        eprintln!("smcr-init: {}", verify::refusal(&why));
        return Ok(ExitCode::from(verify::EXIT_HOST_NETNS));
    }
    let found = verify::observe(sysctl_root);
    if output == "json" {
        println!("{}", serde_json::to_string_pretty(&found)?);
    } else {
        println!("{}", found.line());
    }
    Ok(if strict && !found.enabled() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn print_report(r: &PodReport, output: &str) -> anyhow::Result<()> {
    if output == "json" {
        println!("{}", serde_json::to_string_pretty(r)?);
        if let Some(u) = &r.unsupported {
            eprintln!("{u}");
        }
        return Ok(());
    }
    if let Some(s) = &r.skipped {
        println!("skipped: {s}");
    } else if let Some(u) = &r.unsupported {
        eprintln!("{u}");
        if let Some(why) = NO_POLICY.with(|n| n.borrow().clone()) {
            eprintln!("note: BPF socket policy: {why}");
        }
        println!("SMC-R not enabled for {}; the pod runs on TCP", r.netns);
    } else {
        let steps: Vec<String> = r
            .steps
            .iter()
            .map(|s| {
                format!(
                    "{} {}",
                    serde_json::to_string(&s.step).unwrap_or_default(),
                    s.outcome
                )
            })
            .collect();
        println!(
            "SMC-R enabled for {} ({}): {}",
            r.netns,
            r.mechanism
                .map(|m| serde_json::to_string(&m).unwrap_or_default())
                .unwrap_or_default()
                .trim_matches('"'),
            steps.join("; ")
        );
    }
    Ok(())
}

fn ib_pnet(pnet: &str, ibdev: &str, port: u8) -> anyhow::Result<ExitCode> {
    let id =
        PnetId::parse(pnet).map_err(|e| anyhow::anyhow!("PNET ID {pnet:?} is not valid: {e}"))?;
    let r = erdma_smc::pnet::ensure_ib_ports(&[(id, ibdev.to_string(), port)]);
    println!("{}", serde_json::to_string(&r)?);
    Ok(if r.warnings.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn ueid(action: &UeidAction) -> anyhow::Result<ExitCode> {
    let c = erdma_smc::ueid::UeidClient::open()?;
    match action {
        UeidAction::Add { eid } => {
            let added = c.add(eid)?;
            println!(
                "UEID {}: {}",
                eid.to_ascii_uppercase(),
                if added { "added" } else { "already present" }
            );
        }
        UeidAction::Remove { eid } => {
            c.remove(eid)?;
            println!("UEID {} removed", eid.to_ascii_uppercase());
        }
        UeidAction::List => {
            for e in c.list()? {
                println!("{e}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "bpf")]
fn policy(action: &PolicyAction, pin_dir: &Path) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    use erdma_smc::policy::BpfSocketPolicy;
    match action {
        PolicyAction::Load => {
            if BpfSocketPolicy::open_pinned(pin_dir).is_ok() {
                println!(
                    "SMC BPF policy already loaded (pinned at {})",
                    pin_dir.display()
                );
                return Ok(ExitCode::SUCCESS);
            }
            let mut p = BpfSocketPolicy::load()?;
            p.pin(pin_dir)?;
            println!("SMC BPF policy loaded and pinned at {}", pin_dir.display());
        }
        PolicyAction::Unload => {
            BpfSocketPolicy::unpin(pin_dir)?;
            println!("SMC BPF policy pins removed from {}", pin_dir.display());
        }
        PolicyAction::List => {
            let p = BpfSocketPolicy::open_pinned(pin_dir)?;
            for c in p.enabled().map_err(anyhow::Error::msg)? {
                println!("{c}");
            }
        }
        PolicyAction::Release { netns, cookie } => {
            let cookie = match (cookie, netns) {
                (Some(c), _) => *c,
                (None, Some(path)) => {
                    erdma_smc::netns::run_in(path, erdma_smc::netns::current_cookie)?
                        .context("reading the namespace cookie")?
                }
                (None, None) => bail!("give --netns or --cookie"),
            };
            let p = BpfSocketPolicy::open_pinned(pin_dir)?;
            let removed = p.disable(cookie).map_err(anyhow::Error::msg)?;
            println!(
                "netns cookie {cookie}: {}",
                if removed {
                    "removed"
                } else {
                    "was not in the policy"
                }
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "bpf"))]
fn policy(_: &PolicyAction, _: &Path) -> anyhow::Result<ExitCode> {
    bail!("this smcr-init was built without the `bpf` feature")
}
