//! The link core: one link's state under the `Link` handle — its data paths (the transports'
//! in preference order, then TCP's, which reaches every region), its TCP lanes (which also carry
//! its control messages: NOTIFY, PING, BYE), the server's fence, opening
//! (`LinkShared::open`), heartbeat and close. How a batch runs (on its route, the first data path
//! that reaches its regions, decided per region; async requests on the link's queue;
//! notifications ordered after earlier transfers) is in `exec.rs`.

mod exec;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::error::{Error, deadline_after};

/// Why an engine that is not a fabric-memory one does not connect to itself (under its own
/// name, refused by the engine, or under another of its addresses, refused here).
pub(crate) const SELF_LINK_REFUSED: &str =
    "an engine cannot connect to itself (only a fabric-memory engine, EnableUseFabricMem=1, can)";
use crate::metrics::LinkCounters;
use crate::options::SameHost;
use crate::process::PeerProc;
use crate::runtime::executor::Queue;
use crate::runtime::request::{QueuedBatch, ReqState};
use crate::runtime::revoke::fence::ClientFence;
use crate::runtime::transports::tcp_path;
use crate::sync::lock;
use crate::transport::tcp::{FirstLane, Join, Lanes};
use crate::transport::{Backend, DataPath, Health, Setup, TransportKind};
use crate::types::HostId;
use crate::wire::{Hello, LaneRole, TableEntry};

/// Most descriptors in one transfer call.
pub const MAX_BATCH: usize = 1 << 20;

/// The link's transfers that have not ended, sync and async, by sequence number (a
/// notification waits for every earlier one; `close` cancels the async ones and waits for all).
struct Unfinished {
    /// The next sequence number, of a transfer or a notification: taken under this lock, so
    /// one started before a notification has a lower number and is listed when it looks.
    next: u64,
    /// Async requests (one has ended once its state is gone: its worker holds it while it runs).
    reqs: BTreeMap<u64, Weak<ReqState>>,
    /// Sync batches running on their callers' threads (a few: one per thread; a `Vec` keeps
    /// its room, so a sync call allocates nothing here).
    syncs: Vec<u64>,
    /// Set by `close`: no transfer starts any more.
    closed: bool,
    /// Threads waiting on `finished_cv` (a notification, a close): an ending transfer wakes
    /// them only when there are some, so a call costs no system call for it.
    waiting: usize,
}

impl Default for Unfinished {
    fn default() -> Self {
        Unfinished {
            next: 1,
            reqs: BTreeMap::new(),
            syncs: Vec::new(),
            closed: false,
            waiting: 0,
        }
    }
}

impl Unfinished {
    /// Whether a transfer numbered below `seq` has not ended.
    fn any_before(&self, seq: u64) -> bool {
        self.reqs.range(..seq).next().is_some() || self.syncs.iter().any(|&s| s < seq)
    }
}

/// A link's state, shared by the [`Link`](crate::Link) handle, async requests and the
/// executor's workers running them.
pub(crate) struct LinkShared {
    pub(crate) id: u64,
    pub(crate) peer: String,
    pub(crate) remote_instance: u64,
    pub(crate) remote_pid: u32,
    /// Sorted by address, disjoint (checked when decoded).
    pub(crate) table: Vec<TableEntry>,
    pub(crate) engine_id: u64,
    /// The link's async requests, taken in order, at most `max_lanes` at once.
    queue: Arc<Queue<QueuedBatch>>,
    /// Transfers not finished yet.
    unfinished: Mutex<Unfinished>,
    finished_cv: Condvar,
    pub(crate) counters: LinkCounters,
    /// The data paths in preference order (device, UCX, same host: the ones the engine's
    /// transports set up with the peer), then TCP's, which reaches every region: never empty.
    paths: Vec<Box<dyn DataPath>>,
    /// Which of `paths` reach each region of the peer's table.
    routes: exec::Routes,
    /// The link's TCP lanes: their state is the link's (broken, closed), and the control
    /// messages go over them.
    lanes: Arc<Lanes>,
    /// The server's fence for this link, when the peer is on this host: its revocable grant of
    /// one-sided access, entered by every same-host (and same-host UCX) batch.
    fence: Option<ClientFence>,
    pub(crate) span: tracing::Span,
}

/// What a new link takes from its engine, so the link core does not see the engine.
pub(crate) struct LinkConfig<'a> {
    /// The engine's id (for metrics), instance id (its server's: a WELCOME naming it is this
    /// engine's own) and name.
    pub(crate) engine_id: u64,
    pub(crate) instance: u64,
    /// The id this engine's HELLOs name as a client (never the instance its server sends).
    pub(crate) client_id: u64,
    pub(crate) name: &'a str,
    pub(crate) options: &'a crate::options::Options,
    /// The engine's span; the link's is a child of it.
    pub(crate) span: &'a tracing::Span,
    /// The engine's transports besides TCP, in preference order.
    pub(crate) backends: &'a [Arc<dyn Backend>],
}

static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

impl LinkShared {
    pub(crate) fn open(
        engine: &LinkConfig<'_>,
        peer: String,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Arc<Self>, Error> {
        let started = Instant::now();
        let deadline = deadline_after(started, timeout);
        let policy = engine.options.same_host;
        let me = match policy {
            SameHost::Forbid => None,
            _ => HostId::current(),
        };
        let hello = Hello {
            role: LaneRole::NewLink,
            instance: engine.client_id,
            // a server on this host must prove which process it is (`proven`)
            token: if me.is_some() {
                crate::wire::ASKS_SERVER_PROOF
            } else {
                0
            },
            name: engine.name.to_owned(),
            target: peer.clone(),
            host: me,
            nonce: crate::auth::nonce()?,
        };
        let psk = engine.options.psk.clone();
        let (mut first, welcome) =
            FirstLane::open(addr, &peer, &hello, psk.as_ref(), started, deadline)?;
        // the engine itself, perhaps under another of its addresses: only a fabric-memory
        // engine links to itself (its data path knows: `Setup::loopback`)
        let loopback = welcome.instance == engine.instance;
        if loopback && !engine.options.ascend.enable_fabric_mem {
            return Err(Error::NotConnectable {
                peer,
                problem: SELF_LINK_REFUSED,
            });
        }
        let id = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
        let span = tracing::debug_span!(parent: engine.span, "link", id, peer = %peer);
        // on one host: the peer pinned once it proved it is the process it names, and its
        // fence (one-sided access the server can revoke)
        let mut why_not = None;
        let local = match (&me, &welcome.host) {
            (Some(a), Some(b)) if a.same_host(b) => PeerProc::open(b)
                .and_then(|p| proven(&p, welcome.lane_fd, first.stream()).map(|()| p))
                .and_then(|p| ClientFence::open(&p, welcome.fence, welcome.token).map(|f| (p, f)))
                .map_err(|e| {
                    tracing::debug!(parent: &span, error = %e, "no same-host access to the peer (kernel or peer refused); using tcp");
                    why_not = Some(
                        "the kernel refused access to the peer process, the peer did not prove it \
                         is the process it names, or it offered no fence (pidfd_open, \
                         /proc/PID/mem, pidfd_getfd)",
                    );
                })
                .ok(),
            _ => None,
        };
        let (local, mut fence) = local.map_or((None, None), |(p, f)| (Some(p), Some(f)));
        let mut paths: Vec<Box<dyn DataPath>> = Vec::new();
        {
            let _in_link = span.enter();
            let mut setup = Setup {
                me: engine.name,
                peer: &peer,
                table: &welcome.table,
                deadline,
                ctl: &mut first,
                local,
                covered: false,
                why_not,
                loopback,
            };
            for b in engine.backends {
                if let Some(p) = b.connect(&mut setup)? {
                    tracing::debug!(transport = ?b.kind(), "data path set up");
                    paths.push(p);
                    setup.covered = true;
                }
            }
            why_not = setup.why_not;
        }
        let near = welcome.fence >= 0
            || welcome.host.is_some()
            || crate::process::peer_on_this_host(first.stream());
        if near && fence.is_none() {
            // the server may be on this host, but it did not prove which process it is, or its
            // fence could not be taken: a one-sided path (UCX over shared memory) could reach
            // whatever process its answers name, and would run outside the fence, where the
            // server's `deactivate` cannot stop it. Such paths go; the link moves its data
            // over the others (TCP at least).
            paths.retain(|p| {
                if p.fenced() {
                    tracing::debug!(parent: &span, transport = ?p.kind(), "no fence: not used");
                    p.close();
                }
                !p.fenced()
            });
        }
        if paths.is_empty() {
            // no data path but TCP's (added below): the fence guards nothing
            fence = None;
        }
        let one_sided = paths
            .iter()
            .any(|p| matches!(p.kind(), TransportKind::SameHost | TransportKind::Ascend));
        if policy == SameHost::Require && !one_sided {
            return Err(Error::TransportUnavailable {
                peer,
                transport: TransportKind::SameHost.name(),
                why: why_not.unwrap_or("the peer is not on this host (boot id and pid namespace)"),
            });
        }
        // the last data path, and the control messages' lanes: TCP's
        let max_lanes = engine.options.max_lanes;
        let join = Join {
            addr,
            peer: peer.clone(),
            instance: engine.client_id,
            name: engine.name.to_owned(),
            token: welcome.token,
            remote_instance: welcome.instance,
            psk,
        };
        let lanes = first.into_lanes(join, max_lanes, span.clone());
        let parallel = engine.options.parallel_lanes.min(max_lanes);
        paths.push(tcp_path(lanes.clone(), parallel));
        tracing::debug!(parent: &span, regions = welcome.table.len(), remote_instance = welcome.instance,
            elapsed_us = started.elapsed().as_micros() as u64, "connected");
        Ok(Arc::new(LinkShared {
            id,
            peer,
            remote_instance: welcome.instance,
            remote_pid: welcome.pid,
            routes: exec::Routes::new(&welcome.table),
            table: welcome.table,
            engine_id: engine.engine_id,
            queue: Queue::new(max_lanes),
            unfinished: Mutex::new(Unfinished::default()),
            finished_cv: Condvar::new(),
            counters: LinkCounters::default(),
            paths,
            lanes,
            fence,
            span,
        }))
    }

    /// Whether the link broke (or was closed).
    pub(crate) fn is_broken(&self) -> bool {
        self.lanes.is_broken()
    }

    /// `Err(NotConnected)` once the link is broken.
    pub(crate) fn check_usable(&self) -> Result<(), Error> {
        self.lanes.usable()
    }

    /// Whether the link moves device memory (it has a device data path).
    pub(crate) fn has_device_path(&self) -> bool {
        self.paths.iter().any(|p| p.moves_device_memory())
    }

    /// The transport carrying the link's data: its preferred data path's (TCP when it has no
    /// other).
    pub(crate) fn transport(&self) -> TransportKind {
        self.paths[0].kind()
    }

    /// The transport that moves batches on region `id` of the peer's table (its route's
    /// first data path).
    pub(crate) fn transport_of(&self, id: u32) -> TransportKind {
        let m = self.routes.mask(id, &self.paths);
        self.paths[m.trailing_zeros() as usize].kind()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.lanes.is_closed()
    }

    /// Marks the link unusable (the first reason stays); callers waiting for a lane see
    /// `NOT_CONNECTED` at once.
    fn mark_broken(&self, why: String) {
        self.lanes.break_link(why);
    }

    /// The link's TCP lanes (tests).
    #[cfg(test)]
    pub(crate) fn lanes_for_test(&self) -> &Lanes {
        &self.lanes
    }

    /// Breaks the link as a heartbeat not answered in time would, its peer alive (tests).
    #[cfg(test)]
    pub(crate) fn break_for_test(&self) {
        self.mark_broken("broken by a test".into());
    }
}

/// Checks that the process `peer` (pinned, named by a server's WELCOME) holds the other end of
/// `ours`, the link's first connection, in its descriptor `lane_fd`: the server's proof of its
/// process, asked for in the HELLO. Until it holds, nothing same-host of the WELCOME is used
/// (its fence, its table's descriptors and addresses): they are the named process's only once
/// the TCP peer is known to be that process.
fn proven(
    peer: &PeerProc,
    lane_fd: Option<i32>,
    ours: &std::net::TcpStream,
) -> std::io::Result<()> {
    match lane_fd {
        Some(fd) if peer.holds_peer_of(fd, ours)? => Ok(()),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the server did not prove it is the process it names",
        )),
    }
}

impl LinkShared {
    /// Whether the link's peer is provably gone, checked now, for a link that nothing used
    /// for a while: `Some(true)` if the link is broken, a data path knows its peer failed (a
    /// same-host peer's process exited), or a PING on an idle lane finds the connection reset
    /// or hung up (a peer that exited, finalized or restarted); the link is then broken.
    /// `Some(false)` if the PING was answered. `None` (no idle lane, no answer within
    /// `timeout`) decides nothing and breaks nothing: a slow or stopped peer keeps its link.
    pub(crate) fn peer_gone(&self, timeout: Duration) -> Option<bool> {
        if self.is_broken() {
            return Some(true);
        }
        for p in &self.paths {
            if let Health::Failed(why) = p.health() {
                self.mark_broken(why);
                return Some(true);
            }
        }
        self.lanes.peer_gone(timeout)
    }

    /// One heartbeat: PING on an idle lane; no PONG within `timeout` breaks the link (a silent
    /// peer: stopped, hung, or cut off). Links that are busy (no idle lane) prove themselves by
    /// their transfers; same-host links watch the peer's pidfd instead (a stopped peer still
    /// serves them).
    pub(crate) fn heartbeat(&self, timeout: Duration) {
        for p in &self.paths {
            match p.health() {
                Health::Unknown => {}
                Health::Watched => return,
                Health::Failed(why) => {
                    self.mark_broken(why);
                    return;
                }
            }
        }
        self.lanes.heartbeat(timeout);
    }

    /// Closes the link, waiting up to `timeout` for the peer's acknowledgement.
    pub(crate) fn close_timeout(&self, timeout: Duration) -> Result<(), Error> {
        self.close(timeout)
    }

    /// Closes the link, briefly, ignoring errors (teardown). Like [`LinkShared::close`], it
    /// returns only once every transfer of the link has ended, also when the link is closed
    /// already or another thread is closing it with a longer timeout (a compat `Disconnect`
    /// racing `Finalize`): lanes still in use are cut by this call's own short deadline, and
    /// the transfers waited for. Before, a second closer returned at once, and a `Finalize`
    /// could return while a sync READ on the link still wrote the caller's memory.
    pub(crate) fn close_quietly(&self) {
        const BRIEF: Duration = Duration::from_millis(200);
        if !self.is_closed() {
            let _ = self.close(BRIEF);
            return;
        }
        let started = Instant::now();
        let _ = self.lanes.close(started, deadline_after(started, BRIEF));
        self.wait_requests();
    }

    /// Closes the link: no transfer starts on it any more, every async request still queued or
    /// running (held, dropped or forgotten) is cancelled, and the peer is told (BYE, waiting up
    /// to `timeout` for its answer). Returns only once every transfer of the link has ended
    /// (sync ones on other threads too, which the compat engine's shared links can have): from
    /// then on nothing of this link touches local memory. How long that takes is bounded by
    /// each transport's cancellation (a lane's socket is shut down; a same-host copy stops
    /// between parts; UCX stops waiting; a device batch ends by its deadline), and for a sync
    /// batch over TCP by `timeout` (its lane is shut down then), on the other paths by its
    /// deadline.
    pub(crate) fn close(&self, timeout: Duration) -> Result<(), Error> {
        let started = Instant::now();
        // async requests first: cancelled at once (a running one's lane is shut down); then the
        // lanes: a BYE on an idle one, and the lanes still in use (sync transfers on other
        // threads) waited for until `timeout`, then shut down
        self.queue.close();
        self.cancel_requests();
        let r = self.lanes.close(started, deadline_after(started, timeout));
        self.wait_requests();
        for p in &self.paths {
            p.close();
        }
        tracing::debug!(parent: &self.span, ok = r.is_ok(), "disconnected");
        r
    }

    /// Refuses new transfers and cancels every async request that has not ended.
    fn cancel_requests(&self) {
        let pending: Vec<Arc<ReqState>> = {
            let mut u = lock(&self.unfinished);
            u.closed = true;
            u.reqs.values().filter_map(Weak::upgrade).collect()
        };
        for st in &pending {
            st.cancel(self);
        }
    }

    /// Waits until each transfer has ended (an async one's worker saw the cancel, or it was
    /// still queued; a sync one returned).
    fn wait_requests(&self) {
        let mut u = lock(&self.unfinished);
        loop {
            // a request whose state is gone cannot be running (its worker holds it)
            u.reqs.retain(|_, w| w.strong_count() > 0);
            if u.reqs.is_empty() && u.syncs.is_empty() {
                return;
            }
            tracing::trace!(parent: &self.span, requests = u.reqs.len(), sync = u.syncs.len(), "waiting for transfers to end");
            u.waiting += 1;
            u = self
                .finished_cv
                .wait_timeout(u, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
            u.waiting -= 1;
        }
    }
}
