//! Registered regions and local sub-ranges of them (the memory types that can be registered are
//! in `buffers.rs`).
//!
//! A [`Region`] is a capability: proof that a piece of memory is registered with one engine. It is
//! an owned handle (not a borrow of the engine), so the engine can still change state while regions
//! exist. Transfers are built from [`LocalRange`]s, which borrow their region: a range cannot outlive
//! the region, and a region cannot be deregistered while a range of it is alive.
//!
//! Memory a peer may write is never handed out as `&[u8]`/`&mut [u8]` while the engine may serve
//! it; use [`Region::read_at`] / [`Region::write_at`] (copies), or get the memory back with
//! `deregister` once no link can exist.

use std::fmt;
use std::ops::{Bound, RangeBounds};

use crate::buffers::HostBuffer;
use crate::error::Error;
use crate::runtime::region::RegionCore;
use crate::types::{Access, MemType};

/// A registered memory region: the capability to use this memory in transfers of its engine.
///
/// `M` is what deregistration hands back: the [`RegistrableMemory`](crate::RegistrableMemory) you registered, or the
/// [`MemDesc`](crate::MemDesc) of a raw registration. Dropping a `Region` without deregistering it is safe: the
/// memory stays registered (and alive) until the engine is finalized or dropped, then it is freed.
pub struct Region<M = HostBuffer> {
    pub(crate) core: std::sync::Arc<RegionCore>,
    pub(crate) _mem: std::marker::PhantomData<fn() -> M>,
}

impl<M> fmt::Debug for Region<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("id", &self.core.id)
            .field("engine", &self.core.engine)
            .field("addr", &format_args!("{:#x}", self.core.addr))
            .field("len", &self.core.len)
            .field("mem_type", &self.core.mem_type)
            .field("access", &self.core.access)
            .finish()
    }
}

impl<M> Region<M> {
    /// The region's id in its engine's table (what peers see).
    pub fn id(&self) -> u32 {
        self.core.id
    }
    /// The id of the engine it is registered with.
    pub fn engine_id(&self) -> u64 {
        self.core.engine
    }
    /// The start address (what peers see in the region table).
    pub fn addr(&self) -> usize {
        self.core.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.core.len
    }
    /// Always false: empty regions cannot be registered.
    pub fn is_empty(&self) -> bool {
        self.core.len == 0
    }
    /// The memory type.
    pub fn mem_type(&self) -> MemType {
        self.core.mem_type
    }
    /// What peers may do with it.
    pub fn access(&self) -> Access {
        self.core.access
    }
    /// The start as a raw pointer. Reading or writing through it is up to you (and `unsafe`).
    pub fn as_ptr(&self) -> *mut u8 {
        self.core.addr as *mut u8
    }

    /// A sub-range of the region, for use in transfer descriptors. Any non-empty sub-range is allowed.
    ///
    /// # Errors
    /// [`Error::RangeOutOfBounds`] (`PARAM_INVALID`) when the range is empty or leaves the region.
    pub fn range(&self, range: impl RangeBounds<usize>) -> Result<LocalRange<'_>, Error> {
        let (offset, len) = resolve(range, self.core.len, self.core.id)?;
        Ok(LocalRange {
            core: &self.core,
            offset,
            len,
        })
    }

    /// The whole region as one range.
    pub fn full(&self) -> LocalRange<'_> {
        LocalRange {
            core: &self.core,
            offset: 0,
            len: self.core.len,
        }
    }

    /// Copies `buf.len()` bytes starting at `offset` out of the region.
    ///
    /// `&mut self` keeps local transfers on this region (which borrow it) from running at the
    /// same time. A peer may still WRITE into a region its engine serves: read after the peer has
    /// told you its data landed.
    ///
    /// # Errors
    /// [`Error::RangeOutOfBounds`] if the range leaves the region;
    /// [`Error::UnsupportedMemory`] for device memory; [`Error::RegionBusy`]
    /// (`RESOURCE_EXHAUSTED`) while an async request using the region (held, or forgotten with
    /// `mem::forget`) has not ended, or while a same-host client that `deactivate` gave up on
    /// (stopped or hung mid-batch) may still write it: until it leaves its fence or exits
    /// (`deregister` hands back a copy meanwhile).
    pub fn read_at(&mut self, offset: usize, buf: &mut [u8]) -> Result<(), Error> {
        self.check_host_span(offset, buf.len())?;
        self.check_idle()?;
        // SAFETY: the span lies inside the registered region, which stays allocated while `self`
        // holds its core; host memory is valid for reads; `buf` cannot alias registered memory
        // given out by this crate, since no `&mut [u8]` to it is ever created. Peers may write
        // the region meanwhile while the engine serves it (another process, or a one-sided
        // write a transport thread of this process applies, such as UCX's progress): the
        // memory is shared with the outside, as a DMA buffer is, and only ever copied through
        // raw pointers, so `buf` gets some interleaving of old and new bytes, each valid for
        // `u8` (ordering it is the caller's: a notification after the peer's WRITE).
        unsafe {
            std::ptr::copy_nonoverlapping(self.core.ptr_at(offset), buf.as_mut_ptr(), buf.len())
        };
        Ok(())
    }

    /// Copies `data` into the region starting at `offset`.
    ///
    /// # Errors
    /// As [`Region::read_at`].
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<(), Error> {
        self.check_host_span(offset, data.len())?;
        self.check_idle()?;
        // SAFETY: as in `read_at`; the memory is valid for writes of any byte values
        // (the `RegistrableMemory` contract, or the `register_raw` contract).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.core.ptr_at(offset), data.len())
        };
        Ok(())
    }

    /// Copies `buf.len()` bytes starting at `offset` out of a region of an Ascend engine, device
    /// memory included, with `aclrtMemcpy` (the way to read device memory: it is never a host
    /// slice).
    ///
    /// # Errors
    /// [`Error::ForeignHandle`] for a token of another engine; [`Error::RangeOutOfBounds`];
    /// [`Error::UnsupportedMemory`] on an engine without an Ascend runtime; [`Error::Native`].
    pub fn read_device(
        &mut self,
        ctx: &crate::ContextToken<'_>,
        offset: usize,
        buf: &mut [u8],
    ) -> Result<(), Error> {
        let dev = self.check_device_span(ctx, offset, buf.len())?;
        self.check_idle()?;
        let device = self.core.mem_type == MemType::Device;
        // SAFETY: the span lies inside the registered region (of that memory type), alive while
        // `self` holds its core; `&mut self` and the idle check keep local transfers off it.
        unsafe { dev.read(self.core.addr + offset, buf, device) }
    }

    /// Copies `data` into a region of an Ascend engine at `offset` with `aclrtMemcpy`.
    ///
    /// # Errors
    /// As [`Region::read_device`].
    pub fn write_device(
        &mut self,
        ctx: &crate::ContextToken<'_>,
        offset: usize,
        data: &[u8],
    ) -> Result<(), Error> {
        let dev = self.check_device_span(ctx, offset, data.len())?;
        self.check_idle()?;
        let device = self.core.mem_type == MemType::Device;
        // SAFETY: as in `read_device`; no Rust reference to registered memory is ever made.
        unsafe { dev.write(self.core.addr + offset, data, device) }
    }

    fn check_device_span(
        &self,
        ctx: &crate::ContextToken<'_>,
        offset: usize,
        len: usize,
    ) -> Result<&crate::device::Device, Error> {
        if ctx.engine_id() != self.core.engine {
            return Err(Error::ForeignHandle {
                what: "context token",
                owner: ctx.engine_id(),
                engine: self.core.engine,
            });
        }
        let Some(dev) = &self.core.device else {
            return Err(Error::UnsupportedMemory {
                mem_type: self.core.mem_type,
                why: "the engine has no Ascend runtime",
            });
        };
        match offset.checked_add(len) {
            Some(end) if end <= self.core.len => Ok(dev),
            _ => Err(Error::RangeOutOfBounds {
                region: self.core.id,
                offset: offset as u64,
                len: len as u64,
                region_len: self.core.len as u64,
            }),
        }
    }

    /// `RegionBusy` while an async request that uses the region has not ended: a request that
    /// is held borrows the region (so `&mut self` methods do not compile); one that was
    /// `mem::forget`ten no longer does, and is caught here. Also while a same-host client that
    /// `deactivate` or `finalize` gave up on may still write the memory (it is quarantined).
    fn check_idle(&self) -> Result<(), Error> {
        self.core.check_idle()?;
        self.core.check_unblocked()
    }

    fn check_host_span(&self, offset: usize, len: usize) -> Result<(), Error> {
        if self.core.mem_type != MemType::Host {
            return Err(Error::UnsupportedMemory {
                mem_type: self.core.mem_type,
                why: "read_at/write_at copy host memory only",
            });
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.core.len => Ok(()),
            _ => Err(Error::RangeOutOfBounds {
                region: self.core.id,
                offset: offset as u64,
                len: len as u64,
                region_len: self.core.len as u64,
            }),
        }
    }
}

pub(crate) fn resolve(
    range: impl RangeBounds<usize>,
    total: usize,
    region: u32,
) -> Result<(usize, usize), Error> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(total),
    };
    match (start, end) {
        (Some(s), Some(e)) if s < e && e <= total => Ok((s, e - s)),
        _ => Err(Error::RangeOutOfBounds {
            region,
            offset: start.unwrap_or(usize::MAX) as u64,
            len: match (start, end) {
                (Some(s), Some(e)) => e.saturating_sub(s) as u64,
                _ => u64::MAX,
            },
            region_len: total as u64,
        }),
    }
}

/// A validated, non-empty sub-range of a local [`Region`]; it borrows the region.
#[derive(Clone, Copy)]
pub struct LocalRange<'r> {
    pub(crate) core: &'r std::sync::Arc<RegionCore>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl LocalRange<'_> {
    /// Offset from the region start.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false: ranges are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The region's id.
    pub fn region_id(&self) -> u32 {
        self.core.id
    }
    /// The address of the range's first byte.
    pub fn addr(&self) -> usize {
        self.core.addr + self.offset
    }
    /// The core floor's span of it, for the batch checks.
    pub(crate) fn span(&self) -> crate::runtime::check::Local<'_> {
        crate::runtime::check::Local {
            core: self.core,
            offset: self.offset,
            len: self.len,
        }
    }
}

impl fmt::Debug for LocalRange<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalRange")
            .field("region", &self.core.id)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_resolution() {
        assert_eq!(resolve(.., 10, 0).unwrap(), (0, 10));
        assert_eq!(resolve(3..7, 10, 0).unwrap(), (3, 4));
        assert_eq!(resolve(3..=9, 10, 0).unwrap(), (3, 7));
        for bad in [(5usize, 5usize), (7, 3), (0, 11)] {
            assert!(matches!(
                resolve(bad.0..bad.1, 10, 4),
                Err(Error::RangeOutOfBounds { region: 4, .. })
            ));
        }
        assert!(resolve(..=usize::MAX, 10, 0).is_err());
    }
}
