//! The fuzz targets' bodies (`bodies.rs`, also compiled into the main crate's
//! `tests/fuzz_corpus.rs`, which replays the checked-in corpus on stable).

mod bodies;
pub use bodies::*;
