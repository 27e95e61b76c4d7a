//! Quarantine: memory a same-host client may still write, kept out of use until it cannot.
//!
//! When a serving engine stops, it revokes every same-host client's one-sided access and waits,
//! up to its grace period, for each to confirm it has no copy in flight (see
//! [`fence`](super::fence)). A client that does not (stopped, hung) leaves the engine with
//! memory it cannot hand back: the original pages may still be written. Such a region is
//! quarantined when it is deregistered or freed: its owner gets a copy (deregister), and the
//! original allocation is kept — neither freed nor reused — until every fence that blocks it has
//! settled (the client left the fence, or its process is gone). A background thread (started on
//! first use) frees it then.
//!
//! The same holds memory the compat engine frees while links exist (an engine-allocated buffer
//! deregistered while linked): it is withdrawn from the table, and its allocation is kept until
//! every same-host link that may have it in its table has ended (its fence revoked and
//! settled), as a link's one-sided access to it cannot be taken back alone.
//!
//! Each quarantine is reported with a `tracing` warning (a `debug!` event for memory held for
//! live links) and counted in the engine's [`Metrics`](crate::Metrics) (`quarantined_regions`,
//! `quarantined_bytes`, `quarantines`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use super::fence::ServerFence;
use crate::sync::lock;
use crate::types::raw::RawMemory;

/// An engine's quarantine counters.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// Allocations held right now.
    pub regions: AtomicUsize,
    /// Their bytes.
    pub bytes: AtomicUsize,
    /// Allocations ever quarantined.
    pub total: AtomicU64,
}

/// The fences that keep a region's memory from its owner: those of clients that did not
/// confirm, in time, that they stopped touching it.
pub(crate) type Blockers = Vec<Arc<ServerFence>>;

/// Whether any of `blockers` may still touch the memory (the fence's rule, which the loom model
/// in `fence.rs` runs).
pub(crate) use super::fence::blocking;

struct Held {
    raw: RawMemory,
    free: unsafe fn(RawMemory),
    blockers: Blockers,
    stats: Arc<Stats>,
}

// SAFETY: `raw` is owned memory of a `Send` type (the `RegistrableMemory` bound), only freed by
// the reaper thread, once; the fences are `Send + Sync`.
unsafe impl Send for Held {}

struct Quarantine {
    held: Mutex<Vec<Held>>,
    cv: Condvar,
}

fn quarantine() -> &'static Quarantine {
    static Q: OnceLock<&'static Quarantine> = OnceLock::new();
    Q.get_or_init(|| {
        let q: &'static Quarantine = Box::leak(Box::new(Quarantine {
            held: Mutex::new(Vec::new()),
            cv: Condvar::new(),
        }));
        let spawned = std::thread::Builder::new()
            .name("hixl-quarantine".into())
            .spawn(move || reap(q));
        if let Err(e) = spawned {
            // without the reaper, held memory is never freed: a leak, never a use after free
            tracing::warn!(error = %e, "cannot start the quarantine thread; quarantined memory will leak");
        }
        q
    })
}

/// How often the reaper looks at the fences of held memory (a fence has no descriptor to wait
/// on; a pidfd would only tell of the process's end).
const REAP_EVERY: Duration = Duration::from_millis(20);

fn reap(q: &'static Quarantine) {
    let mut held = lock(&q.held);
    loop {
        if held.is_empty() {
            held = q.cv.wait(held).unwrap_or_else(|e| e.into_inner());
            continue;
        }
        let mut i = 0;
        while i < held.len() {
            if blocking(&held[i].blockers) {
                i += 1;
                continue;
            }
            let h = held.swap_remove(i);
            h.stats.regions.fetch_sub(1, Ordering::SeqCst);
            h.stats.bytes.fetch_sub(h.raw.len(), Ordering::SeqCst);
            tracing::debug!(len = h.raw.len(), "quarantined memory freed");
            // SAFETY: every client that could touch the memory has left its fence for good
            // (revoked: it starts no batch) or is gone; `free` is the release function of the
            // type that produced `raw`, called once (the entry was removed).
            unsafe { (h.free)(h.raw) };
        }
        held =
            q.cv.wait_timeout(held, REAP_EVERY)
                .unwrap_or_else(|e| e.into_inner())
                .0;
    }
}

/// Keeps `raw` until `blockers` have settled, then frees it with `free`.
pub(crate) fn hold(
    raw: RawMemory,
    free: unsafe fn(RawMemory),
    blockers: Blockers,
    stats: &Arc<Stats>,
) {
    stats.regions.fetch_add(1, Ordering::SeqCst);
    stats.bytes.fetch_add(raw.len(), Ordering::SeqCst);
    stats.total.fetch_add(1, Ordering::SeqCst);
    if blockers.iter().any(|f| f.is_revoked() && !f.settled()) {
        tracing::warn!(
            len = raw.len(),
            clients = blockers.len(),
            "memory quarantined: a same-host client did not confirm it stopped writing; its owner got a copy"
        );
    } else {
        // withdrawn from a serving engine (the compat engine's deregistration while linked)
        tracing::debug!(
            len = raw.len(),
            links = blockers.len(),
            "memory held until the same-host links that may reach it end"
        );
    }
    let q = quarantine();
    lock(&q.held).push(Held {
        raw,
        free,
        blockers,
        stats: stats.clone(),
    });
    q.cv.notify_all();
}
