//! Helpers shared by the integration tests.
#![allow(dead_code)]

use hixl::{Connected, Hixl, HostBuffer, Options, Region};

#[allow(unused_imports)]
pub use hixl::testkit::{Rng, fnv1a};

/// A serving engine on an ephemeral loopback port with one region of `len` bytes, activated.
pub fn server(len: usize, opts: Options) -> (Hixl<Connected>, Region) {
    let (e, r) = Hixl::initialize_ephemeral("127.0.0.1", opts)
        .unwrap()
        .register(HostBuffer::new(len).unwrap())
        .unwrap();
    (e.activate().unwrap(), r)
}

/// A client-only engine with one region of `len` bytes, activated, moving data over TCP only.
pub fn client(len: usize) -> (Hixl<Connected>, Region) {
    client_with(len, Options::default().same_host(hixl::SameHost::Forbid))
}

/// A client-only engine with one region of `len` bytes and these options, activated.
pub fn client_with(len: usize, opts: Options) -> (Hixl<Connected>, Region) {
    let (e, r) = Hixl::initialize("127.0.0.1", opts)
        .unwrap()
        .register(HostBuffer::new(len).unwrap())
        .unwrap();
    (e.activate().unwrap(), r)
}

/// The transport a link must use under `policy` on this machine (the same-host transport where
/// the kernel offers it).
pub fn expected_transport(policy: hixl::SameHost) -> hixl::TransportKind {
    let cma = hixl::probe()
        .iter()
        .any(|t| t.kind == hixl::TransportKind::Cma && t.available);
    match policy {
        hixl::SameHost::Forbid => hixl::TransportKind::Tcp,
        _ if cma => hixl::TransportKind::Cma,
        _ => hixl::TransportKind::Tcp,
    }
}
