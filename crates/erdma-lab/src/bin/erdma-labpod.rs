//! `erdma-labpod`: the lab's pod runtime.
//!
//! `erdma-labpod run --name NAME [--alloc ALLOC.json]... [--netns NAME] [--env K=V]... -- CMD...`
//! starts CMD as a pod made from one or more Allocate responses (the JSON printed by
//! `erdma-fake-kubelet allocate -o json`); `plan` prints what `run` would do, as JSON.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use erdma_lab::allocation::Allocation;
use erdma_lab::cdi::{CdiRegistry, DEFAULT_SPEC_DIRS};
use erdma_lab::plan::{PodPlan, PodSpec};

#[derive(Parser)]
#[command(
    name = "erdma-labpod",
    version,
    about = "Run a command as a lab pod: own network, mount, PID, UTS and IPC namespaces and a private /dev holding only the allocated devices"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the pod, wait for it and exit with its command's status.
    Run(PodArgs),
    /// Print the validated pod plan as JSON without starting anything.
    Plan(PodArgs),
}

#[derive(Args)]
struct PodArgs {
    /// Pod name (DNS-1123 label); also its hostname.
    #[arg(long)]
    name: String,
    /// Allocate response JSON (`erdma-fake-kubelet allocate -o json`); repeat for several resources.
    /// Without it the pod gets no devices.
    #[arg(long = "alloc")]
    allocs: Vec<PathBuf>,
    /// Join this network namespace (/run/netns/NAME) instead of creating an empty one.
    #[arg(long)]
    netns: Option<String>,
    /// Extra environment variable, KEY=VALUE (repeatable; applied after the allocation's).
    #[arg(long = "env", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Directory with CDI specs for `cdi_devices` (repeatable; default /etc/cdi and /var/run/cdi).
    #[arg(long = "cdi-spec-dir")]
    cdi_spec_dirs: Vec<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("--env {s:?} is not KEY=VALUE"))
}

fn build_plan(args: &PodArgs) -> anyhow::Result<PodPlan> {
    let allocations = args
        .allocs
        .iter()
        .map(|p| Allocation::from_file(p))
        .collect::<Result<Vec<_>, _>>()?;
    let cdi_names: Vec<&str> = allocations
        .iter()
        .flat_map(|a| a.cdi_devices.iter().map(|c| c.name()))
        .collect();
    let cdi = if cdi_names.is_empty() {
        Default::default()
    } else {
        let dirs = if args.cdi_spec_dirs.is_empty() {
            DEFAULT_SPEC_DIRS.iter().map(PathBuf::from).collect()
        } else {
            args.cdi_spec_dirs.clone()
        };
        CdiRegistry::load(&dirs)?.resolve(&cdi_names)?
    };
    let spec = PodSpec {
        name: args.name.clone(),
        netns: args.netns.clone(),
        allocations,
        cdi,
        env: args.env.clone(),
        command: args.command.clone(),
    };
    PodPlan::build(&spec).with_context(|| format!("pod {}", args.name))
}

fn main() {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Plan(args) => build_plan(args).and_then(|plan| {
            println!("{}", serde_json::to_string_pretty(&plan)?);
            Ok(0)
        }),
        Command::Run(args) => build_plan(args).and_then(|plan| Ok(erdma_lab::runtime::run(&plan)?)),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("erdma-labpod: {e:#}");
            std::process::exit(125);
        }
    }
}
