//! The control plane, common to every transport: the server that accepts, authenticates and
//! admits peers and dispatches their frames (`server`), and the bounds it keeps (`limits`).

pub(crate) mod limits;
pub(crate) mod server;
