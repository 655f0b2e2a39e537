//! SMC-R host plumbing.
pub mod decline;
pub mod diag;
pub mod pnet;
pub mod annotation;
pub mod configure;
pub mod netns;
pub mod probe;
pub mod sysctl;
