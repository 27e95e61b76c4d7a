//! Fuzz target `table`: see `fuzz/src/bodies.rs`. Run with
//! `cargo +nightly fuzz run table fuzz/corpus/table` from the repository root.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hixl_fuzz::table(data));
