//! One lane: a TCP connection of a link, client side. It says HELLO (and proves the
//! pre-shared key) to open, then carries requests, a batch's pipelined and answered in order:
//! an XFER frame with all its descriptors (the WRITE payload follows it straight from
//! registered memory) answered by one DONE frame (the READ payload follows it straight into
//! registered memory), a NOTIFY, a PING or the BYE; or, on a new link's first lane, the frames
//! of a transport's setup.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::auth::{Psk, Role};
use crate::error::Status;
use crate::io::{Inbound, IoVec, Sock, read_frame};
use crate::types::batch::Descs;
use crate::types::{BatchDesc, TransferOp, WireDesc};
use crate::wire::{self, Hello, Kind, Refuse, Welcome};

/// What a client takes from a server: any frame up to [`wire::MAX_FRAME`] (a large table's
/// WELCOME, a UCXINFO; the server's frames are the client's to trust that far).
fn any(_: Kind) -> u32 {
    wire::MAX_FRAME
}

/// How a lane operation failed.
#[derive(Debug)]
pub(super) enum LaneFail {
    /// The peer refused the request; `usable` says whether the lane is still in step.
    Refused {
        status: Status,
        reason: String,
        usable: bool,
    },
    /// An I/O error (timeouts included); the lane is dead.
    Io(io::Error),
    /// The peer broke the protocol; the lane is dead.
    Protocol(String),
    /// Peer authentication failed; the lane is dead.
    Auth(&'static str),
}

/// How long a client lane polls for a reply before sleeping: small transfers come back within
/// it and skip a wake-up; large ones spend at most this much CPU more per call.
const REPLY_SPIN: Duration = Duration::from_micros(50);

/// A list's descriptors as a request carries them, into `wire`, and its local ranges, into
/// `targets` (both cleared first): a run of descriptors that follow each other on both sides
/// (the next local address and the next offset of the same remote region) is one descriptor,
/// and local ranges that follow each other are one range. The bytes moved and their order are the list's; the request is shorter (10⁵
/// descriptors of consecutive blocks: one instead of 2 MB of them), and the server checks the
/// joined range against the same region.
fn join_list(x: &[BatchDesc], wire: &mut Vec<WireDesc>, targets: &mut Vec<IoVec>) {
    wire.clear();
    targets.clear();
    for d in x {
        // the last range ends where the descriptor before this one ended locally
        let follows_locally = targets.last().is_some_and(|t| t.base + t.len == d.local);
        if let Some(w) = wire.last_mut()
            && follows_locally
            && d.remote.region == w.region
            && w.offset.checked_add(w.len) == Some(d.remote.offset)
        {
            w.len += d.remote.len;
            targets.last_mut().expect("a range for each descriptor").len += d.remote.len as usize;
        } else {
            wire.push(d.remote);
            IoVec::push_joined(targets, d.local, d.remote.len as usize);
        }
    }
}

/// `f`, with the lane no longer usable: requests (or part of one) are out that nobody will
/// read the replies of.
fn out_of_step(f: LaneFail) -> LaneFail {
    match f {
        LaneFail::Refused { status, reason, .. } => LaneFail::Refused {
            status,
            reason,
            usable: false,
        },
        other => other,
    }
}

/// One connection of a link, client side.
#[derive(Debug)]
pub(super) struct Lane {
    sock: Sock,
    inb: Inbound,
    out: Vec<u8>,
    iov: Vec<IoVec>,
    /// A list request's descriptors as sent (each run adjacent on both sides joined in one).
    wire: Vec<WireDesc>,
    /// The requests sent and not answered yet, oldest first.
    sent: VecDeque<Sent>,
    /// Emptied range lists of answered requests, for the next ones.
    spare: Vec<Vec<IoVec>>,
}

/// A request sent on a lane whose DONE has not been read.
#[derive(Debug)]
struct Sent {
    req: u64,
    /// Its encoded request's length.
    bytes: usize,
    /// A READ's payload length (0 for a WRITE).
    payload: usize,
    /// Its local ranges: where a READ's payload goes.
    targets: Vec<IoVec>,
}

/// Most requests a lane has unanswered (a pipelined batch's frames; their DONEs wait in this
/// lane's socket buffer, a few dozen bytes each).
pub(super) const IN_FLIGHT: usize = 64;

/// Most bytes of READ requests a lane has unanswered (see [`Lane::xfer`]): the server reads the
/// next request only once it has sent a payload, so a longer queue gains nothing; within this
/// window the queue fits common socket buffers, and the lane seldom has to read replies early
/// to get a request out (`send_request`).
pub(super) const READ_WINDOW: usize = 16 << 10;

/// Most bytes of READ payloads a lane has unanswered before it sends another READ request (see
/// [`Lane::xfer`]): a frame whose payload is larger goes out once the one before it is read.
/// Small payloads (a block batch of many small tensors) still go out together, costing one
/// round trip; large ones gain nothing from being queued at the server, which sends one
/// payload at a time, and on loopback a queue of megabyte payloads measured about 14% slower
/// than one at a time (LLM-DataDist's pull of 4 tensors x 64 blocks of 16 KiB, six pairs).
pub(super) const READ_PAYLOAD_WINDOW: usize = 256 << 10;

impl Lane {
    /// Its connection.
    pub(super) fn stream(&self) -> &TcpStream {
        &self.sock.stream
    }

    /// Connects, says HELLO and reads the WELCOME. `connected` sees the connection once it is
    /// made (to keep a handle that can shut it down); its error ends the opening.
    pub(super) fn open(
        addr: SocketAddr,
        hello: &Hello,
        key: Option<&Psk>,
        deadline: Instant,
        connected: impl FnOnce(&TcpStream) -> io::Result<()>,
    ) -> Result<(Self, Welcome), LaneFail> {
        let rem = deadline.saturating_duration_since(Instant::now());
        if rem.is_zero() {
            return Err(LaneFail::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "deadline passed",
            )));
        }
        #[cfg(not(test))]
        let stream = TcpStream::connect_timeout(&addr, rem);
        // (a test's listener may ask for its clients' smallest receive buffers)
        #[cfg(test)]
        let stream = crate::io::tiny::connect(&addr, rem);
        let stream = stream.map_err(LaneFail::Io)?;
        connected(&stream).map_err(LaneFail::Io)?;
        let mut sock = Sock::new(stream).map_err(LaneFail::Io)?;
        sock.set_spin(REPLY_SPIN);
        let mut lane = Lane {
            sock,
            inb: Inbound::new(),
            out: Vec::with_capacity(256),
            iov: Vec::new(),
            wire: Vec::new(),
            sent: VecDeque::new(),
            spare: Vec::new(),
        };
        // with a key, the nonce vouches for it on this very connection (admission priority),
        // and the target is the address the connection reached (what the server checks and
        // the proofs bind: a relay at another address is refused; a server named by a
        // wildcard address is reached at a real one)
        let mut vouched;
        let hello = match key {
            Some(k) => {
                let (me, peer) = (lane.sock.stream.local_addr(), lane.sock.stream.peer_addr());
                let (me, peer) = (me.map_err(LaneFail::Io)?, peer.map_err(LaneFail::Io)?);
                vouched = hello.clone();
                vouched.target = peer.to_string();
                vouched.nonce = k
                    .vouching_nonce(&hello.name, me, peer)
                    .map_err(|e| LaneFail::Io(io::Error::other(e.to_string())))?;
                &vouched
            }
            None => hello,
        };
        hello.encode(&mut lane.out);
        lane.sock
            .send_bytes(&lane.out, Some(deadline))
            .map_err(LaneFail::Io)?;
        let dl = Some(deadline);
        let mut proven = false;
        // the server's same-host nonce in a sealed memfd of this process, which the server takes
        // (PROOF names the descriptor): open until the WELCOME, which comes after that
        let mut placed: Option<std::os::fd::OwnedFd> = None;
        loop {
            match read_frame(&mut lane.sock, &mut lane.inb, any, dl, || dl).map_err(LaneFail::Io)? {
                Ok((Kind::Challenge, p)) if !proven => {
                    let Some(key) = key else {
                        return Err(LaneFail::Auth(
                            "the peer requires a pre-shared key; none is configured",
                        ));
                    };
                    let f =
                        wire::decode_auth(p, 2).map_err(|e| LaneFail::Protocol(e.to_string()))?;
                    let (sn, proof) = (f[0], f[1]);
                    let who = crate::auth::Who {
                        name: &hello.name,
                        target: &hello.target,
                    };
                    if !key.check(Role::Server, &hello.nonce, &sn, who, &proof) {
                        return Err(LaneFail::Auth(
                            "the peer does not know the pre-shared key, or did not answer the \
                             HELLO this engine sent to the address it dialed (a relay)",
                        ));
                    }
                    let mine = key.client_proof(&hello.nonce, &sn, who);
                    wire::encode_auth(&mut lane.out, Kind::Auth, &[&mine]);
                    lane.sock.send_bytes(&lane.out, dl).map_err(LaneFail::Io)?;
                    proven = true;
                }
                Ok((Kind::Prove, p)) if placed.is_none() && hello.host.is_some() => {
                    if key.is_some() && !proven {
                        return Err(LaneFail::Auth(
                            "the peer did not authenticate (it has no pre-shared key)",
                        ));
                    }
                    let nonce =
                        wire::decode_prove(p).map_err(|e| LaneFail::Protocol(e.to_string()))?;
                    let fd = crate::process::Pinned::proof_memfd(&nonce).map_err(LaneFail::Io)?;
                    let at = std::os::fd::AsRawFd::as_raw_fd(placed.insert(fd));
                    wire::encode_proof(&mut lane.out, at as u64);
                    lane.sock.send_bytes(&lane.out, dl).map_err(LaneFail::Io)?;
                }
                Ok((Kind::Welcome, _)) if key.is_some() && !proven => {
                    return Err(LaneFail::Auth(
                        "the peer did not authenticate (it has no pre-shared key)",
                    ));
                }
                Ok((Kind::Welcome, p)) => {
                    let w = Welcome::decode(p).map_err(|e| LaneFail::Protocol(e.to_string()))?;
                    drop(placed);
                    // a large table's WELCOME (up to MAX_FRAME) is not kept for the lane's life
                    lane.inb.trim();
                    return Ok((lane, w));
                }
                Ok((Kind::Refuse, p)) => return Err(refusal(p, false)),
                Ok((k, _)) => {
                    return Err(LaneFail::Protocol(format!("expected WELCOME, got {k:?}")));
                }
                Err(e) => return Err(LaneFail::Protocol(e.to_string())),
            }
        }
    }

    /// Runs a batch (or a part of one) on this lane in frames of at most
    /// [`wire::MAX_DESCS_PER_FRAME`] descriptors or blocks (a block batch's a layout at a
    /// time), each an XFER for a list or an XFER_BLOCKS carrying the remote indices, numbered
    /// from `reqs`. The frames are pipelined: a request goes out without waiting for the DONEs
    /// of those before it (a block batch of one layout per tensor costs one round trip, not one
    /// per tensor), up to [`IN_FLIGHT`] requests and, for READ, [`READ_WINDOW`] bytes of them
    /// and [`READ_PAYLOAD_WINDOW`] bytes of their payloads unanswered; the DONEs (and READ
    /// payloads) are read in order.
    ///
    /// # Safety
    /// Every descriptor's (block's) local range is valid registered memory for the whole call:
    /// readable for WRITE, writable with any bytes (and not otherwise referenced) for READ.
    pub(super) unsafe fn xfer(
        &mut self,
        op: TransferOp,
        descs: Descs<'_>,
        reqs: &AtomicU64,
        deadline: Instant,
    ) -> Result<(), LaneFail> {
        // an earlier call's ranges must never be written after it returned: every call leaves
        // no request unanswered (below), and a lane that did is not used again
        if !self.sent.is_empty() {
            return Err(LaneFail::Protocol(
                "a lane with unanswered requests of an earlier batch".into(),
            ));
        }
        let r = descs
            .try_frames(wire::MAX_DESCS_PER_FRAME, |frame| {
                let req = reqs.fetch_add(1, Ordering::Relaxed);
                // SAFETY: the frame's ranges are some of the batch's (this function's contract).
                unsafe { self.send_request(op, req, frame, deadline) }
            })
            .and_then(|()| {
                while !self.sent.is_empty() {
                    // SAFETY: as above: each unanswered request's ranges are the batch's.
                    unsafe { self.finish_oldest(op, deadline) }?;
                }
                Ok(())
            });
        if r.is_err() && !self.sent.is_empty() {
            // requests are still unanswered: their replies would come to the next user
            self.sent.clear();
            return r.map_err(out_of_step);
        }
        r
    }

    /// Encodes one frame's request into `self.out` and its local ranges, waits for the
    /// oldest replies while the pipeline is full, then sends the request (with the WRITE
    /// payload) and counts it unanswered.
    ///
    /// # Safety
    /// The frame's local ranges are valid registered memory until its reply is read
    /// ([`Lane::xfer`]'s contract).
    unsafe fn send_request(
        &mut self,
        op: TransferOp,
        req: u64,
        frame: Descs<'_>,
        deadline: Instant,
    ) -> Result<(), LaneFail> {
        let mut targets = self.spare.pop().unwrap_or_default();
        match frame {
            Descs::List(x) => {
                join_list(x, &mut self.wire, &mut targets);
                wire::encode_xfer(&mut self.out, op, req, self.wire.iter().copied());
            }
            Descs::Blocks(b) => {
                debug_assert_eq!(b.layouts.len(), 1, "a frame carries one layout");
                let (layout, idx) = (&b.layouts[0].remote, b.remote_idx);
                wire::encode_xfer_blocks(&mut self.out, op, req, layout, idx);
                targets.clear();
                frame.for_each_local(|base, len| IoVec::push_joined(&mut targets, base, len));
            }
        }
        let bytes = self.out.len();
        let payload = match op {
            TransferOp::Read => targets.iter().map(|t| t.len).sum(),
            TransferOp::Write => 0,
        };
        let unanswered = |sent: &VecDeque<Sent>| sent.iter().map(|s| s.bytes).sum::<usize>();
        let coming = |sent: &VecDeque<Sent>| sent.iter().map(|s| s.payload).sum::<usize>();
        while !self.sent.is_empty()
            && (self.sent.len() >= IN_FLIGHT
                || (op == TransferOp::Read
                    && (unanswered(&self.sent) + bytes > READ_WINDOW
                        || coming(&self.sent) + payload > READ_PAYLOAD_WINDOW)))
        {
            // SAFETY: the caller's contract, for the earlier frames too.
            unsafe { self.finish_oldest(op, deadline) }?;
        }
        let dl = Some(deadline);
        self.iov.clear();
        self.iov.push(IoVec {
            base: self.out.as_ptr() as usize,
            len: bytes,
        });
        if op == TransferOp::Write {
            self.iov.extend_from_slice(&targets);
        }
        // While the request cannot go out, the replies of those before it are read: the
        // server answers them in order, each whole, without waiting for anything more from
        // this lane, and it reads this request only after it sent them. Waiting on the send
        // alone could wait for good: the server stuck sending a payload this lane does not
        // read, this lane stuck sending a request the server does not read, as soon as the
        // socket buffers are smaller than the requests in flight (TCP shrinks them to a few
        // KiB under memory pressure).
        loop {
            // SAFETY: the first iovec is `self.out`, alive for the call; the others are the
            // frame's local ranges, valid for reads (this function's contract).
            let sent = match unsafe { self.sock.send_fitting(&mut self.iov) } {
                Ok(sent) => sent,
                Err(e) => return Err(self.send_failed(op, e, deadline)),
            };
            if sent {
                break;
            }
            if self.sent.is_empty() {
                // nothing to read: the server reads this request as soon as it can
                // SAFETY: as above (what is left of the same iovecs).
                if let Err(e) = unsafe { self.sock.send_all(&mut self.iov, dl) } {
                    return Err(self.send_failed(op, e, deadline));
                }
                break;
            }
            // SAFETY: the caller's contract, for the earlier frames too.
            if let Err(e) = unsafe { self.finish_oldest(op, deadline) } {
                // with part of this request out (the first iovec, the frame, goes first), the
                // lane is out of step
                return Err(if self.iov[0].len < bytes {
                    out_of_step(e)
                } else {
                    e
                });
            }
        }
        self.sent.push_back(Sent {
            req,
            bytes,
            payload,
            targets,
        });
        Ok(())
    }

    /// Why a send failed: a WRITE the peer refused (it closes the lane) has its reason in a
    /// DONE, after those of the requests before it, looked for 50 ms at most and not past the
    /// transfer's `deadline`; else the I/O error.
    fn send_failed(&mut self, op: TransferOp, e: io::Error, deadline: Instant) -> LaneFail {
        if op == TransferOp::Write && e.kind() != io::ErrorKind::TimedOut {
            let quick = Some((Instant::now() + Duration::from_millis(50)).min(deadline));
            for _ in 0..=self.sent.len() {
                match read_frame(&mut self.sock, &mut self.inb, any, quick, || quick) {
                    Ok(Ok((Kind::Done, p))) => match wire::decode_done(p) {
                        Ok((_, 0, _)) => continue,
                        Ok((_, status, reason)) => {
                            return LaneFail::Refused {
                                status: Status::from_peer(status),
                                reason,
                                usable: false,
                            };
                        }
                        Err(_) => break,
                    },
                    _ => break,
                }
            }
        }
        LaneFail::Io(e)
    }

    /// Reads the DONE of the oldest unanswered request, and its READ payload into its ranges.
    ///
    /// # Safety
    /// Its local ranges are valid registered memory, writable with any bytes (and not
    /// otherwise referenced) for READ ([`Lane::xfer`]'s contract).
    unsafe fn finish_oldest(&mut self, op: TransferOp, deadline: Instant) -> Result<(), LaneFail> {
        let dl = Some(deadline);
        let Some(mut s) = self.sent.pop_front() else {
            return Ok(());
        };
        let (status, reason) = self.read_done(s.req, dl)?;
        if status != 0 {
            return Err(LaneFail::Refused {
                status: Status::from_peer(status),
                reason,
                // a refused READ leaves the lane in step (when nothing after it is unanswered:
                // see `xfer`); a refused WRITE is closed by the peer
                usable: op == TransferOp::Read,
            });
        }
        if op == TransferOp::Read {
            // SAFETY: the request's local ranges, valid for writes of any bytes (this
            // function's contract).
            unsafe { self.inb.recv_into(&mut self.sock, &mut s.targets, dl) }
                .map_err(LaneFail::Io)?;
        }
        s.targets.clear();
        self.spare.push(s.targets);
        Ok(())
    }

    /// Reads the DONE frame answering request `req`: its status code and reason.
    fn read_done(&mut self, req: u64, dl: Option<Instant>) -> Result<(u32, String), LaneFail> {
        let (got, status, reason) = match read_frame(&mut self.sock, &mut self.inb, any, dl, || dl)
            .map_err(LaneFail::Io)?
        {
            Ok((Kind::Done, p)) => {
                wire::decode_done(p).map_err(|e| LaneFail::Protocol(e.to_string()))?
            }
            Ok((Kind::Refuse, p)) => return Err(refusal(p, false)),
            Ok((k, _)) => return Err(LaneFail::Protocol(format!("expected DONE, got {k:?}"))),
            Err(e) => return Err(LaneFail::Protocol(e.to_string())),
        };
        if got != req {
            return Err(LaneFail::Protocol(format!(
                "DONE for request {got}, expected {req}"
            )));
        }
        Ok((status, reason))
    }

    /// Sends one encoded frame (a transport's link setup).
    pub(super) fn send_frame(&mut self, frame: &[u8], deadline: Instant) -> Result<(), LaneFail> {
        self.sock
            .send_bytes(frame, Some(deadline))
            .map_err(LaneFail::Io)
    }

    /// Reads the next frame, whatever its kind (a REFUSE is the peer's refusal).
    pub(super) fn recv_any(&mut self, deadline: Instant) -> Result<(Kind, Vec<u8>), LaneFail> {
        let dl = Some(deadline);
        let r = match read_frame(&mut self.sock, &mut self.inb, any, dl, || dl)
            .map_err(LaneFail::Io)?
        {
            Ok((Kind::Refuse, p)) => Err(refusal(p, false)),
            Ok((k, p)) => Ok((k, p.to_vec())),
            Err(e) => Err(LaneFail::Protocol(e.to_string())),
        };
        // a setup frame can be large: the lane keeps its usual buffer after it
        self.inb.trim();
        r
    }

    /// Another handle to the lane's socket (it keeps the socket open on its own).
    pub(super) fn try_clone_stream(&self) -> io::Result<TcpStream> {
        self.sock.stream.try_clone()
    }

    /// A handle that shuts the lane's connection down from another thread while the lane lives
    /// (it does not keep the connection open: once the lane is gone it upgrades to nothing).
    pub(super) fn shutter(&self) -> std::sync::Weak<TcpStream> {
        std::sync::Arc::downgrade(&self.sock.stream)
    }

    /// The lane's socket (a cancel shuts it down from another thread).
    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        self.sock.stream.as_fd()
    }

    /// Sends a notification and waits for its acknowledgement.
    pub(super) fn notify(
        &mut self,
        req: u64,
        name: &str,
        msg: &str,
        deadline: Instant,
    ) -> Result<(), LaneFail> {
        let dl = Some(deadline);
        wire::encode_notify(&mut self.out, req, name, msg);
        self.sock.send_bytes(&self.out, dl).map_err(LaneFail::Io)?;
        let (status, reason) = self.read_done(req, dl)?;
        if status != 0 {
            return Err(LaneFail::Refused {
                status: Status::from_peer(status),
                reason,
                usable: true,
            });
        }
        Ok(())
    }

    /// Sends PING and waits for PONG.
    pub(super) fn ping(&mut self, deadline: Instant) -> Result<(), LaneFail> {
        self.exchange(Kind::Ping, Kind::Pong, deadline)
    }

    /// Sends BYE and waits for the acknowledgement.
    pub(super) fn bye(&mut self, deadline: Instant) -> Result<(), LaneFail> {
        self.exchange(Kind::Bye, Kind::ByeAck, deadline)
    }

    /// Sends an empty frame of kind `ask` and waits for an empty frame of kind `answer` (what
    /// a server sends). Only the answer's header is waited for: an answer with a payload, or of
    /// another kind, breaks the protocol (the lane is dropped), and its payload is not read
    /// beyond what the lane's usual buffer takes in (a server answering every heartbeat with
    /// 8 MiB does not grow the buffer to 8 MiB).
    fn exchange(&mut self, ask: Kind, answer: Kind, deadline: Instant) -> Result<(), LaneFail> {
        let dl = Some(deadline);
        self.sock
            .send_bytes(&wire::header(ask, 0), dl)
            .map_err(LaneFail::Io)?;
        (self.inb)
            .fill(&mut self.sock, wire::HEADER_LEN, dl)
            .map_err(LaneFail::Io)?;
        let mut h = [0u8; wire::HEADER_LEN];
        h.copy_from_slice(self.inb.take(wire::HEADER_LEN));
        match wire::decode_header(&h) {
            Ok(h) if h.kind == answer && h.len == 0 => Ok(()),
            Ok(h) if h.kind == answer => Err(LaneFail::Protocol(format!(
                "{answer:?} with a payload of {} bytes (it has none)",
                h.len
            ))),
            Ok(h) => Err(LaneFail::Protocol(format!(
                "expected {answer:?}, got {:?}",
                h.kind
            ))),
            Err(e) => Err(LaneFail::Protocol(e.to_string())),
        }
    }
}

fn refusal(p: &[u8], usable: bool) -> LaneFail {
    match Refuse::decode(p) {
        Ok(r) => LaneFail::Refused {
            status: Status::from_peer(r.status),
            reason: r.reason,
            usable,
        },
        Err(e) => LaneFail::Protocol(e.to_string()),
    }
}

#[cfg(test)]
mod tests;
