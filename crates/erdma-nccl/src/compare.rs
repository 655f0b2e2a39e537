//! `nccl compare A B`: bus bandwidth per message size and step times side by side with the ratio,
//! plus each side's transport verdict, to answer "did eRDMA help?".
//!
//! A is the baseline (for example the TCP run), B the candidate (the eRDMA run); every ratio is
//! "B relative to A": bandwidth B/A, speed-up of time A/B. Above 1 means B is better.

use crate::perf::{PerfRow, PerfSummary};
use crate::report::{AnalyzeReport, Answer};
use serde::Serialize;
use std::collections::BTreeMap;

/// Sizes from this many bytes up are bandwidth-bound and enter the headline ratio.
pub const LARGE_MESSAGE: u64 = 1 << 20;
/// Ratios within ±5 % count as "no measurable difference".
pub const NOISE: f64 = 0.05;

/// One side of a comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// Input name.
    pub name: String,
    /// eRDMA verdict of the side's (first) job.
    pub erdma_used: Answer,
    /// Why.
    pub because: String,
    /// Transport mix (`NET/IB x24`).
    pub transports: Vec<String>,
    /// Figures found.
    pub perf: PerfSummary,
    /// The run's RDMA objects from the node agents' usage saved while it ran
    /// (`erdmactl nccl compare --usage-a/--usage-b`); absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdma: Option<RunRdma>,
}

/// A run's RDMA objects, summed over the pods of a usage file (`erdmactl top pods -o json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RunRdma {
    /// The usage file.
    pub source: String,
    /// Nodes in it.
    pub nodes: usize,
    /// Pods in it.
    pub pods: usize,
    /// Queue pairs.
    pub qps: u64,
    /// Queue pairs in RTS (ready to send).
    pub qps_rts: u64,
    /// Bytes registered in memory regions (pinned).
    pub mr_bytes: u64,
    /// Completion queues.
    pub cqs: u64,
    /// Protection domains.
    pub pds: u64,
}

/// One matched message size.
#[derive(Debug, Clone, Serialize)]
pub struct CompareRow {
    /// Collective.
    pub collective: String,
    /// Message size in bytes.
    pub size_bytes: u64,
    /// Data type of A (B may differ when sources differ).
    pub dtype: String,
    /// A's bus bandwidth (GB/s).
    pub a_busbw_gbps: f64,
    /// B's bus bandwidth (GB/s).
    pub b_busbw_gbps: f64,
    /// B/A bus bandwidth (`None` when A is 0).
    pub busbw_ratio: Option<f64>,
    /// A's time (µs).
    pub a_time_us: f64,
    /// B's time (µs).
    pub b_time_us: f64,
    /// A/B time (speed-up of B; `None` when B is 0).
    pub speedup: Option<f64>,
}

/// Step times side by side.
#[derive(Debug, Clone, Serialize)]
pub struct StepCompare {
    /// A's mean step time (ms).
    pub a_ms: f64,
    /// B's mean step time (ms).
    pub b_ms: f64,
    /// A/B (speed-up of B).
    pub speedup: Option<f64>,
}

/// The comparison.
#[derive(Debug, Clone, Serialize)]
pub struct CompareReport {
    /// Baseline.
    pub a: Side,
    /// Candidate.
    pub b: Side,
    /// Matched rows (out-of-place figures, or in-place with `--in-place`).
    pub rows: Vec<CompareRow>,
    /// Geometric mean of B/A bus bandwidth over matched sizes ≥ 1 MiB (all sizes when none is).
    pub busbw_ratio_geomean: Option<f64>,
    /// Sizes entering that mean.
    pub busbw_ratio_sizes: usize,
    /// Step times.
    pub steps: Option<StepCompare>,
    /// `yes` when B is eRDMA, A is not, and B is faster beyond noise; `no` when it is not faster;
    /// `unknown` when the sides do not differ in eRDMA use or there are no figures.
    pub erdma_helped: Answer,
    /// One-sentence answer.
    pub summary: String,
}

fn side(name: &str, report: &AnalyzeReport, perf: PerfSummary) -> Side {
    let job = report
        .jobs
        .iter()
        .find(|j| !j.transports.is_empty())
        .or(report.jobs.first());
    Side {
        name: name.to_string(),
        erdma_used: job.map_or(Answer::Unknown, |j| j.verdict.erdma_used),
        because: job.map_or_else(
            || "no NCCL lines".to_string(),
            |j| j.verdict.because.clone(),
        ),
        transports: job
            .map(|j| {
                j.transports
                    .iter()
                    .map(|t| format!("{} x{}", t.transport, t.connections))
                    .collect()
            })
            .unwrap_or_default(),
        perf,
        rdma: None,
    }
}

fn timing(r: &PerfRow, in_place: bool) -> (f64, f64) {
    let t = if in_place {
        r.in_place.unwrap_or(r.out_of_place)
    } else {
        r.out_of_place
    };
    (t.busbw_gbps, t.time_us)
}

/// Compares two analysed inputs with their figures.
pub fn compare(
    a_name: &str,
    a_report: &AnalyzeReport,
    a_perf: PerfSummary,
    b_name: &str,
    b_report: &AnalyzeReport,
    b_perf: PerfSummary,
    in_place: bool,
) -> CompareReport {
    let a = side(a_name, a_report, a_perf);
    let b = side(b_name, b_report, b_perf);
    let mut b_rows: BTreeMap<(&str, u64), Vec<&PerfRow>> = BTreeMap::new();
    for r in &b.perf.rows {
        b_rows
            .entry((r.key.collective.as_str(), r.key.size_bytes))
            .or_default()
            .push(r);
    }
    let mut rows = Vec::new();
    for ra in &a.perf.rows {
        let Some(cands) = b_rows.get(&(ra.key.collective.as_str(), ra.key.size_bytes)) else {
            continue;
        };
        let rb = cands
            .iter()
            .find(|r| r.key.dtype == ra.key.dtype)
            .or(if cands.len() == 1 {
                cands.first()
            } else {
                None
            });
        let Some(rb) = rb else { continue };
        let (abw, at) = timing(ra, in_place);
        let (bbw, bt) = timing(rb, in_place);
        rows.push(CompareRow {
            collective: ra.key.collective.clone(),
            size_bytes: ra.key.size_bytes,
            dtype: ra.key.dtype.clone(),
            a_busbw_gbps: abw,
            b_busbw_gbps: bbw,
            busbw_ratio: ratio(bbw, abw),
            a_time_us: at,
            b_time_us: bt,
            speedup: ratio(at, bt),
        });
    }
    let large: Vec<f64> = rows
        .iter()
        .filter(|r| r.size_bytes >= LARGE_MESSAGE)
        .filter_map(|r| r.busbw_ratio)
        .collect();
    let pool: Vec<f64> = if large.is_empty() {
        rows.iter().filter_map(|r| r.busbw_ratio).collect()
    } else {
        large
    };
    let geomean = (!pool.is_empty())
        .then(|| (pool.iter().map(|r| r.ln()).sum::<f64>() / pool.len() as f64).exp());

    let step = |s: &PerfSummary| s.reported_step_ms.or(s.steps.map(|st| st.mean_ms));
    let steps = match (step(&a.perf), step(&b.perf)) {
        (Some(x), Some(y)) => Some(StepCompare {
            a_ms: x,
            b_ms: y,
            speedup: ratio(x, y),
        }),
        _ => None,
    };

    let (erdma_helped, summary) = conclude(&a, &b, geomean, pool.len(), steps.as_ref());
    CompareReport {
        a,
        b,
        rows,
        busbw_ratio_geomean: geomean,
        busbw_ratio_sizes: pool.len(),
        steps,
        erdma_helped,
        summary,
    }
}

fn ratio(num: f64, den: f64) -> Option<f64> {
    (den > 0.0 && num.is_finite() && den.is_finite()).then(|| num / den)
}

fn conclude(
    a: &Side,
    b: &Side,
    bw: Option<f64>,
    n: usize,
    steps: Option<&StepCompare>,
) -> (Answer, String) {
    let mut facts = Vec::new();
    if let Some(r) = bw {
        facts.push(format!(
            "bus bandwidth B/A = {r:.2}x (geometric mean over {n} message size{})",
            if n == 1 { "" } else { "s" }
        ));
    }
    if let Some(s) = steps.and_then(|s| s.speedup) {
        facts.push(format!("step time speed-up A/B = {s:.2}x"));
    }
    if facts.is_empty() {
        return (
            Answer::Unknown,
            "no comparable figures: neither nccl-tests rows with matching sizes, PROBE_RESULT/TRAIN_RESULT lines nor \
             step_ms= values were found in both inputs"
                .into(),
        );
    }
    // Bandwidth decides when present; the step time otherwise.
    let score = bw.or(steps.and_then(|s| s.speedup)).unwrap_or(1.0);
    let better = if score > 1.0 + NOISE {
        "B is faster"
    } else if score < 1.0 - NOISE {
        "B is slower"
    } else {
        "no measurable difference"
    };
    let use_of = |s: &Side| format!("{} (eRDMA used: {})", s.name, s.erdma_used.as_str());
    let sides = format!("A = {}, B = {}", use_of(a), use_of(b));
    let answer = match (a.erdma_used, b.erdma_used) {
        (Answer::No, Answer::Yes) => {
            if score > 1.0 + NOISE {
                Answer::Yes
            } else {
                Answer::No
            }
        }
        _ => Answer::Unknown,
    };
    let lead = match answer {
        Answer::Yes => "eRDMA helped: ",
        Answer::No => "eRDMA did not help: ",
        Answer::Unknown => "",
    };
    (
        answer,
        format!("{lead}{better}; {}; {sides}", facts.join(", ")),
    )
}
