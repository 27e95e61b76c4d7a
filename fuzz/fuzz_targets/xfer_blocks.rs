//! Fuzz target `xfer_blocks`: see `fuzz/src/bodies.rs`. Run with
//! `cargo +nightly fuzz run xfer_blocks fuzz/corpus/xfer_blocks` from the repository root.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hixl_fuzz::xfer_blocks(data));
