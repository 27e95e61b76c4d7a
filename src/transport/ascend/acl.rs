//! Thin wrappers over the ACL runtime: devices, contexts, memory, streams.
//!
//! Every failure becomes an [`Error`]: a stream-sync timeout is [`Error::Timeout`] (`TIMEOUT`),
//! anything else [`Error::Native`] with `library: "acl"`, the code, its header name and
//! `aclGetRecentErrMsg` (`FAILED`). ACL keeps the current context per thread; allocations and
//! streams remember the context they were made in, and release themselves under it.

// Used only by the unit tests yet, each marked `cfg_attr(not(test), allow(dead_code))`: the other
// malloc policies (BufferPool staging), `is_host`, `finalize`, `reset_device` and `device`
// (engine teardown leaves ACL initialised, as HIXL does).

use std::ffi::{CStr, c_void};
use std::marker::PhantomData;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ffi::{self, AclApi, AclError};
use crate::error::Error;

/// `aclrtMemMallocPolicy` values hixl uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MallocPolicy {
    /// `ACL_MEM_MALLOC_HUGE_FIRST`.
    #[cfg_attr(not(test), allow(dead_code))]
    HugeFirst,
    /// `ACL_MEM_MALLOC_HUGE_ONLY`: 2 MiB pages; required for memory registered for HCCS.
    HugeOnly,
    /// `ACL_MEM_MALLOC_HUGE_ONLY_P2P`.
    #[cfg_attr(not(test), allow(dead_code))]
    HugeOnlyP2p,
    /// Any raw policy value (e.g. `HIGH_BAND_WIDTH | HUGE_FIRST`, as HIXL's buffer pool uses).
    #[cfg_attr(not(test), allow(dead_code))]
    Raw(u32),
}

impl MallocPolicy {
    /// The C enum value.
    pub(crate) fn raw(self) -> u32 {
        match self {
            Self::HugeFirst => ffi::ACL_MEM_MALLOC_HUGE_FIRST,
            Self::HugeOnly => ffi::ACL_MEM_MALLOC_HUGE_ONLY,
            Self::HugeOnlyP2p => ffi::ACL_MEM_MALLOC_HUGE_ONLY_P2P,
            Self::Raw(v) => v,
        }
    }

    /// Whether the allocation must come from 2 MiB huge pages.
    pub(crate) fn huge_only(self) -> bool {
        matches!(
            self.raw() & 0xff,
            ffi::ACL_MEM_MALLOC_HUGE_ONLY | ffi::ACL_MEM_MALLOC_HUGE_ONLY_P2P
        )
    }
}

/// A loaded ACL runtime. Cheap to clone (shared).
#[derive(Clone, Debug)]
pub(crate) struct Acl {
    api: Arc<AclApi>,
}

/// An `aclrtContext`: an opaque token naming a device context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Context(NonNull<c_void>);

// SAFETY: a context is an opaque token handed back to ACL, never dereferenced by hixl; ACL
// documents switching to it from any thread (`aclrtSetCurrentContext`).
unsafe impl Send for Context {}
// SAFETY: as above; sharing the token shares no mutable state on the Rust side.
unsafe impl Sync for Context {}

impl Context {
    /// The raw token.
    pub(crate) fn as_raw(self) -> *mut c_void {
        self.0.as_ptr()
    }
}

/// Restores the thread's previous current context when dropped (HIXL's `TemporaryRtContext`).
/// Bound to the thread it was made on.
#[derive(Debug)]
pub(crate) struct ContextGuard {
    acl: Acl,
    previous: Option<Context>,
    _not_send: PhantomData<*const ()>,
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if let Some(prev) = self.previous
            && let Err(e) = self.acl.set_current_context(prev)
        {
            tracing::warn!("cannot restore the previous ACL context: {e}");
        }
    }
}

/// Device memory (`aclrtMalloc`) or pinned host memory (`aclrtMallocHost`), freed on drop under
/// the context it was allocated in.
///
/// hixl never dereferences it: device addresses are not host addresses on real hardware. Bytes
/// move with [`Acl::write`]/[`Acl::read`] (`aclrtMemcpy`) or HCCL.
#[derive(Debug)]
pub(crate) struct AclBuffer {
    acl: Acl,
    ptr: NonNull<c_void>,
    len: usize,
    host: bool,
    ctx: Option<Context>,
}

// SAFETY: the buffer owns its allocation (no aliasing Rust references exist); every access goes
// through thread-safe ACL calls, and drop switches to the owning context first.
unsafe impl Send for AclBuffer {}
// SAFETY: `&AclBuffer` only exposes the address and length, and `aclrtMemcpy` from several
// threads is allowed by ACL; the Rust side holds no interior state.
unsafe impl Sync for AclBuffer {}

impl AclBuffer {
    /// The start address (a device address for device memory).
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }
    /// The raw pointer.
    pub(crate) fn as_ptr(&self) -> *mut c_void {
        self.ptr.as_ptr()
    }
    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    /// Whether it is pinned host memory (`aclrtMallocHost`).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn is_host(&self) -> bool {
        self.host
    }
    /// The runtime it was allocated from.
    pub(crate) fn acl(&self) -> &Acl {
        &self.acl
    }

    /// Frees it now, reporting a failure (dropping frees too, logging failures).
    ///
    /// # Errors
    /// [`Error::Native`] from `aclrtFree`/`aclrtFreeHost`.
    pub(crate) fn free(self) -> Result<(), Error> {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again; the Acl is moved out exactly once.
        let acl = unsafe { std::ptr::read(&me.acl) };
        acl.release_buffer(me.ptr, me.host, me.ctx)
    }
}

impl Drop for AclBuffer {
    fn drop(&mut self) {
        if let Err(e) = self.acl.release_buffer(self.ptr, self.host, self.ctx) {
            tracing::warn!("leaking ACL memory at {:#x}: {e}", self.addr());
        }
    }
}

/// An `aclrtStream`, destroyed on drop under the context it was created in.
#[derive(Debug)]
pub(crate) struct Stream {
    acl: Acl,
    raw: NonNull<c_void>,
    ctx: Option<Context>,
}

// SAFETY: a stream handle may be used from any thread that has its context current (the calls
// switch to it); it is not shared (`!Sync`), so calls on one stream are not concurrent.
unsafe impl Send for Stream {}

impl Stream {
    /// The raw `aclrtStream`.
    pub(crate) fn as_raw(&self) -> *mut c_void {
        self.raw.as_ptr()
    }
    /// The context it belongs to.
    pub(crate) fn context(&self) -> Option<Context> {
        self.ctx
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _guard = self.ctx.and_then(|c| self.acl.enter(c).ok());
        let api = &self.acl.api;
        // SAFETY: the stream came from aclrtCreateStream and is destroyed once.
        let rc = unsafe { (api.destroy_stream)(self.raw.as_ptr()) };
        if rc != ffi::ACL_SUCCESS {
            tracing::warn!(
                "aclrtDestroyStream failed: {}",
                self.acl.error("aclrtDestroyStream", rc)
            );
        }
    }
}

impl Acl {
    /// Loads the ACL runtime (see [`AclApi::load`] for the search order).
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`].
    pub(crate) fn load(path: Option<&Path>) -> Result<Self, Error> {
        Ok(Self {
            api: Arc::new(AclApi::load(path)?),
        })
    }

    /// The name the library was opened by.
    pub(crate) fn library(&self) -> &str {
        self.api.library()
    }

    /// The latest `aclGetRecentErrMsg` text, if any.
    fn recent_message(&self) -> Option<String> {
        // SAFETY: aclGetRecentErrMsg takes no arguments and returns NULL or a NUL-terminated
        // string owned by ACL, valid until the next ACL call on this thread; copied at once.
        let p = unsafe { (self.api.get_recent_err_msg)() };
        if p.is_null() {
            return None;
        }
        // SAFETY: non-null and NUL-terminated, as above.
        let s = unsafe { CStr::from_ptr(p) }
            .to_string_lossy()
            .trim()
            .to_owned();
        (!s.is_empty()).then_some(s)
    }

    /// The [`Error::Native`] for a failed call.
    pub(crate) fn error(&self, call: &'static str, code: AclError) -> Error {
        let name = ffi::acl_error_name(code);
        let detail = match self.recent_message() {
            Some(m) => format!("{name}: {m}"),
            None => name.to_owned(),
        };
        Error::Native {
            library: "acl",
            call,
            code: i64::from(code),
            detail,
        }
    }

    fn check(&self, call: &'static str, code: AclError) -> Result<(), Error> {
        if code == ffi::ACL_SUCCESS {
            Ok(())
        } else {
            Err(self.error(call, code))
        }
    }

    /// `aclInit(NULL)`; a repeated initialisation is not an error.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn init(&self) -> Result<(), Error> {
        // SAFETY: NULL is documented as "no config file".
        let rc = unsafe { (self.api.init)(std::ptr::null()) };
        if rc == ffi::ACL_ERROR_REPEAT_INITIALIZE {
            return Ok(());
        }
        self.check("aclInit", rc)
    }

    /// `aclFinalize()`.
    ///
    /// # Errors
    /// [`Error::Native`].
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn finalize(&self) -> Result<(), Error> {
        // SAFETY: no arguments.
        let rc = unsafe { (self.api.finalize)() };
        self.check("aclFinalize", rc)
    }

    /// `aclrtSetDevice(device)`: also makes the device's default context current on this thread.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn set_device(&self, device: i32) -> Result<(), Error> {
        // SAFETY: plain integer argument.
        let rc = unsafe { (self.api.set_device)(device) };
        self.check("aclrtSetDevice", rc)
    }

    /// `aclrtResetDevice(device)`.
    ///
    /// # Errors
    /// [`Error::Native`].
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn reset_device(&self, device: i32) -> Result<(), Error> {
        // SAFETY: plain integer argument.
        let rc = unsafe { (self.api.reset_device)(device) };
        self.check("aclrtResetDevice", rc)
    }

    /// `aclrtGetDevice`: the device of this thread's current context.
    ///
    /// # Errors
    /// [`Error::Native`] (`ACL_ERROR_RT_CONTEXT_NULL` without a context).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn device(&self) -> Result<i32, Error> {
        let mut d = -1;
        // SAFETY: `d` is a valid out-pointer for the call.
        let rc = unsafe { (self.api.get_device)(&mut d) };
        self.check("aclrtGetDevice", rc).map(|()| d)
    }

    /// `aclrtGetPhyDevIdByLogicDevId`: the physical id of logical device `logical` (the id
    /// `aclrtSetDevice` takes). They differ in containers and with visible-device remapping;
    /// HCCL's rank table and `/etc/hccn.conf` use the physical id.
    ///
    /// # Errors
    /// [`Error::Native`]; also for a negative id reported as success.
    pub(crate) fn physical_device_id(&self, logical: i32) -> Result<u32, Error> {
        let mut phy: i32 = -1;
        // SAFETY: `phy` is a valid out-pointer for the call.
        let rc = unsafe { (self.api.get_phy_dev_id_by_logic_dev_id)(logical, &mut phy) };
        self.check("aclrtGetPhyDevIdByLogicDevId", rc)?;
        u32::try_from(phy).map_err(|_| Error::Native {
            library: "acl",
            call: "aclrtGetPhyDevIdByLogicDevId",
            code: 0,
            detail: format!("ACL_SUCCESS with the physical id {phy}"),
        })
    }

    /// `aclrtGetSocName()`: the SoC's name (e.g. `Ascend910B1`, `Ascend910_9391`), or `None`
    /// when ACL returns NULL or an empty string.
    pub(crate) fn soc_name(&self) -> Option<String> {
        // SAFETY: no arguments; the result is NULL or a NUL-terminated string owned by ACL for
        // the life of the process, copied at once.
        let p = unsafe { (self.api.get_soc_name)() };
        if p.is_null() {
            return None;
        }
        // SAFETY: non-null and NUL-terminated, as above.
        let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        (!s.is_empty()).then_some(s)
    }

    /// `aclrtGetDeviceInfo(device, attr)` (`device` is the logical id, as HIXL passes it).
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn device_info(&self, device: u32, attr: std::ffi::c_int) -> Result<i64, Error> {
        let mut v: i64 = 0;
        // SAFETY: `v` is a valid out-pointer; the other arguments are plain values.
        let rc = unsafe { (self.api.get_device_info)(device, attr, &mut v) };
        self.check("aclrtGetDeviceInfo", rc).map(|()| v)
    }

    /// `aclrtStreamAbort`, under the stream's context: drops the tasks not yet executed, so
    /// no copy queued on it touches memory afterwards (HIXL's failure teardown).
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn abort(&self, stream: &Stream) -> Result<(), Error> {
        let _guard = match stream.ctx {
            Some(c) => Some(self.enter(c)?),
            None => None,
        };
        // SAFETY: the stream is alive (borrowed).
        let rc = unsafe { (self.api.stream_abort)(stream.raw.as_ptr()) };
        self.check("aclrtStreamAbort", rc)
    }

    /// `aclrtGetCurrentContext`.
    ///
    /// # Errors
    /// [`Error::Native`] (also when ACL reports success with a null context).
    pub(crate) fn current_context(&self) -> Result<Context, Error> {
        let mut c: *mut c_void = std::ptr::null_mut();
        // SAFETY: `c` is a valid out-pointer for the call.
        let rc = unsafe { (self.api.get_current_context)(&mut c) };
        self.check("aclrtGetCurrentContext", rc)?;
        NonNull::new(c).map(Context).ok_or_else(|| Error::Native {
            library: "acl",
            call: "aclrtGetCurrentContext",
            code: i64::from(ffi::ACL_ERROR_RT_CONTEXT_NULL),
            detail: "ACL_ERROR_RT_CONTEXT_NULL: success with a null context".into(),
        })
    }

    /// `aclrtSetCurrentContext(ctx)`.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn set_current_context(&self, ctx: Context) -> Result<(), Error> {
        // SAFETY: the token came from ACL (`Context` is only built from ACL results).
        let rc = unsafe { (self.api.set_current_context)(ctx.as_raw()) };
        self.check("aclrtSetCurrentContext", rc)
    }

    /// Makes `ctx` current on this thread until the guard drops, then restores the previous
    /// context (if there was one).
    ///
    /// # Errors
    /// [`Error::Native`] from `aclrtSetCurrentContext`.
    pub(crate) fn enter(&self, ctx: Context) -> Result<ContextGuard, Error> {
        let previous = self.current_context().ok();
        if previous != Some(ctx) {
            self.set_current_context(ctx)?;
        }
        Ok(ContextGuard {
            acl: self.clone(),
            previous: previous.filter(|p| *p != ctx),
            _not_send: PhantomData,
        })
    }

    /// `aclrtMalloc(len, policy)` under this thread's current context. With a huge-only policy
    /// and a length that is a multiple of 2 MiB, the address must be 2 MiB aligned (HCCS
    /// registrations need it); a misaligned result is freed and refused.
    ///
    /// # Errors
    /// [`Error::Native`] from `aclrtMalloc`, or with code `ACL_ERROR_MEMORY_ADDRESS_UNALIGNED`
    /// for a misaligned huge-page allocation.
    pub(crate) fn malloc_device(
        &self,
        len: usize,
        policy: MallocPolicy,
    ) -> Result<AclBuffer, Error> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; size and policy are plain values.
        let rc = unsafe { (self.api.malloc)(&mut p, len, policy.raw()) };
        self.check("aclrtMalloc", rc)?;
        let buf = self.own(p, len, false, "aclrtMalloc")?;
        if policy.huge_only()
            && len.is_multiple_of(ffi::HUGE_PAGE)
            && !buf.addr().is_multiple_of(ffi::HUGE_PAGE)
        {
            let addr = buf.addr();
            if let Err(e) = buf.free() {
                tracing::warn!("cannot free a misaligned ACL allocation: {e}");
            }
            return Err(Error::Native {
                library: "acl",
                call: "aclrtMalloc",
                code: i64::from(ffi::ACL_ERROR_MEMORY_ADDRESS_UNALIGNED),
                detail: format!(
                    "ACL_ERROR_MEMORY_ADDRESS_UNALIGNED: a HUGE_ONLY allocation of {len} bytes \
                     returned {addr:#x}, not 2 MiB aligned"
                ),
            });
        }
        Ok(buf)
    }

    /// `aclrtMallocHost(len)`: pinned host memory, under this thread's current context.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn malloc_host(&self, len: usize) -> Result<AclBuffer, Error> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        let rc = unsafe { (self.api.malloc_host)(&mut p, len) };
        self.check("aclrtMallocHost", rc)?;
        self.own(p, len, true, "aclrtMallocHost")
    }

    fn own(
        &self,
        p: *mut c_void,
        len: usize,
        host: bool,
        call: &'static str,
    ) -> Result<AclBuffer, Error> {
        let ptr = NonNull::new(p).ok_or_else(|| Error::Native {
            library: "acl",
            call,
            code: 0,
            detail: "ACL_SUCCESS with a null pointer".into(),
        })?;
        Ok(AclBuffer {
            acl: self.clone(),
            ptr,
            len,
            host,
            ctx: self.current_context().ok(),
        })
    }

    fn release_buffer(
        &self,
        ptr: NonNull<c_void>,
        host: bool,
        ctx: Option<Context>,
    ) -> Result<(), Error> {
        let _guard = match ctx {
            Some(c) => Some(self.enter(c)?),
            None => None,
        };
        if host {
            // SAFETY: `ptr` came from aclrtMallocHost and is freed once (the buffer is gone).
            let rc = unsafe { (self.api.free_host)(ptr.as_ptr()) };
            self.check("aclrtFreeHost", rc)
        } else {
            // SAFETY: `ptr` came from aclrtMalloc and is freed once (the buffer is gone).
            let rc = unsafe { (self.api.free)(ptr.as_ptr()) };
            self.check("aclrtFree", rc)
        }
    }

    fn range_check(buf: &AclBuffer, offset: usize, len: usize) -> Result<(), Error> {
        match offset.checked_add(len) {
            Some(end) if end <= buf.len => Ok(()),
            _ => Err(Error::RangeOutOfBounds {
                region: 0,
                offset: offset as u64,
                len: len as u64,
                region_len: buf.len as u64,
            }),
        }
    }

    /// Copies `src` into `buf` at `offset` (`aclrtMemcpy`, host to device or host to host).
    ///
    /// # Errors
    /// [`Error::RangeOutOfBounds`] if the range does not fit; [`Error::Native`].
    pub(crate) fn write(&self, buf: &AclBuffer, offset: usize, src: &[u8]) -> Result<(), Error> {
        Self::range_check(buf, offset, src.len())?;
        let kind = if buf.host {
            ffi::ACL_MEMCPY_HOST_TO_HOST
        } else {
            ffi::ACL_MEMCPY_HOST_TO_DEVICE
        };
        // SAFETY: the destination range lies inside the allocation (checked above), which is
        // alive for the call; `src` is a valid slice of `src.len()` bytes.
        let rc = unsafe {
            (self.api.memcpy)(
                buf.ptr.as_ptr().cast::<u8>().add(offset).cast(),
                buf.len - offset,
                src.as_ptr().cast(),
                src.len(),
                kind,
            )
        };
        self.check("aclrtMemcpy", rc)
    }

    /// Copies from `buf` at `offset` into `dst` (`aclrtMemcpy`, device to host or host to host).
    ///
    /// # Errors
    /// [`Error::RangeOutOfBounds`] if the range does not fit; [`Error::Native`].
    pub(crate) fn read(&self, buf: &AclBuffer, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        Self::range_check(buf, offset, dst.len())?;
        let kind = if buf.host {
            ffi::ACL_MEMCPY_HOST_TO_HOST
        } else {
            ffi::ACL_MEMCPY_DEVICE_TO_HOST
        };
        // SAFETY: the source range lies inside the live allocation (checked above); `dst` is an
        // exclusively borrowed slice of `dst.len()` bytes.
        let rc = unsafe {
            (self.api.memcpy)(
                dst.as_mut_ptr().cast(),
                dst.len(),
                buf.ptr.as_ptr().cast::<u8>().add(offset).cast(),
                dst.len(),
                kind,
            )
        };
        self.check("aclrtMemcpy", rc)
    }

    /// Copies `src` to `addr` (`aclrtMemcpy`, host to device, or host to host when `device` is
    /// false).
    ///
    /// # Safety
    /// `addr..addr + src.len()` is live ACL (or registered host) memory of that kind, with no
    /// Rust reference to it.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) unsafe fn write_raw(
        &self,
        addr: usize,
        src: &[u8],
        device: bool,
    ) -> Result<(), Error> {
        let kind = if device {
            ffi::ACL_MEMCPY_HOST_TO_DEVICE
        } else {
            ffi::ACL_MEMCPY_HOST_TO_HOST
        };
        // SAFETY: the caller vouches for the destination; `src` is a valid slice.
        let rc = unsafe {
            (self.api.memcpy)(
                addr as *mut c_void,
                src.len(),
                src.as_ptr().cast(),
                src.len(),
                kind,
            )
        };
        self.check("aclrtMemcpy", rc)
    }

    /// Copies from `addr` into `dst` (`aclrtMemcpy`, device to host, or host to host when
    /// `device` is false).
    ///
    /// # Safety
    /// `addr..addr + dst.len()` is live ACL (or registered host) memory of that kind.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) unsafe fn read_raw(
        &self,
        addr: usize,
        dst: &mut [u8],
        device: bool,
    ) -> Result<(), Error> {
        let kind = if device {
            ffi::ACL_MEMCPY_DEVICE_TO_HOST
        } else {
            ffi::ACL_MEMCPY_HOST_TO_HOST
        };
        // SAFETY: the caller vouches for the source; `dst` is an exclusively borrowed slice.
        let rc = unsafe {
            (self.api.memcpy)(
                dst.as_mut_ptr().cast(),
                dst.len(),
                addr as *const c_void,
                dst.len(),
                kind,
            )
        };
        self.check("aclrtMemcpy", rc)
    }

    /// `aclrtCreateStream` under this thread's current context.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn create_stream(&self) -> Result<Stream, Error> {
        let mut s: *mut c_void = std::ptr::null_mut();
        // SAFETY: `s` is a valid out-pointer.
        let rc = unsafe { (self.api.create_stream)(&mut s) };
        self.check("aclrtCreateStream", rc)?;
        let raw = NonNull::new(s).ok_or_else(|| Error::Native {
            library: "acl",
            call: "aclrtCreateStream",
            code: 0,
            detail: "ACL_SUCCESS with a null stream".into(),
        })?;
        Ok(Stream {
            acl: self.clone(),
            raw,
            ctx: self.current_context().ok(),
        })
    }

    /// Destroys a stream now, reporting a failure (dropping destroys too, logging failures).
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn destroy_stream(&self, stream: Stream) -> Result<(), Error> {
        let stream = std::mem::ManuallyDrop::new(stream);
        let _guard = match stream.ctx {
            Some(c) => Some(self.enter(c)?),
            None => None,
        };
        // SAFETY: the stream came from aclrtCreateStream and is destroyed once (its Drop does
        // not run).
        let rc = unsafe { (self.api.destroy_stream)(stream.raw.as_ptr()) };
        // SAFETY: the field is read once from a value that is never used again.
        drop(unsafe { std::ptr::read(&stream.acl) });
        self.check("aclrtDestroyStream", rc)
    }

    /// `aclrtSynchronizeStreamWithTimeout`, under the stream's context. `op` and `peer` name
    /// the transfer for a timeout error.
    ///
    /// # Errors
    /// [`Error::Timeout`] (`TIMEOUT`) for `ACL_ERROR_RT_STREAM_SYNC_TIMEOUT` and the runtime's
    /// other timeout codes; [`Error::Native`] (`FAILED`) otherwise.
    pub(crate) fn synchronize(
        &self,
        stream: &Stream,
        timeout: Duration,
        op: &'static str,
        peer: &str,
    ) -> Result<(), Error> {
        let _guard = match stream.ctx {
            Some(c) => Some(self.enter(c)?),
            None => None,
        };
        let start = Instant::now();
        // SAFETY: the stream is alive (borrowed); the timeout is a plain value.
        let rc = unsafe {
            (self.api.synchronize_stream_with_timeout)(stream.raw.as_ptr(), timeout_ms(timeout))
        };
        if ffi::ACL_TIMEOUT_CODES.contains(&rc) {
            let _ = self.recent_message();
            return Err(Error::Timeout {
                op,
                peer: peer.to_owned(),
                elapsed: start.elapsed(),
            });
        }
        self.check("aclrtSynchronizeStreamWithTimeout", rc)
    }
}

/// A timeout in whole milliseconds for ACL: at least 1 (0 and -1 mean "wait forever" to some
/// ACL calls), rounded up, at most `i32::MAX`.
pub(crate) fn timeout_ms(t: Duration) -> i32 {
    let ms = t.as_nanos().div_ceil(1_000_000).max(1);
    i32::try_from(ms).unwrap_or(i32::MAX)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::Status;
    use crate::transport::ascend::double;
    use std::path::PathBuf;

    /// A private double instance with its own log file; removes both on drop.
    pub(crate) struct Fixture {
        pub(crate) so: PathBuf,
        pub(crate) log: PathBuf,
        pub(crate) acl: Acl,
    }

    impl Fixture {
        pub(crate) fn new(tag: &str) -> Self {
            let so = double::test_instance(tag);
            let log = so.with_extension("log");
            let _ = std::fs::remove_file(&log);
            let acl = Acl::load(Some(&so)).expect("load the double as ACL");
            double::control(&so, "log", Some(&log.to_string_lossy()));
            double::control(&so, "fail", Some(""));
            double::control(&so, "dir", Some(""));
            double::control(&so, "device_ip", Some(""));
            Self { so, log, acl }
        }

        pub(crate) fn fail(&self, what: &str) {
            double::control(&self.so, "fail", Some(what));
        }

        pub(crate) fn log_lines(&self) -> Vec<String> {
            std::fs::read_to_string(&self.log)
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect()
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.so);
            let _ = std::fs::remove_file(&self.log);
        }
    }

    #[test]
    fn device_context_and_memory_round_trip() {
        let f = Fixture::new("acl-basic");
        let acl = &f.acl;
        acl.init().unwrap();
        acl.init().expect("a repeated aclInit is fine");
        acl.set_device(3).unwrap();
        assert_eq!(acl.device().unwrap(), 3);
        let ctx = acl.current_context().unwrap();
        let buf = acl.malloc_device(4 << 20, MallocPolicy::HugeOnly).unwrap();
        assert_eq!(buf.addr() % ffi::HUGE_PAGE, 0, "HUGE_ONLY is 2 MiB aligned");
        assert_eq!(buf.len(), 4 << 20);
        acl.write(&buf, 10, b"hello ascend").unwrap();
        let mut back = [0u8; 12];
        acl.read(&buf, 10, &mut back).unwrap();
        assert_eq!(&back, b"hello ascend");
        let e = acl.write(&buf, (4 << 20) - 2, b"abc").unwrap_err();
        assert!(matches!(e, Error::RangeOutOfBounds { .. }), "{e:?}");
        let host = acl.malloc_host(4096).unwrap();
        assert!(host.is_host());
        acl.write(&host, 0, b"pinned").unwrap();
        let stream = acl.create_stream().unwrap();
        assert_eq!(stream.context(), Some(ctx));
        acl.synchronize(&stream, Duration::from_millis(100), "WRITE", "peer")
            .unwrap();
        acl.destroy_stream(stream).unwrap();
        buf.free().unwrap();
        drop(host);
        acl.reset_device(3).unwrap();
        acl.finalize().unwrap();
        let log = f.log_lines();
        assert!(
            log.iter()
                .any(|l| l.starts_with("aclrtMalloc size=4194304 policy=1 ")),
            "{log:#?}"
        );
        assert!(
            log.iter()
                .any(|l| l.starts_with("aclrtFreeHost ") && l.ends_with("rc=0"))
        );
        assert!(
            log.iter()
                .any(|l| l.starts_with("aclrtDestroyStream ") && l.ends_with("rc=0"))
        );
    }

    #[test]
    fn calls_without_a_context_fail_and_guards_switch_and_restore() {
        let f = Fixture::new("acl-ctx");
        let acl = f.acl.clone();
        acl.init().unwrap();
        acl.set_device(1).unwrap();
        let ctx = acl.current_context().unwrap();
        let buf = std::thread::scope(|s| {
            s.spawn(|| {
                // a fresh thread has no current context
                let e = acl
                    .malloc_device(4096, MallocPolicy::HugeFirst)
                    .unwrap_err();
                match &e {
                    Error::Native {
                        library: "acl",
                        call: "aclrtMalloc",
                        code,
                        detail,
                    } => {
                        assert_eq!(*code, 107_002);
                        assert!(detail.starts_with("ACL_ERROR_RT_CONTEXT_NULL"), "{detail}");
                        assert!(detail.contains("without a current context"), "{detail}");
                    }
                    other => panic!("wrong error {other:?}"),
                }
                assert_eq!(e.status(), Status::FAILED);
                let guard = acl.enter(ctx).unwrap();
                let buf = acl.malloc_device(4096, MallocPolicy::HugeFirst).unwrap();
                drop(guard);
                buf
            })
            .join()
            .unwrap()
        });
        // freed on this thread, under the context it remembers
        drop(buf);
        let log = f.log_lines();
        let sets = log
            .iter()
            .filter(|l| l.starts_with("aclrtSetCurrentContext ctx=") && l.ends_with("rc=0"))
            .count();
        assert!(sets >= 1, "{log:#?}");
        assert!(
            log.iter()
                .any(|l| l.starts_with("aclrtFree ") && l.ends_with("rc=0"))
        );
    }

    #[test]
    fn injected_failures_map_to_hixl_statuses() {
        let f = Fixture::new("acl-fail");
        let acl = &f.acl;
        acl.init().unwrap();
        acl.set_device(0).unwrap();
        f.fail("aclrtMalloc");
        let e = acl
            .malloc_device(1 << 20, MallocPolicy::HugeOnly)
            .unwrap_err();
        match &e {
            Error::Native {
                library,
                call,
                code,
                detail,
            } => {
                assert_eq!(*library, "acl");
                assert_eq!(*call, "aclrtMalloc");
                assert_eq!(*code, 207_001);
                assert!(
                    detail.starts_with("ACL_ERROR_RT_MEMORY_ALLOCATION: "),
                    "{detail}"
                );
                assert!(detail.contains("injected failure"), "{detail}");
            }
            other => panic!("wrong error {other:?}"),
        }
        assert_eq!(e.status(), Status::FAILED);
        assert_eq!(e.status().code(), 503_900);

        f.fail("sync_timeout");
        let stream = acl.create_stream().unwrap();
        let e = acl
            .synchronize(&stream, Duration::from_millis(5), "WRITE", "10.0.0.2:16000")
            .unwrap_err();
        assert!(
            matches!(&e, Error::Timeout { op: "WRITE", peer, .. } if peer == "10.0.0.2:16000"),
            "{e:?}"
        );
        assert_eq!(e.status(), Status::TIMEOUT);
        assert_eq!(e.status().code(), 103_901);
        for code in [107_019, 107_020, 207_020] {
            f.fail(&format!("aclrtSynchronizeStreamWithTimeout={code}"));
            let e = acl
                .synchronize(&stream, Duration::from_millis(5), "READ", "p")
                .unwrap_err();
            assert_eq!(e.status(), Status::TIMEOUT, "{code}: {e:?}");
        }
        f.fail("aclrtSynchronizeStreamWithTimeout=507899");
        let e = acl
            .synchronize(&stream, Duration::from_millis(5), "READ", "p")
            .unwrap_err();
        assert!(matches!(&e, Error::Native { code: 507_899, .. }), "{e:?}");
        assert_eq!(e.status(), Status::FAILED);
        f.fail("");
        drop(stream);
        let log = f.log_lines();
        assert!(
            log.iter()
                .any(|l| l.starts_with("aclrtSynchronizeStreamWithTimeout ")
                    && l.ends_with("rc=507046")),
            "{log:#?}"
        );
    }

    #[test]
    fn a_misaligned_huge_only_allocation_is_refused_and_freed() {
        let f = Fixture::new("acl-align");
        let acl = &f.acl;
        acl.init().unwrap();
        acl.set_device(0).unwrap();
        f.fail("misalign");
        let e = acl
            .malloc_device(2 << 20, MallocPolicy::HugeOnly)
            .unwrap_err();
        assert!(
            matches!(&e, Error::Native { call: "aclrtMalloc", code: 200_003, detail, .. } if detail.contains("2 MiB")),
            "{e:?}"
        );
        // not a multiple of 2 MiB: no alignment promise to check
        let odd = acl.malloc_device(3 << 19, MallocPolicy::HugeOnly).unwrap();
        drop(odd);
        // other policies make no alignment promise
        let normal = acl.malloc_device(2 << 20, MallocPolicy::HugeFirst).unwrap();
        drop(normal);
        let log = f.log_lines();
        let frees = log
            .iter()
            .filter(|l| l.starts_with("aclrtFree ") && l.ends_with("rc=0"))
            .count();
        assert_eq!(frees, 3, "the refused allocation was freed too: {log:#?}");
    }

    #[test]
    fn timeouts_round_up_to_whole_milliseconds() {
        assert_eq!(timeout_ms(Duration::ZERO), 1);
        assert_eq!(timeout_ms(Duration::from_micros(1)), 1);
        assert_eq!(timeout_ms(Duration::from_micros(1500)), 2);
        assert_eq!(timeout_ms(Duration::from_secs(3)), 3000);
        assert_eq!(timeout_ms(Duration::from_secs(u64::MAX)), i32::MAX);
        assert!(MallocPolicy::HugeOnly.huge_only());
        assert!(MallocPolicy::HugeOnlyP2p.huge_only());
        assert!(!MallocPolicy::Raw(0x1000).huge_only());
        assert!(MallocPolicy::Raw(0x1001).huge_only());
    }
}
