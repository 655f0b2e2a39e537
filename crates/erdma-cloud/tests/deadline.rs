//! Deadlines of the ECS client (issue 30, item 3): an endpoint that accepts and never answers, or
//! never completes the connection, fails each attempt at its deadline, is retried per the
//! `RetryPolicy`, and ends in an error naming the action and the deadline; a hang on one attempt
//! does not keep the next from answering. `GUARD` only keeps a regression from hanging the test
//! run; nothing here measures how fast anything is.

use erdma_cloud::emulator::{EcsEmulator, EmuInstance, EmuInstanceType};
use erdma_cloud::http::{HttpError, Timeouts};
use erdma_cloud::{
    CredentialProvider, CredentialSource, Credentials, EcsClient, EcsConfig, EcsError, RetryPolicy,
    SignatureVersion,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// Far beyond every deadline below (3 attempts of 1 s, and their backoff).
const GUARD: Duration = Duration::from_secs(90);

const FAST: RetryPolicy = RetryPolicy {
    max_attempts: 3,
    base: Duration::from_millis(1),
    max: Duration::from_millis(5),
};

const SHORT: Timeouts = Timeouts {
    connect: Some(Duration::from_secs(1)),
    read: Some(Duration::from_secs(1)),
};

fn ecs(endpoint: &str) -> EcsClient {
    EcsClient::new(
        EcsConfig {
            endpoint: endpoint.to_string(),
            region: "emu-region".into(),
            signature: SignatureVersion::V3,
            retry: FAST,
        },
        Arc::new(CredentialProvider::new(CredentialSource::AccessKey(
            Credentials::access_key("AKID", "s3cr3t"),
        ))),
    )
    .expect("client")
}

/// Accepts connections and holds them without a byte of answer; counts them.
async fn silent() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(s);
        }
    });
    (format!("http://{addr}"), accepted)
}

#[test]
fn the_defaults_are_the_alibaba_cloud_sdks() {
    let t = Timeouts::default();
    assert_eq!(t.connect, Some(Duration::from_secs(5)));
    assert_eq!(t.read, Some(Duration::from_secs(10)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_endpoint_fails_each_attempt_at_the_read_timeout_naming_action_and_deadline() {
    let (endpoint, accepted) = silent().await;
    let c = ecs(&endpoint).with_timeouts(SHORT);
    assert_eq!(c.timeouts(), SHORT);
    let err = tokio::time::timeout(GUARD, c.describe_instances_by_id(&["i-one"]))
        .await
        .expect("the call ends instead of hanging")
        .expect_err("nothing was answered");
    match &err {
        EcsError::Transport {
            action,
            source: HttpError::Timeout(after),
            attempts,
            ..
        } => {
            assert_eq!(action, "DescribeInstances");
            assert_eq!(*after, Duration::from_secs(1));
            assert_eq!(*attempts, 3, "every attempt of the retry policy was made");
        }
        other => panic!("expected a read timeout, got {other:?}"),
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        3,
        "one connection per attempt"
    );
    assert!(err.is_retryable(), "a reconcile retries it later");
    let msg = err.to_string();
    for part in [
        "ECS DescribeInstances",
        "no answer within 1s",
        "3 attempt(s)",
        "ecsReadTimeoutSeconds",
        &endpoint,
    ] {
        assert!(msg.contains(part), "{part:?} missing: {msg}");
    }
}

/// A listener whose accept queue is full: further connections never complete (the kernel drops
/// their SYNs), as a firewalled endpoint.
async fn unconnectable() -> (String, Vec<TcpStream>, TcpListener) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let listener = socket.listen(0).expect("listen");
    let addr = listener.local_addr().expect("addr");
    let mut queued = Vec::new();
    for _ in 0..4 {
        match tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await {
            Ok(Ok(s)) => queued.push(s),
            _ => break,
        }
    }
    (format!("http://{addr}"), queued, listener)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_never_completes_the_connection_fails_at_the_connect_timeout() {
    let (endpoint, _queued, _listener) = unconnectable().await;
    let c = ecs(&endpoint).with_timeouts(Timeouts {
        connect: Some(Duration::from_secs(1)),
        read: Some(Duration::from_secs(30)),
    });
    let err = tokio::time::timeout(GUARD, c.describe_instance_type("ecs.g8ae.4xlarge"))
        .await
        .expect("the call ends instead of hanging")
        .expect_err("never connected");
    assert!(
        matches!(
            &err,
            EcsError::Transport {
                source: HttpError::ConnectTimeout(t),
                attempts: 3,
                ..
            } if *t == Duration::from_secs(1)
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("ECS DescribeInstanceTypes") && msg.contains("could not connect within 1s"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_attempt_is_retried_and_the_next_one_answers() {
    let emu = EcsEmulator::start().await.expect("emulator");
    {
        let mut st = emu.state();
        st.add_key("AKID", "s3cr3t");
        st.add_type(EmuInstanceType {
            id: "ecs.g8ae.4xlarge".into(),
            eri_quantity: Some(1),
            network_cards: 1,
            queue_pairs: 8,
            gpus: 0,
        });
        st.add_instance(EmuInstance {
            id: "i-one".into(),
            instance_type: "ecs.g8ae.4xlarge".into(),
            private_ip: "10.0.0.5".into(),
            vswitch_id: "vsw-1".into(),
            security_groups: vec!["sg-1".into()],
            jumbo_frame: Some(true),
        });
    }
    let upstream = emu
        .endpoint()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    // The first connection is held silent; later ones are passed to the emulator.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = listener.accept().await {
            if count.fetch_add(1, Ordering::SeqCst) == 0 {
                held.push(s);
                continue;
            }
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut u) = TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut s, &mut u).await;
                }
            });
        }
    });
    let c = ecs(&endpoint).with_timeouts(SHORT);
    let found = tokio::time::timeout(GUARD, c.describe_instances_by_id(&["i-one"]))
        .await
        .expect("the call ends instead of hanging")
        .expect("the second attempt answers");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].instance_id, "i-one");
    assert!(
        accepted.load(Ordering::SeqCst) >= 2,
        "the hung attempt was retried"
    );
}
