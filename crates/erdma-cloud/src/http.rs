//! The HTTP(S) client used for ECS and STS (hyper + rustls with the webpki roots, so images need
//! no CA bundle) and small request helpers.

use crate::encode::percent_encode;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// The Alibaba Cloud SDKs' default connect timeout (`connectTimeout`, 5000 ms).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The Alibaba Cloud SDKs' default read timeout (`readTimeout`, 10000 ms).
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Deadlines of one HTTP exchange (one attempt; retries are the caller's). `None`: no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// The TCP connection must be up within this.
    pub connect: Option<Duration>,
    /// The whole answer (its last byte) must be in within this after the request is sent; it
    /// also bounds a connect that is part of the attempt.
    pub read: Option<Duration>,
}

impl Default for Timeouts {
    /// The Alibaba Cloud SDKs' defaults: connect 5 s, read 10 s.
    fn default() -> Self {
        Self {
            connect: Some(DEFAULT_CONNECT_TIMEOUT),
            read: Some(DEFAULT_READ_TIMEOUT),
        }
    }
}

/// The shared client: HTTPS (or plain HTTP for the local emulator) with its [`Timeouts`].
#[derive(Debug, Clone)]
pub struct HttpClient {
    inner: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeouts: Timeouts,
}

impl HttpClient {
    /// A client with the webpki root certificates, the ring crypto provider and `timeouts`.
    pub fn new(timeouts: Timeouts) -> Self {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(timeouts.connect);
        http.enforce_http(false);
        let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map(|b| {
            b.with_root_certificates(rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            })
            .with_no_client_auth()
        });
        let connector = match tls {
            Ok(cfg) => hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(cfg)
                .https_or_http()
                .enable_http1()
                .wrap_connector(http),
            // The ring provider always supports the default versions; keep a working client anyway.
            Err(_) => hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(
                    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                        rustls::crypto::ring::default_provider(),
                    ))
                    .with_protocol_versions(&[&rustls::version::TLS12])
                    .expect("TLS 1.2 is supported by ring")
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
                )
                .https_or_http()
                .enable_http1()
                .wrap_connector(http),
        };
        Self {
            inner: Client::builder(TokioExecutor::new()).build(connector),
            timeouts,
        }
    }

    /// Its deadlines.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }
}

/// A client with the default [`Timeouts`].
pub fn client() -> HttpClient {
    HttpClient::new(Timeouts::default())
}

/// Error of one HTTP exchange (connection, timeout, body).
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The request could not be built (bad endpoint).
    #[error("bad request URL {url}: {msg}")]
    Url {
        /// The URL.
        url: String,
        /// Why.
        msg: String,
    },
    /// Connection or protocol error.
    #[error("{0}")]
    Transport(String),
    /// No connection within the connect timeout.
    #[error("could not connect within {0:?} (connect timeout)")]
    ConnectTimeout(Duration),
    /// No complete answer within the read timeout.
    #[error("no answer within {0:?} (read timeout)")]
    Timeout(Duration),
}

/// Whether `e` is the connector giving up after its connect timeout.
fn is_connect_timeout(e: &hyper_util::client::legacy::Error) -> bool {
    if !e.is_connect() {
        return false;
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        cur = c.source();
    }
    false
}

/// Sends `req` and reads the whole answer: `(status, body)`, within `http`'s [`Timeouts`].
pub async fn send(
    http: &HttpClient,
    req: hyper::Request<Full<Bytes>>,
) -> Result<(u16, Bytes), HttpError> {
    let timeouts = http.timeouts;
    let fut = async {
        let resp = http.inner.request(req).await.map_err(|e| {
            match timeouts.connect.filter(|_| is_connect_timeout(&e)) {
                Some(t) => HttpError::ConnectTimeout(t),
                None => HttpError::Transport(format!("{e:#}")),
            }
        })?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| HttpError::Transport(e.to_string()))?
            .to_bytes();
        Ok((status, body))
    };
    match timeouts.read {
        Some(t) => tokio::time::timeout(t, fut)
            .await
            .map_err(|_| HttpError::Timeout(t))?,
        None => fut.await,
    }
}

/// `application/x-www-form-urlencoded` body of `params` (RFC 3986 encoding).
pub fn form_body<S: AsRef<str>>(params: &[(&str, S)]) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v.as_ref())))
        .collect::<Vec<_>>()
        .join("&")
}

/// POSTs `params` as a form to `endpoint` (`https://host[:port]`), returns status and body.
pub async fn post_form<S: AsRef<str>>(
    http: &HttpClient,
    endpoint: &str,
    params: &[(&str, S)],
) -> Result<(u16, Bytes), HttpError> {
    let url = format!("{}/", endpoint.trim_end_matches('/'));
    let req = hyper::Request::post(&url)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("user-agent", crate::USER_AGENT)
        .body(Full::new(Bytes::from(form_body(params))))
        .map_err(|e| HttpError::Url {
            url: url.clone(),
            msg: e.to_string(),
        })?;
    send(http, req).await
}
