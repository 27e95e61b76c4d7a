//! Peer authentication: a pre-shared key proven by HMAC-SHA256 challenge-response, so the key
//! never crosses the wire.
//!
//! ```text
//! client → HELLO  { client nonce, client name, ... }
//! server → CHALLENGE { server nonce, HMAC(key, "hixl-v1 server" | cn | sn | client name) }
//! client → AUTH   { HMAC(key, "hixl-v1 client" | sn | cn | client name) }      (after checking)
//! server → WELCOME (or REFUSE)
//! ```
//!
//! Each side proves the key over fresh nonces from both, so neither proof can be replayed, and
//! the client's name is bound into both proofs (an allow-list of names means something once
//! peers authenticate). An engine with a key refuses a peer without one, and vice versa.
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
    /// its own label, with the client's name.
    fn mac(&self, role: Role, cn: &[u8; 32], sn: &[u8; 32], name: &str) -> Hmac<Sha256> {
        let (label, a, b) = match role {
            Role::Server => (SERVER, cn, sn),
            Role::Client => (CLIENT, sn, cn),
        };
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        m.update(label);
        m.update(a);
        m.update(b);
        m.update(name.as_bytes());
        m
    }
    fn proof(&self, role: Role, cn: &[u8; 32], sn: &[u8; 32], name: &str) -> [u8; 32] {
        self.mac(role, cn, sn, name).finalize().into_bytes().into()
    }
    /// Checks the proof `role` sent, in constant time.
    pub(crate) fn check(
        &self,
        role: Role,
        cn: &[u8; 32],
        sn: &[u8; 32],
        name: &str,
        proof: &[u8; 32],
    ) -> bool {
        self.mac(role, cn, sn, name).verify_slice(proof).is_ok()
    }
    /// The server's proof for client nonce `cn`, server nonce `sn`, client name `name`.
    pub(crate) fn server_proof(&self, cn: &[u8; 32], sn: &[u8; 32], name: &str) -> [u8; 32] {
        self.proof(Role::Server, cn, sn, name)
    }
    /// The client's proof (its nonces in the other order, under another label).
    pub(crate) fn client_proof(&self, cn: &[u8; 32], sn: &[u8; 32], name: &str) -> [u8; 32] {
        self.proof(Role::Client, cn, sn, name)
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

/// Which side a proof is of.
#[derive(Clone, Copy)]
pub(crate) enum Role {
    /// The accepting side's (WELCOME).
    Server,
    /// The connecting side's (PROOF).
    Client,
}

const SERVER: &[u8] = b"hixl-v1 server";
const CLIENT: &[u8] = b"hixl-v1 client";
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
    fn proofs_bind_key_nonces_role_and_name() {
        let k = Psk::new("0123456789abcdef");
        let (cn, sn) = ([1u8; 32], [2u8; 32]);
        let sp = k.server_proof(&cn, &sn, "10.0.0.1");
        let cp = k.client_proof(&cn, &sn, "10.0.0.1");
        assert!(k.check(Role::Server, &cn, &sn, "10.0.0.1", &sp));
        assert!(k.check(Role::Client, &cn, &sn, "10.0.0.1", &cp));
        assert_ne!(sp, cp, "a server proof must not pass as a client proof");
        assert!(!k.check(Role::Client, &cn, &sn, "10.0.0.1", &sp));
        assert!(!k.check(Role::Server, &cn, &[3; 32], "10.0.0.1", &sp));
        assert!(!k.check(Role::Server, &cn, &sn, "10.0.0.2", &sp));
        assert!(!Psk::new("another key 0123").check(Role::Server, &cn, &sn, "10.0.0.1", &sp));
        assert_eq!(format!("{k:?}"), "Psk(<redacted>)");
    }
}
