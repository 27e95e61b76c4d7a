//! Asynchronous connect and disconnect (HIXL `ConnectAsync` / `DisconnectAsync` /
//! `GetAsyncConnectStatus`): a bounded queue served by two workers on the runtime's executor, FIFO per remote.
//!
//! A link made this way is held by the engine until [`Hixl::take_link`](crate::Hixl::take_link)
//! hands it over as an ordinary [`Link`](crate::Link) (or `disconnect_async` closes it).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use crate::error::Error;
use crate::runtime::engine::EngineInner;
use crate::runtime::link::LinkShared;
use crate::sync::lock;

/// Most queued async connect and disconnect tasks per engine (HIXL's `connect_pool.task_queue_capacity` default).
pub const ASYNC_QUEUE_CAPACITY: usize = 128;
/// Threads serving the async connect queue (HIXL's `connect_pool.thread_num` default).
const THREADS: usize = 2;
const IDLE: Duration = Duration::from_secs(2);

/// Where an async connection to one remote stands (HIXL `AsyncConnectStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncConnectStatus {
    /// No async connection (never asked, disconnected, or taken with `take_link`).
    NotConnect,
    /// A connect is queued.
    ConnectPending,
    /// A connect is running.
    Connecting,
    /// Connected; `take_link` hands the link over.
    Connected,
    /// The last connect failed; `take_link` returns the error.
    ConnectFailed,
    /// A disconnect is queued.
    DisconnectPending,
    /// A disconnect is running.
    Disconnecting,
}

#[derive(Clone, Copy)]
enum Task {
    Connect(SocketAddr, Duration),
    Disconnect(Duration),
}

struct Slot {
    status: AsyncConnectStatus,
    queue: VecDeque<Task>,
    busy: bool,
    link: Option<Arc<LinkShared>>,
    error: Option<Arc<Error>>,
}

#[derive(Default)]
struct State {
    slots: HashMap<String, Slot>,
    queued: usize,
    workers: usize,
    stop: bool,
}

/// The engine's async connect queue.
#[derive(Default)]
pub(crate) struct ConnectPool {
    st: Mutex<State>,
    cv: Condvar,
}

impl ConnectPool {
    /// Queues a task for `key`; starts a worker if needed.
    fn push(
        self: &Arc<Self>,
        engine: &Weak<EngineInner>,
        key: &str,
        task: Task,
    ) -> Result<(), Error> {
        let mut st = lock(&self.st);
        if st.queued >= ASYNC_QUEUE_CAPACITY {
            return Err(Error::QueueFull {
                capacity: ASYNC_QUEUE_CAPACITY,
            });
        }
        st.queued += 1;
        let slot = st.slots.entry(key.to_owned()).or_insert_with(|| Slot {
            status: AsyncConnectStatus::NotConnect,
            queue: VecDeque::new(),
            busy: false,
            link: None,
            error: None,
        });
        slot.queue.push_back(task);
        if !slot.busy {
            slot.status = pending(task);
        }
        if st.workers < THREADS {
            st.workers += 1;
            let (e, pool) = (engine.clone(), self.clone());
            if crate::runtime::executor::spawn(move || worker(pool, e)).is_err() {
                st.workers -= 1;
            }
        }
        self.cv.notify_one();
        Ok(())
    }

    pub fn connect(
        self: &Arc<Self>,
        engine: &Weak<EngineInner>,
        key: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.push(engine, key, Task::Connect(addr, timeout))
    }

    pub fn disconnect(
        self: &Arc<Self>,
        engine: &Weak<EngineInner>,
        key: &str,
        timeout: Duration,
    ) -> Result<(), Error> {
        {
            let st = lock(&self.st);
            let known = st
                .slots
                .get(key)
                .is_some_and(|s| s.link.is_some() || !s.queue.is_empty() || s.busy);
            if !known {
                return Err(Error::NotConnected {
                    peer: key.to_owned(),
                    why: "no async connection to disconnect".into(),
                });
            }
        }
        self.push(engine, key, Task::Disconnect(timeout))
    }

    pub fn status(&self, key: &str) -> AsyncConnectStatus {
        lock(&self.st)
            .slots
            .get(key)
            .map_or(AsyncConnectStatus::NotConnect, |s| s.status)
    }

    pub fn all(&self) -> BTreeMap<String, AsyncConnectStatus> {
        lock(&self.st)
            .slots
            .iter()
            .map(|(k, s)| (k.clone(), s.status))
            .collect()
    }

    /// Hands over a connected link, or the error of a failed connect.
    pub fn take(&self, key: &str) -> Result<Arc<LinkShared>, Error> {
        let mut st = lock(&self.st);
        let Some(slot) = st.slots.get_mut(key) else {
            return Err(Error::NotConnected {
                peer: key.to_owned(),
                why: "no async connection".into(),
            });
        };
        match slot.status {
            AsyncConnectStatus::Connected if slot.queue.is_empty() => {
                let link = slot.link.take().expect("a connected slot holds its link");
                st.slots.remove(key);
                Ok(link)
            }
            AsyncConnectStatus::ConnectFailed if slot.queue.is_empty() => {
                let e = slot.error.take().expect("a failed slot holds its error");
                st.slots.remove(key);
                Err(Error::Shared(e))
            }
            s => Err(Error::NotConnected {
                peer: key.to_owned(),
                why: format!("the async connection is {s:?}"),
            }),
        }
    }

    /// Stops the workers (waiting for running tasks if `join`) and closes every link still
    /// held; returns them (closed).
    pub fn shutdown(&self, join: bool) -> Vec<Arc<LinkShared>> {
        let links: Vec<Arc<LinkShared>> = {
            let mut st = lock(&self.st);
            st.stop = true;
            st.queued = 0;
            st.slots.drain().filter_map(|(_, s)| s.link).collect()
        };
        self.cv.notify_all();
        if join {
            // every worker leaves at `stop` (a running task first ends)
            let mut st = lock(&self.st);
            while st.workers > 0 {
                st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        }
        for l in &links {
            l.close_quietly();
        }
        lock(&self.st).stop = false;
        links
    }
}

fn pending(t: Task) -> AsyncConnectStatus {
    match t {
        Task::Connect(..) => AsyncConnectStatus::ConnectPending,
        Task::Disconnect(_) => AsyncConnectStatus::DisconnectPending,
    }
}

fn worker(pool: Arc<ConnectPool>, engine: Weak<EngineInner>) {
    loop {
        let (key, task) = {
            let mut st = lock(&pool.st);
            loop {
                if st.stop {
                    st.workers -= 1;
                    pool.cv.notify_all();
                    return;
                }
                let next = st
                    .slots
                    .iter_mut()
                    .find(|(_, s)| !s.busy && !s.queue.is_empty())
                    .map(|(k, s)| {
                        s.busy = true;
                        let t = s.queue.pop_front().expect("non-empty");
                        s.status = match t {
                            Task::Connect(..) => AsyncConnectStatus::Connecting,
                            Task::Disconnect(_) => AsyncConnectStatus::Disconnecting,
                        };
                        (k.clone(), t)
                    });
                if let Some(n) = next {
                    st.queued -= 1;
                    break n;
                }
                let (g, t) = pool
                    .cv
                    .wait_timeout(st, IDLE)
                    .unwrap_or_else(|e| e.into_inner());
                st = g;
                if t.timed_out() && !st.slots.values().any(|s| !s.queue.is_empty()) {
                    st.workers -= 1;
                    pool.cv.notify_all();
                    return;
                }
            }
        };
        // run it without holding the lock (nor the engine, between tasks)
        let Some(inner) = engine.upgrade() else {
            lock(&pool.st).workers -= 1;
            pool.cv.notify_all();
            return;
        };
        let held = lock(&pool.st)
            .slots
            .get_mut(&key)
            .and_then(|s| s.link.take());
        let (status, link, error) = match task {
            Task::Connect(addr, timeout) => match held {
                Some(l) => (AsyncConnectStatus::Connected, Some(l), None),
                None => match inner.open_link(&key, addr, timeout) {
                    Ok(l) => (AsyncConnectStatus::Connected, Some(l), None),
                    Err(e) => (AsyncConnectStatus::ConnectFailed, None, Some(Arc::new(e))),
                },
            },
            Task::Disconnect(timeout) => {
                if let Some(l) = held {
                    let _ = l.close_timeout(timeout);
                    inner.forget_link(&l);
                }
                (AsyncConnectStatus::NotConnect, None, None)
            }
        };
        {
            let mut st = lock(&pool.st);
            if let Some(s) = st.slots.get_mut(&key) {
                s.busy = false;
                s.link = link;
                s.error = error;
                s.status = s.queue.front().map_or(status, |t| pending(*t));
            } else if let Some(l) = link {
                // the slot went away (shutdown): do not leak the link
                l.close_quietly();
                inner.forget_link(&l);
            }
        }
        pool.cv.notify_all();
        drop(inner);
    }
}
