//! A small safe RAII layer over the UCP FFI: context, worker, endpoint, memory registration.
//!
//! # Ownership
//! [`Context`] (a UCP context) is shared with `Arc`; every [`Worker`] and [`MemHandle`] keeps it
//! alive. A [`Worker`] is shared with `Arc` too; every [`Endpoint`] and [`Waker`] keeps its
//! worker alive, so UCX objects are always destroyed child first (rkeys, then the endpoint, then
//! the worker, then the context).
//!
//! # Threads
//! All types are `Send`; `Context`, `Worker`, `Waker` and `MemHandle` are also `Sync`. No caller
//! needs a lock of its own:
//! - context-level calls (`ucp_mem_map`, `ucp_rkey_pack`, `ucp_mem_unmap`) are serialized by a
//!   mutex in the context (the context is also created with `mt_workers_shared`);
//! - worker-level calls (progress, arm, endpoint operations, rkey unpack/destroy, request
//!   checks) run under the worker's own mutex unless UCX reports that the worker really runs in
//!   `UCS_THREAD_MODE_MULTI` (then UCX locks internally and we add nothing);
//! - [`Waker::wake`] (`ucp_worker_signal`) is thread-safe in every mode (UCX documents it).
//!
//! The usual pattern: one thread progresses a server worker in a loop
//! (`progress` until 0, then [`Worker::wait_event`] with a timeout) and is stopped through a
//! [`Waker`]; endpoints on a client worker progress it themselves while they flush.
//! `ThreadMode::Multi` lets these overlap without our mutex; `ThreadMode::Serialized` gives the
//! same safety with our mutex (UCX's `SINGLE` mode, which ties a worker to one thread, is not
//! offered because these handles are `Send`).
//! hixl's own workers are `Serialized`; `Multi` is built for the unit tests only.
//!
//! # Trust
//! UCX parses worker addresses and packed rkeys without a length and trusts their content:
//! UCX 1.13 `abort()`s (assertions in `address.c`/`select.c`/`mm_posix.c`) or crashes on
//! corrupted ones, and a peer holding any rkey can write anywhere in the target process over
//! tcp or shared memory (UCX checks no bounds there). This layer checks what can be checked
//! without re-implementing UCX's parser (length bounds, the address version, the rkey's own
//! length fields, copies into a buffer UCX cannot read past) but addresses and rkeys must only
//! be accepted from authenticated peers.
//!
//! # Files
//! - `context`: the UCP context and memory registration ([`Context`], [`MemHandle`]);
//! - `worker`: the progress engine and its wake-up ([`Worker`], [`Waker`], [`ThreadMode`]);
//! - `endpoint`: connections to remote workers, PUT/GET and flush ([`Endpoint`]);
//! - `checks`: what is checked of untrusted worker addresses and rkeys before UCX parses them.

mod checks;
mod context;
mod endpoint;
mod worker;

use super::ffi::{self, Ucp, ucs_status_t};
use crate::error::Error;

pub(crate) use context::{Context, MemHandle};
pub(crate) use endpoint::{Endpoint, PendingFlush, SETTLE_BOUND};
pub(crate) use worker::{ThreadMode, Waker, Worker};

/// The error for a failed UCX call. Link failures become [`Error::NotConnected`] when a peer is
/// known.
pub(super) fn ucs_error(
    ucp: &Ucp,
    call: &'static str,
    status: ucs_status_t,
    peer: Option<&str>,
) -> Error {
    let detail = ucp.status_string(status);
    if let Some(peer) = peer
        && is_link_failure(status)
    {
        return Error::NotConnected {
            peer: peer.to_string(),
            why: format!("UCX {call}: {detail}"),
        };
    }
    Error::Native {
        library: "ucx",
        call,
        code: i64::from(status),
        detail,
    }
}

/// Statuses that mean the connection to the peer is gone.
pub(super) fn is_link_failure(s: ucs_status_t) -> bool {
    matches!(
        s,
        ffi::UCS_ERR_CONNECTION_RESET
            | ffi::UCS_ERR_ENDPOINT_TIMEOUT
            | ffi::UCS_ERR_UNREACHABLE
            | ffi::UCS_ERR_NOT_CONNECTED
    ) || (ffi::UCS_ERR_LAST_LINK_FAILURE..=ffi::UCS_ERR_FIRST_LINK_FAILURE).contains(&s)
        || (ffi::UCS_ERR_LAST_ENDPOINT_FAILURE..=ffi::UCS_ERR_FIRST_ENDPOINT_FAILURE).contains(&s)
}

/// Whether `e` is UCX's `UCS_ERR_NO_DEVICE`: a context's worker cannot be made because a
/// network device the context listed went away (it lists them once, when it is made).
pub(crate) fn is_no_device(e: &Error) -> bool {
    matches!(e, Error::Native { library: "ucx", code, .. } if *code == i64::from(ffi::UCS_ERR_NO_DEVICE))
}

/// `Ok` for `UCS_OK`, else the error for `call`.
pub(super) fn check(ucp: &Ucp, call: &'static str, status: ucs_status_t) -> Result<(), Error> {
    if status == ffi::UCS_OK {
        Ok(())
    } else {
        Err(ucs_error(ucp, call, status, None))
    }
}

#[cfg(test)]
mod tests;
