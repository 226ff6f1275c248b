//! Small concurrency helpers shared by the controller's modules.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, recovering the data of a lock poisoned by a panicking holder: every value behind
/// the controller's mutexes stays valid between statements, so a panic elsewhere must not stop
/// the controller.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reads `l`, recovering the data of a lock poisoned by a panicking writer (as [`lock`]).
pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes `l`, recovering the data of a lock poisoned by a panicking writer (as [`lock`]).
pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}
