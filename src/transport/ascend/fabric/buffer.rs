//! [`FabricBuffer`]: fabric memory (ACL virtual memory) of a fabric-memory engine, the typed
//! API's own memory kind for `EnableUseFabricMem` ([`Options::fabric_mem`](crate::Options::fabric_mem)).

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use super::alloc::{self, Lib};
use super::ffi::FabricApi;
use crate::device::{ContextToken, Device};
use crate::error::Error;
use crate::types::MemType;
use crate::types::raw::{RawMemory, RegistrableMemory};

/// VMM memory (`aclrtMallocPhysical` + `aclrtReserveMemAddress` + `aclrtMapMem`, HIXL's
/// `MallocMem`) of a fabric-memory engine, allocated with
/// [`Hixl::alloc_fabric`](crate::Hixl::alloc_fabric) on the engine's device and freed when
/// dropped (`FreeMem`). Register it with [`Hixl::register_device`](crate::Hixl::register_device):
/// peers then map its physical memory. Never a host slice (device memory, or host memory the
/// device maps): copy with [`FabricBuffer::write`] and [`FabricBuffer::read`] (`aclrtMemcpy`).
pub struct FabricBuffer {
    addr: usize,
    len: usize,
    mem_type: MemType,
    engine: u64,
    device: Arc<Device>,
}

impl fmt::Debug for FabricBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FabricBuffer")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("mem_type", &self.mem_type)
            .field("engine", &self.engine)
            .finish()
    }
}

impl FabricBuffer {
    pub(crate) fn alloc(
        device: &Arc<Device>,
        engine: u64,
        ctx: &ContextToken<'_>,
        mem_type: MemType,
        len: usize,
    ) -> Result<Self, Error> {
        if ctx.engine_id() != engine {
            return Err(Error::ForeignHandle {
                what: "context token",
                owner: ctx.engine_id(),
                engine,
            });
        }
        if len == 0 {
            return Err(Error::ZeroLengthRegion);
        }
        let acl = device.acl.clone();
        let api = FabricApi::load(acl.library())?;
        let lib: Lib = Arc::new((acl, api));
        let _g = device.enter()?;
        let addr = alloc::malloc_with(&lib, mem_type, len)?;
        Ok(Self {
            addr,
            len,
            mem_type,
            engine,
            device: device.clone(),
        })
    }

    /// The address (in this process's reservation).
    pub fn addr(&self) -> usize {
        self.addr
    }
    /// Length in bytes, as asked (the allocation is rounded up to 2 MiB).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false: empty buffers cannot be allocated.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Device or host memory.
    pub fn mem_type(&self) -> MemType {
        self.mem_type
    }
    /// The fabric shareable handle of its physical memory (HIXL's `ExportToShareableHandle`).
    ///
    /// # Errors
    /// [`Error::Native`] from ACL.
    pub fn shareable_handle(&self) -> Result<[u8; 128], Error> {
        alloc::export_to_shareable_handle(self.addr)
    }

    fn range(&self, offset: usize, n: usize) -> Result<usize, Error> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(self.addr + offset),
            _ => Err(Error::RangeOutOfBounds {
                region: 0,
                offset: offset as u64,
                len: n as u64,
                region_len: self.len as u64,
            }),
        }
    }

    /// Copies `data` into the buffer at `offset` (`aclrtMemcpy` under the engine's context).
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
        let at = self.range(offset, data.len())?;
        // SAFETY: `at..at + data.len()` lies in this buffer's live mapping, exclusively borrowed.
        unsafe {
            self.device
                .write(at, data, self.mem_type == MemType::Device)
        }
    }

    /// Copies from the buffer at `offset` into `buf`.
    ///
    /// # Errors
    /// As [`FabricBuffer::write`].
    pub fn read(&self, ctx: &ContextToken<'_>, offset: usize, buf: &mut [u8]) -> Result<(), Error> {
        self.token(ctx)?;
        let at = self.range(offset, buf.len())?;
        // SAFETY: as in `write`; the buffer is not registered while owned, so no peer writes it.
        unsafe { self.device.read(at, buf, self.mem_type == MemType::Device) }
    }

    fn token(&self, ctx: &ContextToken<'_>) -> Result<(), Error> {
        if ctx.engine_id() != self.engine {
            return Err(Error::ForeignHandle {
                what: "context token",
                owner: ctx.engine_id(),
                engine: self.engine,
            });
        }
        Ok(())
    }
}

impl Drop for FabricBuffer {
    fn drop(&mut self) {
        let g = self.device.enter();
        if let Err(e) = alloc::free_mem(self.addr) {
            tracing::warn!("freeing fabric memory failed: {e}");
        }
        drop(g);
    }
}

// SAFETY: the buffer moves into a box that only `from_raw_parts` takes back, so nothing frees
// or unmaps the memory meanwhile; the memory type is what it was allocated as. hixl never
// dereferences it: it hands its addresses to ACL.
unsafe impl RegistrableMemory for FabricBuffer {
    fn into_raw_parts(self) -> RawMemory {
        let (addr, len, t) = (self.addr, self.len, self.mem_type);
        let ptr = NonNull::new(addr as *mut u8).expect("VMM addresses are non-null");
        let extra = Box::into_raw(Box::new(self)) as usize;
        RawMemory::new(ptr, len, extra, t)
    }
    unsafe fn from_raw_parts(raw: RawMemory) -> Self {
        // SAFETY: the extra word is the box made by `into_raw_parts`, taken back once.
        *unsafe { Box::from_raw(raw.extra() as *mut FabricBuffer) }
    }
}
