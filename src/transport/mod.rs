//! Transports: how bytes move once a link exists.
//!
//! The control plane (handshake, region tables, disconnect) is common to all transports and
//! speaks the [`wire`](crate::wire) protocol over TCP. Data moves over TCP; between engines on one
//! host over the same-host transport (`cma`); over UCX (`ucx/`) when both engines ask for it;
//! over HCCL (`ascend/`) between Ascend engines. Vendor libraries are loaded at run time
//! (`crate::dl`); [`probe`] reports what is available.

pub(crate) mod ascend;
pub(crate) mod same_host;
pub(crate) mod tcp;
pub(crate) mod ucx;

use std::time::Instant;

use crate::error::{Error, Status};
use crate::types::{LaneDesc, TransferOp};
use crate::wire::Kind;

/// A link's first lane while the link is set up, as a transport sees it: frames out and in,
/// every failure already the caller's error. The runtime implements it over the TCP lane, so a
/// transport's handshake never sees TCP.
pub(crate) trait Control {
    /// Sends one encoded frame.
    fn send(&mut self, frame: &[u8], deadline: Instant) -> Result<(), Error>;
    /// Reads the next frame: its kind and payload (a REFUSE comes back as the peer's refusal).
    fn recv(&mut self, deadline: Instant) -> Result<(Kind, Vec<u8>), Error>;
    /// The caller's error for a peer that broke the protocol.
    fn protocol(&self, problem: String) -> Error;
    /// The caller's error for the peer's refusal to set the transport up.
    fn refused(&self, status: Status, reason: String) -> Error;
}

/// How a batch failed on a [`DataPath`]; the link turns it into the caller's error.
#[derive(Debug)]
pub(crate) enum PathFail {
    /// The peer is gone: the link breaks for `why`, and the caller gets `NOT_CONNECTED`.
    Gone(String),
    /// The path failed and poisons the link (HIXL: reconnect to go on): the link breaks for
    /// `why`, and the caller gets `error`.
    Poisoned {
        /// Why the link is broken from now on.
        why: String,
        /// The caller's error.
        error: Error,
    },
    /// The batch failed; the link is as it was.
    Failed(Error),
}

/// A way to move a batch of descriptors without a TCP lane (TCP lanes are the fallback every
/// link has). A link tries its data paths in preference order and takes the first that
/// [`covers`](DataPath::covers) the batch.
pub(crate) trait DataPath: Sync {
    /// The transport it belongs to.
    fn kind(&self) -> TransportKind;

    /// Whether it moves this batch (every region of the batch is reachable by it).
    fn covers(&self, descs: &[LaneDesc]) -> bool;

    /// Whether it writes and reads a same-host peer's memory one-sidedly, so a batch runs
    /// inside the server's fence for the link (see `transport::same_host::fence`), when the link has one.
    fn fenced(&self) -> bool;

    /// Whether a broken link refuses a batch before this path is tried (paths that a failure
    /// poisons); the others check the peer themselves.
    fn refused_when_broken(&self) -> bool;

    /// Moves the batch by `deadline`; `stop` cancels it where the path can be cancelled.
    ///
    /// # Safety
    /// Every descriptor's local range is valid registered memory (readable for WRITE, writable
    /// and unaliased for READ) for the whole call, and its remote range was checked against
    /// the peer's table.
    unsafe fn run(
        &self,
        peer: &str,
        op: TransferOp,
        descs: &[LaneDesc],
        deadline: Instant,
        stop: &dyn Fn() -> bool,
    ) -> Result<(), PathFail>;
}

/// The transports hixl knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportKind {
    /// TCP, between any two hosts.
    Tcp,
    /// Same host, one-sided (shared mappings, `/proc/PID/mem`, `process_vm_readv`).
    Cma,
    /// UCX (RDMA verbs, tcp, shared memory), loaded at run time.
    Ucx,
    /// Ascend ACL + HCCL, loaded at run time.
    Ascend,
}

/// Whether a transport can be used here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportInfo {
    /// The transport.
    pub kind: TransportKind,
    /// Whether it can be used.
    pub available: bool,
    /// Why not, or what it runs on.
    pub detail: &'static str,
}

/// Which transports this build and this machine provide. Never panics, has no side effects
/// (the Ascend libraries are opened once, to check their symbols, and nothing is initialised;
/// the answer is kept for the life of the process).
pub fn probe() -> Vec<TransportInfo> {
    vec![
        TransportInfo {
            kind: TransportKind::Tcp,
            available: true,
            detail: "built in",
        },
        match same_host::available() {
            Ok(()) => TransportInfo {
                kind: TransportKind::Cma,
                available: true,
                detail: "pidfd, sealed memfd mappings and process_vm_readv/writev (per peer: same boot id and pid namespace, and ptrace rights)",
            },
            Err(why) => TransportInfo {
                kind: TransportKind::Cma,
                available: false,
                detail: why,
            },
        },
        match ucx::ffi::ucp() {
            Ok(_) => TransportInfo {
                kind: TransportKind::Ucx,
                available: true,
                detail: "libucp loaded (UCP RMA; UCX_TLS and UCX_NET_DEVICES choose the devices); needs Options::psk",
            },
            Err(_) => TransportInfo {
                kind: TransportKind::Ucx,
                available: false,
                detail: "libucp.so.0 (UCX 1.13 or later) cannot be loaded; set HIXL_UCX_LIB or install UCX",
            },
        },
        match ascend::probe() {
            Ok(detail) => TransportInfo {
                kind: TransportKind::Ascend,
                available: true,
                detail,
            },
            Err(detail) => TransportInfo {
                kind: TransportKind::Ascend,
                available: false,
                detail,
            },
        },
    ]
}
