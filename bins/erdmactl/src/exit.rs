//! Exit statuses, the same contract for every subcommand (also in `--help` and the README):
//! 0 success, 1 a check failed or nothing usable was found, 2 usage, input or access error.

/// A check failed, or nothing usable was found.
pub const CHECK_FAILED: u8 = 1;
/// Usage, input or access error: nothing was decided.
pub const USAGE: u8 = 2;

/// The top-level `--help` text.
pub const ALL: &str = "Exit status (every subcommand): 0 success; 1 a check failed or nothing usable was found; 2 usage, input or access error (nothing was decided), or stdout could not be written; 141 stdout's reader went away (| head), as SIGPIPE ends a process. Each subcommand's --help says what 1 means for it.";
/// `erdmactl devices`.
pub const DEVICES: &str = "Exit status: 0 at least one usable (healthy) RDMA device is listed; 1 none is usable (the table or JSON says why); 2 usage or input error.";
/// `erdmactl doctor`.
pub const DOCTOR: &str = "Exit status: 0 no check failed (WARN, INFO and SKIP allowed); 1 a check failed, or with --strict a check warned; 2 usage error, or the cluster could not be read (kubeconfig, API, missing node or pod).";
/// `erdmactl install`.
pub const INSTALL: &str = "Exit status: 0 rendered (--dry-run) or applied; 2 invalid values, values a working install needs are missing (apply only), another eRDMA installation serves aliyun/erdma (refused, nothing applied; --allow-existing overrides), or the API refused.";
/// `erdmactl uninstall`.
pub const UNINSTALL: &str =
    "Exit status: 0 deleted, or listed with --dry-run; 2 usage error or the API refused.";
/// `erdmactl submit pytorch`.
pub const SUBMIT: &str = "Exit status: 0 submitted, or rendered with --dry-run; 2 invalid arguments, or the API refused the job.";
/// `erdmactl smc status` / `smc pnet`.
pub const SMC: &str = "Exit status: 0 listed; 1 this kernel has no SMC (the reason is printed: \"SMC unsupported: ...\"); 2 usage error, or the network namespace cannot be entered.";
/// `erdmactl top pods` / `top devices`.
pub const TOP: &str = "Exit status: 0 every agent asked was read; 1 an agent could not be read or cannot read RDMA usage (each such node is named on stderr with the reason; the others are printed); 2 usage error, or the cluster could not be read (kubeconfig, API).";
