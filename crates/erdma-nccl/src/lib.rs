//! NCCL log analysis for erdma (the library behind `erdmactl nccl analyze|compare`; the CLI and
//! its text rendering live in erdmactl).
//!
//! - [`reader`]: bounded, allocation-free line reading (constant memory, non-UTF-8 tolerated);
//!   [`scan`]: the lines and ` NCCL ` markers of a whole read buffer, 64 bytes at a time;
//! - [`line`](mod@line): the `host:pid:tid [dev] NCCL INFO` prefix;
//! - [`event`]: what a message says (versions, devices, networks, channels, GDR, GID, errors);
//! - [`diagnose`]: known failures with meaning and fix;
//! - [`model`]: the streaming analyser and job grouping; [`process`]: what it keeps per process
//!   and file; [`prefix_cache`]: which process a line prefix belongs to;
//! - [`report`]: the `-o json` shape and the "eRDMA used" verdict;
//! - [`perf`] and [`compare`]: nccl-tests tables, probe/training figures, and A/B comparison;

pub mod compare;
pub mod diagnose;
pub mod event;
pub mod line;
pub mod model;
pub mod perf;
pub mod prefix_cache;
pub mod process;
pub mod reader;
pub mod report;
pub mod scan;

pub use model::{Analyzer, Options};
pub use report::{AnalyzeReport, Answer, JobReport, Verdict};
