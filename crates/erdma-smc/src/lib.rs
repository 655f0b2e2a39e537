//! SMC-R host plumbing.
pub mod annotation;
pub mod configure;
pub mod decline;
pub mod diag;
pub mod metrics;
pub mod netns;
pub mod pnet;
#[cfg(feature = "bpf")]
pub mod policy;
pub mod prestart;
pub mod probe;
pub mod sysctl;
pub mod ueid;
