//! Transports: how bytes move once a link exists.
//!
//! The control plane (handshake, region tables, disconnect) is common to all transports and
//! speaks the [`wire`](crate::wire) protocol over TCP. Data moves over TCP; between engines on one
//! host over the same-host transport (`cma`); over UCX (`ucx/`) when both engines ask for it;
//! over HCCL (`ascend/`) between Ascend engines. Vendor libraries are loaded at run time
//! (`crate::dl`); [`probe`] reports what is available.

pub(crate) mod ascend;
pub(crate) mod fence;
pub(crate) mod host;
pub(crate) mod tcp;
pub(crate) mod ucx;

/// The transports hixl knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportKind {
    /// TCP, between any two hosts.
    Tcp,
    /// Same host, one-sided (shared mappings, `/proc/PID/mem`, `process_vm_readv`).
    Cma,
    /// UCX (RDMA verbs, tcp, shared memory), loaded at run time.
    Ucx,
    /// Ascend ACL + HCCL, loaded at run time.
    Ascend,
}

/// Whether a transport can be used here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportInfo {
    /// The transport.
    pub kind: TransportKind,
    /// Whether it can be used.
    pub available: bool,
    /// Why not, or what it runs on.
    pub detail: &'static str,
}

/// Which transports this build and this machine provide. Never panics, has no side effects
/// (the Ascend libraries are opened once, to check their symbols, and nothing is initialised;
/// the answer is kept for the life of the process).
pub fn probe() -> Vec<TransportInfo> {
    vec![
        TransportInfo {
            kind: TransportKind::Tcp,
            available: true,
            detail: "built in",
        },
        match host::available() {
            Ok(()) => TransportInfo {
                kind: TransportKind::Cma,
                available: true,
                detail: "pidfd, sealed memfd mappings and process_vm_readv/writev (per peer: same boot id and pid namespace, and ptrace rights)",
            },
            Err(why) => TransportInfo {
                kind: TransportKind::Cma,
                available: false,
                detail: why,
            },
        },
        match ucx::ffi::ucp() {
            Ok(_) => TransportInfo {
                kind: TransportKind::Ucx,
                available: true,
                detail: "libucp loaded (UCP RMA; UCX_TLS and UCX_NET_DEVICES choose the devices); needs Options::psk",
            },
            Err(_) => TransportInfo {
                kind: TransportKind::Ucx,
                available: false,
                detail: "libucp.so.0 (UCX 1.13 or later) cannot be loaded; set HIXL_UCX_LIB or install UCX",
            },
        },
        match ascend::probe() {
            Ok(detail) => TransportInfo {
                kind: TransportKind::Ascend,
                available: true,
                detail,
            },
            Err(detail) => TransportInfo {
                kind: TransportKind::Ascend,
                available: false,
                detail,
            },
        },
    ]
}
