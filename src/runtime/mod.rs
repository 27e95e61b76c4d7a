//! The core floor under every face: its handle API (`handle.rs`: engines, regions, links and
//! requests as handles) and the client-side batch checks (`check.rs`) over the engine core, the
//! link core, the executor, the region records, the serving engine (`serve/`) and revocation
//! (`revoke/`: fences, quarantine).

pub(crate) mod address;
pub(crate) mod check;
pub(crate) mod connect;
pub(crate) mod engine;
pub(crate) mod executor;
pub(crate) mod handle;
pub(crate) mod link;
pub(crate) mod named;
pub(crate) mod peers;
pub(crate) mod region;
pub(crate) mod request;
pub(crate) mod revoke;
pub(crate) mod serve;
pub(crate) mod transports;
