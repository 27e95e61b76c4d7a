//! The TCP transport: works between any two hosts, and is every link's control channel.
//!
//! A link is one or more *lanes* (TCP connections, [`lane`]): the first one opens the link
//! (HELLO, WELCOME with the peer's region table, and the other transports' setup frames), and
//! later ones JOIN it. The link's [`Lanes`] are its pool of them, with the failure policy: which
//! failure leaves a lane reusable, which closes it, and which breaks the link (the peer went
//! away). The control plane sends NOTIFY, PING and BYE on them; [`TcpPath`] is TCP's
//! [`DataPath`](crate::transport::DataPath), the last a link tries, which covers every batch:
//! a transfer takes a lane for itself and moves its whole batch in one round trip (a large sync
//! batch is split across several lanes), so no lock is held across network I/O. The serving
//! half ([`serve`]) applies XFER requests on the server's connections, against the regions the
//! control plane's server admits.

mod lane;
mod lanes;
mod path;
pub(crate) mod serve;
pub(crate) use lanes::{FirstLane, Join, Lanes};
pub(crate) use path::TcpPath;
