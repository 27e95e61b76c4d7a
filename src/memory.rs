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
use crate::types::raw::{RawMemory, RegistrableMemory};
use crate::types::{Access, MemDesc, MemType, RegionView};

/// Replaces memory a peer may have mapped by a private copy (a HostBuffer, since only
/// HostBuffers have a memfd), releasing the shared one.
fn unshare(raw: RawMemory, free: unsafe fn(RawMemory)) -> Result<RawMemory, (Error, RawMemory)> {
    let mut copy = match HostBuffer::new(raw.len) {
        Ok(b) => b,
        Err(e) => return Err((e, raw)),
    };
    // SAFETY: `raw` describes `len` readable bytes; `copy` is a fresh buffer of the same length.
    unsafe { std::ptr::copy_nonoverlapping(raw.ptr.as_ptr(), copy.as_mut_ptr(), raw.len) };
    // SAFETY: `free` is the release function of the type that produced `raw`, called once.
    unsafe { free(raw) };
    Ok(copy.into_raw_parts())
}

/// The engine-side record of a registered region: shared by the user's [`Region`] handle, the
/// engine's table and every serving thread, so the memory lives while any of them may touch it.
pub(crate) struct RegionCore {
    pub(crate) id: u32,
    pub(crate) engine: u64,
    pub(crate) addr: usize,
    pub(crate) len: usize,
    pub(crate) mem_type: MemType,
    pub(crate) access: Access,
    /// The sealed memfd behind the memory, or -1.
    pub(crate) fd: i32,
    /// Set once the memfd was offered to a same-host peer, which may have mapped it.
    pub(crate) exposed: std::sync::atomic::AtomicBool,
    /// The owned memory and how to free it; `None` once handed back, or for raw registrations.
    owned: Option<(RawMemory, unsafe fn(RawMemory))>,
    /// How to copy the owned memory into a new value of its type, for quarantine; only memory
    /// that can be copied is offered to same-host peers for one-sided access.
    dup: Option<Duplicate>,
    /// Fences of same-host clients that did not confirm in time that they stopped touching the
    /// memory (set when the engine stops serving); while one of them may still touch it, the
    /// memory is quarantined instead of handed back or freed.
    pub(crate) blockers: std::sync::Mutex<crate::quarantine::Blockers>,
    /// The engine's quarantine counters.
    pub(crate) stats: std::sync::Arc<crate::quarantine::Stats>,
    /// Async requests using the region that have not ended (a forgotten request does not end
    /// the borrow the compiler sees, so `read_at`/`write_at` check this).
    pub(crate) uses: std::sync::atomic::AtomicUsize,
    /// The region's HCCL registration on an Ascend engine; released before the memory.
    pub(crate) device: Option<crate::transport::ascend::DeviceReg>,
}

/// Copies owned memory into a new value of the same type and returns its raw parts.
type Duplicate = unsafe fn(&RawMemory) -> Option<RawMemory>;

/// The copy function for `M`, for the memory types the crate knows how to copy: `Vec<u8>`,
/// `Box<[u8]>` and [`HostBuffer`].
fn duplicator<M: RegistrableMemory>() -> Option<Duplicate> {
    use std::any::TypeId;
    let t = TypeId::of::<M>();
    if t == TypeId::of::<Vec<u8>>() {
        Some(dup_vec)
    } else if t == TypeId::of::<Box<[u8]>>() {
        Some(dup_box)
    } else if t == TypeId::of::<HostBuffer>() {
        Some(dup_host_buffer)
    } else {
        None
    }
}

/// A `Vec<u8>` holding a copy of `raw`'s bytes, or `None` if it cannot be allocated.
///
/// # Safety
/// `raw` must describe `len` bytes valid for reads.
unsafe fn copy_to_vec(raw: &RawMemory) -> Option<Vec<u8>> {
    let mut v: Vec<u8> = Vec::new();
    v.try_reserve_exact(raw.len).ok()?;
    // SAFETY: `raw` is readable (the caller's contract); `v` has room for `len` bytes, which
    // are initialised by the copy before `set_len`. The source may be written by another
    // process meanwhile: it is read through raw pointers only, and any byte value is valid.
    unsafe {
        std::ptr::copy_nonoverlapping(raw.ptr.as_ptr(), v.as_mut_ptr(), raw.len);
        v.set_len(raw.len);
    }
    Some(v)
}

unsafe fn dup_vec(raw: &RawMemory) -> Option<RawMemory> {
    // SAFETY: forwarded caller contract.
    unsafe { copy_to_vec(raw) }.map(RegistrableMemory::into_raw_parts)
}

unsafe fn dup_box(raw: &RawMemory) -> Option<RawMemory> {
    // SAFETY: forwarded caller contract.
    unsafe { copy_to_vec(raw) }.map(|v| v.into_boxed_slice().into_raw_parts())
}

unsafe fn dup_host_buffer(raw: &RawMemory) -> Option<RawMemory> {
    let mut b = HostBuffer::new(raw.len).ok()?;
    // SAFETY: `raw` is readable (the caller's contract); `b` is a fresh buffer of that length.
    unsafe { std::ptr::copy_nonoverlapping(raw.ptr.as_ptr(), b.as_mut_ptr(), raw.len) };
    Some(b.into_raw_parts())
}

// SAFETY: the core only stores addresses and owned memory of a `Send` type; the memory itself is
// only touched through raw pointers by the engine's transfer code and `read_at`/`write_at`.
unsafe impl Send for RegionCore {}
// SAFETY: nothing in the core is mutated through `&RegionCore`.
unsafe impl Sync for RegionCore {}

unsafe fn release<M: RegistrableMemory>(raw: RawMemory) {
    // SAFETY: `raw` came from `M::into_raw_parts` and is released once (see `RegionCore::drop`).
    drop(unsafe { M::from_raw_parts(raw) });
}

impl RegionCore {
    /// What a transport needs to know of the region.
    pub(crate) fn view(&self) -> RegionView {
        RegionView {
            id: self.id,
            addr: self.addr,
            len: self.len,
            mem_type: self.mem_type,
            access: self.access,
        }
    }

    pub(crate) fn new_owned<M: RegistrableMemory>(
        id: u32,
        engine: u64,
        raw: RawMemory,
        access: Access,
    ) -> Self {
        Self {
            id,
            engine,
            addr: raw.ptr.as_ptr() as usize,
            len: raw.len,
            mem_type: raw.mem_type,
            access,
            fd: raw.fd,
            exposed: std::sync::atomic::AtomicBool::new(false),
            owned: Some((raw, release::<M> as unsafe fn(RawMemory))),
            dup: duplicator::<M>(),
            blockers: std::sync::Mutex::new(Vec::new()),
            stats: Default::default(),
            uses: std::sync::atomic::AtomicUsize::new(0),
            device: None,
        }
    }

    pub(crate) fn new_raw(
        id: u32,
        engine: u64,
        desc: MemDesc,
        mem_type: MemType,
        access: Access,
    ) -> Self {
        Self {
            id,
            engine,
            addr: desc.addr,
            len: desc.len,
            mem_type,
            access,
            fd: -1,
            exposed: std::sync::atomic::AtomicBool::new(false),
            owned: None,
            dup: None,
            blockers: std::sync::Mutex::new(Vec::new()),
            stats: Default::default(),
            uses: std::sync::atomic::AtomicUsize::new(0),
            device: None,
        }
    }

    /// Whether same-host peers may reach the memory one-sidedly (mapped or `/proc/PID/mem`):
    /// only owned memory the engine can quarantine (copy out and keep) is offered; the rest is
    /// served over TCP, by serving threads the engine joins before it hands memory back.
    pub(crate) fn one_sided(&self) -> bool {
        self.dup.is_some()
    }

    /// The fences still blocking the memory (none if every client confirmed, or is gone).
    fn live_blockers(&self) -> crate::quarantine::Blockers {
        let b = std::sync::Mutex::lock(&self.blockers)
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if crate::quarantine::blocking(&b) {
            b
        } else {
            Vec::new()
        }
    }

    /// Takes the owned memory out (deregistration); the core then frees nothing. Memory a
    /// same-host peer may have mapped is replaced by a private copy first.
    pub(crate) fn take_raw(&mut self) -> Result<Option<RawMemory>, Error> {
        // the HCCL registration goes first: the memory is about to leave the engine
        drop(self.device.take());
        let Some((raw, free)) = self.owned.take() else {
            return Ok(None);
        };
        let blockers = self.live_blockers();
        if !blockers.is_empty() {
            // a same-host client may still write the original: hand back a copy, keep it
            let copy = self.dup.and_then(|dup| {
                // SAFETY: `raw` is this region's owned memory, readable; `dup` is the copy
                // function of the type that produced it.
                unsafe { dup(&raw) }
            });
            let Some(copy) = copy else {
                self.owned = Some((raw, free));
                return Err(Error::OutOfMemory { len: self.len });
            };
            crate::quarantine::hold(raw, free, blockers, &self.stats);
            return Ok(Some(copy));
        }
        if raw.fd < 0 || !self.exposed.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(Some(raw));
        }
        match unshare(raw, free) {
            Ok(copy) => Ok(Some(copy)),
            Err((e, raw)) => {
                self.owned = Some((raw, free));
                Err(e)
            }
        }
    }

    pub(crate) fn ptr_at(&self, offset: usize) -> *mut u8 {
        (self.addr + offset) as *mut u8
    }
}

impl Drop for RegionCore {
    fn drop(&mut self) {
        drop(self.device.take());
        if let Some((raw, free)) = self.owned.take() {
            let blockers = self.live_blockers();
            if !blockers.is_empty() {
                // a same-host client may still write it: free it once it cannot
                crate::quarantine::hold(raw, free, blockers, &self.stats);
                return;
            }
            // SAFETY: this is the last reference to the region (it is in an `Arc` that is being
            // dropped), so no transfer or serving thread of this process can touch the memory
            // any more, and no same-host client can (none blocks it: every one confirmed, or is
            // gone); `free` is the release function of the type that produced `raw`.
            unsafe { free(raw) }
        }
    }
}

/// An async request's hold on a region: keeps the core alive and counted in its `uses` until
/// the request is done with the memory.
pub(crate) struct RegionUse(std::sync::Arc<RegionCore>);

impl RegionUse {
    pub(crate) fn new(core: &std::sync::Arc<RegionCore>) -> Self {
        core.uses.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self(core.clone())
    }
    pub(crate) fn core(&self) -> &std::sync::Arc<RegionCore> {
        &self.0
    }
}

impl Drop for RegionUse {
    fn drop(&mut self) {
        self.0
            .uses
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A registered memory region: the capability to use this memory in transfers of its engine.
///
/// `M` is what deregistration hands back: the [`RegistrableMemory`] you registered, or the
/// [`MemDesc`] of a raw registration. Dropping a `Region` without deregistering it is safe: the
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
    /// `mem::forget`) has not ended.
    pub fn read_at(&mut self, offset: usize, buf: &mut [u8]) -> Result<(), Error> {
        self.check_host_span(offset, buf.len())?;
        self.check_idle()?;
        // SAFETY: the span lies inside the registered region, which stays allocated while `self`
        // holds its core; host memory is valid for reads; `buf` cannot alias registered memory
        // given out by this crate, since no `&mut [u8]` to it is ever created.
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
        // SAFETY: the span lies inside the registered region, alive while `self` holds its core.
        unsafe { dev.read(self.core.addr + offset, buf) }
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
        // SAFETY: as in `read_device`; no Rust reference to registered memory is ever made.
        unsafe { dev.write(self.core.addr + offset, data) }
    }

    fn check_device_span(
        &self,
        ctx: &crate::ContextToken<'_>,
        offset: usize,
        len: usize,
    ) -> Result<&crate::transport::ascend::DeviceReg, Error> {
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
    /// `mem::forget`ten no longer does, and is caught here.
    fn check_idle(&self) -> Result<(), Error> {
        if self.core.uses.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            return Err(Error::RegionBusy {
                region: self.core.id,
            });
        }
        Ok(())
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
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.core.ptr_at(self.offset)
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
