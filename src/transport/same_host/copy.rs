//! How a same-host batch's parts move: memory copies (mapped regions), index loops over a block
//! batch's arrays (mapped regions, never expanded into descriptors), and `process_vm_*` pairs,
//! each cut into parts for the pool (`parts.rs`), shared with its helper thread from 1 MiB on.

use std::io;

use super::parts::{Halt, PartFail, Stop, run_parts};
use crate::io::IoVec;
use crate::process::{PeerProc, Target, vm_io};
use crate::types::blocks::BlockIndices;
use crate::types::split::{Cut, split};

/// A memory copy to run: `len` bytes from `src` to `dst` (addresses).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemCopy {
    pub src: usize,
    pub dst: usize,
    pub len: usize,
}

impl MemCopy {
    /// Appends a copy of `len` bytes from `src` to `dst`, in the last copy when it follows it on
    /// both sides (as [`Pairs::push`] joins `process_vm_*` pairs): a batch of adjacent blocks is
    /// one copy before it is cut into parts.
    pub(crate) fn push_joined(v: &mut Vec<MemCopy>, src: usize, dst: usize, len: usize) {
        match v.last_mut() {
            Some(c) if c.src + c.len == src && c.dst + c.len == dst => c.len += len,
            _ => v.push(MemCopy { src, dst, len }),
        }
    }
}

impl Cut for MemCopy {
    fn bytes(&self) -> u64 {
        self.len as u64
    }
    fn cut(&self, at: u64) -> (Self, Self) {
        let at = at as usize;
        let head = MemCopy { len: at, ..*self };
        let tail = MemCopy {
            src: self.src + at,
            dst: self.dst + at,
            len: self.len - at,
        };
        (head, tail)
    }
}

/// A `process_vm_*` pair: a local and a remote `iovec` of the same length.
#[derive(Clone, Copy)]
struct Pair(IoVec, IoVec);

impl Cut for Pair {
    fn bytes(&self) -> u64 {
        self.0.len as u64
    }
    fn cut(&self, at: u64) -> (Self, Self) {
        let at = at as usize;
        let head = |v: IoVec| IoVec {
            base: v.base,
            len: at,
        };
        let tail = |v: IoVec| IoVec {
            base: v.base + at,
            len: v.len - at,
        };
        (
            Pair(head(self.0), head(self.1)),
            Pair(tail(self.0), tail(self.1)),
        )
    }
}

/// The `process_vm_*` pairs of a batch, ranges adjacent on both sides in one pair; each pair
/// remembers the batch position (descriptor or block) where it starts, for a failure's report.
#[derive(Default)]
pub(crate) struct Pairs {
    local: Vec<IoVec>,
    remote: Vec<IoVec>,
    at: Vec<usize>,
}

impl Pairs {
    /// Adds `len` bytes between `local` and `remote` (addresses), position `at` of the batch.
    pub(crate) fn push(&mut self, at: usize, local: usize, remote: usize, len: usize) {
        match (self.local.last_mut(), self.remote.last_mut()) {
            (Some(a), Some(b)) if a.base + a.len == local && b.base + b.len == remote => {
                a.len += len;
                b.len += len;
            }
            _ => {
                self.local.push(IoVec { base: local, len });
                self.remote.push(IoVec { base: remote, len });
                self.at.push(at);
            }
        }
    }

    /// Whether there is none.
    pub(crate) fn is_empty(&self) -> bool {
        self.local.is_empty()
    }
}

/// # Safety
/// Every copy's source must be valid for reads and its destination for writes of `len` bytes,
/// and the two must not overlap.
unsafe fn run_copies(copies: &[MemCopy]) {
    for c in copies {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(c.src as *const u8, c.dst as *mut u8, c.len) };
    }
}

/// One part of a batch of copies (it cannot fail).
///
/// # Safety
/// As [`run_copies`].
unsafe fn copy_part(copies: &[MemCopy], (): ()) -> Result<(), PartFail> {
    // SAFETY: the caller's contract.
    unsafe { run_copies(copies) };
    Ok(())
}

/// `process_vm_*` over one part's pairs.
///
/// # Safety
/// As [`vm_io`] for the part's local iovecs.
unsafe fn run_pairs(pairs: &[Pair], (target, write): (Target, bool)) -> Result<(), PartFail> {
    let (mut local, mut remote): (Vec<IoVec>, Vec<IoVec>) =
        pairs.iter().map(|p| (p.0, p.1)).unzip();
    // SAFETY: the caller's contract.
    unsafe { vm_io(target, write, &mut local, &mut remote) }
}

/// Batches below this many bytes in all are not shared with the helper thread.
const HELP_MIN: usize = 1 << 20;

/// The parts a batch of copies is claimed in: small enough to share a 1 MiB batch eight ways
/// and to stop within about 10 µs of a deadline, large enough that claiming one (an atomic add,
/// a clock read) is nothing beside its copy.
const PART: usize = 128 << 10;

/// The parts a `process_vm_*` batch is claimed in: an eighth of the batch, but at least
/// [`PVM_PART_MIN`] and at most [`PVM_PART_MAX`] bytes (each part is a system call at least:
/// 2 MiB parts cost a 64 MiB batch 4% more CPU than two halves did, 8 MiB ones about nothing,
/// and a deadline is met within 8 MiB of copying), and at most [`PVM_PART_PAIRS`] pairs (a few
/// calls of `IOV_MAX`), so a batch of many tiny pieces stops in time too.
const PVM_PART_MIN: usize = 1 << 20;
const PVM_PART_MAX: usize = 8 << 20;
const PVM_PART_PAIRS: usize = 4096;

/// A small batch of copies (under [`HELP_MIN`] bytes) checks its deadline and cancel every
/// this many descriptors (or [`PART`] bytes): a batch of many tiny copies stops in time too.
const CHECK_EVERY: usize = 1024;

/// Runs the copies by `stop`, sharing batches of 1 MiB or more with the helper thread: the two
/// claim parts of [`PART`] bytes until none is left or the batch stops; the call returns once
/// no part is being copied.
///
/// # Safety
/// As [`run_copies`], for the whole call.
pub(crate) unsafe fn copy_all(copies: &[MemCopy], stop: &Stop<'_>) -> Result<(), Halt> {
    let total: usize = copies.iter().map(|c| c.len).sum();
    if total < HELP_MIN {
        let (mut bytes, mut count) = (0usize, 0usize);
        for c in copies {
            if bytes >= PART || count >= CHECK_EVERY || (bytes == 0 && count == 0) {
                stop.check()?;
                (bytes, count) = (0, 0);
            }
            // SAFETY: the caller's contract.
            unsafe { run_copies(std::slice::from_ref(c)) };
            (bytes, count) = (bytes + c.len, count + 1);
        }
        return Ok(());
    }
    let parts = split(copies, total.div_ceil(PART));
    // SAFETY: the caller's contract, for the whole call, which `run_parts` does not outlast.
    match unsafe { run_parts(parts, copy_part, (), true, stop) } {
        None => Ok(()),
        Some((why, _)) => Err(why),
    }
}

/// `process_vm_*` over `pairs` by `stop`, in parts of 1 to 8 MiB (and at most
/// [`PVM_PART_PAIRS`] pairs), shared with the helper thread from 1 MiB on. A failure names the
/// batch position where its pair starts.
///
/// # Safety
/// As `PeerProc::pvm`, for the whole call.
pub(crate) unsafe fn pvm_all(
    proc: &PeerProc,
    write: bool,
    pairs: &Pairs,
    stop: &Stop<'_>,
) -> Result<(), Halt> {
    let list: Vec<Pair> = (pairs.local.iter())
        .zip(&pairs.remote)
        .map(|(a, b)| Pair(*a, *b))
        .collect();
    let total: usize = pairs.local.iter().map(|v| v.len).sum();
    let target = proc.target();
    let part = (total / 8).clamp(PVM_PART_MIN, PVM_PART_MAX);
    let parts: Vec<Vec<Pair>> = split(&list, total.div_ceil(part))
        .into_iter()
        .flat_map(|p| match p.len() > PVM_PART_PAIRS {
            false => vec![p],
            true => p.chunks(PVM_PART_PAIRS).map(<[Pair]>::to_vec).collect(),
        })
        .collect();
    // SAFETY: the caller's contract, for the whole call, which `run_parts` does not outlast.
    let outcome = unsafe { run_parts(parts, run_pairs, (target, write), total >= HELP_MIN, stop) };
    let at = |k: usize| pairs.at.get(k).copied().unwrap_or(0);
    match outcome {
        None if !write && proc.exited() => {
            // after a read: the peer must still be alive, else the bytes may come from a
            // process that got its pid
            Err(Halt::Failed(
                io::Error::from_raw_os_error(libc::ESRCH),
                at(pairs.local.len().saturating_sub(1)),
            ))
        }
        None => Ok(()),
        Some((Halt::Failed(e, _), moved)) => Err(Halt::Failed(e, at(pair_at(&pairs.local, moved)))),
        Some((why, _)) => Err(why),
    }
}

/// The index of the pair in which byte `moved` of the batch lies (the last pair if past the
/// end).
fn pair_at(local: &[IoVec], moved: u64) -> usize {
    let (mut at, mut sum) = (0usize, 0u64);
    while at + 1 < local.len() && sum + local[at].len as u64 <= moved {
        sum += local[at].len as u64;
        at += 1;
    }
    at
}

/// One layout of a block batch's copies: block `k` moves `block` bytes from
/// `src + src_idx[k] * src_stride` to `dst + dst_idx[k] * dst_stride`.
#[derive(Clone, Copy)]
pub(crate) struct Strided {
    pub(crate) src: usize,
    pub(crate) src_stride: usize,
    pub(crate) dst: usize,
    pub(crate) dst_stride: usize,
    pub(crate) block: usize,
}

/// A block batch's copies: its layouts, one after the other, over one pair of index arrays
/// (read in place, never expanded).
#[derive(Clone, Copy)]
pub(crate) struct Indexed<'a> {
    pub(crate) layouts: &'a [Strided],
    pub(crate) src_idx: BlockIndices<'a>,
    pub(crate) dst_idx: BlockIndices<'a>,
}

impl Indexed<'_> {
    /// Copies blocks `from..to` of layout `l`.
    ///
    /// # Safety
    /// Each of these blocks' sources is valid for reads and its destination for writes of
    /// `block` bytes, and the two do not overlap.
    #[inline]
    unsafe fn run(&self, l: usize, from: usize, to: usize) {
        let s = &self.layouts[l];
        for k in from..to {
            let src = s.src + self.src_idx.at(k) as usize * s.src_stride;
            let dst = s.dst + self.dst_idx.at(k) as usize * s.dst_stride;
            // SAFETY: the caller's contract.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, s.block) };
        }
    }
}

/// An index array as a raw pointer (its element width, its start, its length).
#[derive(Clone, Copy)]
enum RawIdx {
    U32(*const u32, usize),
    U64(*const u64, usize),
}

impl RawIdx {
    fn of(idx: BlockIndices<'_>) -> Self {
        match idx {
            BlockIndices::U32(v) => RawIdx::U32(v.as_ptr(), v.len()),
            BlockIndices::U64(v) => RawIdx::U64(v.as_ptr(), v.len()),
        }
    }
    /// # Safety
    /// The array it was made from is alive and unchanged for `'a`.
    unsafe fn get<'a>(self) -> BlockIndices<'a> {
        match self {
            // SAFETY: the caller's contract: the pointer and length of a live slice.
            RawIdx::U32(p, n) => BlockIndices::U32(unsafe { std::slice::from_raw_parts(p, n) }),
            // SAFETY: as above.
            RawIdx::U64(p, n) => BlockIndices::U64(unsafe { std::slice::from_raw_parts(p, n) }),
        }
    }
}

/// An [`Indexed`] as raw pointers, for the helper thread (no reference to its arrays outlives
/// the submitter's call).
#[derive(Clone, Copy)]
struct RawIndexed {
    layouts: (*const Strided, usize),
    src_idx: RawIdx,
    dst_idx: RawIdx,
}

impl RawIndexed {
    fn of(b: &Indexed<'_>) -> Self {
        RawIndexed {
            layouts: (b.layouts.as_ptr(), b.layouts.len()),
            src_idx: RawIdx::of(b.src_idx),
            dst_idx: RawIdx::of(b.dst_idx),
        }
    }
    /// # Safety
    /// The arrays it was made from are alive and unchanged for `'a`.
    unsafe fn get<'a>(self) -> Indexed<'a> {
        Indexed {
            // SAFETY: the caller's contract: the pointer and length of a live slice.
            layouts: unsafe { std::slice::from_raw_parts(self.layouts.0, self.layouts.1) },
            // SAFETY: the caller's contract.
            src_idx: unsafe { self.src_idx.get() },
            // SAFETY: the caller's contract.
            dst_idx: unsafe { self.dst_idx.get() },
        }
    }
}

// SAFETY: a `RawIndexed` is made by `copy_indexed` from arrays that outlive every dereference
// of its pointers (the submitter waits for each part the helper claimed; an unclaimed part is
// never run), and the addresses it leads to are memory the caller keeps valid for the whole
// batch; nothing in it is tied to a thread.
unsafe impl Send for RawIndexed {}

/// A run of one layout's blocks: `start..end`, `block` bytes each.
#[derive(Clone, Copy)]
struct BlockSpan {
    layout: usize,
    start: usize,
    end: usize,
    block: u64,
}

impl Cut for BlockSpan {
    fn bytes(&self) -> u64 {
        (self.end - self.start) as u64 * self.block
    }
    fn cut(&self, at: u64) -> (Self, Self) {
        // (not called: the spans are made whole, one part each) at a block boundary
        let mid = (self.start + (at / self.block.max(1)) as usize).clamp(self.start, self.end);
        (
            BlockSpan { end: mid, ..*self },
            BlockSpan {
                start: mid,
                ..*self
            },
        )
    }
}

/// One part of a block batch.
///
/// # Safety
/// As [`Indexed::run`] for the part's blocks; the arrays `b` was made from are alive.
unsafe fn copy_block_part(spans: &[BlockSpan], b: RawIndexed) -> Result<(), PartFail> {
    // SAFETY: a part is run only once claimed, while its submitter (`copy_indexed`) waits for
    // it with the arrays alive.
    let copy = unsafe { b.get() };
    for s in spans {
        // SAFETY: the caller's contract.
        unsafe { copy.run(s.layout, s.start, s.end) };
    }
    Ok(())
}

/// Copies the blocks of `b` by `stop`, as [`copy_all`] does: batches of 1 MiB or more shared
/// with the helper thread in parts of about [`PART`] bytes (whole blocks of one layout); the
/// call returns once no part is being copied.
///
/// # Safety
/// Every block's source is valid for reads and its destination for writes of its layout's
/// `block` bytes for the whole call, and the two do not overlap.
pub(crate) unsafe fn copy_indexed(b: &Indexed<'_>, stop: &Stop<'_>) -> Result<(), Halt> {
    let count = b.src_idx.len();
    let total = (b.layouts.iter()).fold(0usize, |t, s| {
        t.saturating_add(count.saturating_mul(s.block))
    });
    if total < HELP_MIN {
        for (l, s) in b.layouts.iter().enumerate() {
            let per_check = (PART / s.block.max(1)).clamp(1, CHECK_EVERY);
            let mut at = 0;
            while at < count {
                stop.check()?;
                let end = count.min(at + per_check);
                // SAFETY: the caller's contract.
                unsafe { b.run(l, at, end) };
                at = end;
            }
        }
        return Ok(());
    }
    let mut spans: Vec<Vec<BlockSpan>> = Vec::new();
    for (layout, s) in b.layouts.iter().enumerate() {
        let per_part = (PART / s.block.max(1)).max(1);
        spans.extend((0..count).step_by(per_part).map(|start| {
            vec![BlockSpan {
                layout,
                start,
                end: count.min(start + per_part),
                block: s.block as u64,
            }]
        }));
    }
    // the arrays outlive this call, which `run_parts` does not outlast
    let raw = RawIndexed::of(b);
    // SAFETY: the caller's contract, for the whole call.
    match unsafe { run_parts(spans, copy_block_part, raw, true, stop) } {
        None => Ok(()),
        Some((why, _)) => Err(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    /// Random bytes (a xorshift stream: the unit tests do not have `testkit`).
    fn random(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn no_stop() -> Stop<'static> {
        Stop {
            deadline: Instant::now() + std::time::Duration::from_secs(3600),
            cancelled: &|| false,
            given_up: None,
        }
    }

    /// Batches large enough to be shared, from several threads at once (so the helper is busy,
    /// or wakes to a batch already done, or shares it): every byte lands where it belongs and
    /// nothing else is written.
    #[test]
    fn shared_copies_move_every_byte_once() {
        std::thread::scope(|s| {
            for t in 0..4u64 {
                s.spawn(move || {
                    for round in 0..12u64 {
                        let seed = t * 100 + round;
                        let n = (3 << 20) + (seed as usize * 4099) % (1 << 20);
                        let src = random(seed, n);
                        let mut dst = random(!seed, n + 64);
                        let before = dst.clone();
                        // pieces of odd sizes, in reverse order, 32 bytes into `dst`
                        let step = 4096 + (seed as usize * 977) % 70_000;
                        let (sp, dp) = (src.as_ptr() as usize, dst.as_mut_ptr() as usize + 32);
                        let copies: Vec<MemCopy> = (0..n)
                            .step_by(step)
                            .rev()
                            .map(|off| MemCopy {
                                src: sp + off,
                                dst: dp + off,
                                len: step.min(n - off),
                            })
                            .collect();
                        // SAFETY: every source lies in `src`, every destination in `dst`, both
                        // alive for the call, distinct allocations.
                        unsafe { copy_all(&copies, &no_stop()) }.unwrap();
                        assert!(dst[32..32 + n] == src[..], "seed {seed}: bytes differ");
                        assert_eq!(
                            dst[..32],
                            before[..32],
                            "seed {seed}: wrote before the range"
                        );
                        assert_eq!(
                            dst[32 + n..],
                            before[32 + n..],
                            "seed {seed}: wrote after it"
                        );
                    }
                });
            }
        });
    }

    /// A batch stops between parts at its deadline or at a cancel, small or shared: it returns
    /// `Deadline`/`Cancelled` long before all of it could have moved, and no byte is written
    /// after it returned.
    #[test]
    fn a_batch_stops_between_parts_and_nothing_moves_afterwards() {
        // 64 MiB copied 64 times over (4 GiB): far longer than the deadline on any machine
        let n = 64 << 20;
        let src = random(7, n);
        let mut dst = vec![0u8; n];
        let copies: Vec<MemCopy> = (0..64)
            .map(|_| MemCopy {
                src: src.as_ptr() as usize,
                dst: dst.as_mut_ptr() as usize,
                len: n,
            })
            .collect();
        for cancel in [false, true] {
            dst.fill(0);
            let t0 = Instant::now();
            let asked = AtomicBool::new(false);
            let cancelled = || {
                // a cancel asked for once the batch had started
                cancel && (asked.load(Ordering::Relaxed) || t0.elapsed().as_millis() >= 2)
            };
            let stop = Stop {
                deadline: if cancel {
                    t0 + std::time::Duration::from_secs(3600)
                } else {
                    t0 + std::time::Duration::from_millis(2)
                },
                cancelled: &cancelled,
                given_up: None,
            };
            // SAFETY: as in the test above.
            let r = unsafe { copy_all(&copies, &stop) };
            let took = t0.elapsed();
            match (cancel, r) {
                (false, Err(Halt::Deadline)) | (true, Err(Halt::Cancelled)) => {}
                (_, r) => panic!("cancel {cancel}: {r:?} after {took:?}"),
            }
            // nothing lands after the call returned
            let snap = dst.clone();
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(
                dst == snap,
                "cancel {cancel}: written after the call returned"
            );
            // a small batch (no helper) stops too, at its first check
            asked.store(true, Ordering::Relaxed);
            let small = [MemCopy {
                src: src.as_ptr() as usize,
                dst: dst.as_mut_ptr() as usize,
                len: 4096,
            }];
            let past = Stop {
                deadline: if cancel { stop.deadline } else { t0 },
                cancelled: &cancelled,
                given_up: None,
            };
            // SAFETY: as above.
            let r = unsafe { copy_all(&small, &past) };
            assert!(r.is_err(), "cancel {cancel}");
        }
    }

    /// A block batch of three layouts (blocks of different sizes, indices reversed and
    /// scattered), small and large enough to be shared: each layout's blocks land where their
    /// indices say, and nothing else of the destination is written.
    #[test]
    fn indexed_copies_move_each_layout() {
        for n in [40usize, 3000] {
            let blocks = [512usize, 4096, 1000];
            let src_idx: Vec<u64> = (0..n as u64).rev().collect();
            let dst_idx: Vec<u32> = (0..n as u32).map(|i| (i * 7) % n as u32).collect();
            let srcs: Vec<Vec<u8>> = (blocks.iter().enumerate())
                .map(|(k, b)| random(k as u64 + 11, n * b * 2))
                .collect();
            let mut dsts: Vec<Vec<u8>> = (blocks.iter().enumerate())
                .map(|(k, b)| random(k as u64 + 99, n * b * 3))
                .collect();
            let before = dsts.clone();
            let layouts: Vec<Strided> = (0..3)
                .map(|k| Strided {
                    src: srcs[k].as_ptr() as usize,
                    src_stride: blocks[k] * 2,
                    dst: dsts[k].as_mut_ptr() as usize,
                    dst_stride: blocks[k] * 3,
                    block: blocks[k],
                })
                .collect();
            let b = Indexed {
                layouts: &layouts,
                src_idx: BlockIndices::U64(&src_idx),
                dst_idx: BlockIndices::U32(&dst_idx),
            };
            // SAFETY: every block lies in its layout's `srcs`/`dsts` buffer (index < n, stride
            // 2 or 3 blocks, buffers 2n and 3n blocks long), all alive for the call, distinct.
            unsafe { copy_indexed(&b, &no_stop()) }.unwrap();
            for k in 0..3 {
                let bl = blocks[k];
                let mut want = before[k].clone();
                for i in 0..n {
                    let s = src_idx[i] as usize * bl * 2;
                    let d = dst_idx[i] as usize * bl * 3;
                    want[d..d + bl].copy_from_slice(&srcs[k][s..s + bl]);
                }
                assert!(dsts[k] == want, "layout {k} of {n} blocks");
            }
        }
    }
}
