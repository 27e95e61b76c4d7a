//! Other processes of this host, and memory shared with them: a leaf the same-host transport,
//! the runtime's revocation fences (`runtime::revoke`) and [`HostBuffer`](crate::HostBuffer)
//! are built of.
//!
//! - [`Pinned`] (here): a process pinned by a pidfd, checked against the start time it
//!   announced (so a reused pid is never taken for it), which says when the process is gone.
//! - [`PeerProc`] (`peer.rs`): a pinned process with its address space open: writes through
//!   its `/proc/PID/mem` (bound to the address space, not to the pid number), reads with
//!   `process_vm_readv`, and `pidfd_getfd` to take one of its descriptors (`taken.rs`).
//! - [`sealed_memfd`] and [`Mapping`] (`memfd.rs`): memory in a memfd sealed against
//!   shrinking and growing, and a shared mapping of one (checked first: sealed, large enough,
//!   so no access can fault).
//! - [`peer_on_this_host`] (`host.rs`): whether a TCP peer connects from one of this host's
//!   addresses.

mod host;
mod memfd;
mod peer;
mod taken;

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use host::netns_cookie;
pub(crate) use host::peer_on_this_host;
#[cfg(test)]
pub(crate) use memfd::NO_MEMFD;
pub(crate) use memfd::{Mapping, sealed_memfd};
pub(crate) use peer::{PeerProc, Target, vm_io};

use crate::types::{HostId, start_time};

/// A process pinned by a pidfd (checked against the start time it announced).
#[derive(Debug)]
pub(crate) struct Pinned {
    pidfd: OwnedFd,
    pid: libc::pid_t,
}

impl Pinned {
    /// Pins the process `id` describes; an error if its pid now belongs to another process.
    pub fn open(id: &HostId) -> io::Result<Self> {
        // SAFETY: pidfd_open takes a pid and flags; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, id.pid as libc::pid_t, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor that nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // the pidfd now pins this process; check it is the one that said hello
        if start_time(id.pid) != Some(id.start) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the peer's pid belongs to another process",
            ));
        }
        Ok(Self {
            pidfd,
            pid: id.pid as libc::pid_t,
        })
    }

    /// Whether the pinned process holds `nonce` in its descriptor `fd`, a memfd sealed against
    /// writes: the proof that a same-host client is the process it names. The descriptor is
    /// taken with `pidfd_getfd` (by the pidfd: no pid can be reused under it) and read only
    /// once its seals show it is a memfd whose bytes are fixed, so the read cannot block (no
    /// file system, no fault handler of the client's) and no one can change it meanwhile.
    ///
    /// # Errors
    /// The kernel refused to give the descriptor (no right to trace the process, no such
    /// descriptor).
    pub fn holds(&self, fd: i32, nonce: &[u8; 32]) -> io::Result<bool> {
        // closed without waiting on the client whatever it turns out to be (`Taken`)
        let theirs = taken::take(self.pidfd.as_fd(), fd)?;
        if theirs.seals().is_none_or(|s| s & libc::F_SEAL_WRITE == 0) {
            return Ok(false);
        }
        let mut got = [0u8; 32];
        // SAFETY: `got` is a live, writable array of 32 bytes; `theirs` is a memfd (its seals
        // were read), so the read cannot block.
        let n = unsafe { libc::pread(theirs.as_raw_fd(), got.as_mut_ptr().cast(), 32, 0) };
        Ok(n == 32 && &got == nonce)
    }

    /// Whether this process holds the other end of `ours` (a TCP connection of this process)
    /// in its descriptor `fd`: a TCP socket whose local address is `ours`' peer address and
    /// whose peer address is `ours`' local one, in the same network namespace. What a client
    /// checks of a server on its host before any one-sided path: the kernel says which process
    /// holds the connection, so a server cannot name another process (the client itself
    /// included) as itself, and a relay cannot pass on another process's proof (no other
    /// process holds this connection). The descriptor is taken as [`Pinned::holds`] takes one.
    ///
    /// # Errors
    /// The kernel refused to give the descriptor, or to say a socket's addresses.
    pub fn holds_peer_of(&self, fd: i32, ours: &TcpStream) -> io::Result<bool> {
        if fd < 0 {
            return Ok(false);
        }
        let theirs = taken::take(self.pidfd.as_fd(), fd)?;
        if !theirs.is_socket() {
            return Ok(false);
        }
        let t = socket2::SockRef::from(&theirs);
        if t.r#type()? != socket2::Type::STREAM || t.protocol()? != Some(socket2::Protocol::TCP) {
            return Ok(false);
        }
        let (tl, tp) = (t.local_addr()?.as_socket(), t.peer_addr()?.as_socket());
        Ok(tl == Some(ours.peer_addr()?)
            && tp == Some(ours.local_addr()?)
            && netns_cookie(&theirs) == netns_cookie(ours))
    }

    /// A sealed memfd holding `nonce` (write-sealed): what a same-host client names in its
    /// PROOF, for the server to take with `pidfd_getfd` and read.
    pub fn proof_memfd(nonce: &[u8; 32]) -> io::Result<OwnedFd> {
        // SAFETY: memfd_create with a static NUL-terminated name; the result is checked.
        let fd = unsafe {
            libc::memfd_create(
                c"hixl-proof".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let seals =
            libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: writing 32 bytes from a live array to our own memfd, then sealing it.
        let ok = unsafe {
            libc::write(fd.as_raw_fd(), nonce.as_ptr().cast(), 32) == 32
                && libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) == 0
        };
        if !ok {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }

    /// Whether the process has exited (its pidfd is readable).
    pub fn exited(&self) -> bool {
        let mut fds = [libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        poll_now(&mut fds);
        fds[0].revents != 0
    }
}

/// Whether the other end of `control` closed it (or it failed): `POLLRDHUP`, `POLLHUP` or
/// `POLLERR` now, without waiting.
pub(crate) fn hung_up(control: &TcpStream) -> bool {
    let mut fds = [libc::pollfd {
        fd: control.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    }];
    poll_now(&mut fds);
    fds[0].revents != 0
}

/// Polls `fds` without waiting, retrying when a signal interrupts the call; afterwards each
/// `revents` says what is ready (a descriptor that cannot be polled reports `POLLNVAL`).
fn poll_now(fds: &mut [libc::pollfd]) {
    loop {
        // SAFETY: `fds` is a live, writable array of `fds.len()` pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        if n >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_is_a_write_sealed_memfd_of_the_named_process_holding_the_nonce() {
        let me = HostId::current().expect("/proc tells who we are");
        let pin = Pinned::open(&me).unwrap();
        let nonce = [9u8; 32];
        let proof = Pinned::proof_memfd(&nonce).unwrap();
        assert!(pin.holds(proof.as_raw_fd(), &nonce).unwrap());
        assert!(
            !pin.holds(proof.as_raw_fd(), &[8u8; 32]).unwrap(),
            "another nonce"
        );
        // the nonce in a memfd that is not sealed against writes: not a proof
        // SAFETY: memfd_create with a static name; the result is checked.
        let open = unsafe { libc::memfd_create(c"open".as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(open >= 0);
        // SAFETY: a new descriptor nothing else owns.
        let open = unsafe { OwnedFd::from_raw_fd(open) };
        // SAFETY: 32 bytes from a live array into our own memfd.
        let n = unsafe { libc::write(open.as_raw_fd(), nonce.as_ptr().cast(), 32) };
        assert_eq!(n, 32);
        assert!(
            !pin.holds(open.as_raw_fd(), &nonce).unwrap(),
            "writable memfd"
        );
        // a pipe holding the nonce: not a memfd
        let mut p = [0i32; 2];
        // SAFETY: `p` is a live array of two descriptors the call fills.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both are new descriptors nothing else owns.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        // SAFETY: 32 bytes from a live array into our own pipe.
        let n = unsafe { libc::write(w.as_raw_fd(), nonce.as_ptr().cast(), 32) };
        assert_eq!(n, 32);
        assert!(!pin.holds(r.as_raw_fd(), &nonce).unwrap(), "a pipe");
        // no such descriptor
        assert!(pin.holds(i32::MAX, &nonce).is_err());
    }
}
