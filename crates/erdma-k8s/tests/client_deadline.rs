//! The request-timeout contract of `erdma_k8s::client` (issue 30, item 3) over real HTTP: an API
//! server that accepts and never answers, or stops in the middle of an answer, fails the request
//! with an error naming the deadline; a watch is not cut by it; a slow request is reported as
//! progress. The servers are plain sockets in the test. `GUARD` only keeps a regression from
//! hanging the test run; no test measures how fast anything is.

use erdma_k8s::client::{ClientOptions, Progress, RequestTimedOut, Waiting, build};
use erdma_k8s::fake::FakeApiServer;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, WatchEvent, WatchParams};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Far beyond every deadline below: reaching it means the request hung.
const GUARD: Duration = Duration::from_secs(90);

/// Reads one request's head (up to the blank line).
async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A server that runs `answer` on every connection it accepts; its address.
async fn server<F, Fut>(answer: F) -> String
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(answer(s));
        }
    });
    format!("http://{addr}")
}

/// Accepts, reads the request, and holds the connection without a byte of answer.
async fn silent() -> String {
    server(|mut s| async move {
        read_head(&mut s).await;
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(s);
    })
    .await
}

fn client(url: &str, options: &ClientOptions) -> kube::Client {
    build(kube::Config::new(url.parse().expect("url")), options).expect("client")
}

fn deadline(secs: u64) -> ClientOptions {
    ClientOptions::with_deadline(Some(Duration::from_secs(secs)))
}

/// The `RequestTimedOut` in `e`'s source chain.
fn timed_out(e: &kube::Error) -> Option<RequestTimedOut> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(t) = c.downcast_ref::<RequestTimedOut>() {
            return Some(t.clone());
        }
        cur = c.source();
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_api_server_fails_the_request_naming_the_deadline() {
    let url = silent().await;
    let nodes: Api<Node> = Api::all(client(&url, &deadline(1)));
    let err = tokio::time::timeout(GUARD, nodes.get("n1"))
        .await
        .expect("the request ends at its deadline instead of hanging")
        .expect_err("nothing was answered");
    let t = timed_out(&err).unwrap_or_else(|| panic!("not a RequestTimedOut: {err:?}"));
    assert_eq!(t.after, Duration::from_secs(1));
    assert_eq!(t.action, "getting nodes/n1");
    assert_eq!(t.server, url);
    let msg = err.to_string();
    assert!(
        msg.contains("did not answer within 1s") && msg.contains(&url),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_stops_half_way_fails_at_the_same_deadline() {
    let url = server(|mut s| async move {
        read_head(&mut s).await;
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 4096\r\n\r\n{\"kind\":";
        let _ = s.write_all(head.as_bytes()).await;
        tokio::time::sleep(Duration::from_secs(3600)).await;
    })
    .await;
    let nodes: Api<Node> = Api::all(client(&url, &deadline(2)));
    let err = tokio::time::timeout(GUARD, nodes.list(&Default::default()))
        .await
        .expect("the body read ends at the deadline instead of hanging")
        .expect_err("the body never ended");
    let msg = format!("{err:#}");
    assert!(msg.contains("within 2s"), "{msg}");
    assert!(msg.contains("listing nodes"), "{msg}");
}

/// A watch quiet for longer than the deadline goes on: the API server ends it after its own
/// `timeoutSeconds`. (With `kube::Config::read_timeout` as the deadline, this watch is cut.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_watch_outlives_the_deadline() {
    let url = server(|mut s| async move {
        let head = read_head(&mut s).await;
        assert!(head.contains("watch=true"), "{head}");
        let start = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
        let _ = s.write_all(start.as_bytes()).await;
        let _ = s.flush().await;
        // Three times the deadline without a byte, then one event and the end.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let event = r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Node","metadata":{"name":"late","resourceVersion":"7"}}}"#;
        let line = format!("{event}\n");
        let chunk = format!("{:x}\r\n{line}\r\n0\r\n\r\n", line.len());
        let _ = s.write_all(chunk.as_bytes()).await;
        tokio::time::sleep(Duration::from_secs(3600)).await;
    })
    .await;
    let nodes: Api<Node> = Api::all(client(&url, &deadline(1)));
    let stream = nodes
        .watch(&WatchParams::default().timeout(290), "0")
        .await
        .expect("watch started");
    let mut stream = Box::pin(stream);
    let first = tokio::time::timeout(GUARD, stream.next())
        .await
        .expect("the event arrives")
        .expect("the stream did not end")
        .expect("no error: the watch was not cut");
    match first {
        WatchEvent::Added(n) => assert_eq!(n.metadata.name.as_deref(), Some("late")),
        other => panic!("expected ADDED, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_request_is_reported_while_it_waits() {
    let url = silent().await;
    let seen: Arc<Mutex<Vec<(String, String, Duration)>>> = Arc::default();
    let sink = seen.clone();
    let options = ClientOptions {
        request_timeout: Some(Duration::from_secs(4)),
        progress: Some(Progress::new(
            Duration::from_secs(1),
            move |w: &Waiting<'_>| {
                sink.lock().expect("lock").push((
                    w.server.to_string(),
                    w.action.to_string(),
                    w.elapsed,
                ))
            },
        )),
    };
    let nodes: Api<Node> = Api::all(client(&url, &options));
    let err = tokio::time::timeout(GUARD, nodes.get("n1"))
        .await
        .expect("ends at the deadline")
        .expect_err("nothing was answered");
    assert!(timed_out(&err).is_some(), "{err:?}");
    let seen = seen.lock().expect("lock").clone();
    assert!(!seen.is_empty(), "no progress reported before the deadline");
    for (server, action, elapsed) in &seen {
        assert_eq!(server, &url);
        assert_eq!(action, "getting nodes/n1");
        assert!(*elapsed >= Duration::from_secs(1), "{elapsed:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_requests_pass_through_unchanged() {
    let api = FakeApiServer::new();
    api.put(&Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            ..Default::default()
        },
        ..Default::default()
    });
    let cancel = CancellationToken::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(api.clone().serve_http(listener, cancel.clone()));
    let reported: Arc<Mutex<usize>> = Arc::default();
    let count = reported.clone();
    let options = ClientOptions {
        request_timeout: Some(Duration::from_secs(30)),
        progress: Some(Progress::new(
            Duration::from_secs(20),
            move |_: &Waiting<'_>| *count.lock().expect("lock") += 1,
        )),
    };
    let nodes: Api<Node> = Api::all(client(&url, &options));
    let n = nodes.get("n1").await.expect("answered");
    assert_eq!(n.metadata.name.as_deref(), Some("n1"));
    let list = nodes.list(&Default::default()).await.expect("listed");
    assert_eq!(list.items.len(), 1);
    let missing = nodes.get("n2").await.expect_err("not there");
    assert!(
        matches!(&missing, kube::Error::Api(s) if s.code == 404),
        "an API error stays an API error: {missing:?}"
    );
    assert_eq!(*reported.lock().expect("lock"), 0, "nothing was slow");
    cancel.cancel();
}
