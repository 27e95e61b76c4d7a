//! The same-host data path of one link: the peer's regions as this process reaches them (mapped
//! memfds, or `process_vm_readv`/`/proc/PID/mem`), and the batch runner ([`DataPath`]).

use super::copy::{Indexed, MemCopy, Pairs, Strided, copy_all, copy_indexed, pvm_all};
use super::parts::{Halt, Stop};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crate::error::Error;
use crate::io::IoVec;
use crate::process::{Mapping, PeerProc};
use crate::transport::{Batch, DataPath, Health, PathFail, TransportKind};
use crate::types::Access;
use crate::types::TransferOp;
use crate::types::batch::Descs;
use crate::wire::{self, TableEntry};

/// A peer region as the same-host path reaches it: mapped (its memfd, mapped on first use), or
/// through `process_vm_readv`/`writev` at its address.
struct PeerRegion {
    addr: u64,
    len: u64,
    fd: i32,
    writable: bool,
    map: std::sync::OnceLock<Option<Mapping>>,
    /// Which chunks of the mapping this link has populated (made with the mapping's first
    /// prefault).
    warm: std::sync::OnceLock<Warmth>,
}

/// The chunk of a mapped peer region that the link populates at once: 2 MiB, a page table's
/// reach, so a batch populates at most one chunk beyond each end of what it touches.
const CHUNK: usize = 2 << 20;

/// Which [`CHUNK`]s of a mapped peer region the link has populated (`Mapping::populate`): each
/// once, at connect or by the first WRITE batch that touches it, while the link's budget lasts.
struct Warmth {
    bits: Vec<AtomicU64>,
    chunks: usize,
    done: AtomicUsize,
}

impl Warmth {
    fn new(len: usize) -> Self {
        let chunks = len.div_ceil(CHUNK);
        Warmth {
            bits: (0..chunks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            chunks,
            done: AtomicUsize::new(0),
        }
    }
    fn all(&self) -> bool {
        self.done.load(Ordering::Relaxed) >= self.chunks
    }
    fn has(&self, c: usize) -> bool {
        self.bits[c / 64].load(Ordering::Relaxed) & (1 << (c % 64)) != 0
    }
    fn set(&self, c: usize) {
        let bit = 1 << (c % 64);
        if self.bits[c / 64].fetch_or(bit, Ordering::Relaxed) & bit == 0 {
            self.done.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Takes `n` bytes from the link's prefault budget; false (nothing taken) when fewer are left.
fn take(budget: &AtomicU64, n: usize) -> bool {
    budget
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
            left.checked_sub(n as u64)
        })
        .is_ok()
}

impl PeerRegion {
    /// The region's mapping, made on first use; `None` if it has no memfd (then the region is
    /// reached with `process_vm_*`, which the kernel checks) or the memfd failed the checks.
    ///
    /// A region offered with a memfd is reached through its mapping or not at all (its batches
    /// go over TCP): never with `process_vm_*` at its address. What the peer revokes of a
    /// memfd region is then the pages it shared, whatever it does with its address later (the
    /// compat engine's engine-allocated buffers stay at their address, made private, after
    /// their registration ends).
    fn mapping(&self, proc: &PeerProc) -> Option<&Mapping> {
        self.map
            .get_or_init(|| {
                if self.fd < 0 {
                    return None;
                }
                let m = proc.getfd(self.fd).and_then(|fd| Mapping::new(&fd, self.len, self.writable));
                if let Err(e) = &m {
                    tracing::debug!(error = %e, addr = self.addr, "not mapping a peer region; its batches go over tcp");
                }
                m.ok()
            })
            .as_ref()
    }

    /// Populates the chunks of bytes `off..off + len` of mapping `m` (this region's) that the
    /// link has not populated yet, while `budget` lasts, so the copies that follow take no page
    /// faults (`Mapping::populate`: a kernel walk, cheaper than a fault per page). A failure
    /// (an old kernel's `EINVAL`) spends the budget: the link's pages then fault on first touch,
    /// as without prefaulting.
    fn prefault(&self, m: &Mapping, off: u64, len: usize, budget: &AtomicU64) {
        let w = self.warm.get_or_init(|| Warmth::new(m.len()));
        if w.all() || budget.load(Ordering::Relaxed) == 0 || w.chunks == 0 {
            return;
        }
        let first = (off as usize / CHUNK).min(w.chunks - 1);
        let last = ((off as usize).saturating_add(len.max(1) - 1) / CHUNK).min(w.chunks - 1);
        for c in first..=last {
            if w.has(c) {
                continue;
            }
            let n = CHUNK.min(m.len() - c * CHUNK);
            if !take(budget, n) {
                return;
            }
            match m.populate(c * CHUNK, n) {
                Ok(_) => w.set(c),
                Err(e) => {
                    tracing::debug!(error = %e, "not prefaulting a peer's memory; its pages fault on first touch");
                    budget.store(0, Ordering::Relaxed);
                    return;
                }
            }
        }
    }
}

/// The same-host data path of a link: the pinned peer process, its regions (mapped lazily, so
/// connecting to an engine with thousands of regions stays fast), and a handle to the link's
/// control connection (to notice the peer closing the link).
pub(crate) struct SameHostPath {
    proc: PeerProc,
    watch: std::net::TcpStream,
    /// Sorted by region id (the peer's table order is not assumed).
    regions: Vec<(u32, PeerRegion)>,
    /// Bytes of the peer's mapped regions this link may still populate
    /// (`Options::prefault_budget`).
    budget: AtomicU64,
}

/// Finds regions of a batch in a [`SameHostPath`]'s table: a binary search, skipped while
/// descriptors stay in the region of the one before (the common case: a batch into one KV cache).
struct Finder<'a> {
    table: &'a [(u32, PeerRegion)],
    last: Option<&'a (u32, PeerRegion)>,
}

impl<'a> Finder<'a> {
    fn new(table: &'a [(u32, PeerRegion)]) -> Self {
        Finder { table, last: None }
    }
    fn find(&mut self, id: u32) -> Option<&'a PeerRegion> {
        match self.last {
            Some(hit) if hit.0 == id => Some(&hit.1),
            _ => {
                let i = self.table.binary_search_by_key(&id, |r| r.0).ok()?;
                let hit = &self.table[i];
                self.last = Some(hit);
                Some(&hit.1)
            }
        }
    }
}

impl SameHostPath {
    /// Whether the peer's region `id` is reachable one-sidedly (the others go over TCP): a
    /// region without a memfd through `process_vm_*`, one with a memfd through its mapping
    /// (made now).
    fn reaches(&self, id: u32) -> bool {
        (Finder::new(&self.regions).find(id))
            .is_some_and(|r| r.fd < 0 || r.mapping(&self.proc).is_some())
    }

    pub(crate) fn setup(
        proc: PeerProc,
        table: &[TableEntry],
        watch: std::net::TcpStream,
        (prefault, deadline): (u64, Instant),
    ) -> std::io::Result<SameHostPath> {
        let mut regions = Vec::with_capacity(table.len());
        let (mut mapped, mut probe) = (false, None);
        let budget = AtomicU64::new(prefault);
        for e in table {
            if e.fd == wire::FD_TCP_ONLY || e.access == Access::None {
                // the peer serves it over TCP only (memory it could not quarantine)
                continue;
            }
            let fd = e.fd;
            let r = PeerRegion {
                addr: e.addr,
                len: e.len,
                fd,
                writable: e.access.permits(TransferOp::Write),
                map: std::sync::OnceLock::new(),
                warm: std::sync::OnceLock::new(),
            };
            if fd >= 0 && !mapped {
                // the first memfd is taken and checked now: a peer whose memory cannot be mapped
                // safely, or a kernel that refuses pidfd_getfd, keeps the link on TCP
                let m = proc
                    .getfd(fd)
                    .and_then(|f| Mapping::new(&f, e.len, r.writable))?;
                prefault_at_connect(&r, &m, &budget, deadline);
                let _ = r.map.set(Some(m));
                mapped = true;
            }
            if fd < 0 && e.access.permits(TransferOp::Read) && probe.is_none() {
                probe = Some(e.addr);
            }
            regions.push((e.id, r));
        }
        // a table naming one id twice (the peer's own never does): its first entry counts
        regions.sort_by_key(|r| r.0);
        regions.dedup_by_key(|r| r.0);
        // a probe read where the kernel must allow process_vm_readv
        if let Some(addr) = probe {
            let mut byte = 0u8;
            let mut l = [IoVec {
                base: &mut byte as *mut u8 as usize,
                len: 1,
            }];
            let mut r = [IoVec {
                base: addr as usize,
                len: 1,
            }];
            // SAFETY: the local iovec is the live byte above.
            unsafe { proc.pvm(false, &mut l, &mut r) }.map_err(|(e, _)| e)?;
        }
        Ok(SameHostPath {
            proc,
            watch,
            regions,
            budget,
        })
    }
}

/// Populates region `r`'s mapping `m` (the first the peer offers: for an engine serving a KV
/// cache, the cache) chunk by chunk from its start, while the link's budget lasts and until
/// half the time left before the connect's deadline has passed: the first round after connect
/// then takes no page faults where it touches what was populated. (Mapping the peer's other
/// regions stays lazy, so connecting to an engine with thousands of them stays fast; their
/// chunks are populated by the batches that touch them.)
fn prefault_at_connect(r: &PeerRegion, m: &Mapping, budget: &AtomicU64, deadline: Instant) {
    let now = Instant::now();
    let until = now + deadline.saturating_duration_since(now) / 2;
    let mut off = 0;
    while off < m.len() && budget.load(Ordering::Relaxed) > 0 && Instant::now() < until {
        r.prefault(m, off as u64, CHUNK, budget);
        off += CHUNK;
    }
}

impl DataPath for SameHostPath {
    fn kind(&self) -> TransportKind {
        TransportKind::SameHost
    }

    fn reaches(&self, region: u32) -> bool {
        SameHostPath::reaches(self, region)
    }

    fn fenced(&self) -> bool {
        true
    }

    fn refused_when_broken(&self) -> bool {
        false
    }

    /// A same-host peer is watched through its pidfd (a stopped peer still serves the link);
    /// one that exited is seen at once. (Not the link's first connection: it carries TCP
    /// transfers too, which a cancel shuts down.)
    fn health(&self) -> Health {
        if self.proc.exited() {
            Health::Failed("the peer exited".into())
        } else {
            Health::Watched
        }
    }

    /// Memory copies for mapped regions (a block batch's as a copy loop over its index arrays,
    /// never expanded into descriptors), `process_vm_readv`/`writev` for the others (ranges
    /// adjacent on both sides in one pair), in parts between which the batch stops at its
    /// deadline (`TIMEOUT`) or a cancel, shared with the helper thread from 1 MiB on; it
    /// returns once no part of it is moving.
    unsafe fn run(&self, batch: &Batch<'_>) -> Result<(), PathFail> {
        let (peer, op) = (batch.peer, batch.op);
        batch.start(None)?;
        if !self.proc.alive(&self.watch) {
            return Err(PathFail::Gone("the peer exited or closed the link".into()));
        }
        let plan = self.plan(batch)?;
        let cancelled = || batch.cancel_requested();
        let stop = Stop {
            deadline: batch.deadline,
            cancelled: &cancelled,
            given_up: batch.given_up,
        };
        // SAFETY: each local range (each block, by its largest index) lies in a registered
        // region the caller keeps alive; each remote range was validated against the peer's
        // table, and its mapping covers the whole region (the memfd is sealed against
        // shrinking and was checked to be at least that long). Local and mapped memory are
        // distinct mappings. The peer may write its pages meanwhile: they are copied as raw
        // bytes, never made into Rust references.
        let r = unsafe { plan.run(&self.proc, op, &stop) };
        r.map_err(|halt| match halt {
            Halt::Deadline => PathFail::Failed(Error::Timeout {
                op: op.name(),
                peer: peer.to_owned(),
                elapsed: batch.started.elapsed(),
            }),
            Halt::Cancelled => PathFail::Failed(Error::Cancelled {
                op: op.name(),
                peer: peer.to_owned(),
            }),
            Halt::Failed(e, _) if e.raw_os_error() == Some(libc::ESRCH) => {
                PathFail::Gone("the peer exited".into())
            }
            Halt::Failed(e, at) => PathFail::Failed(Error::SameHost {
                op: op.name(),
                peer: peer.to_owned(),
                index: at,
                source: e,
            }),
        })
    }
}

/// How a same-host batch moves: copies of mapped memory (a list's, a block batch's layouts
/// over its index arrays), then `process_vm_*` pairs for the regions without a memfd.
struct Plan<'a> {
    copies: Vec<MemCopy>,
    strided: Vec<Strided>,
    /// A block batch's index arrays as the copies' sources and destinations.
    idx: Option<(
        crate::types::blocks::BlockIndices<'a>,
        crate::types::blocks::BlockIndices<'a>,
    )>,
    pairs: Pairs,
}

impl Plan<'_> {
    /// # Safety
    /// Every range in it is valid for the whole call (sources readable, destinations
    /// writable, the two not overlapping); the pairs' local ranges as `PeerProc::pvm` needs.
    unsafe fn run(&self, proc: &PeerProc, op: TransferOp, stop: &Stop<'_>) -> Result<(), Halt> {
        // SAFETY: the caller's contract.
        unsafe { copy_all(&self.copies, stop) }?;
        if let Some((src_idx, dst_idx)) = self.idx.filter(|_| !self.strided.is_empty()) {
            let b = Indexed {
                layouts: &self.strided,
                src_idx,
                dst_idx,
            };
            // SAFETY: the caller's contract.
            unsafe { copy_indexed(&b, stop) }?;
        }
        if !self.pairs.is_empty() {
            // SAFETY: the caller's contract.
            unsafe { pvm_all(proc, op == TransferOp::Write, &self.pairs, stop) }?;
        }
        Ok(())
    }
}

impl SameHostPath {
    /// The batch's plan: each of its regions found once per run of descriptors in it (each
    /// layout's once); `UnknownRemoteRegion` for one the path does not reach.
    fn plan<'a>(&self, batch: &Batch<'a>) -> Result<Plan<'a>, PathFail> {
        let (peer, op) = (batch.peer, batch.op);
        let unknown = |region, offset, len| {
            PathFail::Failed(Error::UnknownRemoteRegion {
                peer: peer.to_owned(),
                region,
                offset,
                len,
            })
        };
        let mut plan = Plan {
            copies: Vec::new(),
            strided: Vec::new(),
            idx: None,
            pairs: Pairs::default(),
        };
        let mut f = Finder::new(&self.regions);
        match batch.descs {
            Descs::List(xds) => {
                plan.copies.reserve(xds.len());
                for (i, d) in xds.iter().enumerate() {
                    let (region, off, len) = (d.remote.region, d.remote.offset, d.remote.len);
                    let Some(r) = f.find(region) else {
                        return Err(unknown(region, off, len));
                    };
                    match (r.fd, r.mapping(&self.proc)) {
                        (_, Some(m)) => {
                            if op == TransferOp::Write {
                                // a WRITE's copies fault once per page (a write fault maps one
                                // page); a READ's read faults map sixteen (fault-around) on both
                                // copy threads, which measured faster than populating first
                                r.prefault(m, off, len as usize, &self.budget);
                            }
                            let (src, dst) = match op {
                                TransferOp::Write => (d.local, m.at(off)),
                                TransferOp::Read => (m.at(off), d.local),
                            };
                            MemCopy::push_joined(&mut plan.copies, src, dst, len as usize);
                        }
                        // a memfd region is reached through its mapping or not at all (never
                        // process_vm: `reaches` keeps such batches off this path)
                        (fd, None) if fd >= 0 => return Err(unknown(region, off, len)),
                        (_, None) => {
                            let at = (r.addr + off) as usize;
                            plan.pairs.push(i, d.local, at, len as usize);
                        }
                    }
                }
            }
            Descs::Blocks(b) => {
                let (li, ri) = (b.local_idx, b.remote_idx);
                plan.idx = Some(match op {
                    TransferOp::Write => (li, ri),
                    TransferOp::Read => (ri, li),
                });
                for (l, lay) in b.layouts.iter().enumerate() {
                    let w = lay.remote;
                    let Some(r) = f.find(w.region) else {
                        return Err(unknown(w.region, w.offset, lay.remote_extent));
                    };
                    let (block, ls, rs) = (
                        w.block as usize,
                        lay.local_stride as usize,
                        w.stride as usize,
                    );
                    match (r.fd, r.mapping(&self.proc)) {
                        (_, Some(m)) => {
                            let remote = m.at(w.offset);
                            plan.strided.push(match op {
                                TransferOp::Write => Strided {
                                    src: lay.local,
                                    src_stride: ls,
                                    dst: remote,
                                    dst_stride: rs,
                                    block,
                                },
                                TransferOp::Read => Strided {
                                    src: remote,
                                    src_stride: rs,
                                    dst: lay.local,
                                    dst_stride: ls,
                                    block,
                                },
                            });
                        }
                        (fd, None) if fd >= 0 => {
                            return Err(unknown(w.region, w.offset, lay.remote_extent));
                        }
                        (_, None) => {
                            let base = (r.addr + w.offset) as usize;
                            for k in 0..b.indices() {
                                let remote = base + ri.at(k) as usize * rs;
                                let local = lay.local_at(li.at(k));
                                plan.pairs.push(l * b.indices() + k, local, remote, block);
                            }
                        }
                    }
                }
            }
        }
        Ok(plan)
    }
}
