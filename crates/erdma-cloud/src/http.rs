//! The HTTP(S) client used for ECS and STS (hyper + rustls with the webpki roots, so images need
//! no CA bundle) and small request helpers.

use crate::encode::percent_encode;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// The shared client type: HTTPS (or plain HTTP for the local emulator).
pub type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Per-request timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A client with the webpki root certificates and the ring crypto provider.
pub fn client() -> HttpClient {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(Duration::from_secs(10)));
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
    Client::builder(TokioExecutor::new()).build(connector)
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
    /// No answer within [`REQUEST_TIMEOUT`].
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Sends `req` and reads the whole answer: `(status, headers, body)`.
pub async fn send(
    http: &HttpClient,
    req: hyper::Request<Full<Bytes>>,
) -> Result<(u16, Bytes), HttpError> {
    let fut = async {
        let resp = http
            .request(req)
            .await
            .map_err(|e| HttpError::Transport(format!("{e:#}")))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| HttpError::Transport(e.to_string()))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(REQUEST_TIMEOUT, fut)
        .await
        .map_err(|_| HttpError::Timeout(REQUEST_TIMEOUT))?
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
