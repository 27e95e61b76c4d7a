//! The same-host transport (`cma`): one-sided transfers between processes of one machine, with no
//! work by the peer's CPU.
//!
//! - Memory the engine allocates ([`HostBuffer`](crate::HostBuffer)) lives in a sealed `memfd`
//!   (it can neither shrink nor grow). A same-host client takes a duplicate of that descriptor
//!   with `pidfd_getfd`, checks the seals and size, and maps it: READ and WRITE are then a plain
//!   memory copy into or out of the peer's pages, at memory speed, no system call per descriptor.
//! - Any other registered host memory is reached with `process_vm_readv`/`process_vm_writev` on
//!   the peer's addresses, batched by `IOV_MAX`, partial transfers continued.
//!
//! Both need the right to trace the peer (same user, or `CAP_SYS_PTRACE`): exactly the right to
//! read and write its memory anyway. Where the kernel refuses, the link stays on TCP.
//!
//! The peer is identified by boot id, pid namespace, pid and process start time; the pid is
//! pinned with a pidfd right after the start time is checked, and every transfer first checks
//! (one `poll`) that the peer is alive and the link's control connection open.

use std::fs;
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;

use crate::transport::io::{IOV_MAX, IoVec};

/// Who a process is, as far as the same-host transport cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostId {
    /// `/proc/sys/kernel/random/boot_id`, as 16 bytes.
    pub boot: [u8; 16],
    /// The inode of `/proc/self/ns/pid`.
    pub pidns: u64,
    /// The process id (in that namespace).
    pub pid: u32,
    /// The process start time, in clock ticks after boot (`/proc/PID/stat` field 22).
    pub start: u64,
}

fn boot_id() -> Option<[u8; 16]> {
    let s = fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: String = s.trim().chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut b = [0u8; 16];
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(b)
}

/// The start time of `pid`, from `/proc/PID/stat` (field 22, after the parenthesised name).
fn start_time(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

impl HostId {
    /// This process's identity, or `None` where `/proc` does not tell (then cma is off).
    pub fn current() -> Option<HostId> {
        static ME: OnceLock<Option<HostId>> = OnceLock::new();
        *ME.get_or_init(|| {
            let pid = std::process::id();
            Some(HostId {
                boot: boot_id()?,
                pidns: fs::metadata("/proc/self/ns/pid").ok()?.ino(),
                pid,
                start: start_time(pid)?,
            })
        })
    }

    /// Same machine, same pid namespace (so the pid means the same process for both).
    pub fn same_host(&self, other: &HostId) -> bool {
        self.boot == other.boot && self.pidns == other.pidns && self.boot != [0; 16]
    }
}

/// A peer process pinned by a pidfd.
#[derive(Debug)]
pub(crate) struct PeerProc {
    pidfd: OwnedFd,
    pid: libc::pid_t,
}

impl PeerProc {
    /// Opens the peer and checks it is the process `id` describes (not a reused pid).
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

    /// Whether the process still runs, and `control` (the link's TCP connection) is still open.
    pub fn alive(&self, control: &TcpStream) -> bool {
        let mut fds = [
            libc::pollfd {
                fd: self.pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: control.as_raw_fd(),
                events: libc::POLLRDHUP,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a live array of two pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 0) };
        n == 0
    }

    /// A duplicate of the peer's descriptor `fd` (`pidfd_getfd`).
    pub fn getfd(&self, fd: i32) -> io::Result<OwnedFd> {
        // SAFETY: pidfd_getfd takes a pidfd, a descriptor number and flags; the result is checked.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, self.pidfd.as_raw_fd(), fd, 0) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
    }

    /// Moves the bytes of `local` to or from `remote` (same total length) with
    /// `process_vm_writev` (`write`) or `process_vm_readv`, continuing partial transfers.
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
        let (mut li, mut ri, mut moved) = (0usize, 0usize, 0u64);
        loop {
            while li < local.len() && local[li].len == 0 {
                li += 1;
            }
            while ri < remote.len() && remote[ri].len == 0 {
                ri += 1;
            }
            if li == local.len() || ri == remote.len() {
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
            let n = unsafe {
                if write {
                    libc::process_vm_writev(self.pid, lp, ln as _, rp, rn as _, 0)
                } else {
                    libc::process_vm_readv(self.pid, lp, ln as _, rp, rn as _, 0)
                }
            };
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

struct CopyJob {
    copies: Vec<Copy>,
    done: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
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
                        let mut q = h.queue.lock().unwrap_or_else(|e| e.into_inner());
                        loop {
                            if let Some(j) = q.pop_front() {
                                break j;
                            }
                            q = h.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                        }
                    };
                    // SAFETY: the submitter keeps every range valid until `done` is set (it
                    // waits for it, even while unwinding: see `WaitDone`).
                    unsafe { run_copies(&job.copies) };
                    let (m, cv) = &*job.done;
                    *m.lock().unwrap_or_else(|e| e.into_inner()) = true;
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
struct WaitDone(std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>);

impl Drop for WaitDone {
    fn drop(&mut self) {
        let (m, cv) = &*self.0;
        let mut done = m.lock().unwrap_or_else(|e| e.into_inner());
        while !*done {
            done = cv.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Copies below this many bytes in all are not shared with the helper thread.
const HELP_MIN: usize = 1 << 20;

/// Runs the copies, sharing large batches with the helper thread (about half the bytes each).
///
/// # Safety
/// As [`run_copies`], for the whole call.
pub(crate) unsafe fn copy_all(copies: &[Copy]) {
    let total: usize = copies.iter().map(|c| c.len).sum();
    let Some(h) = helper().filter(|_| total >= HELP_MIN) else {
        // SAFETY: the caller's contract.
        return unsafe { run_copies(copies) };
    };
    // the second half of the bytes goes to the helper, cutting a copy where needed
    let (mut mine, mut theirs) = (Vec::new(), Vec::new());
    let mut room = total / 2;
    for c in copies {
        let take = c.len.min(room);
        if take > 0 {
            mine.push(Copy { len: take, ..*c });
        }
        if c.len > take {
            theirs.push(Copy {
                src: c.src + take,
                dst: c.dst + take,
                len: c.len - take,
            });
        }
        room -= take;
    }
    let done = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    {
        let mut q = h.queue.lock().unwrap_or_else(|e| e.into_inner());
        if !q.is_empty() {
            // the helper is busy with another caller's copies: do it all here
            drop(q);
            // SAFETY: the caller's contract.
            return unsafe { run_copies(copies) };
        }
        q.push_back(CopyJob {
            copies: theirs,
            done: done.clone(),
        });
    }
    let _wait = WaitDone(done);
    h.cv.notify_one();
    // SAFETY: the caller's contract; `_wait` keeps this call from returning before the helper
    // has finished its half.
    unsafe { run_copies(&mine) };
}
