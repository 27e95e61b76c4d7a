//! # hixl: one-sided memory transfer where misuse does not compile
//!
//! hixl moves memory between processes and machines with one-sided READ (remote → local) and
//! WRITE (local → remote): the engine under KV-cache transfer in disaggregated LLM serving. It
//! follows the HIXL model (Huawei CANN's transfer library): an engine named `ip[:port]` is
//! initialized, registers memory, connects to remote engines, runs batches of
//! `{local, remote, len}` descriptors, then disconnects, deregisters and finalizes, with HIXL's
//! numeric status codes.
//!
//! ## Quick start
//!
//! ```
//! use hixl::{Hixl, HostBuffer, Options, TransferDesc, TransferOp};
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), hixl::Error> {
//! // a serving engine (it listens) with a 1 MiB cache, and a client engine with a 1 MiB buffer
//! let (server, cache) = Hixl::initialize_ephemeral("127.0.0.1", Options::default())?
//!     .register(HostBuffer::new(1 << 20)?)?;
//! let server = server.activate()?;
//! let (client, mut buf) = Hixl::initialize("127.0.0.1", Options::default())?
//!     .register(HostBuffer::new(1 << 20)?)?;
//! let client = client.activate()?;
//!
//! buf.write_at(0, b"hello, decode side")?;
//! {
//!     let link = client.connect(server.name())?;                  // the server's table arrives
//!     let remote = link.remote(cache.addr() as u64, 18)?;          // validated against it
//!     let desc = TransferDesc::new(buf.range(0..18)?, remote);
//!     link.transfer_sync(TransferOp::Write, &[desc], Duration::from_secs(1))?;
//!     link.disconnect(Duration::from_secs(1))?;                    // consumes the link
//! }
//! let server = server.deactivate();                                // no link can exist now
//! let cache = server.deregister(cache)?;                           // the memory comes back
//! assert_eq!(&cache[..18], b"hello, decode side");
//! let _ = (client.finalize(), server.finalize());
//! # Ok(()) }
//! ```
//!
//! ## The lifecycle
//!
//! ```text
//! Hixl<Initialized> --register--> Hixl<Registered> --activate--> Hixl<Connected> --finalize--> Hixl<Finalized>
//!        |                           ^  register / deregister         |  connect(&self) -> Link<'_>
//!        +--finalize--> Finalized    +----------- deactivate ---------+  (every link gone first)
//! ```
//!
//! | misuse | what you get |
//! |---|---|
//! | registering after `activate` (after links can exist) | compile error: no `register` on `Hixl<Connected>` |
//! | transferring without a link | compile error: transfers are methods of [`Link`] |
//! | a descriptor from a raw address or integer | compile error: descriptors take [`LocalRange`] and [`RemoteRange`] |
//! | a region after `deregister`, a link after `disconnect`, an engine after `finalize` or any transition | compile error (use of moved value) |
//! | deregistering or finalizing while a link is open | compile error: links borrow the connected engine |
//! | a [`ContextToken`] sent to another thread | compile error: it is `!Send` |
//! | a range outliving its region, a link outliving its engine | compile error (borrow) |
//! | a region of engine A used on engine B, a remote range of another link | [`Error::ForeignHandle`], `PARAM_INVALID` |
//! | a range outside the peer's table, wrong lengths, forbidden access | `PARAM_INVALID`, checked locally and again by the peer |
//! | a dead peer, a timeout | `NOT_CONNECTED` / `TIMEOUT`, within the deadline |
//!
//! The graph is also written down declaratively for the `typestate` crate, which checks that
//! every state is reachable and can reach `Finalized` (`src/spec.rs`, built for the tests); a
//! test keeps it in step with the engine.
//!
//! ## Regions, ranges and links
//!
//! Registration takes ownership of memory ([`HostBuffer`], `Box<[u8]>`, `Vec<u8>`, or anything
//! implementing the `unsafe trait` [`RegistrableMemory`]) and returns a [`Region`]: an owned
//! capability, not a borrow of the engine, so the engine can still change state.
//! `deregister(region)` hands the memory back. HIXL's `MemDesc` form is
//! [`Hixl::register_raw`], an `unsafe fn` with a `# Safety` contract.
//!
//! [`Region::range`] gives a [`LocalRange`] that borrows the region; [`Link::remote`] (by address,
//! as in HIXL) or [`RemoteRegion::range`] give a [`RemoteRange`] that borrows the link. A
//! [`TransferDesc`] pairs them. Memory peers may write is never handed out as a slice while the
//! engine may serve it: use [`Region::read_at`] / [`Region::write_at`], or take it back.
//!
//! ## Thread safety
//!
//! `Hixl<S>`, [`Region`] and [`Link`] are `Send + Sync`. Many threads may transfer on one link
//! at once: a batch runs on the link's first data path that reaches its regions (Ascend, UCX, same host),
//! else over TCP, where each transfer in flight takes a lane of its own (a TCP connection, up to
//! [`Options::max_lanes`]; beyond that it waits for a free one). Device-bound calls take a
//! [`ContextToken`], which is `!Send + !Sync`; [`DetachedContext`] carries the context to
//! another thread.
//!
//! ## Resource cleanup
//!
//! [`Hixl::finalize`] is the explicit teardown: serving threads stop (requests in flight get a
//! bounded grace period), sockets close, and every link closes: its async requests that have
//! not ended, forgotten ones included, are cancelled and waited for, so once it returns nothing
//! of this engine touches registered memory. Dropping an engine does the same. Dropping a
//! [`Link`] disconnects it (cancelling and waiting for its requests the same way); dropping a
//! [`Region`] leaves its memory registered until the engine goes away, then frees it. Teardown
//! never panics.
//!
//! ## Async transfers, notifications, metrics
//!
//! [`Link::transfer_async`] returns a [`TransferReq`] with an enforced deadline, `cancel`,
//! `status`/`wait`, a user-data tag and `Future` support; it owns the memory it touches, so
//! dropping or forgetting it is safe. [`Link::send_notify`] is delivered after every transfer
//! started before it on the link (the KV-ready signal). [`Hixl::connect_async`] queues connects.
//! [`Hixl::metrics`] counts bytes, operations, errors and latency per link and operation.
//!
//! ## HIXL's call shape, checked at run time
//!
//! [`compat::Hixl`] is one owned engine with HIXL's methods (by remote engine name, integer
//! addresses, HIXL's status codes, `AutoConnect`), built on the typed engine: what the type
//! states prove here is checked there at run time. The C ABI (`hixl-capi`, `libhixl.so`,
//! `include/hixl_c.h`) and the header-only C++ API (`include/hixl/hixl.h`) are thin layers
//! over it.
//!
//! ## Transports
//!
//! TCP between any two hosts (zero-copy from and into registered memory, one round trip per
//! batch, large transfers over two lanes). Between engines on one host, the same-host transport:
//! sealed-memfd [`HostBuffer`]s are mapped by the peer and moved with a memory copy;
//! other memory with `process_vm_readv`/`writev`; the peer's CPU does nothing. It is chosen
//! automatically and falls back to TCP where the kernel refuses ([`SameHost`],
//! [`Link::transport`]). UCX (UCP RMA over RDMA verbs, tcp or shared memory, [`Ucx`]) and
//! Ascend (ACL device memory and HCCL one-sided put/get, [`AscendConfig`], [`DeviceBuffer`];
//! verified against an ABI test double, not yet on hardware) are loaded with `dlopen` at run
//! time, so a missing vendor library is a typed error, never a build or link failure; [`probe`]
//! says what is available.

#![deny(unsafe_op_in_unsafe_fn, missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

mod auth;
mod buffers;
pub mod compat;
pub mod cs;
pub mod datadist;

mod device;
mod dl;
mod engine;
mod error;
mod io;
mod link;
mod memory;
mod metrics;
mod notify;
mod options;
mod process;
// A published table (the header, the seqlock, the fetch with retry) that LLM-DataDist and HIXL-CS
// share: public for the fuzz targets of their codecs, hidden from the docs and not part of the
// semver surface.
#[doc(hidden)]
pub mod published;
mod request;
mod runtime;
// The engine's state graph for the `typestate` crate's checks: test support (feature `testkit`).
#[cfg(feature = "testkit")]
#[doc(hidden)]
pub mod spec;
mod sync;
// Test support (reproducible random data, checksums, the Ascend ABI double's builder, a
// same-host write for the pid-reuse test) for the integration tests, the examples and
// hixl-peer: only with the cargo feature `testkit` (off by default), hidden from the docs and not
// part of the semver surface. What in it can write memory is an `unsafe fn`.
#[cfg(feature = "testkit")]
#[doc(hidden)]
pub mod testkit;
mod transport;
mod types;
// The serving engine's handshake, a state machine that owns no socket: public for its fuzz
// target over whole frame sequences, hidden from the docs and not part of the semver surface.
#[doc(hidden)]
pub mod handshake {
    pub use crate::runtime::serve::handshake::{Admission, Handshake, Refusal, Step};
    pub use crate::runtime::serve::limits::MAX_HANDSHAKE_FRAME;

    /// A client's AUTH proof (what an honest client answers a CHALLENGE with) for the HELLO's
    /// client `name` and `target`.
    pub fn client_proof(
        key: &crate::Psk,
        cn: &[u8; 32],
        sn: &[u8; 32],
        name: &str,
        target: &str,
    ) -> [u8; 32] {
        key.client_proof(cn, sn, crate::auth::Who { name, target })
    }
}
// The control protocol's codec: public for the hostile-peer tests and the fuzz target, hidden
// from the docs and not part of the semver surface (the protocol is versioned on the wire).
#[doc(hidden)]
pub mod wire;

/// Fabric memory (`EnableUseFabricMem=1`, HIXL's FabricMem engine on its host-copy path): the
/// allocator statics (HIXL's `MallocMem`, `FreeMem`, `ExportToShareableHandle`) over ACL's
/// virtual memory. See `docs/ascend.md` ("Fabric memory").
pub mod fabric {
    pub use crate::options::FabricConfig;
    pub use crate::runtime::transports::{
        FabricBuffer, export_to_shareable_handle, free_mem, malloc_mem,
    };
}

pub use auth::Psk;
pub use buffers::HostBuffer;
pub use device::{ContextToken, DetachedContext, DeviceBuffer, PinnedHostBuffer};
pub use engine::{
    Connected, Finalized, Hixl, Initialized, Live, Quiescent, Reclaim, Registered, State,
    TransitionError,
};
pub use error::{Error, HandedBack, RemoteRefusal, Status, timeout_from_millis};
pub use link::{BlockLayout, Link, RemoteRange, RemoteRegion, TransferDesc};
pub use memory::{LocalRange, Region};
pub use metrics::{LinkMetrics, Metrics, OpMetrics};
pub use notify::{MAX_NOTIFY_LEN, MAX_PENDING_NOTIFIES, Notify};
pub use options::{AscendConfig, AscendMode, HIXL_KEYS, Options, SameHost, Ucx};
pub use request::{TransferArgs, TransferReq, TransferStatus};
pub use runtime::connect::{ASYNC_QUEUE_CAPACITY, AsyncConnectStatus};
pub use runtime::link::MAX_BATCH;
pub use transport::{TransportInfo, TransportKind, probe};
pub use types::blocks::BlockIndices;
pub use types::engine_name::EngineName;
pub use types::raw::{RawMemory, RegistrableMemory};
pub use types::{Access, MemDesc, MemType, TransferOp};
