//! The region table a serving engine exposes, and how a request is checked against it before a
//! byte moves: TCP's serving half reaches it as [`Served`].

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::error::Status;
use crate::io::IoVec;
use crate::runtime::region::RegionCore;
use crate::sync::lock;
use crate::transport::tcp::serve::Served;
use crate::types::blocks::WireBlocks;
use crate::types::{TransferOp, WireDesc};
use crate::wire::{self, TableEntry};

/// The region table a serving engine exposes, sorted by region id. Regions come and go while it
/// serves only through the compat engine (HIXL registers and deregisters while linked): each
/// request looks regions up in a snapshot and enters their [`ServeGate`]s, which withdrawing a
/// region closes (and waits for) after taking it out of the table.
pub(crate) struct ServeTable {
    by_id: Mutex<Arc<Vec<Arc<RegionCore>>>>,
}

/// The region table as one request sees it.
pub(crate) type Snapshot = Arc<Vec<Arc<RegionCore>>>;

impl ServeTable {
    pub fn new(mut regions: Vec<Arc<RegionCore>>) -> Self {
        regions.sort_by_key(|r| r.id);
        Self {
            by_id: Mutex::new(Arc::new(regions)),
        }
    }
    /// The regions served now.
    pub(crate) fn snapshot(&self) -> Snapshot {
        lock(&self.by_id).clone()
    }
    /// Serves `r` too (to peers that connect from now on: a link's table is sent once).
    pub(crate) fn add(&self, r: Arc<RegionCore>) {
        let mut t = lock(&self.by_id);
        let mut v = Vec::clone(&t);
        let at = v.partition_point(|x| x.id < r.id);
        v.insert(at, r);
        *t = Arc::new(v);
    }
    /// Stops serving region `id`: later requests do not find it (`PARAM_INVALID`). The caller
    /// closes its gate to wait for requests already applying to it.
    pub(crate) fn remove(&self, id: u32) {
        let mut t = lock(&self.by_id);
        if t.iter().any(|r| r.id == id) {
            *t = Arc::new(t.iter().filter(|r| r.id != id).cloned().collect());
        }
    }
    fn get(table: &[Arc<RegionCore>], id: u32) -> Option<&RegionCore> {
        table
            .binary_search_by_key(&id, |r| r.id)
            .ok()
            .map(|i| &*table[i])
    }
    /// The table as peers see it. With `same_host` (a same-host peer with a fence), each region
    /// says how that peer may reach it: the memfd of a shareable region (the region is then
    /// marked as possibly mapped by a peer), `-1` for `/proc/PID/mem` at its address, or
    /// [`wire::FD_TCP_ONLY`] for memory the engine could not quarantine (caller-managed raw
    /// memory, types it cannot copy): served over TCP only.
    pub fn entries(&self, same_host: bool) -> Vec<TableEntry> {
        self.snapshot()
            .iter()
            .map(|r| TableEntry {
                fd: if !same_host {
                    -1
                } else if !r.one_sided() || r.access == crate::types::Access::None {
                    wire::FD_TCP_ONLY
                } else if r.fd >= 0 {
                    r.exposed.store(true, Ordering::SeqCst);
                    r.fd
                } else {
                    -1
                },
                id: r.id,
                addr: r.addr as u64,
                len: r.len as u64,
                mem_type: r.mem_type,
                access: r.access,
            })
            .collect()
    }
}

/// The gates a request entered: left when it is dropped, once the request no longer touches
/// the regions' memory.
#[derive(Default)]
struct Entered(Vec<(u32, Arc<crate::runtime::region::ServeGate>)>);

impl Entered {
    fn enter(&mut self, r: &RegionCore) -> bool {
        if self.0.iter().any(|(id, _)| *id == r.id) {
            return true;
        }
        if !r.gate.enter() {
            return false;
        }
        self.0.push((r.id, r.gate.clone()));
        true
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        for (_, g) in self.0.drain(..) {
            g.leave();
        }
    }
}

/// A request's hold on the regions it touches, while it is applied: the snapshot keeps their
/// records (and owned memory) alive, and the entered gates make withdrawing a region (the
/// compat engine's deregistration while linked) wait. Dropped in this order: the snapshot first.
pub(crate) struct Held {
    _snapshot: Snapshot,
    _entered: Entered,
}

// SAFETY: `validate` (and `validate_blocks`, whose every block lies at or below its largest
// index's, which it checks) admits only ranges inside host regions of the table, within their bounds,
// whose memory is valid for reads and for writes of any bytes, by anyone (the
// RegistrableMemory / register_raw contracts); the snapshot in `Held` keeps the regions'
// records (and owned memory) alive, and the gates it entered keep them registered: withdrawing
// a region takes it out of the table, then waits for its gate to be left.
unsafe impl Served for ServeTable {
    type Held = Held;

    fn admit(
        &self,
        op: TransferOp,
        descs: &[WireDesc],
        targets: &mut Vec<IoVec>,
    ) -> Result<Held, (Status, String)> {
        let mut entered = Entered::default();
        let snapshot = self.snapshot();
        validate(&snapshot, op, descs, targets, &mut entered)?;
        Ok(Held {
            _snapshot: snapshot,
            _entered: entered,
        })
    }

    fn admit_blocks(
        &self,
        op: TransferOp,
        blocks: &WireBlocks,
        idx: &[u64],
        targets: &mut Vec<IoVec>,
    ) -> Result<Held, (Status, String)> {
        let mut entered = Entered::default();
        let snapshot = self.snapshot();
        validate_blocks(&snapshot, op, blocks, idx, targets, &mut entered)?;
        Ok(Held {
            _snapshot: snapshot,
            _entered: entered,
        })
    }
}

/// Checks a block batch against the table once (its region, its largest index against the
/// region's bounds, overflow-checked, the access rights, host memory) and computes the memory
/// its blocks touch (blocks adjacent in memory in one range); `entered` holds the region's gate
/// until the request is done with it.
fn validate_blocks(
    table: &[Arc<RegionCore>],
    op: TransferOp,
    b: &WireBlocks,
    idx: &[u64],
    targets: &mut Vec<IoVec>,
    entered: &mut Entered,
) -> Result<(), (Status, String)> {
    targets.clear();
    // one pass for the largest index: the only one whose bounds are checked
    let max = idx.iter().copied().max().unwrap_or(0);
    let Some(r) = ServeTable::get(table, b.region) else {
        return Err((
            Status::PARAM_INVALID,
            format!("block batch: no region {}", b.region),
        ));
    };
    if b.block == 0 || b.stride < b.block || b.block_offset(max, r.len as u64).is_none() {
        return Err((
            Status::PARAM_INVALID,
            format!(
                "block batch: block index {max} (stride {}, {} bytes, base {}) outside region {} \
                 of {} bytes",
                b.stride, b.block, b.offset, r.id, r.len
            ),
        ));
    }
    if !r.access.permits(op) {
        return Err((
            Status::PARAM_INVALID,
            format!(
                "block batch: {op} not permitted on region {} ({})",
                r.id,
                r.access.name()
            ),
        ));
    }
    if r.mem_type != crate::types::MemType::Host {
        return Err((
            Status::UNSUPPORTED,
            "block batch: device memory over tcp".into(),
        ));
    }
    if !entered.enter(r) {
        return Err((
            Status::PARAM_INVALID,
            format!("block batch: region {} was deregistered", r.id),
        ));
    }
    // every index is at most `max`, whose block lies inside the region: no overflow below
    let (base, stride, block) = (
        r.addr + b.offset as usize,
        b.stride as usize,
        b.block as usize,
    );
    targets.reserve(idx.len());
    for &i in idx {
        let at = base + i as usize * stride;
        match targets.last_mut() {
            Some(t) if t.base + t.len == at => t.len += block,
            _ => targets.push(IoVec {
                base: at,
                len: block,
            }),
        }
    }
    Ok(())
}

/// Checks a batch against the table and computes the memory it touches; `entered` holds the
/// regions' gates until the request is done with them.
///
/// Never trusts the peer: unknown (or withdrawn) regions, empty, overflowing or out-of-bounds
/// ranges and forbidden operations are refused before any memory is touched.
fn validate(
    table: &[Arc<RegionCore>],
    op: TransferOp,
    descs: &[WireDesc],
    targets: &mut Vec<IoVec>,
    entered: &mut Entered,
) -> Result<(), (Status, String)> {
    targets.clear();
    for (i, d) in descs.iter().enumerate() {
        let Some(r) = ServeTable::get(table, d.region) else {
            return Err((
                Status::PARAM_INVALID,
                format!("descriptor {i}: no region {}", d.region),
            ));
        };
        let in_bounds = d.len > 0
            && d.offset
                .checked_add(d.len)
                .is_some_and(|end| end <= r.len as u64);
        if !in_bounds {
            return Err((
                Status::PARAM_INVALID,
                format!(
                    "descriptor {i}: range {}+{} outside region {} of {} bytes",
                    d.offset, d.len, r.id, r.len
                ),
            ));
        }
        if !r.access.permits(op) {
            return Err((
                Status::PARAM_INVALID,
                format!(
                    "descriptor {i}: {op} not permitted on region {} ({})",
                    r.id,
                    r.access.name()
                ),
            ));
        }
        if r.mem_type != crate::types::MemType::Host {
            return Err((
                Status::UNSUPPORTED,
                format!("descriptor {i}: device memory over tcp"),
            ));
        }
        if !entered.enter(r) {
            return Err((
                Status::PARAM_INVALID,
                format!("descriptor {i}: region {} was deregistered", r.id),
            ));
        }
        // ranges adjacent in memory in one iovec: the byte stream is the same
        let (base, len) = (r.addr + d.offset as usize, d.len as usize);
        match targets.last_mut() {
            Some(t) if t.base + t.len == base => t.len += len,
            _ => targets.push(IoVec { base, len }),
        }
    }
    Ok(())
}
