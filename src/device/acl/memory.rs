//! ACL memory: device (`aclrtMalloc`) and pinned host (`aclrtMallocHost`) allocations as
//! [`AclBuffer`]s, freed under their context, and the `aclrtMemcpy` copies in and out.

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;

use super::{Acl, Context, MallocPolicy};
use crate::device::sys::acl as sys;
use crate::error::Error;

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
    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    /// Whether it is pinned host memory (`aclrtMallocHost`).
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
        let (acl, ptr, host, ctx) = take_apart!(self => acl, ptr, host, ctx);
        acl.release_buffer(ptr, host, ctx)
    }
}

impl Drop for AclBuffer {
    fn drop(&mut self) {
        if let Err(e) = self.acl.release_buffer(self.ptr, self.host, self.ctx) {
            tracing::warn!("leaking ACL memory at {:#x}: {e}", self.addr());
        }
    }
}

impl Acl {
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
            && len.is_multiple_of(sys::HUGE_PAGE)
            && !buf.addr().is_multiple_of(sys::HUGE_PAGE)
        {
            let addr = buf.addr();
            if let Err(e) = buf.free() {
                tracing::warn!("cannot free a misaligned ACL allocation: {e}");
            }
            return Err(Error::Native {
                library: "acl",
                call: "aclrtMalloc",
                code: i64::from(sys::ACL_ERROR_MEMORY_ADDRESS_UNALIGNED),
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
        let _guard = self.enter_if(ctx)?;
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

    /// `aclrtMemcpy(dst, dst_max, src, count, kind)`.
    ///
    /// # Safety
    /// `dst..dst + dst_max` must be writable and `src..src + count` readable memory of the kinds
    /// `kind` names, both live for the call, with no Rust reference to the destination.
    unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        dst_max: usize,
        src: *const c_void,
        count: usize,
        kind: c_int,
    ) -> Result<(), Error> {
        // SAFETY: the caller vouches for both ranges.
        let rc = unsafe { (self.api.memcpy)(dst, dst_max, src, count, kind) };
        self.check("aclrtMemcpy", rc)
    }

    /// Copies `src` into `buf` at `offset` (`aclrtMemcpy`, host to device or host to host).
    /// (The engine's buffers copy through `memory.rs`'s one device-memory type.)
    ///
    /// # Errors
    /// [`Error::RangeOutOfBounds`] if the range does not fit; [`Error::Native`].
    #[cfg(test)]
    pub(crate) fn write(&self, buf: &AclBuffer, offset: usize, src: &[u8]) -> Result<(), Error> {
        check_range(offset, src.len(), buf.len)?;
        // SAFETY: the destination range lies inside the allocation (checked above), which is
        // alive for the call; `src` is a valid slice of `src.len()` bytes.
        unsafe {
            self.memcpy(
                buf.ptr.as_ptr().cast::<u8>().add(offset).cast(),
                buf.len - offset,
                src.as_ptr().cast(),
                src.len(),
                copy_to(!buf.host),
            )
        }
    }

    /// Copies from `buf` at `offset` into `dst` (`aclrtMemcpy`, device to host or host to host).
    ///
    /// # Errors
    /// [`Error::RangeOutOfBounds`] if the range does not fit; [`Error::Native`].
    #[cfg(test)]
    pub(crate) fn read(&self, buf: &AclBuffer, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        check_range(offset, dst.len(), buf.len)?;
        // SAFETY: the source range lies inside the live allocation (checked above); `dst` is an
        // exclusively borrowed slice of `dst.len()` bytes.
        unsafe {
            self.memcpy(
                dst.as_mut_ptr().cast(),
                dst.len(),
                buf.ptr.as_ptr().cast::<u8>().add(offset).cast(),
                dst.len(),
                copy_from(!buf.host),
            )
        }
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
        // SAFETY: the caller vouches for the destination; `src` is a valid slice.
        unsafe {
            self.memcpy(
                addr as *mut c_void,
                src.len(),
                src.as_ptr().cast(),
                src.len(),
                copy_to(device),
            )
        }
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
        // SAFETY: the caller vouches for the source; `dst` is an exclusively borrowed slice.
        unsafe {
            self.memcpy(
                dst.as_mut_ptr().cast(),
                dst.len(),
                addr as *const c_void,
                dst.len(),
                copy_from(device),
            )
        }
    }
}

/// `Ok` when `offset..offset + len` lies inside memory of `region_len` bytes, else
/// [`Error::RangeOutOfBounds`]: the range check of every copy into or out of the engine's
/// memory (its buffers', and the raw ones').
///
/// # Errors
/// As said.
pub(crate) fn check_range(offset: usize, len: usize, region_len: usize) -> Result<(), Error> {
    match offset.checked_add(len) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(Error::RangeOutOfBounds {
            region: 0,
            offset: offset as u64,
            len: len as u64,
            region_len: region_len as u64,
        }),
    }
}

/// The `aclrtMemcpyKind` of a copy from the host into device memory (`device`) or host memory.
fn copy_to(device: bool) -> c_int {
    if device {
        sys::ACL_MEMCPY_HOST_TO_DEVICE
    } else {
        sys::ACL_MEMCPY_HOST_TO_HOST
    }
}

/// The `aclrtMemcpyKind` of a copy from device memory (`device`) or host memory to the host.
fn copy_from(device: bool) -> c_int {
    if device {
        sys::ACL_MEMCPY_DEVICE_TO_HOST
    } else {
        sys::ACL_MEMCPY_HOST_TO_HOST
    }
}
