//! TCP's serving half: XFER requests on a server's connection. The control plane's server
//! (`runtime/control`) admits the connection, reads each frame and hands an XFER here: its
//! descriptors are checked against the served regions ([`Served`], the server's region table)
//! before a byte moves, then the bytes go straight between the socket and registered memory (a
//! WRITE's payload is received into it, a READ's reply is sent from it).

use std::io;
use std::time::Instant;

use crate::error::Status;
use crate::io::{Inbound, IoVec, Sock};
use crate::types::{TransferOp, WireDesc};
use crate::wire::{self, WireError};

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

    /// Checks a batch against the regions (each descriptor's region, its bounds with overflow
    /// checks, the access rights, host memory) and puts the memory it touches in `targets`, in
    /// order.
    ///
    /// # Errors
    /// The status and reason the client is told: nothing was touched.
    fn admit(
        &self,
        op: TransferOp,
        descs: &[WireDesc],
        targets: &mut Vec<IoVec>,
    ) -> Result<Self::Held, (Status, String)>;
}

/// Why an XFER request ends its connection.
#[derive(Debug)]
pub(crate) enum XferEnd {
    /// The socket failed.
    Io(io::Error),
    /// A WRITE was refused (the client was told why): the payload that follows cannot be
    /// skipped safely, so the connection closes.
    Refused(String),
}

/// One XFER request, decoded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Xfer {
    op: TransferOp,
    req: u64,
}

/// A serving connection's XFER half: the buffers its requests reuse.
#[derive(Default)]
pub(crate) struct XferServer {
    descs: Vec<WireDesc>,
    targets: Vec<IoVec>,
    iov: Vec<IoVec>,
}

impl XferServer {
    /// Decodes an XFER frame's payload (its descriptors are kept for [`XferServer::apply`]).
    ///
    /// # Errors
    /// The frame is not a valid XFER.
    pub(crate) fn decode(&mut self, payload: &[u8]) -> Result<Xfer, WireError> {
        let (op, req) = wire::decode_xfer(payload, &mut self.descs)?;
        Ok(Xfer { op, req })
    }

    /// Applies the request just decoded by `deadline`: checked against `served`, then the
    /// WRITE's payload is received into the targets, or the READ's sent from them, and the
    /// client gets its DONE (a refused READ gets its reason, and the connection goes on).
    ///
    /// # Errors
    /// The connection ends: see [`XferEnd`].
    pub(crate) fn apply<S: Served>(
        &mut self,
        x: Xfer,
        sock: &mut Sock,
        inb: &mut Inbound,
        out: &mut Vec<u8>,
        deadline: Option<Instant>,
        served: &S,
    ) -> Result<(), XferEnd> {
        // alive until the request is done with the memory (the end of this function)
        let _held = match served.admit(x.op, &self.descs, &mut self.targets) {
            Ok(h) => h,
            Err((status, reason)) => {
                wire::encode_done(out, x.req, status.code(), &reason);
                let _ = sock.send_bytes(out, deadline);
                if x.op == TransferOp::Write {
                    // the payload that follows cannot be skipped safely: close the lane
                    return Err(XferEnd::Refused(reason));
                }
                return Ok(());
            }
        };
        match x.op {
            TransferOp::Write => {
                // SAFETY: `admit` put in `targets` only ranges of registered host memory valid
                // for writes of any bytes, by anyone, while `_held` lives (`Served`'s contract).
                unsafe { inb.recv_into(sock, &self.targets, deadline) }.map_err(XferEnd::Io)?;
                wire::encode_done(out, x.req, 0, "");
                sock.send_bytes(out, deadline).map_err(XferEnd::Io)
            }
            TransferOp::Read => {
                wire::encode_done(out, x.req, 0, "");
                self.iov.clear();
                self.iov.push(IoVec {
                    base: out.as_ptr() as usize,
                    len: out.len(),
                });
                self.iov.extend_from_slice(&self.targets);
                // SAFETY: the first iovec is `out`, alive for the call; the others are valid
                // for reads while `_held` lives (`Served`'s contract).
                unsafe { sock.send_all(&mut self.iov, deadline) }.map_err(XferEnd::Io)
            }
        }
    }

    /// Gives back what a large request made the buffers grow to (between requests a
    /// connection keeps no more memory than a small one needs).
    /// Bytes its buffers hold now.
    pub(crate) fn footprint(&self) -> usize {
        self.descs.capacity() * std::mem::size_of::<WireDesc>()
            + (self.targets.capacity() + self.iov.capacity()) * std::mem::size_of::<IoVec>()
    }

    pub(crate) fn trim(&mut self) {
        for v in [&mut self.targets, &mut self.iov] {
            if v.capacity() > KEEP_DESCS {
                *v = Vec::new();
            }
        }
        if self.descs.capacity() > KEEP_DESCS {
            self.descs = Vec::new();
        }
    }
}
