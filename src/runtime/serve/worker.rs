//! A serving worker: it opens (or joins) the link of a completed handshake (WELCOME with the
//! region table), then serves the frames of an established lane (NOTIFY, PING, BYE, a
//! transport's setup request such as UCXASK or DEVICE_HELLO, and XFER, which TCP's serving half
//! applies: `transport::tcp::serve`) while requests keep coming, and hands the lane back to the
//! poller when none follows. Once a request's first byte arrives the whole request has
//! `server_io_timeout`; a lane that misses it is closed with its unsent bytes discarded. Every
//! descriptor is validated against the region table (region id, bounds with overflow checks,
//! access rights) before a byte moves, and no length is trusted before it is checked.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::conn::{ConnEnd, Established, InFlight, Ready, Work, frame_in, released, trim};
use super::state::{JoinFail, Shared};
use super::table::Held;
use crate::error::Status;
use crate::error::deadline_after;
use crate::io::{Inbound, Sock, read_frame};
use crate::notify::Notify;
use crate::transport::tcp::serve::{After, PATIENCE, Pending, XferServer};
use crate::transport::{Accept, AcceptFail};
use crate::wire::{self, Kind, LaneRole, Refuse, Welcome, WireError};

/// How long a serving thread polls for the next request before sleeping: back-to-back small
/// requests skip a wake-up.
pub(super) const SERVE_SPIN: Duration = Duration::from_micros(20);

/// Takes the next request of an established connection, whose frame is in ([`frame_in`]).
/// Returns the frame and its deadline, `timeout` from now, which bounds the rest of the
/// request (a WRITE's payload, the reply).
#[allow(clippy::type_complexity)]
pub(super) fn read_request<'a>(
    sock: &mut Sock,
    inb: &'a mut Inbound,
    timeout: Duration,
) -> Result<(Result<(Kind, &'a [u8]), WireError>, Instant), io::Error> {
    let deadline = deadline_after(Instant::now(), timeout);
    let frame = read_frame(sock, inb, wire::max_request, Some(deadline), || {
        Some(deadline)
    })?;
    Ok((frame, deadline))
}

/// Ends a connection that broke the protocol: tells the peer why, then closes.
pub(super) fn violation(
    sock: &mut Sock,
    out: &mut Vec<u8>,
    e: WireError,
    deadline: Option<Instant>,
) -> ConnEnd {
    refuse(
        sock,
        out,
        super::limits::PROTOCOL_VIOLATION,
        &e.to_string(),
        deadline,
    );
    ConnEnd::Protocol(e)
}

/// Refuses a handshake: tells the client `told` with `status` (by `deadline`) and ends the
/// connection for `why` (what the log says).
fn refused(
    sock: &mut Sock,
    out: &mut Vec<u8>,
    status: Status,
    told: &str,
    why: impl Into<String>,
    deadline: Option<Instant>,
) -> ConnEnd {
    refuse(sock, out, status, told, deadline);
    ConnEnd::Refused(why.into())
}

pub(super) fn refuse(
    sock: &mut Sock,
    out: &mut Vec<u8>,
    status: Status,
    reason: &str,
    deadline: Option<Instant>,
) {
    Refuse {
        status: status.code(),
        reason: reason.to_owned(),
    }
    .encode(out);
    let _ = sock.send_bytes(out, deadline);
}

/// Queues `job` for the server's workers (a worker starts when none is idle and fewer than
/// `max_threads` run). When no worker can be started at all, the job's connection closes.
pub(super) fn submit(shared: &Arc<Shared>, job: Work) {
    // a worker holds the server weakly: once serving stopped and no job is left, nothing of
    // the server (its region table) outlives it in a worker that has not left yet
    let s = Arc::downgrade(shared);
    let mut handler = move || -> crate::runtime::executor::Handler<Work> {
        let s = s.clone();
        Box::new(move |job| {
            if let Some(s) = s.upgrade() {
                run(&s, job)
            }
        })
    };
    // a lingering worker looks at the queue every LINGER_SLICE: it takes the job, rather than
    // a new thread (sequential requests on many lanes would each start one)
    // welcoming a new link never waits behind requests: it is taken first, within one share
    // of a request (see `drive`) when every worker is busy
    let queued = if matches!(job, Work::Open(_)) {
        shared.queue.push_first(job, &mut handler)
    } else if shared.lingering.load(Ordering::SeqCst) > 0 {
        shared.queue.push_to_workers(job, &mut handler)
    } else {
        shared.queue.push(job, &mut handler)
    };
    if let Err(job) = queued {
        tracing::warn!(parent: &shared.span, "no thread to serve a connection; closing it");
        if let Work::Serve(lane) = job {
            lane_closed(shared, *lane, ConnEnd::Refused("no serving thread".into()));
        }
    }
}

/// A worker's job: opens the link of a completed handshake, or serves a lane's requests.
fn run(shared: &Arc<Shared>, job: Work) {
    let lane = match job {
        Work::Open(ready) => match open_link(shared, *ready) {
            Some(lane) => lane,
            None => return,
        },
        Work::Serve(lane) => lane,
    };
    serve_lane(shared, lane);
}

/// Opens (or joins) the link of a completed handshake and welcomes the client; `None` when the
/// connection ended instead.
pub(super) fn open_link(shared: &Arc<Shared>, r: Ready) -> Option<Box<Established>> {
    let Ready {
        mut conn,
        inb,
        hello,
        fence,
        same_host,
        on_this_host,
    } = r;
    let sock = &mut conn.sock;
    let setup = (sock.stream.set_nodelay(true))
        // blocking calls return after the patience at most: a request that stalls is parked
        // (its own deadline is kept apart)
        .and_then(|()| sock.set_fixed_timeout(PATIENCE))
        .and_then(|()| match shared.keepalive {
            Some(every) => sock.set_keepalive(every),
            None => Ok(()),
        });
    if let Err(e) = setup {
        tracing::debug!(parent: &shared.span, error = %e, "cannot set up a lane");
        return None;
    }
    sock.set_spin(SERVE_SPIN);
    let mut out = Vec::with_capacity(256);
    let io_deadline = || Some(deadline_after(Instant::now(), shared.io_timeout));
    let id = conn.id;
    let (token, live, busy, fence) = match hello.role {
        LaneRole::NewLink => {
            // only a fence the server will revoke and wait for is offered
            let fence = fence.map(Arc::new).filter(|f| shared.offer_fence(f));
            // the link's token is what later lanes present to JOIN it: unguessable, never 0
            let token = loop {
                match crate::auth::random_u64() {
                    Ok(0) => {}
                    Ok(t) => break t,
                    Err(e) => {
                        // the fence offered above is never used: revoked, so it is spent (a
                        // fence left live would hold every region withdrawn from now on)
                        if let Some(f) = &fence {
                            f.revoke();
                        }
                        let told = "the server has no random source";
                        refused(
                            &mut conn.sock,
                            &mut out,
                            Status::FAILED,
                            told,
                            e.to_string(),
                            io_deadline(),
                        );
                        return None;
                    }
                }
            };
            // a new link from the same client engine (name and instance) replaces its old one,
            // whose lanes may linger
            let (member, retired) =
                shared
                    .links
                    .open(token, &hello, id, fence.clone(), &shared.conns);
            for old in &retired {
                tracing::debug!(parent: &shared.span, server = %shared.name, client = ?old.client,
                    instance = old.instance, "replacing the old link of a reconnecting client");
            }
            // nothing of the old link is applied once the new one exists: wait for requests
            // it was applying (each is bounded by the I/O timeout) before welcoming the new one
            for old in retired {
                if !old.drain(shared.io_timeout) {
                    refused(
                        &mut conn.sock,
                        &mut out,
                        Status::FAILED,
                        "the previous link is still busy",
                        "the previous link did not drain",
                        io_deadline(),
                    );
                    forget(shared, id, token, &ConnEnd::Refused(String::new()));
                    return None;
                }
            }
            tracing::debug!(parent: &shared.span, client = ?hello.name, "link opened");
            (token, member.live, member.busy, fence)
        }
        LaneRole::Join => {
            let reopened = || shared.notifies.link_reopened(hello.token);
            let max = shared.limits.max_lanes_per_link;
            match shared.links.join(&hello, id, max, reopened) {
                Ok(m) => (hello.token, m.live, m.busy, None),
                Err(JoinFail::Full) => {
                    let why = "too many lanes on this link";
                    let st = Status::RESOURCE_EXHAUSTED;
                    refused(&mut conn.sock, &mut out, st, why, why, io_deadline());
                    return None;
                }
                Err(JoinFail::Unknown) => {
                    let st = Status::NOT_CONNECTED;
                    let why = "join to an unknown link";
                    refused(
                        &mut conn.sock,
                        &mut out,
                        st,
                        "unknown link",
                        why,
                        io_deadline(),
                    );
                    return None;
                }
            }
        }
    };
    let table = match hello.role {
        LaneRole::NewLink => shared.table.entries(fence.is_some()),
        LaneRole::Join => Vec::new(),
    };
    if let Some(f) = &fence {
        // the page says whose fence it is (a client that takes the descriptor by its number
        // checks it: `ClientFence::open`)
        f.tag(token);
        // what this link can reach one-sidedly, recorded after the table was taken (a region
        // withdrawn meanwhile counts this fence until then: `ServerFence::may_reach`)
        f.offered(
            (table.iter())
                .filter(|e| e.fd != wire::FD_TCP_ONLY)
                .map(|e| e.id)
                .collect(),
        );
    }
    Welcome {
        instance: shared.instance,
        token,
        pid: std::process::id(),
        table,
        host: if same_host { shared.host } else { None },
        fence: fence.as_ref().map_or(-1, |f| f.fd()),
        // asked for: this process's proof that it is the one `host` names (its end of this
        // connection, which the client takes and checks)
        lane_fd: (hello.role == LaneRole::NewLink && hello.token & wire::ASKS_SERVER_PROOF != 0)
            .then(|| match same_host && shared.host.is_some() {
                true => conn.sock.stream.as_raw_fd(),
                false => -1,
            }),
    }
    .encode(&mut out);
    let mut lane = Box::new(Established {
        conn,
        inb,
        out,
        xfer: XferServer::default(),
        token,
        live,
        busy,
        client: hello.name.clone(),
        new_link: hello.role == LaneRole::NewLink,
        asked: Vec::new(),
        parked: None,
        on_this_host,
    });
    let sent = lane.conn.sock.send_bytes(&lane.out, io_deadline());
    if let Err(e) = sent {
        lane_closed(shared, *lane, ConnEnd::Io(e));
        return None;
    }
    Some(lane)
}

/// Serves a lane's requests while they keep coming ([`request_waiting_in`]), then hands it back
/// to the poller, or closes it.
pub(super) fn serve_lane(shared: &Arc<Shared>, mut lane: Box<Established>) {
    match serve_requests(shared, &mut lane) {
        Ok(()) => {
            let before = lane.footprint();
            lane.shrink();
            released(before, lane.footprint());
            shared.returns.give(lane);
        }
        Err(end) => lane_closed(shared, *lane, end),
    }
}

/// Moves what a request has left: `Ok(true)` when it is done (the next request follows),
/// `Ok(false)` when its socket stalled or its share of the worker is spent while other work
/// waits (it is parked, the lane goes back to the poller), or why the lane ends.
fn drive(shared: &Shared, sock: &mut Sock, p: &mut Pending<Held>) -> Result<bool, ConnEnd> {
    // its share spent while other work waits for a worker, it goes to the back of the queue
    // (parked: the poller hands it back as soon as its socket is ready)
    match p.progress(sock, &|| shared.queue.pending() > 0) {
        Ok(After::NextRequest) => Ok(true),
        Ok(After::Park) => Ok(false),
        Ok(After::Close(reason)) => Err(ConnEnd::Refused(reason)),
        Err(e) => Err(ConnEnd::of(e)),
    }
}

/// Serves a lane's requests while they come: `Ok` when the lane goes back to the poller (no
/// request followed, or one is parked on its stalled socket), else why it ends.
fn serve_requests(shared: &Arc<Shared>, lane: &mut Established) -> Result<(), ConnEnd> {
    let Established {
        conn,
        inb,
        out,
        xfer,
        token,
        live,
        busy,
        client,
        new_link,
        asked,
        on_this_host,
        parked,
    } = lane;
    let token = *token;
    let sock = &mut conn.sock;
    // a request parked on a stalled socket goes on first
    if let Some((mut p, flight)) = parked.take()
        && !drive(shared, sock, &mut p)?
    {
        *parked = Some((p, flight));
        return Ok(());
    }
    let began = Instant::now();
    loop {
        // between requests a connection keeps no more memory than a small one needs
        trim(inb, xfer, out);
        // a lane whose requests follow one another keeps its worker for one share while other
        // work waits, then goes to the back of the queue (the poller hands it back at once)
        if began.elapsed() >= PATIENCE && shared.queue.pending() > 0 {
            return Ok(());
        }
        match request_waiting_in(shared, inb, sock) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) => return Err(ConnEnd::of(e)),
        }
        // the request's frame is in: the whole request has `io_timeout`
        let (frame, deadline) = match read_request(sock, inb, shared.io_timeout) {
            Err(e) => return Err(ConnEnd::of(e)),
            Ok((Err(e), _)) => {
                let dl = Some(deadline_after(Instant::now(), shared.io_timeout));
                return Err(violation(sock, out, e, dl));
            }
            Ok((Ok(f), deadline)) => (f, Some(deadline)),
        };
        let flight = InFlight::new(&shared.active, busy);
        if !live.load(Ordering::SeqCst) {
            // superseded (or closed) while this request was on its way: apply nothing
            return Err(ConnEnd::Refused("request on a superseded link".into()));
        }
        // what the request has left to move, past what it does at once
        let mut pending = match frame {
            (kind @ (Kind::Xfer | Kind::XferBlocks), p) => {
                let x = match xfer.decode(kind, p) {
                    Ok(x) => x,
                    Err(e) => return Err(violation(sock, out, e, deadline)),
                };
                xfer.apply(x, inb, deadline, &*shared.table, conn.id)
            }
            (Kind::Notify, p) => {
                let (req, name, msg) = match wire::decode_notify(p) {
                    Ok(x) => x,
                    Err(e) => return Err(violation(sock, out, e, deadline)),
                };
                let from = client.clone();
                let mut reply = Vec::with_capacity(64);
                match shared.notifies.push(token, Notify { from, name, msg }) {
                    Ok(()) => wire::encode_done(&mut reply, req, 0, ""),
                    Err(reason) => wire::encode_done(
                        &mut reply,
                        req,
                        Status::RESOURCE_EXHAUSTED.code(),
                        &reason,
                    ),
                }
                Pending::reply(reply, After::NextRequest, deadline)
            }
            (Kind::Ping, p) => {
                if !p.is_empty() {
                    let e = WireError::Trailing(p.len());
                    return Err(violation(sock, out, e, deadline));
                }
                let pong = wire::header(Kind::Pong, 0).to_vec();
                Pending::reply(pong, After::NextRequest, deadline)
            }
            (Kind::Bye, p) => {
                if !p.is_empty() {
                    let e = WireError::Trailing(p.len());
                    return Err(violation(sock, out, e, deadline));
                }
                if let Some(client) = shared.links.close(token, conn.id, &shared.conns) {
                    tracing::debug!(parent: &shared.span, ?client, "link closed by client");
                    shared.prune_fences();
                }
                // the acknowledgement goes if the socket takes it now; the lane ends anyway
                let _ = sock.send_now(&wire::header(Kind::ByeAck, 0));
                return Err(ConnEnd::Bye);
            }
            // a transport's setup request, or a frame no one takes
            (k, p) => {
                let Some(b) = shared.backends.iter().find(|b| b.request_kind() == Some(k)) else {
                    let e = WireError::Unexpected(k);
                    return Err(violation(sock, out, e, deadline));
                };
                if !b.repeatable() && (!*new_link || asked.contains(&k)) {
                    let e = WireError::Unexpected(k);
                    return Err(violation(sock, out, e, deadline));
                }
                // (a repeatable kind asked again is not listed again: the list stays one
                // entry a kind, whatever a client repeats)
                if !asked.contains(&k) {
                    asked.push(k);
                }
                let fenced = shared.links.fenced(token);
                let accepted = b.accept(Accept {
                    me: &shared.name,
                    client,
                    payload: p,
                    fenced,
                    on_this_host: *on_this_host,
                    send: &mut |f| sock.send_bytes(f, deadline),
                });
                match accepted {
                    Ok(Some(side)) => shared.links.add_path(token, side),
                    Ok(None) => {}
                    Err(AcceptFail::Io(e)) => return Err(ConnEnd::Io(e)),
                    Err(AcceptFail::Violation(e)) => {
                        return Err(violation(sock, out, e, deadline));
                    }
                }
                continue;
            }
        };
        if !drive(shared, sock, &mut pending)? {
            // the socket stalled: the worker goes on to other work, the poller waits for it
            *parked = Some((pending, flight));
            return Ok(());
        }
    }
}

/// How long a worker that just served a request waits for the lane's next one (when no other
/// work is queued) before handing the lane back to the poller: a lane moving data keeps its
/// thread, and spares each request the poller's wake-up and the hand-over.
pub(super) const SERVE_LINGER: Duration = Duration::from_millis(2);

/// Whether a request's whole frame is here: buffered, in within [`SERVE_SPIN`], or — when
/// nothing else waits for a worker — within [`SERVE_LINGER`]. A lane whose next frame is not in
/// by then goes back to the poller (with whatever part of it came).
fn request_waiting_in(shared: &Shared, inb: &mut Inbound, sock: &Sock) -> io::Result<bool> {
    let spin = Instant::now() + SERVE_SPIN;
    loop {
        if frame_in(inb, sock)? {
            return Ok(true);
        }
        if Instant::now() >= spin {
            break;
        }
        std::hint::spin_loop();
    }
    let until = Instant::now() + SERVE_LINGER;
    shared.lingering.fetch_add(1, Ordering::SeqCst);
    let waited = linger(shared, inb, sock, until);
    shared.lingering.fetch_sub(1, Ordering::SeqCst);
    // a job queued while this worker lingered started no thread: this worker takes it, and its
    // lane (its next frame in, or not) goes back to the poller
    Ok(waited? && shared.queue.pending() == 0)
}

/// How often a lingering worker looks at the queue.
const LINGER_SLICE: Duration = Duration::from_micros(200);

/// Waits until `until` for the lane's next frame, in slices of [`LINGER_SLICE`]; gives up as
/// soon as a job waits for a worker or serving stops.
fn linger(shared: &Shared, inb: &mut Inbound, sock: &Sock, until: Instant) -> io::Result<bool> {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || shared.queue.pending() > 0 || shared.stop.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let mut fds = [libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&sock.stream),
            events: libc::POLLIN,
            revents: 0,
        }];
        let slice = left.min(LINGER_SLICE);
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: slice.as_nanos() as libc::c_long,
        };
        // SAFETY: `fds` is a live array of one pollfd and `ts` a live timespec; no signal mask.
        unsafe { libc::ppoll(fds.as_mut_ptr(), 1, &ts, std::ptr::null()) };
        if fds[0].revents != 0 && frame_in(inb, sock)? {
            return Ok(true);
        }
    }
}

/// A lane ended: it leaves its link (a link that lost its last lane is kept a while for its
/// client to rejoin, without its fence: a same-host client proves itself again on a new link),
/// and its socket closes; one that missed a deadline discards what it had not sent.
pub(super) fn lane_closed(shared: &Shared, lane: Established, end: ConnEnd) {
    if matches!(&end, ConnEnd::Io(e) if e.kind() == io::ErrorKind::TimedOut) {
        lane.conn.sock.discard_unsent_on_close();
    }
    forget(shared, lane.conn.id, lane.token, &end);
    let from = lane.conn.from;
    let held = lane.footprint();
    drop(lane);
    released(held, 0);
    match end {
        ConnEnd::Closed | ConnEnd::Bye => {
            tracing::trace!(parent: &shared.span, %from, reason = %end, "lane closed")
        }
        _ => tracing::debug!(parent: &shared.span, %from, reason = %end, "lane closed"),
    }
}

/// Takes connection `id` out of link `token`.
fn forget(shared: &Shared, id: u64, token: u64, end: &ConnEnd) {
    let bye = matches!(end, ConnEnd::Bye);
    let left = shared.links.leave(id, token, bye, shared.orphan_grace());
    if let Some(f) = left.fence {
        f.revoke();
    }
    if left.emptied {
        shared.notifies.link_closed(token);
    }
    for t in left.gone {
        shared.notifies.link_closed(t);
    }
    shared.prune_fences();
}
