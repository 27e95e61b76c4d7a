//! The C ABI's arguments read into the instance's types: pointers (null where a value is
//! needed: `LLM_PARAM_INVALID`), strings (not UTF-8), addresses as text, enum values, arrays
//! with their counts. No value is checked here: the rules are the instance's
//! (`hixl_rs::datadist::args`).

use std::ffi::c_char;

use hixl_rs::datadist::{
    CacheDesc, ClusterInfo, DataType, IpInfo, Layers, LlmStatus, Placement, RemoteCache, args,
};

use super::{
    DdCacheDesc, DdCacheIndex, DdClusterInfo, DdIpInfo, DdLayers, R, fail, invalid, of_engine,
};
use crate::{slice, string};

/// # Safety
/// `keys` and `values` are null (with `count` 0) or arrays of `count` NUL-terminated strings.
pub(super) unsafe fn options(
    keys: *const *const c_char,
    values: *const *const c_char,
    count: usize,
) -> R<Vec<(String, String)>> {
    // SAFETY: the caller's contract.
    let (ks, vs) = unsafe { (slice(keys, count, "keys"), slice(values, count, "values")) };
    let (ks, vs) = (ks.map_err(of_engine)?, vs.map_err(of_engine)?);
    let mut out = Vec::with_capacity(count);
    for (k, v) in ks.iter().zip(vs) {
        // SAFETY: the caller's contract: each element is a NUL-terminated string.
        let (k, v) = unsafe { (string(*k, "option key"), string(*v, "option value")) };
        out.push((
            k.map_err(of_engine)?.to_owned(),
            v.map_err(of_engine)?.to_owned(),
        ));
    }
    Ok(out)
}

/// # Safety
/// `p` is null (with `count` 0) or an array of `count` addresses whose `ip` is a
/// NUL-terminated string.
pub(super) unsafe fn ip_infos(p: *const DdIpInfo, count: usize, what: &str) -> R<Vec<IpInfo>> {
    // SAFETY: the caller's contract.
    let infos = unsafe { slice(p, count, what) }.map_err(of_engine)?;
    infos
        .iter()
        .map(|i| {
            // SAFETY: the caller's contract.
            let ip = unsafe { string(i.ip, "ip") }.map_err(of_engine)?;
            if ip.is_empty() {
                return Err(invalid(format!("{what}: an empty ip")));
            }
            let ip = ip
                .parse()
                .map_err(|_| invalid(format!("{what}: {ip:?} is not an IP address")))?;
            Ok(IpInfo { ip, port: i.port })
        })
        .collect()
}

/// # Safety
/// `p` is null (with `count` 0) or an array of `count` valid cluster descriptions.
pub(super) unsafe fn clusters(p: *const DdClusterInfo, count: usize) -> R<Vec<ClusterInfo>> {
    // SAFETY: the caller's contract.
    let cs = unsafe { slice(p, count, "clusters") }.map_err(of_engine)?;
    cs.iter()
        .map(|c| {
            Ok(ClusterInfo {
                remote_cluster_id: c.remote_cluster_id,
                remote_role_type: c.remote_role_type,
                // SAFETY: the caller's contract.
                local_ip_infos: unsafe {
                    ip_infos(c.local_ip_infos, c.local_ip_count, "local_ip_infos")
                }?,
                // SAFETY: the caller's contract.
                remote_ip_infos: unsafe {
                    ip_infos(c.remote_ip_infos, c.remote_ip_count, "remote_ip_infos")
                }?,
            })
        })
        .collect()
}

/// # Safety
/// `rets` is null or writable for `n` statuses.
pub(super) unsafe fn put_rets(rets: *mut u32, got: &[LlmStatus]) -> R<()> {
    if got.is_empty() {
        return Ok(());
    }
    if rets.is_null() {
        return Err(invalid("rets is null"));
    }
    for (i, s) in got.iter().enumerate() {
        // SAFETY: `i < n`, the caller's array's length (its contract); no alignment assumed.
        unsafe { rets.add(i).write_unaligned(s.code()) };
    }
    Ok(())
}

/// The layers of `p` (null: every tensor, two per layer), as the C ABI encodes them
/// ([`args::layers_of_ends`]).
///
/// # Safety
/// `p` is null or readable.
pub(super) unsafe fn layers(p: *const DdLayers) -> R<Layers> {
    if p.is_null() {
        return Ok(Layers::all());
    }
    // SAFETY: not null; readable by the caller's contract (no alignment assumed).
    let l = unsafe { p.read_unaligned() };
    args::layers_of_ends(
        (l.src_first, l.src_last),
        (l.dst_first, l.dst_last),
        l.tensor_num_per_layer,
    )
    .map_err(fail)
}

/// # Safety
/// `p` is null or readable.
pub(super) unsafe fn index(p: *const DdCacheIndex, what: &str) -> R<DdCacheIndex> {
    if p.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    // SAFETY: not null; readable by the caller's contract (no alignment assumed).
    Ok(unsafe { p.read_unaligned() })
}

pub(super) fn by_id(i: &DdCacheIndex) -> RemoteCache {
    RemoteCache::ById {
        cluster_id: i.cluster_id,
        cache_id: i.cache_id,
        batch_index: i.batch_index,
    }
}

/// # Safety
/// `src` and `dst` are null (with `count` 0) or arrays of `count` block indices.
pub(super) unsafe fn blocks<'a>(
    src: *const u64,
    dst: *const u64,
    count: usize,
) -> R<(&'a [u64], &'a [u64])> {
    // SAFETY: the caller's contract.
    unsafe { lists(src, count, dst, count) }
}

/// # Safety
/// `src` is null (with `src_count` 0) or an array of `src_count` block indices; `dst` as
/// much with `dst_count`.
pub(super) unsafe fn lists<'a>(
    src: *const u64,
    src_count: usize,
    dst: *const u64,
    dst_count: usize,
) -> R<(&'a [u64], &'a [u64])> {
    // SAFETY: the caller's contract.
    let s = unsafe { slice(src, src_count, "src_blocks") }.map_err(of_engine)?;
    // SAFETY: the caller's contract.
    let d = unsafe { slice(dst, dst_count, "dst_blocks") }.map_err(of_engine)?;
    Ok((s, d))
}

/// The description `desc` and the `count` addresses at `addrs` of a registration.
///
/// # Safety
/// As [`hixl_dd_register_cache`]'s (`cache_id` is only checked for null).
pub(super) unsafe fn cache_desc<'a>(
    desc: *const DdCacheDesc,
    addrs: *const u64,
    count: usize,
    cache_id: *mut i64,
) -> R<(CacheDesc, &'a [u64])> {
    if desc.is_null() || cache_id.is_null() {
        return Err(invalid("desc or cache_id is null"));
    }
    // SAFETY: not null; readable by the caller's contract (no alignment assumed).
    let c = unsafe { desc.read_unaligned() };
    let placement = Placement::from_value(c.placement)
        .ok_or_else(|| invalid(format!("{} is not a placement (0, 1)", c.placement)))?;
    // SAFETY: the caller's contract.
    let shape = unsafe { slice(c.shape, c.shape_len, "shape") }.map_err(of_engine)?;
    // SAFETY: the caller's contract.
    let addrs = unsafe { slice(addrs, count, "addrs") }.map_err(of_engine)?;
    let desc = CacheDesc {
        placement,
        num_tensors: c.num_tensors,
        data_type: DataType(c.data_type),
        shape: shape.to_vec(),
    };
    Ok((desc, addrs))
}
