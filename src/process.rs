//! Other processes of this host, and memory shared with them: a leaf the same-host transport,
//! the runtime's revocation fences (`runtime::revoke`) and [`HostBuffer`](crate::HostBuffer)
//! are built of.
//!
//! - [`Pinned`]: a process pinned by a pidfd, checked against the start time it announced (so
//!   a reused pid is never taken for it), which says when the process is gone.
//! - [`PeerProc`]: a pinned process with its address space open: writes through its
//!   `/proc/PID/mem` (bound to the address space, not to the pid number), reads with
//!   `process_vm_readv`, and `pidfd_getfd` to take one of its descriptors.
//! - [`sealed_memfd`] and [`Mapping`]: memory in a memfd sealed against shrinking and growing,
//!   and a shared mapping of one (checked first: sealed, large enough, so no access can fault).
//! - [`peer_on_this_host`]: whether a TCP peer connects from one of this host's addresses.

mod taken;

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

pub(crate) use taken::Taken;

use crate::io::{IOV_MAX, IoVec, advance};
use crate::types::{HostId, start_time};

/// A memfd of `len` bytes sealed against shrinking, growing and further sealing.
pub(crate) fn sealed_memfd(len: usize) -> Option<i32> {
    // SAFETY: memfd_create with a static NUL-terminated name; the result is checked.
    let fd = unsafe {
        libc::memfd_create(
            c"hixl".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return None;
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: sizing and sealing the descriptor we just created.
    let ok = unsafe {
        libc::ftruncate(fd, len as libc::off_t) == 0
            && libc::fcntl(fd, libc::F_ADD_SEALS, seals) == 0
    };
    if !ok {
        // SAFETY: closing our own descriptor, once.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(fd)
}

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

/// The network namespace of socket `s` (`SO_NETNS_COOKIE`, Linux 5.14), or `None` where the
/// kernel (or this architecture's option number) does not tell.
fn netns_cookie(s: &impl AsFd) -> Option<u64> {
    // the option's number in the generic socket.h (not alpha, mips, parisc, sparc)
    let generic = cfg!(any(
        target_arch = "x86_64",
        target_arch = "x86",
        target_arch = "aarch64",
        target_arch = "arm",
        target_arch = "riscv64",
        target_arch = "powerpc64",
        target_arch = "s390x",
        target_arch = "loongarch64"
    ));
    if !generic {
        return None;
    }
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let mut v = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v`, a live u64, and its length.
    let r = unsafe {
        libc::getsockopt(
            s.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut v).cast(),
            &mut len,
        )
    };
    (r == 0 && len as usize == std::mem::size_of::<u64>()).then_some(v)
}

/// A peer's sealed memfd, mapped into this process.
#[derive(Debug)]
pub(crate) struct Mapping {
    addr: usize,
    len: usize,
    /// Whether the memfd held every one of its pages when it was mapped (no holes): then
    /// [`Mapping::populate`] need not ask `mincore` which pages it holds.
    dense: bool,
}

impl Mapping {
    /// Maps `len` bytes of `fd`, after checking that it is a regular file of at least `len`
    /// bytes sealed against shrinking (so no access can ever fault with SIGBUS).
    pub fn new(fd: impl AsFd, len: u64, writable: bool) -> io::Result<Self> {
        let fd = fd.as_fd();
        let bad = |why| io::Error::new(io::ErrorKind::InvalidData, why);
        // SAFETY: fcntl(F_GET_SEALS) on a descriptor we own; the result is checked.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(bad("the peer's memory is not sealed against shrinking"));
        }
        // SAFETY: a zeroed stat is valid output space for fstat on a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || (st.st_size as u64) < len || len == 0 {
            return Err(bad("the peer's memory is smaller than its region"));
        }
        let len = len as usize;
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        // SAFETY: a new shared mapping of a sealed regular file of at least `len` bytes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            addr: p as usize,
            len,
            dense: (st.st_blocks as u64).saturating_mul(512) >= st.st_size as u64,
        })
    }

    /// Maps the pages of bytes `off..off + len` (widened to whole pages, cut at the mapping's
    /// end) into this process's page tables now, so copies through them take no page fault:
    /// only pages the peer's memfd holds (as `mincore` reports them, unless the memfd had no
    /// holes when mapped: `mincore` took a third of the time), one `MADV_POPULATE_READ` per run
    /// of them, so holes the peer never touched stay holes (a read fault of a shmem hole
    /// allocates a page). Read population of a shared mapping of shmem
    /// maps a writable entry when the mapping is writable, and maps the pages around the one
    /// faulted in (the kernel's fault-around): measured here, 512 MiB took 43 ms where copying
    /// 512 MiB into a fresh mapping took 300 ms (80 ms warm). Returns the bytes of pages
    /// populated.
    ///
    /// # Errors
    /// `mincore` or `madvise` failed (`EINVAL` on kernels before 5.14, which lack
    /// `MADV_POPULATE_READ`); pages it did not map fault on first touch, as without it.
    pub fn populate(&self, off: usize, len: usize) -> io::Result<usize> {
        const PAGE: usize = 4096;
        let start = (off / PAGE) * PAGE;
        let end = off.saturating_add(len).min(self.len).div_ceil(PAGE) * PAGE;
        let end = end.min(self.len.div_ceil(PAGE) * PAGE);
        if start >= end {
            return Ok(0);
        }
        let pages = (end - start) / PAGE;
        if self.dense {
            // SAFETY: as below, for the whole range: every page of it is held (the memfd had no
            // holes when mapped; hixl's engines never punch any), so nothing is allocated. A
            // hostile peer that punched holes since gets them filled with zeroed pages of its
            // own memfd, inside the mapping it offered (within the budget): no byte of data
            // changes, and no memory of this process's is touched.
            if unsafe {
                libc::madvise(
                    (self.addr + start) as *mut libc::c_void,
                    end - start,
                    libc::MADV_POPULATE_READ,
                )
            } != 0
            {
                return Err(io::Error::last_os_error());
            }
            return Ok(end - start);
        }
        let mut held = vec![0u8; pages];
        // SAFETY: `start..end` lies in this mapping (page aligned: the mapping starts on a page
        // and `start` is a multiple of the page size); `held` has one byte per page. mincore
        // reads page tables and the memfd's page cache, nothing of the memory's contents.
        if unsafe {
            libc::mincore(
                (self.addr + start) as *mut libc::c_void,
                end - start,
                held.as_mut_ptr(),
            )
        } != 0
        {
            return Err(io::Error::last_os_error());
        }
        let mut done = 0;
        let mut i = 0;
        while i < pages {
            if held[i] & 1 == 0 {
                i += 1;
                continue;
            }
            let run = held[i..].iter().take_while(|&&b| b & 1 != 0).count();
            let at = self.addr + start + i * PAGE;
            // SAFETY: the run lies in this mapping. MADV_POPULATE_READ only faults the pages in
            // (as a read of each would): it changes no byte of the memory, so the peer writing
            // these pages meanwhile, or a copy of this process reading them, sees the same
            // contents with or without it; the memfd is sealed against shrinking, so no page of
            // the range can be beyond its end (no SIGBUS: the kernel would answer EFAULT).
            if unsafe {
                libc::madvise(
                    at as *mut libc::c_void,
                    run * PAGE,
                    libc::MADV_POPULATE_READ,
                )
            } != 0
            {
                return Err(io::Error::last_os_error());
            }
            done += run * PAGE;
            i += run;
        }
        Ok(done)
    }

    /// The mapping's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The local address of byte `offset` of the peer's region.
    pub fn at(&self, offset: u64) -> usize {
        debug_assert!(offset as usize <= self.len);
        self.addr + offset as usize
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping `new` made, once; nothing refers to it after the
        // link (its owner) is gone.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// Whether the peer of `stream` may be a process on this host, whatever it says about itself:
/// it connects from a loopback address, from the address it reached, or from any address of
/// this host's interfaces (as `getifaddrs` lists them). Not knowing counts as yes.
pub(crate) fn peer_on_this_host(stream: &TcpStream) -> bool {
    let (Ok(peer), Ok(local)) = (stream.peer_addr(), stream.local_addr()) else {
        return true;
    };
    let ip = canonical(peer.ip());
    if ip.is_loopback() || ip == canonical(local.ip()) {
        return true;
    }
    match interface_addresses() {
        Some(all) => all.contains(&ip),
        None => true,
    }
}

/// An IPv4-mapped IPv6 address as IPv4; others unchanged.
fn canonical(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
        v4 => v4,
    }
}

/// Every IPv4 and IPv6 address of this host's interfaces (in this network namespace), or
/// `None` if the kernel will not say.
fn interface_addresses() -> Option<Vec<std::net::IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `head`, which is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: a non-null `ifa_addr` points to a sockaddr whose family says its type.
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: AF_INET: the sockaddr is a sockaddr_in.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                out.push(std::net::IpAddr::V4(ip));
            } else if family == libc::AF_INET6 {
                // SAFETY: AF_INET6: the sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                out.push(std::net::IpAddr::V6(std::net::Ipv6Addr::from(
                    sin6.sin6_addr.s6_addr,
                )));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once; no node is used after this.
    unsafe { libc::freeifaddrs(head) };
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Populating a mapping maps the pages the memfd holds and allocates none of its holes: of
    /// an 8 MiB memfd whose first 1 MiB and last page were written, exactly those are
    /// populated, and the memfd holds no more blocks after than before.
    #[test]
    fn populate_maps_held_pages_and_leaves_holes() {
        let len = 8 << 20;
        let fd = sealed_memfd(len).expect("a memfd");
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let data = vec![7u8; 1 << 20];
        // SAFETY: writes from a live buffer into our own memfd, within its size.
        let ok = unsafe {
            libc::pwrite(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), 0) == 1 << 20
                && libc::pwrite(fd.as_raw_fd(), data.as_ptr().cast(), 1, (len - 1) as i64) == 1
        };
        assert!(ok);
        let blocks = || {
            // SAFETY: a zeroed stat is valid output space for fstat on our own descriptor.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
            st.st_blocks
        };
        let before = blocks();
        let m = Mapping::new(&fd, len as u64, true).unwrap();
        match m.populate(0, len) {
            // a kernel before 5.14 has no MADV_POPULATE_READ: nothing to check
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return,
            r => assert_eq!(r.unwrap(), (1 << 20) + 4096),
        }
        assert_eq!(blocks(), before, "populating allocated memory in the memfd");
        assert_eq!(
            m.populate(len - 10, 100).unwrap(),
            4096,
            "cut at the mapping's end"
        );
        assert_eq!(m.populate(len, 1).unwrap(), 0);
        // a memfd with every page written is dense: populated whole, without mincore
        let full = sealed_memfd(1 << 20).expect("a memfd");
        // SAFETY: a new descriptor nothing else owns.
        let full = unsafe { OwnedFd::from_raw_fd(full) };
        // SAFETY: a write from a live buffer into our own memfd, within its size.
        let n = unsafe { libc::pwrite(full.as_raw_fd(), data.as_ptr().cast(), data.len(), 0) };
        assert_eq!(n, 1 << 20);
        let d = Mapping::new(&full, 1 << 20, false).unwrap();
        assert!(d.dense && !m.dense);
        assert_eq!(d.populate(4096, 100).unwrap(), 4096);
        // the contents are as written
        // SAFETY: the mapping is `len` bytes long and holds what was written above.
        let mapped = unsafe { std::slice::from_raw_parts(m.at(0) as *const u8, 1 << 20) };
        assert!(mapped == &data[..]);
    }

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
