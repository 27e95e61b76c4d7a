//! The UCXINFO frame: the UCX worker address and packed remote keys a UCX client needs.

use super::codec::check_unique_ids;
use super::{Kind, MAX_TABLE, Reader, WireError, begin, seal};

/// The longest UCX worker address or packed remote key accepted (UCX's are a few hundred bytes).
pub const MAX_UCX_BLOB: usize = 64 << 10;

/// Server → client: what a UCX client needs to reach the server's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UcxInfo {
    /// The server's UCP worker address (opaque bytes from `ucp_worker_get_address`).
    pub worker: Vec<u8>,
    /// Region id → its packed remote key (opaque bytes from `ucp_rkey_pack`).
    pub rkeys: Vec<(u32, Vec<u8>)>,
}

impl UcxInfo {
    /// Encodes the frame into `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        begin(out, Kind::UcxInfo);
        out.extend_from_slice(&(self.worker.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.worker);
        out.extend_from_slice(&(self.rkeys.len() as u32).to_le_bytes());
        for (id, k) in &self.rkeys {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
        }
        seal(out);
    }

    /// Decodes a UCXINFO payload: blobs non-empty and at most [`MAX_UCX_BLOB`] bytes, region ids
    /// unique.
    ///
    /// # Errors
    /// A [`WireError`] if the payload is malformed.
    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(p);
        let blob = |r: &mut Reader<'_>, what: &'static str| -> Result<Vec<u8>, WireError> {
            let n = r.u32(what)? as usize;
            if n == 0 || n > MAX_UCX_BLOB {
                return Err(WireError::Invalid(what));
            }
            Ok(r.take(n, what)?.to_vec())
        };
        let worker = blob(&mut r, "ucx worker address")?;
        let n = r.count("rkey count", MAX_TABLE, 9)?;
        let mut rkeys = Vec::with_capacity(n);
        for _ in 0..n {
            let id = r.u32("region id")?;
            rkeys.push((id, blob(&mut r, "ucx rkey")?));
        }
        r.finish()?;
        check_unique_ids(rkeys.iter().map(|(i, _)| *i))?;
        Ok(UcxInfo { worker, rkeys })
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::payload;

    #[test]
    fn ucx_info_round_trip_and_limits() {
        let info = UcxInfo {
            worker: vec![1, 2, 3],
            rkeys: vec![(4, vec![9; 40]), (7, vec![8; 1])],
        };
        let mut out = Vec::new();
        info.encode(&mut out);
        let (h, p) = payload(&out);
        assert_eq!(h.kind, Kind::UcxInfo);
        assert_eq!(UcxInfo::decode(p).unwrap(), info);
        // a duplicate id, an empty blob, an oversized blob, a count past the payload
        let dup = UcxInfo {
            worker: vec![1],
            rkeys: vec![(4, vec![1]), (4, vec![2])],
        };
        out.clear();
        dup.encode(&mut out);
        assert_eq!(
            UcxInfo::decode(payload(&out).1),
            Err(WireError::Invalid("duplicate region id"))
        );
        let mut p = Vec::new();
        p.extend_from_slice(&0u32.to_le_bytes());
        assert!(UcxInfo::decode(&p).is_err());
        let mut p = Vec::new();
        p.extend_from_slice(&((MAX_UCX_BLOB + 1) as u32).to_le_bytes());
        assert!(UcxInfo::decode(&p).is_err());
        let mut p = Vec::new();
        p.extend_from_slice(&1u32.to_le_bytes());
        p.push(5);
        p.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(UcxInfo::decode(&p).is_err());
    }
}
