//! HIXL-CS in Rust (`hixl::cs`, the library the `HixlCS*` C ABI translates): the server's and
//! the client's rules with their exact statuses, random data PUT and GET sync and async,
//! completions, the failure latch, memory registered after connect, and a server in another
//! process (`hixl-peer cs-serve`) stopped under a batch (one test crate; the C program over the
//! same library is `hixl-capi/tests/cs.rs`).

#[path = "../common/mod.rs"]
mod common;

mod batches;
mod clients;
mod servers;
mod support;
mod two_processes;
