//! Fuzz target `device`: see `fuzz/src/bodies.rs`. Run with
//! `cargo +nightly fuzz run device fuzz/corpus/device` from the repository root.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hixl_fuzz::device(data));
