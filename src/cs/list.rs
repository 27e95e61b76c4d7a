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
//! Public for the fuzz target `cs_list`, hidden from the docs and not part of the semver
//! surface.

use crate::published::Format;

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
