//! Runs the analyser over one file and prints the number of jobs: the hot path of
//! `erdmactl nccl analyze` without the CLI, for profiling (`perf record`).
//! `cargo run --release -p erdma-nccl --example analyze_file -- LOG`

use erdma_nccl::{Analyzer, Options};
use std::io::BufReader;

fn main() -> std::io::Result<()> {
    let path = std::env::args().nth(1).expect("usage: analyze_file LOG");
    let file = std::fs::File::open(&path)?;
    let mut an = Analyzer::new(Options::default());
    an.add_input(&path, BufReader::with_capacity(1 << 20, file))?;
    let report = an.finish();
    println!("{} jobs", report.jobs.len());
    Ok(())
}
