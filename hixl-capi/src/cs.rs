//! HIXL-CS, HIXL's client/server C API (`include/cs/hixl_cs.h`: the 16 `HixlCS*` functions),
//! over [`hixl_rs::cs`], where HIXL-CS lives: the server, the client, the memory list, the
//! batches and every rule they check (see that module for what maps to what). This module only
//! translates: C pointers and out-pointers, C strings (UTF-8, the IP address), the C structs to
//! and from the library's types, and handles to and from tables; it checks nothing the library
//! checks.
//!
//! Handles: a server or client handle is a key in a table here, never dereferenced (one that
//! was destroyed, or never issued, gives `PARAM_INVALID`); memory and completion handles are
//! the library's numbers ([`cs::MemHandle`], [`cs::Completion`]), which it looks up the same
//! way. The arrays `HixlCSClientGetRemoteMem` hands out are kept beside the client here, until
//! the next call or its destruction, as the header says.
//!
//! The code by job: this file holds the C types, the handle tables and the translations the
//! functions share; `server.rs`, `client.rs` and `batch.rs` the `extern "C"` functions.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use hixl_rs::MemType;
use hixl_rs::cs;

use super::{Fail, NEXT_HANDLE, R, invalid};

mod batch;
mod client;
mod server;

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

/// `EndpointDesc`: 160 bytes (protocol, address, location, spare), read as bytes: the
/// library's type, whose layout is the C type's.
pub type EndpointDesc = cs::Endpoint;

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
    assert!(size_of::<EndpointDesc>() == 160 && align_of::<EndpointDesc>() == 1);
    assert!(size_of::<HixlServerDesc>() == 128 && offset_of!(HixlServerDesc, reserved) == 24);
    assert!(size_of::<HixlClientDesc>() == 128 && offset_of!(HixlClientDesc, tc) == 28);
    assert!(offset_of!(HixlClientDesc, reserved) == 30);
    assert!(size_of::<HixlConfig>() == 128);
    assert!(size_of::<HixlOneSideOpDesc>() == 24);
    assert!(size_of::<usize>() == size_of::<*mut c_char>());
};

// ---------------------------------------------------------------------------------------------
// handles

/// A client and what `HixlCSClientGetRemoteMem` last handed out (the C arrays live here until
/// the next call or the client's destruction).
struct CClient {
    client: cs::Client,
    out: Mutex<RemoteMems>,
}

/// The C form of the server's list: the `CommMem` array, the tags and the array of pointers
/// to them.
#[derive(Default)]
struct RemoteMems {
    mems: Vec<CommMem>,
    tags: Vec<CString>,
    tag_ptrs: Vec<usize>,
}

type Table<T> = Mutex<HashMap<usize, Arc<T>>>;

fn servers() -> &'static Table<cs::Server> {
    static T: OnceLock<Table<cs::Server>> = OnceLock::new();
    T.get_or_init(Default::default)
}

fn clients() -> &'static Table<CClient> {
    static T: OnceLock<Table<CClient>> = OnceLock::new();
    T.get_or_init(Default::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn lookup<T>(t: &Table<T>, h: *mut c_void, what: &str) -> R<Arc<T>> {
    lock(t)
        .get(&(h as usize))
        .cloned()
        .ok_or_else(|| invalid(format!("{h:p} is not a live HIXL-CS {what} handle")))
}

fn insert<T>(t: &Table<T>, v: T) -> usize {
    let key = NEXT_HANDLE.fetch_add(16, std::sync::atomic::Ordering::Relaxed);
    lock(t).insert(key, Arc::new(v));
    key
}

/// Takes handle `h` out of table `t` (Destroy).
fn remove<T>(t: &Table<T>, h: *mut c_void, what: &str) -> R<Arc<T>> {
    lock(t)
        .remove(&(h as usize))
        .ok_or_else(|| invalid(format!("{h:p} is not a live HIXL-CS {what} handle")))
}

// ---------------------------------------------------------------------------------------------
// translations

/// The library's error with its code.
fn fail(e: cs::Error) -> Fail {
    (e.code(), e.message().to_owned())
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

/// A C port: at most 65535.
fn port(p: u32) -> R<u16> {
    u16::try_from(p).map_err(|_| invalid(format!("server_port {p} > 65535")))
}

/// `global_resource_config` (null or a string).
///
/// # Safety
/// `config` is null or readable; its string null or NUL-terminated.
unsafe fn read_config(config: *const HixlConfig) -> R<Option<String>> {
    if config.is_null() {
        return Err(invalid("config is null"));
    }
    // SAFETY: not null, readable by the caller's contract.
    let c = unsafe { config.read_unaligned() };
    // SAFETY: the caller's contract.
    match unsafe { opt_cstr(c.global_resource_config) } {
        Some(b) => String::from_utf8(b)
            .map(Some)
            .map_err(|_| invalid("global_resource_config is not UTF-8")),
        None => Ok(None),
    }
}

/// A `CommMem` as the library's [`cs::Mem`] (its range is the library's to check).
///
/// # Safety
/// `mem` is null or readable.
unsafe fn read_mem(mem: *const CommMem) -> R<cs::Mem> {
    if mem.is_null() {
        return Err(invalid("mem is null"));
    }
    // SAFETY: not null, readable by the caller's contract (the type is read as a plain i32).
    let m = unsafe { mem.read_unaligned() };
    let typ = match m.typ {
        0 => MemType::Device,
        1 => MemType::Host,
        v => {
            return Err(invalid(format!(
                "mem type {v} is not COMM_MEM_TYPE_DEVICE (0) or COMM_MEM_TYPE_HOST (1)"
            )));
        }
    };
    let size = usize::try_from(m.size).map_err(|_| invalid("mem size overflows"))?;
    Ok(cs::Mem {
        typ,
        addr: m.addr,
        size,
    })
}

/// A `timeout_ms`.
fn millis(ms: u32) -> Duration {
    Duration::from_millis(u64::from(ms))
}

/// A handle number as the C handle.
fn handle(raw: u64) -> *mut c_void {
    raw as usize as *mut c_void
}
