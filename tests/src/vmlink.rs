//! TCP connections carried over one virtio console port, between a VM and the host.
//!
//! The VM has no network. Its agent dials `127.0.0.1:<port>` inside the VM, where
//! `sked-vm-relay` accepts and forwards the bytes over a virtio serial port; qemu carries the
//! port to a Unix socket on the host, where [`serve_host_side`] opens a real TCP connection to
//! the controller for each connection of the VM. Frames keep connections apart (the agent
//! reconnects after errors): `[kind u8][connection u32][length u32][payload]`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, Result};

pub const OPEN: u8 = 1;
pub const DATA: u8 = 2;
pub const CLOSE: u8 = 3;
const HEADER: usize = 9;
const MAX_PAYLOAD: usize = 64 * 1024;

fn header(kind: u8, id: u32, len: usize) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0] = kind;
    h[1..5].copy_from_slice(&id.to_be_bytes());
    h[5..9].copy_from_slice(&(len as u32).to_be_bytes());
    h
}

fn parse_header(h: &[u8; HEADER]) -> (u8, u32, usize) {
    let id = u32::from_be_bytes([h[1], h[2], h[3], h[4]]);
    let len = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize;
    (h[0], id, len)
}

/// Writes one frame (whole, so frames of several connections never interleave).
fn write_frame(port: &Mutex<std::fs::File>, kind: u8, id: u32, payload: &[u8]) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(HEADER + payload.len());
    frame.extend_from_slice(&header(kind, id, payload.len()));
    frame.extend_from_slice(payload);
    let mut port = port.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    port.write_all(&frame)?;
    port.flush()
}

/// The VM side: accepts TCP connections on `listen` and carries them over `port_path`.
pub fn serve_guest_side(port_path: &str, listen: SocketAddr) -> Result<()> {
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(port_path)
        .with_context(|| format!("opening {port_path}"))?;
    let writer = Arc::new(Mutex::new(reader.try_clone()?));
    let conns: Arc<Mutex<HashMap<u32, TcpStream>>> = Arc::default();
    {
        let conns = conns.clone();
        std::thread::spawn(move || {
            let mut reader = reader;
            let mut h = [0u8; HEADER];
            while reader.read_exact(&mut h).is_ok() {
                let (kind, id, len) = parse_header(&h);
                let mut payload = vec![0u8; len.min(MAX_PAYLOAD)];
                if reader.read_exact(&mut payload).is_err() {
                    break;
                }
                let mut conns = conns.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                match kind {
                    DATA => {
                        if let Some(c) = conns.get_mut(&id)
                            && c.write_all(&payload).is_err()
                        {
                            conns.remove(&id);
                        }
                    }
                    CLOSE => {
                        if let Some(c) = conns.remove(&id) {
                            let _ = c.shutdown(std::net::Shutdown::Both);
                        }
                    }
                    _ => {}
                }
            }
        });
    }
    let listener = TcpListener::bind(listen).with_context(|| format!("listening on {listen}"))?;
    let mut next = 0u32;
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        next = next.wrapping_add(1);
        let id = next;
        let _ = stream.set_nodelay(true);
        conns.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id, stream.try_clone()?);
        write_frame(&writer, OPEN, id, &[])?;
        let (writer, conns) = (writer.clone(), conns.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if write_frame(&writer, DATA, id, &buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            conns.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id);
            let _ = write_frame(&writer, CLOSE, id, &[]);
        });
    }
    Ok(())
}

/// The host side: reads frames from qemu's Unix socket for the port and opens a TCP
/// connection to `target` for each connection of the VM. Runs until the socket closes.
pub async fn serve_host_side(socket: std::path::PathBuf, target: SocketAddr) -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;

    let stream = tokio::net::UnixStream::connect(&socket)
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    let (mut rx, mut tx) = stream.into_split();
    let (frames_tx, mut frames_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Some(frame) = frames_rx.recv().await {
            if tx.write_all(&frame).await.is_err() {
                break;
            }
        }
    });
    let frame = |kind, id, payload: &[u8]| {
        let mut f = header(kind, id, payload.len()).to_vec();
        f.extend_from_slice(payload);
        f
    };
    let mut conns: HashMap<u32, tokio::net::tcp::OwnedWriteHalf> = HashMap::new();
    let mut h = [0u8; HEADER];
    while rx.read_exact(&mut h).await.is_ok() {
        let (kind, id, len) = parse_header(&h);
        let mut payload = vec![0u8; len.min(MAX_PAYLOAD)];
        rx.read_exact(&mut payload).await?;
        match kind {
            OPEN => match tokio::net::TcpStream::connect(target).await {
                Ok(conn) => {
                    let _ = conn.set_nodelay(true);
                    let (mut read, write) = conn.into_split();
                    conns.insert(id, write);
                    let frames = frames_tx.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            match read.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if frames.send(frame(DATA, id, &buf[..n])).is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                        let _ = frames.send(frame(CLOSE, id, &[]));
                    });
                }
                Err(_) => {
                    let _ = frames_tx.send(frame(CLOSE, id, &[]));
                }
            },
            DATA => {
                if let Some(c) = conns.get_mut(&id)
                    && c.write_all(&payload).await.is_err()
                {
                    conns.remove(&id);
                }
            }
            CLOSE => {
                if let Some(mut c) = conns.remove(&id) {
                    let _ = c.shutdown().await;
                }
            }
            _ => {}
        }
    }
    Ok(())
}
