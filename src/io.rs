//! Deadline-bounded vectored socket I/O straight into and out of registered memory.
//!
//! Registered memory is never turned into Rust slices (a peer may write it at any time); the
//! kernel copies between the socket and raw addresses with `sendmsg`/`readv`. Deadlines are kept
//! with `SO_RCVTIMEO`/`SO_SNDTIMEO`, re-armed only when the remaining time has shrunk well below
//! the armed value, so a steady stream of transfers costs no extra system calls.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::wire::{self, WireError};

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

/// The pace a peer must keep to hold a serving worker: at least this many bytes in each
/// patience interval (64 KiB per 5 ms: about 13 MB/s); a slower one is parked between its bytes.
pub(crate) const MIN_PACE: usize = 64 << 10;

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

/// Initial size of the receive buffer.
const INBOUND: usize = 64 << 10;

/// An `iovec` that is `Send` (it holds an address, not a pointer), with `libc::iovec`'s layout.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct IoVec {
    pub base: usize,
    pub len: usize,
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
    pub stream: TcpStream,
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
        Ok(Self::adopt(stream))
    }

    /// Wraps `stream` as it is (no socket option set, no timeout armed).
    pub fn adopt(stream: TcpStream) -> Self {
        Self {
            stream,
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
    /// call (`gather`; large ones waited for whole with `MSG_WAITALL`).
    ///
    /// # Safety
    /// For `Send`, every iovec must describe memory valid for reads; for `Recv`, valid for
    /// writes of any byte values, for the whole call.
    unsafe fn io_all(
        &mut self,
        dir: Dir,
        iov: &mut [IoVec],
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        let fd = self.stream.as_raw_fd();
        let mut i = 0;
        let mut part = [IoVec { base: 0, len: 0 }; RECV_IOVS];
        loop {
            while i < iov.len() && iov[i].len == 0 {
                i += 1;
            }
            if i == iov.len() {
                return Ok(());
            }
            self.arm(dir, deadline)?;
            // SAFETY: `fd` is this socket; the iovecs' memory is valid as the caller promises.
            let n = unsafe { one_call(fd, dir == Dir::Send, iov, i, &mut part, false) };
            if n < 0 {
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
        unsafe { self.io_all(Dir::Send, iov, deadline) }
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

    /// Moves the bytes `iov[*pos..]` describes (consuming them, and `*pos` past those done) as
    /// long as the peer keeps pace: `Ok(true)` once all have moved; `Ok(false)` when it does
    /// not — no byte for `patience`, or less than [`MIN_PACE`] bytes in a `patience` — so the
    /// caller parks the request and resumes it when the socket is ready; `TimedOut` once
    /// `deadline` passes. A `resumed` request first moves what the socket takes without
    /// waiting, and parks again unless that was at least [`MIN_PACE`] bytes: a peer that trickles
    /// costs a worker only the moments its bytes take, not its patience each time. Receiving, a
    /// closed connection is `UnexpectedEof`.
    ///
    /// # Safety
    /// Sending, every iovec must describe memory valid for reads; receiving, valid for writes of
    /// any byte values; both until the bytes have moved (this call or a later one).
    pub unsafe fn move_patiently(
        &mut self,
        send: bool,
        iov: &mut [IoVec],
        pos: &mut usize,
        deadline: Option<Instant>,
        patience: Duration,
        resumed: bool,
    ) -> io::Result<bool> {
        let fd = self.stream.as_raw_fd();
        // a socket whose own timeout is within the patience blocks in the call itself (one
        // system call per wake-up); others poll for it
        let armed = if send { self.wr } else { self.rd };
        let can_block = armed.is_some_and(|t| t <= patience);
        let mut probing = resumed;
        let (mut window, mut paced) = (Instant::now(), 0usize);
        let mut part = [IoVec { base: 0, len: 0 }; RECV_IOVS];
        loop {
            while *pos < iov.len() && iov[*pos].len == 0 {
                *pos += 1;
            }
            if *pos == iov.len() {
                return Ok(true);
            }
            let blocking = can_block && !probing;
            // receiving, a run of pieces of one size class (`gather`), large ones waited for
            // whole when blocking (measured: 1 MiB pieces ran 7% slower without MSG_WAITALL)
            // SAFETY: `fd` is this socket; the iovecs' memory is valid as the caller promises.
            let n = unsafe { one_call(fd, send, iov, *pos, &mut part, !blocking) };
            if n > 0 {
                advance(iov, pos, n as usize);
                paced += n as usize;
                if probing && paced >= MIN_PACE {
                    // it keeps pace again: wait for it as for any peer
                    probing = false;
                    (window, paced) = (Instant::now(), 0);
                } else if !probing && window.elapsed() >= patience {
                    if paced < MIN_PACE {
                        return Ok(false);
                    }
                    // a peer that keeps pace still has the request's deadline (checked once a
                    // window, not only when a call would block)
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        return Err(timed_out());
                    }
                    (window, paced) = (now, 0);
                }
                continue;
            }
            if n == 0 && !send {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the connection",
                ));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => {}
                _ => return Err(e),
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Err(timed_out());
            }
            if probing || blocking {
                // nothing more now (probing), or the call waited its timeout without a byte
                return Ok(false);
            }
            let wait = deadline.map_or(patience, |d| patience.min(d - now));
            let mut fds = [libc::pollfd {
                fd,
                events: if send { libc::POLLOUT } else { libc::POLLIN },
                revents: 0,
            }];
            let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
            // SAFETY: `fds` is a live array of one pollfd.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
            if r == 0 {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(timed_out());
                }
                return Ok(false);
            }
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

/// A receive buffer: small frames and small payload pieces are read in bulk and copied; large
/// payload pieces go straight from the socket into their target.
#[derive(Debug)]
pub(crate) struct Inbound {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Inbound {
    pub fn new() -> Self {
        Self::with_capacity(INBOUND)
    }

    /// A buffer of `n` bytes to begin with (it grows as bytes arrive).
    pub fn with_capacity(n: usize) -> Self {
        Self {
            buf: vec![0; n.max(crate::wire::HEADER_LEN)],
            start: 0,
            end: 0,
        }
    }

    /// Shrinks the buffer back to its usual size after a large frame, keeping any bytes already
    /// received (a connection keeps no more memory than it needs between requests).
    pub fn trim(&mut self) {
        if self.buf.len() <= INBOUND || self.buffered() > INBOUND {
            return;
        }
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
        self.buf.truncate(INBOUND);
        self.buf.shrink_to_fit();
    }

    /// Bytes of buffer it holds.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Bytes received and not taken yet.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Gives back all but `keep` bytes of buffer (and at least what is buffered): a connection
    /// waiting for its next request holds little memory.
    pub fn shrink_to(&mut self, keep: usize) {
        let keep = keep.max(self.buffered()).max(crate::wire::HEADER_LEN);
        if self.buf.len() <= keep {
            return;
        }
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
        self.buf.truncate(keep);
        self.buf.shrink_to_fit();
    }

    /// Reads what the socket has now, without waiting, until at least `n` bytes are buffered;
    /// says whether they are. A closed connection is `UnexpectedEof`.
    pub fn fill_now(&mut self, sock: &Sock, n: usize) -> io::Result<bool> {
        if self.buffered() >= n {
            return Ok(true);
        }
        if self.buf.len() - self.start < n {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let fd = sock.stream.as_raw_fd();
        while self.buffered() < n {
            if self.end == self.buf.len() {
                let grown = self.buf.len().saturating_mul(2).min(self.start + n);
                self.buf.resize(grown, 0);
            }
            let room = &mut self.buf[self.end..];
            // SAFETY: `room` is a live, writable slice of `room.len()` bytes.
            let got =
                unsafe { libc::recv(fd, room.as_mut_ptr().cast(), room.len(), libc::MSG_DONTWAIT) };
            if got == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the connection",
                ));
            }
            if got < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => return Ok(false),
                    _ => return Err(e),
                }
            }
            self.end += got as usize;
        }
        Ok(true)
    }

    /// The header of the next frame once the whole frame is in (reading what `sock` has now,
    /// without waiting): `Ok(None)` while bytes are missing. A header that does not decode, or
    /// that declares more than `limit` bytes (`what` names the limit), is `Some(Err)` at once,
    /// before anything is allocated for its payload. The frame stays in the buffer.
    pub fn frame_ready(
        &mut self,
        sock: &Sock,
        limit: u32,
        what: &'static str,
    ) -> io::Result<Option<Result<wire::Header, WireError>>> {
        if !self.fill_now(sock, wire::HEADER_LEN)? {
            return Ok(None);
        }
        let h: [u8; wire::HEADER_LEN] = self.peek(wire::HEADER_LEN).try_into().expect("header");
        let h = match wire::decode_header(&h) {
            Ok(h) if h.len > limit => {
                let (got, limit) = (h.len.into(), limit.into());
                return Ok(Some(Err(WireError::OverLimit { what, got, limit })));
            }
            Ok(h) => h,
            Err(e) => return Ok(Some(Err(e))),
        };
        let all = self.fill_now(sock, wire::HEADER_LEN + h.len as usize)?;
        Ok(all.then_some(Ok(h)))
    }

    /// The next `n` buffered bytes, left in the buffer (`n` must be buffered).
    pub fn peek(&self, n: usize) -> &[u8] {
        &self.buf[self.start..self.start + n]
    }

    /// Makes at least `n` bytes available in the buffer.
    pub fn fill(&mut self, sock: &mut Sock, n: usize, deadline: Option<Instant>) -> io::Result<()> {
        if self.buffered() >= n {
            return Ok(());
        }
        if self.buf.len() - self.start < n {
            // compact; the buffer grows below as bytes arrive, never ahead of them
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.buffered() < n {
            if self.end == self.buf.len() {
                // full and more is due: at most double, never past the frame's end, so a length
                // a peer declares costs memory only as its bytes come in
                let grown = self.buf.len().saturating_mul(2).min(self.start + n);
                self.buf.resize(grown, 0);
            }
            let end = self.end;
            let got = sock.recv_some(&mut self.buf[end..], deadline)?;
            self.end += got;
        }
        Ok(())
    }

    /// The next `n` buffered bytes (after [`Inbound::fill`]); consumes them.
    pub fn take(&mut self, n: usize) -> &[u8] {
        debug_assert!(self.buffered() >= n);
        let s = self.start;
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        &self.buf[s..s + n]
    }

    /// Receives exactly the bytes described by `targets`, in order (buffered bytes first, the
    /// rest straight into the targets). Consumes `targets` (each is advanced past its bytes).
    ///
    /// # Safety
    /// Every target must describe memory valid for writes of any byte values for the whole call.
    pub unsafe fn recv_into(
        &mut self,
        sock: &mut Sock,
        targets: &mut [IoVec],
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        let mut pos = 0;
        while pos < targets.len() && self.buffered() > 0 {
            if targets[pos].len == 0 {
                pos += 1;
                continue;
            }
            let t = targets[pos];
            let take = t.len.min(self.buffered());
            // SAFETY: the source is initialised buffer memory; the target is writable (caller
            // contract) and cannot overlap our private buffer.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.buf.as_ptr().add(self.start),
                    t.base as *mut u8,
                    take,
                )
            };
            self.take(take);
            advance(targets, &mut pos, take);
        }
        // SAFETY: the caller's contract for the targets.
        unsafe { sock.io_all(Dir::Recv, &mut targets[pos..], deadline) }
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

/// Reads one frame; the payload stays in the inbound buffer.
pub(crate) fn read_frame<'a>(
    sock: &mut Sock,
    inb: &'a mut Inbound,
    first: Option<Instant>,
    rest: impl FnOnce() -> Option<Instant>,
) -> Result<Result<(wire::Kind, &'a [u8]), WireError>, io::Error> {
    inb.fill(sock, wire::HEADER_LEN, first)?;
    let h: [u8; wire::HEADER_LEN] = inb.take(wire::HEADER_LEN).try_into().expect("header size");
    let h = match wire::decode_header(&h) {
        Ok(h) => h,
        Err(e) => return Ok(Err(e)),
    };
    inb.fill(sock, h.len as usize, rest())?;
    Ok(Ok((h.kind, inb.take(h.len as usize))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, Sock) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, Sock::new(s).unwrap())
    }

    /// A peer that keeps pace does not keep a patient receive past its deadline: a sender that
    /// never stops (until the receiver closes), a receive of 64 GiB (more than any machine
    /// moves in its 100 ms), and the receive ends `TimedOut` with bytes still to come (it would
    /// otherwise run for the whole payload).
    #[test]
    fn a_paced_peer_still_meets_the_deadline() {
        let (mut c, mut sock) = pair();
        sock.set_fixed_timeout(Duration::from_millis(5)).unwrap();
        const MIB: usize = 1 << 20;
        let writer = std::thread::spawn(move || {
            let chunk = vec![7u8; MIB];
            while c.write_all(&chunk).is_ok() {}
        });
        let mut sink = vec![0u8; MIB];
        let base = sink.as_mut_ptr() as usize;
        // every piece lands in the same MiB (its bytes are not looked at)
        let mut iov = vec![IoVec { base, len: MIB }; 64 << 10];
        let (mut pos, start) = (0, Instant::now());
        let deadline = Some(start + Duration::from_millis(100));
        let mut resumed = false;
        let r = loop {
            // SAFETY: every iovec is `sink`, alive and written only through them for the call.
            match unsafe {
                sock.move_patiently(
                    false,
                    &mut iov,
                    &mut pos,
                    deadline,
                    Duration::from_millis(5),
                    resumed,
                )
            } {
                Ok(false) => resumed = true, // parked and resumed, as a server does
                r => break r,
            }
        };
        let e = r.expect_err("the whole payload was taken past the deadline");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(pos < iov.len(), "every byte came in before the deadline");
        drop(sock);
        writer.join().unwrap();
    }

    /// A frame header and payload pieces of every size class (empty, tiny, 4 KiB, larger than a
    /// receive, odd): bytes already buffered go first, the rest is gathered straight into the
    /// targets whatever the sender's chunking, and nothing lands outside them.
    #[test]
    fn recv_into_fills_every_target_in_order() {
        let (mut c, mut sock) = pair();
        let lens = [
            8usize,
            0,
            4096,
            4096,
            300_001,
            1,
            0,
            DIRECT_MAX,
            65_536,
            7,
            3 * DIRECT_MAX + 5,
        ];
        let total: usize = lens.iter().sum();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let payload: Vec<u8> = (0..total)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let head = b"HEADER..".to_vec();
        let sent = payload.clone();
        let writer = std::thread::spawn(move || {
            // the header and the first bytes in one write (they end up buffered), then chunks
            // of uneven sizes
            let first = 1000;
            c.write_all(&[&head[..], &sent[..first]].concat()).unwrap();
            let mut at = first;
            let mut step = 1;
            while at < sent.len() {
                let n = step.min(sent.len() - at);
                c.write_all(&sent[at..at + n]).unwrap();
                at += n;
                step = step * 3 % 200_003 + 1;
            }
            c
        });
        let mut inb = Inbound::new();
        let deadline = Some(Instant::now() + Duration::from_secs(20));
        inb.fill(&mut sock, 8, deadline).unwrap();
        assert_eq!(inb.take(8), b"HEADER..");
        // targets with a guard byte on each side
        let mut dst = vec![0xA5u8; total + 2 * lens.len()];
        let mut targets = Vec::new();
        let mut at = 1;
        for &l in &lens {
            targets.push(IoVec {
                base: dst.as_mut_ptr() as usize + at,
                len: l,
            });
            at += l + 2;
        }
        // SAFETY: every target lies in `dst`, alive and not otherwise used for the call.
        unsafe { inb.recv_into(&mut sock, &mut targets, deadline) }.unwrap();
        let (mut at, mut from) = (1, 0);
        for &l in &lens {
            assert_eq!(dst[at - 1], 0xA5, "a byte landed before a target");
            assert!(
                dst[at..at + l] == payload[from..from + l],
                "piece of {l} bytes differs"
            );
            assert_eq!(dst[at + l], 0xA5, "a byte landed after a target");
            at += l + 2;
            from += l;
        }
        assert_eq!(inb.buffered(), 0);
        drop(writer.join().unwrap());
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

    #[test]
    fn a_declared_length_costs_memory_only_as_bytes_arrive() {
        let (mut c, mut sock) = pair();
        let mut inb = Inbound::with_capacity(4096);
        c.write_all(&[7u8; 10_000]).unwrap();
        let soon = Some(Instant::now() + Duration::from_millis(200));
        let e = inb.fill(&mut sock, 8 << 20, soon).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(
            inb.buf.len() <= 16 << 10,
            "{} bytes for 10,000",
            inb.buf.len()
        );
        assert_eq!(inb.buffered(), 10_000);
        // the rest arrives: the frame is complete, and the buffer shrinks once it is consumed
        let rest = vec![7u8; (8 << 20) - 10_000];
        let writer = std::thread::spawn(move || c.write_all(&rest).map(|_| c));
        let later = Some(Instant::now() + Duration::from_secs(20));
        inb.fill(&mut sock, 8 << 20, later).unwrap();
        assert!(inb.take(8 << 20).iter().all(|&b| b == 7));
        let _c = writer.join().unwrap().unwrap();
        assert!(inb.buf.len() >= 8 << 20);
        inb.trim();
        assert_eq!(inb.buf.len(), INBOUND);
    }
}
