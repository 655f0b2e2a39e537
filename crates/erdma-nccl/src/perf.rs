//! Performance figures found in a log: nccl-tests tables, `PROBE_RESULT {json}` lines and training
//! step times (`step_ms=<ms>` lines and `TRAIN_RESULT {json}` of `examples/pytorch-mnist`).
//!
//! nccl-tests rows (`NVIDIA/nccl-tests:src/util.cu`, `nccl-and-arena.md` §A4) have the columns
//! `size count type [redop] root` then out-of-place `time algbw busbw #wrong` and in-place
//! `time algbw busbw #wrong`; `#wrong` may be `N/A`. Launchers may prefix rows (`[1,0]<stdout>:`).

use memchr::memmem::Finder;
use serde::Serialize;
use std::collections::BTreeMap;

/// Most distinct (collective, size, type) rows kept per file: bounded memory on any input.
pub const MAX_ROWS: usize = 4096;

/// Time and bandwidth of one measurement.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Timing {
    /// Time per operation in microseconds.
    pub time_us: f64,
    /// Algorithm bandwidth in GB/s.
    pub algbw_gbps: f64,
    /// Bus bandwidth in GB/s.
    pub busbw_gbps: f64,
}

/// Key of a row: collective, message size in bytes, data type.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RowKey {
    /// Collective name (`all_reduce`), from `# Collective test starting: all_reduce_perf` or the
    /// probe's key; `unknown` when the log does not say.
    pub collective: String,
    /// Message size in bytes.
    pub size_bytes: u64,
    /// Element type (`float`), or `bytes` for probe results.
    pub dtype: String,
}

/// Averages of all rows with one key.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PerfRow {
    /// The key.
    #[serde(flatten)]
    pub key: RowKey,
    /// Out-of-place figures (nccl-tests) or the probe's figures.
    pub out_of_place: Timing,
    /// In-place figures (nccl-tests only).
    pub in_place: Option<Timing>,
    /// Sum of `#wrong` over samples (`None` when not validated).
    pub wrong: Option<u64>,
    /// How many rows were averaged.
    pub samples: u32,
}

/// Running statistics of step times.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct StepStats {
    /// Values seen (including warm-up).
    pub count: u64,
    /// Mean of the values after the first [`WARMUP_STEPS`] (or of all when there are fewer).
    pub mean_ms: f64,
    /// Smallest value.
    pub min_ms: f64,
    /// Largest value.
    pub max_ms: f64,
    #[serde(skip)]
    sum_all: f64,
    #[serde(skip)]
    sum_steady: f64,
}

/// Leading `step_ms=` values ignored by the mean (CUDA/NCCL initialisation makes them slow).
pub const WARMUP_STEPS: u64 = 3;

impl StepStats {
    fn add(&mut self, v: f64) {
        if !v.is_finite() || v < 0.0 {
            return;
        }
        if self.count == 0 {
            self.min_ms = v;
            self.max_ms = v;
        }
        self.min_ms = self.min_ms.min(v);
        self.max_ms = self.max_ms.max(v);
        self.count += 1;
        self.sum_all += v;
        if self.count > WARMUP_STEPS {
            self.sum_steady += v;
        }
        let steady = self.count.saturating_sub(WARMUP_STEPS);
        self.mean_ms = if steady > 0 {
            self.sum_steady / steady as f64
        } else {
            self.sum_all / self.count as f64
        };
    }
}

/// Everything performance-related found in one input.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct PerfSummary {
    /// Rows sorted by collective, size, type.
    pub rows: Vec<PerfRow>,
    /// `# Avg bus bandwidth : <g>` per collective.
    pub avg_busbw_gbps: BTreeMap<String, f64>,
    /// Per-step times from `step_ms=` lines.
    pub steps: Option<StepStats>,
    /// Steady-state mean step time reported by the workload itself (`TRAIN_RESULT.step_ms_mean` or
    /// `PROBE_RESULT.ddp_step_ms`).
    pub reported_step_ms: Option<f64>,
    /// Throughput reported by the workload (`TRAIN_RESULT.samples_per_s`).
    pub samples_per_s: Option<f64>,
    /// Which formats were seen: `nccl-tests`, `probe`, `train`, `step_ms`.
    pub sources: Vec<&'static str>,
}

#[derive(Debug, Default)]
struct Acc {
    oop: [f64; 3],
    ip: [f64; 3],
    ip_n: u32,
    wrong: Option<u64>,
    n: u32,
}

/// Streams lines and collects performance figures.
#[derive(Debug)]
pub struct PerfCollector {
    collective: String,
    rows: BTreeMap<RowKey, Acc>,
    avg: BTreeMap<String, f64>,
    steps: StepStats,
    reported_step_ms: Option<f64>,
    samples_per_s: Option<f64>,
    sources: Vec<&'static str>,
    probe: Finder<'static>,
    train: Finder<'static>,
    step: Finder<'static>,
}

impl Default for PerfCollector {
    fn default() -> Self {
        Self {
            collective: "unknown".into(),
            rows: BTreeMap::new(),
            avg: BTreeMap::new(),
            steps: StepStats::default(),
            reported_step_ms: None,
            samples_per_s: None,
            sources: Vec::new(),
            probe: Finder::new("PROBE_RESULT "),
            train: Finder::new("TRAIN_RESULT "),
            step: Finder::new("step_ms="),
        }
    }
}

impl PerfCollector {
    fn seen(&mut self, s: &'static str) {
        if !self.sources.contains(&s) {
            self.sources.push(s);
        }
    }

    /// Feeds one line (any content).
    pub fn line(&mut self, line: &str) {
        let body = strip_launcher_prefix(line);
        let t = body.trim_start();
        if let Some(rest) = t.strip_prefix('#') {
            self.comment(rest.trim());
            return;
        }
        if t.as_bytes().first().is_some_and(u8::is_ascii_digit) && self.table_row(t) {
            return;
        }
        let b = line.as_bytes();
        if let Some(at) = self.probe.find(b) {
            self.probe_json(&line[at + "PROBE_RESULT ".len()..]);
        } else if let Some(at) = self.train.find(b) {
            self.train_json(&line[at + "TRAIN_RESULT ".len()..]);
        } else if let Some(at) = self.step.find(b) {
            let v = line[at + "step_ms=".len()..]
                .split(|c: char| c.is_whitespace() || c == ',')
                .next();
            if let Some(v) = v.and_then(|v| v.parse::<f64>().ok()) {
                self.seen("step_ms");
                self.steps.add(v);
            }
        }
    }

    fn comment(&mut self, c: &str) {
        if let Some(name) = c.strip_prefix("Collective test starting:") {
            self.seen("nccl-tests");
            self.collective = name.trim().trim_end_matches("_perf").to_string();
        } else if let Some(v) = c.strip_prefix("Avg bus bandwidth") {
            let v = v
                .trim_start_matches([' ', ':'])
                .split_whitespace()
                .next()
                .unwrap_or("");
            if let Ok(v) = v.parse::<f64>()
                && (self.avg.len() < MAX_ROWS || self.avg.contains_key(&self.collective))
            {
                self.seen("nccl-tests");
                self.avg.insert(self.collective.clone(), v);
            }
        } else if c.starts_with("nThread ") {
            self.seen("nccl-tests");
        }
    }

    fn table_row(&mut self, t: &str) -> bool {
        let mut it = t.split_whitespace();
        let (Some(size), Some(_count), Some(dtype)) = (it.next(), it.next(), it.next()) else {
            return false;
        };
        let Ok(size) = size.parse::<u64>() else {
            return false;
        };
        if !_count.bytes().all(|b| b.is_ascii_digit())
            || !dtype
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return false;
        }
        if dtype.as_bytes().first().is_none_or(|b| b.is_ascii_digit()) {
            return false;
        }
        let Some(t3) = it.next() else { return false };
        // Optional redop column, then root.
        if t3.parse::<i64>().is_err() {
            let Some(root) = it.next() else { return false };
            if root.parse::<i64>().is_err() {
                return false;
            }
        }
        let nums: Vec<&str> = it.collect();
        if nums.len() < 4 {
            return false;
        }
        let f = |s: &str| s.parse::<f64>().ok().filter(|v| v.is_finite());
        let (Some(t), Some(a), Some(b)) = (f(nums[0]), f(nums[1]), f(nums[2])) else {
            return false;
        };
        let wrong1 = wrong_of(nums[3]);
        let ip = if nums.len() >= 8 {
            match (f(nums[4]), f(nums[5]), f(nums[6])) {
                (Some(t), Some(a), Some(b)) => Some(([t, a, b], wrong_of(nums[7]))),
                _ => None,
            }
        } else {
            None
        };
        let key = RowKey {
            collective: self.collective.clone(),
            size_bytes: size,
            dtype: dtype.to_string(),
        };
        if self.rows.len() >= MAX_ROWS && !self.rows.contains_key(&key) {
            return true;
        }
        self.seen("nccl-tests");
        let acc = self.rows.entry(key).or_default();
        acc.n += 1;
        for (slot, v) in acc.oop.iter_mut().zip([t, a, b]) {
            *slot += v;
        }
        let mut wrong = wrong1;
        if let Some((vals, w2)) = ip {
            acc.ip_n += 1;
            for (slot, v) in acc.ip.iter_mut().zip(vals) {
                *slot += v;
            }
            wrong = match (wrong, w2) {
                (Some(x), Some(y)) => Some(x.saturating_add(y)),
                (x, y) => x.or(y),
            };
        }
        if let Some(w) = wrong {
            acc.wrong = Some(acc.wrong.unwrap_or(0).saturating_add(w));
        }
        true
    }

    fn probe_json(&mut self, json: &str) {
        let Ok(serde_json::Value::Object(map)) =
            serde_json::from_str::<serde_json::Value>(json.trim())
        else {
            return;
        };
        self.seen("probe");
        if let Some(v) = map.get("ddp_step_ms").and_then(serde_json::Value::as_f64) {
            self.reported_step_ms = Some(v);
        }
        for (name, value) in &map {
            let Some(items) = value.as_array() else {
                continue;
            };
            for item in items {
                let get = |k: &str| item.get(k).and_then(serde_json::Value::as_f64);
                let (Some(bytes), Some(t)) = (
                    item.get("bytes").and_then(serde_json::Value::as_u64),
                    get("time_us"),
                ) else {
                    continue;
                };
                let key = RowKey {
                    collective: normalise_collective(name),
                    size_bytes: bytes,
                    dtype: "bytes".into(),
                };
                if self.rows.len() >= MAX_ROWS && !self.rows.contains_key(&key) {
                    continue;
                }
                let acc = self.rows.entry(key).or_default();
                acc.n += 1;
                acc.oop[0] += t;
                acc.oop[1] += get("algbw_GBps").unwrap_or(0.0);
                acc.oop[2] += get("busbw_GBps").unwrap_or(0.0);
            }
        }
    }

    fn train_json(&mut self, json: &str) {
        let Ok(serde_json::Value::Object(map)) =
            serde_json::from_str::<serde_json::Value>(json.trim())
        else {
            return;
        };
        self.seen("train");
        if let Some(v) = map.get("step_ms_mean").and_then(serde_json::Value::as_f64) {
            self.reported_step_ms = Some(v);
        }
        if let Some(v) = map.get("samples_per_s").and_then(serde_json::Value::as_f64) {
            self.samples_per_s = Some(v);
        }
    }

    /// The collected figures.
    pub fn finish(self) -> PerfSummary {
        let rows = self
            .rows
            .into_iter()
            .map(|(key, a)| {
                let n = f64::from(a.n.max(1));
                let ipn = f64::from(a.ip_n.max(1));
                PerfRow {
                    key,
                    out_of_place: Timing {
                        time_us: a.oop[0] / n,
                        algbw_gbps: a.oop[1] / n,
                        busbw_gbps: a.oop[2] / n,
                    },
                    in_place: (a.ip_n > 0).then(|| Timing {
                        time_us: a.ip[0] / ipn,
                        algbw_gbps: a.ip[1] / ipn,
                        busbw_gbps: a.ip[2] / ipn,
                    }),
                    wrong: a.wrong,
                    samples: a.n,
                }
            })
            .collect();
        PerfSummary {
            rows,
            avg_busbw_gbps: self.avg,
            steps: (self.steps.count > 0).then_some(self.steps),
            reported_step_ms: self.reported_step_ms,
            samples_per_s: self.samples_per_s,
            sources: self.sources,
        }
    }
}

fn wrong_of(s: &str) -> Option<u64> {
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(|v| v as u64)
}

/// `allreduce` / `all_reduce_perf` / `AllReduce` → `all_reduce`.
fn normalise_collective(name: &str) -> String {
    let n = name.trim_end_matches("_perf").to_ascii_lowercase();
    match n.as_str() {
        "allreduce" => "all_reduce".into(),
        "allgather" => "all_gather".into(),
        "reducescatter" => "reduce_scatter".into(),
        "alltoall" => "alltoall".into(),
        _ => n,
    }
}

/// Strips `[1,0]<stdout>:` (mpirun `--tag-output`) from the front of a line.
fn strip_launcher_prefix(line: &str) -> &str {
    if line.starts_with('[')
        && let Some(i) = line.find(">:")
        && line[..i].contains("]<")
    {
        return &line[i + 2..];
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(text: &str) -> PerfSummary {
        let mut c = PerfCollector::default();
        for l in text.lines() {
            c.line(l);
        }
        c.finish()
    }

    #[test]
    fn nccl_tests_table_with_header_and_avg() {
        let s = collect(
            "# Collective test starting: all_reduce_perf\n\
             # nThread 1 nGpus 1 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0\n\
             #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n\
             \x20          8             2     float     sum      -1    14.54    0.00    0.00      0    15.94    0.00    0.00      0\n\
             [1,0]<stdout>:     1048576        262144     float     sum      -1    105.9    9.90   17.33      0    105.7    9.92   17.37    N/A\n\
             # Avg bus bandwidth    : 8.675 \n",
        );
        assert_eq!(s.rows.len(), 2);
        let r = &s.rows[1];
        assert_eq!(r.key.collective, "all_reduce");
        assert_eq!(r.key.size_bytes, 1048576);
        assert_eq!(r.out_of_place.busbw_gbps, 17.33);
        assert_eq!(r.in_place.map(|t| t.busbw_gbps), Some(17.37));
        assert_eq!(r.wrong, Some(0));
        assert_eq!(s.avg_busbw_gbps.get("all_reduce"), Some(&8.675));
        assert_eq!(s.sources, vec!["nccl-tests"]);
    }

    #[test]
    fn old_rows_without_redop_column() {
        let s = collect(
            "    40046416      40046416      int8       0   1268.1   31.58   31.58  0e+00   1279.3   31.30   31.30  0e+00",
        );
        assert_eq!(s.rows.len(), 1);
        assert_eq!(s.rows[0].key.dtype, "int8");
        assert_eq!(s.rows[0].out_of_place.time_us, 1268.1);
    }

    #[test]
    fn nccl_prefixed_lines_are_not_rows() {
        let s = collect(
            "0fed198eb8ba:528157:528268 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM",
        );
        assert!(s.rows.is_empty());
    }

    #[test]
    fn probe_and_steps() {
        let s = collect(
            "PROBE_RESULT {\"world\": 2, \"allreduce\": [{\"bytes\": 1048576, \"time_us\": 35.5, \"algbw_GBps\": 29.5, \"busbw_GBps\": 29.5}], \"ddp_step_ms\": 2.58}\n\
             step 1 loss=2.3 step_ms=100\nstep 2 step_ms=50\nstep 3 step_ms=10\nstep 4 step_ms=4\nstep 5 step_ms=6\n",
        );
        assert_eq!(s.rows[0].key.collective, "all_reduce");
        assert_eq!(s.rows[0].out_of_place.busbw_gbps, 29.5);
        assert_eq!(s.reported_step_ms, Some(2.58));
        let st = s.steps.expect("steps");
        assert_eq!(st.count, 5);
        assert_eq!(st.mean_ms, 5.0);
        assert_eq!(st.max_ms, 100.0);
    }
}
