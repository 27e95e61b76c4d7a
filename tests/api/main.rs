//! The engine's API across two engines: transfers, async requests and notifications, every bad
//! input's exact error, and keys (one test crate; each module is one former test file).

#[path = "../common/mod.rs"]
mod common;

mod async_api;
mod auth;
mod blocks;
mod errors;
mod transfer;
