//! Fuzz target `ucx_info`: see `fuzz/src/bodies.rs`. Run with
//! `cargo +nightly fuzz run ucx_info fuzz/corpus/ucx_info` from the repository root.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hixl_fuzz::ucx_info(data));
