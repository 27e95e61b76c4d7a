//! The FABRIC_HELLO / FABRIC_WELCOME frames: the fabric-memory data path's share-handle
//! exchange (`EnableUseFabricMem=1`). The client asks with FABRIC_HELLO (no blocks); the server
//! answers with FABRIC_WELCOME: per VMM block of each region it serves, the region id, the
//! block's start and length in the server's address space, and its 128-byte fabric shareable
//! handle (`aclrtMemExportToShareableHandleV2`), which the client imports and maps.

use super::codec::put_str;
use super::{Kind, MAX_TABLE, Reader, WireError, begin, seal};

/// Bytes of an `aclrtMemFabricHandle`.
pub const FABRIC_HANDLE_LEN: usize = 128;
/// Most blocks in one FABRIC_WELCOME.
pub const MAX_FABRIC_BLOCKS: usize = MAX_TABLE;
/// Bytes per encoded block.
const BLOCK_LEN: usize = 4 + 8 + 8 + FABRIC_HANDLE_LEN;

/// One VMM block of a served region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricBlock {
    /// The region (an id of the server's table) the block belongs to.
    pub region: u32,
    /// The block's start in the server's address space.
    pub base: u64,
    /// Its length.
    pub len: u64,
    /// Its fabric shareable handle.
    pub handle: [u8; FABRIC_HANDLE_LEN],
}

/// FABRIC_HELLO and FABRIC_WELCOME.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FabricInfo {
    /// 0, or the HIXL status code of why the sender has no fabric data path.
    pub status: u32,
    /// Why not (with a non-zero status).
    pub reason: String,
    /// The blocks (FABRIC_WELCOME with status 0 only).
    pub blocks: Vec<FabricBlock>,
}

impl FabricInfo {
    /// Encodes the frame (`kind` is [`Kind::FabricHello`] or [`Kind::FabricWelcome`]).
    pub fn encode(&self, kind: Kind, out: &mut Vec<u8>) {
        begin(out, kind);
        out.extend_from_slice(&self.status.to_le_bytes());
        put_str(out, &self.reason);
        out.extend_from_slice(&(self.blocks.len() as u32).to_le_bytes());
        for b in &self.blocks {
            out.extend_from_slice(&b.region.to_le_bytes());
            out.extend_from_slice(&b.base.to_le_bytes());
            out.extend_from_slice(&b.len.to_le_bytes());
            out.extend_from_slice(&b.handle);
        }
        seal(out);
    }

    /// Decodes a FABRIC_HELLO or FABRIC_WELCOME payload. Blocks of zero length, or whose end
    /// overflows, are refused.
    ///
    /// # Errors
    /// A [`WireError`] if the payload is malformed.
    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(p);
        let status = r.u32("status")?;
        let reason = r.string("reason")?;
        let n = r.count("fabric blocks", MAX_FABRIC_BLOCKS, BLOCK_LEN)?;
        let mut blocks = Vec::with_capacity(n);
        for _ in 0..n {
            let region = r.u32("block region")?;
            let base = r.u64("block base")?;
            let len = r.u64("block length")?;
            if len == 0 || base.checked_add(len).is_none() {
                return Err(WireError::Invalid("block range"));
            }
            let handle = r
                .take(FABRIC_HANDLE_LEN, "fabric handle")?
                .try_into()
                .map_err(|_| WireError::Truncated("fabric handle"))?;
            blocks.push(FabricBlock {
                region,
                base,
                len,
                handle,
            });
        }
        r.finish()?;
        Ok(Self {
            status,
            reason,
            blocks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::payload;

    #[test]
    fn fabric_info_round_trip_and_hostile_payloads() {
        let info = FabricInfo {
            status: 0,
            reason: String::new(),
            blocks: vec![
                FabricBlock {
                    region: 3,
                    base: 0x4000_0000,
                    len: 2 << 20,
                    handle: [7; FABRIC_HANDLE_LEN],
                },
                FabricBlock {
                    region: 4,
                    base: 0x5000_0000,
                    len: 4 << 20,
                    handle: [9; FABRIC_HANDLE_LEN],
                },
            ],
        };
        let mut out = Vec::new();
        info.encode(Kind::FabricWelcome, &mut out);
        let (h, p) = payload(&out);
        assert_eq!(h.kind, Kind::FabricWelcome);
        assert_eq!(FabricInfo::decode(p).unwrap(), info);
        for n in 0..p.len() {
            assert!(FabricInfo::decode(&p[..n]).is_err(), "prefix of {n} bytes");
        }
        let mut long = p.to_vec();
        long.push(0);
        assert!(FabricInfo::decode(&long).is_err(), "trailing bytes");
        // a count larger than what follows is refused before anything is allocated
        let mut huge = 0u32.to_le_bytes().to_vec();
        huge.extend_from_slice(&0u16.to_le_bytes());
        huge.extend_from_slice(&(MAX_FABRIC_BLOCKS as u32).to_le_bytes());
        assert!(FabricInfo::decode(&huge).is_err());
        // a zero-length block, and one whose end overflows
        for (base, len) in [(0u64, 0u64), (u64::MAX - 1, 2)] {
            let bad = FabricInfo {
                blocks: vec![FabricBlock {
                    region: 1,
                    base,
                    len,
                    handle: [0; FABRIC_HANDLE_LEN],
                }],
                ..FabricInfo::default()
            };
            bad.encode(Kind::FabricHello, &mut out);
            let (_, p) = payload(&out);
            assert_eq!(
                FabricInfo::decode(p),
                Err(WireError::Invalid("block range"))
            );
        }
    }
}
