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

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, CString, c_char, c_void};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use hixl_rs::compat::{self, HostMem, TransferOpDesc, TransferStatus};
use hixl_rs::{Access, MemType, Status, TransferOp};

use super::{Fail, NEXT_HANDLE, R, entry, invalid, put};

mod config;
mod table;

use table::{ENDPOINT_LEN, HEADER_LEN, MAGIC, TABLE_LEN, Table};

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

fn comm_type(t: MemType) -> i32 {
    match t {
        MemType::Device => 0,
        _ => 1,
    }
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

// ---------------------------------------------------------------------------------------------
// server

struct SMem {
    tag: Vec<u8>,
    typ: MemType,
    addr: usize,
    size: usize,
    /// The engine's registration, once listening.
    engine: Option<compat::MemHandle>,
}

struct ServerState {
    name: String,
    port: u16,
    /// The engine's options (`hixl.*` keys of the config, then AutoConnect off).
    options: Vec<(String, String)>,
    endpoints: Vec<[u8; ENDPOINT_LEN]>,
    /// Initialized at Listen.
    engine: Option<Arc<compat::Hixl>>,
    table: Option<HostMem>,
    version: u64,
    mems: BTreeMap<u64, SMem>,
}

struct Server {
    state: Mutex<ServerState>,
}

impl ServerState {
    fn table(&self) -> Table {
        Table {
            endpoints: self.endpoints.clone(),
            mems: self
                .mems
                .values()
                .map(|m| table::Mem {
                    typ: comm_type(m.typ),
                    addr: m.addr as u64,
                    size: m.size as u64,
                    tag: m.tag.clone(),
                })
                .collect(),
        }
    }

    /// Rewrites the published list (odd version while it is written, then even).
    fn publish(&mut self) -> R<()> {
        let t = self.table();
        let Some(mem) = &self.table else {
            return Ok(());
        };
        let payload = t.encode_payload();
        if payload.len() > TABLE_LEN - HEADER_LEN {
            return Err((
                Status::RESOURCE_EXHAUSTED.code(),
                "the memory list does not fit the server's table".into(),
            ));
        }
        let base = mem.as_ptr();
        let word = |i: usize, v: u64| {
            // SAFETY: the table is TABLE_LEN bytes, alive while `self.table` is (this borrow);
            // i < 4, so in bounds. Peers only READ it.
            unsafe { base.add(i * 8).cast::<u64>().write_unaligned(v.to_le()) }
        };
        self.version += 1; // odd
        word(1, self.version);
        std::sync::atomic::fence(Ordering::SeqCst);
        // SAFETY: HEADER_LEN + payload.len() <= TABLE_LEN (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(payload.as_ptr(), base.add(HEADER_LEN), payload.len())
        };
        word(0, MAGIC);
        word(2, payload.len() as u64);
        word(3, table::fnv1a(&payload));
        std::sync::atomic::fence(Ordering::SeqCst);
        self.version += 1; // even
        word(1, self.version);
        Ok(())
    }

    fn check_new(&self, addr: usize, size: usize, tag: &[u8]) -> R<()> {
        if tag.len() > table::MAX_TAG {
            return Err(invalid(format!(
                "mem_tag is {} bytes (at most {})",
                tag.len(),
                table::MAX_TAG
            )));
        }
        if self.mems.len() >= table::MAX_MEMS {
            return Err((
                Status::RESOURCE_EXHAUSTED.code(),
                format!("the server has {} registrations already", table::MAX_MEMS),
            ));
        }
        let mut t = self.table();
        t.mems.push(table::Mem {
            typ: 1,
            addr: addr as u64,
            size: size as u64,
            tag: tag.to_vec(),
        });
        if t.payload_len() > TABLE_LEN - HEADER_LEN {
            return Err((
                Status::RESOURCE_EXHAUSTED.code(),
                "the memory list would not fit the server's table (1 MiB)".into(),
            ));
        }
        if let Some(m) = self
            .mems
            .values()
            .find(|m| overlaps(m.addr, m.size, addr, size))
        {
            return Err(invalid(format!(
                "{addr:#x}+{size} overlaps memory registered already ({:#x}+{})",
                m.addr, m.size
            )));
        }
        Ok(())
    }
}

/// # Safety
/// The memory stays valid until unregistered or the engine finalized.
unsafe fn engine_register(e: &compat::Hixl, m: &SMem) -> R<compat::MemHandle> {
    let desc = compat::MemDesc {
        addr: m.addr,
        len: m.size,
        local_only: false,
    };
    // SAFETY: the caller's contract (HixlCSServerRegMem's).
    unsafe { e.register_mem(desc, m.typ) }.map_err(cs_fail)
}

/// Creates a server (not listening yet).
///
/// # Safety
/// Pointers are null or point to what `hixl_cs.h` says (`endpoint_list_num` endpoints,
/// NUL-terminated strings); `server_handle` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSServerCreate(
    server_desc: *const HixlServerDesc,
    config: *const HixlConfig,
    server_handle: *mut *mut c_void,
) -> u32 {
    entry(|| {
        // SAFETY: the caller's contract.
        unsafe { put(server_handle, std::ptr::null_mut(), "server_handle") }?;
        if server_desc.is_null() {
            return Err(invalid("server_desc is null"));
        }
        // SAFETY: not null, readable by the caller's contract.
        let d = unsafe { server_desc.read_unaligned() };
        // SAFETY: the caller's contract.
        let ip = unsafe { ip(d.server_ip) }?;
        // SAFETY: the caller's contract.
        let options = unsafe { read_config(config, config::Side::Server) }?;
        let port = u16::try_from(d.server_port)
            .map_err(|_| invalid(format!("server_port {} > 65535", d.server_port)))?;
        if d.endpoint_list.is_null() || d.endpoint_list_num == 0 {
            return Err(invalid("endpoint_list is null or endpoint_list_num is 0"));
        }
        if d.endpoint_list_num as usize > table::MAX_ENDPOINTS {
            return Err(invalid(format!(
                "endpoint_list_num {} > {}",
                d.endpoint_list_num,
                table::MAX_ENDPOINTS
            )));
        }
        // SAFETY: the caller's contract: endpoint_list_num endpoints.
        let eps = unsafe {
            super::slice(
                d.endpoint_list,
                d.endpoint_list_num as usize,
                "endpoint_list",
            )
        }?;
        let mut endpoints = Vec::with_capacity(eps.len());
        for (i, e) in eps.iter().enumerate() {
            let loc = endpoint_loc(&e.bytes);
            if loc != 0 && loc != 1 {
                return Err(invalid(format!(
                    "endpoint {i}: location type {loc} is neither DEVICE nor HOST"
                )));
            }
            endpoints.push(e.bytes);
        }
        let key = insert(
            servers(),
            Server {
                state: Mutex::new(ServerState {
                    name: engine_name(ip, port),
                    port,
                    options,
                    endpoints,
                    engine: None,
                    table: None,
                    version: 0,
                    mems: BTreeMap::new(),
                }),
            },
        );
        // SAFETY: the caller's contract.
        unsafe { put(server_handle, key as *mut c_void, "server_handle") }
    })
}

/// Registers server memory under a tag.
///
/// # Safety
/// `mem_tag` is null or NUL-terminated; `mem` null or readable; `mem_handle` null or writable.
/// The memory stays valid until unregistered or the server destroyed, and clients PUT into and
/// GET from it at any time.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSServerRegMem(
    server_handle: *mut c_void,
    mem_tag: *const c_char,
    mem: *const CommMem,
    mem_handle: *mut *mut c_void,
) -> u32 {
    entry(|| {
        let s = lookup(servers(), server_handle, "server")?;
        // SAFETY: the caller's contract.
        let (typ, addr, size) = unsafe { read_mem(mem) }?;
        if mem_handle.is_null() {
            return Err(invalid("mem_handle is null"));
        }
        // SAFETY: the caller's contract.
        let tag = unsafe { opt_cstr(mem_tag) }.unwrap_or_default();
        let mut st = lock(&s.state);
        st.check_new(addr, size, &tag)?;
        let mut m = SMem {
            tag,
            typ,
            addr,
            size,
            engine: None,
        };
        if let Some(e) = &st.engine {
            // SAFETY: this function's contract.
            m.engine = Some(unsafe { engine_register(e, &m) }?);
        }
        let h = next_handle();
        st.mems.insert(h, m);
        st.publish()?;
        // SAFETY: checked not null, writable by the caller's contract.
        unsafe { put(mem_handle, h as usize as *mut c_void, "mem_handle") }
    })
}

/// Starts listening (the engine is initialized here; `backlog` is the engine's).
///
/// # Safety
/// Any handle value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSServerListen(server_handle: *mut c_void, backlog: u32) -> u32 {
    let _ = backlog;
    entry(|| {
        let s = lookup(servers(), server_handle, "server")?;
        let mut st = lock(&s.state);
        if st.engine.is_some() {
            return Err(failed("the server is listening already"));
        }
        if st.port == 0 {
            return Err(invalid("server_port is 0: there is nothing to listen on"));
        }
        let e = Arc::new(compat::Hixl::new());
        let mut options = st.options.clone();
        options.push(("AutoConnect".into(), "0".into()));
        e.initialize(&st.name, options)
            .map_err(|e| failed(format!("cannot listen: {}", e.message())))?;
        let table = e
            .alloc_host_mem_with(TABLE_LEN, Access::Read)
            .map_err(cs_fail)?;
        st.table = Some(table);
        let mut handles = Vec::new();
        for m in st.mems.values() {
            // SAFETY: HixlCSServerRegMem's contract, under which the memory was given.
            match unsafe { engine_register(&e, m) } {
                Ok(h) => handles.push(h),
                Err(err) => {
                    st.table = None;
                    e.finalize();
                    return Err(err);
                }
            }
        }
        for (m, h) in st.mems.values_mut().zip(handles) {
            m.engine = Some(h);
        }
        st.engine = Some(e);
        st.publish()
    })
}

/// Unregisters server memory.
///
/// # Safety
/// Any handle value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSServerUnregMem(
    server_handle: *mut c_void,
    mem_handle: *mut c_void,
) -> u32 {
    entry(|| {
        let s = lookup(servers(), server_handle, "server")?;
        let mut st = lock(&s.state);
        let key = mem_handle as usize as u64;
        let Some(m) = st.mems.get(&key) else {
            return Err(invalid(format!(
                "{mem_handle:p} is not a registration of this server"
            )));
        };
        if let (Some(e), Some(h)) = (&st.engine, m.engine) {
            e.deregister_mem(h).map_err(cs_fail)?;
        }
        st.mems.remove(&key);
        st.publish()
    })
}

/// Stops and frees a server.
///
/// # Safety
/// Any handle value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSServerDestroy(server_handle: *mut c_void) -> u32 {
    entry(|| {
        let s = lock(servers())
            .remove(&(server_handle as usize))
            .ok_or_else(|| {
                invalid(format!(
                    "{server_handle:p} is not a live HIXL-CS server handle"
                ))
            })?;
        let mut st = lock(&s.state);
        if let Some(e) = st.engine.take() {
            e.finalize();
        }
        st.table = None;
        st.mems.clear();
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// client

/// A client registration (identical ranges share one engine registration).
struct CMem {
    len: usize,
    typ: MemType,
    engine: compat::MemHandle,
    refs: usize,
}

struct ClientState {
    engine: Arc<compat::Hixl>,
    /// The server's engine name.
    remote: String,
    remote_endpoint: [u8; ENDPOINT_LEN],
    connected: bool,
    latched: bool,
    download: HostMem,
    /// By start address.
    mems: BTreeMap<usize, CMem>,
    /// Memory handle → start address.
    mem_handles: HashMap<u64, usize>,
    /// The imported server ranges, by start address: (end, type).
    remote_mems: BTreeMap<u64, u64>,
    /// What HixlCSClientGetRemoteMem hands out.
    out_mems: Vec<CommMem>,
    out_tags: Vec<CString>,
    out_tag_ptrs: Vec<usize>,
    /// Completion handle → engine request.
    handles: HashMap<u64, compat::TransferReq>,
}

struct Client {
    state: Mutex<ClientState>,
}

fn millis(t: u32) -> i32 {
    i32::try_from(t).unwrap_or(i32::MAX)
}

impl ClientState {
    /// READs the server's list within `deadline` (retried while the server rewrites it).
    fn fetch(&self, deadline: Instant) -> R<(Table, compat::RemoteRegionDesc)> {
        let regions = self.engine.remote_regions(&self.remote).map_err(cs_fail)?;
        let Some(region) = regions.iter().copied().find(|r| {
            r.access == Access::Read && r.mem_type == MemType::Host && r.len == TABLE_LEN as u64
        }) else {
            return Err(failed(format!(
                "{} publishes no HIXL-CS memory list (not a HIXL-CS server?)",
                self.remote
            )));
        };
        let base = self.download.as_ptr();
        let read = |len: usize| -> R<()> {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err((TIMEOUT, "timed out reading the server's memory list".into()));
            }
            let d = TransferOpDesc {
                local_addr: self.download.addr(),
                remote_addr: region.addr as usize,
                len,
            };
            self.engine
                .transfer_sync(
                    &self.remote,
                    TransferOp::Read,
                    &[d],
                    millis(left.as_millis().max(1) as u32),
                )
                .map_err(cs_fail)
        };
        let header = || -> R<(u64, usize, u64)> {
            let mut h = [0u8; HEADER_LEN];
            // SAFETY: the download buffer holds TABLE_LEN >= HEADER_LEN bytes, alive while
            // `self` is; only this client's (serialized) transfers write it.
            unsafe { std::ptr::copy_nonoverlapping(base, h.as_mut_ptr(), HEADER_LEN) };
            table::decode_header(&h).map_err(|w| failed(format!("the server's memory list: {w}")))
        };
        for _ in 0..64 {
            read(HEADER_LEN)?;
            let (v, len, _) = header()?;
            if v % 2 == 1 {
                continue;
            }
            read(HEADER_LEN + len)?;
            let (v2, len2, sum) = header()?;
            if v2 != v || len2 != len {
                continue;
            }
            // SAFETY: as above; HEADER_LEN + len <= TABLE_LEN (decode_header checked).
            let payload = unsafe { std::slice::from_raw_parts(base.add(HEADER_LEN), len) };
            if table::fnv1a(payload) != sum {
                continue;
            }
            let t = table::decode_payload(payload)
                .map_err(|w| failed(format!("the server's memory list: {w}")))?;
            return Ok((t, region));
        }
        Err(failed(
            "the server's memory list kept changing while it was read",
        ))
    }

    /// Records the list (and what GetRemoteMem hands out).
    fn import(&mut self, t: &Table, builtin: compat::RemoteRegionDesc) -> R<()> {
        let mut mems = vec![CommMem {
            typ: 1,
            addr: builtin.addr as usize,
            size: builtin.len,
        }];
        let mut tags = vec![CString::new(BUILTIN_TAG).unwrap_or_default()];
        let ranges = disjoint((builtin.addr, builtin.len), &t.mems).map_err(invalid)?;
        for m in &t.mems {
            mems.push(CommMem {
                typ: m.typ,
                addr: m.addr as usize,
                size: m.size,
            });
            tags.push(CString::new(m.tag.clone()).unwrap_or_default());
        }
        self.remote_mems = ranges;
        self.out_tag_ptrs = tags.iter().map(|t| t.as_ptr() as usize).collect();
        self.out_tags = tags;
        self.out_mems = mems;
        Ok(())
    }

    /// Whether every region of the list is in the link's table (memory the server registered
    /// after this client connected is not).
    fn link_covers(&self, t: &Table) -> R<bool> {
        let regions = self.engine.remote_regions(&self.remote).map_err(cs_fail)?;
        Ok(t.mems.iter().all(|m| {
            regions
                .iter()
                .any(|r| r.addr <= m.addr && m.addr + m.size <= r.addr + r.len)
        }))
    }

    /// The engine descriptors of a batch, each range checked: local inside one registered client
    /// range, remote inside one imported server range.
    fn descs(&self, descs: &[HixlOneSideOpDesc]) -> R<Vec<TransferOpDesc>> {
        let mut out = Vec::with_capacity(descs.len());
        for (i, d) in descs.iter().enumerate() {
            let local = d.local_buf as usize;
            let remote = d.remote_buf as u64;
            let len =
                usize::try_from(d.len).map_err(|_| invalid(format!("desc {i}: len overflows")))?;
            if len == 0 {
                return Err(invalid(format!("desc {i}: len is 0")));
            }
            let in_local = local.checked_add(len).is_some_and(|end| {
                self.mems
                    .range(..=local)
                    .next_back()
                    .is_some_and(|(&a, m)| end <= a + m.len)
            });
            if !in_local {
                return Err(invalid(format!(
                    "desc {i}: local {local:#x}+{len} is not inside one range registered with \
                     HixlCSClientRegMem"
                )));
            }
            let in_remote = remote.checked_add(d.len).is_some_and(|end| {
                self.remote_mems
                    .range(..=remote)
                    .next_back()
                    .is_some_and(|(_, &e)| end <= e)
            });
            if !in_remote {
                return Err(invalid(format!(
                    "desc {i}: remote {remote:#x}+{len} is not inside one range of the server's \
                     memory list{}",
                    if self.connected {
                        ""
                    } else {
                        " (not connected)"
                    }
                )));
            }
            out.push(TransferOpDesc {
                local_addr: local,
                remote_addr: remote as usize,
                len,
            });
        }
        Ok(out)
    }

    /// Latches the client on a failed or timed-out batch.
    fn after(&mut self, r: R<()>) -> R<()> {
        if let Err((code, _)) = &r
            && *code != Status::PARAM_INVALID.code()
            && *code != Status::RESOURCE_EXHAUSTED.code()
        {
            self.latched = true;
        }
        r
    }
}

/// Creates a client.
///
/// # Safety
/// Pointers are null or point to what `hixl_cs.h` says; `client_handle` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientCreate(
    client_desc: *const HixlClientDesc,
    config: *const HixlConfig,
    client_handle: *mut *mut c_void,
) -> u32 {
    entry(|| {
        // SAFETY: the caller's contract.
        unsafe { put(client_handle, std::ptr::null_mut(), "client_handle") }?;
        if client_desc.is_null() {
            return Err(invalid("client_desc is null"));
        }
        // SAFETY: not null, readable by the caller's contract.
        let d = unsafe { client_desc.read_unaligned() };
        // SAFETY: the caller's contract.
        let ip = unsafe { ip(d.server_ip) }?;
        if d.local_endpoint.is_null() || d.remote_endpoint.is_null() {
            return Err(invalid("local_endpoint or remote_endpoint is null"));
        }
        // SAFETY: not null, readable by the caller's contract.
        let (local, remote) = unsafe {
            (
                d.local_endpoint.read_unaligned().bytes,
                d.remote_endpoint.read_unaligned().bytes,
            )
        };
        // SAFETY: the caller's contract.
        let mut options = unsafe { read_config(config, config::Side::Client) }?;
        let port = u16::try_from(d.server_port)
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| invalid(format!("server_port {} is not in 1..=65535", d.server_port)))?;
        let loc = endpoint_loc(&local);
        if loc != 0 && loc != 1 {
            return Err(invalid(format!(
                "local endpoint location type {loc} is neither DEVICE nor HOST"
            )));
        }
        config::check_env().map_err(invalid)?;
        let engine = Arc::new(compat::Hixl::new());
        let me = if ip.is_ipv4() { "127.0.0.1" } else { "[::1]" };
        engine
            .initialize(me, {
                options.push(("AutoConnect".into(), "0".into()));
                options
            })
            .map_err(cs_fail)?;
        let download = engine
            .alloc_host_mem_with(TABLE_LEN, Access::None)
            .map_err(cs_fail)?;
        let key = insert(
            clients(),
            Client {
                state: Mutex::new(ClientState {
                    engine,
                    remote: engine_name(ip, port),
                    remote_endpoint: remote,
                    connected: false,
                    latched: false,
                    download,
                    mems: BTreeMap::new(),
                    mem_handles: HashMap::new(),
                    remote_mems: BTreeMap::new(),
                    out_mems: Vec::new(),
                    out_tags: Vec::new(),
                    out_tag_ptrs: Vec::new(),
                    handles: HashMap::new(),
                }),
            },
        );
        // SAFETY: the caller's contract.
        unsafe { put(client_handle, key as *mut c_void, "client_handle") }
    })
}

/// Connects the client, matches its remote endpoint and fetches the server's memory list.
///
/// # Safety
/// Any handle value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientConnect(client_handle: *mut c_void, timeout_ms: u32) -> u32 {
    entry(|| {
        let c = lookup(clients(), client_handle, "client")?;
        let mut st = lock(&c.state);
        if st.connected {
            return Err(failed("the client is connected already"));
        }
        if timeout_ms == 0 {
            return Err((TIMEOUT, "timeout_ms is 0".into()));
        }
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        st.engine
            .connect(&st.remote, millis(timeout_ms))
            .map_err(cs_fail)?;
        let fetched = st.fetch(deadline).and_then(|(t, builtin)| {
            if !t
                .endpoints
                .iter()
                .any(|e| endpoint_matches(e, &st.remote_endpoint))
            {
                return Err(invalid(
                    "remote_endpoint matches none of the server's endpoints",
                ));
            }
            st.import(&t, builtin)
        });
        if let Err(e) = fetched {
            let _ = st.engine.disconnect(&st.remote, 1000);
            return Err(e);
        }
        st.connected = true;
        Ok(())
    })
}

/// The server's memory list (fetched again).
///
/// # Safety
/// Out-pointers are null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientGetRemoteMem(
    client_handle: *mut c_void,
    remote_mem_list: *mut *mut CommMem,
    mem_tag_list: *mut *mut *mut c_char,
    list_num: *mut u32,
    timeout_ms: u32,
) -> u32 {
    entry(|| {
        let c = lookup(clients(), client_handle, "client")?;
        if remote_mem_list.is_null() || mem_tag_list.is_null() || list_num.is_null() {
            return Err(invalid("remote_mem_list, mem_tag_list or list_num is null"));
        }
        let mut st = lock(&c.state);
        if !st.connected {
            return Err(failed("the client is not connected"));
        }
        if timeout_ms == 0 {
            return Err((TIMEOUT, "timeout_ms is 0".into()));
        }
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        let (mut t, mut builtin) = st.fetch(deadline)?;
        if !st.link_covers(&t)? {
            // the server registered memory after this link was made: a new link gets a table
            // with it (the engine's tables are fixed per link)
            if !st.handles.is_empty() {
                return Err(failed(format!(
                    "the server's list grew; {} async batches must be queried to their end before \
                     it can be imported",
                    st.handles.len()
                )));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = st.engine.disconnect(&st.remote, 1000);
            st.connected = false;
            st.remote_mems.clear();
            st.engine
                .connect(&st.remote, millis(left.as_millis().max(1) as u32))
                .map_err(cs_fail)?;
            st.connected = true;
            (t, builtin) = st.fetch(deadline)?;
        }
        st.import(&t, builtin)?;
        let n = st.out_mems.len() as u32;
        let (mems, tags) = if n == 0 {
            (std::ptr::null_mut(), std::ptr::null_mut())
        } else {
            (
                st.out_mems.as_mut_ptr(),
                st.out_tag_ptrs.as_mut_ptr().cast::<*mut c_char>(),
            )
        };
        // SAFETY: checked not null, writable by the caller's contract. The arrays live in the
        // client until the next call or its destruction, as the header says.
        unsafe {
            remote_mem_list.write_unaligned(mems);
            mem_tag_list.write_unaligned(tags);
            list_num.write_unaligned(n);
        }
        Ok(())
    })
}

/// Registers client memory.
///
/// # Safety
/// As [`HixlCSServerRegMem`]: the memory stays valid until unregistered or the client destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientRegMem(
    client_handle: *mut c_void,
    mem_tag: *const c_char,
    mem: *const CommMem,
    mem_handle: *mut *mut c_void,
) -> u32 {
    let _ = mem_tag;
    entry(|| {
        let c = lookup(clients(), client_handle, "client")?;
        // SAFETY: the caller's contract.
        let (typ, addr, size) = unsafe { read_mem(mem) }?;
        if mem_handle.is_null() {
            return Err(invalid("mem_handle is null"));
        }
        let mut st = lock(&c.state);
        let same = st
            .mems
            .get(&addr)
            .is_some_and(|m| m.len == size && m.typ == typ);
        if !same {
            if let Some((&a, m)) = st
                .mems
                .iter()
                .find(|(a, m)| overlaps(**a, m.len, addr, size))
            {
                return Err(invalid(format!(
                    "{addr:#x}+{size} partially overlaps the registered {a:#x}+{}",
                    m.len
                )));
            }
            let desc = compat::MemDesc {
                addr,
                len: size,
                local_only: true,
            };
            // SAFETY: this function's contract.
            let h = unsafe { st.engine.register_mem(desc, typ) }.map_err(cs_fail)?;
            st.mems.insert(
                addr,
                CMem {
                    len: size,
                    typ,
                    engine: h,
                    refs: 0,
                },
            );
        }
        if let Some(m) = st.mems.get_mut(&addr) {
            m.refs += 1;
        }
        let h = next_handle();
        st.mem_handles.insert(h, addr);
        // SAFETY: checked not null, writable by the caller's contract.
        unsafe { put(mem_handle, h as usize as *mut c_void, "mem_handle") }
    })
}

/// Unregisters client memory.
///
/// # Safety
/// Any handle value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientUnregMem(
    client_handle: *mut c_void,
    mem_handle: *mut c_void,
) -> u32 {
    entry(|| {
        let c = lookup(clients(), client_handle, "client")?;
        let mut st = lock(&c.state);
        let key = mem_handle as usize as u64;
        let Some(&addr) = st.mem_handles.get(&key) else {
            return Err(invalid(format!(
                "{mem_handle:p} is not a registration of this client"
            )));
        };
        let Some(m) = st.mems.get(&addr) else {
            return Err(failed("internal: a handle without its range"));
        };
        if m.refs == 1 {
            st.engine.deregister_mem(m.engine).map_err(cs_fail)?;
            st.mems.remove(&addr);
        } else if let Some(m) = st.mems.get_mut(&addr) {
            m.refs -= 1;
        }
        st.mem_handles.remove(&key);
        Ok(())
    })
}

/// # Safety
/// `desc_list` is null or `list_num` descriptors.
unsafe fn batch_descs<'a>(
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
) -> R<&'a [HixlOneSideOpDesc]> {
    if list_num == 0 {
        return Err(invalid("list_num is 0"));
    }
    if desc_list.is_null() {
        return Err(invalid("desc_list is null"));
    }
    // SAFETY: the caller's contract.
    unsafe { super::slice(desc_list, list_num as usize, "desc_list") }
}

/// # Safety
/// As [`HixlCSClientBatchPutAsync`].
unsafe fn batch_async(
    client_handle: *mut c_void,
    op: TransferOp,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    complete_handle: *mut *mut c_void,
) -> u32 {
    entry(|| {
        let c = lookup(clients(), client_handle, "client")?;
        if complete_handle.is_null() {
            return Err(invalid("complete_handle is null"));
        }
        // SAFETY: the caller's contract.
        let descs = unsafe { batch_descs(list_num, desc_list) }?;
        let mut st = lock(&c.state);
        if st.latched {
            return Err(failed(
                "an earlier batch failed or timed out: destroy the client and create it again",
            ));
        }
        let descs = st.descs(descs)?;
        if st.handles.len() >= MAX_HANDLES {
            return Err((
                Status::RESOURCE_EXHAUSTED.code(),
                format!("{MAX_HANDLES} async batches are not yet reported COMPLETED or FAILED"),
            ));
        }
        let r = st
            .engine
            .transfer_async(&st.remote, op, &descs, compat::TransferArgs::default())
            .map_err(cs_fail);
        let req = match r {
            Ok(req) => req,
            Err(e) => return st.after(Err(e)),
        };
        let h = next_handle();
        st.handles.insert(h, req);
        // SAFETY: checked not null, writable by the caller's contract.
        unsafe {
            put(
                complete_handle,
                h as usize as *mut c_void,
                "complete_handle",
            )
        }
    })
}

/// # Safety
/// As [`HixlCSClientBatchPutSync`].
unsafe fn batch_sync(
    client_handle: *mut c_void,
    op: TransferOp,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    timeout_ms: u32,
) -> u32 {
    entry(|| {
        let c = lookup(clients(), client_handle, "client")?;
        // SAFETY: the caller's contract.
        let descs = unsafe { batch_descs(list_num, desc_list) }?;
        let mut st = lock(&c.state);
        if st.latched {
            return Err(failed(
                "an earlier batch failed or timed out: destroy the client and create it again",
            ));
        }
        let descs = st.descs(descs)?;
        if timeout_ms == 0 {
            return st.after(Err((TIMEOUT, "timeout_ms is 0".into())));
        }
        let r = st
            .engine
            .transfer_sync(&st.remote, op, &descs, millis(timeout_ms))
            .map_err(cs_fail);
        st.after(r)
    })
}

/// Starts a batch PUT (client → server).
///
/// # Safety
/// `desc_list` is null or `list_num` descriptors; `complete_handle` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientBatchPutAsync(
    client_handle: *mut c_void,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    complete_handle: *mut *mut c_void,
) -> u32 {
    // SAFETY: the caller's contract.
    unsafe {
        batch_async(
            client_handle,
            TransferOp::Write,
            list_num,
            desc_list,
            complete_handle,
        )
    }
}

/// Starts a batch GET (server → client).
///
/// # Safety
/// As [`HixlCSClientBatchPutAsync`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientBatchGetAsync(
    client_handle: *mut c_void,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    complete_handle: *mut *mut c_void,
) -> u32 {
    // SAFETY: the caller's contract.
    unsafe {
        batch_async(
            client_handle,
            TransferOp::Read,
            list_num,
            desc_list,
            complete_handle,
        )
    }
}

/// A batch PUT, waited for.
///
/// # Safety
/// `desc_list` is null or `list_num` descriptors.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientBatchPutSync(
    client_handle: *mut c_void,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    timeout_ms: u32,
) -> u32 {
    // SAFETY: the caller's contract.
    unsafe {
        batch_sync(
            client_handle,
            TransferOp::Write,
            list_num,
            desc_list,
            timeout_ms,
        )
    }
}

/// A batch GET, waited for.
///
/// # Safety
/// As [`HixlCSClientBatchPutSync`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientBatchGetSync(
    client_handle: *mut c_void,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    timeout_ms: u32,
) -> u32 {
    // SAFETY: the caller's contract.
    unsafe {
        batch_sync(
            client_handle,
            TransferOp::Read,
            list_num,
            desc_list,
            timeout_ms,
        )
    }
}

/// The state of an async batch; COMPLETED and FAILED free the handle.
///
/// # Safety
/// `complete_status` is null or writable; any handle value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientQueryCompleteStatus(
    client_handle: *mut c_void,
    complete_handle: *mut c_void,
    complete_status: *mut i32,
) -> u32 {
    entry(|| {
        let c = lookup(clients(), client_handle, "client")?;
        if complete_status.is_null() {
            return Err(invalid("complete_status is null"));
        }
        let mut st = lock(&c.state);
        let key = complete_handle as usize as u64;
        let Some(&req) = st.handles.get(&key) else {
            return Err(invalid(format!(
                "{complete_handle:p} is not a live completion handle of this client (never \
                 issued, or already reported COMPLETED or FAILED)"
            )));
        };
        let s = match st.engine.get_transfer_status(req) {
            Ok(TransferStatus::Waiting) => 0,
            Ok(TransferStatus::Completed) => 1,
            Ok(_) | Err(_) => 3,
        };
        if s != 0 {
            st.handles.remove(&key);
        }
        if s == 3 {
            st.latched = true;
        }
        // SAFETY: checked not null, writable by the caller's contract.
        unsafe { put(complete_status, s, "complete_status") }
    })
}

/// Disconnects and frees a client.
///
/// # Safety
/// Any handle value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientDestroy(client_handle: *mut c_void) -> u32 {
    entry(|| {
        let c = lock(clients())
            .remove(&(client_handle as usize))
            .ok_or_else(|| {
                invalid(format!(
                    "{client_handle:p} is not a live HIXL-CS client handle"
                ))
            })?;
        let mut st = lock(&c.state);
        st.handles.clear();
        st.engine.finalize();
        st.mems.clear();
        st.mem_handles.clear();
        st.connected = false;
        Ok(())
    })
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
