//! Field codec: the bounds-checked [`Reader`] every decoder reads a payload with, and the
//! writers for the fields it reads back (strings, host ids).

use super::{HostId, MAX_STR, WireError};

/// A bounds-checked reader over a frame payload.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Reads from `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    pub(super) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).ok_or(WireError::Truncated(what))?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or(WireError::Truncated(what))?;
        self.pos = end;
        Ok(s)
    }
    pub(super) fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.take(1, what)?[0])
    }
    pub(super) fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        let s = self.take(2, what)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    pub(super) fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes(s.try_into().expect("4 bytes")))
    }
    pub(super) fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        let s = self.take(8, what)?;
        Ok(u64::from_le_bytes(s.try_into().expect("8 bytes")))
    }
    pub(super) fn string(&mut self, what: &'static str) -> Result<String, WireError> {
        let n = self.u16(what)? as usize;
        within(what, n, MAX_STR)?;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| WireError::Invalid(what))
    }
    pub(super) fn count(
        &mut self,
        what: &'static str,
        limit: usize,
        each: usize,
    ) -> Result<usize, WireError> {
        let n = self.u32(what)? as usize;
        within(what, n, limit)?;
        // the entries must fit in what is left, before anything is allocated for them
        if n.saturating_mul(each) > self.buf.len() - self.pos {
            return Err(WireError::Truncated(what));
        }
        Ok(n)
    }
    pub(super) fn host(&mut self) -> Result<Option<HostId>, WireError> {
        match self.u8("host flag")? {
            0 => Ok(None),
            1 => Ok(Some(HostId {
                boot: self.take(16, "boot id")?.try_into().expect("16 bytes"),
                pidns: self.u64("pid namespace")?,
                pid: self.u32("pid")?,
                start: self.u64("start time")?,
            })),
            _ => Err(WireError::Invalid("host flag")),
        }
    }
    /// Whether bytes are left (an optional field at the end of a payload).
    pub(super) fn has_more(&self) -> bool {
        self.pos < self.buf.len()
    }
    pub(super) fn finish(self) -> Result<(), WireError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            n => Err(WireError::Trailing(n)),
        }
    }
}

/// `s`, cut to [`MAX_STR`] bytes at a character's boundary (a decoder refuses a cut
/// character: a long reason with a peer's multibyte name in it must still decode).
pub(super) fn put_str(out: &mut Vec<u8>, s: &str) {
    let mut n = s.len().min(MAX_STR);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    let b = &s.as_bytes()[..n];
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

pub(super) fn put_host(out: &mut Vec<u8>, h: &Option<HostId>) {
    match h {
        None => out.push(0),
        Some(h) => {
            out.push(1);
            out.extend_from_slice(&h.boot);
            out.extend_from_slice(&h.pidns.to_le_bytes());
            out.extend_from_slice(&h.pid.to_le_bytes());
            out.extend_from_slice(&h.start.to_le_bytes());
        }
    }
}

/// [`WireError::OverLimit`] for a count or length `n` of `what` above `limit`.
fn within(what: &'static str, n: usize, limit: usize) -> Result<(), WireError> {
    if n > limit {
        return Err(WireError::OverLimit {
            what,
            got: n as u64,
            limit: limit as u64,
        });
    }
    Ok(())
}

/// Refuses a list of region ids that names one region twice (a WELCOME table, UCX remote keys).
pub(super) fn check_unique_ids(ids: impl Iterator<Item = u32>) -> Result<(), WireError> {
    let mut ids: Vec<u32> = ids.collect();
    ids.sort_unstable();
    if ids.windows(2).any(|w| w[0] == w[1]) {
        return Err(WireError::Invalid("duplicate region id"));
    }
    Ok(())
}
