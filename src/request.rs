//! Asynchronous transfers: requests with enforced deadlines, cancellation, user data, batch
//! polling, and `Future` support (no runtime dependency).
//!
//! A [`TransferReq`] owns what its transfer touches: the local regions (kept alive and
//! registered by `Arc`) and the link's state. Dropping or forgetting it is therefore safe: a
//! request that has not started is cancelled, one that is running finishes on its own, unless
//! its link is closed first (disconnect, drop, or the engine's `deactivate`/`finalize`/drop),
//! which cancels it and waits for it to end. A terminal status
//! ([`TransferStatus::is_terminal`]) means the engine no longer touches the local buffers.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::runtime::handle::ReqHandle;
use crate::runtime::request::{Phase, to_status};
pub use crate::runtime::request::{TransferArgs, TransferStatus};
use crate::sync::model::lock;
use crate::types::TransferOp;

/// An async transfer in flight. It borrows its link (so the link cannot be disconnected while
/// the request is held), and owns the memory it touches.
#[must_use = "a request that is dropped before it starts is cancelled"]
pub struct TransferReq<'l> {
    h: ReqHandle,
    _link: PhantomData<&'l ()>,
}

impl fmt::Debug for TransferReq<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransferReq")
            .field("op", &self.h.st.op)
            .field("user_data", &self.h.st.user_data)
            .field("status", &self.h.st.status())
            .finish()
    }
}

impl TransferReq<'_> {
    pub(crate) fn new(h: ReqHandle) -> Self {
        Self {
            h,
            _link: PhantomData,
        }
    }

    /// The tag given in [`TransferArgs::user_data`].
    pub fn user_data(&self) -> u64 {
        self.h.st.user_data
    }
    /// The operation.
    pub fn op(&self) -> TransferOp {
        self.h.st.op
    }
    /// The deadline the engine enforces.
    pub fn deadline(&self) -> Instant {
        self.h.st.deadline
    }

    /// The request's status, without blocking (HIXL `GetTransferStatus`).
    pub fn status(&self) -> TransferStatus {
        self.h.status()
    }

    /// Waits up to `timeout` for the request to end; returns its status then (`Waiting` if it
    /// has not ended). The request's own deadline still applies.
    pub fn wait(&self, timeout: Duration) -> TransferStatus {
        self.h.wait(timeout)
    }

    /// Asks the engine to stop the request. One still queued ends `Cancelled` at once; one
    /// running has its lane shut down and ends as soon as the I/O returns (`Cancelled`, or
    /// `Completed` if the data had already moved). Returns the status after the request; wait
    /// for a terminal status before reusing the buffers.
    pub fn cancel(&self) -> TransferStatus {
        self.h.cancel()
    }

    /// The outcome as a `Result`, if the request has ended.
    pub fn result(&self) -> Option<Result<(), Error>> {
        let st = self.status();
        self.to_result(st)
    }

    fn to_result(&self, st: TransferStatus) -> Option<Result<(), Error>> {
        match st {
            TransferStatus::Waiting => None,
            TransferStatus::Completed => Some(Ok(())),
            TransferStatus::Failed(e) => Some(Err(Error::Shared(e))),
            TransferStatus::TimedOut => Some(Err(Error::Timeout {
                op: self.h.st.op.name(),
                peer: self.h.link.peer.clone(),
                elapsed: self.h.st.deadline - self.h.st.started,
            })),
            TransferStatus::Cancelled => Some(Err(Error::Cancelled {
                op: self.h.st.op.name(),
                peer: self.h.link.peer.clone(),
            })),
        }
    }

    /// Polls many requests at once (HIXL's batch `GetTransferStatus`): returns up to
    /// `max_query_count` entries `(index in reqs, user_data, status)`, in order, skipping those
    /// still waiting if `skip_waiting`.
    pub fn poll_many(
        reqs: &[TransferReq<'_>],
        max_query_count: usize,
        skip_waiting: bool,
    ) -> Vec<(usize, u64, TransferStatus)> {
        let mut out = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            if out.len() >= max_query_count {
                break;
            }
            let st = r.status();
            if skip_waiting && !st.is_terminal() {
                continue;
            }
            out.push((i, r.user_data(), st));
        }
        out
    }
}

impl Future for TransferReq<'_> {
    type Output = Result<(), Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let _ = self.h.status(); // a queued request past its deadline ends here
        let mut g = lock(&self.h.st.m);
        if let Phase::Done(o) = &g.phase {
            let st = to_status(o);
            drop(g);
            return Poll::Ready(self.to_result(st).expect("a terminal status"));
        }
        g.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}
