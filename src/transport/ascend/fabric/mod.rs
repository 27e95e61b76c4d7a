//! Fabric memory (`EnableUseFabricMem=1`), HIXL's FabricMem engine on its host-copy path
//! (upstream's `fabric_memory.enable_aicpu_unfold=false`): memory is ACL virtual memory (VMM:
//! `aclrtReserveMemAddress` + `aclrtMallocPhysical` + `aclrtMapMem`), exchanged as fabric
//! shareable handles; the importer maps the exporter's physical memory into its own address
//! space and copies with `aclrtMemcpyAsync` (device to device) on the link's streams. No HCCL.
//!
//! - Registration ([`FabricBackend`]'s `register`): every region must be VMM memory. The range
//!   is walked with `aclrtMemGetAddressRange`; each block's physical allocation is retained
//!   (`aclrtMemRetainAllocationHandle`) and exported
//!   (`aclrtMemExportToShareableHandleV2`, `FABRIC`); memory the engine's allocator made
//!   ([`malloc_mem`]) and "foreign" VMM memory the caller mapped itself are treated alike.
//! - Connect (client): FABRIC_HELLO, answered by FABRIC_WELCOME with the server's blocks
//!   (`wire::FabricInfo`); each is imported (`aclrtMemImportFromShareableHandleV2`), mapped into
//!   a reservation of this process, and remembered by the server's region id.
//! - Transfer: each descriptor's remote range is translated to the local mapping of the block
//!   that holds it (none: `PARAM_INVALID`), copied with `aclrtMemcpyAsync` round-robin over
//!   `fabric_memory.task_stream_num` streams, then each stream is synchronised; a failure
//!   aborts the streams before the call returns, so no copy touches memory afterwards.
//! - While any link of the engine (made or served) is up, deregistration is refused with
//!   `FAILED` ("Disconnect peers before deregistering memory"), upstream's rule.
//! - A fabric-memory engine may connect to itself, as upstream's FabricMem engine does (its kv
//!   benchmark links each engine to itself); hixl's other engines refuse (`PARAM_INVALID`, as
//!   upstream's). The self-link is an ordinary link through the engine's own listener: its
//!   own handles imported and mapped a second time, so a transfer copies between this
//!   process's own regions. As the server's addresses are this process's, a batch whose
//!   source range overlaps a destination range (of the same or another descriptor) is refused
//!   before anything moves (`Error::OverlappingTransfer`, `PARAM_INVALID`): the copies run on
//!   several streams in no defined order. Deregistration (refused while the link is up, and
//!   in the typed API impossible while a `Link` borrows the engine) and finalize (which closes
//!   the link first) are as with any peer; an allow-list must name the engine itself.
//!
//! The AICPU path (upstream's default, `enable_aicpu_unfold=true`: copies unfolded by an AICPU
//! kernel in `libcann_hixl_kernel.so`) is not implemented: asking for it is `UNSUPPORTED`.

mod alloc;
mod buffer;
pub(crate) mod ffi;
mod link;
mod retire;

pub use alloc::{export_to_shareable_handle, free_mem, malloc_mem};
pub use buffer::FabricBuffer;

use link::FabricLink;
#[cfg(test)]
use link::loopback_overlap;

use std::any::Any;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use self::ffi::FabricApi;
use super::options::AscendOptions;
use crate::device::Device;
use crate::device::acl::Acl;
use crate::error::{Error, Status};
use crate::sync::lock;
use crate::transport::{
    Accept, AcceptFail, Backend, DataPath, Region, Regions, Registration, Setup, TransportKind,
};
use crate::types::{Access, MemType};
use crate::wire::{FABRIC_HANDLE_LEN, FabricBlock, FabricInfo, Kind};

/// The VMM granularity the reservations and mappings are rounded to.
const GRANULE: usize = 2 << 20;

/// Why the AICPU path is refused.
pub(crate) const NO_AICPU: &str = "fabric memory's AICPU path (GlobalResourceConfig \
     fabric_memory.enable_aicpu_unfold=true) needs HIXL's AICPU kernels (libcann_hixl_kernel.so), \
     which hixl does not have; set it to false (or leave it unset) for the host-copy path";

/// The options keys HIXL accepts with `EnableUseFabricMem=1` (canonical names; hixl's own
/// `hixl.*` keys are accepted too).
const FABRIC_KEYS: &[&str] = &[
    "EnableUseFabricMem",
    "RdmaTrafficClass",
    "RdmaServiceLevel",
    "LocalCommRes",
    "BufferPool",
    "AutoConnect",
    "GlobalResourceConfig",
];

/// Checks HIXL's rules for the options of a fabric-memory engine: only [`FABRIC_KEYS`] (and
/// hixl's own), `BufferPool` `"0:0"` if given, and the host-copy path.
///
/// # Errors
/// [`Error::InvalidOption`] (`PARAM_INVALID`) for another key or another buffer pool;
/// [`Error::UnsupportedOption`] (`UNSUPPORTED`) for the AICPU path.
pub(crate) fn check_options(
    hixl: &std::collections::BTreeMap<String, String>,
    o: &AscendOptions,
) -> Result<(), Error> {
    for (k, v) in hixl {
        if k.starts_with("hixl.") || FABRIC_KEYS.contains(&k.as_str()) {
            if k == "BufferPool" && v != "0:0" {
                return Err(Error::InvalidOption {
                    key: k.clone(),
                    value: v.clone(),
                    problem: "\"0:0\" with EnableUseFabricMem=1 (fabric memory has no buffer pool)",
                });
            }
            continue;
        }
        return Err(Error::InvalidOption {
            key: k.clone(),
            value: v.clone(),
            problem: "not an option of a fabric-memory engine (EnableUseFabricMem=1 accepts \
                      Rdma*, LocalCommRes, BufferPool, AutoConnect, GlobalResourceConfig)",
        });
    }
    if let Some(g) = &o.global_resource_config
        && g.fabric_enable_aicpu_unfold == Some(true)
    {
        return Err(Error::UnsupportedOption {
            key: "GlobalResourceConfig".into(),
            value: "fabric_memory.enable_aicpu_unfold=true".into(),
            why: NO_AICPU,
        });
    }
    Ok(())
}

/// A fabric-memory engine's runtime: its device (ACL, no HCCL) and the VMM entry points.
pub(crate) struct FabricRt {
    pub(crate) device: Arc<Device>,
    pub(crate) api: FabricApi,
    /// `fabric_memory.task_stream_num` (default 1).
    streams: usize,
}

impl std::fmt::Debug for FabricRt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricRt")
            .field("device", &self.device)
            .field("acl", &self.api.library())
            .field("streams", &self.streams)
            .finish()
    }
}

impl FabricRt {
    /// Loads ACL (no HCCL: the fabric path needs none), takes the calling thread's device as
    /// [`Device::open`] does, and looks up the VMM entry points.
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] (`UNSUPPORTED`) for a missing library or symbol;
    /// [`Error::Native`] from ACL.
    pub(crate) fn start(o: &AscendOptions) -> Result<Arc<Self>, Error> {
        let acl = Acl::load(o.acl_lib.as_deref())?;
        let api = FabricApi::load(acl.library())?;
        let device = Device::open(acl, o.device_id, o.require_device)?;
        let streams = o
            .global_resource_config
            .as_ref()
            .and_then(|g| g.fabric_task_stream_num)
            .unwrap_or(1)
            .clamp(1, 8) as usize;
        Ok(Arc::new(Self {
            device: Arc::new(device),
            api,
            streams,
        }))
    }

    fn acl(&self) -> &Acl {
        &self.device.acl
    }

    fn check(&self, call: &'static str, rc: i32) -> Result<(), Error> {
        if rc == 0 {
            Ok(())
        } else {
            Err(self.acl().error(call, rc))
        }
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
        let (mut base, mut size): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: plain out-pointers; `addr` is only looked up, not dereferenced.
        let rc = unsafe { (self.api.address_range)(addr as *mut c_void, &mut base, &mut size) };
        let base = base as usize;
        if rc != 0 || len == 0 || base > addr || base.checked_add(size).is_none_or(|e| e < end) {
            return Err("it is not inside one live ACL allocation (aclrtMemGetAddressRange)");
        }
        let mut attr = ffi::PtrAttributes::default();
        // SAFETY: as above; `attr` is a writable aclrtPtrAttributes.
        let rc = unsafe { (self.api.pointer_attributes)(addr as *const c_void, &mut attr) };
        if rc != 0 || attr.location.kind != ffi::LOCATION_DEVICE {
            return Err("it is not device memory (aclrtPointerGetAttributes)");
        }
        Ok((base, size))
    }

    /// Walks `addr..addr + len` block by block (`aclrtMemGetAddressRange`), retaining and
    /// exporting each block's physical allocation.
    ///
    /// # Errors
    /// [`Error::UnsupportedMemory`] for memory that is not VMM memory; [`Error::Native`].
    fn export_range(
        self: &Arc<Self>,
        addr: usize,
        len: usize,
        mem_type: MemType,
    ) -> Result<FabricReg, Error> {
        let _g = self.device.enter()?;
        let mut reg = FabricReg {
            rt: self.clone(),
            blocks: Vec::new(),
            shared: Default::default(),
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
            let (mut base, mut size): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
            // SAFETY: plain out-pointers; `p` is only looked up, not dereferenced.
            let rc = unsafe { (self.api.address_range)(p as *mut c_void, &mut base, &mut size) };
            self.check("aclrtMemGetAddressRange", rc).map_err(not_vmm)?;
            let base = base as usize;
            if size == 0 || base > p || base.saturating_add(size) <= p {
                return Err(not_vmm(self.acl().error("aclrtMemGetAddressRange", 0)));
            }
            let mut h: *mut c_void = std::ptr::null_mut();
            // SAFETY: as above.
            let rc = unsafe { (self.api.retain)(base as *mut c_void, &mut h) };
            self.check("aclrtMemRetainAllocationHandle", rc)
                .map_err(not_vmm)?;
            let mut block = Block {
                base,
                len: size,
                phys: h as usize,
                handle: [0; FABRIC_HANDLE_LEN],
            };
            // SAFETY: `h` is a live physical handle; the output is 128 writable bytes.
            let rc = unsafe {
                (self.api.export)(
                    h,
                    ffi::EXPORT_DISABLE_PID_VALIDATION,
                    ffi::SHARE_FABRIC,
                    block.handle.as_mut_ptr().cast(),
                )
            };
            reg.blocks.push(block.clone());
            self.check("aclrtMemExportToShareableHandleV2", rc)?;
            p = base + size;
        }
        Ok(reg)
    }
}

/// One VMM block of a registered region: its range, its retained physical handle and its
/// fabric handle.
#[derive(Clone)]
struct Block {
    base: usize,
    len: usize,
    phys: usize,
    handle: [u8; FABRIC_HANDLE_LEN],
}

/// A region's fabric registration: the retained handles (released when it drops) and the
/// exported fabric handles peers import.
pub(crate) struct FabricReg {
    rt: Arc<FabricRt>,
    blocks: Vec<Block>,
    /// Its handles were sent to a peer: when it ends, its memory is moved away from what the
    /// peer imported ([`retire`]).
    shared: std::sync::atomic::AtomicBool,
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
            // SAFETY: a handle retained by `export_range`, released once.
            let rc = unsafe { (self.rt.api.free_physical)(b.phys as *mut c_void) };
            if rc != 0 {
                tracing::warn!("aclrtFreePhysical of a retained handle failed: {rc}");
            }
        }
    }
}

fn fabric_reg(region: &dyn Region) -> Option<&FabricReg> {
    region
        .registrations()
        .iter()
        .find_map(|r| (**r).downcast_ref::<FabricReg>())
}

/// Counts an engine's live fabric links (both sides) while it is held.
struct LiveLink(Arc<AtomicUsize>);

impl LiveLink {
    fn new(n: &Arc<AtomicUsize>) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Self(n.clone())
    }
}

impl Drop for LiveLink {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Fabric memory for one engine; without a runtime (an engine that is not a fabric-memory one)
/// it only answers a fabric client's FABRIC_HELLO with a refusal that says why.
pub(crate) struct FabricBackend {
    rt: Option<Arc<FabricRt>>,
    regions: Mutex<Regions>,
    live: Arc<AtomicUsize>,
}

impl FabricBackend {
    /// The backend of a fabric-memory engine.
    pub(crate) fn new(rt: Arc<FabricRt>) -> Self {
        Self {
            rt: Some(rt),
            regions: Mutex::new(Vec::new()),
            live: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The backend of an engine that is not a fabric-memory one.
    pub(crate) fn refuser() -> Self {
        Self {
            rt: None,
            regions: Mutex::new(Vec::new()),
            live: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Backend for FabricBackend {
    fn kind(&self) -> TransportKind {
        TransportKind::Ascend
    }

    unsafe fn register(
        &self,
        addr: usize,
        len: usize,
        mem_type: MemType,
    ) -> Result<Option<Registration>, Error> {
        let Some(rt) = &self.rt else { return Ok(None) };
        let reg = rt.export_range(addr, len, mem_type)?;
        Ok(Some(Box::new(reg)))
    }

    fn activate(&self, regions: &Regions, _serving: bool, _span: &tracing::Span) {
        if self.rt.is_some() {
            *lock(&self.regions) = regions.clone();
        }
    }

    fn deactivate(&self) {
        lock(&self.regions).clear();
    }

    fn region_added(&self, region: &Arc<dyn Region>) {
        if self.rt.is_some() {
            lock(&self.regions).push(region.clone());
        }
    }

    fn region_withdrawn(&self, id: u32) {
        lock(&self.regions).retain(|r| r.view().id != id);
    }

    fn deregistration_blocked(&self) -> Option<&'static str> {
        (self.live.load(Ordering::SeqCst) > 0)
            .then_some("Disconnect peers before deregistering memory (fabric memory)")
    }

    fn connect(&self, setup: &mut Setup<'_>) -> Result<Option<Box<dyn DataPath>>, Error> {
        let Some(rt) = &self.rt else { return Ok(None) };
        let deadline = setup.deadline;
        let mut out = Vec::new();
        FabricInfo::default().encode(Kind::FabricHello, &mut out);
        setup.ctl.send(&out, deadline)?;
        let theirs = match setup.ctl.recv(deadline)? {
            (Kind::FabricWelcome, p) => {
                FabricInfo::decode(&p).map_err(|e| setup.ctl.protocol(e.to_string()))?
            }
            (k, _) => {
                return Err(setup
                    .ctl
                    .protocol(format!("expected FabricWelcome, got {k:?}")));
            }
        };
        if theirs.status != 0 {
            return Err(setup
                .ctl
                .refused(Status::from_peer(theirs.status), theirs.reason));
        }
        let mut link = FabricLink::import(rt, setup.peer, &theirs.blocks, setup.table, &self.live)?;
        link.loopback = setup.loopback;
        link.watch = setup.ctl.watch().ok();
        Ok(Some(Box::new(Mutex::new(Some(link)))))
    }

    fn request_kind(&self) -> Option<Kind> {
        Some(Kind::FabricHello)
    }

    fn accept(&self, req: Accept<'_>) -> Result<Option<Box<dyn Any + Send>>, AcceptFail> {
        let hello = FabricInfo::decode(req.payload).map_err(AcceptFail::Violation)?;
        let mut info = FabricInfo::default();
        if self.rt.is_none() {
            info.status = Status::UNSUPPORTED.code();
            info.reason = "this engine does not use fabric memory (EnableUseFabricMem=1 on both \
                           sides)"
                .into();
        } else if hello.status != 0 || !hello.blocks.is_empty() {
            info.status = Status::PARAM_INVALID.code();
            info.reason = "FABRIC_HELLO carries neither a status nor blocks".into();
        } else {
            for r in lock(&self.regions).iter() {
                let v = r.view();
                if v.access == Access::None {
                    continue;
                }
                let Some(reg) = fabric_reg(&**r) else {
                    continue;
                };
                // from now on a peer may hold these blocks: the region is retired when it ends
                reg.shared.store(true, Ordering::SeqCst);
                info.blocks.extend(reg.blocks.iter().map(|b| FabricBlock {
                    region: v.id,
                    base: b.base as u64,
                    len: b.len as u64,
                    handle: b.handle,
                }));
            }
        }
        let mut out = Vec::new();
        info.encode(Kind::FabricWelcome, &mut out);
        (req.send)(&out).map_err(AcceptFail::Io)?;
        if info.status != 0 {
            return Ok(None);
        }
        tracing::debug!(
            client = req.client,
            blocks = info.blocks.len(),
            "fabric handles sent"
        );
        Ok(Some(Box::new(LiveLink::new(&self.live))))
    }
}

#[cfg(test)]
mod tests;
