//! The UCP worker (progress engine, [`Worker`]), the thread mode it runs in, and the [`Waker`]
//! that interrupts a thread waiting on it.

use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::Context;
use super::check;
use crate::error::Error;
use crate::sync::lock;
use crate::transport::ucx::ffi::{self, Ucp};

/// The thread mode asked of UCX for a worker. Either way the [`Worker`] is safe to share; see
/// the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ThreadMode {
    /// `UCS_THREAD_MODE_SERIALIZED`: UCX does not lock; this layer serializes with a mutex.
    Serialized,
    /// `UCS_THREAD_MODE_MULTI`: UCX locks internally (falls back to our mutex if the UCX build
    /// reports a lesser mode).
    #[cfg(test)]
    Multi,
}

/// The shared state of a [`Worker`].
pub(super) struct WorkerInner {
    /// Keeps the context alive.
    ctx: Context,
    /// The UCP worker.
    pub(super) h: ffi::ucp_worker_h,
    /// Its event fd (owned by UCX).
    efd: c_int,
    /// Its packed address.
    address: Vec<u8>,
    /// The mode it really runs in.
    mode: ThreadMode,
    /// `None` when the worker really is `UCS_THREAD_MODE_MULTI`.
    lock: Option<Mutex<()>>,
}

// SAFETY: every call on the worker handle (and on endpoints, rkeys and requests of this worker)
// is made under `enter()`, which locks unless UCX runs the worker in MULTI mode (then UCX locks
// internally); ucp_worker_signal is documented thread-safe in all modes; destroy runs in Drop.
unsafe impl Send for WorkerInner {}
// SAFETY: as above.
unsafe impl Sync for WorkerInner {}

impl WorkerInner {
    /// The function table.
    pub(super) fn ucp(&self) -> &'static Ucp {
        self.ctx.inner.ucp
    }

    /// Enters the worker's critical section (a no-op in MULTI mode).
    pub(super) fn enter(&self) -> Option<MutexGuard<'_, ()>> {
        self.lock.as_ref().map(lock)
    }

    /// Progresses the worker once (in its critical section); the number of events processed.
    pub(super) fn progress(&self) -> u32 {
        let _g = self.enter();
        // SAFETY: valid worker, inside its critical section.
        unsafe { (self.ucp().ucp_worker_progress)(self.h) }
    }
}

impl Drop for WorkerInner {
    fn drop(&mut self) {
        // SAFETY: the worker came from ucp_worker_create; every endpoint and waker of it is gone
        // (they hold the Arc this lives in); destroyed once.
        unsafe { (self.ucp().ucp_worker_destroy)(self.h) };
    }
}

/// A UCP worker (progress engine); cheap to clone (`Arc`), `Send + Sync`.
#[derive(Clone)]
pub(crate) struct Worker {
    /// The shared state (endpoints keep it alive).
    pub(super) inner: Arc<WorkerInner>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("mode", &self.inner.mode)
            .field("address_len", &self.inner.address.len())
            .finish()
    }
}

impl Worker {
    /// The context it was made in (memory it moves zero-copy is mapped there).
    pub(crate) fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Creates a worker on `ctx`.
    ///
    /// # Errors
    /// [`Error::Native`] if UCX fails (e.g. no transport supports the wakeup feature).
    pub(crate) fn new(ctx: &Context, mode: ThreadMode) -> Result<Self, Error> {
        let ucp = ctx.inner.ucp;
        let mut params = ffi::ucp_worker_params_t::zeroed();
        params.field_mask = ffi::UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        params.thread_mode = match mode {
            ThreadMode::Serialized => ffi::UCS_THREAD_MODE_SERIALIZED,
            #[cfg(test)]
            ThreadMode::Multi => ffi::UCS_THREAD_MODE_MULTI,
        };
        let mut h: ffi::ucp_worker_h = std::ptr::null_mut();
        // SAFETY: valid context (kept alive by `ctx`), params and out-pointer.
        let status = unsafe { (ucp.ucp_worker_create)(ctx.inner.h, &params, &mut h) };
        check(ucp, "ucp_worker_create", status)?;
        // From here on, dropping `inner` destroys the worker.
        let mut inner = WorkerInner {
            ctx: ctx.clone(),
            h,
            efd: -1,
            address: Vec::new(),
            mode,
            lock: Some(Mutex::new(())),
        };
        let mut attr = ffi::ucp_worker_attr_t::zeroed();
        attr.field_mask = ffi::UCP_WORKER_ATTR_FIELD_THREAD_MODE;
        // SAFETY: valid worker and out-struct (only the thread mode is asked for).
        let status = unsafe { (ucp.ucp_worker_query)(h, &mut attr) };
        check(ucp, "ucp_worker_query", status)?;
        if attr.thread_mode == ffi::UCS_THREAD_MODE_MULTI {
            inner.lock = None;
        } else {
            inner.mode = ThreadMode::Serialized;
        }
        // SAFETY: valid worker and out-pointer; the fd is owned by the worker.
        let status = unsafe { (ucp.ucp_worker_get_efd)(h, &mut inner.efd) };
        check(ucp, "ucp_worker_get_efd", status)?;
        let mut addr: *mut ffi::ucp_address_t = std::ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: valid worker and out-pointers.
        let status = unsafe { (ucp.ucp_worker_get_address)(h, &mut addr, &mut len) };
        check(ucp, "ucp_worker_get_address", status)?;
        // SAFETY: UCX returned `len` readable bytes at `addr`.
        inner.address = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) }.to_vec();
        // SAFETY: addr came from ucp_worker_get_address of this worker; released once.
        unsafe { (ucp.ucp_worker_release_address)(h, addr) };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The worker's packed address, for peers to connect to.
    pub(crate) fn address(&self) -> &[u8] {
        &self.inner.address
    }

    /// The thread mode the worker really runs in (`Serialized` if MULTI was asked but the UCX
    /// build does not provide it).
    #[cfg(test)]
    pub(crate) fn thread_mode(&self) -> ThreadMode {
        self.inner.mode
    }

    /// Progresses communication once; returns the number of events processed.
    pub(crate) fn progress(&self) -> u32 {
        self.inner.progress()
    }

    /// Waits until the worker has events, [`Waker::wake`] is called, or `timeout` passes
    /// (`None`: no timeout). Returns early, without sleeping, if progress is pending; call
    /// [`progress`](Self::progress) until it returns 0 before waiting again.
    ///
    /// # Errors
    /// [`Error::Native`] if arming the worker or `poll` fails.
    pub(crate) fn wait_event(&self, timeout: Option<Duration>) -> Result<(), Error> {
        let w = &*self.inner;
        let ucp = w.ucp();
        {
            let _g = w.enter();
            // SAFETY: valid worker, inside its critical section.
            if unsafe { (ucp.ucp_worker_progress)(w.h) } != 0 {
                return Ok(());
            }
            // SAFETY: as above; the worker was created with the WAKEUP feature.
            let status = unsafe { (ucp.ucp_worker_arm)(w.h) };
            if status == ffi::UCS_ERR_BUSY {
                return Ok(());
            }
            check(ucp, "ucp_worker_arm", status)?;
        }
        let ms: c_int = match timeout {
            None => -1,
            Some(t) => {
                // round up so that a sub-millisecond timeout still sleeps
                let ms = t.as_nanos().div_ceil(1_000_000);
                c_int::try_from(ms).unwrap_or(c_int::MAX)
            }
        };
        let mut pfd = libc::pollfd {
            fd: w.efd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the efd stays open while the worker exists (we hold it).
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::Native {
                    library: "ucx",
                    call: "poll(ucp_worker_get_efd)",
                    code: i64::from(e.raw_os_error().unwrap_or(0)),
                    detail: e.to_string(),
                });
            }
        }
        Ok(())
    }

    /// A handle that wakes a thread blocked in [`wait_event`](Self::wait_event).
    pub(crate) fn waker(&self) -> Waker {
        Waker {
            inner: self.inner.clone(),
        }
    }
}

/// Wakes a thread blocked in [`Worker::wait_event`] (`ucp_worker_signal`); `Send + Sync`. Keeps
/// the worker alive.
#[derive(Clone)]
pub(crate) struct Waker {
    inner: Arc<WorkerInner>,
}

impl std::fmt::Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waker").finish_non_exhaustive()
    }
}

impl Waker {
    /// Signals the worker's event fd.
    ///
    /// # Errors
    /// [`Error::Native`] if `ucp_worker_signal` fails.
    pub(crate) fn wake(&self) -> Result<(), Error> {
        let ucp = self.inner.ucp();
        // SAFETY: valid worker (kept alive by the Arc); ucp_worker_signal may be called from any
        // thread without the worker lock (documented in ucp.h).
        let status = unsafe { (ucp.ucp_worker_signal)(self.inner.h) };
        check(ucp, "ucp_worker_signal", status)
    }
}
