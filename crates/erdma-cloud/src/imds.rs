//! The ECS instance metadata service: what address an ERI gets (IMDSv2, seed §9).

use erdma_model::MacAddr;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use std::future::Future;
use std::net::Ipv4Addr;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// The metadata service's address on ECS.
pub const DEFAULT_ENDPOINT: &str = "http://100.100.100.200";
/// IMDSv2 token request path.
pub const TOKEN_PATH: &str = "/latest/api/token";
/// Header carrying the token on every request.
pub const TOKEN_HEADER: &str = "X-aliyun-ecs-metadata-token";
/// Header carrying the requested token lifetime.
pub const TOKEN_TTL_HEADER: &str = "X-aliyun-ecs-metadata-token-ttl-seconds";
/// Requested token lifetime (the maximum); the token is reused for half of it.
pub const TOKEN_TTL: Duration = Duration::from_secs(21600);

/// Path of one per-ENI metadata field.
pub fn eni_path(mac: MacAddr, field: &str) -> String {
    format!("/latest/meta-data/network/interfaces/macs/{mac}/{field}")
}

/// What the metadata service says about one ENI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EniAddressing {
    /// `primary-ip-address`.
    pub primary_ip: Ipv4Addr,
    /// Network of `vswitch-cidr-block`.
    pub network: Ipv4Addr,
    /// Prefix length of `vswitch-cidr-block`.
    pub prefix_len: u8,
    /// `gateway`.
    pub gateway: Ipv4Addr,
}

/// The metadata service failed or answered garbage.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// The service could not be reached or kept failing.
    #[error(
        "metadata service {endpoint}{path}: {detail}. Fix: make sure the node reaches {endpoint} (ECS VPC) and is not blocked by a firewall or hop limit"
    )]
    Unreachable {
        /// Endpoint.
        endpoint: String,
        /// Path.
        path: String,
        /// Last error.
        detail: String,
    },
    /// The service answered an HTTP error.
    #[error("metadata service {path}: HTTP {status}. Fix: {fix}")]
    Status {
        /// Path.
        path: String,
        /// HTTP status.
        status: u16,
        /// What to do.
        fix: String,
    },
    /// The answer is not what the field must contain.
    #[error(
        "metadata service {path}: {value:?} is not {expected}. Fix: check that the ENI with this MAC is attached to this instance"
    )]
    Garbage {
        /// Path.
        path: String,
        /// The value received (truncated).
        value: String,
        /// What was expected.
        expected: String,
    },
}

/// Source of ENI addressing (real: [`ImdsClient`]).
pub trait Metadata: Send + Sync {
    /// Addressing of the ENI with `mac`.
    fn eni_addressing(
        &self,
        mac: MacAddr,
    ) -> impl Future<Output = Result<EniAddressing, MetadataError>> + Send;
}

fn garbage(path: &str, value: &str, expected: &str) -> MetadataError {
    let value: String = value.chars().take(64).collect();
    MetadataError::Garbage {
        path: path.to_string(),
        value,
        expected: expected.to_string(),
    }
}

/// Parses the three per-ENI fields and checks they fit together.
pub fn parse_addressing(
    mac: MacAddr,
    ip: &str,
    cidr: &str,
    gateway: &str,
) -> Result<EniAddressing, MetadataError> {
    let ip_path = eni_path(mac, "primary-ip-address");
    let cidr_path = eni_path(mac, "vswitch-cidr-block");
    let gw_path = eni_path(mac, "gateway");
    let primary_ip: Ipv4Addr = ip
        .trim()
        .parse()
        .map_err(|_| garbage(&ip_path, ip, "an IPv4 address"))?;
    let gateway: Ipv4Addr = gateway
        .trim()
        .parse()
        .map_err(|_| garbage(&gw_path, gateway, "an IPv4 address"))?;
    let (net, len) = cidr
        .trim()
        .split_once('/')
        .ok_or_else(|| garbage(&cidr_path, cidr, "an IPv4 CIDR block"))?;
    let network: Ipv4Addr = net
        .parse()
        .map_err(|_| garbage(&cidr_path, cidr, "an IPv4 CIDR block"))?;
    let prefix_len: u8 = len
        .parse()
        .ok()
        .filter(|l| (1..=32).contains(l))
        .ok_or_else(|| garbage(&cidr_path, cidr, "an IPv4 CIDR block with a prefix of 1-32"))?;
    let mask = u32::MAX << (32 - u32::from(prefix_len));
    let network = Ipv4Addr::from(u32::from(network) & mask);
    let inside = |a: Ipv4Addr| u32::from(a) & mask == u32::from(network);
    if !inside(primary_ip) {
        return Err(garbage(
            &ip_path,
            ip,
            &format!("inside the vSwitch block {network}/{prefix_len}"),
        ));
    }
    if !inside(gateway) || gateway == primary_ip {
        return Err(garbage(
            &gw_path,
            gateway.to_string().as_str(),
            &format!("a gateway inside {network}/{prefix_len}"),
        ));
    }
    Ok(EniAddressing {
        primary_ip,
        network,
        prefix_len,
        gateway,
    })
}

/// IMDSv2 client: token from `PUT /latest/api/token` (reused for half its lifetime), 4 tries per
/// request with backoff from 500 ms (×1.2), one token refresh on HTTP 401.
pub struct ImdsClient {
    endpoint: String,
    host: String,
    port: u16,
    token: Mutex<Option<(String, Instant)>>,
    timeout: Duration,
    tries: u32,
    backoff: Duration,
}

/// The per-request body limit: metadata values are short.
const MAX_BODY: usize = 64 * 1024;

impl ImdsClient {
    /// A client of the service at `endpoint` (`http://host[:port]`).
    pub fn new(endpoint: &str) -> Result<Self, MetadataError> {
        let bad = |detail: &str| MetadataError::Unreachable {
            endpoint: endpoint.to_string(),
            path: String::new(),
            detail: detail.to_string(),
        };
        let uri: Uri = endpoint.parse().map_err(|_| bad("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad(
                "only http:// endpoints are supported (the metadata service is plain HTTP)",
            ));
        }
        let host = uri
            .host()
            .ok_or_else(|| bad("no host"))?
            .trim_matches(['[', ']'])
            .to_string();
        Ok(ImdsClient {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            host,
            port: uri.port_u16().unwrap_or(80),
            token: Mutex::new(None),
            timeout: Duration::from_secs(2),
            tries: 4,
            backoff: Duration::from_millis(500),
        })
    }

    /// The ECS metadata service.
    pub fn ecs() -> Self {
        // The constant is a valid http URL.
        Self::new(DEFAULT_ENDPOINT).unwrap_or_else(|_| unreachable!("DEFAULT_ENDPOINT is valid"))
    }

    /// Overrides the retry backoff start (tests).
    pub fn with_backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    async fn request_once(
        &self,
        method: Method,
        path: &str,
        header: (&str, &str),
    ) -> Result<(StatusCode, String), String> {
        let fut = async {
            let stream = TcpStream::connect((self.host.as_str(), self.port))
                .await
                .map_err(|e| e.to_string())?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
            let req = Request::builder()
                .method(method)
                .uri(path)
                .header(hyper::header::HOST, self.host.as_str())
                .header(header.0, header.1)
                .body(Empty::<bytes::Bytes>::new())
                .map_err(|e| e.to_string())?;
            let exchange = async {
                let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
                let status = resp.status();
                let body = Limited::new(resp.into_body(), MAX_BODY)
                    .collect()
                    .await
                    .map_err(|e| e.to_string())?;
                let text = String::from_utf8(body.to_bytes().to_vec())
                    .map_err(|_| "response is not UTF-8".to_string())?;
                Ok::<_, String>((status, text))
            };
            tokio::select! {
                r = exchange => r,
                c = conn => Err(match c { Ok(()) => "connection closed early".to_string(), Err(e) => e.to_string() }),
            }
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| format!("no answer within {:?}", self.timeout))?
    }

    /// Retries a request on transport errors and 5xx.
    async fn request(
        &self,
        method: Method,
        path: &str,
        header: (&str, &str),
    ) -> Result<(StatusCode, String), MetadataError> {
        let mut delay = self.backoff;
        let mut last = String::new();
        for attempt in 0..self.tries {
            if attempt > 0 {
                tokio::time::sleep(delay).await;
                delay = delay.mul_f64(1.2);
            }
            match self.request_once(method.clone(), path, header).await {
                Ok((s, _)) if s.is_server_error() => last = format!("HTTP {s}"),
                Ok(r) => return Ok(r),
                Err(e) => last = e,
            }
        }
        Err(MetadataError::Unreachable {
            endpoint: self.endpoint.clone(),
            path: path.to_string(),
            detail: format!("{} tries failed, last: {last}", self.tries),
        })
    }

    async fn token(&self, refresh: bool) -> Result<String, MetadataError> {
        let mut cached = self.token.lock().await;
        if !refresh
            && let Some((t, until)) = cached.as_ref()
            && Instant::now() < *until
        {
            return Ok(t.clone());
        }
        let ttl = TOKEN_TTL.as_secs().to_string();
        let (status, body) = self
            .request(Method::PUT, TOKEN_PATH, (TOKEN_TTL_HEADER, &ttl))
            .await?;
        if !status.is_success() {
            return Err(MetadataError::Status {
                path: TOKEN_PATH.to_string(),
                status: status.as_u16(),
                fix: "the metadata service refused an IMDSv2 token; check the instance's metadata access settings".into(),
            });
        }
        let token = body.trim().to_string();
        if token.is_empty() || token.len() > 4096 || token.chars().any(|c| c.is_control()) {
            return Err(garbage(TOKEN_PATH, &token, "an IMDSv2 token"));
        }
        *cached = Some((token.clone(), Instant::now() + TOKEN_TTL / 2));
        Ok(token)
    }

    /// `GET path` with the token; on 401 the token is refreshed once.
    pub async fn get(&self, path: &str) -> Result<String, MetadataError> {
        let mut refreshed = false;
        loop {
            let token = self.token(refreshed).await?;
            let (status, body) = self
                .request(Method::GET, path, (TOKEN_HEADER, &token))
                .await?;
            match status {
                s if s.is_success() => return Ok(body),
                StatusCode::UNAUTHORIZED if !refreshed => refreshed = true,
                s => {
                    return Err(MetadataError::Status {
                        path: path.to_string(),
                        status: s.as_u16(),
                        fix: if s == StatusCode::NOT_FOUND {
                            "no such ENI on this instance: check that the ERI is attached (`ip link`, ECS console)".into()
                        } else {
                            "retry later; check the metadata service".into()
                        },
                    });
                }
            }
        }
    }
}

impl Metadata for ImdsClient {
    async fn eni_addressing(&self, mac: MacAddr) -> Result<EniAddressing, MetadataError> {
        let ip = self.get(&eni_path(mac, "primary-ip-address")).await?;
        let cidr = self.get(&eni_path(mac, "vswitch-cidr-block")).await?;
        let gw = self.get(&eni_path(mac, "gateway")).await?;
        parse_addressing(mac, &ip, &cidr, &gw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac() -> MacAddr {
        "00:16:3e:0a:1b:2c".parse().unwrap()
    }

    #[test]
    fn parses_and_validates() {
        let a = parse_addressing(mac(), "172.16.1.9\n", "172.16.1.0/24", "172.16.1.253").unwrap();
        assert_eq!(a.primary_ip, Ipv4Addr::new(172, 16, 1, 9));
        assert_eq!(a.network, Ipv4Addr::new(172, 16, 1, 0));
        assert_eq!(a.prefix_len, 24);
        assert_eq!(a.gateway, Ipv4Addr::new(172, 16, 1, 253));
        for (ip, cidr, gw, field) in [
            (
                "<html>",
                "172.16.1.0/24",
                "172.16.1.253",
                "primary-ip-address",
            ),
            (
                "172.16.1.9",
                "172.16.1.0",
                "172.16.1.253",
                "vswitch-cidr-block",
            ),
            (
                "172.16.1.9",
                "172.16.1.0/33",
                "172.16.1.253",
                "vswitch-cidr-block",
            ),
            (
                "172.16.2.9",
                "172.16.1.0/24",
                "172.16.1.253",
                "primary-ip-address",
            ),
            ("172.16.1.9", "172.16.1.0/24", "10.0.0.1", "gateway"),
            ("172.16.1.9", "172.16.1.0/24", "", "gateway"),
        ] {
            let e = parse_addressing(mac(), ip, cidr, gw)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(field) && e.contains("00:16:3e:0a:1b:2c") && e.contains("Fix:"),
                "{e}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_answers_never_panic(ip in ".{0,40}", cidr in ".{0,40}", gw in ".{0,40}") {
            let _ = parse_addressing(mac(), &ip, &cidr, &gw);
        }

        #[test]
        fn consistent_answers_parse(net in proptest::prelude::any::<u32>(), len in 8u8..=29, host in 1u32..3, gw_host in 3u32..5) {
            let mask = u32::MAX << (32 - u32::from(len));
            let network = Ipv4Addr::from(net & mask);
            let ip = Ipv4Addr::from((net & mask) | host);
            let gw = Ipv4Addr::from((net & mask) | gw_host);
            let a = parse_addressing(mac(), &format!("{ip}\n"), &format!("{network}/{len}"), &gw.to_string()).unwrap();
            proptest::prop_assert_eq!(a, EniAddressing { primary_ip: ip, network, prefix_len: len, gateway: gw });
        }
    }

    #[test]
    fn paths_match_the_seed() {
        assert_eq!(
            eni_path(mac(), "gateway"),
            "/latest/meta-data/network/interfaces/macs/00:16:3e:0a:1b:2c/gateway"
        );
    }

    #[test]
    fn endpoint_is_validated() {
        assert!(ImdsClient::new("https://100.100.100.200").is_err());
        assert!(ImdsClient::new("not a url").is_err());
        let c = ImdsClient::new("http://127.0.0.1:8080/").unwrap();
        assert_eq!(
            (c.host.as_str(), c.port, c.endpoint.as_str()),
            ("127.0.0.1", 8080, "http://127.0.0.1:8080")
        );
        assert_eq!(ImdsClient::ecs().port, 80);
    }
}
