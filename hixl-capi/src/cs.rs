//! HIXL-CS, HIXL's client/server C API (`include/cs/hixl_cs.h`: the 16 `HixlCS*` functions),
//! carried on hixl's own engine ([`hixl_rs::compat::Hixl`]) instead of hcomm endpoints and
//! channels. What maps to what:
//!
//! - a server is an engine listening on `server_ip:server_port` (from `HixlCSServerListen`; it
//!   is initialized there, so memory registered before is registered then). It publishes its
//!   endpoints and its tagged memory list in a read-only region of its own (`table.rs`),
//!   rewritten at every registration;
//! - a client is a client-only engine. `HixlCSClientConnect` connects it (the engine's
//!   handshake, region tables and transports: same-host or TCP for host memory, HCCL for device
//!   memory where ACL and HCCL load), READs the server's list, and matches `remote_endpoint`
//!   among the server's endpoints as upstream's server does (same protocol; HCCS by id, UB by
//!   EID, RoCE/UBOE by IP address; else `PARAM_INVALID`); `HixlCSClientGetRemoteMem` READs
//!   the list again (reconnecting when the server registered memory the link's table lacks);
//! - batches are engine transfers, PUT a WRITE and GET a READ; async ones get a handle from a
//!   per-client table (at most [`MAX_HANDLES`] unqueried, upstream's limit), which a status
//!   query frees once it reports COMPLETED or FAILED.
//!
//! Handles (server, client, memory, completion) are keys in tables, never dereferenced: a
//! handle that was destroyed, freed, or never issued gives `PARAM_INVALID`. Status codes are
//! upstream's: `PARAM_INVALID` for bad arguments and addresses, `TIMEOUT`, `FAILED` (the
//! engine's `NOT_CONNECTED` and `ALREADY_CONNECTED` included), `RESOURCE_EXHAUSTED`,
//! `UNSUPPORTED`. A batch that failed or timed out latches the client, as upstream's does:
//! every later batch is `FAILED` until it is destroyed and created again.
//!
//! The server's list in `HixlCSClientGetRemoteMem` starts with one built-in region, tagged
//! `_hixl_builtin_host_trans_flag` as upstream's built-in completion flag is: here it is the
//! published list itself (read-only to clients).
//!
//! The code by job: this file holds the C types, the handle tables and what the server and the
//! client share; `server.rs` the server (its registrations and the list it publishes);
//! `client.rs` the client (connect, the server's list, client registrations, the address
//! checks of a batch); `batch.rs` the batches (PUT/GET sync and async, completion handles, the
//! failure latch); `config.rs` the config's JSON; `table.rs` the list's encoding.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, c_char, c_void};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use hixl_rs::compat;
use hixl_rs::{MemType, Status};

use super::{Fail, NEXT_HANDLE, R, invalid};

mod batch;
mod client;
mod config;
mod server;
mod table;

pub use batch::{
    HixlCSClientBatchGetAsync, HixlCSClientBatchGetSync, HixlCSClientBatchPutAsync,
    HixlCSClientBatchPutSync, HixlCSClientQueryCompleteStatus,
};
pub use client::{
    HixlCSClientConnect, HixlCSClientCreate, HixlCSClientDestroy, HixlCSClientGetRemoteMem,
    HixlCSClientRegMem, HixlCSClientUnregMem,
};
pub use server::{
    HixlCSServerCreate, HixlCSServerDestroy, HixlCSServerListen, HixlCSServerRegMem,
    HixlCSServerUnregMem,
};

use client::Client;
use server::Server;
use table::ENDPOINT_LEN;

/// Most async batches a client has issued and not yet seen reported COMPLETED or FAILED
/// (upstream's host flag queue).
pub const MAX_HANDLES: usize = 4096;
/// The tag of the built-in region in the remote memory list.
const BUILTIN_TAG: &str = "_hixl_builtin_host_trans_flag";

const TIMEOUT: u32 = 103_901;
const FAILED: u32 = 503_900;

/// `CommMem`: `{CommMemType type; void *addr; uint64_t size}` (24 bytes on LP64); the address
/// as an integer, so the client's arrays of them are `Send`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CommMem {
    /// `COMM_MEM_TYPE_DEVICE` 0, `COMM_MEM_TYPE_HOST` 1.
    pub typ: i32,
    /// The first byte.
    pub addr: usize,
    /// Bytes.
    pub size: u64,
}

/// `EndpointDesc`: 160 bytes (protocol, address, location, spare), read as bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EndpointDesc {
    /// All of it.
    pub bytes: [u8; ENDPOINT_LEN],
}

/// `HixlServerDesc` (128 bytes).
#[repr(C)]
pub struct HixlServerDesc {
    /// `endpoint_list_num` endpoints.
    pub endpoint_list: *const EndpointDesc,
    /// The control address to listen on.
    pub server_ip: *const c_char,
    /// Its port (0: none).
    pub server_port: u32,
    /// Endpoints in `endpoint_list`.
    pub endpoint_list_num: u32,
    /// Reserved.
    pub reserved: [u8; 104],
}

/// `HixlClientDesc` (128 bytes).
#[repr(C)]
pub struct HixlClientDesc {
    /// The client's endpoint.
    pub local_endpoint: *const EndpointDesc,
    /// The server endpoint it asks for.
    pub remote_endpoint: *const EndpointDesc,
    /// The server's control address.
    pub server_ip: *const c_char,
    /// Its port (1..=65535).
    pub server_port: u32,
    /// RDMA traffic class.
    pub tc: u8,
    /// RDMA service level.
    pub sl: u8,
    /// Reserved.
    pub reserved: [u8; 98],
}

/// `HixlServerConfig` and `HixlClientConfig` (128 bytes).
#[repr(C)]
pub struct HixlConfig {
    /// Null, "" or a JSON object.
    pub global_resource_config: *const c_char,
    /// Reserved.
    pub reserved: [u8; 120],
}

/// `HixlOneSideOpDesc`: the server's range first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HixlOneSideOpDesc {
    /// In the server.
    pub remote_buf: *mut c_void,
    /// In this process.
    pub local_buf: *mut c_void,
    /// Bytes.
    pub len: u64,
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::offset_of;
    assert!(size_of::<CommMem>() == 24 && offset_of!(CommMem, addr) == 8);
    assert!(size_of::<EndpointDesc>() == 160);
    assert!(size_of::<HixlServerDesc>() == 128 && offset_of!(HixlServerDesc, reserved) == 24);
    assert!(size_of::<HixlClientDesc>() == 128 && offset_of!(HixlClientDesc, tc) == 28);
    assert!(offset_of!(HixlClientDesc, reserved) == 30);
    assert!(size_of::<HixlConfig>() == 128);
    assert!(size_of::<HixlOneSideOpDesc>() == 24);
    assert!(size_of::<usize>() == size_of::<*mut c_char>());
};

// ---------------------------------------------------------------------------------------------
// handles

fn next_handle() -> u64 {
    NEXT_HANDLE.fetch_add(16, Ordering::Relaxed) as u64
}

type Table2<T> = Mutex<HashMap<usize, Arc<T>>>;

fn servers() -> &'static Table2<Server> {
    static T: OnceLock<Table2<Server>> = OnceLock::new();
    T.get_or_init(Default::default)
}

fn clients() -> &'static Table2<Client> {
    static T: OnceLock<Table2<Client>> = OnceLock::new();
    T.get_or_init(Default::default)
}

fn lookup<T>(t: &Table2<T>, h: *mut c_void, what: &str) -> R<Arc<T>> {
    t.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(h as usize))
        .cloned()
        .ok_or_else(|| invalid(format!("{h:p} is not a live HIXL-CS {what} handle")))
}

fn insert<T>(t: &Table2<T>, v: T) -> usize {
    let key = next_handle() as usize;
    t.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, Arc::new(v));
    key
}

/// The compat engine's error with HIXL-CS's codes (the engine's connection statuses are FAILED).
fn cs_fail(e: compat::Error) -> Fail {
    let code = match e.status() {
        s if s == Status::PARAM_INVALID
            || s == Status::TIMEOUT
            || s == Status::RESOURCE_EXHAUSTED
            || s == Status::UNSUPPORTED =>
        {
            s.code()
        }
        _ => FAILED,
    };
    (code, e.message().to_owned())
}

/// A client engine that could not start, or a server whose device endpoints found no device:
/// ACL's own code where reading the device failed (as upstream's `HIXL_CHK_ACL_RET` on
/// `aclrtGetDevice` returns it), else as [`cs_fail`].
fn cs_start_fail(e: compat::Error) -> Fail {
    match crate::start_fail(e.clone()) {
        (code, msg) if Status::from_code(code).is_none() => (code, msg),
        _ => cs_fail(e),
    }
}

fn failed(msg: impl Into<String>) -> Fail {
    (FAILED, msg.into())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// # Safety
/// `s` is null or a NUL-terminated string.
unsafe fn opt_cstr(s: *const c_char) -> Option<Vec<u8>> {
    // SAFETY: not null, and NUL-terminated by the caller's contract.
    (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_bytes().to_vec())
}

/// # Safety
/// `s` is null or a NUL-terminated string.
unsafe fn ip(s: *const c_char) -> R<IpAddr> {
    // SAFETY: the caller's contract.
    let s = unsafe { super::string(s, "server_ip") }?;
    s.parse()
        .map_err(|_| invalid(format!("server_ip {s:?} is not an IP address")))
}

/// `ip:port`, or `[ip]:port`.
fn engine_name(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// # Safety
/// `config` is null or readable; its string null or NUL-terminated.
unsafe fn read_config(config: *const HixlConfig, side: config::Side) -> R<Vec<(String, String)>> {
    if config.is_null() {
        return Err(invalid("config is null"));
    }
    // SAFETY: not null, readable by the caller's contract.
    let c = unsafe { config.read_unaligned() };
    // SAFETY: the caller's contract.
    let text = unsafe { opt_cstr(c.global_resource_config) };
    let text = match &text {
        Some(b) => Some(
            std::str::from_utf8(b).map_err(|_| invalid("global_resource_config is not UTF-8"))?,
        ),
        None => None,
    };
    config::check(text, side).map_err(invalid)
}

/// # Safety
/// `mem` is null or readable.
unsafe fn read_mem(mem: *const CommMem) -> R<(MemType, usize, usize)> {
    if mem.is_null() {
        return Err(invalid("mem is null"));
    }
    // SAFETY: not null, readable by the caller's contract (the type is read as a plain i32).
    let m = unsafe { mem.read_unaligned() };
    let t = match m.typ {
        0 => MemType::Device,
        1 => MemType::Host,
        v => {
            return Err(invalid(format!(
                "mem type {v} is not COMM_MEM_TYPE_DEVICE (0) or COMM_MEM_TYPE_HOST (1)"
            )));
        }
    };
    let size = usize::try_from(m.size).map_err(|_| invalid("mem size overflows"))?;
    if m.addr == 0 || size == 0 || m.addr.checked_add(size).is_none() {
        return Err(invalid(format!(
            "mem {:#x}+{} is empty, null or wraps",
            m.addr, m.size
        )));
    }
    Ok((t, m.addr, size))
}

/// Whether `[a, a+al)` and `[b, b+bl)` share a byte.
fn overlaps(a: usize, al: usize, b: usize, bl: usize) -> bool {
    a < b + bl && b < a + al
}

/// Upstream's endpoint match (`EndpointStore::MatchEndpoint`): the same protocol, then HCCS by
/// id, UBC_TP/UBC_CTP/UBG by EID, RoCE/UBOE by IPv4 or IPv6 address; other protocols match
/// nothing.
fn endpoint_matches(a: &[u8; ENDPOINT_LEN], b: &[u8; ENDPOINT_LEN]) -> bool {
    let i32_at =
        |e: &[u8; ENDPOINT_LEN], o: usize| i32::from_ne_bytes([e[o], e[o + 1], e[o + 2], e[o + 3]]);
    let protocol = i32_at(a, 0);
    if protocol != i32_at(b, 0) {
        return false;
    }
    // commAddr at 4: type (4 bytes), then the union at 8
    let union = |e: &[u8; ENDPOINT_LEN], n: usize| e[8..8 + n].to_vec();
    match protocol {
        0 => union(a, 4) == union(b, 4),           // HCCS: id
        4 | 5 | 9 => union(a, 16) == union(b, 16), // UBC_CTP, UBC_TP, UBG: eid
        1 | 7 => {
            // RoCE, UBOE: by address type
            let t = i32_at(a, 4);
            t == i32_at(b, 4)
                && match t {
                    0 => union(a, 4) == union(b, 4),
                    1 => union(a, 16) == union(b, 16),
                    _ => false,
                }
        }
        _ => false,
    }
}

/// The server's ranges (the built-in one, then its list) by start address, with their ends;
/// `Err` when two overlap (the list comes from the peer).
fn disjoint(builtin: (u64, u64), mems: &[table::Mem]) -> Result<BTreeMap<u64, u64>, String> {
    let mut ranges = BTreeMap::new();
    for (addr, size) in std::iter::once(builtin).chain(mems.iter().map(|m| (m.addr, m.size))) {
        let end = addr
            .checked_add(size)
            .filter(|_| size > 0)
            .ok_or_else(|| format!("the server's region {addr:#x}+{size} is empty or wraps"))?;
        // the range starting last before `end` is the one that would overlap, if any does
        if let Some((&a, &e)) = ranges.range(..end).next_back()
            && e > addr
        {
            return Err(format!(
                "the server's region {addr:#x}+{size} overlaps its region {a:#x}+{}",
                e - a
            ));
        }
        ranges.insert(addr, end);
    }
    Ok(ranges)
}

/// The location of an endpoint: 0 device, 1 host (`EndpointLoc.locType` at 44).
fn endpoint_loc(e: &[u8; ENDPOINT_LEN]) -> i32 {
    i32::from_ne_bytes([e[44], e[45], e[46], e[47]])
}

fn millis(t: u32) -> i32 {
    i32::try_from(t).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(protocol: i32, addr_type: i32, addr: &[u8]) -> [u8; ENDPOINT_LEN] {
        let mut e = [0xffu8; ENDPOINT_LEN];
        e[0..4].copy_from_slice(&protocol.to_ne_bytes());
        e[4..8].copy_from_slice(&addr_type.to_ne_bytes());
        e[8..8 + addr.len()].copy_from_slice(addr);
        e[44..48].copy_from_slice(&1i32.to_ne_bytes());
        e
    }

    #[test]
    fn server_ranges_must_be_disjoint() {
        let m = |addr, size| table::Mem {
            typ: 1,
            addr,
            size,
            tag: Vec::new(),
        };
        let ok = disjoint(
            (0x1000, 0x100),
            &[m(0x2000, 0x100), m(0x1100, 0xf00), m(0x3000, 1)],
        );
        assert_eq!(ok.unwrap().len(), 4);
        for bad in [
            vec![m(0x1000, 0x100)],                  // the built-in one again
            vec![m(0x10ff, 2)],                      // straddles its end
            vec![m(0x800, 0x900)],                   // straddles its start
            vec![m(0x2000, 0x100), m(0x2010, 0x10)], // inside another
            vec![m(0x2010, 0x10), m(0x2000, 0x100)], // around another
            vec![m(0x3000, 0)],                      // empty
            vec![m(u64::MAX - 1, 4)],                // wraps
        ] {
            assert!(disjoint((0x1000, 0x100), &bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn endpoints_match_as_upstream() {
        let roce = ep(1, 0, &[127, 0, 0, 1]);
        assert!(endpoint_matches(&roce, &ep(1, 0, &[127, 0, 0, 1])));
        assert!(!endpoint_matches(&roce, &ep(1, 0, &[127, 0, 0, 2])));
        assert!(!endpoint_matches(&roce, &ep(7, 0, &[127, 0, 0, 1])));
        assert!(!endpoint_matches(&roce, &ep(1, 1, &[127, 0, 0, 1])));
        assert!(endpoint_matches(
            &ep(0, 2, &[5, 0, 0, 0]),
            &ep(0, 3, &[5, 0, 0, 0])
        ));
        assert!(endpoint_matches(&ep(4, 3, &[9; 16]), &ep(4, 3, &[9; 16])));
        assert!(!endpoint_matches(&ep(2, 0, &[1; 4]), &ep(2, 0, &[1; 4])));
        assert_eq!(endpoint_loc(&roce), 1);
    }
}
