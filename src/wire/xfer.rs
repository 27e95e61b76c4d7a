//! The data-path frames: XFER (a batch of descriptors), XFER_BLOCKS (a block-indexed batch:
//! its remote half, carried as its index array, never expanded), DONE (the end of either), and
//! NOTIFY.

use super::codec::put_str;
use super::{
    DESC_LEN, Kind, MAX_DESCS_PER_FRAME, Reader, WireBlocks, WireDesc, WireError, begin, seal,
};
use crate::types::TransferOp;
use crate::types::blocks::BlockIndices;

/// The longest payload of a client's request of `kind` on an established lane, which the server
/// refuses from the header, before it buffers any of the payload: an XFER of
/// [`MAX_DESCS_PER_FRAME`] descriptors (1.25 MiB), an XFER_BLOCKS of as many 8-byte indices
/// (0.5 MiB), a NOTIFY of two strings of [`MAX_STR`](super::MAX_STR) bytes; a transport's setup
/// request (UCXASK, DEVICE_HELLO, FABRIC_HELLO) [`MAX_SETUP_REQUEST`]; PING, BYE and a kind no
/// client sends on a lane carry nothing.
pub fn max_request(kind: Kind) -> u32 {
    const XFER_FIXED: usize = 1 + 8 + 4; // op, request id, count
    const BLOCKS_FIXED: usize = 1 + 8 + 4 + 8 + 8 + 8 + 1 + 4; // ... region, layout, width, count
    let n = MAX_DESCS_PER_FRAME;
    let len = match kind {
        Kind::Xfer => XFER_FIXED + n * DESC_LEN,
        Kind::XferBlocks => BLOCKS_FIXED + n * 8,
        Kind::Notify => 8 + 2 * (2 + super::MAX_STR),
        Kind::UcxAsk | Kind::DeviceHello | Kind::FabricHello => MAX_SETUP_REQUEST as usize,
        _ => 0,
    };
    len as u32
}

/// The longest transport setup request a client sends on a lane (UCXASK is empty; a
/// DEVICE_HELLO or FABRIC_HELLO holds a few strings of at most [`MAX_STR`](super::MAX_STR)
/// bytes).
pub const MAX_SETUP_REQUEST: u32 = 16 << 10;

/// Encodes an XFER frame header and its descriptors into `out`.
pub fn encode_xfer(
    out: &mut Vec<u8>,
    op: TransferOp,
    req: u64,
    descs: impl ExactSizeIterator<Item = WireDesc>,
) {
    begin(out, Kind::Xfer);
    out.push(op as u8);
    out.extend_from_slice(&req.to_le_bytes());
    out.extend_from_slice(&(descs.len() as u32).to_le_bytes());
    for d in descs {
        out.extend_from_slice(&d.region.to_le_bytes());
        out.extend_from_slice(&d.offset.to_le_bytes());
        out.extend_from_slice(&d.len.to_le_bytes());
    }
    seal(out);
}

/// Decodes an XFER payload into `descs` (cleared first); returns the op and request id.
///
/// # Errors
/// A [`WireError`] if the payload is malformed or holds no descriptor.
pub fn decode_xfer(p: &[u8], descs: &mut Vec<WireDesc>) -> Result<(TransferOp, u64), WireError> {
    let mut r = Reader::new(p);
    let op = TransferOp::from_u8(r.u8("op")?).ok_or(WireError::Invalid("op"))?;
    let req = r.u64("request id")?;
    let n = r.count("descriptor count", MAX_DESCS_PER_FRAME, DESC_LEN)?;
    if n == 0 {
        return Err(WireError::Invalid("empty batch"));
    }
    descs.clear();
    descs.reserve(n);
    for _ in 0..n {
        descs.push(WireDesc {
            region: r.u32("desc region")?,
            offset: r.u64("desc offset")?,
            len: r.u64("desc len")?,
        });
    }
    r.finish()?;
    Ok((op, req))
}

/// An XFER_BLOCKS request, decoded: its op, request id, remote half, the width its indices
/// came in (`true`: 8 bytes each, else 4), and the largest index (found while decoding, so the
/// server checks the request's bounds once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XferBlocks {
    /// READ or WRITE.
    pub op: TransferOp,
    /// The request id its DONE names.
    pub req: u64,
    /// The region, base offset, block size and stride.
    pub blocks: WireBlocks,
    /// Whether the indices were sent as 8-byte values.
    pub wide: bool,
    /// The largest index.
    pub max: u64,
}

/// Encodes an XFER_BLOCKS frame: op (u8), request id (u64), region (u32), base offset, block
/// size and stride (u64 each), index width (u8: 4 or 8), count (u32), then the indices (at most
/// [`MAX_DESCS_PER_FRAME`]), all little-endian.
pub fn encode_xfer_blocks(
    out: &mut Vec<u8>,
    op: TransferOp,
    req: u64,
    b: &WireBlocks,
    idx: BlockIndices<'_>,
) {
    begin(out, Kind::XferBlocks);
    out.push(op as u8);
    out.extend_from_slice(&req.to_le_bytes());
    out.extend_from_slice(&b.region.to_le_bytes());
    out.extend_from_slice(&b.offset.to_le_bytes());
    out.extend_from_slice(&b.block.to_le_bytes());
    out.extend_from_slice(&b.stride.to_le_bytes());
    match idx {
        BlockIndices::U32(v) => {
            out.push(4);
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.reserve(v.len() * 4);
            for i in v {
                out.extend_from_slice(&i.to_le_bytes());
            }
        }
        BlockIndices::U64(v) => {
            out.push(8);
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.reserve(v.len() * 8);
            for i in v {
                out.extend_from_slice(&i.to_le_bytes());
            }
        }
    }
    seal(out);
}

/// Decodes an XFER_BLOCKS payload; its indices go into `idx` (cleared first, widened to u64).
///
/// # Errors
/// A [`WireError`] if the payload is malformed, holds no index, or its layout is invalid (a
/// zero block, a stride smaller than the block). Whether the blocks fit a region is the
/// server's check, not the decoder's.
pub fn decode_xfer_blocks(p: &[u8], idx: &mut Vec<u64>) -> Result<XferBlocks, WireError> {
    let mut r = Reader::new(p);
    let op = TransferOp::from_u8(r.u8("op")?).ok_or(WireError::Invalid("op"))?;
    let req = r.u64("request id")?;
    let blocks = WireBlocks {
        region: r.u32("block region")?,
        offset: r.u64("block base offset")?,
        block: r.u64("block size")?,
        stride: r.u64("block stride")?,
    };
    if blocks.block == 0 {
        return Err(WireError::Invalid("zero block size"));
    }
    if blocks.stride < blocks.block {
        return Err(WireError::Invalid("block stride below the block size"));
    }
    let width = r.u8("index width")?;
    if width != 4 && width != 8 {
        return Err(WireError::Invalid("index width"));
    }
    let n = r.count("block count", MAX_DESCS_PER_FRAME, width as usize)?;
    if n == 0 {
        return Err(WireError::Invalid("empty batch"));
    }
    let raw = r.take(n * width as usize, "block indices")?;
    r.finish()?;
    idx.clear();
    idx.reserve(n);
    let mut max = 0u64;
    if width == 4 {
        for c in raw.chunks_exact(4) {
            let v = u64::from(u32::from_le_bytes(c.try_into().expect("4 bytes")));
            max = max.max(v);
            idx.push(v);
        }
    } else {
        for c in raw.chunks_exact(8) {
            let v = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            max = max.max(v);
            idx.push(v);
        }
    }
    Ok(XferBlocks {
        op,
        req,
        blocks,
        wide: width == 8,
        max,
    })
}

/// Encodes a DONE frame.
pub fn encode_done(out: &mut Vec<u8>, req: u64, status: u32, reason: &str) {
    begin(out, Kind::Done);
    out.extend_from_slice(&req.to_le_bytes());
    out.extend_from_slice(&status.to_le_bytes());
    put_str(out, reason);
    seal(out);
}

/// Decodes a DONE payload: request id, status and reason.
///
/// # Errors
/// A [`WireError`] if the payload is malformed.
pub fn decode_done(p: &[u8]) -> Result<(u64, u32, String), WireError> {
    let mut r = Reader::new(p);
    let req = r.u64("request id")?;
    let status = r.u32("status")?;
    let reason = r.string("reason")?;
    r.finish()?;
    Ok((req, status, reason))
}

/// Encodes a NOTIFY frame (name and message are cut at [`MAX_STR`](super::MAX_STR) bytes; callers check first).
pub fn encode_notify(out: &mut Vec<u8>, req: u64, name: &str, msg: &str) {
    begin(out, Kind::Notify);
    out.extend_from_slice(&req.to_le_bytes());
    put_str(out, name);
    put_str(out, msg);
    seal(out);
}

/// Decodes a NOTIFY payload: request id, name and message.
///
/// # Errors
/// A [`WireError`] if the payload is malformed.
pub fn decode_notify(p: &[u8]) -> Result<(u64, String, String), WireError> {
    let mut r = Reader::new(p);
    let req = r.u64("request id")?;
    let name = r.string("notify name")?;
    let msg = r.string("notify message")?;
    r.finish()?;
    Ok((req, name, msg))
}
#[cfg(test)]
mod tests {
    use super::*;

    /// A reason longer than a string may be is cut at a character's boundary: a peer's name of
    /// multibyte characters in it still decodes (the cut at byte 1024 fell inside a character,
    /// and the reader refused the whole frame).
    #[test]
    fn a_long_reason_is_cut_between_characters() {
        let reason = format!("engine \"{}\" is not on the allow-list", "日".repeat(341));
        assert!(reason.len() > crate::wire::MAX_STR);
        let mut out = Vec::new();
        encode_done(&mut out, 7, 3, &reason);
        let (req, status, got) = decode_done(&out[crate::wire::HEADER_LEN..]).unwrap();
        assert_eq!((req, status), (7, 3));
        assert!(
            reason.starts_with(&got) && got.len() <= crate::wire::MAX_STR,
            "{got}"
        );
        assert!(got.len() > crate::wire::MAX_STR - 3);
    }

    #[test]
    fn huge_counts_are_refused_before_allocating() {
        let mut p = Vec::new();
        p.push(1u8);
        p.extend_from_slice(&5u64.to_le_bytes());
        p.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_xfer(&p, &mut Vec::new()),
            Err(WireError::OverLimit { .. })
        ));
        let mut p = Vec::new();
        p.push(1u8);
        p.extend_from_slice(&5u64.to_le_bytes());
        p.extend_from_slice(&1000u32.to_le_bytes());
        assert_eq!(
            decode_xfer(&p, &mut Vec::new()),
            Err(WireError::Truncated("descriptor count"))
        );
    }

    /// Each request kind's largest honest frame fits [`max_request`] (the data path's exactly),
    /// and a kind no client sends on a lane is allowed no payload.
    #[test]
    fn the_largest_request_of_each_kind_fits_its_limit() {
        use crate::wire::{DeviceInfo, FabricInfo, HEADER_LEN, MAX_STR};
        let payload = |f: &[u8]| (f.len() - HEADER_LEN) as u32;
        let n = MAX_DESCS_PER_FRAME;
        let mut out = Vec::new();
        let d = WireDesc {
            region: 1,
            offset: 2,
            len: 3,
        };
        encode_xfer(&mut out, TransferOp::Write, 9, std::iter::repeat_n(d, n));
        assert_eq!(payload(&out), max_request(Kind::Xfer));
        let b = WireBlocks {
            region: 1,
            offset: 0,
            block: 8,
            stride: 8,
        };
        let idx = vec![u64::MAX; n];
        encode_xfer_blocks(&mut out, TransferOp::Read, 9, &b, BlockIndices::U64(&idx));
        assert_eq!(payload(&out), max_request(Kind::XferBlocks));
        let long = "x".repeat(MAX_STR);
        encode_notify(&mut out, 9, &long, &long);
        assert_eq!(payload(&out), max_request(Kind::Notify));
        let dev = DeviceInfo {
            status: u32::MAX,
            device_id: u32::MAX,
            device_ip: long.clone(),
            host_ip: long.clone(),
            timeout_ms: u32::MAX,
            reason: long.clone(),
        };
        dev.encode(Kind::DeviceHello, &mut out);
        assert!(payload(&out) <= max_request(Kind::DeviceHello));
        FabricInfo::default().encode(Kind::FabricHello, &mut out);
        assert!(payload(&out) <= max_request(Kind::FabricHello));
        assert!(MAX_SETUP_REQUEST <= max_request(Kind::UcxAsk));
        for k in [
            Kind::Ping,
            Kind::Bye,
            Kind::Welcome,
            Kind::Done,
            Kind::Hello,
        ] {
            assert_eq!(max_request(k), 0, "{k:?}");
        }
    }
}
