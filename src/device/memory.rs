//! The device floor's safe level (cudarc's `safe`): the engine's memory handed to the caller,
//! three kinds over one device-memory type ([`DeviceMem`]: the engine's token, the range check
//! and the copies in and out, written once):
//!
//! - [`DeviceBuffer`]: device memory (`aclrtMalloc`, huge pages);
//! - [`PinnedHostBuffer`]: pinned host memory (`aclrtMallocHost`), a byte slice while owned;
//! - [`FabricBuffer`]: fabric memory (ACL virtual memory of the allocator statics, HIXL's
//!   `MallocMem`, `fabric.rs`) of a fabric-memory engine.
//!
//! Each is allocated under a [`ContextToken`] of its engine and registrable with it.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use super::Device;
use super::acl::{Acl, AclBuffer, ContextGuard, MallocPolicy, check_range};
use super::context::ContextToken;
use super::fabric;
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

/// The accessors and copies of a buffer kind that are its [`DeviceMem`]'s (`mem`), with the
/// kind's own words for them.
macro_rules! buffer_api {
    ($ty:ident, addr: $addr:literal, len: $len:literal, write: $write:literal, read: $read:literal $(,)?) => {
        impl $ty {
            #[doc = $addr]
            pub fn addr(&self) -> usize {
                self.mem.addr()
            }
            #[doc = $len]
            pub fn len(&self) -> usize {
                self.mem.len()
            }
            /// Always false: empty buffers cannot be allocated.
            pub fn is_empty(&self) -> bool {
                self.mem.len() == 0
            }
            #[doc = $write]
            ///
            /// # Errors
            /// [`Error::ForeignHandle`] for a token of another engine;
            /// [`Error::RangeOutOfBounds`]; [`Error::Native`].
            pub fn write(
                &mut self,
                ctx: &ContextToken<'_>,
                offset: usize,
                data: &[u8],
            ) -> Result<(), Error> {
                self.mem.write(ctx, offset, data)
            }
            #[doc = $read]
            ///
            /// # Errors
            /// As [`write`](Self::write).
            pub fn read(
                &self,
                ctx: &ContextToken<'_>,
                offset: usize,
                buf: &mut [u8],
            ) -> Result<(), Error> {
                self.mem.read(ctx, offset, buf)
            }
        }
    };
}

/// The allocation under a [`DeviceMem`], released when it drops.
enum Owner {
    /// `aclrtMalloc` (device) or `aclrtMallocHost` (host) memory, freed under the context it
    /// was made in.
    Acl(AclBuffer),
    /// VMM memory of the allocator statics, freed (`FreeMem`) under the engine's context.
    Vmm(Vmm),
}

/// A [`fabric::malloc_with`] allocation (`len` as asked, the allocation rounded up), freed
/// with [`fabric::free_buffer`] when dropped (the public [`fabric::free_mem`] refuses it).
struct Vmm {
    addr: usize,
    len: usize,
    mem_type: MemType,
    device: Arc<Device>,
}

impl Drop for Vmm {
    fn drop(&mut self) {
        let g = self.device.enter();
        if let Err(e) = fabric::free_buffer(self.addr) {
            tracing::warn!("freeing fabric memory failed: {e}");
        }
        drop(g);
    }
}

/// One allocation of an engine's memory and the engine it is of: the token check, the range
/// check and the copies of the three buffer kinds.
pub(crate) struct DeviceMem {
    owner: Owner,
    engine: u64,
}

/// What a [`DeviceMem`] is allocated as: the three buffer kinds.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Alloc {
    /// Device memory: `aclrtMalloc` (`ACL_MEM_MALLOC_HUGE_ONLY`), a [`DeviceBuffer`].
    Device,
    /// Pinned host memory: `aclrtMallocHost`, zeroed, a [`PinnedHostBuffer`].
    PinnedHost,
    /// Fabric memory of this type (ACL's VMM, HIXL's `MallocMem`), a [`FabricBuffer`].
    Fabric(MemType),
}

impl DeviceMem {
    /// `len` bytes of `engine`'s memory on `device` under its token `ctx`, as `kind` says:
    /// the one allocation of every buffer kind, after the one check ([`check_alloc`]).
    pub(crate) fn alloc(
        device: &Arc<Device>,
        engine: u64,
        ctx: &ContextToken<'_>,
        len: usize,
        kind: Alloc,
    ) -> Result<Self, Error> {
        check_alloc(engine, ctx, len)?;
        let acl = &device.acl;
        let owner = match kind {
            Alloc::Device => Owner::Acl(acl.malloc_device(len, MallocPolicy::HugeOnly)?),
            Alloc::PinnedHost => {
                let buf = acl.malloc_host(len)?;
                // SAFETY: `aclrtMallocHost` returned `buf.len()` bytes of host memory owned by
                // `buf`, not registered yet (no peer reaches it); they are zeroed through the
                // raw pointer before any `&[u8]` to them exists (a slice over uninitialised
                // bytes would be UB).
                unsafe { std::ptr::write_bytes(buf.addr() as *mut u8, 0, buf.len()) };
                Owner::Acl(buf)
            }
            Alloc::Fabric(mem_type) => {
                acl.check_vmm()?;
                let _g = device.enter()?;
                let addr = fabric::malloc_with(acl, mem_type, len, fabric::Holder::Buffer)?;
                Owner::Vmm(Vmm {
                    addr,
                    len,
                    mem_type,
                    device: device.clone(),
                })
            }
        };
        Ok(Self { owner, engine })
    }

    fn addr(&self) -> usize {
        match &self.owner {
            Owner::Acl(b) => b.addr(),
            Owner::Vmm(v) => v.addr,
        }
    }

    fn len(&self) -> usize {
        match &self.owner {
            Owner::Acl(b) => b.len(),
            Owner::Vmm(v) => v.len,
        }
    }

    fn mem_type(&self) -> MemType {
        match &self.owner {
            Owner::Acl(b) if b.is_host() => MemType::Host,
            Owner::Acl(_) => MemType::Device,
            Owner::Vmm(v) => v.mem_type,
        }
    }

    fn acl(&self) -> &Acl {
        match &self.owner {
            Owner::Acl(b) => b.acl(),
            Owner::Vmm(v) => &v.device.acl,
        }
    }

    /// Before a copy of `n` bytes at `offset`: `ctx` is the engine's token and the range lies
    /// inside; its address, and the engine's context entered where the copy needs it (VMM
    /// memory is copied under it, as it was allocated; ACL's allocations under the token's,
    /// which is the engine's).
    fn before_copy(
        &self,
        ctx: &ContextToken<'_>,
        offset: usize,
        n: usize,
    ) -> Result<(usize, Option<ContextGuard>), Error> {
        check_token(self.engine, ctx)?;
        check_range(offset, n, self.len())?;
        let guard = match &self.owner {
            Owner::Acl(_) => None,
            Owner::Vmm(v) => Some(v.device.enter()?),
        };
        Ok((self.addr() + offset, guard))
    }

    /// Copies `data` in at `offset` (`aclrtMemcpy`, host to device for device memory).
    fn write(&mut self, ctx: &ContextToken<'_>, offset: usize, data: &[u8]) -> Result<(), Error> {
        let (at, _g) = self.before_copy(ctx, offset, data.len())?;
        // SAFETY: `at..at + data.len()` lies inside this live allocation (checked above), which
        // is exclusively borrowed: no peer writes it (it is not registered while owned) and no
        // Rust reference to it exists.
        unsafe {
            self.acl()
                .write_raw(at, data, self.mem_type() == MemType::Device)
        }
    }

    /// Copies out from `offset` into `buf` (`aclrtMemcpy`, device to host for device memory).
    fn read(&self, ctx: &ContextToken<'_>, offset: usize, buf: &mut [u8]) -> Result<(), Error> {
        let (at, _g) = self.before_copy(ctx, offset, buf.len())?;
        // SAFETY: as in `write`; the source is only read.
        unsafe {
            self.acl()
                .read_raw(at, buf, self.mem_type() == MemType::Device)
        }
    }

    /// The `Debug` fields every buffer shows: the address (hex) and the length.
    fn debug<'a, 'b>(&self, f: &'a mut fmt::Formatter<'b>, name: &str) -> fmt::DebugStruct<'a, 'b> {
        let mut d = f.debug_struct(name);
        d.field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len());
        d
    }

    /// Boxes `owner` (the buffer holding this memory) so its raw parts fit in [`RawMemory`]
    /// (the box pointer is the extra word).
    fn into_raw_parts<T>(owner: T, mem: impl FnOnce(&T) -> &DeviceMem) -> RawMemory {
        let m = mem(&owner);
        let (addr, len, mem_type) = (m.addr(), m.len(), m.mem_type());
        let ptr = NonNull::new(addr as *mut u8).expect("ACL allocations are non-null");
        let extra = Box::into_raw(Box::new(owner)) as usize;
        RawMemory::new(ptr, len, extra, mem_type)
    }

    /// The buffer [`into_raw_parts`](Self::into_raw_parts) boxed.
    ///
    /// # Safety
    /// `raw` came from `into_raw_parts` with a `T`, and is taken back once.
    unsafe fn from_raw_parts<T>(raw: RawMemory) -> T {
        // SAFETY: the extra word is the box made by `into_raw_parts`, taken back once.
        *unsafe { Box::from_raw(raw.extra() as *mut T) }
    }
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
    mem: DeviceMem,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.mem
            .debug(f, "DeviceBuffer")
            .field("engine", &self.mem.engine)
            .finish()
    }
}

impl DeviceBuffer {
    /// The engine it was allocated by.
    pub fn engine_id(&self) -> u64 {
        self.mem.engine
    }
}

buffer_api! {
    DeviceBuffer,
    addr: "The device address.",
    len: "Length in bytes.",
    write: "Copies `data` into the buffer at `offset` (`aclrtMemcpy`, host to device).",
    read: "Copies from the buffer at `offset` into `buf` (`aclrtMemcpy`, device to host).",
}

/// Pinned host memory (`aclrtMallocHost`) of an Ascend engine, allocated with
/// [`Hixl::alloc_pinned_host`](crate::Hixl::alloc_pinned_host). Host memory: while you own it,
/// it is an ordinary byte slice.
pub struct PinnedHostBuffer {
    mem: DeviceMem,
}

impl fmt::Debug for PinnedHostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.mem.debug(f, "PinnedHostBuffer").finish()
    }
}

impl Deref for PinnedHostBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `aclrtMallocHost` returned `len` bytes of host memory owned by `self`
        // (zeroed at allocation, so initialised); nothing else references them while owned.
        unsafe { std::slice::from_raw_parts(self.mem.addr() as *const u8, self.mem.len()) }
    }
}

impl DerefMut for PinnedHostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.mem.addr() as *mut u8, self.mem.len()) }
    }
}

/// VMM memory (`aclrtMallocPhysical` + `aclrtReserveMemAddress` + `aclrtMapMem`, HIXL's
/// `MallocMem`) of a fabric-memory engine, allocated with
/// [`Hixl::alloc_fabric`](crate::Hixl::alloc_fabric) on the engine's device and freed when
/// dropped (`FreeMem`; [`free_mem`](crate::fabric::free_mem) of its address is `PARAM_INVALID`:
/// only the drop frees it). Register it with [`Hixl::register_device`](crate::Hixl::register_device):
/// peers then map its physical memory. Never a host slice (device memory, or host memory the
/// device maps): copy with [`FabricBuffer::write`] and [`FabricBuffer::read`] (`aclrtMemcpy`).
pub struct FabricBuffer {
    mem: DeviceMem,
}

impl fmt::Debug for FabricBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.mem
            .debug(f, "FabricBuffer")
            .field("mem_type", &self.mem.mem_type())
            .field("engine", &self.mem.engine)
            .finish()
    }
}

impl FabricBuffer {
    /// Device or host memory.
    pub fn mem_type(&self) -> MemType {
        self.mem.mem_type()
    }
    /// The fabric shareable handle of its physical memory (HIXL's `ExportToShareableHandle`).
    ///
    /// # Errors
    /// [`Error::Native`] from ACL.
    pub fn shareable_handle(&self) -> Result<[u8; 128], Error> {
        fabric::export_to_shareable_handle(self.mem.addr())
    }
}

buffer_api! {
    FabricBuffer,
    addr: "The address (in this process's reservation).",
    len: "Length in bytes, as asked (the allocation is rounded up to 2 MiB).",
    write: "Copies `data` into the buffer at `offset` (`aclrtMemcpy` under the engine's context).",
    read: "Copies from the buffer at `offset` into `buf`.",
}

// SAFETY: the buffer (with its allocation) moves into a box that only `from_raw_parts` takes
// back, so nothing frees or touches the memory meanwhile; the memory type is what ACL allocated
// (`aclrtMalloc`: device). hixl never dereferences `MemType::Device` memory: it only hands its
// addresses to ACL/HCCL.
unsafe impl RegistrableMemory for DeviceBuffer {
    fn into_raw_parts(self) -> RawMemory {
        DeviceMem::into_raw_parts(self, |b| &b.mem)
    }
    unsafe fn from_raw_parts(raw: RawMemory) -> Self {
        // SAFETY: forwarded from the caller: `raw` came from `into_raw_parts` above.
        unsafe { DeviceMem::from_raw_parts(raw) }
    }
}

// SAFETY: as for DeviceBuffer; `aclrtMallocHost` memory is host memory, valid for reads and
// writes of any bytes.
unsafe impl RegistrableMemory for PinnedHostBuffer {
    fn into_raw_parts(self) -> RawMemory {
        DeviceMem::into_raw_parts(self, |b| &b.mem)
    }
    unsafe fn from_raw_parts(raw: RawMemory) -> Self {
        // SAFETY: as for DeviceBuffer.
        unsafe { DeviceMem::from_raw_parts(raw) }
    }
}

// SAFETY: as for DeviceBuffer (nothing frees or unmaps the memory while boxed); the memory type
// is what it was allocated as. hixl never dereferences it: it hands its addresses to ACL.
unsafe impl RegistrableMemory for FabricBuffer {
    fn into_raw_parts(self) -> RawMemory {
        DeviceMem::into_raw_parts(self, |b| &b.mem)
    }
    unsafe fn from_raw_parts(raw: RawMemory) -> Self {
        // SAFETY: as for DeviceBuffer.
        unsafe { DeviceMem::from_raw_parts(raw) }
    }
}

/// Each buffer kind over the memory [`DeviceMem::alloc`] made for it.
macro_rules! from_mem {
    ($($ty:ident),*) => {$(
        impl From<DeviceMem> for $ty {
            fn from(mem: DeviceMem) -> Self {
                Self { mem }
            }
        }
    )*};
}
from_mem!(DeviceBuffer, PinnedHostBuffer, FabricBuffer);
