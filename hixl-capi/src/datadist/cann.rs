//! The calls of CANN's C++ class `llm_datadist::LlmDataDist` in its own argument forms
//! (`hixl_dd_cann_*`, declared in `include/hixl_dd.h`), which `cxx/llm_datadist.cc` forwards
//! to: its `Initialize`, `LinkLlmClusters`, `UnlinkLlmClusters`, pulls with a
//! `KvCacheExtParam`, pushes with a `Cache` argument. They translate, as the other calls here
//! do; the rules of that API are the instance's (`DataDist::cann_*`, `ExtParam`, `CacheArg`).

use std::ffi::c_char;

use hixl_rs::datadist::{CacheArg, CannPart, DataDist, ExtParam};

use super::{
    DdCacheIndex, DdClusterInfo, DdLayers, HixlDd, LlmStatusCode, R, by_id, index, initialize,
    invalid, links, lists, with,
};

/// `hixl_dd_cache_arg`: the `Cache` argument of CANN's pushes (its id and the description its
/// caller gives: CANN reads the placement and tensor count from it).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DdCacheArg {
    /// `cache_id`.
    pub cache_id: i64,
    /// `cache_desc.placement` (`HIXL_DD_PLACEMENT_*`, as given).
    pub placement: u32,
    /// `cache_desc.num_tensors`.
    pub num_tensors: u32,
}

#[cfg(target_pointer_width = "64")]
const _: () = assert!(size_of::<DdCacheArg>() == 16);

/// CANN's `KvCacheExtParam` at `p` (in `hixl_dd_layers`' layout).
///
/// # Safety
/// `p` is null or readable.
unsafe fn ext(p: *const DdLayers) -> R<ExtParam> {
    if p.is_null() {
        return Err(invalid("ext_param is null"));
    }
    // SAFETY: not null; readable by the caller's contract (no alignment assumed).
    let l = unsafe { p.read_unaligned() };
    Ok(ExtParam {
        src: (l.src_first, l.src_last),
        dst: (l.dst_first, l.dst_last),
        per_layer: l.tensor_num_per_layer,
    })
}

/// # Safety
/// `p` is null or readable.
unsafe fn cache_arg(p: *const DdCacheArg) -> R<CacheArg> {
    if p.is_null() {
        return Err(invalid("src_cache is null"));
    }
    // SAFETY: not null; readable by the caller's contract (no alignment assumed).
    let c = unsafe { p.read_unaligned() };
    Ok(CacheArg {
        cache_id: c.cache_id,
        placement: c.placement,
        num_tensors: c.num_tensors,
    })
}

/// `Initialize(options)` of CANN's C++ class ([`DataDist::cann_initialize`]:
/// `llm.DeviceId` required): as [`super::hixl_dd_initialize`] otherwise.
///
/// [`DataDist::cann_initialize`]: hixl_rs::datadist::DataDist::cann_initialize
///
/// # Safety
/// As [`super::hixl_dd_initialize`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_cann_initialize(
    dd: *mut HixlDd,
    keys: *const *const c_char,
    values: *const *const c_char,
    count: usize,
) -> LlmStatusCode {
    // SAFETY: the caller's contract.
    unsafe { initialize(dd, keys, values, count, DataDist::cann_initialize) }
}

/// `LinkLlmClusters` of CANN's C++ class ([`DataDist::cann_link_clusters`]: at least one
/// cluster, IPv4 addresses): as [`super::hixl_dd_link_clusters`]; `*reached` says whether the
/// call got to the clusters (and wrote `rets`).
///
/// [`DataDist::cann_link_clusters`]: hixl_rs::datadist::DataDist::cann_link_clusters
///
/// # Safety
/// As [`super::hixl_dd_link_clusters`]; `reached` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_cann_link_clusters(
    dd: *mut HixlDd,
    clusters: *const DdClusterInfo,
    count: usize,
    timeout_in_millis: i32,
    rets: *mut u32,
    reached: *mut bool,
) -> LlmStatusCode {
    // SAFETY: the caller's contract.
    unsafe {
        links(dd, clusters, count, rets, reached, |d, cs| {
            d.cann_link_clusters(cs, timeout_in_millis)
        })
    }
}

/// `UnlinkLlmClusters` of CANN's C++ class ([`DataDist::cann_unlink_clusters`]: a cluster
/// that is not linked is unlinked already): as [`hixl_dd_cann_link_clusters`].
///
/// [`DataDist::cann_unlink_clusters`]: hixl_rs::datadist::DataDist::cann_unlink_clusters
///
/// # Safety
/// As [`hixl_dd_cann_link_clusters`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_cann_unlink_clusters(
    dd: *mut HixlDd,
    clusters: *const DdClusterInfo,
    count: usize,
    timeout_in_millis: i32,
    // (the header's `bool`, read as its byte: a caller without the header's type, or ctypes
    // with a `c_int`, may pass a value other than 0 or 1, which no Rust `bool` may hold)
    force: u8,
    rets: *mut u32,
    reached: *mut bool,
) -> LlmStatusCode {
    // SAFETY: the caller's contract.
    unsafe {
        links(dd, clusters, count, rets, reached, |d, cs| {
            d.cann_unlink_clusters(cs, timeout_in_millis, force != 0)
        })
    }
}

/// `PullKvCache` of CANN's C++ class: [`super::hixl_dd_pull_cache`] with `ext` a
/// `KvCacheExtParam` (not null; [`ExtParam::pull_layers`]).
///
/// # Safety
/// `src` and `ext` are null or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_cann_pull_cache(
    dd: *mut HixlDd,
    src: *const DdCacheIndex,
    dst_cache_id: i64,
    dst_batch_index: u32,
    size: i64,
    ext: *const DdLayers,
) -> LlmStatusCode {
    // SAFETY: the caller's contract.
    let args = || unsafe { Ok((index(src, "src")?, self::ext(ext)?)) };
    with(dd, args, |d, (src, e)| {
        let part = CannPart::Batch {
            index: dst_batch_index,
            size,
        };
        d.cann_pull(&by_id(&src), dst_cache_id, part, &e)
    })
}

/// `PullKvBlocks` of CANN's C++ class: [`super::hixl_dd_pull_blocks`] with `ext` a
/// `KvCacheExtParam`.
///
/// # Safety
/// As [`super::hixl_dd_pull_blocks`], with a count for each list; `ext` is null or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_cann_pull_blocks(
    dd: *mut HixlDd,
    src: *const DdCacheIndex,
    dst_cache_id: i64,
    src_blocks: *const u64,
    src_count: usize,
    dst_blocks: *const u64,
    dst_count: usize,
    ext: *const DdLayers,
) -> LlmStatusCode {
    // SAFETY: the caller's contract.
    let args = || unsafe {
        let b = lists(src_blocks, src_count, dst_blocks, dst_count)?;
        Ok((index(src, "src")?, b, self::ext(ext)?))
    };
    with(dd, args, |d, (src, b, e)| {
        let (src_blocks, dst_blocks) = b;
        let part = CannPart::Blocks {
            src: src_blocks,
            dst: dst_blocks,
        };
        d.cann_pull(&by_id(&src), dst_cache_id, part, &e)
    })
}

/// `PushKvCache` of CANN's C++ class: batch `src_batch_index` of the cache `src` names into the
/// batch `dst` names, `size` -1, the layers of `ext` (a `KvCacheExtParam`) or, without a
/// source range, every layer of `src`'s `num_tensors` ([`ExtParam::push_layers`]).
///
/// # Safety
/// `src`, `dst` and `ext` are null or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_cann_push_cache(
    dd: *mut HixlDd,
    src: *const DdCacheArg,
    src_batch_index: u32,
    dst: *const DdCacheIndex,
    size: i64,
    ext: *const DdLayers,
) -> LlmStatusCode {
    // SAFETY: the caller's contract.
    let args = || unsafe { Ok((cache_arg(src)?, index(dst, "dst")?, self::ext(ext)?)) };
    with(dd, args, |d, (src, dst, e)| {
        let part = CannPart::Batch {
            index: src_batch_index,
            size,
        };
        d.cann_push(&src, &by_id(&dst), part, &e)
    })
}

/// `PushKvBlocks` of CANN's C++ class: [`hixl_dd_cann_push_cache`]'s arguments with block
/// lists for the batches.
///
/// # Safety
/// As [`hixl_dd_cann_push_cache`]; `src_blocks` is null (with `src_count` 0) or
/// `src_count` indices, `dst_blocks` as much with `dst_count`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_dd_cann_push_blocks(
    dd: *mut HixlDd,
    src: *const DdCacheArg,
    dst: *const DdCacheIndex,
    src_blocks: *const u64,
    src_count: usize,
    dst_blocks: *const u64,
    dst_count: usize,
    ext: *const DdLayers,
) -> LlmStatusCode {
    // SAFETY: the caller's contract.
    let args = || unsafe {
        let b = lists(src_blocks, src_count, dst_blocks, dst_count)?;
        Ok((cache_arg(src)?, index(dst, "dst")?, b, self::ext(ext)?))
    };
    with(dd, args, |d, (src, dst, b, e)| {
        let (src_blocks, dst_blocks) = b;
        let part = CannPart::Blocks {
            src: src_blocks,
            dst: dst_blocks,
        };
        d.cann_push(&src, &by_id(&dst), part, &e)
    })
}
