//! The kube clients of erdma's binaries, built with one request-timeout contract.
//!
//! - Every request that is not long-running has a total deadline: from the moment it is sent to
//!   the last byte of its answer, the client's own retries (429/503/504) included. A request past
//!   it fails with [`RequestTimedOut`], which names what was being done, the API server and the
//!   deadline (kube reports it as a `ServiceError`, the callers add their own context).
//! - Long-running requests are exempt: watches (`watch=true`), followed logs (`follow=true`) and
//!   upgraded connections (exec, attach, port-forward). The API server ends a watch after its
//!   `timeoutSeconds` (kube-runtime's watcher asks for 290 s) and the watcher has its own idle
//!   timeout on top, so an idle watch is neither cut nor left hanging.
//! - Optionally, [`Progress`] reports a request that has not been answered after a second (and
//!   again after 2, 4, 8 … seconds): erdmactl prints those on stderr.
//!
//! Why not `kube::Config::read_timeout`: kube applies it to the connection's reads, for every
//! request alike. A watch that sees no event for longer would be cut and listed again over and
//! over, and as a per-read timeout it is no deadline for an answer that trickles in.

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use hyper::{Method, Request, Response, Uri};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// Boxed error of the client's service stack.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The default deadline of the long-running binaries (agent, controller): 70 s, the one
/// kube-controller-manager sets on its clients: just above the API server's own limit for a
/// request that is not long-running (its `--request-timeout`, 60 s by default), so a request the
/// server may still answer is never cut, and one it will never answer fails.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(70);

/// Progress is first reported after this long without an answer.
pub const PROGRESS_AFTER: Duration = Duration::from_secs(1);

/// A request that ran past its deadline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{action}: the API server at {server} did not answer within {after:?} (request timed out)")]
pub struct RequestTimedOut {
    /// What the request was doing (see [`describe`]).
    pub action: String,
    /// The API server's address.
    pub server: String,
    /// The deadline.
    pub after: Duration,
}

/// A request waiting for its answer, as [`Progress`] reports it.
#[derive(Debug, Clone, Copy)]
pub struct Waiting<'a> {
    /// The API server's address.
    pub server: &'a str,
    /// What the request is doing (see [`describe`]).
    pub action: &'a str,
    /// How long it has been waiting.
    pub elapsed: Duration,
}

type Report = dyn Fn(&Waiting<'_>) + Send + Sync;

/// Reports requests that take long: first after `first` without an answer, then each time the
/// wait has doubled; across all requests of a client at most one report per `first`.
#[derive(Clone)]
pub struct Progress {
    first: Duration,
    report: Arc<Report>,
    last: Arc<Mutex<Option<Instant>>>,
}

impl Progress {
    /// Calls `report` for requests unanswered after `first` (then 2×, 4× … `first`).
    pub fn new(first: Duration, report: impl Fn(&Waiting<'_>) + Send + Sync + 'static) -> Self {
        Self {
            first: first.max(Duration::from_millis(1)),
            report: Arc::new(report),
            last: Arc::new(Mutex::new(None)),
        }
    }

    fn tick(&self, waiting: &Waiting<'_>) {
        let now = Instant::now();
        {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|l| now.duration_since(l) < self.first) {
                return;
            }
            *last = Some(now);
        }
        (self.report)(waiting);
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("first", &self.first)
            .finish_non_exhaustive()
    }
}

/// How a client treats slow requests.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Deadline of each request that is not long-running; `None`: none (kubectl's
    /// `--request-timeout=0`).
    pub request_timeout: Option<Duration>,
    /// Reports requests that take long.
    pub progress: Option<Progress>,
}

impl Default for ClientOptions {
    /// [`DEFAULT_REQUEST_TIMEOUT`], no progress reports.
    fn default() -> Self {
        Self::with_deadline(Some(DEFAULT_REQUEST_TIMEOUT))
    }
}

impl ClientOptions {
    /// `request_timeout` (`None`: no deadline), no progress reports.
    pub fn with_deadline(request_timeout: Option<Duration>) -> Self {
        Self {
            request_timeout,
            progress: None,
        }
    }
}

/// A client for `config` with `options`. The connect timeout is kept within the deadline.
pub fn build(
    mut config: kube::Config,
    options: &ClientOptions,
) -> Result<kube::Client, crate::Error> {
    if let Some(t) = options.request_timeout {
        config.connect_timeout = Some(config.connect_timeout.map_or(t, |c| c.min(t)));
    }
    let layer = DeadlineLayer {
        server: Arc::from(config.cluster_url.to_string().trim_end_matches('/')),
        timeout: options.request_timeout,
        progress: options.progress.clone(),
    };
    let builder =
        kube::client::ClientBuilder::try_from(config).map_err(|source| crate::Error::Kube {
            what: "building the Kubernetes client".into(),
            source,
        })?;
    Ok(builder.with_layer(&layer).build())
}

/// A client from the environment as `kube::Client::try_default` finds it (in-cluster, else
/// `KUBECONFIG` or `~/.kube/config`), with `options`.
pub async fn infer(options: &ClientOptions) -> Result<kube::Client, crate::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| crate::Error::Kube {
            what: "no Kubernetes configuration (in-cluster service account, KUBECONFIG or ~/.kube/config)".into(),
            source: kube::Error::InferConfig(e),
        })?;
    build(config, options)
}

/// Parses a request timeout as kubectl's `--request-timeout` takes it: a number with a unit
/// (`500ms`, `30s`, `2m`, `1h`, or several: `1m30s`) or bare seconds (`30`). `0` means no
/// deadline (`None`).
pub fn parse_timeout(value: &str) -> Result<Option<Duration>, String> {
    let bad = |why: &str| {
        format!("{value:?} is not a duration ({why}); e.g. 30s, 2m, 1m30s, 500ms, or 0 for none")
    };
    let s = value.trim();
    if s.is_empty() {
        return Err(bad("empty"));
    }
    let total = if s.bytes().all(|b| b.is_ascii_digit()) {
        Duration::from_secs(s.parse().map_err(|_| bad("too large"))?)
    } else {
        let mut total = Duration::ZERO;
        let mut rest = s;
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return Err(bad("a number must come before each unit"));
            }
            let n: u64 = rest[..digits].parse().map_err(|_| bad("too large"))?;
            rest = &rest[digits..];
            let unit = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
            let part = match &rest[..unit] {
                "ms" => Duration::from_millis(n),
                "s" => Duration::from_secs(n),
                "m" => Duration::from_secs(n.saturating_mul(60)),
                "h" => Duration::from_secs(n.saturating_mul(3600)),
                "" => return Err(bad("a unit must follow each number after the first")),
                _ => return Err(bad("units are ms, s, m and h")),
            };
            rest = &rest[unit..];
            total = total.saturating_add(part);
        }
        total
    };
    Ok((!total.is_zero()).then_some(total))
}

/// What a request does, in words: `getting nodes/n1`, `listing pods in namespace default`,
/// `patching nodes/n1/status`, `creating pytorchjobs in namespace team`; `GET /version` for
/// paths outside the resource API.
pub fn describe(method: &Method, uri: &Uri) -> String {
    let path = uri.path();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] | ["apis", _, _version, rest @ ..] => rest,
        ["api"] | ["apis"] | ["apis", _] => &[][..],
        _ => return format!("{method} {path}"),
    };
    if rest.is_empty() {
        return format!("reading the API discovery ({path})");
    }
    let (namespace, rest) = match rest {
        ["namespaces", ns, r @ ..] if !r.is_empty() => (Some(*ns), r),
        r => (None, r),
    };
    let object = rest.join("/");
    let named = rest.len() > 1;
    let verb = match (method.as_str(), named) {
        ("GET", true) => "getting",
        ("GET", false) => "listing",
        ("POST", _) => "creating",
        ("PUT", _) => "replacing",
        ("PATCH", _) => "patching",
        ("DELETE", true) => "deleting",
        ("DELETE", false) => "deleting all",
        (other, _) => return format!("{other} {path}"),
    };
    match namespace {
        Some(ns) => format!("{verb} {object} in namespace {ns}"),
        None => format!("{verb} {object}"),
    }
}

/// Whether the request stays open by design: a watch, a followed log, an upgraded connection.
fn long_running<B>(req: &Request<B>) -> bool {
    let query = req.uri().query().unwrap_or_default();
    query
        .split('&')
        .any(|kv| matches!(kv, "watch=true" | "watch=1" | "follow=true" | "follow=1"))
        || req.headers().contains_key(hyper::header::UPGRADE)
}

/// The tower layer of [`build`].
#[derive(Clone)]
struct DeadlineLayer {
    server: Arc<str>,
    timeout: Option<Duration>,
    progress: Option<Progress>,
}

impl<S> tower::Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`DeadlineLayer`].
#[derive(Clone)]
struct Deadline<S> {
    inner: S,
    layer: DeadlineLayer,
}

impl<S, B> tower::Service<Request<kube::client::Body>> for Deadline<S>
where
    S: tower::Service<Request<kube::client::Body>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<DeadlineBody<B>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<kube::client::Body>) -> Self::Future {
        if long_running(&req) {
            let answer = self.inner.call(req);
            return Box::pin(async move {
                let resp = answer.await.map_err(Into::into)?;
                Ok(resp.map(|inner| DeadlineBody {
                    inner,
                    deadline: None,
                }))
            });
        }
        let action = describe(req.method(), req.uri());
        let answer = self.inner.call(req);
        let layer = self.layer.clone();
        Box::pin(async move {
            let start = Instant::now();
            let timed_out = |after| RequestTimedOut {
                action: action.clone(),
                server: layer.server.to_string(),
                after,
            };
            let waited = wait_reporting(
                answer,
                layer.progress.as_ref(),
                layer.timeout,
                &layer.server,
                &action,
            );
            let resp = match layer.timeout {
                Some(t) => tokio::time::timeout_at(start + t, waited)
                    .await
                    .map_err(|_| Box::new(timed_out(t)) as BoxError)?,
                None => waited.await,
            }
            .map_err(Into::into)?;
            Ok(resp.map(|inner| DeadlineBody {
                inner,
                deadline: layer
                    .timeout
                    .map(|t| (Box::pin(tokio::time::sleep_until(start + t)), timed_out(t))),
            }))
        })
    }
}

/// Awaits `answer`, reporting it to `progress` while it takes long (not at or after `deadline`,
/// where the request fails instead).
async fn wait_reporting<F: Future>(
    answer: F,
    progress: Option<&Progress>,
    deadline: Option<Duration>,
    server: &str,
    action: &str,
) -> F::Output {
    let Some(progress) = progress else {
        return answer.await;
    };
    let start = Instant::now();
    let mut next = progress.first;
    tokio::pin!(answer);
    loop {
        if deadline.is_some_and(|d| next >= d) {
            return answer.await;
        }
        tokio::select! {
            biased;
            out = &mut answer => return out,
            _ = tokio::time::sleep_until(start + next) => {
                progress.tick(&Waiting { server, action, elapsed: start.elapsed() });
                next = next.saturating_mul(2);
            }
        }
    }
}

/// A response body that fails with [`RequestTimedOut`] when the request's deadline passes
/// before its end.
struct DeadlineBody<B> {
    inner: B,
    deadline: Option<(Pin<Box<tokio::time::Sleep>>, RequestTimedOut)>,
}

impl<B> hyper::body::Body for DeadlineBody<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if let Some((sleep, _)) = this.deadline.as_mut()
            && sleep.as_mut().poll(cx).is_ready()
            && let Some((_, err)) = this.deadline.take()
        {
            return Poll::Ready(Some(Err(Box::new(err))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(method: &str, uri: &str) -> String {
        describe(&method.parse().expect("method"), &uri.parse().expect("uri"))
    }

    #[test]
    fn requests_are_described_by_verb_resource_and_namespace() {
        assert_eq!(words("GET", "/api/v1/nodes/n1"), "getting nodes/n1");
        assert_eq!(
            words("GET", "/api/v1/nodes?labelSelector=a%3Db"),
            "listing nodes"
        );
        assert_eq!(
            words("GET", "/api/v1/namespaces/default/pods"),
            "listing pods in namespace default"
        );
        assert_eq!(
            words("PATCH", "/api/v1/nodes/n1/status?fieldManager=x"),
            "patching nodes/n1/status"
        );
        assert_eq!(
            words("POST", "/apis/kubeflow.org/v1/namespaces/team/pytorchjobs"),
            "creating pytorchjobs in namespace team"
        );
        assert_eq!(
            words(
                "DELETE",
                "/apis/apps/v1/namespaces/kube-system/daemonsets/agent"
            ),
            "deleting daemonsets/agent in namespace kube-system"
        );
        // A namespace itself is a cluster-scoped object.
        assert_eq!(
            words("GET", "/api/v1/namespaces/team"),
            "getting namespaces/team"
        );
        assert_eq!(
            words("GET", "/apis/apps/v1"),
            "reading the API discovery (/apis/apps/v1)"
        );
        assert_eq!(words("GET", "/version"), "GET /version");
    }

    #[test]
    fn watches_follows_and_upgrades_are_long_running() {
        let req = |uri: &str| Request::get(uri).body(()).expect("request");
        assert!(long_running(&req(
            "/api/v1/nodes?watch=true&resourceVersion=1"
        )));
        assert!(long_running(&req(
            "/api/v1/nodes?resourceVersion=1&watch=1"
        )));
        assert!(long_running(&req(
            "/api/v1/namespaces/a/pods/p/log?follow=true"
        )));
        assert!(!long_running(&req("/api/v1/nodes?resourceVersion=1")));
        assert!(!long_running(&req("/api/v1/nodes/watch=true")));
        let exec = Request::get("/api/v1/namespaces/a/pods/p/exec")
            .header("upgrade", "websocket")
            .body(())
            .expect("request");
        assert!(long_running(&exec));
    }

    #[test]
    fn timeouts_parse_as_kubectl_takes_them() {
        let ok = |s: &str| parse_timeout(s).expect(s);
        assert_eq!(ok("30s"), Some(Duration::from_secs(30)));
        assert_eq!(ok("45"), Some(Duration::from_secs(45)));
        assert_eq!(ok("2m"), Some(Duration::from_secs(120)));
        assert_eq!(ok("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(ok("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(ok("1500ms"), Some(Duration::from_millis(1500)));
        assert_eq!(ok("0"), None);
        assert_eq!(ok("0s"), None);
        for bad in ["", "s", "1x", "1.5s", "-1s", "10s5", "ten"] {
            let e = parse_timeout(bad).expect_err(bad);
            assert!(e.contains("e.g. 30s"), "{bad}: {e}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn progress_is_reported_at_doubling_waits_and_stops_with_the_answer() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let progress = Progress::new(Duration::from_secs(1), move |w: &Waiting<'_>| {
            sink.lock()
                .expect("lock")
                .push((w.action.to_string(), w.elapsed.as_secs()));
        });
        let answer = async {
            tokio::time::sleep(Duration::from_millis(9500)).await;
            7
        };
        let out = wait_reporting(
            answer,
            Some(&progress),
            None,
            "https://api",
            "listing nodes",
        )
        .await;
        assert_eq!(out, 7);
        let seen = log.lock().expect("lock").clone();
        let at: Vec<u64> = seen.iter().map(|(_, s)| *s).collect();
        assert_eq!(
            at,
            [1, 2, 4, 8],
            "reports at 1, 2, 4 and 8 s, none after the answer"
        );
        assert!(seen.iter().all(|(a, _)| a == "listing nodes"));
        // A fast answer is never reported.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let quiet = wait_reporting(async { 1 }, Some(&progress), None, "https://api", "x").await;
        assert_eq!(quiet, 1);
        assert_eq!(log.lock().expect("lock").len(), 4);
        // Nothing is reported at or after the deadline: the request fails there instead.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let slow = async {
            tokio::time::sleep(Duration::from_secs(9)).await;
            2
        };
        let out = wait_reporting(
            slow,
            Some(&progress),
            Some(Duration::from_secs(4)),
            "s",
            "y",
        )
        .await;
        assert_eq!(out, 2);
        let seen = log.lock().expect("lock").clone();
        let at: Vec<u64> = seen[4..].iter().map(|(_, s)| *s).collect();
        assert_eq!(at, [1, 2], "4 s is the deadline: no report there or later");
    }
}
