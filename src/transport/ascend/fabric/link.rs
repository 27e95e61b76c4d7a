//! The client side of a fabric link: the server's blocks imported and mapped into this
//! process (by region), a batch translated onto those mappings and copied on the link's
//! streams, the self-link's overlap rule, and the watch on the server's end (a server that
//! stopped has moved its memory away: `retire`); and the count of the links an engine made
//! ([`LiveLink`]: its imports of peers' memory, upstream's channels).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::rt::FabricRt;
use crate::device::acl::{Stream, VMM_GRANULE};
use crate::error::Error;
use crate::transport::ascend::path::AscendLink;
use crate::transport::{Batch, PathFail};
use crate::types::{BatchDesc, TransferOp};
use crate::wire::FabricBlock;

/// Counts a fabric link this engine made (a client's: it holds imports of the peer's memory)
/// while it is held. Deregistration is refused while any is held (upstream's `HasChannels`);
/// links it serves are not counted: a region whose handles a peer imported is retired when its
/// registration ends (`retire.rs`), so deregistering it while served keeps the peer's writes
/// out of the memory handed back.
pub(super) struct LiveLink(Arc<AtomicUsize>);

impl LiveLink {
    pub(super) fn new(n: &Arc<AtomicUsize>) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Self(n.clone())
    }
}

impl Drop for LiveLink {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

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
        let acl = self.rt.acl();
        // SAFETY: what `import_block` made, each released once, the mapping before the
        // reservation, the handle last; the link that used the mapping is gone.
        unsafe {
            if self.mapped && acl.unmap(self.va).is_err() {
                tracing::warn!("aclrtUnmapMem of a peer's block failed");
                return; // the reservation and the memory stay rather than be reused
            }
            if self.va != 0 && acl.release(self.va).is_err() {
                tracing::warn!("aclrtReleaseMemAddress of a peer's block failed");
            }
            if acl.free_physical(self.phys).is_err() {
                tracing::warn!("aclrtFreePhysical of an imported handle failed");
            }
        }
    }
}

fn import_block(rt: &Arc<FabricRt>, b: &FabricBlock) -> Result<Imported, Error> {
    // the peer's length, and the reservation it takes (whole granules): checked before anything
    // is imported
    let overflow = || Error::AddressOverflow {
        addr: b.base as usize,
        len: usize::MAX,
    };
    let len = usize::try_from(b.len).map_err(|_| overflow())?;
    let reserved = len
        .checked_next_multiple_of(VMM_GRANULE)
        .ok_or_else(overflow)?;
    let acl = rt.acl();
    let phys = acl.import_fabric(&b.handle)?;
    let mut imp = Imported {
        rt: rt.clone(),
        phys,
        va: 0,
        reserved,
        mapped: false,
        peer_base: b.base,
        len,
    };
    imp.va = acl.reserve(imp.reserved)?;
    // SAFETY: a fresh reservation of this process, and a live imported handle.
    unsafe { acl.map(imp.va, imp.reserved, phys) }?;
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
    /// A failed batch's streams could not be aborted: the device may still run its copies into
    /// the imported mappings, so the link is poisoned and, when it goes, its imports and
    /// streams are leaked rather than unmapped and destroyed under them (as the HCCL path).
    stuck: AtomicBool,
    _live: LiveLink,
}

impl Drop for FabricLink {
    fn drop(&mut self) {
        if self.stuck.load(Ordering::Acquire) {
            let blocks: usize = self.blocks.values().map(Vec::len).sum();
            tracing::error!(
                peer = %self.peer,
                "a device stream of this link could not be aborted; leaking its {blocks} imported \
                 blocks and {} streams",
                self.streams.len()
            );
            std::mem::forget(std::mem::take(&mut self.blocks));
            std::mem::forget(std::mem::take(&mut self.streams));
        }
    }
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
            stuck: AtomicBool::new(false),
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

    /// Aborts every stream after a failed batch; one that cannot be aborted makes the link
    /// [`stuck`](Self::stuck).
    fn abort_all(&self) {
        for s in &self.streams {
            if let Err(e) = self.rt.acl().abort(s) {
                tracing::error!(peer = %self.peer, "aclrtStreamAbort failed after a failed fabric transfer: {e}");
                self.stuck.store(true, Ordering::Release);
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
            if let Err(e) = unsafe { self.rt.acl().copy_device_async(dst, src, len, s) } {
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

/// The client's data path of a fabric link (`ClosablePath` closes it: its imports are
/// unmapped and released when the link closes).
impl AscendLink for FabricLink {
    /// A client on the server's host copies inside the server's fence: the server's `finalize`
    /// revokes it and waits for its batches before it moves its memory away (`retire`).
    const ENTERS_FENCE: bool = true;

    /// The regions the server sent blocks of (a batch into another: PARAM_INVALID from `run`,
    /// when nothing else reaches it).
    fn reaches(&self, region: u32) -> bool {
        self.blocks.contains_key(&region)
    }

    unsafe fn run(&self, batch: &Batch<'_>) -> Result<(), PathFail> {
        // a server that stopped (its connection closed) has moved its memory away from what
        // this link imported: nothing starts, and a batch it overlapped is not reported done
        let gone = |when: &str| {
            let why = format!("the server closed the link {when} (it stopped serving)");
            PathFail::Gone(why)
        };
        if self.peer_gone() {
            return Err(gone("before this transfer started"));
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.transfer(batch.op, &batch.descs.expand(), batch.deadline) }.map_err(
            |error| {
                if self.stuck.load(Ordering::Acquire) {
                    let why = "a device stream could not be aborted after a failed batch".into();
                    PathFail::Poisoned { why, error }
                } else {
                    PathFail::Failed(error)
                }
            },
        )?;
        if self.peer_gone() {
            return Err(gone(
                "while this transfer ran; its bytes may not be in its memory",
            ));
        }
        Ok(())
    }
}
