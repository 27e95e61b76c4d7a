//! The engine core under `Hixl<S>`: the region table, the peer registry (one usable link per
//! remote engine), the links it opened, the heartbeat, the engine's transports, and serving
//! (start, stop). The type states and the typed registration operations are in src/engine/.

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpListener};
use std::sync::Weak;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::auth::random_u64;
use crate::device::Device;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::notify::NotifyQueue;
use crate::options::Options;
use crate::runtime::connect::{ConnectPool, Opener};
use crate::runtime::link::{LinkConfig, LinkShared};
use crate::runtime::region::RegionCore;
use crate::runtime::serve::{ServeTable, Server, ServerConfig};
use crate::runtime::transports::{self, Transports};
use crate::sync::lock;
use crate::transport::{Backend, Region, Regions};
use crate::types::MemType;
use crate::types::engine_name::EngineName;

#[derive(Default)]
pub(crate) struct RegionTable {
    pub(crate) by_addr: BTreeMap<usize, Arc<RegionCore>>,
    pub(crate) next_id: u32,
    pub(crate) bytes: usize,
}

/// Who holds a remote engine's name.
enum PeerSlot {
    /// A connect is running (the ticket tells it apart from a later one).
    Connecting(u64),
    /// A link; a broken one does not block a new connect.
    Linked(Weak<LinkShared>),
}

/// The engine's resources. `Drop` is the fallback teardown; `finalize` is the observable one.
pub(crate) struct EngineInner {
    pub(crate) id: u64,
    /// The instance id its server's WELCOMEs name (anyone who connects learns it).
    pub(crate) instance: u64,
    /// The id its links' HELLOs name as a client, another random value: a server replaces a
    /// client's link with a new one of the same name and id, so it is never sent to anyone
    /// but the servers this engine links to (a peer that connected to this engine's server
    /// could otherwise cut this engine's links to others).
    client_id: u64,
    pub(crate) name: String,
    pub(crate) options: Options,
    listener: Mutex<Option<TcpListener>>,
    pub(crate) regions: Mutex<RegionTable>,
    server: Mutex<Option<Server>>,
    /// The transports besides TCP, in preference order (`runtime::transports`).
    pub(crate) backends: Vec<Arc<dyn Backend>>,
    /// Remote engine name → the link that holds it (one usable link per peer).
    peers: Mutex<HashMap<String, PeerSlot>>,
    /// Links this engine opened, for metrics.
    links: Mutex<Vec<Weak<LinkShared>>>,
    pub(crate) notifies: Arc<NotifyQueue>,
    pub(crate) connects: Arc<ConnectPool>,
    pub(crate) me: Weak<EngineInner>,
    /// Whether the heartbeat thread runs.
    heartbeats: std::sync::atomic::AtomicBool,
    /// Open to links (`serve` succeeded, `stop` not called since): a region registered now is
    /// published at once (`runtime::handle::Engine::register_raw`).
    pub(crate) open: std::sync::atomic::AtomicBool,
    /// The engine's device (where CANN loads, or as the options ask).
    pub(crate) device: Option<Arc<Device>>,
    /// Why device memory is refused, for an engine without a device.
    pub(crate) no_device: &'static str,
    /// A fabric-memory engine's runtime.
    pub(crate) fabric: Option<Arc<transports::FabricRt>>,
    /// Quarantine counters, shared with every region of the engine.
    pub(crate) quarantine: Arc<crate::runtime::revoke::quarantine::Stats>,
    pub(crate) span: tracing::Span,
}

static NEXT_ENGINE: AtomicU64 = AtomicU64::new(1);

impl EngineInner {
    /// A new engine named `parsed` (listening when it has a port, or an ephemeral one), with
    /// the transports its options ask for.
    pub(crate) fn new(
        parsed: EngineName,
        options: Options,
        ephemeral: bool,
    ) -> Result<Arc<Self>, Error> {
        // before anything is bound or started: an engine without a random source cannot take
        // part in the protocol (instance ids, link tokens and nonces come only from it)
        let instance = random_u64()?;
        let client_id = random_u64()?;
        let port = match (parsed.port, ephemeral) {
            (Some(p), _) => Some(p),
            (None, true) => Some(0),
            (None, false) => None,
        };
        let (listener, name) = match port {
            Some(p) => {
                let addr = SocketAddr::new(parsed.ip, p);
                let l = TcpListener::bind(addr).map_err(|source| Error::Listen {
                    addr: addr.to_string(),
                    source,
                })?;
                #[cfg(test)]
                crate::io::tiny::listener(&l);
                let actual = l.local_addr().map_err(|source| Error::Listen {
                    addr: addr.to_string(),
                    source,
                })?;
                (Some(l), actual.to_string())
            }
            None => (None, parsed.to_string()),
        };
        let Transports {
            backends,
            device,
            no_device,
            fabric,
        } = transports::start(&options)?;
        let id = NEXT_ENGINE.fetch_add(1, Ordering::Relaxed);
        let span = tracing::debug_span!("hixl", engine = %name, id);
        tracing::debug!(parent: &span, server = listener.is_some(), "initialized");
        let notify_limits = options.notify_limits();
        // HIXL's `connect_pool.*` keys of `GlobalResourceConfig`
        let pool = options.ascend.global_resource_config.as_ref();
        let connects = Arc::new(ConnectPool::new(
            pool.and_then(|g| g.connect_pool_thread_num),
            pool.and_then(|g| g.connect_pool_task_queue_capacity),
        ));
        Ok(Arc::new_cyclic(|me| EngineInner {
            id,
            instance,
            client_id,
            name,
            options,
            listener: Mutex::new(listener),
            regions: Mutex::new(RegionTable::default()),
            server: Mutex::new(None),
            backends,
            peers: Mutex::new(HashMap::new()),
            links: Mutex::new(Vec::new()),
            notifies: Arc::new(NotifyQueue::new(notify_limits)),
            connects,
            me: me.clone(),
            heartbeats: std::sync::atomic::AtomicBool::new(false),
            open: std::sync::atomic::AtomicBool::new(false),
            device,
            no_device,
            fabric,
            quarantine: Default::default(),
            span,
        }))
    }

    /// Opens the engine to links (`activate`): its transports take its regions and, when it
    /// listens, it starts serving them. On failure nothing serves.
    pub(crate) fn serve(&self) -> std::io::Result<()> {
        let listener = lock(&self.listener);
        let cores = self.region_cores();
        let regions: Regions = cores.iter().map(|r| r.clone() as Arc<dyn Region>).collect();
        for b in &self.backends {
            b.activate(&regions, listener.is_some(), &self.span);
        }
        let started = match listener.as_ref() {
            None => Ok(None),
            Some(l) => l.try_clone().and_then(|l| {
                Server::start(
                    l,
                    Arc::new(ServeTable::new(cores)),
                    ServerConfig {
                        name: self.name.clone(),
                        instance: self.instance,
                        io_timeout: self.options.server_io_timeout,
                        limits: self.options.server_limits(),
                        notifies: self.notifies.clone(),
                        host: match self.options.same_host {
                            crate::options::SameHost::Forbid => None,
                            _ => crate::types::HostId::current(),
                        },
                        allow: self.options.allow_peers.clone(),
                        psk: self.options.psk.clone(),
                        keepalive: self.options.heartbeat,
                        backends: self.backends.clone(),
                        span: self.span.clone(),
                    },
                )
                .map(Some)
            }),
        };
        match started {
            Ok(server) => {
                *lock(&self.server) = server;
                self.open.store(true, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => {
                for b in &self.backends {
                    b.deactivate();
                }
                Err(e)
            }
        }
    }

    pub(crate) fn insert(
        &self,
        addr: usize,
        len: usize,
        mem_type: MemType,
        make: impl FnOnce(u32) -> RegionCore,
    ) -> Result<Arc<RegionCore>, Error> {
        if len == 0 {
            return Err(Error::ZeroLengthRegion);
        }
        if addr == 0 {
            return Err(Error::NullAddress);
        }
        let end = addr
            .checked_add(len)
            .ok_or(Error::AddressOverflow { addr, len })?;
        if mem_type != MemType::Host && self.device.is_none() {
            return Err(Error::UnsupportedMemory {
                mem_type,
                why: self.no_device,
            });
        }
        let mut regs = lock(&self.regions);
        if let Some((&a, r)) = regs.by_addr.range(..=addr).next_back() {
            if a == addr && r.len == len {
                return Err(Error::AlreadyRegistered {
                    addr,
                    len,
                    existing: r.id,
                });
            }
            if a + r.len > addr {
                return Err(Error::OverlappingRegion {
                    addr,
                    len,
                    existing: r.id,
                });
            }
        }
        if let Some((_, r)) = regs.by_addr.range(addr + 1..end).next() {
            return Err(Error::OverlappingRegion {
                addr,
                len,
                existing: r.id,
            });
        }
        if regs.by_addr.len() >= self.options.max_regions {
            return Err(Error::TooManyRegions {
                limit: self.options.max_regions,
            });
        }
        let id = regs.next_id;
        let next = id.checked_add(1).ok_or(Error::TooManyRegions {
            limit: u32::MAX as usize,
        })?;
        let mut registrations = Vec::new();
        for b in &self.backends {
            // SAFETY: the range is the memory being registered (owned by the engine from here,
            // or vouched for by `register_raw`'s caller); the registration is stored in the
            // region's core, which releases it before the memory; the engine never makes a
            // Rust reference to registered memory.
            if let Some(r) = unsafe { b.register(addr, len, mem_type) }? {
                registrations.push(r);
            }
        }
        regs.next_id = next;
        let mut core = make(id);
        core.device = self.device.clone();
        core.registrations = registrations;
        core.stats = self.quarantine.clone();
        let core = Arc::new(core);
        regs.by_addr.insert(addr, core.clone());
        regs.bytes += len;
        tracing::debug!(parent: &self.span, region = id, addr = format_args!("{addr:#x}"), len, "registered");
        Ok(core)
    }

    /// Serves a region registered while the engine is open to links (the compat engine; the
    /// typed API registers only before `activate`): its transports learn of it first, then the
    /// table peers get at connect has it.
    pub(crate) fn publish(&self, core: &Arc<RegionCore>) {
        let region: Arc<dyn Region> = core.clone();
        for b in &self.backends {
            b.region_added(&region);
        }
        let table = lock(&self.server).as_ref().map(|s| s.table());
        if let Some(t) = table {
            t.add(core.clone());
        }
    }

    /// Withdraws a region from an engine open to links (the compat engine's deregistration
    /// while linked), before it leaves the region table: peers' later TCP requests do not find
    /// it (`PARAM_INVALID`), requests being applied to it are waited for, and every transport
    /// that reached it lets go. When this returns, no peer touches caller-managed memory.
    ///
    /// Memory the engine owns and offers same-host peers one-sidedly ([`RegionCore::one_sided`])
    /// cannot be taken back from one link alone (a fence guards a link, not a region): the
    /// fences of every same-host link that may have the region in its table become the
    /// region's blockers, so its allocation is kept (quarantined when the record is dropped)
    /// until each of those links has ended and left its fence. Until then such a peer may
    /// still copy into or out of it.
    ///
    /// # Errors
    /// [`Error::UnsupportedMemory`] (`UNSUPPORTED`) when a transport gave peers one-sided access
    /// it cannot take back alone (UCX): nothing changed.
    pub(crate) fn withdraw(&self, core: &Arc<RegionCore>) -> Result<(), Error> {
        let refuse = |why: &'static str| Error::UnsupportedMemory {
            mem_type: core.mem_type,
            why,
        };
        for b in &self.backends {
            b.can_withdraw(core.id).map_err(refuse)?;
        }
        let server = lock(&self.server);
        // no server: none was started (no peer got a table), or one is being stopped, which
        // takes its fences out of reach here. The latter cannot overlap a withdrawal: the only
        // caller (the compat engine's deregistration) and the compat engine's stop both hold its
        // core's write lock, and a stopped server's fences already block the regions it served
        // (`stop`)
        if let Some(s) = server.as_ref() {
            s.table().remove(core.id);
            if core.one_sided() {
                // after the removal: a link whose handshake takes the table from now on does
                // not get the region; every one that got it listed its fence before
                lock(&core.blockers).extend(s.fences_reaching(core.id));
            }
        }
        drop(server);
        // requests being applied to it get `finalize_timeout`, as when serving stops; then
        // their lanes are cut (a client that never reads a READ's reply, or trickles a WRITE,
        // held this for its request's whole `server_io_timeout`), and waited for
        let grace = self.options.finalize_timeout;
        let inside = core.gate.close_within(grace);
        if !inside.is_empty() {
            tracing::warn!(
                region = core.id,
                requests = inside.len(),
                ?grace,
                "requests still applied to a withdrawn region after the grace: their lanes are cut"
            );
            // (the lanes inside now, under the gate's lock: one whose request left meanwhile
            // and went on to another region is not cut; locks: server, gate, conns)
            let server = lock(&self.server);
            if let Some(s) = server.as_ref() {
                core.gate.cut_inside(|lanes| s.cut(lanes));
            }
        }
        core.gate.close();
        for b in &self.backends {
            b.region_withdrawn(core.id);
        }
        Ok(())
    }

    /// What a new link of this engine takes from it.
    fn link_config(&self) -> LinkConfig<'_> {
        LinkConfig {
            engine_id: self.id,
            instance: self.instance,
            client_id: self.client_id,
            name: &self.name,
            options: &self.options,
            span: &self.span,
            backends: &self.backends,
        }
    }

    /// Takes the region out of the region table (if it is still there).
    pub(crate) fn unlist(&self, core: &Arc<RegionCore>) {
        let mut regs = lock(&self.regions);
        if regs
            .by_addr
            .get(&core.addr)
            .is_some_and(|r| Arc::ptr_eq(r, core))
        {
            regs.by_addr.remove(&core.addr);
            regs.bytes -= core.len;
        }
    }

    pub(crate) fn region_cores(&self) -> Vec<Arc<RegionCore>> {
        lock(&self.regions).by_addr.values().cloned().collect()
    }

    /// A link handle went away (or a held async link was closed): its peer's name is free again,
    /// unless a newer link already holds it.
    pub(crate) fn forget_link(&self, link: &LinkShared) {
        {
            let mut peers = lock(&self.peers);
            if let Some(PeerSlot::Linked(w)) = peers.get(&link.peer)
                && std::ptr::eq(w.as_ptr(), link)
            {
                peers.remove(&link.peer);
            }
        }
        lock(&self.links).retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), link));
    }

    /// Opens a link to `key` (reserving the name first: `ALREADY_CONNECTED` if a usable link or
    /// a connect holds it). A *broken* link does not hold its name: the new link supersedes it
    /// (link generations: the old handle stays broken, `NOT_CONNECTED`, and the new link has a
    /// larger [`Link::id`](crate::Link::id)).
    pub(crate) fn open_link(
        &self,
        key: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Arc<LinkShared>, Error> {
        // tells this connect's reservation apart from a later one's: unique, not secret
        static NEXT_TICKET: AtomicU64 = AtomicU64::new(1);
        let ticket = NEXT_TICKET.fetch_add(1, Ordering::Relaxed);
        {
            let mut peers = lock(&self.peers);
            match peers.get(key) {
                None => {}
                Some(PeerSlot::Linked(w)) => match w.upgrade() {
                    Some(old) if !old.is_broken() => {
                        return Err(Error::AlreadyConnected {
                            peer: key.to_owned(),
                        });
                    }
                    old => {
                        tracing::debug!(parent: &self.span, peer = key,
                            old_link = old.map(|o| o.id), "a new link supersedes a broken one");
                    }
                },
                Some(PeerSlot::Connecting(_)) => {
                    return Err(Error::AlreadyConnected {
                        peer: key.to_owned(),
                    });
                }
            }
            peers.insert(key.to_owned(), PeerSlot::Connecting(ticket));
        }
        let r = LinkShared::open(&self.link_config(), key.to_owned(), addr, timeout);
        let mut peers = lock(&self.peers);
        let ours = matches!(peers.get(key), Some(PeerSlot::Connecting(t)) if *t == ticket);
        match r {
            Ok(l) => {
                if ours {
                    peers.insert(key.to_owned(), PeerSlot::Linked(Arc::downgrade(&l)));
                }
                drop(peers);
                let mut links = lock(&self.links);
                links.retain(|w| w.strong_count() > 0);
                links.push(Arc::downgrade(&l));
                drop(links);
                // closed to links meanwhile (a `stop` or `finalize` on another thread, which
                // stores `open` before it takes `links`): either it took this link and closes
                // it, or this sees it closed; a link never outlives the engine's closing
                if !self.open.load(Ordering::SeqCst) {
                    l.close_quietly();
                    self.forget_link(&l);
                    return Err(Error::NotConnected {
                        peer: key.to_owned(),
                        why: "the engine was closed to links while this connect ran".into(),
                    });
                }
                self.start_heartbeats();
                Ok(l)
            }
            Err(e) => {
                if ours {
                    peers.remove(key);
                }
                Err(e)
            }
        }
    }

    /// Starts the engine's heartbeat (once): every interval, on the executor, a PING on each
    /// idle link.
    fn start_heartbeats(&self) {
        let Some(every) = self.options.heartbeat else {
            return;
        };
        if self.heartbeats.swap(true, Ordering::SeqCst) {
            return;
        }
        heartbeat_after(self.me.clone(), every);
    }

    /// Closes every link the async connect queue still holds.
    fn close_async_links(&self) {
        for link in self.connects.shutdown() {
            self.forget_link(&link);
        }
    }

    /// Closes every link of the engine, held or not: a `Link` that was `mem::forget`ten no
    /// longer borrows the engine, so leaving `Connected` must end it too.
    fn close_links(&self) {
        let links: Vec<Arc<LinkShared>> = std::mem::take(&mut *lock(&self.links))
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for l in &links {
            l.close_quietly();
        }
        lock(&self.peers).clear();
    }

    fn stop_server(&self) {
        let server = lock(&self.server).take();
        if let Some(s) = server {
            let regions = s.regions();
            let stuck = s.stop(self.options.finalize_timeout);
            if !stuck.is_empty() {
                // memory those clients can reach is quarantined when it is handed back or freed
                for r in regions.iter().filter(|r| r.one_sided()) {
                    lock(&r.blockers).extend(stuck.iter().cloned());
                }
            }
        }
        // after the TCP side: no new client sets a transport up; nothing of the regions stays
        // reachable through a transport before any region can be deregistered
        for b in &self.backends {
            b.deactivate();
        }
    }
}

impl EngineInner {
    /// Whether the engine listens (serves its regions to peers).
    pub(crate) fn is_listening(&self) -> bool {
        lock(&self.listener).is_some()
    }

    /// How many regions are registered, and how many bytes.
    pub(crate) fn region_totals(&self) -> (usize, usize) {
        let regs = lock(&self.regions);
        (regs.by_addr.len(), regs.bytes)
    }

    /// Why the engine's memory may not be deregistered now (a transport's rule: a fabric-memory
    /// engine with a peer connected), or `None`.
    pub(crate) fn deregistration_blocked(&self) -> Option<&'static str> {
        self.backends
            .iter()
            .find_map(|b| b.deregistration_blocked())
    }

    /// How many peers hold a link to this engine right now (links it serves).
    pub(crate) fn served_links(&self) -> usize {
        lock(&self.server).as_ref().map_or(0, |s| s.served_links())
    }

    /// A snapshot of the engine's metrics.
    pub(crate) fn metrics(&self) -> Metrics {
        let links = lock(&self.links)
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|l| !l.is_closed())
            .map(|l| l.counters.snapshot(l.id, &l.peer))
            .collect();
        let regs = lock(&self.regions);
        let q = &self.quarantine;
        Metrics {
            regions: regs.by_addr.len(),
            registered_bytes: regs.bytes,
            links,
            quarantined_regions: q.regions.load(Ordering::SeqCst),
            quarantined_bytes: q.bytes.load(Ordering::SeqCst),
            quarantines: q.total.load(Ordering::SeqCst),
        }
    }

    /// Leaves `Connected`: ends every link of the engine and stops serving.
    pub(crate) fn stop(&self) {
        self.open.store(false, Ordering::SeqCst);
        // (not waiting for a running async connect: it waits on its peer, by its own timeout;
        // the link it opens is refused now that the engine is closed, `open_link`)
        self.close_async_links();
        self.close_links();
        self.stop_server();
    }

    /// Finalizes: stops, closes the listening socket and empties the region table.
    pub(crate) fn finalize(&self) {
        self.stop();
        lock(&self.listener).take();
        let mut regs = lock(&self.regions);
        regs.by_addr.clear();
        regs.bytes = 0;
    }
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        self.close_async_links();
        self.close_links();
        self.stop_server();
    }
}

/// How many links the heartbeat pings at once: a silent peer's PING waits out its interval, so
/// links are pinged side by side, not one after another (k silent peers then break within about
/// one interval, not k of them), at most this many at a time.
const PINGERS: usize = 16;

/// The heartbeat of one engine: its pingers (a queue on the executor: the links to PING) and
/// the ids of the links a PING of is queued or out (skipped by the next round until it ends).
struct Heartbeat {
    every: Duration,
    pingers: Arc<crate::runtime::executor::Queue<Arc<LinkShared>>>,
    pinging: Mutex<std::collections::HashSet<u64>>,
}

/// Schedules the engine's first heartbeat round `every` from now: a round (a job on the
/// executor) hands each of the engine's links (but one still being pinged) to the pingers, which
/// PING them side by side, and schedules the next round an interval after it. The engine is
/// held only while its links are listed, so dropping it is never delayed long; once it is gone
/// the rounds stop.
fn heartbeat_after(me: Weak<EngineInner>, every: Duration) {
    let beat = Arc::new(Heartbeat {
        every,
        pingers: crate::runtime::executor::Queue::new(PINGERS),
        pinging: Mutex::new(std::collections::HashSet::new()),
    });
    next_round(me, beat);
}

fn next_round(me: Weak<EngineInner>, beat: Arc<Heartbeat>) {
    let at = crate::error::deadline_after(std::time::Instant::now(), beat.every);
    crate::runtime::executor::at(at, move || {
        let round = {
            let (me, beat) = (me.clone(), beat.clone());
            move || {
                let Some(engine) = me.upgrade() else { return };
                let links: Vec<Arc<LinkShared>> = lock(&engine.links)
                    .iter()
                    .filter_map(Weak::upgrade)
                    .collect();
                drop(engine);
                for l in links {
                    beat.ping(l);
                }
                next_round(me, beat);
            }
        };
        if me.strong_count() > 0 && crate::runtime::executor::spawn(round).is_err() {
            // no worker now: try again next interval
            next_round(me, beat);
        }
    });
}

impl Heartbeat {
    /// Hands `l` to the pingers, unless its last PING is still out.
    fn ping(self: &Arc<Self>, l: Arc<LinkShared>) {
        let id = l.id;
        if !lock(&self.pinging).insert(id) {
            return;
        }
        let handler = &mut || -> crate::runtime::executor::Handler<Arc<LinkShared>> {
            let beat = self.clone();
            Box::new(move |l: Arc<LinkShared>| {
                l.heartbeat(beat.every);
                lock(&beat.pinging).remove(&l.id);
            })
        };
        if self.pingers.push(l, handler).is_err() {
            // no worker now: the link is pinged next round
            lock(&self.pinging).remove(&id);
        }
    }
}

impl Opener for EngineInner {
    fn open_link(
        &self,
        key: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Arc<LinkShared>, Error> {
        EngineInner::open_link(self, key, addr, timeout)
    }

    fn forget_link(&self, link: &LinkShared) {
        EngineInner::forget_link(self, link);
    }
}
