//! Handing fabric memory back: a region whose blocks a peer imported is *retired* when its
//! registration ends (deregistration, finalize, drop; the C ABI's and C++'s alike), so that no
//! peer reaches the memory its owner gets back.
//!
//! A peer that imported a block maps the block's physical memory into its own address space
//! and copies into it with no work by this engine: closing the link does not unmap it, and a
//! client (honest but late, or hostile) can keep writing after the server's `finalize` has
//! returned. So each block's virtual range is moved onto fresh physical memory holding the same
//! bytes: a new allocation (`aclrtMallocPhysical`, same location) is mapped at a scratch
//! reservation, the block is copied into it (device to device, waited for), the owner's range
//! is unmapped from the old physical memory and the new one mapped in its place (with the same
//! access for host memory). The old physical memory is left to the peers that imported it:
//! this engine's references to it are released (the driver frees it once the last importer
//! lets go), and the engine's allocator ([`super::alloc`]) hands out the new allocation's
//! handle from then on, never the old one.
//!
//! On a link whose client runs on this host, the client's batches are inside the server's
//! fence (the fabric path enters it when the link has one), which `finalize` revokes and waits
//! for before the registrations end: a batch that returned `Ok` has its bytes in the memory
//! that is copied. A client on another host notices the link's end on its control connection:
//! a batch that starts after it fails; one that was running may report `Ok` though its bytes
//! went to the old memory (docs/ascend.md, "FabricMem").

use std::ffi::c_void;
use std::time::Duration;

use super::ffi::{self, PhysicalMemProp};
use super::{Block, FabricRt, GRANULE};
use crate::error::Error;

impl FabricRt {
    /// Moves `b`'s virtual range onto fresh physical memory holding its bytes, and releases
    /// `b`'s retained handle (see the module's docs). On failure the range stays on its old
    /// memory (mapped, its bytes intact), the error says why, and the handle is still released.
    pub(super) fn retire(&self, b: &Block) -> Result<(), Error> {
        let r = self.move_block(b);
        // SAFETY: the handle `export_range` retained, released once.
        let rc = unsafe { (self.api.free_physical)(b.phys as *mut c_void) };
        if rc != 0 {
            tracing::warn!("aclrtFreePhysical of a retained handle failed: {rc}");
        }
        r
    }

    fn move_block(&self, b: &Block) -> Result<(), Error> {
        let _g = self.device.enter()?;
        let api = &self.api;
        let len = b.len;
        if len == 0 || !len.is_multiple_of(GRANULE) || !b.base.is_multiple_of(GRANULE) {
            return Err(self.acl().error("aclrtMemGetAddressRange", 0));
        }
        let mut attr = ffi::PtrAttributes::default();
        // SAFETY: `b.base` is only looked up; `attr` is a writable aclrtPtrAttributes.
        let rc = unsafe { (api.pointer_attributes)(b.base as *const c_void, &mut attr) };
        self.check("aclrtPointerGetAttributes", rc)?;
        let host = attr.location.kind != ffi::LOCATION_DEVICE;
        let prop = PhysicalMemProp {
            mem_attr: if host {
                ffi::ACL_MEM_P2P_HUGE
            } else {
                ffi::ACL_HBM_MEM_HUGE
            },
            location: attr.location,
            ..PhysicalMemProp::default()
        };
        let mut fresh: *mut c_void = std::ptr::null_mut();
        // SAFETY: an out-pointer and a valid property struct; a size of whole granules.
        let rc = unsafe { (api.malloc_physical)(&mut fresh, len, &prop, 0) };
        self.check("aclrtMallocPhysical", rc)?;
        let copied = self.copy_into(b, fresh, host);
        if let Err(e) = copied {
            // SAFETY: the allocation just made, never mapped at the owner's range.
            unsafe { (api.free_physical)(fresh) };
            return Err(e);
        }
        // the owner's range, from the old memory onto the new one
        // SAFETY: `b.base` is the start of the mapping `export_range` found, still mapped.
        let rc = unsafe { (api.unmap)(b.base as *mut c_void) };
        if let Err(e) = self.check("aclrtUnmapMem", rc) {
            // SAFETY: as above.
            unsafe { (api.free_physical)(fresh) };
            return Err(e);
        }
        // SAFETY: the range was just unmapped, inside the owner's reservation; `fresh` is live.
        let rc = unsafe { (api.map)(b.base as *mut c_void, len, 0, fresh, 0) };
        if let Err(e) = self.check("aclrtMapMem", rc) {
            // back onto the old memory rather than leave the owner's range unmapped
            // SAFETY: the old handle is still retained (released by `retire` after this).
            let back =
                unsafe { (api.map)(b.base as *mut c_void, len, 0, b.phys as *mut c_void, 0) };
            if back != 0 {
                tracing::error!(
                    addr = b.base,
                    "a fabric region's range could not be mapped again"
                );
            }
            // SAFETY: as above.
            unsafe { (api.free_physical)(fresh) };
            return Err(e);
        }
        if host {
            self.grant_access(b.base, len)?;
        }
        // the engine's allocator keeps the new allocation's handle for `free_mem` (and gives
        // up the old one); memory the caller mapped itself keeps only the mapping's reference
        match super::alloc::replace_physical(b.base, fresh as usize) {
            Some(old) => {
                // SAFETY: the allocator's handle of the old memory, released once (the
                // importers' own references keep it alive for them).
                let rc = unsafe { (api.free_physical)(old as *mut c_void) };
                if rc != 0 {
                    tracing::warn!("aclrtFreePhysical of the old allocation failed: {rc}");
                }
            }
            None => {
                // SAFETY: `fresh` is mapped: its memory lives until the owner unmaps it.
                unsafe { (api.free_physical)(fresh) };
            }
        }
        Ok(())
    }

    /// Maps `fresh` at a scratch reservation and copies the block's bytes into it (waited
    /// for); the scratch mapping is gone when this returns.
    fn copy_into(&self, b: &Block, fresh: *mut c_void, host: bool) -> Result<(), Error> {
        let api = &self.api;
        let mut va: *mut c_void = std::ptr::null_mut();
        // SAFETY: an out-pointer; a size of whole granules.
        let rc = unsafe { (api.reserve)(&mut va, b.len, 0, std::ptr::null_mut(), 1) };
        self.check("aclrtReserveMemAddress", rc)?;
        // SAFETY: a fresh reservation of this process, and a live handle.
        let rc = unsafe { (api.map)(va, b.len, 0, fresh, 0) };
        let mut r = self.check("aclrtMapMem", rc);
        if r.is_ok() && host {
            r = self.grant_access(va as usize, b.len);
        }
        if r.is_ok() {
            r = self.copy(va as usize, b.base, b.len);
        }
        // SAFETY: the scratch mapping (if made) and reservation, each released once.
        unsafe {
            if rc == 0 {
                (api.unmap)(va);
            }
            (api.release)(va);
        }
        r
    }

    /// Copies `len` bytes from `src` to `dst` (device to device) and waits for it.
    fn copy(&self, dst: usize, src: usize, len: usize) -> Result<(), Error> {
        let s = self.acl().create_stream()?;
        // SAFETY: both ranges are live mappings of this process of `len` bytes.
        let rc = unsafe {
            (self.api.memcpy_async)(
                dst as *mut c_void,
                len,
                src as *const c_void,
                len,
                ffi::ACL_MEMCPY_DEVICE_TO_DEVICE,
                s.as_raw(),
            )
        };
        self.check("aclrtMemcpyAsync", rc)?;
        self.acl()
            .synchronize(&s, Duration::from_secs(60), "retire", "this engine")
    }

    /// Gives this engine's device read-write access to host memory mapped at `va`, as
    /// [`super::alloc::malloc_mem`] does.
    fn grant_access(&self, va: usize, len: usize) -> Result<(), Error> {
        let device = self.acl().device()?;
        // SAFETY: the callers' ranges are mapped (the block, or the scratch mapping just made).
        let rc = unsafe { super::alloc::set_access(&self.api, device, va as *mut c_void, len) };
        self.check("aclrtMemSetAccess", rc)
    }
}
