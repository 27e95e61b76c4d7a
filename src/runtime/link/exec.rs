//! How a link runs a batch: on the first data path that covers it (device, UCX, same-host,
//! then TCP, which covers every batch), async requests on the link's queue, and notifications
//! ordered after earlier transfers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{LinkShared, Unfinished};
use crate::error::Error;
use crate::runtime::executor::Handler;
use crate::runtime::region::RegionUse;
use crate::runtime::request::{Outcome, QueuedBatch, ReqState, Settle, Started};
use crate::sync::lock;
use crate::transport::{Batch, PathFail};
use crate::types::blocks::{BlockBatch, OwnedBlocks};
use crate::types::{BatchDesc, TransferOp};

impl LinkShared {
    /// Runs a checked batch (`xds`, `bytes` in all, from `ndescs` descriptors) by `deadline`.
    /// It is listed among the link's unfinished transfers while it runs, so a notification sent
    /// meanwhile (from another thread) follows its data, and `close` waits for it.
    pub(crate) fn run_sync(
        &self,
        op: TransferOp,
        xds: &[BatchDesc],
        bytes: u64,
        ndescs: usize,
        started: Instant,
        deadline: Instant,
    ) -> Result<(), Error> {
        self.run_sync_any(op, xds, None, bytes, ndescs, started, deadline)
    }

    /// [`LinkShared::run_sync`] for a checked block batch.
    pub(crate) fn run_sync_blocks(
        &self,
        op: TransferOp,
        blocks: &BlockBatch<'_>,
        started: Instant,
        deadline: Instant,
    ) -> Result<(), Error> {
        let (bytes, n) = (blocks.bytes(), blocks.count());
        self.run_sync_any(op, &[], Some(blocks), bytes, n, started, deadline)
    }

    #[allow(clippy::too_many_arguments)]
    fn run_sync_any(
        &self,
        op: TransferOp,
        xds: &[BatchDesc],
        blocks: Option<&BlockBatch<'_>>,
        bytes: u64,
        ndescs: usize,
        started: Instant,
        deadline: Instant,
    ) -> Result<(), Error> {
        let seq = self.begin(|u, seq| u.syncs.push(seq))?.0;
        // listed until it returns, or unwinds
        let _listed = Listed(self, seq);
        self.counters.start(op);
        let r = self.run_batch(
            &Batch {
                peer: &self.peer,
                op,
                descs: xds,
                bytes,
                started,
                deadline,
                cancel: None,
            },
            blocks,
        );
        let took = started.elapsed();
        self.counters
            .finish(op, bytes, took, r.as_ref().err().map(Error::status));
        match &r {
            Ok(()) => {
                tracing::trace!(parent: &self.span, %op, descs = ndescs, us = took.as_micros() as u64, "transfer done")
            }
            Err(e) => {
                tracing::trace!(parent: &self.span, %op, descs = ndescs, error = %e, "transfer failed")
            }
        }
        r
    }

    /// Queues a checked batch as an async request holding `keep` until it ends; the deadline
    /// watcher ends it if it is still queued at `timeout` from now. `NOT_CONNECTED` once the
    /// link was closed (a close cancels and waits for every request it sees, so none may start
    /// after it).
    pub(crate) fn start_async(
        self: &Arc<Self>,
        op: TransferOp,
        xds: Vec<BatchDesc>,
        bytes: u64,
        keep: Vec<RegionUse>,
        timeout: Duration,
        user_data: u64,
    ) -> Result<Arc<ReqState>, Error> {
        let (_, state) = self.begin(|u, seq| {
            let state = Arc::new(ReqState::new(seq, op, user_data, bytes, timeout, keep));
            u.reqs.insert(seq, Arc::downgrade(&state));
            state
        })?;
        self.counters.start(op);
        crate::runtime::request::watch(&state, self);
        self.enqueue(QueuedBatch {
            state: state.clone(),
            xds,
            blocks: None,
        });
        Ok(state)
    }

    /// [`LinkShared::start_async`] for a checked block batch (its indices copied).
    pub(crate) fn start_async_blocks(
        self: &Arc<Self>,
        op: TransferOp,
        blocks: OwnedBlocks,
        keep: Vec<RegionUse>,
        timeout: Duration,
        user_data: u64,
    ) -> Result<Arc<ReqState>, Error> {
        let bytes = blocks.batch().bytes();
        let (_, state) = self.begin(|u, seq| {
            let state = Arc::new(ReqState::new(seq, op, user_data, bytes, timeout, keep));
            u.reqs.insert(seq, Arc::downgrade(&state));
            state
        })?;
        self.counters.start(op);
        crate::runtime::request::watch(&state, self);
        self.enqueue(QueuedBatch {
            state: state.clone(),
            xds: Vec::new(),
            blocks: Some(blocks),
        });
        Ok(state)
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
        let deadline = started + timeout;
        let me = {
            let mut unfinished = lock(&sh.unfinished);
            let me = unfinished.next;
            unfinished.next += 1;
            while unfinished.any_before(me) {
                let rem = deadline.saturating_duration_since(Instant::now());
                if rem.is_zero() {
                    return Err(Error::Timeout {
                        op: "notify (waiting for earlier transfers)",
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

    /// Runs a batch on the first data path that covers it and turns its failure into the
    /// caller's error, breaking the link where the failure says so.
    ///
    /// The caller keeps every local range registered and alive for the call.
    fn run_batch(&self, b: &Batch<'_>, blocks: Option<&BlockBatch<'_>>) -> Result<(), Error> {
        let path = (self.paths.iter())
            .find(|p| match blocks {
                Some(bb) => p.covers_blocks(bb),
                None => p.covers(b.descs),
            })
            .expect("the last data path, TCP's, covers every batch");
        // one-sided on this host: inside the server's fence, so it can revoke access and know
        // when no batch touches its memory any more
        let pass = match (&self.fence, path.enters_fence()) {
            (Some(f), true) => match f.enter() {
                Some(p) => Some(p),
                None => return Err(self.revoked("before this transfer started")),
            },
            _ => None,
        };
        if path.fenced() {
            crate::runtime::revoke::fence::test_pause();
        }
        tracing::trace!(transport = ?path.kind(), descs = b.descs.len(), op = %b.op, "batch on a data path");
        let r = if path.refused_when_broken() {
            self.check_usable()
        } else {
            Ok(())
        };
        // SAFETY: `prepare` checked every local range against the caller's registered regions,
        // which the caller's borrows (sync) or the request's state (async) hold alive for the
        // call, and every remote range against the peer's table.
        let run = || match blocks {
            // SAFETY: as above (`Link::prepare_blocks` checked every block).
            Some(bb) => unsafe { path.run_blocks(b, bb) },
            // SAFETY: as above.
            None => unsafe { path.run(b) },
        };
        let r = r.and_then(|()| match run() {
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
            Ok(()) if !kept => {
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
        let blocks = job.blocks.as_ref().map(OwnedBlocks::batch);
        let r = self.run_batch(
            &Batch {
                peer: &self.peer,
                op: st.op,
                descs: &job.xds,
                bytes: st.bytes,
                started: st.started,
                deadline: st.deadline,
                cancel: Some(&req),
            },
            blocks.as_ref(),
        );
        let outcome = match (req.unstarted(), r) {
            // it ended (cancelled, or its deadline passed) before its path started it
            (Some(o), _) => o,
            (None, Ok(())) => Outcome::Completed,
            (None, Err(Error::LanesExhausted { .. } | Error::Timeout { .. })) => Outcome::TimedOut,
            (None, Err(e)) => Outcome::Failed(Arc::new(e)),
        };
        st.finish(self, outcome);
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
                st.finish(self, Outcome::Failed(Arc::new(e)));
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
    fn settle(
        &self,
        seq: u64,
        op: TransferOp,
        bytes: u64,
        took: Duration,
        err: Option<crate::error::Status>,
    ) {
        self.counters.finish(op, bytes, took, err);
        let mut u = lock(&self.unfinished);
        u.reqs.remove(&seq);
        self.ended(u);
    }
}
