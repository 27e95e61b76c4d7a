//! The transports across two processes: same-host, UCX (fenced on one host), TCP to a
//! `hixl-peer` child, and the faults each survives (one test crate; each module is one former
//! test file).

#[path = "../common/mod.rs"]
mod common;

mod cross_process;
mod faults;
mod fenced_ucx;
mod prefault;
mod same_host;
mod ucx;
