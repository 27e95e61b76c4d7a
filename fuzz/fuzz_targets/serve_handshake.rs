//! Fuzz target `serve_handshake`: the serving engine's handshake machine over whole frame
//! sequences; see `fuzz/src/bodies.rs`. Run with
//! `cargo +nightly fuzz run serve_handshake fuzz/corpus/serve_handshake` from the repository root.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hixl_fuzz::serve_handshake(data));
