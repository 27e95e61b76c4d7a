//! A served connection as it moves between the poller and the workers: [`Conn`] (the socket
//! and its entry in the connection table), [`Ready`] (a handshake that completed), [`Lane`] (an
//! established lane between requests), the [`Job`]s workers take, and [`Returns`], the way a
//! lane that went idle gets back to the poller.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};

use super::server::ServerShared;
use crate::io::{Inbound, Sock};
use crate::runtime::revoke::fence::ServerFence;
use crate::runtime::transports::XferServer;
use crate::sync::lock;
use crate::wire::{Hello, Kind};

/// An accepted connection: its socket, and its entry in the connection table, which it leaves
/// (on drop) before the socket closes, so a descriptor number in the table always names the
/// connection's own socket.
pub(crate) struct Conn {
    pub(super) sock: Sock,
    pub(super) id: u64,
    pub(super) from: SocketAddr,
    pub(super) shared: Arc<ServerShared>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        lock(&self.shared.conns).remove(&self.id);
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
pub(crate) struct Lane {
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
    pub(super) parked: Option<super::dispatch::Parked>,
}

/// Bytes of receive buffer an idle lane keeps.
const IDLE_INBOUND: usize = 4 << 10;

impl Lane {
    /// Bytes its buffers hold.
    pub(super) fn footprint(&self) -> usize {
        super::dispatch::footprint(&self.inb, &self.xfer, self.out.capacity())
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
pub(crate) enum Job {
    /// Opens or joins the link of a completed handshake, then serves its requests.
    Open(Box<Ready>),
    /// Serves the requests of a lane that has one coming.
    Serve(Box<Lane>),
}

/// Lanes that went idle, on their way back to the poller, which waits on `wake` (an eventfd).
/// (Boxed: a lane moves between threads and maps as one pointer.)
#[allow(clippy::vec_box)]
pub(crate) struct Returns {
    lanes: Mutex<Vec<Box<Lane>>>,
    wake: OwnedFd,
}

impl Returns {
    pub(super) fn new() -> std::io::Result<Self> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            lanes: Mutex::new(Vec::new()),
            // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// The descriptor the poller waits on.
    pub(super) fn fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Wakes the poller (a lane came back, or serving stops).
    pub(super) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our own eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Hands `lane` back to the poller.
    pub(super) fn give(&self, lane: Box<Lane>) {
        lock(&self.lanes).push(lane);
        self.wake();
    }

    /// The lanes handed back since the last call (clears the wake-up).
    #[allow(clippy::vec_box)]
    pub(super) fn take(&self) -> Vec<Box<Lane>> {
        let mut n: u64 = 0;
        // SAFETY: reading 8 bytes into a live u64 from our own non-blocking eventfd.
        unsafe { libc::read(self.wake.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
        std::mem::take(&mut *lock(&self.lanes))
    }
}
