//! The HIXL-CS server: an engine listening on its control address, its tagged registrations,
//! and the memory list it publishes (rewritten at every registration).

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use hixl_rs::compat::{self, HostMem};
use hixl_rs::{Access, MemType, Status};

use super::table::{self, ENDPOINT_LEN, HEADER_LEN, MAGIC, TABLE_LEN, Table};
use super::{
    CommMem, HixlConfig, HixlServerDesc, config, cs_fail, cs_start_fail, endpoint_loc, engine_name,
    failed, insert, ip, lock, lookup, next_handle, opt_cstr, overlaps, read_config, read_mem,
    servers,
};
use crate::{R, entry, invalid, put};

fn comm_type(t: MemType) -> i32 {
    match t {
        MemType::Device => 0,
        _ => 1,
    }
}

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

pub(super) struct Server {
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
        let mut options = unsafe { read_config(config, config::Side::Server) }?;
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
            crate::slice(
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
        if endpoints.iter().any(|e| endpoint_loc(e) == 0) {
            // device endpoints: the thread's device is read now, as upstream's Create does
            // (RegisterDeviceTransFinishedFlag), and its engine at Listen takes that device
            options.push(("hixl.ascend.require_device".into(), "1".into()));
            hixl_rs::Options::from_pairs(options.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .and_then(|o| o.calling_thread_device())
                .map_err(|e| cs_start_fail(e.into()))?;
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
