//! `erdmactl`: the erdma command-line tool. Also usable as a kubectl plugin (`kubectl erdma`) when
//! installed as `kubectl-erdma` on the PATH.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod devices;
mod doctor;
mod exit;
mod install;
mod nccl;
mod output;
mod smc;
mod submit;
mod top;

/// erdma command-line tool: inspect RDMA devices, analyse NCCL logs, diagnose nodes and pods.
#[derive(Debug, Parser)]
#[command(name = "erdmactl", version, about, long_about = None, after_help = exit::ALL)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the RDMA devices of this node (or of a sysfs fixture) with mode, state, NUMA, netdev,
    /// PNET ID, char devices and health.
    #[command(after_help = exit::DEVICES)]
    Devices(devices::Args),
    /// Analyse NCCL logs (is eRDMA used? which errors, which fixes?) and compare runs.
    Nccl(nccl::NcclArgs),
    /// SMC-R: sockets through smc_diag (`status`, like smcss) and the pnet table (`pnet`).
    Smc(smc::Args),
    /// Submit training jobs, Arena-compatible (`submit pytorch`, with `--erdma` and `--smcr`).
    Submit(submit::Args),
    /// Diagnose eRDMA on a node (`--node`), a pod (`--pod`) or this machine: PASS/WARN/FAIL + fix.
    #[command(after_help = exit::DOCTOR)]
    Doctor(Box<doctor::Args>),
    /// Per-pod RDMA usage (`top pods`: QPs, pinned memory, CQs, PDs) and per-device traffic
    /// (`top devices`), read from the agents like `kubectl top`.
    Top(top::Args),
    /// Render (`--dry-run -o yaml|json`) or apply the manifests: CRD, RBAC, controller, agent,
    /// webhook; options mirror the original chart's values.
    #[command(after_help = exit::INSTALL)]
    Install(Box<install::Args>),
    /// Delete what `install` created (same values file and flags); the CRD only with
    /// `--include-crd`.
    #[command(after_help = exit::UNINSTALL)]
    Uninstall(install::UninstallArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return parse_error(e),
    };
    let result = match cli.command {
        Command::Devices(args) => devices::run(&args),
        Command::Nccl(args) => nccl::run(&args),
        Command::Smc(args) => smc::run(&args),
        Command::Submit(args) => submit::run(&args),
        Command::Doctor(args) => doctor::run(&args),
        Command::Top(args) => top::run(&args),
        Command::Install(args) => install::run(&args),
        Command::Uninstall(args) => install::uninstall(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) if closed_stdout(&e) => ExitCode::from(output::BROKEN_PIPE),
        Err(e) => {
            let msg = chain_text(&e);
            // kube's errors name the transport failure only in their source chain, which some
            // callers flatten: SendRequest is the client's word for "no answer came back".
            if msg.contains("timed out") || msg.contains("SendRequest") {
                crate::output::warn(&format!(
                    "erdmactl: {msg}\nerdmactl: the API server could not be reached or did not answer within --request-timeout (default 30s): check the server address in the kubeconfig (--kubeconfig, --context), or raise --request-timeout"
                ));
            } else {
                crate::output::warn(&format!("erdmactl: {msg}"));
            }
            ExitCode::from(exit::USAGE)
        }
    }
}

/// The error and its causes as `a: b: c`, leaving out a cause whose text the message already
/// holds (kube's errors print their source inside their own message; a silent API server would
/// otherwise be named three times on one line).
fn chain_text(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if msg.contains(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg
}

/// Whether the error is stdout's reader going away (`| head`): stop quietly.
fn closed_stdout(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<output::OutputClosed>()
            || c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `--help`, `--version` and usage errors, as clap prints them, but a help text that cannot be
/// written is an error (exit 2), not a silent success.
fn parse_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let text = e.render().to_string();
    if !matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        // clap's own printing: stderr, colour only on a terminal.
        let _ = e.print();
        return ExitCode::from(exit::USAGE);
    }
    match output::emit(&text) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if closed_stdout(&e) => ExitCode::from(output::BROKEN_PIPE),
        Err(e) => {
            crate::output::warn(&format!("erdmactl: {e:#}"));
            ExitCode::from(exit::USAGE)
        }
    }
}
