//! Fuzz target `decode`: see `fuzz/src/bodies.rs`. Run with
//! `cargo +nightly fuzz run decode fuzz/corpus/decode` from the repository root.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hixl_fuzz::decode(data));
