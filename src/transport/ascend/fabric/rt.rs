//! A fabric-memory engine's runtime ([`FabricRt`]: its device, ACL without HCCL) and a region's
//! registration ([`FabricReg`]): the range walked block by block, each block's physical
//! allocation retained and exported as a fabric handle; when a registration whose handles a
//! peer holds ends, its blocks are retired (`retire.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::device::Device;
use crate::device::acl::Acl;
use crate::device::own_export;
use crate::error::Error;
use crate::transport::Region;
use crate::transport::ascend::options::AscendOptions;
use crate::types::MemType;
use crate::wire::FABRIC_HANDLE_LEN;

/// A fabric-memory engine's runtime: its device (ACL, with the VMM entry points; no HCCL).
pub(crate) struct FabricRt {
    pub(crate) device: Arc<Device>,
    /// `fabric_memory.task_stream_num` (default 1).
    pub(super) streams: usize,
}

impl std::fmt::Debug for FabricRt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricRt")
            .field("device", &self.device)
            .field("acl", &self.acl().library())
            .field("streams", &self.streams)
            .finish()
    }
}

impl FabricRt {
    /// Loads ACL (no HCCL: the fabric path needs none), checks it has the VMM entry points and
    /// takes the calling thread's device as [`Device::open`] does.
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] (`UNSUPPORTED`) for a missing library or symbol;
    /// [`Error::Native`] from ACL.
    pub(crate) fn start(o: &AscendOptions) -> Result<Arc<Self>, Error> {
        let acl = Acl::load(o.acl_lib.as_deref())?;
        acl.check_vmm()?;
        let device = Device::open(acl, o.device_id, o.require_device)?;
        let streams = o
            .global_resource_config
            .as_ref()
            .and_then(|g| g.fabric_task_stream_num)
            .unwrap_or(1)
            .clamp(1, 8) as usize;
        Ok(Arc::new(Self {
            device: Arc::new(device),
            streams,
        }))
    }

    pub(super) fn acl(&self) -> &Acl {
        &self.device.acl
    }

    /// The live device allocation of ACL (`(base, size)`) that holds `addr..addr + len`, or why
    /// there is none: `aclrtMemGetAddressRange` gives the allocation holding `addr` (it must
    /// hold the whole range), `aclrtPointerGetAttributes` its location (it must be the device).
    /// Upstream's FabricMem engine copies such local memory without a registration (its
    /// benchmarks' `--memory=device` initiator does).
    ///
    /// # Errors
    /// Why not, for the caller's message.
    pub(crate) fn device_allocation(
        &self,
        addr: usize,
        len: usize,
    ) -> Result<(usize, usize), &'static str> {
        let Ok(_g) = self.device.enter() else {
            return Err("the engine's device could not be entered to ask ACL about it");
        };
        let Some(end) = addr.checked_add(len) else {
            return Err("the range overflows");
        };
        let holds = |&(base, size): &(usize, usize)| {
            len != 0 && base <= addr && base.checked_add(size).is_some_and(|e| e >= end)
        };
        let Some((base, size)) = self.acl().address_range(addr).ok().filter(holds) else {
            return Err("it is not inside one live ACL allocation (aclrtMemGetAddressRange)");
        };
        match self.acl().pointer_attributes(addr) {
            Ok(attr) if attr.location.is_device() => Ok((base, size)),
            _ => Err("it is not device memory (aclrtPointerGetAttributes)"),
        }
    }

    /// Walks `addr..addr + len` block by block (`aclrtMemGetAddressRange`): a block the
    /// engine's allocator made ([`malloc_mem`](crate::device::fabric::malloc_mem)) takes the
    /// allocator's handle and its export (made once); another block's physical allocation is
    /// retained and exported.
    ///
    /// # Errors
    /// [`Error::UnsupportedMemory`] for memory that is not VMM memory; [`Error::Native`].
    pub(super) fn export_range(
        self: &Arc<Self>,
        addr: usize,
        len: usize,
        mem_type: MemType,
    ) -> Result<FabricReg, Error> {
        let _g = self.device.enter()?;
        let acl = self.acl();
        let mut reg = FabricReg {
            rt: self.clone(),
            blocks: Vec::new(),
            shared: AtomicBool::new(false),
        };
        let end = addr
            .checked_add(len)
            .ok_or(Error::AddressOverflow { addr, len })?;
        let mut p = addr;
        let not_vmm = |e: Error| {
            tracing::debug!(error = %e, "not VMM memory");
            Error::UnsupportedMemory {
                mem_type,
                why: "a fabric-memory engine (EnableUseFabricMem=1) registers ACL virtual memory \
                      only: MallocMem's, or physical memory the caller mapped with aclrtMapMem",
            }
        };
        while p < end {
            let (base, size) = acl.address_range(p).map_err(not_vmm)?;
            if size == 0 || base > p || base.saturating_add(size) <= p {
                return Err(not_vmm(acl.error("aclrtMemGetAddressRange", 0)));
            }
            // the allocator's own memory: its handle and its export, made once (upstream's
            // `ExportToShareableHandle`); a second export of one handle fails, and HDK 25.5
            // has no retain. Other memory: retained and exported here.
            let (phys, exported, retained) = match own_export(base) {
                Some(own) => {
                    let (phys, handle) = own?;
                    (phys, Ok(handle), false)
                }
                None => {
                    let phys = acl.retain_allocation(base).map_err(not_vmm)?;
                    // SAFETY: `phys` is live: just retained, and released only when `reg` drops.
                    (phys, unsafe { acl.export_fabric(phys) }, true)
                }
            };
            // (a retained handle is kept even when its export failed: `reg`'s drop releases it)
            reg.blocks.push(Block {
                base,
                len: size,
                phys,
                handle: *exported.as_ref().unwrap_or(&[0; FABRIC_HANDLE_LEN]),
                retained,
            });
            exported?;
            p = base + size;
        }
        Ok(reg)
    }
}

/// One VMM block of a registered region: its range, its physical handle (retained, or the
/// allocator's) and its fabric handle.
#[derive(Clone)]
pub(super) struct Block {
    pub(super) base: usize,
    pub(super) len: usize,
    pub(super) phys: usize,
    pub(super) handle: [u8; FABRIC_HANDLE_LEN],
    /// `phys` is a reference this registration retained (released when it ends); else the
    /// allocator's own handle, which the allocator releases.
    pub(super) retained: bool,
}

/// A region's fabric registration: the retained handles (released when it drops) and the
/// exported fabric handles peers import.
pub(crate) struct FabricReg {
    rt: Arc<FabricRt>,
    pub(super) blocks: Vec<Block>,
    /// Its handles were sent to a peer: when it ends, its memory is moved away from what the
    /// peer imported (`retire`).
    pub(super) shared: AtomicBool,
}

impl Drop for FabricReg {
    fn drop(&mut self) {
        let shared = self.shared.load(Ordering::SeqCst);
        for b in &self.blocks {
            if shared {
                if let Err(e) = self.rt.retire(b) {
                    tracing::error!(addr = b.base, len = b.len, error = %e,
                        "a fabric region could not be moved away from its peers' imports: a peer that kept its import can still reach it");
                }
                continue;
            }
            if !b.retained {
                continue; // the allocator's handle: its `free_mem` releases it
            }
            // SAFETY: a handle retained by `export_range`, released once.
            if let Err(e) = unsafe { self.rt.acl().free_physical(b.phys) } {
                tracing::warn!("aclrtFreePhysical of a retained handle failed: {e}");
            }
        }
    }
}

/// A region's fabric registration, if it has one.
pub(super) fn fabric_reg(region: &dyn Region) -> Option<&FabricReg> {
    region
        .registrations()
        .iter()
        .find_map(|r| (**r).downcast_ref::<FabricReg>())
}
