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

/// A client-only engine with one region of `len` bytes, activated.
pub fn client(len: usize) -> (Hixl<Connected>, Region) {
    let (e, r) = Hixl::initialize("127.0.0.1", Options::default())
        .unwrap()
        .register(HostBuffer::new(len).unwrap())
        .unwrap();
    (e.activate().unwrap(), r)
}
