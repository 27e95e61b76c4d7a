//! The runtime under the API: the engine core, the link core, the executor, the region
//! records, the serving engine (`serve/`) and revocation (`revoke/`: fences, quarantine).

pub(crate) mod connect;
pub(crate) mod engine;
pub(crate) mod executor;
pub(crate) mod link;
pub(crate) mod region;
pub(crate) mod request;
pub(crate) mod revoke;
pub(crate) mod serve;
pub(crate) mod transports;
