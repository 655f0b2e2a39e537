//! NRI's connection multiplexer: several logical byte streams over one socket. Every write is one
//! frame, an 8-byte header (connection ID, payload length; both big-endian `u32`) and the payload;
//! the reader hands each frame's payload to its connection in order. Opening a connection is local:
//! both ends simply agree on the IDs ([`PLUGIN_SERVICE_CONN`], [`RUNTIME_SERVICE_CONN`]).

use std::collections::HashMap;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinHandle;

/// A logical connection's ID.
pub type ConnId = u32;
/// The connection on which the plugin serves and the runtime calls.
pub const PLUGIN_SERVICE_CONN: ConnId = 1;
/// The connection on which the runtime serves and the plugin calls.
pub const RUNTIME_SERVICE_CONN: ConnId = 2;
/// Frame header length.
pub const HEADER_LEN: usize = 8;
/// Largest frame payload accepted (a ttRPC message is at most 4 MiB plus its header).
pub const MAX_FRAME: usize = (4 << 20) + 64;

/// Errors of the multiplexer.
#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    /// The trunk failed or closed.
    #[error("NRI connection: {0}")]
    Io(#[from] std::io::Error),
    /// A frame larger than [`MAX_FRAME`].
    #[error("NRI connection: frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    FrameTooLarge(usize),
}

type Writer = Arc<Mutex<Box<dyn AsyncWrite + Send + Unpin>>>;

/// Writes frames of one logical connection.
#[derive(Clone)]
pub struct ConnWriter {
    id: ConnId,
    writer: Writer,
}

impl ConnWriter {
    /// Sends `data` as one frame.
    pub async fn send(&self, data: &[u8]) -> Result<(), MuxError> {
        if data.len() > MAX_FRAME {
            return Err(MuxError::FrameTooLarge(data.len()));
        }
        let mut frame = Vec::with_capacity(HEADER_LEN + data.len());
        frame.extend_from_slice(&self.id.to_be_bytes());
        frame.extend_from_slice(&(data.len() as u32).to_be_bytes());
        frame.extend_from_slice(data);
        let mut w = self.writer.lock().await;
        w.write_all(&frame).await?;
        w.flush().await?;
        Ok(())
    }
}

/// One logical connection: its writer and the payloads that arrive for it.
pub struct Conn {
    /// Sends on this connection.
    pub writer: ConnWriter,
    /// Payloads received on this connection, in order; `None` once the trunk is gone.
    pub incoming: mpsc::UnboundedReceiver<Vec<u8>>,
}

/// A multiplexed trunk, split into the logical connections opened before [`Mux::start`].
pub struct Mux {
    reader: Option<Box<dyn AsyncRead + Send + Unpin>>,
    writer: Writer,
    routes: HashMap<ConnId, mpsc::UnboundedSender<Vec<u8>>>,
}

impl Mux {
    /// Multiplexes `trunk` (a Unix stream in production, an in-memory pipe in tests).
    pub fn new<S>(trunk: S) -> Self
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (r, w) = tokio::io::split(trunk);
        Mux {
            reader: Some(Box::new(r)),
            writer: Arc::new(Mutex::new(Box::new(w))),
            routes: HashMap::new(),
        }
    }

    /// Opens logical connection `id`.
    pub fn open(&mut self, id: ConnId) -> Conn {
        let (tx, rx) = mpsc::unbounded_channel();
        self.routes.insert(id, tx);
        Conn {
            writer: ConnWriter {
                id,
                writer: self.writer.clone(),
            },
            incoming: rx,
        }
    }

    /// Starts demultiplexing. The task ends when the trunk closes or fails (every connection's
    /// `incoming` then ends); frames for connections nobody opened are dropped.
    pub fn start(mut self) -> JoinHandle<Result<(), MuxError>> {
        let mut reader = self.reader.take().expect("start is called once");
        let routes = std::mem::take(&mut self.routes);
        tokio::spawn(async move {
            let mut hdr = [0u8; HEADER_LEN];
            loop {
                match reader.read_exact(&mut hdr).await {
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                    Err(e) => return Err(MuxError::Io(e)),
                }
                let id = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
                let len = u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]) as usize;
                if len > MAX_FRAME {
                    return Err(MuxError::FrameTooLarge(len));
                }
                let mut payload = vec![0u8; len];
                reader.read_exact(&mut payload).await?;
                match routes.get(&id) {
                    Some(tx) => {
                        // A closed receiver means that side stopped listening; keep routing others.
                        let _ = tx.send(payload);
                    }
                    None => tracing::debug!(
                        conn = id,
                        len,
                        "NRI frame for an unopened connection dropped"
                    ),
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_reach_their_connection_in_order() {
        let (a, b) = tokio::io::duplex(64);
        let mut left = Mux::new(a);
        let l1 = left.open(1);
        let l2 = left.open(2);
        let _lt = left.start();
        let mut right = Mux::new(b);
        let mut r1 = right.open(1);
        let mut r2 = right.open(2);
        let _rt = right.start();
        l1.writer.send(b"one").await.unwrap();
        l2.writer.send(b"two").await.unwrap();
        l1.writer.send(&[7u8; 1000]).await.unwrap();
        assert_eq!(r1.incoming.recv().await.unwrap(), b"one");
        assert_eq!(r2.incoming.recv().await.unwrap(), b"two");
        assert_eq!(r1.incoming.recv().await.unwrap(), vec![7u8; 1000]);
        drop((l1, l2));
    }

    #[tokio::test]
    async fn the_wire_format_is_id_length_payload() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut m = Mux::new(a);
        let c = m.open(RUNTIME_SERVICE_CONN);
        let _t = m.start();
        c.writer.send(b"xyz").await.unwrap();
        let mut got = [0u8; 11];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [0, 0, 0, 2, 0, 0, 0, 3, b'x', b'y', b'z']);
    }

    #[tokio::test]
    async fn an_oversized_frame_ends_the_trunk_with_an_error() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut m = Mux::new(a);
        let mut c = m.open(1);
        let t = m.start();
        b.write_all(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff])
            .await
            .unwrap();
        assert!(matches!(t.await.unwrap(), Err(MuxError::FrameTooLarge(_))));
        assert!(c.incoming.recv().await.is_none());
    }
}
