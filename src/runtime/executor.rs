//! The runtime's one executor for background work: a process-wide cache of worker threads that
//! run queued jobs (a thread starts when no idle one can take a job, and leaves after
//! [`IDLE`] without work), and one timer thread that runs short jobs at their time. Async
//! connects, a link's async transfers, the deadlines of queued requests and the heartbeat run
//! on it; each caller bounds its own concurrency (the connect queue: two workers; a link: its
//! `max_lanes`). Not an async runtime: jobs block on sockets as they need to.
//!
//! (The same-host transport's copy helper is not background work: it is the second half of a
//! caller's copy, handed over only when it is idle, and stays a thread of its own.)

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::sync::lock;

/// How long a worker thread waits for a job before it leaves.
pub(crate) const IDLE: Duration = Duration::from_secs(2);

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Workers waiting for a job.
    idle: usize,
}

struct Timed {
    at: Instant,
    seq: u64,
    job: Job,
}
impl PartialEq for Timed {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

#[derive(Default)]
struct Timers {
    heap: BinaryHeap<Reverse<Timed>>,
    seq: u64,
    /// Whether the timer thread runs.
    running: bool,
}

struct Executor {
    queue: Mutex<Queue>,
    work: Condvar,
    timers: Mutex<Timers>,
    tick: Condvar,
}

fn executor() -> &'static Executor {
    static E: OnceLock<Executor> = OnceLock::new();
    E.get_or_init(|| Executor {
        queue: Mutex::default(),
        work: Condvar::new(),
        timers: Mutex::default(),
        tick: Condvar::new(),
    })
}

/// Runs `job` on a worker thread soon.
///
/// # Errors
/// The job comes back when no worker can take it and no thread can be started (the caller
/// fails what the job would have done).
pub(crate) fn spawn<F: FnOnce() + Send + 'static>(job: F) -> Result<(), F> {
    let e = executor();
    let mut q = lock(&e.queue);
    // every queued job has an idle worker to take it: wake one
    if q.idle > q.jobs.len() {
        q.jobs.push_back(Box::new(job));
        drop(q);
        e.work.notify_one();
        return Ok(());
    }
    drop(q);
    // no idle worker for it: a new one runs it first
    let slot = std::sync::Arc::new(Mutex::new(Some(job)));
    let mine = slot.clone();
    let started = std::thread::Builder::new()
        .name("hixl-worker".into())
        .spawn(move || {
            let first = lock(&mine).take();
            if let Some(job) = first {
                run(Box::new(job));
            }
            work(e);
        });
    match started {
        Ok(_) => Ok(()),
        Err(_) => Err(lock(&slot)
            .take()
            .expect("a thread that did not start ran nothing")),
    }
}

/// A worker: runs queued jobs until it has waited [`IDLE`] for one.
fn work(e: &'static Executor) {
    let mut q = lock(&e.queue);
    loop {
        if let Some(job) = q.jobs.pop_front() {
            drop(q);
            run(job);
            q = lock(&e.queue);
            continue;
        }
        q.idle += 1;
        let (g, t) = e
            .work
            .wait_timeout(q, IDLE)
            .unwrap_or_else(|p| p.into_inner());
        q = g;
        q.idle -= 1;
        if t.timed_out() && q.jobs.is_empty() {
            return;
        }
    }
}

/// Runs a job; a panic ends the job, not the worker.
fn run(job: Job) {
    if catch_unwind(AssertUnwindSafe(job)).is_err() {
        tracing::error!("a background job panicked");
    }
}

/// Runs `job` on the timer thread at `at` (or soon after). Timer jobs must be short: a job with
/// more to do hands it to [`spawn`].
pub(crate) fn at(at: Instant, job: impl FnOnce() + Send + 'static) {
    let e = executor();
    let mut t = lock(&e.timers);
    let seq = t.seq;
    t.seq += 1;
    let earliest = t.heap.peek().is_none_or(|Reverse(top)| at < top.at);
    t.heap.push(Reverse(Timed {
        at,
        seq,
        job: Box::new(job),
    }));
    if !t.running {
        t.running = std::thread::Builder::new()
            .name("hixl-timer".into())
            .spawn(move || timer(e))
            .is_ok();
        if !t.running {
            tracing::error!("cannot start the timer thread; timed jobs wait for the next try");
        }
    } else if earliest {
        e.tick.notify_one();
    }
}

fn timer(e: &'static Executor) {
    let mut t = lock(&e.timers);
    loop {
        let now = Instant::now();
        match t.heap.peek() {
            None => t = e.tick.wait(t).unwrap_or_else(|p| p.into_inner()),
            Some(Reverse(top)) if top.at <= now => {
                let Reverse(due) = t.heap.pop().expect("peeked");
                drop(t);
                run(due.job);
                t = lock(&e.timers);
            }
            Some(Reverse(top)) => {
                let wait = top.at - now;
                t = e
                    .tick
                    .wait_timeout(t, wait)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    #[test]
    fn jobs_run_in_parallel_and_timers_in_order() {
        // four jobs that each wait for all four to have started: they need four workers
        let started = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        for _ in 0..4 {
            let (s, tx) = (started.clone(), tx.clone());
            let r = spawn(move || {
                s.fetch_add(1, Ordering::SeqCst);
                let until = Instant::now() + Duration::from_secs(10);
                while s.load(Ordering::SeqCst) < 4 && Instant::now() < until {
                    std::thread::yield_now();
                }
                tx.send(s.load(Ordering::SeqCst)).unwrap();
            });
            assert!(r.is_ok());
        }
        for _ in 0..4 {
            assert_eq!(rx.recv_timeout(Duration::from_secs(20)).unwrap(), 4);
        }
        // timers fire in time order, whatever order they were set in
        let (tx, rx) = mpsc::channel();
        let now = Instant::now();
        for (i, ms) in [(0, 30u64), (1, 10), (2, 20)] {
            let tx = tx.clone();
            at(now + Duration::from_millis(ms), move || tx.send(i).unwrap());
        }
        let order: Vec<i32> = (0..3)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(order, vec![1, 2, 0]);
        assert!(now.elapsed() >= Duration::from_millis(30));
    }
}
