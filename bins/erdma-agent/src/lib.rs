//! `erdma-agent` as a library: the node agent's tasks, started by [`agent::run`] from the
//! settings [`cli`] resolves; the binary's `main` only parses flags, sets up logs and signals.
//!
//! The pieces: flags and config file → settings; the device state owner (inventory scans,
//! published when changed); the driver manager (readiness gate); the ERI source (local
//! discovery or this node's ERdmaDevice) and the instance ID; the publisher that turns these
//! into the served snapshot through `erdma_model::DeviceSelection`; ERI netdev and SMC-R pnet
//! host setup; SMC-R for annotated pods in PreStartContainer (`--deviceplugin-prestart-container`);
//! the kubelet device plugin and the watch for another plugin serving the same resource, or (per
//! node, `--resource-api`) the DRA driver instead;
//! `/metrics` and `/healthz`; SIGTERM/SIGINT → graceful shutdown.
//!
//! What runs on a node is decided once, from the settings and what the node offers, by
//! [`plan::AgentPlan`]; [`agent::run`] only wires it: one start per concern, in the module that
//! owns the concern, and one shutdown ([`tasks::Tasks`]).

pub mod agent;
pub mod cli;
pub mod cluster;
pub mod coexistence;
pub mod devices;
pub mod driver;
pub mod health;
pub mod hostsetup;
pub mod metrics;
pub mod nri;
pub mod pending;
pub mod plan;
pub mod plugin;
pub mod plugin_resource;
pub mod rdma_max;
pub mod reload_guard;
pub mod resource_api;
pub mod smcr;
pub mod source;
pub mod tasks;
pub mod usage;
