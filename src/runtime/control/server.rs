//! The control plane's server: its state (the region table every request is validated against,
//! which TCP's serving half reaches as [`Served`]; the link registry; the connection table that
//! keeps the bounds of [`limits`]), its start and its stop. The listener, every handshake and
//! every idle lane are the [`poller`](super::poller)'s, one thread; requests are served by
//! workers in [`dispatch`](super::dispatch), at most [`Limits::max_threads`] at once.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::conn::{Job, Returns};
use crate::auth::Psk;
use crate::error::Status;
use crate::io::{IoVec, Sock};
use crate::notify::NotifyQueue;
use crate::runtime::control::limits::{self, ConnTable, Limits};
use crate::runtime::region::RegionCore;
use crate::runtime::revoke::fence::{ServerFence, revoke_all};
use crate::runtime::transports::Served;
use crate::sync::lock;
use crate::types::HostId;
use crate::types::TransferOp;
use crate::types::WireDesc;
use crate::wire::{self, Hello, TableEntry};

/// The region table a serving engine exposes, sorted by region id. Regions come and go while it
/// serves only through the compat engine (HIXL registers and deregisters while linked): each
/// request looks regions up in a snapshot and enters their [`ServeGate`]s, which withdrawing a
/// region closes (and waits for) after taking it out of the table.
pub(crate) struct ServeTable {
    by_id: Mutex<Arc<Vec<Arc<RegionCore>>>>,
}

/// The region table as one request sees it.
pub(crate) type Snapshot = Arc<Vec<Arc<RegionCore>>>;

impl ServeTable {
    pub fn new(mut regions: Vec<Arc<RegionCore>>) -> Self {
        regions.sort_by_key(|r| r.id);
        Self {
            by_id: Mutex::new(Arc::new(regions)),
        }
    }
    /// The regions served now.
    pub(crate) fn snapshot(&self) -> Snapshot {
        lock(&self.by_id).clone()
    }
    /// Serves `r` too (to peers that connect from now on: a link's table is sent once).
    pub(crate) fn add(&self, r: Arc<RegionCore>) {
        let mut t = lock(&self.by_id);
        let mut v = Vec::clone(&t);
        let at = v.partition_point(|x| x.id < r.id);
        v.insert(at, r);
        *t = Arc::new(v);
    }
    /// Stops serving region `id`: later requests do not find it (`PARAM_INVALID`). The caller
    /// closes its gate to wait for requests already applying to it.
    pub(crate) fn remove(&self, id: u32) {
        let mut t = lock(&self.by_id);
        if t.iter().any(|r| r.id == id) {
            *t = Arc::new(t.iter().filter(|r| r.id != id).cloned().collect());
        }
    }
    fn get(table: &[Arc<RegionCore>], id: u32) -> Option<&RegionCore> {
        table
            .binary_search_by_key(&id, |r| r.id)
            .ok()
            .map(|i| &*table[i])
    }
    /// The table as peers see it. With `same_host` (a same-host peer with a fence), each region
    /// says how that peer may reach it: the memfd of a shareable region (the region is then
    /// marked as possibly mapped by a peer), `-1` for `/proc/PID/mem` at its address, or
    /// [`wire::FD_TCP_ONLY`] for memory the engine could not quarantine (caller-managed raw
    /// memory, types it cannot copy): served over TCP only.
    pub fn entries(&self, same_host: bool) -> Vec<TableEntry> {
        self.snapshot()
            .iter()
            .map(|r| TableEntry {
                fd: if !same_host {
                    -1
                } else if !r.one_sided() || r.access == crate::types::Access::None {
                    wire::FD_TCP_ONLY
                } else if r.fd >= 0 {
                    r.exposed.store(true, Ordering::SeqCst);
                    r.fd
                } else {
                    -1
                },
                id: r.id,
                addr: r.addr as u64,
                len: r.len as u64,
                mem_type: r.mem_type,
                access: r.access,
            })
            .collect()
    }
}

/// The gates a request entered: left when it is dropped, once the request no longer touches
/// the regions' memory.
#[derive(Default)]
struct Entered(Vec<(u32, Arc<crate::runtime::region::ServeGate>)>);

impl Entered {
    fn enter(&mut self, r: &RegionCore) -> bool {
        if self.0.iter().any(|(id, _)| *id == r.id) {
            return true;
        }
        if !r.gate.enter() {
            return false;
        }
        self.0.push((r.id, r.gate.clone()));
        true
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        for (_, g) in self.0.drain(..) {
            g.leave();
        }
    }
}

/// A request's hold on the regions it touches, while it is applied: the snapshot keeps their
/// records (and owned memory) alive, and the entered gates make withdrawing a region (the
/// compat engine's deregistration while linked) wait. Dropped in this order: the snapshot first.
pub(crate) struct Held {
    _snapshot: Snapshot,
    _entered: Entered,
}

// SAFETY: `validate` admits only ranges inside host regions of the table, within their bounds,
// whose memory is valid for reads and for writes of any bytes, by anyone (the
// RegistrableMemory / register_raw contracts); the snapshot in `Held` keeps the regions'
// records (and owned memory) alive, and the gates it entered keep them registered: withdrawing
// a region takes it out of the table, then waits for its gate to be left.
unsafe impl Served for ServeTable {
    type Held = Held;

    fn admit(
        &self,
        op: TransferOp,
        descs: &[WireDesc],
        targets: &mut Vec<IoVec>,
    ) -> Result<Held, (Status, String)> {
        let mut entered = Entered::default();
        let snapshot = self.snapshot();
        validate(&snapshot, op, descs, targets, &mut entered)?;
        Ok(Held {
            _snapshot: snapshot,
            _entered: entered,
        })
    }
}

/// Checks a batch against the table and computes the memory it touches; `entered` holds the
/// regions' gates until the request is done with them.
///
/// Never trusts the peer: unknown (or withdrawn) regions, empty, overflowing or out-of-bounds
/// ranges and forbidden operations are refused before any memory is touched.
fn validate(
    table: &[Arc<RegionCore>],
    op: TransferOp,
    descs: &[WireDesc],
    targets: &mut Vec<IoVec>,
    entered: &mut Entered,
) -> Result<(), (Status, String)> {
    targets.clear();
    for (i, d) in descs.iter().enumerate() {
        let Some(r) = ServeTable::get(table, d.region) else {
            return Err((
                Status::PARAM_INVALID,
                format!("descriptor {i}: no region {}", d.region),
            ));
        };
        let in_bounds = d.len > 0
            && d.offset
                .checked_add(d.len)
                .is_some_and(|end| end <= r.len as u64);
        if !in_bounds {
            return Err((
                Status::PARAM_INVALID,
                format!(
                    "descriptor {i}: range {}+{} outside region {} of {} bytes",
                    d.offset, d.len, r.id, r.len
                ),
            ));
        }
        if !r.access.permits(op) {
            return Err((
                Status::PARAM_INVALID,
                format!(
                    "descriptor {i}: {op} not permitted on region {} ({})",
                    r.id,
                    r.access.name()
                ),
            ));
        }
        if r.mem_type != crate::types::MemType::Host {
            return Err((
                Status::UNSUPPORTED,
                format!("descriptor {i}: device memory over tcp"),
            ));
        }
        if !entered.enter(r) {
            return Err((
                Status::PARAM_INVALID,
                format!("descriptor {i}: region {} was deregistered", r.id),
            ));
        }
        targets.push(IoVec {
            base: r.addr + d.offset as usize,
            len: d.len as usize,
        });
    }
    Ok(())
}

pub(super) struct LinkRec {
    pub(super) client: String,
    pub(super) instance: u64,
    pub(super) conns: HashSet<u64>,
    /// Cleared when the link is superseded or closed: its lanes apply nothing more.
    pub(super) live: Arc<AtomicBool>,
    /// Requests of this link being applied right now.
    pub(super) busy: Arc<AtomicUsize>,
    /// The server's side of the link's data paths (what its transports' `accept` returned),
    /// dropped with the link.
    pub(super) paths: Vec<Box<dyn std::any::Any + Send>>,
    /// The link's fence, when its client is on this host: revoked when the link ends.
    pub(super) fence: Option<Arc<ServerFence>>,
    /// Since when the link has no lane (a client that cancelled a running request closed its
    /// only one): its client may join it again for [`ORPHAN_GRACE`](ServerShared::orphan_grace).
    pub(super) orphaned: Option<std::time::Instant>,
}

/// At most this many links without a lane are kept for their client to rejoin; beyond it the
/// oldest go first.
const MAX_ORPHANS: usize = 1024;

/// Removes the links without a lane that have had none for `grace`, and the oldest beyond `max`;
/// returns their tokens. Links with a lane are never removed.
fn prune_orphans(links: &mut HashMap<u64, LinkRec>, grace: Duration, max: usize) -> Vec<u64> {
    let mut orphans: Vec<(std::time::Instant, u64)> = links
        .iter()
        .filter_map(|(t, l)| l.orphaned.map(|at| (at, *t)))
        .collect();
    orphans.sort_unstable();
    let excess = orphans.len().saturating_sub(max);
    let gone: Vec<u64> = orphans
        .iter()
        .enumerate()
        .filter(|(i, (at, _))| *i < excess || at.elapsed() >= grace)
        .map(|(_, (_, t))| *t)
        .collect();
    for t in &gone {
        links.remove(t);
    }
    gone
}

impl Drop for LinkRec {
    fn drop(&mut self) {
        // a link that ended grants no more one-sided access
        if let Some(f) = &self.fence {
            f.revoke();
        }
    }
}

impl LinkRec {
    /// Stops the link's lanes: they apply no request after this returns, except those already
    /// being applied, which [`LinkRec::drain`] waits for.
    fn retire(&self, conns: &Mutex<ConnTable>) {
        self.live.store(false, Ordering::SeqCst);
        let conns = lock(conns);
        for c in self.conns.iter().filter_map(|c| conns.get(c)) {
            Sock::shutdown(c);
        }
    }
    /// Waits (up to `limit`) until no request of this retired link is being applied.
    pub(super) fn drain(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while self.busy.load(Ordering::SeqCst) > 0 {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }
}

/// What a lane holds of its link: the flag that says the link is live, and the count of its
/// requests being applied.
pub(super) struct Member {
    pub(super) live: Arc<AtomicBool>,
    pub(super) busy: Arc<AtomicUsize>,
}

impl Member {
    fn of(l: &LinkRec) -> Self {
        Self {
            live: l.live.clone(),
            busy: l.busy.clone(),
        }
    }
}

/// Why a lane cannot join a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum JoinFail {
    /// No link of this client has the token.
    Unknown,
    /// The link has its most lanes.
    Full,
}

/// What a lane's leaving did to the registry.
#[derive(Default)]
pub(super) struct Left {
    /// The fence of a link that lost its last lane: the caller revokes it (outside the lock).
    pub(super) fence: Option<Arc<ServerFence>>,
    /// The lane was its link's last: the link is kept a while for its client to rejoin.
    pub(super) emptied: bool,
    /// Links forgotten (orphaned past the grace, or beyond [`MAX_ORPHANS`]).
    pub(super) gone: Vec<u64>,
}

/// The link registry: every link a server serves (or keeps for its client to rejoin), by
/// token. Its methods are the only place it is edited, and the only place it is locked.
#[derive(Default)]
pub(crate) struct Links(Mutex<HashMap<u64, LinkRec>>);

impl Links {
    /// Opens link `token` for `hello`'s client, with lane `id` and `fence`. The client's old
    /// links (same name *and* instance: many client-only engines on one host share the name
    /// of its address) are taken out and retired first (their lanes shut through `conns`):
    /// returned, for the caller to drain before it welcomes the new link.
    pub(super) fn open(
        &self,
        token: u64,
        hello: &Hello,
        id: u64,
        fence: Option<Arc<ServerFence>>,
        conns: &Mutex<ConnTable>,
    ) -> (Member, Vec<LinkRec>) {
        let mut links = lock(&self.0);
        let stale: Vec<u64> = (links.iter())
            .filter(|(_, l)| l.client == hello.name && l.instance == hello.instance)
            .map(|(t, _)| *t)
            .collect();
        let mut retired = Vec::new();
        for t in stale {
            if let Some(old) = links.remove(&t) {
                old.retire(conns);
                retired.push(old);
            }
        }
        let rec = LinkRec {
            client: hello.name.clone(),
            instance: hello.instance,
            conns: HashSet::from([id]),
            live: Arc::new(AtomicBool::new(true)),
            busy: Arc::new(AtomicUsize::new(0)),
            paths: Vec::new(),
            fence,
            orphaned: None,
        };
        let member = Member::of(&rec);
        links.insert(token, rec);
        (member, retired)
    }

    /// Joins lane `id` to the link `hello` names (its token, client name and instance), if it
    /// has fewer than `max_lanes`; `reopened` runs (under the registry's lock) when the link had
    /// no lane and its client is back.
    pub(super) fn join(
        &self,
        hello: &Hello,
        id: u64,
        max_lanes: usize,
        reopened: impl FnOnce(),
    ) -> Result<Member, JoinFail> {
        let mut links = lock(&self.0);
        match links.get_mut(&hello.token) {
            Some(l) if l.instance == hello.instance && l.client == hello.name => {
                if l.conns.len() >= max_lanes {
                    return Err(JoinFail::Full);
                }
                l.conns.insert(id);
                if l.orphaned.take().is_some() {
                    reopened();
                }
                Ok(Member::of(l))
            }
            _ => Err(JoinFail::Unknown),
        }
    }

    /// Closes link `token` (its client said BYE on lane `id`): it applies nothing more, its
    /// other lanes are shut (through `conns`), its fence is revoked. Returns its client's name.
    pub(super) fn close(&self, token: u64, id: u64, conns: &Mutex<ConnTable>) -> Option<String> {
        let rec = lock(&self.0).remove(&token)?;
        rec.live.store(false, Ordering::SeqCst);
        let conns = lock(conns);
        for c in (rec.conns.iter())
            .filter(|&&c| c != id)
            .filter_map(|c| conns.get(c))
        {
            Sock::shutdown(c);
        }
        drop(conns);
        Some(rec.client.clone())
    }

    /// Whether link `token` has a fence (its client proved it is on this host).
    pub(super) fn fenced(&self, token: u64) -> bool {
        lock(&self.0).get(&token).is_some_and(|l| l.fence.is_some())
    }

    /// Keeps a transport's server side of link `token` (dropped with the link).
    pub(super) fn add_path(&self, token: u64, side: Box<dyn std::any::Any + Send>) {
        if let Some(l) = lock(&self.0).get_mut(&token) {
            l.paths.push(side);
        }
    }

    /// Takes lane `id` out of link `token`. A link that lost its last lane (not by BYE) is
    /// kept for `grace` for its client to rejoin, without its fence (returned, for the caller
    /// to revoke); orphans past the grace, and the oldest beyond [`MAX_ORPHANS`], are forgotten.
    pub(super) fn leave(&self, id: u64, token: u64, bye: bool, grace: Duration) -> Left {
        let mut links = lock(&self.0);
        let mut left = Left::default();
        if let Some(l) = links.get_mut(&token) {
            l.conns.remove(&id);
            // its last lane: the link is kept a while for its client to rejoin (a client
            // that cancels a running request closes that request's lane, maybe its only
            // one); its pending notifications start their grace now. Its fence goes now:
            // an orphaned link holds no descriptor
            if l.conns.is_empty() && !bye {
                l.orphaned = Some(Instant::now());
                left.fence = l.fence.take();
                left.emptied = true;
            }
        } // else: closed by BYE or replaced
        // fences of links that go are revoked as their records go
        left.gone = prune_orphans(&mut links, grace, MAX_ORPHANS);
        left
    }

    /// How many links have a lane now.
    pub(super) fn served(&self) -> usize {
        lock(&self.0)
            .values()
            .filter(|l| l.orphaned.is_none())
            .count()
    }
}

/// State shared by the poller and every serving worker of one engine.
pub(crate) struct ServerShared {
    pub(super) name: String,
    pub(super) instance: u64,
    pub(super) table: Arc<ServeTable>,
    pub(super) io_timeout: Duration,
    pub(super) limits: Limits,
    pub(super) stop: AtomicBool,
    /// Set once the stop's grace is over: the poller ends, closing what it still holds.
    pub(super) halt: AtomicBool,
    /// Requests being served right now.
    pub(super) active: AtomicUsize,
    /// Workers waiting a moment for their lane's next request; while one does, a new job
    /// starts no thread: the lingering worker gives up its wait and takes it.
    pub(super) lingering: AtomicUsize,
    /// Every connection, from accept until its thread ends, with the counts [`Limits`] bound.
    pub(super) conns: Mutex<ConnTable>,
    pub(super) links: Links,
    pub(super) next_id: AtomicU64,
    pub(super) notifies: Arc<NotifyQueue>,
    /// This process, offered to same-host clients (`None`: same-host transfers are off).
    pub(super) host: Option<HostId>,
    /// The client engine names served (`None`: all).
    pub(super) allow: Option<Vec<String>>,
    /// The pre-shared key clients must prove (`None`: no authentication).
    pub(super) psk: Option<Psk>,
    /// Keepalive interval for served connections (`None`: off).
    pub(super) keepalive: Option<Duration>,
    /// The engine's transports besides TCP: they answer clients' setup requests.
    pub(super) backends: Vec<Arc<dyn crate::transport::Backend>>,
    /// Every fence handed to a same-host client that may still be in use: revoked (and waited
    /// for) when serving stops; dropped once revoked and settled. `None` once serving stops: no
    /// fence is handed out after that.
    pub(super) fences: Mutex<Option<Vec<Arc<ServerFence>>>>,
    /// Fences alive now (their places in the budget of [`Limits::max_fenced`]).
    pub(super) fenced: Arc<AtomicUsize>,
    /// The workers' queue: completed handshakes and lanes with a request.
    pub(super) queue: Arc<crate::runtime::executor::Queue<Job>>,
    /// Lanes on their way back to the poller, and its wake-up.
    pub(super) returns: Returns,
    pub(super) span: tracing::Span,
}

impl ServerShared {
    /// How long a link without a lane is kept for its client to rejoin: the I/O timeout.
    pub(super) fn orphan_grace(&self) -> Duration {
        self.io_timeout
    }

    /// Forgets fences that are revoked and settled: their clients start no batch and have
    /// none in flight.
    pub(super) fn prune_fences(&self) {
        if let Some(fences) = lock(&self.fences).as_mut() {
            fences.retain(|f| !f.spent());
        }
    }

    /// Records a fence before it is offered to its client; `false` once serving has stopped
    /// (then the fence must not be offered: `stop` would not wait for it).
    pub(super) fn offer_fence(&self, fence: &Arc<ServerFence>) -> bool {
        let mut fences = lock(&self.fences);
        match fences.as_mut() {
            Some(list) => {
                list.retain(|f| !f.spent());
                list.push(fence.clone());
                true
            }
            None => false,
        }
    }
}

/// A running server: its poller thread (the workers are jobs of its queue).
pub(crate) struct Server {
    pub(super) shared: Arc<ServerShared>,
    pub(super) poller: Option<JoinHandle<()>>,
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
        let shared = Arc::new(ServerShared {
            name: cfg.name,
            instance: cfg.instance,
            table,
            io_timeout: cfg.io_timeout,
            queue: crate::runtime::executor::Queue::new(cfg.limits.max_threads),
            limits: cfg.limits,
            stop: AtomicBool::new(false),
            halt: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            lingering: AtomicUsize::new(0),
            conns: Mutex::new(ConnTable::default()),
            links: Links::default(),
            next_id: AtomicU64::new(super::poller::FIRST_ID),
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
            .spawn(move || super::poller::run(s, listener))?;
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
        let until = Instant::now() + grace;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(orphaned: Option<Instant>) -> LinkRec {
        LinkRec {
            client: "c".into(),
            instance: 1,
            conns: HashSet::new(),
            live: Arc::new(AtomicBool::new(true)),
            busy: Arc::new(AtomicUsize::new(0)),
            paths: Vec::new(),
            fence: None,
            orphaned,
        }
    }

    #[test]
    fn links_without_lanes_are_kept_for_the_grace_and_bounded_in_number() {
        let now = Instant::now();
        let ago = |s: u64| now.checked_sub(Duration::from_secs(s)).unwrap_or(now);
        let mut links = HashMap::new();
        // 10 links with a lane, 1030 without: the oldest one past the grace
        for t in 0..10u64 {
            links.insert(t, rec(None));
        }
        links.insert(100, rec(Some(ago(120))));
        for t in 0..1029u64 {
            links.insert(1000 + t, rec(Some(ago(30) + Duration::from_millis(t))));
        }
        let gone = prune_orphans(&mut links, Duration::from_secs(60), 1024);
        // the one past the grace, then the oldest until 1024 are left
        let mut gone = gone;
        gone.sort_unstable();
        assert_eq!(gone, vec![100, 1000, 1001, 1002, 1003, 1004]);
        assert_eq!(
            links.values().filter(|l| l.orphaned.is_some()).count(),
            1024
        );
        assert!(
            (0..10).all(|t| links.contains_key(&t)),
            "a link with a lane went"
        );
        // nothing more goes while they are within the grace and the bound
        assert!(prune_orphans(&mut links, Duration::from_secs(60), 1024).is_empty());
    }
}
