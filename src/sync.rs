//! Small helpers shared by every module: the poison-tolerant std locks, and the hasher of the
//! in-memory maps.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks a std mutex, ignoring poisoning: a panic elsewhere mid-update leaves plain data that
/// every path keeps consistent, so the value is still usable. Never held across `.await`.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks a std `RwLock`, ignoring poisoning (as [`lock`]).
pub(crate) fn read<T>(rw: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    rw.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks a std `RwLock`, ignoring poisoning (as [`lock`]).
pub(crate) fn write<T>(rw: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    rw.write().unwrap_or_else(PoisonError::into_inner)
}

/// The map of the gateway's in-memory tables (registrations, sessions, in-flight requests,
/// slots, tools, metric handles): std's `HashMap` with foldhash, seeded per process. Their
/// keys are ids the gateway made, configured names, or a client's request ids (bounded per
/// session), looked up on every call, where SipHash cost more than the lookup itself.
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The set of the same tables (see [`HashMap`]).
pub(crate) type HashSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;
