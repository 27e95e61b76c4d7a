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
//! lets go), and the allocator statics (the device floor's, `device/fabric.rs`) hand out the
//! new allocation's handle from then on, never the old one.
//!
//! On a link whose client runs on this host, the client's batches are inside the server's
//! fence (the fabric path enters it when the link has one), which `finalize` revokes and waits
//! for before the registrations end: a batch that returned `Ok` has its bytes in the memory
//! that is copied. A client on another host notices the link's end on its control connection:
//! a batch that starts after it fails; one that was running may report `Ok` though its bytes
//! went to the old memory (docs/ascend.md, "FabricMem").

use std::time::Duration;

use super::rt::{Block, FabricRt};
use crate::device::acl::VMM_GRANULE;
use crate::device::replace_physical;
use crate::error::Error;

impl FabricRt {
    /// Moves `b`'s virtual range onto fresh physical memory holding its bytes, and releases
    /// `b`'s retained handle (see the module's docs). On failure the range stays on its old
    /// memory (mapped, its bytes intact), the error says why, and the handle is still released.
    pub(super) fn retire(&self, b: &Block) -> Result<(), Error> {
        let r = self.move_block(b);
        // (the allocator's own handle is the allocator's to release: `replace_physical` below
        // handed it back, or `free_mem` will)
        if b.retained {
            // SAFETY: the handle `export_range` retained, released once.
            if let Err(e) = unsafe { self.acl().free_physical(b.phys) } {
                tracing::warn!("aclrtFreePhysical of a retained handle failed: {e}");
            }
        }
        r
    }

    fn move_block(&self, b: &Block) -> Result<(), Error> {
        let _g = self.device.enter()?;
        let acl = self.acl();
        let len = b.len;
        if len == 0 || !len.is_multiple_of(VMM_GRANULE) || !b.base.is_multiple_of(VMM_GRANULE) {
            return Err(acl.error("aclrtMemGetAddressRange", 0));
        }
        let location = acl.pointer_attributes(b.base)?.location;
        let host = !location.is_device();
        let fresh = acl.malloc_physical(len, location)?;
        // SAFETY (the releases of `fresh` below): the allocation just made, released once, and
        // never left mapped at the owner's range when released here.
        let copied = self.copy_into(b, fresh, host);
        if let Err(e) = copied {
            // SAFETY: as said above.
            let _ = unsafe { acl.free_physical(fresh) };
            return Err(e);
        }
        // the owner's range, from the old memory onto the new one
        // SAFETY: `b.base` is the start of the mapping `export_range` found, still mapped; the
        // registration is ending, so nothing of this engine copies into it.
        if let Err(e) = unsafe { acl.unmap(b.base) } {
            // SAFETY: as said above.
            let _ = unsafe { acl.free_physical(fresh) };
            return Err(e);
        }
        // SAFETY: the range was just unmapped, inside the owner's reservation; `fresh` is live.
        if let Err(e) = unsafe { acl.map(b.base, len, fresh) } {
            // back onto the old memory rather than leave the owner's range unmapped
            // SAFETY: the old handle is still held: retained (released by `retire` after
            // this), or the allocator's (not replaced: `replace_physical` runs only after).
            if unsafe { acl.map(b.base, len, b.phys) }.is_err() {
                tracing::error!(
                    addr = b.base,
                    "a fabric region's range could not be mapped again"
                );
            }
            // SAFETY: as said above.
            let _ = unsafe { acl.free_physical(fresh) };
            return Err(e);
        }
        if host {
            self.grant_access(b.base, len)?;
        }
        // the engine's allocator keeps the new allocation's handle for `free_mem` (and gives
        // up the old one); memory the caller mapped itself keeps only the mapping's reference
        match replace_physical(b.base, fresh) {
            Some(old) => {
                // SAFETY: the allocator's handle of the old memory, released once (the
                // importers' own references keep it alive for them).
                if let Err(e) = unsafe { acl.free_physical(old) } {
                    tracing::warn!("aclrtFreePhysical of the old allocation failed: {e}");
                }
            }
            None => {
                // SAFETY: `fresh` is mapped: its memory lives until the owner unmaps it.
                let _ = unsafe { acl.free_physical(fresh) };
            }
        }
        Ok(())
    }

    /// Maps `fresh` at a scratch reservation and copies the block's bytes into it (waited
    /// for); the scratch mapping is gone when this returns.
    fn copy_into(&self, b: &Block, fresh: usize, host: bool) -> Result<(), Error> {
        let acl = self.acl();
        let va = acl.reserve(b.len)?;
        // SAFETY: a fresh reservation of this process, and a live handle.
        let mapped = unsafe { acl.map(va, b.len, fresh) };
        let is_mapped = mapped.is_ok();
        let mut r = mapped;
        if r.is_ok() && host {
            r = self.grant_access(va, b.len);
        }
        if r.is_ok() {
            r = self.copy(va, b.base, b.len);
        }
        // SAFETY: the scratch mapping (if made; the copy into it was waited for) and
        // reservation, each released once.
        unsafe {
            if is_mapped {
                let _ = acl.unmap(va);
            }
            let _ = acl.release(va);
        }
        r
    }

    /// Copies `len` bytes from `src` to `dst` (device to device) and waits for it.
    fn copy(&self, dst: usize, src: usize, len: usize) -> Result<(), Error> {
        let s = self.acl().create_stream()?;
        // SAFETY: both ranges are live mappings of this process of `len` bytes, kept until the
        // stream is synchronised below (a failed call queued nothing).
        unsafe { self.acl().copy_device_async(dst, src, len, &s) }?;
        self.acl()
            .synchronize(&s, Duration::from_secs(60), "retire", "this engine")
    }

    /// Gives this engine's device read-write access to host memory mapped at `va`, as
    /// `malloc_mem` does.
    fn grant_access(&self, va: usize, len: usize) -> Result<(), Error> {
        let device = self.acl().device()?;
        // SAFETY: the callers' ranges are mapped (the block, or the scratch mapping just made).
        unsafe { self.acl().set_access(device, va, len) }
    }
}
