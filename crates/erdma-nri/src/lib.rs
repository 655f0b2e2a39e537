//! The NRI (Node Resource Interface) plugin protocol, written for erdma.
//!
//! containerd (1.7 with NRI enabled, on by default from 2.0) and CRI-O hand every pod sandbox and
//! container to NRI plugins before they start, over one Unix socket (`/var/run/nri/nri.sock`):
//!
//! - [`mux`]: the connection multiplexer NRI puts on that socket (8-byte frames: connection ID,
//!   length); logical connection 1 carries the plugin's service, 2 the runtime's.
//! - [`ttrpc`]: ttRPC framing (10-byte message header, `ttrpc.Request`/`Response` envelopes) and
//!   a unary server and client over one logical connection.
//! - [`api`]: our own protos of the NRI `v1alpha1` API (the subset erdma uses, containerd 1.7's
//!   NRI v0.6 up to v0.12) and ttRPC's envelope, with checked-in generated code.
//! - [`plugin`]: the plugin runner: connect, register, answer `Configure`/`Synchronize` (split or
//!   whole), hand pod and container events (over their own RPCs or `StateChange`) to a
//!   [`plugin::Handler`], with a time budget per call, and tell a [`plugin::HookObserver`] each
//!   hook's duration and outcome.
//! - `fake` (feature): a runtime stand-in that drives a plugin as containerd 1.7, NRI v0.8 or NRI
//!   v0.12 does, for tests.

pub mod api;
#[cfg(feature = "fake")]
pub mod fake;
pub mod mux;
pub mod plugin;
pub mod ttrpc;

/// Default NRI socket.
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";
