//! The link core: one link's state under the `Link` handle — its TCP lane pool, its other
//! data paths (device, UCX, same-host) and the server's fence, opening (`LinkShared::open`),
//! heartbeat and close, and how lane failures become the caller's errors. How a batch runs
//! (data-path dispatch, splitting across lanes, async workers) is in `exec.rs`.

mod exec;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::error::{Error, RemoteRefusal};
use crate::metrics::LinkCounters;
use crate::options::SameHost;
use crate::process::PeerProc;
use crate::runtime::executor::Queue;
use crate::runtime::request::ReqState;
use crate::runtime::revoke::fence::ClientFence;
use crate::sync::lock;
use crate::transport::tcp::{Lane, LaneFail};
use crate::transport::{Backend, Control, DataPath, Health, Setup, TransportKind};
use crate::types::HostId;
use crate::wire::{self, Hello, LaneRole, TableEntry};

/// Most descriptors in one transfer call.
pub const MAX_BATCH: usize = 1 << 20;

struct Pool {
    idle: Vec<Lane>,
    open: usize,
    broken: Option<String>,
    /// Set once the link was closed (by `disconnect` or `Drop`).
    closed: bool,
}

impl Pool {
    /// `Err(NotConnected)` once the link to `peer` is broken.
    fn usable(&self, peer: &str) -> Result<(), Error> {
        match &self.broken {
            Some(why) => Err(Error::NotConnected {
                peer: peer.to_owned(),
                why: why.clone(),
            }),
            None => Ok(()),
        }
    }
}

/// The link's async requests that have not ended, by sequence number (notifications wait for
/// earlier ones; `close` cancels and waits for all of them).
#[derive(Default)]
struct Unfinished {
    reqs: BTreeMap<u64, Weak<ReqState>>,
    /// Set by `close`: no request starts any more.
    closed: bool,
}

/// A link's state, shared by the [`Link`](crate::Link) handle, async requests and async worker threads.
pub(crate) struct LinkShared {
    pub(crate) id: u64,
    pub(crate) peer: String,
    addr: SocketAddr,
    token: u64,
    pub(crate) remote_instance: u64,
    pub(crate) remote_pid: u32,
    /// Sorted by address, disjoint (checked when decoded).
    pub(crate) table: Vec<TableEntry>,
    pub(crate) engine_id: u64,
    instance: u64,
    name: String,
    max_lanes: usize,
    /// How many lanes one large transfer may use at once.
    parallel: usize,
    pool: Mutex<Pool>,
    freed: Condvar,
    next_req: AtomicU64,
    /// The link's async requests, started in order, at most `max_lanes` at once.
    queue: Arc<Queue>,
    /// Async requests not finished yet.
    unfinished: Mutex<Unfinished>,
    finished_cv: Condvar,
    pub(crate) counters: LinkCounters,
    /// The data paths other than the TCP lanes, in preference order (device, UCX, same host):
    /// the ones the engine's transports set up with the peer.
    paths: Vec<Box<dyn DataPath>>,
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
    /// The engine's transports besides TCP, in preference order.
    pub(crate) backends: &'a [Arc<dyn Backend>],
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
            nonce: crate::auth::nonce()?,
        };
        let psk = engine.options.psk.clone();
        let (mut lane, welcome) = Lane::open(addr, &hello, psk.as_ref(), deadline)
            .map_err(|f| lane_error(f, "connect", &peer, started, true))?;
        let id = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
        let span = tracing::debug_span!(parent: engine.span, "link", id, peer = %peer);
        // on one host: the peer pinned, and its fence (one-sided access the server can revoke)
        let mut why_not = None;
        let local = match (&me, &welcome.host) {
            (Some(a), Some(b)) if a.same_host(b) => PeerProc::open(b)
                .and_then(|p| ClientFence::open(&p, welcome.fence).map(|f| (p, f)))
                .map_err(|e| {
                    tracing::debug!(parent: &span, error = %e, "no same-host access to the peer (kernel or peer refused); using tcp");
                    why_not = Some(
                        "the kernel refused access to the peer process, or the peer offered no \
                         fence (pidfd_open, /proc/PID/mem, pidfd_getfd)",
                    );
                })
                .ok(),
            _ => None,
        };
        let (local, mut fence) = local.map_or((None, None), |(p, f)| (Some(p), Some(f)));
        let mut paths: Vec<Box<dyn DataPath>> = Vec::new();
        {
            let _in_link = span.enter();
            let mut ctl = LaneControl {
                lane: &mut lane,
                peer: &peer,
                started,
            };
            let mut setup = Setup {
                me: engine.name,
                peer: &peer,
                table: &welcome.table,
                deadline,
                ctl: &mut ctl,
                local,
                covered: false,
                why_not,
            };
            for b in engine.backends {
                if let Some(p) = b.connect(&mut setup)? {
                    tracing::debug!(transport = ?b.kind(), "data path set up");
                    paths.push(p);
                    setup.covered = true;
                }
            }
            why_not = setup.why_not;
        }
        if welcome.fence >= 0 && fence.is_none() {
            // the server sees this client on its host, but its fence could not be taken: a
            // one-sided path would run outside it, where the server's `deactivate` cannot stop
            // it. Such paths go; the link moves its data over the others (TCP at least).
            paths.retain(|p| {
                if p.fenced() {
                    tracing::debug!(parent: &span, transport = ?p.kind(), "no fence: not used");
                    p.close();
                }
                !p.fenced()
            });
        }
        if paths.is_empty() {
            // no one-sided path: the fence guards nothing
            fence = None;
        }
        let one_sided = paths
            .iter()
            .any(|p| matches!(p.kind(), TransportKind::SameHost | TransportKind::Ascend));
        if policy == SameHost::Require && !one_sided {
            return Err(Error::TransportUnavailable {
                peer,
                transport: TransportKind::SameHost.name(),
                why: why_not.unwrap_or("the peer is not on this host (boot id and pid namespace)"),
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
            queue: Queue::new(engine.options.max_lanes),
            unfinished: Mutex::new(Unfinished::default()),
            finished_cv: Condvar::new(),
            counters: LinkCounters::default(),
            paths,
            fence,
            psk,
            span,
        }))
    }

    /// Whether the link broke (or was closed).
    pub(crate) fn is_broken(&self) -> bool {
        lock(&self.pool).broken.is_some()
    }

    /// `Err(NotConnected)` once the link is broken.
    pub(crate) fn check_usable(&self) -> Result<(), Error> {
        lock(&self.pool).usable(&self.peer)
    }

    /// Whether the link moves device memory (it has a device data path).
    pub(crate) fn has_device_path(&self) -> bool {
        self.paths.iter().any(|p| p.moves_device_memory())
    }

    /// The transport carrying the link's data: its preferred data path's, or TCP.
    pub(crate) fn transport(&self) -> crate::transport::TransportKind {
        let first = self.data_paths().next();
        first.map_or(crate::transport::TransportKind::Tcp, |p| p.kind())
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
            pool.usable(&self.peer)?;
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
                    nonce: crate::auth::nonce()?,
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
}

impl LinkShared {
    /// One heartbeat: PING on an idle lane; no PONG within `timeout` breaks the link (a silent
    /// peer: stopped, hung, or cut off). Links that are busy (no idle lane) prove themselves by
    /// their transfers; same-host links watch the peer's pidfd instead (a stopped peer still
    /// serves them).
    pub(crate) fn heartbeat(&self, timeout: Duration) {
        for p in &self.paths {
            match p.health() {
                Health::Unknown => {}
                Health::Watched => return,
                Health::Failed(why) => {
                    self.mark_broken(why);
                    return;
                }
            }
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

    /// Closes the link: no request starts on it any more, every async request still queued or
    /// running (held, dropped or forgotten) is cancelled, and the peer is told (BYE, waiting up
    /// to `timeout` for its answer). Returns only once every async request of the link has
    /// ended: from then on nothing of this link touches local memory. How long that takes is
    /// bounded by each transport's cancellation (a lane's socket is shut down; a same-host copy
    /// finishes the batch it is in; UCX stops waiting; a device batch ends by its deadline).
    pub(crate) fn close(&self, timeout: Duration) -> Result<(), Error> {
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
        self.freed.notify_all();
        self.end_requests();
        for p in &self.paths {
            p.close();
        }
        tracing::debug!(parent: &self.span, ok = r.is_ok(), "disconnected");
        r
    }

    /// Refuses new async requests, cancels every one that has not ended, and waits until each
    /// has (its worker saw the cancel, or it was still queued).
    fn end_requests(&self) {
        let pending: Vec<Arc<ReqState>> = {
            let mut u = lock(&self.unfinished);
            u.closed = true;
            u.reqs.values().filter_map(Weak::upgrade).collect()
        };
        for st in &pending {
            st.cancel(self);
        }
        drop(pending);
        let mut u = lock(&self.unfinished);
        loop {
            // a request whose state is gone cannot be running (its worker holds it)
            u.reqs.retain(|_, w| w.strong_count() > 0);
            if u.reqs.is_empty() {
                return;
            }
            tracing::trace!(parent: &self.span, requests = u.reqs.len(), "waiting for cancelled requests to end");
            u = self
                .finished_cv
                .wait_timeout(u, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
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
    fn watch(&self) -> std::io::Result<std::net::TcpStream> {
        self.watch_stream()
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
    fn watch_stream(&self) -> std::io::Result<std::net::TcpStream> {
        self.lane.try_clone_stream()
    }

    fn fail(&self, f: LaneFail) -> Error {
        lane_error(f, "connect", self.peer, self.started, false)
    }
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
