//! The cache table: what an LLM-DataDist instance publishes of its caches, for peers to fetch
//! once per link (a one-sided READ of the read-only region it lives in; see `core.rs`). It is a
//! published table ([`crate::published`]: the header, the seqlock, the fetch with retry); this
//! file is its payload's codec. Its bytes come from the peer: the decoder checks every count
//! and length against the bytes there are before it reads them, and never panics.
//!
//! Payload (little-endian, after the published table's header with the magic "HXLCTBL2"): `{u32
//! caches; u32 keys; caches × {i64 cache_id; u32 kind; u32 placement; u32 num_tensors; u32 zero;
//! u64 tensor_size; u64 stride; u64 count; u64 address × num_tensors}; keys × {i64 cache_id; u64
//! req_id; u64 model_id; u64 batch}}` (a key names one batch of its cache: several keys, one per
//! request, share a cache of batches).

use super::types::{CacheKind, Placement};
use crate::published::Format;

/// The table's region: at most this many bytes, header included.
pub(crate) const TABLE_LEN: usize = 1 << 20;
/// The cache table as a published table ("HXLCTBL2": keys carry their batch).
pub(crate) const FORMAT: Format = Format::new(*b"HXLCTBL2", TABLE_LEN);
/// Most tensors one cache has.
pub(crate) const MAX_TENSORS: u32 = 1 << 16;

/// One cache as the table describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub cache_id: i64,
    pub kind: CacheKind,
    pub placement: Placement,
    /// Bytes of each tensor.
    pub tensor_size: u64,
    /// Bytes of one block or batch of each tensor.
    pub stride: u64,
    /// Blocks (or batches) in each tensor.
    pub count: u64,
    /// Each tensor's address, in the owner's address space.
    pub addrs: Vec<u64>,
}

/// A key a cache is registered under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key {
    pub cache_id: i64,
    pub req_id: u64,
    pub model_id: u64,
    /// The batch of the cache the key names (0 for a blocks cache's key).
    pub batch: u64,
}

/// A decoded table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Table {
    pub entries: Vec<Entry>,
    pub keys: Vec<Key>,
}

/// Why a table's payload was refused: a length or count beyond the bytes, a bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed cache table: {0}")]
pub(crate) struct Malformed(pub &'static str);

impl Table {
    /// The payload's bytes.
    pub(crate) fn encode_payload(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.keys.len() as u32).to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.cache_id.to_le_bytes());
            out.extend_from_slice(&(e.kind as u32).to_le_bytes());
            out.extend_from_slice(&(e.placement as u32).to_le_bytes());
            out.extend_from_slice(&(e.addrs.len() as u32).to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            for v in [e.tensor_size, e.stride, e.count] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            for a in &e.addrs {
                out.extend_from_slice(&a.to_le_bytes());
            }
        }
        for k in &self.keys {
            out.extend_from_slice(&k.cache_id.to_le_bytes());
            out.extend_from_slice(&k.req_id.to_le_bytes());
            out.extend_from_slice(&k.model_id.to_le_bytes());
            out.extend_from_slice(&k.batch.to_le_bytes());
        }
        out
    }

    /// Decodes a payload (its checksum checked already: [`Format::fetch`], [`Format::open`]).
    pub(crate) fn decode_payload(p: &[u8]) -> Result<Table, Malformed> {
        let mut r = Reader { p, at: 0 };
        let caches = r.u32()?;
        let keys = r.u32()?;
        // every entry takes at least 48 bytes and every key 32: counts beyond the bytes fail
        // here, before anything is allocated for them
        if u64::from(caches) * 48 + u64::from(keys) * 32 > p.len() as u64 {
            return Err(Malformed("more entries than bytes"));
        }
        let mut entries = Vec::with_capacity(caches as usize);
        for _ in 0..caches {
            let cache_id = r.u64()? as i64;
            let kind = CacheKind::from_value(r.u32()?).ok_or(Malformed("a cache kind"))?;
            let placement = Placement::from_value(r.u32()?).ok_or(Malformed("a placement"))?;
            let n = r.u32()?;
            if n == 0 || n > MAX_TENSORS {
                return Err(Malformed("a tensor count"));
            }
            if r.u32()? != 0 {
                return Err(Malformed("a reserved word"));
            }
            let (tensor_size, stride, count) = (r.u64()?, r.u64()?, r.u64()?);
            if stride == 0 || stride.checked_mul(count) != Some(tensor_size) {
                return Err(Malformed("a stride that does not divide the tensor"));
            }
            if u64::from(n) * 8 > r.left() as u64 {
                return Err(Malformed("more addresses than bytes"));
            }
            let mut addrs = Vec::with_capacity(n as usize);
            for _ in 0..n {
                // every offset into a tensor is then below u64::MAX: no arithmetic on a peer's
                // addresses overflows
                let a = r.u64()?;
                if a.checked_add(tensor_size).is_none() {
                    return Err(Malformed("a tensor past the end of memory"));
                }
                addrs.push(a);
            }
            entries.push(Entry {
                cache_id,
                kind,
                placement,
                tensor_size,
                stride,
                count,
                addrs,
            });
        }
        let mut ks = Vec::with_capacity(keys as usize);
        for _ in 0..keys {
            ks.push(Key {
                cache_id: r.u64()? as i64,
                req_id: r.u64()?,
                model_id: r.u64()?,
                batch: r.u64()?,
            });
        }
        if r.left() != 0 {
            return Err(Malformed("bytes after the keys"));
        }
        Ok(Table { entries, keys: ks })
    }
}

struct Reader<'a> {
    p: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], Malformed> {
        let b = self
            .p
            .get(self.at..self.at.checked_add(n).ok_or(Malformed("a length"))?)
            .ok_or(Malformed("a table cut short"))?;
        self.at += n;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32, Malformed> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, Malformed> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn left(&self) -> usize {
        self.p.len() - self.at
    }
}

/// Decodes a whole table image (header and payload), as a fuzzer feeds it.
pub fn decode(bytes: &[u8]) -> Result<(), String> {
    let p = FORMAT.open(bytes).map_err(|e| e.to_string())?;
    Table::decode_payload(p)
        .map(drop)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        Table {
            entries: vec![
                Entry {
                    cache_id: 1,
                    kind: CacheKind::Blocks,
                    placement: Placement::Device,
                    tensor_size: 4096,
                    stride: 512,
                    count: 8,
                    addrs: vec![0x1000, 0x9000, 0x20000],
                },
                Entry {
                    cache_id: 7,
                    kind: CacheKind::Mix,
                    placement: Placement::Host,
                    tensor_size: 64,
                    stride: 64,
                    count: 1,
                    addrs: vec![0xdead_0000],
                },
            ],
            keys: vec![Key {
                cache_id: 1,
                req_id: u64::MAX,
                model_id: 3,
                batch: 0,
            }],
        }
    }

    fn image(t: &Table, version: u64) -> Vec<u8> {
        FORMAT.image(version, &t.encode_payload())
    }

    #[test]
    fn round_trip_and_every_truncation_or_flip_is_refused_or_decodes() {
        let t = sample();
        let img = image(&t, 2);
        assert_eq!(Table::decode_payload(FORMAT.open(&img).unwrap()), Ok(t));
        assert_eq!(
            decode(&image(&sample(), 3)),
            Err("the table is being rewritten".to_owned())
        );
        for cut in 0..img.len() {
            assert!(decode(&img[..cut]).is_err(), "cut at {cut}");
        }
        // a flipped byte of the payload fails the checksum; of the header, the magic or lengths
        for i in 0..img.len() {
            let mut bad = img.clone();
            bad[i] ^= 0x41;
            let _ = decode(&bad); // never panics
            if i >= crate::published::HEADER_LEN {
                assert!(decode(&bad).is_err(), "flip at {i}");
            }
        }
    }

    #[test]
    fn a_tensor_past_the_end_of_memory_is_refused() {
        // offsets into a peer's tensors are added to its addresses: none may overflow
        let mut t = sample();
        t.entries[1].addrs = vec![u64::MAX - 63];
        let img = image(&t, 2);
        assert_eq!(
            decode(&img),
            Err("malformed cache table: a tensor past the end of memory".to_owned())
        );
        t.entries[1].addrs = vec![u64::MAX - 64];
        assert_eq!(decode(&image(&t, 2)), Ok(()));
    }

    #[test]
    fn counts_beyond_the_bytes_are_refused_before_allocating() {
        let mut p = Vec::new();
        p.extend_from_slice(&u32::MAX.to_le_bytes());
        p.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            Table::decode_payload(&p),
            Err(Malformed("more entries than bytes"))
        );
    }
}
