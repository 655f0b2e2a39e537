//! The HTTP servers' bounds over real sockets on 127.0.0.1: a thousand clients that send half a
//! request head and stall are held no longer than the head timeout, never beyond the connection
//! cap, while `/healthz` keeps answering; slow handshakes, slow bodies, long heads and long
//! bodies are cut off.
#![cfg(feature = "http")]

use axum::Router;
use axum::routing::{get, post};
use erdma_host::http::{Bounds, ConnectionMetrics, Dropped, Limits, serve, serve_with};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// What a client that stalls in the middle of its request head sends.
const HALF_HEAD: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: x\r\n";
/// Longer than any test here takes: a bound that never fires while a test looks.
const NEVER: Duration = Duration::from_secs(3600);
/// Guards against a hang when a bound under test is missing; no test relies on it.
const HANG_GUARD: Duration = Duration::from_secs(120);

fn app() -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/peer",
            get(
                |axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>| async move {
                    peer.to_string()
                },
            ),
        )
        .route(
            "/body",
            post(|body: axum::body::Body| async move {
                // Asks for everything: the server's own cap is what stops it.
                match axum::body::to_bytes(body, usize::MAX).await {
                    Ok(b) => (axum::http::StatusCode::OK, format!("{} bytes", b.len())),
                    Err(e) => (axum::http::StatusCode::PAYLOAD_TOO_LARGE, e.to_string()),
                }
            }),
        )
}

/// A server on 127.0.0.1 under `limits`, counted in the returned metrics as `server`.
async fn start(
    server: &'static str,
    limits: Limits,
) -> (SocketAddr, ConnectionMetrics, CancellationToken) {
    raise_fd_limit();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = ConnectionMetrics::default();
    let bounds = Bounds::new(server, metrics.clone()).with_limits(limits);
    let cancel = CancellationToken::new();
    tokio::spawn(serve(listener, app(), bounds, cancel.clone()));
    (addr, metrics, cancel)
}

/// Two sockets per client in one process, two tests of a thousand clients at once: more than a
/// default soft limit of 1 024.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < 16384 {
            lim.rlim_cur = lim.rlim_max.min(16384);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
    assert!(
        lim.rlim_cur >= 8192,
        "these tests need 8192 open files; the hard limit is {}",
        lim.rlim_max
    );
}

async fn stalled(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        // The server may already have closed one over the cap: the write may then fail.
        let _ = s.write_all(HALF_HEAD).await;
        out.push(s);
    }
    out
}

/// One request on a new connection, read to its end (the server closes it).
async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(request).await;
    read_to_close(&mut s).await
}

/// What comes until the server closes `s` (a reset ends it too).
async fn read_to_close(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(HANG_GUARD, s.read_to_end(&mut out))
        .await
        .expect("the server closes the connection");
    String::from_utf8_lossy(&out).into_owned()
}

async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(HANG_GUARD, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "never came: {what}");
}

fn vm_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_stalled_clients_stay_under_the_cap_while_healthz_answers() {
    const HELD: usize = 1000;
    let cap = HELD + 10;
    let limits = Limits {
        max_connections: cap,
        header_read: NEVER,
        ..Limits::default()
    };
    let (addr, m, cancel) = start("capped", limits).await;
    let rss_before = vm_rss_kib();
    let held = stalled(addr, HELD).await;
    until("1000 connections open", || m.open("capped") == HELD as i64).await;

    let answer = exchange(
        addr,
        b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("\r\n\r\nok"), "{answer}");
    until("the /healthz connection given back", || {
        m.open("capped") == HELD as i64
    })
    .await;

    // 20 more: the cap takes 10, the other 10 are closed at once, nothing read from them.
    let mut more = stalled(addr, 20).await;
    until("the cap reached", || {
        m.open("capped") == cap as i64 && m.dropped("capped", Dropped::OverCap) == 10
    })
    .await;
    for s in more.iter_mut().skip(10) {
        assert_eq!(read_to_close(s).await, "", "closed without an answer");
    }
    let rss_held = vm_rss_kib();
    println!(
        "MEASURE held={cap} rss_before_kib={rss_before} rss_held_kib={rss_held} per_connection_kib={:.1}",
        (rss_held.saturating_sub(rss_before)) as f64 / cap as f64
    );
    // Full: even /healthz waits for a slot (the head timeout frees them; see the next test).
    assert_eq!(
        exchange(addr, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await,
        ""
    );
    assert_eq!(m.dropped("capped", Dropped::OverCap), 11);

    // Clients that go away give their slots back.
    drop(held);
    drop(more);
    until("every slot back", || m.open("capped") == 0).await;
    let answer = exchange(
        addr,
        b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_heads_and_idle_keep_alives_are_closed_after_the_head_timeout() {
    const STALLED: usize = 1000;
    let limits = Limits {
        header_read: Duration::from_millis(300),
        ..Limits::default()
    };
    let (addr, m, cancel) = start("timed", limits).await;
    let mut held = stalled(addr, STALLED).await;
    // A client that stalls is answered nothing and closed; hyper answers a head timeout with
    // 408 where it can write, so either an empty read or that 408.
    for s in held.iter_mut() {
        let got = read_to_close(s).await;
        assert!(got.is_empty() || got.starts_with("HTTP/1.1 408"), "{got}");
    }
    until("every stalled connection closed", || m.open("timed") == 0).await;
    assert_eq!(m.dropped("timed", Dropped::HeaderTimeout), STALLED as u64);
    assert_eq!(m.dropped("timed", Dropped::OverCap), 0);

    // Kept alive after an answer, then idle: closed by the same timer.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let rest = read_to_close(&mut s).await;
    assert!(rest.starts_with("HTTP/1.1 200"), "{rest}");
    assert!(
        rest.ends_with("\r\n\r\nok"),
        "answered, then closed: {rest}"
    );
    until("the idle connection counted", || {
        m.dropped("timed", Dropped::HeaderTimeout) == STALLED as u64 + 1
    })
    .await;
    cancel.cancel();
}

#[tokio::test]
async fn a_slow_body_gets_408_and_a_long_one_is_refused() {
    let limits = Limits {
        request: Duration::from_millis(300),
        max_body: 1000,
        ..Limits::default()
    };
    let (addr, m, cancel) = start("bodies", limits).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /body HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n0123456789")
        .await
        .unwrap();
    let answer = read_to_close(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("connection: close\r\n"), "{answer}");
    assert!(
        answer.ends_with("request not complete within 300ms\n"),
        "{answer}"
    );
    assert_eq!(m.dropped("bodies", Dropped::RequestTimeout), 1);

    let fits = format!(
        "POST /body HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 1000\r\n\r\n{}",
        "a".repeat(1000)
    );
    let answer = exchange(addr, fits.as_bytes()).await;
    assert!(answer.ends_with("1000 bytes"), "{answer}");
    let long = format!(
        "POST /body HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 1001\r\n\r\n{}",
        "a".repeat(1001)
    );
    let answer = exchange(addr, long.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("length limit exceeded"), "{answer}");
    cancel.cancel();
}

#[tokio::test]
async fn a_head_longer_than_the_buffer_is_refused() {
    let (addr, _m, cancel) = start("heads", Limits::default()).await;
    let long = format!(
        "GET /healthz HTTP/1.1\r\nhost: x\r\nx-filler: {}\r\nconnection: close\r\n\r\n",
        "a".repeat(64 << 10)
    );
    let answer = exchange(addr, long.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    let answer = exchange(
        addr,
        b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.ends_with("\r\n\r\nok"), "{answer}");
    cancel.cancel();
}

#[tokio::test]
async fn a_handshake_that_never_ends_is_dropped_and_requests_know_their_peer() {
    raise_fd_limit();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = ConnectionMetrics::default();
    let bounds = Bounds::new("tls", metrics.clone()).with_limits(Limits {
        handshake: Duration::from_millis(300),
        ..Limits::default()
    });
    let cancel = CancellationToken::new();
    let first = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    // The first client's "handshake" never ends (a client that opened TLS and went silent).
    let handshake = move |tcp: TcpStream, _| {
        let stall = first.swap(false, std::sync::atomic::Ordering::SeqCst);
        async move {
            if stall {
                std::future::pending::<()>().await;
            }
            Ok(tcp)
        }
    };
    tokio::spawn(serve_with(
        listener,
        handshake,
        app(),
        bounds,
        cancel.clone(),
    ));
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert_eq!(read_to_close(&mut silent).await, "");
    until("the handshake timeout counted", || {
        metrics.dropped("tls", Dropped::HandshakeTimeout) == 1
    })
    .await;

    let mut s = TcpStream::connect(addr).await.unwrap();
    let me = s.local_addr().unwrap();
    s.write_all(b"GET /peer HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let answer = read_to_close(&mut s).await;
    assert!(answer.ends_with(&format!("\r\n\r\n{me}")), "{answer}");
    cancel.cancel();
}
