//! HIXL-CS, HIXL's client/server mode (CANN's `include/cs/hixl_cs.h`), carried on hixl's own
//! engine instead of hcomm endpoints and channels: a [`Server`] registers memory under tags and
//! listens; a [`Client`] connects, fetches the server's tagged memory list, registers its own
//! memory, and PUTs (a WRITE) or GETs (a READ) batches of [`OpDesc`]s, synchronously or
//! asynchronously. The C ABI (`HixlCS*` in `libcann_hixl.so`, `hixl-capi/src/cs.rs`) is a
//! translation of this module: every rule below is checked here, once.
//!
//! What maps to what:
//!
//! - a server is an engine listening on `server_ip:server_port` ([`Server::listen`]: it is
//!   initialized there, so memory registered before is registered then). It publishes its
//!   endpoints and its tagged memory list in a read-only region of its own (`list.rs`, a
//!   [published table](crate::published)), rewritten at every registration;
//! - a client is a client-only engine. [`Client::connect`] connects it (the engine's
//!   handshake, region tables and transports: same-host or TCP for host memory, HCCL for device
//!   memory where ACL and HCCL load), READs the server's list, and matches the client's remote
//!   endpoint among the server's endpoints as upstream's server does ([`Endpoint::matches`];
//!   else `PARAM_INVALID`); [`Client::remote_mems`] READs the list again (reconnecting when
//!   the server registered memory the link's table lacks, or registered it again: the list
//!   gives each region's id in the server's engine);
//! - batches are engine transfers, PUT a WRITE and GET a READ; an async one gets a
//!   [`Completion`] (at most [`MAX_HANDLES`] unqueried, upstream's limit), which
//!   [`Client::query`] frees once it reports [`CompleteStatus::Completed`] or
//!   [`CompleteStatus::Failed`].
//!
//! Registrations and completions are [`MemHandle`]s and [`Completion`]s, numbers looked up in
//! the server's or client's tables: one that was freed, or never issued, is `PARAM_INVALID`.
//! Status codes ([`Error::code`]) are upstream's: `PARAM_INVALID` for bad arguments and
//! addresses, `TIMEOUT`, `FAILED` (the engine's `NOT_CONNECTED` and `ALREADY_CONNECTED`
//! included), `RESOURCE_EXHAUSTED`, `UNSUPPORTED`, and ACL's own code where an engine with a
//! device endpoint finds no device at start. A batch that failed or timed out latches the
//! client, as upstream's does: every later batch is `FAILED` until it is closed and created
//! again.
//!
//! The server's list in [`Client::remote_mems`] starts with one built-in region, tagged
//! [`BUILTIN_TAG`] as upstream's built-in completion flag is: here it is the published list
//! itself (read-only to clients).
//!
//! ```no_run
//! use std::net::Ipv4Addr;
//! use std::time::Duration;
//! use hixl::cs::{Client, ClientDesc, Endpoint, Mem, OpDesc, Server};
//! use hixl::{MemType, TransferOp};
//!
//! # fn main() -> Result<(), hixl::cs::Error> {
//! let ip = Ipv4Addr::LOCALHOST.into();
//! let mut kv = vec![0u8; 1 << 20];
//! let server = Server::new(ip, 26000, &[Endpoint::roce(ip)], None)?;
//! let mem = Mem { typ: MemType::Host, addr: kv.as_mut_ptr() as usize, size: kv.len() };
//! // SAFETY: `kv` outlives the server, and nothing reads it while clients write it.
//! unsafe { server.register(b"kv", mem) }?;
//! server.listen()?;
//!
//! let desc = ClientDesc {
//!     server_ip: ip,
//!     server_port: 26000,
//!     local_endpoint: Endpoint::roce(ip),
//!     remote_endpoint: Endpoint::roce(ip),
//! };
//! let client = Client::new(&desc, None)?;
//! client.connect(Duration::from_secs(5))?;
//! let remote = client.remote_mems(Duration::from_secs(5))?; // [built-in, kv]
//! let mut mine = vec![7u8; 4096];
//! let local = Mem { typ: MemType::Host, addr: mine.as_mut_ptr() as usize, size: mine.len() };
//! // SAFETY: `mine` outlives the client, and nothing touches it during batches.
//! unsafe { client.register(local) }?;
//! let put = OpDesc { remote_addr: remote[1].addr, local_addr: local.addr, len: 4096 };
//! client.batch_sync(TransferOp::Write, &[put], Duration::from_secs(5))?;
//! # Ok(())
//! # }
//! ```
//!
//! The code by job: this file holds the types and what the server and the client share;
//! `server.rs` the server (its registrations and the list it publishes); `client.rs` the
//! client (connect, the server's list, client registrations); `batch.rs` the batches (the
//! address checks, PUT/GET sync and async, completions, the failure latch); `config.rs` the
//! config's JSON; `list.rs` the list's encoding; `engine.rs` the engine under them (the core
//! floor's handle API, as the compat face's; the only file that names the engine).

use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{MemType, Status};

mod batch;
mod client;
mod config;
mod engine;
#[doc(hidden)]
pub mod list;
mod server;

pub use client::{Client, ClientDesc};
pub use list::{ENDPOINT_LEN, MAX_ENDPOINTS, MAX_MEMS, MAX_TAG};
pub use server::Server;

/// Most async batches a client has issued and not yet seen reported
/// [`CompleteStatus::Completed`] or [`CompleteStatus::Failed`] (upstream's host flag queue).
pub const MAX_HANDLES: usize = 4096;
/// The tag of the built-in region in the remote memory list.
pub const BUILTIN_TAG: &str = "_hixl_builtin_host_trans_flag";

/// A failed HIXL-CS call: the status code upstream's C API returns, and the cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (status {code})")]
pub struct Error {
    code: u32,
    message: String,
}

impl Error {
    /// The code: a HIXL status ([`Error::status`]), or ACL's own code where a device endpoint's
    /// engine found no device at start (107002 `ACL_ERROR_RT_CONTEXT_NULL`).
    pub fn code(&self) -> u32 {
        self.code
    }
    /// The code as a HIXL status, when it is one.
    pub fn status(&self) -> Option<Status> {
        Status::from_code(self.code)
    }
    /// The cause, for logs.
    pub fn message(&self) -> &str {
        &self.message
    }
    fn with(status: Status, message: impl Into<String>) -> Error {
        Error {
            code: status.code(),
            message: message.into(),
        }
    }
    fn invalid(message: impl Into<String>) -> Error {
        Error::with(Status::PARAM_INVALID, message)
    }
    fn failed(message: impl Into<String>) -> Error {
        Error::with(Status::FAILED, message)
    }
    fn timeout(message: impl Into<String>) -> Error {
        Error::with(Status::TIMEOUT, message)
    }
    fn exhausted(message: impl Into<String>) -> Error {
        Error::with(Status::RESOURCE_EXHAUSTED, message)
    }
}

/// A HIXL-CS result.
pub type Result<T> = std::result::Result<T, Error>;

/// An endpoint (`EndpointDesc`, 160 bytes: protocol, address, location, spare), kept as its
/// bytes: the same layout as the C type, so a C array of them is a slice of these.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// All of it.
    pub bytes: [u8; ENDPOINT_LEN],
}

impl Endpoint {
    /// A RoCE endpoint of `ip` (protocol 1; address type 0 with an IPv4 address, 1 with an
    /// IPv6 one) on the host (location 1), the rest zero: what a client and a server on hixl's
    /// TCP, same-host or HCCL paths name each other by.
    pub fn roce(ip: IpAddr) -> Endpoint {
        let mut bytes = [0u8; ENDPOINT_LEN];
        bytes[0..4].copy_from_slice(&1i32.to_ne_bytes());
        match ip {
            IpAddr::V4(a) => bytes[8..12].copy_from_slice(&a.octets()),
            IpAddr::V6(a) => {
                bytes[4..8].copy_from_slice(&1i32.to_ne_bytes());
                bytes[8..24].copy_from_slice(&a.octets());
            }
        }
        Endpoint { bytes }.at(1)
    }

    /// The same endpoint at location `location` (0 device, 1 host; anything else is refused
    /// where an endpoint is taken).
    pub fn at(mut self, location: i32) -> Endpoint {
        self.bytes[44..48].copy_from_slice(&location.to_ne_bytes());
        self
    }

    fn i32_at(&self, o: usize) -> i32 {
        let b = &self.bytes;
        i32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
    }

    /// The location (`EndpointLoc.locType` at byte 44): 0 device, 1 host; anything else is
    /// refused where an endpoint is taken.
    pub fn location(&self) -> i32 {
        self.i32_at(44)
    }

    /// How many bytes of the address union (at byte 8) name the endpoint, by protocol: HCCS's
    /// id (4), UBC_CTP/UBC_TP/UBG's EID (16), RoCE/UBOE's IPv4 (4) or IPv6 (16) address by
    /// its address type (at byte 4); 0 for other protocols (they match nothing).
    fn address_len(&self) -> usize {
        match self.i32_at(0) {
            0 => 4,          // HCCS: id
            4 | 5 | 9 => 16, // UBC_CTP, UBC_TP, UBG: eid
            1 | 7 => match self.i32_at(4) {
                0 => 4,
                1 => 16,
                _ => 0,
            },
            _ => 0,
        }
    }

    /// Whether its protocol names its address by type (RoCE, UBOE).
    fn typed(&self) -> bool {
        matches!(self.i32_at(0), 1 | 7)
    }

    /// Upstream's endpoint match (`EndpointStore::MatchEndpoint`): the same protocol, then
    /// HCCS by id, UBC_TP/UBC_CTP/UBG by EID, RoCE/UBOE by IPv4 or IPv6 address; other
    /// protocols match nothing.
    pub fn matches(&self, other: &Endpoint) -> bool {
        let n = self.address_len();
        self.i32_at(0) == other.i32_at(0)
            && (!self.typed() || self.i32_at(4) == other.i32_at(4))
            && n > 0
            && self.bytes[8..8 + n] == other.bytes[8..8 + n]
    }

    /// The endpoint as a server publishes it to every peer: its protocol, address type (RoCE,
    /// UBOE), the address bytes it is matched by ([`Endpoint::matches`]) and its location;
    /// every other byte zero. A C caller's `EndpointDesc` may hold anything in the bytes no
    /// call reads (a stack value not cleared by `EndpointDescInit`), which no peer may READ.
    pub fn published(&self) -> [u8; ENDPOINT_LEN] {
        let mut out = [0u8; ENDPOINT_LEN];
        out[0..4].copy_from_slice(&self.bytes[0..4]);
        if self.typed() {
            out[4..8].copy_from_slice(&self.bytes[4..8]);
        }
        let n = self.address_len();
        out[8..8 + n].copy_from_slice(&self.bytes[8..8 + n]);
        out[44..48].copy_from_slice(&self.bytes[44..48]);
        out
    }

    /// A location that is neither device (0) nor host (1): `PARAM_INVALID` naming `what`.
    fn check_location(&self, what: &str) -> Result<()> {
        match self.location() {
            0 | 1 => Ok(()),
            loc => Err(Error::invalid(format!(
                "{what}: location type {loc} is neither DEVICE nor HOST"
            ))),
        }
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("protocol", &self.i32_at(0))
            .field("location", &self.location())
            .finish_non_exhaustive()
    }
}

/// Memory to register (`CommMem`): its type and range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mem {
    /// Device or host memory.
    pub typ: MemType,
    /// The first byte (not 0).
    pub addr: usize,
    /// Bytes (not 0; the range must not wrap).
    pub size: usize,
}

impl Mem {
    /// `PARAM_INVALID` for a null, empty or wrapping range.
    fn check(&self) -> Result<()> {
        if self.addr == 0 || self.size == 0 || self.addr.checked_add(self.size).is_none() {
            return Err(Error::invalid(format!(
                "mem {:#x}+{} is empty, null or wraps",
                self.addr, self.size
            )));
        }
        Ok(())
    }
}

/// One region of a server's memory list, as [`Client::remote_mems`] gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteMem {
    /// Device or host memory.
    pub typ: MemType,
    /// The first byte, in the server's address space.
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// The tag it was registered under (no NUL inside).
    pub tag: Vec<u8>,
}

/// One descriptor of a batch (`HixlOneSideOpDesc`): `len` bytes at `remote_addr` in the
/// server and at `local_addr` here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpDesc {
    /// In the server: inside one range of its memory list.
    pub remote_addr: u64,
    /// In this process: inside one range registered with [`Client::register`].
    pub local_addr: usize,
    /// Bytes (not 0).
    pub len: u64,
}

/// An async batch's state (`HixlCompleteStatus`, upstream's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum CompleteStatus {
    /// Still running.
    Waiting = 0,
    /// Done: the bytes moved.
    Completed = 1,
    /// It failed, or passed the engine's deadline (upstream's query never reports a timeout).
    Failed = 3,
}

/// A registration of a server or a client: a number in its table (the C ABI's `MemHandle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemHandle(u64);

/// An async batch of a client: a number in its table (the C ABI's `CompleteHandle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Completion(u64);

macro_rules! raw_handle {
    ($t:ident) => {
        impl $t {
            /// The number (never 0).
            pub fn into_raw(self) -> u64 {
                self.0
            }
            /// A number as a handle: one that was never issued, or was freed, is refused
            /// (`PARAM_INVALID`) by the call that takes it.
            pub fn from_raw(raw: u64) -> $t {
                $t(raw)
            }
            fn next() -> $t {
                $t(next_id())
            }
        }
    };
}
raw_handle!(MemHandle);
raw_handle!(Completion);

static_assertions::assert_impl_all!(Server: Send, Sync);
static_assertions::assert_impl_all!(Client: Send, Sync);

/// Numbers for handles, unique in the process (multiples of 16 from 2^32: never 0, never a
/// small integer a caller makes up, apart from the C ABI's own handle numbers).
fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1 << 32);
    NEXT.fetch_add(16, Ordering::Relaxed)
}

/// Whether `[a, a+al)` and `[b, b+bl)` share a byte.
fn overlaps(a: usize, al: usize, b: usize, bl: usize) -> bool {
    a < b + bl && b < a + al
}

/// The list's `CommMemType` of a memory type (0 device, 1 host).
fn comm_type(t: MemType) -> i32 {
    match t {
        MemType::Device => 0,
        MemType::Host => 1,
    }
}

/// The memory type of the list's `CommMemType` (the decoder lets only 0 and 1 through).
fn mem_type(typ: i32) -> MemType {
    if typ == 0 {
        MemType::Device
    } else {
        MemType::Host
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(protocol: i32, addr_type: i32, addr: &[u8]) -> Endpoint {
        let mut e = [0xffu8; ENDPOINT_LEN];
        e[0..4].copy_from_slice(&protocol.to_ne_bytes());
        e[4..8].copy_from_slice(&addr_type.to_ne_bytes());
        e[8..8 + addr.len()].copy_from_slice(addr);
        e[44..48].copy_from_slice(&1i32.to_ne_bytes());
        Endpoint { bytes: e }
    }

    #[test]
    fn endpoints_match_as_upstream() {
        let roce = ep(1, 0, &[127, 0, 0, 1]);
        assert!(roce.matches(&ep(1, 0, &[127, 0, 0, 1])));
        assert!(!roce.matches(&ep(1, 0, &[127, 0, 0, 2])));
        assert!(!roce.matches(&ep(7, 0, &[127, 0, 0, 1])));
        assert!(!roce.matches(&ep(1, 1, &[127, 0, 0, 1])));
        assert!(ep(0, 2, &[5, 0, 0, 0]).matches(&ep(0, 3, &[5, 0, 0, 0])));
        assert!(ep(4, 3, &[9; 16]).matches(&ep(4, 3, &[9; 16])));
        let v4 = Endpoint::roce([127, 0, 0, 1].into());
        assert!(v4.matches(&roce) && v4.location() == 1 && v4.at(0).location() == 0);
        let v6 = Endpoint::roce(std::net::Ipv6Addr::LOCALHOST.into());
        assert!(v6.matches(&v6) && !v6.matches(&v4));
        assert!(!ep(2, 0, &[1; 4]).matches(&ep(2, 0, &[1; 4])));
        assert_eq!(roce.location(), 1);
        assert!(roce.check_location("e").is_ok());
        let mut odd = roce;
        odd.bytes[44..48].copy_from_slice(&2i32.to_ne_bytes());
        assert_eq!(
            odd.check_location("e").unwrap_err().status(),
            Some(Status::PARAM_INVALID)
        );
    }

    /// A server publishes of an endpoint what names it, and zeroes everything else a C caller
    /// left in it (here 0xAB in every byte): each protocol's published form still matches
    /// the endpoint, and holds none of the other bytes.
    #[test]
    fn published_endpoints_hold_only_what_names_them() {
        for (protocol, typ, kept) in [
            (1i32, 0i32, 4usize), // RoCE IPv4
            (1, 1, 16),           // RoCE IPv6
            (7, 0, 4),            // UBOE IPv4
            (0, 9, 4),            // HCCS id (the address type not published)
            (5, 9, 16),           // UBC_TP eid
            (3, 0, 0),            // a protocol nothing matches: no address
        ] {
            let mut e = Endpoint {
                bytes: [0xAB; ENDPOINT_LEN],
            };
            e.bytes[0..4].copy_from_slice(&protocol.to_ne_bytes());
            e.bytes[4..8].copy_from_slice(&typ.to_ne_bytes());
            let e = e.at(1);
            let p = Endpoint {
                bytes: e.published(),
            };
            assert_eq!(p.matches(&e), kept > 0, "protocol {protocol}");
            assert_eq!(p.location(), 1);
            for (i, &b) in p.bytes.iter().enumerate() {
                let named = i < 4
                    || (4..8).contains(&i) && matches!(protocol, 1 | 7)
                    || (8..8 + kept).contains(&i)
                    || (44..48).contains(&i);
                if !named {
                    assert_eq!(b, 0, "protocol {protocol}: byte {i} published");
                }
            }
        }
    }

    #[test]
    fn handles_are_distinct_and_never_small() {
        let (a, b) = (MemHandle::next(), Completion::next());
        assert_ne!(a.into_raw(), b.into_raw());
        assert!(a.into_raw() >= 1 << 32 && a.into_raw() % 16 == 0);
        assert_eq!(MemHandle::from_raw(a.into_raw()), a);
    }
}
