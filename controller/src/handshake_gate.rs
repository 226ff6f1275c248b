//! The door of a TLS port (the reports server's, the webhook's): connections that never
//! authenticate cannot starve the ones that do.
//!
//! - A connection waits at most [`SILENT_AFTER`] for its whole first TLS record (the
//!   ClientHello) before it is given a handshake: a TLS client sends its ClientHello as soon as
//!   it connects, so a peer that says nothing, or sends a few bytes of a record and stalls, is
//!   dropped before it can hold a handshake slot, and an agent whose hello is there is never
//!   queued behind it. (Bytes are peeked, not read: the TLS acceptor reads them after.)
//! - One source address holds at most [`PENDING_PER_SOURCE`] connections that have not finished
//!   their handshake; past that, its new connections are closed at once.
//! - Connections and drops are counted by port and reason (`sked_tls_connections_total`,
//!   `sked_tls_connections_dropped_total`), and drops are logged once per [`LOG_EVERY`], with
//!   the address that sent the most, not once per connection.
//!
//! Hand-made: the limiters at hand (tower's, tokio's semaphores) bound requests or tasks in
//! total; none bounds connections per peer address before their TLS handshake.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::net::TcpStream;
use tracing::warn;

use crate::metrics::Metrics;
use crate::mutex::lock;

/// How long a connection may take to send its whole first TLS record.
pub const SILENT_AFTER: Duration = Duration::from_secs(1);
/// How long the rest of a handshake may take once the ClientHello is in: one round trip.
pub const HANDSHAKE_AFTER_HELLO: Duration = Duration::from_secs(3);
/// Most bytes of a first TLS record looked at: its 5-byte header and at most 2^14 bytes.
const MAX_RECORD: usize = 5 + (1 << 14);
/// A TLS record of the handshake protocol (a ClientHello comes in one).
const HANDSHAKE_RECORD: u8 = 0x16;
/// Connections one source address may have before their handshake is done.
pub const PENDING_PER_SOURCE: usize = 64;
/// Drops are logged at most this often.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Why a connection was closed before it was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dropped {
    /// Its source address had [`PENDING_PER_SOURCE`] connections waiting already.
    SourceLimit,
    /// It sent nothing within [`SILENT_AFTER`].
    Silent,
    /// It sent part of its first TLS record, not all of it, within [`SILENT_AFTER`].
    IncompleteHello,
    /// Its TLS handshake failed (not TLS, a certificate or protocol it does not take).
    HandshakeFailed,
    /// Its TLS handshake did not finish in time.
    HandshakeTimeout,
}

impl Dropped {
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::SourceLimit => "source_limit",
            Dropped::Silent => "silent",
            Dropped::IncompleteHello => "incomplete_hello",
            Dropped::HandshakeFailed => "handshake_failed",
            Dropped::HandshakeTimeout => "handshake_timeout",
        }
    }
}

/// The door of one port.
pub struct HandshakeGate {
    /// The port's name in metrics and logs: `reports`, `webhook`.
    port: &'static str,
    /// Connections without a finished handshake, by source address.
    pending: Mutex<HashMap<IpAddr, usize>>,
    /// Drops since the last log line.
    unlogged: Mutex<Unlogged>,
    metrics: Arc<Metrics>,
}

struct Unlogged {
    since: Instant,
    by_reason: HashMap<Dropped, u64>,
    by_source: HashMap<IpAddr, u64>,
}

/// A connection's place among its source's pending ones, given back when it is dropped (once
/// the handshake is done, or failed).
pub struct Pending {
    gate: Arc<HandshakeGate>,
    source: IpAddr,
}

impl Pending {
    /// The connection's source address.
    pub fn source(&self) -> IpAddr {
        self.source
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut pending = lock(&self.gate.pending);
        if let Some(n) = pending.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                pending.remove(&self.source);
            }
        }
    }
}

impl HandshakeGate {
    pub fn new(port: &'static str, metrics: Arc<Metrics>) -> Arc<Self> {
        // Backdated, so the first drop is logged at once.
        let since = Instant::now().checked_sub(LOG_EVERY).unwrap_or_else(Instant::now);
        Arc::new(Self {
            port,
            pending: Mutex::default(),
            unlogged: Mutex::new(Unlogged { since, by_reason: HashMap::new(), by_source: HashMap::new() }),
            metrics,
        })
    }

    /// Lets `tcp` on to its handshake: a place among its source's pending connections, and its
    /// whole first TLS record within [`SILENT_AFTER`]. Keep the returned place until the
    /// handshake is done.
    pub async fn admit(self: &Arc<Self>, tcp: &TcpStream) -> Result<Pending, Dropped> {
        self.metrics.tls_connection(self.port);
        let source = tcp.peer_addr().map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip());
        let place = {
            let mut pending = lock(&self.pending);
            let n = pending.entry(source).or_default();
            if *n >= PENDING_PER_SOURCE {
                drop(pending);
                return Err(self.dropped(Dropped::SourceLimit, source));
            }
            *n += 1;
            Pending { gate: self.clone(), source }
        };
        let mut buf = vec![0u8; MAX_RECORD];
        let mut seen = 0;
        match tokio::time::timeout(SILENT_AFTER, whole_first_record(tcp, &mut buf, &mut seen)).await {
            Ok(Ok(true)) => Ok(place),
            // Closed before a word, or a socket error: nothing to count but the connection.
            Ok(_) => Err(Dropped::HandshakeFailed),
            Err(_) if seen == 0 => Err(self.dropped(Dropped::Silent, place.source)),
            Err(_) => Err(self.dropped(Dropped::IncompleteHello, place.source)),
        }
    }

    /// Counts a connection dropped for `why`, and logs the drops once per [`LOG_EVERY`].
    pub fn dropped(&self, why: Dropped, source: IpAddr) -> Dropped {
        self.metrics.tls_connection_dropped(self.port, why.as_str());
        let mut unlogged = lock(&self.unlogged);
        *unlogged.by_reason.entry(why).or_default() += 1;
        *unlogged.by_source.entry(source).or_default() += 1;
        if unlogged.since.elapsed() >= LOG_EVERY {
            let mut reasons: Vec<String> =
                unlogged.by_reason.iter().map(|(why, n)| format!("{n} {}", why.as_str())).collect();
            reasons.sort();
            let (top, top_count) =
                unlogged.by_source.iter().max_by_key(|(_, n)| **n).map_or((source, 0), |(a, n)| (*a, *n));
            let total: u64 = unlogged.by_reason.values().sum();
            warn!(
                port = self.port,
                dropped = total,
                reasons = %reasons.join(", "),
                busiest_source = %top,
                busiest_source_dropped = top_count,
                "connections closed before their TLS handshake (a peer that sent nothing, or too many waiting from one address); counted in sked_tls_connections_dropped_total"
            );
            *unlogged = Unlogged { since: Instant::now(), by_reason: HashMap::new(), by_source: HashMap::new() };
        }
        why
    }
}

/// Waits until the connection's first TLS record has arrived whole, looking at its bytes
/// without taking them (`seen`: how many have come so far). `Ok(false)`: the peer closed first.
async fn whole_first_record(tcp: &TcpStream, buf: &mut [u8], seen: &mut usize) -> std::io::Result<bool> {
    loop {
        let ready = tcp.ready(tokio::io::Interest::READABLE).await?;
        // A look that finds the record incomplete says WouldBlock, so tokio waits for more bytes
        // instead of the loop spinning on the ones already there.
        match tcp.try_io(tokio::io::Interest::READABLE, || first_record_arrived(tcp, buf, seen)) {
            Ok(arrived) => return Ok(arrived),
            // Closed with the record incomplete: it never will be (and a closed socket stays
            // readable, so waiting again would spin).
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && ready.is_read_closed() => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

/// One look at what the peer sent so far: `Ok(true)` once its first record is whole (or is no
/// TLS handshake record at all: the TLS acceptor refuses that at once), `Ok(false)` when it
/// closed, `WouldBlock` while the record is not whole yet.
///
/// Peeked with rustix's safe `recv`: tokio's own `peek` waits for bytes, not for more bytes.
fn first_record_arrived(tcp: &TcpStream, buf: &mut [u8], seen: &mut usize) -> std::io::Result<bool> {
    let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
    // (the bytes copied, and the bytes that were there: the same, for a stream socket)
    let (n, _) = rustix::net::recv(tcp, &mut *buf, flags)?;
    *seen = n;
    let whole = match buf.get(..n) {
        None | Some([]) => return Ok(false),
        Some([HANDSHAKE_RECORD, _, _, high, low, ..]) => n >= 5 + usize::from(u16::from_be_bytes([*high, *low])),
        Some([HANDSHAKE_RECORD, ..]) => false,
        Some(_) => true,
    };
    if whole || n == buf.len() { Ok(true) } else { Err(std::io::ErrorKind::WouldBlock.into()) }
}

/// An axum-server acceptor that sends each connection through a [`HandshakeGate`] before the
/// TLS acceptor it wraps.
#[derive(Clone)]
pub struct GatedAcceptor<A> {
    inner: A,
    gate: Arc<HandshakeGate>,
}

impl<A> GatedAcceptor<A> {
    pub fn new(inner: A, gate: Arc<HandshakeGate>) -> Self {
        Self { inner, gate }
    }
}

impl<A, S> axum_server::accept::Accept<TcpStream, S> for GatedAcceptor<A>
where
    A: axum_server::accept::Accept<TcpStream, S> + Clone + Send + Sync + 'static,
    A::Future: Send + 'static,
    S: Send + 'static,
{
    type Stream = A::Stream;
    type Service = A::Service;
    type Future = BoxFuture<'static, std::io::Result<(A::Stream, A::Service)>>;

    fn accept(&self, tcp: TcpStream, service: S) -> Self::Future {
        let (inner, gate) = (self.inner.clone(), self.gate.clone());
        Box::pin(async move {
            let place = gate.admit(&tcp).await.map_err(|why| std::io::Error::other(why.as_str()))?;
            let accepted = inner.accept(tcp, service).await;
            if let Err(e) = &accepted {
                let why = if e.kind() == std::io::ErrorKind::TimedOut {
                    Dropped::HandshakeTimeout
                } else {
                    Dropped::HandshakeFailed
                };
                gate.dropped(why, place.source());
            }
            accepted
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pair(listener: &tokio::net::TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    #[tokio::test]
    async fn a_silent_peer_is_dropped_and_one_that_speaks_is_let_on() {
        let gate = HandshakeGate::new("test", Arc::new(Metrics::new(Arc::default())));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (_silent, accepted) = pair(&listener).await;
        assert_eq!(gate.admit(&accepted).await.err(), Some(Dropped::Silent));
        let (speaking, accepted) = pair(&listener).await;
        speaking.try_write(HELLO).unwrap();
        assert!(gate.admit(&accepted).await.is_ok());
        assert!(lock(&gate.pending).is_empty(), "the place is given back with the guard");
    }

    /// A whole (if tiny) handshake record: its header says 4 bytes, and 4 follow.
    const HELLO: &[u8] = b"\x16\x03\x01\x00\x04\x01\x00\x00\x00";

    #[tokio::test]
    async fn a_record_sent_in_part_holds_no_slot_and_one_that_arrives_in_pieces_is_let_on() {
        let gate = HandshakeGate::new("test", Arc::new(Metrics::new(Arc::default())));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        // The header of a 512-byte record, and nothing more.
        let (stalled, accepted) = pair(&listener).await;
        stalled.try_write(b"\x16\x03\x01\x02\x00").unwrap();
        assert_eq!(gate.admit(&accepted).await.err(), Some(Dropped::IncompleteHello));
        // A hello that comes in two pieces is waited for, not spun on.
        let (slow, accepted) = pair(&listener).await;
        slow.try_write(&HELLO[..3]).unwrap();
        let (admitted, ()) = tokio::join!(gate.admit(&accepted), async {
            tokio::task::yield_now().await;
            slow.try_write(&HELLO[3..]).unwrap();
        });
        assert!(admitted.is_ok());
        // Not TLS at all: let on, for the TLS acceptor to refuse at once.
        let (http, accepted) = pair(&listener).await;
        http.try_write(b"GET / HTTP/1.1\r\n").unwrap();
        assert!(gate.admit(&accepted).await.is_ok());
        // Closed before a word, or in the middle of its record: dropped at once, not spun on
        // until the silence limit.
        let (closed, accepted) = pair(&listener).await;
        drop(closed);
        assert_eq!(gate.admit(&accepted).await.err(), Some(Dropped::HandshakeFailed));
        let (closed, accepted) = pair(&listener).await;
        closed.try_write(&HELLO[..3]).unwrap();
        drop(closed);
        let started = tokio::time::Instant::now();
        assert_eq!(gate.admit(&accepted).await.err(), Some(Dropped::HandshakeFailed));
        assert!(started.elapsed() < SILENT_AFTER, "a closed peer is not waited for");
    }

    #[tokio::test]
    async fn one_source_holds_a_bounded_number_of_pending_connections() {
        let gate = HandshakeGate::new("test", Arc::new(Metrics::new(Arc::default())));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut held = Vec::new();
        for _ in 0..PENDING_PER_SOURCE {
            let (client, accepted) = pair(&listener).await;
            client.try_write(HELLO).unwrap();
            held.push((client, gate.admit(&accepted).await.unwrap()));
        }
        let (client, accepted) = pair(&listener).await;
        client.try_write(HELLO).unwrap();
        assert_eq!(gate.admit(&accepted).await.err(), Some(Dropped::SourceLimit));
        held.pop();
        assert!(gate.admit(&accepted).await.is_ok(), "a place given back is free again");
    }
}
