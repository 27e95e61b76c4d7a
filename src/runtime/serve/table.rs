//! The region table a serving engine exposes, and how a request is checked against it before a
//! byte moves: TCP's serving half reaches it as [`Served`].

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::error::Status;
use crate::io::IoVec;
use crate::runtime::region::RegionCore;
use crate::sync::lock;
use crate::transport::tcp::serve::Served;
use crate::types::TransferOp;
use crate::types::batch::WireDescs;
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

/// The gates a request of the lane `conn` entered: left when it is dropped, once the request
/// no longer touches the regions' memory.
struct Entered {
    conn: u64,
    gates: Vec<(u32, Arc<crate::runtime::region::ServeGate>)>,
}

impl Entered {
    fn new(conn: u64) -> Self {
        Entered {
            conn,
            gates: Vec::new(),
        }
    }

    fn enter(&mut self, r: &RegionCore) -> bool {
        if self.gates.iter().any(|(id, _)| *id == r.id) {
            return true;
        }
        if !r.gate.enter(self.conn) {
            return false;
        }
        self.gates.push((r.id, r.gate.clone()));
        true
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        for (_, g) in self.gates.drain(..) {
            g.leave(self.conn);
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

// SAFETY: `validate` (for a block batch: every block lies at or below its largest index's,
// which it checks) admits only ranges inside host regions of the table, within their bounds,
// whose memory is valid for reads and for writes of any bytes, by anyone (the
// RegistrableMemory / register_raw contracts); the snapshot in `Held` keeps the regions'
// records (and owned memory) alive, and the gates it entered keep them registered: withdrawing
// a region takes it out of the table, then waits for its gate to be left.
unsafe impl Served for ServeTable {
    type Held = Held;

    fn admit(
        &self,
        conn: u64,
        op: TransferOp,
        descs: WireDescs<'_>,
        targets: &mut Vec<IoVec>,
    ) -> Result<Held, (Status, String)> {
        let mut entered = Entered::new(conn);
        let snapshot = self.snapshot();
        validate(&snapshot, op, descs, targets, &mut entered)?;
        Ok(Held {
            _snapshot: snapshot,
            _entered: entered,
        })
    }
}

/// Checks a batch against the table and computes the memory it touches (ranges adjacent in
/// memory in one `iovec`: the byte stream is the same); `entered` holds the regions' gates
/// until the request is done with them. A list is checked descriptor by descriptor; a block
/// batch once, by its largest index (every other block lies at or below it).
///
/// Never trusts the peer: unknown (or withdrawn) regions, empty, overflowing or out-of-bounds
/// ranges and forbidden operations are refused before any memory is touched.
fn validate(
    table: &[Arc<RegionCore>],
    op: TransferOp,
    descs: WireDescs<'_>,
    targets: &mut Vec<IoVec>,
    entered: &mut Entered,
) -> Result<(), (Status, String)> {
    targets.clear();
    match descs {
        WireDescs::List(descs) => {
            for (i, d) in descs.iter().enumerate() {
                let fits = |len: u64| {
                    d.len > 0 && d.offset.checked_add(d.len).is_some_and(|end| end <= len)
                };
                let outside = |r: &RegionCore| {
                    format!(
                        "range {}+{} outside region {} of {} bytes",
                        d.offset, d.len, r.id, r.len
                    )
                };
                let what = || format!("descriptor {i}");
                let r = admit_region(table, op, d.region, fits, outside, what, entered)?;
                IoVec::push_joined(targets, r.addr + d.offset as usize, d.len as usize);
            }
        }
        WireDescs::Blocks(b, idx) => {
            // one pass for the largest index: the only one whose bounds are checked
            let max = idx.iter().copied().max().unwrap_or(0);
            let fits =
                |len: u64| b.block > 0 && b.stride >= b.block && b.block_offset(max, len).is_some();
            let outside = |r: &RegionCore| {
                format!(
                    "block index {max} (stride {}, {} bytes, base {}) outside region {} of {} \
                     bytes",
                    b.stride, b.block, b.offset, r.id, r.len
                )
            };
            let what = || "block batch".to_owned();
            let r = admit_region(table, op, b.region, fits, outside, what, entered)?;
            // every index is at most `max`, whose block lies inside the region: no overflow
            let (base, stride, block) = (
                r.addr + b.offset as usize,
                b.stride as usize,
                b.block as usize,
            );
            targets.reserve(idx.len());
            for &i in idx {
                IoVec::push_joined(targets, base + i as usize * stride, block);
            }
        }
    }
    Ok(())
}

/// The region `id` of the table for a range that `fits` it (given its length; `outside` says
/// how it does not), `op` permitted there, host memory, its gate entered; `what` names the
/// range in the refusal.
fn admit_region<'t>(
    table: &'t [Arc<RegionCore>],
    op: TransferOp,
    id: u32,
    fits: impl Fn(u64) -> bool,
    outside: impl Fn(&RegionCore) -> String,
    what: impl Fn() -> String,
    entered: &mut Entered,
) -> Result<&'t RegionCore, (Status, String)> {
    let Some(r) = ServeTable::get(table, id) else {
        return Err((Status::PARAM_INVALID, format!("{}: no region {id}", what())));
    };
    if !fits(r.len as u64) {
        return Err((Status::PARAM_INVALID, format!("{}: {}", what(), outside(r))));
    }
    if !r.access.permits(op) {
        return Err((
            Status::PARAM_INVALID,
            format!(
                "{}: {op} not permitted on region {} ({})",
                what(),
                r.id,
                r.access.name()
            ),
        ));
    }
    if r.mem_type != crate::types::MemType::Host {
        return Err((
            Status::UNSUPPORTED,
            format!("{}: device memory over tcp", what()),
        ));
    }
    if !entered.enter(r) {
        return Err((
            Status::PARAM_INVALID,
            format!("{}: region {} was deregistered", what(), r.id),
        ));
    }
    Ok(r)
}
