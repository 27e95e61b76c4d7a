//! Asynchronous connect and disconnect (HIXL `ConnectAsync` / `DisconnectAsync` /
//! `GetAsyncConnectStatus`): a bounded queue of tasks, FIFO per remote, run on a [`Queue`] of
//! the runtime's executor, up to [`THREADS`] at a time by default (each remote's next task is
//! queued there when its previous one ends).
//!
//! A link made this way is held by the engine until [`Hixl::take_link`](crate::Hixl::take_link)
//! hands it over as an ordinary [`Link`](crate::Link) (or `disconnect_async` closes it).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::error::Error;
use crate::runtime::executor::{Handler, Queue};
use crate::runtime::link::LinkShared;
use crate::sync::lock;

/// Most queued async connect and disconnect tasks per engine (HIXL's `connect_pool.task_queue_capacity` default).
pub const ASYNC_QUEUE_CAPACITY: usize = 128;
/// Tasks that run at once unless `connect_pool.thread_num` says (HIXL's default is 2: two
/// peers that do not answer would hold every other async connect back for their timeouts; a
/// task is a thread waiting on a socket, so hixl runs more).
const THREADS: usize = 16;

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
    /// One of its tasks runs (the next one is queued on the executor when it ends).
    busy: bool,
    link: Option<Arc<LinkShared>>,
    error: Option<Arc<Error>>,
}

#[derive(Default)]
struct State {
    slots: HashMap<String, Slot>,
    queued: usize,
    stop: bool,
    /// Counts [`ConnectPool::shutdown`]s: a task that was running across one finds its slot
    /// gone (or another's, made since) and lets go of what it made.
    generation: u64,
}

/// What the connect queue needs of its engine (the engine core implements it): the queue holds
/// its engine weakly and names no type of it.
pub(crate) trait Opener: Send + Sync + 'static {
    /// Opens a link to `key` at `addr` within `timeout`.
    fn open_link(
        &self,
        key: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Arc<LinkShared>, Error>;
    /// A link it opened was closed: its name is free again.
    fn forget_link(&self, link: &LinkShared);
}

/// The engine's async connect queue.
pub(crate) struct ConnectPool {
    st: Mutex<State>,
    /// Runs the remotes' turns (see [`turn`]), by key.
    tasks: Arc<Queue<String>>,
    /// Most tasks queued and not started ([`ASYNC_QUEUE_CAPACITY`] unless configured).
    capacity: usize,
}

impl ConnectPool {
    /// A queue running `threads` tasks at once (16 by default) and holding `capacity` queued
    /// ones ([`ASYNC_QUEUE_CAPACITY`] by default): HIXL's `connect_pool.thread_num` and
    /// `connect_pool.task_queue_capacity`.
    pub(crate) fn new(threads: Option<u64>, capacity: Option<u64>) -> Self {
        let n =
            |v: Option<u64>, default| v.map_or(default, |v| usize::try_from(v).unwrap_or(default));
        Self {
            st: Mutex::default(),
            tasks: Queue::new(n(threads, THREADS)),
            capacity: n(capacity, ASYNC_QUEUE_CAPACITY),
        }
    }

    /// Queues a task for `key`; gives the remote a turn if none of its tasks runs.
    fn push<E: Opener>(
        self: &Arc<Self>,
        engine: &Weak<E>,
        key: &str,
        task: Task,
    ) -> Result<(), Error> {
        let mut st = lock(&self.st);
        if st.queued >= self.capacity {
            return Err(Error::QueueFull {
                capacity: self.capacity,
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
        // the caller's latest call shows at once, a task of it running or not (HIXL's
        // `SetStatus` on submit)
        slot.status = pending(task);
        if !slot.busy {
            self.give_turn(engine, key);
        }
        Ok(())
    }

    /// Queues a turn for remote `key` on the executor. A turn that finds one of the remote's
    /// tasks running, or none queued, does nothing, so a turn too many is harmless.
    fn give_turn<E: Opener>(self: &Arc<Self>, engine: &Weak<E>, key: &str) {
        let worker = &mut || -> Handler<String> {
            let (pool, e) = (self.clone(), engine.clone());
            Box::new(move |k| turn(&pool, &e, k))
        };
        if self.tasks.push(key.to_owned(), worker).is_err() {
            tracing::debug!(
                remote = key,
                "no worker for an async connect now; its next task starts it"
            );
        }
    }

    pub fn connect<E: Opener>(
        self: &Arc<Self>,
        engine: &Weak<E>,
        key: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.push(engine, key, Task::Connect(addr, timeout))
    }

    pub fn disconnect<E: Opener>(
        self: &Arc<Self>,
        engine: &Weak<E>,
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

    /// Stops the queue and closes every link still held; returns them (closed). A task still
    /// running (a connect waiting on a slow peer) is not waited for: it ends on its own, its
    /// engine closed to links by then (the link it opens is refused), and lets go of what it
    /// made (its generation is over); tasks still queued are dropped.
    pub fn shutdown(&self) -> Vec<Arc<LinkShared>> {
        let links: Vec<Arc<LinkShared>> = {
            let mut st = lock(&self.st);
            st.stop = true;
            st.generation += 1;
            st.queued = 0;
            st.slots.drain().filter_map(|(_, s)| s.link).collect()
        };
        for l in &links {
            l.close_quietly();
        }
        lock(&self.st).stop = false;
        links
    }
}

/// The link a slot holds, unless its peer is provably gone ([`LinkShared::peer_gone`]: no
/// transfer has used a link that sat in its slot since its connect). A gone one is closed and
/// let go of, so the connect makes a new one (a peer that restarted on its address), instead of
/// reporting a dead link as connected; a slow peer's link stays.
fn live<E: Opener>(engine: &E, l: Arc<LinkShared>, timeout: Duration) -> Option<Arc<LinkShared>> {
    if l.peer_gone(timeout) != Some(true) {
        return Some(l);
    }
    l.close_quietly();
    engine.forget_link(&l);
    None
}

/// The status a remote shows when a task of it starts or ends with `new`, where it showed
/// `now`: as HIXL's `ConnectPoolExecutor::SetStatus`, a connect's progress does not hide a
/// disconnect the caller asked for since (`DisconnectPending`), nor a disconnect's a connect
/// (`ConnectPending`): the status follows the caller's latest call.
fn shown(now: AsyncConnectStatus, new: AsyncConnectStatus) -> AsyncConnectStatus {
    use AsyncConnectStatus::*;
    match (now, new) {
        (DisconnectPending, Connecting | Connected | ConnectFailed) => now,
        (ConnectPending, Disconnecting | NotConnect) => now,
        _ => new,
    }
}

fn pending(t: Task) -> AsyncConnectStatus {
    match t {
        Task::Connect(..) => AsyncConnectStatus::ConnectPending,
        Task::Disconnect(_) => AsyncConnectStatus::DisconnectPending,
    }
}

/// One turn of remote `key`: runs its next task, then queues its next turn if it has more.
fn turn<E: Opener>(pool: &Arc<ConnectPool>, engine: &Weak<E>, key: String) {
    let (task, generation) = {
        let mut st = lock(&pool.st);
        if st.stop {
            return;
        }
        let Some(s) = st.slots.get_mut(&key) else {
            return;
        };
        if s.busy {
            return; // its running task gives the next turn
        }
        let Some(t) = s.queue.pop_front() else {
            return;
        };
        s.busy = true;
        s.status = shown(
            s.status,
            match t {
                Task::Connect(..) => AsyncConnectStatus::Connecting,
                Task::Disconnect(_) => AsyncConnectStatus::Disconnecting,
            },
        );
        st.queued -= 1;
        (t, st.generation)
    };
    // run it without holding the lock (nor the engine, between tasks)
    let Some(inner) = engine.upgrade() else {
        return;
    };
    let held = lock(&pool.st)
        .slots
        .get_mut(&key)
        .and_then(|s| s.link.take());
    let (status, link, error) = match task {
        Task::Connect(addr, timeout) => match held.and_then(|l| live(&*inner, l, timeout)) {
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
    let more = {
        let mut st = lock(&pool.st);
        let ours = st.generation == generation;
        if let Some(s) = st.slots.get_mut(&key).filter(|_| ours) {
            s.busy = false;
            s.link = link;
            s.error = error;
            s.status = shown(s.status, status);
            let more = !s.queue.is_empty();
            if s.status == AsyncConnectStatus::NotConnect && s.link.is_none() && !more {
                // disconnected with nothing queued: no entry, as HIXL's (`status` answers
                // `NotConnect` for a remote it does not list), so remotes come and go without
                // the table growing
                st.slots.remove(&key);
            }
            more
        } else {
            if let Some(l) = link {
                // the slot went away, or is a later generation's (shutdown): do not leak the
                // link
                l.close_quietly();
                inner.forget_link(&l);
            }
            false
        }
    };
    if more {
        pool.give_turn(engine, &key);
    }
}
