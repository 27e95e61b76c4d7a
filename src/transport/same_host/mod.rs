//! The same-host transport (`cma`): one-sided transfers between processes of one machine, with no
//! work by the peer's CPU.
//!
//! - Memory the engine allocates ([`HostBuffer`](crate::HostBuffer)) lives in a sealed `memfd`
//!   (it can neither shrink nor grow). A same-host client takes a duplicate of that descriptor
//!   with `pidfd_getfd`, checks the seals and size, and maps it: READ and WRITE are then a plain
//!   memory copy into or out of the peer's pages, at memory speed, no system call per descriptor.
//! - `Vec<u8>`/`Box<[u8]>` regions are written through the peer's `/proc/PID/mem` and read with
//!   `process_vm_readv`, batched by `IOV_MAX`, partial transfers continued. Other memory (which
//!   the server could not quarantine) is not offered one-sidedly: it goes over TCP.
//!
//! Every batch runs inside the server's fence for the link (`transport::same_host::fence`), so the server
//! can revoke one-sided access and wait for copies in flight before it hands memory back.
//!
//! Both need the right to trace the peer (same user, or `CAP_SYS_PTRACE`): exactly the right to
//! read and write its memory anyway. Where the kernel refuses, the link stays on TCP.
//!
//! The peer is identified by boot id, pid namespace, pid and process start time; the pid is
//! pinned with a pidfd right after the start time is checked, and every transfer first checks
//! (one `poll`) that the peer is alive and the link's control connection open.
//!
//! A pid number can be reused once its process is gone, so nothing is ever *written* by pid
//! number: writes go through the peer's `/proc/PID/mem`, opened once at connect and checked
//! against the pidfd after opening. That descriptor is bound to the peer's address space, not
//! to its pid: once the peer is gone it writes nothing (the kernel answers 0 bytes), whichever
//! process gets the pid next. Reads use `process_vm_readv` (one copy, faster) and are followed by
//! a pidfd check: a peer still alive after the read was alive for all of it, so the bytes came
//! from it; a read the peer did not outlive fails (`ESRCH`).

mod backend;
pub(crate) mod fence;
pub(crate) mod path;

pub(crate) use backend::SameHostBackend;

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use crate::io::{IOV_MAX, IoVec};
use crate::sync::lock;
use crate::types::split::{Cut, split};
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

    /// A duplicate of the peer's descriptor `fd` (`pidfd_getfd`).
    pub fn getfd(&self, fd: i32) -> io::Result<OwnedFd> {
        // SAFETY: pidfd_getfd takes a pidfd, a descriptor number and flags; the result is checked.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, self.pin.pidfd.as_raw_fd(), fd, 0) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
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
    fn target(&self) -> Target {
        Target {
            pid: self.pin.pid,
            mem: self.mem.as_raw_fd(),
        }
    }
}

/// How a batch reaches the peer: its pid for reads, its `/proc/PID/mem` for writes.
#[derive(Clone, Copy)]
struct Target {
    pid: libc::pid_t,
    mem: i32,
}

/// Writes (`write`) through the peer's `/proc/PID/mem`, or reads with `process_vm_readv`.
///
/// # Safety
/// For a read, `local` must describe memory valid for writes of any bytes; for a write, valid
/// for reads; both for the whole call. `target.mem` must stay open for the call.
unsafe fn vm_io(
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

/// Consumes `n` bytes from the front of `iov[*i..]`.
fn advance(iov: &mut [IoVec], i: &mut usize, mut n: usize) {
    while n > 0 {
        let take = n.min(iov[*i].len);
        iov[*i].base += take;
        iov[*i].len -= take;
        n -= take;
        if iov[*i].len == 0 {
            *i += 1;
        }
    }
}

/// A peer's sealed memfd, mapped into this process.
#[derive(Debug)]
pub(crate) struct Mapping {
    addr: usize,
    len: usize,
}

impl Mapping {
    /// Maps `len` bytes of `fd`, after checking that it is a regular file of at least `len`
    /// bytes sealed against shrinking (so no access can ever fault with SIGBUS).
    pub fn new(fd: &OwnedFd, len: u64, writable: bool) -> io::Result<Self> {
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
        })
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

/// Whether this kernel has what the same-host transport needs.
pub fn available() -> Result<(), &'static str> {
    let me = HostId::current().ok_or("/proc does not say who this process is")?;
    PeerProc::open(&me)
        .map(drop)
        .map_err(|_| "pidfd_open is not available")
}

/// A memory copy to run: `len` bytes from `src` to `dst` (addresses).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Copy {
    pub src: usize,
    pub dst: usize,
    pub len: usize,
}

impl Cut for Copy {
    fn bytes(&self) -> u64 {
        self.len as u64
    }
    fn cut(&self, at: u64) -> (Self, Self) {
        let at = at as usize;
        let head = Copy { len: at, ..*self };
        let tail = Copy {
            src: self.src + at,
            dst: self.dst + at,
            len: self.len - at,
        };
        (head, tail)
    }
}

/// A `process_vm_*` pair: a local and a remote `iovec` of the same length.
#[derive(Clone, Copy)]
struct Pair(IoVec, IoVec);

impl Cut for Pair {
    fn bytes(&self) -> u64 {
        self.0.len as u64
    }
    fn cut(&self, at: u64) -> (Self, Self) {
        let at = at as usize;
        let head = |v: IoVec| IoVec {
            base: v.base,
            len: at,
        };
        let tail = |v: IoVec| IoVec {
            base: v.base + at,
            len: v.len - at,
        };
        (
            Pair(head(self.0), head(self.1)),
            Pair(tail(self.0), tail(self.1)),
        )
    }
}

/// What the helper does: memory copies, or a `process_vm_*` batch for process `pid`.
enum Work {
    Copies(Vec<Copy>),
    Pvm {
        target: Target,
        write: bool,
        local: Vec<IoVec>,
        remote: Vec<IoVec>,
    },
}

type PvmResult = Result<(), (io::Error, u64)>;
type Done = std::sync::Arc<(std::sync::Mutex<Option<PvmResult>>, std::sync::Condvar)>;

struct CopyJob {
    work: Work,
    done: Done,
}

/// A persistent helper thread that copies part of a large same-host batch while the caller
/// copies the rest (waking it costs far less than spawning a thread per transfer).
struct CopyHelper {
    queue: std::sync::Mutex<std::collections::VecDeque<CopyJob>>,
    cv: std::sync::Condvar,
}

fn helper() -> Option<&'static CopyHelper> {
    static H: OnceLock<Option<&'static CopyHelper>> = OnceLock::new();
    *H.get_or_init(|| {
        let h: &'static CopyHelper = Box::leak(Box::new(CopyHelper {
            queue: std::sync::Mutex::new(std::collections::VecDeque::new()),
            cv: std::sync::Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("hixl-copy".into())
            .spawn(move || {
                loop {
                    let job = {
                        let mut q = lock(&h.queue);
                        loop {
                            if let Some(j) = q.pop_front() {
                                break j;
                            }
                            q = h.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                        }
                    };
                    // SAFETY: the submitter keeps every range valid until `done` is set (it
                    // waits for it, even while unwinding: see `WaitDone`).
                    let r = unsafe {
                        match job.work {
                            Work::Copies(c) => {
                                run_copies(&c);
                                Ok(())
                            }
                            Work::Pvm {
                                target,
                                write,
                                mut local,
                                mut remote,
                            } => vm_io(target, write, &mut local, &mut remote),
                        }
                    };
                    let (m, cv) = &*job.done;
                    *lock(m) = Some(r);
                    cv.notify_all();
                }
            })
            .ok()
            .map(|_| h)
    })
}

/// # Safety
/// Every copy's source must be valid for reads and its destination for writes of `len` bytes,
/// and the two must not overlap.
unsafe fn run_copies(copies: &[Copy]) {
    for c in copies {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(c.src as *const u8, c.dst as *mut u8, c.len) };
    }
}

/// Waits for a helper job on drop, so the borrowed memory outlives the helper's use of it even
/// if the caller unwinds.
struct WaitDone(Done);

impl WaitDone {
    /// Waits for the helper and takes its result.
    fn result(self) -> PvmResult {
        let r = Self::wait(&self.0);
        std::mem::forget(self);
        r
    }
    fn wait(done: &Done) -> PvmResult {
        let (m, cv) = &**done;
        let mut g = lock(m);
        loop {
            if let Some(r) = g.take() {
                return r;
            }
            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for WaitDone {
    fn drop(&mut self) {
        let _ = Self::wait(&self.0);
    }
}

/// Hands `work` to the helper if it is idle; `None` (and the work back) if it is busy or absent.
fn submit(work: Work) -> Result<WaitDone, Work> {
    let Some(h) = helper() else { return Err(work) };
    let done: Done = std::sync::Arc::new((std::sync::Mutex::new(None), std::sync::Condvar::new()));
    {
        let mut q = lock(&h.queue);
        if !q.is_empty() {
            return Err(work);
        }
        q.push_back(CopyJob {
            work,
            done: done.clone(),
        });
    }
    h.cv.notify_one();
    Ok(WaitDone(done))
}

/// Copies below this many bytes in all are not shared with the helper thread.
const HELP_MIN: usize = 1 << 20;

/// Runs the copies, sharing large batches with the helper thread (about half the bytes each).
///
/// # Safety
/// As [`run_copies`], for the whole call.
pub(crate) unsafe fn copy_all(copies: &[Copy]) {
    let total: usize = copies.iter().map(|c| c.len).sum();
    if total < HELP_MIN {
        // SAFETY: the caller's contract.
        return unsafe { run_copies(copies) };
    }
    // the second half of the bytes goes to the helper, cutting a copy where needed
    let mut halves = split(copies, 2).into_iter();
    let mine = halves.next().unwrap_or_default();
    let theirs = halves.next().unwrap_or_default();
    let _wait = match submit(Work::Copies(theirs)) {
        Ok(w) => w,
        Err(_) => {
            // the helper is busy with another caller's work: do it all here
            // SAFETY: the caller's contract.
            return unsafe { run_copies(copies) };
        }
    };
    // SAFETY: the caller's contract; `_wait` keeps this call from returning before the helper
    // has finished its half.
    unsafe { run_copies(&mine) };
}

/// `process_vm_*` over pairs `(local[i], remote[i])` of equal lengths, sharing batches of 1 MiB
/// or more with the helper thread (about half the bytes each). On failure returns the error and
/// the index of the pair where it stopped.
///
/// # Safety
/// As [`PeerProc::pvm`], for the whole call.
pub(crate) unsafe fn pvm_all(
    proc: &PeerProc,
    write: bool,
    local: &[IoVec],
    remote: &[IoVec],
) -> Result<(), (io::Error, usize)> {
    let where_ = |lens: &[usize], moved: u64| {
        let (mut at, mut sum) = (0usize, 0u64);
        while at + 1 < lens.len() && sum + lens[at] as u64 <= moved {
            sum += lens[at] as u64;
            at += 1;
        }
        at
    };
    let total: usize = local.iter().map(|v| v.len).sum();
    if total < HELP_MIN {
        let (mut l, mut r) = (local.to_vec(), remote.to_vec());
        let lens: Vec<usize> = l.iter().map(|v| v.len).collect();
        // SAFETY: the caller's contract.
        return unsafe { proc.pvm(write, &mut l, &mut r) }
            .map_err(|(e, moved)| (e, where_(&lens, moved)))
            .and_then(|()| read_checked(proc, write, local.len()));
    }
    // cut at half the bytes: pairs [0, k) and the first part of pair k go here, the rest there
    let pairs: Vec<Pair> = local
        .iter()
        .zip(remote)
        .map(|(a, b)| Pair(*a, *b))
        .collect();
    let mut halves = split(&pairs, 2).into_iter();
    let (first, rest) = (
        halves.next().unwrap_or_default(),
        halves.next().unwrap_or_default(),
    );
    // the pair the second half starts in (cut or whole), for error positions
    let first_bytes: usize = first.iter().map(|p| p.0.len).sum();
    let k = {
        let (mut k, mut sum) = (0, 0);
        while k < local.len() && sum + local[k].len <= first_bytes {
            sum += local[k].len;
            k += 1;
        }
        k
    };
    let unzip = |v: &[Pair]| -> (Vec<IoVec>, Vec<IoVec>) { v.iter().map(|p| (p.0, p.1)).unzip() };
    let ((mut l, mut r), (l2, r2)) = (unzip(&first), unzip(&rest));
    let (lens1, lens2): (Vec<usize>, Vec<usize>) = (
        l.iter().map(|v| v.len).collect(),
        l2.iter().map(|v| v.len).collect(),
    );
    let theirs = Work::Pvm {
        target: proc.target(),
        write,
        local: l2,
        remote: r2,
    };
    let (wait, mut l2, mut r2) = match submit(theirs) {
        Ok(w) => (Some(w), Vec::new(), Vec::new()),
        Err(Work::Pvm { local, remote, .. }) => (None, local, remote),
        Err(Work::Copies(_)) => unreachable!("submit hands back what it was given"),
    };
    // SAFETY: the caller's contract; the helper's half is waited for before returning.
    let first =
        unsafe { proc.pvm(write, &mut l, &mut r) }.map_err(|(e, moved)| (e, where_(&lens1, moved)));
    let second = match wait {
        Some(w) => w.result(),
        // SAFETY: the caller's contract.
        None => unsafe { proc.pvm(write, &mut l2, &mut r2) },
    }
    .map_err(|(e, moved)| (e, k + where_(&lens2, moved)));
    first
        .and(second)
        .and_then(|()| read_checked(proc, write, local.len()))
}

/// After a read: the peer must still be alive, else the bytes may come from a process that got
/// its pid (`ESRCH`, reported at the last pair).
fn read_checked(proc: &PeerProc, write: bool, pairs: usize) -> Result<(), (io::Error, usize)> {
    if !write && proc.exited() {
        return Err((
            io::Error::from_raw_os_error(libc::ESRCH),
            pairs.saturating_sub(1),
        ));
    }
    Ok(())
}
