//! Small concurrency helpers shared by the controller's modules.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, recovering the data of a lock poisoned by a panicking holder: every value behind
/// the controller's mutexes stays valid between statements, so a panic elsewhere must not stop
/// the controller.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
