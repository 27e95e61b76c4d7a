//! The control plane, common to every transport: the server that accepts and admits peers and
//! keeps the region table and link registry (`server`), each connection's handshake and frame
//! dispatch (`dispatch`), and the bounds the server keeps (`limits`).

pub(crate) mod dispatch;
pub(crate) mod limits;
pub(crate) mod server;
