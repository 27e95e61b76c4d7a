//! The serving engine's one poller thread: it accepts connections, runs every handshake
//! ([`handshake`](super::handshake)) and holds every idle lane, waiting on all of them at once
//! (`epoll`). Threads go only to work: a completed handshake, or a lane whose next request has
//! arrived, becomes a [`Work`] on the server's worker queue (at most
//! [`Limits::max_threads`](super::limits::Limits::max_threads) at once); a worker hands its lane
//! back once no request follows. So a connection that says nothing, an idle lane, or a slow
//! handshake costs a socket and a few hundred bytes, never a thread.
//!
//! Every connection is registered once, one-shot: an event disarms it, so the poller and a worker
//! never both read it; re-arming a returned lane reports bytes that came meanwhile (level
//! triggered).

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::conn::{Conn, ConnEnd, Established, Ready, Work, frame_in};
use super::epoll::{Epoll, Token};
use super::handshake::{Admission, Handshake, Refusal, Step};
use super::limits::{self, Candidate};
use super::state::Shared;
use super::worker;
use crate::error::Status;
use crate::error::deadline_after;
use crate::io::{Inbound, Sock};
use crate::process::Pinned;
use crate::runtime::revoke::fence::{ServerFence, Slot};
use crate::sync::lock;
use crate::wire::{self, Hello};

/// Most connections accepted per wake-up before the others get a turn.
const ACCEPT_BURST: usize = 64;

/// A connection in its handshake: the socket the poller reads and answers, what came of the
/// client's next frame, and the handshake's state.
struct Greeting {
    conn: Conn,
    inb: Inbound,
    hs: Box<Handshake>,
}

/// What the poller holds for one connection between its events.
enum Held {
    /// In its handshake (due at the handshake's deadline).
    Greeting(Box<Greeting>),
    /// An established lane waiting for its next request; due once that frame has started (the
    /// whole frame is due within the I/O timeout).
    Idle {
        lane: Box<Established>,
        due: Option<Instant>,
    },
    /// A lane whose request is parked on a stalled socket, due at the request's deadline.
    Parked {
        lane: Box<Established>,
        due: Instant,
    },
}

impl Held {
    /// When the poller must act on it without an event.
    fn due(&self) -> Option<Instant> {
        match self {
            Held::Greeting(g) => Some(g.hs.deadline),
            Held::Idle { due, .. } => *due,
            Held::Parked { due, .. } => Some(*due),
        }
    }
}

/// The poller's state: everything it holds between events.
struct Poller {
    shared: Arc<Shared>,
    epoll: Epoll,
    listener: TcpListener,
    /// Every connection the poller holds, by its token: one map, one state per connection.
    held: HashMap<u64, Held>,
    backoff: limits::Backoff,
    /// Accepting waits until then (out of descriptors or memory).
    paused: Option<Instant>,
    /// Serving is stopping (see [`Poller::drain`]).
    draining: bool,
}

/// Runs the poller until the server stops; what it holds then is closed.
pub(super) fn run(shared: Arc<Shared>, listener: TcpListener) {
    let epoll = match Epoll::new() {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(parent: &shared.span, error = %e, "no epoll: not serving");
            return;
        }
    };
    let level = libc::EPOLLIN as u32;
    let registered = epoll
        .ctl(
            libc::EPOLL_CTL_ADD,
            listener.as_raw_fd(),
            Token::LISTENER,
            level,
        )
        .and_then(|()| epoll.ctl(libc::EPOLL_CTL_ADD, shared.returns.fd(), Token::WAKE, level));
    if let Err(e) = registered {
        tracing::error!(parent: &shared.span, error = %e, "cannot poll the listener: not serving");
        return;
    }
    let mut p = Poller {
        shared,
        epoll,
        listener,
        held: HashMap::new(),
        backoff: limits::Backoff::default(),
        paused: None,
        draining: false,
    };
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    loop {
        // the flags are checked before each wait: a wake-up read while handling events (a lane
        // coming back) may have been the stop's
        if p.shared.halt.load(Ordering::SeqCst) {
            return;
        }
        if p.shared.stop.load(Ordering::SeqCst) {
            p.drain();
        }
        let timeout = p.next_timeout();
        let n = p.epoll.wait(&mut evs, timeout);
        if p.shared.halt.load(Ordering::SeqCst) {
            return;
        }
        // connections first, then newcomers: a handshake whose next frame is in moves on
        // before a newcomer could take its place
        let mut accept = false;
        for ev in &evs[..n] {
            match Token(ev.u64) {
                Token::LISTENER => accept = true,
                Token::WAKE => p.returned(),
                Token(id) => p.ready(id),
            }
        }
        if accept && !p.draining {
            p.accept();
        }
        p.expire();
    }
}

impl Poller {
    /// How long to wait for events: until the first deadline of a connection, or the end of an
    /// accept pause.
    fn next_timeout(&self) -> Option<Duration> {
        let first = self.held.values().filter_map(Held::due).min();
        let until = match (first, self.paused) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }?;
        Some(until.saturating_duration_since(Instant::now()))
    }

    fn accept(&mut self) {
        for _ in 0..ACCEPT_BURST {
            match self.listener.accept() {
                Ok((stream, from)) => {
                    self.backoff.reset();
                    self.admit(stream, from);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if limits::wait_out(&e) => {
                    // out of descriptors (or memory): established links keep being served;
                    // stop accepting for a while, longer each time, and retry
                    let wait = self.backoff.step();
                    tracing::debug!(parent: &self.shared.span, error = %e, ?wait, "accept failed; backing off");
                    let _ = self.epoll.ctl(
                        libc::EPOLL_CTL_MOD,
                        self.listener.as_raw_fd(),
                        Token::LISTENER,
                        0,
                    );
                    self.paused = Some(Instant::now() + wait);
                    return;
                }
                Err(e) => {
                    // about one connection (reset before it was accepted, ...): the next may work
                    tracing::debug!(parent: &self.shared.span, error = %e, "accept failed");
                }
            }
        }
    }

    /// Takes a new connection into the handshake budget, making room for it when its address
    /// or the budget is full.
    fn admit(&mut self, stream: TcpStream, from: SocketAddr) {
        let sh = &self.shared;
        let l = &sh.limits;
        let full = {
            let conns = lock(&sh.conns);
            conns.counts().0 >= l.max_handshakes
                || conns.handshakes_from(from.ip()) >= l.max_handshakes_per_peer
        };
        if full {
            let keyed = sh.psk.is_some();
            let cands: Vec<Candidate> = (self.held.iter())
                .filter_map(|(&id, s)| match s {
                    Held::Greeting(g) => Some(Candidate {
                        id,
                        peer: g.conn.from.ip(),
                        progress: g.hs.progress(keyed),
                        since: g.hs.since,
                    }),
                    _ => None,
                })
                .collect();
            match limits::make_room(&cands, from.ip(), l) {
                Ok(None) => {}
                Ok(Some(victim)) => {
                    if let Some(Held::Greeting(g)) = self.held.remove(&victim) {
                        let told = "handshake cut to make room for others";
                        let r = Refusal::new(Status::RESOURCE_EXHAUSTED, told, told);
                        refuse(sh, &g.conn, &r);
                    }
                }
                Err(why) => {
                    tracing::debug!(parent: &sh.span, %from, why, "refused at accept");
                    return;
                }
            }
        }
        let id = sh.next_id.fetch_add(1, Ordering::Relaxed);
        let fd = stream.as_raw_fd();
        lock(&sh.conns).admit(id, fd, from.ip());
        let conn = Conn {
            sock: Sock::adopt(stream),
            id,
            from,
            table: sh.conns.clone(),
        };
        if let Err(e) = self.epoll.add_oneshot(fd, Token(id)) {
            tracing::debug!(parent: &sh.span, error = %e, "cannot poll a connection");
            return;
        }
        let now = Instant::now();
        let g = Greeting {
            conn,
            // handshake frames are small: so is the buffer until the client is welcomed
            inb: Inbound::with_capacity(256),
            hs: Box::new(Handshake::new(now, deadline_after(now, sh.io_timeout))),
        };
        // an honest client's HELLO is usually in by the time its connection is accepted: taken
        // now, before any later connection could make it give up its place
        self.greet(id, g);
    }

    /// Connection `id` has input (or hung up).
    fn ready(&mut self, id: u64) {
        match self.held.remove(&id) {
            None => {}
            Some(Held::Greeting(g)) => self.greet(id, *g),
            // a lane of a link superseded or closed meanwhile (its socket was shut down) ends
            // here, its parked request with it: no worker is needed for that, and the new
            // link's opening, which waits on a worker until the old link's requests have
            // stopped, is not left waiting for a worker behind it
            Some(Held::Parked { lane, .. } | Held::Idle { lane, .. })
                if !lane.live.load(Ordering::SeqCst) =>
            {
                worker::lane_closed(&self.shared, *lane, ConnEnd::Refused("superseded".into()));
            }
            // its parked request's socket is ready (or failed): a worker goes on with it
            Some(Held::Parked { lane, .. }) => self.submit(Work::Serve(lane)),
            Some(Held::Idle { mut lane, due }) => {
                // a worker takes the lane once its next frame is in: a peer that starts a frame
                // and stalls holds no thread, only its deadline
                match frame_in(&mut lane.inb, &lane.conn.sock) {
                    Ok(true) => self.submit(Work::Serve(lane)),
                    Ok(false) => {
                        let due = due.unwrap_or_else(|| {
                            deadline_after(Instant::now(), self.shared.io_timeout)
                        });
                        match self.epoll.rearm(lane.conn.as_raw_fd(), Token(id)) {
                            Ok(()) => {
                                let due = Some(due);
                                self.held.insert(id, Held::Idle { lane, due });
                            }
                            Err(e) => worker::lane_closed(&self.shared, *lane, ConnEnd::Io(e)),
                        }
                    }
                    Err(e) => worker::lane_closed(&self.shared, *lane, ConnEnd::of(e)),
                }
            }
        }
    }

    /// Lanes handed back by workers: idle until their next request.
    fn returned(&mut self) {
        for mut lane in self.shared.returns.take() {
            let id = lane.conn.id;
            if lane.parked.is_none() && matches!(frame_in(&mut lane.inb, &lane.conn.sock), Ok(true))
            {
                // its next request is in already (its worker went to other work)
                self.submit(Work::Serve(lane));
                continue;
            }
            let (fd, out) = (
                lane.conn.as_raw_fd(),
                lane.parked.as_ref().map(|p| !p.0.receiving()),
            );
            match self.epoll.rearm_for(fd, Token(id), out.unwrap_or(false)) {
                Ok(()) => {
                    let timeout = deadline_after(Instant::now(), self.shared.io_timeout);
                    let slot = if let Some((p, _)) = &lane.parked {
                        // a parked request keeps its own deadline
                        let due = p.deadline.unwrap_or(timeout);
                        Held::Parked { lane, due }
                    } else {
                        // part of its next frame came: the whole frame is due within the timeout
                        let due = (lane.inb.buffered() > 0).then_some(timeout);
                        Held::Idle { lane, due }
                    };
                    self.held.insert(id, slot);
                }
                Err(e) => worker::lane_closed(&self.shared, *lane, ConnEnd::Io(e)),
            }
        }
    }

    /// Ends the handshakes past their deadline (`REFUSE` `TIMEOUT`) and the lanes past theirs,
    /// and a pause in accepting.
    fn expire(&mut self) {
        let now = Instant::now();
        let late: Vec<u64> = (self.held.iter())
            .filter(|(_, s)| s.due().is_some_and(|t| t <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            match self.held.remove(&id) {
                None => {}
                Some(Held::Greeting(g)) => {
                    let r = Refusal::new(Status::TIMEOUT, "handshake timed out", "timed out");
                    refuse(&self.shared, &g.conn, &r);
                }
                Some(Held::Idle { lane, .. } | Held::Parked { lane, .. }) => {
                    let e = io::Error::new(
                        io::ErrorKind::TimedOut,
                        "a started frame did not finish in time",
                    );
                    worker::lane_closed(&self.shared, *lane, ConnEnd::Io(e));
                }
            }
        }
        if self.paused.is_some_and(|t| t <= now) {
            self.paused = None;
            let fd = self.listener.as_raw_fd();
            let _ = (self.epoll).ctl(
                libc::EPOLL_CTL_MOD,
                fd,
                Token::LISTENER,
                libc::EPOLLIN as u32,
            );
        }
    }

    /// Serving stops: no more connections or handshakes. Established lanes are still served
    /// until the stop's grace is over (a request can be under way on one lane of a link while
    /// its other lane's part is just arriving), as are requests parked on a stalled socket.
    fn drain(&mut self) {
        if !self.draining {
            self.draining = true;
            let fd = self.listener.as_raw_fd();
            let _ = self.epoll.ctl(libc::EPOLL_CTL_DEL, fd, Token::LISTENER, 0);
            self.paused = None;
        }
        self.held.retain(|_, s| !matches!(s, Held::Greeting(_)));
    }

    fn submit(&self, job: Work) {
        worker::submit(&self.shared, job);
    }

    /// Reads what a handshake's client sent and answers it, as far as it goes without waiting:
    /// the handshake decides ([`Handshake::on_frame`]), the poller moves the bytes and runs the
    /// same-host proof.
    fn greet(&mut self, id: u64, g: Greeting) {
        let Greeting {
            conn,
            mut inb,
            mut hs,
        } = g;
        let what = "handshake frame length";
        loop {
            let len = match inb.frame_ready(&conn.sock, |_| limits::MAX_HANDSHAKE_FRAME, what) {
                Ok(None) => {
                    if self.epoll.rearm(conn.as_raw_fd(), Token(id)).is_ok() {
                        let g = Box::new(Greeting { conn, inb, hs });
                        self.held.insert(id, Held::Greeting(g));
                    }
                    return;
                }
                Ok(Some(Ok(h))) => h,
                Ok(Some(Err(e))) => return refuse(&self.shared, &conn, &Refusal::violation(&e)),
                Err(e) => {
                    tracing::trace!(parent: &self.shared.span, from = %conn.from, error = %e, "handshake ended");
                    return;
                }
            };
            inb.take(wire::HEADER_LEN);
            let adm = self.admission(&conn);
            match hs.on_frame(len.kind, inb.take(len.len as usize), &adm) {
                Step::Send(frame, next) => {
                    // a few dozen bytes into a send buffer that is empty this early
                    if conn.sock.send_now(&frame).is_err() {
                        return;
                    }
                    hs = next;
                }
                Step::Prove { hello, fd, nonce } => {
                    let fence = self.proven(&conn, &hello, fd, &nonce);
                    return self.finish(conn, inb, hello, fence);
                }
                Step::Done(hello) => return self.finish(conn, inb, hello, None),
                Step::Refuse(r) => return refuse(&self.shared, &conn, &r),
            }
        }
    }

    /// What a handshake on `conn` is checked against now.
    fn admission<'a>(&'a self, conn: &Conn) -> Admission<'a> {
        let sh = &self.shared;
        let fence_room = lock(&sh.fences)
            .as_ref()
            .is_some_and(|_| sh.fenced.load(Ordering::SeqCst) < sh.limits.max_fenced());
        Admission {
            psk: sh.psk.as_ref(),
            allow: sh.allow.as_deref(),
            host: sh.host,
            fence_room,
            client: conn.from,
            // what a keyed HELLO's nonce vouches for (a system call, only with a key)
            server: sh
                .psk
                .as_ref()
                .and_then(|_| conn.sock.stream.local_addr().ok()),
        }
    }

    /// The fence of a client that proved it is the process it named (`nonce` in its
    /// descriptor `fd`), if the budget has room; `None` serves it over TCP.
    fn proven(&self, conn: &Conn, hello: &Hello, fd: u64, nonce: &[u8; 32]) -> Option<ServerFence> {
        let sh = &self.shared;
        let client = hello.host.as_ref()?;
        let fd = i32::try_from(fd).ok()?;
        let slot = Slot::take(&sh.fenced, sh.limits.max_fenced())?;
        let why = match Pinned::open(client) {
            Ok(pin) => match pin.holds(fd, nonce) {
                Ok(true) => match ServerFence::for_pinned(pin, Some(slot)) {
                    Ok(f) => return Some(f),
                    Err(e) => format!("no fence: {e}"),
                },
                Ok(false) => "the descriptor is not a sealed memfd holding the nonce".to_owned(),
                Err(e) => format!("cannot take the client's descriptor: {e}"),
            },
            Err(e) => format!("cannot pin the client process: {e}"),
        };
        tracing::debug!(parent: &sh.span, from = %conn.from, why, "same-host proof failed; serving the client over tcp");
        None
    }

    /// The end of a handshake: counted as an established lane, handed to a worker that opens
    /// or joins its link.
    fn finish(&self, conn: Conn, inb: Inbound, hello: Box<Hello>, fence: Option<ServerFence>) {
        let sh = &self.shared;
        if let Err(why) = lock(&sh.conns).establish(conn.id, &sh.limits) {
            return refuse(
                sh,
                &conn,
                &Refusal::new(Status::RESOURCE_EXHAUSTED, why, why),
            );
        }
        let same_host = matches!((&hello.host, &sh.host), (Some(c), Some(s)) if c.same_host(s));
        let on_this_host = crate::process::peer_on_this_host(&conn.sock.stream);
        self.submit(Work::Open(Box::new(Ready {
            conn,
            inb,
            hello,
            fence,
            same_host,
            on_this_host,
        })));
    }
}

/// Tells a handshake's client why it is refused (if its send buffer takes it now) before the
/// connection closes; the log says why.
fn refuse(shared: &Shared, conn: &Conn, r: &Refusal) {
    let _ = conn.sock.send_now(&r.frame());
    tracing::debug!(parent: &shared.span, from = %conn.from, why = %r.why, "handshake refused");
}
