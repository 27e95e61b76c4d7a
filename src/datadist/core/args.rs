//! LLM-DataDist's argument rules, each checked here once for every surface: the Rust API, the C
//! ABI (and through it CANN's C++ class `llm_datadist::LlmDataDist`) and the Python package.
//! The surfaces only translate (pointers, UTF-8, C++ and Python types into these types); what an
//! argument may be is decided here, with its `LLM_PARAM_INVALID`.
//!
//! The order every call reports in, as upstream's: an instance that cannot take calls
//! ([`DataDist::ready`]: `LLM_FAILED`) first, then the arguments on their own (this module, and
//! a surface's translation, [`DataDist::refuse`]), then what needs the instance's state (a local
//! cache that does not exist, a link that does not, a block outside a cache).
//!
//! The rules of the forms only one upstream surface has stay with that form, here too: CANN's
//! C++ `KvCacheExtParam` and its push's `Cache` argument ([`ExtParam`], [`CacheArg`]), and the
//! Python package's `range` of layers ([`LayerRange`]).

use super::{DataDist, not_initialized};
use crate::datadist::table::MAX_TENSORS;
use crate::datadist::types::{
    CacheDesc, CacheKind, ClusterInfo, Error, IpInfo, Layers, Placement, RemoteCache, Result,
};
use crate::sync::lock;

impl DataDist {
    /// Whether the instance takes calls: `LLM_FAILED` before `initialize` and after
    /// `finalize`, which every call but those two reports before anything about its arguments.
    ///
    /// # Errors
    /// `LLM_FAILED`.
    pub fn ready(&self) -> Result<()> {
        if lock(&self.state).is_some() {
            Ok(())
        } else {
            Err(not_initialized())
        }
    }

    /// An argument a surface could not translate into these types (not an int, beyond its
    /// type, not an address, a null pointer), or that broke a rule of this module the surface
    /// applied before the call: `e`, unless the instance is not [`ready`](DataDist::ready),
    /// which comes first.
    pub fn refuse(&self, e: Error) -> Error {
        self.ready().err().unwrap_or(e)
    }
}

/// A link's or unlink's timeout (ms): positive.
pub(super) fn timeout(ms: i32) -> Result<()> {
    if ms <= 0 {
        return Err(Error::param(format!(
            "timeout ({ms}) should be greater than 0"
        )));
    }
    Ok(())
}

/// The address a link to cluster `c` goes to: its one remote address; never this instance's
/// own cluster (a status of that cluster's, not of the call).
pub(super) fn link_target(own: u64, c: &ClusterInfo) -> Result<&IpInfo> {
    let [ip] = c.remote_ip_infos.as_slice() else {
        return Err(Error::param(format!(
            "cluster {}: link to exactly one remote address, not {}",
            c.remote_cluster_id,
            c.remote_ip_infos.len()
        )));
    };
    if c.remote_cluster_id == own {
        return Err(Error::param("a cluster does not link to itself"));
    }
    Ok(ip)
}

/// A registration's arguments on their own (`RegisterKvCache`, `register_cache`,
/// `register_blocks_cache`): one address per tensor, at least one, at most a table entry's,
/// none 0 and none whose tensor passes the end of memory; a description with a size
/// ([`CacheDesc::tensor_size`]); a batch dimension in the shape (a cache of batches'); at most
/// one key a batch (a cache of batches), one for a blocks or mixed cache. Returns the tensor
/// size and the number of batches (or blocks).
pub(super) fn register(
    desc: &CacheDesc,
    addrs: &[u64],
    kind: CacheKind,
    batch_dim: usize,
    keys: usize,
) -> Result<(u64, u64)> {
    if addrs.is_empty() || addrs.len() != desc.num_tensors as usize {
        return Err(Error::param(format!(
            "{} addresses for a cache of {} tensors",
            addrs.len(),
            desc.num_tensors
        )));
    }
    if addrs.len() > MAX_TENSORS as usize {
        return Err(Error::param("more tensors than a cache holds (65,536)"));
    }
    if addrs.contains(&0) {
        return Err(Error::param("addr can not be zero."));
    }
    let tensor_size = desc.tensor_size()?;
    if addrs.iter().any(|a| a.checked_add(tensor_size).is_none()) {
        return Err(Error::param("a tensor past the end of memory"));
    }
    let dim = if kind == CacheKind::Cache {
        batch_dim
    } else {
        0
    };
    let count = *desc
        .shape
        .get(dim)
        .ok_or_else(|| Error::param(format!("batch dimension {dim} is not in the shape")))?
        as u64;
    let most = if kind == CacheKind::Cache { count } else { 1 };
    if keys as u64 > most {
        return Err(Error::param(format!(
            "{keys} keys for a cache of {most} batches (one key names one batch)"
        )));
    }
    Ok((tensor_size, count))
}

/// A memory pool's range: a non-null address, a length, inside memory.
pub(super) fn pool(addr: u64, len: u64) -> Result<()> {
    if addr == 0 || len == 0 || addr.checked_add(len).is_none() {
        return Err(Error::param(format!(
            "a pool of {len} bytes at {addr:#x}: a non-null address, a length, inside memory"
        )));
    }
    Ok(())
}

/// A pull's arguments on their own (`PullKvCache`, `PullKvBlocks`, `pull_cache`,
/// `pull_blocks`): not from the instance's own cluster; a peer cache id not below 0; `size` -1
/// or above 0; the block lists ([`pull_blocks`]); the layers ([`layers`]).
pub(super) fn pull(
    own: u64,
    src: &RemoteCache,
    size: i64,
    blocks: Option<(&[u64], &[u64])>,
    l: &Layers,
) -> Result<()> {
    if src.cluster_id() == own {
        return Err(Error::param("a pull from this instance's own cluster"));
    }
    peer_cache(src)?;
    if size == 0 || size < -1 {
        return Err(Error::param(format!(
            "size ({size}) is invalid, should be = -1 or > 0"
        )));
    }
    if let Some((s, d)) = blocks {
        block_lists(Some(src), s, d)?;
    }
    layers(l)
}

/// A push's arguments on their own (`PushKvCache`, `PushKvBlocks`, `push_cache`,
/// `push_blocks`): not to the instance's own cluster; a peer cache id not below 0; the block
/// lists ([`push_blocks`]); the layers ([`layers`], of one span: [`spans`]).
pub(super) fn push(
    own: u64,
    dst: &RemoteCache,
    blocks: Option<(&[u64], &[u64])>,
    l: &Layers,
) -> Result<()> {
    if dst.cluster_id() == own {
        return Err(Error::param("a push to this instance's own cluster"));
    }
    peer_cache(dst)?;
    if let Some((s, d)) = blocks {
        block_lists(None, s, d)?;
        by_id_batch_zero(dst)?;
    }
    layers(l)?;
    spans(l)
}

/// A push's `size`, where a surface has one (`PushKvCache`, `push_cache`, `hixl_dd_push_cache`):
/// a push moves whole batches, -1.
///
/// # Errors
/// `LLM_PARAM_INVALID` for any other value.
pub fn push_size(size: i64) -> Result<()> {
    if size != -1 {
        return Err(Error::param(format!(
            "size ({size}) is invalid, should be = -1 (a push moves whole batches)"
        )));
    }
    Ok(())
}

/// A peer's cache by id names an id from 1; a negative one is no id (by key: any key).
fn peer_cache(key: &RemoteCache) -> Result<()> {
    match *key {
        RemoteCache::ById { cache_id, .. } if cache_id < 0 => Err(Error::param(format!(
            "cache_id ({cache_id}) should be >= 0"
        ))),
        _ => Ok(()),
    }
}

/// A transfer of blocks by cache id takes batch index 0 (`CacheIndex::batch_index`).
fn by_id_batch_zero(key: &RemoteCache) -> Result<()> {
    match *key {
        RemoteCache::ById { batch_index, .. } if batch_index != 0 => Err(Error::param(format!(
            "batch_index ({batch_index}): a transfer of blocks takes 0"
        ))),
        _ => Ok(()),
    }
}

/// A move's block lists: at least one destination block, source blocks as many. A pull
/// (`pull_from`: the peer's cache) may give no source blocks to cut a peer's batch into the
/// destination blocks (by the peer cache's id or request key, never by a blocks cache's key);
/// a pull by id with source blocks takes batch index 0.
fn block_lists(pull_from: Option<&RemoteCache>, s: &[u64], d: &[u64]) -> Result<()> {
    if d.is_empty() {
        return Err(Error::param("dst_blocks can not be empty."));
    }
    if let Some(src) = pull_from
        && s.is_empty()
    {
        return match src {
            RemoteCache::Blocks { .. } => Err(Error::param("src_blocks can not be empty.")),
            _ => Ok(()),
        };
    }
    same_length(s, d)?;
    pull_from.map_or(Ok(()), by_id_batch_zero)
}

fn same_length(s: &[u64], d: &[u64]) -> Result<()> {
    if s.len() != d.len() {
        return Err(Error::param(format!(
            "src_blocks ({}) and dst_blocks ({}) differ in length",
            s.len(),
            d.len()
        )));
    }
    Ok(())
}

/// A transfer's layers on their own: at least one tensor per layer, both sides' ranges or
/// neither, each `first <= last`.
fn layers(l: &Layers) -> Result<()> {
    if l.per_layer == 0 {
        return Err(Error::param("tensor_num_per_layer should be >= 1"));
    }
    match (l.src, l.dst) {
        (None, None) => Ok(()),
        (Some(s), Some(d)) => {
            for (r, what) in [(s, "source"), (d, "destination")] {
                if r.0 > r.1 {
                    return Err(Error::param(format!(
                        "{what} layer range {r:?} is reversed"
                    )));
                }
            }
            Ok(())
        }
        _ => Err(Error::param("give both layer ranges or neither")),
    }
}

/// Both layer ranges (checked by [`layers`]) span as many layers: a push's argument rule; a
/// pull's, checked once the link and both caches are known (where every surface reported it).
pub(super) fn spans(l: &Layers) -> Result<()> {
    match (l.src, l.dst) {
        (Some(s), Some(d)) if s.1 - s.0 != d.1 - d.0 => Err(Error::param(format!(
            "src_layer_range {s:?} and dst_layer_range {d:?} differ in length"
        ))),
        _ => Ok(()),
    }
}

/// The local cache of a transfer is of its kind: blocks move in a blocks cache (or a mixed
/// one), batches in a cache of batches (or a mixed one).
pub(super) fn local_kind(kind: CacheKind, blocks: bool, cache_id: i64) -> Result<()> {
    match (kind, blocks) {
        (CacheKind::Blocks, false) => Err(Error::param(format!(
            "cache {cache_id} is a blocks cache: it moves by blocks, not batches"
        ))),
        (CacheKind::Cache, true) => Err(Error::param(format!(
            "cache {cache_id} is a cache of batches: blocks move in a blocks cache"
        ))),
        _ => Ok(()),
    }
}

/// The C ABI's layers (`hixl_dd_layers`): each side `first, last`, or `-1, -1` for none.
///
/// # Errors
/// `LLM_PARAM_INVALID` for another negative value, and as the transfer's rules.
pub fn layers_of_ends(
    src: (i32, i32),
    dst: (i32, i32),
    tensor_num_per_layer: u32,
) -> Result<Layers> {
    let side = |(first, last): (i32, i32), what: &str| match (first, last) {
        (-1, -1) => Ok(None),
        (f, l) if f >= 0 && l >= 0 => Ok(Some((f as u32, l as u32))),
        _ => Err(Error::param(format!(
            "{what} layer range [{first}, {last}]: -1, -1, or 0 <= first <= last"
        ))),
    };
    Ok(Layers {
        src: side(src, "source")?,
        dst: side(dst, "destination")?,
        per_layer: tensor_num_per_layer,
    })
}

/// CANN's C++ `KvCacheExtParam`: each side's `{first, last}` layer range (`-1` or more, first
/// not past last; a side whose first is below 0 names no range) and the tensors per layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtParam {
    /// `src_layer_range`.
    pub src: (i32, i32),
    /// `dst_layer_range`.
    pub dst: (i32, i32),
    /// `tensor_num_per_layer` (a `uint8_t` in CANN's header).
    pub per_layer: u32,
}

/// The `Cache` argument of CANN's C++ pushes: its id and the description its caller gives
/// (CANN's push reads the placement and tensor count from the argument, not from the cache
/// registered under the id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheArg {
    /// `cache_id`.
    pub cache_id: i64,
    /// `cache_desc.placement` as given (`CachePlacement`: 0 host, 1 device).
    pub placement: u32,
    /// `cache_desc.num_tensors`.
    pub num_tensors: u32,
}

impl ExtParam {
    /// CANN's checks: each side's ranges `-1` or more and not reversed, at least one tensor
    /// per layer; for a push both ranges span as many layers.
    fn check(&self, push: bool) -> Result<()> {
        for ((first, last), what) in [(self.src, "src_layer_range"), (self.dst, "dst_layer_range")]
        {
            if first < -1 || last < -1 || first > last {
                return Err(Error::param(format!(
                    "{what} [{first}, {last}]: -1 or more, first <= last"
                )));
            }
        }
        if self.per_layer == 0 {
            return Err(Error::param("tensor_num_per_layer should be >= 1"));
        }
        // (in i64: `[-1, i32::MAX]` spans past an i32)
        let span = |(first, last): (i32, i32)| i64::from(last) - i64::from(first);
        if push && span(self.src) != span(self.dst) {
            return Err(Error::param(
                "src_layer_range and dst_layer_range differ in length",
            ));
        }
        Ok(())
    }

    fn side((first, last): (i32, i32)) -> Option<(u32, u32)> {
        (first >= 0).then_some((first as u32, last as u32))
    }

    /// A pull's layers, as CANN's: both ranges when both are set, else every tensor.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` (CANN's checks).
    pub fn pull_layers(&self) -> Result<Layers> {
        self.check(false)?;
        let (src, dst) = match (Self::side(self.src), Self::side(self.dst)) {
            (Some(s), Some(d)) => (Some(s), Some(d)),
            _ => (None, None),
        };
        Ok(Layers {
            src,
            dst,
            per_layer: self.per_layer,
        })
    }

    /// A push's layers, as CANN's: from a cache the argument places on the device; a given
    /// source range as it is; without one, layers `0..=max` of both sides, `max` from the
    /// argument's `num_tensors` (a last partial layer counts as one; fewer tensors than a
    /// layer's: one layer).
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID`: the argument places the cache on the host, CANN's checks of the
    /// ranges, no source range and no `num_tensors` to derive one from.
    pub fn push_layers(&self, arg: &CacheArg) -> Result<Layers> {
        if arg.placement != Placement::Device as u32 {
            return Err(Error::param(format!(
                "the cache argument's placement ({}): CANN's pushes take a device cache",
                arg.placement
            )));
        }
        self.check(true)?;
        if self.src.0 >= 0 {
            return Ok(Layers {
                src: Self::side(self.src),
                dst: Self::side(self.dst),
                per_layer: self.per_layer,
            });
        }
        let (n, per) = (arg.num_tensors, self.per_layer);
        if n == 0 {
            return Err(Error::param(
                "no src_layer_range and no num_tensors to derive one from",
            ));
        }
        let max = if n < per { 0 } else { n.div_ceil(per) - 1 };
        Ok(Layers {
            src: Some((0, max)),
            dst: Some((0, max)),
            per_layer: per,
        })
    }
}

/// A Python `range` of layers: `start..stop` by `step`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerRange {
    /// `range.start`.
    pub start: i64,
    /// `range.stop`.
    pub stop: i64,
    /// `range.step`.
    pub step: i64,
}

impl LayerRange {
    /// The inclusive `(first, last)` of a range of step 1, `0 <= start < stop`, `stop - 1` a
    /// `uint32`.
    fn inclusive(&self, what: &str) -> Result<(u32, u32)> {
        if self.step != 1 {
            return Err(Error::param(format!(
                "param check failed, {what} step must be 1."
            )));
        }
        let last = self.stop.checked_sub(1).map(u32::try_from);
        match (u32::try_from(self.start), last) {
            (Ok(first), Some(Ok(last))) if self.start < self.stop => Ok((first, last)),
            _ => Err(Error::param(format!(
                "{what} range({}, {}) is empty, negative or past uint32",
                self.start, self.stop
            ))),
        }
    }

    /// A pull's layers as the Python package takes them (both ranges or neither, at least one
    /// tensor a layer: the pull checks that, as it does for every surface's layers).
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` for a range of another step, an empty or negative one, one past
    /// `uint32`.
    pub fn pull_layers(
        src: Option<LayerRange>,
        dst: Option<LayerRange>,
        per_layer: u32,
    ) -> Result<Layers> {
        let src = src.map(|r| r.inclusive("src_layer_range")).transpose()?;
        let dst = dst.map(|r| r.inclusive("dst_layer_range")).transpose()?;
        Ok(Layers {
            src,
            dst,
            per_layer,
        })
    }

    /// A push's layers as the Python package takes them: a side without a range is every
    /// whole layer of the source cache's `num_tensors` (the argument's), at least one.
    ///
    /// # Errors
    /// As [`LayerRange::pull_layers`]; `LLM_PARAM_INVALID` for no layer to push.
    pub fn push_layers(
        src: Option<LayerRange>,
        dst: Option<LayerRange>,
        per_layer: u32,
        num_tensors: u32,
    ) -> Result<Layers> {
        if per_layer == 0 {
            return Err(Error::param("tensor_num_per_layer should be >= 1"));
        }
        let every = LayerRange {
            start: 0,
            stop: i64::from(num_tensors / per_layer),
            step: 1,
        };
        if src.is_none() && every.stop == 0 {
            return Err(Error::param(format!(
                "no layer to push: {num_tensors} tensors, {per_layer} per layer"
            )));
        }
        Self::pull_layers(
            Some(src.unwrap_or(every)),
            Some(dst.unwrap_or(every)),
            per_layer,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datadist::types::LlmStatus;

    /// Caller arguments at the ends of their types are refused as `LLM_PARAM_INVALID`, not a
    /// panic (both overflowed in a debug build: a C++ push's `[-1, INT32_MAX]` range, a Python
    /// `range(0, -2**63)`).
    #[test]
    fn layer_ranges_at_the_ends_of_their_types_are_refused_not_a_panic() {
        let arg = CacheArg {
            cache_id: 1,
            placement: Placement::Device as u32,
            num_tensors: 4,
        };
        let ext = ExtParam {
            src: (-1, i32::MAX),
            dst: (0, 0),
            per_layer: 1,
        };
        let e = ext.push_layers(&arg).unwrap_err();
        assert_eq!(e.status, LlmStatus::LLM_PARAM_INVALID, "{e:?}");
        let both = ExtParam {
            dst: (-1, i32::MAX),
            ..ext
        };
        assert!(
            both.push_layers(&arg).is_ok(),
            "as long as each other: no range"
        );
        for stop in [i64::MIN, -1, 0] {
            let r = LayerRange {
                start: 0,
                stop,
                step: 1,
            };
            let e = LayerRange::pull_layers(Some(r), Some(r), 1).unwrap_err();
            assert_eq!(e.status, LlmStatus::LLM_PARAM_INVALID, "{e:?}");
        }
        let r = LayerRange {
            start: i64::MAX,
            stop: i64::MIN,
            step: 1,
        };
        assert!(LayerRange::push_layers(Some(r), None, 1, 4).is_err());
    }
}
