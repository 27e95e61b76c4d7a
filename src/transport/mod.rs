//! Transports: how bytes move once a link exists, and the two traits a transport implements.
//!
//! The control plane (handshake, region tables, notifications, heartbeat, disconnect;
//! `runtime/serve/`) is common to all transports and speaks the [`wire`](crate::wire)
//! protocol over TCP: every link has TCP lanes, and TCP (`tcp/`) is also the `DataPath` of
//! last resort, which covers every batch. A transport adds a `DataPath` (how a link moves a
//! batch with it) and, but for TCP, a `Backend` (its engine-wide part: what it keeps while the
//! engine is open to links, the client's and the server's side of a new link's setup): the
//! same-host transport (`same_host/`, `TransportKind::SameHost`), UCX (`ucx/`) and Ascend HCCL
//! (`ascend/`). They are registered in one place, `runtime::transports::start`; a link tries
//! their paths in that order, then TCP's. Vendor libraries are loaded at run time
//! (`crate::dl`); [`probe`] reports what is available. No transport imports another.

pub(crate) mod ascend;
pub(crate) mod same_host;
pub(crate) mod tcp;
pub(crate) mod ucx;

use std::any::Any;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Status};
use crate::types::batch::Descs;
use crate::types::{MemType, RegionView, TransferOp};
use crate::wire::{Kind, TableEntry, WireError};

/// A registered region as a transport sees it. A transport that keeps the `Arc` keeps the
/// memory alive (and registered) while it does.
pub(crate) trait Region: Send + Sync {
    /// Where the region is and what peers may do with it.
    fn view(&self) -> RegionView;
    /// What the engine's transports registered of it ([`Backend::register`]); a transport
    /// finds its own by type.
    fn registrations(&self) -> &[Registration];
}

/// A transport's registration of a region with its own library (HCCL's, on an Ascend engine),
/// kept by the region until its memory goes.
pub(crate) type Registration = Box<dyn Any + Send + Sync>;

/// An engine's regions, as its transports see them.
pub(crate) type Regions = Vec<Arc<dyn Region>>;

/// What a transport's client side gets to set up its data path on a new link: after WELCOME,
/// on the link's first lane.
pub(crate) struct Setup<'a> {
    /// This engine's name and the peer's.
    pub(crate) me: &'a str,
    pub(crate) peer: &'a str,
    /// The peer's region table.
    pub(crate) table: &'a [TableEntry],
    /// When the link must be up.
    pub(crate) deadline: Instant,
    /// The link's first lane.
    pub(crate) ctl: &'a mut dyn Control,
    /// The peer's process, when it is on this host and granted this link one-sided access (the
    /// link holds the server's fence); the same-host transport takes it.
    pub(crate) local: Option<crate::process::PeerProc>,
    /// Whether a data path set up before this one already moves the link's batches.
    pub(crate) covered: bool,
    /// Why the last transport that could have served the link did not (for the caller's error
    /// when the link requires it).
    pub(crate) why_not: Option<&'static str>,
    /// Whether the peer is this engine itself (a fabric-memory engine's self-link: the "remote"
    /// memory is this process's own).
    pub(crate) loopback: bool,
}

/// What a transport's server side gets when a client asks it to set up a link's data path.
pub(crate) struct Accept<'a> {
    /// This engine's name and the client's.
    pub(crate) me: &'a str,
    pub(crate) client: &'a str,
    /// The request's payload.
    pub(crate) payload: &'a [u8],
    /// Whether the client's link holds a fence: one-sided access on this host that the server
    /// revokes, and waits for, before its memory can go.
    pub(crate) fenced: bool,
    /// Whether the client may be a process on this host, whatever it said about itself (it
    /// connects from an address of this host). A one-sided path to such a client must be fenced.
    pub(crate) on_this_host: bool,
    /// Writes one frame to the client.
    pub(crate) send: &'a mut dyn FnMut(&[u8]) -> std::io::Result<()>,
}

/// How the server side of a setup request failed.
#[derive(Debug)]
pub(crate) enum AcceptFail {
    /// Writing to the client failed: the connection is gone.
    Io(std::io::Error),
    /// The request broke the protocol: the connection is closed.
    Violation(WireError),
}

/// A transport's engine-wide part. The runtime calls it at `activate`/`deactivate`, when a new
/// link is set up (client), and when a client's setup request arrives (server).
pub(crate) trait Backend: Send + Sync {
    /// The transport it belongs to.
    fn kind(&self) -> TransportKind;

    /// The engine opens to links with `regions` (`serving`: it listens). A failure costs speed
    /// only: the transport logs it and stays out of the way.
    fn activate(&self, _regions: &Regions, _serving: bool, _span: &tracing::Span) {}

    /// A region is being registered with the engine (before it enters the region table): a
    /// transport that registers memory with its library does it here, and the region keeps
    /// what it returns until its memory goes. An error fails the registration.
    ///
    /// # Safety
    /// `addr..addr + len` is memory of `mem_type` that stays allocated until the returned
    /// registration is dropped, and no Rust reference to it is live while peers may write it.
    unsafe fn register(
        &self,
        _addr: usize,
        _len: usize,
        _mem_type: MemType,
    ) -> Result<Option<Registration>, Error> {
        Ok(None)
    }

    /// The engine leaves `Connected`: nothing of its regions stays reachable through this
    /// transport, and it keeps none of them.
    fn deactivate(&self) {}

    /// A region was registered while the engine is open to links (only the compat engine does
    /// this: HIXL registers while linked). Links set up from now on may reach it; the
    /// transport may let existing links use it locally. Without an override the region is not
    /// this transport's: peers reach it over TCP.
    fn region_added(&self, _region: &Arc<dyn Region>) {}

    /// Whether region `id` can be withdrawn while the engine is open to links: `Err(why)` when
    /// this transport gave peers one-sided access to it that it cannot take back alone.
    fn can_withdraw(&self, _id: u32) -> Result<(), &'static str> {
        Ok(())
    }

    /// Region `id` is withdrawn (after [`can_withdraw`](Backend::can_withdraw) allowed it):
    /// when this returns, no peer reaches it through this transport, and the transport keeps
    /// nothing of it.
    fn region_withdrawn(&self, _id: u32) {}

    /// Client: sets up this transport's data path on a new link. `Ok(None)`: not on this link
    /// (the peer does not offer it, or it is not needed); `Err`: the link fails.
    fn connect(&self, setup: &mut Setup<'_>) -> Result<Option<Box<dyn DataPath>>, Error>;

    /// Server: the frame kind of a client's setup request for this transport, if it has one.
    fn request_kind(&self) -> Option<Kind> {
        None
    }

    /// Why the engine's memory may not be deregistered now (a fabric-memory engine with a
    /// peer connected: upstream's `FAILED`), or `None`.
    fn deregistration_blocked(&self) -> Option<&'static str> {
        None
    }

    /// Whether a client may send that request more than once on one connection.
    fn repeatable(&self) -> bool {
        false
    }

    /// Server: answers a client's setup request. What it returns is the server's side of the
    /// link's data path, kept (and dropped) with the link.
    fn accept(&self, _req: Accept<'_>) -> Result<Option<Box<dyn Any + Send>>, AcceptFail> {
        Ok(None)
    }
}

/// What a data path knows about its peer without a heartbeat PING.
#[derive(Debug)]
pub(crate) enum Health {
    /// Nothing: the link pings.
    Unknown,
    /// The path watches the peer itself (a same-host peer's pidfd): no PING.
    Watched,
    /// The path failed for this reason: the link breaks.
    Failed(String),
}

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
    /// Another handle to the lane's socket, to notice the peer closing it.
    fn watch(&self) -> std::io::Result<std::net::TcpStream>;
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
    /// The batch failed; the link is as it was (or the path broke it itself: TCP's lanes).
    Failed(Error),
    /// An async request ended (cancelled, or its deadline passed while the path waited for a
    /// lane) before the path started it (see [`Batch::start`]): nothing was touched.
    NotStarted,
}

/// A checked batch, as a [`DataPath`] runs it.
#[derive(Clone, Copy)]
pub(crate) struct Batch<'a> {
    /// The peer's name, for errors.
    pub(crate) peer: &'a str,
    pub(crate) op: TransferOp,
    /// Every local range lies in registered memory and every remote range in the peer's table.
    pub(crate) descs: Descs<'a>,
    /// The bytes of all of them.
    pub(crate) bytes: u64,
    /// When the call (or the async request) started, for its timeout error.
    pub(crate) started: Instant,
    /// When it must have ended.
    pub(crate) deadline: Instant,
    /// Whether the caller waits for it, or it is an async request (and how to cancel it).
    pub(crate) mode: Mode<'a>,
    /// Inside a same-host server's fence: its word that says the server gave this client up
    /// (stopped or hung past the server's grace), non-zero from then on. A path that copies
    /// one-sidedly stops between its parts once it is set, as for a cancel: a client resumed
    /// after it was given up on moves at most the parts its threads had begun (128 KiB each
    /// for mapped memory, up to 8 MiB for `process_vm_*` copies; UCX: its chunk).
    pub(crate) given_up: Option<&'a crate::sync::model::AtomicU32>,
}

/// Whether a fence's "given up" word ([`Batch::given_up`]) is set.
pub(crate) fn given_up(word: Option<&crate::sync::model::AtomicU32>) -> bool {
    word.is_some_and(|w| w.load(std::sync::atomic::Ordering::SeqCst) != 0)
}

/// How a batch runs: on the caller's thread, which waits for it (nothing cancels it), or as an
/// async request, which a cancel ends.
#[derive(Clone, Copy)]
pub(crate) enum Mode<'a> {
    /// A sync transfer.
    Sync,
    /// An async request's batch, and its cancellation.
    Request(&'a dyn Cancel),
}

impl Batch<'_> {
    /// The path is about to touch memory; until [`Batch::unwatch`], a cancel shuts `sock`
    /// down, when the path gives one (TCP: the lane's socket); a path without one polls
    /// [`Batch::cancel_requested`] or runs to its end.
    ///
    /// # Errors
    /// [`PathFail::NotStarted`] when the request has ended meanwhile (cancelled, or its deadline
    /// passed): the path returns it without touching memory.
    pub(crate) fn start(&self, sock: Option<BorrowedFd<'_>>) -> Result<(), PathFail> {
        match self.mode {
            Mode::Request(c) if !c.start(sock) => Err(PathFail::NotStarted),
            _ => Ok(()),
        }
    }

    /// A cancel no longer touches the socket given to [`Batch::start`], which may be closed
    /// now. Whether a cancel was asked for (the socket may have been shut down).
    pub(crate) fn unwatch(&self) -> bool {
        matches!(self.mode, Mode::Request(c) if c.unwatch())
    }

    /// Whether the server gave this (fenced) batch's client up: see [`Batch::given_up`].
    pub(crate) fn given_up(&self) -> bool {
        given_up(self.given_up)
    }

    /// Whether a cancel was asked for.
    pub(crate) fn cancel_requested(&self) -> bool {
        matches!(self.mode, Mode::Request(c) if c.requested())
    }
}

/// An async request's cancellation as the data path running its batch sees it (the runtime
/// implements it over the request's state): a request is queued, and a cancel or its deadline
/// ends it at once, until its path starts it; then a cancel shuts the path's socket down (TCP)
/// or is polled (UCX).
pub(crate) trait Cancel: Sync {
    /// The request starts; until [`Cancel::unwatch`], a cancel shuts `sock` down. `false` when
    /// it has ended already.
    fn start(&self, sock: Option<BorrowedFd<'_>>) -> bool;
    /// A cancel no longer touches the socket; whether one was asked for.
    fn unwatch(&self) -> bool;
    /// Whether a cancel was asked for.
    fn requested(&self) -> bool;
}

/// A way to move a batch of descriptors. A link decides, for each region of the peer's table,
/// which of its data paths reach it (the transports' in preference order, as
/// `runtime::transports` registers them, then TCP's, which reaches every region) the first
/// time a batch touches it; a batch runs on the first path that reaches all its regions and
/// [`covers`](DataPath::covers) its local ranges.
pub(crate) trait DataPath: Send + Sync {
    /// The transport it belongs to.
    fn kind(&self) -> TransportKind;

    /// Whether it reaches region `region` of the peer's table: asked once per region and link
    /// (the answer is kept for the link's life).
    fn reaches(&self, region: u32) -> bool;

    /// Whether it moves this batch, whose remote regions it [`reaches`](Self::reaches): by
    /// default yes; a path that moves only some local memory (HCCL: regions bound to its
    /// communicator) looks at the local ranges here.
    fn covers(&self, _descs: &Descs<'_>) -> bool {
        true
    }

    /// Whether it writes and reads a same-host peer's memory one-sidedly, so a batch runs
    /// inside the server's fence for the link (see `runtime::revoke`), when the link has one.
    fn fenced(&self) -> bool;

    /// Whether its batches enter the link's fence when the link has one: a
    /// [`fenced`](Self::fenced) path's do; a one-sided path that also runs where no fence can
    /// be had (fabric memory, whose clients may be on other hosts) says so here, and enters it
    /// on a link to this host.
    fn enters_fence(&self) -> bool {
        self.fenced()
    }

    /// Whether a broken link refuses a batch before this path is tried (paths that a failure
    /// poisons); the others check the peer themselves.
    fn refused_when_broken(&self) -> bool;

    /// Moves the batch by its deadline: a list or a block batch (a path that takes
    /// descriptors only expands a block batch once, [`Descs::expand`]). Before it touches
    /// memory it calls [`Batch::start`] (and returns its [`PathFail::NotStarted`]); a path that
    /// can be stopped while it runs says how there, or polls [`Batch::cancel_requested`].
    ///
    /// # Safety
    /// Every descriptor's (and block's) local range is valid registered memory (readable for
    /// WRITE, writable and unaliased for READ) for the whole call, and its remote range was
    /// checked against the peer's table.
    unsafe fn run(&self, batch: &Batch<'_>) -> Result<(), PathFail>;

    /// Whether it moves device memory (a link without such a path moves host memory only).
    fn moves_device_memory(&self) -> bool {
        false
    }

    /// What it knows of the peer, for the heartbeat.
    fn health(&self) -> Health {
        Health::Unknown
    }

    /// The link closes: release what must not wait for the last handle to go.
    fn close(&self) {}
}

/// The transports hixl knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportKind {
    /// TCP, between any two hosts.
    Tcp,
    /// The same-host transport, one-sided (shared mappings, `/proc/PID/mem`,
    /// `process_vm_readv`).
    SameHost,
    /// UCX (RDMA verbs, tcp, shared memory), loaded at run time.
    Ucx,
    /// Ascend ACL + HCCL, loaded at run time.
    Ascend,
}

impl TransportKind {
    /// Its name in messages, logs and the bindings: `"tcp"`, `"same-host"`, `"ucx"`,
    /// `"ascend"`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::SameHost => "same-host",
            Self::Ucx => "ucx",
            Self::Ascend => "ascend",
        }
    }
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
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
                kind: TransportKind::SameHost,
                available: true,
                detail: "pidfd, sealed memfd mappings and process_vm_readv/writev (per peer: same boot id and pid namespace, and ptrace rights)",
            },
            Err(why) => TransportInfo {
                kind: TransportKind::SameHost,
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
