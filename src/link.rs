//! Links: the capability to transfer with one remote engine.
//!
//! [`Hixl::connect`](crate::Hixl::connect) returns a [`Link`] that *borrows* the connected engine.
//! So a link cannot outlive its engine, the engine cannot leave `Connected` (to deregister memory
//! or finalize) while a link is alive, and `disconnect(self)` consumes the link: using it
//! afterwards does not compile. Several threads may share one link (`&Link` is `Sync`): each
//! transfer takes a lane (TCP connection) of its own.
//!
//! The peer's region table arrives with the link. [`Link::remote`] and [`RemoteRegion::range`]
//! validate remote ranges against it locally; the serving side validates every range again.

use std::collections::{BTreeSet, VecDeque};
use std::fmt;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::engine::EngineInner;
use crate::error::{Error, RemoteRefusal, check_timeout};
use crate::metrics::LinkCounters;
use crate::notify::MAX_NOTIFY_LEN;
use crate::options::SameHost;
use crate::request::{Job, Outcome, ReqState, TransferArgs, TransferReq};
use crate::runtime::region::RegionUse;
use crate::sync::lock;
use crate::transfer::TransferDesc;
use crate::transport::ascend::link::DeviceLink;
use crate::transport::same_host::PeerProc;
use crate::transport::same_host::fence::ClientFence;
use crate::transport::same_host::path::SameHostPath;
use crate::transport::tcp::{Lane, LaneFail};
use crate::transport::{Control, DataPath, PathFail};
use crate::types::HostId;
use crate::types::LaneDesc;
use crate::types::TransferOp;
use crate::types::WireDesc;
use crate::types::{Access, MemType};
use crate::wire::{self, Hello, LaneRole, TableEntry};

/// Most descriptors in one transfer call.
pub const MAX_BATCH: usize = 1 << 20;

/// How long an idle async worker thread waits for work before it exits.
const WORKER_IDLE: Duration = Duration::from_secs(2);

struct Pool {
    idle: Vec<Lane>,
    open: usize,
    broken: Option<String>,
    /// Set once the link was closed (by `disconnect` or `Drop`).
    closed: bool,
}

#[derive(Default)]
struct Jobs {
    queue: VecDeque<Job>,
    workers: usize,
    idle: usize,
}

/// A link's state, shared by the [`Link`] handle, async requests and async worker threads.
pub(crate) struct LinkShared {
    pub(crate) id: u64,
    pub(crate) peer: String,
    addr: SocketAddr,
    token: u64,
    remote_instance: u64,
    remote_pid: u32,
    /// Sorted by address, disjoint (checked when decoded).
    table: Vec<TableEntry>,
    engine_id: u64,
    instance: u64,
    name: String,
    max_lanes: usize,
    /// How many lanes one large transfer may use at once.
    parallel: usize,
    pool: Mutex<Pool>,
    freed: Condvar,
    next_req: AtomicU64,
    jobs: Mutex<Jobs>,
    jobs_cv: Condvar,
    /// Async requests not finished yet, by sequence number (notifications wait for earlier ones).
    unfinished: Mutex<BTreeSet<u64>>,
    finished_cv: Condvar,
    pub(crate) counters: LinkCounters,
    /// The same-host data path, when the peer is on this host and the kernel allows it.
    cma: Option<SameHostPath>,
    /// The UCX data path, when both engines use UCX.
    ucx: Option<crate::transport::ucx::UcxLink>,
    /// The device data path (Ascend HCCL), when both engines have an Ascend runtime; emptied
    /// when the link closes (the communicator is destroyed then).
    device: Option<Mutex<Option<DeviceLink>>>,
    /// The server's fence for this link, when the peer is on this host: its revocable grant of
    /// one-sided access, entered by every same-host (and same-host UCX) batch.
    fence: Option<ClientFence>,
    /// The pre-shared key new lanes prove.
    psk: Option<crate::auth::Psk>,
    pub(crate) span: tracing::Span,
}

/// What a new link takes from its engine, so the link core does not see the engine.
pub(crate) struct LinkConfig<'a> {
    /// The engine's id (for metrics), instance id and name.
    pub(crate) engine_id: u64,
    pub(crate) instance: u64,
    pub(crate) name: &'a str,
    pub(crate) options: &'a crate::options::Options,
    /// The engine's span; the link's is a child of it.
    pub(crate) span: &'a tracing::Span,
    /// UCX, when the engine uses it, with this engine's regions mapped for its own links.
    pub(crate) ucx: Option<(
        &'a crate::transport::ucx::UcxEngine,
        Option<Arc<crate::transport::ucx::UcxLocal>>,
    )>,
    /// The Ascend runtime, when the engine has one, with the engine's regions (the device path
    /// binds them).
    pub(crate) ascend: Option<(
        &'a Arc<crate::transport::ascend::Runtime>,
        crate::transport::ascend::link::DeviceRegions,
    )>,
}

static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

impl LinkShared {
    pub(crate) fn open(
        engine: &LinkConfig<'_>,
        peer: String,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Arc<Self>, Error> {
        let started = Instant::now();
        let deadline = started + timeout;
        let policy = engine.options.same_host;
        let me = match policy {
            SameHost::Forbid => None,
            _ => HostId::current(),
        };
        let hello = Hello {
            role: LaneRole::NewLink,
            instance: engine.instance,
            token: 0,
            name: engine.name.to_owned(),
            target: peer.clone(),
            host: me,
            nonce: crate::auth::nonce(),
        };
        let psk = engine.options.psk.clone();
        let (mut lane, welcome) = Lane::open(addr, &hello, psk.as_ref(), deadline)
            .map_err(|f| lane_error(f, "connect", &peer, started, true))?;
        let id = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
        let span = tracing::debug_span!(parent: engine.span, "link", id, peer = %peer);
        let ucx = match &engine.ucx {
            None => None,
            Some((u, local)) => {
                let require = engine.options.ucx == crate::options::Ucx::Require;
                let got = lane
                    .ucx_info(deadline)
                    .map_err(|f| lane_error(f, "connect", &peer, started, true))
                    .and_then(|info| match info {
                        Some(info) => crate::transport::ucx::UcxLink::connect(
                            u,
                            &peer,
                            &info,
                            &welcome.table,
                            local.clone(),
                        )
                        .map(Some),
                        None => Ok(None),
                    });
                match got {
                    Ok(Some(l)) => Some(l),
                    Ok(None) if require => {
                        return Err(Error::TransportUnavailable {
                            peer,
                            transport: "ucx",
                            why: "the peer does not serve over UCX",
                        });
                    }
                    Ok(None) => None,
                    Err(e) if require => return Err(e),
                    Err(e) => {
                        tracing::debug!(parent: &span, error = %e, "UCX link failed; using tcp or same-host");
                        None
                    }
                }
            }
        };
        let device = match &engine.ascend {
            Some((rt, regions)) => crate::transport::ascend::link::connect(
                rt,
                &mut LaneControl {
                    lane: &mut lane,
                    peer: &peer,
                    started,
                },
                regions,
                &welcome.table,
                engine.name,
                &peer,
                deadline,
            )?,
            None => None,
        };
        // on one host: the peer pinned, and its fence (one-sided access the server can revoke)
        let local = match (&me, &welcome.host) {
            (Some(a), Some(b)) if a.same_host(b) => PeerProc::open(b)
                .and_then(|p| ClientFence::open(&p, welcome.fence).map(|f| (p, f)))
                .map_err(|e| {
                    tracing::debug!(parent: &span, error = %e, "no same-host access to the peer (kernel or peer refused); using tcp");
                })
                .ok(),
            _ => None,
        };
        let (cma, fence) = match local {
            None => (None, None),
            Some((_, fence)) if ucx.is_some() || device.is_some() => (None, Some(fence)),
            Some((proc, fence)) => match lane
                .try_clone_stream()
                .and_then(|watch| SameHostPath::setup(proc, &welcome.table, watch))
            {
                Ok(c) => (Some(c), Some(fence)),
                Err(e) => {
                    tracing::debug!(parent: &span, error = %e, "same-host transport refused by the kernel; using tcp");
                    (None, None)
                }
            },
        };
        if policy == SameHost::Require && cma.is_none() && device.is_none() {
            return Err(Error::TransportUnavailable {
                peer,
                transport: "cma",
                why: "the peer is not on this host (boot id and pid namespace), or the kernel refused access",
            });
        }
        tracing::debug!(parent: &span, regions = welcome.table.len(), remote_instance = welcome.instance,
            elapsed_us = started.elapsed().as_micros() as u64, "connected");
        Ok(Arc::new(LinkShared {
            id,
            peer,
            addr,
            token: welcome.token,
            remote_instance: welcome.instance,
            remote_pid: welcome.pid,
            table: welcome.table,
            engine_id: engine.engine_id,
            instance: engine.instance,
            name: engine.name.to_owned(),
            max_lanes: engine.options.max_lanes,
            parallel: engine.options.parallel_lanes.min(engine.options.max_lanes),
            pool: Mutex::new(Pool {
                idle: vec![lane],
                open: 1,
                broken: None,
                closed: false,
            }),
            freed: Condvar::new(),
            next_req: AtomicU64::new(1),
            jobs: Mutex::new(Jobs::default()),
            jobs_cv: Condvar::new(),
            unfinished: Mutex::new(BTreeSet::new()),
            finished_cv: Condvar::new(),
            counters: LinkCounters::default(),
            cma,
            ucx,
            device: device.map(|d| Mutex::new(Some(d))),
            fence,
            psk,
            span,
        }))
    }

    /// Whether the link broke (or was closed).
    pub(crate) fn is_broken(&self) -> bool {
        lock(&self.pool).broken.is_some()
    }

    pub(crate) fn is_closed(&self) -> bool {
        lock(&self.pool).closed
    }

    /// Takes an idle lane, opens a new one (up to `max_lanes`), or waits for one.
    fn checkout(
        &self,
        deadline: Instant,
        started: Instant,
        op: &'static str,
    ) -> Result<Lane, Error> {
        let mut pool = lock(&self.pool);
        loop {
            if let Some(why) = &pool.broken {
                return Err(Error::NotConnected {
                    peer: self.peer.clone(),
                    why: why.clone(),
                });
            }
            if let Some(l) = pool.idle.pop() {
                return Ok(l);
            }
            if pool.open < self.max_lanes {
                pool.open += 1;
                drop(pool);
                let hello = Hello {
                    role: LaneRole::Join,
                    instance: self.instance,
                    token: self.token,
                    name: self.name.clone(),
                    target: self.peer.clone(),
                    host: None,
                    nonce: crate::auth::nonce(),
                };
                return match Lane::open(self.addr, &hello, self.psk.as_ref(), deadline) {
                    Ok((lane, _)) => {
                        tracing::trace!(parent: &self.span, "lane opened");
                        Ok(lane)
                    }
                    Err(f) => {
                        let dead = match &f {
                            LaneFail::Refused { .. } => true,
                            LaneFail::Io(e) => is_gone(e),
                            LaneFail::Protocol(_) | LaneFail::Auth(_) => false,
                        };
                        let e = lane_error(f, op, &self.peer, started, false);
                        self.discard(dead.then(|| format!("cannot open a new lane: {e}")));
                        Err(e)
                    }
                };
            }
            let rem = deadline.saturating_duration_since(Instant::now());
            if rem.is_zero() {
                return Err(Error::LanesExhausted {
                    peer: self.peer.clone(),
                    lanes: pool.open,
                });
            }
            pool = self
                .freed
                .wait_timeout(pool, rem)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn checkin(&self, lane: Lane) {
        let mut pool = lock(&self.pool);
        if pool.closed || pool.broken.is_some() {
            pool.open -= 1;
            drop(pool);
            drop(lane);
        } else {
            pool.idle.push(lane);
        }
        self.freed.notify_one();
    }

    /// Forgets a dead lane; `broken` marks the whole link unusable.
    fn discard(&self, broken: Option<String>) {
        let mut pool = lock(&self.pool);
        pool.open -= 1;
        match broken {
            Some(why) => self.break_locked(&mut pool, why),
            None => self.freed.notify_one(),
        }
    }

    /// Marks the link unusable (the first reason stays), drops its idle lanes and wakes every
    /// caller waiting for a lane, so they see `NOT_CONNECTED` at once.
    fn mark_broken(&self, why: String) {
        self.break_locked(&mut lock(&self.pool), why);
    }

    fn break_locked(&self, pool: &mut Pool, why: String) {
        if pool.broken.is_none() {
            tracing::debug!(parent: &self.span, why = %why, "link broken");
            pool.broken = Some(why);
        }
        pool.idle.clear();
        self.freed.notify_all();
    }

    /// Puts a lane back, or drops it when a failure left it out of step (see [`LaneAfter`]).
    fn release(&self, lane: Lane, after: LaneAfter) {
        match after {
            LaneAfter::Reuse => self.checkin(lane),
            LaneAfter::Gone(why) => {
                drop(lane);
                self.discard(Some(why));
            }
            LaneAfter::Discard => {
                drop(lane);
                self.discard(None);
            }
        }
    }

    /// The link's data paths other than its TCP lanes, in preference order: device (HCCL),
    /// UCX, same-host.
    fn data_paths(&self) -> impl Iterator<Item = &dyn DataPath> {
        let device = self.device.as_ref().map(|d| d as &dyn DataPath);
        let ucx = self.ucx.as_ref().map(|u| u as &dyn DataPath);
        let cma = self.cma.as_ref().map(|c| c as &dyn DataPath);
        device.into_iter().chain(ucx).chain(cma)
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
            crate::transport::same_host::fence::test_pause();
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
        if path.refused_when_broken()
            && let Some(why) = &lock(&self.pool).broken
        {
            return Err(Error::NotConnected {
                peer: self.peer.clone(),
                why: why.clone(),
            });
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
        err: Option<crate::Status>,
    ) {
        self.counters.finish(op, bytes, took, err);
        lock(&self.unfinished).remove(&seq);
        self.finished_cv.notify_all();
    }

    fn enqueue(self: &Arc<Self>, job: Job) {
        let mut jobs = lock(&self.jobs);
        jobs.queue.push_back(job);
        if jobs.idle > 0 {
            self.jobs_cv.notify_one();
        } else if jobs.workers < self.max_lanes {
            jobs.workers += 1;
            let me = self.clone();
            let spawned = std::thread::Builder::new()
                .name("hixl-async".into())
                .spawn(move || me.worker());
            if spawned.is_err() {
                jobs.workers -= 1;
                // nobody can run it: fail what is queued rather than leave it waiting
                let stranded: Vec<Job> = jobs.queue.drain(..).collect();
                drop(jobs);
                for j in stranded {
                    if j.state.claim_queued() {
                        let e = Error::LanesExhausted {
                            peer: self.peer.clone(),
                            lanes: 0,
                        };
                        j.state.finish(self, Outcome::Failed(Arc::new(e)));
                    }
                }
            }
        }
    }

    fn worker(self: Arc<Self>) {
        loop {
            let job = {
                let mut jobs = lock(&self.jobs);
                loop {
                    if let Some(j) = jobs.queue.pop_front() {
                        break j;
                    }
                    if self.is_closed() {
                        jobs.workers -= 1;
                        return;
                    }
                    jobs.idle += 1;
                    let (g, t) = self
                        .jobs_cv
                        .wait_timeout(jobs, WORKER_IDLE)
                        .unwrap_or_else(|e| e.into_inner());
                    jobs = g;
                    jobs.idle -= 1;
                    if t.timed_out() && jobs.queue.is_empty() {
                        jobs.workers -= 1;
                        return;
                    }
                }
            };
            self.execute(job);
        }
    }

    /// One heartbeat: PING on an idle lane; no PONG within `timeout` breaks the link (a silent
    /// peer: stopped, hung, or cut off). Links that are busy (no idle lane) prove themselves by
    /// their transfers; same-host links watch the peer's pidfd instead (a stopped peer still
    /// serves them).
    pub(crate) fn heartbeat(&self, timeout: Duration) {
        if self.cma.is_some() {
            return;
        }
        if self.ucx.as_ref().is_some_and(|u| u.is_failed()) {
            self.mark_broken("the UCX endpoint failed (peer unreachable)".into());
            return;
        }
        let lane = {
            let mut pool = lock(&self.pool);
            if pool.closed || pool.broken.is_some() {
                return;
            }
            match pool.idle.pop() {
                Some(l) => Some(l),
                // lanes at work have their own deadlines
                None if pool.open > 0 => return,
                // no lane at all (the last one died with a timed-out transfer): the peer must
                // still accept a new one
                None => None,
            }
        };
        let mut lane = match lane {
            Some(l) => l,
            None => {
                let now = Instant::now();
                match self.checkout(now + timeout, now, "heartbeat") {
                    Ok(l) => l,
                    Err(e) => {
                        self.mark_broken(format!("no heartbeat answer: {e}"));
                        return;
                    }
                }
            }
        };
        match lane.ping(Instant::now() + timeout) {
            Ok(()) => self.checkin(lane),
            Err(f) => {
                drop(lane);
                let why = match f {
                    LaneFail::Io(e) if !is_gone(&e) => {
                        format!("no heartbeat answer within {timeout:?}")
                    }
                    LaneFail::Io(e) => format!("peer went away: {e}"),
                    _ => "the heartbeat was answered wrongly".to_owned(),
                };
                self.discard(Some(why));
            }
        }
    }

    /// Closes the link, waiting up to `timeout` for the peer's acknowledgement.
    pub(crate) fn close_timeout(&self, timeout: Duration) -> Result<(), Error> {
        self.close(timeout)
    }

    /// Closes the link, briefly, ignoring errors (teardown).
    pub(crate) fn close_quietly(&self) {
        if !self.is_closed() {
            let _ = self.close(Duration::from_millis(200));
        }
    }

    fn close(&self, timeout: Duration) -> Result<(), Error> {
        let started = Instant::now();
        let deadline = started + timeout;
        let (lane, broken) = {
            let mut pool = lock(&self.pool);
            (pool.idle.pop(), pool.broken.is_some())
        };
        let r = match (lane, broken) {
            (Some(mut lane), false) => lane
                .bye(deadline)
                .map_err(|f| lane_error(f, "disconnect", &self.peer, started, false)),
            _ => Ok(()),
        };
        {
            let mut pool = lock(&self.pool);
            pool.open -= pool.idle.len();
            pool.idle.clear();
            pool.broken.get_or_insert_with(|| "disconnected".into());
            pool.closed = true;
        }
        if let Some(dev) = &self.device {
            // unbind the regions and destroy the communicator now, not when the last worker
            // lets go of the link
            drop(lock(dev).take());
        }
        self.freed.notify_all();
        self.jobs_cv.notify_all();
        tracing::debug!(parent: &self.span, ok = r.is_ok(), "disconnected");
        r
    }
}

/// Bytes per lane below which a TCP transfer is not split across lanes.
const SPLIT_MIN: u64 = 8 << 20;

/// Splits a batch into up to `lanes` parts of about equal bytes (cutting descriptors where
/// needed), or returns it whole when it is too small to gain from more lanes.
fn split(xds: &[LaneDesc], bytes: u64, lanes: usize, min_part: u64) -> Vec<Vec<LaneDesc>> {
    let parts = (lanes as u64).min(bytes / min_part).max(1) as usize;
    if parts < 2 {
        return Vec::new();
    }
    let share = bytes.div_ceil(parts as u64);
    let mut out: Vec<Vec<LaneDesc>> = vec![Vec::new()];
    let mut room = share;
    for d in xds {
        let mut d = *d;
        while d.remote.len > 0 {
            if room == 0 {
                out.push(Vec::new());
                room = share;
            }
            let take = d.remote.len.min(room);
            let last = out.last_mut().expect("at least one part");
            last.push(LaneDesc {
                local: d.local,
                remote: WireDesc {
                    region: d.remote.region,
                    offset: d.remote.offset,
                    len: take,
                },
            });
            d.local += take as usize;
            d.remote.offset += take;
            d.remote.len -= take;
            room -= take;
        }
    }
    out
}

/// What becomes of a lane after an operation, decided from how it failed (if it did) before
/// the failure is turned into the caller's error (which keeps the `io::Error` itself).
enum LaneAfter {
    /// Back into the pool: it is still in step with the peer.
    Reuse,
    /// The peer went away: the link is broken, for this reason.
    Gone(String),
    /// Out of step: closed, the link stays usable.
    Discard,
}

impl LaneAfter {
    fn of(f: Option<&LaneFail>) -> Self {
        match f {
            None | Some(LaneFail::Refused { usable: true, .. }) => Self::Reuse,
            Some(LaneFail::Io(e)) if is_gone(e) => Self::Gone(format!("peer went away: {e}")),
            Some(_) => Self::Discard,
        }
    }
}

/// A connection to one remote engine, borrowed from the connected engine.
pub struct Link<'e> {
    engine: EngineRef<'e>,
    pub(crate) shared: Arc<LinkShared>,
}

/// How a link holds its engine: borrowed (the typed API: the borrow checker keeps the engine in
/// `Connected` while the link lives), or owned (the runtime-checked [`crate::compat`] engine,
/// which checks the same rules itself before it leaves `Connected`).
enum EngineRef<'e> {
    Borrowed(&'e EngineInner),
    Owned(Arc<EngineInner>),
}

impl std::ops::Deref for EngineRef<'_> {
    type Target = EngineInner;
    fn deref(&self) -> &EngineInner {
        match self {
            EngineRef::Borrowed(e) => e,
            EngineRef::Owned(e) => e,
        }
    }
}

impl fmt::Debug for Link<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("id", &self.shared.id)
            .field("peer", &self.shared.peer)
            .field("remote_instance", &self.shared.remote_instance)
            .field("regions", &self.shared.table.len())
            .finish()
    }
}

impl<'e> Link<'e> {
    pub(crate) fn from_shared(engine: &'e EngineInner, shared: Arc<LinkShared>) -> Self {
        Link {
            engine: EngineRef::Borrowed(engine),
            shared,
        }
    }

    /// The remote engine's name.
    pub fn peer(&self) -> &str {
        &self.shared.peer
    }
    /// This link's id: unique in the process, and increasing, so it is also the link's
    /// generation: a link that supersedes a broken one to the same peer has a larger id.
    pub fn id(&self) -> u64 {
        self.shared.id
    }
    /// The remote engine's per-process instance id (changes when the peer restarts).
    pub fn remote_instance(&self) -> u64 {
        self.shared.remote_instance
    }
    /// The remote engine's process id, as it reported it.
    pub fn remote_pid(&self) -> u32 {
        self.shared.remote_pid
    }
    /// The transport carrying this link's data: [`TransportKind::Cma`](crate::TransportKind::Cma)
    /// when the peer is on this host and the kernel allows it, TCP otherwise.
    pub fn transport(&self) -> crate::TransportKind {
        if self.shared.device.is_some() {
            crate::TransportKind::Ascend
        } else if self.shared.ucx.is_some() {
            crate::TransportKind::Ucx
        } else if self.shared.cma.is_some() {
            crate::TransportKind::Cma
        } else {
            crate::TransportKind::Tcp
        }
    }
    /// Whether the link broke (its peer went away or refused a lane). A broken link stays
    /// broken: disconnect it and connect again.
    pub fn is_broken(&self) -> bool {
        self.shared.is_broken()
    }

    /// The peer's registered regions, as it sent them at connect, sorted by address.
    pub fn regions(&self) -> impl ExactSizeIterator<Item = RemoteRegion<'_>> + '_ {
        self.shared.table.iter().map(move |e| RemoteRegion {
            link: self,
            entry: *e,
        })
    }

    /// The peer's region with this id.
    ///
    /// # Errors
    /// [`Error::RemoteNotRegistered`] if the peer's table has no such region.
    pub fn region(&self, id: u32) -> Result<RemoteRegion<'_>, Error> {
        self.shared
            .table
            .iter()
            .find(|e| e.id == id)
            .map(|e| RemoteRegion {
                link: self,
                entry: *e,
            })
            .ok_or_else(|| Error::RemoteNotRegistered {
                peer: self.shared.peer.clone(),
                addr: 0,
                len: 0,
            })
    }

    /// The remote range `addr..addr+len` in the peer's address space (HIXL's form); it must lie
    /// inside one region of the peer's table.
    ///
    /// # Errors
    /// [`Error::RemoteNotRegistered`] (`PARAM_INVALID`) if it does not, or `len` is zero.
    pub fn remote(&self, addr: u64, len: u64) -> Result<RemoteRange<'_>, Error> {
        let not_registered = || Error::RemoteNotRegistered {
            peer: self.shared.peer.clone(),
            addr,
            len,
        };
        let table = &self.shared.table;
        let end = addr
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or_else(not_registered)?;
        let i = table.partition_point(|e| e.addr <= addr);
        let e = i
            .checked_sub(1)
            .map(|i| &table[i])
            .ok_or_else(not_registered)?;
        if end > e.addr + e.len {
            return Err(not_registered());
        }
        Ok(self.make_range(e, addr - e.addr, len))
    }

    fn make_range(&self, e: &TableEntry, offset: u64, len: u64) -> RemoteRange<'_> {
        RemoteRange {
            link: self.shared.id,
            region: e.id,
            offset,
            len,
            access: e.access,
            mem_type: e.mem_type,
            _link: PhantomData,
        }
    }

    /// Checks a batch and turns it into lane descriptors; returns them and the byte count.
    fn prepare(
        &self,
        op: TransferOp,
        descs: &[TransferDesc<'_>],
        xds: &mut Vec<LaneDesc>,
    ) -> Result<u64, Error> {
        if descs.is_empty() {
            return Err(Error::EmptyBatch);
        }
        if descs.len() > MAX_BATCH {
            return Err(Error::BatchTooLarge {
                count: descs.len(),
                limit: MAX_BATCH,
            });
        }
        let mut bytes = 0u64;
        xds.reserve(descs.len());
        for (index, d) in descs.iter().enumerate() {
            if d.local.core.engine != self.shared.engine_id {
                return Err(Error::ForeignHandle {
                    what: "local region",
                    owner: d.local.core.engine,
                    engine: self.shared.engine_id,
                });
            }
            if d.remote.link != self.shared.id {
                return Err(Error::ForeignHandle {
                    what: "remote range",
                    owner: d.remote.link,
                    engine: self.shared.id,
                });
            }
            if d.local.len as u64 != d.remote.len {
                return Err(Error::LengthMismatch {
                    index,
                    local: d.local.len as u64,
                    remote: d.remote.len,
                });
            }
            if !d.remote.access.permits(op) {
                return Err(Error::AccessDenied {
                    op,
                    region: d.remote.region,
                    access: d.remote.access.name(),
                });
            }
            let host_only = self.shared.device.is_none();
            if host_only && d.local.core.mem_type != MemType::Host {
                return Err(Error::UnsupportedMemory {
                    mem_type: d.local.core.mem_type,
                    why: "the tcp and same-host transports move host memory only",
                });
            }
            if host_only && d.remote.mem_type != MemType::Host {
                return Err(Error::UnsupportedMemory {
                    mem_type: d.remote.mem_type,
                    why: "the peer's region is device memory: it needs a device link (Ascend \
                          on both engines)",
                });
            }
            bytes += d.remote.len;
            xds.push(LaneDesc {
                local: d.local.ptr() as usize,
                remote: WireDesc {
                    region: d.remote.region,
                    offset: d.remote.offset,
                    len: d.remote.len,
                },
            });
        }
        Ok(bytes)
    }

    /// Runs a batch of READ or WRITE descriptors and returns when all have completed (HIXL
    /// `TransferSync`). The batch is sent in one request (up to 65,536 descriptors per frame),
    /// not one round trip per descriptor.
    ///
    /// # Errors
    /// - `PARAM_INVALID`: [`Error::InvalidTimeout`], [`Error::EmptyBatch`],
    ///   [`Error::BatchTooLarge`], [`Error::ForeignHandle`] (a region of another engine or a
    ///   range of another link), [`Error::LengthMismatch`], [`Error::AccessDenied`] (the peer's
    ///   table forbids `op`), or [`Error::Refused`] when the peer's own validation refuses it;
    /// - `TIMEOUT`: [`Error::Timeout`], and the data of the batch is unspecified;
    /// - `NOT_CONNECTED`: [`Error::NotConnected`] when the peer went away (the link is broken);
    /// - `RESOURCE_EXHAUSTED`: [`Error::LanesExhausted`];
    /// - `FAILED`: [`Error::Io`] or [`Error::Protocol`].
    pub fn transfer_sync(
        &self,
        op: TransferOp,
        descs: &[TransferDesc<'_>],
        timeout: Duration,
    ) -> Result<(), Error> {
        let timeout = check_timeout(timeout)?;
        let started = Instant::now();
        let deadline = started + timeout;
        let mut xds = Vec::new();
        let bytes = self.prepare(op, descs, &mut xds)?;
        let sh = &*self.shared;
        sh.counters.start(op);
        // large TCP batches: one part per lane (the same-host path shares large copies with a
        // helper thread itself)
        let direct = sh.direct_path(&xds);
        let parts = if direct.is_some() {
            Vec::new()
        } else {
            split(&xds, bytes, sh.parallel, SPLIT_MIN)
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
            run(&xds)
        };
        let took = started.elapsed();
        sh.counters
            .finish(op, bytes, took, r.as_ref().err().map(Error::status));
        match &r {
            Ok(()) => {
                tracing::trace!(parent: &sh.span, %op, descs = descs.len(), us = took.as_micros() as u64, "transfer done")
            }
            Err(e) => {
                tracing::trace!(parent: &sh.span, %op, descs = descs.len(), error = %e, "transfer failed")
            }
        }
        r
    }

    /// Starts a batch and returns at once (HIXL `TransferAsync`).
    ///
    /// The request borrows what its descriptors borrow (the link, and each local region), so
    /// while it is held its regions cannot be written or read with `write_at`/`read_at` (they
    /// need `&mut`) and cannot be deregistered: the engine may still be copying them. Starting
    /// many requests and then waiting for all of them is fine (shared borrows). It also owns
    /// what it touches: the local regions stay alive and registered until it ends, even if the
    /// request is dropped or `mem::forget`ten; while a forgotten request has not ended, its
    /// regions answer `read_at`, `write_at` and `deregister` with `RegionBusy` (203900).
    ///
    /// ```no_run
    /// # use hixl::{Error, Link, Region, TransferArgs, TransferDesc, TransferOp, TransferReq, TransferStatus};
    /// # use std::time::Duration;
    /// # fn layers(link: &Link<'_>, kv: &mut Region, remote: u64) -> Result<(), Error> {
    /// // one request per layer, all in flight at once, then wait for every one
    /// let reqs = (0..4usize)
    ///     .map(|i| {
    ///         let local = kv.range(i * 4096..(i + 1) * 4096)?;
    ///         let d = TransferDesc::new(local, link.remote(remote + (i * 4096) as u64, 4096)?);
    ///         link.transfer_async(TransferOp::Write, &[d], TransferArgs::tagged(i as u64))
    ///     })
    ///     .collect::<Result<Vec<TransferReq<'_>>, Error>>()?;
    /// for r in &reqs {
    ///     assert!(matches!(r.wait(Duration::from_secs(5)), TransferStatus::Completed));
    /// }
    /// drop(reqs);
    /// kv.write_at(0, b"next layer")?; // the requests are gone: the region is ours again
    /// # Ok(()) }
    /// ```
    ///
    /// The engine enforces the deadline (`args.timeout` from now): a request that has not
    /// finished by then ends [`TransferStatus::TimedOut`](crate::TransferStatus::TimedOut). Many
    /// requests may be in flight on one link; they run on up to `max_lanes` lanes and complete
    /// in any order.
    ///
    /// # Errors
    /// The validation errors of [`Link::transfer_sync`] (before anything starts), and
    /// [`Error::NotConnected`] if the link is broken.
    pub fn transfer_async<'s>(
        &'s self,
        op: TransferOp,
        descs: &[TransferDesc<'s>],
        args: TransferArgs,
    ) -> Result<TransferReq<'s>, Error> {
        self.start_async(op, descs, args)
    }

    /// [`Link::transfer_async`] with the request's lifetime left to the caller. The request owns
    /// what the transfer touches (its regions and the link's state, by `Arc`), so it is sound
    /// for any lifetime; the borrow in `transfer_async` is what keeps `write_at`/`read_at`
    /// (`&mut Region`) from running beside it in the typed API. The [`crate::compat`] engine,
    /// which hands out no `&mut` access to its (caller-managed) memory, holds requests by id.
    pub(crate) fn start_async<'r>(
        &self,
        op: TransferOp,
        descs: &[TransferDesc<'_>],
        args: TransferArgs,
    ) -> Result<TransferReq<'r>, Error> {
        let timeout = check_timeout(args.timeout)?;
        if let Some(why) = &lock(&self.shared.pool).broken {
            return Err(Error::NotConnected {
                peer: self.shared.peer.clone(),
                why: why.clone(),
            });
        }
        let mut xds = Vec::new();
        let bytes = self.prepare(op, descs, &mut xds)?;
        let mut keep: Vec<RegionUse> = Vec::new();
        for d in descs {
            if !keep.iter().any(|k| Arc::ptr_eq(k.core(), d.local.core)) {
                keep.push(RegionUse::new(d.local.core));
            }
        }
        let seq = self.shared.next_req.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ReqState::new(seq, op, args.user_data, bytes, timeout, keep));
        lock(&self.shared.unfinished).insert(seq);
        self.shared.counters.start(op);
        crate::request::watch(&state, &self.shared);
        self.shared.enqueue(Job {
            state: state.clone(),
            xds,
        });
        Ok(TransferReq::new(state, self.shared.clone()))
    }

    /// Sends a notification to the peer and waits for its acknowledgement (HIXL `SendNotify`).
    ///
    /// It is delivered after every transfer started earlier on this link has ended: a
    /// notification sent after a WRITE (sync, or async and still running) reaches the peer only
    /// once that WRITE's data has landed. That makes it the KV-ready signal.
    ///
    /// # Errors
    /// - `PARAM_INVALID`: [`Error::InvalidTimeout`], [`Error::NotifyTooLong`];
    /// - `RESOURCE_EXHAUSTED`: the peer has 4096 notifications of this link pending (in
    ///   [`Error::Refused`]);
    /// - `TIMEOUT`: [`Error::Timeout`] (no acknowledgement, or earlier transfers still running);
    /// - `NOT_CONNECTED` and `FAILED` as for transfers.
    pub fn send_notify(&self, name: &str, msg: &str, timeout: Duration) -> Result<(), Error> {
        let timeout = check_timeout(timeout)?;
        for (what, s) in [("name", name), ("message", msg)] {
            if s.len() > MAX_NOTIFY_LEN {
                return Err(Error::NotifyTooLong {
                    what,
                    len: s.len(),
                    limit: MAX_NOTIFY_LEN,
                });
            }
        }
        let sh = &*self.shared;
        let started = Instant::now();
        let deadline = started + timeout;
        let me = sh.next_req.fetch_add(1, Ordering::Relaxed);
        {
            let mut unfinished = lock(&sh.unfinished);
            while unfinished.range(..me).next().is_some() {
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

    /// Closes the link (HIXL `Disconnect`): tells the peer, waits for its acknowledgement up to
    /// `timeout`, and closes every lane. Consumes the link.
    ///
    /// # Errors
    /// [`Error::InvalidTimeout`] for a zero timeout (the link is closed anyway); otherwise the
    /// error of the goodbye exchange. The link is closed on the local side in every case.
    pub fn disconnect(self, timeout: Duration) -> Result<(), Error> {
        let r = check_timeout(timeout).and_then(|t| self.shared.close(t));
        self.shared.close_quietly();
        r
    }
}

impl Link<'static> {
    /// A link that owns a reference to its engine instead of borrowing it (for the
    /// runtime-checked [`crate::compat`] engine, which closes its links before the engine
    /// leaves `Connected`; a link it forgets is ended by `deactivate`/`finalize` like any other).
    pub(crate) fn owning(engine: Arc<EngineInner>, shared: Arc<LinkShared>) -> Self {
        Link {
            engine: EngineRef::Owned(engine),
            shared,
        }
    }
}

impl Drop for Link<'_> {
    fn drop(&mut self) {
        self.shared.close_quietly();
        self.engine.forget_link(&self.shared);
    }
}

fn is_gone(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof
            | ConnectionReset
            | ConnectionAborted
            | BrokenPipe
            | NotConnected
            | ConnectionRefused
    )
}

pub(crate) fn lane_error(
    f: LaneFail,
    op: &'static str,
    peer: &str,
    started: Instant,
    connecting: bool,
) -> Error {
    match f {
        LaneFail::Refused { status, reason, .. } => Error::Refused {
            op,
            peer: peer.to_owned(),
            refusal: RemoteRefusal { status, reason },
        },
        LaneFail::Io(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ) =>
        {
            Error::Timeout {
                op,
                peer: peer.to_owned(),
                elapsed: started.elapsed(),
            }
        }
        LaneFail::Io(e) if connecting => Error::ConnectFailed {
            peer: peer.to_owned(),
            source: e,
        },
        LaneFail::Io(e) if is_gone(&e) => Error::NotConnected {
            peer: peer.to_owned(),
            why: format!("peer went away during {op}: {e}"),
        },
        LaneFail::Io(e) => Error::Io {
            op,
            peer: peer.to_owned(),
            source: e,
        },
        LaneFail::Protocol(problem) => Error::Protocol {
            peer: peer.to_owned(),
            problem,
        },
        LaneFail::Auth(why) => Error::AuthFailed {
            peer: peer.to_owned(),
            why,
        },
    }
}

/// A new link's first lane as a transport's setup sees it ([`Control`]): lane failures become
/// the caller's errors of `connect`.
struct LaneControl<'a> {
    lane: &'a mut Lane,
    peer: &'a str,
    started: Instant,
}

impl Control for LaneControl<'_> {
    fn send(&mut self, frame: &[u8], deadline: Instant) -> Result<(), Error> {
        let r = self.lane.send_frame(frame, deadline);
        r.map_err(|f| self.fail(f))
    }
    fn recv(&mut self, deadline: Instant) -> Result<(wire::Kind, Vec<u8>), Error> {
        let r = self.lane.recv_any(deadline);
        r.map_err(|f| self.fail(f))
    }
    fn protocol(&self, problem: String) -> Error {
        self.fail(LaneFail::Protocol(problem))
    }
    fn refused(&self, status: crate::error::Status, reason: String) -> Error {
        self.fail(LaneFail::Refused {
            status,
            reason,
            usable: false,
        })
    }
}

impl LaneControl<'_> {
    fn fail(&self, f: LaneFail) -> Error {
        lane_error(f, "connect", self.peer, self.started, false)
    }
}

/// One region of the peer's table, seen through a link.
#[derive(Clone, Copy)]
pub struct RemoteRegion<'l> {
    link: &'l Link<'l>,
    entry: TableEntry,
}

impl<'l> RemoteRegion<'l> {
    /// The region's id in the peer's table.
    pub fn id(&self) -> u32 {
        self.entry.id
    }
    /// Its start address in the peer's address space.
    pub fn addr(&self) -> u64 {
        self.entry.addr
    }
    /// Its length.
    pub fn len(&self) -> u64 {
        self.entry.len
    }
    /// Always false: empty regions are never registered.
    pub fn is_empty(&self) -> bool {
        self.entry.len == 0
    }
    /// Its memory type.
    pub fn mem_type(&self) -> MemType {
        self.entry.mem_type
    }
    /// What this engine may do with it.
    pub fn access(&self) -> Access {
        self.entry.access
    }
    /// A validated sub-range (offsets relative to the region start).
    ///
    /// # Errors
    /// [`Error::RangeOutOfBounds`] (`PARAM_INVALID`) when it is empty or leaves the region.
    pub fn range(&self, range: impl RangeBounds<u64>) -> Result<RemoteRange<'l>, Error> {
        use std::ops::Bound::*;
        let total = self.entry.len;
        let start = match range.start_bound() {
            Included(&s) => Some(s),
            Excluded(&s) => s.checked_add(1),
            Unbounded => Some(0),
        };
        let end = match range.end_bound() {
            Included(&e) => e.checked_add(1),
            Excluded(&e) => Some(e),
            Unbounded => Some(total),
        };
        match (start, end) {
            (Some(s), Some(e)) if s < e && e <= total => {
                Ok(self.link.make_range(&self.entry, s, e - s))
            }
            _ => Err(Error::RangeOutOfBounds {
                region: self.entry.id,
                offset: start.unwrap_or(u64::MAX),
                len: match (start, end) {
                    (Some(s), Some(e)) => e.saturating_sub(s),
                    _ => u64::MAX,
                },
                region_len: total,
            }),
        }
    }
    /// The whole region.
    pub fn full(&self) -> RemoteRange<'l> {
        self.link.make_range(&self.entry, 0, self.entry.len)
    }
}

impl fmt::Debug for RemoteRegion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteRegion")
            .field("id", &self.entry.id)
            .field("addr", &format_args!("{:#x}", self.entry.addr))
            .field("len", &self.entry.len)
            .field("access", &self.entry.access)
            .finish()
    }
}

/// A validated, non-empty range of a region in the peer's table; it borrows its link.
#[derive(Clone, Copy)]
pub struct RemoteRange<'l> {
    pub(crate) link: u64,
    pub(crate) region: u32,
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
    pub(crate) mem_type: MemType,
    _link: PhantomData<&'l ()>,
}

impl RemoteRange<'_> {
    /// The peer's region id.
    pub fn region_id(&self) -> u32 {
        self.region
    }
    /// Offset in that region.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Always false: ranges are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Debug for RemoteRange<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteRange")
            .field("link", &self.link)
            .field("region", &self.region)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
