//! `erdmactl nccl analyze|compare`: clap types, the entry point, text rendering.

mod render;

use crate::output::{self, Format};
use anyhow::Context as _;
use erdma_nccl::compare;
use erdma_nccl::model::{Analyzer, Options};
use erdma_nccl::report::Answer;
use std::fs::File;
use std::io::{self, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Read buffer per input: 64 KiB stays in the L2 cache between the kernel's copy and the scan
/// (measured on the 1 GiB bench log: 256 KiB cost ~30 % more system time and no less user time).
const READ_BUFFER: usize = 64 * 1024;

/// `erdmactl nccl`: analyse NCCL logs and compare runs.
#[derive(Debug, Clone, clap::Args)]
pub struct NcclArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: NcclCommand,
}

/// Subcommands of `nccl`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum NcclCommand {
    /// Report NCCL version, ranks, nodes, network, devices, GID index, GDR, transport mix, errors
    /// with fixes, and whether eRDMA was used, per job. Reads NCCL_DEBUG=INFO output of one or many
    /// ranks (interleaved or one file per rank; `-` reads stdin).
    #[command(
        after_help = "Exit status: 0 analysed; 1 with --require-erdma, a job did not use eRDMA; 2 unreadable log or usage error."
    )]
    Analyze(AnalyzeArgs),
    /// Compare two runs (NCCL logs with nccl-tests tables, PROBE_RESULT/TRAIN_RESULT lines or
    /// step_ms= values): bus bandwidth per message size and step times side by side with B/A ratios.
    #[command(after_help = "Exit status: 0 compared; 2 unreadable log or usage error.")]
    Compare(CompareArgs),
}

/// Arguments of `nccl analyze`.
#[derive(Debug, Clone, clap::Args)]
pub struct AnalyzeArgs {
    /// Log files (`-` for stdin). Processes are grouped into jobs by communicator id; a
    /// `host:pid` that prints a second NCCL version banner is another run (another job, so a TCP
    /// run and an eRDMA run of one job are judged apart); a file given twice is read once.
    #[arg(required = true, value_name = "LOG")]
    pub logs: Vec<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Format,
    /// Exit with status 1 unless every job used eRDMA (for CI gates and readiness checks).
    #[arg(long)]
    pub require_erdma: bool,
    /// Longest line considered, in bytes (80 to 16 MiB); longer lines are cut.
    #[arg(long, default_value_t = erdma_nccl::reader::DEFAULT_MAX_LINE, value_name = "BYTES")]
    pub max_line_bytes: usize,
}

/// Arguments of `nccl compare`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// Baseline run (for example TCP).
    #[arg(value_name = "A.log")]
    pub a: PathBuf,
    /// Candidate run (for example eRDMA).
    #[arg(value_name = "B.log")]
    pub b: PathBuf,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Format,
    /// Compare nccl-tests in-place columns instead of out-of-place.
    #[arg(long)]
    pub in_place: bool,
    /// A's RDMA usage saved while it ran (`erdmactl top pods -o json > FILE`, or one agent's
    /// `/usage`): its QPs, registered bytes, CQs and PDs are added to A's side.
    #[arg(long, value_name = "FILE")]
    pub usage_a: Option<PathBuf>,
    /// B's RDMA usage, as --usage-a.
    #[arg(long, value_name = "FILE")]
    pub usage_b: Option<PathBuf>,
}

/// The sum of a usage file's pods: `top pods -o json` (`{"kind": "UsageList", "items": [...]}`),
/// a list of node usages, or one agent's `/usage` answer.
fn run_rdma(path: &Path) -> anyhow::Result<compare::RunRdma> {
    use erdma_usage::report::NodeUsage;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read usage file {}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "usage file {} is not JSON (save it with erdmactl top pods -o json)",
            path.display()
        )
    })?;
    let nodes: Vec<NodeUsage> = match v {
        serde_json::Value::Array(items) => serde_json::from_value(items.into())?,
        serde_json::Value::Object(ref o) if o.contains_key("items") => {
            serde_json::from_value(o["items"].clone())?
        }
        other => vec![serde_json::from_value(other)?],
    };
    let mut r = compare::RunRdma {
        source: path.display().to_string(),
        nodes: nodes.len(),
        ..Default::default()
    };
    for n in &nodes {
        r.pods += n.pods.len();
        for d in n.pods.iter().flat_map(|p| &p.devices) {
            let c = &d.counts;
            r.qps += c.qps;
            r.qps_rts += c.qps_by_state.get("RTS").copied().unwrap_or(0);
            r.mr_bytes += c.mr_bytes;
            r.cqs += c.cqs;
            r.pds += c.pds;
        }
    }
    Ok(r)
}

/// The largest `--max-line-bytes`: a line without a newline (`/dev/zero`) is buffered up to it.
const MAX_LINE_BYTES: usize = 16 << 20;

/// Runs `erdmactl nccl ...`, printing to stdout.
pub fn run(args: &NcclArgs) -> anyhow::Result<ExitCode> {
    let stdout = io::stdout();
    let mut lock = stdout.lock();
    run_to(args, &mut lock)
}

/// Runs `erdmactl nccl ...`, printing to `out`.
fn run_to(args: &NcclArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    match &args.command {
        NcclCommand::Analyze(a) => analyze(a, out),
        NcclCommand::Compare(c) => compare_cmd(c, out),
    }
}

fn feed(an: &mut Analyzer, path: &Path) -> anyhow::Result<()> {
    if path == Path::new("-") {
        let stdin = io::stdin();
        an.add_input(
            "<stdin>",
            BufReader::with_capacity(READ_BUFFER, stdin.lock()),
        )
        .context("reading NCCL log from stdin")?;
        return Ok(());
    }
    let file = File::open(path).with_context(|| {
        format!(
            "cannot open NCCL log {}: check the path (use - for stdin)",
            path.display()
        )
    })?;
    an.add_input(
        &path.display().to_string(),
        BufReader::with_capacity(READ_BUFFER, file),
    )
    .with_context(|| format!("reading NCCL log {}", path.display()))
}

fn analyze(a: &AnalyzeArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    if a.max_line_bytes < 80 {
        anyhow::bail!(
            "--max-line-bytes {} is too small: NCCL lines need at least 80 bytes (default 65536)",
            a.max_line_bytes
        );
    }
    if a.max_line_bytes > MAX_LINE_BYTES {
        anyhow::bail!(
            "--max-line-bytes {} is too large: at most {MAX_LINE_BYTES} (16 MiB; a line is held in memory whole up to this length, default 65536)",
            a.max_line_bytes
        );
    }
    let mut an = Analyzer::new(Options {
        max_line: a.max_line_bytes,
        collect_perf: false,
    });
    // A file given twice would count every line twice: read once, say so.
    let mut seen = std::collections::BTreeSet::new();
    for p in &a.logs {
        if p != Path::new("-")
            && let Ok(real) = std::fs::canonicalize(p)
            && !seen.insert(real)
        {
            crate::output::warn(&format!(
                "erdmactl: note: {} is given more than once; it is read once",
                p.display()
            ));
            continue;
        }
        feed(&mut an, p)?;
    }
    let report = an.finish();
    let text = match a.output {
        Format::Table => render::analyze(&report),
        f => output::render(&report, f)?,
    };
    crate::output::write_to(out, &text)?;
    if a.require_erdma
        && report
            .jobs
            .iter()
            .any(|j| j.verdict.erdma_used != Answer::Yes)
    {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

fn one(
    path: &Path,
) -> anyhow::Result<(
    String,
    erdma_nccl::report::AnalyzeReport,
    erdma_nccl::perf::PerfSummary,
)> {
    let mut an = Analyzer::new(Options {
        collect_perf: true,
        ..Options::default()
    });
    feed(&mut an, path)?;
    let (report, mut perfs) = an.finish_with_perf();
    let perf = perfs.pop().unwrap_or_default();
    let name = if path == Path::new("-") {
        "<stdin>".to_string()
    } else {
        path.display().to_string()
    };
    Ok((name, report, perf))
}

fn compare_cmd(c: &CompareArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    if c.a == Path::new("-") && c.b == Path::new("-") {
        anyhow::bail!("only one of A and B can be - (stdin)");
    }
    let (an, ar, ap) = one(&c.a)?;
    let (bn, br, bp) = one(&c.b)?;
    let mut report = compare::compare(&an, &ar, ap, &bn, &br, bp, c.in_place);
    if let Some(p) = &c.usage_a {
        report.a.rdma = Some(run_rdma(p).with_context(|| format!("--usage-a {}", p.display()))?);
    }
    if let Some(p) = &c.usage_b {
        report.b.rdma = Some(run_rdma(p).with_context(|| format!("--usage-b {}", p.display()))?);
    }
    let text = match c.output {
        Format::Table => render::compare(&report),
        f => output::render(&report, f)?,
    };
    crate::output::write_to(out, &text)?;
    Ok(ExitCode::SUCCESS)
}
