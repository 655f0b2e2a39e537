//! What one client may hold of an erdma HTTP server: every server of [`super`] (the agent's
//! `/metrics` port, the controller's metrics port and its TLS webhook) runs under [`Limits`].
//!
//! - **Connections**: at most [`Limits::max_connections`] at once; one accepted beyond that is
//!   closed at once (nothing read from it) and counted as `over_cap`.
//! - **TLS handshake**: [`Limits::handshake`]; a client that has not finished it by then is
//!   dropped (`handshake_timeout`).
//! - **Request head**: [`Limits::header_read`], counted from the moment the server waits for a
//!   head, on a new connection and between two requests of a kept-alive one alike (hyper's
//!   header timer starts whenever the connection waits for a head), so it is also the keep-alive
//!   idle timeout. The read buffer, and so the longest head, is [`Limits::max_buffer`].
//! - **Request**: [`Limits::request`] from the end of the head to the response's head (the body
//!   included); beyond it the answer is `408` and the connection is closed (`request_timeout`).
//!   A body longer than [`Limits::max_body`] fails to read.
//!
//! Memory held by clients is so bounded by `max_connections` times a connection's buffers, and
//! released after at most `handshake + header_read` for a client that never sends a request.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connections served at once by one server, by default.
pub const MAX_CONNECTIONS: usize = 1024;
/// How long a client may take over its TLS handshake, by default.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's head, and to start the next one on a
/// kept-alive connection, by default.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request may take from its head to the response's head, by default.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest request body, by default (the servers that read bodies set their own).
pub const MAX_BODY: usize = 64 << 10;
/// A connection's read buffer, and so the longest request head, by default.
pub const MAX_BUFFER: usize = 32 << 10;

/// The bounds of one server (see the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// The TLS handshake's time.
    pub handshake: Duration,
    /// The time to a complete request head (also the keep-alive idle time).
    pub header_read: Duration,
    /// The time from a request's head to its response's head.
    pub request: Duration,
    /// The longest request body, in bytes.
    pub max_body: usize,
    /// A connection's read buffer, in bytes (at least 8 KiB, hyper's minimum).
    pub max_buffer: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: MAX_CONNECTIONS,
            handshake: HANDSHAKE_TIMEOUT,
            header_read: HEADER_READ_TIMEOUT,
            request: REQUEST_TIMEOUT,
            max_body: MAX_BODY,
            max_buffer: MAX_BUFFER,
        }
    }
}

/// Why a server dropped a connection early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dropped {
    /// Accepted while [`Limits::max_connections`] were open.
    OverCap,
    /// The TLS handshake did not end within [`Limits::handshake`].
    HandshakeTimeout,
    /// No complete request head within [`Limits::header_read`].
    HeaderTimeout,
    /// No response within [`Limits::request`].
    RequestTimeout,
}

impl Dropped {
    /// The `reason` label.
    pub fn name(self) -> &'static str {
        match self {
            Dropped::OverCap => "over_cap",
            Dropped::HandshakeTimeout => "handshake_timeout",
            Dropped::HeaderTimeout => "header_timeout",
            Dropped::RequestTimeout => "request_timeout",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabel {
    server: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    server: &'static str,
    reason: &'static str,
}

/// `erdma_http_connections{server}` (open now) and
/// `erdma_http_connections_dropped_total{server,reason}` ([`Dropped`]), one set per process shared
/// by its servers. A default one counts without being exposed (tests, a part run alone).
#[derive(Debug, Clone, Default)]
pub struct ConnectionMetrics {
    open: Family<ServerLabel, Gauge>,
    dropped: Family<DropLabels, Counter>,
}

impl ConnectionMetrics {
    /// The metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "erdma_http_connections",
            "Connections an HTTP server of this process holds open, by server",
            m.open.clone(),
        );
        registry.register(
            "erdma_http_connections_dropped",
            "Connections an HTTP server closed early, by server and reason (over_cap, handshake_timeout, header_timeout, request_timeout)",
            m.dropped.clone(),
        );
        m
    }

    /// Connections `server` holds open now.
    pub fn open(&self, server: &'static str) -> i64 {
        self.open.get_or_create(&ServerLabel { server }).get()
    }

    /// Connections `server` dropped for `why` so far.
    pub fn dropped(&self, server: &'static str, why: Dropped) -> u64 {
        let labels = DropLabels {
            server,
            reason: why.name(),
        };
        self.dropped.get_or_create(&labels).get()
    }

    pub(super) fn count_drop(&self, server: &'static str, why: Dropped) {
        let labels = DropLabels {
            server,
            reason: why.name(),
        };
        self.dropped.get_or_create(&labels).inc();
    }
}

/// One server's bounds and where it counts: what [`super::serve`] and friends take.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// The `server` label of its metrics (`metrics`, `webhook`).
    pub server: &'static str,
    /// Its limits.
    pub limits: Limits,
    /// Where it counts connections.
    pub metrics: ConnectionMetrics,
}

impl Bounds {
    /// `server` under the default [`Limits`], counted in `metrics`.
    pub fn new(server: &'static str, metrics: ConnectionMetrics) -> Self {
        Bounds {
            server,
            limits: Limits::default(),
            metrics,
        }
    }

    /// The same with `limits`.
    pub fn with_limits(self, limits: Limits) -> Self {
        Bounds { limits, ..self }
    }
}

/// The connection cap of one running server.
#[derive(Debug)]
pub(super) struct Admission {
    slots: Arc<Semaphore>,
    server: &'static str,
    metrics: ConnectionMetrics,
}

impl Admission {
    pub(super) fn new(bounds: &Bounds) -> Self {
        Admission {
            slots: Arc::new(Semaphore::new(bounds.limits.max_connections)),
            server: bounds.server,
            metrics: bounds.metrics.clone(),
        }
    }

    /// A slot for one more connection, held until the connection ends; `None` (counted as
    /// `over_cap`) when every slot is taken.
    pub(super) fn admit(&self) -> Option<Slot> {
        match self.slots.clone().try_acquire_owned() {
            Ok(permit) => {
                self.metrics
                    .open
                    .get_or_create(&ServerLabel {
                        server: self.server,
                    })
                    .inc();
                Some(Slot {
                    _permit: permit,
                    server: self.server,
                    metrics: self.metrics.clone(),
                })
            }
            Err(_) => {
                self.metrics.count_drop(self.server, Dropped::OverCap);
                None
            }
        }
    }
}

/// One open connection's place under the cap; given back when dropped.
#[derive(Debug)]
pub(super) struct Slot {
    _permit: OwnedSemaphorePermit,
    server: &'static str,
    metrics: ConnectionMetrics,
}

impl Slot {
    /// The counter of early ends of this connection's server for `why`.
    pub(super) fn counter(&self, why: Dropped) -> Counter {
        let labels = DropLabels {
            server: self.server,
            reason: why.name(),
        };
        self.metrics.dropped.get_or_create(&labels).clone()
    }

    /// Counts an early end of this connection.
    pub(super) fn dropped(&self, why: Dropped) {
        self.metrics.count_drop(self.server, why);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.metrics
            .open
            .get_or_create(&ServerLabel {
                server: self.server,
            })
            .dec();
    }
}

/// hyper's HTTP/1.1 server under `limits`: the head timer (with the tokio timer it needs to act
/// at all) and the read buffer.
pub(super) fn http1(limits: &Limits) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .max_buf_size(limits.max_buffer.max(8192));
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_given_back_and_the_over_cap_counted() {
        let metrics = ConnectionMetrics::default();
        let bounds = Bounds::new("t", metrics.clone()).with_limits(Limits {
            max_connections: 2,
            ..Limits::default()
        });
        let admission = Admission::new(&bounds);
        let a = admission.admit().expect("first");
        let b = admission.admit().expect("second");
        assert!(admission.admit().is_none(), "a third is over the cap of 2");
        assert_eq!(metrics.open("t"), 2);
        assert_eq!(metrics.dropped("t", Dropped::OverCap), 1);
        b.dropped(Dropped::HeaderTimeout);
        drop(b);
        assert_eq!(metrics.open("t"), 1);
        assert_eq!(metrics.dropped("t", Dropped::HeaderTimeout), 1);
        let _c = admission.admit().expect("a slot came back");
        drop(a);
        assert_eq!(metrics.open("t"), 1);
    }

    #[test]
    fn the_metrics_are_exposed_with_their_labels() {
        let mut registry = Registry::default();
        let metrics = ConnectionMetrics::register(&mut registry);
        let bounds = Bounds::new("webhook", metrics).with_limits(Limits {
            max_connections: 1,
            ..Limits::default()
        });
        let admission = Admission::new(&bounds);
        let _held = admission.admit();
        assert!(admission.admit().is_none());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("erdma_http_connections{server=\"webhook\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "erdma_http_connections_dropped_total{server=\"webhook\",reason=\"over_cap\"} 1\n"
            ),
            "{text}"
        );
    }
}
