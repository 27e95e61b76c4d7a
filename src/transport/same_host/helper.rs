//! How a same-host batch moves: memory copies (mapped regions) and `process_vm_*` pairs, in
//! parts, between which the batch stops at its deadline or a cancel; large batches are shared
//! with a helper thread (whoever is free claims the next part). A batch that stops returns only
//! once no part of it is still moving, so its end means nothing touches its memory any more.

use std::io;
use std::sync::OnceLock;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::io::IoVec;
use crate::process::{PeerProc, Target, vm_io};
use crate::sync::lock;
use crate::sync::model::{AtomicBool, AtomicUsize};
use crate::types::blocks::BlockIndices;
use crate::types::split::{Cut, split};

/// A memory copy to run: `len` bytes from `src` to `dst` (addresses).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemCopy {
    pub src: usize,
    pub dst: usize,
    pub len: usize,
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

/// When a batch stops between its parts: at its deadline, or once `cancelled` says so (an async
/// request's cancel; asked by the caller's thread only).
pub(crate) struct Stop<'a> {
    pub(crate) deadline: Instant,
    pub(crate) cancelled: &'a dyn Fn() -> bool,
}

/// Why a batch ended before all of it moved. Nothing of it moves any more when this is
/// returned.
#[derive(Debug)]
pub(crate) enum Halt {
    /// Its deadline passed.
    Deadline,
    /// It was cancelled.
    Cancelled,
    /// A `process_vm_*` call failed, at this pair of the batch.
    Failed(io::Error, usize),
}

/// A part's failure: the error and how many of the part's bytes had moved.
type PartFail = (io::Error, u64);

/// The parts of a batch, claimed one at a time by the caller and (for large batches) the helper
/// until none is left or one of them stops the batch: a helper slow to wake (its core busy)
/// costs the caller nothing, the caller then moves every part itself. (Its locks and atomics
/// are the loom model's, `loom_model` below.)
struct Parts<P> {
    parts: Vec<Vec<P>>,
    /// The next part to claim (past the end: none left).
    next: AtomicUsize,
    /// Parts finished, or given up unclaimed (see [`Parts::give_up`]).
    finished: crate::sync::model::Mutex<usize>,
    all_done: crate::sync::model::Condvar,
    deadline: Instant,
    /// Set with the first reason to stop; no part is claimed afterwards.
    halted: AtomicBool,
    /// The first reason, and for a failure the part it happened in.
    why: crate::sync::model::Mutex<Option<(Halt, usize, u64)>>,
}

impl<P> Parts<P> {
    fn new(parts: Vec<Vec<P>>, deadline: Instant) -> Self {
        Parts {
            parts,
            next: AtomicUsize::new(0),
            finished: crate::sync::model::Mutex::new(0),
            all_done: crate::sync::model::Condvar::new(),
            deadline,
            halted: AtomicBool::new(false),
            why: crate::sync::model::Mutex::new(None),
        }
    }

    /// Claims parts and runs them with `run` (given `ctx`) until none is left or the batch
    /// stops: before each claim the deadline and `cancelled` are checked.
    ///
    /// # Safety
    /// `run(part, ctx)` must be safe to call on every part until it is finished (its memory
    /// valid).
    unsafe fn work<C: Copy>(
        &self,
        run: unsafe fn(&[P], C) -> Result<(), PartFail>,
        ctx: C,
        cancelled: &dyn Fn() -> bool,
    ) {
        loop {
            if self.halted.load(Ordering::Acquire) {
                return;
            }
            if Instant::now() >= self.deadline {
                return self.halt(Halt::Deadline, 0, 0);
            }
            if cancelled() {
                return self.halt(Halt::Cancelled, 0, 0);
            }
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            let Some(part) = self.parts.get(i) else {
                return;
            };
            // (`run` cannot unwind past here without the part being finished: a part left
            // unfinished would keep the submitter waiting, so both runners are unwind-free:
            // copies and system calls)
            // SAFETY: the caller's contract; the part is this claimant's alone.
            let r = unsafe { run(part, ctx) };
            if let Err((e, moved)) = r {
                self.halt(Halt::Failed(e, 0), i, moved);
            }
            self.finish(1);
        }
    }

    /// Stops the batch for `why` (the first reason stays) and gives up the parts nobody
    /// claimed.
    fn halt(&self, why: Halt, part: usize, moved: u64) {
        {
            let mut w = crate::sync::model::lock(&self.why);
            if w.is_none() {
                *w = Some((why, part, moved));
            }
        }
        self.halted.store(true, Ordering::Release);
        self.give_up();
    }

    /// Counts the parts nobody claimed yet as finished; later claims find none.
    fn give_up(&self) {
        let n = self.parts.len();
        let unclaimed = n.saturating_sub(self.next.swap(n, Ordering::AcqRel));
        if unclaimed > 0 {
            self.finish(unclaimed);
        }
    }

    fn finish(&self, n: usize) {
        let mut f = crate::sync::model::lock(&self.finished);
        *f += n;
        if *f >= self.parts.len() {
            self.all_done.notify_all();
        }
    }

    /// Waits until every part is finished or given up.
    fn wait(&self) {
        let n = self.parts.len();
        let mut f = crate::sync::model::lock(&self.finished);
        while *f < n {
            f = self.all_done.wait(f).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The reason the batch stopped, with a failure's position as its byte offset in the
    /// batch; `None` if every part moved.
    fn outcome(&self) -> Option<(Halt, u64)>
    where
        P: Cut,
    {
        let (why, part, moved) = crate::sync::model::lock(&self.why).take()?;
        let before: u64 = self.parts[..part].iter().flatten().map(Cut::bytes).sum();
        Some((why, before + moved))
    }
}

/// Waits, even while unwinding, until no part of a batch shared with the helper is moving:
/// parts nobody claimed are given up, claimed ones waited for.
struct Joined<'a, P>(&'a Parts<P>);

impl<P> Drop for Joined<'_, P> {
    fn drop(&mut self) {
        self.0.give_up();
        self.0.wait();
    }
}

/// What the helper does: claim parts of a batch of copies, of a block batch's copies, or of
/// `process_vm_*` pairs.
enum Work {
    Copies(std::sync::Arc<Parts<MemCopy>>),
    Blocks(std::sync::Arc<Parts<BlockSpan>>, RawBlocks),
    Pvm {
        parts: std::sync::Arc<Parts<Pair>>,
        target: Target,
        write: bool,
    },
}

/// A persistent helper thread that moves parts of a large same-host batch while the caller
/// moves the others (waking it costs far less than spawning a thread per transfer).
struct Helper {
    queue: std::sync::Mutex<std::collections::VecDeque<Work>>,
    cv: std::sync::Condvar,
}

fn helper() -> Option<&'static Helper> {
    static H: OnceLock<Option<&'static Helper>> = OnceLock::new();
    *H.get_or_init(|| {
        let h: &'static Helper = Box::leak(Box::new(Helper {
            queue: std::sync::Mutex::new(std::collections::VecDeque::new()),
            cv: std::sync::Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("hixl-copy".into())
            .spawn(move || {
                loop {
                    let work = {
                        let mut q = lock(&h.queue);
                        loop {
                            if let Some(w) = q.pop_front() {
                                break w;
                            }
                            q = h.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                        }
                    };
                    // SAFETY: a part is moved only once claimed, and the submitter does not
                    // return (or unwind) before every claimed part is finished (`Joined`). The
                    // ranges are the caller's registered memory and the peer's mapped memfd (or
                    // its address space, through the kernel), which the peer may write at the
                    // same time: they are copied as raw bytes, never made into Rust references,
                    // and kept mapped by the caller's registration and the link's fence for the
                    // whole batch. The helper checks the deadline, not the cancel (the caller
                    // does, and stops the helper's claims when it sees one).
                    unsafe {
                        match work {
                            Work::Copies(p) => p.work(copy_part, (), &|| false),
                            Work::Blocks(p, b) => p.work(copy_block_part, b, &|| false),
                            Work::Pvm {
                                parts,
                                target,
                                write,
                            } => parts.work(run_pairs, (target, write), &|| false),
                        }
                    }
                }
            })
            .ok()
            .map(|_| h)
    })
}

/// Hands `work` to the helper if it is idle; `false` if it is busy or absent (the caller then
/// moves every part itself).
fn submit(work: Work) -> bool {
    let Some(h) = helper() else { return false };
    {
        let mut q = lock(&h.queue);
        if !q.is_empty() {
            return false;
        }
        q.push_back(work);
    }
    h.cv.notify_one();
    true
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
                check(stop)?;
                (bytes, count) = (0, 0);
            }
            // SAFETY: the caller's contract.
            unsafe { run_copies(std::slice::from_ref(c)) };
            (bytes, count) = (bytes + c.len, count + 1);
        }
        return Ok(());
    }
    let parts = std::sync::Arc::new(Parts::new(
        split(copies, total.div_ceil(PART)),
        stop.deadline,
    ));
    {
        // waits for every part the helper claimed before this call returns (or unwinds)
        let joined = Joined(&parts);
        submit(Work::Copies(parts.clone()));
        // SAFETY: the caller's contract; `joined` keeps this call from returning while the
        // helper still copies a part.
        unsafe { parts.work(copy_part, (), stop.cancelled) };
        drop(joined);
    }
    match parts.outcome() {
        None => Ok(()),
        Some((why, _)) => Err(why),
    }
}

/// The deadline and cancel of `stop`, checked now.
fn check(stop: &Stop<'_>) -> Result<(), Halt> {
    if Instant::now() >= stop.deadline {
        return Err(Halt::Deadline);
    }
    if (stop.cancelled)() {
        return Err(Halt::Cancelled);
    }
    Ok(())
}

/// `process_vm_*` over pairs `(local[i], remote[i])` of equal lengths by `stop`, in parts of
/// 1 to 8 MiB (and at most [`PVM_PART_PAIRS`] pairs), shared with the helper thread from 1 MiB
/// on. A failure names the pair where it stopped.
///
/// # Safety
/// As `PeerProc::pvm`, for the whole call.
pub(crate) unsafe fn pvm_all(
    proc: &PeerProc,
    write: bool,
    local: &[IoVec],
    remote: &[IoVec],
    stop: &Stop<'_>,
) -> Result<(), Halt> {
    let pairs: Vec<Pair> = local
        .iter()
        .zip(remote)
        .map(|(a, b)| Pair(*a, *b))
        .collect();
    let total: usize = local.iter().map(|v| v.len).sum();
    let target = proc.target();
    let part = (total / 8).clamp(PVM_PART_MIN, PVM_PART_MAX);
    let parts: Vec<Vec<Pair>> = split(&pairs, total.div_ceil(part))
        .into_iter()
        .flat_map(|p| match p.len() > PVM_PART_PAIRS {
            false => vec![p],
            true => p.chunks(PVM_PART_PAIRS).map(<[Pair]>::to_vec).collect(),
        })
        .collect();
    let parts = std::sync::Arc::new(Parts::new(parts, stop.deadline));
    {
        let joined = Joined(&parts);
        if total >= HELP_MIN {
            submit(Work::Pvm {
                parts: parts.clone(),
                target,
                write,
            });
        }
        // SAFETY: the caller's contract; `joined` waits for the helper's parts.
        unsafe { parts.work(run_pairs, (target, write), stop.cancelled) };
        drop(joined);
    }
    match parts.outcome() {
        None if !write && proc.exited() => {
            // after a read: the peer must still be alive, else the bytes may come from a
            // process that got its pid
            Err(Halt::Failed(
                io::Error::from_raw_os_error(libc::ESRCH),
                local.len().saturating_sub(1),
            ))
        }
        None => Ok(()),
        Some((Halt::Failed(e, _), moved)) => Err(Halt::Failed(e, pair_at(local, moved))),
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

/// A block batch's copies: block `k` moves `block` bytes from `src + src_idx[k] * src_stride`
/// to `dst + dst_idx[k] * dst_stride` (the index arrays are read in place, never expanded).
#[derive(Clone, Copy)]
pub(crate) struct BlockCopy<'a> {
    pub(crate) src: usize,
    pub(crate) src_stride: usize,
    pub(crate) src_idx: BlockIndices<'a>,
    pub(crate) dst: usize,
    pub(crate) dst_stride: usize,
    pub(crate) dst_idx: BlockIndices<'a>,
    pub(crate) block: usize,
}

impl BlockCopy<'_> {
    /// Copies blocks `from..to`.
    ///
    /// # Safety
    /// Each of these blocks' sources is valid for reads and its destination for writes of
    /// `block` bytes, and the two do not overlap.
    #[inline]
    unsafe fn run(&self, from: usize, to: usize) {
        for k in from..to {
            let s = self.src + self.src_idx.at(k) as usize * self.src_stride;
            let d = self.dst + self.dst_idx.at(k) as usize * self.dst_stride;
            // SAFETY: the caller's contract.
            unsafe { std::ptr::copy_nonoverlapping(s as *const u8, d as *mut u8, self.block) };
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

/// A [`BlockCopy`] whose index arrays are raw pointers, for the helper thread (no reference to
/// them outlives the submitter's call).
#[derive(Clone, Copy)]
struct RawBlocks {
    src: usize,
    src_stride: usize,
    src_idx: RawIdx,
    dst: usize,
    dst_stride: usize,
    dst_idx: RawIdx,
    block: usize,
}

impl RawBlocks {
    fn of(b: &BlockCopy<'_>) -> Self {
        RawBlocks {
            src: b.src,
            src_stride: b.src_stride,
            src_idx: RawIdx::of(b.src_idx),
            dst: b.dst,
            dst_stride: b.dst_stride,
            dst_idx: RawIdx::of(b.dst_idx),
            block: b.block,
        }
    }
    /// # Safety
    /// The index arrays it was made from are alive and unchanged for `'a`.
    unsafe fn copy<'a>(self) -> BlockCopy<'a> {
        BlockCopy {
            src: self.src,
            src_stride: self.src_stride,
            // SAFETY: the caller's contract.
            src_idx: unsafe { self.src_idx.get() },
            dst: self.dst,
            dst_stride: self.dst_stride,
            // SAFETY: the caller's contract.
            dst_idx: unsafe { self.dst_idx.get() },
            block: self.block,
        }
    }
}

// SAFETY: a `RawBlocks` is made by `copy_blocks` from arrays that outlive every dereference of
// its pointers (the submitter waits for each part the helper claimed, `Joined`; an unclaimed
// part is never run), and the addresses in it are memory the caller keeps valid for the whole
// batch; nothing in it is tied to a thread.
unsafe impl Send for RawBlocks {}

/// A run of a block batch's blocks: `start..end`, `block` bytes each.
#[derive(Clone, Copy)]
struct BlockSpan {
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
/// As [`BlockCopy::run`] for the part's blocks.
unsafe fn copy_block_part(spans: &[BlockSpan], b: RawBlocks) -> Result<(), PartFail> {
    // SAFETY: a part is run only once claimed, while its submitter (`copy_blocks`) waits for
    // it with the index arrays alive.
    let copy = unsafe { b.copy() };
    for s in spans {
        // SAFETY: the caller's contract.
        unsafe { copy.run(s.start, s.end) };
    }
    Ok(())
}

/// Copies the blocks of `b` (`count` of them) by `stop`, as [`copy_all`] does: batches of
/// 1 MiB or more shared with the helper thread in parts of about [`PART`] bytes (whole blocks);
/// the call returns once no part is being copied.
///
/// # Safety
/// Every block's source is valid for reads and its destination for writes of `b.block` bytes
/// for the whole call, and the two do not overlap.
pub(crate) unsafe fn copy_blocks(
    b: &BlockCopy<'_>,
    count: usize,
    stop: &Stop<'_>,
) -> Result<(), Halt> {
    let total = count.saturating_mul(b.block);
    let per_check = (PART / b.block.max(1)).clamp(1, CHECK_EVERY);
    if total < HELP_MIN {
        let mut at = 0;
        while at < count {
            check(stop)?;
            let end = count.min(at + per_check);
            // SAFETY: the caller's contract.
            unsafe { b.run(at, end) };
            at = end;
        }
        return Ok(());
    }
    let per_part = (PART / b.block.max(1)).max(1);
    let spans: Vec<Vec<BlockSpan>> = (0..count)
        .step_by(per_part)
        .map(|start| {
            vec![BlockSpan {
                start,
                end: count.min(start + per_part),
                block: b.block as u64,
            }]
        })
        .collect();
    let parts = std::sync::Arc::new(Parts::new(spans, stop.deadline));
    // the index arrays outlive this call, and `joined` keeps the call from returning (or
    // unwinding) while the helper still copies a part
    let raw = RawBlocks::of(b);
    {
        let joined = Joined(&parts);
        submit(Work::Blocks(parts.clone(), raw));
        // SAFETY: the caller's contract; `joined` waits for the helper's parts.
        unsafe { parts.work(copy_block_part, raw, stop.cancelled) };
        drop(joined);
    }
    match parts.outcome() {
        None => Ok(()),
        Some((why, _)) => Err(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            };
            // SAFETY: as above.
            let r = unsafe { copy_all(&small, &past) };
            assert!(r.is_err(), "cancel {cancel}");
        }
    }
}

/// The shared parts of a same-host batch under loom (`RUSTFLAGS="--cfg loom" cargo test
/// --release --lib loom`): the caller and the helper claim parts of the real [`Parts`] (with
/// loom's lock, condition variable and atomics) while a third thread cancels; each part writes
/// its own `loom::cell::UnsafeCell`, and once the caller's share and [`Joined`] returned the
/// owner writes every cell (the buffer reused). Properties: no part's write races the owner's
/// (the call returns only when no part can still touch the buffer), every part is finished or
/// given up exactly once (nobody waits forever), and a batch that reports no stop moved every
/// part.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    type Cells = [UnsafeCell<u8>; 2];

    /// A part is an index; its bytes do not matter here.
    impl Cut for usize {
        fn bytes(&self) -> u64 {
            1
        }
        fn cut(&self, _: u64) -> (Self, Self) {
            unreachable!("the model's parts are not cut")
        }
    }

    /// Marks the cells of the part's indices moved.
    ///
    /// # Safety
    /// `cells` points to live cells.
    unsafe fn mark(part: &[usize], cells: *const Cells) -> Result<(), PartFail> {
        for &i in part {
            // SAFETY: the caller's contract; loom checks the accesses' order.
            unsafe { (*cells)[i].with_mut(|m| *m = 1) };
        }
        Ok(())
    }

    #[test]
    fn a_returned_batch_leaves_no_part_moving() {
        loom::model(|| {
            let cells: Arc<Cells> = Arc::new([UnsafeCell::new(0), UnsafeCell::new(0)]);
            let far = Instant::now() + std::time::Duration::from_secs(3600);
            let parts = Arc::new(Parts::new(vec![vec![0usize], vec![1]], far));
            let cancel = Arc::new(AtomicBool::new(false));
            let helper = {
                let (parts, cells) = (parts.clone(), cells.clone());
                loom::thread::spawn(move || {
                    // SAFETY: the cells live as long as this thread's `Arc`.
                    unsafe { parts.work(mark, Arc::as_ptr(&cells), &|| false) };
                })
            };
            let canceller = {
                let cancel = cancel.clone();
                loom::thread::spawn(move || cancel.store(true, Ordering::SeqCst))
            };
            {
                let joined = Joined(&*parts);
                let cancelled = || cancel.load(Ordering::SeqCst);
                // SAFETY: as above.
                unsafe { parts.work(mark, Arc::as_ptr(&cells), &cancelled) };
                drop(joined);
            }
            let moved: Vec<u8> = (0..2)
                .map(|i| {
                    // SAFETY: as above: the owner's access, after the call returned.
                    cells[i].with_mut(|m| unsafe {
                        let was = *m;
                        *m = 2;
                        was
                    })
                })
                .collect();
            if parts.outcome().is_none() {
                assert_eq!(moved, [1, 1], "no stop reported, yet a part did not move");
            }
            helper.join().unwrap();
            canceller.join().unwrap();
        });
    }
}
