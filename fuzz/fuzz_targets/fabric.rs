//! Fuzz target `fabric`: see `fuzz/src/bodies.rs`. Run with
//! `cargo +nightly fuzz run fabric fuzz/corpus/fabric` from the repository root.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hixl_fuzz::fabric(data));
