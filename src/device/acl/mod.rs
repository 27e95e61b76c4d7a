//! The device floor's result level (cudarc's `result`): thin wrappers over the ACL runtime's
//! table (`device/sys/acl.rs`), every call a `Result` through one check ([`Acl::check`]):
//! devices, contexts, memory, streams, virtual memory.
//!
//! Every failure becomes an [`Error`]: a stream-sync timeout is [`Error::Timeout`] (`TIMEOUT`),
//! anything else [`Error::Native`] with `library: "acl"`, the code, its header name and
//! `aclGetRecentErrMsg` (`FAILED`). ACL keeps the current context per thread; allocations and
//! streams remember the context they were made in, and release themselves under it.
//!
//! Files: `memory` (device and pinned host memory, [`AclBuffer`], and copies), `stream`
//! (streams, [`Stream`]: create, synchronise, abort), `vmm` (virtual memory: reservations,
//! physical memory, mappings, fabric handles, and async device-to-device copies); this file has
//! the loaded runtime, its errors, devices and contexts.

mod memory;
mod stream;
mod vmm;

use std::ffi::{CStr, c_void};
use std::marker::PhantomData;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use crate::device::sys::acl::{self as sys, AclApi, AclError};
use crate::error::Error;

pub(crate) use self::memory::{AclBuffer, check_range};
pub(crate) use self::stream::Stream;
pub(crate) use self::vmm::VMM_GRANULE;
/// The ACL types and constants the floors above name (the table itself is the device floor's).
pub(crate) use crate::device::sys::acl::{
    ACL_DEV_ATTR_SUPER_POD_DEVICE_ID, ACL_DEV_ATTR_SUPER_POD_ID, ACL_ERROR_RT_CONTEXT_NULL,
    MemLocation,
};

/// `aclrtMemMallocPolicy` values hixl uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MallocPolicy {
    /// `ACL_MEM_MALLOC_HUGE_FIRST`.
    #[cfg(test)]
    HugeFirst,
    /// `ACL_MEM_MALLOC_HUGE_ONLY`: 2 MiB pages; required for memory registered for HCCS.
    HugeOnly,
    /// `ACL_MEM_MALLOC_HUGE_ONLY_P2P`.
    #[cfg(test)]
    HugeOnlyP2p,
    /// Any raw policy value (e.g. `HIGH_BAND_WIDTH | HUGE_FIRST`, as HIXL's buffer pool uses).
    #[cfg(test)]
    Raw(u32),
}

impl MallocPolicy {
    /// The C enum value.
    pub(crate) fn raw(self) -> u32 {
        match self {
            #[cfg(test)]
            Self::HugeFirst => sys::ACL_MEM_MALLOC_HUGE_FIRST,
            Self::HugeOnly => sys::ACL_MEM_MALLOC_HUGE_ONLY,
            #[cfg(test)]
            Self::HugeOnlyP2p => sys::ACL_MEM_MALLOC_HUGE_ONLY_P2P,
            #[cfg(test)]
            Self::Raw(v) => v,
        }
    }

    /// Whether the allocation must come from 2 MiB huge pages.
    pub(crate) fn huge_only(self) -> bool {
        matches!(
            self.raw() & 0xff,
            sys::ACL_MEM_MALLOC_HUGE_ONLY | sys::ACL_MEM_MALLOC_HUGE_ONLY_P2P
        )
    }
}

/// A loaded ACL runtime. Cheap to clone (shared).
#[derive(Clone, Debug)]
pub(crate) struct Acl {
    /// The function table.
    pub(super) api: Arc<AclApi>,
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

impl Acl {
    /// The ACL runtime (see [`AclApi::load`] for the search order): loaded once per process,
    /// shared by every `Acl` from then on.
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`].
    pub(crate) fn load(path: Option<&Path>) -> Result<Self, Error> {
        Ok(Self {
            api: AclApi::load(path)?,
        })
    }

    /// Whether `other` calls the same table (the same loaded library).
    #[cfg(test)]
    pub(crate) fn same_table(&self, other: &Acl) -> bool {
        Arc::ptr_eq(&self.api, &other.api)
    }

    /// How many times this process opened the ACL library `name` (once, however often and
    /// from wherever it is loaded).
    #[cfg(test)]
    pub(crate) fn opened(name: &str) -> usize {
        AclApi::opened(name)
    }

    /// The name the library was opened by.
    pub(crate) fn library(&self) -> &str {
        self.api.library()
    }

    /// The latest `aclGetRecentErrMsg` text, if any.
    pub(super) fn recent_message(&self) -> Option<String> {
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
        let name = sys::acl_error_name(code);
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

    /// `Ok` for `ACL_SUCCESS`, else [`error`](Self::error).
    pub(super) fn check(&self, call: &'static str, code: AclError) -> Result<(), Error> {
        if code == sys::ACL_SUCCESS {
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
        if rc == sys::ACL_ERROR_REPEAT_INITIALIZE {
            return Ok(());
        }
        self.check("aclInit", rc)
    }

    /// `aclFinalize()`.
    ///
    /// # Errors
    /// [`Error::Native`].
    #[cfg(test)]
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
    #[cfg(test)]
    pub(crate) fn reset_device(&self, device: i32) -> Result<(), Error> {
        // SAFETY: plain integer argument.
        let rc = unsafe { (self.api.reset_device)(device) };
        self.check("aclrtResetDevice", rc)
    }

    /// `aclrtGetDevice`: the device of this thread's current context.
    ///
    /// # Errors
    /// [`Error::Native`] (`ACL_ERROR_RT_CONTEXT_NULL` without a context).
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
            code: i64::from(sys::ACL_ERROR_RT_CONTEXT_NULL),
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

    /// [`enter`](Self::enter) `ctx` if there is one (memory and streams made without a current
    /// context have none).
    ///
    /// # Errors
    /// As [`enter`](Self::enter).
    pub(crate) fn enter_if(&self, ctx: Option<Context>) -> Result<Option<ContextGuard>, Error> {
        ctx.map(|c| self.enter(c)).transpose()
    }
}

/// A timeout in whole milliseconds for ACL: at least 1 (0 and -1 mean "wait forever" to some
/// ACL calls), rounded up, at most `i32::MAX`.
pub(crate) fn timeout_ms(t: Duration) -> i32 {
    let ms = t.as_nanos().div_ceil(1_000_000).max(1);
    i32::try_from(ms).unwrap_or(i32::MAX)
}

#[cfg(test)]
pub(crate) mod tests;
