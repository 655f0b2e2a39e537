//! The binaries' HTTP servers (feature `http`), one construction for `erdma-agent` (`/metrics`,
//! `/healthz`, `/readyz`) and `erdma-controller` (the same three, and the TLS webhook).
//!
//! - Routes: an axum [`Router`] the binary builds; [`metrics_route`] renders a prometheus-client
//!   registry as OpenMetrics text with its content type.
//! - Connections: HTTP/1.1 only (hyper), one task per connection; [`serve_with`] runs a
//!   handshake of the caller's (TLS) on each accepted connection inside that task, so a slow
//!   client never holds up the accept loop. Every server runs under [`Bounds`]: a cap on open
//!   connections, handshake, request-head and request timeouts, a body cap ([`bounds`]).
//! - Shutdown: when the [`CancellationToken`] fires, no connection is accepted any more,
//!   handshakes in progress are dropped, requests in progress are answered and idle keep-alive
//!   connections closed; what has not ended [`DRAIN`] later is dropped, so a stalled client never
//!   holds up the process's shutdown.
//! - Binding: [`serve_bound`] retries a failed bind every [`BIND_RETRY`] with an error log, for a
//!   server whose absence must not stop the process (the agent serves devices meanwhile); a
//!   binary for which the address is required binds itself and calls [`serve`].

use axum::Router;
use axum::http::header::{CONNECTION, CONTENT_TYPE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::Service;

pub mod bounds;
pub use bounds::{Bounds, ConnectionMetrics, Dropped, Limits};

/// The content type of [`encode`]'s text (OpenMetrics 1.0).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// How long connections may take to end after the shutdown began; then they are dropped.
pub const DRAIN: Duration = Duration::from_secs(2);
/// How long [`serve_bound`] waits between two tries to bind.
pub const BIND_RETRY: Duration = Duration::from_secs(10);

/// Renders `registry` as OpenMetrics text.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// Renders `registries` as one OpenMetrics text (their families in turn, one `# EOF`).
pub fn encode_all(registries: &[&Registry]) -> String {
    let mut out = String::new();
    for r in registries {
        let text = encode(r);
        out.push_str(text.strip_suffix("# EOF\n").unwrap_or(&text));
    }
    out.push_str("# EOF\n");
    out
}

/// `registry` as an HTTP answer: 200, [`OPENMETRICS`], [`encode`]'s text.
pub fn metrics_response(registry: &Registry) -> Response {
    metrics_response_all(&[registry])
}

/// `registries` as one HTTP answer: 200, [`OPENMETRICS`], [`encode_all`]'s text.
pub fn metrics_response_all(registries: &[&Registry]) -> Response {
    ([(CONTENT_TYPE, OPENMETRICS)], encode_all(registries)).into_response()
}

/// The peer's address of a request served here ([`serve_with`] gives every request one).
pub fn peer(req: &axum::extract::Request) -> Option<SocketAddr> {
    req.extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
}

/// `GET /metrics` of `registry` (route it at `/metrics`).
pub fn metrics_route(registry: Arc<Registry>) -> MethodRouter {
    get(move || {
        let answer = metrics_response(&registry);
        async move { answer }
    })
}

/// Serves `app` over plain HTTP on `listener` under `bounds` until `cancel` fires (see the
/// module's shutdown).
pub async fn serve(listener: TcpListener, app: Router, bounds: Bounds, cancel: CancellationToken) {
    serve_with(
        listener,
        |tcp, _peer| std::future::ready(Ok(tcp)),
        app,
        bounds,
        cancel,
    )
    .await
}

/// Serves `app` on `listener` under `bounds` until `cancel` fires, over what `handshake` makes
/// of each accepted connection (a TLS server session, for one); a failed handshake drops the
/// connection, logged at debug level, and one that outlasts [`Limits::handshake`] too. Each
/// request carries the peer's address as [`axum::extract::ConnectInfo`]`<SocketAddr>`.
pub async fn serve_with<H, F, S>(
    listener: TcpListener,
    handshake: H,
    app: Router,
    bounds: Bounds,
    cancel: CancellationToken,
) where
    H: Fn(TcpStream, SocketAddr) -> F,
    F: Future<Output = io::Result<S>> + Send + 'static,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let admission = bounds::Admission::new(&bounds);
    let limits = bounds.limits;
    let mut conns = JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            _ = cancel.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    accept_error(e).await;
                    continue;
                }
            },
        };
        let Some(slot) = admission.admit() else {
            tracing::debug!(%peer, "{} connections open; closing this one", limits.max_connections);
            continue;
        };
        let session = tokio::time::timeout(limits.handshake, handshake(tcp, peer));
        let app = app.clone();
        let cancel = cancel.clone();
        conns.spawn(async move {
            let io = tokio::select! {
                _ = cancel.cancelled() => return,
                io = session => match io {
                    Ok(Ok(io)) => io,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, "handshake failed: {e}");
                        return;
                    }
                    Err(_) => {
                        slot.dropped(Dropped::HandshakeTimeout);
                        tracing::debug!(%peer, "handshake not done within {:?}", limits.handshake);
                        return;
                    }
                },
            };
            // Each request gets the peer's address, a body of at most `max_body`, and
            // `limits.request` to be answered (else 408, and the connection closes).
            let timed_out = slot.counter(Dropped::RequestTimeout);
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let (mut parts, body) = req.into_parts();
                parts.extensions.insert(axum::extract::ConnectInfo(peer));
                let body = http_body_util::Limited::new(body, limits.max_body);
                let answer = app.clone().call(hyper::Request::from_parts(parts, body));
                let timed_out = timed_out.clone();
                async move {
                    let late = match tokio::time::timeout(limits.request, answer).await {
                        Ok(answer) => return answer,
                        Err(_) => request_timed_out(limits.request),
                    };
                    timed_out.inc();
                    Ok::<_, Infallible>(late)
                }
            });
            let conn =
                bounds::http1(&limits).serve_connection(hyper_util::rt::TokioIo::new(io), service);
            let mut conn = std::pin::pin!(conn);
            let ended = tokio::select! {
                r = conn.as_mut() => r,
                _ = cancel.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            match ended {
                Err(e) if e.is_timeout() => {
                    slot.dropped(Dropped::HeaderTimeout);
                    tracing::debug!(%peer, "no request head within {:?}", limits.header_read);
                }
                Err(e) => tracing::debug!(%peer, "connection ended: {e}"),
                Ok(()) => {}
            }
            drop(slot);
        });
    }
    drop(listener);
    let drained =
        tokio::time::timeout(DRAIN, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::debug!(
            left = conns.len(),
            "connections still open {DRAIN:?} after the shutdown began; dropped"
        );
    }
}

/// The answer to a request not answered within `limit`: 408, and the connection closes.
fn request_timed_out(limit: Duration) -> Response {
    let text = format!("request not complete within {limit:?}\n");
    let mut late = (StatusCode::REQUEST_TIMEOUT, text).into_response();
    late.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    late
}

/// A failed `accept`: a connection that went away before it was accepted is ignored; anything
/// else (out of file descriptors) is logged and waited out for a second, as hyper used to.
async fn accept_error(e: io::Error) {
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!("accept failed: {e}");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Where [`serve_bound`] listens, and the words of its logs.
#[derive(Debug, Clone)]
pub struct Bind {
    /// The address.
    pub addr: SocketAddr,
    /// The flag that set it (`--metrics-addr`), named when the bind fails.
    pub flag: &'static str,
    /// What is served (`/metrics and /healthz`), logged once bound.
    pub serves: &'static str,
    /// What goes on while the bind fails (`devices are served meanwhile`).
    pub meanwhile: &'static str,
}

/// Binds `bind.addr` and serves `app` there until `cancel` fires; a failed bind is logged as an
/// error and tried again every [`BIND_RETRY`].
pub async fn serve_bound(bind: Bind, app: Router, bounds: Bounds, cancel: CancellationToken) {
    let addr = bind.addr;
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => {
                tracing::info!(%addr, "serving {}", bind.serves);
                serve(listener, app, bounds, cancel).await;
                return;
            }
            Err(e) => tracing::error!(
                %addr,
                "cannot bind {} ({e}); retrying in {} s, {}",
                bind.flag,
                BIND_RETRY.as_secs(),
                bind.meanwhile
            ),
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(BIND_RETRY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn fetch(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        // A connection the server dropped may refuse the request: then the answer is empty.
        let _ = s.write_all(request.as_bytes()).await;
        let mut out = String::new();
        // A dropped connection may end in a reset: what came before it is the answer.
        let _ = s.read_to_string(&mut out).await;
        out
    }

    #[tokio::test]
    async fn metrics_are_served_as_openmetrics_and_the_shutdown_is_bounded() {
        let mut registry = Registry::default();
        let c = Counter::<u64>::default();
        registry.register("erdma_test_calls", "Calls", c.clone());
        c.inc();
        let app = Router::new().route("/metrics", metrics_route(Arc::new(registry)));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = CancellationToken::new();
        let bounds = Bounds::new("metrics", ConnectionMetrics::default());
        let server = tokio::spawn(serve(listener, app, bounds, cancel.clone()));
        let answer = fetch(addr, "/metrics").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            answer.contains(&format!("content-type: {OPENMETRICS}\r\n")),
            "{answer}"
        );
        assert!(
            answer.ends_with("erdma_test_calls_total 1\n# EOF\n"),
            "{answer}"
        );
        assert!(fetch(addr, "/other").await.starts_with("HTTP/1.1 404"));

        // A client that sent half a request and stalls, and an idle one, hold nothing up.
        let mut stalled = TcpStream::connect(addr).await.unwrap();
        stalled
            .write_all(b"GET /metrics HTTP/1.1\r\n")
            .await
            .unwrap();
        let _idle = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        cancel.cancel();
        tokio::time::timeout(DRAIN + Duration::from_secs(5), server)
            .await
            .expect("the server ends within its drain time")
            .unwrap();
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "no longer listening"
        );
    }

    #[tokio::test]
    async fn a_failed_handshake_drops_only_that_connection() {
        let app = Router::new().route("/healthz", get(|| async { "ok" }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = CancellationToken::new();
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = calls.clone();
        let server = tokio::spawn(serve_with(
            listener,
            move |tcp, _| {
                let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async move {
                    if n == 0 {
                        Err(io::Error::other("refused"))
                    } else {
                        Ok(tcp)
                    }
                }
            },
            app,
            Bounds::new("webhook", ConnectionMetrics::default()),
            cancel.clone(),
        ));
        assert_eq!(fetch(addr, "/healthz").await, "", "the first is dropped");
        let answer = fetch(addr, "/healthz").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nok"), "{answer}");
        cancel.cancel();
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_failed_bind_is_retried_until_the_shutdown() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let bind = Bind {
            addr: taken.local_addr().unwrap(),
            flag: "--metrics-addr",
            serves: "/metrics",
            meanwhile: "nothing else",
        };
        let cancel = CancellationToken::new();
        let bounds = Bounds::new("metrics", ConnectionMetrics::default());
        let server = tokio::spawn(serve_bound(bind, Router::new(), bounds, cancel.clone()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!server.is_finished(), "still trying");
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("ends on the shutdown")
            .unwrap();
    }
}
