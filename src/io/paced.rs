//! Paced serving I/O: a request's bytes move while the peer keeps pace, and the request is
//! parked (its worker goes on to other work) when it does not.

use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::{IoVec, RECV_IOVS, Sock, advance, one_call, timed_out};

/// The pace a peer must keep to hold a serving worker: at least this many bytes in each
/// patience interval (64 KiB per 5 ms: about 13 MB/s); a slower one is parked between its bytes.
pub(crate) const MIN_PACE: usize = 64 << 10;

/// How a request's bytes are paced: its deadline, the patience it is given, whether it was
/// parked before (see [`Sock::move_patiently`]), and whether other work waits for its thread.
pub(crate) struct Pace<'a> {
    /// When the whole request must be done.
    pub(crate) deadline: Option<Instant>,
    /// How long it may wait for progress, and the window its pace is measured over.
    pub(crate) patience: Duration,
    /// It was parked once: it resumes without waiting until it keeps pace again.
    pub(crate) resumed: bool,
    /// Whether other work waits for this thread (then it yields at the end of a window).
    pub(crate) others_wait: &'a dyn Fn() -> bool,
}

impl Sock {
    /// Moves the bytes `iov[*pos..]` describes (consuming them, and `*pos` past those done) as
    /// long as the peer keeps pace ([`Pace`]): `Ok(true)` once all have moved; `Ok(false)` when it does
    /// not — no byte for `patience`, or less than [`MIN_PACE`] bytes in a `patience` — so the
    /// caller parks the request and resumes it when the socket is ready; `TimedOut` once
    /// `deadline` passes. A `resumed` request first moves what the socket takes without
    /// waiting, and parks again unless that was at least [`MIN_PACE`] bytes: a peer that trickles
    /// costs a worker only the moments its bytes take, not its patience each time. Receiving, a
    /// closed connection is `UnexpectedEof`. A peer that keeps pace yields too, at the end of a
    /// `patience` window in which `others_wait` says other work waits for this thread
    /// (`Ok(false)`, as if it stalled): no request holds its worker beyond a share of about
    /// `patience` while others wait, however fast its peer.
    ///
    /// # Safety
    /// Sending, every iovec must describe memory valid for reads; receiving, valid for writes of
    /// any byte values; both until the bytes have moved (this call or a later one).
    pub unsafe fn move_patiently(
        &mut self,
        send: bool,
        iov: &mut [IoVec],
        pos: &mut usize,
        pace: &Pace<'_>,
    ) -> io::Result<bool> {
        let (deadline, patience, resumed) = (pace.deadline, pace.patience, pace.resumed);
        let others_wait = pace.others_wait;
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
                    if others_wait() {
                        // its share is spent: it goes to the back of the queue
                        return Ok(false);
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
}

#[cfg(test)]
mod tests {
    use super::super::tests::pair;
    use super::*;
    use std::io::Write;

    /// One patient receive into `iov` (every iovec `endless`'s sink) with a 5 ms patience.
    fn receive(
        sock: &mut Sock,
        iov: &mut [IoVec],
        pos: &mut usize,
        deadline: Option<Instant>,
        resumed: bool,
        others_wait: &dyn Fn() -> bool,
    ) -> io::Result<bool> {
        let pace = Pace {
            deadline,
            patience: Duration::from_millis(5),
            resumed,
            others_wait,
        };
        // SAFETY: every iovec is the caller's sink, alive and written only through them for
        // the call.
        unsafe { sock.move_patiently(false, iov, pos, &pace) }
    }

    /// A peer that keeps pace does not keep a patient receive past its deadline: a sender that
    /// never stops (until the receiver closes), a receive of 64 GiB (more than any machine
    /// moves in its 100 ms), and the receive ends `TimedOut` with bytes still to come (it would
    /// otherwise run for the whole payload).
    /// A socket whose peer sends without end (until it is dropped), its sender, and a 64 GiB
    /// receive of it: every piece lands in the same MiB of `sink` (its bytes are not looked at).
    fn endless(sink: &mut [u8]) -> (Sock, std::thread::JoinHandle<()>, Vec<IoVec>) {
        let (mut c, mut sock) = pair();
        sock.set_fixed_timeout(Duration::from_millis(5)).unwrap();
        let writer = std::thread::spawn(move || {
            let chunk = vec![7u8; 1 << 20];
            while c.write_all(&chunk).is_ok() {}
        });
        let (base, len) = (sink.as_mut_ptr() as usize, sink.len());
        (sock, writer, vec![IoVec { base, len }; 64 << 10])
    }

    #[test]
    fn a_paced_peer_still_meets_the_deadline() {
        let mut sink = vec![0u8; 1 << 20];
        let (mut sock, writer, mut iov) = endless(&mut sink);
        let (mut pos, start) = (0, Instant::now());
        let deadline = Some(start + Duration::from_millis(100));
        let mut resumed = false;
        let r = loop {
            match receive(&mut sock, &mut iov, &mut pos, deadline, resumed, &|| false) {
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

    /// A peer that keeps pace yields its worker once others wait for it: the receive of a
    /// payload without end returns `Ok(false)` (parked, as if stalled) after moving bytes, within
    /// a few windows, and asks whether others wait only at the end of a window.
    #[test]
    fn a_paced_peer_yields_when_others_wait() {
        const MIB: usize = 1 << 20;
        let mut sink = vec![0u8; MIB];
        let (mut sock, writer, mut iov) = endless(&mut sink);
        let (mut pos, start) = (0, Instant::now());
        let deadline = Some(start + Duration::from_secs(60));
        let asked = std::cell::Cell::new(0u32);
        let others_wait = || {
            asked.set(asked.get() + 1);
            asked.get() >= 3
        };
        let r = receive(&mut sock, &mut iov, &mut pos, deadline, false, &others_wait);
        assert!(!r.expect("no error"), "it yielded");
        assert_eq!(asked.get(), 3, "asked once a window, yielded when told");
        assert!(
            pos > 0 || iov[0].len < MIB,
            "it moved bytes before it yielded"
        );
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "it did not run to its deadline"
        );
        drop(sock);
        writer.join().unwrap();
    }
}
