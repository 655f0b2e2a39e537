//! `erdmactl doctor`: the documented eRDMA troubleshooting as checks. Each [`Check`] is PASS,
//! WARN, FAIL or SKIP with a message naming the object and value, and a fix hint.
//!
//! The checks are pure functions of Kubernetes objects ([`node`], [`pod`]) and of the local device
//! inventory ([`local`]); [`cluster`] fetches the objects with the user's kubeconfig.

pub mod agent_health;
pub mod check;
pub mod cluster;
pub mod coexistence;
pub mod dra;
pub mod libs;
pub mod local;
pub mod node;
pub mod nri;
pub mod pod;
pub mod scheduling;
pub mod smc_usage;
pub mod usage;

pub use check::{Check, Report, Status};
