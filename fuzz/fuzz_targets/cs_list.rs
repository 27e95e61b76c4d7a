//! Fuzz target `cs_list`: see `fuzz/src/bodies.rs`. Run with
//! `cargo +nightly fuzz run cs_list fuzz/corpus/cs_list` from the repository root.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hixl_fuzz::cs_list(data));
