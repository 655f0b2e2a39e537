//! ttRPC over one logical connection: 10-byte message headers (length, stream ID, type, flags;
//! big-endian), `ttrpc.Request` / `ttrpc.Response` envelopes, unary calls only (all NRI uses).
//! Clients use odd stream IDs; a response carries its request's stream ID.

use crate::api::envelope::{Request, Response, Status};
use crate::mux::{Conn, ConnWriter, MuxError};
use prost::Message as _;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Message header length.
pub const HEADER_LEN: usize = 10;
/// Largest message body (ttRPC's limit).
pub const MAX_MESSAGE: usize = 4 << 20;
/// A request.
pub const TYPE_REQUEST: u8 = 1;
/// A response.
pub const TYPE_RESPONSE: u8 = 2;

/// gRPC status codes used here.
pub mod code {
    /// Success.
    pub const OK: i32 = 0;
    /// The call was refused or failed for a reason the message names.
    pub const UNKNOWN: i32 = 2;
    /// The callee has no such method.
    pub const UNIMPLEMENTED: i32 = 12;
    /// The callee hit an internal error.
    pub const INTERNAL: i32 = 13;
}

/// Errors of a ttRPC exchange.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The connection failed or closed.
    #[error(transparent)]
    Mux(#[from] MuxError),
    /// The connection closed before the answer.
    #[error("ttRPC connection closed")]
    Closed,
    /// A malformed message.
    #[error("ttRPC protocol error: {0}")]
    Protocol(String),
    /// The peer answered with a non-OK status.
    #[error("{service}/{method} failed (code {code}): {message}")]
    Status {
        /// Service called.
        service: String,
        /// Method called.
        method: String,
        /// gRPC status code.
        code: i32,
        /// The peer's message.
        message: String,
    },
    /// The request is larger than a ttRPC message may be; nothing was sent (ttRPC's client refuses
    /// it the same way, with ResourceExhausted, which is how a runtime learns to split Synchronize).
    #[error(
        "{service}/{method}: message length {length} exceeds the maximum message size of {max}"
    )]
    Oversized {
        /// Service called.
        service: String,
        /// Method called.
        method: String,
        /// The request envelope's length.
        length: usize,
        /// The limit ([`MAX_MESSAGE`]).
        max: usize,
    },
    /// No answer in time.
    #[error("{service}/{method}: no answer within {timeout:?}")]
    Timeout {
        /// Service called.
        service: String,
        /// Method called.
        method: String,
        /// The limit.
        timeout: Duration,
    },
}

/// One ttRPC message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Stream ID.
    pub stream: u32,
    /// Type ([`TYPE_REQUEST`], [`TYPE_RESPONSE`], ...).
    pub kind: u8,
    /// Flags.
    pub flags: u8,
    /// Body.
    pub body: Vec<u8>,
}

impl Message {
    /// Header and body, as written on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.body.len());
        out.extend_from_slice(&(self.body.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.stream.to_be_bytes());
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&self.body);
        out
    }
}

/// Reassembles messages from a connection's byte chunks (frames need not align with messages).
pub struct MessageReader {
    incoming: mpsc::UnboundedReceiver<Vec<u8>>,
    buf: Vec<u8>,
}

impl MessageReader {
    /// Reads from a connection's incoming chunks.
    pub fn new(incoming: mpsc::UnboundedReceiver<Vec<u8>>) -> Self {
        MessageReader {
            incoming,
            buf: Vec::new(),
        }
    }

    /// The next message; `Ok(None)` when the connection closed between messages.
    pub async fn next(&mut self) -> Result<Option<Message>, RpcError> {
        loop {
            if let Some(m) = self.take()? {
                return Ok(Some(m));
            }
            match self.incoming.recv().await {
                Some(chunk) => self.buf.extend_from_slice(&chunk),
                None if self.buf.is_empty() => return Ok(None),
                None => {
                    return Err(RpcError::Protocol(
                        "connection closed inside a message".into(),
                    ));
                }
            }
        }
    }

    fn take(&mut self) -> Result<Option<Message>, RpcError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let b = &self.buf;
        let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if len > MAX_MESSAGE {
            return Err(RpcError::Protocol(format!(
                "message of {len} bytes exceeds the {MAX_MESSAGE}-byte limit"
            )));
        }
        if b.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let m = Message {
            stream: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            kind: b[8],
            flags: b[9],
            body: b[HEADER_LEN..HEADER_LEN + len].to_vec(),
        };
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some(m))
    }
}

/// A boxed future, for object-safe services.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a server answers: the response body, or a status code and message.
pub type Answer = Result<Vec<u8>, (i32, String)>;

/// A ttRPC service: `call(service, method, request body)`.
pub trait Service: Send + Sync + 'static {
    /// Handles one call.
    fn call<'a>(
        &'a self,
        service: &'a str,
        method: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, Answer>;
}

/// Serves `service` on `conn` until the connection closes. Each request runs in its own task, so
/// a slow call does not hold up the others.
pub async fn serve(conn: Conn, service: Arc<dyn Service>) -> Result<(), RpcError> {
    let Conn { writer, incoming } = conn;
    let mut reader = MessageReader::new(incoming);
    let mut calls = tokio::task::JoinSet::new();
    while let Some(m) = reader.next().await? {
        if m.kind != TYPE_REQUEST {
            tracing::debug!(
                kind = m.kind,
                stream = m.stream,
                "ttRPC: ignoring a non-request message"
            );
            continue;
        }
        let req = Request::decode(m.body.as_slice())
            .map_err(|e| RpcError::Protocol(format!("bad request envelope: {e}")))?;
        let (svc, w, stream) = (service.clone(), writer.clone(), m.stream);
        calls.spawn(async move {
            let answer = svc.call(&req.service, &req.method, req.payload).await;
            let resp = match answer {
                Ok(payload) => Response {
                    status: Some(Status {
                        code: code::OK,
                        message: String::new(),
                    }),
                    payload,
                },
                Err((code, message)) => Response {
                    status: Some(Status { code, message }),
                    payload: Vec::new(),
                },
            };
            let msg = Message {
                stream,
                kind: TYPE_RESPONSE,
                flags: 0,
                body: resp.encode_to_vec(),
            };
            if let Err(e) = w.send(&msg.encode()).await {
                tracing::debug!("ttRPC: cannot answer {}/{}: {e}", req.service, req.method);
            }
        });
        while calls.try_join_next().is_some() {}
    }
    calls.shutdown().await;
    Ok(())
}

type Pending = Arc<Mutex<HashMap<u32, oneshot::Sender<Response>>>>;

/// A ttRPC client on one connection.
#[derive(Clone)]
pub struct Client {
    writer: ConnWriter,
    next: Arc<AtomicU32>,
    pending: Pending,
}

impl Client {
    /// A client on `conn`; the returned task reads the responses and ends with the connection.
    pub fn new(conn: Conn) -> (Client, JoinHandle<()>) {
        let Conn { writer, incoming } = conn;
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let p = pending.clone();
        let task = tokio::spawn(async move {
            let mut reader = MessageReader::new(incoming);
            while let Ok(Some(m)) = reader.next().await {
                if m.kind != TYPE_RESPONSE {
                    continue;
                }
                let Ok(resp) = Response::decode(m.body.as_slice()) else {
                    tracing::debug!(stream = m.stream, "ttRPC: undecodable response dropped");
                    continue;
                };
                let waiter = p
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&m.stream);
                if let Some(tx) = waiter {
                    let _ = tx.send(resp);
                }
            }
            // Wake every caller: the connection is gone.
            p.lock().unwrap_or_else(|e| e.into_inner()).clear();
        });
        (
            Client {
                writer,
                next: Arc::new(AtomicU32::new(1)),
                pending,
            },
            task,
        )
    }

    /// One unary call with a deadline (also sent to the peer as `timeout_nano`).
    pub async fn call(
        &self,
        service: &str,
        method: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, RpcError> {
        let req = Request {
            service: service.into(),
            method: method.into(),
            payload: body,
            timeout_nano: i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX),
            metadata: Vec::new(),
        }
        .encode_to_vec();
        if req.len() > MAX_MESSAGE {
            return Err(RpcError::Oversized {
                service: service.into(),
                method: method.into(),
                length: req.len(),
                max: MAX_MESSAGE,
            });
        }
        let stream = self.next.fetch_add(2, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(stream, tx);
        let msg = Message {
            stream,
            kind: TYPE_REQUEST,
            flags: 0,
            body: req,
        };
        let sent = self.writer.send(&msg.encode()).await;
        let result = match sent {
            Err(e) => Err(RpcError::Mux(e)),
            Ok(()) => match tokio::time::timeout(timeout, rx).await {
                Err(_) => Err(RpcError::Timeout {
                    service: service.into(),
                    method: method.into(),
                    timeout,
                }),
                Ok(Err(_)) => Err(RpcError::Closed),
                Ok(Ok(resp)) => match resp.status {
                    Some(s) if s.code != code::OK => Err(RpcError::Status {
                        service: service.into(),
                        method: method.into(),
                        code: s.code,
                        message: s.message,
                    }),
                    _ => Ok(resp.payload),
                },
            },
        };
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&stream);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mux::Mux;

    struct Echo;
    impl Service for Echo {
        fn call<'a>(
            &'a self,
            service: &'a str,
            method: &'a str,
            body: Vec<u8>,
        ) -> BoxFuture<'a, Answer> {
            Box::pin(async move {
                match method {
                    "Echo" => Ok(body),
                    "Slow" => {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        Ok(body)
                    }
                    m => Err((
                        code::UNIMPLEMENTED,
                        format!("{service}/{m} is not implemented"),
                    )),
                }
            })
        }
    }

    fn pair() -> (Client, JoinHandle<Result<(), RpcError>>) {
        let (a, b) = tokio::io::duplex(16);
        let mut client_side = Mux::new(a);
        let c = client_side.open(1);
        client_side.start();
        let mut server_side = Mux::new(b);
        let s = server_side.open(1);
        server_side.start();
        let server = tokio::spawn(serve(s, Arc::new(Echo)));
        let (client, _t) = Client::new(c);
        (client, server)
    }

    #[tokio::test]
    async fn unary_calls_statuses_and_deadlines() {
        let (client, _server) = pair();
        let t = Duration::from_secs(10);
        let big = vec![42u8; 100_000];
        assert_eq!(client.call("s", "Echo", big.clone(), t).await.unwrap(), big);
        let err = client.call("s", "Nope", vec![], t).await.unwrap_err();
        assert!(
            matches!(&err, RpcError::Status { code: code::UNIMPLEMENTED, message, .. } if message == "s/Nope is not implemented"),
            "{err}"
        );
        let err = client
            .call("s", "Slow", vec![], Duration::from_millis(1))
            .await
            .unwrap_err();
        assert!(matches!(err, RpcError::Timeout { .. }), "{err}");
        let err = client
            .call("s", "Echo", vec![0u8; MAX_MESSAGE], t)
            .await
            .unwrap_err();
        assert!(
            matches!(err, RpcError::Oversized { length, max: MAX_MESSAGE, .. } if length > MAX_MESSAGE),
            "{err}"
        );
        // The connection still works after a timed-out and a refused call.
        assert_eq!(
            client.call("s", "Echo", b"x".to_vec(), t).await.unwrap(),
            b"x"
        );
    }

    #[tokio::test]
    async fn messages_split_across_frames_are_reassembled() {
        let (tx, rx) = mpsc::unbounded_channel();
        let m = Message {
            stream: 3,
            kind: TYPE_REQUEST,
            flags: 0,
            body: b"hello".to_vec(),
        };
        let wire = [m.encode(), m.encode()].concat();
        for chunk in wire.chunks(4) {
            tx.send(chunk.to_vec()).unwrap();
        }
        drop(tx);
        let mut r = MessageReader::new(rx);
        assert_eq!(r.next().await.unwrap(), Some(m.clone()));
        assert_eq!(r.next().await.unwrap(), Some(m));
        assert_eq!(r.next().await.unwrap(), None);
        assert_eq!(
            Message {
                stream: 1,
                kind: 2,
                flags: 4,
                body: vec![9]
            }
            .encode(),
            vec![0, 0, 0, 1, 0, 0, 0, 1, 2, 4, 9]
        );
    }
}
