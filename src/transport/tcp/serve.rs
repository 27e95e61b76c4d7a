//! TCP's serving half: XFER requests on a server's connection. The serving engine
//! (`runtime/serve/`) admits the connection, reads each frame and hands an XFER here: its
//! descriptors are checked against the served regions ([`Served`], the server's region table)
//! before a byte moves, then the bytes go straight between the socket and registered memory (a
//! WRITE's payload is received into it, a READ's reply is sent from it).

use std::io;
use std::time::{Duration, Instant};

use crate::error::Status;
use crate::io::{Inbound, IoVec, Pace, Sock};
use crate::types::batch::WireDescs;
use crate::types::blocks::WireBlocks;
use crate::types::{TransferOp, WireDesc};
use crate::wire::{self, Kind, WireError};

/// Most entries a serving connection keeps in its descriptor vectors between requests.
const KEEP_DESCS: usize = 4096;

/// The regions a server serves, as its TCP serving half sees them (the control plane's region
/// table implements it).
///
/// # Safety
/// When [`Served::admit`] returns `Ok`, every range it put in `targets` lies in registered host
/// memory that is valid for reads, and for writes of any bytes by anyone, for as long as the
/// returned [`Served::Held`] lives (it keeps the regions alive and registered).
pub(crate) unsafe trait Served {
    /// What keeps a request's regions alive and registered; dropped once the request is done
    /// with their memory.
    type Held;

    /// Checks a batch against the regions (each descriptor's region, or a block batch's
    /// once, by its largest index; bounds with overflow checks, the access rights, host
    /// memory) and puts the memory it touches in `targets`, in order (ranges adjacent in memory
    /// in one).
    ///
    /// `conn` is the lane's connection id (a withdrawal that waited long enough for a
    /// request cuts its lane by it).
    ///
    /// # Errors
    /// The status and reason the client is told: nothing was touched.
    fn admit(
        &self,
        conn: u64,
        op: TransferOp,
        descs: WireDescs<'_>,
        targets: &mut Vec<IoVec>,
    ) -> Result<Self::Held, (Status, String)>;
}

/// How long a request waits on a socket that makes no progress before it is parked: its worker
/// goes on to other work, and the request resumes when the socket is ready. A client that reads
/// (or sends) at any useful pace never waits that long: the kernel wakes a sender once half its
/// buffer has drained.
pub(crate) const PATIENCE: Duration = Duration::from_millis(5);

/// What a lane does after a request moved what it could.
#[derive(Debug)]
pub(crate) enum After {
    /// Its next request: this one's bytes have all moved.
    NextRequest,
    /// Waits for its socket: the request is parked with what it has left.
    Park,
    /// Closes, for this reason (a refused WRITE: its payload that follows cannot be skipped
    /// safely).
    Close(String),
}

/// A request under way: what it has left to receive (a WRITE's payload, into registered
/// memory) and then to send (its DONE, and a READ's data, from registered memory), and the
/// hold on the regions they move. It moves what the socket takes without waiting longer than
/// [`PATIENCE`]; a request that cannot is parked in this state and resumed later.
pub(crate) struct Pending<H> {
    recv: Vec<IoVec>,
    recv_pos: usize,
    send: Vec<IoVec>,
    send_pos: usize,
    /// The frame `send[0]` points into (its heap buffer stays put when the struct moves).
    _frame: Vec<u8>,
    /// What follows once every byte has moved ([`After::NextRequest`] or [`After::Close`]).
    then: After,
    /// It was parked once: it resumes without waiting until it keeps pace again.
    resumed: bool,
    /// When the whole request must be done.
    pub(crate) deadline: Option<Instant>,
    /// Keeps the regions the iovecs point into alive and registered (`Served::Held`); dropped
    /// once they are done with (or when the request is dropped unfinished).
    _held: Option<H>,
}

impl<H> Pending<H> {
    /// A frame to send (a reply), then `then`.
    pub(crate) fn reply(frame: Vec<u8>, then: After, deadline: Option<Instant>) -> Box<Self> {
        let send = vec![IoVec {
            base: frame.as_ptr() as usize,
            len: frame.len(),
        }];
        Box::new(Self {
            recv: Vec::new(),
            recv_pos: 0,
            send,
            send_pos: 0,
            _frame: frame,
            then,
            resumed: false,
            deadline,
            _held: None,
        })
    }

    /// Whether it waits to receive (else to send).
    pub(crate) fn receiving(&self) -> bool {
        self.recv[self.recv_pos.min(self.recv.len())..]
            .iter()
            .any(|v| v.len > 0)
    }

    /// Moves what the socket takes (never waiting more than [`PATIENCE`] for it): once every
    /// byte has moved, what follows; [`After::Park`] when the socket stalled, or when its share
    /// of the worker is spent (a [`PATIENCE`] window ended while `others_wait`).
    ///
    /// # Errors
    /// The socket failed, or the deadline passed (`TimedOut`).
    pub(crate) fn progress(
        &mut self,
        sock: &mut Sock,
        others_wait: &dyn Fn() -> bool,
    ) -> io::Result<After> {
        let pace = Pace {
            deadline: self.deadline,
            patience: PATIENCE,
            resumed: self.resumed,
            others_wait,
        };
        // SAFETY: the receive iovecs are ranges `Served::admit` returned, valid for writes of
        // any bytes, by anyone, while `_held` lives (it lives as long as `self`).
        let received =
            unsafe { sock.move_patiently(false, &mut self.recv, &mut self.recv_pos, &pace) }?;
        // SAFETY: the first send iovec is `self.frame`'s heap buffer, alive and unmoved as long
        // as `self`; the others are ranges `Served::admit` returned, valid for reads while
        // `_held` lives.
        let sent = received
            && unsafe { sock.move_patiently(true, &mut self.send, &mut self.send_pos, &pace) }?;
        if !sent {
            self.resumed = true;
            return Ok(After::Park);
        }
        Ok(std::mem::replace(&mut self.then, After::NextRequest))
    }
}

/// One XFER or XFER_BLOCKS request, decoded (its descriptors or indices are kept by the
/// [`XferServer`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Xfer {
    op: TransferOp,
    req: u64,
    /// An XFER_BLOCKS' layout (its indices in `XferServer::idx`); `None` for an XFER.
    blocks: Option<WireBlocks>,
}

/// A serving connection's XFER half: the buffers its requests reuse.
#[derive(Default)]
pub(crate) struct XferServer {
    descs: Vec<WireDesc>,
    idx: Vec<u64>,
    targets: Vec<IoVec>,
}

impl XferServer {
    /// Decodes an XFER (`kind` [`Kind::Xfer`]) or XFER_BLOCKS frame's payload (its descriptors
    /// or indices are kept for [`XferServer::apply`]).
    ///
    /// # Errors
    /// The frame is not a valid request of its kind.
    pub(crate) fn decode(&mut self, kind: Kind, payload: &[u8]) -> Result<Xfer, WireError> {
        if kind == Kind::Xfer {
            let (op, req) = wire::decode_xfer(payload, &mut self.descs)?;
            return Ok(Xfer {
                op,
                req,
                blocks: None,
            });
        }
        let x = wire::decode_xfer_blocks(payload, &mut self.idx)?;
        Ok(Xfer {
            op: x.op,
            req: x.req,
            blocks: Some(x.blocks),
        })
    }

    /// Starts the request just decoded, due by `deadline`: checked against `served` (a block
    /// batch once, by its largest index, never expanded into descriptors), then the WRITE's
    /// payload is to be received into the targets (what already came with the frame is copied
    /// at once), or the READ's to be sent from them, with the client's DONE (a refused READ
    /// gets its reason, and the connection goes on; a refused WRITE's connection closes). The
    /// caller moves the rest with [`Pending::progress`].
    pub(crate) fn apply<S: Served>(
        &mut self,
        x: Xfer,
        inb: &mut Inbound,
        deadline: Option<Instant>,
        served: &S,
        conn: u64,
    ) -> Box<Pending<S::Held>> {
        let descs = match &x.blocks {
            None => WireDescs::List(&self.descs),
            Some(b) => WireDescs::Blocks(b, &self.idx),
        };
        let admitted = served.admit(conn, x.op, descs, &mut self.targets);
        self.start(x, admitted, inb, deadline)
    }

    /// A request admitted (or refused) by `served`: its DONE, and the payload to move.
    fn start<H>(
        &mut self,
        x: Xfer,
        admitted: Result<H, (Status, String)>,
        inb: &mut Inbound,
        deadline: Option<Instant>,
    ) -> Box<Pending<H>> {
        let mut frame = Vec::new();
        let held = match admitted {
            Ok(h) => h,
            Err((status, reason)) => {
                wire::encode_done(&mut frame, x.req, status.code(), &reason);
                let then = match x.op {
                    TransferOp::Write => After::Close(reason),
                    TransferOp::Read => After::NextRequest,
                };
                return Pending::reply(frame, then, deadline);
            }
        };
        wire::encode_done(&mut frame, x.req, 0, "");
        let mut p = Pending::reply(frame, After::NextRequest, deadline);
        match x.op {
            TransferOp::Write => {
                p.recv = self.targets.clone();
                // the payload's first bytes may have come with the frame
                for t in &mut p.recv {
                    let take = t.len.min(inb.buffered());
                    if take == 0 {
                        break;
                    }
                    let from = inb.take(take);
                    // SAFETY: `admit` put in `targets` only ranges of registered host memory
                    // valid for writes of any bytes, by anyone, while `held` lives; `from` is
                    // our private buffer, which cannot overlap them. Others may write the same
                    // bytes meanwhile (the owner, other peers, other processes): registered
                    // memory is shared with the outside, as a DMA buffer is, and is only ever
                    // copied through raw pointers, never behind a Rust reference; what lands
                    // is some interleaving of the writers' bytes, each valid for `u8`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(from.as_ptr(), t.base as *mut u8, take)
                    };
                    t.base += take;
                    t.len -= take;
                }
            }
            TransferOp::Read => p.send.extend_from_slice(&self.targets),
        }
        p._held = Some(held);
        p
    }

    /// Bytes its buffers hold now.
    pub(crate) fn footprint(&self) -> usize {
        self.descs.capacity() * std::mem::size_of::<WireDesc>()
            + self.idx.capacity() * std::mem::size_of::<u64>()
            + self.targets.capacity() * std::mem::size_of::<IoVec>()
    }

    /// Gives back what a large request made the buffers grow to (between requests a
    /// connection keeps no more memory than a small one needs).
    pub(crate) fn trim(&mut self) {
        if self.targets.capacity() > KEEP_DESCS {
            self.targets = Vec::new();
        }
        if self.descs.capacity() > KEEP_DESCS {
            self.descs = Vec::new();
        }
        if self.idx.capacity() > KEEP_DESCS {
            self.idx = Vec::new();
        }
    }
}
