//! A local ECS metadata-service emulator (IMDSv2) serving the same paths and formats on
//! `127.0.0.1`, for tests and the lab. It answers like the real service: tokens from
//! `PUT /latest/api/token`, 401 for a missing or unknown token, plain-text values, 404 for unknown
//! paths. Values are stored as raw text so tests can serve garbage.

use crate::imds::{TOKEN_HEADER, TOKEN_PATH, TOKEN_TTL_HEADER};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The emulator's mutable state.
#[derive(Debug, Default)]
pub struct EmulatorState {
    /// Plain-text values by path (e.g. `/latest/meta-data/instance-id`).
    pub values: BTreeMap<String, String>,
    /// Tokens that are currently valid.
    pub tokens: BTreeSet<String>,
    /// Answer this many next requests with HTTP 503.
    pub fail_next: usize,
    /// Every request as `METHOD path`.
    pub log: Vec<String>,
    next_token: u64,
}

/// A running emulator; stops when dropped.
pub struct MetadataEmulator {
    addr: SocketAddr,
    state: Arc<Mutex<EmulatorState>>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl MetadataEmulator {
    /// Starts serving on `127.0.0.1` on a free port.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(EmulatorState::default()));
        let cancel = CancellationToken::new();
        let (st, c) = (Arc::clone(&state), cancel.clone());
        let task = tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = c.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok((s, _)) => s,
                        Err(_) => continue,
                    },
                };
                let st = Arc::clone(&st);
                let c = c.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let st = Arc::clone(&st);
                        async move { Ok::<_, std::convert::Infallible>(answer(&st, req)) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc);
                    tokio::select! {
                        _ = c.cancelled() => {}
                        _ = conn => {}
                    }
                });
            }
        });
        Ok(MetadataEmulator {
            addr,
            state,
            cancel,
            task: Some(task),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sets a value.
    pub fn set(&self, path: &str, value: &str) {
        self.with(|s| {
            s.values.insert(path.to_string(), value.to_string());
        });
    }

    /// Serves an ENI's addressing fields.
    pub fn add_eni(&self, mac: erdma_model::MacAddr, ip: &str, cidr: &str, gateway: &str) {
        use crate::imds::eni_path;
        self.set(&eni_path(mac, "primary-ip-address"), ip);
        self.set(&eni_path(mac, "vswitch-cidr-block"), cidr);
        self.set(&eni_path(mac, "gateway"), gateway);
    }

    /// Accesses the state.
    pub fn with<R>(&self, f: impl FnOnce(&mut EmulatorState) -> R) -> R {
        let mut guard = match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    /// Invalidates every token (as if they expired).
    pub fn expire_tokens(&self) {
        self.with(|s| s.tokens.clear());
    }

    /// The request log.
    pub fn log(&self) -> Vec<String> {
        self.with(|s| s.log.clone())
    }
}

impl Drop for MetadataEmulator {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

fn reply(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain"),
    );
    r
}

fn answer(state: &Mutex<EmulatorState>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let mut s = match state.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    };
    let path = req.uri().path().to_string();
    s.log.push(format!("{} {}", req.method(), path));
    if s.fail_next > 0 {
        s.fail_next -= 1;
        return reply(StatusCode::SERVICE_UNAVAILABLE, "busy");
    }
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    if path == TOKEN_PATH {
        if req.method() != Method::PUT {
            return reply(StatusCode::METHOD_NOT_ALLOWED, "");
        }
        let ttl_ok = header(TOKEN_TTL_HEADER)
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|t| (1..=21600).contains(&t));
        if !ttl_ok {
            return reply(
                StatusCode::BAD_REQUEST,
                "missing or invalid X-aliyun-ecs-metadata-token-ttl-seconds",
            );
        }
        s.next_token += 1;
        let token = format!("AQAEA{:016x}emulated==", s.next_token);
        s.tokens.insert(token.clone());
        return reply(StatusCode::OK, &token);
    }
    if req.method() != Method::GET {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "");
    }
    if !header(TOKEN_HEADER).is_some_and(|t| s.tokens.contains(&t)) {
        return reply(StatusCode::UNAUTHORIZED, "");
    }
    match s.values.get(&path) {
        Some(v) => reply(StatusCode::OK, v),
        None => reply(StatusCode::NOT_FOUND, "Not Found"),
    }
}
