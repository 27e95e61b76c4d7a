//! One lane: a TCP connection of a link, client side. It says HELLO (and proves the
//! pre-shared key) to open, then carries one request at a time: an XFER frame with all its
//! descriptors (the WRITE payload follows it straight from registered memory) answered by one
//! DONE frame (the READ payload follows it straight into registered memory), a NOTIFY, a PING
//! or the BYE; or, on a new link's first lane, the frames of a transport's setup.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use crate::auth::{Psk, Role};
use crate::error::Status;
use crate::io::{Inbound, IoVec, Sock, read_frame};
use crate::types::batch::Descs;
use crate::types::{BatchDesc, TransferOp, WireDesc};
use crate::wire::{self, Hello, Kind, Refuse, Welcome};

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

/// One connection of a link, client side.
#[derive(Debug)]
pub(super) struct Lane {
    sock: Sock,
    inb: Inbound,
    out: Vec<u8>,
    iov: Vec<IoVec>,
    targets: Vec<IoVec>,
    /// A list request's descriptors as sent (each run adjacent on both sides joined in one).
    wire: Vec<WireDesc>,
}

impl Lane {
    /// Its connection.
    pub(super) fn stream(&self) -> &TcpStream {
        &self.sock.stream
    }

    /// Connects, says HELLO and reads the WELCOME.
    pub(super) fn open(
        addr: SocketAddr,
        hello: &Hello,
        key: Option<&Psk>,
        deadline: Instant,
    ) -> Result<(Self, Welcome), LaneFail> {
        let rem = deadline.saturating_duration_since(Instant::now());
        if rem.is_zero() {
            return Err(LaneFail::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "deadline passed",
            )));
        }
        let stream = TcpStream::connect_timeout(&addr, rem).map_err(LaneFail::Io)?;
        let mut sock = Sock::new(stream).map_err(LaneFail::Io)?;
        sock.set_spin(REPLY_SPIN);
        let mut lane = Lane {
            sock,
            inb: Inbound::new(),
            out: Vec::with_capacity(256),
            iov: Vec::new(),
            targets: Vec::new(),
            wire: Vec::new(),
        };
        // with a key, the nonce vouches for it on this very connection (admission priority)
        let mut vouched;
        let hello = match key {
            Some(k) => {
                let (me, peer) = (lane.sock.stream.local_addr(), lane.sock.stream.peer_addr());
                let (me, peer) = (me.map_err(LaneFail::Io)?, peer.map_err(LaneFail::Io)?);
                vouched = hello.clone();
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
            match read_frame(&mut lane.sock, &mut lane.inb, dl, || dl).map_err(LaneFail::Io)? {
                Ok((Kind::Challenge, p)) if !proven => {
                    let Some(key) = key else {
                        return Err(LaneFail::Auth(
                            "the peer requires a pre-shared key; none is configured",
                        ));
                    };
                    let f =
                        wire::decode_auth(p, 2).map_err(|e| LaneFail::Protocol(e.to_string()))?;
                    let (sn, proof) = (f[0], f[1]);
                    if !key.check(Role::Server, &hello.nonce, &sn, &hello.name, &proof) {
                        return Err(LaneFail::Auth("the peer does not know the pre-shared key"));
                    }
                    let mine = key.client_proof(&hello.nonce, &sn, &hello.name);
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

    /// Runs one frame of a batch (at most [`wire::MAX_DESCS_PER_FRAME`] descriptors or
    /// blocks, a block batch's of one layout) on this lane: an XFER for a list, an
    /// XFER_BLOCKS carrying the remote indices for blocks; the local ranges are the payload's
    /// targets.
    ///
    /// # Safety
    /// Every descriptor's (block's) local range is valid registered memory for the whole call:
    /// readable for WRITE, writable with any bytes (and not otherwise referenced) for READ.
    pub(super) unsafe fn xfer(
        &mut self,
        op: TransferOp,
        req: u64,
        descs: Descs<'_>,
        deadline: Instant,
    ) -> Result<(), LaneFail> {
        match descs {
            Descs::List(x) => {
                join_list(x, &mut self.wire, &mut self.targets);
                wire::encode_xfer(&mut self.out, op, req, self.wire.iter().copied());
            }
            Descs::Blocks(b) => {
                debug_assert_eq!(b.layouts.len(), 1, "a frame carries one layout");
                wire::encode_xfer_blocks(
                    &mut self.out,
                    op,
                    req,
                    &b.layouts[0].remote,
                    b.remote_idx,
                );
                let t = &mut self.targets;
                t.clear();
                descs.for_each_local(|base, len| IoVec::push_joined(t, base, len));
            }
        }
        // SAFETY: the targets are the local ranges (this function's contract).
        unsafe { self.exchange_xfer(op, req, deadline) }
    }

    /// Sends the request in `self.out` (with the WRITE payload from `self.targets`), reads its
    /// DONE and the READ payload into `self.targets`.
    ///
    /// # Safety
    /// `self.targets` are valid registered memory for the whole call: readable for WRITE,
    /// writable with any bytes (and not otherwise referenced) for READ.
    unsafe fn exchange_xfer(
        &mut self,
        op: TransferOp,
        req: u64,
        deadline: Instant,
    ) -> Result<(), LaneFail> {
        let dl = Some(deadline);
        self.iov.clear();
        self.iov.push(IoVec {
            base: self.out.as_ptr() as usize,
            len: self.out.len(),
        });
        if op == TransferOp::Write {
            self.iov.extend_from_slice(&self.targets);
        }
        // SAFETY: the first iovec is `self.out`, alive for the call; the others are the local
        // ranges, valid for reads for the whole call (this function's contract).
        let sent = unsafe { self.sock.send_all(&mut self.iov, dl) };
        if let Err(e) = sent {
            // the peer may have refused and closed: prefer its reason to the broken pipe
            if op == TransferOp::Write && e.kind() != io::ErrorKind::TimedOut {
                let quick = Some(Instant::now() + Duration::from_millis(50));
                let reply = read_frame(&mut self.sock, &mut self.inb, quick, || quick);
                if let Ok(Ok((Kind::Done, p))) = reply
                    && let Ok((_, status, reason)) = wire::decode_done(p)
                    && status != 0
                {
                    return Err(LaneFail::Refused {
                        status: Status::from_peer(status),
                        reason,
                        usable: false,
                    });
                }
            }
            return Err(LaneFail::Io(e));
        }
        let (status, reason) = self.read_done(req, dl)?;
        if status != 0 {
            return Err(LaneFail::Refused {
                status: Status::from_peer(status),
                reason,
                // a refused READ leaves the lane in step; a refused WRITE is closed by the peer
                usable: op == TransferOp::Read,
            });
        }
        if op == TransferOp::Read {
            // SAFETY: the targets are the local ranges, valid for writes of any bytes for the
            // whole call (this function's contract).
            unsafe { self.inb.recv_into(&mut self.sock, &mut self.targets, dl) }
                .map_err(LaneFail::Io)?;
        }
        Ok(())
    }

    /// Reads the DONE frame answering request `req`: its status code and reason.
    fn read_done(&mut self, req: u64, dl: Option<Instant>) -> Result<(u32, String), LaneFail> {
        let (got, status, reason) =
            match read_frame(&mut self.sock, &mut self.inb, dl, || dl).map_err(LaneFail::Io)? {
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
        match read_frame(&mut self.sock, &mut self.inb, dl, || dl).map_err(LaneFail::Io)? {
            Ok((Kind::Refuse, p)) => Err(refusal(p, false)),
            Ok((k, p)) => Ok((k, p.to_vec())),
            Err(e) => Err(LaneFail::Protocol(e.to_string())),
        }
    }

    /// Another handle to the lane's socket (it keeps the socket open on its own).
    pub(super) fn try_clone_stream(&self) -> io::Result<TcpStream> {
        self.sock.stream.try_clone()
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

    /// Sends an empty frame of kind `ask` and waits for an empty frame of kind `answer`.
    fn exchange(&mut self, ask: Kind, answer: Kind, deadline: Instant) -> Result<(), LaneFail> {
        let dl = Some(deadline);
        self.sock
            .send_bytes(&wire::header(ask, 0), dl)
            .map_err(LaneFail::Io)?;
        match read_frame(&mut self.sock, &mut self.inb, dl, || dl).map_err(LaneFail::Io)? {
            Ok((k, _)) if k == answer => Ok(()),
            Ok((k, _)) => Err(LaneFail::Protocol(format!(
                "expected {answer:?}, got {k:?}"
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
mod tests {
    use super::*;

    fn d(local: usize, region: u32, offset: u64, len: u64) -> BatchDesc {
        BatchDesc::of(local, region, offset, len)
    }

    /// Descriptors adjacent on both sides join; adjacent on one side only, or in another
    /// region, they stay apart (local ranges that follow each other still join); the bytes
    /// and their order are the list's.
    #[test]
    fn a_list_joins_runs_adjacent_on_both_sides() {
        let list = [
            d(1000, 1, 0, 64),
            d(1064, 1, 64, 64),   // joins: next local, next offset
            d(1128, 1, 128, 32),  // joins
            d(1160, 1, 4096, 64), // local adjacent, remote not: a new descriptor, same range
            d(5000, 1, 4160, 64), // remote adjacent, local not: a new descriptor and range
            d(5064, 2, 4224, 64), // local adjacent, another region
            d(5128, 2, 4288, 8),  // joins the one before
        ];
        let (mut wire, mut targets) = (vec![d(9, 9, 9, 9).remote], vec![]);
        join_list(&list, &mut wire, &mut targets);
        let w = |region, offset, len| WireDesc {
            region,
            offset,
            len,
        };
        assert_eq!(
            wire,
            [w(1, 0, 160), w(1, 4096, 64), w(1, 4160, 64), w(2, 4224, 72)]
        );
        let t: Vec<(usize, usize)> = targets.iter().map(|v| (v.base, v.len)).collect();
        assert_eq!(t, [(1000, 224), (5000, 136)]);
        let bytes = |it: &mut dyn Iterator<Item = u64>| it.sum::<u64>();
        assert_eq!(
            bytes(&mut wire.iter().map(|x| x.len)),
            bytes(&mut list.iter().map(|x| x.remote.len))
        );
    }
}
