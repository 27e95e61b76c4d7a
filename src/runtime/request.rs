//! Async requests inside the runtime: a request's state machine (queued, running, ended, with
//! its outcome), the jobs a link queues, the request's side of cancellation as a data path sees
//! it ([`Started`]), and the deadline watcher that ends queued requests whose deadline passed. The public handle, `TransferReq`, is in src/request.rs; the
//! public argument and status types are defined here and re-exported.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

use crate::error::{Error, deadline_after};
use crate::sync::model::{Condvar, Mutex, lock};
use crate::transport::Cancel;
use crate::types::TransferOp;

/// Optional arguments of [`Link::transfer_async`](crate::Link::transfer_async) (HIXL `TransferArgs`).
#[derive(Debug, Clone, Copy)]
pub struct TransferArgs {
    /// A tag returned with the request's status (HIXL `TransferArgs.user_data`).
    pub user_data: u64,
    /// The request's deadline, from the call (1000 ms by default, as HIXL's timeouts).
    pub timeout: Duration,
}

impl Default for TransferArgs {
    fn default() -> Self {
        Self {
            user_data: 0,
            timeout: Duration::from_millis(1000),
        }
    }
}

impl TransferArgs {
    /// Arguments with this tag and the default timeout.
    pub fn tagged(user_data: u64) -> Self {
        Self {
            user_data,
            ..Self::default()
        }
    }
    /// The same arguments with another timeout.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }
}

/// Where an async request is (HIXL `TransferStatus`, with deadlines and cancellation that HIXL
/// leaves to the caller).
#[derive(Debug, Clone)]
pub enum TransferStatus {
    /// Queued or running: the engine may still touch the local buffers.
    Waiting,
    /// All descriptors completed.
    Completed,
    /// It failed; the data of the batch is unspecified.
    Failed(Arc<Error>),
    /// The deadline passed before it completed; the data of the batch is unspecified.
    TimedOut,
    /// [`TransferReq::cancel`](crate::TransferReq::cancel) stopped it; the data of the batch is unspecified.
    Cancelled,
}

impl TransferStatus {
    /// Whether the request has ended. Then the engine no longer touches its local buffers.
    pub fn is_terminal(&self) -> bool {
        !matches!(self, Self::Waiting)
    }
    /// HIXL's status code for the outcome: `SUCCESS` for completed, `TIMEOUT`, the error's code,
    /// `FAILED` for cancelled; `None` while waiting.
    pub fn code(&self) -> Option<crate::error::Status> {
        match self {
            Self::Waiting => None,
            Self::Completed => Some(crate::error::Status::SUCCESS),
            Self::Failed(e) => Some(e.status()),
            Self::TimedOut => Some(crate::error::Status::TIMEOUT),
            Self::Cancelled => Some(crate::error::Status::FAILED),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    Completed,
    Failed(Arc<Error>),
    TimedOut,
    Cancelled,
}

/// Where a request is.
pub(crate) enum Phase {
    Queued,
    /// Its data path started it; a cancel shuts down socket `fd`, when it has one (its data
    /// path keeps it open while it is here).
    Running {
        fd: Option<RawFd>,
    },
    Done(Outcome),
}

/// A request's mutable state.
pub(crate) struct Inner {
    pub(crate) phase: Phase,
    pub(crate) cancel: bool,
    /// The link's bookkeeping for this request was done (exactly once).
    settled: bool,
    /// The regions the request uses (alive, and counted as in use) until it ends.
    keep: Vec<crate::runtime::region::RegionUse>,
    pub(crate) waker: Option<Waker>,
    /// Its deadline's job on the executor's timer ([`watch`]) while it is queued: cancelled
    /// when it starts or ends, so a request leaves nothing on the timer after it.
    timer: Option<crate::runtime::executor::TimerKey>,
}

/// The shared state of one async request.
pub(crate) struct ReqState {
    pub(crate) m: Mutex<Inner>,
    pub(crate) cv: Condvar,
    pub(crate) seq: u64,
    pub(crate) op: TransferOp,
    pub(crate) user_data: u64,
    pub(crate) bytes: u64,
    pub(crate) started: Instant,
    pub(crate) deadline: Instant,
}

/// Where a request's end is accounted (the link core implements it: its counters and its set of
/// unfinished requests), so that a request names no type of its link.
pub(crate) trait Settle: Send + Sync + 'static {
    /// Counts a request that ends (`err`: how it failed), before anyone can see it ended: the
    /// link's metrics never show a request in flight that a waiter saw end.
    fn count(
        &self,
        op: TransferOp,
        bytes: u64,
        took: std::time::Duration,
        err: Option<crate::error::Status>,
    );
    /// Bookkeeping when request `seq` ended, whoever ended it.
    fn settle(&self, seq: u64);
}

/// A queued async request: its state (which keeps its regions alive until it ends) and its
/// descriptors.
pub(crate) struct QueuedBatch {
    pub state: Arc<ReqState>,
    /// Its descriptors (a list or a block batch).
    pub descs: crate::types::batch::OwnedDescs,
}

impl ReqState {
    pub(crate) fn new(
        seq: u64,
        op: TransferOp,
        user_data: u64,
        bytes: u64,
        timeout: Duration,
        keep: Vec<crate::runtime::region::RegionUse>,
    ) -> Self {
        let started = Instant::now();
        Self {
            m: Mutex::new(Inner {
                phase: Phase::Queued,
                cancel: false,
                settled: false,
                keep,
                waker: None,
                timer: None,
            }),
            cv: Condvar::new(),
            seq,
            op,
            user_data,
            bytes,
            started,
            deadline: deadline_after(started, timeout),
        }
    }

    /// Whether `cancel` was asked for while it ran.
    pub(crate) fn cancel_requested(&self) -> bool {
        lock(&self.m).cancel
    }

    /// A worker takes the request; `false` if it already ended (deadline, cancel).
    pub(crate) fn claim_queued(&self) -> bool {
        matches!(lock(&self.m).phase, Phase::Queued)
    }

    /// Its data path is about to touch memory; a cancel shuts down socket `fd` (if any) until
    /// [`ReqState::unwatch`]. `Err` with the outcome to end with if the request was cancelled
    /// or its deadline passed meanwhile.
    pub(crate) fn set_running(&self, fd: Option<RawFd>) -> Result<(), Outcome> {
        let mut g = lock(&self.m);
        match g.phase {
            Phase::Queued if g.cancel => Err(Outcome::Cancelled),
            Phase::Queued if Instant::now() >= self.deadline => Err(Outcome::TimedOut),
            Phase::Queued => {
                g.phase = Phase::Running { fd };
                // the worker keeps the deadline from here on
                let timer = g.timer.take();
                drop(g);
                if let Some(key) = timer {
                    crate::runtime::executor::cancel(key);
                }
                Ok(())
            }
            Phase::Running { .. } => Err(Outcome::Failed(Arc::new(Error::Protocol {
                peer: String::new(),
                problem: "request run twice".into(),
            }))),
            Phase::Done(ref o) => Err(o.clone()),
        }
    }

    /// A cancel no longer touches the socket given to [`ReqState::set_running`] (its data path
    /// may close it now). Returns whether a cancel was asked for.
    pub(crate) fn unwatch(&self) -> bool {
        let mut g = lock(&self.m);
        if let Phase::Running { fd } = &mut g.phase {
            *fd = None;
        }
        g.cancel
    }

    /// The request's own part of ending it: unless it has ended already (or, with
    /// `only_queued`, has started), releases its regions and then makes the end visible. Returns
    /// the outcome and the waker to wake, if this call ended it. (The loom model at the end of
    /// this file runs it against an observer.)
    fn release(
        &self,
        outcome: Outcome,
        only_queued: bool,
        counted: impl FnOnce(&Outcome),
    ) -> Option<(
        Outcome,
        Option<Waker>,
        Option<crate::runtime::executor::TimerKey>,
    )> {
        let mut g = lock(&self.m);
        if g.settled || (only_queued && !matches!(g.phase, Phase::Queued)) {
            return None;
        }
        let outcome = match (&g.phase, outcome) {
            (Phase::Done(o), _) => o.clone(),
            (_, Outcome::Failed(_)) if g.cancel => Outcome::Cancelled,
            (_, o) => o,
        };
        // the memory is no longer touched (never started, or the worker is done with it): the
        // regions are free again, and the end counted, before anyone can see the request ended
        drop(std::mem::take(&mut g.keep));
        counted(&outcome);
        g.phase = Phase::Done(outcome.clone());
        g.settled = true;
        Some((outcome, g.waker.take(), g.timer.take()))
    }

    /// Ends the request with `outcome` unless it has ended already; settles the link's
    /// bookkeeping exactly once and wakes waiters. With `only_queued`, only a request that has
    /// not started is ended. Returns whether this call ended it.
    fn end(&self, link: &impl Settle, outcome: Outcome, only_queued: bool) -> bool {
        let counted = |outcome: &Outcome| {
            let err = match outcome {
                Outcome::Completed => None,
                Outcome::Failed(e) => Some(e.status()),
                Outcome::TimedOut => Some(crate::error::Status::TIMEOUT),
                Outcome::Cancelled => Some(crate::error::Status::FAILED),
            };
            link.count(self.op, self.bytes, self.started.elapsed(), err);
        };
        let Some((_, waker, timer)) = self.release(outcome, only_queued, counted) else {
            return false;
        };
        if let Some(key) = timer {
            crate::runtime::executor::cancel(key);
        }
        link.settle(self.seq);
        self.cv.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
        true
    }

    /// The worker ends the request it ran (or could not run).
    pub(crate) fn finish(&self, link: &impl Settle, outcome: Outcome) {
        self.end(link, outcome, false);
    }

    /// Ends a request that has not started (deadline, cancel, drop) without touching memory.
    pub(crate) fn resolve_queued(&self, link: &impl Settle, outcome: Outcome) -> bool {
        self.end(link, outcome, true)
    }

    /// Stops the request: one still queued ends `Cancelled` at once; one running is marked
    /// cancelled (a data path polls that between its steps) and its lane's socket, if it runs on
    /// one, is shut down, so the worker's I/O returns and it ends the request.
    pub(crate) fn cancel(&self, link: &impl Settle) {
        if self.resolve_queued(link, Outcome::Cancelled) {
            return;
        }
        let mut g = lock(&self.m);
        if let Phase::Running { fd } = g.phase {
            g.cancel = true;
            if let Some(fd) = fd {
                // SAFETY: the data path keeps `fd` open while the phase is `Running` with it
                // (until `unwatch`, which takes it out under this lock: TCP's `run_request`
                // closes its lane only after that), and the phase cannot change while we hold
                // the lock.
                unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            }
        }
    }

    pub(crate) fn status(&self) -> TransferStatus {
        match &lock(&self.m).phase {
            Phase::Queued | Phase::Running { .. } => TransferStatus::Waiting,
            Phase::Done(o) => to_status(o),
        }
    }
}

/// An async request while a data path runs its batch: the [`Cancel`] the path sees. It keeps
/// the outcome of a request that ended before its path started it.
pub(crate) struct Started<'a> {
    st: &'a ReqState,
    unstarted: std::sync::Mutex<Option<Outcome>>,
}

impl<'a> Started<'a> {
    pub(crate) fn new(st: &'a ReqState) -> Self {
        Self {
            st,
            unstarted: std::sync::Mutex::new(None),
        }
    }

    /// The outcome of a request that ended before its path started it.
    pub(crate) fn unstarted(self) -> Option<Outcome> {
        self.unstarted
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Cancel for Started<'_> {
    fn start(&self, sock: Option<BorrowedFd<'_>>) -> bool {
        match self.st.set_running(sock.map(|s| s.as_raw_fd())) {
            Ok(()) => true,
            Err(o) => {
                *crate::sync::lock(&self.unstarted) = Some(o);
                false
            }
        }
    }
    fn unwatch(&self) -> bool {
        self.st.unwatch()
    }
    fn requested(&self) -> bool {
        self.st.cancel_requested()
    }
}

pub(crate) fn to_status(o: &Outcome) -> TransferStatus {
    match o {
        Outcome::Completed => TransferStatus::Completed,
        Outcome::Failed(e) => TransferStatus::Failed(e.clone()),
        Outcome::TimedOut => TransferStatus::TimedOut,
        Outcome::Cancelled => TransferStatus::Cancelled,
    }
}

/// Watches a new request's deadline: on the executor's timer, a request still queued then ends
/// `TimedOut` (and its future is woken), even when every worker of its link is busy.
pub(crate) fn watch<L: Settle>(st: &Arc<ReqState>, link: &Arc<L>) {
    let (st_w, link_w) = (Arc::downgrade(st), Arc::downgrade(link));
    let key = crate::runtime::executor::at(st.deadline, move || {
        if let (Some(st), Some(link)) = (st_w.upgrade(), link_w.upgrade()) {
            st.resolve_queued(&*link, Outcome::TimedOut);
        }
    });
    // kept for the cancel when it starts or ends; if it did already, cancelled here
    let mut g = lock(&st.m);
    if matches!(g.phase, Phase::Queued) {
        g.timer = Some(key);
    } else {
        drop(g);
        crate::runtime::executor::cancel(key);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::runtime::executor::pending;

    struct Uncounted;
    impl Settle for Uncounted {
        fn count(&self, _: TransferOp, _: u64, _: Duration, _: Option<crate::error::Status>) {}
        fn settle(&self, _: u64) {}
    }

    /// An hour's deadline: a request that ends long before it (cancelled while queued, or run
    /// to completion) leaves no job on the executor's timer (before, each one stayed until its
    /// deadline: memory growing with the request rate times the deadline).
    #[test]
    fn a_request_that_ends_leaves_nothing_on_the_timer() {
        let link = Arc::new(Uncounted);
        for run in [false, true] {
            let hour = Duration::from_secs(3600);
            let st = Arc::new(ReqState::new(1, TransferOp::Write, 0, 1, hour, vec![]));
            watch(&st, &link);
            let key = lock(&st.m)
                .timer
                .expect("a queued request's deadline is watched");
            assert!(pending(key));
            if run {
                assert!(st.set_running(None).is_ok(), "queued");
                assert!(
                    !pending(key),
                    "a running request's deadline is its worker's"
                );
                st.finish(&*link, Outcome::Completed);
            } else {
                st.cancel(&*link);
            }
            assert!(!pending(key), "an ended request is still on the timer");
            assert!(matches!(
                st.status(),
                TransferStatus::Completed | TransferStatus::Cancelled
            ));
        }
        // a request that ended before its deadline was watched is not kept either
        let st = Arc::new(ReqState::new(
            2,
            TransferOp::Read,
            0,
            1,
            Duration::from_secs(3600),
            vec![],
        ));
        st.cancel(&*link);
        watch(&st, &link);
        assert!(lock(&st.m).timer.is_none());
    }
}

/// Request release under loom: a worker that used a region's memory ends the request while
/// another thread waits to see it end and then uses the memory itself (`write_at`). The real
/// [`ReqState`] (with loom's mutex) and the real region use count (loom's atomic) run every
/// interleaving; the memory is a `loom::cell::UnsafeCell`. Properties: once the end is visible
/// the region is not in use (no `RegionBusy` after a visible end), and the worker's use of the
/// memory happens before the observer's (no use after release).
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use crate::runtime::region::{RegionCore, RegionUse};
    use crate::types::{Access, MemDesc, MemType};
    use loom::cell::UnsafeCell;

    #[test]
    fn a_visible_end_means_the_region_is_free() {
        loom::model(|| {
            let core = Arc::new(RegionCore::new_raw(
                0,
                0,
                MemDesc {
                    addr: 0x1000,
                    len: 1,
                },
                MemType::Host,
                Access::ReadWrite,
            ));
            let mem = loom::sync::Arc::new(UnsafeCell::new(0u8));
            let st = Arc::new(ReqState::new(
                1,
                TransferOp::Write,
                0,
                1,
                Duration::from_secs(60),
                vec![RegionUse::new(&core)],
            ));
            // the link's metrics (`Settle::count`)
            let counted = loom::sync::Arc::new(loom::sync::atomic::AtomicBool::new(false));
            let worker = {
                let (st, mem, counted) = (st.clone(), mem.clone(), counted.clone());
                loom::thread::spawn(move || {
                    assert!(st.claim_queued());
                    st.set_running(None).ok().expect("queued");
                    // SAFETY: loom checks that no access of another thread races this one.
                    mem.with_mut(|m| unsafe { *m = 1 });
                    let count =
                        |_: &Outcome| counted.store(true, loom::sync::atomic::Ordering::Relaxed);
                    st.release(Outcome::Completed, false, count)
                        .expect("this worker ends it");
                })
            };
            while !st.status().is_terminal() {
                loom::thread::yield_now();
            }
            assert!(!core.in_use(), "RegionBusy after the end was visible");
            assert!(
                counted.load(loom::sync::atomic::Ordering::Relaxed),
                "still in flight in the metrics after the end was visible"
            );
            // the owner's `write_at`
            // SAFETY: as above.
            mem.with_mut(|m| unsafe { *m = 2 });
            worker.join().unwrap();
        });
    }
}
