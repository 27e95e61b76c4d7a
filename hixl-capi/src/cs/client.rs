//! The client's functions but its batches: `HixlCSClient*` over [`cs::Client`].

use std::ffi::{CString, c_char, c_void};
use std::sync::Mutex;

use hixl_rs::{MemType, cs};

use super::{
    CClient, CommMem, HixlClientDesc, HixlConfig, RemoteMems, clients, fail, handle, insert, ip,
    lock, lookup, millis, port, read_config, read_mem, remove,
};
use crate::{entry, invalid, put};

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
        let server_ip = unsafe { ip(d.server_ip) }?;
        if d.local_endpoint.is_null() || d.remote_endpoint.is_null() {
            return Err(invalid("local_endpoint or remote_endpoint is null"));
        }
        // SAFETY: not null, readable by the caller's contract.
        let (local_endpoint, remote_endpoint) = unsafe {
            (
                d.local_endpoint.read_unaligned(),
                d.remote_endpoint.read_unaligned(),
            )
        };
        // SAFETY: the caller's contract.
        let config = unsafe { read_config(config) }?;
        let desc = cs::ClientDesc {
            server_ip,
            server_port: port(d.server_port)?,
            local_endpoint,
            remote_endpoint,
        };
        let client = cs::Client::new(&desc, config.as_deref()).map_err(fail)?;
        let key = insert(
            clients(),
            CClient {
                client,
                out: Mutex::default(),
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
        c.client.connect(millis(timeout_ms)).map_err(fail)
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
        let list = c.client.remote_mems(millis(timeout_ms)).map_err(fail)?;
        let mut out = lock(&c.out);
        *out = RemoteMems::default();
        for m in list {
            out.mems.push(CommMem {
                typ: match m.typ {
                    MemType::Device => 0,
                    MemType::Host => 1,
                },
                addr: m.addr as usize,
                size: m.size,
            });
            // (a tag has no NUL: the library's list refuses one)
            out.tags.push(CString::new(m.tag).unwrap_or_default());
        }
        out.tag_ptrs = out.tags.iter().map(|t| t.as_ptr() as usize).collect();
        let n = out.mems.len() as u32;
        let (mems, tags) = if n == 0 {
            (std::ptr::null_mut(), std::ptr::null_mut())
        } else {
            (
                out.mems.as_mut_ptr(),
                out.tag_ptrs.as_mut_ptr().cast::<*mut c_char>(),
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
/// As [`HixlCSServerRegMem`](super::HixlCSServerRegMem): the memory stays valid until
/// unregistered or the client destroyed.
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
        let mem = unsafe { read_mem(mem) }?;
        if mem_handle.is_null() {
            return Err(invalid("mem_handle is null"));
        }
        // SAFETY: this function's contract is the library's.
        let h = unsafe { c.client.register(mem) }.map_err(fail)?;
        // SAFETY: checked not null, writable by the caller's contract.
        unsafe { put(mem_handle, handle(h.into_raw()), "mem_handle") }
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
        (c.client)
            .deregister(cs::MemHandle::from_raw(mem_handle as u64))
            .map_err(fail)
    })
}

/// Disconnects and frees a client.
///
/// # Safety
/// Any handle value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientDestroy(client_handle: *mut c_void) -> u32 {
    entry(|| {
        let c = remove(clients(), client_handle, "client")?;
        c.client.close();
        *lock(&c.out) = RemoteMems::default();
        Ok(())
    })
}
