//! Small synchronisation helpers shared by every module.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks a std mutex, ignoring poisoning: a panic elsewhere mid-update leaves plain data that
/// every path keeps consistent, so the value is still usable. Never held across `.await`.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
