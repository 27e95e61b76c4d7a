//! A link's lanes: the pool its requests take a lane from (an idle one, a new one that JOINs
//! the link, up to `max_lanes`, or the next one freed), and the failure policy. A lane whose
//! request failed goes back to the pool while it is in step with the peer, is closed when it is
//! not, and breaks the link when the peer went away. The pool's state is the link's: once the
//! link is broken (by a lane, or by another data path through [`Lanes::break_link`]) or closed,
//! no lane is handed out and every caller waiting for one gets `NOT_CONNECTED`, a caller
//! opening a new lane included (its connection is shut down: a peer that stopped serving but
//! keeps its port would hold it unanswered in its backlog until the caller's deadline), and so
//! does a caller whose lane is in use: a break shuts every lane's connection down (the pool
//! holds each weakly), a close once its own deadline passed.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use super::lane::{Lane, LaneFail};
use crate::auth::Psk;
use crate::error::{Error, RemoteRefusal, Status, deadline_after};
use crate::sync::lock;
use crate::transport::Control;
use crate::types::TransferOp;
use crate::types::batch::Descs;
use crate::wire::{Hello, Kind, LaneRole, Welcome};

/// What a new lane says to JOIN its link.
pub(crate) struct Join {
    /// The peer's address and name.
    pub(crate) addr: SocketAddr,
    pub(crate) peer: String,
    /// This engine's instance id and name.
    pub(crate) instance: u64,
    pub(crate) name: String,
    /// The link's token (from the WELCOME).
    pub(crate) token: u64,
    /// The server's instance id (from the WELCOME): a joined lane's WELCOME must name the same
    /// engine and link.
    pub(crate) remote_instance: u64,
    /// The pre-shared key new lanes prove.
    pub(crate) psk: Option<Psk>,
}

struct Pool {
    idle: Vec<Lane>,
    open: usize,
    broken: Option<String>,
    /// Set once the link was closed (by `disconnect` or `Drop`).
    closed: bool,
    /// The peer refused a new lane for want of room (`RESOURCE_EXHAUSTED`): no more lanes than
    /// were open then, until the instant (the link keeps the lanes it has).
    full: Option<(usize, Instant)>,
    /// The connections of lanes being opened (their numbers, and a second handle on each):
    /// a break shuts them down, so their callers stop waiting for a WELCOME that may never
    /// come (a peer that stopped serving but keeps its port holds them in its backlog).
    opening: Vec<(u64, TcpStream)>,
    next_opening: u64,
    /// Every lane's connection, idle or in use (weakly: a lane that went closes its own): a
    /// break shuts them down, so a transfer waiting on a lane of its own ends at once too.
    live: Vec<Weak<TcpStream>>,
}

impl Pool {
    /// `Err(NotConnected)` once the link to `peer` is broken.
    fn usable(&self, peer: &str) -> Result<(), Error> {
        match (&self.broken, self.closed) {
            (Some(why), _) => Err(Error::NotConnected {
                peer: peer.to_owned(),
                why: why.clone(),
            }),
            (None, true) => Err(Error::NotConnected {
                peer: peer.to_owned(),
                why: "disconnected".into(),
            }),
            (None, false) => Ok(()),
        }
    }

    /// How many lanes may be open now: `max`, or fewer while the peer said it had no room.
    fn room(&mut self, max: usize) -> usize {
        match self.full {
            Some((n, until)) if Instant::now() < until => n.min(max),
            Some(_) => {
                self.full = None;
                max
            }
            None => max,
        }
    }
}

/// How long a link opens no lane beyond those it has after the peer refused one for want of
/// room.
const FULL_BACKOFF: Duration = Duration::from_secs(1);

/// A link's lanes.
pub(crate) struct Lanes {
    join: Join,
    max_lanes: usize,
    pool: Mutex<Pool>,
    freed: Condvar,
    /// The ids of XFER requests (a DONE names the request it answers): what
    /// [`Lane::xfer`] numbers a batch's frames from.
    pub(super) next_req: AtomicU64,
    span: tracing::Span,
}

/// A new link's first lane, until the link is set up: the other transports' setup speaks
/// through it ([`Control`]), its failures are the caller's errors of `connect`.
pub(crate) struct FirstLane {
    lane: Lane,
    peer: String,
    started: Instant,
}

impl FirstLane {
    /// Connects to `addr`, says `hello` (proving `psk`) and reads the WELCOME, by `deadline`.
    ///
    /// # Errors
    /// What `connect` reports: [`Error::ConnectFailed`], [`Error::Timeout`],
    /// [`Error::Refused`], [`Error::AuthFailed`], [`Error::Protocol`].
    pub(crate) fn open(
        addr: SocketAddr,
        peer: &str,
        hello: &Hello,
        psk: Option<&Psk>,
        started: Instant,
        deadline: Instant,
    ) -> Result<(Self, Welcome), Error> {
        let (lane, welcome) = Lane::open(addr, hello, psk, deadline, |_| Ok(()))
            .map_err(|f| lane_error(f, "connect", peer, started, true))?;
        let first = FirstLane {
            lane,
            peer: peer.to_owned(),
            started,
        };
        Ok((first, welcome))
    }

    /// The lane's connection (what a server on this host proves it holds the other end of).
    pub(crate) fn stream(&self) -> &TcpStream {
        self.lane.stream()
    }

    /// The link is set up: its first lane is the first of its pool.
    pub(crate) fn into_lanes(
        self,
        join: Join,
        max_lanes: usize,
        span: tracing::Span,
    ) -> Arc<Lanes> {
        let first = self.lane.shutter();
        Arc::new(Lanes {
            join,
            max_lanes,
            pool: Mutex::new(Pool {
                idle: vec![self.lane],
                open: 1,
                broken: None,
                closed: false,
                full: None,
                opening: Vec::new(),
                next_opening: 0,
                live: vec![first],
            }),
            freed: Condvar::new(),
            next_req: AtomicU64::new(1),
            span,
        })
    }

    fn fail(&self, f: LaneFail) -> Error {
        lane_error(f, "connect", &self.peer, self.started, false)
    }
}

impl Control for FirstLane {
    fn send(&mut self, frame: &[u8], deadline: Instant) -> Result<(), Error> {
        let r = self.lane.send_frame(frame, deadline);
        r.map_err(|f| self.fail(f))
    }
    fn recv(&mut self, deadline: Instant) -> Result<(Kind, Vec<u8>), Error> {
        let r = self.lane.recv_any(deadline);
        r.map_err(|f| self.fail(f))
    }
    fn protocol(&self, problem: String) -> Error {
        self.fail(LaneFail::Protocol(problem))
    }
    fn refused(&self, status: Status, reason: String) -> Error {
        self.fail(LaneFail::Refused {
            status,
            reason,
            usable: false,
        })
    }
    fn watch(&self) -> io::Result<TcpStream> {
        self.lane.try_clone_stream()
    }
}

impl Lanes {
    fn peer(&self) -> &str {
        &self.join.peer
    }

    /// Whether the link broke (or was closed).
    pub(crate) fn is_broken(&self) -> bool {
        lock(&self.pool).broken.is_some()
    }

    /// Whether the link was closed.
    pub(crate) fn is_closed(&self) -> bool {
        lock(&self.pool).closed
    }

    /// `Err(NotConnected)` once the link is broken.
    pub(crate) fn usable(&self) -> Result<(), Error> {
        lock(&self.pool).usable(self.peer())
    }

    /// Marks the link unusable (the first reason stays), drops its idle lanes and wakes every
    /// caller waiting for a lane, so they see `NOT_CONNECTED` at once.
    pub(crate) fn break_link(&self, why: String) {
        self.break_locked(&mut lock(&self.pool), why);
    }

    fn break_locked(&self, pool: &mut Pool, why: String) {
        if pool.broken.is_none() {
            tracing::debug!(parent: &self.span, why = %why, "link broken");
            pool.broken = Some(why);
        }
        pool.idle.clear();
        for (_, s) in pool.opening.drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        for s in pool.live.drain(..).filter_map(|w| w.upgrade()) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.freed.notify_all();
    }

    /// Takes an idle lane, opens a new one (up to `max_lanes`), or waits for one. A new lane
    /// the peer refuses for want of room (`RESOURCE_EXHAUSTED`, its limits on connections)
    /// leaves the link as it was: the caller waits for one of the lanes it has, and no other
    /// is opened for [`FULL_BACKOFF`]; with no lane open, that refusal is the caller's error.
    /// Any other refusal, or a peer that reset or refused the connection, breaks the link.
    pub(super) fn checkout(
        &self,
        deadline: Instant,
        started: Instant,
        op: &'static str,
    ) -> Result<Lane, Error> {
        let mut pool = lock(&self.pool);
        loop {
            pool.usable(self.peer())?;
            if let Some(l) = pool.idle.pop() {
                return Ok(l);
            }
            if pool.open < pool.room(self.max_lanes) {
                let nonce = crate::auth::nonce()?;
                pool.open += 1;
                drop(pool);
                let f = match self.open_lane(nonce, deadline) {
                    Ok(lane) => return Ok(lane),
                    Err(f) => f,
                };
                // (dead: the peer refused it or went away; full: it had no room for it)
                let (dead, full) = match &f {
                    LaneFail::Refused { status, .. } if *status == Status::RESOURCE_EXHAUSTED => {
                        (false, true)
                    }
                    LaneFail::Refused { .. } => (true, false),
                    LaneFail::Io(e) => (is_gone(e), false),
                    LaneFail::Protocol(_) | LaneFail::Auth(_) => (false, false),
                };
                let e = lane_error(f, op, self.peer(), started, false);
                pool = lock(&self.pool);
                pool.open -= 1;
                if let Err(broke) = pool.usable(self.peer()) {
                    // the link broke or closed while the lane was opening (which is why it
                    // failed): every waiter, a closing link's too (one woken could be a caller
                    // that gives up, leaving the close to wait out its deadline)
                    self.freed.notify_all();
                    return Err(broke);
                }
                if dead {
                    self.break_locked(&mut pool, format!("cannot open a new lane: {e}"));
                    return Err(e);
                }
                self.freed.notify_one();
                if !full || pool.open == 0 {
                    return Err(e);
                }
                tracing::debug!(parent: &self.span, lanes = pool.open, "no room for a new lane: waiting for one of the link's");
                pool.full = Some((pool.open, Instant::now() + FULL_BACKOFF));
                continue;
            }
            let rem = deadline.saturating_duration_since(Instant::now());
            if rem.is_zero() {
                return Err(Error::LanesExhausted {
                    peer: self.peer().to_owned(),
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

    /// Opens a lane that JOINs the link (its HELLO's `nonce`), by `deadline`.
    fn open_lane(&self, nonce: [u8; 32], deadline: Instant) -> Result<Lane, LaneFail> {
        let j = &self.join;
        let hello = Hello {
            role: LaneRole::Join,
            instance: j.instance,
            token: j.token,
            name: j.name.clone(),
            target: j.peer.clone(),
            host: None,
            nonce,
        };
        let mut mine = None;
        let opened = Lane::open(j.addr, &hello, j.psk.as_ref(), deadline, |s| {
            let second = s.try_clone()?;
            let mut pool = lock(&self.pool);
            if pool.broken.is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    "the link broke",
                ));
            }
            pool.next_opening += 1;
            let n = *mine.insert(pool.next_opening);
            pool.opening.push((n, second));
            Ok(())
        });
        if let Some(n) = mine {
            lock(&self.pool).opening.retain(|(i, _)| *i != n);
        }
        let (lane, w) = opened?;
        // the lane must have joined this link of this server (an honest server echoes both;
        // another process at the address, or the server restarted, is no lane of it)
        if w.instance != j.remote_instance || w.token != j.token {
            // (the link's token is a secret of the link: never in an error text or a log)
            return Err(LaneFail::Protocol(format!(
                "a joined lane was welcomed by server instance {:#x}{}, not this link's server \
                 {:#x}",
                w.instance,
                if w.token == j.token {
                    ""
                } else {
                    " for another link"
                },
                j.remote_instance
            )));
        }
        let mut pool = lock(&self.pool);
        if let Err(broke) = pool.usable(self.peer()) {
            // broke after the WELCOME: this lane was not among those the break shut down
            drop(pool);
            return Err(LaneFail::Io(io::Error::new(
                io::ErrorKind::NotConnected,
                broke.to_string(),
            )));
        }
        pool.live.retain(|w| w.strong_count() > 0);
        pool.live.push(lane.shutter());
        drop(pool);
        tracing::trace!(parent: &self.span, "lane opened");
        Ok(lane)
    }

    /// How many lanes are being opened.
    #[cfg(test)]
    pub(crate) fn opening_for_test(&self) -> usize {
        lock(&self.pool).opening.len()
    }

    /// Puts a lane back (or closes it, once the link is broken or closed).
    pub(super) fn checkin(&self, lane: Lane) {
        let mut pool = lock(&self.pool);
        if pool.closed || pool.broken.is_some() {
            pool.open -= 1;
            drop(pool);
            drop(lane);
            // (a closing link waits for its last lanes here, beside callers that give up)
            self.freed.notify_all();
        } else {
            pool.idle.push(lane);
            self.freed.notify_one();
        }
    }

    /// Forgets a dead lane; `broken` marks the whole link unusable.
    fn discard(&self, broken: Option<String>) {
        let mut pool = lock(&self.pool);
        pool.open -= 1;
        match broken {
            Some(why) => self.break_locked(&mut pool, why),
            None if pool.closed => self.freed.notify_all(),
            None => self.freed.notify_one(),
        }
    }

    /// Puts a lane back, or drops it when a failure left it out of step (see [`LaneAfter`]).
    pub(super) fn release(&self, lane: Lane, after: LaneAfter) {
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

    /// Takes a lane, runs `f` on it, and puts it back or drops it as its failure says; the
    /// failure becomes the caller's error of `op`.
    fn with_lane(
        &self,
        op: &'static str,
        started: Instant,
        deadline: Instant,
        f: impl FnOnce(&mut Lane) -> Result<(), LaneFail>,
    ) -> Result<(), Error> {
        let mut lane = self.checkout(deadline, started, op)?;
        let r = f(&mut lane);
        let after = LaneAfter::of(r.as_ref().err());
        let e = r.err().map(|f| {
            let cut = matches!(f, LaneFail::Io(_));
            let e = lane_error(f, op, self.peer(), started, false);
            // a lane cut because the link broke or was closed meanwhile: that is the error
            match lock(&self.pool).usable(self.peer()) {
                Err(broke) if cut => broke,
                _ => e,
            }
        });
        self.release(lane, after);
        e.map_or(Ok(()), Err)
    }

    /// Runs a batch on a lane of its own: a sync transfer's batch, or one part of it, in
    /// frames numbered by the link's request counter ([`Lane::xfer`]).
    ///
    /// # Safety
    /// As [`Lane::xfer`].
    pub(super) unsafe fn transfer(
        &self,
        op: TransferOp,
        descs: Descs<'_>,
        started: Instant,
        deadline: Instant,
    ) -> Result<(), Error> {
        self.with_lane(op.name(), started, deadline, |lane| {
            // SAFETY: this function's contract.
            unsafe { lane.xfer(op, descs, &self.next_req, deadline) }
        })
    }

    /// Sends notification `req` and waits for its acknowledgement, by `deadline`.
    pub(crate) fn notify(
        &self,
        req: u64,
        name: &str,
        msg: &str,
        started: Instant,
        deadline: Instant,
    ) -> Result<(), Error> {
        self.with_lane("notify", started, deadline, |lane| {
            lane.notify(req, name, msg, deadline)
        })
    }

    /// One heartbeat: PING on an idle lane; no PONG within `timeout` breaks the link (a silent
    /// peer: stopped, hung, or cut off). A link that is busy (no idle lane) proves itself by its
    /// transfers.
    pub(crate) fn heartbeat(&self, timeout: Duration) {
        match self.ping_idle(timeout, "heartbeat") {
            Pinged::Down | Pinged::Busy | Pinged::Answered => {}
            // a peer with no room for a lane answered: it is there
            Pinged::NoLane(Error::Refused { refusal, .. })
                if refusal.status == Status::RESOURCE_EXHAUSTED => {}
            Pinged::NoLane(e) => self.break_link(format!("no heartbeat answer: {e}")),
            Pinged::Gone(e) => self.discard(Some(format!("peer went away: {e}"))),
            Pinged::Silent(LaneFail::Io(_)) => {
                self.discard(Some(format!("no heartbeat answer within {timeout:?}")));
            }
            Pinged::Silent(_) => {
                self.discard(Some("the heartbeat was answered wrongly".to_owned()));
            }
        }
    }

    /// Whether the peer is provably gone: PING on an idle lane (on a new one when the link
    /// has none open). A PONG says no; a connection the peer reset or hung up, or a new one
    /// it refused (but for want of room), says yes (the link breaks, as it would on any
    /// lane); no answer within
    /// `timeout`, or lanes all at work, decide nothing (`None`: a lane that timed out is
    /// dropped, the link stays). A broken or closed link is gone.
    pub(crate) fn peer_gone(&self, timeout: Duration) -> Option<bool> {
        match self.ping_idle(timeout, "a check of the peer") {
            Pinged::Down => Some(true),
            Pinged::Busy => None,
            Pinged::Silent(_) => {
                // (out of step, an answer may still come: the lane is not reused, the link
                // stays)
                self.discard(None);
                None
            }
            // a lane that could not open because the peer reset, refused or hung up on it
            // broke the link (`checkout`)
            Pinged::NoLane(_) => self.is_broken().then_some(true),
            Pinged::Answered => Some(false),
            Pinged::Gone(e) => {
                self.discard(Some(format!("peer went away: {e}")));
                Some(true)
            }
        }
    }

    /// One PING on an idle lane, or on a new one when the link has none open (the last one
    /// died with a timed-out transfer: the peer must still accept a new one). A lane that
    /// answered is put back; one that failed is dropped, and its place in the pool is the
    /// caller's to [`discard`](Self::discard).
    fn ping_idle(&self, timeout: Duration, op: &'static str) -> Pinged {
        let idle = {
            let mut pool = lock(&self.pool);
            if pool.closed || pool.broken.is_some() {
                return Pinged::Down;
            }
            match pool.idle.pop() {
                Some(l) => Some(l),
                // lanes at work have their own deadlines
                None if pool.open > 0 => return Pinged::Busy,
                None => None,
            }
        };
        let mut lane = match idle {
            Some(l) => l,
            None => {
                let now = Instant::now();
                match self.checkout(deadline_after(now, timeout), now, op) {
                    Ok(l) => l,
                    Err(e) => return Pinged::NoLane(e),
                }
            }
        };
        match lane.ping(deadline_after(Instant::now(), timeout)) {
            Ok(()) => {
                self.checkin(lane);
                Pinged::Answered
            }
            Err(LaneFail::Io(e)) if is_gone(&e) => Pinged::Gone(e),
            Err(f) => Pinged::Silent(f),
        }
    }

    /// Closes the link's lanes: says BYE on an idle one (unless the link is broken) and waits
    /// for the answer by `deadline`; from then on no lane is handed out, and every caller
    /// waiting for one, or opening one, gets `NOT_CONNECTED`.
    ///
    /// # Errors
    /// The BYE exchange's, as `disconnect`'s (the lanes are closed anyway).
    pub(crate) fn close(&self, started: Instant, deadline: Instant) -> Result<(), Error> {
        let (lane, broken) = {
            let mut pool = lock(&self.pool);
            (pool.idle.pop(), pool.broken.is_some())
        };
        let used = lane.is_some();
        let r = match (lane, broken) {
            (Some(mut lane), false) => lane
                .bye(deadline)
                .map_err(|f| lane_error(f, "disconnect", self.peer(), started, false)),
            _ => Ok(()),
        };
        let mut pool = lock(&self.pool);
        if used {
            pool.open -= 1; // the lane of the BYE, dropped
        }
        pool.open -= pool.idle.len();
        pool.idle.clear();
        pool.closed = true;
        for (_, s) in pool.opening.drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.freed.notify_all();
        // lanes in use (transfers and notifications on other threads) end by the caller's
        // deadline: waited for until then (a lane put back is dropped: `checkin`), then cut
        // (`break_locked`); no lane is handed out meanwhile
        while pool.open > 0 && pool.broken.is_none() {
            let rem = deadline.saturating_duration_since(Instant::now());
            if rem.is_zero() {
                break;
            }
            pool = (self.freed.wait_timeout(pool, rem))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        // (a link already broken keeps its reason)
        self.break_locked(&mut pool, "disconnected".into());
        r
    }
}

/// Whether an I/O error says the peer went away (rather than that it is slow).
/// How [`Lanes::ping_idle`] went.
enum Pinged {
    /// The link is closed or broken: no PING.
    Down,
    /// Every lane is at work: no PING.
    Busy,
    /// No lane could be opened for it (`checkout` broke the link if the peer refused it).
    NoLane(Error),
    /// The PONG came.
    Answered,
    /// The peer reset or hung up the connection.
    Gone(io::Error),
    /// No answer in time, or a wrong one.
    Silent(LaneFail),
}

pub(super) fn is_gone(e: &io::Error) -> bool {
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

/// The caller's error for a lane failure during `op` (`connecting`: opening the link).
pub(super) fn lane_error(
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
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
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

/// What becomes of a lane after an operation, decided from how it failed (if it did) before
/// the failure is turned into the caller's error (which keeps the `io::Error` itself).
pub(super) enum LaneAfter {
    /// Back into the pool: it is still in step with the peer.
    Reuse,
    /// The peer went away: the link is broken, for this reason.
    Gone(String),
    /// Out of step: closed, the link stays usable.
    Discard,
}

impl LaneAfter {
    pub(super) fn of(f: Option<&LaneFail>) -> Self {
        match f {
            None | Some(LaneFail::Refused { usable: true, .. }) => Self::Reuse,
            Some(LaneFail::Io(e)) if is_gone(e) => Self::Gone(format!("peer went away: {e}")),
            Some(_) => Self::Discard,
        }
    }
}

#[cfg(test)]
mod tests {
    //! A lane the peer refuses for want of room (`RESOURCE_EXHAUSTED`: its limit on a link's lanes)
    //! leaves the link as it was: the caller waits for one of the lanes it has, and the link still
    //! moves data.

    use std::time::{Duration, Instant};

    use crate::error::Error;
    use crate::testkit::Rng;
    use crate::types::TransferOp;
    use crate::{Connected, Hixl, Options, Region, SameHost, TransferDesc};

    const LEN: usize = 64 << 10;

    fn tcp() -> Options {
        Options::default().same_host(SameHost::Forbid)
    }

    /// An active engine and its region.
    type Engine = (Hixl<Connected>, Region<Vec<u8>>);

    /// A serving engine (options `server`) with a region of `LEN` bytes, and a TCP client of
    /// up to four lanes with a buffer of `2 * LEN`, both active.
    fn engines(server: Options) -> (Engine, Engine) {
        let srv = Hixl::initialize_ephemeral("127.0.0.1", server)
            .unwrap()
            .into_registered();
        let served = srv.register(vec![0u8; LEN]).unwrap();
        let cli = Hixl::initialize_ephemeral("127.0.0.1", tcp().max_lanes(4))
            .unwrap()
            .into_registered();
        let buf = cli.register(vec![0u8; 2 * LEN]).unwrap();
        (
            (srv.activate().unwrap(), served),
            (cli.activate().unwrap(), buf),
        )
    }

    /// A lane that JOINs the link must be welcomed by the link's own server for the link's own
    /// token: a raw server welcomes the first lane as instance 1 (token 2), then a JOIN as
    /// another instance, then one for another link. Neither joins the pool (the second lane
    /// fails, and so the link); before, a JOIN's WELCOME was not looked at.
    #[test]
    fn a_lane_welcomed_by_another_server_or_link_does_not_join() {
        use crate::wire::{self, Hello, Kind, LaneRole, Welcome};
        use std::io::{Read, Write};
        for (instance, token) in [(9u64, 2u64), (1, 3)] {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let server = std::thread::spawn(move || {
                let mut kept = Vec::new();
                for w in [(1u64, 2u64), (instance, token)] {
                    let (mut s, _) = l.accept().unwrap();
                    let mut h = [0u8; wire::HEADER_LEN];
                    s.read_exact(&mut h).unwrap();
                    let h = wire::decode_header(&h).unwrap();
                    assert_eq!(h.kind, Kind::Hello);
                    let mut hello = vec![0u8; h.len as usize];
                    s.read_exact(&mut hello).unwrap();
                    let mut out = Vec::new();
                    Welcome {
                        instance: w.0,
                        token: w.1,
                        pid: 3,
                        table: Vec::new(),
                        host: None,
                        fence: -1,
                        lane_fd: None,
                    }
                    .encode(&mut out);
                    s.write_all(&out).unwrap();
                    kept.push(s);
                }
                kept
            });
            let hello = Hello {
                role: LaneRole::NewLink,
                instance: 7,
                token: 0,
                name: "127.0.0.1".into(),
                target: addr.to_string(),
                host: None,
                nonce: [5; 32],
            };
            let now = Instant::now();
            let deadline = now + Duration::from_secs(20);
            let (first, w) =
                super::FirstLane::open(addr, "server", &hello, None, now, deadline).unwrap();
            let join = super::Join {
                addr,
                peer: "server".into(),
                instance: 7,
                name: "127.0.0.1".into(),
                token: w.token,
                remote_instance: w.instance,
                psk: None,
            };
            let lanes = first.into_lanes(join, 4, tracing::Span::none());
            let held = lanes.checkout(deadline, now, "a test").unwrap();
            let e = lanes
                .checkout(deadline, now, "a test")
                .expect_err("a lane of another server or link");
            assert!(
                e.to_string().contains("joined lane was welcomed"),
                "({instance}, {token}): {e}"
            );
            drop(held);
            drop(server.join().unwrap());
        }
    }

    /// A caller opening a new lane when the link breaks (another lane found the peer gone) or
    /// is closed gets `NOT_CONNECTED` at once, not at its deadline: here the server was
    /// deactivated, so the new lane's connection waits in its listener's backlog, where no
    /// WELCOME comes.
    #[test]
    fn a_lane_being_opened_when_the_link_breaks_fails_at_once() {
        opening_when_the_link_ends(|lanes, first| {
            // the lane the caller holds finds the peer gone
            lanes.release(first, super::LaneAfter::Gone("peer went away".into()))
        });
        opening_when_the_link_ends(|lanes, first| {
            // the link is closed (a disconnect, or the engine's deactivate or finalize)
            let now = Instant::now();
            lanes.close(now, now + Duration::from_secs(1)).unwrap();
            lanes.checkin(first);
        });
    }

    /// A lane being opened, to a server that stopped serving, when `end` ends the link (given
    /// the one lane the caller holds).
    fn opening_when_the_link_ends(end: impl FnOnce(&super::Lanes, super::Lane)) {
        let ((srv, _served), (cli, _buf)) = engines(tcp());
        let link = cli.connect(srv.name()).unwrap();
        let lanes = link.shared.lanes_for_test();
        let now = Instant::now();
        let first = lanes
            .checkout(now + Duration::from_secs(20), now, "a test")
            .unwrap();
        // the server stops serving but keeps its port
        let _srv = srv.deactivate();
        std::thread::scope(|s| {
            let opener = s.spawn(|| {
                let now = Instant::now();
                lanes.checkout(now + Duration::from_secs(60), now, "a test")
            });
            let t0 = Instant::now();
            while lanes.opening_for_test() == 0 {
                assert!(
                    t0.elapsed() < Duration::from_secs(20) && !opener.is_finished(),
                    "no lane was being opened"
                );
                std::thread::yield_now();
            }
            end(lanes, first);
            let broke = Instant::now();
            let e = opener.join().unwrap().unwrap_err();
            // "at once" (serving.md; its deadline is 60 s away): 3 s leaves a loaded machine
            // its slack
            assert!(
                broke.elapsed() < Duration::from_secs(3),
                "the caller opening a lane waited {:?} after the link broke",
                broke.elapsed()
            );
            assert!(
                matches!(e, Error::NotConnected { .. }),
                "the caller opening a lane: {e:?}"
            );
            assert_eq!(e.status().code(), 103_902);
        });
        assert_eq!(lanes.opening_for_test(), 0);
    }

    #[test]
    fn a_lane_refused_for_want_of_room_keeps_the_link() {
        let ((srv, _served), (cli, mut buf)) = engines(tcp().max_server_lanes_per_link(2));
        let link = cli.connect(srv.name()).unwrap();
        let lanes = link.shared.lanes_for_test();
        let long = || {
            let now = Instant::now();
            (now + Duration::from_secs(20), now)
        };
        // the link's first lane, and a second that joins it: the server's two
        let (d, t) = long();
        let first = lanes.checkout(d, t, "a test").unwrap();
        let (d, t) = long();
        let second = lanes.checkout(d, t, "a test").unwrap();
        // a third is refused for want of room: the caller waits for one of the two, until its
        // deadline; the link is not broken
        let t = Instant::now();
        let e = lanes
            .checkout(t + Duration::from_millis(300), t, "a test")
            .unwrap_err();
        assert!(
            matches!(e, Error::LanesExhausted { lanes: 2, .. }),
            "a lane the server had no room for: {e:?}"
        );
        assert!(
            !lanes.is_broken(),
            "the link broke for a lane refused for want of room"
        );
        // a lane given back is the next caller's
        lanes.checkin(first);
        let (d, t) = long();
        let again = lanes.checkout(d, t, "a test").unwrap();
        lanes.checkin(again);
        lanes.checkin(second);
        // and the link moves data both ways
        let data = Rng::new(44).bytes(LEN);
        buf.write_at(0, &data).unwrap();
        let r = link.regions().next().unwrap();
        let out = [TransferDesc::new(
            buf.range(0..LEN).unwrap(),
            r.range(0..LEN as u64).unwrap(),
        )];
        link.transfer_sync(TransferOp::Write, &out, Duration::from_secs(20))
            .unwrap();
        let back = [TransferDesc::new(
            buf.range(LEN..2 * LEN).unwrap(),
            r.range(0..LEN as u64).unwrap(),
        )];
        link.transfer_sync(TransferOp::Read, &back, Duration::from_secs(20))
            .unwrap();
        let mut got = vec![0u8; LEN];
        buf.read_at(LEN, &mut got).unwrap();
        assert!(
            got == data,
            "the READ brought back other bytes than the WRITE sent"
        );
    }
}
