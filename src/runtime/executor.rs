//! The runtime's one executor for background work: a process-wide cache of worker threads that
//! run queued jobs (a thread starts when no idle one can take a job, and leaves after
//! [`IDLE`] without work), [`Queue`]s on those workers for callers that bound their
//! concurrency or keep an order (a link's async transfers: its `max_lanes` at once, started in
//! order; the async connects: two at once, each remote's in order), and one timer thread that
//! runs short jobs at their time. Async connects, a link's async transfers, the deadlines of
//! queued requests and the heartbeat run on it. Not an async runtime: jobs block on sockets as
//! they need to. The workers are the only threads that wait for work.
//!
//! (The same-host transport's copy helper is not background work: it is the second half of a
//! caller's copy, handed over only when it is idle, and stays a thread of its own.)

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::sync::lock;

/// How long a worker thread waits for a job before it leaves.
pub(crate) const IDLE: Duration = Duration::from_secs(2);

type Job = Box<dyn FnOnce() + Send>;

/// The executor's own queue.
#[derive(Default)]
struct Pending {
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
    queue: Mutex<Pending>,
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

/// Jobs that start in the order they were queued, at most `limit` at once, each on a worker of
/// the executor. A worker that finds the queue empty goes back to the executor (nothing idles
/// here); while any job of the queue is queued, at least one worker runs the queue.
pub(crate) struct Queue {
    limit: usize,
    st: Mutex<QueueState>,
    /// Signalled when nothing of the queue is queued or running.
    drained: Condvar,
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    /// Workers running the queue's jobs (none while `jobs` is empty, outside `push`).
    running: usize,
}

/// No worker can run a job: none of its queue runs and no thread can be started.
#[derive(Debug)]
pub(crate) struct NoWorker;

impl Queue {
    /// A queue that runs at most `limit` (at least one) of its jobs at once.
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: limit.max(1),
            st: Mutex::default(),
            drained: Condvar::new(),
        })
    }

    /// Queues `job`: it starts after every job queued before it has started, when fewer than
    /// `limit` of the queue's jobs run.
    ///
    /// # Errors
    /// [`NoWorker`] when nothing can run it (it is dropped; the caller fails what it would
    /// have done).
    pub(crate) fn push(
        self: &Arc<Self>,
        job: impl FnOnce() + Send + 'static,
    ) -> Result<(), NoWorker> {
        let mut st = lock(&self.st);
        st.jobs.push_back(Box::new(job));
        if st.running >= self.limit {
            return Ok(()); // a worker of the queue gets to it
        }
        st.running += 1;
        let me = self.clone();
        if spawn(move || me.drain()).is_ok() {
            return Ok(());
        }
        st.running -= 1;
        if st.running > 0 {
            return Ok(());
        }
        // no worker runs the queue, so it held only this job
        st.jobs.pop_back();
        Err(NoWorker)
    }

    /// A worker's turn on the queue: runs its jobs until it is empty.
    fn drain(&self) {
        loop {
            let job = {
                let mut st = lock(&self.st);
                match st.jobs.pop_front() {
                    Some(j) => j,
                    None => {
                        st.running -= 1;
                        if st.running == 0 {
                            self.drained.notify_all();
                        }
                        return;
                    }
                }
            };
            run(job);
        }
    }

    /// Waits until none of the queue's jobs is queued or running.
    pub(crate) fn wait_idle(&self) {
        let mut st = lock(&self.st);
        while st.running > 0 {
            st = self.drained.wait(st).unwrap_or_else(|p| p.into_inner());
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

    #[test]
    fn a_queue_keeps_its_bound_and_one_at_a_time_its_order() {
        // 40 jobs, at most 3 at once; each of them runs
        let q = Queue::new(3);
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..40 {
            let (now, most, ran) = (now.clone(), most.clone(), ran.clone());
            q.push(move || {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
                now.fetch_sub(1, Ordering::SeqCst);
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        }
        q.wait_idle();
        assert_eq!(ran.load(Ordering::SeqCst), 40);
        assert!(most.load(Ordering::SeqCst) <= 3, "{most:?}");
        // one at a time: strictly one after the other
        let q = Queue::new(1);
        let (tx, rx) = mpsc::channel();
        for i in 0..5 {
            let tx = tx.clone();
            q.push(move || tx.send(i).unwrap()).unwrap();
        }
        let got: Vec<i32> = (0..5)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
        q.wait_idle();
    }
}
