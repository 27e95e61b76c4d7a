//! The server's functions: `HixlCSServer*` over [`cs::Server`].

use std::ffi::{c_char, c_void};

use hixl_rs::cs;

use super::{
    CommMem, HixlConfig, HixlServerDesc, fail, handle, insert, ip, lookup, opt_cstr, port,
    read_config, read_mem, remove, servers,
};
use crate::{entry, invalid, put};

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
        let config = unsafe { read_config(config) }?;
        let port = port(d.server_port)?;
        // a count past what the library takes forms no slice (its memory is not read, nor
        // promised to be there: the pointer check, not the library's rule)
        let n = d.endpoint_list_num as usize;
        if n > cs::MAX_ENDPOINTS {
            return Err(invalid(format!(
                "{n} endpoints (at most {})",
                cs::MAX_ENDPOINTS
            )));
        }
        // SAFETY: the caller's contract: endpoint_list_num endpoints (none read when it is 0;
        // the library refuses that).
        let eps = unsafe {
            crate::slice(
                d.endpoint_list,
                d.endpoint_list_num as usize,
                "endpoint_list",
            )
        }?;
        let s = cs::Server::new(ip, port, eps, config.as_deref()).map_err(fail)?;
        let key = insert(servers(), s);
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
        let mem = unsafe { read_mem(mem) }?;
        if mem_handle.is_null() {
            return Err(invalid("mem_handle is null"));
        }
        // SAFETY: the caller's contract (a null tag is "").
        let tag = unsafe { opt_cstr(mem_tag) }.unwrap_or_default();
        // SAFETY: this function's contract is the library's.
        let h = unsafe { s.register(&tag, mem) }.map_err(fail)?;
        // SAFETY: checked not null, writable by the caller's contract.
        unsafe { put(mem_handle, handle(h.into_raw()), "mem_handle") }
    })
}

/// Starts listening (`backlog` is the engine's).
///
/// # Safety
/// Any handle value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSServerListen(server_handle: *mut c_void, backlog: u32) -> u32 {
    let _ = backlog;
    entry(|| {
        let s = lookup(servers(), server_handle, "server")?;
        s.listen().map_err(fail)
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
        s.deregister(cs::MemHandle::from_raw(mem_handle as u64))
            .map_err(fail)
    })
}

/// Stops and frees a server.
///
/// # Safety
/// Any handle value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSServerDestroy(server_handle: *mut c_void) -> u32 {
    entry(|| {
        remove(servers(), server_handle, "server")?.close();
        Ok(())
    })
}
