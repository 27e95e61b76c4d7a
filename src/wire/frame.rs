//! Frame framing: the kinds of frame, the 12-byte header every frame opens with, the errors a
//! decoder reports, and `begin`/`seal`, which wrap every encoded payload in its header.

use super::{HEADER_LEN, MAGIC, MAX_FRAME, MIN_VERSION, VERSION};

/// Frame kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    /// Client → server: open a link, or join a lane to one.
    Hello = 1,
    /// Server → client: accepted; carries the region table for a new link.
    Welcome = 2,
    /// Either way: refused, with a status and a reason; the connection closes.
    Refuse = 3,
    /// Client → server: a batch of descriptors (WRITE data follows).
    Xfer = 4,
    /// Server → client: a batch is done (READ data follows on success).
    Done = 5,
    /// Client → server: close the link.
    Bye = 6,
    /// Server → client: the link is closed.
    ByeAck = 7,
    /// Client → server: a notification (name and message); answered with DONE.
    Notify = 8,
    /// Server → client: prove the pre-shared key (server nonce and the server's proof).
    Challenge = 9,
    /// Client → server: the client's proof of the pre-shared key.
    Auth = 10,
    /// Client → server: are you there? (heartbeat; answered with PONG)
    Ping = 11,
    /// Server → client: the answer to PING.
    Pong = 12,
    /// Client → server: send your UCX worker address and remote keys (empty payload).
    UcxAsk = 13,
    /// Server → client: the UCX worker address and one packed remote key per region.
    UcxInfo = 14,
    /// Client → server, on a new link's first lane: the client's device (Ascend backend), to
    /// set up a device data path; answered with DEVICE_WELCOME, then DONE (request 0) once the
    /// server's side of the data path is ready.
    DeviceHello = 15,
    /// Server → client: the server's device, or why it has none (a status other than 0).
    DeviceWelcome = 16,
    /// Server → client, in a new link's handshake when the client says it runs on this host:
    /// prove you are the process you name (a 32-byte nonce to hold in a descriptor of yours).
    Prove = 17,
    /// Client → server: the number of the client's descriptor (a write-sealed memfd) holding
    /// the nonce of PROVE; the server takes it from the process it is about to pin.
    Proof = 18,
    /// Client → server, on a new link's first lane (fabric-memory engines): send your regions'
    /// fabric shareable handles.
    FabricHello = 19,
    /// Server → client: the server's VMM blocks and their fabric handles, or why it has none (a
    /// status other than 0).
    FabricWelcome = 20,
    /// Client → server: a block-indexed batch (one region, a base offset, a block size, a
    /// stride and the block indices; WRITE data follows). Answered with DONE, as XFER.
    XferBlocks = 21,
}

impl Kind {
    /// Every frame kind.
    pub const ALL: [Kind; 21] = [
        Kind::Hello,
        Kind::Welcome,
        Kind::Refuse,
        Kind::Xfer,
        Kind::Done,
        Kind::Bye,
        Kind::ByeAck,
        Kind::Notify,
        Kind::Challenge,
        Kind::Auth,
        Kind::Ping,
        Kind::Pong,
        Kind::UcxAsk,
        Kind::UcxInfo,
        Kind::DeviceHello,
        Kind::DeviceWelcome,
        Kind::Prove,
        Kind::Proof,
        Kind::FabricHello,
        Kind::FabricWelcome,
        Kind::XferBlocks,
    ];

    /// The protocol version that introduced this kind: what its frames carry in their header
    /// (see [`super::VERSION`]).
    pub fn since(self) -> u16 {
        match self {
            Self::XferBlocks => 4,
            _ => super::MIN_VERSION,
        }
    }

    fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            1 => Self::Hello,
            2 => Self::Welcome,
            3 => Self::Refuse,
            4 => Self::Xfer,
            5 => Self::Done,
            6 => Self::Bye,
            7 => Self::ByeAck,
            8 => Self::Notify,
            9 => Self::Challenge,
            10 => Self::Auth,
            11 => Self::Ping,
            12 => Self::Pong,
            13 => Self::UcxAsk,
            14 => Self::UcxInfo,
            15 => Self::DeviceHello,
            16 => Self::DeviceWelcome,
            17 => Self::Prove,
            18 => Self::Proof,
            19 => Self::FabricHello,
            20 => Self::FabricWelcome,
            21 => Self::XferBlocks,
            _ => return None,
        })
    }
}

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The first four bytes are not `"HIXL"`.
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// A version this build does not speak.
    #[error("unsupported protocol version {0}")]
    BadVersion(u16),
    /// An unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u16),
    /// A frame longer than [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(u32),
    /// The frame ends before a field.
    #[error("truncated frame: {0}")]
    Truncated(&'static str),
    /// Bytes left over after the last field.
    #[error("{0} trailing bytes")]
    Trailing(usize),
    /// A count or string length above its limit.
    #[error("{what} of {got} exceeds the limit {limit}")]
    OverLimit {
        /// The field.
        what: &'static str,
        /// The value received.
        got: u64,
        /// The limit.
        limit: u64,
    },
    /// A field with a value outside its domain.
    #[error("invalid {0}")]
    Invalid(&'static str),
    /// A frame kind that is not allowed at this point.
    #[error("unexpected {0:?} frame")]
    Unexpected(Kind),
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The frame kind.
    pub kind: Kind,
    /// The payload length.
    pub len: u32,
}

/// Encodes a header.
pub fn header(kind: Kind, len: usize) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4..6].copy_from_slice(&kind.since().to_le_bytes());
    h[6..8].copy_from_slice(&(kind as u16).to_le_bytes());
    h[8..12].copy_from_slice(&(len as u32).to_le_bytes());
    h
}

/// Decodes and checks a header.
///
/// # Errors
/// A [`WireError`] for a bad magic, version, kind or length.
pub fn decode_header(b: &[u8; HEADER_LEN]) -> Result<Header, WireError> {
    let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    let version = u16::from_le_bytes([b[4], b[5]]);
    if !(MIN_VERSION..=VERSION).contains(&version) {
        return Err(WireError::BadVersion(version));
    }
    let k = u16::from_le_bytes([b[6], b[7]]);
    let kind = Kind::from_u16(k).ok_or(WireError::UnknownKind(k))?;
    if version < kind.since() {
        // a kind its frame's version does not have
        return Err(WireError::BadVersion(version));
    }
    let len = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    if len > MAX_FRAME {
        return Err(WireError::TooLarge(len));
    }
    Ok(Header { kind, len })
}

/// Starts a frame in `out` (cleared); finish it with [`seal`].
pub fn begin(out: &mut Vec<u8>, kind: Kind) {
    out.clear();
    out.extend_from_slice(&header(kind, 0));
}

/// Writes the payload length into a frame begun with [`begin`].
pub fn seal(out: &mut [u8]) {
    let len = (out.len() - HEADER_LEN) as u32;
    out[8..12].copy_from_slice(&len.to_le_bytes());
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::MAX_FRAME;

    #[test]
    fn headers_are_checked() {
        let mut h = header(Kind::Bye, 0);
        assert!(decode_header(&h).is_ok());
        h[6] = 99;
        assert_eq!(decode_header(&h), Err(WireError::UnknownKind(99)));
        let mut h = header(Kind::Bye, 0);
        h[4] = 1;
        assert_eq!(decode_header(&h), Err(WireError::BadVersion(1)));
        h[4] = 5;
        assert_eq!(decode_header(&h), Err(WireError::BadVersion(5)));
        // version 3 frames (every kind but XFER_BLOCKS) and version 4 ones both decode: an
        // engine that speaks only version 3 still talks to this one
        for kind in Kind::ALL {
            let h = header(kind, 0);
            let v = u16::from_le_bytes([h[4], h[5]]);
            assert_eq!(v, if kind == Kind::XferBlocks { 4 } else { 3 });
            assert_eq!(decode_header(&h).map(|h| h.kind), Ok(kind));
            let mut h4 = h;
            h4[4] = 4;
            assert_eq!(decode_header(&h4).map(|h| h.kind), Ok(kind));
        }
        // XFER_BLOCKS under a version 3 header is refused (version 3 has no such kind)
        let mut h = header(Kind::XferBlocks, 0);
        h[4] = 3;
        assert_eq!(decode_header(&h), Err(WireError::BadVersion(3)));
        let h = header(Kind::Xfer, MAX_FRAME as usize + 1);
        assert_eq!(decode_header(&h), Err(WireError::TooLarge(MAX_FRAME + 1)));
        let mut h = header(Kind::Bye, 0);
        h[0] = b'X';
        assert!(matches!(decode_header(&h), Err(WireError::BadMagic(_))));
    }
}
