//! The runtime under the API: the engine core, the link core, the executor, the region
//! records and the control plane (`control/`).

pub(crate) mod connect;
pub(crate) mod control;
pub(crate) mod engine;
pub(crate) mod executor;
pub(crate) mod link;
pub(crate) mod region;
pub(crate) mod request;
pub(crate) mod transports;
