//! The handshake frames: HELLO (client greeting), REFUSE (either way), and the CHALLENGE/AUTH
//! pre-shared-key proofs. The WELCOME answer and its region table are in `table.rs`.

use super::codec::{put_host, put_str};
use super::{HostId, Kind, Reader, WireError, begin, seal};

/// Whether a HELLO opens a new link or joins a lane to an existing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneRole {
    /// The first lane of a new link; the server answers with its region table.
    NewLink,
    /// Another lane of the link identified by the token.
    Join,
}

/// Client → server greeting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// New link or additional lane.
    pub role: LaneRole,
    /// The client engine's per-process instance id.
    pub instance: u64,
    /// The link token (for [`LaneRole::Join`]); for [`LaneRole::NewLink`], flags
    /// ([`ASKS_SERVER_PROOF`]; an engine before protocol version 5's rule sends 0 and ignores
    /// the word).
    pub token: u64,
    /// The client's engine name.
    pub name: String,
    /// The engine name the client believes it is talking to.
    pub target: String,
    /// The client process, for same-host transfers (`None` if it does not offer them).
    pub host: Option<HostId>,
    /// A fresh random nonce, for peer authentication.
    pub nonce: [u8; 32],
}

/// A new link's HELLO flag: the client asks a server on its host to prove which process it is
/// ([`Welcome::lane_fd`](super::Welcome::lane_fd)). An engine that does not know the flag ignores
/// it and sends the WELCOME without that field, which the client then takes as no proof.
pub const ASKS_SERVER_PROOF: u64 = 1;

impl Hello {
    /// Encodes the frame into `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        begin(out, Kind::Hello);
        out.push(match self.role {
            LaneRole::NewLink => 0,
            LaneRole::Join => 1,
        });
        out.extend_from_slice(&self.instance.to_le_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
        put_str(out, &self.name);
        put_str(out, &self.target);
        put_host(out, &self.host);
        out.extend_from_slice(&self.nonce);
        seal(out);
    }
    /// Decodes a HELLO payload.
    ///
    /// # Errors
    /// A [`WireError`] if the payload is malformed.
    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(p);
        let role = match r.u8("lane role")? {
            0 => LaneRole::NewLink,
            1 => LaneRole::Join,
            _ => return Err(WireError::Invalid("lane role")),
        };
        let h = Hello {
            role,
            instance: r.u64("instance")?,
            token: r.u64("token")?,
            name: r.string("name")?,
            target: r.string("target")?,
            host: r.host()?,
            nonce: r.take(32, "nonce")?.try_into().expect("32 bytes"),
        };
        r.finish()?;
        Ok(h)
    }
}

/// A refusal: status code and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refuse {
    /// HIXL status code.
    pub status: u32,
    /// Why.
    pub reason: String,
}

impl Refuse {
    /// Encodes the frame into `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        begin(out, Kind::Refuse);
        out.extend_from_slice(&self.status.to_le_bytes());
        put_str(out, &self.reason);
        seal(out);
    }
    /// Decodes a REFUSE payload.
    ///
    /// # Errors
    /// A [`WireError`] if the payload is malformed.
    pub fn decode(p: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(p);
        let f = Refuse {
            status: r.u32("status")?,
            reason: r.string("reason")?,
        };
        r.finish()?;
        Ok(f)
    }
}

/// Encodes a CHALLENGE or AUTH frame: 32-byte fields, as given.
pub fn encode_auth(out: &mut Vec<u8>, kind: Kind, fields: &[&[u8; 32]]) {
    begin(out, kind);
    for f in fields {
        out.extend_from_slice(&f[..]);
    }
    seal(out);
}

/// Decodes a CHALLENGE (`n == 2`: server nonce, proof) or AUTH (`n == 1`: proof) payload.
///
/// # Errors
/// A [`WireError`] if the payload is not `n` 32-byte fields.
pub fn decode_auth(p: &[u8], n: usize) -> Result<Vec<[u8; 32]>, WireError> {
    let mut r = Reader::new(p);
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(r.take(32, "auth field")?.try_into().expect("32 bytes"));
    }
    r.finish()?;
    Ok(v)
}

/// Encodes a PROVE frame: the nonce a same-host client must hold in a descriptor of its own.
pub fn encode_prove(out: &mut Vec<u8>, nonce: &[u8; 32]) {
    begin(out, Kind::Prove);
    out.extend_from_slice(nonce);
    seal(out);
}

/// Decodes a PROVE payload (the nonce).
///
/// # Errors
/// A [`WireError`] if the payload is not one 32-byte nonce.
pub fn decode_prove(p: &[u8]) -> Result<[u8; 32], WireError> {
    let mut r = Reader::new(p);
    let n = r.take(32, "nonce")?.try_into().expect("32 bytes");
    r.finish()?;
    Ok(n)
}

/// Encodes a PROOF frame: the number of the client's descriptor holding the nonce.
pub fn encode_proof(out: &mut Vec<u8>, fd: u64) {
    begin(out, Kind::Proof);
    out.extend_from_slice(&fd.to_le_bytes());
    seal(out);
}

/// Decodes a PROOF payload (the descriptor number).
///
/// # Errors
/// A [`WireError`] if the payload is not one address.
pub fn decode_proof(p: &[u8]) -> Result<u64, WireError> {
    let mut r = Reader::new(p);
    let a = r.u64("descriptor")?;
    r.finish()?;
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::payload;
    use crate::wire::{HostId, Kind};

    #[test]
    fn hello_round_trip() {
        let h = Hello {
            role: LaneRole::Join,
            instance: 7,
            token: 99,
            name: "10.0.0.1:5".into(),
            target: "[::1]:6".into(),
            host: Some(HostId {
                boot: [7; 16],
                pidns: 4_026_531_836,
                pid: 42,
                start: 99,
            }),
            nonce: [9; 32],
        };
        let mut out = Vec::new();
        h.encode(&mut out);
        let (hd, p) = payload(&out);
        assert_eq!(hd.kind, Kind::Hello);
        assert_eq!(Hello::decode(p).unwrap(), h);
        // every truncation is an error, never a panic
        for cut in 0..p.len() {
            assert!(Hello::decode(&p[..cut]).is_err());
        }
        let mut longer = p.to_vec();
        longer.push(0);
        assert_eq!(Hello::decode(&longer), Err(WireError::Trailing(1)));
    }
}
