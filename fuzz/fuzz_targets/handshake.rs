//! Fuzz target `handshake`: see `fuzz/src/bodies.rs`. Run with
//! `cargo +nightly fuzz run handshake fuzz/corpus/handshake` from the repository root.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hixl_fuzz::handshake(data));
