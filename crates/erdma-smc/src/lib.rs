//! SMC-R host plumbing: the pnet table (`SMC_PNETID`), SMC-Rv2 UEIDs, `smc_diag` sockets, the
//! generic-netlink codec they share ([`genl`]), the capability probe, pod namespaces and their
//! sysctls, the BPF socket policy (feature `bpf`), the pod annotation and the pre-start decision,
//! and the SMC metrics.
pub mod annotation;
pub mod configure;
pub mod decline;
pub mod diag;
pub mod genl;
pub mod metrics;
pub mod netns;
pub mod pnet;
#[cfg(feature = "bpf")]
pub mod policy;
pub mod prestart;
pub mod probe;
pub mod sysctl;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod ueid;
