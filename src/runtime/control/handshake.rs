//! A connection's handshake, as the poller runs it without a thread of its own: HELLO, then
//! CHALLENGE/AUTH with a pre-shared key, then PROVE/PROOF for a client that says it runs on this
//! host, each frame read as its bytes arrive (never waiting), each answer sent at once (a few
//! dozen bytes into an empty send buffer). A handshake that completes is counted as established
//! and handed, with its fence when it earned one, to a worker that opens or joins its link
//! ([`dispatch::open_link`](super::dispatch::open_link)).
//!
//! Same-host proof: a HELLO that names a process on this host gets a fence (a memfd) and that
//! process pinned (a pidfd) only once the client proved it is that process: the server sends a
//! random nonce (PROVE), the client puts it in a write-sealed memfd of its own and answers with
//! the descriptor's number (PROOF), and the server takes that descriptor from the process it
//! pins (`pidfd_getfd`, which only works on a process the server may trace), checks the seals
//! and reads the nonce (a memfd read never blocks). A client that cannot prove it (or a server
//! whose fence budget is spent) is served over TCP. With a key, the proof comes after
//! authentication: nothing is spent on a client that did not prove the key.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use super::conn::{Conn, Ready};
use super::dispatch::whole_frame;
use super::limits::{self, Progress};
use super::server::ServerShared;
use crate::error::Status;
use crate::io::Inbound;
use crate::process::Pinned;
use crate::runtime::revoke::fence::{ServerFence, Slot};
use crate::sync::lock;
use crate::wire::{self, Hello, Kind, LaneRole, Refuse, WireError};

/// Where a handshake is.
pub(super) enum Stage {
    /// Waiting for the HELLO.
    Hello,
    /// CHALLENGE sent with the server's nonce `sn`; waiting for the AUTH.
    Auth { hello: Box<Hello>, sn: [u8; 32] },
    /// PROVE sent with `nonce`; waiting for the PROOF (the client's descriptor holding it).
    Prove { hello: Box<Hello>, nonce: [u8; 32] },
}

/// A connection in its handshake, owned by the poller.
pub(super) struct Handshake {
    pub(super) conn: Conn,
    pub(super) inb: Inbound,
    /// The whole handshake's deadline.
    pub(super) deadline: Instant,
    pub(super) since: Instant,
    pub(super) stage: Stage,
    /// Its HELLO's nonce vouched for the key ([`Psk::vouches`](crate::auth::Psk)): never cut
    /// for a newcomer.
    vouched: bool,
}

/// A handshake frame read whole, or why it cannot be.
type Frame = Result<(Kind, Vec<u8>), WireError>;

/// What a handshake step came to.
pub(super) enum Step {
    /// Needs more bytes from the client.
    Wait(Box<Handshake>),
    /// Complete: a worker opens or joins the link.
    Done(Box<Ready>),
    /// Ended (refused, broken, closed); the connection closes.
    End,
}

impl Handshake {
    pub(super) fn new(conn: Conn, deadline: Instant) -> Self {
        Self {
            conn,
            // handshake frames are small: so is the buffer until the client is welcomed
            inb: Inbound::with_capacity(256),
            deadline,
            since: Instant::now(),
            stage: Stage::Hello,
            vouched: false,
        }
    }

    /// How far it got (what decides which handshake makes room for a newcomer).
    pub(super) fn progress(&self, keyed: bool) -> Progress {
        if self.vouched {
            return Progress::Authenticated;
        }
        match self.stage {
            Stage::Hello => Progress::Silent,
            Stage::Auth { .. } => Progress::Greeted,
            Stage::Prove { .. } if keyed => Progress::Authenticated,
            Stage::Prove { .. } => Progress::Greeted,
        }
    }

    /// Tells the client `status`/`told` (if its send buffer takes it now) before the
    /// connection closes; the log says `why`.
    pub(super) fn refuse(&self, shared: &ServerShared, status: Status, told: &str, why: &str) {
        let mut out = Vec::with_capacity(64 + told.len());
        Refuse {
            status: status.code(),
            reason: told.to_owned(),
        }
        .encode(&mut out);
        let _ = self.conn.sock.send_now(&out);
        tracing::debug!(parent: &shared.span, from = %self.conn.from, why, "handshake refused");
    }

    /// Ends a handshake that broke the protocol (a frame that does not decode, of a kind the
    /// stage does not expect, or with a malformed payload): `FAILED`, at every stage, as on an
    /// established lane ([`dispatch::violation`](super::dispatch::violation)).
    fn violation(&self, shared: &ServerShared, e: WireError) -> Step {
        self.refuse(
            shared,
            limits::PROTOCOL_VIOLATION,
            &e.to_string(),
            "protocol violation",
        );
        Step::End
    }

    /// The next complete handshake frame, if its bytes are in: a header declaring more than
    /// [`limits::MAX_HANDSHAKE_FRAME`] bytes is refused before anything is allocated for it.
    fn frame(&mut self) -> io::Result<Option<Frame>> {
        let what = "handshake frame length";
        let whole = whole_frame(
            &mut self.inb,
            &self.conn.sock,
            limits::MAX_HANDSHAKE_FRAME,
            what,
        )?;
        Ok(whole.map(|h| {
            h.map(|h| {
                self.inb.take(wire::HEADER_LEN);
                (h.kind, self.inb.take(h.len as usize).to_vec())
            })
        }))
    }

    /// Reads what the client sent and answers it, as far as it goes without waiting.
    pub(super) fn step(mut self: Box<Self>, shared: &Arc<ServerShared>) -> Step {
        loop {
            let (kind, p) = match self.frame() {
                Ok(None) => return Step::Wait(self),
                Ok(Some(Ok(f))) => f,
                Ok(Some(Err(e))) => return self.violation(shared, e),
                Err(e) => {
                    tracing::trace!(parent: &shared.span, from = %self.conn.from, error = %e, "handshake ended");
                    return Step::End;
                }
            };
            match std::mem::replace(&mut self.stage, Stage::Hello) {
                Stage::Hello => {
                    if kind != Kind::Hello {
                        return self.violation(shared, WireError::Unexpected(kind));
                    }
                    let hello = match Hello::decode(&p) {
                        Ok(h) => h,
                        Err(e) => return self.violation(shared, e),
                    };
                    let Some(key) = &shared.psk else {
                        return self.authenticated(shared, Box::new(hello));
                    };
                    let Ok(sn) = crate::auth::nonce() else {
                        return self.no_randomness(shared);
                    };
                    let server = self.conn.sock.stream.local_addr();
                    self.vouched = server
                        .is_ok_and(|s| key.vouches(&hello.nonce, &hello.name, self.conn.from, s));
                    let proof = key.server_proof(&hello.nonce, &sn, &hello.name);
                    let mut out = Vec::with_capacity(96);
                    wire::encode_auth(&mut out, Kind::Challenge, &[&sn, &proof]);
                    if self.conn.sock.send_now(&out).is_err() {
                        return Step::End;
                    }
                    self.stage = Stage::Auth {
                        hello: Box::new(hello),
                        sn,
                    };
                }
                Stage::Auth { hello, sn } => {
                    let key = shared.psk.as_ref().expect("a challenge means a key");
                    // a frame that is not a well-formed AUTH breaks the protocol, as at any
                    // other stage; a well-formed one with the wrong proof fails authentication
                    let answer = match (kind, wire::decode_auth(&p, 1)) {
                        (Kind::Auth, Ok(f)) => f[0],
                        (Kind::Auth, Err(e)) => return self.violation(shared, e),
                        (k, _) => return self.violation(shared, WireError::Unexpected(k)),
                    };
                    if !key.check_client(&hello.nonce, &sn, &hello.name, &answer) {
                        let why = format!("engine {:?} failed authentication", hello.name);
                        self.refuse(shared, Status::PARAM_INVALID, "authentication failed", &why);
                        return Step::End;
                    }
                    return self.authenticated(shared, hello);
                }
                Stage::Prove { hello, nonce } => {
                    let fd = match (kind, wire::decode_proof(&p)) {
                        (Kind::Proof, Ok(a)) => a,
                        (Kind::Proof, Err(e)) => return self.violation(shared, e),
                        (k, _) => return self.violation(shared, WireError::Unexpected(k)),
                    };
                    let fence = self.proven(shared, &hello, fd, &nonce);
                    return self.finish(shared, hello, fence);
                }
            }
        }
    }

    /// The client is authenticated (or no key is needed): the allow-list, then the same-host
    /// proof for a new link from a process on this host, else the end of the handshake.
    fn authenticated(mut self: Box<Self>, shared: &Arc<ServerShared>, hello: Box<Hello>) -> Step {
        if let Some(allow) = &shared.allow
            && !allow.contains(&hello.name)
        {
            let why = format!("engine {:?} is not on the allow-list", hello.name);
            self.refuse(shared, Status::PARAM_INVALID, &why, &why);
            return Step::End;
        }
        let room = lock(&shared.fences).as_ref().is_some_and(|_| {
            shared.fenced.load(std::sync::atomic::Ordering::SeqCst) < shared.limits.max_fenced()
        });
        if hello.role == LaneRole::NewLink && same_host(shared, &hello) && room {
            let Ok(nonce) = crate::auth::nonce() else {
                return self.no_randomness(shared);
            };
            let mut out = Vec::with_capacity(48);
            wire::encode_prove(&mut out, &nonce);
            if self.conn.sock.send_now(&out).is_err() {
                return Step::End;
            }
            self.stage = Stage::Prove { hello, nonce };
            return Step::Wait(self);
        }
        self.finish(shared, hello, None)
    }

    /// The fence of a client that proved it is the process it named (`nonce` in its
    /// descriptor `fd`), if the budget has room; `None` serves it over TCP.
    fn proven(
        &self,
        shared: &ServerShared,
        hello: &Hello,
        fd: u64,
        nonce: &[u8; 32],
    ) -> Option<ServerFence> {
        let client = hello.host.as_ref()?;
        let fd = i32::try_from(fd).ok()?;
        let slot = Slot::take(&shared.fenced, shared.limits.max_fenced())?;
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
        tracing::debug!(parent: &shared.span, from = %self.conn.from, why, "same-host proof failed; serving the client over tcp");
        None
    }

    /// The end of the handshake: counted as an established lane, handed to a worker.
    fn finish(
        self: Box<Self>,
        shared: &Arc<ServerShared>,
        hello: Box<Hello>,
        fence: Option<ServerFence>,
    ) -> Step {
        if let Err(why) = lock(&shared.conns).establish(self.conn.id, &shared.limits) {
            self.refuse(shared, Status::RESOURCE_EXHAUSTED, why, why);
            return Step::End;
        }
        let same_host = same_host(shared, &hello);
        let on_this_host = crate::io::peer_on_this_host(&self.conn.sock.stream);
        let Handshake { conn, inb, .. } = *self;
        Step::Done(Box::new(Ready {
            conn,
            inb,
            hello,
            fence,
            same_host,
            on_this_host,
        }))
    }

    /// The random source failed: the client is refused, never given a guessable nonce.
    fn no_randomness(&self, shared: &ServerShared) -> Step {
        let told = "the server has no random source";
        self.refuse(shared, Status::FAILED, told, told);
        Step::End
    }
}

/// Whether `hello` names a process on this server's host (boot id and pid namespace).
fn same_host(shared: &ServerShared, hello: &Hello) -> bool {
    matches!((&hello.host, &shared.host), (Some(c), Some(s)) if c.same_host(s))
}
