//! SMC-R host plumbing.
pub mod annotation;
pub mod configure;
pub mod decline;
pub mod diag;
pub mod netns;
pub mod pnet;
#[cfg(feature = "bpf")]
pub mod policy;
pub mod probe;
pub mod sysctl;
pub mod ueid;
pub mod prestart;
pub mod metrics;
