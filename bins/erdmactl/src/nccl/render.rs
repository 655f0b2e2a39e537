//! Human-readable rendering of NCCL analysis and comparison reports.

use crate::output::table;
use erdma_nccl::compare::CompareReport;
use erdma_nccl::report::{AnalyzeReport, JobReport};
use std::fmt::Write as _;

fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.join(", ")
    }
}

/// Renders `nccl analyze` as text.
pub fn analyze(report: &AnalyzeReport) -> String {
    let mut out = String::new();
    for (i, job) in report.jobs.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        job_text(&mut out, job);
    }
    let cut: u64 = report.files.iter().map(|f| f.truncated_lines).sum();
    if cut > 0 {
        let _ = writeln!(
            out,
            "\nnote: {cut} over-long line(s) were cut before analysis"
        );
    }
    if report.processes_not_tracked > 0 {
        let _ = writeln!(
            out,
            "note: lines of {} process(es) beyond the tracking limit were not analysed",
            report.processes_not_tracked
        );
    }
    out
}

fn job_text(out: &mut String, j: &JobReport) {
    let _ = writeln!(out, "{} ({})", j.id, j.files.join(", "));
    let kv = |out: &mut String, k: &str, v: String| {
        let _ = writeln!(out, "  {k:<16} {v}");
    };
    kv(out, "NCCL version", list(&j.nccl_versions));
    kv(
        out,
        "ranks",
        format!(
            "{} (seen {}, processes {})",
            or_dash(j.ranks),
            j.ranks_seen,
            j.processes
        ),
    );
    kv(
        out,
        "nodes",
        format!("{} (hosts: {})", or_dash(j.nodes), list(&j.hosts)),
    );
    let mut net = list(&j.network.chosen);
    if !j.network.plugins_failed.is_empty() {
        net.push_str(&format!(
            " (failed: {})",
            j.network.plugins_failed.join(", ")
        ));
    }
    kv(out, "network", net);
    let mut ib = list(&j.ib.devices);
    if j.ib.no_device_found {
        ib.push_str(" (NET/IB: No device found)");
    }
    if !j.ib.oob.is_empty() {
        ib.push_str(&format!("; OOB {}", j.ib.oob.join(", ")));
    }
    kv(out, "IB devices", ib);
    if !j.socket_interfaces.is_empty() {
        kv(out, "socket ifaces", j.socket_interfaces.join(", "));
    }
    let in_use: Vec<String> = j.gid_index.in_use.iter().map(i64::to_string).collect();
    kv(
        out,
        "GID index",
        format!(
            "configured {}, in use {}",
            j.gid_index.configured.as_deref().unwrap_or("-"),
            list(&in_use)
        ),
    );
    kv(
        out,
        "GDR",
        format!(
            "{} ({}/{} network connections with GDRDMA)",
            j.gdr.state, j.gdr.gdr_connections, j.gdr.net_connections
        ),
    );
    if j.transports.is_empty() {
        kv(out, "transports", "- (no channel connection logged)".into());
    } else {
        let rows: Vec<Vec<String>> = j
            .transports
            .iter()
            .map(|t| {
                vec![
                    t.transport.clone(),
                    t.connections.to_string(),
                    t.gdr_connections.to_string(),
                    list(&t.devices),
                ]
            })
            .collect();
        let _ = writeln!(out, "  transports:");
        for l in table(&["TRANSPORT", "CONNECTIONS", "GDRDMA", "DEVICES"], &rows).lines() {
            let _ = writeln!(out, "    {l}");
        }
    }
    if !j.env.is_empty() {
        let env: Vec<String> = j.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        kv(out, "NCCL env", env.join(" "));
    }
    if let Some(r) = &j.nccl_result {
        kv(out, "NCCL result", format!("{} ({})", r.name, r.code));
    }
    if j.problems.is_empty() {
        kv(out, "problems", "none".into());
    } else {
        let _ = writeln!(out, "  problems:");
        for p in &j.problems {
            let sev = match p.severity {
                erdma_nccl::diagnose::Severity::Error => "ERROR",
                erdma_nccl::diagnose::Severity::Warning => "WARN",
                erdma_nccl::diagnose::Severity::Info => "INFO",
            };
            let who = if p.processes == 0 {
                "in PyTorch/launcher output".to_string()
            } else {
                format!("in {} process(es)", p.processes)
            };
            let _ = writeln!(
                out,
                "    {sev} {} [{}] x{} {who}, first at {}",
                p.title,
                p.kind_str(),
                p.count,
                p.first_seen
            );
            let _ = writeln!(out, "      line:    {}", p.message);
            let _ = writeln!(out, "      meaning: {}", p.meaning);
            let _ = writeln!(out, "      fix:     {}", p.fix);
        }
    }
    let _ = writeln!(
        out,
        "  eRDMA used: {}, because {}",
        j.verdict.erdma_used.as_str(),
        j.verdict.because
    );
}

fn gb(v: f64) -> String {
    format!("{v:.2}")
}

fn ratio(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

/// Human size: 8 B, 64 KiB, 128 MiB.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut u = 0;
    while v >= 1024 && v.is_multiple_of(1024) && u + 1 < UNITS.len() {
        v /= 1024;
        u += 1;
    }
    format!("{v} {}", UNITS[u])
}

/// Renders `nccl compare` as text.
pub fn compare(c: &CompareReport) -> String {
    let mut out = String::new();
    for (label, s) in [("A", &c.a), ("B", &c.b)] {
        let _ = writeln!(out, "{label}: {}", s.name);
        let _ = writeln!(
            out,
            "   eRDMA used: {}, because {}",
            s.erdma_used.as_str(),
            s.because
        );
        if !s.transports.is_empty() {
            let _ = writeln!(out, "   transports: {}", s.transports.join(", "));
        }
        if let Some(r) = &s.rdma {
            let _ = writeln!(
                out,
                "   RDMA ({}): {} pods on {} nodes, {} QPs ({} RTS), {} registered, {} CQs, {} PDs",
                r.source,
                r.pods,
                r.nodes,
                r.qps,
                r.qps_rts,
                crate::top::human_bytes(r.mr_bytes as f64),
                r.cqs,
                r.pds
            );
        }
    }
    out.push('\n');
    if c.rows.is_empty() {
        out.push_str("no message size appears in both inputs\n");
    } else {
        let rows: Vec<Vec<String>> = c
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.collective.clone(),
                    size(r.size_bytes),
                    gb(r.a_busbw_gbps),
                    gb(r.b_busbw_gbps),
                    ratio(r.busbw_ratio),
                    format!("{:.1}", r.a_time_us),
                    format!("{:.1}", r.b_time_us),
                    ratio(r.speedup),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "COLLECTIVE",
                "SIZE",
                "A BUSBW GB/s",
                "B BUSBW GB/s",
                "B/A",
                "A TIME us",
                "B TIME us",
                "SPEEDUP",
            ],
            &rows,
        ));
    }
    if let Some(s) = &c.steps {
        let _ = writeln!(
            out,
            "\nstep time: A {:.3} ms, B {:.3} ms, speed-up {}",
            s.a_ms,
            s.b_ms,
            ratio(s.speedup)
        );
    }
    let _ = writeln!(out, "\n{}", c.summary);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use erdma_nccl::{Analyzer, Options};

    proptest::proptest! {
        /// Whatever the logs hold, the text rendering does not panic.
        #[test]
        fn any_report_renders(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4096)) {
            let mut an = Analyzer::new(Options::default());
            an.add_input("fuzz", &data[..]).expect("in-memory read");
            let _text = analyze(&an.finish());
        }
    }
}
