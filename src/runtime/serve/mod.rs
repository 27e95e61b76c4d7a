//! The serving engine: a driver over sans-I/O parts. The face ([`Server`]: start, stop, what
//! it serves) is here; below it, in import order: the one poller thread ([`poller`]), which
//! accepts, runs every handshake ([`handshake`], a state machine that owns no socket) and
//! holds idle lanes; the workers ([`worker`]) that open links and serve their requests; what
//! both share and the link registry ([`state`]); a connection as it moves between them
//! ([`conn`]); the region table requests are checked against ([`table`]), the bounds the
//! server keeps ([`limits`]), and the poller's epoll, tokens and waker ([`epoll`]).

pub(crate) mod conn;
pub(crate) mod epoll;
pub(crate) mod handshake;
pub(crate) mod limits;
pub(crate) mod poller;
pub(crate) mod state;
pub(crate) mod table;
pub(crate) mod worker;

use std::io;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::auth::Psk;
use crate::error::deadline_after;
use crate::io::Sock;
use crate::notify::NotifyQueue;
use crate::runtime::revoke::fence::{ServerFence, revoke_all};
use crate::sync::lock;
use crate::types::HostId;
use conn::Returns;
use epoll::Token;
use limits::{ConnTable, Limits};
use state::{Links, Shared};
pub(crate) use table::{ServeTable, Snapshot};

/// A running server: its poller thread (the workers are jobs of its queue).
pub(crate) struct Server {
    shared: Arc<Shared>,
    poller: Option<JoinHandle<()>>,
}

/// Options for [`Server::start`].
pub(crate) struct ServerConfig {
    pub name: String,
    pub instance: u64,
    pub io_timeout: Duration,
    pub limits: Limits,
    pub notifies: Arc<NotifyQueue>,
    pub host: Option<HostId>,
    pub allow: Option<Vec<String>>,
    pub psk: Option<Psk>,
    /// Keepalive interval for served connections (the engine's heartbeat interval).
    pub keepalive: Option<Duration>,
    /// The engine's transports besides TCP.
    pub backends: Vec<Arc<dyn crate::transport::Backend>>,
    pub span: tracing::Span,
}

impl Server {
    /// Starts accepting on `listener` (a clone of the engine's listening socket).
    pub fn start(
        listener: TcpListener,
        table: Arc<ServeTable>,
        cfg: ServerConfig,
    ) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        defer_accept(&listener, cfg.io_timeout);
        let nofile = limits::raise_nofile(cfg.limits.descriptors());
        tracing::debug!(parent: &cfg.span, nofile, "descriptor limit");
        let shared = Arc::new(Shared {
            name: cfg.name,
            instance: cfg.instance,
            table,
            io_timeout: cfg.io_timeout,
            queue: crate::runtime::executor::Queue::new(cfg.limits.max_threads),
            limits: cfg.limits,
            stop: AtomicBool::new(false),
            halt: AtomicBool::new(false),
            active: Arc::new(AtomicUsize::new(0)),
            lingering: AtomicUsize::new(0),
            conns: Arc::new(Mutex::new(ConnTable::default())),
            links: Links::default(),
            next_id: AtomicU64::new(Token::FIRST_CONN),
            notifies: cfg.notifies,
            host: cfg.host,
            allow: cfg.allow,
            psk: cfg.psk,
            keepalive: cfg.keepalive,
            backends: cfg.backends,
            fences: Mutex::new(Some(Vec::new())),
            fenced: Arc::new(AtomicUsize::new(0)),
            returns: Returns::new()?,
            span: cfg.span,
        });
        let s = shared.clone();
        let poller = std::thread::Builder::new()
            .name("hixl-serve".into())
            .spawn(move || poller::run(s, listener))?;
        Ok(Self {
            shared,
            poller: Some(poller),
        })
    }

    /// How many client links are being served right now (links without a lane, kept for
    /// their client to rejoin, do not count).
    pub fn served_links(&self) -> usize {
        self.shared.links.served()
    }

    /// The regions served now.
    pub fn regions(&self) -> Snapshot {
        self.shared.table.snapshot()
    }

    /// The fences of every same-host link that may reach region `id` one-sidedly: links open
    /// or being opened that were offered it, or whose offer is not recorded yet (a fence is
    /// listed before its link takes the region table, and records what it got after), so called
    /// after the region left the table, these are all the links that can have it in theirs.
    pub(crate) fn fences_reaching(&self, id: u32) -> Vec<Arc<ServerFence>> {
        let fences = lock(&self.shared.fences);
        (fences.iter().flatten())
            .filter(|f| f.may_reach(id))
            .cloned()
            .collect()
    }

    /// The table served (it changes under the compat engine's live registrations).
    pub(crate) fn table(&self) -> Arc<ServeTable> {
        self.shared.table.clone()
    }

    /// Shuts down the sockets of the lanes `conns` (connection ids; gone ones are skipped):
    /// their requests fail at once, a parked one when the poller sees the hang-up.
    pub(crate) fn cut(&self, conns: &[u64]) {
        let table = lock(&self.shared.conns);
        for c in conns.iter().filter_map(|id| table.get(id)) {
            Sock::shutdown(c);
        }
    }

    /// Stops serving: no new connections; revokes every same-host client's one-sided access;
    /// waits up to `grace` for requests being served to finish and for every same-host client
    /// to leave its fence; then closes every connection and joins every thread. When this
    /// returns, no serving thread touches registered memory any more, and neither does any
    /// same-host client, except those returned: their fences did not settle in time (the
    /// client is stopped or hung), so the memory they can reach must be quarantined.
    pub fn stop(mut self, grace: Duration) -> crate::runtime::revoke::quarantine::Blockers {
        // the poller stops accepting and closes every handshake; established lanes are served
        // through the grace (requests parked on a stalled socket included)
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.returns.wake();
        // from here no fence is handed out: a handshake still running serves its client over TCP
        let fences = lock(&self.shared.fences).take().unwrap_or_default();
        let until = deadline_after(Instant::now(), grace);
        let in_grace = || {
            let more = Instant::now() < until;
            if more {
                std::thread::sleep(Duration::from_millis(1));
            }
            more
        };
        // every fence revoked; within the grace, wait for them all to settle; a client still
        // inside its fence then is given up on: its batch will report failure
        let stuck = revoke_all(fences, in_grace);
        // requests being served over TCP get the rest of the grace
        // (a lane whose request is queued for a worker counts too)
        let busy_now =
            || self.shared.active.load(Ordering::SeqCst) > 0 || self.shared.queue.pending() > 0;
        while busy_now() && in_grace() {}
        if !stuck.is_empty() {
            tracing::warn!(parent: &self.shared.span, clients = stuck.len(), ?grace,
                "same-host clients did not leave their fences in time; their memory will be quarantined");
        }
        let busy = self.shared.active.load(Ordering::SeqCst);
        // the poller ends: idle lanes, and parked requests still unfinished, are dropped
        self.shared.halt.store(true, Ordering::SeqCst);
        self.shared.returns.wake();
        if let Some(p) = self.poller.take() {
            let _ = p.join();
        }
        for s in lock(&self.shared.conns).values() {
            Sock::shutdown(s);
        }
        // every worker ends its lane (each one's socket is shut down) and leaves
        self.shared.queue.close();
        self.shared.queue.wait_idle();
        // lanes handed back after the poller ended
        drop(self.shared.returns.take());
        tracing::debug!(parent: &self.shared.span, cut_requests = busy, "server stopped");
        stuck
    }
}

/// Has the kernel hold back a connection from `accept` until its first bytes arrive (for up to
/// about `limit`): clients speak first (HELLO), so a connection that says nothing costs the
/// server nothing — no descriptor, no handshake slot — while an honest client's HELLO is in by
/// the time its connection is accepted, and is taken at once (the stateless first round of
/// admission). Where the option is missing, connections are accepted at once as before.
fn defer_accept(listener: &TcpListener, limit: Duration) {
    let secs = limit.as_secs().clamp(1, i32::MAX as u64) as libc::c_int;
    // SAFETY: setsockopt reads one c_int from a live local for the call.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(listener),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&secs as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "no TCP_DEFER_ACCEPT");
    }
}
