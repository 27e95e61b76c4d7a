//! Large same-host batches, shared with a helper: a persistent thread copies parts of a batch of
//! memory copies while the caller copies the others (whoever is free takes the next part), or
//! half the bytes of a batch of `process_vm_*` pairs.

use std::io;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::io::IoVec;
use crate::process::{PeerProc, Target, vm_io};
use crate::sync::lock;
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

/// A large batch of memory copies shared by the caller and the helper: both take the next
/// unclaimed part until none is left, so a helper that is slow to wake (its core busy) costs the
/// caller nothing: the caller then copies every part itself.
struct Shared {
    parts: Vec<Vec<MemCopy>>,
    /// The next part to claim (past the end: none left).
    next: AtomicUsize,
    /// Parts finished (or given up unstarted, see [`SharedCopies`]'s drop).
    finished: std::sync::Mutex<usize>,
    all_done: std::sync::Condvar,
}

impl Shared {
    /// Claims parts and copies them until none is left.
    ///
    /// # Safety
    /// Every copy of every part must be valid ([`run_copies`]) until the part is finished.
    unsafe fn work(&self) {
        while let Some(part) = self.parts.get(self.next.fetch_add(1, Ordering::AcqRel)) {
            // SAFETY: the caller's contract; the submitter waits for every claimed part.
            // (`run_copies` cannot unwind, so a claimed part is always finished: a part that
            // unwound here would leave `SharedCopies` waiting for it.)
            unsafe { run_copies(part) };
            self.finish(1);
        }
    }
    fn finish(&self, n: usize) {
        let mut f = lock(&self.finished);
        *f += n;
        if *f >= self.parts.len() {
            self.all_done.notify_all();
        }
    }
}

/// What the helper does: a share of memory copies, or a `process_vm_*` batch for process `pid`.
enum Work {
    Copies(std::sync::Arc<Shared>),
    Pvm {
        target: Target,
        write: bool,
        local: Vec<IoVec>,
        remote: Vec<IoVec>,
    },
}

type PvmResult = Result<(), (io::Error, u64)>;
type Done = std::sync::Arc<(std::sync::Mutex<Option<PvmResult>>, std::sync::Condvar)>;

struct CopyJob {
    work: Work,
    done: Done,
}

/// A persistent helper thread that copies part of a large same-host batch while the caller
/// copies the rest (waking it costs far less than spawning a thread per transfer).
struct CopyHelper {
    queue: std::sync::Mutex<std::collections::VecDeque<CopyJob>>,
    cv: std::sync::Condvar,
}

fn helper() -> Option<&'static CopyHelper> {
    static H: OnceLock<Option<&'static CopyHelper>> = OnceLock::new();
    *H.get_or_init(|| {
        let h: &'static CopyHelper = Box::leak(Box::new(CopyHelper {
            queue: std::sync::Mutex::new(std::collections::VecDeque::new()),
            cv: std::sync::Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("hixl-copy".into())
            .spawn(move || {
                loop {
                    let job = {
                        let mut q = lock(&h.queue);
                        loop {
                            if let Some(j) = q.pop_front() {
                                break j;
                            }
                            q = h.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                        }
                    };
                    // SAFETY: copies: a part is copied only once claimed, and the submitter
                    // does not return (or unwind) before every claimed part is finished
                    // (`SharedCopies`); `process_vm_*` pairs: the submitter keeps every range
                    // valid until `done` is set (it waits for it, even while unwinding:
                    // `WaitDone`). The ranges are the caller's registered memory and the peer's
                    // mapped memfd, which the peer may write at the same time: they are copied
                    // as raw bytes, never made into Rust references, and kept mapped by the
                    // caller's registration and the link's fence for the whole batch.
                    let r = unsafe {
                        match job.work {
                            Work::Copies(c) => {
                                c.work();
                                Ok(())
                            }
                            Work::Pvm {
                                target,
                                write,
                                mut local,
                                mut remote,
                            } => vm_io(target, write, &mut local, &mut remote),
                        }
                    };
                    let (m, cv) = &*job.done;
                    *lock(m) = Some(r);
                    cv.notify_all();
                }
            })
            .ok()
            .map(|_| h)
    })
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

/// Waits for a helper job on drop, so the borrowed memory outlives the helper's use of it even
/// if the caller unwinds.
struct WaitDone {
    done: Done,
    /// Whether [`WaitDone::result`] has taken the result (then dropping has nothing to wait for,
    /// and only releases `done`).
    taken: bool,
}

impl WaitDone {
    /// Waits for the helper and takes its result.
    fn result(mut self) -> PvmResult {
        let r = Self::wait(&self.done);
        self.taken = true;
        r
    }
    /// Leaves the job to finish on its own (its memory is waited for some other way).
    fn detach(mut self) {
        self.taken = true;
    }
    fn wait(done: &Done) -> PvmResult {
        let (m, cv) = &**done;
        let mut g = lock(m);
        loop {
            if let Some(r) = g.take() {
                return r;
            }
            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for WaitDone {
    fn drop(&mut self) {
        if !self.taken {
            let _ = Self::wait(&self.done);
        }
    }
}

/// Hands `work` to the helper if it is idle; `None` (and the work back) if it is busy or absent.
fn submit(work: Work) -> Result<WaitDone, Work> {
    let Some(h) = helper() else { return Err(work) };
    let done: Done = std::sync::Arc::new((std::sync::Mutex::new(None), std::sync::Condvar::new()));
    {
        let mut q = lock(&h.queue);
        if !q.is_empty() {
            return Err(work);
        }
        q.push_back(CopyJob {
            work,
            done: done.clone(),
        });
    }
    h.cv.notify_one();
    Ok(WaitDone { done, taken: false })
}

/// Copies below this many bytes in all are not shared with the helper thread.
const HELP_MIN: usize = 1 << 20;

/// The size of the parts a shared batch of copies is claimed in: small enough to share a 1 MiB
/// batch eight ways, large enough that claiming one (an atomic add) is nothing beside its copy.
const PART: usize = 128 << 10;

/// Waits, even while unwinding, until no part of a shared batch is being copied: parts nobody
/// claimed yet are given up (the helper then finds none left), claimed ones are waited for.
struct SharedCopies(std::sync::Arc<Shared>);

impl Drop for SharedCopies {
    fn drop(&mut self) {
        let s = &self.0;
        let n = s.parts.len();
        let unclaimed = n.saturating_sub(s.next.swap(n, Ordering::AcqRel));
        if unclaimed > 0 {
            s.finish(unclaimed);
        }
        let mut f = lock(&s.finished);
        while *f < n {
            f = s.all_done.wait(f).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Runs the copies, sharing batches of 1 MiB or more with the helper thread: the two claim parts
/// of [`PART`] bytes until none is left, and the call returns once every part is copied.
///
/// # Safety
/// As [`run_copies`], for the whole call.
pub(crate) unsafe fn copy_all(copies: &[MemCopy]) {
    let total: usize = copies.iter().map(|c| c.len).sum();
    if total < HELP_MIN {
        // SAFETY: the caller's contract.
        return unsafe { run_copies(copies) };
    }
    let shared = std::sync::Arc::new(Shared {
        parts: split(copies, total.div_ceil(PART)),
        next: AtomicUsize::new(0),
        finished: std::sync::Mutex::new(0),
        all_done: std::sync::Condvar::new(),
    });
    // waits for every part the helper claimed before this call returns (or unwinds)
    let guard = SharedCopies(shared.clone());
    // a busy or absent helper leaves every part to this thread; the job's own completion is not
    // waited for (`guard` is): a helper that wakes after the last part finds nothing to do
    if let Ok(job) = submit(Work::Copies(shared)) {
        job.detach();
    }
    // SAFETY: the caller's contract; `guard` keeps this call from returning while the helper
    // still copies a part.
    unsafe { guard.0.work() };
    drop(guard);
}

/// `process_vm_*` over pairs `(local[i], remote[i])` of equal lengths, sharing batches of 1 MiB
/// or more with the helper thread (about half the bytes each). On failure returns the error and
/// the index of the pair where it stopped.
///
/// # Safety
/// As `PeerProc::pvm`, for the whole call.
pub(crate) unsafe fn pvm_all(
    proc: &PeerProc,
    write: bool,
    local: &[IoVec],
    remote: &[IoVec],
) -> Result<(), (io::Error, usize)> {
    let where_ = |lens: &[usize], moved: u64| {
        let (mut at, mut sum) = (0usize, 0u64);
        while at + 1 < lens.len() && sum + lens[at] as u64 <= moved {
            sum += lens[at] as u64;
            at += 1;
        }
        at
    };
    let total: usize = local.iter().map(|v| v.len).sum();
    if total < HELP_MIN {
        let (mut l, mut r) = (local.to_vec(), remote.to_vec());
        let lens: Vec<usize> = l.iter().map(|v| v.len).collect();
        // SAFETY: the caller's contract.
        return unsafe { proc.pvm(write, &mut l, &mut r) }
            .map_err(|(e, moved)| (e, where_(&lens, moved)))
            .and_then(|()| read_checked(proc, write, local.len()));
    }
    // cut at half the bytes: pairs [0, k) and the first part of pair k go here, the rest there
    let pairs: Vec<Pair> = local
        .iter()
        .zip(remote)
        .map(|(a, b)| Pair(*a, *b))
        .collect();
    let mut halves = split(&pairs, 2).into_iter();
    let (first, rest) = (
        halves.next().unwrap_or_default(),
        halves.next().unwrap_or_default(),
    );
    // the pair the second half starts in (cut or whole), for error positions
    let first_bytes: usize = first.iter().map(|p| p.0.len).sum();
    let k = {
        let (mut k, mut sum) = (0, 0);
        while k < local.len() && sum + local[k].len <= first_bytes {
            sum += local[k].len;
            k += 1;
        }
        k
    };
    let unzip = |v: &[Pair]| -> (Vec<IoVec>, Vec<IoVec>) { v.iter().map(|p| (p.0, p.1)).unzip() };
    let ((mut l, mut r), (l2, r2)) = (unzip(&first), unzip(&rest));
    let (lens1, lens2): (Vec<usize>, Vec<usize>) = (
        l.iter().map(|v| v.len).collect(),
        l2.iter().map(|v| v.len).collect(),
    );
    let theirs = Work::Pvm {
        target: proc.target(),
        write,
        local: l2,
        remote: r2,
    };
    let (wait, mut l2, mut r2) = match submit(theirs) {
        Ok(w) => (Some(w), Vec::new(), Vec::new()),
        Err(Work::Pvm { local, remote, .. }) => (None, local, remote),
        Err(Work::Copies(_)) => unreachable!("submit hands back what it was given"),
    };
    // SAFETY: the caller's contract; the helper's half is waited for before returning.
    let first =
        unsafe { proc.pvm(write, &mut l, &mut r) }.map_err(|(e, moved)| (e, where_(&lens1, moved)));
    let second = match wait {
        Some(w) => w.result(),
        // SAFETY: the caller's contract.
        None => unsafe { proc.pvm(write, &mut l2, &mut r2) },
    }
    .map_err(|(e, moved)| (e, k + where_(&lens2, moved)));
    first
        .and(second)
        .and_then(|()| read_checked(proc, write, local.len()))
}

/// After a read: the peer must still be alive, else the bytes may come from a process that got
/// its pid (`ESRCH`, reported at the last pair).
fn read_checked(proc: &PeerProc, write: bool, pairs: usize) -> Result<(), (io::Error, usize)> {
    if !write && proc.exited() {
        return Err((
            io::Error::from_raw_os_error(libc::ESRCH),
            pairs.saturating_sub(1),
        ));
    }
    Ok(())
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
                        unsafe { copy_all(&copies) };
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
}
