//! The receive buffer a connection reads through ([`Inbound`]): small frames and small payload
//! pieces in bulk, large pieces straight into their target; and framing over it.

use std::io;
use std::os::fd::AsRawFd;
use std::time::Instant;

use super::{Dir, IoVec, Sock, advance};
use crate::wire::{self, WireError};

/// Initial size of the receive buffer.
const INBOUND: usize = 64 << 10;
/// Payload pieces smaller than this are received through the buffer ([`Inbound::recv_into`]):
/// random 64-byte READ targets cost the client 175-180 CPU ns each so against 240-250 straight
/// (2 × 10⁴ per call, `bench --blocks`, interleaved), 512-byte ones 490-550 against 405-440.
pub(crate) const STAGED_BELOW: usize = 256;
/// Most bytes of small pieces one fill of the buffer waits for (its usual size: staging never
/// grows it).
const STAGE_MAX: usize = INBOUND;

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
    /// that declares more than `limit` gives its kind (`what` names the limit), is `Some(Err)`
    /// at once, before anything is allocated for its payload. The frame stays in the buffer.
    pub fn frame_ready(
        &mut self,
        sock: &Sock,
        limit: impl Fn(wire::Kind) -> u32,
        what: &'static str,
    ) -> io::Result<Option<Result<wire::Header, WireError>>> {
        if !self.fill_now(sock, wire::HEADER_LEN)? {
            return Ok(None);
        }
        let h: [u8; wire::HEADER_LEN] = self.peek(wire::HEADER_LEN).try_into().expect("header");
        let h = match within(wire::decode_header(&h), &limit, what) {
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

    /// Receives exactly the bytes described by `targets`, in order: buffered bytes first; a run
    /// of small pieces (under [`STAGED_BELOW`] bytes each) through the buffer in bulk, copied
    /// out; a run of large ones straight into their targets. Consumes `targets` (each is
    /// advanced past its bytes). Bytes that arrive after the last target stay buffered.
    ///
    /// Small pieces are staged because the kernel's cost is per piece: random 64-byte READ
    /// targets went 128 (8 KiB) to a `recvmsg`; through the buffer a call takes up to
    /// [`STAGE_MAX`] bytes and a piece costs one small copy.
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
        loop {
            // SAFETY: the caller's contract for the targets.
            unsafe { self.copy_out(targets, &mut pos) };
            if pos == targets.len() {
                return Ok(());
            }
            if targets[pos].len < STAGED_BELOW {
                let (mut want, mut at) = (0, pos);
                while at < targets.len() && targets[at].len < STAGED_BELOW && want < STAGE_MAX {
                    want += targets[at].len;
                    at += 1;
                }
                self.fill(sock, want.min(STAGE_MAX), deadline)?;
                continue;
            }
            let end = (targets[pos..].iter())
                .position(|t| t.len < STAGED_BELOW)
                .map_or(targets.len(), |k| pos + k);
            // SAFETY: the caller's contract for the targets.
            unsafe { sock.io_all(Dir::Recv, &mut targets[pos..end], deadline, true) }?;
            pos = end;
        }
    }

    /// Copies buffered bytes into `targets[*pos..]`, in order, as far as they go (empty targets
    /// are stepped over).
    ///
    /// # Safety
    /// As [`Inbound::recv_into`].
    unsafe fn copy_out(&mut self, targets: &mut [IoVec], pos: &mut usize) {
        loop {
            while *pos < targets.len() && targets[*pos].len == 0 {
                *pos += 1;
            }
            if *pos == targets.len() || self.buffered() == 0 {
                return;
            }
            let t = targets[*pos];
            let take = t.len.min(self.buffered());
            // SAFETY: the source is initialised buffer memory, ours alone; the target is valid
            // for writes of any byte values (the caller's contract) and cannot overlap our
            // buffer. Others may write the target meanwhile (another process, a peer's
            // one-sided write applied by a transport thread here): registered memory is shared
            // with the outside, as a DMA buffer is, so it is only ever copied through raw
            // pointers and never behind a Rust reference, and what ends up there is some
            // interleaving of the writers' bytes, each valid for `u8`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.buf.as_ptr().add(self.start),
                    t.base as *mut u8,
                    take,
                )
            };
            self.take(take);
            advance(targets, pos, take);
        }
    }
}

/// Reads one frame, at most `limit` bytes for its kind (a longer one is refused from its
/// header, before its payload is read); the payload stays in the inbound buffer.
pub(crate) fn read_frame<'a>(
    sock: &mut Sock,
    inb: &'a mut Inbound,
    limit: impl Fn(wire::Kind) -> u32,
    first: Option<Instant>,
    rest: impl FnOnce() -> Option<Instant>,
) -> Result<Result<(wire::Kind, &'a [u8]), WireError>, io::Error> {
    inb.fill(sock, wire::HEADER_LEN, first)?;
    let h: [u8; wire::HEADER_LEN] = inb.take(wire::HEADER_LEN).try_into().expect("header size");
    let h = match within(wire::decode_header(&h), &limit, "frame length") {
        Ok(h) => h,
        Err(e) => return Ok(Err(e)),
    };
    inb.fill(sock, h.len as usize, rest())?;
    Ok(Ok((h.kind, inb.take(h.len as usize))))
}

/// A decoded header whose length is at most what `limit` gives its kind (`what` names the
/// limit); a longer one is [`WireError::OverLimit`].
fn within(
    h: Result<wire::Header, WireError>,
    limit: impl Fn(wire::Kind) -> u32,
    what: &'static str,
) -> Result<wire::Header, WireError> {
    let h = h?;
    let max = limit(h.kind);
    if h.len > max {
        let (got, limit) = (h.len.into(), max.into());
        return Err(WireError::OverLimit { what, got, limit });
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::super::DIRECT_MAX;
    use super::super::tests::pair;
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    /// A buffer with a target of each length in `lens`, a guard byte on each side of each.
    fn guarded(lens: &[usize]) -> (Vec<u8>, Vec<IoVec>) {
        let total: usize = lens.iter().sum();
        let mut dst = vec![0xA5u8; total + 2 * lens.len() + 1];
        let mut targets = Vec::new();
        let mut at = 1;
        for &l in lens {
            targets.push(IoVec {
                base: dst.as_mut_ptr() as usize + at,
                len: l,
            });
            at += l + 2;
        }
        (dst, targets)
    }

    /// Each target of [`guarded`] holds its piece of `payload`, and every guard byte is intact.
    fn check(dst: &[u8], lens: &[usize], payload: &[u8]) {
        let (mut at, mut from) = (1, 0);
        for &l in lens {
            assert_eq!(dst[at - 1], 0xA5, "a byte landed before a target");
            assert!(
                dst[at..at + l] == payload[from..from + l],
                "a piece of {l} bytes differs"
            );
            assert_eq!(dst[at + l], 0xA5, "a byte landed after a target");
            at += l + 2;
            from += l;
        }
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
        let (dst, mut targets) = guarded(&lens);
        // SAFETY: every target lies in `dst`, alive and not otherwise used for the call.
        unsafe { inb.recv_into(&mut sock, &mut targets, deadline) }.unwrap();
        check(&dst, &lens, &payload);
        assert_eq!(inb.buffered(), 0);
        drop(writer.join().unwrap());
    }

    /// Many small pieces (staged through the buffer) between large ones (received straight),
    /// sent in uneven chunks with the next frame's bytes right behind the payload: every piece
    /// lands in order inside its target, and what follows the last one stays buffered.
    #[test]
    fn small_pieces_go_through_the_buffer_in_order() {
        let (mut c, mut sock) = pair();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut lens: Vec<usize> = (0..20_000)
            .map(|_| (next() % (STAGED_BELOW as u64 + 64)) as usize)
            .collect();
        lens[5_000] = 3 * DIRECT_MAX;
        lens[12_345] = 70_000;
        let total: usize = lens.iter().sum();
        let payload: Vec<u8> = (0..total).map(|_| next() as u8).collect();
        let sent = [&payload[..], b"NEXTFRAME"].concat();
        let writer = std::thread::spawn(move || {
            let (mut at, mut step) = (0, 1);
            while at < sent.len() {
                let n = step.min(sent.len() - at);
                c.write_all(&sent[at..at + n]).unwrap();
                at += n;
                step = step * 7 % 150_001 + 1;
            }
            c
        });
        let (dst, mut targets) = guarded(&lens);
        let mut inb = Inbound::new();
        let deadline = Some(Instant::now() + Duration::from_secs(30));
        // SAFETY: every target lies in `dst`, alive and not otherwise used for the call.
        unsafe { inb.recv_into(&mut sock, &mut targets, deadline) }.unwrap();
        check(&dst, &lens, &payload);
        inb.fill(&mut sock, 9, deadline).unwrap();
        assert_eq!(inb.take(9), b"NEXTFRAME");
        assert!(inb.capacity() <= INBOUND, "staging grew the buffer");
        drop(writer.join().unwrap());
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
