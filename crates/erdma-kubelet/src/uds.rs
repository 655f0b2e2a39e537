//! gRPC over Unix domain sockets: listening (accepting `:authority` `localhost` and socket paths),
//! and dialing (sending either).

use crate::authority::{AuthorityPolicy, AuthorityRewriter};
use erdma_host::atomic::{self, AtomicError};
use hyper_util::rt::TokioIo;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::Stream;
use tonic::transport::{Channel, Endpoint};

/// Longest path a Unix socket address can hold on Linux (`sun_path` minus the NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// Errors of the socket helpers.
#[derive(Debug, thiserror::Error)]
pub enum UdsError {
    /// The socket path is too long for `sun_path`.
    #[error(
        "socket path {path} is {len} bytes long; Unix socket paths must be at most {MAX_SOCKET_PATH} bytes (use a shorter directory)"
    )]
    PathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
    /// Something other than a socket is in the way.
    #[error(
        "{path} exists and is not a socket; refusing to replace it (remove it by hand if it is stale)"
    )]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// An I/O error on a path.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Connecting a gRPC channel failed.
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        source: tonic::transport::Error,
    },
}

impl From<AtomicError> for UdsError {
    fn from(e: AtomicError) -> Self {
        UdsError::Io {
            what: e.what,
            path: e.path,
            source: e.source,
        }
    }
}

fn check_len(path: &Path) -> Result<(), UdsError> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(UdsError::PathTooLong {
            path: path.to_path_buf(),
            len,
        });
    }
    Ok(())
}

/// True when `path` exists and is a socket.
pub fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false)
}

/// Binds a listening socket at `path` with mode 0600. A stale *socket* at the path is replaced;
/// anything else there is an error.
///
/// The socket is bound under a hidden temporary name in the same directory and renamed over
/// `path`, so the path never disappears in between: a watcher (another instance of the same
/// plugin, say) sees the socket replaced, never removed.
pub fn bind(path: &Path) -> Result<UnixListener, UdsError> {
    check_len(path)?;
    let io = |what: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source| UdsError::Io {
            what,
            path: p,
            source,
        }
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {}
        Ok(_) => return Err(UdsError::NotASocket { path: path.into() }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(UdsError::Io {
                what: "stat",
                path: path.into(),
                source,
            });
        }
    }
    let tmp = atomic::temp_sibling(path, &std::process::id().to_string());
    if tmp.as_os_str().len() > MAX_SOCKET_PATH {
        // No room for a temporary name: replace in two steps.
        if is_socket(path) {
            std::fs::remove_file(path).map_err(io("remove stale socket", path))?;
        }
        let listener = UnixListener::bind(path).map_err(io("bind", path))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(io("chmod 0600", path))?;
        return Ok(listener);
    }
    if is_socket(&tmp) {
        std::fs::remove_file(&tmp).map_err(io("remove stale socket", &tmp))?;
    }
    let listener = atomic::replace_with(path, &tmp, |tmp| {
        let listener = UnixListener::bind(tmp).map_err(AtomicError::at("bind", tmp))?;
        std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o600))
            .map_err(AtomicError::at("chmod 0600", tmp))?;
        Ok(listener)
    })?;
    Ok(listener)
}

/// Connection info of an accepted Unix-socket connection.
#[derive(Debug, Clone, Default)]
pub struct UdsConnectInfo {
    /// Peer process ID, when the kernel reports it.
    pub peer_pid: Option<i32>,
}

/// An accepted connection whose incoming bytes pass through an [`AuthorityRewriter`] that makes
/// a socket-path `:authority` acceptable to the HTTP/2 server.
pub struct ServerConn {
    inner: UnixStream,
    rewriter: AuthorityRewriter,
    raw: Box<[u8]>,
    out: Vec<u8>,
    out_at: usize,
    info: UdsConnectInfo,
}

impl ServerConn {
    /// Wraps an accepted stream.
    pub fn new(inner: UnixStream) -> Self {
        let peer_pid = inner.peer_cred().ok().and_then(|c| c.pid());
        ServerConn {
            inner,
            rewriter: AuthorityRewriter::new(AuthorityPolicy::FixInvalid),
            raw: vec![0u8; 16 * 1024].into_boxed_slice(),
            out: Vec::new(),
            out_at: 0,
            info: UdsConnectInfo { peer_pid },
        }
    }
}

impl AsyncRead for ServerConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_at < this.out.len() {
                let n = (this.out.len() - this.out_at).min(buf.remaining());
                buf.put_slice(&this.out[this.out_at..this.out_at + n]);
                this.out_at += n;
                if this.out_at == this.out.len() {
                    this.out.clear();
                    this.out_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut rb = ReadBuf::new(&mut this.raw);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            let got = rb.filled();
            if got.is_empty() {
                return Poll::Ready(Ok(()));
            }
            let got = got.to_vec();
            this.rewriter.feed(&got, &mut this.out)?;
        }
    }
}

impl AsyncWrite for ServerConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for ServerConn {
    type ConnectInfo = UdsConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

/// The stream of accepted connections of `listener`, for
/// `tonic::transport::Server::serve_with_incoming_shutdown`.
pub fn incoming(
    listener: UnixListener,
) -> impl Stream<Item = io::Result<ServerConn>> + Send + 'static {
    let listener = tokio_stream::wrappers::UnixListenerStream::new(listener);
    tokio_stream::StreamExt::map(listener, |r| r.map(ServerConn::new))
}

/// The `:authority` a client sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientAuthority {
    /// `localhost`, as current kubelets send.
    Localhost,
    /// The socket path itself, as old kubelets (grpc-go dialing a bare path) sent.
    SocketPath,
}

/// A client connection whose outgoing bytes pass through an [`AuthorityRewriter`].
pub struct ClientConn {
    inner: UnixStream,
    rewriter: AuthorityRewriter,
    out: Vec<u8>,
    out_at: usize,
}

impl ClientConn {
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.out_at < self.out.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out[self.out_at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out_at += n;
        }
        self.out.clear();
        self.out_at = 0;
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for ClientConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ClientConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        this.rewriter.feed(buf, &mut this.out)?;
        // The bytes are accepted; write as much as possible now, the rest on the next call/flush.
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// Dials a gRPC server on the Unix socket `path` (plain HTTP/2), sending `authority` as the
/// `:authority` of every request. Fails after `timeout` if the server does not answer.
pub async fn connect(
    path: &Path,
    authority: ClientAuthority,
    timeout: Duration,
) -> Result<Channel, UdsError> {
    check_len(path)?;
    let endpoint = Endpoint::from_static("http://localhost").connect_timeout(timeout);
    let socket = path.to_path_buf();
    let connector = tower::service_fn(move |_uri| {
        let socket = socket.clone();
        let authority = authority.clone();
        async move {
            let stream = UnixStream::connect(&socket).await?;
            match authority {
                ClientAuthority::Localhost => {
                    Ok::<_, io::Error>(TokioIo::new(Either::Plain(stream)))
                }
                ClientAuthority::SocketPath => {
                    let policy = AuthorityPolicy::ReplaceWith(socket.display().to_string());
                    Ok(TokioIo::new(Either::Rewriting(Box::new(ClientConn {
                        inner: stream,
                        rewriter: AuthorityRewriter::new(policy),
                        out: Vec::new(),
                        out_at: 0,
                    }))))
                }
            }
        }
    });
    tokio::time::timeout(timeout, endpoint.connect_with_connector(connector))
        .await
        .map_err(|_| UdsError::Io {
            what: "connect (timed out)",
            path: path.into(),
            source: io::ErrorKind::TimedOut.into(),
        })?
        .map_err(|source| UdsError::Connect {
            path: path.into(),
            source,
        })
}

/// A plain or rewriting client stream.
enum Either {
    Plain(UnixStream),
    Rewriting(Box<ClientConn>),
}

impl AsyncRead for Either {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Either::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Either::Rewriting(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Either {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Either::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Either::Rewriting(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Either::Plain(s) => Pin::new(s).poll_flush(cx),
            Either::Rewriting(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Either::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Either::Rewriting(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
