//! The UCP context ([`Context`]) and the memory it registers for remote access ([`MemHandle`]).

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use super::{check, ucs_error};
use crate::error::Error;
use crate::sync::lock;
use crate::transport::ucx::ffi::{self, Ucp};

/// The shared state of a [`Context`].
pub(super) struct ContextInner {
    /// The function table.
    pub(super) ucp: &'static Ucp,
    /// The UCP context.
    pub(super) h: ffi::ucp_context_h,
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
    pub(super) inner: Arc<ContextInner>,
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

    /// Whether `other` is this very context (not a clone of another).
    pub(crate) fn same(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
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
    pub(super) memh: ffi::ucp_mem_h,
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
