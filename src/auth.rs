//! Peer authentication: a pre-shared key proven by HMAC-SHA256 challenge-response, so the key
//! never crosses the wire.
//!
//! ```text
//! client → HELLO  { client nonce, client name, target, ... }
//! server → CHALLENGE { server nonce, HMAC(key, "hixl-v2 server" | cn | sn | name | target) }
//! client → AUTH   { HMAC(key, "hixl-v2 client" | sn | cn | name | target) }  (after checking)
//! server → WELCOME (or REFUSE)
//! ```
//!
//! Each side proves the key over fresh nonces from both, so neither proof can be replayed. The
//! client's name and the target, the server address the client dialed, are bound into both
//! proofs (each with its length before it), and a keyed server refuses a HELLO whose target is
//! not the address its end of the connection has. So a relay without the key, at another
//! address, cannot pass a keyed server's proof on to a keyed client as its own: forwarded
//! unchanged, the HELLO names the relay, which the server refuses; rewritten, the server's
//! proof names another target than the client checks. (What follows the handshake on the
//! connection is not authenticated: an attacker on the path itself is not kept out.) An
//! engine with a key refuses a peer without one, and vice versa.
//!
//! A keyed client's nonce also *vouches* for the key in the first flight: its first 16 bytes are
//! random, its last 16 the start of HMAC(key, "hixl-v1 early" | first half | client name |
//! client address | server address). The server checks it as soon as the HELLO is in and gives
//! such a handshake priority: no connection that has not shown the key can take its place. It
//! grants nothing else (the CHALLENGE/AUTH exchange still decides), and a copy is worth nothing
//! on another connection (the addresses are bound in, and two open connections never share
//! both).

use std::fmt;
use std::net::SocketAddr;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// A pre-shared key. Its `Debug` output never shows the key.
#[derive(Clone)]
pub struct Psk(Vec<u8>);

impl Psk {
    /// The key's bytes (at least 16 for [`Options::psk`](crate::Options::psk) to accept them).
    pub fn new(key: impl AsRef<[u8]>) -> Self {
        Psk(key.as_ref().to_vec())
    }
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
    /// The MAC `role` proves: the server's over (cn, sn), the client's over (sn, cn), each under
    /// its own label, with the HELLO's client name and target (`who`), each after its length.
    fn mac(&self, role: Role, cn: &[u8; 32], sn: &[u8; 32], who: Who<'_>) -> Hmac<Sha256> {
        let (label, a, b) = match role {
            Role::Server => (SERVER, cn, sn),
            Role::Client => (CLIENT, sn, cn),
        };
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        m.update(label);
        m.update(a);
        m.update(b);
        for s in [who.name, who.target] {
            m.update(&(s.len() as u64).to_le_bytes());
            m.update(s.as_bytes());
        }
        m
    }
    fn proof(&self, role: Role, cn: &[u8; 32], sn: &[u8; 32], who: Who<'_>) -> [u8; 32] {
        self.mac(role, cn, sn, who).finalize().into_bytes().into()
    }
    /// Checks the proof `role` sent, in constant time.
    pub(crate) fn check(
        &self,
        role: Role,
        cn: &[u8; 32],
        sn: &[u8; 32],
        who: Who<'_>,
        proof: &[u8; 32],
    ) -> bool {
        self.mac(role, cn, sn, who).verify_slice(proof).is_ok()
    }
    /// The server's proof for client nonce `cn`, server nonce `sn`, and the HELLO's `who`.
    pub(crate) fn server_proof(&self, cn: &[u8; 32], sn: &[u8; 32], who: Who<'_>) -> [u8; 32] {
        self.proof(Role::Server, cn, sn, who)
    }
    /// The client's proof (its nonces in the other order, under another label).
    pub(crate) fn client_proof(&self, cn: &[u8; 32], sn: &[u8; 32], who: Who<'_>) -> [u8; 32] {
        self.proof(Role::Client, cn, sn, who)
    }
}

impl Psk {
    fn early(
        &self,
        half: &[u8],
        name: &str,
        client: SocketAddr,
        server: SocketAddr,
    ) -> Hmac<Sha256> {
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        m.update(EARLY);
        m.update(half);
        m.update(name.as_bytes());
        m.update(canonical(client).to_string().as_bytes());
        m.update(b"|");
        m.update(canonical(server).to_string().as_bytes());
        m
    }

    /// A client nonce that vouches for the key on the connection from `client` to `server`.
    pub(crate) fn vouching_nonce(
        &self,
        name: &str,
        client: SocketAddr,
        server: SocketAddr,
    ) -> Result<[u8; 32], crate::error::Error> {
        let mut n = nonce()?;
        let mac: [u8; 32] = self
            .early(&n[..16], name, client, server)
            .finalize()
            .into_bytes()
            .into();
        n[16..].copy_from_slice(&mac[..16]);
        Ok(n)
    }

    /// Whether client nonce `cn` vouches for the key on the connection from `client` to
    /// `server` (in constant time).
    pub(crate) fn vouches(
        &self,
        cn: &[u8; 32],
        name: &str,
        client: SocketAddr,
        server: SocketAddr,
    ) -> bool {
        self.early(&cn[..16], name, client, server)
            .verify_truncated_left(&cn[16..])
            .is_ok()
    }
}

/// An IPv4-mapped IPv6 address as IPv4 (the two ends of one connection may see either form).
fn canonical(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => a,
        },
        SocketAddr::V4(_) => a,
    }
}

/// What a HELLO says of the two ends, bound into both proofs: the client's engine name and
/// the target, the server address the client dialed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Who<'a> {
    /// The client's engine name.
    pub(crate) name: &'a str,
    /// The engine name (address) the client dialed.
    pub(crate) target: &'a str,
}

/// Whether `target` (a HELLO's) names `reached`, the address the server's end of the
/// connection has (an IPv4-mapped IPv6 address as IPv4).
pub(crate) fn names(target: &str, reached: SocketAddr) -> bool {
    target
        .parse::<SocketAddr>()
        .is_ok_and(|t| canonical(t) == canonical(reached))
}

/// Which side a proof is of.
#[derive(Clone, Copy)]
pub(crate) enum Role {
    /// The accepting side's (WELCOME).
    Server,
    /// The connecting side's (PROOF).
    Client,
}

const SERVER: &[u8] = b"hixl-v2 server";
const CLIENT: &[u8] = b"hixl-v2 client";
const EARLY: &[u8] = b"hixl-v1 early";

impl fmt::Debug for Psk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Psk(<redacted>)")
    }
}

/// A random 64-bit value from the operating system (instance ids, link tokens). There is no
/// fallback: a value a peer could guess (time, pid, a counter) would let it forge a link token
/// or replay a handshake, so a failing source is an error.
pub(crate) fn random_u64() -> Result<u64, crate::error::Error> {
    getrandom::u64().map_err(|e| crate::error::Error::NoRandomness { source: e.into() })
}

/// 32 random bytes from the operating system (no fallback, as [`random_u64`]).
pub(crate) fn nonce() -> Result<[u8; 32], crate::error::Error> {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).map_err(|e| crate::error::Error::NoRandomness { source: e.into() })?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vouching_nonce_binds_key_name_and_both_addresses() {
        let k = Psk::new("0123456789abcdef");
        let (c, s): (SocketAddr, SocketAddr) = (
            "127.0.0.1:5000".parse().unwrap(),
            "127.0.0.1:6000".parse().unwrap(),
        );
        let n = k.vouching_nonce("a:1", c, s).unwrap();
        assert!(k.vouches(&n, "a:1", c, s));
        // the same connection seen as IPv4-mapped IPv6 from one end
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:5000".parse().unwrap();
        assert!(k.vouches(&n, "a:1", mapped, s));
        assert!(!k.vouches(&n, "a:2", c, s), "another name");
        assert!(
            !k.vouches(&n, "a:1", "127.0.0.1:5001".parse().unwrap(), s),
            "another connection"
        );
        assert!(
            !k.vouches(&n, "a:1", c, "127.0.0.2:6000".parse().unwrap()),
            "another server"
        );
        assert!(
            !Psk::new("another key of 16+").vouches(&n, "a:1", c, s),
            "another key"
        );
        let mut bent = n;
        bent[3] ^= 1;
        assert!(!k.vouches(&bent, "a:1", c, s), "a changed random half");
        // the first half stays random
        assert_ne!(n[..16], k.vouching_nonce("a:1", c, s).unwrap()[..16]);
    }

    #[test]
    fn proofs_bind_key_nonces_role_name_and_target() {
        let k = Psk::new("0123456789abcdef");
        let (cn, sn) = ([1u8; 32], [2u8; 32]);
        let who = |name, target| Who { name, target };
        let w = who("10.0.0.1", "10.0.0.9:5000");
        let sp = k.server_proof(&cn, &sn, w);
        let cp = k.client_proof(&cn, &sn, w);
        assert!(k.check(Role::Server, &cn, &sn, w, &sp));
        assert!(k.check(Role::Client, &cn, &sn, w, &cp));
        assert_ne!(sp, cp, "a server proof must not pass as a client proof");
        assert!(!k.check(Role::Client, &cn, &sn, w, &sp));
        assert!(!k.check(Role::Server, &cn, &[3; 32], w, &sp));
        assert!(!k.check(
            Role::Server,
            &cn,
            &sn,
            who("10.0.0.2", "10.0.0.9:5000"),
            &sp
        ));
        assert!(
            !k.check(
                Role::Server,
                &cn,
                &sn,
                who("10.0.0.1", "10.0.0.8:5000"),
                &sp
            ),
            "another target"
        );
        // the two strings are length-prefixed: moving bytes from one to the other changes it
        assert!(!k.check(
            Role::Server,
            &cn,
            &sn,
            who("10.0.0.11", "0.0.0.9:5000"),
            &sp
        ));
        assert!(!Psk::new("another key 0123").check(Role::Server, &cn, &sn, w, &sp));
        // a target names the address the server's end has (either form of IPv4)
        let reached: SocketAddr = "10.0.0.9:5000".parse().unwrap();
        assert!(names("10.0.0.9:5000", reached));
        assert!(names("[::ffff:10.0.0.9]:5000", reached));
        assert!(!names("10.0.0.9:5001", reached));
        assert!(!names("10.0.0.9", reached));
        assert!(!names("", reached));
        assert_eq!(format!("{k:?}"), "Psk(<redacted>)");
    }
}
