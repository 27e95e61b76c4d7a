//! The memory list a HIXL-CS server publishes: its endpoints and its tagged regions, in a
//! read-only host region of its engine ([`FORMAT`]'s region) that clients READ at connect and
//! at every [`Client::remote_mems`](super::Client::remote_mems), and find in the link's region
//! table by its size. It is a published table ([`crate::published`]: the header, the seqlock,
//! the fetch with retry); this file is its payload's codec. Its bytes come from the peer: the
//! decoder checks every count and length against the bytes there are before it reads them, and
//! never panics.
//!
//! Payload (little-endian, after the published table's header with the magic "HXLCSMT1"): `{u32
//! endpoints; u32 mems; endpoints × 160 bytes (an EndpointDesc as the server got it); mems ×
//! {i32 type (0 device, 1 host); u32 tag length; u64 addr; u64 size; tag bytes}}`.
//!
//! After the payload, a trailer (the published table's, [`crate::published::Trailer`]) gives
//! each region's id in the server's engine, in the list's order, so that a client can tell a
//! region its link has from one registered again at the same addresses: `{u64 magic
//! "HXLCSID1"; u64 FNV-1a of the payload; u32 count; u32 0; count × u32 id; u64 FNV-1a of the
//! trailer's bytes before it}`. A reader of the list that knows no trailer never reads it, and
//! a list without one (from a server that writes none) is read as before.
//!
//! Public for the fuzz target `cs_list`, hidden from the docs and not part of the semver
//! surface.

use crate::published::{Format, Trailer, fnv1a};

/// The list as a published table ("HXLCSMT1"), in a region of 1 MiB + 4 KiB: distinct from
/// LLM-DataDist's 1 MiB cache table, so neither is mistaken for the other.
pub const FORMAT: Format = Format::new(*b"HXLCSMT1", (1 << 20) + 4096);
/// An endpoint descriptor's bytes (`EndpointDesc`).
pub const ENDPOINT_LEN: usize = 160;
/// Most regions a server registers (upstream's `kMaxUserRemoteMemNum`).
pub const MAX_MEMS: usize = 4096;
/// Most endpoints a server has.
pub const MAX_ENDPOINTS: usize = 1024;
/// Longest tag, in bytes.
pub const MAX_TAG: usize = 4096;
/// Bytes of one region's entry before its tag.
const MEM_FIXED: usize = 24;
/// The ids trailer's magic.
const IDS_MAGIC: [u8; 8] = *b"HXLCSID1";
/// Bytes of the ids trailer besides its ids.
const IDS_FIXED: usize = 32;

/// Bytes of the ids trailer of `mems` regions.
pub fn ids_len(mems: usize) -> usize {
    IDS_FIXED + 4 * mems
}

/// The most bytes of an ids trailer after a payload of `len` bytes (for as many regions as it
/// can list).
pub fn ids_len_after(len: usize) -> usize {
    ids_len((len.saturating_sub(8) / MEM_FIXED).min(MAX_MEMS))
}

/// The ids trailer of `payload`: `ids` in the list's order.
pub fn encode_ids(payload: &[u8], ids: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ids_len(ids.len()));
    out.extend_from_slice(&IDS_MAGIC);
    out.extend_from_slice(&fnv1a(payload).to_le_bytes());
    out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// The ids in `after`, the bytes after `payload`: [`Trailer::Absent`] without the magic and
/// `payload`'s checksum (no trailer, or another payload's), [`Trailer::Torn`] when the rest
/// does not check (a count beyond the limit or the bytes, a checksum that does not match).
pub fn decode_ids(payload: &[u8], after: &[u8]) -> Trailer<Vec<u32>> {
    let mut r = Reader { b: after };
    match (r.take(8), r.u64()) {
        (Ok(m), Ok(sum)) if m == IDS_MAGIC && sum == fnv1a(payload) => {}
        _ => return Trailer::Absent,
    }
    let Ok(count) = r.u32().map(|n| n as usize) else {
        return Trailer::Torn;
    };
    if count > MAX_MEMS || after.len() < ids_len(count) {
        return Trailer::Torn;
    }
    let (body, tail) = after.split_at(ids_len(count) - 8);
    if tail[..8] != fnv1a(body).to_le_bytes() || body[20..24] != [0; 4] {
        return Trailer::Torn;
    }
    let ids = body[24..].chunks_exact(4);
    Trailer::Found(
        ids.map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

/// One region of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `CommMemType`: 0 device, 1 host.
    pub typ: i32,
    /// The first byte, in the server's address space.
    pub addr: u64,
    /// Bytes (not 0).
    pub size: u64,
    /// No NUL inside.
    pub tag: Vec<u8>,
}

/// A decoded list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// The server's endpoints, as it got them.
    pub endpoints: Vec<[u8; ENDPOINT_LEN]>,
    /// Its registered regions, with their tags.
    pub mems: Vec<Entry>,
}

impl Table {
    /// The payload's bytes (what [`decode_payload`] reads).
    pub fn encode_payload(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(self.endpoints.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.mems.len() as u32).to_le_bytes());
        for e in &self.endpoints {
            out.extend_from_slice(e);
        }
        for m in &self.mems {
            out.extend_from_slice(&m.typ.to_le_bytes());
            out.extend_from_slice(&(m.tag.len() as u32).to_le_bytes());
            out.extend_from_slice(&m.addr.to_le_bytes());
            out.extend_from_slice(&m.size.to_le_bytes());
            out.extend_from_slice(&m.tag);
        }
        out
    }

    /// The payload's length, without encoding it.
    pub fn payload_len(&self) -> usize {
        8 + self.endpoints.len() * ENDPOINT_LEN
            + self
                .mems
                .iter()
                .map(|m| MEM_FIXED + m.tag.len())
                .sum::<usize>()
    }
}

/// A little-endian reader over peer bytes that never reads past the end.
struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.b.len() < n {
            return Err("truncated");
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u32(&mut self) -> Result<u32, &'static str> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, &'static str> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
}

/// Decodes a payload; refuses counts beyond the limits or the bytes, a type that is not 0 or 1,
/// an empty or wrapping range, a tag with a NUL, trailing bytes.
pub fn decode_payload(b: &[u8]) -> Result<Table, &'static str> {
    let mut r = Reader { b };
    let endpoints = r.u32()? as usize;
    let mems = r.u32()? as usize;
    if endpoints > MAX_ENDPOINTS || mems > MAX_MEMS {
        return Err("too many entries");
    }
    // every entry needs at least its fixed bytes: checked before anything is allocated
    if endpoints * ENDPOINT_LEN + mems * MEM_FIXED > r.b.len() {
        return Err("counts beyond the bytes");
    }
    let mut t = Table::default();
    for _ in 0..endpoints {
        let mut e = [0u8; ENDPOINT_LEN];
        e.copy_from_slice(r.take(ENDPOINT_LEN)?);
        t.endpoints.push(e);
    }
    for _ in 0..mems {
        let typ = r.u32()? as i32;
        let tag_len = r.u32()? as usize;
        let addr = r.u64()?;
        let size = r.u64()?;
        if typ != 0 && typ != 1 {
            return Err("a memory type that is not DEVICE or HOST");
        }
        if size == 0 || addr.checked_add(size).is_none() {
            return Err("an empty or wrapping range");
        }
        if tag_len > MAX_TAG {
            return Err("a tag too long");
        }
        let tag = r.take(tag_len)?;
        if tag.contains(&0) {
            return Err("a tag with a NUL");
        }
        t.mems.push(Entry {
            typ,
            addr,
            size,
            tag: tag.to_vec(),
        });
    }
    if !r.b.is_empty() {
        return Err("trailing bytes");
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        Table {
            endpoints: vec![[7u8; ENDPOINT_LEN], [9u8; ENDPOINT_LEN]],
            mems: vec![
                Entry {
                    typ: 1,
                    addr: 0x1000,
                    size: 4096,
                    tag: b"kv".to_vec(),
                },
                Entry {
                    typ: 0,
                    addr: 0x9000,
                    size: 1,
                    tag: Vec::new(),
                },
            ],
        }
    }

    #[test]
    fn round_trip() {
        let t = sample();
        let p = t.encode_payload();
        assert_eq!(p.len(), t.payload_len());
        assert_eq!(decode_payload(&p).unwrap(), t);
    }

    #[test]
    fn ids_trailers() {
        let p = sample().encode_payload();
        let ids = [3u32, 0xdead_beef];
        let mut after = encode_ids(&p, &ids);
        assert_eq!(after.len(), ids_len(2));
        assert!(ids_len(2) <= ids_len_after(p.len()));
        assert_eq!(decode_ids(&p, &after), Trailer::Found(ids.to_vec()));
        after.extend_from_slice(&[0x55; 40]); // what follows in the region: not read
        assert_eq!(decode_ids(&p, &after), Trailer::Found(ids.to_vec()));
        // no trailer, or another payload's: absent
        assert_eq!(decode_ids(&p, &[0; 64]), Trailer::Absent);
        assert_eq!(decode_ids(&p, &[]), Trailer::Absent);
        assert_eq!(decode_ids(&p[1..], &after), Trailer::Absent);
        // this payload's, but cut short or changed: torn
        for n in 16..ids_len(2) {
            assert_eq!(decode_ids(&p, &after[..n]), Trailer::Torn, "cut at {n}");
        }
        for i in 16..ids_len(2) {
            let mut bad = after.clone();
            bad[i] ^= 0x10;
            assert_eq!(decode_ids(&p, &bad), Trailer::Torn, "flip at {i}");
        }
        let mut many = encode_ids(&p, &[]);
        many[16..20].copy_from_slice(&(MAX_MEMS as u32 + 1).to_le_bytes());
        assert_eq!(decode_ids(&p, &many), Trailer::Torn);
        assert_eq!(ids_len_after(0), ids_len(0));
        assert_eq!(ids_len_after(usize::MAX), ids_len(MAX_MEMS));
    }

    /// Every truncation and many random corruptions (a fixed-seed xorshift, so a failure
    /// reproduces): the decoder answers, never panics, and what it accepts re-encodes to the
    /// same bytes.
    #[test]
    fn corrupted_payloads_are_refused_without_panic() {
        let p = sample().encode_payload();
        for n in 0..p.len() {
            assert!(decode_payload(&p[..n]).is_err(), "truncated to {n}");
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let mut q = p.clone();
            for _ in 0..1 + next() % 4 {
                let i = (next() as usize) % q.len();
                q[i] = next() as u8;
            }
            if let Ok(t) = decode_payload(&q) {
                assert_eq!(t.encode_payload(), q);
            }
        }
        // huge counts with few bytes
        let mut q = vec![0xff; 8];
        q.extend_from_slice(&[0; 16]);
        assert!(decode_payload(&q).is_err());
    }
}
