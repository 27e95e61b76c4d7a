//! LLM-DataDist's C ABI (`hixl_dd_*`, declared in `include/hixl_dd.h`): the runtime-checked
//! instance [`hixl_rs::datadist::DataDist`] as C functions, for `libllm_datadist.so`'s
//! `llm_datadist::LlmDataDist` (`cxx/llm_datadist.cc`) and any C caller.
//!
//! The rules are the engine ABI's (`lib.rs`), with LLM-DataDist's status codes: every entry
//! point runs under `catch_unwind` (a panic is `LLM_FAILED`), translates its pointers (null →
//! `LLM_PARAM_INVALID`), strings (not UTF-8 → `LLM_PARAM_INVALID`), enum values and counts,
//! and looks its handle up in a registry (an unknown or destroyed handle is
//! `LLM_PARAM_INVALID`, never a dereference); a failure leaves its cause for
//! `hixl_last_error_message` (the same thread-local buffer as the engine's calls). What an
//! argument may be is the instance's to say (`hixl_rs::datadist::args`): nothing here checks a
//! value, and a translation that fails on a live handle is reported after what the instance
//! reports first ([`DataDist::refuse`]: `LLM_FAILED` before `Initialize`).
//!
//! `cann.rs`: the calls of CANN's C++ class in its own argument forms (`hixl_dd_cann_*`), which
//! `cxx/llm_datadist.cc` forwards to.

use std::collections::HashMap;
use std::ffi::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};

use hixl_rs::datadist::{ClusterInfo, DataDist, Error, LlmStatus, Role, args};

use crate::{put, set_error, slice, string};

mod cann;
mod translate;
use translate::{blocks, by_id, cache_desc, clusters, index, layers, lists, options, put_rets};

/// A status code: LLM-DataDist's values (0 `LLM_SUCCESS`, 0x5010B005 `LLM_PARAM_INVALID`, ...).
pub type LlmStatusCode = u32;

/// An LLM-DataDist instance handle (`hixl_dd *`): opaque to C, a key in the registry, never
/// dereferenced and never reused in a process.
pub struct HixlDd {
    _private: [u8; 0],
}

/// `hixl_dd_ip_info`: an address (`IpInfo`): a NUL-terminated IPv4 or IPv6 text and a port.
#[repr(C)]
pub struct DdIpInfo {
    /// The address, as text.
    pub ip: *const c_char,
    /// The port.
    pub port: u16,
}

/// `hixl_dd_cluster_info`: a peer cluster (`ClusterInfo`).
#[repr(C)]
pub struct DdClusterInfo {
    /// The peer's cluster id.
    pub remote_cluster_id: u64,
    /// The peer's role (informative).
    pub remote_role_type: i32,
    /// This side's addresses (informative): `local_ip_count` of them.
    pub local_ip_infos: *const DdIpInfo,
    /// How many `local_ip_infos`.
    pub local_ip_count: usize,
    /// The peer's listen address(es): `remote_ip_count` of them (one to link).
    pub remote_ip_infos: *const DdIpInfo,
    /// How many `remote_ip_infos`.
    pub remote_ip_count: usize,
}

/// `hixl_dd_cache_desc`: a cache's description (`CacheDesc`).
#[repr(C)]
pub struct DdCacheDesc {
    /// `HIXL_DD_PLACEMENT_HOST` 0 or `HIXL_DD_PLACEMENT_DEVICE` 1.
    pub placement: u32,
    /// How many tensors.
    pub num_tensors: u32,
    /// A `ge::DataType` value.
    pub data_type: i32,
    /// Each tensor's shape: `shape_len` dimensions.
    pub shape: *const i64,
    /// How many dimensions.
    pub shape_len: usize,
}

/// `hixl_dd_cache_index`: a peer's cache (`CacheIndex`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DdCacheIndex {
    /// The peer's cluster id.
    pub cluster_id: u64,
    /// Its cache id.
    pub cache_id: i64,
    /// The batch (0 for blocks).
    pub batch_index: u32,
}

/// `hixl_dd_layers`: the layers a transfer moves (`KvCacheExtParam`). A side's range is
/// `first..=last` (layers of `tensor_num_per_layer` tensors), or `-1, -1` for every tensor;
/// give both sides' ranges or neither.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DdLayers {
    /// The source's first layer, or -1.
    pub src_first: i32,
    /// The source's last layer, or -1.
    pub src_last: i32,
    /// The destination's first layer, or -1.
    pub dst_first: i32,
    /// The destination's last layer, or -1.
    pub dst_last: i32,
    /// Tensors per layer (at least 1; 2 by default: K and V).
    pub tensor_num_per_layer: u32,
}

// the header's layouts on LP64 (include/hixl_dd.h and cxx/llm_datadist.cc assert the same)
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::offset_of;
    assert!(size_of::<DdIpInfo>() == 16 && offset_of!(DdIpInfo, port) == 8);
    assert!(size_of::<DdClusterInfo>() == 48 && offset_of!(DdClusterInfo, local_ip_infos) == 16);
    assert!(size_of::<DdCacheDesc>() == 32 && offset_of!(DdCacheDesc, shape) == 16);
    assert!(size_of::<DdCacheIndex>() == 24 && offset_of!(DdCacheIndex, batch_index) == 16);
    assert!(size_of::<DdLayers>() == 20);
};

type Registry = Mutex<HashMap<usize, Arc<DataDist>>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A failed call: its LLM status and its message.
type Fail = (LlmStatus, String);
type R<T> = Result<T, Fail>;

fn invalid(msg: impl Into<String>) -> Fail {
    (LlmStatus::LLM_PARAM_INVALID, msg.into())
}

fn fail(e: Error) -> Fail {
    (e.status, e.message)
}

/// A failed translation of a call's arguments, as the live instance `d` reports it (after its
/// own failure, [`DataDist::refuse`]).
fn refused(d: &DataDist) -> impl Fn(Fail) -> Fail + '_ {
    move |(status, msg)| fail(d.refuse(Error::new(status, msg)))
}

/// Runs `call` on the instance `dd` with the arguments `args` translates (a translation's
/// failure reported after the instance's own, [`refused`]).
fn with<A>(
    dd: *mut HixlDd,
    args: impl FnOnce() -> R<A>,
    call: impl FnOnce(&DataDist, A) -> Result<(), Error>,
) -> LlmStatusCode {
    entry(|| {
        let d = instance(dd)?;
        let a = args().map_err(refused(&d))?;
        call(&d, a).map_err(fail)
    })
}

/// The engine ABI's failures (`PARAM_INVALID` of its pointer helpers) as LLM ones.
fn of_engine((status, msg): (u32, String)) -> Fail {
    let s = hixl_rs::Status::from_code(status).unwrap_or(hixl_rs::Status::FAILED);
    (LlmStatus::of_engine(s), msg)
}

/// Runs an entry point: a panic becomes `LLM_FAILED`, a failure leaves its message.
fn entry(f: impl FnOnce() -> R<()>) -> LlmStatusCode {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err((status, msg))) => {
            set_error(&msg);
            status.code()
        }
        Err(_) => {
            set_error("internal error: a panic was caught at the C boundary");
            LlmStatus::LLM_FAILED.code()
        }
    }
}

fn instance(h: *mut HixlDd) -> R<Arc<DataDist>> {
    registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(h as usize))
        .cloned()
        .ok_or_else(|| invalid(format!("{h:p} is not a live LLM-DataDist handle")))
}

fn role(v: i32) -> R<Role> {
    Role::from_value(v).ok_or_else(|| invalid(format!("{v} is not a role (1, 2, 3)")))
}

/// Creates an LLM-DataDist instance for `cluster_id` in `role` (1 prompt, 2 decoder, 3 mix),
/// not initialized yet, and stores its handle in `*out`.
///
/// # Safety
/// `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_create(
    cluster_id: u64,
    role: i32,
    out: *mut *mut HixlDd,
) -> LlmStatusCode {
    entry(|| {
        if out.is_null() {
            return Err(invalid("out is null"));
        }
        let role = self::role(role)?;
        let key = super::NEXT_HANDLE.fetch_add(16, std::sync::atomic::Ordering::Relaxed);
        registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, Arc::new(DataDist::new(cluster_id, role)));
        // SAFETY: checked not null; writable by the caller's contract.
        unsafe { put(out, key as *mut HixlDd, "out") }.map_err(of_engine)
    })
}

/// Finalizes (if needed) and destroys an instance; the handle is unknown afterwards. A null or
/// unknown handle is ignored.
///
/// # Safety
/// Any pointer value is accepted (it is looked up, not dereferenced).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_destroy(dd: *mut HixlDd) {
    entry(|| {
        let d = registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(dd as usize));
        if let Some(d) = d {
            d.finalize();
        }
        Ok(())
    });
}

/// `Initialize(options)`: `count` option pairs by CANN's keys (`llm.ListenIpInfo`,
/// `llm.DeviceId`, `llm.SyncKvCacheWaitTime`, `llm.TransferBackend`, ...;
/// [`DataDist::initialize`]). A second call succeeds and changes nothing.
///
/// # Safety
/// `keys` and `values` are null (with `count` 0) or arrays of `count` NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_initialize(
    dd: *mut HixlDd,
    keys: *const *const c_char,
    values: *const *const c_char,
    count: usize,
) -> LlmStatusCode {
    // SAFETY: the caller's contract.
    unsafe { initialize(dd, keys, values, count, DataDist::initialize) }
}

/// An `Initialize`: `call` with the `count` option pairs at `keys` and `values` (not
/// [`with`]: nothing is reported before an `Initialize`'s arguments).
///
/// # Safety
/// As [`hixl_dd_initialize`].
unsafe fn initialize(
    dd: *mut HixlDd,
    keys: *const *const c_char,
    values: *const *const c_char,
    count: usize,
    call: impl FnOnce(&DataDist, &[(String, String)]) -> Result<(), Error>,
) -> LlmStatusCode {
    entry(|| {
        let d = instance(dd)?;
        // SAFETY: the caller's contract.
        let opts = unsafe { options(keys, values, count) }?;
        call(&d, &opts).map_err(fail)
    })
}

/// `Finalize()`: links go, caches are deregistered, the engine is finalized; idempotent.
///
/// # Safety
/// Any pointer value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_finalize(dd: *mut HixlDd) -> LlmStatusCode {
    entry(|| {
        instance(dd)?.finalize();
        Ok(())
    })
}

/// `SetRole(role, options)` ([`DataDist::set_role`]): with `llm.ListenIpInfo` the instance
/// listens there from now on (`LLM_EXIST_LINK` while links exist).
///
/// # Safety
/// As [`hixl_dd_initialize`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_set_role(
    dd: *mut HixlDd,
    role: i32,
    keys: *const *const c_char,
    values: *const *const c_char,
    count: usize,
) -> LlmStatusCode {
    // SAFETY: the caller's contract.
    let args = || Ok((self::role(role)?, unsafe { options(keys, values, count) }?));
    with(dd, args, |d, (role, opts)| d.set_role(role, &opts))
}

/// The instance's current role (1, 2, 3) in `*role`.
///
/// # Safety
/// `role` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_role(dd: *mut HixlDd, role: *mut i32) -> LlmStatusCode {
    entry(|| {
        let d = instance(dd)?;
        // SAFETY: the caller's contract.
        unsafe { put(role, d.role() as i32, "role") }.map_err(of_engine)
    })
}

/// `LinkLlmClusters`: links to each of `count` clusters by `timeout_in_millis`; `rets[i]` gets
/// cluster `i`'s status and the call returns the last failure (or success). A malformed
/// address fails the call (`LLM_PARAM_INVALID`) before anything is linked, and `rets` is not
/// written then.
///
/// # Safety
/// `clusters` is null (with `count` 0) or an array of `count` cluster descriptions whose
/// arrays and strings are as documented; `rets` is null (with `count` 0) or writable for
/// `count` statuses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_link_clusters(
    dd: *mut HixlDd,
    clusters: *const DdClusterInfo,
    count: usize,
    timeout_in_millis: i32,
    rets: *mut u32,
) -> LlmStatusCode {
    // SAFETY: the caller's contract.
    unsafe {
        links(dd, clusters, count, rets, std::ptr::null_mut(), |d, cs| {
            d.link_clusters(cs, timeout_in_millis)
        })
    }
}

/// `UnlinkLlmClusters`: as [`hixl_dd_link_clusters`]; `force` tells the peer nothing (and
/// then needs no address). An unlinked cluster's status is `LLM_NOT_YET_LINK`.
///
/// # Safety
/// As [`hixl_dd_link_clusters`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_unlink_clusters(
    dd: *mut HixlDd,
    clusters: *const DdClusterInfo,
    count: usize,
    timeout_in_millis: i32,
    // (the header's `bool`, read as its byte: a caller without the header's type, or ctypes
    // with a `c_int`, may pass a value other than 0 or 1, which no Rust `bool` may hold)
    force: u8,
    rets: *mut u32,
) -> LlmStatusCode {
    // SAFETY: the caller's contract.
    unsafe {
        links(dd, clusters, count, rets, std::ptr::null_mut(), |d, cs| {
            d.unlink_clusters(cs, timeout_in_millis, force != 0)
        })
    }
}

/// A call on each of `count` clusters: `call` with them translated, its statuses into `rets`,
/// the last failure (or success) returned; `rets` is not written when the call fails before
/// the clusters (a translation, a rule of the call's), and `*reached` (when not null) says
/// whether it was.
///
/// # Safety
/// As [`hixl_dd_link_clusters`]; `reached` is null or writable.
unsafe fn links(
    dd: *mut HixlDd,
    clusters: *const DdClusterInfo,
    count: usize,
    rets: *mut u32,
    reached: *mut bool,
    call: impl FnOnce(&DataDist, &[ClusterInfo]) -> Result<(LlmStatus, Vec<LlmStatus>), Error>,
) -> LlmStatusCode {
    entry(|| {
        let d = instance(dd)?;
        // SAFETY: the caller's contract.
        let cs = unsafe { self::clusters(clusters, count) }.map_err(refused(&d))?;
        if rets.is_null() && count > 0 {
            return Err(refused(&d)(invalid("rets is null")));
        }
        let (last, each) = call(&d, &cs).map_err(fail)?;
        // SAFETY: the caller's contract (`count` statuses).
        unsafe { put_rets(rets, &each) }?;
        if !reached.is_null() {
            // SAFETY: not null; writable by the caller's contract.
            unsafe { reached.write_unaligned(true) };
        }
        if last == LlmStatus::LLM_SUCCESS {
            Ok(())
        } else {
            Err((
                last,
                format!("{last} for a cluster; rets has each cluster's status"),
            ))
        }
    })
}

/// The Python package's `link(comm_name, {cluster_id: rank}, rank_table)`
/// ([`DataDist::link_comm`]): links to the clusters `cluster_ids[i]` (rank `ranks[i]` of
/// `rank_table`, HCCL's rank-table JSON; this instance's own cluster among them) over the
/// communicator `comm_name`, and stores its id (from 1) in `*comm_id`. The peers are linked
/// in the background: poll [`hixl_dd_query_register_mem_status`].
///
/// # Safety
/// `comm_name` and `rank_table` are null or NUL-terminated strings; `cluster_ids` and `ranks`
/// null (with `count` 0) or arrays of `count`; `comm_id` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_link_comm(
    dd: *mut HixlDd,
    comm_name: *const c_char,
    cluster_ids: *const u64,
    ranks: *const u32,
    count: usize,
    rank_table: *const c_char,
    comm_id: *mut i64,
) -> LlmStatusCode {
    entry(|| {
        let d = instance(dd)?;
        if comm_id.is_null() {
            return Err(invalid("comm_id is null"));
        }
        // SAFETY: the caller's contract.
        let name = unsafe { string(comm_name, "comm_name") }.map_err(of_engine)?;
        // SAFETY: the caller's contract.
        let table = unsafe { string(rank_table, "rank_table") }.map_err(of_engine)?;
        // SAFETY: the caller's contract.
        let ids = unsafe { slice(cluster_ids, count, "cluster_ids") }.map_err(of_engine)?;
        // SAFETY: the caller's contract.
        let rs = unsafe { slice(ranks, count, "ranks") }.map_err(of_engine)?;
        let map: Vec<(u64, u32)> = ids.iter().copied().zip(rs.iter().copied()).collect();
        let id = d.link_comm(name, &map, table).map_err(fail)?;
        // SAFETY: checked not null; writable by the caller's contract.
        unsafe { put(comm_id, id, "comm_id") }.map_err(of_engine)
    })
}

/// `query_register_mem_status(comm_id)` ([`DataDist::query_register_mem_status`]): stores
/// `HIXL_DD_REGISTER_MEM_OK` 0, `_PREPARING` 1 or `_FAILED` 2 in `*status`; an unknown id is
/// `LLM_NOT_YET_LINK`.
///
/// # Safety
/// `status` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_query_register_mem_status(
    dd: *mut HixlDd,
    comm_id: i64,
    status: *mut i32,
) -> LlmStatusCode {
    entry(|| {
        let d = instance(dd)?;
        if status.is_null() {
            return Err(invalid("status is null"));
        }
        let s = d.query_register_mem_status(comm_id).map_err(fail)?;
        // SAFETY: checked not null; writable by the caller's contract.
        unsafe { put(status, s.value(), "status") }.map_err(of_engine)
    })
}

/// `unlink(comm_id)` ([`DataDist::unlink_comm`]): the clusters it linked are unlinked and the
/// communicator destroyed; an unknown id is `LLM_NOT_YET_LINK`.
///
/// # Safety
/// Any pointer value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_unlink_comm(dd: *mut HixlDd, comm_id: i64) -> LlmStatusCode {
    entry(|| instance(dd)?.unlink_comm(comm_id).map_err(fail))
}

/// `RegisterKvCache`: registers `count` tensors at `addrs` as one cache of `desc` (blocks and
/// batches both: `shape[0]` of them) and stores its id (from 1) in `*cache_id`.
///
/// # Safety
/// `desc` is null or readable (its `shape` null with `shape_len` 0, or `shape_len` dimensions);
/// `addrs` null (with `count` 0) or `count` addresses; `cache_id` null or writable. Each
/// tensor, `product(shape) * element size` bytes at its address, must be memory of the given
/// placement that stays allocated and valid until the cache is unregistered or the instance
/// finalized: peers READ and WRITE it while linked (the engine's `RegisterMem` contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_register_cache(
    dd: *mut HixlDd,
    desc: *const DdCacheDesc,
    addrs: *const u64,
    count: usize,
    cache_id: *mut i64,
) -> LlmStatusCode {
    entry(|| {
        let d = instance(dd)?;
        // SAFETY: the caller's contract (this function's `# Safety`).
        let (desc, addrs) =
            unsafe { cache_desc(desc, addrs, count, cache_id) }.map_err(refused(&d))?;
        // SAFETY: the caller's contract is `register_cache`'s (this function's `# Safety`).
        let id =
            unsafe { d.register_cache(&desc, addrs, hixl_rs::datadist::CacheKind::Mix, 0, &[]) }
                .map_err(fail)?;
        // SAFETY: checked not null; writable by the caller's contract.
        unsafe { put(cache_id, id, "cache_id") }.map_err(of_engine)
    })
}

/// `UnregisterKvCache`: the cache leaves the table and its tensors are deregistered; an
/// unknown id succeeds.
///
/// # Safety
/// Any pointer value is accepted for `dd`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_unregister_cache(dd: *mut HixlDd, cache_id: i64) -> LlmStatusCode {
    entry(|| instance(dd)?.unregister_cache(cache_id).map_err(fail))
}

/// `PullKvCache`: batch `src->batch_index` of each tensor of the peer's cache `src->cache_id`
/// (cluster `src->cluster_id`) into batch `dst_batch_index` of local cache `dst_cache_id`:
/// `size` bytes (-1: a whole batch). `layers` may be null (every tensor).
///
/// # Safety
/// `src` is null or readable; `layers` null or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_pull_cache(
    dd: *mut HixlDd,
    src: *const DdCacheIndex,
    dst_cache_id: i64,
    dst_batch_index: u32,
    size: i64,
    l: *const DdLayers,
) -> LlmStatusCode {
    // SAFETY: the caller's contract.
    let args = || unsafe { Ok((index(src, "src")?, layers(l)?)) };
    with(dd, args, |d, (src, l)| {
        d.pull(&by_id(&src), dst_cache_id, dst_batch_index, size, None, &l)
    })
}

/// `PullKvBlocks`: block `src_blocks[i]` of each tensor of the peer's cache into block
/// `dst_blocks[i]` of local cache `dst_cache_id`, for `count` (at least one) pairs;
/// `src->batch_index` must be 0. `layers` may be null.
///
/// # Safety
/// `src` is null or readable; `src_blocks` and `dst_blocks` null or `count` indices each;
/// `layers` null or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_pull_blocks(
    dd: *mut HixlDd,
    src: *const DdCacheIndex,
    dst_cache_id: i64,
    src_blocks: *const u64,
    dst_blocks: *const u64,
    count: usize,
    l: *const DdLayers,
) -> LlmStatusCode {
    // SAFETY: the caller's contract.
    let args = || unsafe {
        let b = blocks(src_blocks, dst_blocks, count)?;
        Ok((index(src, "src")?, b, layers(l)?))
    };
    with(dd, args, |d, (src, b, l)| {
        d.pull(&by_id(&src), dst_cache_id, 0, -1, Some(b), &l)
    })
}

/// `PushKvCache`: batch `src_batch_index` of each tensor of local cache `src_cache_id` into
/// batch `dst->batch_index` of the peer's cache, one WRITE per layer; `size` must be -1 (a
/// whole batch). `layers` may be null.
///
/// # Safety
/// `dst` is null or readable; `layers` null or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_push_cache(
    dd: *mut HixlDd,
    src_cache_id: i64,
    src_batch_index: u32,
    dst: *const DdCacheIndex,
    size: i64,
    l: *const DdLayers,
) -> LlmStatusCode {
    // SAFETY: the caller's contract.
    let args = || unsafe { Ok((index(dst, "dst")?, layers(l)?)) };
    with(dd, args, |d, (dst, l)| {
        args::push_size(size).map_err(|e| d.refuse(e))?;
        d.push(src_cache_id, &by_id(&dst), src_batch_index, None, &l)
    })
}

/// `PushKvBlocks`: block `src_blocks[i]` of each tensor of local cache `src_cache_id` into
/// block `dst_blocks[i]` of the peer's cache, one WRITE per layer; `dst->batch_index` must be
/// 0. `layers` may be null.
///
/// # Safety
/// As [`hixl_dd_pull_blocks`], with `dst` for `src`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_push_blocks(
    dd: *mut HixlDd,
    src_cache_id: i64,
    dst: *const DdCacheIndex,
    src_blocks: *const u64,
    dst_blocks: *const u64,
    count: usize,
    l: *const DdLayers,
) -> LlmStatusCode {
    // SAFETY: the caller's contract.
    let args = || unsafe {
        let b = blocks(src_blocks, dst_blocks, count)?;
        Ok((index(dst, "dst")?, b, layers(l)?))
    };
    with(dd, args, |d, (dst, b, l)| {
        d.push(src_cache_id, &by_id(&dst), 0, Some(b), &l)
    })
}
