//! The crate's one lock helper: a mutex whose holder panicked is still used (every critical
//! section leaves its data consistent, or the data is only counters and queues).

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, ignoring poisoning.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
