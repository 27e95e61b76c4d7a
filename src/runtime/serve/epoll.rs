//! The poller's system parts, as mio has them: an [`Epoll`] instance, the [`Token`]s it reports
//! (two reserved, then one per connection, its id), and a [`Waker`] (an eventfd) that other
//! threads use to wake the poller. Nothing here knows what a connection is.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// What an event is about: the listener, the waker, or the connection whose id it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Token(pub(super) u64);

impl Token {
    /// The listening socket.
    pub(super) const LISTENER: Token = Token(0);
    /// The [`Waker`].
    pub(super) const WAKE: Token = Token(1);
    /// The first connection id (ids below it are reserved).
    pub(super) const FIRST_CONN: u64 = 16;
}

/// An epoll instance.
pub(super) struct Epoll(OwnedFd);

impl Epoll {
    pub(super) fn new() -> io::Result<Self> {
        // SAFETY: epoll_create1 takes flags; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor that nothing else owns.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// `epoll_ctl` with `op` for `fd`, reported as `token`, for `events`.
    pub(super) fn ctl(
        &self,
        op: libc::c_int,
        fd: RawFd,
        token: Token,
        events: u32,
    ) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events,
            u64: token.0,
        };
        // SAFETY: `ev` is a live epoll_event; the kernel checks both descriptors.
        if unsafe { libc::epoll_ctl(self.0.as_raw_fd(), op, fd, &mut ev) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watches `fd` for input (and hang-ups), one event at a time.
    pub(super) fn add_oneshot(&self, fd: RawFd, token: Token) -> io::Result<()> {
        let ev = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT) as u32;
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, ev)
    }

    /// Re-arms a one-shot `fd` after its event was handled, for input (and hang-ups).
    pub(super) fn rearm(&self, fd: RawFd, token: Token) -> io::Result<()> {
        self.rearm_for(fd, token, false)
    }

    /// Re-arms a one-shot `fd` for output (`out`), or for input and the peer's half-close.
    ///
    /// Waiting for output, the peer's half-close (`EPOLLRDHUP`) is not asked for: it is level
    /// triggered, so once the peer's FIN is in every re-arm would fire at once while the reply
    /// still cannot be sent (a parked reply on a half-closed lane would spin its worker). A peer
    /// that half-closed and still reads gets its reply; one that does not is closed at the
    /// request's deadline; errors and hang-ups are reported whatever is asked.
    pub(super) fn rearm_for(&self, fd: RawFd, token: Token, out: bool) -> io::Result<()> {
        let dir = if out {
            libc::EPOLLOUT
        } else {
            libc::EPOLLIN | libc::EPOLLRDHUP
        };
        let ev = (dir | libc::EPOLLONESHOT) as u32;
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, ev)
    }

    /// Waits for events (up to `evs.len()`) for at most `timeout` (`None`: until one comes);
    /// returns how many came.
    pub(super) fn wait(&self, evs: &mut [libc::epoll_event], timeout: Option<Duration>) -> usize {
        let ms = timeout.map_or(-1, |t| {
            // round up, so a deadline is not polled for again and again just before it passes
            (t.as_micros().div_ceil(1000)).min(i32::MAX as u128) as libc::c_int
        });
        // SAFETY: `evs` is a live, writable array of `evs.len()` events.
        let n = unsafe {
            libc::epoll_wait(
                self.0.as_raw_fd(),
                evs.as_mut_ptr(),
                evs.len() as libc::c_int,
                ms,
            )
        };
        usize::try_from(n).unwrap_or(0)
    }
}

/// Wakes the poller from another thread: an eventfd it waits on as [`Token::WAKE`].
pub(super) struct Waker(OwnedFd);

impl Waker {
    pub(super) fn new() -> io::Result<Self> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The descriptor the poller waits on.
    pub(super) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Wakes the poller.
    pub(super) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our own eventfd.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Clears the wake-ups so far.
    pub(super) fn clear(&self) {
        let mut n: u64 = 0;
        // SAFETY: reading 8 bytes into a live u64 from our own non-blocking eventfd.
        unsafe { libc::read(self.0.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
    }
}
