//! A connection to a remote worker ([`Endpoint`]): rkeys, PUT and GET, flush, and the bounded
//! close.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use super::checks::{ADDRESS_PADDING, check_address, check_rkey, padded_rkey};
use super::worker::WorkerInner;
use super::{MemHandle, Worker, is_link_failure, ucs_error};
use crate::error::Error;
use crate::transport::ucx::ffi::{self, Ucp, ucs_status_t};

/// How long `Drop` of an [`Endpoint`] waits for its flush and for its close, each.
const DROP_BOUND: Duration = Duration::from_secs(1);
/// How long a forced close (after a timeout or a failure) may take before we give up on it.
const FORCE_CLOSE_BOUND: Duration = Duration::from_secs(1);
/// How long after a flush was posted a transfer that missed its deadline waits for the
/// operations in flight before it closes the endpoint (gently if they ended, forced if not):
/// tearing an endpoint down with the peer's replies pending lets UCX 1.13's tcp transport abort
/// the peer's process (`ucp_request.c:684` in wire-up, `uct_tcp_ep_pending_purge`).
pub(crate) const SETTLE_BOUND: Duration = Duration::from_millis(500);

/// The endpoint error handler: records the first failure status. Runs inside
/// `ucp_worker_progress` on whatever thread progresses the worker; it cannot unwind (atomic
/// stores only).
///
/// # Safety
/// Called by UCX only, with `arg` the endpoint's error-handler argument this module set: null,
/// or a pointer to the endpoint's live status word.
unsafe extern "C" fn on_endpoint_error(arg: *mut c_void, _ep: ffi::ucp_ep_h, status: ucs_status_t) {
    if arg.is_null() {
        return;
    }
    // SAFETY: `arg` is the `Arc<AtomicI32>` pointer handed to ucp_ep_create; its strong count
    // is only released after the endpoint's close completed (after which UCX calls no handler),
    // or never.
    let failure = unsafe { &*arg.cast::<AtomicI32>() };
    let code = if status == ffi::UCS_OK {
        ffi::UCS_ERR_IO_ERROR
    } else {
        status
    };
    let _ = failure.compare_exchange(0, i32::from(code), Ordering::AcqRel, Ordering::Acquire);
}

/// A connection to a remote worker with error mode PEER, for PUT and GET.
///
/// Operations are posted without per-operation requests; [`flush`](Self::flush) establishes
/// their completion. Once the endpoint has failed (its error handler fired, a flush failed or
/// timed out) it is closed at once and every call returns [`Error::NotConnected`].
pub(crate) struct Endpoint {
    /// Keeps the worker alive.
    worker: Arc<WorkerInner>,
    /// NULL once closed.
    ep: ffi::ucp_ep_h,
    /// Unpacked rkeys, by index.
    rkeys: Vec<ffi::ucp_rkey_h>,
    /// 0, or the `ucs_status_t` the error handler (or a failed flush) recorded.
    failure: Arc<AtomicI32>,
    /// The reference handed to UCX as the error handler's argument (reclaimed after close).
    handler_arg: *const AtomicI32,
    /// The peer's name, for errors.
    peer: String,
    /// Whether UCX detects a dead peer (error mode PEER); `false` with shared-memory-only
    /// transports, which lack it in UCX 1.13.
    detects_failure: bool,
}

// SAFETY: the raw handles are used only through `&mut self` (or Drop), inside the worker's
// critical section; the handler argument is an `Arc` pointer.
unsafe impl Send for Endpoint {}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("peer", &self.peer)
            .field("closed", &self.ep.is_null())
            .field("failure", &self.failure.load(Ordering::Acquire))
            .field("rkeys", &self.rkeys.len())
            .field("detects_failure", &self.detects_failure)
            .finish()
    }
}

/// Whether `UCX_TLS` names only shared-memory transports (UCX 1.13 has no peer-failure
/// detection for those, so error mode PEER cannot be used with them).
fn shared_memory_only() -> bool {
    shared_memory_only_in(std::env::var("UCX_TLS").ok().as_deref())
}

/// [`shared_memory_only`] for a given `UCX_TLS` value (an exclusion list, `^...`, says nothing).
fn shared_memory_only_in(tls: Option<&str>) -> bool {
    const SHM: [&str; 9] = [
        "sm", "shm", "posix", "sysv", "cma", "knem", "xpmem", "self", "mm",
    ];
    match tls.map(str::trim) {
        Some(v) if !v.is_empty() && !v.starts_with('^') => {
            v.split(',').map(str::trim).all(|t| SHM.contains(&t))
        }
        _ => false,
    }
}

impl Endpoint {
    /// Connects to the remote worker whose packed address is `address` (as received from the
    /// peer named `peer`, which names the peer in errors).
    ///
    /// The address is checked for a plausible length and a known header version and copied
    /// into a zero-padded buffer before UCX parses it; see the module documentation on trust.
    ///
    /// # Errors
    /// [`Error::Protocol`] for an address that fails these checks, [`Error::NotConnected`] if
    /// UCX finds the peer unreachable, [`Error::Native`] for other UCX failures.
    pub(crate) fn connect(worker: &Worker, address: &[u8], peer: &str) -> Result<Self, Error> {
        let w = &worker.inner;
        let ucp = w.ucp();
        check_address(address).map_err(|problem| Error::Protocol {
            peer: peer.to_string(),
            problem: format!("UCX worker address of {} bytes: {problem}", address.len()),
        })?;
        let mut padded = vec![0u8; address.len() + ADDRESS_PADDING];
        padded[..address.len()].copy_from_slice(address);

        let failure = Arc::new(AtomicI32::new(0));
        let handler_arg = Arc::into_raw(failure.clone());
        let create = |mode: ffi::ucp_err_handling_mode_t| {
            let mut params = ffi::ucp_ep_params_t::zeroed();
            params.field_mask = ffi::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                | ffi::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | ffi::UCP_EP_PARAM_FIELD_ERR_HANDLER;
            params.address = padded.as_ptr().cast();
            params.err_mode = mode;
            params.err_handler = ffi::ucp_err_handler_t {
                cb: Some(on_endpoint_error),
                arg: handler_arg.cast_mut().cast(),
            };
            let mut ep: ffi::ucp_ep_h = std::ptr::null_mut();
            let _g = w.enter();
            // SAFETY: valid worker (inside its critical section), params and out-pointer; the
            // address buffer outlives the call (UCX copies what it keeps); the handler argument
            // stays valid while the endpoint exists (see `close`).
            let status = unsafe { (ucp.ucp_ep_create)(w.h, &params, &mut ep) };
            (status, ep)
        };
        // with shared-memory transports only, PEER is known to fail (and UCX logs an error
        // when it does): go straight to NONE
        let (mut status, mut ep) = if shared_memory_only() {
            (ffi::UCS_ERR_UNREACHABLE, std::ptr::null_mut())
        } else {
            create(ffi::UCP_ERR_HANDLING_MODE_PEER)
        };
        let mut detects_failure = true;
        if status == ffi::UCS_ERR_UNREACHABLE {
            // UCX 1.13's shared-memory transports cannot detect a dead peer (error mode PEER);
            // with only those (UCX_TLS=sm) the link runs without it and hixl's own control
            // plane (heartbeats over the TCP control connection) notices a dead peer
            let (s2, e2) = create(ffi::UCP_ERR_HANDLING_MODE_NONE);
            if s2 == ffi::UCS_OK {
                tracing::debug!(
                    peer,
                    "UCX endpoint without peer-failure detection (these transports lack it)"
                );
                detects_failure = false;
            }
            (status, ep) = (s2, e2);
        }
        if status != ffi::UCS_OK {
            // SAFETY: no endpoint was created, so UCX holds no copy of the pointer; this
            // releases the reference made by into_raw above.
            drop(unsafe { Arc::from_raw(handler_arg) });
            return Err(ucs_error(ucp, "ucp_ep_create", status, Some(peer)));
        }
        Ok(Self {
            worker: w.clone(),
            ep,
            rkeys: Vec::new(),
            failure,
            handler_arg,
            peer: peer.to_string(),
            detects_failure,
        })
    }

    /// Whether UCX itself detects a dead peer on this endpoint (error mode PEER).
    #[cfg(test)]
    pub(crate) fn detects_failure(&self) -> bool {
        self.detects_failure
    }

    /// The peer's name, as given to [`connect`](Self::connect).
    pub(crate) fn peer(&self) -> &str {
        &self.peer
    }

    /// Whether the endpoint failed or was closed (every further call fails).
    pub(crate) fn is_failed(&self) -> bool {
        self.ep.is_null() || self.failure.load(Ordering::Acquire) != 0
    }

    fn failure_status(&self) -> ucs_status_t {
        // only ever set from a ucs_status_t
        ucs_status_t::try_from(self.failure.load(Ordering::Acquire))
            .unwrap_or(ffi::UCS_ERR_IO_ERROR)
    }

    fn not_connected(&self, why: String) -> Error {
        Error::NotConnected {
            peer: self.peer.clone(),
            why,
        }
    }

    /// Records `status` as the endpoint's failure, unless one is recorded already.
    fn record_failure(&self, status: ucs_status_t) {
        let _ = self.failure.compare_exchange(
            0,
            i32::from(status),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// The error for an endpoint that failed with status `f`.
    fn failed(&self, f: ucs_status_t) -> Error {
        let ucp = self.worker.ucp();
        self.not_connected(format!(
            "UCX endpoint failed: {} ({f})",
            ucp.status_string(f)
        ))
    }

    /// The live endpoint handle, or the error to return (closing a failed endpoint first).
    fn usable(&mut self) -> Result<ffi::ucp_ep_h, Error> {
        if self.ep.is_null() {
            return Err(self.not_connected("the UCX endpoint was closed after a failure".into()));
        }
        let f = self.failure_status();
        if f != 0 {
            self.close(true, FORCE_CLOSE_BOUND);
            return Err(self.failed(f));
        }
        Ok(self.ep)
    }

    /// Unpacks a packed rkey received from the peer and keeps it; returns its index for
    /// [`put_in`](Self::put_in) and [`get_in`](Self::get_in).
    ///
    /// # Errors
    /// [`Error::Protocol`] if the bytes are not a well-formed packed rkey (length fields that
    /// do not match the length), [`Error::NotConnected`] on a failed endpoint,
    /// [`Error::Native`] if UCX rejects it.
    pub(crate) fn add_rkey(&mut self, packed: &[u8]) -> Result<usize, Error> {
        let ep = self.usable()?;
        check_rkey(packed).map_err(|problem| Error::Protocol {
            peer: self.peer.clone(),
            problem: format!("UCX rkey of {} bytes: {problem}", packed.len()),
        })?;
        let w = &*self.worker;
        let ucp = w.ucp();
        let mut rkey: ffi::ucp_rkey_h = std::ptr::null_mut();
        // each transport reads its own key struct, whatever size the peer gave it: from a copy
        // with a transport's largest key of zeros after it (UCX copies what it keeps)
        let padded = padded_rkey(packed);
        let status = {
            let _g = w.enter();
            // SAFETY: live endpoint inside the worker's critical section. UCX reads the header
            // and each domain's size byte as `check_rkey` checked them, and each transport's key
            // (at most 255 bytes) from where its size byte says: within `padded`, which is this
            // thread's own copy (no peer writes it) and outlives the call. Valid out-pointer.
            unsafe { (ucp.ucp_ep_rkey_unpack)(ep, padded.as_ptr().cast(), &mut rkey) }
        };
        if status != ffi::UCS_OK {
            return Err(ucs_error(
                ucp,
                "ucp_ep_rkey_unpack",
                status,
                Some(&self.peer),
            ));
        }
        self.rkeys.push(rkey);
        Ok(self.rkeys.len() - 1)
    }

    fn rkey(&self, index: usize, call: &'static str) -> Result<ffi::ucp_rkey_h, Error> {
        self.rkeys.get(index).copied().ok_or_else(|| Error::Native {
            library: "ucx",
            call,
            code: i64::from(ffi::UCS_ERR_INVALID_PARAM),
            detail: format!(
                "no rkey #{index} on this endpoint ({} added)",
                self.rkeys.len()
            ),
        })
    }

    /// Handles the status pointer of a posted operation: frees a request at once (completion
    /// is established by the flush), turns an error into an `Error`.
    fn posted(&mut self, call: &'static str, r: ffi::ucs_status_ptr_t) -> Result<(), Error> {
        let ucp = self.worker.ucp();
        if ffi::ptr_is_ptr(r) {
            let _g = self.worker.enter();
            // SAFETY: a request returned by UCX for this worker, freed once; UCX completes it
            // in the background.
            unsafe { (ucp.ucp_request_free)(r) };
            return Ok(());
        }
        let status = ffi::ptr_status(r);
        if status == ffi::UCS_OK {
            return Ok(());
        }
        if is_link_failure(status) {
            self.record_failure(status);
            self.close(true, FORCE_CLOSE_BOUND);
        }
        Err(ucs_error(ucp, call, status, Some(&self.peer)))
    }

    /// Posts a PUT of `len` bytes from `local` to `remote_addr` in the peer memory of rkey
    /// `rkey` (an index from [`add_rkey`](Self::add_rkey)). With `memh` (a mapping of this
    /// endpoint's context covering the source) UCX can use zero-copy protocols.
    ///
    /// # Safety
    /// `local..local+len` must be readable and stay valid and unmodified until a
    /// [`flush`](Self::flush) returns (with any result) or the endpoint is dropped; `memh`, if
    /// given, must cover `local..local+len`.
    ///
    /// # Errors
    /// [`Error::NotConnected`] on a failed endpoint or link failure, [`Error::Native`]
    /// otherwise (an unknown rkey index is `UCS_ERR_INVALID_PARAM`).
    pub(crate) unsafe fn put_in(
        &mut self,
        local: *const u8,
        len: usize,
        remote_addr: u64,
        rkey: usize,
        memh: Option<&MemHandle>,
    ) -> Result<(), Error> {
        self.post("ucp_put_nbx", len, rkey, memh, |ucp, ep, rk, param| {
            // SAFETY: live endpoint and rkey of it, inside the worker's critical section; the
            // caller keeps the buffer valid until the flush (and `memh` covering it).
            unsafe { (ucp.ucp_put_nbx)(ep, local.cast(), len, remote_addr, rk, param) }
        })
    }

    /// Posts a GET of `len` bytes from `remote_addr` (rkey index `rkey`) into `local`, inside
    /// `memh` if given (as in [`put_in`](Self::put_in)).
    ///
    /// # Safety
    /// `local..local+len` must be writable and stay valid, and not be accessed by anything
    /// else, until a [`flush`](Self::flush) returns (with any result) or the endpoint is
    /// dropped; `memh`, if given, must cover `local..local+len`.
    ///
    /// # Errors
    /// As [`put_in`](Self::put_in).
    pub(crate) unsafe fn get_in(
        &mut self,
        local: *mut u8,
        len: usize,
        remote_addr: u64,
        rkey: usize,
        memh: Option<&MemHandle>,
    ) -> Result<(), Error> {
        self.post("ucp_get_nbx", len, rkey, memh, |ucp, ep, rk, param| {
            // SAFETY: as in `put_in`; the caller keeps the buffer valid and unaliased.
            unsafe { (ucp.ucp_get_nbx)(ep, local.cast(), len, remote_addr, rk, param) }
        })
    }

    /// Checks the endpoint and the rkey index, then runs `call` (a PUT or GET) inside the
    /// worker's critical section and handles what it returned.
    fn post(
        &mut self,
        name: &'static str,
        len: usize,
        rkey: usize,
        memh: Option<&MemHandle>,
        call: impl FnOnce(
            &Ucp,
            ffi::ucp_ep_h,
            ffi::ucp_rkey_h,
            &ffi::ucp_request_param_t,
        ) -> ffi::ucs_status_ptr_t,
    ) -> Result<(), Error> {
        let ep = self.usable()?;
        let rkey = self.rkey(rkey, name)?;
        if len == 0 {
            return Ok(());
        }
        let mut param = ffi::ucp_request_param_t::zeroed();
        if let Some(m) = memh {
            param.op_attr_mask |= ffi::UCP_OP_ATTR_FIELD_MEMH;
            param.memh = m.memh;
        }
        let r = {
            let _g = self.worker.enter();
            call(self.worker.ucp(), ep, rkey, &param)
        };
        self.posted(name, r)
    }

    /// Waits until every operation posted so far completed at the peer, progressing the
    /// worker: [`flush_post`](Self::flush_post), [`PendingFlush::wait`] and
    /// [`flush_end`](Self::flush_end) in one.
    ///
    /// When this returns, UCX no longer touches the buffers of the operations posted before:
    /// on success they are done; on a timeout the endpoint is closed first, gently once they
    /// ended (within [`SETTLE_BOUND`] of the flush), else forced (outstanding operations are
    /// cancelled); on a failure it is force-closed; either way it is unusable afterwards.
    ///
    /// A `deadline` that has already passed when `flush` is called is a timeout, whether or
    /// not operations are outstanding.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the deadline passes, [`Error::NotConnected`] when the
    /// endpoint failed (error handler, link failure), [`Error::Native`] for other UCX errors.
    pub(crate) fn flush(&mut self, deadline: Option<Instant>) -> Result<(), Error> {
        let pending = self.flush_post(deadline)?;
        let outcome = pending.wait(deadline);
        self.flush_end(outcome)
    }

    /// Posts a flush of every operation posted so far and returns without waiting for it.
    /// The flush completes when those operations completed at the peer; it is waited for with
    /// [`PendingFlush::wait`], which needs no access to the endpoint (so a caller that keeps
    /// the endpoint behind a lock can release it meanwhile, and another batch can post), and
    /// its outcome handed to [`flush_end`](Self::flush_end) on the same endpoint.
    ///
    /// # Errors
    /// As [`flush`](Self::flush), for a failed endpoint or a deadline already passed.
    pub(crate) fn flush_post(&mut self, deadline: Option<Instant>) -> Result<PendingFlush, Error> {
        let start = Instant::now();
        let ep = self.usable()?;
        if deadline.is_some_and(|d| start >= d) {
            return Err(self.timed_out(start));
        }
        Ok(self.post_flush(ep, start))
    }

    /// Posts a flush of every operation posted on `ep` (this endpoint's, live), begun at
    /// `start`.
    fn post_flush(&self, ep: ffi::ucp_ep_h, start: Instant) -> PendingFlush {
        let ucp = self.worker.ucp();
        let param = ffi::ucp_request_param_t::zeroed();
        let req = {
            let _g = self.worker.enter();
            // SAFETY: live endpoint inside the worker's critical section; no callback is set.
            unsafe { (ucp.ucp_ep_flush_nbx)(ep, &param) }
        };
        PendingFlush {
            worker: self.worker.clone(),
            req,
            start,
        }
    }

    /// Ends a flush of this endpoint: a timeout force-closes the endpoint (and is
    /// [`Error::Timeout`]); a failure recorded by the flush or by the error handler closes it
    /// (and is [`Error::NotConnected`] or [`Error::Native`]).
    ///
    /// # Errors
    /// As [`flush`](Self::flush).
    pub(crate) fn flush_end(&mut self, outcome: FlushOutcome) -> Result<(), Error> {
        let status = match outcome {
            FlushOutcome::Done(s) => s,
            FlushOutcome::TimedOut { start } => return Err(self.timed_out(start)),
        };
        if status != ffi::UCS_OK {
            self.record_failure(status);
        }
        let f = self.failure_status();
        if f != 0 {
            self.close(true, FORCE_CLOSE_BOUND);
            if status != ffi::UCS_OK && !is_link_failure(status) {
                let ucp = self.worker.ucp();
                return Err(ucs_error(ucp, "ucp_ep_flush_nbx", status, Some(&self.peer)));
            }
            return Err(self.failed(f));
        }
        Ok(())
    }

    /// Closes the endpoint after a flush begun at `start` ran out of time: the operations in
    /// flight get until [`SETTLE_BOUND`] after `start` to end (the caller's buffers are still
    /// borrowed meanwhile), then the close is gentle if they did, forced if not. A forced close
    /// with the peer's replies pending lets UCX 1.13's tcp transport abort the peer's process:
    /// a client whose deadlines were a few milliseconds killed the serving process on its
    /// first READ (`many_timeouts_never_kill_the_peer`).
    fn timed_out(&mut self, start: Instant) -> Error {
        let settled = self.flushed_within(SETTLE_BOUND.saturating_sub(start.elapsed()));
        self.close(!settled, FORCE_CLOSE_BOUND);
        Error::Timeout {
            op: "UCX flush",
            peer: self.peer.clone(),
            elapsed: start.elapsed(),
        }
    }

    /// Whether a flush of every operation posted on the endpoint completed within `bound`
    /// (`false` at once for a failed or closed endpoint). Nothing is closed here.
    fn flushed_within(&mut self, bound: Duration) -> bool {
        if self.ep.is_null() || self.failure_status() != 0 || bound.is_zero() {
            return false;
        }
        let now = Instant::now();
        let pending = self.post_flush(self.ep, now);
        pending.wait(Some(now + bound)) == FlushOutcome::Done(ffi::UCS_OK)
    }

    /// Closes the endpoint (`force`: without flushing, cancelling outstanding operations) and
    /// progresses until the close completes or `bound` passes. Idempotent.
    ///
    /// The rkeys: UCX requires each to be destroyed after the operations using it were flushed
    /// and before its endpoint is destroyed (`ucp_rkey_destroy`, ucp.h). A gentle close comes
    /// after a completed flush (`Drop`, [`timed_out`](Self::timed_out)) with nothing posted
    /// since (`&mut self`: no other batch can post), so they are destroyed first, in the same
    /// critical section as the close. Before a forced close operations may be outstanding (a
    /// failed peer, a flush that did not end), and no moment is right: they are leaked (a few
    /// hundred bytes each) rather than destroyed under operations that still use them.
    fn close(&mut self, force: bool, bound: Duration) {
        if self.ep.is_null() {
            return;
        }
        let ucp = self.worker.ucp();
        let mut param = ffi::ucp_request_param_t::zeroed();
        param.op_attr_mask = ffi::UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = if force {
            ffi::UCP_EP_CLOSE_FLAG_FORCE
        } else {
            0
        };
        let ep = std::mem::replace(&mut self.ep, std::ptr::null_mut());
        let rkeys = std::mem::take(&mut self.rkeys);
        let req = {
            let _g = self.worker.enter();
            if !force {
                for rkey in rkeys {
                    // SAFETY: unpacked on this endpoint, which is still open; every operation
                    // was flushed and none posted since (see above); destroyed once.
                    unsafe { (ucp.ucp_rkey_destroy)(rkey) };
                }
            }
            // SAFETY: live endpoint, closed once (self.ep is cleared above).
            unsafe { (ucp.ucp_ep_close_nbx)(ep, &param) }
        };
        let mut completed = true;
        if ffi::ptr_is_ptr(req) {
            let until = Instant::now() + bound;
            let mut idle = 0u32;
            loop {
                let s = {
                    let _g = self.worker.enter();
                    // SAFETY: an incomplete request of this worker, not yet freed.
                    unsafe { (ucp.ucp_request_check_status)(req) }
                };
                let done = s != ffi::UCS_INPROGRESS;
                if done || Instant::now() >= until {
                    let _g = self.worker.enter();
                    // SAFETY: freed once; if not complete, UCX finishes the close in the
                    // background (on later progress or worker destruction).
                    unsafe { (ucp.ucp_request_free)(req) };
                    completed = done;
                    break;
                }
                if self.worker.progress() == 0 {
                    idle += 1;
                    if idle.is_multiple_of(64) {
                        std::thread::yield_now();
                    }
                }
            }
        }
        if completed {
            if !self.handler_arg.is_null() {
                // SAFETY: the endpoint is closed, so UCX calls its error handler no more; this
                // releases the reference made by Arc::into_raw in `connect`, once.
                drop(unsafe { Arc::from_raw(self.handler_arg) });
                self.handler_arg = std::ptr::null();
            }
        } else {
            // UCX may still call the handler: leak its reference (one AtomicI32) on purpose.
            tracing::warn!(peer = %self.peer, "UCX endpoint close did not complete in {bound:?}");
            self.handler_arg = std::ptr::null();
        }
    }
}

impl Drop for Endpoint {
    /// Flushes (bounded, unless failed), destroys the rkeys, then closes the endpoint (forced if
    /// it failed), never waiting more than about two seconds.
    fn drop(&mut self) {
        if self.ep.is_null() {
            return;
        }
        if !self.is_failed() {
            // a failed or timed-out flush force-closes the endpoint itself
            let _ = self.flush(Some(Instant::now() + DROP_BOUND));
        }
        let force = self.is_failed();
        self.close(force, DROP_BOUND);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_only_reads_ucx_tls() {
        for v in ["sm", "sm,self", " posix , cma ", "shm"] {
            assert!(shared_memory_only_in(Some(v)), "{v}");
        }
        for v in ["tcp", "sm,tcp", "rc,sm", "^tcp", "", "all"] {
            assert!(!shared_memory_only_in(Some(v)), "{v}");
        }
        assert!(!shared_memory_only_in(None));
    }
}

/// What [`PendingFlush::wait`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlushOutcome {
    /// The flush completed with this status.
    Done(ucs_status_t),
    /// The deadline passed first (the request was released; the endpoint must be closed,
    /// which [`Endpoint::flush_end`] does, before the buffers are the caller's again).
    TimedOut {
        /// When the flush was posted.
        start: Instant,
    },
}

/// A flush posted by [`Endpoint::flush_post`] and not yet waited for. Dropped unwaited, it
/// releases its request (UCX completes it in the background); the buffers of the operations it
/// covers are not the caller's until a flush of the endpoint completed or the endpoint closed.
pub(crate) struct PendingFlush {
    /// Keeps the worker (whose request this is) alive.
    worker: Arc<WorkerInner>,
    /// The status pointer `ucp_ep_flush_nbx` returned: a request not yet freed, or a status.
    req: ffi::ucs_status_ptr_t,
    /// When it was posted.
    start: Instant,
}

impl std::fmt::Debug for PendingFlush {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingFlush")
            .field("request", &ffi::ptr_is_ptr(self.req))
            .finish_non_exhaustive()
    }
}

impl PendingFlush {
    /// Waits, progressing the worker (in its critical section, so any thread may do it while
    /// another posts on the same endpoint), until the flush completes or `deadline` passes.
    pub(crate) fn wait(mut self, deadline: Option<Instant>) -> FlushOutcome {
        let req = std::mem::replace(&mut self.req, std::ptr::null_mut());
        if !ffi::ptr_is_ptr(req) {
            return FlushOutcome::Done(ffi::ptr_status(req));
        }
        let ucp = self.worker.ucp();
        let mut idle = 0u32;
        loop {
            let s = {
                let _g = self.worker.enter();
                // SAFETY: an incomplete request of this worker, not yet freed.
                unsafe { (ucp.ucp_request_check_status)(req) }
            };
            if s != ffi::UCS_INPROGRESS {
                let _g = self.worker.enter();
                // SAFETY: the completed request is freed once (`self.req` was cleared).
                unsafe { (ucp.ucp_request_free)(req) };
                return FlushOutcome::Done(s);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let _g = self.worker.enter();
                // SAFETY: freed once; UCX completes it (cancelled) when the endpoint is
                // force-closed, which the caller's `flush_end` does.
                unsafe { (ucp.ucp_request_free)(req) };
                return FlushOutcome::TimedOut { start: self.start };
            }
            if self.worker.progress() == 0 {
                idle += 1;
                if idle.is_multiple_of(64) {
                    std::thread::yield_now();
                }
            } else {
                idle = 0;
            }
        }
    }
}

impl Drop for PendingFlush {
    fn drop(&mut self) {
        if ffi::ptr_is_ptr(self.req) {
            let _g = self.worker.enter();
            // SAFETY: a request of this worker not yet freed (`wait` clears `req`); UCX
            // releases it when it completes.
            unsafe { (self.worker.ucp().ucp_request_free)(self.req) };
        }
    }
}
