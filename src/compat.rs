//! HIXL's call shape, checked at run time: one owned engine keyed by remote engine name, with
//! integer addresses and HIXL's status codes. The C ABI (`hixl-capi`, `libhixl.so`), the C++
//! header (`include/hixl/hixl.h`) and the Python package are thin layers over it.
//!
//! [`Hixl`] mirrors `hixl::Hixl` of HIXL's C++ API method for method. It is built on the typed
//! engine: it holds a [`crate::Hixl`] in `Registered` or `Connected`, its regions as
//! [`Region<MemDesc>`](crate::Region) capabilities and its links as owned [`crate::Link`]s, and
//! what the typestates prove at compile time is checked here before each call, with HIXL's
//! status:
//!
//! | misuse | status |
//! |---|---|
//! | any call before `initialize` or after `finalize`; `initialize` twice | `FAILED` |
//! | registering or deregistering while a link exists (ours, or a peer's to us) | `UNSUPPORTED` |
//! | deregistering an unknown handle | `PARAM_INVALID` |
//! | a local range not inside one region this engine registered | `PARAM_INVALID` |
//! | a remote range not inside one region of the peer's table | `PARAM_INVALID` |
//! | a transfer or notify to a remote that is not connected (without `AutoConnect`) | `NOT_CONNECTED` |
//! | connecting twice | `ALREADY_CONNECTED` |
//! | a status query for an unknown (or already reported) request | `FAILED` |
//! | a timeout of 0 or less | `PARAM_INVALID` |
//!
//! Nothing reachable through it can touch memory outside the registered ranges: every local
//! address range is looked up in this engine's regions, every remote range in the table the
//! peer sent at connect (and the peer checks it again). What the caller promises is what
//! HIXL's `RegisterMem` asks for, hence [`Hixl::register_mem`] is an `unsafe fn`.
//!
//! ```
//! use hixl::compat::{Hixl, MemDesc, TransferOpDesc};
//! use hixl::{MemType, TransferOp};
//!
//! # fn main() -> Result<(), hixl::compat::Error> {
//! let (mut cache, mut kv) = (vec![0u8; 4096], vec![7u8; 4096]);
//! let server = Hixl::new();
//! server.initialize("127.0.0.1:0", [("AutoConnect", "0")])?; // an ephemeral port
//! let desc = |m: &mut Vec<u8>| MemDesc { addr: m.as_mut_ptr() as usize, len: m.len(), local_only: false };
//! // SAFETY: both buffers outlive the engines (finalized below) and are read only after the
//! // transfer returned.
//! unsafe { server.register_mem(desc(&mut cache), MemType::Host) }?;
//! let client = Hixl::new();
//! client.initialize("127.0.0.1", [("AutoConnect", "1")])?; // no explicit connect needed
//! // SAFETY: as above.
//! unsafe { client.register_mem(desc(&mut kv), MemType::Host) }?;
//! let d = TransferOpDesc {
//!     local_addr: kv.as_ptr() as usize,
//!     remote_addr: cache.as_ptr() as usize + 100,
//!     len: 1000,
//! };
//! client.transfer_sync(&server.local_engine()?, TransferOp::Write, &[d], 1000)?;
//! client.finalize();
//! server.finalize();
//! assert!(cache[100..1100].iter().all(|&b| b == 7));
//! # Ok(()) }
//! ```
//!
//! ## How HIXL's lifecycle maps onto the typed one
//!
//! HIXL has no `activate`: an engine serves as soon as it is initialized, and memory may be
//! registered before the first connect. The compat engine therefore activates the typed engine
//! at `initialize` (serving starts with no regions, so peers can connect at once), and
//! `register_mem` / `deregister_mem` step it back to `Registered`, change the region table, and
//! activate it again (same listening socket: a peer connecting meanwhile waits in the backlog).
//! Stepping back stops serving, and on this host that revokes one-sided access, so it is done
//! only while no link exists in either direction (none of ours, no async connect, no peer linked
//! to us); otherwise the call is refused with `UNSUPPORTED` and nothing changes. Register every
//! region first, then connect: the pattern HIXL's own examples and the vLLM connector follow.
//!
//! ## AutoConnect
//!
//! With `"AutoConnect" = "1"` a transfer or notify to a remote that is not connected connects
//! first (with the engine's connect timeout, `hixl.ConnectTimeoutMs`, 1000 ms by default), and a
//! link that broke (a failed transfer, or the heartbeat noticing the peer is gone) is dropped so
//! the next call connects again. Without it, a broken link answers `NOT_CONNECTED` until it is
//! disconnected or connected again (a new connect supersedes a broken link).
//!
//! ## Requests
//!
//! `transfer_async` returns a non-zero request id. A status query that reports a terminal
//! status (completed, timeout, failed) forgets the request, as HIXL frees it; asking again, or
//! for an id never issued, gives `FAILED`, never a stale request.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use crate::engine::{Connected, Registered};
use crate::sync::lock;
use crate::{Access, AsyncConnectStatus, Link, MemType, Options, Region, Status, TransferOp};

/// Whether a feature is supported ([`get_capability`]).
pub const FEATURE_SUPPORTED: i32 = 1;
/// Whether a feature is supported ([`get_capability`]).
pub const FEATURE_NOT_SUPPORTED: i32 = 0;

/// HIXL's option keys (`OPTION_*` in `hixl_types.h`).
pub const OPTION_ENABLE_USE_FABRIC_MEM: &str = "EnableUseFabricMem";
/// See [`OPTION_ENABLE_USE_FABRIC_MEM`].
pub const OPTION_RDMA_TRAFFIC_CLASS: &str = "RdmaTrafficClass";
/// See [`OPTION_ENABLE_USE_FABRIC_MEM`].
pub const OPTION_RDMA_SERVICE_LEVEL: &str = "RdmaServiceLevel";
/// See [`OPTION_ENABLE_USE_FABRIC_MEM`].
pub const OPTION_BUFFER_POOL: &str = "BufferPool";
/// See [`OPTION_ENABLE_USE_FABRIC_MEM`].
pub const OPTION_GLOBAL_RESOURCE_CONFIG: &str = "GlobalResourceConfig";
/// See [`OPTION_ENABLE_USE_FABRIC_MEM`].
pub const OPTION_AUTO_CONNECT: &str = "AutoConnect";
/// See [`OPTION_ENABLE_USE_FABRIC_MEM`].
pub const OPTION_LOCAL_COMM_RES: &str = "LocalCommRes";

/// A failed call: HIXL's status code and a human-readable cause.
#[derive(Debug, Clone)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    fn new(status: Status, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
    /// HIXL's status code.
    pub fn status(&self) -> Status {
        self.status
    }
    /// The cause, for logs.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

impl From<crate::Error> for Error {
    fn from(e: crate::Error) -> Self {
        Self::new(e.status(), e.to_string())
    }
}

/// A compat result.
pub type Result<T> = std::result::Result<T, Error>;

/// HIXL's `MemDesc`: a caller-managed address range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemDesc {
    /// Start address.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// Register for local use only: peers may neither READ nor WRITE it (HIXL `local_only`).
    pub local_only: bool,
}

/// A registered region (HIXL `MemHandle`): a non-zero id.
pub type MemHandle = u64;
/// An async request (HIXL `TransferReq`): a non-zero id.
pub type TransferReq = u64;

/// HIXL's `TransferOpDesc`: `len` bytes between a local and a remote address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct TransferOpDesc {
    /// Address in this process, inside a region registered with this engine.
    pub local_addr: usize,
    /// Address in the peer, inside a region of its table.
    pub remote_addr: usize,
    /// Bytes to move.
    pub len: usize,
}

/// HIXL's `TransferStatus` (C values 0..=3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum TransferStatus {
    /// Queued or running.
    Waiting = 0,
    /// Done.
    Completed = 1,
    /// Its deadline passed.
    Timeout = 2,
    /// It failed (or the id is unknown).
    Failed = 3,
}

/// HIXL's `FeatureType` for [`get_capability`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum FeatureType {
    /// Transfers connect on demand (`AutoConnect=1`): supported.
    AutoConnect = 0,
    /// HIXL's client/server C API (`hixl_cs.h`, hcomm types): not supported.
    ClientServerComm = 1,
}

impl FeatureType {
    /// The feature with this C value.
    pub fn from_i32(v: i32) -> Option<Self> {
        match v {
            0 => Some(Self::AutoConnect),
            1 => Some(Self::ClientServerComm),
            _ => None,
        }
    }
}

/// HIXL's `GetCapability`: [`FEATURE_SUPPORTED`] or [`FEATURE_NOT_SUPPORTED`].
pub fn get_capability(feature: FeatureType) -> i32 {
    match feature {
        FeatureType::AutoConnect => FEATURE_SUPPORTED,
        FeatureType::ClientServerComm => FEATURE_NOT_SUPPORTED,
    }
}

/// HIXL's `TransferArgs`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TransferArgs {
    /// Returned with the request's result (HIXL `user_data`, a pointer there).
    pub user_data: u64,
}

/// HIXL's `GetTransferStatusArgs`.
#[derive(Debug, Clone, Copy)]
pub struct GetTransferStatusArgs {
    /// Most results to return.
    pub max_query_count: u32,
    /// Leave out requests still waiting.
    pub skip_waiting: bool,
}

impl Default for GetTransferStatusArgs {
    fn default() -> Self {
        Self {
            max_query_count: u32::MAX,
            skip_waiting: false,
        }
    }
}

/// HIXL's `TransferResult`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferResult {
    /// The request.
    pub req: TransferReq,
    /// Its [`TransferArgs::user_data`].
    pub user_data: u64,
    /// Its status.
    pub status: TransferStatus,
}

/// HIXL's `NotifyDesc`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NotifyDesc {
    /// The notification's name.
    pub name: String,
    /// The message.
    pub notify_msg: String,
}

/// One region of a peer's table ([`Hixl::remote_regions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRegionDesc {
    /// Start address in the peer's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Memory type.
    pub mem_type: MemType,
    /// What the peer lets this engine do with it.
    pub access: Access,
}

enum Typed {
    Registered(crate::Hixl<Registered>),
    Connected(crate::Hixl<Connected>),
}

type Reg = Arc<Region<crate::MemDesc>>;

#[derive(Default)]
struct Core {
    engine: Option<Typed>,
    finalized: bool,
    auto_connect: bool,
    connect_timeout: Duration,
    /// Regions by start address (disjoint: the typed engine refuses overlaps).
    regions: BTreeMap<usize, Reg>,
    handles: HashMap<MemHandle, usize>,
}

struct Pending {
    /// Shared so [`Hixl::wait_transfer`] can wait on it without holding the table's lock.
    req: Arc<crate::TransferReq<'static>>,
    user_data: u64,
}

/// The runtime-checked engine (HIXL's `hixl::Hixl`). `Send + Sync`: share it by `&` or `Arc`.
pub struct Hixl {
    core: RwLock<Core>,
    /// Links by remote key (the peer's socket address).
    links: Mutex<HashMap<String, Arc<Link<'static>>>>,
    /// Serialises on-demand connects (AutoConnect), so two callers do not race for one name.
    connecting: Mutex<()>,
    reqs: Mutex<BTreeMap<TransferReq, Pending>>,
    next_id: AtomicU64,
}

static_assertions::assert_impl_all!(Hixl: Send, Sync);

impl Default for Hixl {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Hixl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("compat::Hixl")
            .field("name", &self.local_engine().ok())
            .finish()
    }
}

fn millis(t: i32) -> Result<Duration> {
    Ok(crate::timeout_from_millis(t)?)
}

fn not_initialized() -> Error {
    Error::new(
        Status::FAILED,
        "the engine is not initialized (or finalized)",
    )
}

impl Hixl {
    /// An engine that is not initialized yet (HIXL's constructor).
    pub fn new() -> Self {
        Self {
            core: RwLock::new(Core::default()),
            links: Mutex::new(HashMap::new()),
            connecting: Mutex::new(()),
            reqs: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Core> {
        self.core.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write(&self) -> RwLockWriteGuard<'_, Core> {
        self.core.write().unwrap_or_else(|e| e.into_inner())
    }

    /// HIXL `Initialize`: `local_engine` is `"ip"` (a client only), `"ip:port"` (listens there;
    /// port 0 listens on a port the OS chooses, see [`Hixl::local_engine`]), or the IPv6 forms
    /// `"[ip]"`, `"[ip]:port"`. Options are HIXL's string keys ([`Options::from_pairs`]).
    ///
    /// # Errors
    /// `FAILED` if already initialized (or finalized: an engine is initialized once), the
    /// errors of [`crate::Hixl::initialize`] and [`Options::from_pairs`].
    pub fn initialize<K: AsRef<str>, V: AsRef<str>>(
        &self,
        local_engine: &str,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Result<()> {
        let mut core = self.write();
        if core.engine.is_some() || core.finalized {
            return Err(Error::new(
                Status::FAILED,
                "the engine is already initialized",
            ));
        }
        let mut options = Options::from_pairs(options)?;
        let auto = std::mem::take(&mut options.auto_connect);
        let timeout = options.connect_timeout;
        // "ip:0" / "[ip]:0": listen on an ephemeral port (the typed initialize reads port 0 as
        // "no port", HIXL's client-only form)
        let explicit_zero = local_engine.ends_with("]:0")
            || (local_engine.parse::<std::net::Ipv6Addr>().is_err()
                && local_engine.ends_with(":0"));
        let engine = if explicit_zero {
            crate::Hixl::initialize_ephemeral(local_engine, options)?
        } else {
            crate::Hixl::initialize(local_engine, options)?
        };
        let engine = engine
            .into_registered()
            .activate()
            .map_err(crate::Error::from)?;
        core.engine = Some(Typed::Connected(engine));
        core.auto_connect = auto;
        core.connect_timeout = timeout;
        Ok(())
    }

    /// The engine's name as peers connect to it (with the port it got, for port 0).
    ///
    /// # Errors
    /// `FAILED` before `initialize` or after `finalize`.
    pub fn local_engine(&self) -> Result<String> {
        let core = self.read();
        match &core.engine {
            Some(Typed::Connected(e)) => Ok(e.name().to_owned()),
            Some(Typed::Registered(e)) => Ok(e.name().to_owned()),
            _ => Err(not_initialized()),
        }
    }

    /// HIXL `Finalize`: requests in flight are cancelled and waited for (a running one ends at
    /// the latest at its deadline, [`ASYNC_DEADLINE`]), every link closes, serving stops (the
    /// typed engine's `finalize`: requests being served get its grace period), the regions are
    /// released. When it returns, nothing of this engine touches registered memory any more.
    /// Calling it again, or before `initialize`, does nothing.
    pub fn finalize(&self) {
        let mut core = self.write();
        let engine = core.engine.take();
        if engine.is_some() {
            core.finalized = true;
        }
        // requests in flight may still write the caller's memory: stop them, and return only
        // once each has ended (a running one ends at the latest at its deadline)
        let reqs = std::mem::take(&mut *lock(&self.reqs));
        for p in reqs.values() {
            p.req.cancel();
        }
        let links: Vec<_> = lock(&self.links).drain().map(|(_, l)| l).collect();
        for l in links {
            l.shared.close_quietly();
        }
        for p in reqs.values() {
            while !p.req.wait(Duration::from_secs(1)).is_terminal() {}
        }
        drop(reqs);
        match engine {
            Some(Typed::Connected(e)) => drop(e.finalize()),
            Some(Typed::Registered(e)) => drop(e.finalize()),
            _ => {}
        }
        core.regions.clear();
        core.handles.clear();
    }

    /// HIXL `RegisterMem`: makes `desc` reachable by this engine's transfers and, unless
    /// `local_only`, by peers (READ and WRITE). Returns a non-zero handle.
    ///
    /// # Safety
    /// Until the handle is deregistered or the engine finalized:
    /// - `desc.addr..desc.addr + desc.len` must stay allocated, mapped and valid for reads and
    ///   writes of any byte values;
    /// - nothing else may access it in a way that conflicts with transfers: peers READ and
    ///   WRITE it at any time, and this engine's READ transfers write it.
    ///
    /// (This is [`crate::Hixl::register_raw`]'s contract, which it calls.)
    ///
    /// # Errors
    /// `FAILED` when not initialized; `UNSUPPORTED` while a link exists, and for device memory
    /// on an engine without Ascend; `PARAM_INVALID` for a null address, zero length, overflow
    /// or overlap with a registered region; `RESOURCE_EXHAUSTED` for too many regions.
    pub unsafe fn register_mem(&self, desc: MemDesc, mem_type: MemType) -> Result<MemHandle> {
        let mut core = self.write();
        let access = if desc.local_only {
            Access::None
        } else {
            Access::ReadWrite
        };
        let raw = crate::MemDesc {
            addr: desc.addr,
            len: desc.len,
        };
        let region = self.with_registered(&mut core, "register memory", |e| {
            // SAFETY: the caller upholds `register_raw`'s contract (this function's `# Safety`).
            unsafe { e.register_raw_with(raw, mem_type, access) }.map_err(Error::from)
        })?;
        let handle = self.next_id.fetch_add(1, Ordering::Relaxed);
        core.handles.insert(handle, desc.addr);
        core.regions.insert(desc.addr, Arc::new(region));
        Ok(handle)
    }

    /// HIXL `DeregisterMem`.
    ///
    /// # Errors
    /// `FAILED` when not initialized; `PARAM_INVALID` for an unknown handle; `UNSUPPORTED`
    /// while a link exists; `RESOURCE_EXHAUSTED` while an async request still uses the region.
    pub fn deregister_mem(&self, handle: MemHandle) -> Result<()> {
        let mut core = self.write();
        if core.engine.is_none() {
            return Err(not_initialized());
        }
        let Some(&addr) = core.handles.get(&handle) else {
            return Err(Error::new(
                Status::PARAM_INVALID,
                format!("no memory is registered with handle {handle:#x}"),
            ));
        };
        let reg = core
            .regions
            .remove(&addr)
            .expect("handles and regions agree");
        // the region goes into the closure and comes back here unless it was handed back
        let mut slot = Some(reg);
        let r = self.with_registered(&mut core, "deregister memory", |e| {
            let region = slot.take().expect("taken once");
            match Arc::try_unwrap(region) {
                Ok(region) => e.deregister(region).map(drop).map_err(|refused| {
                    slot = Some(Arc::new(refused.value));
                    Error::from(refused.error)
                }),
                Err(shared) => {
                    slot = Some(shared);
                    Err(Error::new(
                        Status::RESOURCE_EXHAUSTED,
                        "the region is in use by an async transfer",
                    ))
                }
            }
        });
        match slot {
            // refused (or busy): the region stays registered under its handle
            Some(region) if r.is_err() => {
                core.regions.insert(addr, region);
            }
            // handed back (an error then is serving failing to restart)
            _ => {
                core.handles.remove(&handle);
            }
        }
        r
    }

    /// Runs `f` on the engine stepped back to `Registered` (serving stopped), then activates it
    /// again. Refused (`UNSUPPORTED`) while any link exists in either direction.
    fn with_registered<T>(
        &self,
        core: &mut Core,
        what: &str,
        f: impl FnOnce(&crate::Hixl<Registered>) -> Result<T>,
    ) -> Result<T> {
        let engine = match core.engine.take() {
            None => return Err(not_initialized()),
            Some(e) => e,
        };
        let busy = match &engine {
            Typed::Connected(e) => self.link_count(e),
            _ => 0,
        };
        if busy > 0 {
            core.engine = Some(engine);
            return Err(Error::new(
                Status::UNSUPPORTED,
                format!(
                    "cannot {what} while {busy} link(s) exist: disconnect them first (hixl \
                     stops serving to change the region table, which would revoke peers' access)"
                ),
            ));
        }
        let registered = match engine {
            Typed::Connected(e) => {
                lock(&self.links).clear();
                e.deactivate()
            }
            Typed::Registered(e) => e,
        };
        let r = f(&registered);
        match registered.activate() {
            Ok(e) => core.engine = Some(Typed::Connected(e)),
            Err(t) => {
                // serving could not restart: the engine stays `Registered` and the next call
                // that needs it tries again
                let (error, engine, ()) = t.into_parts();
                core.engine = Some(Typed::Registered(engine));
                if r.is_ok() {
                    return Err(error.into());
                }
            }
        }
        r
    }

    /// Links in either direction: ours (held or in the async queue) and peers' to us.
    fn link_count(&self, e: &crate::Hixl<Connected>) -> usize {
        let mut links = lock(&self.links);
        links.retain(|_, l| !l.is_broken());
        let queued = e
            .async_connect_statuses()
            .values()
            .filter(|s| {
                !matches!(
                    s,
                    AsyncConnectStatus::NotConnect | AsyncConnectStatus::ConnectFailed
                )
            })
            .count();
        links.len() + queued + e.served_links()
    }

    /// The typed engine in `Connected`, activating it again if a restart of serving failed
    /// earlier.
    fn connected<'c>(&self, core: &'c Core) -> Result<&'c crate::Hixl<Connected>> {
        match &core.engine {
            Some(Typed::Connected(e)) => Ok(e),
            Some(Typed::Registered(_)) => Err(Error::new(
                Status::FAILED,
                "serving could not be restarted after the last (de)registration; register or \
                 deregister again to retry",
            )),
            _ => Err(not_initialized()),
        }
    }

    /// HIXL `Connect`: opens a link to a listening engine; its region table arrives with it.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a bad name or timeout (or this engine's own name); `ALREADY_CONNECTED`;
    /// `TIMEOUT`; `FAILED` when the peer cannot be reached.
    pub fn connect(&self, remote_engine: &str, timeout_in_millis: i32) -> Result<()> {
        let timeout = millis(timeout_in_millis)?;
        let core = self.read();
        let e = self.connected(&core)?;
        let (key, _) = e.remote_key(remote_engine)?;
        let _serial = lock(&self.connecting);
        if let Some(l) = lock(&self.links).get(&key)
            && !l.is_broken()
        {
            return Err(Error::new(
                Status::ALREADY_CONNECTED,
                format!("already connected to {key}"),
            ));
        }
        let link = e.connect_owned(remote_engine, timeout)?;
        // a broken link under this name is superseded (and closed when dropped)
        lock(&self.links).insert(key, Arc::new(link));
        Ok(())
    }

    /// HIXL `Disconnect`: closes the link (an async connection too), telling the peer.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a bad name or timeout; `NOT_CONNECTED` if there is no link; the
    /// error of the goodbye exchange (the link is closed on this side in every case).
    pub fn disconnect(&self, remote_engine: &str, timeout_in_millis: i32) -> Result<()> {
        let timeout = millis(timeout_in_millis)?;
        let core = self.read();
        let e = self.connected(&core)?;
        let (key, _) = e.remote_key(remote_engine)?;
        let link = lock(&self.links).remove(&key);
        let link = match link {
            Some(l) => l,
            None => match e.take_link_owned(remote_engine) {
                Ok(l) => Arc::new(l),
                Err(_) => {
                    return Err(Error::new(
                        Status::NOT_CONNECTED,
                        format!("not connected to {key}"),
                    ));
                }
            },
        };
        // transfers running on other threads keep their clone; the link is closed under them
        let r = link.shared.close_timeout(timeout);
        drop(link);
        Ok(r?)
    }

    /// HIXL `ConnectAsync`: queues a connect; see [`Hixl::get_async_connect_status`]. The link
    /// is used by the first call that needs it once the status is `Connected`.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a bad name or timeout; `ALREADY_CONNECTED` if a link exists;
    /// `RESOURCE_EXHAUSTED` when the queue is full.
    pub fn connect_async(&self, remote_engine: &str, timeout_in_millis: i32) -> Result<()> {
        let timeout = millis(timeout_in_millis)?;
        let core = self.read();
        let e = self.connected(&core)?;
        let (key, _) = e.remote_key(remote_engine)?;
        if lock(&self.links).get(&key).is_some_and(|l| !l.is_broken()) {
            return Err(Error::new(
                Status::ALREADY_CONNECTED,
                format!("already connected to {key}"),
            ));
        }
        Ok(e.connect_async(remote_engine, timeout)?)
    }

    /// HIXL `DisconnectAsync`: queues a disconnect of an async connection; a link already in
    /// use is closed at once.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a bad name or timeout; `NOT_CONNECTED` if there is no connection.
    pub fn disconnect_async(&self, remote_engine: &str, timeout_in_millis: i32) -> Result<()> {
        let timeout = millis(timeout_in_millis)?;
        let core = self.read();
        let e = self.connected(&core)?;
        let (key, _) = e.remote_key(remote_engine)?;
        let held = lock(&self.links).remove(&key);
        if let Some(l) = held {
            let _ = l.shared.close_timeout(timeout);
            return Ok(());
        }
        Ok(e.disconnect_async(remote_engine, timeout)?)
    }

    /// HIXL `GetAsyncConnectStatus` for one remote: `Connected` for a usable link (however it
    /// was made), else the async queue's status.
    ///
    /// # Errors
    /// `FAILED` when not initialized; `PARAM_INVALID` for a bad name.
    pub fn get_async_connect_status(&self, remote_engine: &str) -> Result<AsyncConnectStatus> {
        let core = self.read();
        let e = self.connected(&core)?;
        let (key, _) = e.remote_key(remote_engine)?;
        if lock(&self.links).get(&key).is_some_and(|l| !l.is_broken()) {
            return Ok(AsyncConnectStatus::Connected);
        }
        Ok(e.async_connect_status(remote_engine))
    }

    /// HIXL `GetAsyncConnectStatus` for every remote this engine knows.
    ///
    /// # Errors
    /// `FAILED` when not initialized.
    pub fn get_all_async_connect_status(&self) -> Result<BTreeMap<String, AsyncConnectStatus>> {
        let core = self.read();
        let e = self.connected(&core)?;
        let mut all = e.async_connect_statuses();
        for (k, l) in lock(&self.links).iter() {
            if !l.is_broken() {
                all.insert(k.clone(), AsyncConnectStatus::Connected);
            }
        }
        Ok(all)
    }

    /// The link to `key`: a held one; one an async connect finished; or, with AutoConnect, a new
    /// one. A broken link is dropped first with AutoConnect.
    fn link_for(
        &self,
        e: &crate::Hixl<Connected>,
        auto: bool,
        connect_timeout: Duration,
        remote: &str,
        key: &str,
    ) -> Result<Arc<Link<'static>>> {
        {
            let mut links = lock(&self.links);
            match links.get(key) {
                Some(l) if !(auto && l.is_broken()) => return Ok(l.clone()),
                Some(_) => drop(links.remove(key)),
                None => {}
            }
        }
        if e.async_connect_status(remote) == AsyncConnectStatus::Connected
            && let Ok(l) = e.take_link_owned(remote)
        {
            let l = Arc::new(l);
            lock(&self.links).insert(key.to_owned(), l.clone());
            return Ok(l);
        }
        if !auto {
            return Err(Error::new(
                Status::NOT_CONNECTED,
                format!("not connected to {key} (connect first, or set AutoConnect=1)"),
            ));
        }
        let _serial = lock(&self.connecting);
        if let Some(l) = lock(&self.links).get(key) {
            return Ok(l.clone()); // another caller connected meanwhile
        }
        let l = Arc::new(e.connect_owned(remote, connect_timeout)?);
        lock(&self.links).insert(key.to_owned(), l.clone());
        tracing::debug!(peer = key, "auto-connected");
        Ok(l)
    }

    /// After a failed call on `link`: with AutoConnect, a link that failed (broke, timed out,
    /// or failed otherwise, but not a parameter error) is dropped so the next call connects
    /// again.
    fn after_failure(&self, auto: bool, key: &str, link: &Arc<Link<'static>>, status: Status) {
        let failed = matches!(
            status,
            Status::NOT_CONNECTED | Status::TIMEOUT | Status::FAILED | Status::NOTIFY_FAILED
        );
        if auto && (failed || link.is_broken()) {
            let mut links = lock(&self.links);
            if links.get(key).is_some_and(|l| Arc::ptr_eq(l, link)) {
                links.remove(key);
            }
        }
    }

    /// Runs `f` with the link for `remote` (connecting on demand with AutoConnect), dropping a
    /// link that broke under it (AutoConnect).
    fn on_link<T>(
        &self,
        remote: &str,
        f: impl FnOnce(&Core, &Link<'static>) -> Result<T>,
    ) -> Result<T> {
        let core = self.read();
        let e = self.connected(&core)?;
        let (key, _) = e.remote_key(remote)?;
        let link = self.link_for(e, core.auto_connect, core.connect_timeout, remote, &key)?;
        let r = f(&core, &link);
        if let Err(e) = &r {
            self.after_failure(core.auto_connect, &key, &link, e.status);
        }
        r
    }

    /// HIXL `TransferSync`: READ (remote → local) or WRITE (local → remote) a batch.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a bad timeout, an empty batch, a zero length, a local range not in
    /// one registered region, a remote range not in one region of the peer's table (or one it
    /// forbids); `NOT_CONNECTED` without a link (and no AutoConnect), or when the peer went
    /// away; `TIMEOUT`; `FAILED`.
    pub fn transfer_sync(
        &self,
        remote_engine: &str,
        op: TransferOp,
        op_descs: &[TransferOpDesc],
        timeout_in_millis: i32,
    ) -> Result<()> {
        let timeout = millis(timeout_in_millis)?;
        self.on_link(remote_engine, |core, link| {
            let regions = local_regions(core, op_descs)?;
            let descs = descriptors(link, &regions, op_descs)?;
            Ok(link.transfer_sync(op, &descs, timeout)?)
        })
    }

    /// HIXL `TransferAsync`: starts a batch and returns its request id (non-zero). The engine
    /// enforces a deadline of [`ASYNC_DEADLINE`] on it (then its status is `Timeout`).
    ///
    /// # Errors
    /// The validation errors of [`Hixl::transfer_sync`], before anything starts.
    pub fn transfer_async(
        &self,
        remote_engine: &str,
        op: TransferOp,
        op_descs: &[TransferOpDesc],
        args: TransferArgs,
    ) -> Result<TransferReq> {
        let req = self.on_link(remote_engine, |core, link| {
            let regions = local_regions(core, op_descs)?;
            let descs = descriptors(link, &regions, op_descs)?;
            let targs = crate::TransferArgs::tagged(args.user_data).timeout(ASYNC_DEADLINE);
            let req: crate::TransferReq<'static> = link.start_async(op, &descs, targs)?;
            Ok(req)
        })?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.reqs).insert(
            id,
            Pending {
                req: Arc::new(req),
                user_data: args.user_data,
            },
        );
        Ok(id)
    }

    /// HIXL `GetTransferStatus` for one request. A terminal status (completed, timeout,
    /// failed) is reported once: the request is forgotten then.
    ///
    /// # Errors
    /// `FAILED` for an unknown request (never issued, or already reported).
    pub fn get_transfer_status(&self, req: TransferReq) -> Result<TransferStatus> {
        let mut reqs = lock(&self.reqs);
        let Some(p) = reqs.get(&req) else {
            return Err(Error::new(
                Status::FAILED,
                format!("no transfer request {req:#x} (unknown, or its end was already reported)"),
            ));
        };
        let st = status_of(&p.req);
        if st != TransferStatus::Waiting {
            reqs.remove(&req);
        }
        Ok(st)
    }

    /// HIXL's many-request `GetTransferStatus`: up to `max_query_count` requests, oldest
    /// first, leaving out waiting ones with `skip_waiting`; terminal ones are forgotten once
    /// reported.
    ///
    /// # Errors
    /// `FAILED` when not initialized.
    pub fn get_transfer_statuses(
        &self,
        args: GetTransferStatusArgs,
    ) -> Result<Vec<TransferResult>> {
        if self.read().engine.is_none() {
            return Err(not_initialized());
        }
        let mut reqs = lock(&self.reqs);
        let mut out = Vec::new();
        let mut done = Vec::new();
        for (&id, p) in reqs.iter() {
            if out.len() >= args.max_query_count as usize {
                break;
            }
            let status = status_of(&p.req);
            if status == TransferStatus::Waiting {
                if args.skip_waiting {
                    continue;
                }
            } else {
                done.push(id);
            }
            out.push(TransferResult {
                req: id,
                user_data: p.user_data,
                status,
            });
        }
        for id in done {
            reqs.remove(&id);
        }
        Ok(out)
    }

    /// Cancels an async request (an extension of HIXL, which has no cancel): descriptors not
    /// yet started are skipped, and its status becomes `Failed` once what was running ended.
    /// The request stays known until its terminal status is reported.
    ///
    /// # Errors
    /// `FAILED` for an unknown request (never issued, or already reported).
    pub fn cancel_transfer(&self, req: TransferReq) -> Result<()> {
        match lock(&self.reqs).get(&req) {
            Some(p) => {
                p.req.cancel();
                Ok(())
            }
            None => Err(Error::new(
                Status::FAILED,
                format!("no transfer request {req:#x} (unknown, or its end was already reported)"),
            )),
        }
    }

    /// Waits up to `timeout` for a request to end (an extension of HIXL, whose callers poll
    /// [`Hixl::get_transfer_status`]); reports its status as that call does (a terminal status
    /// once, then the request is forgotten).
    ///
    /// # Errors
    /// `FAILED` for an unknown request (never issued, or already reported).
    pub fn wait_transfer(&self, req: TransferReq, timeout: Duration) -> Result<TransferStatus> {
        let Some(r) = lock(&self.reqs).get(&req).map(|p| p.req.clone()) else {
            return Err(Error::new(
                Status::FAILED,
                format!("no transfer request {req:#x} (unknown, or its end was already reported)"),
            ));
        };
        r.wait(timeout);
        drop(r);
        self.get_transfer_status(req)
    }

    /// The region table `remote_engine` sent at connect (an extension of HIXL, whose users
    /// ship base addresses out of band), sorted by address.
    ///
    /// # Errors
    /// `FAILED` when not initialized; `PARAM_INVALID` for a bad name; `NOT_CONNECTED` without a
    /// usable link (with AutoConnect, one is made).
    pub fn remote_regions(&self, remote_engine: &str) -> Result<Vec<RemoteRegionDesc>> {
        self.on_link(remote_engine, |_, link| {
            Ok(link
                .regions()
                .map(|r| RemoteRegionDesc {
                    addr: r.addr(),
                    len: r.len(),
                    mem_type: r.mem_type(),
                    access: r.access(),
                })
                .collect())
        })
    }

    /// The transport of the link to `remote_engine` (TCP, same-host CMA, UCX, Ascend), if one
    /// is held.
    ///
    /// # Errors
    /// As [`Hixl::remote_regions`].
    pub fn transport(&self, remote_engine: &str) -> Result<crate::TransportKind> {
        self.on_link(remote_engine, |_, link| Ok(link.transport()))
    }

    /// How many async requests have not been reported terminal yet.
    pub fn pending_transfers(&self) -> usize {
        lock(&self.reqs).len()
    }

    /// HIXL `SendNotify`: delivered after every transfer started before it on the link.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a bad timeout or a name/message over 1024 bytes; `NOT_CONNECTED`
    /// without a link (and no AutoConnect); `NOTIFY_FAILED` when the peer did not take it
    /// (`TIMEOUT`, `RESOURCE_EXHAUSTED` and `NOT_CONNECTED` keep their codes).
    pub fn send_notify(
        &self,
        remote_engine: &str,
        notify: &NotifyDesc,
        timeout_in_millis: i32,
    ) -> Result<()> {
        let timeout = millis(timeout_in_millis)?;
        self.on_link(remote_engine, |_, link| {
            link.send_notify(&notify.name, &notify.notify_msg, timeout)
                .map_err(|e| {
                    let mut e = Error::from(e);
                    if e.status == Status::FAILED {
                        e.status = Status::NOTIFY_FAILED;
                    }
                    e
                })
        })
    }

    /// HIXL `GetNotifies`: every notification received so far, oldest first.
    ///
    /// # Errors
    /// `FAILED` when not initialized.
    pub fn get_notifies(&self) -> Result<Vec<NotifyDesc>> {
        let core = self.read();
        let got = match &core.engine {
            Some(Typed::Connected(e)) => e.get_notifies(),
            Some(Typed::Registered(e)) => e.get_notifies(),
            _ => return Err(not_initialized()),
        };
        Ok(got
            .into_iter()
            .map(|n| NotifyDesc {
                name: n.name,
                notify_msg: n.msg,
            })
            .collect())
    }
}

/// The deadline the engine enforces on async requests (HIXL leaves it to the caller; its
/// default timeouts are 1000 ms, which would cut large batches short, so a generous one).
pub const ASYNC_DEADLINE: Duration = Duration::from_secs(60);

impl Drop for Hixl {
    fn drop(&mut self) {
        self.finalize();
    }
}

fn status_of(r: &crate::TransferReq<'static>) -> TransferStatus {
    match r.status() {
        crate::TransferStatus::Waiting => TransferStatus::Waiting,
        crate::TransferStatus::Completed => TransferStatus::Completed,
        crate::TransferStatus::TimedOut => TransferStatus::Timeout,
        crate::TransferStatus::Failed(_) | crate::TransferStatus::Cancelled => {
            TransferStatus::Failed
        }
    }
}

/// For each descriptor, the registered region holding its local range, and the offset in it.
fn local_regions(
    core: &Core,
    descs: &[TransferOpDesc],
) -> Result<Vec<(Arc<Region<crate::MemDesc>>, usize)>> {
    let mut out = Vec::with_capacity(descs.len());
    for (i, d) in descs.iter().enumerate() {
        let found = core
            .regions
            .range(..=d.local_addr)
            .next_back()
            .map(|(_, r)| r)
            .filter(|r| {
                d.len > 0
                    && d.local_addr
                        .checked_add(d.len)
                        .is_some_and(|end| end <= r.addr() + r.len())
            });
        match found {
            Some(r) => out.push((r.clone(), d.local_addr - r.addr())),
            None => {
                return Err(Error::new(
                    Status::PARAM_INVALID,
                    format!(
                        "descriptor {i}: local range {:#x}+{} is not inside one region registered \
                         with this engine",
                        d.local_addr, d.len
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// The typed descriptors: local ranges from the regions found, remote ranges validated against
/// the peer's table.
fn descriptors<'a>(
    link: &'a Link<'static>,
    regions: &'a [(Arc<Region<crate::MemDesc>>, usize)],
    descs: &[TransferOpDesc],
) -> Result<Vec<crate::TransferDesc<'a>>> {
    descs
        .iter()
        .zip(regions)
        .map(|(d, (region, off))| {
            let local = region.range(*off..*off + d.len)?;
            let remote = link.remote(d.remote_addr as u64, d.len as u64)?;
            Ok(crate::TransferDesc::new(local, remote))
        })
        .collect()
}
