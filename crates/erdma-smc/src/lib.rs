//! SMC-R host plumbing.
pub mod decline;
pub mod diag;
pub mod pnet;
