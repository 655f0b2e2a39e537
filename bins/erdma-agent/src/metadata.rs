//! The ECS instance metadata service (only the instance ID is needed here).

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where the ECS metadata service answers.
pub const METADATA_ADDR: &str = "100.100.100.200:80";
/// The path of the instance ID.
pub const INSTANCE_ID_PATH: &str = "/latest/meta-data/instance-id";

/// Source of the instance ID.
#[allow(async_fn_in_trait)]
pub trait InstanceMetadata {
    /// The instance ID (`i-...`).
    async fn instance_id(&self) -> Result<String, String>;
}

/// The real metadata service over plain HTTP.
#[derive(Debug, Clone)]
pub struct HttpMetadata {
    /// `host:port`.
    pub addr: String,
    /// Whole-request timeout.
    pub timeout: Duration,
}

impl Default for HttpMetadata {
    fn default() -> Self {
        HttpMetadata {
            addr: METADATA_ADDR.into(),
            timeout: Duration::from_secs(2),
        }
    }
}

impl InstanceMetadata for HttpMetadata {
    async fn instance_id(&self) -> Result<String, String> {
        let fetch = async {
            let mut s = tokio::net::TcpStream::connect(&self.addr)
                .await
                .map_err(|e| e.to_string())?;
            let host = self.addr.split(':').next().unwrap_or("");
            s.write_all(
                format!("GET {INSTANCE_ID_PATH} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes(),
            )
            .await
            .map_err(|e| e.to_string())?;
            let mut buf = Vec::new();
            s.take(64 * 1024)
                .read_to_end(&mut buf)
                .await
                .map_err(|e| e.to_string())?;
            parse_response(&buf)
        };
        tokio::time::timeout(self.timeout, fetch)
            .await
            .map_err(|_| format!("no answer within {:?}", self.timeout))?
            .map_err(|e| format!("instance ID from http://{}{INSTANCE_ID_PATH}: {e} (pass --instance-id to skip the metadata service)", self.addr))
    }
}

/// Extracts the instance ID from a raw HTTP/1.x response.
fn parse_response(raw: &[u8]) -> Result<String, String> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("malformed HTTP response")?;
    let status = head.lines().next().unwrap_or("");
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("HTTP status {status:?}"));
    }
    let id = body.trim();
    if !id.starts_with("i-")
        || id.len() > 64
        || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(format!("{id:?} is not an ECS instance ID"));
    }
    Ok(id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_answers() {
        assert_eq!(
            parse_response(b"HTTP/1.0 200 OK\r\nContent-Length: 9\r\n\r\ni-bp1abc\n").unwrap(),
            "i-bp1abc"
        );
        assert!(
            parse_response(b"HTTP/1.0 404 Not Found\r\n\r\nnope")
                .unwrap_err()
                .contains("404")
        );
        assert!(
            parse_response(b"HTTP/1.0 200 OK\r\n\r\n<html>")
                .unwrap_err()
                .contains("not an ECS instance ID")
        );
        assert!(parse_response(b"garbage").is_err());
    }

    #[tokio::test]
    async fn talks_http_to_a_local_server() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 512];
            let n = s.read(&mut buf).await.unwrap();
            assert!(
                String::from_utf8_lossy(&buf[..n])
                    .starts_with("GET /latest/meta-data/instance-id HTTP/1.0")
            );
            s.write_all(b"HTTP/1.0 200 OK\r\n\r\ni-test123")
                .await
                .unwrap();
        });
        let m = HttpMetadata {
            addr,
            timeout: Duration::from_secs(2),
        };
        assert_eq!(m.instance_id().await.unwrap(), "i-test123");
    }
}
