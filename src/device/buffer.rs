//! The engine's device memory handed to the caller: device memory ([`DeviceBuffer`],
//! `aclrtMalloc`) and pinned host memory ([`PinnedHostBuffer`], `aclrtMallocHost`), both
//! allocated and copied under a [`ContextToken`] and registrable with the engine.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use super::Device;
use super::acl::{Acl, AclBuffer, MallocPolicy};
use super::context::ContextToken;
use crate::error::Error;
use crate::types::MemType;
use crate::types::raw::{RawMemory, RegistrableMemory};

/// [`Error::ForeignHandle`] unless `ctx` is a token of `engine`.
fn check_token(engine: u64, ctx: &ContextToken<'_>) -> Result<(), Error> {
    if ctx.engine_id() != engine {
        return Err(Error::ForeignHandle {
            what: "context token",
            owner: ctx.engine_id(),
            engine,
        });
    }
    Ok(())
}

/// The checks before an allocation: `ctx` is `engine`'s token, and `len` is not zero.
fn check_alloc(engine: u64, ctx: &ContextToken<'_>, len: usize) -> Result<(), Error> {
    check_token(engine, ctx)?;
    if len == 0 {
        return Err(Error::ZeroLengthRegion);
    }
    Ok(())
}

/// The `Debug` fields both buffers show: the address (hex) and the length.
fn debug_buf<'a, 'b>(
    f: &'a mut fmt::Formatter<'b>,
    name: &str,
    buf: &AclBuffer,
) -> fmt::DebugStruct<'a, 'b> {
    let mut d = f.debug_struct(name);
    d.field("addr", &format_args!("{:#x}", buf.addr()))
        .field("len", &buf.len());
    d
}

/// Device memory (`aclrtMalloc`) of an Ascend engine, allocated with
/// [`Hixl::alloc_device`](crate::Hixl::alloc_device).
///
/// Allocated `ACL_MEM_MALLOC_HUGE_ONLY` (HCCS links need huge pages, and hixl cannot know at
/// allocation time which links will use a buffer); a length that is a multiple of 2 MiB gets a
/// 2 MiB aligned address, or the allocation fails. Device memory is never a host slice: copy
/// with [`DeviceBuffer::write`] and [`DeviceBuffer::read`] (`aclrtMemcpy`). Register it with
/// [`Hixl::register_device`](crate::Hixl::register_device).
pub struct DeviceBuffer {
    buf: AclBuffer,
    engine: u64,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_buf(f, "DeviceBuffer", &self.buf)
            .field("engine", &self.engine)
            .finish()
    }
}

impl DeviceBuffer {
    pub(crate) fn alloc(
        dev: &Device,
        engine: u64,
        ctx: &ContextToken<'_>,
        len: usize,
    ) -> Result<Self, Error> {
        check_alloc(engine, ctx, len)?;
        let buf = dev.acl.malloc_device(len, MallocPolicy::HugeOnly)?;
        Ok(Self { buf, engine })
    }
    /// The device address.
    pub fn addr(&self) -> usize {
        self.buf.addr()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    /// Always false: empty buffers cannot be allocated.
    pub fn is_empty(&self) -> bool {
        self.buf.len() == 0
    }
    /// The engine it was allocated by.
    pub fn engine_id(&self) -> u64 {
        self.engine
    }
    /// Copies `data` into the buffer at `offset` (`aclrtMemcpy`, host to device).
    ///
    /// # Errors
    /// [`Error::ForeignHandle`] for a token of another engine; [`Error::RangeOutOfBounds`];
    /// [`Error::Native`].
    pub fn write(
        &mut self,
        ctx: &ContextToken<'_>,
        offset: usize,
        data: &[u8],
    ) -> Result<(), Error> {
        self.token(ctx)?;
        let acl = self.buf_acl();
        acl.write(&self.buf, offset, data)
    }
    /// Copies from the buffer at `offset` into `buf` (`aclrtMemcpy`, device to host).
    ///
    /// # Errors
    /// As [`DeviceBuffer::write`].
    pub fn read(&self, ctx: &ContextToken<'_>, offset: usize, buf: &mut [u8]) -> Result<(), Error> {
        self.token(ctx)?;
        self.buf_acl().read(&self.buf, offset, buf)
    }
    fn token(&self, ctx: &ContextToken<'_>) -> Result<(), Error> {
        check_token(self.engine, ctx)
    }
    fn buf_acl(&self) -> &Acl {
        self.buf.acl()
    }
}

/// Pinned host memory (`aclrtMallocHost`) of an Ascend engine, allocated with
/// [`Hixl::alloc_pinned_host`](crate::Hixl::alloc_pinned_host). Host memory: while you own it,
/// it is an ordinary byte slice.
pub struct PinnedHostBuffer {
    buf: AclBuffer,
}

impl fmt::Debug for PinnedHostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_buf(f, "PinnedHostBuffer", &self.buf).finish()
    }
}

impl PinnedHostBuffer {
    pub(crate) fn alloc(
        dev: &Device,
        engine: u64,
        ctx: &ContextToken<'_>,
        len: usize,
    ) -> Result<Self, Error> {
        check_alloc(engine, ctx, len)?;
        let buf = dev.acl.malloc_host(len)?;
        // SAFETY: `aclrtMallocHost` returned `len` bytes of host memory owned by `buf`; they are
        // zeroed through the raw pointer before any `&[u8]` to them exists (a slice over
        // uninitialised bytes would be UB).
        unsafe { std::ptr::write_bytes(buf.as_ptr().cast::<u8>(), 0, buf.len()) };
        Ok(Self { buf })
    }
}

impl Deref for PinnedHostBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `aclrtMallocHost` returned `len` bytes of host memory owned by `self`
        // (zeroed at allocation, so initialised); nothing else references them while owned.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast::<u8>(), self.buf.len()) }
    }
}

impl DerefMut for PinnedHostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_ptr().cast::<u8>(), self.buf.len()) }
    }
}

/// Boxes the buffer so its raw parts fit in [`RawMemory`] (the box pointer is the extra word).
fn boxed_parts<T>(
    value: T,
    ptr: *mut std::ffi::c_void,
    len: usize,
    mem_type: MemType,
) -> RawMemory {
    let ptr = NonNull::new(ptr.cast::<u8>()).expect("ACL allocations are non-null");
    let extra = Box::into_raw(Box::new(value)) as usize;
    RawMemory::new(ptr, len, extra, mem_type)
}

// SAFETY: the buffer (with its allocation) moves into a box that only `from_raw_parts` takes
// back, so nothing frees or touches the memory meanwhile; the memory type is what ACL allocated
// (`aclrtMalloc`: device). hixl never dereferences `MemType::Device` memory: it only hands its
// addresses to ACL/HCCL.
unsafe impl RegistrableMemory for DeviceBuffer {
    fn into_raw_parts(self) -> RawMemory {
        let (p, len) = (self.buf.as_ptr(), self.buf.len());
        boxed_parts(self, p, len, MemType::Device)
    }
    unsafe fn from_raw_parts(raw: RawMemory) -> Self {
        // SAFETY: the extra word is the box made by `into_raw_parts`, taken back once.
        *unsafe { Box::from_raw(raw.extra() as *mut DeviceBuffer) }
    }
}

// SAFETY: as for DeviceBuffer; `aclrtMallocHost` memory is host memory, valid for reads and
// writes of any bytes.
unsafe impl RegistrableMemory for PinnedHostBuffer {
    fn into_raw_parts(self) -> RawMemory {
        let (p, len) = (self.buf.as_ptr(), self.buf.len());
        boxed_parts(self, p, len, MemType::Host)
    }
    unsafe fn from_raw_parts(raw: RawMemory) -> Self {
        // SAFETY: the extra word is the box made by `into_raw_parts`, taken back once.
        *unsafe { Box::from_raw(raw.extra() as *mut PinnedHostBuffer) }
    }
}
