//! Soundness of one-sided access across two processes: once `deactivate`, `deregister`,
//! `finalize` or drop returns, nothing of the engine (same-host clients, forgotten requests)
//! touches the memory again (one test crate; each module is one former test file).

#[path = "../common/mod.rs"]
mod common;

mod finalize;
mod soundness;
