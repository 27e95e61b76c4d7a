//! The in-use rule of a local cache: its running pulls and pushes are counted, and
//! unregistering waits until none runs (and lets no new one start) before its memory is given
//! back. A cache carved from a memory pool has no engine registration of its own, so the
//! engine's rule (a deregistration waits for the transfers that use the region) does not see
//! its transfers: this count is what does, for every cache alike.

use std::sync::{Arc, Condvar, Mutex};

use crate::datadist::types::{Error, LlmStatus, Result};
use crate::sync::lock;

/// The pulls and pushes of one cache that are running, and whether it is being unregistered.
#[derive(Debug, Default)]
pub(super) struct Uses {
    state: Mutex<State>,
    ended: Condvar,
}

#[derive(Debug, Default)]
struct State {
    running: usize,
    closing: bool,
}

impl Uses {
    /// Counts one more transfer of cache `id`, until the guard is dropped; refused
    /// (`LLM_KV_CACHE_NOT_EXIST`) once the cache is being unregistered.
    pub(super) fn enter(self: &Arc<Self>, id: i64) -> Result<InUse> {
        let mut s = lock(&self.state);
        if s.closing {
            return Err(Error::new(
                LlmStatus::LLM_KV_CACHE_NOT_EXIST,
                format!("local cache {id} is being unregistered"),
            ));
        }
        s.running += 1;
        Ok(InUse(self.clone()))
    }

    /// Lets no new transfer in and returns once every running one has ended. A transfer ends
    /// by its deadline (`llm.SyncKvCacheWaitTime`), so this wait is bounded by it.
    pub(super) fn close(&self) {
        let mut s = lock(&self.state);
        s.closing = true;
        while s.running > 0 {
            s = self.ended.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Lets transfers in again (the unregistration that closed it failed).
    pub(super) fn reopen(&self) {
        lock(&self.state).closing = false;
    }
}

/// One running transfer of a cache ([`Uses::enter`]); dropping it ends it.
#[derive(Debug)]
pub(super) struct InUse(Arc<Uses>);

impl Drop for InUse {
    fn drop(&mut self) {
        let mut s = lock(&self.0.state);
        s.running -= 1;
        if s.running == 0 {
            self.0.ended.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_waits_for_running_uses_and_refuses_new_ones() {
        let uses = Arc::new(Uses::default());
        let held = uses.enter(3).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let u = &uses;
            s.spawn(move || {
                u.close();
                tx.send(()).unwrap();
            });
            // the closer waits while `held` runs; once it is closing, new uses are refused
            while uses.enter(3).is_ok() {
                std::thread::yield_now();
            }
            assert!(rx.try_recv().is_err(), "close returned while a use ran");
            let e = uses.enter(3).unwrap_err();
            assert_eq!(e.status, LlmStatus::LLM_KV_CACHE_NOT_EXIST);
            drop(held);
            rx.recv().unwrap();
        });
        uses.reopen();
        drop(uses.enter(3).unwrap());
    }
}
