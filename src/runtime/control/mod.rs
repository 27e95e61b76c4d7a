//! The control plane, common to every transport: the server that accepts and admits peers and
//! keeps the region table and link registry (`server`), its one poller thread (`poller`), which
//! runs every handshake (`handshake`) and holds idle lanes, the workers' frame dispatch
//! (`dispatch`), the connection as it moves between them (`conn`), and the bounds the server
//! keeps (`limits`).

pub(crate) mod conn;
pub(crate) mod dispatch;
pub(crate) mod handshake;
pub(crate) mod limits;
pub(crate) mod poller;
pub(crate) mod server;
