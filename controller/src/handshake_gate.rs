//! The door of a TLS port (the reports server's, the webhook's): connections that never
//! authenticate cannot starve the ones that do.
//!
//! - A connection waits at most [`SILENT_AFTER`] for its first bytes before it is given a
//!   handshake: a TLS client sends its ClientHello as soon as it connects, so a peer that says
//!   nothing is dropped before it can hold a handshake slot, and an agent whose hello is there
//!   is never queued behind it.
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

/// How long a connection may stay silent before its first bytes.
pub const SILENT_AFTER: Duration = Duration::from_secs(1);
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
    /// first bytes within [`SILENT_AFTER`]. Keep the returned place until the handshake is done.
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
        let mut first = [0u8; 1];
        match tokio::time::timeout(SILENT_AFTER, tcp.peek(&mut first)).await {
            Ok(Ok(n)) if n > 0 => Ok(place),
            // Closed before a word, or a socket error: nothing to count but the connection.
            Ok(_) => Err(Dropped::HandshakeFailed),
            Err(_) => Err(self.dropped(Dropped::Silent, place.source)),
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
        speaking.try_write(b"\x16").unwrap();
        assert!(gate.admit(&accepted).await.is_ok());
        assert!(lock(&gate.pending).is_empty(), "the place is given back with the guard");
    }

    #[tokio::test]
    async fn one_source_holds_a_bounded_number_of_pending_connections() {
        let gate = HandshakeGate::new("test", Arc::new(Metrics::new(Arc::default())));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut held = Vec::new();
        for _ in 0..PENDING_PER_SOURCE {
            let (client, accepted) = pair(&listener).await;
            client.try_write(b"\x16").unwrap();
            held.push((client, gate.admit(&accepted).await.unwrap()));
        }
        let (client, accepted) = pair(&listener).await;
        client.try_write(b"\x16").unwrap();
        assert_eq!(gate.admit(&accepted).await.err(), Some(Dropped::SourceLimit));
        held.pop();
        assert!(gate.admit(&accepted).await.is_ok(), "a place given back is free again");
    }
}
