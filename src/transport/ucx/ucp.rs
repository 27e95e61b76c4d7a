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
//!
//! # Trust
//! UCX parses worker addresses and packed rkeys without a length and trusts their content:
//! UCX 1.13 `abort()`s (assertions in `address.c`/`select.c`/`mm_posix.c`) or crashes on
//! corrupted ones, and a peer holding any rkey can write anywhere in the target process over
//! tcp or shared memory (UCX checks no bounds there). This layer checks what can be checked
//! without re-implementing UCX's parser (length bounds, the address version, the rkey's own
//! length fields, copies into a buffer UCX cannot read past) but addresses and rkeys must only
//! be accepted from authenticated peers.

// Used only by the unit tests yet, each marked `cfg_attr(not(test), allow(dead_code))`: the
// multi-threaded worker mode, `thread_mode`, `detects_failure`, and `put`/`get` (the link uses
// `put_in`/`get_in`, with its local memory handle).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::ffi::{self, Ucp, ucs_status_t};
use crate::error::Error;
use crate::sync::lock;

/// How long `Drop` of an [`Endpoint`] waits for its flush and for its close, each.
const DROP_BOUND: Duration = Duration::from_secs(1);
/// How long a forced close (after a timeout or a failure) may take before we give up on it.
const FORCE_CLOSE_BOUND: Duration = Duration::from_secs(1);
/// The largest worker address accepted (real ones are a few hundred bytes, a few KiB with many
/// RDMA devices).
pub(crate) const MAX_ADDRESS_LEN: usize = 64 * 1024;
/// The smallest plausible worker address (header, uuid).
const MIN_ADDRESS_LEN: usize = 9;
/// Zero bytes appended to a worker address before UCX parses it: UCX reads it without a
/// length, and every length field it follows is at most a byte or two, so a malformed address
/// cannot make it read past this padding.
const ADDRESS_PADDING: usize = 256 * 1024;
/// The memory types UCX 1.13 knows (`UCS_MEMORY_TYPE_LAST`), used to bound the rkey's type byte.
const KNOWN_MEMORY_TYPES: u8 = 5;

/// The error for a failed UCX call. Link failures become [`Error::NotConnected`] when a peer is
/// known.
fn ucs_error(ucp: &Ucp, call: &'static str, status: ucs_status_t, peer: Option<&str>) -> Error {
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
fn is_link_failure(s: ucs_status_t) -> bool {
    matches!(
        s,
        ffi::UCS_ERR_CONNECTION_RESET
            | ffi::UCS_ERR_ENDPOINT_TIMEOUT
            | ffi::UCS_ERR_UNREACHABLE
            | ffi::UCS_ERR_NOT_CONNECTED
    ) || (ffi::UCS_ERR_LAST_LINK_FAILURE..=ffi::UCS_ERR_FIRST_LINK_FAILURE).contains(&s)
        || (ffi::UCS_ERR_LAST_ENDPOINT_FAILURE..=ffi::UCS_ERR_FIRST_ENDPOINT_FAILURE).contains(&s)
}

/// `Ok` for `UCS_OK`, else the error for `call`.
fn check(ucp: &Ucp, call: &'static str, status: ucs_status_t) -> Result<(), Error> {
    if status == ffi::UCS_OK {
        Ok(())
    } else {
        Err(ucs_error(ucp, call, status, None))
    }
}

// ---------------------------------------------------------------------------------------------
// Context

/// The shared state of a [`Context`].
struct ContextInner {
    /// The function table.
    ucp: &'static Ucp,
    /// The UCP context.
    h: ffi::ucp_context_h,
    /// Serializes context-level calls (also correct with a UCX built without thread support).
    lock: Mutex<()>,
}

// SAFETY: the handle is only used through `&self` methods that take `lock` (mem map/unmap,
// rkey pack) and by workers created with `mt_workers_shared`; `ucp_cleanup` runs in Drop, with
// exclusive access.
unsafe impl Send for ContextInner {}
// SAFETY: as above.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: the context came from ucp_init_version and every worker and memory handle of
        // it is gone (they hold the Arc this lives in).
        unsafe { (self.ucp.ucp_cleanup)(self.h) };
    }
}

/// A UCP context with the RMA and WAKEUP features; cheap to clone (`Arc`).
#[derive(Clone)]
pub(crate) struct Context {
    /// The shared state.
    inner: Arc<ContextInner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Context {
    /// Reads the UCX configuration from the environment (`UCX_TLS`, `UCX_NET_DEVICES`, ...) and
    /// creates a context for RMA with wakeup support.
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] without a usable libucp, [`Error::Native`] if UCX fails.
    pub(crate) fn new() -> Result<Self, Error> {
        let ucp = ffi::ucp()?;
        let mut config: *mut ffi::ucp_config_t = std::ptr::null_mut();
        // SAFETY: NULL prefix and file name are allowed (default "UCX_" environment prefix);
        // `config` is a valid out-pointer.
        let status =
            unsafe { (ucp.ucp_config_read)(std::ptr::null(), std::ptr::null(), &mut config) };
        check(ucp, "ucp_config_read", status)?;
        let mut params = ffi::ucp_params_t::zeroed();
        params.field_mask = ffi::UCP_PARAM_FIELD_FEATURES
            | ffi::UCP_PARAM_FIELD_MT_WORKERS_SHARED
            | ffi::UCP_PARAM_FIELD_NAME;
        params.features = ffi::UCP_FEATURE_RMA | ffi::UCP_FEATURE_WAKEUP;
        params.mt_workers_shared = 1;
        params.name = c"hixl".as_ptr();
        let mut h: ffi::ucp_context_h = std::ptr::null_mut();
        // SAFETY: params and config are valid for the call (UCX copies what it keeps; the name
        // is a static string anyway); `h` is a valid out-pointer.
        let status = unsafe {
            (ucp.ucp_init_version)(
                ffi::API_VERSION.0,
                ffi::API_VERSION.1,
                &params,
                config,
                &mut h,
            )
        };
        // SAFETY: config came from ucp_config_read and is released once, after its last use.
        unsafe { (ucp.ucp_config_release)(config) };
        check(ucp, "ucp_init", status)?;
        Ok(Self {
            inner: Arc::new(ContextInner {
                ucp,
                h,
                lock: Mutex::new(()),
            }),
        })
    }

    /// Registers existing memory `[addr, addr + len)` for remote access (read and write) and
    /// packs its rkey.
    ///
    /// # Safety
    /// The memory must stay allocated (mapped) until the returned [`MemHandle`] is dropped, and
    /// the caller must expect that peers holding the rkey read and write it at any time until
    /// then.
    ///
    /// # Errors
    /// [`Error::NullAddress`], [`Error::ZeroLengthRegion`], or [`Error::Native`] from
    /// `ucp_mem_map`/`ucp_rkey_pack`.
    pub(crate) unsafe fn map(&self, addr: *mut u8, len: usize) -> Result<MemHandle, Error> {
        if addr.is_null() {
            return Err(Error::NullAddress);
        }
        if len == 0 {
            return Err(Error::ZeroLengthRegion);
        }
        let c = &*self.inner;
        let mut params = ffi::ucp_mem_map_params_t::zeroed();
        params.field_mask =
            ffi::UCP_MEM_MAP_PARAM_FIELD_ADDRESS | ffi::UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        params.address = addr.cast();
        params.length = len;
        let _g = lock(&c.lock);
        let mut memh: ffi::ucp_mem_h = std::ptr::null_mut();
        // SAFETY: valid context and params; the caller guarantees the memory stays valid while
        // the registration exists.
        let status = unsafe { (c.ucp.ucp_mem_map)(c.h, &params, &mut memh) };
        check(c.ucp, "ucp_mem_map", status)?;
        let mut buf: *mut c_void = std::ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: memh was just mapped on this context; out-pointers are valid.
        let status = unsafe { (c.ucp.ucp_rkey_pack)(c.h, memh, &mut buf, &mut size) };
        if status != ffi::UCS_OK {
            // SAFETY: memh is mapped and not used elsewhere.
            unsafe { (c.ucp.ucp_mem_unmap)(c.h, memh) };
            return Err(ucs_error(c.ucp, "ucp_rkey_pack", status, None));
        }
        let rkey = if size == 0 || buf.is_null() {
            Vec::new()
        } else {
            // SAFETY: UCX returned `size` readable bytes at `buf`.
            unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), size) }.to_vec()
        };
        // SAFETY: buf came from ucp_rkey_pack and is released once, after the copy.
        unsafe { (c.ucp.ucp_rkey_buffer_release)(buf) };
        Ok(MemHandle {
            ctx: self.clone(),
            memh,
            rkey,
            addr: addr as usize,
            len,
        })
    }
}

/// A registered memory range; unregistered on drop.
pub(crate) struct MemHandle {
    /// Keeps the context alive.
    ctx: Context,
    /// The registration.
    memh: ffi::ucp_mem_h,
    /// The packed rkey (copied out of UCX's buffer).
    rkey: Vec<u8>,
    /// Start address.
    addr: usize,
    /// Length.
    len: usize,
}

// SAFETY: the handle is only used in Drop (exclusive), under the context lock.
unsafe impl Send for MemHandle {}
// SAFETY: `&MemHandle` gives access to plain data only.
unsafe impl Sync for MemHandle {}

impl std::fmt::Debug for MemHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemHandle")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("rkey_len", &self.rkey.len())
            .finish()
    }
}

impl MemHandle {
    /// The packed remote key, to send to peers (packed once, at map time).
    pub(crate) fn packed_rkey(&self) -> &[u8] {
        &self.rkey
    }

    /// The registered start address.
    pub(crate) fn addr(&self) -> usize {
        self.addr
    }

    /// The registered length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for MemHandle {
    fn drop(&mut self) {
        let c = &*self.ctx.inner;
        let _g = lock(&c.lock);
        // SAFETY: memh was mapped on this context and is unmapped once.
        let status = unsafe { (c.ucp.ucp_mem_unmap)(c.h, self.memh) };
        if status != ffi::UCS_OK {
            tracing::warn!(
                status = %c.ucp.status_string(status),
                "ucp_mem_unmap failed"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Worker

/// The thread mode asked of UCX for a worker. Either way the [`Worker`] is safe to share; see
/// the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ThreadMode {
    /// `UCS_THREAD_MODE_SERIALIZED`: UCX does not lock; this layer serializes with a mutex.
    Serialized,
    /// `UCS_THREAD_MODE_MULTI`: UCX locks internally (falls back to our mutex if the UCX build
    /// reports a lesser mode).
    #[cfg_attr(not(test), allow(dead_code))]
    Multi,
}

/// The shared state of a [`Worker`].
struct WorkerInner {
    /// Keeps the context alive.
    ctx: Context,
    /// The UCP worker.
    h: ffi::ucp_worker_h,
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
    fn ucp(&self) -> &'static Ucp {
        self.ctx.inner.ucp
    }

    /// Enters the worker's critical section (a no-op in MULTI mode).
    fn enter(&self) -> Option<MutexGuard<'_, ()>> {
        self.lock.as_ref().map(lock)
    }

    fn progress(&self) -> u32 {
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
    inner: Arc<WorkerInner>,
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
    #[cfg_attr(not(test), allow(dead_code))]
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

// ---------------------------------------------------------------------------------------------
// Endpoint

/// The endpoint error handler: records the first failure status. Runs inside
/// `ucp_worker_progress` on whatever thread progresses the worker; it cannot unwind (atomic
/// stores only).
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
    #[cfg_attr(not(test), allow(dead_code))]
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
    #[cfg_attr(not(test), allow(dead_code))]
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

    /// The live endpoint handle, or the error to return (closing a failed endpoint first).
    fn usable(&mut self) -> Result<ffi::ucp_ep_h, Error> {
        if self.ep.is_null() {
            return Err(self.not_connected("the UCX endpoint was closed after a failure".into()));
        }
        let f = self.failure_status();
        if f != 0 {
            self.close(true, FORCE_CLOSE_BOUND);
            let ucp = self.worker.ucp();
            return Err(self.not_connected(format!(
                "UCX endpoint failed: {} ({f})",
                ucp.status_string(f)
            )));
        }
        Ok(self.ep)
    }

    /// Unpacks a packed rkey received from the peer and keeps it; returns its index for
    /// [`put`](Self::put) and [`get`](Self::get).
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
        let status = {
            let _g = w.enter();
            // SAFETY: live endpoint inside the worker's critical section; `packed` was checked
            // to hold every byte UCX's parser reads (check_rkey); valid out-pointer.
            unsafe { (ucp.ucp_ep_rkey_unpack)(ep, packed.as_ptr().cast(), &mut rkey) }
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
            let _ = self.failure.compare_exchange(
                0,
                i32::from(status),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            self.close(true, FORCE_CLOSE_BOUND);
        }
        Err(ucs_error(ucp, call, status, Some(&self.peer)))
    }

    /// Posts a PUT of `len` bytes from `local` to `remote_addr` in the peer memory of rkey
    /// `rkey` (an index from [`add_rkey`](Self::add_rkey)).
    ///
    /// # Safety
    /// `local..local+len` must be readable and stay valid and unmodified until a
    /// [`flush`](Self::flush) returns (with any result) or the endpoint is dropped.
    ///
    /// # Errors
    /// [`Error::NotConnected`] on a failed endpoint or link failure, [`Error::Native`]
    /// otherwise (an unknown rkey index is `UCS_ERR_INVALID_PARAM`).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) unsafe fn put(
        &mut self,
        local: *const u8,
        len: usize,
        remote_addr: u64,
        rkey: usize,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { self.put_in(local, len, remote_addr, rkey, None) }
    }

    /// [`put`](Self::put) from memory inside `memh` (a mapping of this endpoint's context),
    /// which lets UCX use zero-copy protocols.
    ///
    /// # Safety
    /// As [`put`](Self::put); `memh`, if given, must cover `local..local+len`.
    ///
    /// # Errors
    /// As [`put`](Self::put).
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

    /// Posts a GET of `len` bytes from `remote_addr` (rkey index `rkey`) into `local`.
    ///
    /// # Safety
    /// `local..local+len` must be writable and stay valid, and not be accessed by anything
    /// else, until a [`flush`](Self::flush) returns (with any result) or the endpoint is
    /// dropped.
    ///
    /// # Errors
    /// As [`put`](Self::put).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) unsafe fn get(
        &mut self,
        local: *mut u8,
        len: usize,
        remote_addr: u64,
        rkey: usize,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { self.get_in(local, len, remote_addr, rkey, None) }
    }

    /// [`get`](Self::get) into memory inside `memh` (a mapping of this endpoint's context).
    ///
    /// # Safety
    /// As [`get`](Self::get); `memh`, if given, must cover `local..local+len`.
    ///
    /// # Errors
    /// As [`put`](Self::put).
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
    /// worker.
    ///
    /// When this returns, UCX no longer touches the buffers of the operations posted before:
    /// on success they are done; on a timeout or a failure the endpoint is force-closed first
    /// (outstanding operations are cancelled) and is unusable afterwards.
    ///
    /// A `deadline` that has already passed when `flush` is called is a timeout, whether or
    /// not operations are outstanding.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the deadline passes, [`Error::NotConnected`] when the
    /// endpoint failed (error handler, link failure), [`Error::Native`] for other UCX errors.
    pub(crate) fn flush(&mut self, deadline: Option<Instant>) -> Result<(), Error> {
        self.flush_until(deadline, &|| false)
    }

    /// [`flush`](Self::flush), also ended by `stop` (polled while waiting): then the endpoint
    /// is force-closed as on a timeout, and the error is [`Error::Cancelled`].
    ///
    /// # Errors
    /// As [`flush`](Self::flush), and [`Error::Cancelled`].
    pub(crate) fn flush_until(
        &mut self,
        deadline: Option<Instant>,
        stop: &dyn Fn() -> bool,
    ) -> Result<(), Error> {
        let start = Instant::now();
        let ep = self.usable()?;
        let ucp = self.worker.ucp();
        let timeout = |this: &mut Self| {
            this.close(true, FORCE_CLOSE_BOUND);
            Error::Timeout {
                op: "UCX flush",
                peer: this.peer.clone(),
                elapsed: start.elapsed(),
            }
        };
        if deadline.is_some_and(|d| start >= d) {
            return Err(timeout(self));
        }
        let param = ffi::ucp_request_param_t::zeroed();
        let req = {
            let _g = self.worker.enter();
            // SAFETY: live endpoint inside the worker's critical section; no callback is set.
            unsafe { (ucp.ucp_ep_flush_nbx)(ep, &param) }
        };
        let status = if ffi::ptr_is_ptr(req) {
            let (mut idle, mut spins) = (0u32, 0u32);
            loop {
                let s = {
                    let _g = self.worker.enter();
                    // SAFETY: an incomplete request of this worker, not yet freed.
                    unsafe { (ucp.ucp_request_check_status)(req) }
                };
                if s != ffi::UCS_INPROGRESS {
                    let _g = self.worker.enter();
                    // SAFETY: the completed request is freed once.
                    unsafe { (ucp.ucp_request_free)(req) };
                    break s;
                }
                spins = spins.wrapping_add(1);
                let cancelled = spins.is_multiple_of(64) && stop();
                if cancelled || deadline.is_some_and(|d| Instant::now() >= d) {
                    {
                        let _g = self.worker.enter();
                        // SAFETY: freed once; UCX completes it (cancelled) when the endpoint
                        // is force-closed just below.
                        unsafe { (ucp.ucp_request_free)(req) };
                    }
                    if cancelled {
                        self.close(true, FORCE_CLOSE_BOUND);
                        return Err(Error::Cancelled {
                            op: "UCX flush",
                            peer: self.peer.clone(),
                        });
                    }
                    return Err(timeout(self));
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
        } else {
            ffi::ptr_status(req)
        };
        if status != ffi::UCS_OK {
            let _ = self.failure.compare_exchange(
                0,
                i32::from(status),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        let f = self.failure_status();
        if f != 0 {
            self.close(true, FORCE_CLOSE_BOUND);
            if status != ffi::UCS_OK && !is_link_failure(status) {
                return Err(ucs_error(ucp, "ucp_ep_flush_nbx", status, Some(&self.peer)));
            }
            return Err(self.not_connected(format!(
                "UCX endpoint failed: {} ({f})",
                ucp.status_string(f)
            )));
        }
        Ok(())
    }

    /// Destroys every rkey, then closes the endpoint (`force`: without flushing, cancelling
    /// outstanding operations) and progresses until the close completes or `bound` passes.
    /// Idempotent.
    fn close(&mut self, force: bool, bound: Duration) {
        if self.ep.is_null() {
            return;
        }
        let ucp = self.worker.ucp();
        // rkeys first: they refer to the endpoint's configuration, which the close releases.
        {
            let _g = self.worker.enter();
            for rkey in self.rkeys.drain(..) {
                // SAFETY: each rkey was unpacked on this (still open) endpoint; destroyed once.
                unsafe { (ucp.ucp_rkey_destroy)(rkey) };
            }
        }
        let mut param = ffi::ucp_request_param_t::zeroed();
        param.op_attr_mask = ffi::UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = if force {
            ffi::UCP_EP_CLOSE_FLAG_FORCE
        } else {
            0
        };
        let ep = std::mem::replace(&mut self.ep, std::ptr::null_mut());
        let req = {
            let _g = self.worker.enter();
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

/// Checks what can be checked of a worker address without UCX's parser.
fn check_address(a: &[u8]) -> Result<(), &'static str> {
    if a.len() < MIN_ADDRESS_LEN {
        return Err("too short");
    }
    if a.len() > MAX_ADDRESS_LEN {
        return Err("too long");
    }
    // header: the low 4 bits are the address version (V1 = 0, V2 = 1 in UCX 1.13+); UCX
    // aborts on a version it does not know
    if a[0] & 0x0f > 1 {
        return Err("unknown UCX address version");
    }
    Ok(())
}

/// Checks that a packed rkey holds every byte UCX's `ucp_ep_rkey_unpack` reads: a 64-bit
/// memory-domain map, a memory-type byte, then for each bit of the map a size byte and that
/// many bytes.
fn check_rkey(r: &[u8]) -> Result<(), &'static str> {
    let Some((map, rest)) = r.split_first_chunk::<8>() else {
        return Err("too short for its header");
    };
    let Some((&mem_type, mut rest)) = rest.split_first() else {
        return Err("too short for its header");
    };
    if mem_type >= KNOWN_MEMORY_TYPES {
        return Err("unknown memory type");
    }
    let map = u64::from_ne_bytes(*map);
    for _ in 0..map.count_ones() {
        let Some((&size, tail)) = rest.split_first() else {
            return Err("shorter than its memory-domain map says");
        };
        let Some(tail) = tail.get(usize::from(size)..) else {
            return Err("shorter than its key sizes say");
        };
        rest = tail;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
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

    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A context, or None (printing why) when UCX is not installed.
    fn context_or_skip() -> Option<Context> {
        if let Err(e) = ffi::ucp() {
            eprintln!("skipped: {e}");
            return None;
        }
        Some(Context::new().expect("UCX is installed but ucp_init failed"))
    }

    fn tls() -> String {
        std::env::var("UCX_TLS").unwrap_or_else(|_| "<default>".into())
    }

    fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut s = seed
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            // splitmix64
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        }
        out.truncate(len);
        out
    }

    /// Progresses `w` on a thread until dropped (stopped through a `Waker`).
    struct ProgressThread {
        stop: Arc<AtomicBool>,
        waker: Waker,
        handle: Option<std::thread::JoinHandle<()>>,
    }

    impl ProgressThread {
        fn start(w: &Worker) -> Self {
            let stop = Arc::new(AtomicBool::new(false));
            let (w2, s2) = (w.clone(), stop.clone());
            let handle = std::thread::spawn(move || {
                while !s2.load(Ordering::Acquire) {
                    while w2.progress() > 0 {}
                    w2.wait_event(Some(Duration::from_millis(200)))
                        .expect("wait");
                }
            });
            Self {
                stop,
                waker: w.waker(),
                handle: Some(handle),
            }
        }
    }

    impl Drop for ProgressThread {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Release);
            self.waker.wake().expect("signal");
            let t = Instant::now();
            self.handle.take().unwrap().join().expect("progress thread");
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the waker did not stop the thread"
            );
        }
    }

    /// Connects a client endpoint to `server`, or None (printing why) when the transports
    /// restricted by UCX_TLS cannot connect with error mode PEER.
    fn connect_or_skip(client: &Worker, server: &Worker) -> Option<Endpoint> {
        match Endpoint::connect(client, server.address(), "server") {
            Ok(ep) => Some(ep),
            Err(e) if std::env::var_os("UCX_TLS").is_some() => {
                eprintln!(
                    "skipped: UCX_TLS={} cannot connect with error mode PEER: {e}",
                    tls()
                );
                None
            }
            Err(e) => panic!("connect with the default UCX_TLS failed: {e}"),
        }
    }

    #[test]
    fn put_and_get_between_two_workers() {
        let Some(ctx) = context_or_skip() else { return };
        let server = Worker::new(&ctx, ThreadMode::Multi).expect("server worker");
        let client = Worker::new(&ctx, ThreadMode::Serialized).expect("client worker");
        assert_eq!(client.thread_mode(), ThreadMode::Serialized);
        const LEN: usize = 1 << 20;
        let mut remote = random_bytes(LEN, 1);
        let original = remote.clone();
        // SAFETY: `remote` outlives `mem` (dropped at the end of the test, after `mem`), and it
        // is only read after the flush.
        let mem = unsafe { ctx.map(remote.as_mut_ptr(), LEN) }.expect("map");
        assert!(!mem.packed_rkey().is_empty());
        let progress = ProgressThread::start(&server);
        let Some(mut ep) = connect_or_skip(&client, &server) else {
            return;
        };
        let rkey = ep.add_rkey(mem.packed_rkey()).expect("rkey");
        let base = remote.as_ptr() as u64;

        let src = random_bytes(300_000, 2);
        let (off, other) = (4096usize, 700_000usize);
        let mut back = vec![0u8; src.len()];
        let mut untouched = vec![0u8; 50_000];
        // SAFETY: `src` stays alive and unmodified until the flush below returns.
        unsafe { ep.put(src.as_ptr(), src.len(), base + off as u64, rkey) }.expect("put");
        ep.flush(Some(Instant::now() + Duration::from_secs(30)))
            .expect("flush put");
        // SAFETY: `back` and `untouched` are not accessed until the flush below returns.
        unsafe { ep.get(back.as_mut_ptr(), back.len(), base + off as u64, rkey) }.expect("get");
        // SAFETY: as above.
        unsafe {
            ep.get(
                untouched.as_mut_ptr(),
                untouched.len(),
                base + other as u64,
                rkey,
            )
        }
        .expect("get");
        ep.flush(Some(Instant::now() + Duration::from_secs(30)))
            .expect("flush get");
        assert!(
            back == src,
            "GET did not return what PUT wrote (UCX_TLS={})",
            tls()
        );
        assert!(untouched[..] == original[other..other + untouched.len()]);
        // an unknown rkey index is a typed error, not a panic
        // SAFETY: nothing is posted (the index is rejected first).
        let e = unsafe { ep.put(src.as_ptr(), 1, base, 99) }.expect_err("bad rkey index");
        assert!(
            matches!(e, Error::Native { code, .. } if code == i64::from(ffi::UCS_ERR_INVALID_PARAM))
        );
        assert!(!ep.is_failed());
        let t = Instant::now();
        drop(ep);
        assert!(t.elapsed() < Duration::from_secs(3));
        drop(progress);
        drop(mem);
        assert!(remote[off..off + src.len()] == src[..]);
        assert!(remote[..off] == original[..off]);
        eprintln!("PUT/GET ok with UCX_TLS={}", tls());
    }

    #[test]
    fn a_past_deadline_times_out_and_closes_the_endpoint() {
        let Some(ctx) = context_or_skip() else { return };
        let server = Worker::new(&ctx, ThreadMode::Multi).expect("server worker");
        let client = Worker::new(&ctx, ThreadMode::Multi).expect("client worker");
        let mut remote = vec![0u8; 1 << 20];
        // SAFETY: `remote` outlives `mem` (declared before it, so dropped after).
        let mem = unsafe { ctx.map(remote.as_mut_ptr(), remote.len()) }.expect("map");
        let progress = ProgressThread::start(&server);
        let Some(mut ep) = connect_or_skip(&client, &server) else {
            return;
        };
        let rkey = ep.add_rkey(mem.packed_rkey()).expect("rkey");
        let src = random_bytes(1 << 20, 3);
        // SAFETY: `src` outlives the endpoint's flush (which force-closes it on timeout).
        unsafe { ep.put(src.as_ptr(), src.len(), remote.as_ptr() as u64, rkey) }.expect("put");
        let t = Instant::now();
        let e = ep
            .flush(Some(Instant::now() - Duration::from_millis(1)))
            .expect_err("deadline in the past");
        assert!(
            matches!(&e, Error::Timeout { peer, .. } if peer == "server"),
            "{e:?}"
        );
        assert!(ep.is_failed());
        // SAFETY: rejected before posting.
        let e =
            unsafe { ep.put(src.as_ptr(), 1, remote.as_ptr() as u64, rkey) }.expect_err("closed");
        assert!(matches!(e, Error::NotConnected { .. }), "{e:?}");
        assert!(matches!(ep.flush(None), Err(Error::NotConnected { .. })));
        assert!(matches!(
            ep.add_rkey(mem.packed_rkey()),
            Err(Error::NotConnected { .. })
        ));
        drop(ep);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "timeout path took {:?}",
            t.elapsed()
        );
        drop(progress);
    }

    #[test]
    fn a_deadline_passing_during_the_flush_times_out() {
        let Some(ctx) = context_or_skip() else { return };
        let server = Worker::new(&ctx, ThreadMode::Multi).expect("server worker");
        let client = Worker::new(&ctx, ThreadMode::Multi).expect("client worker");
        let mut remote = vec![0u8; 1 << 20];
        // SAFETY: `remote` outlives `mem` (declared before it, so dropped after).
        let mem = unsafe { ctx.map(remote.as_mut_ptr(), remote.len()) }.expect("map");
        // no progress on the server: nothing that needs the target (wireup, tcp) can complete
        let Some(mut ep) = connect_or_skip(&client, &server) else {
            return;
        };
        let rkey = ep.add_rkey(mem.packed_rkey()).expect("rkey");
        let src = random_bytes(1 << 20, 4);
        // SAFETY: `src` outlives the flush, which force-closes the endpoint on timeout.
        unsafe { ep.put(src.as_ptr(), src.len(), remote.as_ptr() as u64, rkey) }.expect("put");
        let t = Instant::now();
        match ep.flush(Some(t + Duration::from_millis(300))) {
            Err(Error::Timeout { elapsed, .. }) => {
                assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
                assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
                assert!(ep.is_failed());
            }
            // a transport that needs no target progress (e.g. RDMA) may complete
            Ok(()) => eprintln!(
                "flush completed without target progress (UCX_TLS={})",
                tls()
            ),
            Err(e) => panic!("unexpected {e:?}"),
        }
        let t = Instant::now();
        drop(ep);
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "drop took {:?}",
            t.elapsed()
        );
    }

    #[test]
    fn a_dead_peer_is_not_connected() {
        let Some(ctx) = context_or_skip() else { return };
        let server = Worker::new(&ctx, ThreadMode::Multi).expect("server worker");
        let client = Worker::new(&ctx, ThreadMode::Multi).expect("client worker");
        let mut remote = vec![0u8; 1 << 16];
        // SAFETY: `remote` outlives `mem` (declared before it, so dropped after).
        let mem = unsafe { ctx.map(remote.as_mut_ptr(), remote.len()) }.expect("map");
        let progress = ProgressThread::start(&server);
        let Some(mut ep) = connect_or_skip(&client, &server) else {
            return;
        };
        if !ep.detects_failure() {
            eprintln!(
                "a_dead_peer_is_not_connected: skipped: these UCX transports (UCX_TLS={}) cannot detect a dead peer (error mode PEER); hixl's heartbeats do that",
                std::env::var("UCX_TLS").unwrap_or_default()
            );
            drop(ep);
            drop(progress);
            return;
        }
        let rkey = ep.add_rkey(mem.packed_rkey()).expect("rkey");
        let src = random_bytes(1 << 16, 5);
        let base = remote.as_ptr() as u64;
        // SAFETY: `src` outlives the flush.
        unsafe { ep.put(src.as_ptr(), src.len(), base, rkey) }.expect("put");
        ep.flush(Some(Instant::now() + Duration::from_secs(30)))
            .expect("flush");
        // the server goes away (its worker is destroyed, closing its connections)
        drop(progress);
        drop(server);
        let t = Instant::now();
        let deadline = t + Duration::from_secs(20);
        let e = loop {
            // SAFETY: `src` outlives the flush.
            let r = unsafe { ep.put(src.as_ptr(), src.len(), base, rkey) }
                .and_then(|()| ep.flush(Some(deadline)));
            match r {
                Ok(()) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(()) => panic!("writes to a destroyed worker kept succeeding"),
                Err(e) => break e,
            }
        };
        assert!(
            matches!(&e, Error::NotConnected { peer, .. } if peer == "server"),
            "{e:?}"
        );
        assert!(ep.is_failed());
        eprintln!("dead peer noticed after {:?}: {e}", t.elapsed());
        let t = Instant::now();
        drop(ep);
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "drop took {:?}",
            t.elapsed()
        );
        drop(mem);
    }

    #[test]
    fn malformed_addresses_and_rkeys_are_typed_errors() {
        let Some(ctx) = context_or_skip() else { return };
        let server = Worker::new(&ctx, ThreadMode::Multi).expect("server worker");
        let client = Worker::new(&ctx, ThreadMode::Multi).expect("client worker");
        let protocol = |r: Result<Endpoint, Error>| match r {
            Err(Error::Protocol { peer, problem }) => {
                assert_eq!(peer, "p");
                problem
            }
            other => panic!("expected a protocol error, got {other:?}"),
        };
        protocol(Endpoint::connect(&client, &[], "p"));
        protocol(Endpoint::connect(&client, &[0u8; 4], "p"));
        protocol(Endpoint::connect(
            &client,
            &vec![0u8; MAX_ADDRESS_LEN + 1],
            "p",
        ));
        // a version UCX does not know (UCX itself would abort)
        let mut bad = server.address().to_vec();
        bad[0] |= 0x0f;
        assert!(protocol(Endpoint::connect(&client, &bad, "p")).contains("version"));

        let mut remote = vec![0u8; 4096];
        // SAFETY: `remote` outlives `mem`.
        let mem = unsafe { ctx.map(remote.as_mut_ptr(), remote.len()) }.expect("map");
        let progress = ProgressThread::start(&server);
        let Some(mut ep) = connect_or_skip(&client, &server) else {
            return;
        };
        let good = mem.packed_rkey().to_vec();
        let mut bad_rkeys: Vec<Vec<u8>> = vec![
            vec![],
            vec![1, 2, 3],
            good[..8].to_vec(),
            // every memory domain claimed, no key bytes
            [u64::MAX.to_ne_bytes().as_slice(), &[0]].concat(),
            // an unknown memory type
            [&good[..8], &[200], &good[9..]].concat(),
        ];
        if good.len() > 9 {
            bad_rkeys.push(good[..good.len() - 1].to_vec());
        }
        for bad in &bad_rkeys {
            match ep.add_rkey(bad) {
                Err(Error::Protocol { peer, .. }) => assert_eq!(peer, "server"),
                other => panic!("rkey {bad:?}: expected a protocol error, got {other:?}"),
            }
        }
        assert!(!ep.is_failed());
        assert_eq!(ep.add_rkey(&good).expect("the real rkey"), 0);
        drop(ep);
        drop(progress);
        drop(mem);
    }

    #[test]
    fn rkey_length_walk() {
        let mut r = 0b101u64.to_ne_bytes().to_vec();
        r.push(0); // host memory
        r.extend_from_slice(&[2, 0xaa, 0xbb]); // first domain: 2 bytes
        assert_eq!(
            check_rkey(&r),
            Err("shorter than its memory-domain map says")
        );
        r.push(0); // second domain: 0 bytes
        assert_eq!(check_rkey(&r), Ok(()));
        r.truncate(10);
        assert_eq!(check_rkey(&r), Err("shorter than its key sizes say"));
        assert!(check_rkey(&[0; 9]).is_ok());
        assert!(check_address(&[0x20; 9]).is_ok());
        assert!(check_address(&[0x2f; 9]).is_err());
    }

    #[test]
    fn mapping_rejects_null_and_empty() {
        let Some(ctx) = context_or_skip() else { return };
        // SAFETY: rejected before UCX sees them.
        let null = unsafe { ctx.map(std::ptr::null_mut(), 8) };
        assert!(matches!(null, Err(Error::NullAddress)));
        let mut b = [0u8; 8];
        // SAFETY: as above.
        let empty = unsafe { ctx.map(b.as_mut_ptr(), 0) };
        assert!(matches!(empty, Err(Error::ZeroLengthRegion)));
    }
}
