//! A served connection as it moves between the poller and the workers: [`Conn`] (the socket
//! and its entry in the connection table), [`Ready`] (a handshake that completed),
//! [`Established`] (a lane of a link, between requests), the [`Work`] workers take, and
//! [`Returns`], the way a lane that went idle gets back to the poller; with what a lane's
//! buffers and requests cost ([`InFlight`], [`trim`]) and why it ends ([`ConnEnd`]).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::epoll::Waker;
use super::limits::ConnTable;
use super::table::Held;
use crate::io::{Inbound, Sock};
use crate::runtime::revoke::fence::ServerFence;
use crate::sync::lock;
use crate::transport::tcp::serve::{Pending, XferServer};
use crate::wire::{self, Hello, Kind, WireError};

/// An accepted connection: its socket, and its entry in the connection table, which it leaves
/// (on drop) before the socket closes, so a descriptor number in the table always names the
/// connection's own socket.
pub(crate) struct Conn {
    pub(super) sock: Sock,
    pub(super) id: u64,
    pub(super) from: SocketAddr,
    /// The server's connection table.
    pub(super) table: Arc<Mutex<ConnTable>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        lock(&self.table).remove(&self.id);
        // the socket closes after this, as the fields drop
    }
}

impl AsRawFd for Conn {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.stream.as_raw_fd()
    }
}

/// A connection whose handshake completed: authenticated, allowed, counted as established.
pub(crate) struct Ready {
    pub(super) conn: Conn,
    /// Whatever the client sent after its last handshake frame.
    pub(super) inb: Inbound,
    pub(super) hello: Box<Hello>,
    /// The fence of a same-host client that proved who it is.
    pub(super) fence: Option<ServerFence>,
    /// The client named a process on this host (the WELCOME says who the server is).
    pub(super) same_host: bool,
    /// The client's address is one of this host's.
    pub(super) on_this_host: bool,
}

/// An established lane: its connection, the link it belongs to, and the buffers its requests
/// reuse.
pub(crate) struct Established {
    pub(super) conn: Conn,
    pub(super) inb: Inbound,
    pub(super) out: Vec<u8>,
    pub(super) xfer: XferServer,
    pub(super) token: u64,
    /// Cleared when the link is superseded or closed: its lanes apply nothing more.
    pub(super) live: Arc<AtomicBool>,
    /// Requests of the link being applied right now.
    pub(super) busy: Arc<AtomicUsize>,
    /// The client engine's name.
    pub(super) client: String,
    /// The lane opened its link (transports' setup requests come on it).
    pub(super) new_link: bool,
    /// The setup requests it made.
    pub(super) asked: Vec<Kind>,
    pub(super) on_this_host: bool,
    /// A request waiting for the socket to take (or give) its bytes.
    pub(super) parked: Option<Parked>,
}

/// Bytes of receive buffer an idle lane keeps.
const IDLE_INBOUND: usize = 4 << 10;

impl Established {
    /// Bytes its buffers hold.
    pub(super) fn footprint(&self) -> usize {
        footprint(&self.inb, &self.xfer, self.out.capacity())
    }

    /// Gives back what the lane's buffers grew to: it waits for its next request holding
    /// little memory.
    pub(super) fn shrink(&mut self) {
        if self.parked.is_some() {
            return; // its request's buffers are in use
        }
        self.inb.shrink_to(IDLE_INBOUND);
        self.xfer = XferServer::default();
        self.out = Vec::new();
    }
}

/// What a serving worker does.
pub(crate) enum Work {
    /// Opens or joins the link of a completed handshake, then serves its requests.
    Open(Box<Ready>),
    /// Serves the requests of a lane that has one coming.
    Serve(Box<Established>),
}

/// Lanes that went idle, on their way back to the poller, which the [`Waker`] wakes: the one
/// channel from the workers to the poller. (Boxed: a lane moves between threads and maps as one
/// pointer.)
#[allow(clippy::vec_box)]
pub(crate) struct Returns {
    lanes: Mutex<Vec<Box<Established>>>,
    waker: Waker,
}

impl Returns {
    pub(super) fn new() -> io::Result<Self> {
        Ok(Self {
            lanes: Mutex::new(Vec::new()),
            waker: Waker::new()?,
        })
    }

    /// The descriptor the poller waits on.
    pub(super) fn fd(&self) -> RawFd {
        self.waker.fd()
    }

    /// Wakes the poller (a lane came back, or serving stops).
    pub(super) fn wake(&self) {
        self.waker.wake();
    }

    /// Hands `lane` back to the poller.
    pub(super) fn give(&self, lane: Box<Established>) {
        lock(&self.lanes).push(lane);
        self.wake();
    }

    /// The lanes handed back since the last call (clears the wake-up).
    #[allow(clippy::vec_box)]
    pub(super) fn take(&self) -> Vec<Box<Established>> {
        self.waker.clear();
        std::mem::take(&mut *lock(&self.lanes))
    }
}

/// Why a serving connection ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnEnd {
    #[error("peer closed the connection")]
    Closed,
    #[error("link closed by BYE")]
    Bye,
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("protocol violation: {0}")]
    Protocol(#[from] WireError),
    #[error("refused: {0}")]
    Refused(String),
}

impl ConnEnd {
    /// How a socket error ends a connection: a close by the peer is [`ConnEnd::Closed`].
    pub(super) fn of(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ConnEnd::Closed
        } else {
            ConnEnd::Io(e)
        }
    }
}

/// Gives back what a large request made a connection's buffers grow to.
pub(super) fn trim(inb: &mut Inbound, xfer: &mut XferServer, out: &mut Vec<u8>) {
    let before = footprint(inb, xfer, out.capacity());
    inb.trim();
    xfer.trim();
    if out.capacity() > 64 << 10 {
        *out = Vec::with_capacity(256);
    }
    released(before, footprint(inb, xfer, out.capacity()));
}

/// Bytes a lane's buffers hold (`out`: its reply buffer's capacity).
pub(super) fn footprint(inb: &Inbound, xfer: &XferServer, out: usize) -> usize {
    inb.capacity() + xfer.footprint() + out
}

/// Buffers shrank from `before` to `after` bytes: a large drop is handed back to the system.
pub(super) fn released(before: usize, after: usize) {
    if before.saturating_sub(after) >= GIVE_BACK {
        give_back_freed_memory();
    }
}

/// Freed request buffers at least this large are handed back to the operating system at once.
const GIVE_BACK: usize = 1 << 20;

/// Hands memory the allocator keeps after frees back to the operating system. Requests are
/// served by whichever worker is free, and glibc keeps each thread's freed memory in that
/// thread's arena: after a few large requests (a frame of 65,536 descriptors takes about 4 MiB
/// of buffers) on different workers, megabytes would stay resident. Called only after a request
/// freed at least [`GIVE_BACK`] bytes, so its cost (a walk over the arenas) is paid rarely.
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only returns free memory to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A request counted as being served, server-wide and on its link, for as long as it lives
/// (parked ones included): the server's stop and a link's replacement wait for it.
pub(crate) struct InFlight {
    server: Arc<AtomicUsize>,
    link: Arc<AtomicUsize>,
}

impl InFlight {
    /// Counts a request in `server` (the server's requests being served) and `link`.
    pub(super) fn new(server: &Arc<AtomicUsize>, link: &Arc<AtomicUsize>) -> Self {
        server.fetch_add(1, Ordering::SeqCst);
        link.fetch_add(1, Ordering::SeqCst);
        Self {
            server: server.clone(),
            link: link.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.link.fetch_sub(1, Ordering::SeqCst);
        self.server.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A request parked on its lane (its socket stalled), and its count as in flight.
pub(crate) type Parked = (Box<Pending<Held>>, InFlight);

/// Whether a lane's next frame is all in (reading what has come, without waiting); a header
/// that does not decode, or declares more than its kind's largest request
/// ([`wire::max_request`]), counts as in: the worker refuses it, before its bytes come.
pub(super) fn frame_in(inb: &mut Inbound, sock: &Sock) -> io::Result<bool> {
    Ok(inb
        .frame_ready(sock, wire::max_request, "request length")?
        .is_some())
}
