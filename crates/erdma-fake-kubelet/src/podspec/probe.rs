//! Container probes as the kubelet's prober runs them (`pkg/kubelet/prober`): `httpGet` (HTTP
//! only), `tcpSocket` and `exec` (CRI `ExecSync`), with the API's defaults (period 10 s,
//! timeout 1 s, success threshold 1, failure threshold 3) and the worker's threshold rules.
//!
//! The lab kubelet runs the startup probe, then the readiness probe, until the container is
//! ready or a deadline passes (readiness failures only keep it not ready; startup failures past
//! the threshold are where the kubelet would restart the container, so probing ends there), and
//! then one liveness check.

use erdma_cri::CriClient;
use erdma_cri::runtime::v1 as cri;
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The `User-Agent` of the kubelet's HTTP probes (`kube-probe/<major>.<minor>`); the lab speaks
/// the API of Kubernetes 1.34.
pub const USER_AGENT: &str = "kube-probe/1.34";

/// What a probe does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAction {
    /// `GET http://host:port/path`; an empty host is the pod IP.
    Http {
        /// `httpGet.host`.
        host: String,
        /// The port (a named port resolved against the container's ports).
        port: u16,
        /// `httpGet.path` (leading `/` added).
        path: String,
        /// `httpGet.httpHeaders`.
        headers: Vec<(String, String)>,
    },
    /// A TCP connect; an empty host is the pod IP.
    Tcp {
        /// `tcpSocket.host`.
        host: String,
        /// The port.
        port: u16,
    },
    /// `ExecSync` of the command (its `$(VAR)` references expanded from the container's
    /// literal env values).
    Exec {
        /// The command.
        command: Vec<String>,
    },
}

/// One probe of the container, with the API's defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbePlan {
    /// `startup`, `readiness` or `liveness`.
    pub kind: &'static str,
    /// What it does.
    pub action: ProbeAction,
    /// `initialDelaySeconds`.
    pub initial_delay: Duration,
    /// `periodSeconds`.
    pub period: Duration,
    /// `timeoutSeconds`.
    pub timeout: Duration,
    /// `successThreshold`.
    pub success_threshold: u32,
    /// `failureThreshold`.
    pub failure_threshold: u32,
}

impl ProbePlan {
    /// As `kubectl describe` prints a probe: `http-get http://:9101/healthz delay=5s
    /// timeout=5s period=10s #success=1 #failure=3`.
    pub fn description(&self) -> String {
        let what = match &self.action {
            ProbeAction::Http {
                host, port, path, ..
            } => format!("http-get http://{}{path}", join_host_port(host, *port)),
            ProbeAction::Tcp { host, port } => {
                format!("tcp-socket {}", join_host_port(host, *port))
            }
            ProbeAction::Exec { command } => format!("exec [{}]", command.join(" ")),
        };
        format!(
            "{what} delay={}s timeout={}s period={}s #success={} #failure={}",
            self.initial_delay.as_secs(),
            self.timeout.as_secs(),
            self.period.as_secs(),
            self.success_threshold,
            self.failure_threshold
        )
    }
}

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn seconds(v: Option<i32>, default: i32, field: &str, min: i32) -> Result<u32, String> {
    let v = v.unwrap_or(default);
    if v < min {
        return Err(format!("{field} {v} must be at least {min}"));
    }
    u32::try_from(v).map_err(|_| format!("{field} {v} is out of range"))
}

/// A probe's port: a number, or the name of one of the container's ports.
pub fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    let n = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => match name.parse::<i32>() {
            Ok(n) => n,
            Err(_) => container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| p.container_port)
                .ok_or_else(|| {
                    format!(
                        "port {name:?} is not a named port of container {:?}",
                        container.name
                    )
                })?,
        },
    };
    u16::try_from(n)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("port {n} is not in 1-65535"))
}

/// The plan of `probe` (`kind`: `startup`, `readiness`, `liveness`) of `container`; the error
/// names the field (relative to the probe) and says why.
pub fn plan(kind: &'static str, probe: &Probe, container: &Container) -> Result<ProbePlan, String> {
    let handlers = [
        probe.http_get.is_some(),
        probe.tcp_socket.is_some(),
        probe.exec.is_some(),
        probe.grpc.is_some(),
    ];
    if handlers.iter().filter(|h| **h).count() != 1 {
        return Err("must have exactly one of httpGet, tcpSocket, exec, grpc".into());
    }
    let action = if let Some(h) = &probe.http_get {
        let scheme = h.scheme.as_deref().unwrap_or("HTTP");
        if scheme != "HTTP" {
            return Err(format!(
                "httpGet.scheme {scheme}: the lab kubelet probes over HTTP only (no TLS). Fix: probe HTTP, or run this pod on a real kubelet"
            ));
        }
        let path = h.path.clone().unwrap_or_default();
        ProbeAction::Http {
            host: h.host.clone().unwrap_or_default(),
            port: resolve_port(&h.port, container).map_err(|e| format!("httpGet.{e}"))?,
            path: if path.starts_with('/') {
                path
            } else {
                format!("/{path}")
            },
            headers: h
                .http_headers
                .iter()
                .flatten()
                .map(|x| (x.name.clone(), x.value.clone()))
                .collect(),
        }
    } else if let Some(t) = &probe.tcp_socket {
        ProbeAction::Tcp {
            host: t.host.clone().unwrap_or_default(),
            port: resolve_port(&t.port, container).map_err(|e| format!("tcpSocket.{e}"))?,
        }
    } else if let Some(e) = &probe.exec {
        // The prober expands only the container's literal env values; a valueFrom variable
        // counts as defined and empty.
        let statics: BTreeMap<String, String> = container
            .env
            .iter()
            .flatten()
            .map(|v| (v.name.clone(), v.value.clone().unwrap_or_default()))
            .collect();
        let command: Vec<String> = e
            .command
            .iter()
            .flatten()
            .map(|c| super::expand::expand(c, |k| statics.get(k).cloned()))
            .collect();
        if command.is_empty() {
            return Err("exec.command is empty".into());
        }
        ProbeAction::Exec { command }
    } else {
        return Err(
            "grpc: the lab kubelet runs httpGet, tcpSocket and exec probes. Fix: use one of them"
                .into(),
        );
    };
    let success_threshold = seconds(probe.success_threshold, 1, "successThreshold", 1)?;
    if kind != "readiness" && success_threshold != 1 {
        return Err(format!(
            "successThreshold {success_threshold} must be 1 for a {kind} probe"
        ));
    }
    Ok(ProbePlan {
        kind,
        action,
        initial_delay: Duration::from_secs(
            seconds(probe.initial_delay_seconds, 0, "initialDelaySeconds", 0)?.into(),
        ),
        period: Duration::from_secs(seconds(probe.period_seconds, 10, "periodSeconds", 1)?.into()),
        timeout: Duration::from_secs(
            seconds(probe.timeout_seconds, 1, "timeoutSeconds", 1)?.into(),
        ),
        success_threshold,
        failure_threshold: seconds(probe.failure_threshold, 3, "failureThreshold", 1)?,
    })
}

/// One probe's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It passed (what it saw).
    Success(String),
    /// It failed (why).
    Failure(String),
}

/// Where probes go: the runtime (for `exec`) and the pod's IP (the default host).
pub struct ProbeTarget<'a> {
    /// The runtime.
    pub cri: &'a mut CriClient,
    /// The container.
    pub container_id: &'a str,
    /// The pod's IP (the node's for a host-network pod).
    pub pod_ip: &'a str,
}

/// Runs `probe` once.
pub async fn run_once(probe: &ProbePlan, target: &mut ProbeTarget<'_>) -> Outcome {
    match &probe.action {
        ProbeAction::Http {
            host,
            port,
            path,
            headers,
        } => {
            let host = if host.is_empty() { target.pod_ip } else { host };
            if let Err(why) = may_dial(host, *port, target.pod_ip).await {
                return Outcome::Failure(why);
            }
            http_get(host, *port, path, headers, probe.timeout).await
        }
        ProbeAction::Tcp { host, port } => {
            let host = if host.is_empty() { target.pod_ip } else { host };
            if let Err(why) = may_dial(host, *port, target.pod_ip).await {
                return Outcome::Failure(why);
            }
            tcp_connect(host, *port, probe.timeout).await
        }
        ProbeAction::Exec { command } => {
            let secs = u32::try_from(probe.timeout.as_secs()).unwrap_or(u32::MAX);
            let call = target
                .cri
                .exec_sync(target.container_id, command.clone(), secs);
            match tokio::time::timeout(probe.timeout + Duration::from_secs(2), call).await {
                Err(_) => Outcome::Failure(format!(
                    "command {command:?} timed out after {}s",
                    probe.timeout.as_secs()
                )),
                Ok(Err(e)) => Outcome::Failure(format!("command {command:?}: {e}")),
                Ok(Ok(out)) => {
                    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
                    text.push_str(&String::from_utf8_lossy(&out.stderr));
                    let text: String = text.trim().chars().take(1024).collect();
                    if out.exit_code == 0 {
                        Outcome::Success(text)
                    } else {
                        Outcome::Failure(format!(
                            "command {command:?} exited with {}: {text}",
                            out.exit_code
                        ))
                    }
                }
            }
        }
    }
}

/// Whether a probe may connect to `host:port`: loopback, or the pod's own IP (the runtime gave
/// it to a sandbox on this machine). A probe's `host` naming anything else (a manifest's
/// address) is refused without a packet sent.
pub async fn may_dial(host: &str, port: u16, pod_ip: &str) -> Result<(), String> {
    use erdma_k8s::dial_guard::{Cidr, DialGuard};
    let mut guard = DialGuard::loopback_only();
    if let Ok(own) = Cidr::parse(pod_ip) {
        guard.allow(own);
    }
    guard
        .resolve(host, port, "the lab kubelet's probe")
        .await
        .map(|_| ())
}

/// A TCP probe: the connection opens within `timeout`.
pub async fn tcp_connect(host: &str, port: u16, timeout: Duration) -> Outcome {
    let addr = join_host_port(host, port);
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await {
        Err(_) => Outcome::Failure(format!("dial tcp {addr}: i/o timeout")),
        Ok(Err(e)) => Outcome::Failure(format!("dial tcp {addr}: {e}")),
        Ok(Ok(_)) => Outcome::Success(format!("connected to {addr}")),
    }
}

/// An HTTP probe: a `GET` answered within `timeout` with a status in 200-399. A redirect is
/// not followed: it counts as the success the kubelet reports for a redirect it does not follow.
pub async fn http_get(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> Outcome {
    let hostport = join_host_port(host, port);
    let url = format!("http://{hostport}{path}");
    match tokio::time::timeout(timeout, http_status(host, port, path, headers)).await {
        Err(_) => Outcome::Failure(format!(
            "Get {url:?}: context deadline exceeded (timeout {}s)",
            timeout.as_secs()
        )),
        Ok(Err(e)) => Outcome::Failure(format!("Get {url:?}: {e}")),
        Ok(Ok(code)) if (200..400).contains(&code) => Outcome::Success(format!("HTTP {code}")),
        Ok(Ok(code)) => Outcome::Failure(format!("HTTP probe failed with statuscode: {code}")),
    }
}

async fn http_status(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
) -> Result<u16, String> {
    let stream = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("dial tcp {}: {e}", join_host_port(host, port)))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    let mut req = hyper::Request::builder().method("GET").uri(path);
    let has = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
    if !has("host") {
        req = req.header("Host", join_host_port(host, port));
    }
    if !has("user-agent") {
        req = req.header("User-Agent", USER_AGENT);
    }
    if !has("accept") {
        req = req.header("Accept", "*/*");
    }
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req
        .header("Connection", "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("bad request: {e}"))?;
    // The connection is driven here, beside the request, and dropped with it: no task outlives
    // the probe.
    let send = sender.send_request(req);
    tokio::pin!(send);
    tokio::pin!(conn);
    tokio::select! {
        biased;
        r = &mut send => return r.map(|resp| resp.status().as_u16()).map_err(|e| e.to_string()),
        c = &mut conn => c.map_err(|e| e.to_string())?,
    }
    // With `Connection: close` the connection may finish first; the response is in by then.
    send.await
        .map(|resp| resp.status().as_u16())
        .map_err(|e| e.to_string())
}

/// A probe's history in the pod record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeRecord {
    /// `startup`, `readiness` or `liveness`.
    pub kind: String,
    /// As `kubectl describe` prints it.
    pub description: String,
    /// Probes run.
    pub attempts: u32,
    /// Of them, passed.
    pub successes: u32,
    /// `success` or `failure` of the last probe (`not run` when none ran).
    pub last_result: String,
    /// What the last probe saw or why it failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_message: String,
    /// Whether the probe reached its threshold (`successThreshold` passes in a row).
    pub passed: bool,
}

impl ProbeRecord {
    fn new(p: &ProbePlan) -> ProbeRecord {
        ProbeRecord {
            kind: p.kind.to_string(),
            description: p.description(),
            attempts: 0,
            successes: 0,
            last_result: "not run".into(),
            last_message: String::new(),
            passed: false,
        }
    }

    fn note(&mut self, o: &Outcome) {
        self.attempts += 1;
        let (result, msg) = match o {
            Outcome::Success(m) => {
                self.successes += 1;
                ("success", m)
            }
            Outcome::Failure(m) => ("failure", m),
        };
        self.last_result = result.into();
        self.last_message = msg.clone();
    }
}

/// How the wait for readiness ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// The container became ready.
    pub ready: bool,
    /// When, counted from `StartContainer`.
    pub ready_after: Option<Duration>,
    /// Every probe run (startup, readiness, liveness).
    pub probes: Vec<ProbeRecord>,
    /// Why it is not ready.
    pub reason: Option<String>,
}

/// The container's probes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probes {
    /// `startupProbe`.
    pub startup: Option<ProbePlan>,
    /// `readinessProbe`.
    pub readiness: Option<ProbePlan>,
    /// `livenessProbe`.
    pub liveness: Option<ProbePlan>,
}

/// `Some(why)` when the container is no longer running.
async fn exited(target: &mut ProbeTarget<'_>) -> Option<String> {
    match target.cri.container_status(target.container_id).await {
        Ok(s) if s.state == cri::ContainerState::ContainerRunning as i32 => None,
        Ok(s) => {
            let state = cri::ContainerState::try_from(s.state)
                .map(|x| x.as_str_name().to_string())
                .unwrap_or_else(|_| format!("state {}", s.state));
            Some(format!(
                "the container is {state} (exit code {}{}{}) before it became ready",
                s.exit_code,
                if s.reason.is_empty() { "" } else { ", " },
                s.reason
            ))
        }
        Err(e) => Some(format!("ContainerStatus failed: {e}")),
    }
}

/// Runs one probe until it passes (`Ok`), or fails past its failure threshold when that ends
/// probing (startup), the container exits, or `deadline` passes (`Err(why)`).
async fn until_passed(
    p: &ProbePlan,
    rec: &mut ProbeRecord,
    target: &mut ProbeTarget<'_>,
    started: Instant,
    deadline: Instant,
) -> Result<(), String> {
    let first = started + p.initial_delay;
    if first > deadline {
        return Err(format!(
            "the {} probe's initialDelaySeconds ({}s) ends after the ready timeout",
            p.kind,
            p.initial_delay.as_secs()
        ));
    }
    tokio::time::sleep_until(first.into()).await;
    let (mut run_ok, mut run_fail) = (0u32, 0u32);
    loop {
        if let Some(why) = exited(target).await {
            return Err(why);
        }
        let at = Instant::now();
        let o = run_once(p, target).await;
        rec.note(&o);
        match o {
            Outcome::Success(_) => {
                run_ok += 1;
                run_fail = 0;
                if run_ok >= p.success_threshold {
                    rec.passed = true;
                    return Ok(());
                }
            }
            Outcome::Failure(m) => {
                run_fail += 1;
                run_ok = 0;
                if p.kind == "startup" && run_fail >= p.failure_threshold {
                    return Err(format!(
                        "the startup probe failed {run_fail} times in a row ({m}); the kubelet would kill and restart the container"
                    ));
                }
            }
        }
        let next = at + p.period;
        if next > deadline {
            return Err(format!(
                "the {} probe did not pass within the ready timeout (last: {}: {})",
                p.kind, rec.last_result, rec.last_message
            ));
        }
        tokio::time::sleep_until(next.into()).await;
    }
}

/// Waits until the container is ready, as the kubelet decides it: the startup probe passed,
/// then the readiness probe passed `successThreshold` times in a row (no probe: ready once
/// running); `timeout` counts from `started` (`StartContainer`). Once ready, the liveness probe
/// runs once (after its initial delay) and is recorded.
pub async fn wait_ready(
    probes: &Probes,
    target: &mut ProbeTarget<'_>,
    started: Instant,
    timeout: Duration,
) -> Readiness {
    let deadline = started + timeout;
    let mut records = Vec::new();
    let mut reason = None;
    for p in [&probes.startup, &probes.readiness].into_iter().flatten() {
        let mut rec = ProbeRecord::new(p);
        let r = until_passed(p, &mut rec, target, started, deadline).await;
        records.push(rec);
        if let Err(why) = r {
            reason = Some(why);
            break;
        }
    }
    if reason.is_none()
        && let Some(why) = exited(target).await
    {
        reason = Some(why);
    }
    let ready = reason.is_none();
    let ready_after = ready.then(|| started.elapsed());
    if ready && let Some(p) = &probes.liveness {
        let mut rec = ProbeRecord::new(p);
        tokio::time::sleep_until((started + p.initial_delay).into()).await;
        let o = run_once(p, target).await;
        rec.note(&o);
        rec.passed = matches!(o, Outcome::Success(_));
        records.push(rec);
    }
    Readiness {
        ready,
        ready_after,
        probes: records,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn probes_reach_loopback_and_the_pods_own_ip_only() {
        assert_eq!(may_dial("127.0.0.1", 8080, "192.0.2.9").await, Ok(()));
        assert_eq!(may_dial("localhost", 8080, "192.0.2.9").await, Ok(()));
        assert_eq!(may_dial("192.0.2.9", 8080, "192.0.2.9").await, Ok(()));
        assert_eq!(may_dial("[::1]", 8080, "192.0.2.9").await, Ok(()));
        let e = may_dial("198.51.100.4", 443, "192.0.2.9")
            .await
            .expect_err("another host");
        assert!(
            e.starts_with(
                "refusing to dial 198.51.100.4:443 (not loopback or a lab address): the lab kubelet's probe"
            ),
            "{e}"
        );
        assert!(e.contains("192.0.2.9/32"), "{e}");
    }
}
