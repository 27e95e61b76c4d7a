//! The runtime's one executor for background work: one worker queue ([`Queue`]: jobs, workers
//! that wait for them, and leave after [`IDLE`] without work), and one timer thread that runs
//! short jobs at their time. The executor's own queue is a process-wide cache of worker threads
//! ([`spawn`]: a thread starts when no idle one can take a job). A caller that bounds its
//! concurrency or keeps an order has a queue of its own whose workers are jobs on the
//! executor's: a link's async transfers (its `max_lanes` at once, taken in order), the async
//! connects (16 at once unless configured; each remote's in order, `runtime::connect`) and the
//! heartbeat's PINGs (16 at once). The deadlines of queued requests run on it too. Not an async
//! runtime: jobs block on sockets as they need to.
//!
//! (The same-host transport's copy helper is not background work: it is the second half of a
//! caller's copy, handed over only when it is idle, and stays a thread of its own.)

use std::collections::{BTreeMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::sync::lock;

/// How long a worker waits for a job before it leaves.
pub(crate) const IDLE: Duration = Duration::from_secs(2);

type Task = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Timers {
    /// The jobs by time (then by the order they were set in): removable by key, so that a job
    /// no longer needed ([`cancel`]) costs nothing until its time.
    jobs: BTreeMap<TimerKey, Task>,
    seq: u64,
    /// Whether the timer thread runs.
    running: bool,
}

struct Executor {
    /// The executor's own queue: its workers are threads, its items jobs.
    jobs: Arc<Queue<Task>>,
    timers: Mutex<Timers>,
    tick: Condvar,
}

fn executor() -> &'static Executor {
    static E: OnceLock<Executor> = OnceLock::new();
    E.get_or_init(|| Executor {
        jobs: Arc::new(Queue::with(usize::MAX, Workers::Threads)),
        timers: Mutex::default(),
        tick: Condvar::new(),
    })
}

/// Runs `job` on a worker thread soon.
///
/// # Errors
/// [`NoWorker`] when no worker can take it and no thread can be started (the job is dropped;
/// the caller fails what it would have done).
pub(crate) fn spawn(job: impl FnOnce() + Send + 'static) -> Result<(), NoWorker> {
    spawn_job(Box::new(job))
}

fn spawn_job(job: Task) -> Result<(), NoWorker> {
    let handler = &mut || -> Handler<Task> { Box::new(|job: Task| job()) };
    executor().jobs.push(job, handler).map_err(|_| NoWorker)
}

/// Items taken in the order they were queued by at most `limit` workers at once. A worker
/// handles items until it has waited [`IDLE`] for one, then leaves; a new one starts when an
/// item finds no idle worker and fewer than `limit` exist. This is the executor's one worker
/// loop: its own queue's workers are threads (its items are jobs), a caller's queue's are
/// jobs on the executor's, each with the caller's handler of its items.
pub(crate) struct Queue<T> {
    limit: usize,
    workers: Workers,
    st: Mutex<QueueState<T>>,
    /// An item was queued (idle workers wait here), or the queue was closed.
    work: Condvar,
    /// Nothing of the queue is queued or handled any more (`wait_idle` waits here).
    drained: Condvar,
}

/// What a queue's workers are.
enum Workers {
    /// Threads of their own (the executor's queue).
    Threads,
    /// Jobs on the executor's queue.
    OnExecutor,
}

struct QueueState<T> {
    items: VecDeque<T>,
    /// Workers, idle ones included.
    workers: usize,
    /// Workers waiting for an item.
    idle: usize,
    /// Callers of `wait_idle` (a condvar's notify costs a system call even when no one waits).
    waiting: usize,
    /// Set by `close`: workers leave as soon as the queue is empty.
    closed: bool,
}

/// What a worker does with each item (it owns what it needs, for as long as it works).
pub(crate) type Handler<T> = Box<dyn FnMut(T) + Send>;

/// No worker can take a job: none exists and none can be started.
#[derive(Debug)]
pub(crate) struct NoWorker;

impl<T: Send + 'static> Queue<T> {
    /// A queue whose items are handled by jobs on the executor's workers, at most `limit` (at
    /// least one) at once.
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self::with(limit.max(1), Workers::OnExecutor))
    }

    fn with(limit: usize, workers: Workers) -> Self {
        Self {
            limit,
            workers,
            st: Mutex::new(QueueState {
                items: VecDeque::new(),
                workers: 0,
                idle: 0,
                waiting: 0,
                closed: false,
            }),
            work: Condvar::new(),
            drained: Condvar::new(),
        }
    }

    /// Queues `item`: it is taken after every item queued before it, by an idle worker, or by a
    /// new one when none is idle and fewer than `limit` exist; `handler` makes a new worker's
    /// handler (called only then, so what it clones is cloned once per worker, not per item).
    ///
    /// # Errors
    /// The item comes back when nothing can take it (the caller fails what it would have done).
    pub(crate) fn push(
        self: &Arc<Self>,
        item: T,
        handler: &mut dyn FnMut() -> Handler<T>,
    ) -> Result<(), T> {
        self.push_with(item, handler, true, false)
    }

    /// As [`Queue::push`], but `item` is taken before every item queued so far (work that must
    /// not wait behind the others, such as welcoming a new link while requests queue).
    ///
    /// # Errors
    /// As [`Queue::push`].
    pub(crate) fn push_first(
        self: &Arc<Self>,
        item: T,
        handler: &mut dyn FnMut() -> Handler<T>,
    ) -> Result<(), T> {
        self.push_with(item, handler, true, true)
    }

    /// Queues `item` for the workers there are: no worker is started for it unless none
    /// exists (the caller knows one of them will look soon).
    pub(crate) fn push_to_workers(
        self: &Arc<Self>,
        item: T,
        handler: &mut dyn FnMut() -> Handler<T>,
    ) -> Result<(), T> {
        self.push_with(item, handler, false, false)
    }

    fn push_with(
        self: &Arc<Self>,
        item: T,
        handler: &mut dyn FnMut() -> Handler<T>,
        start: bool,
        first: bool,
    ) -> Result<(), T> {
        let mut st = lock(&self.st);
        if first {
            st.items.push_front(item);
        } else {
            st.items.push_back(item);
        }
        if !start && st.workers > 0 {
            if st.idle > 0 {
                self.work.notify_one();
            }
            return Ok(());
        }
        if st.idle > 0 {
            self.work.notify_one();
            if st.idle >= st.items.len() {
                return Ok(()); // an idle worker for every queued item
            }
        }
        if st.workers >= self.limit {
            return Ok(()); // a worker of the queue gets to it
        }
        // a new worker (it takes the queue's lock once this returns)
        st.workers += 1;
        let (me, mut h) = (self.clone(), handler());
        let started = match self.workers {
            Workers::Threads => std::thread::Builder::new()
                .name("hixl-worker".into())
                .spawn(move || me.work(&mut *h))
                .is_ok(),
            Workers::OnExecutor => spawn_job(Box::new(move || me.work(&mut *h))).is_ok(),
        };
        if started {
            return Ok(());
        }
        st.workers -= 1;
        if st.workers > 0 {
            return Ok(()); // a worker of the queue gets to it
        }
        // no worker runs the queue, so it held only this item
        let item = if first {
            st.items.pop_front()
        } else {
            st.items.pop_back()
        };
        Err(item.expect("just queued"))
    }

    /// A worker: handles the queue's items until it has waited [`IDLE`] for one, or finds the
    /// queue closed and empty.
    fn work(&self, handle: &mut dyn FnMut(T)) {
        let mut st = lock(&self.st);
        loop {
            if let Some(item) = st.items.pop_front() {
                drop(st);
                run(|| handle(item));
                st = lock(&self.st);
                continue;
            }
            if st.waiting > 0 && st.workers == st.idle + 1 {
                // the last busy worker found nothing more to do
                self.drained.notify_all();
            }
            if st.closed {
                st.workers -= 1;
                return;
            }
            st.idle += 1;
            let (g, t) = self
                .work
                .wait_timeout(st, IDLE)
                .unwrap_or_else(|p| p.into_inner());
            st = g;
            st.idle -= 1;
            if t.timed_out() && st.items.is_empty() {
                st.workers -= 1;
                return;
            }
        }
    }

    /// Items queued and not taken by a worker yet.
    pub(crate) fn pending(&self) -> usize {
        lock(&self.st).items.len()
    }

    /// Waits until none of the queue's items is queued or handled (idle workers may stay).
    pub(crate) fn wait_idle(&self) {
        let mut st = lock(&self.st);
        st.waiting += 1;
        while !st.items.is_empty() || st.workers > st.idle {
            st = self.drained.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.waiting -= 1;
    }

    /// Closes the queue: its workers leave as soon as it is empty, not after [`IDLE`] (a link
    /// that closed runs no more requests).
    pub(crate) fn close(&self) {
        lock(&self.st).closed = true;
        self.work.notify_all();
    }
}

/// Runs a job; a panic ends the job, not the worker.
fn run(job: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(job)).is_err() {
        tracing::error!("a background job panicked");
    }
}

/// A job set with [`at`]: its time, then the order it was set in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TimerKey(Instant, u64);

/// Runs `job` on the timer thread at `at` (or soon after), unless [`cancel`]led first. Timer
/// jobs must be short: a job with more to do hands it to [`spawn`].
pub(crate) fn at(at: Instant, job: impl FnOnce() + Send + 'static) -> TimerKey {
    let e = executor();
    let mut t = lock(&e.timers);
    let key = TimerKey(at, t.seq);
    t.seq += 1;
    let earliest = t.jobs.first_key_value().is_none_or(|(top, _)| key < *top);
    t.jobs.insert(key, Box::new(job));
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
    key
}

/// Drops the job set at `key` if it has not run: nothing of it is kept until its time (a
/// request that ended long before its deadline leaves no entry behind). A job that ran or is
/// running is not affected.
pub(crate) fn cancel(key: TimerKey) {
    let job = lock(&executor().timers).jobs.remove(&key);
    drop(job); // outside the lock: what the job holds may take locks as it goes
}

/// Whether the job set at `key` is still waiting for its time.
#[cfg(test)]
pub(crate) fn pending(key: TimerKey) -> bool {
    lock(&executor().timers).jobs.contains_key(&key)
}

fn timer(e: &'static Executor) {
    let mut t = lock(&e.timers);
    loop {
        let now = Instant::now();
        match t.jobs.first_key_value() {
            None => t = e.tick.wait(t).unwrap_or_else(|p| p.into_inner()),
            Some((top, _)) if top.0 <= now => {
                let (_, job) = t.jobs.pop_first().expect("peeked");
                drop(t);
                run(job);
                t = lock(&e.timers);
            }
            Some((top, _)) => {
                let wait = top.0 - now;
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
    fn a_cancelled_timer_job_never_runs_and_is_not_kept() {
        let (tx, rx) = mpsc::channel();
        let now = Instant::now();
        let (t1, t2) = (tx.clone(), tx.clone());
        let far = at(now + Duration::from_secs(3600), move || t1.send(1).unwrap());
        let farther = at(now + Duration::from_secs(7200), move || t2.send(2).unwrap());
        let soon = at(now + Duration::from_millis(20), move || tx.send(3).unwrap());
        assert!(pending(far) && pending(farther) && pending(soon));
        cancel(far);
        cancel(farther);
        assert!(
            !pending(far) && !pending(farther),
            "a cancelled job is kept until its time"
        );
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 3);
        assert!(!pending(soon), "a job that ran is still listed");
        // the cancelled jobs (and their senders) were dropped, the one that ran too: no sender
        // is left
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
        cancel(soon); // a job that ran: nothing happens
    }

    #[test]
    fn a_queue_keeps_its_bound_and_one_at_a_time_its_order() {
        // 40 jobs, at most 3 at once; each of them runs
        let q: Arc<Queue<Task>> = Queue::new(3);
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..40 {
            let (now, most, ran) = (now.clone(), most.clone(), ran.clone());
            let job: Task = Box::new(move || {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
                now.fetch_sub(1, Ordering::SeqCst);
                ran.fetch_add(1, Ordering::SeqCst);
            });
            assert!(q.push(job, &mut || Box::new(|job: Task| job())).is_ok());
        }
        q.wait_idle();
        assert_eq!(ran.load(Ordering::SeqCst), 40);
        assert!(most.load(Ordering::SeqCst) <= 3, "{most:?}");
        // one at a time: strictly one after the other
        let q: Arc<Queue<Task>> = Queue::new(1);
        let (tx, rx) = mpsc::channel();
        for i in 0..5 {
            let tx = tx.clone();
            let job: Task = Box::new(move || tx.send(i).unwrap());
            assert!(q.push(job, &mut || Box::new(|job: Task| job())).is_ok());
        }
        let got: Vec<i32> = (0..5)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
        q.wait_idle();
        // its idle worker leaves when the queue is closed, not after IDLE
        q.close();
        let t0 = Instant::now();
        while lock(&q.st).workers > 0 {
            assert!(t0.elapsed() < IDLE / 2, "the worker stayed");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
