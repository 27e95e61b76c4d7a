//! HIXL's call shape, checked at run time: one owned engine keyed by remote engine name, with
//! integer addresses and HIXL's status codes. The C ABI (`hixl-capi`, `libhixl.so`), the C++
//! header (`include/hixl/hixl.h`) and the Python package are thin layers over it.
//!
//! [`Hixl`] mirrors `hixl::Hixl` of HIXL's C++ API method for method. It is a face on the core
//! floor (`runtime::handle`), beside the typed API: it holds an engine, its regions' records by
//! handle and its links by remote name, and what the typed API's type states prove at compile
//! time is checked here before each call, with HIXL's status:
//!
//! | misuse | status |
//! |---|---|
//! | any call before `initialize` or after `finalize`; `initialize` twice | `FAILED` |
//! | deregistering, while a link exists, a region UCX serves one-sided | `UNSUPPORTED` |
//! | deregistering handle 0 (an unknown or already-deregistered handle: `SUCCESS`, nothing done, as HIXL) | `PARAM_INVALID` |
//! | deregistering memory a transfer still uses (an async request, or a sync one on another thread) | `RESOURCE_EXHAUSTED` (still registered) |
//! | a local range not inside one region this engine registered | `PARAM_INVALID` |
//! | a remote range not inside one region of the peer's table | `PARAM_INVALID` |
//! | a transfer or notify to a remote that is not connected (without `AutoConnect`) | `NOT_CONNECTED` |
//! | connecting twice | `ALREADY_CONNECTED` |
//! | a status query for an unknown (or already reported) request; for request 0 | `PARAM_INVALID`; `FAILED` (HIXL's) |
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
//! registered and deregistered at any time, links or not. The compat engine therefore opens the
//! core engine at `initialize` (serving starts with no regions, so peers can connect at once)
//! and changes its region table live, as the core floor allows in any state (the typed API
//! keeps registering after `activate` a compile error):
//!
//! - `register_mem` while linked: the region is usable by this engine's transfers at once (on
//!   an Ascend engine it is bound to the communicators of its existing links) and is in the
//!   table of every peer that connects afterwards; a link keeps the peer's table it got at
//!   connect.
//! - `deregister_mem` while linked: the region leaves the table, requests of peers being applied
//!   to it are waited for and later ones refused (`PARAM_INVALID`, nothing touched), and every
//!   device data path (HCCL communicator) that bound it is closed: those links break (with
//!   AutoConnect the next call connects again). Where UCX serves the region one-sided it cannot
//!   take one region back: then deregistration waits for a moment without links, as the typed
//!   engine's does (`UNSUPPORTED` while one exists).
//! - `disconnect` of a peer that went away (finalized, or its process ended) succeeds.
//!
//! ## Engine-allocated memory (an extension)
//!
//! [`Hixl::alloc_host_mem`] allocates a [`HostBuffer`](crate::HostBuffer) the engine owns and
//! registers it (live, like `register_mem`). Same-host peers map it and copy one-sidedly, while
//! caller-managed memory is served to them over TCP only: the engine can keep its own memory
//! from being freed or reused while a one-sided peer may still write it, not the caller's.
//! Deregistered while linked, such a buffer leaves the table at once (TCP requests are refused),
//! and its allocation is kept until every same-host link that got it in its table has ended and
//! left its fence (the quarantine frees it then; [`Hixl::metrics`] counts it meanwhile). The
//! [`HostMem`] it returns keeps the memory mapped while it lives, registration or not, which is
//! what lets the Python package hand out views that cannot outlive the memory. When the
//! registration ends (deregistration or `finalize`) while a same-host peer may have mapped the
//! buffer, the pages the `HostMem` shows are replaced in place by a private copy first: a peer
//! whose link is still up, or one `finalize` gave up on, copies into or out of the pages it
//! mapped, never the keep-alive's (same-host clients reach a memfd region only through its
//! mapping, not at its address).
//!
//! ## Ascend
//!
//! Where CANN's ACL runtime and HCCL load, an engine uses the device `aclrtGetDevice` reports on
//! the thread that calls `initialize` (see [`crate::AscendMode`]): `MEM_DEVICE` memory is then
//! registered with HCCL and moved over it, with no hixl-specific option. Elsewhere `MEM_DEVICE`
//! is `UNSUPPORTED`.
//!
//! ## AutoConnect
//!
//! With `"AutoConnect" = "1"` a transfer or notify to a remote that is not connected connects
//! first (with the engine's connect timeout, `hixl.ConnectTimeoutMs`, 1000 ms by default), and a
//! link that broke (a failed transfer, or the heartbeat noticing the peer is gone) is dropped so
//! the next call connects again. A notification whose time went by waiting for this engine's
//! own earlier transfers (`TIMEOUT`) does not count: the link and those transfers stay. Without it, a broken link answers `NOT_CONNECTED` until it is
//! disconnected or connected again (a new connect supersedes a broken link).
//!
//! ## Requests
//!
//! `transfer_async` returns a non-zero request id. A status query that reports a terminal
//! status (completed, timeout, failed) forgets the request, as HIXL frees it; asking again, or
//! for an id never issued, gives `FAILED`, never a stale request.
//!
//! ## Where things are
//!
//! `types` (HIXL's descriptors, statuses and option keys), `error` (the compat error),
//! `lifecycle` (initialize, finalize, register and deregister), `connections` (connect,
//! disconnect, AutoConnect), `transfers` (transfers, request status, notifies).

mod connections;
mod error;
mod lifecycle;
mod transfers;
mod types;

pub use error::{Error, Result};
pub use types::{
    BlockDesc, FEATURE_NOT_SUPPORTED, FEATURE_SUPPORTED, FeatureType, GetTransferStatusArgs,
    MemDesc, MemHandle, NotifyDesc, OPTION_AUTO_CONNECT, OPTION_BUFFER_POOL,
    OPTION_ENABLE_USE_FABRIC_MEM, OPTION_GLOBAL_RESOURCE_CONFIG, OPTION_LOCAL_COMM_RES,
    OPTION_RDMA_SERVICE_LEVEL, OPTION_RDMA_TRAFFIC_CLASS, RemoteRegionDesc, TransferArgs,
    TransferOpDesc, TransferReq, TransferResult, TransferStatus, capability_of, get_capability,
};

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use crate::Status;
use crate::runtime::handle::{Engine, RegionHandle, ReqHandle};
use crate::runtime::peers::Peers;

/// A registered region: caller-managed memory ([`Hixl::register_mem`]) or a buffer the engine
/// allocated ([`Hixl::alloc_host_mem`]); the engine's record either way.
struct Reg {
    core: RegionHandle,
    /// A buffer the engine allocated (its keep-alive gets private pages when it is let go).
    allocated: bool,
}
/// A host buffer the engine allocated and registered ([`Hixl::alloc_host_mem`]): a hixl
/// extension, the way to get same-host peers' one-sided path (caller-managed memory is served
/// to them over TCP, as the engine cannot keep it from its owner while a peer may still write
/// it).
///
/// The value is a keep-alive, not the registration: the memory stays mapped (and its bytes
/// readable and writable through [`HostMem::as_ptr`]) while this value or the registration
/// lives, whichever is longer. [`Hixl::deregister_mem`] with [`HostMem::handle`] (or
/// `finalize`) ends the registration; dropping the value does not. When the registration ends,
/// pages a same-host peer may have mapped are replaced, at the same address, by a private copy:
/// from then on no peer reaches the bytes this value shows. The memory is freed once both are
/// gone and no peer may still touch the pages it shared: a same-host peer whose link got the
/// buffer in its region table may copy into or out of them until that link ends, so they are
/// kept (never reused) until then.
///
/// It never hands out `&[u8]`: peers write the memory at any time while it is registered.
pub struct HostMem {
    core: RegionHandle,
    handle: MemHandle,
}

impl HostMem {
    /// The first byte's address (page-aligned): what `TransferOpDesc`s and the peer use.
    pub fn addr(&self) -> usize {
        self.core.addr
    }
    /// Length in bytes (as asked; the mapping is rounded up to a page).
    pub fn len(&self) -> usize {
        self.core.len
    }
    /// Always false: empty buffers are refused.
    pub fn is_empty(&self) -> bool {
        self.core.len == 0
    }
    /// The registration's handle, for [`Hixl::deregister_mem`].
    pub fn handle(&self) -> MemHandle {
        self.handle
    }
    /// The first byte as a raw pointer, valid for reads and writes of [`HostMem::len`] bytes
    /// while `self` lives. Reading or writing through it is `unsafe` and races with peers and
    /// transfers while the buffer is registered, as for any registered memory.
    pub fn as_ptr(&self) -> *mut u8 {
        self.core.ptr_at(0)
    }
}

impl fmt::Debug for HostMem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMem")
            .field("addr", &format_args!("{:#x}", self.core.addr))
            .field("len", &self.core.len)
            .field("handle", &self.handle)
            .finish()
    }
}

static_assertions::assert_impl_all!(HostMem: Send, Sync);

#[derive(Default)]
struct Core {
    /// The engine of the core floor, once initialized (open to links unless a restart of
    /// serving failed: see `lifecycle::connected`).
    engine: Option<Engine>,
    finalized: bool,
    auto_connect: bool,
    connect_timeout: Duration,
    /// The registrations by handle (the engine's region table finds them by address).
    handles: HashMap<MemHandle, Reg>,
}

struct Pending {
    /// Shared so [`Hixl::wait_transfer`] can wait on it without holding the table's lock.
    req: Arc<ReqHandle>,
    user_data: u64,
}

/// The runtime-checked engine (HIXL's `hixl::Hixl`). `Send + Sync`: share it by `&` or `Arc`.
pub struct Hixl {
    core: RwLock<Core>,
    /// Links by remote name (the core floor's table, with HIXL's rules for them).
    peers: Peers,
    /// Async requests by id (ids unique in the process: `transfers::next_request`).
    reqs: Mutex<BTreeMap<TransferReq, Pending>>,
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
            peers: Peers::default(),
            reqs: Mutex::new(BTreeMap::new()),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Core> {
        self.core.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write(&self) -> RwLockWriteGuard<'_, Core> {
        self.core.write().unwrap_or_else(|e| e.into_inner())
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
