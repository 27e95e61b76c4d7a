//! The buffers a peer's cache table is READ into (`links::fetch_table`): one a fetch, its own
//! while it runs, so fetches from different peers go on side by side.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

use super::engine::{Buffer, DdEngine};
use crate::Access;
use crate::datadist::table::TABLE_LEN;
use crate::datadist::types::{Error, LlmStatus, Result};
use crate::sync::lock;

/// How many download buffers an instance makes at most (1 MiB each): fetches beyond as many
/// at once wait for one, by their own deadline.
const DOWNLOADS: usize = 8;

/// The buffers peers' tables are READ into, each a fetch's alone while it holds it: made as
/// fetches need them (up to [`DOWNLOADS`]), kept for the next ones.
pub(in crate::datadist) struct Downloads {
    st: Mutex<(Vec<Buffer>, usize)>,
    freed: Condvar,
}

/// A download buffer a fetch holds; back to its pool when dropped.
pub(super) struct Download<'a> {
    buf: Option<Buffer>,
    pool: &'a Downloads,
}

impl std::ops::Deref for Download<'_> {
    type Target = Buffer;
    fn deref(&self) -> &Buffer {
        self.buf.as_ref().expect("held until dropped")
    }
}

impl Drop for Download<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            lock(&self.pool.st).0.push(b);
            self.pool.freed.notify_one();
        }
    }
}

impl Downloads {
    /// A pool holding `first` (made at initialize).
    pub(super) fn new(first: Buffer) -> Self {
        Downloads {
            st: Mutex::new((vec![first], 1)),
            freed: Condvar::new(),
        }
    }

    /// A buffer for one fetch from `remote`: a free one, a new one of `engine`'s, or one freed
    /// by `deadline` (else `LLM_TIMEOUT`).
    pub(super) fn take(
        &self,
        engine: &DdEngine,
        deadline: Instant,
        remote: &str,
    ) -> Result<Download<'_>> {
        let mut st = lock(&self.st);
        loop {
            if let Some(b) = st.0.pop() {
                return Ok(Download {
                    buf: Some(b),
                    pool: self,
                });
            }
            if st.1 < DOWNLOADS {
                st.1 += 1;
                drop(st);
                return match engine.alloc_host_mem_with(TABLE_LEN, Access::None) {
                    Ok(b) => Ok(Download {
                        buf: Some(b),
                        pool: self,
                    }),
                    Err(e) => {
                        lock(&self.st).1 -= 1;
                        self.freed.notify_one();
                        Err(e.into())
                    }
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::new(
                    LlmStatus::LLM_TIMEOUT,
                    format!("no download buffer came free to read {remote}'s cache table"),
                ));
            }
            st = (self.freed.wait_timeout(st, left))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}
