//! The pool a same-host batch's parts are claimed from: the caller and (for large batches) a
//! persistent helper thread claim parts until none is left or one of them stops the batch (its
//! deadline, a cancel, a failure); the call returns only once no part of it is still moving, so
//! its end means nothing touches its memory any more. What a part does is the caller's
//! (`copy.rs`: memory copies, index loops, `process_vm_*` pairs). Its locks and atomics are the
//! loom model's (`loom_model` below).

use std::io;
use std::sync::OnceLock;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::sync::lock;
use crate::sync::model::{AtomicBool, AtomicUsize};
use crate::types::split::Cut;

/// When a batch stops between its parts: at its deadline, or once `cancelled` says so (an async
/// request's cancel; asked by the caller's thread only), or once the server set `given_up`
/// (the fence's word: it gave this client up), which the helper thread reads too.
pub(crate) struct Stop<'a> {
    pub(crate) deadline: Instant,
    pub(crate) cancelled: &'a dyn Fn() -> bool,
    pub(crate) given_up: Option<&'a crate::sync::model::AtomicU32>,
}

impl Stop<'_> {
    /// The deadline and the cancel, checked now.
    pub(super) fn check(&self) -> Result<(), Halt> {
        if Instant::now() >= self.deadline {
            return Err(Halt::Deadline);
        }
        if self.stopped() {
            return Err(Halt::Cancelled);
        }
        Ok(())
    }

    /// Whether the batch was cancelled or its client given up on, checked now.
    fn stopped(&self) -> bool {
        (self.cancelled)() || crate::transport::given_up(self.given_up)
    }
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
pub(super) type PartFail = (io::Error, u64);

/// How a part runs: `run(part, ctx)`.
pub(super) type RunPart<P, C> = unsafe fn(&[P], C) -> Result<(), PartFail>;

/// The parts of a batch, claimed one at a time by the caller and (for large batches) the helper
/// until none is left or one of them stops the batch: a helper slow to wake (its core busy)
/// costs the caller nothing, the caller then moves every part itself.
pub(super) struct Parts<P> {
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
    /// stops: the deadline and `cancelled` are checked for each part claimed, before it runs
    /// (so a batch stops only with a part not moved: one whose parts all moved, its last by
    /// another thread, is not reported stopped).
    ///
    /// # Safety
    /// `run(part, ctx)` must be safe to call on every part until it is finished (its memory
    /// valid).
    unsafe fn work<C: Copy>(&self, run: RunPart<P, C>, ctx: C, cancelled: &dyn Fn() -> bool) {
        loop {
            if self.halted.load(Ordering::Acquire) {
                return;
            }
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            let Some(part) = self.parts.get(i) else {
                return;
            };
            let stop = if Instant::now() >= self.deadline {
                Some(Halt::Deadline)
            } else if cancelled() {
                Some(Halt::Cancelled)
            } else {
                None
            };
            if let Some(why) = stop {
                // (the part claimed is given up with the unclaimed ones)
                self.halt(why, 0, 0);
                return self.finish(1);
            }
            // (`run` cannot unwind past here without the part being finished: a part left
            // unfinished would keep the submitter waiting, so every runner is unwind-free:
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

    /// Waits until every part is finished or given up: spinning for at most [`SPIN`] first
    /// (the helper's last part is a few microseconds from its end; sleeping on the condition
    /// variable costs a wake-up that, on a virtual machine, took longer than the part).
    fn wait(&self) {
        let n = self.parts.len();
        #[cfg(not(loom))]
        {
            let until = Instant::now() + SPIN;
            while *crate::sync::model::lock(&self.finished) < n {
                if Instant::now() >= until {
                    break;
                }
                std::hint::spin_loop();
            }
        }
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

/// Runs `parts` with `run(part, ctx)` by `stop`: on this thread, and with `share` on the
/// helper thread too when it is idle (whoever is free claims the next part). Returns once no
/// part is moving: the reason the batch stopped (a failure's position as its byte offset in
/// the batch), or `None` when every part moved.
///
/// # Safety
/// `run(part, ctx)` must be safe to call, from this thread or the helper, on every part until
/// this call returns: the memory the parts name stays valid, and what `ctx` points to alive.
pub(super) unsafe fn run_parts<P, C>(
    parts: Vec<Vec<P>>,
    run: RunPart<P, C>,
    ctx: C,
    share: bool,
    stop: &Stop<'_>,
) -> Option<(Halt, u64)>
where
    P: Cut + Send + Sync + 'static,
    C: Copy + Send + 'static,
{
    let parts = std::sync::Arc::new(Parts::new(parts, stop.deadline));
    {
        // waits for every part the helper claimed before this call returns (or unwinds)
        let joined = Joined(&parts);
        if share {
            let p = parts.clone();
            // (the fence's word as an address: the helper's job outlives no part it claimed)
            let given_up = stop
                .given_up
                .map(|w| w as *const crate::sync::model::AtomicU32 as usize);
            submit(Box::new(move || {
                let given_up = || {
                    // SAFETY: the word is in the link's fence page, mapped while the batch runs;
                    // `work` reads it only with a part claimed and not finished, and the
                    // submitter does not return before every claimed part is finished
                    // (`Joined`), so the batch (and the page) outlive the read.
                    let w =
                        given_up.map(|w| unsafe { &*(w as *const crate::sync::model::AtomicU32) });
                    crate::transport::given_up(w)
                };
                // SAFETY: a part is moved only once claimed, and the submitter does not return
                // (or unwind) before every claimed part is finished (`Joined`): the caller's
                // contract holds for every part the helper claims. The helper checks the
                // deadline and the server's "given up" word, not the cancel (the caller does,
                // and stops the helper's claims when it sees one): a client resumed after it
                // was given up on moves no part its threads had not begun.
                unsafe { p.work(run, ctx, &given_up) }
            }));
        }
        // SAFETY: the caller's contract; `joined` waits for the helper's parts.
        unsafe { parts.work(run, ctx, &|| stop.stopped()) };
        drop(joined);
    }
    parts.outcome()
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

/// The helper's work: claiming parts of one batch.
type Work = Box<dyn FnOnce() + Send>;

/// How long the helper looks for new work after a batch, and the caller for the helper's last
/// part, before each sleeps: back-to-back batches then find both awake. A wake-up from sleep
/// left a core idle about a fifth of the time at 1 MiB batches (4 KiB × 256 moved 0.64-0.69 of
/// one thread's memcpy, `perf`: 21% idle on 2 cores); a spin costs at most this much CPU per
/// batch.
const SPIN: std::time::Duration = std::time::Duration::from_micros(100);

/// A persistent helper thread that moves parts of a large same-host batch while the caller
/// moves the others (waking it costs far less than spawning a thread per transfer).
struct Helper {
    queue: std::sync::Mutex<Queue>,
    cv: std::sync::Condvar,
    /// Work is queued (the helper's spin reads this, not the lock).
    queued: std::sync::atomic::AtomicBool,
}

/// The helper's queue, and whether it sleeps on the condition variable (only then does a
/// submitter wake it).
struct Queue {
    work: std::collections::VecDeque<Work>,
    asleep: bool,
}

fn helper() -> Option<&'static Helper> {
    static H: OnceLock<Option<&'static Helper>> = OnceLock::new();
    *H.get_or_init(|| {
        let h: &'static Helper = Box::leak(Box::new(Helper {
            queue: std::sync::Mutex::new(Queue {
                work: std::collections::VecDeque::new(),
                asleep: false,
            }),
            cv: std::sync::Condvar::new(),
            queued: std::sync::atomic::AtomicBool::new(false),
        }));
        std::thread::Builder::new()
            .name("hixl-copy".into())
            .spawn(move || {
                loop {
                    let work = {
                        let mut q = lock(&h.queue);
                        loop {
                            if let Some(w) = q.work.pop_front() {
                                h.queued.store(!q.work.is_empty(), Ordering::Relaxed);
                                break w;
                            }
                            q.asleep = true;
                            q = h.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                            q.asleep = false;
                        }
                    };
                    work();
                    // the next batch often follows at once: look for it a while before sleeping
                    let until = Instant::now() + SPIN;
                    'spin: while Instant::now() < until {
                        // the clock is read once every 64 looks (a read costs ~20 pauses)
                        for _ in 0..64 {
                            if h.queued.load(Ordering::Relaxed) {
                                break 'spin;
                            }
                            std::hint::spin_loop();
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
    let asleep = {
        let mut q = lock(&h.queue);
        if !q.work.is_empty() {
            return false;
        }
        q.work.push_back(work);
        h.queued.store(true, Ordering::Relaxed);
        q.asleep
    };
    // a helper that is awake takes the work when it next looks at the queue, under its lock
    if asleep {
        h.cv.notify_one();
    }
    true
}

/// The shared parts of a same-host batch under loom (`RUSTFLAGS="--cfg loom" cargo test
/// --release --lib loom`): the caller and the helper claim parts of the real [`Parts`] (with
/// loom's lock, condition variable and atomics) while a third thread cancels; each part writes
/// its own `loom::cell::UnsafeCell`, and once the caller's share and [`Joined`] returned the
/// owner writes every cell (the buffer reused). Properties: no part's write races the owner's
/// (the call returns only when no part can still touch the buffer), every part is finished or
/// given up exactly once (nobody waits forever), and a batch reports a stop if and only if a
/// part did not move.
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
            match parts.outcome() {
                None => assert_eq!(moved, [1, 1], "no stop reported, yet a part did not move"),
                Some(_) => assert_ne!(moved, [1, 1], "a stop reported, yet every part moved"),
            }
            helper.join().unwrap();
            canceller.join().unwrap();
        });
    }
}
