//! A TCP relay on 127.0.0.1 that can hold every byte it carries (`make chaos`'s stalled agent
//! path): while stalled it reads at most one buffer from each side and writes nothing on, so
//! the peers' connections stay open and their writes back up, as behind a black-holed link; once
//! healed it carries on where it stopped. Hand-made because relays from crates (tokio's
//! `copy_bidirectional`, proxies) have no switch that holds the bytes in flight.

use std::net::SocketAddr;

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running relay to one target.
pub struct StallProxy {
    /// Where it listens (127.0.0.1).
    pub address: SocketAddr,
    stalled: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl StallProxy {
    /// Relays connections made to a new port on 127.0.0.1 to `target`.
    pub async fn start(target: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (stalled, watched) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let watched = watched.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else { return };
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    tokio::join!(pump(in_read, out_write, watched.clone()), pump(out_read, in_write, watched));
                });
            }
        });
        Ok(Self { address, stalled, task })
    }

    /// Holds every byte from now on, in both directions, on every connection.
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// Carries the bytes on again.
    pub fn heal(&self) {
        self.stalled.send_replace(false);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, holding each buffer while the relay is stalled.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut stalled: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if stalled.wait_for(|s| !*s).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        if stalled.wait_for(|s| !*s).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
