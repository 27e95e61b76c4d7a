//! Fuzz target `notify`: see `fuzz/src/bodies.rs`. Run with
//! `cargo +nightly fuzz run notify fuzz/corpus/notify` from the repository root.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hixl_fuzz::notify(data));
