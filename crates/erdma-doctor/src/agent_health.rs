//! The agent's own view, from its `/healthz` endpoint (`{"ok":true,"registered":<bool>}`, served
//! with `/metrics` on `--metrics-addr`, default port 9101, host network).

use crate::check::Check;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The agent's default metrics/health address as seen from its node.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9101";

/// GETs `/healthz` from `addr` (plain HTTP/1.0); returns the status code and body.
pub fn fetch(addr: SocketAddr, timeout: Duration) -> Result<(u16, String), String> {
    let mut s =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.write_all(format!("GET /healthz HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .map_err(|e| format!("send to {addr}: {e}"))?;
    let mut raw = Vec::new();
    s.take(64 * 1024)
        .read_to_end(&mut raw)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr}: not an HTTP response"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            format!(
                "{addr}: no HTTP status in {:?}",
                head.lines().next().unwrap_or("")
            )
        })?;
    Ok((code, body.to_string()))
}

/// `local.agent`: judges a `/healthz` answer (or why there was none).
pub fn check(addr: &str, answer: Result<(u16, String), String>) -> Check {
    let id = "local.agent";
    let (code, body) = match answer {
        Ok(a) => a,
        Err(e) => {
            return Check::warn(
                id,
                format!("no erdma agent answered on {addr}: {e}"),
                "the agent (hostNetwork) serves /healthz on --metrics-addr (default :9101): is it running on this node \
                 (kubectl get pods -A -o wide | grep erdma-agent)? Pass --agent-addr if it listens elsewhere",
            );
        }
    };
    if code != 200 {
        return Check::fail(
            id,
            format!("agent on {addr} answered HTTP {code} to /healthz"),
            "read the agent log",
        );
    }
    let v: serde_json::Value = match serde_json::from_str(body.trim()) {
        Ok(v) => v,
        Err(e) => {
            return Check::warn(
                id,
                format!(
                    "agent on {addr}: /healthz body is not JSON ({e}): {:?}",
                    body.trim()
                ),
                "is another service listening on this port? Pass --agent-addr",
            );
        }
    };
    match v.get("registered").and_then(serde_json::Value::as_bool) {
        Some(true) => Check::pass(
            id,
            format!("agent on {addr} is up and its device plugin is registered with the kubelet"),
        ),
        Some(false) => Check::fail(
            id,
            format!(
                "agent on {addr} is up but its device plugin is not registered with the kubelet"
            ),
            "check the agent log for the Register error and that /var/lib/kubelet/device-plugins is mounted; it re-registers \
             when the kubelet restarts",
        ),
        None => Check::warn(
            id,
            format!(
                "agent on {addr}: /healthz has no \"registered\" field: {}",
                body.trim()
            ),
            "an older agent: upgrade, or rely on node.allocatable",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Status;
    use std::net::TcpListener;

    fn serve_once(reply: &'static str) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf);
                let _ = s.write_all(reply.as_bytes());
            }
        });
        addr
    }

    #[test]
    fn registered_agent_passes_over_real_http() {
        let addr = serve_once(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 31\r\n\r\n{\"ok\":true,\"registered\":true}\n",
        );
        let c = check("a", fetch(addr, Duration::from_secs(2)));
        assert_eq!(c.status, Status::Pass, "{c:?}");
    }

    #[test]
    fn unregistered_plugin_fails_and_silence_warns() {
        let addr = serve_once("HTTP/1.1 200 OK\r\n\r\n{\"ok\":true,\"registered\":false}\n");
        assert_eq!(
            check("a", fetch(addr, Duration::from_secs(2))).status,
            Status::Fail
        );
        // A port nobody listens on.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let closed = l.local_addr().unwrap();
        drop(l);
        let c = check(&closed.to_string(), fetch(closed, Duration::from_secs(2)));
        assert_eq!(c.status, Status::Warn);
        assert!(c.message.contains("no erdma agent answered"));
        assert_eq!(check("a", Ok((500, String::new()))).status, Status::Fail);
        assert_eq!(check("a", Ok((200, "<html>".into()))).status, Status::Warn);
        assert_eq!(
            check("a", Ok((200, "{\"ok\":true}".into()))).status,
            Status::Warn
        );
    }
}
