//! Deadline-bounded vectored socket I/O straight into and out of registered memory.
//!
//! Registered memory is never turned into Rust slices (a peer may write it at any time); the
//! kernel copies between the socket and raw addresses with `sendmsg`/`readv`. Deadlines are kept
//! with `SO_RCVTIMEO`/`SO_SNDTIMEO`, re-armed only when the remaining time has shrunk well below
//! the armed value, so a steady stream of transfers costs no extra system calls.
//!
//! Here: [`Sock`] and its deadline I/O; in `paced.rs`, the paced I/O a serving worker parks
//! a slow peer's request with; in `inbound.rs`, the receive buffer ([`Inbound`]) and framing.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

mod inbound;
mod paced;

pub(crate) use inbound::{Inbound, read_frame};
pub(crate) use paced::Pace;

/// Tests only: the socket buffers TCP gives connections under memory pressure, the smallest the
/// kernel allows (a few KiB), for the engines a test makes while `TINY_LISTENER` is set on its
/// thread: the receive buffer of their listener (what accepted connections inherit, before
/// their window is set) and the send buffers of client lanes to them. The other two buffers are
/// fixed at TCP's initial size, so that they do not grow past a test's payloads.
#[cfg(test)]
pub(crate) mod tiny {
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
    use std::time::Duration;

    thread_local! {
        /// Set: a listener bound on this thread gets the smallest buffers.
        pub(crate) static TINY_LISTENER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// Set too: such a listener's send buffer and its clients' receive buffers are the
        /// smallest as well (else [`FIXED`]), so that a payload of a few KiB fills them.
        pub(crate) static TINY_BOTH_WAYS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// The port of the last such listener.
    static PORT: AtomicU16 = AtomicU16::new(0);
    /// Whether it was bound with [`TINY_BOTH_WAYS`].
    static BOTH_WAYS: AtomicBool = AtomicBool::new(false);

    /// Half TCP's initial buffer (the kernel doubles what it is given).
    const FIXED: usize = 64 << 10;

    /// A listener just bound.
    pub(crate) fn listener(l: &TcpListener) {
        if TINY_LISTENER.get() {
            let s = socket2::SockRef::from(l);
            let both = TINY_BOTH_WAYS.get();
            // (the kernel raises 1 to its minimum)
            s.set_recv_buffer_size(1).expect("SO_RCVBUF");
            s.set_send_buffer_size(if both { 1 } else { FIXED })
                .expect("SO_SNDBUF");
            BOTH_WAYS.store(both, Ordering::SeqCst);
            PORT.store(
                l.local_addr().expect("a bound port").port(),
                Ordering::SeqCst,
            );
        }
    }

    /// No listener's port gets the smallest buffers any more (the test that set one is done).
    pub(crate) fn forget() {
        PORT.store(0, Ordering::SeqCst);
    }

    fn tiny(port: u16) -> bool {
        port != 0 && port == PORT.load(Ordering::SeqCst)
    }

    /// Connects a lane; to a listener bound with [`TINY_BOTH_WAYS`], with the smallest receive
    /// buffer, set before the connect (after it, the buffer only keeps its initial size, else
    /// the kernel drops what the window let in).
    pub(crate) fn connect(addr: &SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
        if !(tiny(addr.port()) && BOTH_WAYS.load(Ordering::SeqCst)) {
            return TcpStream::connect_timeout(addr, timeout);
        }
        let s = socket2::Socket::new(
            socket2::Domain::for_address(*addr),
            socket2::Type::STREAM,
            None,
        )?;
        s.set_recv_buffer_size(1)?;
        s.connect_timeout(&(*addr).into(), timeout)?;
        Ok(s.into())
    }

    /// A client connection just made (a send buffer can shrink after the connect; a receive
    /// buffer only keeps its initial size, see [`connect`]).
    pub(crate) fn client(stream: &TcpStream) {
        let port = stream.peer_addr().map(|a| a.port()).ok();
        if port.is_some_and(tiny) {
            let s = socket2::SockRef::from(stream);
            s.set_send_buffer_size(1).expect("SO_SNDBUF");
            if !BOTH_WAYS.load(Ordering::SeqCst) {
                s.set_recv_buffer_size(FIXED).expect("SO_RCVBUF");
            }
        }
    }
}

/// Most iovecs passed to one system call (Linux `IOV_MAX`).
pub(crate) const IOV_MAX: usize = 1024;
/// Pieces at least this large are received straight into their target, several to a call,
/// and the call waits for all of them (`MSG_WAITALL` where it may block).
const DIRECT_MIN: usize = 32 << 10;
/// Most bytes one receive of large pieces asks for. Shorter reads let the kernel keep the
/// stream moving: large READs gained about 40% at 16 MiB against unbounded reads, and 128 KiB a
/// call against 512 KiB moved 64 KiB to 1 MiB blocks up to 15% faster on loopback (WRITE and
/// READ rows of `examples/bench`, interleaved, 2026-12-02).
const DIRECT_MAX: usize = 128 << 10;
/// Most bytes one receive of small pieces asks for: they go many to a call, which returns with
/// what has arrived (waiting for all of them cost 4 KiB WRITEs 8-15%, measured the same way).
const SMALL_MAX: usize = 512 << 10;

/// Consumes `n` bytes from the front of `iov[*i..]` (those a system call moved).
pub(crate) fn advance(iov: &mut [IoVec], i: &mut usize, mut n: usize) {
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

/// The next receive's iovecs from `iov[pos..]` (whose first piece is not empty), copied into
/// `part`: a run of large pieces ([`DIRECT_MIN`] or more), at most [`DIRECT_MAX`] bytes, to be
/// waited for whole; or a run of small ones, at most [`SMALL_MAX`] bytes; at most [`RECV_IOVS`]
/// pieces either way, the last one cut. Returns how many, and whether to wait for all of them.
///
/// Gathering large pieces many to a call matters for batches of many 32 KiB blocks: one
/// `recvmsg` per piece cost a tenth more CPU per byte (8192 pieces of 32 KiB, client and server
/// together), and a READ's pieces through the lane's buffer an extra copy.
fn gather(iov: &[IoVec], pos: usize, part: &mut [IoVec; RECV_IOVS]) -> (usize, bool) {
    let large = iov[pos].len >= DIRECT_MIN;
    let max = if large { DIRECT_MAX } else { SMALL_MAX };
    let (mut cnt, mut bytes) = (0, 0);
    for v in &iov[pos..] {
        if cnt == RECV_IOVS || bytes == max || (cnt > 0 && (v.len >= DIRECT_MIN) != large) {
            break;
        }
        let len = v.len.min(max - bytes);
        part[cnt] = IoVec { base: v.base, len };
        cnt += 1;
        bytes += len;
    }
    (cnt, large)
}

/// Most iovecs one patient receive passes to the kernel.
const RECV_IOVS: usize = 128;

/// One `sendmsg` (up to [`IOV_MAX`] pieces) or `recvmsg` (a run `gather` picks, copied into
/// `part`, large pieces waited for whole unless `dontwait`) over `iov[pos..]`, with
/// `MSG_DONTWAIT` when `dontwait`: what both [`Sock`] loops call. Returns the system call's
/// result.
///
/// # Safety
/// `fd` is an open socket; sending, every iovec must describe memory valid for reads;
/// receiving, valid for writes of any byte values, for the call.
unsafe fn one_call(
    fd: libc::c_int,
    send: bool,
    iov: &mut [IoVec],
    pos: usize,
    part: &mut [IoVec; RECV_IOVS],
    dontwait: bool,
) -> isize {
    let nowait = if dontwait { libc::MSG_DONTWAIT } else { 0 };
    let (ptr, cnt, flags) = if send {
        let cnt = (iov.len() - pos).min(IOV_MAX);
        (iov[pos..].as_mut_ptr(), cnt, libc::MSG_NOSIGNAL | nowait)
    } else {
        let (cnt, whole) = gather(iov, pos, part);
        let waitall = if whole && !dontwait {
            libc::MSG_WAITALL
        } else {
            0
        };
        (part.as_mut_ptr(), cnt, waitall | nowait)
    };
    // SAFETY: a zeroed msghdr is valid; it points at `cnt` iovecs with the layout of
    // `libc::iovec` (asserted below `IoVec`) that stay alive for the call (`iov`, or `part`, which
    // describes parts of the same ranges).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = ptr.cast::<libc::iovec>();
    msg.msg_iovlen = cnt as _;
    if send {
        // SAFETY: `fd` is an open socket and the iovecs describe readable memory (this
        // function's contract). MSG_NOSIGNAL turns SIGPIPE into EPIPE.
        unsafe { libc::sendmsg(fd, &msg, flags) }
    } else {
        // SAFETY: `fd` is an open socket and the iovecs describe writable memory (this
        // function's contract); a peer may write the same registered memory meanwhile, which
        // the kernel's copy does not mind (no Rust reference to it exists). MSG_WAITALL
        // returns early only on a timeout, a signal or the end.
        unsafe { libc::recvmsg(fd, &mut msg, flags) }
    }
}

/// An `iovec` that is `Send` (it holds an address, not a pointer), with `libc::iovec`'s layout.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct IoVec {
    pub base: usize,
    pub len: usize,
}

impl IoVec {
    /// Appends `len` bytes at `base` to `v`, in the last `iovec` when they follow it in memory
    /// (the byte stream is the same; the kernel walks fewer segments).
    #[inline]
    pub(crate) fn push_joined(v: &mut Vec<IoVec>, base: usize, len: usize) {
        match v.last_mut() {
            Some(t) if t.base + t.len == base => t.len += len,
            _ => v.push(IoVec { base, len }),
        }
    }
}

static_assertions::assert_eq_size!(IoVec, libc::iovec);
static_assertions::assert_eq_align!(IoVec, libc::iovec);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Send,
    Recv,
}

/// A socket with its armed timeouts.
#[derive(Debug)]
pub(crate) struct Sock {
    /// Shared only with weak handles that shut the connection down from another thread (a
    /// client link's lanes: `transport::tcp::lanes`); they never keep it open.
    pub stream: std::sync::Arc<TcpStream>,
    rd: Option<Duration>,
    wr: Option<Duration>,
    /// How long a receive polls without blocking before it sleeps in the kernel. A reply that
    /// comes back within this window skips a scheduler wake-up (about 10 us on loopback).
    spin: Duration,
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "deadline passed")
}

impl Sock {
    pub fn new(stream: TcpStream) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        #[cfg(test)]
        tiny::client(&stream);
        Ok(Self::adopt(stream))
    }

    /// Wraps `stream` as it is (no socket option set, no timeout armed).
    pub fn adopt(stream: TcpStream) -> Self {
        Self {
            stream: std::sync::Arc::new(stream),
            rd: None,
            wr: None,
            spin: Duration::ZERO,
        }
    }

    /// Turns on TCP keepalive probes after `every` of silence, and makes the kernel drop the
    /// connection when data or probes stay unanswered for about three intervals
    /// (`TCP_USER_TIMEOUT`): a peer whose host died or whose link was cut is noticed even when
    /// nothing is being sent.
    pub fn set_keepalive(&self, every: Duration) -> io::Result<()> {
        let secs = every.as_secs().clamp(1, i32::MAX as u64 / 4);
        let user_ms = (every.as_millis().max(1000) * 3).min(i32::MAX as u128) as u64;
        let sock = socket2::SockRef::from(&self.stream);
        let probes = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(secs))
            .with_interval(Duration::from_secs(secs))
            .with_retries(2);
        // SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT
        sock.set_tcp_keepalive(&probes)?;
        sock.set_tcp_user_timeout(Some(Duration::from_millis(user_ms)))
    }

    /// Sets the receive polling window (see the field).
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// Arms the socket timeout for `dir` so that one blocking call cannot pass `deadline` by much.
    /// `None` leaves the armed value alone (the caller loops on timeouts).
    fn arm(&mut self, dir: Dir, deadline: Option<Instant>) -> io::Result<()> {
        let Some(d) = deadline else { return Ok(()) };
        let rem = d.saturating_duration_since(Instant::now());
        if rem.is_zero() {
            return Err(timed_out());
        }
        let want = rem.max(Duration::from_millis(1));
        let armed = match dir {
            Dir::Send => &mut self.wr,
            Dir::Recv => &mut self.rd,
        };
        let rearm = match *armed {
            None => true,
            Some(a) => a > want + want / 8 + Duration::from_millis(1),
        };
        if rearm {
            match dir {
                Dir::Send => self.stream.set_write_timeout(Some(want))?,
                Dir::Recv => self.stream.set_read_timeout(Some(want))?,
            }
            *armed = Some(want);
        }
        Ok(())
    }

    /// Sets a fixed timeout for both directions (used by serving threads).
    pub fn set_fixed_timeout(&mut self, t: Duration) -> io::Result<()> {
        self.stream.set_read_timeout(Some(t))?;
        self.stream.set_write_timeout(Some(t))?;
        self.rd = Some(t);
        self.wr = Some(t);
        Ok(())
    }

    /// Moves every byte described by `iov` (which it consumes as it goes) by `deadline`:
    /// sending, up to [`IOV_MAX`] pieces a call; receiving, a run of pieces of one size class a
    /// call (`gather`; large ones waited for whole with `MSG_WAITALL`). Without `wait` it moves
    /// what the socket takes now and returns `false` where it would wait.
    ///
    /// # Safety
    /// For `Send`, every iovec must describe memory valid for reads; for `Recv`, valid for
    /// writes of any byte values, for the whole call.
    unsafe fn io_all(
        &mut self,
        dir: Dir,
        iov: &mut [IoVec],
        deadline: Option<Instant>,
        wait: bool,
    ) -> io::Result<bool> {
        let fd = self.stream.as_raw_fd();
        let mut i = 0;
        let mut part = [IoVec { base: 0, len: 0 }; RECV_IOVS];
        loop {
            while i < iov.len() && iov[i].len == 0 {
                i += 1;
            }
            if i == iov.len() {
                return Ok(true);
            }
            if wait {
                self.arm(dir, deadline)?;
            }
            // SAFETY: `fd` is this socket; the iovecs' memory is valid as the caller promises.
            let n = unsafe { one_call(fd, dir == Dir::Send, iov, i, &mut part, !wait) };
            if n < 0 {
                if !wait {
                    let e = io::Error::last_os_error();
                    match e.kind() {
                        io::ErrorKind::Interrupted => continue,
                        io::ErrorKind::WouldBlock => return Ok(false),
                        _ => return Err(e),
                    }
                }
                retry_or_fail(deadline)?;
                continue;
            }
            if n == 0 && dir == Dir::Recv {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the connection",
                ));
            }
            advance(iov, &mut i, n as usize);
        }
    }

    /// Sends every byte described by `iov`.
    ///
    /// # Safety
    /// Every iovec must describe memory valid for reads for the whole call.
    pub unsafe fn send_all(
        &mut self,
        iov: &mut [IoVec],
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        // SAFETY: forwarded caller contract.
        unsafe { self.io_all(Dir::Send, iov, deadline, true) }.map(|_| ())
    }

    /// Sends what the socket takes now of `iov` (which it consumes as it goes), without
    /// waiting: `true` when every byte is sent, `false` when the socket would block first.
    ///
    /// # Safety
    /// Every iovec must describe memory valid for reads for the call.
    pub unsafe fn send_fitting(&mut self, iov: &mut [IoVec]) -> io::Result<bool> {
        // SAFETY: forwarded caller contract.
        unsafe { self.io_all(Dir::Send, iov, None, false) }
    }

    /// Sends a byte slice.
    pub fn send_bytes(&mut self, b: &[u8], deadline: Option<Instant>) -> io::Result<()> {
        let mut iov = [IoVec {
            base: b.as_ptr() as usize,
            len: b.len(),
        }];
        // SAFETY: `b` is a live slice for the whole call.
        unsafe { self.send_all(&mut iov, deadline) }
    }

    /// Receives into `buf` whatever is available (at least one byte).
    fn recv_some(&mut self, buf: &mut [u8], deadline: Option<Instant>) -> io::Result<usize> {
        let fd = self.stream.as_raw_fd();
        if !self.spin.is_zero() {
            let until = Instant::now() + self.spin;
            loop {
                // SAFETY: `buf` is a live, writable slice of `buf.len()` bytes.
                let n = unsafe {
                    libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT)
                };
                if n > 0 {
                    return Ok(n as usize);
                }
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "peer closed the connection",
                    ));
                }
                let e = io::Error::last_os_error();
                if !matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) {
                    return Err(e);
                }
                if Instant::now() >= until {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        loop {
            self.arm(Dir::Recv, deadline)?;
            // SAFETY: `buf` is a live, writable slice of `buf.len()` bytes.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                retry_or_fail(deadline)?;
                continue;
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the connection",
                ));
            }
            return Ok(n as usize);
        }
    }

    /// Sends all of `b` now, without waiting (a handshake frame into a send buffer that is
    /// empty this early); `WouldBlock` if it did not all fit.
    pub fn send_now(&self, b: &[u8]) -> io::Result<()> {
        let fd = self.stream.as_raw_fd();
        loop {
            // SAFETY: `b` is a live slice for the call; MSG_NOSIGNAL turns SIGPIPE into EPIPE.
            let n = unsafe {
                libc::send(
                    fd,
                    b.as_ptr().cast(),
                    b.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n as usize != b.len() {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "the send buffer is full",
                ));
            }
            return Ok(());
        }
    }

    /// Makes closing the socket discard what it has not sent yet (`SO_LINGER` 0: the peer gets
    /// a reset): a peer that stopped reading leaves nothing queued in the kernel once the
    /// socket is closed.
    pub fn discard_unsent_on_close(&self) {
        let _ = socket2::SockRef::from(&self.stream).set_linger(Some(Duration::ZERO));
    }

    /// Shuts a socket down in both directions (wakes any thread blocked on it). The caller
    /// makes sure `s` still names the socket it means (it is open for the whole call).
    pub fn shutdown(s: &impl AsRawFd) {
        // SAFETY: a system call on a descriptor number with no memory arguments; the caller
        // keeps the socket open for the call.
        unsafe { libc::shutdown(s.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

/// After a socket call failed: `Ok` to try again (interrupted, or it would block and the
/// deadline has not passed), or the error to return (`TimedOut` once the deadline passed).
fn retry_or_fail(deadline: Option<Instant>) -> io::Result<()> {
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::Interrupted => Ok(()),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                Err(timed_out())
            } else {
                Ok(())
            }
        }
        _ => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    pub(super) fn pair() -> (TcpStream, Sock) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, Sock::new(s).unwrap())
    }

    #[test]
    fn keepalive_sets_the_probes_and_the_user_timeout() {
        let (_c, sock) = pair();
        sock.set_keepalive(Duration::from_secs(5)).unwrap();
        let s = socket2::SockRef::from(&sock.stream);
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(5));
        assert_eq!(s.tcp_keepalive_interval().unwrap(), Duration::from_secs(5));
        assert_eq!(s.tcp_keepalive_retries().unwrap(), 2);
        assert_eq!(s.tcp_user_timeout().unwrap(), Some(Duration::from_secs(15)));
        // below a second: probes every second, the kernel gives up after three
        sock.set_keepalive(Duration::from_millis(300)).unwrap();
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(1));
        assert_eq!(s.tcp_user_timeout().unwrap(), Some(Duration::from_secs(3)));
    }
}
