//! Fuzz target `options`: see `fuzz/src/bodies.rs`. Run with
//! `cargo +nightly fuzz run options fuzz/corpus/options` from the repository root.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hixl_fuzz::options(data));
