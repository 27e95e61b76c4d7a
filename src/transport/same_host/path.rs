//! The same-host data path of one link: the peer's regions as this process reaches them (mapped
//! memfds, or `process_vm_readv`/`/proc/PID/mem`), and the batch runner ([`DataPath`]).

use super::{BlockCopy, Halt, MemCopy, Stop, copy_all, copy_blocks, pvm_all};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crate::error::Error;
use crate::io::IoVec;
use crate::process::{Mapping, PeerProc};
use crate::transport::{Batch, DataPath, Health, PathFail, TransportKind};
use crate::types::blocks::BlockBatch;
use crate::types::{Access, BatchDesc, TransferOp};
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
    /// Whether every region of the batch is reachable one-sidedly (the others go over TCP): a
    /// region without a memfd through `process_vm_*`, one with a memfd through its mapping.
    fn covers(&self, xds: &[BatchDesc]) -> bool {
        let mut f = Finder::new(&self.regions);
        xds.iter().all(|d| {
            f.find(d.remote.region)
                .is_some_and(|r| r.fd < 0 || r.mapping(&self.proc).is_some())
        })
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

    fn covers(&self, descs: &[BatchDesc]) -> bool {
        SameHostPath::covers(self, descs)
    }

    fn fenced(&self) -> bool {
        true
    }

    fn refused_when_broken(&self) -> bool {
        false
    }

    /// A same-host peer is watched through its pidfd (a stopped peer still serves the link).
    fn health(&self) -> Health {
        Health::Watched
    }

    fn covers_blocks(&self, blocks: &BlockBatch<'_>) -> bool {
        SameHostPath::covers(self, &[blocks.span()])
    }

    /// A block batch: for a mapped region a copy loop over the index arrays as they are (no
    /// descriptor per block), shared with the helper thread from 1 MiB on; otherwise
    /// `process_vm_*` over the blocks' iovecs (adjacent blocks in one).
    unsafe fn run_blocks(
        &self,
        batch: &Batch<'_>,
        blocks: &BlockBatch<'_>,
    ) -> Result<(), PathFail> {
        let (peer, op) = (batch.peer, batch.op);
        batch.start(None)?;
        if !self.proc.alive(&self.watch) {
            return Err(PathFail::Gone("the peer exited or closed the link".into()));
        }
        let region = blocks.remote.region;
        let unknown = || {
            PathFail::Failed(Error::UnknownRemoteRegion {
                peer: peer.to_owned(),
                region,
                offset: blocks.remote.offset,
                len: blocks.remote_extent,
            })
        };
        let Some(r) = Finder::new(&self.regions).find(region) else {
            return Err(unknown());
        };
        let cancelled = || batch.cancel_requested();
        let stop = Stop {
            deadline: batch.deadline,
            cancelled: &cancelled,
        };
        let block = blocks.remote.block as usize;
        let (ls, rs) = (blocks.local_stride as usize, blocks.remote.stride as usize);
        let r = match (r.fd, r.mapping(&self.proc)) {
            (_, Some(m)) => {
                let remote = m.at(blocks.remote.offset);
                let (li, ri) = (blocks.local_idx, blocks.remote_idx);
                let copy = match op {
                    TransferOp::Write => BlockCopy {
                        src: blocks.local,
                        src_stride: ls,
                        src_idx: li,
                        dst: remote,
                        dst_stride: rs,
                        dst_idx: ri,
                        block,
                    },
                    TransferOp::Read => BlockCopy {
                        src: remote,
                        src_stride: rs,
                        src_idx: ri,
                        dst: blocks.local,
                        dst_stride: ls,
                        dst_idx: li,
                        block,
                    },
                };
                // SAFETY: every local block lies in a registered region the caller keeps
                // alive (checked once, by its largest index); every remote block lies in the
                // peer's region (checked the same way against its table), whose mapping covers
                // the whole region (the memfd is sealed against shrinking and was checked to be
                // at least that long). Local and mapped memory are distinct mappings.
                unsafe { copy_blocks(&copy, blocks.count(), &stop) }
            }
            // `covers_blocks` keeps such batches off this path (never process_vm for a memfd)
            (fd, None) if fd >= 0 => return Err(unknown()),
            (_, None) => {
                let (mut lo, mut ro): (Vec<IoVec>, Vec<IoVec>) = (Vec::new(), Vec::new());
                let remote = (r.addr + blocks.remote.offset) as usize;
                for k in 0..blocks.count() {
                    let l = blocks.local_at(k);
                    let rr = remote + blocks.remote_idx.at(k) as usize * rs;
                    match (lo.last_mut(), ro.last_mut()) {
                        (Some(a), Some(b)) if a.base + a.len == l && b.base + b.len == rr => {
                            a.len += block;
                            b.len += block;
                        }
                        _ => {
                            lo.push(IoVec {
                                base: l,
                                len: block,
                            });
                            ro.push(IoVec {
                                base: rr,
                                len: block,
                            });
                        }
                    }
                }
                // SAFETY: the local iovecs are blocks of a registered region the caller keeps
                // alive.
                unsafe { pvm_all(&self.proc, op == TransferOp::Write, &lo, &ro, &stop) }
            }
        };
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

    /// Memory copies for mapped regions, `process_vm_readv`/`writev` for the others, in parts
    /// between which the batch stops at its deadline (`TIMEOUT`) or a cancel; it returns once no
    /// part of it is moving.
    unsafe fn run(&self, batch: &Batch<'_>) -> Result<(), PathFail> {
        let (peer, op, xds) = (batch.peer, batch.op, batch.descs);
        batch.start(None)?;
        if !self.proc.alive(&self.watch) {
            return Err(PathFail::Gone("the peer exited or closed the link".into()));
        }
        let (mut lo, mut ro, mut index) = (Vec::new(), Vec::new(), Vec::new());
        let mut copies = Vec::with_capacity(xds.len());
        let mut f = Finder::new(&self.regions);
        for (i, d) in xds.iter().enumerate() {
            let Some(r) = f.find(d.remote.region) else {
                return Err(PathFail::Failed(Error::UnknownRemoteRegion {
                    peer: peer.to_owned(),
                    region: d.remote.region,
                    offset: d.remote.offset,
                    len: d.remote.len,
                }));
            };
            let len = d.remote.len as usize;
            match (r.fd, r.mapping(&self.proc)) {
                (_, Some(m)) => {
                    if op == TransferOp::Write {
                        // a WRITE's copies fault once per page (a write fault maps one page);
                        // a READ's read faults map sixteen (fault-around) on both copy threads,
                        // which measured faster than populating first on this one
                        r.prefault(m, d.remote.offset, len, &self.budget);
                    }
                    let (src, dst) = match op {
                        TransferOp::Write => (d.local, m.at(d.remote.offset)),
                        TransferOp::Read => (m.at(d.remote.offset), d.local),
                    };
                    copies.push(MemCopy { src, dst, len });
                }
                (fd, None) if fd >= 0 => {
                    // `covers` keeps such batches off this path (never process_vm for a memfd)
                    return Err(PathFail::Failed(Error::UnknownRemoteRegion {
                        peer: peer.to_owned(),
                        region: d.remote.region,
                        offset: d.remote.offset,
                        len: d.remote.len,
                    }));
                }
                (_, None) => {
                    lo.push(IoVec { base: d.local, len });
                    ro.push(IoVec {
                        base: (r.addr + d.remote.offset) as usize,
                        len,
                    });
                    index.push(i);
                }
            }
        }
        let cancelled = || batch.cancel_requested();
        let stop = Stop {
            deadline: batch.deadline,
            cancelled: &cancelled,
        };
        // SAFETY: each local range lies in a registered region the caller keeps alive; each
        // remote range was validated against the peer's table, and its mapping covers the whole
        // region (the memfd is sealed against shrinking and was checked to be at least that
        // long). Local and mapped memory are distinct mappings.
        let mut r = unsafe { copy_all(&copies, &stop) };
        if r.is_ok() && !lo.is_empty() {
            // SAFETY: the local iovecs are ranges of registered regions the caller keeps alive.
            r = unsafe { pvm_all(&self.proc, op == TransferOp::Write, &lo, &ro, &stop) };
        }
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
                index: index[at],
                source: e,
            }),
        })
    }
}
