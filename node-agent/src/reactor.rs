//! The agent's one unsafe call: handing a file descriptor it owns to tokio's reactor.
//!
//! `AsyncFd::register` is unsafe because tokio cannot tell whether an `AsRawFd` value owns its
//! descriptor (a borrowed raw fd could be closed, and its number reused, while registered).
//! [`register`] accepts only types that own theirs ([`Owns`], sealed: `OwnedFd` and `File`), so
//! the descriptor stays open and the same for as long as the `AsyncFd` holds it.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;

mod sealed {
    pub trait Sealed {}
    impl Sealed for std::os::fd::OwnedFd {}
    impl Sealed for std::fs::File {}
}

/// A value that owns its file descriptor: it closes it when dropped and never changes it.
pub trait Owns: AsRawFd + sealed::Sealed {}
impl Owns for OwnedFd {}
impl Owns for std::fs::File {}

/// Registers `inner` with the current tokio runtime's reactor (read and write readiness).
pub fn register<T: Owns>(inner: T) -> std::io::Result<AsyncFd<T>> {
    // SAFETY: `T: Owns` owns its descriptor, which stays open and the same until the `AsyncFd`
    // (which takes `inner` by value) drops it or gives it back.
    unsafe { AsyncFd::register(inner) }.map_err(|e| std::io::Error::other(e.to_string()))
}
