//! Report connections, bounded: at most so many at once (a connection past the limit waits in
//! the listen queue), and one that carries no report stream for a while is closed. An agent
//! opens its stream right after its TLS handshake and holds it; a connection that does not is
//! nothing the server should keep paying for (each costs tens of KiB of TLS and HTTP/2 state).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

use crate::mutex::lock;

/// What a report stream knows of the connection it came on (a request extension).
#[derive(Clone, Default)]
pub(crate) struct Connection(Arc<Shared>);

#[derive(Default)]
struct Shared {
    streams: AtomicUsize,
    /// When the last stream ended (`None`: none has yet, the connection's start counts).
    idle_since: std::sync::Mutex<Option<Instant>>,
    /// The connection's reader, woken when its last stream ends so its idle timer starts.
    reader: AtomicWaker,
}

impl Connection {
    /// Counts a stream on this connection for as long as the returned value lives.
    pub(crate) fn stream(&self) -> OpenStream {
        self.0.streams.fetch_add(1, Ordering::AcqRel);
        OpenStream(self.clone())
    }
}

/// One stream open on a [`Connection`].
pub(crate) struct OpenStream(Connection);

impl Drop for OpenStream {
    fn drop(&mut self) {
        let shared = &(self.0).0;
        *lock(&shared.idle_since) = Some(Instant::now());
        if shared.streams.fetch_sub(1, Ordering::AcqRel) == 1 {
            shared.reader.wake();
        }
    }
}

/// A connection's transport, closed by its reader once it has carried no stream for
/// `idle_after`; it holds its place among the server's connections until dropped.
pub(crate) struct Guarded<IO> {
    io: IO,
    connection: Connection,
    idle_after: Duration,
    opened: Instant,
    timer: Pin<Box<Sleep>>,
    _place: OwnedSemaphorePermit,
}

impl<IO> Guarded<IO> {
    pub(crate) fn new(io: IO, idle_after: Duration, place: OwnedSemaphorePermit) -> Self {
        let opened = Instant::now();
        Self {
            io,
            connection: Connection::default(),
            idle_after,
            opened,
            timer: Box::pin(tokio::time::sleep_until(opened + idle_after)),
            _place: place,
        }
    }

    /// Whether the connection has been without a stream for too long; otherwise arms the timer
    /// that wakes `cx` when it will have been.
    fn idle_too_long(&mut self, cx: &mut Context<'_>) -> bool {
        let shared = &self.connection.0;
        shared.reader.register(cx.waker());
        if shared.streams.load(Ordering::Acquire) > 0 {
            return false;
        }
        let since = lock(&shared.idle_since).unwrap_or(self.opened);
        let deadline = since + self.idle_after;
        if self.timer.deadline() != deadline {
            self.timer.as_mut().reset(deadline);
        }
        self.timer.as_mut().poll(cx).is_ready()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.idle_too_long(cx) {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "no report stream on this connection")));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO> Connected for Guarded<IO> {
    type ConnectInfo = Connection;

    fn connect_info(&self) -> Connection {
        self.connection.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn place() -> OwnedSemaphorePermit {
        let places = Arc::new(tokio::sync::Semaphore::new(1));
        match places.try_acquire_owned() {
            Ok(p) => p,
            Err(e) => panic!("a fresh semaphore has a place: {e}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_a_stream_is_closed_after_the_idle_limit() {
        let (near, _far) = tokio::io::duplex(64);
        let mut guarded = Guarded::new(near, Duration::from_secs(30), place());
        let mut byte = [0u8; 1];
        let err = guarded.read(&mut byte).await.err().map(|e| e.kind());
        assert_eq!(err, Some(io::ErrorKind::TimedOut));
        assert!(Instant::now() >= guarded.opened + Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_keeps_its_connection_and_its_end_starts_the_idle_limit() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut guarded = Guarded::new(near, Duration::from_secs(30), place());
        let stream = guarded.connection.stream();
        let opened = guarded.opened;
        // Past the limit with a stream open: still reading.
        tokio::time::sleep(Duration::from_secs(60)).await;
        tokio::io::AsyncWriteExt::write_all(&mut far, b"x").await.ok();
        let mut byte = [0u8; 1];
        assert!(guarded.read(&mut byte).await.is_ok());
        // The stream ends while the reader waits: the reader wakes, and 30 s later it is closed.
        let ended = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(stream);
            Instant::now()
        });
        let err = guarded.read(&mut byte).await.err().map(|e| e.kind());
        assert_eq!(err, Some(io::ErrorKind::TimedOut));
        let ended = ended.await.unwrap_or(opened);
        assert!(Instant::now() >= ended + Duration::from_secs(30), "counted from the stream's end");
    }
}
