//! A published table: bytes an engine offers its peers in a read-only host region of its own,
//! rewritten in place while peers may READ it, and fetched by a peer with one-sided READs. Two
//! products publish one: LLM-DataDist its cache table (`datadist/table.rs`), HIXL-CS its
//! server's memory list (`cs/list.rs`). This module is what they share: the header, the
//! checksum, [`Publisher::publish`] (the writer's half of a seqlock) and [`Format::fetch`] (the
//! reader's, with bounded retry over a READ the caller gives). The payload's codec is each
//! product's own.
//!
//! Layout (little-endian): a header `{u64 magic; u64 version (odd while it is being
//! rewritten); u64 payload length; u64 FNV-1a of the payload}`, then the payload, then
//! optionally a trailer: bytes a product writes after the payload, under the same version, that
//! readers which know none never read ([`Publisher::publish_trailed`], [`Format::fetch_trailed`];
//! the product's codec checks it against the payload). A
//! [`Format`] names one kind of table: its magic, and the size of the region it lives in (the
//! region a peer finds in a link's region table by that size: [`Format::is_region`]).
//!
//! The bytes come from a peer: [`Format::decode_header`] checks the magic and that the length
//! fits the region before anything trusts them, and nothing here panics on any input.
//!
//! Public for the fuzz targets of the products' codecs, hidden from the docs and not part of
//! the semver surface.

use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

use crate::{Access, MemType};

/// The header's bytes.
pub const HEADER_LEN: usize = 32;
/// How many times in a row [`Format::fetch`] reads a table that is being rewritten before it
/// pauses between reads ([`PAUSE`]) until its deadline.
pub const TRIES: usize = 64;
/// The pause between two reads of a table that was being rewritten at [`TRIES`] reads in a row
/// (a writer that keeps registering is not read as fast as the link goes).
pub const PAUSE: Duration = Duration::from_millis(1);

/// FNV-1a over `bytes` (a checksum against torn reads, not against an adversary: a peer that
/// lies about its table lies with a matching checksum).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// One kind of published table: its magic and the bytes of the region it lives in, header
/// included (distinct kinds differ in both, so neither is mistaken for the other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    magic: u64,
    region_len: usize,
}

/// A header's fields, checked against its [`Format`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Even: the table is complete.
    pub version: u64,
    /// The payload's bytes (at most [`Format::max_payload`]).
    pub len: usize,
    /// FNV-1a of the payload.
    pub sum: u64,
}

/// Why a table's bytes were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Fewer bytes than a header.
    #[error("a header cut short")]
    Short,
    /// Another magic: not a table of this kind.
    #[error("not a table of this kind (magic {0:#018x})")]
    Magic(u64),
    /// An odd version: the table is being rewritten.
    #[error("the table is being rewritten")]
    Torn,
    /// A payload longer than the region holds.
    #[error("a payload of {0} bytes, longer than the table's region")]
    TooLong(u64),
    /// Fewer payload bytes than the header says.
    #[error("a payload cut short")]
    Truncated,
    /// A payload whose checksum is not the header's.
    #[error("a payload that does not match its checksum")]
    Checksum,
}

/// What a reader makes of the bytes after a payload, where a publisher may have written a
/// trailer ([`Format::fetch_trailed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trailer<T> {
    /// The payload's own trailer, checked.
    Found(T),
    /// No trailer of this payload: none was written, or it is being rewritten (the fetch tells
    /// the two apart by reading the header again).
    Absent,
    /// A trailer of this payload that does not check: being rewritten, read again.
    Torn,
}

/// Why [`Format::fetch`] got no table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError<E> {
    /// The caller's READ failed.
    #[error("{0}")]
    Read(E),
    /// The bytes are not a table of this kind.
    #[error("{0}")]
    Refused(Refused),
    /// Every read until the deadline (at least [`TRIES`]) found the table being rewritten.
    #[error("the table kept changing while it was read, until the deadline")]
    Changing,
}

impl Format {
    /// A kind of table: `magic` (8 bytes, read as a little-endian `u64`) in a region of
    /// `region_len` bytes, header included.
    ///
    /// # Panics
    /// When the region cannot hold a header (a constant's mistake: at compile time).
    pub const fn new(magic: [u8; 8], region_len: usize) -> Format {
        assert!(
            region_len > HEADER_LEN,
            "a region holds a header and a payload"
        );
        Format {
            magic: u64::from_le_bytes(magic),
            region_len,
        }
    }

    /// The magic.
    pub const fn magic(&self) -> u64 {
        self.magic
    }

    /// The region's bytes, header included.
    pub const fn region_len(&self) -> usize {
        self.region_len
    }

    /// The longest payload the region holds.
    pub const fn max_payload(&self) -> usize {
        self.region_len - HEADER_LEN
    }

    /// Whether a region of a link's table (its access, memory type and length) can be a table
    /// of this kind: a read-only host region of exactly [`Format::region_len`] bytes.
    pub fn is_region(&self, access: Access, mem_type: MemType, len: u64) -> bool {
        access == Access::Read && mem_type == MemType::Host && len == self.region_len as u64
    }

    /// The header at the start of `bytes`, checked: its magic, an even version, a length the
    /// region holds.
    ///
    /// # Errors
    /// [`Refused::Short`], [`Refused::Magic`], [`Refused::Torn`], [`Refused::TooLong`].
    pub fn decode_header(&self, bytes: &[u8]) -> Result<Header, Refused> {
        let word = |i: usize| -> Result<u64, Refused> {
            let b = bytes.get(i * 8..i * 8 + 8).ok_or(Refused::Short)?;
            Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
        };
        let magic = word(0)?;
        if magic != self.magic {
            return Err(Refused::Magic(magic));
        }
        let version = word(1)?;
        if version % 2 == 1 {
            return Err(Refused::Torn);
        }
        let len = word(2)?;
        if len > self.max_payload() as u64 {
            return Err(Refused::TooLong(len));
        }
        Ok(Header {
            version,
            len: len as usize,
            sum: word(3)?,
        })
    }

    /// The payload of a whole table image (a header, then at least the payload it states)
    /// whose checksum matches: a table read at once, as a fuzzer or a test holds it.
    ///
    /// # Errors
    /// As [`Format::decode_header`]; [`Refused::Truncated`], [`Refused::Checksum`].
    pub fn open<'a>(&self, image: &'a [u8]) -> Result<&'a [u8], Refused> {
        let h = self.decode_header(image)?;
        let payload = image
            .get(HEADER_LEN..HEADER_LEN + h.len)
            .ok_or(Refused::Truncated)?;
        if fnv1a(payload) != h.sum {
            return Err(Refused::Checksum);
        }
        Ok(payload)
    }

    /// A complete table image of `payload` at `version`, as a publisher leaves it in its
    /// region (for tests and fuzz seeds; the length is not checked).
    pub fn image(&self, version: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
        for w in [self.magic, version, payload.len() as u64, fnv1a(payload)] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(payload);
        out
    }

    /// Fetches a peer's table: READs its header, then its header and payload, and takes the
    /// payload when the second header states the first one's even version and length and the
    /// payload matches its checksum; a table being rewritten meanwhile is read again: [`TRIES`]
    /// times in a row, then every [`PAUSE`] until `until`.
    ///
    /// `read(buf)` fills `buf` with the first `buf.len()` bytes of the peer's region (a
    /// one-sided READ); it is asked for at most [`Format::region_len`] bytes. A deadline over
    /// the whole fetch is the caller's: its `read` fails once it passed (`until` only ends
    /// the reads of a table that keeps changing).
    ///
    /// # Errors
    /// [`FetchError::Read`] with the first error of `read`; [`FetchError::Refused`] for a
    /// header of another kind or a length beyond the region; [`FetchError::Changing`] when
    /// every try until `until` (at least [`TRIES`]) found the table being rewritten.
    pub fn fetch<E>(
        &self,
        read: impl FnMut(&mut [u8]) -> Result<(), E>,
        until: Instant,
    ) -> Result<Vec<u8>, FetchError<E>> {
        let (payload, _) = self.fetch_trailed(read, |_| 0, |_, _| Trailer::Found(()), until)?;
        Ok(payload)
    }

    /// [`Format::fetch`], and the trailer after the payload: the image READ holds up to
    /// `extra(len)` bytes after a payload of `len` bytes (within the region), which
    /// `open(payload, after)` makes a [`Trailer`] of. [`Trailer::Torn`] reads the table again;
    /// [`Trailer::Absent`] is `None` once one more READ of the header finds it unchanged (no
    /// rewrite began since the first: the bytes after the payload are this version's, and hold
    /// no trailer of it), else reads the table again.
    ///
    /// # Errors
    /// As [`Format::fetch`].
    pub fn fetch_trailed<E, T>(
        &self,
        mut read: impl FnMut(&mut [u8]) -> Result<(), E>,
        extra: impl Fn(usize) -> usize,
        open: impl Fn(&[u8], &[u8]) -> Trailer<T>,
        until: Instant,
    ) -> Result<(Vec<u8>, Option<T>), FetchError<E>> {
        // a header READ: Err for the READ's error, Ok with what the header says
        let header = |read: &mut dyn FnMut(&mut [u8]) -> Result<(), E>| {
            let mut first = [0u8; HEADER_LEN];
            read(&mut first).map_err(FetchError::Read)?;
            Ok(self.decode_header(&first))
        };
        for tries in 0usize.. {
            if tries >= TRIES {
                // a writer that keeps rewriting: read again after a pause, until `until`
                let now = Instant::now();
                if now >= until {
                    break;
                }
                std::thread::sleep(PAUSE.min(until - now));
            }
            let h = match header(&mut read)? {
                Ok(h) => h,
                Err(Refused::Torn) => continue,
                Err(e) => return Err(FetchError::Refused(e)),
            };
            let after = extra(h.len).min(self.max_payload() - h.len);
            let mut image = vec![0u8; HEADER_LEN + h.len + after];
            read(&mut image).map_err(FetchError::Read)?;
            // the header again: the payload is the version's only if it did not change meanwhile
            match self.decode_header(&image) {
                Ok(again) if again == h => {}
                _ => continue,
            }
            let after = image.split_off(HEADER_LEN + h.len);
            let payload = image.split_off(HEADER_LEN);
            if fnv1a(&payload) != h.sum {
                continue;
            }
            match open(&payload, &after) {
                Trailer::Found(t) => return Ok((payload, Some(t))),
                Trailer::Torn => {}
                Trailer::Absent if after.is_empty() || header(&mut read)? == Ok(h) => {
                    return Ok((payload, None));
                }
                Trailer::Absent => {}
            }
        }
        Err(FetchError::Changing)
    }
}

/// The writer's half: the version its table is at (even: complete).
#[derive(Debug, Default)]
pub struct Publisher {
    version: u64,
}

impl Publisher {
    /// The version of the last table published (0: none yet).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Rewrites the table at `base` with `payload`: an odd version first, then the payload and
    /// the rest of the header, then the next even version, with fences between, so that a peer
    /// reading meanwhile sees an odd version, another version or a checksum that does not
    /// match, and reads again.
    ///
    /// # Errors
    /// [`Refused::TooLong`] (nothing written) when the payload does not fit `format`'s region.
    ///
    /// # Safety
    /// `base` must be valid for writes of `format.region_len()` bytes, and nothing else may
    /// write them meanwhile (serialize the calls for one region: `&mut self` does it when one
    /// publisher owns the region). Peers may read them at any time: they are written as raw
    /// bytes, never through a reference.
    pub unsafe fn publish(
        &mut self,
        format: &Format,
        base: *mut u8,
        payload: &[u8],
    ) -> Result<(), Refused> {
        // SAFETY: the caller's contract.
        unsafe { self.publish_trailed(format, base, payload, &[]) }
    }

    /// [`Publisher::publish`], with `trailer` written right after the payload, under the same
    /// version (readers that know no trailer never read it).
    ///
    /// # Errors
    /// [`Refused::TooLong`] (nothing written) when the payload and the trailer do not fit
    /// `format`'s region.
    ///
    /// # Safety
    /// As [`Publisher::publish`].
    pub unsafe fn publish_trailed(
        &mut self,
        format: &Format,
        base: *mut u8,
        payload: &[u8],
        trailer: &[u8],
    ) -> Result<(), Refused> {
        let total = payload.len() + trailer.len();
        if total > format.max_payload() {
            return Err(Refused::TooLong(total as u64));
        }
        let word = |i: usize, v: u64| {
            // SAFETY: i < 4, so the 8 bytes lie in the header, inside the region the caller
            // promised writable; volatile, unaligned: raw bytes that peers READ meanwhile.
            unsafe { std::ptr::write_volatile(base.add(i * 8).cast::<[u8; 8]>(), v.to_le_bytes()) }
        };
        self.version += 1; // odd: being written
        word(1, self.version);
        fence(Ordering::SeqCst);
        // SAFETY: HEADER_LEN + payload.len() <= region_len (checked above), inside the region
        // the caller promised writable; `payload` is our own memory, not the region.
        unsafe {
            std::ptr::copy_nonoverlapping(payload.as_ptr(), base.add(HEADER_LEN), payload.len())
        };
        // SAFETY: HEADER_LEN + payload.len() + trailer.len() <= region_len (checked above), as
        // the payload's copy; `trailer` is our own memory, not the region.
        unsafe {
            let at = base.add(HEADER_LEN + payload.len());
            std::ptr::copy_nonoverlapping(trailer.as_ptr(), at, trailer.len())
        };
        word(0, format.magic);
        word(2, payload.len() as u64);
        word(3, fnv1a(payload));
        fence(Ordering::SeqCst);
        self.version += 1; // even: complete
        word(1, self.version);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: Format = Format::new(*b"HXLTEST1", 4096);

    /// `F.fetch` with no time for pauses: [`TRIES`] reads of a table that keeps changing.
    fn fetch<E>(read: impl FnMut(&mut [u8]) -> Result<(), E>) -> Result<Vec<u8>, FetchError<E>> {
        F.fetch(read, Instant::now())
    }

    /// A region to publish into, and a READ of it that can be made to see a rewrite.
    fn region() -> Vec<u8> {
        vec![0u8; F.region_len()]
    }

    #[test]
    fn published_tables_are_fetched_whole() {
        let mut r = region();
        let mut p = Publisher::default();
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        // SAFETY: `r` is region_len bytes, written by this publisher only.
        unsafe { p.publish(&F, r.as_mut_ptr(), &payload) }.unwrap();
        assert_eq!(p.version(), 2);
        assert_eq!(&r[..HEADER_LEN + payload.len()], F.image(2, &payload));
        let got = fetch(|buf: &mut [u8]| -> Result<(), ()> {
            buf.copy_from_slice(&r[..buf.len()]);
            Ok(())
        });
        assert_eq!(got, Ok(payload.clone()));
        assert_eq!(F.open(&r), Ok(&payload[..]));
        // too long: refused, nothing written
        let before = r.clone();
        let long = vec![1u8; F.max_payload() + 1];
        // SAFETY: as above.
        let e = unsafe { p.publish(&F, r.as_mut_ptr(), &long) };
        assert_eq!(e, Err(Refused::TooLong(long.len() as u64)));
        assert_eq!(r, before);
        assert_eq!(p.version(), 2);
    }

    /// A READ that sees the table mid-rewrite (odd version, or a second header of another
    /// version, or a payload that fails its checksum) retries; one that always does gives up.
    #[test]
    fn a_table_being_rewritten_is_read_again() {
        let old = F.image(2, b"old payload");
        let new = F.image(4, b"the new payload!");
        let mut odd = new.clone();
        odd[8] = 3;
        let mut torn = new.clone();
        *torn.last_mut().unwrap() ^= 1;
        // reads in turn: the odd header; the old header, then the new image; the new header,
        // then a torn payload; the new header and image
        let script = [&odd, &old, &new, &new, &torn, &new, &new];
        let mut at = 0;
        let got = fetch(|buf: &mut [u8]| -> Result<(), ()> {
            let src = script[at];
            at += 1;
            buf.copy_from_slice(&src[..buf.len()]);
            Ok(())
        });
        assert_eq!(got, Ok(b"the new payload!".to_vec()));
        assert_eq!(at, script.len());
        let mut reads = 0;
        let got = fetch(|buf: &mut [u8]| -> Result<(), ()> {
            reads += 1;
            buf.copy_from_slice(&odd[..buf.len()]);
            Ok(())
        });
        assert_eq!(got, Err(FetchError::Changing));
        assert_eq!(reads, TRIES);
    }

    /// A table rewritten at every read for longer than [`TRIES`] reads (a server registering
    /// thousands of regions) is read again, with pauses, until it settles within the deadline.
    #[test]
    fn a_table_that_keeps_changing_is_read_until_the_deadline() {
        let new = F.image(4, b"settled");
        let mut odd = new.clone();
        odd[8] = 3;
        let rewritten = 3 * TRIES;
        let mut reads = 0;
        let got = F.fetch(
            |buf: &mut [u8]| -> Result<(), ()> {
                reads += 1;
                let src = if reads <= rewritten { &odd } else { &new };
                buf.copy_from_slice(&src[..buf.len()]);
                Ok(())
            },
            Instant::now() + Duration::from_secs(60),
        );
        assert_eq!(got, Ok(b"settled".to_vec()));
        assert_eq!(reads, rewritten + 2);
    }

    /// A trailer after the payload: found with it; one that does not check is read again; none
    /// is `None` only once the header, read again, is unchanged.
    #[test]
    fn trailers_are_fetched_with_their_payload() {
        let mut r = region();
        let mut p = Publisher::default();
        // SAFETY: `r` is region_len bytes, written by this publisher only.
        unsafe { p.publish_trailed(&F, r.as_mut_ptr(), b"payload", b"TRAILER") }.unwrap();
        assert_eq!(
            F.open(&r),
            Ok(&b"payload"[..]),
            "a reader that knows no trailer"
        );
        let open = |payload: &[u8], after: &[u8]| match after.get(..7) {
            Some(t) if t == b"TRAILER" && payload == b"payload" => Trailer::Found(t.to_vec()),
            Some(t) if t == b"TRAIL!!" => Trailer::Torn,
            _ => Trailer::Absent,
        };
        // (the reads in turn, counted; `script` gives the image each one sees)
        let fetch = |script: &[&Vec<u8>]| {
            let mut at = 0;
            let got = F.fetch_trailed(
                |buf: &mut [u8]| -> Result<(), ()> {
                    buf.copy_from_slice(&script[at][..buf.len()]);
                    at += 1;
                    Ok(())
                },
                |_| 16,
                open,
                Instant::now(),
            );
            (got, at)
        };
        let (got, reads) = fetch(&[&r, &r]);
        assert_eq!(got, Ok((b"payload".to_vec(), Some(b"TRAILER".to_vec()))));
        assert_eq!(reads, 2);
        let mut torn = r.clone();
        torn[HEADER_LEN + 7..HEADER_LEN + 14].copy_from_slice(b"TRAIL!!");
        let (got, reads) = fetch(&[&r, &torn, &r, &r]);
        assert_eq!(got, Ok((b"payload".to_vec(), Some(b"TRAILER".to_vec()))));
        assert_eq!(reads, 4, "the torn trailer read again");
        // none: the header read once more, unchanged
        let mut none = region();
        // SAFETY: as above.
        unsafe { Publisher::default().publish(&F, none.as_mut_ptr(), b"payload") }.unwrap();
        let (got, reads) = fetch(&[&none, &none, &none]);
        assert_eq!(got, Ok((b"payload".to_vec(), None)));
        assert_eq!(reads, 3);
        // none seen, but the header changed meanwhile (a rewrite that brings the trailer)
        let mut newer = r.clone();
        newer[8] = 4;
        let (got, reads) = fetch(&[&none, &none, &newer, &newer, &newer]);
        assert_eq!(got, Ok((b"payload".to_vec(), Some(b"TRAILER".to_vec()))));
        assert_eq!(reads, 5);
        // payload and trailer together must fit
        let long = vec![0u8; F.max_payload() - 3];
        // SAFETY: as above.
        let e = unsafe { p.publish_trailed(&F, r.as_mut_ptr(), &long, b"four") };
        assert_eq!(e, Err(Refused::TooLong(F.max_payload() as u64 + 1)));
    }

    #[test]
    fn reads_fail_and_strangers_are_refused() {
        assert_eq!(
            fetch(|_: &mut [u8]| Err("gone")),
            Err(FetchError::Read("gone"))
        );
        let other = Format::new(*b"HXLTEST2", 4096).image(2, b"x");
        let got = fetch(|buf: &mut [u8]| -> Result<(), ()> {
            buf.copy_from_slice(&other[..buf.len()]);
            Ok(())
        });
        assert_eq!(
            got,
            Err(FetchError::Refused(Refused::Magic(u64::from_le_bytes(
                *b"HXLTEST2"
            ))))
        );
        let mut long = F.image(2, b"");
        long[16..24].copy_from_slice(&(F.max_payload() as u64 + 1).to_le_bytes());
        assert_eq!(
            F.decode_header(&long),
            Err(Refused::TooLong(F.max_payload() as u64 + 1))
        );
        assert!(F.is_region(Access::Read, MemType::Host, 4096));
        assert!(!F.is_region(Access::ReadWrite, MemType::Host, 4096));
        assert!(!F.is_region(Access::Read, MemType::Device, 4096));
        assert!(!F.is_region(Access::Read, MemType::Host, 4097));
    }

    /// Every truncation and byte flip of an image: refused or opened, never a panic; a flip in
    /// the payload always refused.
    #[test]
    fn every_truncation_or_flip_is_refused_or_opens() {
        let img = F.image(6, b"some payload bytes");
        for cut in 0..img.len() {
            assert!(F.open(&img[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..img.len() {
            let mut bad = img.clone();
            bad[i] ^= 0x41;
            let r = F.open(&bad);
            if i >= HEADER_LEN {
                assert_eq!(r, Err(Refused::Checksum), "flip at {i}");
            }
        }
    }
}
