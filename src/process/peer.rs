//! A pinned peer process with its address space open: writes through its `/proc/PID/mem`
//! (bound to the address space, not to the pid number), reads with `process_vm_readv`, and
//! `pidfd_getfd` to take one of its descriptors.

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use super::taken::{self, Taken};
use super::{Pinned, poll_now};
use crate::io::{IOV_MAX, IoVec, advance};
use crate::types::HostId;

/// A peer process pinned by a pidfd, with its address space open for writes.
#[derive(Debug)]
pub(crate) struct PeerProc {
    pin: Pinned,
    /// `/proc/PID/mem`, opened after the pidfd and checked against it: bound to the peer's
    /// address space, so a write through it can never land in another process.
    mem: OwnedFd,
}

impl PeerProc {
    /// Opens the peer and checks it is the process `id` describes (not a reused pid).
    pub fn open(id: &HostId) -> io::Result<Self> {
        let pin = Pinned::open(id)?;
        let path = std::ffi::CString::new(format!("/proc/{}/mem", id.pid))
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: open with a NUL-terminated path; the result is checked.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor that nothing else owns.
        let mem = unsafe { OwnedFd::from_raw_fd(fd) };
        // the pidfd's process was alive after the open, so it was alive during it: the pid
        // named it, and `mem` is its address space
        if pin.exited() {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(Self { pin, mem })
    }

    /// Whether the process has exited.
    pub fn exited(&self) -> bool {
        self.pin.exited()
    }

    /// Whether the process still runs, and `control` (the link's TCP connection) is still open.
    pub fn alive(&self, control: &TcpStream) -> bool {
        let mut fds = [
            libc::pollfd {
                fd: self.pin.pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: control.as_raw_fd(),
                events: libc::POLLRDHUP,
                revents: 0,
            },
        ];
        poll_now(&mut fds);
        fds.iter().all(|f| f.revents == 0)
    }

    /// A duplicate of the peer's descriptor `fd` (`pidfd_getfd`), closed without waiting on
    /// the peer whatever it turns out to be ([`Taken`]).
    pub fn getfd(&self, fd: i32) -> io::Result<Taken> {
        taken::take(self.pin.pidfd.as_fd(), fd)
    }

    /// [`Pinned::holds_peer_of`] of the peer.
    pub fn holds_peer_of(&self, fd: i32, ours: &TcpStream) -> io::Result<bool> {
        self.pin.holds_peer_of(fd, ours)
    }

    /// Moves the bytes of `local` to or from `remote` (same total length) with
    /// `/proc/PID/mem` (`write`) or `process_vm_readv`, continuing partial transfers.
    /// On failure returns the error and how many bytes had moved.
    ///
    /// # Safety
    /// For a read, `local` must describe memory valid for writes of any bytes; for a write,
    /// valid for reads; both for the whole call.
    pub unsafe fn pvm(
        &self,
        write: bool,
        local: &mut [IoVec],
        remote: &mut [IoVec],
    ) -> Result<(), (io::Error, u64)> {
        // SAFETY: forwarded caller contract.
        unsafe { vm_io(self.target(), write, local, remote) }
    }

    /// What the copy helper needs to reach the peer (valid while `self` lives).
    pub(crate) fn target(&self) -> Target {
        Target {
            pid: self.pin.pid,
            mem: self.mem.as_raw_fd(),
        }
    }
}

/// How a batch reaches the peer: its pid for reads, its `/proc/PID/mem` for writes.
#[derive(Clone, Copy)]
pub(crate) struct Target {
    pid: libc::pid_t,
    mem: i32,
}

/// Writes (`write`) through the peer's `/proc/PID/mem`, or reads with `process_vm_readv`.
///
/// # Safety
/// For a read, `local` must describe memory valid for writes of any bytes; for a write, valid
/// for reads; both for the whole call. `target.mem` must stay open for the call.
pub(crate) unsafe fn vm_io(
    target: Target,
    write: bool,
    local: &mut [IoVec],
    remote: &mut [IoVec],
) -> Result<(), (io::Error, u64)> {
    if write {
        // SAFETY: the caller's contract.
        unsafe { mem_write(target.mem, local, remote) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { pvm_read(target.pid, local, remote) }
    }
}

/// Writes `local` into `remote` (same total length) through `mem`, a `/proc/PID/mem`
/// descriptor: one `pwritev` per run of contiguous remote bytes, partial writes continued. A
/// peer whose address space is gone writes 0 bytes: that is `ESRCH`.
///
/// # Safety
/// `local` must describe memory valid for reads for the whole call.
unsafe fn mem_write(
    mem: i32,
    local: &mut [IoVec],
    remote: &mut [IoVec],
) -> Result<(), (io::Error, u64)> {
    let (mut li, mut ri, mut moved) = (0usize, 0usize, 0u64);
    let mut iov: Vec<libc::iovec> = Vec::new();
    loop {
        if !skip_empty(local, &mut li, remote, &mut ri) {
            return Ok(());
        }
        // the run of remote bytes starting at remote[ri] that is contiguous in the peer
        let start = remote[ri].base;
        let mut run = remote[ri].len;
        let mut j = ri + 1;
        while j < remote.len() && remote[j].base == start + run {
            run += remote[j].len;
            j += 1;
        }
        let Ok(offset) = libc::off_t::try_from(start) else {
            return Err((io::Error::from_raw_os_error(libc::EFAULT), moved));
        };
        // local pieces covering up to `run` bytes
        iov.clear();
        let (mut k, mut want) = (li, run);
        while k < local.len() && want > 0 && iov.len() < IOV_MAX {
            let take = local[k].len.min(want);
            if take > 0 {
                iov.push(libc::iovec {
                    iov_base: local[k].base as *mut libc::c_void,
                    iov_len: take,
                });
            }
            want -= take;
            k += 1;
        }
        // SAFETY: `iov` describes local memory valid for reads (the caller's contract); the
        // kernel checks the remote range against the peer's address space, never ours.
        let n = unsafe { libc::pwritev(mem, iov.as_ptr(), iov.len() as i32, offset) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                // `/proc/PID/mem` says EIO for an address the peer does not have mapped
                // (process_vm_* says EFAULT, as reads still do): report one error for both
                Some(libc::EIO) => return Err((io::Error::from_raw_os_error(libc::EFAULT), moved)),
                _ => return Err((e, moved)),
            }
        }
        if n == 0 {
            // the address space is gone (the peer exited): nothing was written anywhere
            return Err((io::Error::from_raw_os_error(libc::ESRCH), moved));
        }
        moved += n as u64;
        advance(local, &mut li, n as usize);
        advance(remote, &mut ri, n as usize);
    }
}

/// `process_vm_readv` from `remote` of process `pid` into `local` (same total length),
/// continuing partial transfers. On failure returns the error and how many bytes had moved.
/// (Never used to write: a pid number can name another process by the time the call runs.)
///
/// # Safety
/// `local` must describe memory valid for writes of any bytes for the whole call.
unsafe fn pvm_read(
    pid: libc::pid_t,
    local: &mut [IoVec],
    remote: &mut [IoVec],
) -> Result<(), (io::Error, u64)> {
    let (mut li, mut ri, mut moved) = (0usize, 0usize, 0u64);
    loop {
        if !skip_empty(local, &mut li, remote, &mut ri) {
            return Ok(());
        }
        let (ln, rn) = (
            (local.len() - li).min(IOV_MAX),
            (remote.len() - ri).min(IOV_MAX),
        );
        let (lp, rp) = (
            local[li..].as_ptr().cast::<libc::iovec>(),
            remote[ri..].as_ptr().cast::<libc::iovec>(),
        );
        // SAFETY: the iovec arrays have `libc::iovec`'s layout and stay alive for the call;
        // the local memory is valid per the caller's contract; the kernel checks the remote
        // addresses against the peer's address space (EFAULT), never ours.
        let n = unsafe { libc::process_vm_readv(pid, lp, ln as _, rp, rn as _, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err((e, moved));
        }
        if n == 0 {
            return Err((io::Error::from_raw_os_error(libc::EFAULT), moved));
        }
        moved += n as u64;
        advance(local, &mut li, n as usize);
        advance(remote, &mut ri, n as usize);
    }
}

/// Moves `*li` and `*ri` past empty iovecs; whether both sides still have bytes to move.
fn skip_empty(local: &[IoVec], li: &mut usize, remote: &[IoVec], ri: &mut usize) -> bool {
    while *li < local.len() && local[*li].len == 0 {
        *li += 1;
    }
    while *ri < remote.len() && remote[*ri].len == 0 {
        *ri += 1;
    }
    *li < local.len() && *ri < remote.len()
}
