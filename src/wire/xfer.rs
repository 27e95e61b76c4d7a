//! The data-path frames: XFER (a batch of descriptors), DONE (its end), and NOTIFY.

use super::codec::put_str;
use super::{DESC_LEN, Kind, MAX_DESCS_PER_FRAME, Reader, WireDesc, WireError, begin, seal};
use crate::types::TransferOp;

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
}
