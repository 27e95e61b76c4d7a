//! Descriptors taken from another process (`pidfd_getfd`), and closing them without waiting on
//! that process.
//!
//! Closing a descriptor runs its file's flush on every close, not only the last: for a file on
//! FUSE that is a request to the FUSE daemon, which the other process may run itself and may
//! never answer; NFS and other network file systems wait on their servers. A peer that names
//! such a file where a memfd or a socket is expected would stall whichever thread closes the
//! copy: the serving engine's poller (every handshake and idle lane), or a client's connect.
//!
//! So a [`Taken`] descriptor is closed on the dropping thread only when it is of a kind whose
//! close never waits: a shared-memory file (its seals can be read: memfds) or a socket. Any
//! other goes to one closer thread. At most [`MAX_CLOSING`] may wait there; while that many
//! wait, [`take`] takes nothing more (`WouldBlock`), and its callers move on without the peer's
//! descriptor (the same-host proof fails and the peer is served, or reached, over TCP). A peer
//! that withholds its flushes therefore costs at most [`MAX_CLOSING`] descriptors and one
//! thread, in any number of attempts.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, mpsc};

/// Most taken descriptors waiting for the closer thread at once.
pub(crate) const MAX_CLOSING: usize = 64;

/// Taken descriptors handed to the closer thread and not closed yet.
static CLOSING: AtomicUsize = AtomicUsize::new(0);

/// A descriptor taken from another process. Dropping it closes it without ever waiting on that
/// process (see the module's notes).
#[derive(Debug)]
pub(crate) struct Taken(Option<OwnedFd>);

/// Takes a duplicate of descriptor `fd` of the process `pidfd` pins (`pidfd_getfd`).
///
/// # Errors
/// The kernel's (no right to trace the process, no such descriptor), or `WouldBlock` while
/// [`MAX_CLOSING`] taken descriptors wait for the closer thread.
pub(crate) fn take(pidfd: BorrowedFd<'_>, fd: i32) -> io::Result<Taken> {
    if CLOSING.load(Ordering::SeqCst) >= MAX_CLOSING {
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            "descriptors taken from peers are still waiting to be closed",
        ));
    }
    // SAFETY: pidfd_getfd takes a pidfd, a descriptor number and flags; the result is checked.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor (pidfd_getfd sets close-on-exec) that nothing else owns.
    Ok(Taken(Some(unsafe { OwnedFd::from_raw_fd(r as RawFd) })))
}

impl Taken {
    fn fd(&self) -> BorrowedFd<'_> {
        self.0
            .as_ref()
            .expect("a Taken holds its descriptor until dropped")
            .as_fd()
    }

    /// Its seals (`F_GET_SEALS`), when it is a shared-memory file (a memfd); `None` otherwise.
    pub(crate) fn seals(&self) -> Option<i32> {
        // SAFETY: F_GET_SEALS on a descriptor we own; fails on anything but shared memory.
        let s = unsafe { libc::fcntl(self.fd().as_raw_fd(), libc::F_GET_SEALS) };
        (s >= 0).then_some(s)
    }

    /// Whether it is a socket. Asked with `getsockopt(SO_TYPE)`, which fails at once
    /// (`ENOTSOCK`) on anything else, never with `fstat`: on a file of a FUSE mount `fstat` asks
    /// the file system's daemon, which a peer that named the file may run and never let answer
    /// (the serving poller would wait on it).
    pub(crate) fn is_socket(&self) -> bool {
        let mut ty: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: SO_TYPE writes one c_int into `ty`, whose size `len` gives; on a descriptor
        // we own.
        let rc = unsafe {
            libc::getsockopt(
                self.fd().as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_TYPE,
                (&mut ty as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        rc == 0
    }

    /// Whether closing it can never wait on another process.
    fn closes_at_once(&self) -> bool {
        self.seals().is_some() || self.is_socket()
    }
}

impl AsFd for Taken {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd()
    }
}

impl AsRawFd for Taken {
    fn as_raw_fd(&self) -> RawFd {
        self.fd().as_raw_fd()
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        if self.0.is_none() || self.closes_at_once() {
            return; // the field drops next: a memfd's or a socket's close does not wait
        }
        let fd = self.0.take().expect("checked above");
        // counted until closed: a descriptor that cannot be handed over stays open and counted
        // for good (so there are at most MAX_CLOSING such), rather than be closed here, where
        // it could stall this thread
        CLOSING.fetch_add(1, Ordering::SeqCst);
        let Some(tx) = closer() else {
            std::mem::forget(fd); // no closer thread: it could not start
            return;
        };
        let tx = tx.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(mpsc::SendError(fd)) = tx.send(fd) {
            std::mem::forget(fd); // the closer thread is gone (it cannot end while `tx` lives)
        }
    }
}

/// The closer thread's queue, started on first use (`None` if it could not start).
fn closer() -> Option<&'static Mutex<mpsc::Sender<OwnedFd>>> {
    static TX: OnceLock<Option<Mutex<mpsc::Sender<OwnedFd>>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<OwnedFd>();
        std::thread::Builder::new()
            .name("hixl-closer".into())
            .spawn(move || {
                for fd in rx {
                    drop(fd);
                    CLOSING.fetch_sub(1, Ordering::SeqCst);
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    })
    .as_ref()
}

/// How many taken descriptors wait for the closer thread now (tests).
#[cfg(test)]
pub(crate) fn closing() -> usize {
    CLOSING.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_pidfd() -> OwnedFd {
        // SAFETY: pidfd_open of this process; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, std::process::id(), 0) };
        assert!(fd >= 0, "pidfd_open: {}", io::Error::last_os_error());
        // SAFETY: a new descriptor nothing else owns.
        unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
    }

    #[test]
    fn kinds_are_told_apart() {
        let pid = self_pidfd();
        // SAFETY: a new descriptor nothing else owns.
        let memfd = unsafe { OwnedFd::from_raw_fd(super::super::sealed_memfd(4096).unwrap()) };
        let Ok(mem) = take(pid.as_fd(), memfd.as_raw_fd()) else {
            eprintln!("skipped: pidfd_getfd refused on this kernel");
            return;
        };
        assert!(mem.seals().is_some() && !mem.is_socket());
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = take(pid.as_fd(), l.as_raw_fd()).unwrap();
        assert!(s.is_socket() && s.seals().is_none());
        let (r, _w) = std::io::pipe().unwrap();
        let p = take(pid.as_fd(), r.as_raw_fd()).unwrap();
        assert!(!p.is_socket() && p.seals().is_none());
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        let t = take(pid.as_fd(), f.as_raw_fd()).unwrap();
        assert!(!t.is_socket() && !t.closes_at_once());
        let before = closing();
        drop(t); // handed to the closer thread, which closes it
        let t0 = std::time::Instant::now();
        while closing() > before && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::yield_now();
        }
        assert!(closing() <= before, "the closer thread closed it");
    }
}
