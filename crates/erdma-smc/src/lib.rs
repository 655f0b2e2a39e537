//! SMC-R host plumbing.
pub mod pnet;
