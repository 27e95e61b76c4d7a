//! The crate's one lock helper: a mutex whose holder panicked is still used (every critical
//! section leaves its data consistent, or the data is only counters and queues).

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, ignoring poisoning.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The locks and atomics of the protocols the loom models check (`cfg(loom)`: loom's, which
/// explore every interleaving; otherwise std's): the fence's words, a request's state, a
/// region's use count and serving gate, and a same-host batch's shared parts. Only code that a
/// model runs takes them from here.
pub(crate) mod model {
    #[cfg(loom)]
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, fence};
    #[cfg(loom)]
    pub(crate) use loom::sync::{Condvar, Mutex};
    #[cfg(not(loom))]
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, fence};
    #[cfg(not(loom))]
    pub(crate) use std::sync::{Condvar, Mutex};

    #[cfg(not(loom))]
    pub(crate) use crate::sync::lock;

    /// Locks `m`, ignoring poisoning (as [`super::lock`], for loom's mutex).
    #[cfg(loom)]
    pub(crate) fn lock<T>(m: &Mutex<T>) -> loom::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
