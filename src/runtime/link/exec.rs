//! How a link runs a batch: the data path that covers it (device, UCX, same-host, in that
//! order) or TCP lanes (a large batch split across several), async requests on the link's
//! worker threads, and notifications ordered after earlier transfers.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{LaneAfter, LinkShared, lane_error};
use crate::error::Error;
use crate::runtime::region::RegionUse;
use crate::runtime::request::{Job, Outcome, ReqState};
use crate::sync::lock;
use crate::transport::tcp::{Lane, LaneFail};
use crate::transport::{DataPath, PathFail};
use crate::types::{LaneDesc, TransferOp};
use crate::wire;

impl LinkShared {
    /// Runs a checked batch (`xds`, `bytes` in all, from `ndescs` descriptors) by `deadline`:
    /// on the data path that covers it, or on TCP lanes, a large batch split across several.
    pub(crate) fn run_sync(
        &self,
        op: TransferOp,
        xds: &[LaneDesc],
        bytes: u64,
        ndescs: usize,
        started: Instant,
        deadline: Instant,
    ) -> Result<(), Error> {
        let sh = self;
        sh.counters.start(op);
        // large TCP batches: one part per lane (the same-host path shares large copies with a
        // helper thread itself)
        let direct = sh.direct_path(xds);
        let parts = if direct.is_some() {
            Vec::new()
        } else {
            split(xds, bytes, sh.parallel, SPLIT_MIN)
        };
        let run = |p: &[LaneDesc]| match direct {
            Some(path) => sh.run_direct(path, op, p, deadline, &|| false),
            None => sh.run_part(op, p, deadline, started),
        };
        let r = if parts.len() > 1 {
            std::thread::scope(|s| {
                let helpers: Vec<_> = parts[1..].iter().map(|p| s.spawn(move || run(p))).collect();
                let first = run(&parts[0]);
                helpers
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Error::Protocol {
                                peer: sh.peer.clone(),
                                problem: "a transfer helper thread panicked".into(),
                            })
                        })
                    })
                    .fold(first, |acc, r| acc.and(r))
            })
        } else {
            run(xds)
        };
        let took = started.elapsed();
        sh.counters
            .finish(op, bytes, took, r.as_ref().err().map(Error::status));
        match &r {
            Ok(()) => {
                tracing::trace!(parent: &sh.span, %op, descs = ndescs, us = took.as_micros() as u64, "transfer done")
            }
            Err(e) => {
                tracing::trace!(parent: &sh.span, %op, descs = ndescs, error = %e, "transfer failed")
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
        xds: Vec<LaneDesc>,
        bytes: u64,
        keep: Vec<RegionUse>,
        timeout: Duration,
        user_data: u64,
    ) -> Result<Arc<ReqState>, Error> {
        let seq = self.next_req.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ReqState::new(seq, op, user_data, bytes, timeout, keep));
        {
            let mut u = lock(&self.unfinished);
            if u.closed {
                return Err(Error::NotConnected {
                    peer: self.peer.clone(),
                    why: "the link was closed".into(),
                });
            }
            u.reqs.insert(seq, Arc::downgrade(&state));
        }
        self.counters.start(op);
        crate::runtime::request::watch(&state, self);
        self.enqueue(Job {
            state: state.clone(),
            xds,
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
        let me = sh.next_req.fetch_add(1, Ordering::Relaxed);
        {
            let mut unfinished = lock(&sh.unfinished);
            while unfinished.reqs.range(..me).next().is_some() {
                let rem = deadline.saturating_duration_since(Instant::now());
                if rem.is_zero() {
                    return Err(Error::Timeout {
                        op: "notify (waiting for earlier transfers)",
                        peer: sh.peer.clone(),
                        elapsed: started.elapsed(),
                    });
                }
                unfinished = sh
                    .finished_cv
                    .wait_timeout(unfinished, rem)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        let mut lane = sh.checkout(deadline, started, "notify")?;
        let r = lane.notify(me, name, msg, deadline);
        let after = LaneAfter::of(r.as_ref().err());
        let e = r
            .err()
            .map(|f| lane_error(f, "notify", &sh.peer, started, false));
        sh.release(lane, after);
        if e.is_none() {
            sh.counters.notified();
        }
        e.map_or(Ok(()), Err)
    }

    /// The link's data paths other than its TCP lanes, in preference order: device (HCCL),
    /// UCX, same-host.
    pub(super) fn data_paths(&self) -> impl Iterator<Item = &dyn DataPath> {
        self.paths.iter().map(|p| &**p)
    }

    /// The first data path that moves `xds` without a TCP lane, if any.
    fn direct_path(&self, xds: &[LaneDesc]) -> Option<&dyn DataPath> {
        self.data_paths().find(|p| p.covers(xds))
    }

    /// Moves a batch over a lane-free path; `stop` cancels it where the path can be cancelled
    /// (UCX).
    ///
    /// The caller keeps every local range registered and alive for the call.
    fn run_direct(
        &self,
        path: &dyn DataPath,
        op: TransferOp,
        xds: &[LaneDesc],
        deadline: Instant,
        stop: &dyn Fn() -> bool,
    ) -> Result<(), Error> {
        // one-sided on this host: inside the server's fence, so it can revoke access and know
        // when no batch touches its memory any more
        let pass = match (&self.fence, path.fenced()) {
            (Some(f), true) => match f.enter() {
                Some(p) => Some(p),
                None => return Err(self.revoked("before this transfer started")),
            },
            _ => None,
        };
        if path.fenced() {
            crate::runtime::revoke::fence::test_pause();
        }
        tracing::trace!(transport = ?path.kind(), descs = xds.len(), %op, "batch on a data path");
        let r = self.run_path(path, op, xds, deadline, stop);
        let kept = pass.is_none_or(|p| p.leave());
        match r {
            Ok(()) if !kept => {
                Err(self.revoked("while this transfer ran; the peer may not have kept its bytes"))
            }
            r => r,
        }
    }

    /// Runs a batch on `path` and turns its failure into the caller's error, breaking the link
    /// where the failure says so.
    fn run_path(
        &self,
        path: &dyn DataPath,
        op: TransferOp,
        xds: &[LaneDesc],
        deadline: Instant,
        stop: &dyn Fn() -> bool,
    ) -> Result<(), Error> {
        if path.refused_when_broken() {
            self.check_usable()?;
        }
        // SAFETY: `prepare` checked every local range against the caller's registered regions,
        // which the caller's borrows (sync) or the request's state (async) hold alive for the
        // call, and every remote range against the peer's table.
        match unsafe { path.run(&self.peer, op, xds, deadline, stop) } {
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

    /// Takes a lane, runs `xds` on it, and puts it back.
    fn run_part(
        &self,
        op: TransferOp,
        xds: &[LaneDesc],
        deadline: Instant,
        started: Instant,
    ) -> Result<(), Error> {
        let mut lane = self.checkout(deadline, started, op.name())?;
        let r = self.run_on(&mut lane, op, xds, deadline);
        let after = LaneAfter::of(r.as_ref().err());
        let e = r
            .err()
            .map(|f| lane_error(f, op.name(), &self.peer, started, false));
        self.release(lane, after);
        e.map_or(Ok(()), Err)
    }

    /// Runs `xds` on `lane`, in frames of at most 65,536 descriptors.
    fn run_on(
        &self,
        lane: &mut Lane,
        op: TransferOp,
        xds: &[LaneDesc],
        deadline: Instant,
    ) -> Result<(), LaneFail> {
        for chunk in xds.chunks(wire::MAX_DESCS_PER_FRAME) {
            let req = self.next_req.fetch_add(1, Ordering::Relaxed);
            lane.xfer(op, req, chunk, deadline)?;
        }
        Ok(())
    }

    /// Executes one async job on this link (called by worker threads).
    fn execute(self: &Arc<Self>, job: Job) {
        let st = &job.state;
        if !st.claim_queued() {
            return; // resolved while queued (deadline, cancel)
        }
        if let Some(path) = self.direct_path(&job.xds) {
            if let Err(outcome) = st.set_running(-1) {
                st.finish(self, outcome);
                return;
            }
            let stop = || st.cancel_requested();
            let r = self.run_direct(path, st.op, &job.xds, st.deadline, &stop);
            let outcome = match r {
                Ok(()) => Outcome::Completed,
                Err(Error::Timeout { .. }) => Outcome::TimedOut,
                Err(e) => Outcome::Failed(Arc::new(e)),
            };
            st.finish(self, outcome);
            return;
        }
        let lane = match self.checkout(st.deadline, st.started, st.op.name()) {
            Ok(l) => l,
            Err(e) => {
                let outcome = match e {
                    Error::LanesExhausted { .. } | Error::Timeout { .. } => Outcome::TimedOut,
                    e => Outcome::Failed(Arc::new(e)),
                };
                st.finish(self, outcome);
                return;
            }
        };
        let mut lane = lane;
        if let Err(outcome) = st.set_running(lane.raw_fd()) {
            self.checkin(lane);
            st.finish(self, outcome);
            return;
        }
        let r = self.run_on(&mut lane, st.op, &job.xds, st.deadline);
        // the lane (and its descriptor) stays alive until `finish` has left the running phase
        let after = LaneAfter::of(r.as_ref().err());
        let failed = r.is_err();
        let outcome = match r {
            Ok(()) => Outcome::Completed,
            Err(LaneFail::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                ) =>
            {
                Outcome::TimedOut
            }
            Err(f) => Outcome::Failed(Arc::new(lane_error(
                f,
                st.op.name(),
                &self.peer,
                st.started,
                false,
            ))),
        };
        st.finish(self, outcome);
        if failed && st.cancel_requested() {
            // the lane was shut down by `cancel`: that says nothing about the peer
            drop(lane);
            self.discard(None);
        } else {
            self.release(lane, after);
        }
    }

    /// Bookkeeping when a request ends, whoever ended it.
    pub(crate) fn settle(
        &self,
        seq: u64,
        op: TransferOp,
        bytes: u64,
        took: Duration,
        err: Option<crate::error::Status>,
    ) {
        self.counters.finish(op, bytes, took, err);
        lock(&self.unfinished).reqs.remove(&seq);
        self.finished_cv.notify_all();
    }

    /// Queues an async request on the link's queue.
    fn enqueue(self: &Arc<Self>, job: Job) {
        let st = job.state.clone();
        let me = self.clone();
        if self.queue.push(move || me.execute(job)).is_err() {
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

/// Bytes per lane below which a TCP transfer is not split across lanes.
pub(crate) const SPLIT_MIN: u64 = 8 << 20;

/// Splits a batch into up to `lanes` parts of about equal bytes (cutting descriptors where
/// needed), or returns it whole when it is too small to gain from more lanes.
fn split(xds: &[LaneDesc], bytes: u64, lanes: usize, min_part: u64) -> Vec<Vec<LaneDesc>> {
    let parts = (lanes as u64).min(bytes / min_part).max(1) as usize;
    if parts < 2 {
        return Vec::new();
    }
    crate::types::split::split(xds, parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::WireDesc;

    fn xd(local: usize, region: u32, offset: u64, len: u64) -> LaneDesc {
        LaneDesc {
            local,
            remote: WireDesc {
                region,
                offset,
                len,
            },
        }
    }

    #[test]
    fn split_keeps_every_byte_once_and_in_place() {
        let m = 1u64 << 20;
        // too small to split
        assert!(split(&[xd(0, 0, 0, 15 * m)], 15 * m, 2, SPLIT_MIN).is_empty());
        assert!(split(&[xd(0, 0, 0, 64 * m)], 64 * m, 1, SPLIT_MIN).is_empty());
        let cases: Vec<Vec<LaneDesc>> = vec![
            vec![xd(0x1000, 1, 7, 64 * m)],
            vec![
                xd(0x1000, 1, 0, 16 * m),
                xd(0x9000_0000, 2, 5, 16 * m),
                xd(0x5000_0000, 3, 9, 3),
            ],
            (0..4)
                .map(|i| xd(i * 0x100_0000, 0, i as u64 * 0x200_0000, 5 * m + 1))
                .collect(),
        ];
        for xds in cases {
            let bytes: u64 = xds.iter().map(|d| d.remote.len).sum();
            for lanes in [2usize, 3, 8] {
                let parts = split(&xds, bytes, lanes, SPLIT_MIN);
                let want = (lanes as u64).min(bytes / SPLIT_MIN) as usize;
                assert_eq!(parts.len(), want);
                // parts differ by at most one share's rounding, and cover the batch in order
                let flat: Vec<LaneDesc> = parts.iter().flatten().copied().collect();
                let mut i = 0;
                for d in &xds {
                    let (mut local, mut off, mut left) = (d.local, d.remote.offset, d.remote.len);
                    while left > 0 {
                        let p = flat[i];
                        assert_eq!(
                            (p.local, p.remote.region, p.remote.offset),
                            (local, d.remote.region, off)
                        );
                        assert!(p.remote.len > 0 && p.remote.len <= left);
                        local += p.remote.len as usize;
                        off += p.remote.len;
                        left -= p.remote.len;
                        i += 1;
                    }
                }
                assert_eq!(i, flat.len());
                let sizes: Vec<u64> = parts
                    .iter()
                    .map(|p| p.iter().map(|d| d.remote.len).sum())
                    .collect();
                let share = bytes.div_ceil(want as u64);
                assert!(sizes.iter().all(|&s| s <= share), "{sizes:?}");
            }
        }
    }
}
