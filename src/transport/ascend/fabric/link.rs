//! The client side of a fabric link: the server's blocks imported and mapped into this
//! process (by region), a batch translated onto those mappings and copied on the link's
//! streams, the self-link's overlap rule, and the watch on the server's end (a server that
//! stopped has moved its memory away: `retire`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{FabricRt, GRANULE, LiveLink, ffi};
use crate::device::acl::Stream;
use crate::error::Error;
use crate::sync::lock;
use crate::transport::{Batch, DataPath, PathFail, TransportKind};
use crate::types::{BatchDesc, TransferOp};
use crate::wire::FabricBlock;

/// A peer's block, imported and mapped into a reservation of this process.
struct Imported {
    rt: Arc<FabricRt>,
    phys: usize,
    va: usize,
    reserved: usize,
    mapped: bool,
    /// The block in the peer's address space.
    peer_base: u64,
    len: usize,
}

impl Drop for Imported {
    fn drop(&mut self) {
        let api = &self.rt.api;
        // SAFETY: what `import_block` made, each released once, the mapping before the
        // reservation, the handle last.
        unsafe {
            if self.mapped && (api.unmap)(self.va as *mut c_void) != 0 {
                tracing::warn!("aclrtUnmapMem of a peer's block failed");
                return; // the reservation and the memory stay rather than be reused
            }
            if self.va != 0 && (api.release)(self.va as *mut c_void) != 0 {
                tracing::warn!("aclrtReleaseMemAddress of a peer's block failed");
            }
            if (api.free_physical)(self.phys as *mut c_void) != 0 {
                tracing::warn!("aclrtFreePhysical of an imported handle failed");
            }
        }
    }
}

fn import_block(rt: &Arc<FabricRt>, b: &FabricBlock) -> Result<Imported, Error> {
    let len = usize::try_from(b.len).map_err(|_| Error::AddressOverflow {
        addr: b.base as usize,
        len: usize::MAX,
    })?;
    let mut handle = b.handle;
    let mut h: *mut c_void = std::ptr::null_mut();
    // SAFETY: `handle` is 128 readable bytes; `h` an out-pointer.
    let rc = unsafe { (rt.api.import)(handle.as_mut_ptr().cast(), ffi::SHARE_FABRIC, 0, &mut h) };
    rt.check("aclrtMemImportFromShareableHandleV2", rc)?;
    let mut imp = Imported {
        rt: rt.clone(),
        phys: h as usize,
        va: 0,
        reserved: len.div_ceil(GRANULE) * GRANULE,
        mapped: false,
        peer_base: b.base,
        len,
    };
    let mut va: *mut c_void = std::ptr::null_mut();
    // SAFETY: out-pointer; the size is a multiple of the granularity.
    let rc = unsafe { (rt.api.reserve)(&mut va, imp.reserved, 0, std::ptr::null_mut(), 1) };
    rt.check("aclrtReserveMemAddress", rc)?;
    imp.va = va as usize;
    // SAFETY: a fresh reservation of this process, and a live imported handle.
    let rc = unsafe { (rt.api.map)(va, imp.reserved, 0, h, 0) };
    rt.check("aclrtMapMem", rc)?;
    imp.mapped = true;
    Ok(imp)
}

/// On a link to this engine itself, where a remote range is this process's memory at the
/// address `table` gives its region: refuses a batch in which a descriptor's source overlaps a
/// destination (its own or another's) with [`Error::OverlappingTransfer`]. The copies run on
/// several streams in no defined order, so such a batch has no defined result; refused,
/// nothing moves. (Destinations overlapping each other are the caller's affair, as on any
/// link; a descriptor whose region is not in `table` is left to the translation's refusal.)
pub(super) fn loopback_overlap(
    op: TransferOp,
    descs: &[BatchDesc],
    table: &HashMap<u32, u64>,
) -> Result<(), Error> {
    // (start, end, descriptor, is the destination)
    let mut spans: Vec<(u64, u64, usize, bool)> = Vec::with_capacity(2 * descs.len());
    for (i, d) in descs.iter().enumerate() {
        let Some(remote) = table
            .get(&d.remote.region)
            .and_then(|a| a.checked_add(d.remote.offset))
        else {
            continue;
        };
        let local = d.local as u64;
        let len = d.remote.len;
        let (dst, src) = match op {
            TransferOp::Write => (remote, local),
            TransferOp::Read => (local, remote),
        };
        spans.push((src, src.saturating_add(len), i, false));
        spans.push((dst, dst.saturating_add(len), i, true));
    }
    spans.sort_unstable_by_key(|s| s.0);
    // the furthest-reaching source and destination seen so far: a span overlaps a span of the
    // other kind that started no later than it iff that one reaches past its start
    let (mut src_end, mut dst_end) = ((0u64, 0usize), (0u64, 0usize));
    for &(start, end, i, is_dst) in &spans {
        let (other, mine) = if is_dst {
            (src_end, &mut dst_end)
        } else {
            (dst_end, &mut src_end)
        };
        if other.0 > start {
            let (src, dst) = if is_dst { (other.1, i) } else { (i, other.1) };
            return Err(Error::OverlappingTransfer { src, dst });
        }
        if end > mine.0 {
            *mine = (end, i);
        }
    }
    Ok(())
}

/// The client side of a fabric link: the server's blocks, mapped here, by region.
pub(crate) struct FabricLink {
    rt: Arc<FabricRt>,
    peer: String,
    /// Server region id → its start in the server's address space.
    table: HashMap<u32, u64>,
    /// Server region id → its blocks, mapped here.
    blocks: HashMap<u32, Vec<Imported>>,
    streams: Vec<Stream>,
    /// The link is this engine's link to itself: the server's addresses are this process's.
    pub(super) loopback: bool,
    /// The link's control connection (a copy), watched for the server's end.
    pub(super) watch: Option<std::net::TcpStream>,
    _live: LiveLink,
}

impl FabricLink {
    pub(super) fn import(
        rt: &Arc<FabricRt>,
        peer: &str,
        blocks: &[FabricBlock],
        table: &[crate::wire::TableEntry],
        live: &Arc<AtomicUsize>,
    ) -> Result<Self, Error> {
        let _g = rt.device.enter()?;
        let table: HashMap<u32, u64> = table.iter().map(|e| (e.id, e.addr)).collect();
        let mut by_region: HashMap<u32, Vec<Imported>> = HashMap::new();
        for b in blocks {
            if !table.contains_key(&b.region) {
                continue; // a region the peer's table does not list: never reached
            }
            let imp = import_block(rt, b)?;
            by_region.entry(b.region).or_default().push(imp);
        }
        let mut streams = Vec::with_capacity(rt.streams);
        for _ in 0..rt.streams {
            streams.push(rt.acl().create_stream()?);
        }
        tracing::debug!(
            peer,
            blocks = blocks.len(),
            "fabric handles imported and mapped"
        );
        Ok(Self {
            rt: rt.clone(),
            peer: peer.to_owned(),
            table,
            blocks: by_region,
            streams,
            loopback: false,
            watch: None,
            _live: LiveLink::new(live),
        })
    }

    /// Whether the server closed the link's control connection (it stopped serving).
    fn peer_gone(&self) -> bool {
        self.watch.as_ref().is_some_and(crate::process::hung_up)
    }

    /// The local mapping of a remote range (`None`: no block of the region holds it whole).
    fn translate(&self, d: &BatchDesc) -> Option<usize> {
        let start = self
            .table
            .get(&d.remote.region)?
            .checked_add(d.remote.offset)?;
        let end = start.checked_add(d.remote.len)?;
        self.blocks.get(&d.remote.region)?.iter().find_map(|b| {
            (start >= b.peer_base && end <= b.peer_base + b.len as u64)
                .then(|| b.va + (start - b.peer_base) as usize)
        })
    }

    /// On a link to this engine itself: [`loopback_overlap`] over the batch.
    fn check_loopback(&self, op: TransferOp, descs: &[BatchDesc]) -> Result<(), Error> {
        if !self.loopback {
            return Ok(());
        }
        loopback_overlap(op, descs, &self.table)
    }

    fn abort_all(&self) {
        for s in &self.streams {
            if let Err(e) = self.rt.acl().abort(s) {
                tracing::error!(peer = %self.peer, "aclrtStreamAbort failed after a failed fabric transfer: {e}");
            }
        }
    }

    /// Copies the batch and waits for it.
    ///
    /// # Safety
    /// As [`DataPath::run`].
    unsafe fn transfer(
        &self,
        op: TransferOp,
        descs: &[BatchDesc],
        deadline: Instant,
    ) -> Result<(), Error> {
        self.check_loopback(op, descs)?;
        let mut plan = Vec::with_capacity(descs.len());
        for d in descs {
            let Some(remote) = self.translate(d) else {
                return Err(Error::UnknownRemoteRegion {
                    peer: self.peer.clone(),
                    region: d.remote.region,
                    offset: d.remote.offset,
                    len: d.remote.len,
                });
            };
            let len = d.remote.len as usize;
            let (dst, src) = match op {
                TransferOp::Write => (remote, d.local),
                TransferOp::Read => (d.local, remote),
            };
            plan.push((dst, src, len));
        }
        let _g = self.rt.device.enter()?;
        for (i, &(dst, src, len)) in plan.iter().enumerate() {
            let s = &self.streams[i % self.streams.len()];
            // SAFETY: both ranges are mapped memory of this process (the local one registered
            // and kept by the caller, the remote one a live mapping of the peer's block held by
            // this link); a failure aborts the streams before the call returns.
            let rc = unsafe {
                (self.rt.api.memcpy_async)(
                    dst as *mut c_void,
                    len,
                    src as *const c_void,
                    len,
                    ffi::ACL_MEMCPY_DEVICE_TO_DEVICE,
                    s.as_raw(),
                )
            };
            if let Err(e) = self.rt.check("aclrtMemcpyAsync", rc) {
                self.abort_all();
                return Err(e);
            }
        }
        let opname = match op {
            TransferOp::Write => "write",
            TransferOp::Read => "read",
        };
        for s in &self.streams {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            if let Err(e) = self.rt.acl().synchronize(s, left, opname, &self.peer) {
                self.abort_all();
                return Err(e);
            }
        }
        Ok(())
    }
}

impl DataPath for Mutex<Option<FabricLink>> {
    fn kind(&self) -> TransportKind {
        TransportKind::Ascend
    }

    /// Every batch whose remote ranges lie in blocks the server sent (the rest: PARAM_INVALID
    /// from `run`, when nothing else covers them).
    fn reaches(&self, region: u32) -> bool {
        let g = lock(self);
        let Some(l) = g.as_ref() else { return true };
        l.blocks.contains_key(&region)
    }

    fn fenced(&self) -> bool {
        false
    }

    /// A client on the server's host copies inside the server's fence: the server's `finalize`
    /// revokes it and waits for its batches before it moves its memory away (`retire`).
    fn enters_fence(&self) -> bool {
        true
    }

    fn refused_when_broken(&self) -> bool {
        true
    }

    fn moves_device_memory(&self) -> bool {
        true
    }

    fn close(&self) {
        drop(lock(self).take());
    }

    unsafe fn run(&self, batch: &Batch<'_>) -> Result<(), PathFail> {
        batch.start(None)?;
        let g = lock(self);
        let Some(l) = g.as_ref() else {
            return Err(PathFail::Failed(Error::NotConnected {
                peer: batch.peer.to_owned(),
                why: "disconnected".into(),
            }));
        };
        // a server that stopped (its connection closed) has moved its memory away from what
        // this link imported: nothing starts, and a batch it overlapped is not reported done
        let gone = |when: &str| {
            let why = format!("the server closed the link {when} (it stopped serving)");
            PathFail::Gone(why)
        };
        if l.peer_gone() {
            return Err(gone("before this transfer started"));
        }
        // SAFETY: forwarded from the caller.
        unsafe { l.transfer(batch.op, &batch.descs.expand(), batch.deadline) }
            .map_err(PathFail::Failed)?;
        if l.peer_gone() {
            return Err(gone(
                "while this transfer ran; its bytes may not be in its memory",
            ));
        }
        Ok(())
    }
}
