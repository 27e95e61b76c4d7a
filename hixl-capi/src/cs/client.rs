//! The HIXL-CS client: its engine, the connection to the server, the server's memory list
//! (READ from the server's memory and imported), client registrations, and the address checks
//! every batch passes.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, c_char, c_void};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hixl_rs::compat::{self, HostMem, TransferOpDesc};
use hixl_rs::{Access, MemType, TransferOp};

use super::table::{self, ENDPOINT_LEN, HEADER_LEN, TABLE_LEN, Table};
use super::{
    BUILTIN_TAG, CommMem, HixlClientDesc, HixlConfig, HixlOneSideOpDesc, TIMEOUT, clients, config,
    cs_fail, cs_start_fail, disjoint, endpoint_loc, endpoint_matches, engine_name, failed, insert,
    ip, lock, lookup, millis, next_handle, overlaps, read_config, read_mem,
};
use crate::{R, entry, invalid, put};

/// A client registration (identical ranges share one engine registration).
struct CMem {
    len: usize,
    typ: MemType,
    engine: compat::MemHandle,
    refs: usize,
}

pub(super) struct ClientState {
    pub(super) engine: Arc<compat::Hixl>,
    /// The server's engine name.
    pub(super) remote: String,
    remote_endpoint: [u8; ENDPOINT_LEN],
    connected: bool,
    pub(super) latched: bool,
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
    pub(super) handles: HashMap<u64, compat::TransferReq>,
}

pub(super) struct Client {
    pub(super) state: Mutex<ClientState>,
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
    pub(super) fn descs(&self, descs: &[HixlOneSideOpDesc]) -> R<Vec<TransferOpDesc>> {
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
        if loc == 0 {
            // a device endpoint: the engine reads the thread's device at Create, and fails with
            // ACL's error where none is set, as upstream's client (InitDeviceResource)
            options.push(("hixl.ascend.require_device".into(), "1".into()));
        }
        engine
            .initialize(me, {
                options.push(("AutoConnect".into(), "0".into()));
                options
            })
            .map_err(cs_start_fail)?;
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
