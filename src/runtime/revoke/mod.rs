//! Revocation: how a serving engine takes back one-sided access it gave peers on this host,
//! before its memory goes back to its owner.
//!
//! One-sided transports (same-host copies, and UCX to a client on this host) write the server's
//! memory with no work by the server, so the server cannot see a copy in flight. Every such
//! link holds a [`fence`] the server can revoke and wait for; a client that does not confirm in
//! time leaves the memory it could reach in [`quarantine`] until it cannot touch it any more.
//! Both are the runtime's, whichever transport moves the bytes: the serving engine hands out the
//! fences (`serve/`), the link core enters them around every fenced batch (`link/`), and the
//! region records quarantine memory (`region.rs`).

pub(crate) mod fence;
pub(crate) mod quarantine;
