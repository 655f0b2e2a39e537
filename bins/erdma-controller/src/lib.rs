//! The erdma cluster controller as a library (the binary only wires it): configuration, ERI
//! selection, the Node and ERdmaDevice reconcilers, leader election, webhook certificates and the
//! SMC-R mutating webhook.

pub mod batch;
pub mod cert;
pub mod config;
pub mod eri;
pub mod leader;
pub mod metrics;
pub mod reconcile;
pub mod selfcheck;
pub mod verify;
pub mod webhook;
