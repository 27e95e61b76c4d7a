//! The core floor's handle API: what every face (the typed API, [`crate::compat`]) and product
//! (LLM-DataDist, HIXL-CS) is built on. An [`Engine`] registers and deregisters memory in any
//! state, through the one in-use rule ([`Engine::releasable`]); opens links ([`LinkHandle`]),
//! which run checked batches (`runtime::check`) and start requests ([`ReqHandle`]). The typed
//! face adds type states, capabilities and borrows over these handles; the compat face adds
//! HIXL's shape (names, addresses, status codes). Neither reaches the core any other way.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::error::{Error, HandedBack, check_timeout, deadline_after};
use crate::options::Options;
use crate::runtime::connect::AsyncConnectStatus;
use crate::runtime::engine::EngineInner;
use crate::runtime::link::{LinkShared, SELF_LINK_REFUSED};
use crate::runtime::region::RegionCore;
use crate::runtime::request::{Outcome, Phase, ReqState, TransferStatus, to_status};
use crate::sync::{lock, model};
use crate::types::engine_name::EngineName;
use crate::types::raw::{RawMemory, RegistrableMemory};
use crate::types::{Access, MemDesc, MemType};

/// A registered region of an engine: the record every face holds (the typed `Region<M>`, the
/// compat engine's handles, LLM-DataDist's caches).
pub(crate) type RegionHandle = Arc<RegionCore>;

/// An engine of the core floor (cheap to clone: an `Arc`).
#[derive(Clone)]
pub(crate) struct Engine(pub(crate) Arc<EngineInner>);

impl std::ops::Deref for Engine {
    type Target = EngineInner;
    fn deref(&self) -> &EngineInner {
        &self.0
    }
}

impl Engine {
    /// Creates an engine named `name` (`"ip"`, `"ip:port"`, `"[ipv6]"`, `"[ipv6]:port"`; with
    /// `ephemeral`, a name without a port listens on one the OS chooses).
    ///
    /// # Errors
    /// [`Error::InvalidEngineName`], [`Error::InvalidTimeout`] (a zero connect or server I/O
    /// timeout),
    /// [`Error::InvalidOption`] (a pre-shared key under 16 bytes) (`PARAM_INVALID`);
    /// [`Error::Listen`] (`FAILED`) when the port cannot be bound; the transports' errors.
    pub(crate) fn initialize(name: &str, options: Options, ephemeral: bool) -> Result<Self, Error> {
        let parsed = EngineName::parse(name)?;
        check_timeout(options.connect_timeout)?;
        // (a zero I/O timeout would fail every handshake; a huge one is capped where used)
        check_timeout(options.server_io_timeout)?;
        if options.psk.as_ref().is_some_and(|k| k.len() < 16) {
            return Err(Error::InvalidOption {
                key: "psk".into(),
                value: "<redacted>".into(),
                problem: "a pre-shared key needs at least 16 bytes",
            });
        }
        Ok(Engine(EngineInner::new(parsed, options, ephemeral)?))
    }

    /// Opens the engine to links: its transports take its regions, and a listening engine
    /// starts serving them. Registration stays open: regions registered from now on are
    /// published at once ([`Engine::register_raw`]).
    ///
    /// # Errors
    /// [`Error::Listen`] (`FAILED`) when serving cannot start; nothing serves then.
    pub(crate) fn open(&self) -> Result<(), Error> {
        self.0.serve().map_err(|source| Error::Listen {
            addr: self.0.name.clone(),
            source,
        })
    }

    /// Whether the engine is open to links ([`Engine::open`], until [`Engine::close`]).
    pub(crate) fn is_open(&self) -> bool {
        self.0.open.load(Ordering::SeqCst)
    }

    /// Closes the engine to links: every link of the engine ends (its requests cancelled and
    /// waited for) and serving stops (requests being served get the finalize grace).
    pub(crate) fn close(&self) {
        self.0.stop();
    }

    /// Registers caller-managed memory, published to the transports and the table peers get at
    /// connect when the engine is open.
    ///
    /// # Safety
    /// `desc`'s range must stay allocated, mapped and valid for reads and writes of any byte
    /// values, by anyone, until the region leaves the engine (deregistered, or the engine
    /// finalized or dropped), and nothing may access it in a way that conflicts with
    /// transfers: peers read and write it at any time while the engine is open.
    ///
    /// # Errors
    /// `PARAM_INVALID`: [`Error::ZeroLengthRegion`], [`Error::NullAddress`],
    /// [`Error::AddressOverflow`], [`Error::AlreadyRegistered`], [`Error::OverlappingRegion`];
    /// `RESOURCE_EXHAUSTED`: [`Error::TooManyRegions`]; `UNSUPPORTED`:
    /// [`Error::UnsupportedMemory`]; the transports' registration errors.
    pub(crate) unsafe fn register_raw(
        &self,
        desc: MemDesc,
        mem_type: MemType,
        access: Access,
    ) -> Result<RegionHandle, Error> {
        let engine = self.0.id;
        let core = self.0.insert(desc.addr, desc.len, mem_type, |id| {
            RegionCore::new_raw(id, engine, desc, mem_type, access)
        })?;
        self.publish(&core);
        Ok(core)
    }

    /// Registers memory the engine takes ownership of, published as
    /// [`Engine::register_raw`]'s. Device memory only with `device` (a context token was shown).
    ///
    /// # Errors
    /// As [`Engine::register_raw`]; the memory comes back.
    pub(crate) fn register_owned<M: RegistrableMemory>(
        &self,
        mem: M,
        access: Access,
        device: bool,
    ) -> Result<RegionHandle, HandedBack<M>> {
        let raw: RawMemory = mem.into_raw_parts();
        let engine = self.0.id;
        if raw.mem_type() == MemType::Device && !device {
            return Err(HandedBack {
                error: Error::UnsupportedMemory {
                    mem_type: MemType::Device,
                    why: "device memory is registered with register_device and a context token",
                },
                // SAFETY: `raw` came from `into_raw_parts` just above and was not registered.
                value: unsafe { M::from_raw_parts(raw) },
            });
        }
        match self.0.insert(
            raw.ptr().as_ptr() as usize,
            raw.len(),
            raw.mem_type(),
            |id| RegionCore::new_owned::<M>(id, engine, raw, access),
        ) {
            Ok(core) => {
                self.publish(&core);
                Ok(core)
            }
            Err(error) => Err(HandedBack {
                error,
                // SAFETY: `raw` came from `into_raw_parts` just above and was not registered
                // (the insert failed before it made the record).
                value: unsafe { M::from_raw_parts(raw) },
            }),
        }
    }

    /// An open engine serves a region registered now: its transports learn of it, then the
    /// table peers get at connect has it.
    fn publish(&self, core: &RegionHandle) {
        if self.is_open() {
            self.0.publish(core);
        }
    }

    /// The one in-use rule every way a registration ends goes through: [`Error::ForeignHandle`]
    /// for a region of another engine, [`Error::RegionBusy`] (`RESOURCE_EXHAUSTED`) while an
    /// async request uses it ([`RegionCore::check_idle`]).
    ///
    /// # Errors
    /// As said.
    pub(crate) fn releasable(&self, core: &RegionCore) -> Result<(), Error> {
        if core.engine != self.0.id {
            return Err(Error::ForeignHandle {
                what: "region",
                owner: core.engine,
                engine: self.0.id,
            });
        }
        core.check_idle()
    }

    /// Deregisters a region in any state: [`Engine::releasable`]; on an open engine it is
    /// withdrawn first ([`EngineInner::withdraw`]: peers' later requests refused, requests
    /// being applied waited for, the transports let go); then it leaves the region table. What
    /// the region's record still holds is freed with its last holder (memory a same-host link
    /// may reach is kept until it cannot: the quarantine).
    ///
    /// # Errors
    /// Those of [`Engine::releasable`], and `UNSUPPORTED` where a transport cannot let go of
    /// one region while the engine is open ([`EngineInner::withdraw`]). The region stays
    /// registered then.
    pub(crate) fn deregister(&self, core: &RegionHandle) -> Result<(), Error> {
        self.releasable(core)?;
        if self.is_open() {
            self.0.withdraw(core)?;
        }
        self.0.unlist(core);
        tracing::debug!(parent: &self.0.span, region = core.id, "deregistered");
        Ok(())
    }

    /// Runs `f` with the engine's regions by address (the local index every face that takes
    /// addresses uses), locked for one batch's lookups.
    pub(crate) fn with_index<T>(&self, f: impl FnOnce(&Index<'_>) -> T) -> T {
        let regs = lock(&self.0.regions);
        f(&Index {
            by_addr: &regs.by_addr,
            last: std::cell::Cell::new(None),
        })
    }

    /// Why this engine's memory may not be deregistered now (fabric memory with a peer
    /// connected), or `None`.
    pub(crate) fn deregistration_blocked(&self) -> Option<&'static str> {
        self.0.deregistration_blocked()
    }

    /// The key a remote name is known by (its socket address).
    ///
    /// # Errors
    /// [`Error::InvalidEngineName`]; [`Error::NotConnectable`] for a name without a port, or
    /// this engine's own unless it is a fabric-memory engine (`PARAM_INVALID`).
    pub(crate) fn remote_key(&self, remote: &str) -> Result<(String, SocketAddr), Error> {
        let parsed = EngineName::parse(remote)?;
        let Some(addr) = parsed.socket_addr() else {
            return Err(Error::NotConnectable {
                peer: remote.to_owned(),
                problem: "the name has no port, so that engine does not listen",
            });
        };
        let key = addr.to_string();
        // HIXL's FabricMem engine connects to itself (upstream's kv benchmark does): the link
        // moves data between this process's own regions. Its other engines refuse (HIXL's
        // `PARAM_INVALID`), and so does hixl outside fabric memory; a self-link under another
        // name (`0.0.0.0:p` reached as `127.0.0.1:p`) is refused at connect (`LinkShared::open`).
        if key == self.0.name && !self.0.options.ascend.enable_fabric_mem {
            return Err(Error::NotConnectable {
                peer: remote.to_owned(),
                problem: SELF_LINK_REFUSED,
            });
        }
        Ok((key, addr))
    }

    /// Opens a link to `remote` (the peer sends its region table).
    ///
    /// # Errors
    /// Those of [`Engine::remote_key`] and [`EngineInner::open_link`], and
    /// [`Error::InvalidTimeout`].
    pub(crate) fn link(&self, remote: &str, timeout: Duration) -> Result<Arc<LinkShared>, Error> {
        let timeout = check_timeout(timeout)?;
        let (key, addr) = self.remote_key(remote)?;
        self.0.open_link(&key, addr, timeout)
    }

    /// The link an async connect to `remote` finished.
    ///
    /// # Errors
    /// The connect's own error; [`Error::NotConnected`] while it is pending or there is none.
    pub(crate) fn take_link(&self, remote: &str) -> Result<Arc<LinkShared>, Error> {
        let (key, _) = self.remote_key(remote)?;
        self.0.connects.take(&key)
    }

    /// Queues an async connect to `remote`.
    ///
    /// # Errors
    /// As [`Engine::link`]'s parameters; [`Error::QueueFull`].
    pub(crate) fn connect_async(&self, remote: &str, timeout: Duration) -> Result<(), Error> {
        let timeout = check_timeout(timeout)?;
        let (key, addr) = self.remote_key(remote)?;
        self.0.connects.connect(&self.0.me, &key, addr, timeout)
    }

    /// Queues a disconnect of an async connection not yet taken.
    ///
    /// # Errors
    /// [`Error::NotConnected`]; [`Error::QueueFull`].
    pub(crate) fn disconnect_async(&self, remote: &str, timeout: Duration) -> Result<(), Error> {
        let timeout = check_timeout(timeout)?;
        let (key, _) = self.remote_key(remote)?;
        self.0.connects.disconnect(&self.0.me, &key, timeout)
    }

    /// The status of the async connection to `remote`.
    pub(crate) fn async_connect_status(&self, remote: &str) -> AsyncConnectStatus {
        match self.remote_key(remote) {
            Ok((key, _)) => self.0.connects.status(&key),
            Err(_) => AsyncConnectStatus::NotConnect,
        }
    }

    /// The status of every async connection.
    pub(crate) fn async_connect_statuses(&self) -> BTreeMap<String, AsyncConnectStatus> {
        self.0.connects.all()
    }

    /// For a fabric-memory engine: the live ACL device allocation holding local memory that is
    /// not registered (upstream's FabricMem engine copies from and into such memory), as a
    /// region of its own that is in no table, served to no peer and registered with no
    /// transport: it only carries ranges into one call's batch (and keeps the batch's async
    /// request accounted).
    ///
    /// # Errors
    /// Why not (not a fabric-memory engine; not inside one device allocation).
    pub(crate) fn unregistered_device(
        &self,
        addr: usize,
        len: usize,
    ) -> Result<RegionHandle, &'static str> {
        let Some(rt) = &self.0.fabric else {
            return Err("only a fabric-memory engine copies memory that is not registered");
        };
        let (base, size) = rt.device_allocation(addr, len)?;
        Ok(Arc::new(RegionCore::new_raw(
            u32::MAX,
            self.0.id,
            MemDesc {
                addr: base,
                len: size,
            },
            MemType::Device,
            Access::ReadWrite,
        )))
    }
}

/// An engine's regions by address, locked (see [`Engine::with_index`]).
pub(crate) struct Index<'a> {
    by_addr: &'a BTreeMap<usize, RegionHandle>,
    /// The region the last lookup found: a batch's ranges mostly fall in one region (a KV cache
    /// is one region, or a few), so it is tried first.
    last: std::cell::Cell<Option<&'a RegionHandle>>,
}

impl<'a> Index<'a> {
    /// The registered region that holds `addr..addr + len` whole (`len` > 0), or `None`.
    #[inline]
    pub(crate) fn find(&self, addr: usize, len: usize) -> Option<&'a RegionHandle> {
        let holds = |r: &RegionHandle| {
            len > 0
                && addr >= r.addr
                && addr
                    .checked_add(len)
                    .is_some_and(|end| end <= r.addr + r.len)
        };
        if let Some(r) = self.last.get()
            && holds(r)
        {
            return Some(r);
        }
        let (_, r) = self.by_addr.range(..=addr).next_back()?;
        let r = Some(r).filter(|r| holds(r))?;
        self.last.set(Some(r));
        Some(r)
    }

    /// The registered region that holds address `addr` (a block layout's local base), or
    /// `None`.
    pub(crate) fn at(&self, addr: usize) -> Option<&'a RegionHandle> {
        let (_, r) = self.by_addr.range(..=addr).next_back()?;
        (addr - r.addr < r.len).then_some(r)
    }
}

/// A link owned by a face (held in a table by remote name, shared by threads): the link's state,
/// and the engine it belongs to, weakly (a link does not keep its engine alive; the engine's
/// teardown closes it). Dropping it closes the link.
pub(crate) struct LinkHandle {
    shared: Arc<LinkShared>,
    engine: Weak<EngineInner>,
}

impl LinkHandle {
    /// A handle of `shared`, a link of `engine`.
    pub(crate) fn new(engine: &Engine, shared: Arc<LinkShared>) -> Self {
        Self {
            shared,
            engine: Arc::downgrade(&engine.0),
        }
    }

    /// The link's state.
    pub(crate) fn shared(&self) -> &Arc<LinkShared> {
        &self.shared
    }
}

impl std::ops::Deref for LinkHandle {
    type Target = LinkShared;
    fn deref(&self) -> &LinkShared {
        &self.shared
    }
}

impl Drop for LinkHandle {
    fn drop(&mut self) {
        close_link(&self.shared, self.engine.upgrade().as_deref());
    }
}

/// Closes a link a face let go of (briefly, ignoring errors), and frees its peer's name in its
/// engine (if the engine is still there).
pub(crate) fn close_link(shared: &LinkShared, engine: Option<&EngineInner>) {
    shared.close_quietly();
    if let Some(e) = engine {
        e.forget_link(shared);
    }
}

/// An async request: its state and its link's (it owns what its transfer touches). Dropping
/// it is safe: a request that has not started is cancelled, a running one finishes on its own
/// unless its link closes first, which cancels it and waits for it.
pub(crate) struct ReqHandle {
    pub(crate) st: Arc<ReqState>,
    pub(crate) link: Arc<LinkShared>,
}

impl ReqHandle {
    /// Resolves a request still queued at its deadline.
    fn expire_if_due(&self) {
        if Instant::now() >= self.st.deadline {
            self.st.resolve_queued(&*self.link, Outcome::TimedOut);
        }
    }

    /// Its status now (a queued request past its deadline is timed out here).
    pub(crate) fn status(&self) -> TransferStatus {
        self.expire_if_due();
        self.st.status()
    }

    /// Waits up to `timeout` for a terminal status; `Waiting` if none came.
    pub(crate) fn wait(&self, timeout: Duration) -> TransferStatus {
        let until = deadline_after(Instant::now(), timeout);
        loop {
            self.expire_if_due();
            let g = model::lock(&self.st.m);
            if let Phase::Done(o) = &g.phase {
                return to_status(o);
            }
            let now = Instant::now();
            if now >= until {
                return TransferStatus::Waiting;
            }
            // wake at the deadline too, to resolve a request still queued then; past it (a
            // request running still: its worker ends it and notifies), only at `until`
            let next = if self.st.deadline > now {
                until.min(self.st.deadline)
            } else {
                until
            };
            let _ = self
                .st
                .cv
                .wait_timeout(g, next - now)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Cancels it; its status after.
    pub(crate) fn cancel(&self) -> TransferStatus {
        self.st.cancel(&*self.link);
        self.st.status()
    }
}

impl Drop for ReqHandle {
    fn drop(&mut self) {
        // not started yet: nobody wants it any more. Running: let it finish on its own.
        self.st.resolve_queued(&*self.link, Outcome::Cancelled);
    }
}
