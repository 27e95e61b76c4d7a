//! The engine and its type states.
//!
//! ```text
//! Hixl<Initialized> --register--> Hixl<Registered> --activate--> Hixl<Connected> --finalize--> Hixl<Finalized>
//!                                   ^  (register more)                 |  connect(&self) -> Link<'_>
//!                                   +-------------- deactivate --------+  (all links dropped first)
//! ```
//!
//! `Hixl<S>` is an `Arc` to the engine's resources plus a zero-sized state marker. Methods exist
//! only in the states where they are allowed, and transitions consume the engine, so misuse is a
//! compile error. Fallible transitions hand the engine back in its previous state
//! ([`TransitionError::into_engine`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::marker::PhantomData;
use std::net::{SocketAddr, TcpListener};
use std::sync::Weak;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::connect::{AsyncConnectStatus, ConnectPool};
use crate::context::{ContextToken, DetachedContext};
use crate::error::{Error, Refused, Status, check_timeout};
use crate::link::Link;
use crate::memory::Region;
use crate::metrics::Metrics;
use crate::notify::{Notify, NotifyQueue};
use crate::options::Options;
use crate::runtime::control::server::{ServeTable, Server, ServerConfig};
use crate::runtime::link::{LinkConfig, LinkShared};
use crate::runtime::region::RegionCore;
use crate::sync::lock;
use crate::transport::ascend::link::DeviceRegion;
use crate::types::engine_name::EngineName;
use crate::types::raw::{RawMemory, RegistrableMemory};
use crate::types::{Access, MemDesc, MemType, random_u64};

mod sealed {
    pub trait Sealed {}
    pub trait SealedReclaim {}
}

/// An engine state. Sealed: the four states below are all there are.
pub trait State: sealed::Sealed + fmt::Debug + Send + Sync + 'static {
    /// The state's name, for diagnostics.
    const NAME: &'static str;
}

/// Initialized: the name is parsed and, for a server, the port is bound. No memory yet.
#[derive(Debug)]
pub struct Initialized;
/// Registered: memory can be registered and deregistered; no link can exist, nothing is served.
#[derive(Debug)]
pub struct Registered;
/// Connected: registration is closed; the engine serves its regions (if it listens) and can
/// connect to remote engines.
#[derive(Debug)]
pub struct Connected;
/// Finalized: everything is torn down; regions can only be handed back.
#[derive(Debug)]
pub struct Finalized;

macro_rules! states {
    ($($s:ident),*) => {$(
        impl sealed::Sealed for $s {}
        impl State for $s { const NAME: &'static str = stringify!($s); }
    )*};
}
states!(Initialized, Registered, Connected, Finalized);

/// States that can be finalized (every state but `Finalized`).
pub trait Live: State {}
impl Live for Initialized {}
impl Live for Registered {}
impl Live for Connected {}

/// States in which no link exists and nothing is served, so regions can be handed back.
pub trait Quiescent: State {}
impl Quiescent for Registered {}
impl Quiescent for Finalized {}

/// A hixl engine in state `S`.
///
/// Created by [`Hixl::initialize`]. See the [crate docs](crate) for the lifecycle.
#[must_use = "dropping an engine tears it down; call `finalize()` to do it explicitly"]
pub struct Hixl<S: State> {
    inner: Arc<EngineInner>,
    _state: PhantomData<S>,
}

impl<S: State> fmt::Debug for Hixl<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hixl")
            .field("state", &S::NAME)
            .field("name", &self.inner.name)
            .field("id", &self.inner.id)
            .finish()
    }
}

#[derive(Default)]
struct Regions {
    by_addr: BTreeMap<usize, Arc<RegionCore>>,
    next_id: u32,
    bytes: usize,
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
    pub(crate) instance: u64,
    pub(crate) name: String,
    pub(crate) options: Options,
    listener: Mutex<Option<TcpListener>>,
    regions: Mutex<Regions>,
    server: Mutex<Option<Server>>,
    /// UCX, when the options ask for it and it loaded.
    pub(crate) ucx: Option<crate::transport::ucx::UcxEngine>,
    /// The UCX serving side (worker, progress thread, memory handles) while serving.
    ucx_server: Mutex<Option<crate::transport::ucx::UcxServer>>,
    /// This engine's regions mapped with UCX for its own links, while connected.
    pub(crate) ucx_local: Mutex<Option<Arc<crate::transport::ucx::UcxLocal>>>,
    /// Remote engine name → the link that holds it (one usable link per peer).
    peers: Mutex<HashMap<String, PeerSlot>>,
    /// Links this engine opened, for metrics.
    links: Mutex<Vec<Weak<LinkShared>>>,
    pub(crate) notifies: Arc<NotifyQueue>,
    pub(crate) connects: Arc<ConnectPool>,
    me: Weak<EngineInner>,
    /// Whether the heartbeat thread runs.
    heartbeats: std::sync::atomic::AtomicBool,
    /// The Ascend runtime, for engines initialized with Ascend options.
    pub(crate) ascend: Option<Arc<crate::transport::ascend::Runtime>>,
    /// Quarantine counters, shared with every region of the engine.
    quarantine: Arc<crate::quarantine::Stats>,
    pub(crate) span: tracing::Span,
}

static NEXT_ENGINE: AtomicU64 = AtomicU64::new(1);

impl EngineInner {
    fn insert(
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
        if mem_type != MemType::Host && self.ascend.is_none() {
            return Err(Error::UnsupportedMemory {
                mem_type,
                why: "device memory needs an engine initialized with Ascend options",
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
        let device = match &self.ascend {
            // SAFETY: the range is the memory being registered (owned by the engine from here,
            // or vouched for by `register_raw`'s caller); the registration is stored in the
            // region's core, which releases it before the memory.
            Some(rt) => Some(unsafe { rt.register(addr, len, mem_type) }?),
            None => None,
        };
        regs.next_id = next;
        let mut core = make(id);
        core.device = device;
        core.stats = self.quarantine.clone();
        let core = Arc::new(core);
        regs.by_addr.insert(addr, core.clone());
        regs.bytes += len;
        tracing::debug!(parent: &self.span, region = id, addr = format_args!("{addr:#x}"), len, "registered");
        Ok(core)
    }

    fn register_owned<M: RegistrableMemory>(
        &self,
        mem: M,
        access: Access,
        with_token: bool,
    ) -> Result<Region<M>, Refused<M>> {
        let raw: RawMemory = mem.into_raw_parts();
        let engine = self.id;
        if raw.mem_type() == MemType::Device && !with_token {
            return Err(Refused {
                error: Error::UnsupportedMemory {
                    mem_type: MemType::Device,
                    why: "device memory is registered with register_device and a context token",
                },
                // SAFETY: `raw` came from `into_raw_parts` just above and was not registered.
                value: unsafe { M::from_raw_parts(raw) },
            });
        }
        match self.insert(
            raw.ptr().as_ptr() as usize,
            raw.len(),
            raw.mem_type(),
            |id| RegionCore::new_owned::<M>(id, engine, raw, access),
        ) {
            Ok(core) => Ok(Region {
                core,
                _mem: PhantomData,
            }),
            Err(error) => Err(Refused {
                error,
                // SAFETY: `raw` came from `into_raw_parts` just above and was not registered.
                value: unsafe { M::from_raw_parts(raw) },
            }),
        }
    }

    fn register_raw(
        &self,
        desc: MemDesc,
        mem_type: MemType,
        access: Access,
    ) -> Result<Region<MemDesc>, Error> {
        let engine = self.id;
        let core = self.insert(desc.addr, desc.len, mem_type, |id| {
            RegionCore::new_raw(id, engine, desc, mem_type, access)
        })?;
        Ok(Region {
            core,
            _mem: PhantomData,
        })
    }

    fn deregister<M: Reclaim>(&self, region: Region<M>) -> Result<M, Refused<Region<M>>> {
        if region.core.engine != self.id {
            return Err(Refused {
                error: Error::ForeignHandle {
                    what: "region",
                    owner: region.core.engine,
                    engine: self.id,
                },
                value: region,
            });
        }
        let mut regs = lock(&self.regions);
        let listed = regs
            .by_addr
            .get(&region.core.addr)
            .is_some_and(|r| Arc::ptr_eq(r, &region.core));
        if listed {
            regs.by_addr.remove(&region.core.addr);
            regs.bytes -= region.core.len;
        }
        let (error, core) = match Arc::try_unwrap(region.core) {
            Ok(mut core) => {
                let desc = MemDesc {
                    addr: core.addr,
                    len: core.len,
                };
                match core.take_raw() {
                    Ok(raw) => {
                        tracing::debug!(parent: &self.span, region = core.id, "deregistered");
                        // SAFETY: `Region<M>` is only created by `register_owned::<M>` (with the
                        // parts of `M::into_raw_parts`, or a HostBuffer copy of them for a
                        // HostBuffer) or, for `M = MemDesc`, by `register_raw`; this is the last
                        // reference to the core, and `take_raw` hands the parts out once.
                        return Ok(unsafe { M::reclaim(raw, desc) });
                    }
                    Err(error) => (error, Arc::new(core)),
                }
            }
            Err(core) => (Error::RegionBusy { region: core.id }, core),
        };
        // not handed back: the region stays registered, and comes back to the caller
        if listed {
            regs.bytes += core.len;
            regs.by_addr.insert(core.addr, core.clone());
        }
        Err(Refused {
            error,
            value: Region {
                core,
                _mem: PhantomData,
            },
        })
    }

    /// Every registered region (a link's device data path binds them all).
    /// What a new link of this engine takes from it.
    fn link_config(&self) -> LinkConfig<'_> {
        LinkConfig {
            engine_id: self.id,
            instance: self.instance,
            name: &self.name,
            options: &self.options,
            span: &self.span,
            ucx: self
                .ucx
                .as_ref()
                .map(|u| (u, lock(&self.ucx_local).clone())),
            ascend: self.ascend.as_ref().map(|rt| {
                let regions = self.region_cores().into_iter();
                (rt, regions.map(|r| r as Arc<dyn DeviceRegion>).collect())
            }),
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
        let ticket = crate::types::random_u64();
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

    /// Starts the engine's heartbeat thread (once), which pings idle links every interval.
    fn start_heartbeats(&self) {
        let Some(every) = self.options.heartbeat else {
            return;
        };
        if self.heartbeats.swap(true, Ordering::SeqCst) {
            return;
        }
        let me = self.me.clone();
        let spawned = std::thread::Builder::new()
            .name("hixl-heartbeat".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(every);
                    // hold the engine only while pinging, so dropping it is never delayed long
                    let Some(engine) = me.upgrade() else { return };
                    let links: Vec<Arc<LinkShared>> = lock(&engine.links)
                        .iter()
                        .filter_map(Weak::upgrade)
                        .collect();
                    drop(engine);
                    for l in links {
                        l.heartbeat(every);
                    }
                }
            });
        if spawned.is_err() {
            self.heartbeats.store(false, Ordering::SeqCst);
        }
    }

    /// Closes every link the async connect queue still holds.
    fn close_async_links(&self, join: bool) {
        for link in self.connects.shutdown(join) {
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
            let regions = s.regions().to_vec();
            let stuck = s.stop(self.options.finalize_timeout);
            if !stuck.is_empty() {
                // memory those clients can reach is quarantined when it is handed back or freed
                for r in regions.iter().filter(|r| r.one_sided()) {
                    lock(&r.blockers).extend(stuck.iter().cloned());
                }
            }
        }
        // after the TCP side: no new client gets keys; the memory handles are unmapped before
        // any region can be deregistered
        drop(lock(&self.ucx_server).take());
        drop(lock(&self.ucx_local).take());
    }
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        self.close_async_links(false);
        self.close_links();
        self.stop_server();
    }
}

/// What deregistration hands back for a region of type `Region<M>`. Sealed.
pub trait Reclaim: sealed::SealedReclaim + Sized {
    #[doc(hidden)]
    /// Rebuilds the value from what the region held: its owned memory (for owned registrations,
    /// handed out once) and its address range.
    ///
    /// # Safety
    /// `raw` must be what `into_raw_parts` of `Self` returned when the region was registered.
    unsafe fn reclaim(raw: Option<RawMemory>, desc: MemDesc) -> Self;
}

impl<M: RegistrableMemory> sealed::SealedReclaim for M {}
impl<M: RegistrableMemory> Reclaim for M {
    unsafe fn reclaim(raw: Option<RawMemory>, _desc: MemDesc) -> Self {
        let raw = raw.expect("a Region<M> of owned memory holds its memory until reclaimed");
        // SAFETY: the caller passes the parts `M::into_raw_parts` produced at registration.
        unsafe { M::from_raw_parts(raw) }
    }
}

impl sealed::SealedReclaim for MemDesc {}
impl Reclaim for MemDesc {
    unsafe fn reclaim(_raw: Option<RawMemory>, desc: MemDesc) -> Self {
        desc
    }
}

/// A failed transition: the error, the engine in its previous state, and whatever else the call
/// consumed (the memory of a failed first registration).
pub struct TransitionError<S: State, M = ()> {
    /// Why the transition failed.
    pub error: Error,
    engine: Hixl<S>,
    value: M,
}

impl<S: State, M> TransitionError<S, M> {
    /// The engine, back in its previous state.
    pub fn into_engine(self) -> Hixl<S> {
        self.engine
    }
    /// The error, the engine and the consumed value.
    pub fn into_parts(self) -> (Error, Hixl<S>, M) {
        (self.error, self.engine, self.value)
    }
    /// HIXL's status code for the failure.
    pub fn status(&self) -> Status {
        self.error.status()
    }
}

impl<S: State, M> fmt::Debug for TransitionError<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransitionError")
            .field("error", &self.error)
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl<S: State, M> fmt::Display for TransitionError<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "transition failed; engine returned in state {}: {}",
            S::NAME,
            self.error
        )
    }
}

impl<S: State, M> std::error::Error for TransitionError<S, M> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<S: State, M> From<TransitionError<S, M>> for Error {
    fn from(e: TransitionError<S, M>) -> Self {
        e.error
    }
}

impl<S: State> Hixl<S> {
    fn into_state<T: State>(self) -> Hixl<T> {
        tracing::debug!(parent: &self.inner.span, from = S::NAME, to = T::NAME, "transition");
        Hixl {
            inner: self.inner,
            _state: PhantomData,
        }
    }

    /// The engine name (for an engine listening on an ephemeral port, with the port it got).
    pub fn name(&self) -> &str {
        &self.inner.name
    }
    /// The engine's id, unique in this process (regions and links carry it).
    pub fn id(&self) -> u64 {
        self.inner.id
    }
    /// The per-process instance id peers see (random; changes when the process restarts).
    pub fn instance(&self) -> u64 {
        self.inner.instance
    }
    /// Whether the engine listens (serves its regions to peers).
    pub fn is_server(&self) -> bool {
        lock(&self.inner.listener).is_some()
    }
    /// The number of registered regions.
    pub fn region_count(&self) -> usize {
        lock(&self.inner.regions).by_addr.len()
    }
    /// The number of registered bytes.
    pub fn registered_bytes(&self) -> usize {
        lock(&self.inner.regions).bytes
    }
    /// The options the engine was initialized with.
    pub fn options(&self) -> &Options {
        &self.inner.options
    }

    /// A snapshot of the engine's metrics: registered regions and bytes, and per link and
    /// operation the bytes, operations, errors by status, requests in flight and latency
    /// percentiles.
    pub fn metrics(&self) -> Metrics {
        let links = lock(&self.inner.links)
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|l| !l.is_closed())
            .map(|l| l.counters.snapshot(l.id, &l.peer))
            .collect();
        let regs = lock(&self.inner.regions);
        let q = &self.inner.quarantine;
        Metrics {
            regions: regs.by_addr.len(),
            registered_bytes: regs.bytes,
            links,
            quarantined_regions: q.regions.load(Ordering::SeqCst),
            quarantined_bytes: q.bytes.load(Ordering::SeqCst),
            quarantines: q.total.load(Ordering::SeqCst),
        }
    }

    /// Takes every notification received from peers so far, oldest first (HIXL `GetNotifies`).
    pub fn get_notifies(&self) -> Vec<Notify> {
        self.inner.notifies.drain()
    }

    /// Binds the engine's device context on this thread and runs `f` with a token proving it.
    ///
    /// # Errors
    /// Binding a device context can fail on device backends; host engines always succeed.
    pub fn with_context<R>(&self, f: impl FnOnce(&ContextToken<'_>) -> R) -> Result<R, Error> {
        crate::context::bind(self.inner.id, self.inner.ascend.as_deref(), f)
    }

    /// The engine's context, detached so it can be carried to another thread and bound there.
    pub fn detach_context(&self) -> DetachedContext {
        DetachedContext::new(self.inner.id, self.inner.ascend.clone())
    }

    /// Whether the engine has an Ascend runtime (it was initialized with Ascend options).
    pub fn has_ascend(&self) -> bool {
        self.inner.ascend.is_some()
    }

    /// Allocates `len` bytes of device memory (`aclrtMalloc`, `ACL_MEM_MALLOC_HUGE_ONLY`) on
    /// the engine's device.
    ///
    /// # Errors
    /// [`Error::UnsupportedMemory`] on an engine without an Ascend runtime;
    /// [`Error::ForeignHandle`] for a token of another engine; [`Error::ZeroLengthRegion`];
    /// [`Error::Native`] from ACL (e.g. `ACL_ERROR_RT_MEMORY_ALLOCATION`, or
    /// `ACL_ERROR_MEMORY_ADDRESS_UNALIGNED` for a misaligned huge-page allocation).
    pub fn alloc_device(
        &self,
        ctx: &ContextToken<'_>,
        len: usize,
    ) -> Result<crate::DeviceBuffer, Error> {
        let rt = self.runtime()?;
        crate::DeviceBuffer::alloc(rt, self.inner.id, ctx, len)
    }

    /// Allocates `len` zeroed bytes of pinned host memory (`aclrtMallocHost`).
    ///
    /// # Errors
    /// As [`Hixl::alloc_device`].
    pub fn alloc_pinned_host(
        &self,
        ctx: &ContextToken<'_>,
        len: usize,
    ) -> Result<crate::PinnedHostBuffer, Error> {
        let rt = self.runtime()?;
        crate::PinnedHostBuffer::alloc(rt, self.inner.id, ctx, len)
    }

    fn runtime(&self) -> Result<&crate::transport::ascend::Runtime, Error> {
        self.inner
            .ascend
            .as_deref()
            .ok_or(Error::UnsupportedMemory {
                mem_type: MemType::Device,
                why: "device memory needs an engine initialized with Ascend options",
            })
    }
}

impl Hixl<Initialized> {
    /// Creates an engine (HIXL `Initialize`) named `"ip"`, `"ip:port"`, `"[ipv6]"` or
    /// `"[ipv6]:port"`. With a port > 0 the engine listens on that address (only that address)
    /// and serves its regions once connected; without one it is a client only.
    ///
    /// # Errors
    /// [`Error::InvalidEngineName`] (`PARAM_INVALID`) for a bad name; [`Error::Listen`]
    /// (`FAILED`) when the port cannot be bound.
    pub fn initialize(name: &str, options: Options) -> Result<Self, Error> {
        Self::initialize_with(name, options, false)
    }

    /// Like [`Hixl::initialize`], but a name without a port (or with port 0) listens on a port
    /// the OS chooses; [`Hixl::name`] then reports it. Useful for tests and examples.
    ///
    /// # Errors
    /// As [`Hixl::initialize`].
    pub fn initialize_ephemeral(name: &str, options: Options) -> Result<Self, Error> {
        Self::initialize_with(name, options, true)
    }

    fn initialize_with(name: &str, options: Options, ephemeral: bool) -> Result<Self, Error> {
        let parsed = EngineName::parse(name)?;
        check_timeout(options.connect_timeout)?;
        if options.auto_connect {
            return Err(Error::UnsupportedOption {
                key: "AutoConnect".into(),
                value: "1".into(),
                why: "links are explicit capabilities in the typed API; hixl::compat::Hixl honours AutoConnect",
            });
        }
        if options.psk.as_ref().is_some_and(|k| k.len() < 16) {
            return Err(Error::InvalidOption {
                key: "psk".into(),
                value: "<redacted>".into(),
                problem: "a pre-shared key needs at least 16 bytes",
            });
        }
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
                let actual = l.local_addr().map_err(|source| Error::Listen {
                    addr: addr.to_string(),
                    source,
                })?;
                (Some(l), actual.to_string())
            }
            None => (None, parsed.to_string()),
        };
        let ucx = match options.ucx {
            crate::options::Ucx::Off => None,
            policy => {
                if options.psk.is_none() {
                    return Err(Error::InvalidOption {
                        key: "hixl.Ucx".into(),
                        value: format!("{policy:?}").to_lowercase(),
                        problem: "UCX needs Options::psk: its remote keys give access UCX does not bound-check, so only authenticated peers may get them",
                    });
                }
                match crate::transport::ucx::UcxEngine::new() {
                    Ok(u) => Some(u),
                    Err(e) if policy == crate::options::Ucx::Require => return Err(e),
                    Err(e) => {
                        tracing::debug!(error = %e, "UCX unavailable; links use tcp or same-host");
                        None
                    }
                }
            }
        };
        let ascend = if options.ascend_enabled {
            Some(crate::transport::ascend::Runtime::start(&options.ascend)?)
        } else {
            None
        };
        let id = NEXT_ENGINE.fetch_add(1, Ordering::Relaxed);
        let span = tracing::debug_span!("hixl", engine = %name, id);
        tracing::debug!(parent: &span, server = listener.is_some(), "initialized");
        let notify_limits = options.notify_limits();
        Ok(Hixl {
            inner: Arc::new_cyclic(|me| EngineInner {
                id,
                instance: random_u64(),
                name,
                options,
                listener: Mutex::new(listener),
                regions: Mutex::new(Regions::default()),
                server: Mutex::new(None),
                ucx,
                ucx_server: Mutex::new(None),
                ucx_local: Mutex::new(None),
                peers: Mutex::new(HashMap::new()),
                links: Mutex::new(Vec::new()),
                notifies: Arc::new(NotifyQueue::new(notify_limits)),
                connects: Arc::new(ConnectPool::default()),
                me: me.clone(),
                heartbeats: std::sync::atomic::AtomicBool::new(false),
                ascend,
                quarantine: Default::default(),
                span,
            }),
            _state: PhantomData,
        })
    }

    /// Registers the first region (HIXL `RegisterMem`) with read-write access for peers; the
    /// engine moves to `Registered`.
    ///
    /// # Errors
    /// As [`Hixl::<Registered>::register`]; the engine and the memory come back in the error.
    #[allow(clippy::type_complexity)]
    pub fn register<M: RegistrableMemory>(
        self,
        mem: M,
    ) -> Result<(Hixl<Registered>, Region<M>), TransitionError<Initialized, M>> {
        self.register_with(mem, Access::ReadWrite)
    }

    /// Registers the first region with the given remote access rights.
    ///
    /// # Errors
    /// As [`Hixl::<Registered>::register`]; the engine and the memory come back in the error.
    #[allow(clippy::type_complexity)]
    pub fn register_with<M: RegistrableMemory>(
        self,
        mem: M,
        access: Access,
    ) -> Result<(Hixl<Registered>, Region<M>), TransitionError<Initialized, M>> {
        match self.inner.register_owned(mem, access, false) {
            Ok(r) => Ok((self.into_state(), r)),
            Err(Refused { error, value }) => Err(TransitionError {
                error,
                engine: self,
                value,
            }),
        }
    }

    /// Registers caller-managed memory as the first region (HIXL's `MemDesc` form).
    ///
    /// # Safety
    /// As [`Hixl::<Registered>::register_raw`].
    ///
    /// # Errors
    /// As [`Hixl::<Registered>::register_raw`]; the engine comes back in the error.
    pub unsafe fn register_raw(
        self,
        desc: MemDesc,
        mem_type: MemType,
    ) -> Result<(Hixl<Registered>, Region<MemDesc>), TransitionError<Initialized>> {
        match self.inner.register_raw(desc, mem_type, Access::ReadWrite) {
            Ok(r) => Ok((self.into_state(), r)),
            Err(error) => Err(TransitionError {
                error,
                engine: self,
                value: (),
            }),
        }
    }

    /// Moves to `Registered` without registering anything (a client that only needs to be
    /// connected, or code that registers in a loop).
    pub fn into_registered(self) -> Hixl<Registered> {
        self.into_state()
    }
}

impl Hixl<Registered> {
    /// Registers memory the engine takes ownership of (HIXL `RegisterMem`), with read-write
    /// access for peers. Deregistering hands it back.
    ///
    /// # Errors
    /// The memory comes back in the [`Refused`] error. `PARAM_INVALID`:
    /// [`Error::ZeroLengthRegion`], [`Error::AlreadyRegistered`], [`Error::OverlappingRegion`];
    /// `RESOURCE_EXHAUSTED`: [`Error::TooManyRegions`]; `UNSUPPORTED`: [`Error::UnsupportedMemory`]
    /// for device memory.
    pub fn register<M: RegistrableMemory>(&self, mem: M) -> Result<Region<M>, Refused<M>> {
        self.inner.register_owned(mem, Access::ReadWrite, false)
    }

    /// Registers memory with the given remote access rights.
    ///
    /// # Errors
    /// As [`Hixl::<Registered>::register`].
    pub fn register_with<M: RegistrableMemory>(
        &self,
        mem: M,
        access: Access,
    ) -> Result<Region<M>, Refused<M>> {
        self.inner.register_owned(mem, access, false)
    }

    /// Registers caller-managed memory (HIXL's `RegisterMem(MemDesc, MemType)` form).
    ///
    /// # Safety
    /// Until the returned region is deregistered (or, if it is dropped instead, until the
    /// engine is finalized or dropped):
    /// - `desc.addr..desc.addr + desc.len` must stay allocated, mapped and valid for reads and
    ///   writes of any byte values;
    /// - nothing else may access it in a way that conflicts with transfers: peers READ it and
    ///   WRITE it at any time while the engine is `Connected`, and local READ transfers write it.
    ///
    /// # Errors
    /// `PARAM_INVALID`: [`Error::ZeroLengthRegion`], [`Error::NullAddress`],
    /// [`Error::AddressOverflow`], [`Error::AlreadyRegistered`], [`Error::OverlappingRegion`];
    /// `RESOURCE_EXHAUSTED`: [`Error::TooManyRegions`]; `UNSUPPORTED`:
    /// [`Error::UnsupportedMemory`] for [`MemType::Device`].
    pub unsafe fn register_raw(
        &self,
        desc: MemDesc,
        mem_type: MemType,
    ) -> Result<Region<MemDesc>, Error> {
        self.inner.register_raw(desc, mem_type, Access::ReadWrite)
    }

    /// [`register_raw`](Hixl::<Registered>::register_raw) with explicit access rights.
    ///
    /// # Safety
    /// As [`Hixl::<Registered>::register_raw`].
    ///
    /// # Errors
    /// As [`Hixl::<Registered>::register_raw`].
    pub unsafe fn register_raw_with(
        &self,
        desc: MemDesc,
        mem_type: MemType,
        access: Access,
    ) -> Result<Region<MemDesc>, Error> {
        self.inner.register_raw(desc, mem_type, access)
    }

    /// Registers memory (device memory included) with a token proving the engine's device
    /// context is bound on this thread, as HIXL requires for device registrations
    /// (`HcclRegisterGlobalMem` runs under it).
    ///
    /// # Errors
    /// [`Error::ForeignHandle`] for a token of another engine; [`Error::UnsupportedMemory`]
    /// (`UNSUPPORTED`) on an engine without an Ascend runtime; the errors of
    /// [`Hixl::<Registered>::register`]; [`Error::Native`] from HCCL. The memory comes back.
    pub fn register_device<M: RegistrableMemory>(
        &self,
        ctx: &ContextToken<'_>,
        mem: M,
    ) -> Result<Region<M>, Refused<M>> {
        if ctx.engine_id() != self.inner.id {
            return Err(Refused {
                error: Error::ForeignHandle {
                    what: "context token",
                    owner: ctx.engine_id(),
                    engine: self.inner.id,
                },
                value: mem,
            });
        }
        if self.inner.ascend.is_none() {
            return Err(Refused {
                error: Error::UnsupportedMemory {
                    mem_type: MemType::Device,
                    why: "device memory needs an engine initialized with Ascend options",
                },
                value: mem,
            });
        }
        self.inner.register_owned(mem, Access::ReadWrite, true)
    }

    /// Closes registration and opens the engine to links: a listening engine starts serving its
    /// regions (their table is frozen and sent to each client at connect), and
    /// [`Hixl::connect`] becomes available.
    ///
    /// # Errors
    /// [`Error::Listen`] (`FAILED`) if serving threads cannot be started; the engine comes back
    /// in `Registered`.
    pub fn activate(self) -> Result<Hixl<Connected>, TransitionError<Registered>> {
        if let Some(u) = &self.inner.ucx {
            // this engine's own regions, mapped for zero-copy PUT/GET on its UCX links (a
            // failure only costs speed: UCX then copies through its own buffers)
            let regions = self.inner.region_cores();
            match crate::transport::ucx::UcxLocal::map(u, &views(&regions)) {
                Ok(l) => *lock(&self.inner.ucx_local) = Some(Arc::new(l)),
                Err(e) => tracing::warn!(parent: &self.inner.span, error = %e,
                    "cannot map the regions with UCX; UCX transfers will copy"),
            }
        }
        let started = {
            let listener = lock(&self.inner.listener);
            match listener.as_ref() {
                None => Ok(None),
                Some(l) => {
                    let regions: Vec<_> = lock(&self.inner.regions)
                        .by_addr
                        .values()
                        .cloned()
                        .collect();
                    let ucx = match &self.inner.ucx {
                        Some(u) => {
                            match crate::transport::ucx::UcxServer::start(u, &views(&regions)) {
                                Ok(srv) => {
                                    let frame = srv.frame().to_vec();
                                    *lock(&self.inner.ucx_server) = Some(srv);
                                    Some(frame)
                                }
                                Err(e) => {
                                    tracing::warn!(parent: &self.inner.span, error = %e,
                                    "cannot serve over UCX; serving over tcp only");
                                    None
                                }
                            }
                        }
                        None => None,
                    };
                    l.try_clone().and_then(|l| {
                        Server::start(
                            l,
                            ServeTable::new(regions),
                            ServerConfig {
                                name: self.inner.name.clone(),
                                instance: self.inner.instance,
                                io_timeout: self.inner.options.server_io_timeout,
                                limits: self.inner.options.server_limits(),
                                notifies: self.inner.notifies.clone(),
                                host: match self.inner.options.same_host {
                                    crate::options::SameHost::Forbid => None,
                                    _ => crate::types::HostId::current(),
                                },
                                allow: self.inner.options.allow_peers.clone(),
                                psk: self.inner.options.psk.clone(),
                                keepalive: self.inner.options.heartbeat,
                                ucx,
                                device: self.inner.ascend.clone(),
                                span: self.inner.span.clone(),
                            },
                        )
                        .map(Some)
                    })
                }
            }
        };
        match started {
            Ok(server) => {
                *lock(&self.inner.server) = server;
                Ok(self.into_state())
            }
            Err(source) => {
                drop(lock(&self.inner.ucx_server).take());
                drop(lock(&self.inner.ucx_local).take());
                Err(TransitionError {
                    error: Error::Listen {
                        addr: self.inner.name.clone(),
                        source,
                    },
                    engine: self,
                    value: (),
                })
            }
        }
    }
}

impl<S: Quiescent> Hixl<S> {
    /// Deregisters a region (HIXL `DeregisterMem`) and hands back its memory. Only possible
    /// where no link exists and nothing is served, so no transfer can touch it any more.
    ///
    /// # Errors
    /// The region comes back in the [`Refused`] error: [`Error::ForeignHandle`] for a region of
    /// another engine.
    pub fn deregister<M: Reclaim>(&self, region: Region<M>) -> Result<M, Refused<Region<M>>> {
        self.inner.deregister(region)
    }
}

impl Hixl<Connected> {
    /// Connects to a listening remote engine with the configured timeout (1000 ms by default),
    /// HIXL `Connect`. The link borrows the engine.
    ///
    /// # Errors
    /// As [`Hixl::connect_timeout`].
    pub fn connect(&self, remote: &str) -> Result<Link<'_>, Error> {
        self.connect_timeout(remote, self.inner.options.connect_timeout)
    }

    /// Connects to a listening remote engine; the peer sends its region table.
    ///
    /// # Errors
    /// - `PARAM_INVALID`: [`Error::InvalidTimeout`] (zero), [`Error::InvalidEngineName`],
    ///   [`Error::NotConnectable`] (no port, or this engine itself);
    /// - `ALREADY_CONNECTED`: [`Error::AlreadyConnected`];
    /// - `TIMEOUT`: [`Error::Timeout`] when the peer does not answer in time;
    /// - `FAILED`: [`Error::ConnectFailed`] (refused, unreachable; with the cause),
    ///   [`Error::Protocol`]; or the peer's status in [`Error::Refused`].
    pub fn connect_timeout(&self, remote: &str, timeout: Duration) -> Result<Link<'_>, Error> {
        let timeout = check_timeout(timeout)?;
        let (key, addr) = self.remote_key(remote)?;
        let shared = self.inner.open_link(&key, addr, timeout)?;
        Ok(Link::from_shared(&self.inner, shared))
    }

    /// Starts connecting in the background (HIXL `ConnectAsync`): queued (at most 128 tasks per
    /// engine), run by a pool of two threads, in order for each remote. Poll with
    /// [`Hixl::async_connect_status`]; get the link with [`Hixl::take_link`].
    ///
    /// # Errors
    /// The parameter errors of [`Hixl::connect_timeout`] at once; [`Error::QueueFull`]
    /// (`RESOURCE_EXHAUSTED`) when the queue is full. Connect errors are reported by `take_link`.
    pub fn connect_async(&self, remote: &str, timeout: Duration) -> Result<(), Error> {
        let timeout = check_timeout(timeout)?;
        let (key, addr) = self.remote_key(remote)?;
        self.inner
            .connects
            .connect(&self.inner.me, &key, addr, timeout)
    }

    /// Queues a disconnect of an async connection not yet taken (HIXL `DisconnectAsync`).
    ///
    /// # Errors
    /// [`Error::NotConnected`] if there is no such connection (or it was taken: disconnect the
    /// [`Link`] itself); [`Error::QueueFull`] when the queue is full.
    pub fn disconnect_async(&self, remote: &str, timeout: Duration) -> Result<(), Error> {
        let timeout = check_timeout(timeout)?;
        let (key, _) = self.remote_key(remote)?;
        self.inner
            .connects
            .disconnect(&self.inner.me, &key, timeout)
    }

    /// The status of the async connection to `remote` (HIXL `GetAsyncConnectStatus`).
    pub fn async_connect_status(&self, remote: &str) -> AsyncConnectStatus {
        match self.remote_key(remote) {
            Ok((key, _)) => self.inner.connects.status(&key),
            Err(_) => AsyncConnectStatus::NotConnect,
        }
    }

    /// The status of every async connection.
    pub fn async_connect_statuses(&self) -> BTreeMap<String, AsyncConnectStatus> {
        self.inner.connects.all()
    }

    /// Hands over the link of a finished async connect, or returns its error. After this the
    /// link is an ordinary [`Link`] and the async status of `remote` is `NotConnect`.
    ///
    /// # Errors
    /// The connect's own error (in [`Error::Shared`]); [`Error::NotConnected`] if it is still
    /// pending or there is none.
    pub fn take_link(&self, remote: &str) -> Result<Link<'_>, Error> {
        let (key, _) = self.remote_key(remote)?;
        let shared = self.inner.connects.take(&key)?;
        Ok(Link::from_shared(&self.inner, shared))
    }

    /// [`Hixl::connect_timeout`] for the [`crate::compat`] engine: the link holds the engine
    /// by `Arc` instead of borrowing it, so it can be kept in a table by remote name. The
    /// compat engine closes such links itself before it leaves `Connected`.
    pub(crate) fn connect_owned(
        &self,
        remote: &str,
        timeout: Duration,
    ) -> Result<Link<'static>, Error> {
        let timeout = check_timeout(timeout)?;
        let (key, addr) = self.remote_key(remote)?;
        let shared = self.inner.open_link(&key, addr, timeout)?;
        Ok(Link::owning(self.inner.clone(), shared))
    }

    /// [`Hixl::take_link`] for the [`crate::compat`] engine (an owning link).
    pub(crate) fn take_link_owned(&self, remote: &str) -> Result<Link<'static>, Error> {
        let (key, _) = self.remote_key(remote)?;
        let shared = self.inner.connects.take(&key)?;
        Ok(Link::owning(self.inner.clone(), shared))
    }

    /// How many peers hold a link to this engine right now (links it serves).
    pub(crate) fn served_links(&self) -> usize {
        lock(&self.inner.server)
            .as_ref()
            .map_or(0, |s| s.served_links())
    }

    /// The key a remote name is known by (its socket address), as links and the async connect
    /// queue use it.
    pub(crate) fn remote_key(&self, remote: &str) -> Result<(String, SocketAddr), Error> {
        let parsed = EngineName::parse(remote)?;
        let Some(addr) = parsed.socket_addr() else {
            return Err(Error::NotConnectable {
                peer: remote.to_owned(),
                problem: "the name has no port, so that engine does not listen",
            });
        };
        let key = addr.to_string();
        if key == self.inner.name {
            return Err(Error::NotConnectable {
                peer: remote.to_owned(),
                problem: "an engine cannot connect to itself",
            });
        }
        Ok((key, addr))
    }

    /// Stops serving and returns to `Registered`, where memory can be (de)registered. Every link
    /// of this engine must be gone (the borrow checker makes sure). Requests being served get up
    /// to the `finalize_timeout` option to finish; then every incoming connection is closed.
    pub fn deactivate(self) -> Hixl<Registered> {
        self.inner.close_async_links(true);
        self.inner.close_links();
        self.inner.stop_server();
        self.into_state()
    }
}

impl<S: Live> Hixl<S> {
    /// Tears the engine down (HIXL `Finalize`): serving stops (requests in flight get up to the
    /// `finalize_timeout` option to finish), the listening socket closes, and the region table is
    /// released. Regions still held can be handed back with [`Hixl::deregister`] on the
    /// finalized engine; dropped ones are freed.
    pub fn finalize(self) -> Hixl<Finalized> {
        self.inner.close_async_links(true);
        self.inner.close_links();
        self.inner.stop_server();
        lock(&self.inner.listener).take();
        {
            let mut regs = lock(&self.inner.regions);
            regs.by_addr.clear();
            regs.bytes = 0;
        }
        self.into_state()
    }
}

static_assertions::assert_eq_size!(Hixl<Initialized>, Hixl<Connected>);
static_assertions::assert_eq_size!(Hixl<Registered>, Arc<()>);
static_assertions::assert_eq_size!(Hixl<Finalized>, Hixl<Registered>);
static_assertions::assert_impl_all!(Hixl<Connected>: Send, Sync);
static_assertions::assert_impl_all!(Hixl<Registered>: Send, Sync);
static_assertions::assert_impl_all!(Link<'static>: Send, Sync);
static_assertions::assert_impl_all!(Region<crate::HostBuffer>: Send, Sync);
static_assertions::assert_impl_all!(TransitionError<Registered>: std::error::Error, Send, Sync);

/// What the transports see of the regions.
fn views(regions: &[Arc<RegionCore>]) -> Vec<crate::types::RegionView> {
    regions.iter().map(|r| r.view()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_names() {
        let ok = [
            ("127.0.0.1", "127.0.0.1", None),
            ("10.1.2.3:26000", "10.1.2.3:26000", Some(26000)),
            ("10.1.2.3:0", "10.1.2.3", None),
            ("[::1]:7", "[::1]:7", Some(7)),
            ("[fe80::1]", "[fe80::1]", None),
            ("::1", "[::1]", None),
        ];
        for (name, shown, port) in ok {
            let n = EngineName::parse(name).unwrap();
            assert_eq!(n.to_string(), shown);
            assert_eq!(n.port, port);
        }
        for bad in [
            "",
            "localhost",
            "1.2.3",
            "1.2.3.4:",
            "1.2.3.4:x",
            "1.2.3.4:65536",
            "1.2.3.4:-1",
            "[::1",
            "[::1]x",
            "[1.2.3.4]:5",
            " 1.2.3.4",
            "1.2.3.4:5:6",
        ] {
            let e = EngineName::parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidEngineName { .. }), "{bad:?}");
            assert_eq!(e.status(), Status::PARAM_INVALID);
        }
    }
}
