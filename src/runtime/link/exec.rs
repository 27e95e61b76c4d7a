//! How a link runs a batch, a list or a block batch alike: `run` (the caller waits) and `start`
//! (an async request on the link's queue), each on the batch's route (the first data path that
//! reaches its regions: device, UCX, same-host, then TCP, which reaches every region), and
//! notifications ordered after earlier transfers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::{LinkShared, Unfinished};
use crate::error::Error;
use crate::error::{check_timeout, deadline_after};
use crate::runtime::executor::Handler;
use crate::runtime::handle::ReqHandle;
use crate::runtime::region::RegionUse;
use crate::runtime::request::{Outcome, QueuedBatch, ReqState, Settle, Started};
use crate::sync::lock;
use crate::transport::{Batch, DataPath, Mode, PathFail};
use crate::types::TransferOp;
use crate::types::batch::{Descs, OwnedDescs};
use crate::wire::TableEntry;

/// What a notification's `TIMEOUT` names when its time went by waiting for this engine's own
/// earlier transfers to end (a local wait: the link did not fail).
const NOTIFY_WAIT: &str = "notify (waiting for earlier transfers)";

impl LinkShared {
    /// Runs a checked batch (`check::list` or `check::layouts`: `bytes` in all) and returns
    /// when it has ended, by `timeout` from now. It is listed among the link's unfinished
    /// transfers while it runs, so a notification sent meanwhile (from another thread) follows
    /// its data, and `close` waits for it.
    ///
    /// # Errors
    /// [`Error::InvalidTimeout`]; the data paths' ([`Error::Timeout`],
    /// [`Error::NotConnected`], ...).
    pub(crate) fn run<'d>(
        &self,
        op: TransferOp,
        descs: impl Into<Descs<'d>>,
        bytes: u64,
        timeout: Duration,
    ) -> Result<(), Error> {
        let descs = descs.into();
        let timeout = check_timeout(timeout)?;
        let started = Instant::now();
        let seq = self.begin(|u, seq| u.syncs.push(seq))?.0;
        // listed until it returns, or unwinds
        let _listed = Listed(self, seq);
        self.counters.start(op);
        let r = self.run_batch(&Batch {
            peer: &self.peer,
            op,
            descs,
            bytes,
            started,
            deadline: deadline_after(started, timeout),
            mode: Mode::Sync,
            given_up: None,
        });
        let took = started.elapsed();
        self.counters
            .finish(op, bytes, took, r.as_ref().err().map(Error::status));
        let n = descs.count();
        match &r {
            Ok(()) => {
                tracing::trace!(parent: &self.span, %op, descs = n, us = took.as_micros() as u64, "transfer done")
            }
            Err(e) => {
                tracing::trace!(parent: &self.span, %op, descs = n, error = %e, "transfer failed")
            }
        }
        r
    }

    /// Starts a checked batch as an async request that keeps `keep` (the regions it touches)
    /// in use until it ends; the deadline watcher ends it if it is still queued at `timeout`
    /// from now.
    ///
    /// # Errors
    /// [`Error::InvalidTimeout`]; [`Error::NotConnected`] on a broken link, or once the link
    /// was closed (a close cancels and waits for every request it sees, so none may start
    /// after it).
    pub(crate) fn start(
        self: &Arc<Self>,
        op: TransferOp,
        descs: impl Into<OwnedDescs>,
        bytes: u64,
        keep: Vec<RegionUse>,
        timeout: Duration,
        user_data: u64,
    ) -> Result<ReqHandle, Error> {
        let timeout = check_timeout(timeout)?;
        let descs = descs.into();
        self.check_usable()?;
        let (_, state) = self.begin(|u, seq| {
            let state = Arc::new(ReqState::new(seq, op, user_data, bytes, timeout, keep));
            u.reqs.insert(seq, Arc::downgrade(&state));
            state
        })?;
        self.counters.start(op);
        crate::runtime::request::watch(&state, self);
        self.enqueue(QueuedBatch {
            state: state.clone(),
            descs,
        });
        Ok(ReqHandle {
            st: state,
            link: self.clone(),
        })
    }

    /// Sends a notification once every transfer started before it has ended, and waits for
    /// its acknowledgement, by `started + timeout`.
    pub(crate) fn notify(
        &self,
        name: &str,
        msg: &str,
        started: Instant,
        timeout: Duration,
    ) -> Result<(), Error> {
        let sh = self;
        let deadline = deadline_after(started, timeout);
        let me = {
            let mut unfinished = lock(&sh.unfinished);
            let me = unfinished.next;
            unfinished.next += 1;
            while unfinished.any_before(me) {
                let rem = deadline.saturating_duration_since(Instant::now());
                if rem.is_zero() {
                    return Err(Error::Timeout {
                        op: NOTIFY_WAIT,
                        peer: sh.peer.clone(),
                        elapsed: started.elapsed(),
                    });
                }
                unfinished.waiting += 1;
                unfinished = sh
                    .finished_cv
                    .wait_timeout(unfinished, rem)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                unfinished.waiting -= 1;
            }
            me
        };
        sh.lanes.notify(me, name, msg, started, deadline)?;
        sh.counters.notified();
        Ok(())
    }

    /// Runs a batch on its route (the first data path that reaches its regions and covers it)
    /// and turns its failure into the caller's error, breaking the link where the failure says
    /// so.
    ///
    /// The caller keeps every local range registered and alive for the call.
    fn run_batch(&self, b: &Batch<'_>) -> Result<(), Error> {
        let path = self.routes.path(&b.descs, &self.paths);
        // one-sided on this host: inside the server's fence, so it can revoke access and know
        // when no batch touches its memory any more
        let pass = match &self.fence {
            Some(f) if path.enters_fence() => match f.enter() {
                Some(p) => Some(p),
                None => return Err(self.revoked("before this transfer started")),
            },
            _ => None,
        };
        // a client given up on stops between its parts (the server's word, read by the path)
        let fenced;
        let b = match &pass {
            Some(p) => {
                fenced = Batch {
                    given_up: Some(p.given_up_word()),
                    ..*b
                };
                &fenced
            }
            None => b,
        };
        if path.fenced() {
            crate::runtime::revoke::fence::test_pause();
        }
        tracing::trace!(transport = ?path.kind(), descs = b.descs.count(), op = %b.op, "batch on a data path");
        let r = if path.refused_when_broken() {
            self.check_usable()
        } else {
            Ok(())
        };
        // SAFETY: `runtime::check` checked every local range (every block, by its largest
        // index) against the caller's registered regions, which the caller's borrows (sync) or
        // the request's state (async) hold alive for the call, and every remote range against
        // the peer's table.
        let r = r.and_then(|()| match unsafe { path.run(b) } {
            Ok(()) => Ok(()),
            Err(PathFail::Gone(why)) => {
                self.mark_broken(why.clone());
                Err(Error::NotConnected {
                    peer: self.peer.clone(),
                    why,
                })
            }
            Err(PathFail::Poisoned { why, error }) => {
                self.mark_broken(why);
                Err(error)
            }
            Err(PathFail::Failed(e)) => Err(e),
            // the request has its outcome already (see `execute`)
            Err(PathFail::NotStarted) => Err(Error::Cancelled {
                op: b.op.name(),
                peer: self.peer.clone(),
            }),
        });
        let kept = pass.is_none_or(|p| p.leave());
        match r {
            // (stopped between its parts because it was given up on, or ended otherwise: the
            // server gave up on it, which is what the caller learns)
            _ if !kept => {
                Err(self.revoked("while this transfer ran; the peer may not have kept its bytes"))
            }
            r => r,
        }
    }

    /// The server revoked one-sided access (it stopped serving): the link is broken.
    fn revoked(&self, when: &str) -> Error {
        let why = format!("the peer revoked same-host access {when}");
        self.mark_broken(why.clone());
        Error::NotConnected {
            peer: self.peer.clone(),
            why,
        }
    }

    /// Runs one async request (on a worker of the executor).
    fn execute(self: &Arc<Self>, job: QueuedBatch) {
        let st = &job.state;
        if !st.claim_queued() {
            return; // resolved while queued (deadline, cancel)
        }
        let req = Started::new(st);
        let r = self.run_batch(&Batch {
            peer: &self.peer,
            op: st.op,
            descs: job.descs.borrow(),
            bytes: st.bytes,
            started: st.started,
            deadline: st.deadline,
            mode: Mode::Request(&req),
            given_up: None,
        });
        let outcome = match (req.unstarted(), r) {
            // it ended (cancelled, or its deadline passed) before its path started it
            (Some(o), _) => o,
            (None, Ok(())) => Outcome::Completed,
            (None, Err(Error::LanesExhausted { .. } | Error::Timeout { .. })) => Outcome::TimedOut,
            (None, Err(e)) => Outcome::Failed(Arc::new(e)),
        };
        st.finish(&**self, outcome);
    }

    /// Lists a new transfer among the unfinished ones under the next sequence number (`list`
    /// enters it, and returns what the caller keeps of it); `NOT_CONNECTED` once the link was
    /// closed (a close cancels and waits for every transfer it sees, so none may start after
    /// it).
    fn begin<T>(&self, list: impl FnOnce(&mut Unfinished, u64) -> T) -> Result<(u64, T), Error> {
        let mut u = lock(&self.unfinished);
        if u.closed {
            return Err(Error::NotConnected {
                peer: self.peer.clone(),
                why: "the link was closed".into(),
            });
        }
        let seq = u.next;
        u.next += 1;
        let kept = list(&mut u, seq);
        Ok((seq, kept))
    }

    /// A transfer ended (it was taken out of `u`): notifications and `close` waiting go on.
    fn ended(&self, u: std::sync::MutexGuard<'_, Unfinished>) {
        let wake = u.waiting > 0;
        drop(u);
        if wake {
            self.finished_cv.notify_all();
        }
    }

    /// Queues an async request on the link's queue (a new worker of it holds the link).
    fn enqueue(self: &Arc<Self>, job: QueuedBatch) {
        let worker = &mut || -> Handler<QueuedBatch> {
            let me = self.clone();
            Box::new(move |job| me.execute(job))
        };
        if let Err(QueuedBatch { state: st, .. }) = self.queue.push(job, worker) {
            // nobody can run it: fail it rather than leave it waiting
            if st.claim_queued() {
                let e = Error::LanesExhausted {
                    peer: self.peer.clone(),
                    lanes: 0,
                };
                st.finish(&**self, Outcome::Failed(Arc::new(e)));
            }
        }
    }
}

/// A sync batch listed among its link's unfinished transfers, until it is dropped.
struct Listed<'a>(&'a LinkShared, u64);

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        let mut u = lock(&self.0.unfinished);
        if let Some(i) = u.syncs.iter().position(|&s| s == self.1) {
            u.syncs.swap_remove(i);
        }
        self.0.ended(u);
    }
}

impl Settle for LinkShared {
    fn count(&self, op: TransferOp, bytes: u64, took: Duration, err: Option<crate::error::Status>) {
        self.counters.finish(op, bytes, took, err);
    }

    fn settle(&self, seq: u64) {
        let mut u = lock(&self.unfinished);
        u.reqs.remove(&seq);
        self.ended(u);
    }
}

// ---- routes: which data path runs a batch ----

/// Set in a region's mask once its route is decided.
const DECIDED: u32 = 1 << 31;

/// The routes of a link's regions, by region id: for each region of the peer's table, which of
/// the link's data paths reach it (a bit per path, in the link's preference order; TCP's, the
/// last, reaches every region). A region's route is decided the first time a batch touches it
/// (a same-host path maps the region's memfd then, so connecting to an engine with thousands of
/// regions stays fast) and kept for the link's life: a batch costs one lookup per region it
/// names, not a question to every path.
pub(super) struct Routes {
    /// `(region id, mask)`, sorted by id; a mask without [`DECIDED`] is not decided yet.
    by_id: Vec<(u32, AtomicU32)>,
}

impl Routes {
    /// Routes for `table`'s regions, none decided yet.
    pub(super) fn new(table: &[TableEntry]) -> Self {
        let mut by_id: Vec<(u32, AtomicU32)> =
            table.iter().map(|e| (e.id, AtomicU32::new(0))).collect();
        by_id.sort_by_key(|r| r.0);
        by_id.dedup_by_key(|r| r.0);
        Routes { by_id }
    }

    /// The paths that reach region `id` (decided now if it was not): a bit per path of
    /// `paths`; TCP's (the last) always. A region the table lacks gets TCP only (the server
    /// refuses it).
    pub(super) fn mask(&self, id: u32, paths: &[Box<dyn DataPath>]) -> u32 {
        let tcp = 1 << (paths.len() - 1);
        let Ok(i) = self.by_id.binary_search_by_key(&id, |r| r.0) else {
            return tcp;
        };
        let slot = &self.by_id[i].1;
        let m = slot.load(Ordering::Acquire);
        if m & DECIDED != 0 {
            return m & !DECIDED;
        }
        let mut m = tcp;
        for (k, p) in paths[..paths.len() - 1].iter().enumerate() {
            if p.reaches(id) {
                m |= 1 << k;
            }
        }
        // two threads deciding at once reach the same answer
        slot.store(m | DECIDED, Ordering::Release);
        m
    }

    /// The data path a batch runs on: the first that reaches every region of it and covers
    /// it; TCP's when no other does.
    pub(super) fn path<'p>(
        &self,
        descs: &Descs<'_>,
        paths: &'p [Box<dyn DataPath>],
    ) -> &'p dyn DataPath {
        if let [only] = paths {
            return &**only; // TCP alone (a link to another host with no UCX or device path)
        }
        let tcp = 1u32 << (paths.len() - 1);
        let mut mask = u32::MAX;
        let mut last = None;
        for d in descs.spans() {
            let r = d.remote.region;
            if last == Some(r) {
                continue; // the common case: a batch into one region
            }
            last = Some(r);
            mask &= self.mask(r, paths);
            if mask == tcp {
                break;
            }
        }
        (paths.iter())
            .enumerate()
            .find(|(k, p)| mask & (1 << k) != 0 && (*k == paths.len() - 1 || p.covers(descs)))
            .map_or(&*paths[paths.len() - 1], |(_, p)| &**p)
    }
}
