//! Thin wrappers over HCCL's one-sided API: global memory registration, communicators built
//! from a rank table, and batched put/get on an ACL stream.
//!
//! Failures become [`Error::Timeout`] for `HCCL_E_TIMEOUT` (`TIMEOUT`) and [`Error::Native`]
//! with `library: "hccl"` otherwise (`FAILED`). A transfer follows HIXL's `CommChannel`: the
//! descriptors are issued in calls of at most [`MAX_DESCS_PER_CALL`] (64 on Ascend950, see
//! [`Soc`](super::Soc)), then the stream is synchronised with the caller's timeout.
//!
//! Two rules of HCCL are process-wide and kept here: communicators are created one at a time
//! ([`Hccl::init_comm`] holds a process-wide lock, as HIXL's `CommChannel` does, because HCCL
//! does not support parallel `HcclCommInitClusterInfoMemConfig`), and `HcclRegisterGlobalMem`
//! has one registry per process (the same range gets the same handle, an overlapping range is
//! refused), so [`Hccl::register_global_mem`] counts references per exact range and deregisters
//! with the last one.

// Used only by the unit tests yet, each marked `cfg_attr(not(test), allow(dead_code))`:
// `Comm::rank` (diagnostics) and `GlobalMem::deregister` (explicit error reporting; dropping
// deregisters too).

use std::collections::HashMap;
use std::ffi::{CString, c_int, c_void};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::acl::{Acl, Stream};
use super::ffi::{self, HcclApi, HcclResult};
use crate::error::Error;
use crate::sync::lock;

/// Most descriptors HIXL passes to one `HcclBatchPut`/`HcclBatchGet` (`kMaxOpDescNum`).
pub(crate) const MAX_DESCS_PER_CALL: usize = 256;
/// HCCL's limit per batch call on its V2 one-sided path (Ascend950 / A5).
pub(crate) const MAX_DESCS_PER_CALL_V2: usize = 64;

/// Serialises `HcclCommInitClusterInfoMemConfig` in this process: HCCL does not support
/// parallel communicator initialisation (HIXL guards it with a global mutex too).
static INIT_LOCK: Mutex<()> = Mutex::new(());

/// One process-wide HCCL registration: the library it was made with, its range and kind, the
/// handle, and how many [`GlobalMem`]s share it.
#[derive(Debug)]
struct SharedReg {
    handle: usize,
    kind: MemKind,
    refs: usize,
}

/// `(library, addr, len)` → the registration HCCL holds for exactly that range.
type Registry = HashMap<(String, usize, u64), SharedReg>;

static GLOBAL_MEMS: Mutex<Option<Registry>> = Mutex::new(None);

fn global_mems() -> MutexGuard<'static, Option<Registry>> {
    lock(&GLOBAL_MEMS)
}

/// A loaded HCCL. Cheap to clone (shared).
#[derive(Clone, Debug)]
pub(crate) struct Hccl {
    api: Arc<HcclApi>,
}

/// Where registered memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemKind {
    /// Device memory (`COMM_MEM_TYPE_DEVICE`).
    Device,
    /// Host memory (`COMM_MEM_TYPE_HOST`).
    Host,
}

/// A reference to a process-wide HCCL registration (`HcclRegisterGlobalMem`); the last
/// reference to a range deregisters it on drop.
#[derive(Debug)]
pub(crate) struct GlobalMem {
    hccl: Hccl,
    handle: NonNull<c_void>,
    addr: usize,
    len: u64,
    kind: MemKind,
}

// SAFETY: the handle is an opaque HCCL token; HCCL's registration calls are thread-safe (HIXL
// calls them from any engine thread under its own mutex, which `&self` methods do not need:
// each call is independent).
unsafe impl Send for GlobalMem {}
// SAFETY: as above; `&GlobalMem` exposes only plain values and the token.
unsafe impl Sync for GlobalMem {}

impl GlobalMem {
    /// Device or host.
    pub(crate) fn kind(&self) -> MemKind {
        self.kind
    }
    /// The raw handle.
    pub(crate) fn as_raw(&self) -> *mut c_void {
        self.handle.as_ptr()
    }

    /// Deregisters now, reporting a failure (dropping deregisters too, logging failures).
    ///
    /// # Errors
    /// [`Error::Native`] (e.g. while still bound to a communicator).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn deregister(self) -> Result<(), Error> {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: the field is read once from a value that is never used or dropped again.
        let hccl = unsafe { std::ptr::read(&me.hccl) };
        hccl.release_global_mem(me.handle, me.addr, me.len)
    }
}

impl Drop for GlobalMem {
    fn drop(&mut self) {
        if let Err(e) = self
            .hccl
            .release_global_mem(self.handle, self.addr, self.len)
        {
            tracing::warn!("HcclDeregisterGlobalMem failed: {e}");
        }
    }
}

/// Communicator settings, applied on top of HIXL's defaults (see
/// [`HcclCommConfig::hixl_default`](ffi::HcclCommConfig::hixl_default)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CommConfig {
    /// `hcclBufferSize` in MB (HIXL: 200).
    pub(crate) buffer_size_mb: u32,
    /// `hcclRdmaTrafficClass` (`RdmaTrafficClass`), unset by default.
    pub(crate) traffic_class: Option<u32>,
    /// `hcclRdmaServiceLevel` (`RdmaServiceLevel`), unset by default.
    pub(crate) service_level: Option<u32>,
    /// `hcclCommName` (HIXL: `hixl_<client>_<server>`; 1 to 127 bytes, no NUL). HCCL refuses
    /// an empty name and a name a live communicator of this process already has (`HCCL_E_PARA`).
    pub(crate) comm_name: String,
}

impl Default for CommConfig {
    fn default() -> Self {
        Self {
            buffer_size_mb: ffi::HCCL_COMM_DEFAULT_BUFFSIZE,
            traffic_class: None,
            service_level: None,
            comm_name: String::new(),
        }
    }
}

impl CommConfig {
    /// The C struct.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for an empty name, a name over 127 bytes or containing NUL.
    pub(crate) fn to_ffi(&self) -> Result<ffi::HcclCommConfig, Error> {
        let mut c = ffi::HcclCommConfig::hixl_default();
        c.buffer_size = self.buffer_size_mb;
        c.rdma_traffic_class = self.traffic_class.unwrap_or(ffi::HCCL_COMM_CONFIG_NOT_SET);
        c.rdma_service_level = self.service_level.unwrap_or(ffi::HCCL_COMM_CONFIG_NOT_SET);
        let name = self.comm_name.as_bytes();
        if name.is_empty() || name.len() >= ffi::COMM_NAME_MAX_LENGTH || name.contains(&0) {
            return Err(Error::InvalidOption {
                key: "hcclCommName".into(),
                value: self.comm_name.clone(),
                problem: "1 to 127 bytes and no NUL",
            });
        }
        for (d, s) in c.comm_name.iter_mut().zip(name) {
            *d = *s as std::ffi::c_char;
        }
        Ok(c)
    }
}

/// An `HcclComm`, destroyed on drop.
#[derive(Debug)]
pub(crate) struct Comm {
    hccl: Hccl,
    raw: NonNull<c_void>,
    #[cfg_attr(not(test), allow(dead_code))]
    rank: u32,
}

// SAFETY: an HcclComm may be used from any thread (HIXL's channels do); `!Sync` keeps calls on
// one communicator from running concurrently from safe code.
unsafe impl Send for Comm {}

impl Comm {
    /// This process's rank in the communicator.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn rank(&self) -> u32 {
        self.rank
    }
    /// The raw handle.
    pub(crate) fn as_raw(&self) -> *mut c_void {
        self.raw.as_ptr()
    }

    /// Destroys it now, reporting a failure (dropping destroys too, logging failures).
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn destroy(self) -> Result<(), Error> {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: the field is read once from a value that is never used or dropped again.
        let hccl = unsafe { std::ptr::read(&me.hccl) };
        hccl.destroy_raw(me.raw)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if let Err(e) = self.hccl.destroy_raw(self.raw) {
            tracing::warn!("HcclCommDestroy failed: {e}");
        }
    }
}

/// One one-sided operation: `len` bytes between `local` (this process) and `remote` (the remote
/// rank's address space).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OneSideDesc {
    /// Local address.
    pub(crate) local: u64,
    /// Remote address.
    pub(crate) remote: u64,
    /// Length in bytes.
    pub(crate) len: u64,
}

/// Which way bytes move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Local → remote (`HcclBatchPut`, HIXL `WRITE`).
    Put,
    /// Remote → local (`HcclBatchGet`, HIXL `READ`).
    Get,
}

impl Direction {
    /// HIXL's name for the operation, as timeouts report it.
    pub(crate) fn op_name(self) -> &'static str {
        match self {
            Self::Put => "WRITE",
            Self::Get => "READ",
        }
    }
}

/// The error for a failed HCCL call: `HCCL_E_TIMEOUT` is [`Error::Timeout`] (for `op` with
/// `peer`), anything else [`Error::Native`].
pub(crate) fn hccl_error(
    call: &'static str,
    code: HcclResult,
    op: &'static str,
    peer: &str,
    elapsed: Duration,
) -> Error {
    if code == ffi::HCCL_E_TIMEOUT {
        return Error::Timeout {
            op,
            peer: peer.to_owned(),
            elapsed,
        };
    }
    Error::Native {
        library: "hccl",
        call,
        code: i64::from(code),
        detail: ffi::hccl_result_name(code).to_owned(),
    }
}

fn check(
    call: &'static str,
    code: HcclResult,
    op: &'static str,
    peer: &str,
    start: Instant,
) -> Result<(), Error> {
    if code == ffi::HCCL_SUCCESS {
        Ok(())
    } else {
        Err(hccl_error(call, code, op, peer, start.elapsed()))
    }
}

impl Hccl {
    /// Loads HCCL (see [`HcclApi::load`] for the search order).
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`].
    pub(crate) fn load(path: Option<&Path>) -> Result<Self, Error> {
        Ok(Self {
            api: Arc::new(HcclApi::load(path)?),
        })
    }

    /// The name the library was opened by.
    pub(crate) fn library(&self) -> &str {
        self.api.library()
    }

    /// `HcclRegisterGlobalMem` for `len` bytes at `addr`.
    ///
    /// # Safety
    /// `addr..addr + len` must be memory of `kind` (from `aclrtMalloc` for device memory, or
    /// pinned host memory) that stays allocated until the returned [`GlobalMem`] is dropped, and
    /// remote ranks may write into it through communicators it is bound to: no Rust reference
    /// to that memory may be live while a peer can write it.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) unsafe fn register_global_mem(
        &self,
        kind: MemKind,
        addr: usize,
        len: u64,
    ) -> Result<GlobalMem, Error> {
        let mut regs = global_mems();
        let map = regs.get_or_insert_with(HashMap::new);
        let lib = self.library().to_owned();
        let end = (addr as u64).saturating_add(len);
        for ((l, a, n), r) in map.iter_mut() {
            if *l != lib {
                continue;
            }
            if (*a, *n) == (addr, len) && r.kind == kind {
                r.refs += 1;
                return Ok(GlobalMem {
                    hccl: self.clone(),
                    handle: NonNull::new(r.handle as *mut c_void).expect("stored non-null"),
                    addr,
                    len,
                    kind,
                });
            }
            if (addr as u64) < (*a as u64).saturating_add(*n) && (*a as u64) < end {
                return Err(Error::Native {
                    library: "hccl",
                    call: "HcclRegisterGlobalMem",
                    code: i64::from(ffi::HCCL_E_PARA),
                    detail: format!(
                        "HCCL_E_PARA: {addr:#x}+{len} overlaps the range {a:#x}+{n} this process \
                         registered already (HCCL keeps one registry per process; only the same \
                         range can be shared)"
                    ),
                });
            }
        }
        let mem = ffi::CommMem {
            mem_type: match kind {
                MemKind::Device => ffi::COMM_MEM_TYPE_DEVICE,
                MemKind::Host => ffi::COMM_MEM_TYPE_HOST,
            },
            addr: addr as *mut c_void,
            size: len,
        };
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: `mem` and `h` are valid for the call; the caller vouches for the range.
        let rc = unsafe { (self.api.register_global_mem)(&mem, &mut h) };
        check("HcclRegisterGlobalMem", rc, "register", "", Instant::now())?;
        let handle = NonNull::new(h).ok_or_else(|| Error::Native {
            library: "hccl",
            call: "HcclRegisterGlobalMem",
            code: 0,
            detail: "HCCL_SUCCESS with a null handle".into(),
        })?;
        map.insert(
            (lib, addr, len),
            SharedReg {
                handle: handle.as_ptr() as usize,
                kind,
                refs: 1,
            },
        );
        Ok(GlobalMem {
            hccl: self.clone(),
            handle,
            addr,
            len,
            kind,
        })
    }

    /// Drops one reference to a registration; the last one deregisters it.
    fn release_global_mem(
        &self,
        handle: NonNull<c_void>,
        addr: usize,
        len: u64,
    ) -> Result<(), Error> {
        let mut regs = global_mems();
        let key = (self.library().to_owned(), addr, len);
        if let Some(r) = regs.as_mut().and_then(|m| m.get_mut(&key))
            && r.handle == handle.as_ptr() as usize
        {
            r.refs -= 1;
            if r.refs > 0 {
                return Ok(());
            }
            regs.as_mut().map(|m| m.remove(&key));
        }
        drop(regs);
        self.deregister_raw(handle)
    }

    fn deregister_raw(&self, handle: NonNull<c_void>) -> Result<(), Error> {
        // SAFETY: the handle came from HcclRegisterGlobalMem and its last reference is gone.
        let rc = unsafe { (self.api.deregister_global_mem)(handle.as_ptr()) };
        check(
            "HcclDeregisterGlobalMem",
            rc,
            "deregister",
            "",
            Instant::now(),
        )
    }

    fn destroy_raw(&self, comm: NonNull<c_void>) -> Result<(), Error> {
        // SAFETY: the communicator came from HcclCommInitClusterInfoMemConfig and is destroyed
        // once.
        let rc = unsafe { (self.api.comm_destroy)(comm.as_ptr()) };
        check("HcclCommDestroy", rc, "disconnect", "", Instant::now())
    }

    /// `HcclCommInitClusterInfoMemConfig(rank_table, rank, cfg)`: a communicator over the ranks
    /// of `rank_table` (HCCL rank-table JSON, version "1.0" or "1.2"), this process being
    /// `rank`. Holds the process-wide init lock for the call.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a rank table containing NUL or a bad comm name;
    /// [`Error::Timeout`] / [`Error::Native`].
    pub(crate) fn init_comm(
        &self,
        rank_table: &str,
        rank: u32,
        cfg: &CommConfig,
    ) -> Result<Comm, Error> {
        let table = CString::new(rank_table).map_err(|_| Error::InvalidOption {
            key: "rank_table".into(),
            value: rank_table.to_owned(),
            problem: "JSON without NUL bytes",
        })?;
        let mut c = cfg.to_ffi()?;
        let mut comm: *mut c_void = std::ptr::null_mut();
        let start = Instant::now();
        let serial = lock(&INIT_LOCK);
        // SAFETY: all pointers are valid for the call; `c` is a fully initialised v5 config.
        let rc = unsafe {
            (self.api.comm_init_cluster_info_mem_config)(table.as_ptr(), rank, &mut c, &mut comm)
        };
        drop(serial);
        check("HcclCommInitClusterInfoMemConfig", rc, "connect", "", start)?;
        let raw = NonNull::new(comm).ok_or_else(|| Error::Native {
            library: "hccl",
            call: "HcclCommInitClusterInfoMemConfig",
            code: 0,
            detail: "HCCL_SUCCESS with a null communicator".into(),
        })?;
        Ok(Comm {
            hccl: self.clone(),
            raw,
            rank,
        })
    }

    /// `HcclCommBindMem`: makes a registration usable through `comm`.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn bind(&self, comm: &Comm, mem: &GlobalMem) -> Result<(), Error> {
        // SAFETY: both handles are alive (borrowed).
        let rc = unsafe { (self.api.comm_bind_mem)(comm.as_raw(), mem.as_raw()) };
        check("HcclCommBindMem", rc, "connect", "", Instant::now())
    }

    /// `HcclCommUnbindMem`.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn unbind(&self, comm: &Comm, mem: &GlobalMem) -> Result<(), Error> {
        // SAFETY: both handles are alive (borrowed).
        let rc = unsafe { (self.api.comm_unbind_mem)(comm.as_raw(), mem.as_raw()) };
        check("HcclCommUnbindMem", rc, "disconnect", "", Instant::now())
    }

    /// `HcclCommPrepare` (full mesh): connects the data plane and exchanges bound memory.
    /// Blocks up to `timeout`, rounded up to whole seconds as HIXL does (`ceil(ms / 1000)`).
    ///
    /// # Errors
    /// [`Error::Timeout`] (`op: "connect"`, `peer`) for `HCCL_E_TIMEOUT`; [`Error::Native`].
    pub(crate) fn prepare(&self, comm: &Comm, timeout: Duration, peer: &str) -> Result<(), Error> {
        let cfg = ffi::HcclPrepareConfig {
            topo_type: ffi::HCCL_TOPO_FULLMESH,
            rsvd0: 0,
            rsvd1: 0,
            rsvd2: 0,
        };
        let secs = c_int::try_from(timeout.as_millis().div_ceil(1000).max(1)).unwrap_or(c_int::MAX);
        let start = Instant::now();
        // SAFETY: the communicator is alive (borrowed) and `cfg` is valid for the call.
        let rc = unsafe { (self.api.comm_prepare)(comm.as_raw(), &cfg, secs) };
        check("HcclCommPrepare", rc, "connect", peer, start)
    }

    /// Moves bytes for every descriptor: `HcclBatchPut`/`HcclBatchGet` in calls of at most
    /// `per_call` descriptors on `stream`, then `aclrtSynchronizeStreamWithTimeout` with what is
    /// left of `timeout`. Runs under the stream's context.
    ///
    /// On an error, copies issued by earlier calls may still be queued on the stream (a
    /// stream-sync timeout does not cancel them either): the caller aborts the stream
    /// ([`Acl::abort`]) before it releases any memory they touch.
    ///
    /// # Safety
    /// Every local range must lie in memory registered with HCCL and bound to `comm`, allocated
    /// until this returns and until the stream is drained or aborted; for [`Direction::Get`] no
    /// Rust reference to a local range may be live (HCCL writes it). Remote ranges are the
    /// remote rank's business, but must be registered and bound there.
    ///
    /// # Errors
    /// [`Error::EmptyBatch`]; [`Error::Timeout`] (HCCL or stream-sync timeouts, as
    /// `direction.op_name()` with `peer`); [`Error::Native`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn transfer(
        &self,
        acl: &Acl,
        comm: &Comm,
        remote_rank: u32,
        direction: Direction,
        descs: &[OneSideDesc],
        per_call: usize,
        stream: &Stream,
        timeout: Duration,
        peer: &str,
    ) -> Result<(), Error> {
        if descs.is_empty() {
            return Err(Error::EmptyBatch);
        }
        let per_call = per_call.clamp(1, MAX_DESCS_PER_CALL);
        let start = Instant::now();
        let op = direction.op_name();
        let _guard = match stream.context() {
            Some(c) => Some(acl.enter(c)?),
            None => None,
        };
        let (call, f) = match direction {
            Direction::Put => ("HcclBatchPut", self.api.batch_put),
            Direction::Get => ("HcclBatchGet", self.api.batch_get),
        };
        let mut chunk: Vec<ffi::HcclOneSideOpDesc> = Vec::with_capacity(per_call.min(descs.len()));
        for part in descs.chunks(per_call) {
            chunk.clear();
            chunk.extend(part.iter().map(|d| ffi::HcclOneSideOpDesc {
                local_addr: d.local as usize as *mut c_void,
                remote_addr: d.remote as usize as *mut c_void,
                count: d.len,
                data_type: ffi::HCCL_DATA_TYPE_UINT8,
            }));
            let n = u32::try_from(chunk.len()).unwrap_or(u32::MAX);
            // SAFETY: `chunk` holds `n` initialised descriptors and lives across the call; the
            // communicator and stream are alive (borrowed); the caller vouches for the ranges.
            let rc = unsafe {
                f(
                    comm.as_raw(),
                    remote_rank,
                    chunk.as_mut_ptr(),
                    n,
                    stream.as_raw(),
                )
            };
            check(call, rc, op, peer, start)?;
        }
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            // still give the stream a chance to drain: HIXL always synchronises
            return acl.synchronize(stream, Duration::from_millis(1), op, peer);
        }
        acl.synchronize(stream, left, op, peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;
    use crate::transport::ascend::acl::MallocPolicy;
    use crate::transport::ascend::acl::tests::Fixture;

    /// A one-server rank table; every rank on physical device `phy` (the double maps logical
    /// device 0 to physical 10).
    fn rank_table_on(ips: &[&str], phy: u32) -> String {
        let devices: Vec<serde_json::Value> = ips
            .iter()
            .enumerate()
            .map(|(i, ip)| {
                serde_json::json!({"device_id": phy.to_string(), "device_ip": ip, "rank_id": i.to_string()})
            })
            .collect();
        serde_json::json!({"version": "1.0", "server_count": "1", "status": "completed",
            "server_list": [{"server_id": "10.0.0.1", "device": devices}]})
        .to_string()
    }

    fn rank_table(ips: &[&str]) -> String {
        rank_table_on(ips, 10)
    }

    // fields drop in order: the fixture (which deletes the log) goes last
    struct Ranks {
        hccl: Hccl,
        stream: Stream,
        comms: Vec<Comm>,
        mems: Vec<GlobalMem>,
        bufs: Vec<super::super::acl::AclBuffer>,
        f: Fixture,
    }

    /// Two ranks in this process, each with a 1 MiB HUGE_ONLY buffer registered and bound.
    fn two_ranks(tag: &str) -> Ranks {
        let f = Fixture::new(tag);
        let hccl = Hccl::load(Some(&f.so)).expect("load the double as HCCL");
        f.acl.init().unwrap();
        f.acl.set_device(0).unwrap();
        let table = rank_table(&["192.168.100.1", "192.168.100.2"]);
        let cfg = CommConfig {
            comm_name: "hixl_a_b".into(),
            traffic_class: Some(132),
            ..CommConfig::default()
        };
        let mut comms = Vec::new();
        let mut bufs = Vec::new();
        let mut mems = Vec::new();
        for rank in 0..2 {
            let comm = hccl.init_comm(&table, rank, &cfg).unwrap();
            assert_eq!(comm.rank(), rank);
            let buf = f
                .acl
                .malloc_device(1 << 20, MallocPolicy::HugeOnly)
                .unwrap();
            // SAFETY: the buffer outlives the registration (dropped after `mems`), and no Rust
            // reference to its bytes exists.
            let mem =
                unsafe { hccl.register_global_mem(MemKind::Device, buf.addr(), 1 << 20) }.unwrap();
            hccl.bind(&comm, &mem).unwrap();
            comms.push(comm);
            bufs.push(buf);
            mems.push(mem);
        }
        for comm in &comms {
            hccl.prepare(comm, Duration::from_millis(1500), "peer")
                .unwrap();
        }
        let stream = f.acl.create_stream().unwrap();
        Ranks {
            f,
            hccl,
            stream,
            comms,
            bufs,
            mems,
        }
    }

    impl Ranks {
        fn teardown(mut self) {
            for (comm, mem) in self.comms.iter().zip(&self.mems) {
                self.hccl.unbind(comm, mem).unwrap();
            }
            for mem in self.mems.drain(..) {
                mem.deregister().unwrap();
            }
            for comm in self.comms.drain(..) {
                comm.destroy().unwrap();
            }
        }
    }

    #[test]
    fn put_and_get_move_bytes_between_two_ranks() {
        let r = two_ranks("hccl-move");
        let (acl, hccl) = (&r.f.acl, &r.hccl);
        let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        acl.write(&r.bufs[0], 0, &pattern).unwrap();
        let descs: Vec<OneSideDesc> = (0..4)
            .map(|i| OneSideDesc {
                local: (r.bufs[0].addr() + i * 1024) as u64,
                remote: (r.bufs[1].addr() + 8192 + i * 1024) as u64,
                len: 1024,
            })
            .collect();
        // SAFETY: every local range is inside rank 0's registered, bound, live buffer.
        unsafe {
            hccl.transfer(
                acl,
                &r.comms[0],
                1,
                Direction::Put,
                &descs,
                MAX_DESCS_PER_CALL,
                &r.stream,
                Duration::from_secs(1),
                "b",
            )
        }
        .unwrap();
        let mut got = vec![0u8; 4096];
        acl.read(&r.bufs[1], 8192, &mut got).unwrap();
        assert_eq!(got, pattern, "WRITE landed in rank 1");

        // READ it back into rank 0 at another offset
        let back = [OneSideDesc {
            local: (r.bufs[0].addr() + 65536) as u64,
            remote: (r.bufs[1].addr() + 8192) as u64,
            len: 4096,
        }];
        // SAFETY: the local range is inside rank 0's registered, bound, live buffer, and no
        // Rust reference to it exists.
        unsafe {
            hccl.transfer(
                acl,
                &r.comms[0],
                1,
                Direction::Get,
                &back,
                MAX_DESCS_PER_CALL,
                &r.stream,
                Duration::from_secs(1),
                "b",
            )
        }
        .unwrap();
        let mut got = vec![0u8; 4096];
        acl.read(&r.bufs[0], 65536, &mut got).unwrap();
        assert_eq!(got, pattern, "READ brought it back");

        // a local range outside bound memory is refused by HCCL
        let bad = [OneSideDesc {
            local: (r.bufs[0].addr() + (1 << 20) - 10) as u64,
            remote: r.bufs[1].addr() as u64,
            len: 20,
        }];
        // SAFETY: the double checks and refuses the range before touching memory.
        let e = unsafe {
            hccl.transfer(
                acl,
                &r.comms[0],
                1,
                Direction::Put,
                &bad,
                MAX_DESCS_PER_CALL,
                &r.stream,
                Duration::from_secs(1),
                "b",
            )
        }
        .unwrap_err();
        assert!(
            matches!(&e, Error::Native { library: "hccl", call: "HcclBatchPut", code: 1, detail, .. } if detail == "HCCL_E_PARA"),
            "{e:?}"
        );
        assert_eq!(e.status(), Status::FAILED);
        // SAFETY: empty batches are refused before any call.
        let e = unsafe {
            hccl.transfer(
                acl,
                &r.comms[0],
                1,
                Direction::Put,
                &[],
                MAX_DESCS_PER_CALL,
                &r.stream,
                Duration::from_secs(1),
                "b",
            )
        }
        .unwrap_err();
        assert!(matches!(e, Error::EmptyBatch));

        let log = r.f.log_lines();
        assert!(
            log.iter().any(|l| l.starts_with(
                "HcclCommInitClusterInfoMemConfig rank=0 nranks=2 device_ip=192.168.100.1 name=hixl_a_b version=5 size=304 bufsize=200 tc=132 sl=4294967295 table=1.0 device_id=10 "
            )),
            "{log:#?}"
        );
        assert!(
            log.iter()
                .any(|l| l.starts_with("HcclBatchGet rank=1 num=1 rc=0"))
        );
        r.teardown();
    }

    #[test]
    fn batches_are_issued_in_chunks_of_256() {
        let r = two_ranks("hccl-chunk");
        let descs: Vec<OneSideDesc> = (0..600)
            .map(|i| OneSideDesc {
                local: (r.bufs[0].addr() + i * 1000) as u64,
                remote: (r.bufs[1].addr() + i * 1000) as u64,
                len: 1000,
            })
            .collect();
        // SAFETY: every local range is inside rank 0's registered, bound, live buffer.
        unsafe {
            r.hccl.transfer(
                &r.f.acl,
                &r.comms[0],
                1,
                Direction::Put,
                &descs,
                MAX_DESCS_PER_CALL,
                &r.stream,
                Duration::from_secs(2),
                "b",
            )
        }
        .unwrap();
        let log = r.f.log_lines();
        let calls: Vec<&str> = log
            .iter()
            .filter(|l| l.starts_with("HcclBatchPut "))
            .map(String::as_str)
            .collect();
        assert_eq!(
            calls,
            [
                "HcclBatchPut rank=1 num=256 rc=0",
                "HcclBatchPut rank=1 num=256 rc=0",
                "HcclBatchPut rank=1 num=88 rc=0"
            ]
        );
        let syncs: Vec<&String> = log
            .iter()
            .filter(|l| l.starts_with("aclrtSynchronizeStreamWithTimeout "))
            .collect();
        assert_eq!(syncs.len(), 1, "one sync after all chunks: {syncs:?}");
        assert!(syncs[0].contains(" ops=600 rc=0"), "{syncs:?}");
        r.teardown();
    }

    #[test]
    fn hccl_failures_map_to_timeout_and_native() {
        let r = two_ranks("hccl-fail");
        let descs = [OneSideDesc {
            local: r.bufs[0].addr() as u64,
            remote: r.bufs[1].addr() as u64,
            len: 64,
        }];
        r.f.fail("HcclBatchGet=9");
        // SAFETY: the local range is inside rank 0's registered, bound, live buffer.
        let e = unsafe {
            r.hccl.transfer(
                &r.f.acl,
                &r.comms[0],
                1,
                Direction::Get,
                &descs,
                MAX_DESCS_PER_CALL,
                &r.stream,
                Duration::from_secs(1),
                "10.0.0.9",
            )
        }
        .unwrap_err();
        assert!(
            matches!(&e, Error::Timeout { op: "READ", peer, .. } if peer == "10.0.0.9"),
            "{e:?}"
        );
        assert_eq!(e.status(), Status::TIMEOUT);
        assert!(
            r.f.log_lines()
                .iter()
                .any(|l| l == "HcclBatchGet rank=1 num=1 rc=9"),
            "{:#?}",
            r.f.log_lines()
        );
        r.f.fail("HcclCommPrepare=9");
        let e = r
            .hccl
            .prepare(&r.comms[0], Duration::from_millis(10), "p")
            .unwrap_err();
        assert!(matches!(&e, Error::Timeout { op: "connect", .. }), "{e:?}");
        r.f.fail("HcclCommBindMem");
        let e = r.hccl.bind(&r.comms[0], &r.mems[1]).unwrap_err();
        assert!(
            matches!(&e, Error::Native { library: "hccl", call: "HcclCommBindMem", code: 4, detail, .. } if detail == "HCCL_E_INTERNAL"),
            "{e:?}"
        );
        assert_eq!(e.status(), Status::FAILED);
        r.f.fail("sync_timeout");
        // SAFETY: as above.
        let e = unsafe {
            r.hccl.transfer(
                &r.f.acl,
                &r.comms[0],
                1,
                Direction::Put,
                &descs,
                MAX_DESCS_PER_CALL,
                &r.stream,
                Duration::from_secs(1),
                "p",
            )
        }
        .unwrap_err();
        assert!(matches!(&e, Error::Timeout { op: "WRITE", .. }), "{e:?}");
        r.f.fail("");
        // the timed-out copy is still queued: nothing it touches may be unbound before an abort
        let e = r.hccl.unbind(&r.comms[0], &r.mems[0]).unwrap_err();
        assert!(matches!(&e, Error::Native { code: 1, .. }), "{e:?}");
        r.f.acl.abort(&r.stream).unwrap();
        assert!(
            r.f.log_lines()
                .iter()
                .any(|l| l.starts_with("aclrtStreamAbort ") && l.ends_with(" dropped=1 rc=0")),
            "{:#?}",
            r.f.log_lines()
        );
        r.teardown();
    }

    #[test]
    fn prepare_times_out_when_a_peer_never_announces() {
        let f = Fixture::new("hccl-lonely");
        let dir = f.so.with_extension("dir");
        std::fs::create_dir_all(&dir).unwrap();
        crate::transport::ascend::double::control(&f.so, "dir", Some(&dir.to_string_lossy()));
        let hccl = Hccl::load(Some(&f.so)).unwrap();
        f.acl.init().unwrap();
        f.acl.set_device(0).unwrap();
        let cfg = CommConfig {
            comm_name: "lonely".into(),
            ..CommConfig::default()
        };
        let comm = hccl
            .init_comm(&rank_table(&["10.1.1.1", "10.1.1.2"]), 0, &cfg)
            .unwrap();
        assert!(dir.join("10.1.1.1").exists(), "rank 0 announced itself");
        let t = Instant::now();
        let e = hccl
            .prepare(&comm, Duration::from_millis(200), "10.1.1.2")
            .unwrap_err();
        assert!(
            t.elapsed() >= Duration::from_millis(900),
            "rounded up to a whole second"
        );
        assert!(
            matches!(&e, Error::Timeout { op: "connect", peer, .. } if peer == "10.1.1.2"),
            "{e:?}"
        );
        drop(comm);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn comm_names_are_bounded() {
        let ok = CommConfig {
            comm_name: "x".repeat(127),
            service_level: Some(4),
            ..CommConfig::default()
        }
        .to_ffi()
        .unwrap();
        assert_eq!(ok.comm_name[126], b'x' as std::ffi::c_char);
        assert_eq!(ok.comm_name[127], 0);
        assert_eq!(ok.rdma_service_level, 4);
        assert_eq!(ok.rdma_traffic_class, u32::MAX);
        for bad in ["x".repeat(128), "a\0b".to_owned(), String::new()] {
            let e = CommConfig {
                comm_name: bad,
                ..CommConfig::default()
            }
            .to_ffi()
            .unwrap_err();
            assert_eq!(e.status(), Status::PARAM_INVALID);
        }
    }

    fn init_fixture(tag: &str) -> (Fixture, Hccl) {
        let f = Fixture::new(tag);
        let hccl = Hccl::load(Some(&f.so)).expect("load the double as HCCL");
        f.acl.init().unwrap();
        f.acl.set_device(0).unwrap();
        (f, hccl)
    }

    fn named(name: &str) -> CommConfig {
        CommConfig {
            comm_name: name.into(),
            ..CommConfig::default()
        }
    }

    /// Item 2: HCCL does not support parallel `HcclCommInitClusterInfoMemConfig` (the double
    /// fails every call that overlaps another); `init_comm` serialises them process-wide.
    #[test]
    fn concurrent_comm_inits_are_serialised() {
        let (f, hccl) = init_fixture("hccl-serial");
        crate::transport::ascend::double::control(&f.so, "init_hold_ms", Some("100"));
        let ctx = f.acl.current_context().unwrap();
        let table = rank_table(&["10.2.0.1", "10.2.0.2"]);
        let start = std::sync::Barrier::new(4);
        let results: Vec<Result<Comm, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|i| {
                    let (hccl, acl, table, start) = (&hccl, &f.acl, &table, &start);
                    s.spawn(move || {
                        let _g = acl.enter(ctx).unwrap();
                        start.wait();
                        hccl.init_comm(table, 0, &named(&format!("serial_{i}")))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in &results {
            assert!(r.is_ok(), "{r:?}");
        }
        drop(results);
        let log = f.log_lines();
        assert!(!log.iter().any(|l| l.contains(" overlap=1 ")), "{log:#?}");
        assert_eq!(
            log.iter()
                .filter(
                    |l| l.starts_with("HcclCommInitClusterInfoMemConfig ") && l.ends_with("rc=0")
                )
                .count(),
            4
        );
    }

    /// Item 1 (the double's side): a rank table naming the logical id where HCCL expects the
    /// physical one is `HCCL_E_UNAVAIL`; item 3: an empty or live name is `HCCL_E_PARA`.
    #[test]
    fn the_double_checks_device_ids_and_names_like_hccl() {
        let (f, hccl) = init_fixture("hccl-strict");
        assert_eq!(f.acl.physical_device_id(0).unwrap(), 10);
        crate::transport::ascend::double::control(&f.so, "phy_map", Some("0:3,1:0"));
        assert_eq!(f.acl.physical_device_id(0).unwrap(), 3);
        assert_eq!(f.acl.physical_device_id(1).unwrap(), 0);
        let e = hccl
            .init_comm(&rank_table_on(&["10.3.0.1"], 0), 0, &named("logical"))
            .unwrap_err();
        assert!(
            matches!(&e, Error::Native { call: "HcclCommInitClusterInfoMemConfig", code: 7, detail, .. } if detail == "HCCL_E_UNAVAIL"),
            "{e:?}"
        );
        let comm = hccl
            .init_comm(&rank_table_on(&["10.3.0.1"], 3), 0, &named("physical"))
            .unwrap();
        let e = hccl
            .init_comm(&rank_table_on(&["10.3.0.1"], 3), 0, &named("physical"))
            .unwrap_err();
        assert!(matches!(&e, Error::Native { code: 1, .. }), "{e:?}");
        comm.destroy().unwrap();
        let again = hccl
            .init_comm(&rank_table_on(&["10.3.0.1"], 3), 0, &named("physical"))
            .expect("the name is free once the comm is destroyed");
        drop(again);
    }

    /// Item 4: HCCL keeps one registry per process (the same range gets the same handle back);
    /// two registrations of one range share it, and only the last one deregisters. An
    /// overlapping range is refused before HCCL is called.
    #[test]
    fn one_range_registered_twice_shares_one_hccl_registration() {
        let (f, hccl) = init_fixture("hccl-shared");
        let buf = f
            .acl
            .malloc_device(1 << 20, MallocPolicy::HugeOnly)
            .unwrap();
        let cfg = named("shared");
        let comm = hccl
            .init_comm(&rank_table(&["10.4.0.1", "10.4.0.2"]), 0, &cfg)
            .unwrap();
        // SAFETY: the buffer outlives both registrations, and no Rust reference to its bytes
        // exists.
        let a = unsafe { hccl.register_global_mem(MemKind::Device, buf.addr(), 1 << 20) }.unwrap();
        // SAFETY: as above.
        let b = unsafe { hccl.register_global_mem(MemKind::Device, buf.addr(), 1 << 20) }.unwrap();
        assert_eq!(a.as_raw(), b.as_raw());
        // SAFETY: as above (refused before any HCCL call).
        let e = unsafe { hccl.register_global_mem(MemKind::Device, buf.addr() + 4096, 4096) }
            .unwrap_err();
        assert!(
            matches!(
                &e,
                Error::Native {
                    call: "HcclRegisterGlobalMem",
                    code: 1,
                    ..
                }
            ),
            "{e:?}"
        );
        a.deregister().unwrap();
        // still registered for `b`
        hccl.bind(&comm, &b)
            .expect("the handle outlives the first deregistration");
        hccl.unbind(&comm, &b).unwrap();
        let log = f.log_lines();
        assert!(
            !log.iter()
                .any(|l| l.starts_with("HcclDeregisterGlobalMem ")),
            "{log:#?}"
        );
        assert_eq!(
            log.iter()
                .filter(|l| l.starts_with("HcclRegisterGlobalMem "))
                .count(),
            1,
            "{log:#?}"
        );
        drop(b);
        let log = f.log_lines();
        assert_eq!(
            log.iter()
                .filter(|l| l.starts_with("HcclDeregisterGlobalMem ") && l.ends_with("rc=0"))
                .count(),
            1,
            "{log:#?}"
        );
        drop(comm);
        drop(buf);
    }
}
