//! The hixl wire protocol: one versioned, length-prefixed binary format for the handshake, the
//! region-table exchange, transfers and disconnect.
//!
//! Every frame starts with a 12-byte header: magic `"HIXL"`, version (u16), kind (u16) and the
//! payload length (u32), all little-endian. Bulk data (WRITE payloads, READ replies) follows its
//! frame raw and is not counted in the frame length: its size is the sum of the descriptor
//! lengths, which the receiver has validated before it reads or writes a byte of it.
//!
//! The decoder never trusts a length: every field is bounds-checked, counts are capped, and a
//! frame that is not consumed exactly is an error.
//!
//! One file per job: `frame` (kinds, header, errors), `codec` (the bounds-checked reader and
//! field writers), `handshake` (HELLO, REFUSE, CHALLENGE/AUTH), `table` (WELCOME and its region
//! table), `xfer` (XFER, XFER_BLOCKS, DONE, NOTIFY), `device` (DEVICE_HELLO/WELCOME), `ucx` (UCXINFO), `fabric` (FABRIC_HELLO/WELCOME).

mod codec;
mod device;
mod fabric;
mod frame;
mod handshake;
mod table;
mod ucx;
mod xfer;

pub use codec::Reader;
pub use device::DeviceInfo;
pub use fabric::{FABRIC_HANDLE_LEN, FabricBlock, FabricInfo, MAX_FABRIC_BLOCKS};
pub use frame::{Header, Kind, WireError, begin, decode_header, header, seal};
pub use handshake::{
    ASKS_SERVER_PROOF, Hello, LaneRole, Refuse, decode_auth, decode_proof, decode_prove,
    encode_auth, encode_proof, encode_prove,
};
pub use table::{FD_TCP_ONLY, TableEntry, Welcome};
pub use ucx::{MAX_UCX_BLOB, UcxInfo};
pub use xfer::{
    MAX_SETUP_REQUEST, XferBlocks, decode_done, decode_notify, decode_xfer, decode_xfer_blocks,
    encode_done, encode_notify, encode_xfer, encode_xfer_blocks, max_request,
};

/// `"HIXL"` in little-endian byte order.
pub const MAGIC: u32 = u32::from_le_bytes(*b"HIXL");
/// The newest protocol version this build speaks: 4 added XFER_BLOCKS.
///
/// A frame's header carries the oldest version that has its kind ([`Kind::since`]): 3 for
/// every kind but XFER_BLOCKS. So an engine of this build and one that speaks only version 3
/// still talk; only a block-indexed batch sent to the older one is refused there (its header
/// says 4: `REFUSE` FAILED, the lane closed), where the list form works.
pub const VERSION: u16 = 4;
/// The oldest protocol version this build accepts.
pub const MIN_VERSION: u16 = 3;
/// Header size in bytes.
pub const HEADER_LEN: usize = 12;
/// Largest frame payload accepted (the bulk data that follows a frame is not limited by this).
pub const MAX_FRAME: u32 = 8 << 20;
/// Most descriptors in one XFER frame.
pub const MAX_DESCS_PER_FRAME: usize = 65_536;
/// Most regions in one WELCOME table.
pub const MAX_TABLE: usize = 65_536;
/// Longest engine name or reason string.
pub const MAX_STR: usize = 1024;
/// Bytes per encoded descriptor.
pub const DESC_LEN: usize = 20;
/// Bytes per encoded region-table entry.
pub const ENTRY_LEN: usize = 26;

pub use crate::types::blocks::WireBlocks;
pub use crate::types::{HostId, WireDesc};

/// Decodes any frame payload of `kind`, for fuzzing and property tests: `Ok` means the decoder
/// accepted it, and nothing it does may panic.
///
/// # Errors
/// The decoder's [`WireError`].
pub fn decode_any(kind: Kind, p: &[u8]) -> Result<(), WireError> {
    match kind {
        Kind::Hello => Hello::decode(p).map(drop),
        Kind::Welcome => Welcome::decode(p).map(drop),
        Kind::Refuse => Refuse::decode(p).map(drop),
        Kind::Xfer => decode_xfer(p, &mut Vec::new()).map(drop),
        Kind::XferBlocks => decode_xfer_blocks(p, &mut Vec::new()).map(drop),
        Kind::Done => decode_done(p).map(drop),
        Kind::Notify => decode_notify(p).map(drop),
        Kind::Challenge => decode_auth(p, 2).map(drop),
        Kind::Auth => decode_auth(p, 1).map(drop),
        Kind::UcxInfo => UcxInfo::decode(p).map(drop),
        Kind::Bye | Kind::ByeAck | Kind::Ping | Kind::Pong | Kind::UcxAsk => {
            Reader::new(p).finish()
        }
        Kind::DeviceHello | Kind::DeviceWelcome => DeviceInfo::decode(p).map(drop),
        Kind::Prove => decode_prove(p).map(drop),
        Kind::Proof => decode_proof(p).map(drop),
        Kind::FabricHello | Kind::FabricWelcome => FabricInfo::decode(p).map(drop),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    /// The header and payload of an encoded frame (the header checked against it).
    pub(super) fn payload(frame: &[u8]) -> (Header, &[u8]) {
        let h = decode_header(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.len as usize, frame.len() - HEADER_LEN);
        (h, &frame[HEADER_LEN..])
    }

    /// Property: random bytes never make any decoder panic, and whatever decodes re-encodes to
    /// the same bytes (for the kinds with a canonical encoding).
    #[test]
    fn decoders_survive_random_input() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let kinds = Kind::ALL;
        let mut accepted = 0;
        for i in 0..200_000 {
            let len = (next() % 96) as usize;
            let mut p: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // bias toward plausible frames: small counts and string lengths
            if len > 20 && i % 2 == 0 {
                p[17] = 0;
                p[18] = 0;
                p[19] &= 3;
            }
            let kind = kinds[(next() % kinds.len() as u64) as usize];
            if decode_any(kind, &p).is_ok() {
                accepted += 1;
                if kind == Kind::Xfer {
                    let mut d = Vec::new();
                    let (op, req) = decode_xfer(&p, &mut d).unwrap();
                    let mut out = Vec::new();
                    encode_xfer(&mut out, op, req, d.iter().copied());
                    assert_eq!(&out[HEADER_LEN..], &p[..]);
                }
            }
        }
        assert!(
            accepted > 0,
            "the property test never produced a valid frame"
        );
    }
}
