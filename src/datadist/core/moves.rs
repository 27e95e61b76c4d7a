//! Pulls and pushes: a peer's cache entry found once, then blocks moved as one checked block
//! batch over every tensor pair, a layout a pair (the local spans from the cache's own
//! regions, the peer's from the link's table, once a tensor: XFER_BLOCKS frames on the wire,
//! all in flight at once, the remote indices checked once by the server), batches as one
//! batch of a descriptor a tensor pair.

use std::sync::Arc;
use std::time::Duration;

use super::engine::DdEngine;
use super::uses::InUse;
use super::{DataDist, Regions, args};
use crate::TransferOp;
use crate::datadist::table::{Entry, Table};
use crate::datadist::types::{CacheKind, Error, Layers, LlmStatus, RemoteCache, Result};
use crate::runtime::address::AddrDesc;
use crate::runtime::check::{self, Layout, Local};
use crate::runtime::handle::{LinkHandle, RegionHandle};
use crate::sync::lock;
use crate::types::blocks::{BlockBatch, BlockIndices};

/// One tensor pair of a block move: the local tensor (`len` bytes at `local`, in `region`, its
/// cache's registration of it) and the peer's (`remote_len` bytes at `remote`).
#[derive(Clone, Copy)]
pub(super) struct TensorPair<'a> {
    pub(super) region: Option<&'a RegionHandle>,
    pub(super) local: usize,
    pub(super) remote: u64,
    pub(super) local_len: usize,
    pub(super) remote_len: u64,
}

impl<'a> TensorPair<'a> {
    /// The local tensor as a span of its region; `None` if it has none, or lies outside it.
    fn local_span(&self) -> Option<Local<'a>> {
        let region = self.region?;
        let offset = self.local.checked_sub(region.addr)?;
        (offset.checked_add(self.local_len)? <= region.len).then_some(Local {
            core: region,
            offset,
            len: self.local_len,
        })
    }
}

/// A block move: block `local_idx[i]` of each pair's local tensor and block `remote_idx[i]` of
/// its remote tensor, blocks of `block` bytes, packed.
#[derive(Clone, Copy)]
pub(super) struct BlockMove<'a> {
    pub(super) op: TransferOp,
    pub(super) pairs: &'a [TensorPair<'a>],
    pub(super) block: u64,
    pub(super) local_idx: &'a [u64],
    pub(super) remote_idx: &'a [u64],
}

impl DataDist {
    /// Pulls from a peer's cache into local cache `dst_cache` (`PullKvCache`, `PullKvBlocks`).
    /// With `blocks` (`(src_blocks, dst_blocks)`, the same length, not empty) block
    /// `src_blocks[i]` of each tensor lands in block `dst_blocks[i]`, consecutive runs as one
    /// descriptor (a block is the local cache's stride). With no `src_blocks` from a peer's
    /// cache of batches (upstream's cache-to-blocks pull), the batch the key names is cut into
    /// pieces of a local block, piece `j` landing in block `dst_blocks[j]` (as many blocks as
    /// pieces). Without `blocks`, the batch the key names (`src.batch_index`, or its
    /// `CacheKey`'s batch) of each tensor lands in batch `dst_batch` (`size` bytes, or the
    /// local stride for `-1`; the remote offset uses the local stride, as upstream's).
    ///
    /// A `CacheKey` the peer's table (fetched at the link's first use) does not have makes
    /// this fetch the table again, once: caches of requests come and go after a link.
    ///
    /// The arguments are checked on their own first (`args.rs`: the own cluster, block lists,
    /// size, layers), then against the local cache (its kind: blocks move in a blocks cache,
    /// batches in a cache of batches, both in a mixed one), then against the peer's.
    ///
    /// # Errors
    /// `LLM_FAILED` (not initialized), `LLM_NOT_YET_LINK` (no link to the cluster),
    /// `LLM_KV_CACHE_NOT_EXIST` (no such local or remote cache), `LLM_PARAM_INVALID` (a block or
    /// batch outside a cache, mismatched lists or tensor counts, a bad size or layer range, the
    /// own cluster, a local cache of the other kind), `LLM_TIMEOUT`, the engine's other errors.
    pub fn pull(
        &self,
        src: &RemoteCache,
        dst_cache: i64,
        dst_batch: u32,
        size: i64,
        blocks: Option<(&[u64], &[u64])>,
        layers: &Layers,
    ) -> Result<()> {
        let (engine, config) = self.live()?;
        args::pull(self.cluster_id, src, size, blocks, layers)?;
        // counted as a use of the cache until the READ returned: unregistering waits for it
        let (local, regions, _in_use) = self.local(dst_cache)?;
        args::local_kind(local.kind, blocks.is_some(), dst_cache)?;
        let (link, r, src_batch) = self.find_remote(&engine, src)?;
        args::spans(layers)?;
        let (li, ri) = tensor_pairs(layers, local.addrs.len(), r.addrs.len(), true)?;
        let timeout = config.sync_timeout();
        let ops = match blocks {
            Some(([], d)) if r.kind == CacheKind::Cache => {
                batch_to_block_ops(&r, &local, &ri, &li, src_batch, d)?
            }
            Some(([], _)) => {
                return Err(Error::param(
                    "src_blocks can not be empty: only a peer's cache of batches is cut into blocks",
                ));
            }
            Some((s, d)) => {
                let (pairs, block) =
                    block_pairs(&r, &local, &regions, &ri, &li, s, d, TransferOp::Read)?;
                let m = BlockMove {
                    op: TransferOp::Read,
                    pairs: &pairs,
                    block,
                    local_idx: d,
                    remote_idx: s,
                };
                return run_blocks(&link, m, timeout);
            }
            None => {
                let src_batch = u32::try_from(src_batch)
                    .map_err(|_| Error::param("a batch index beyond u32"))?;
                batch_ops(
                    &r,
                    &local,
                    &ri,
                    &li,
                    src_batch,
                    dst_batch,
                    size,
                    TransferOp::Read,
                )?
            }
        };
        engine.transfer(&link, TransferOp::Read, &ops, timeout)?;
        Ok(())
    }

    /// Pushes local cache `src_cache` into a peer's cache (`PushKvCache`, `PushKvBlocks`), one
    /// batch WRITE per layer: with `blocks` block `src_blocks[i]` of each tensor goes to block
    /// `dst_blocks[i]` of the peer's; without, batch `src_batch` to the peer's batch
    /// `dst.batch_index` (a whole stride).
    ///
    /// # Errors
    /// As [`DataDist::pull`].
    pub fn push(
        &self,
        src_cache: i64,
        dst: &RemoteCache,
        src_batch: u32,
        blocks: Option<(&[u64], &[u64])>,
        layers: &Layers,
    ) -> Result<()> {
        let (engine, config) = self.live()?;
        args::push(self.cluster_id, dst, blocks, layers)?;
        // counted as a use of the cache until the last WRITE returned (`pull`)
        let (local, regions, _in_use) = self.local(src_cache)?;
        args::local_kind(local.kind, blocks.is_some(), src_cache)?;
        let (link, r, dst_batch) = self.find_remote(&engine, dst)?;
        // (a batch index only a push of batches uses: a block push by a key whose batch is past
        // u32 is no error)
        let dst_batch = match blocks {
            Some(_) => 0,
            None => {
                u32::try_from(dst_batch).map_err(|_| Error::param("a batch index beyond u32"))?
            }
        };
        let (li, ri) = tensor_pairs(layers, local.addrs.len(), r.addrs.len(), false)?;
        let per = layers.per_layer.max(1) as usize;
        let timeout = config.sync_timeout();
        // one WRITE per layer: the pairs `per` at a time
        for (ls, rs) in li.chunks(per).zip(ri.chunks(per)) {
            let ops = match blocks {
                Some((s, d)) => {
                    let (pairs, block) =
                        block_pairs(&local, &r, &regions, ls, rs, s, d, TransferOp::Write)?;
                    let m = BlockMove {
                        op: TransferOp::Write,
                        pairs: &pairs,
                        block,
                        local_idx: s,
                        remote_idx: d,
                    };
                    run_blocks(&link, m, timeout)?;
                    continue;
                }
                None => batch_ops(
                    &local,
                    &r,
                    ls,
                    rs,
                    src_batch,
                    dst_batch,
                    -1,
                    TransferOp::Write,
                )?,
            };
            engine.transfer(&link, TransferOp::Write, &ops, timeout)?;
        }
        Ok(())
    }

    /// The local cache `cache_id`'s entry, each tensor's region, and a use of the cache that
    /// lasts until the guard is dropped (a pull or push holds it while it moves the cache's
    /// bytes: unregistering waits for it).
    fn local(&self, cache_id: i64) -> Result<(Entry, Regions, InUse)> {
        let caches = lock(&self.caches);
        let c = caches.by_id.get(&cache_id).ok_or_else(|| {
            Error::new(
                LlmStatus::LLM_KV_CACHE_NOT_EXIST,
                format!("no local cache {cache_id}"),
            )
        })?;
        Ok((c.entry.clone(), c.regions.clone(), c.uses.enter(cache_id)?))
    }

    /// The engine's link to the peer, the entry `key` names in its table and the batch the key
    /// names; a `CacheKey` the table lacks fetches it again, once.
    fn find_remote(
        &self,
        engine: &DdEngine,
        key: &RemoteCache,
    ) -> Result<(Arc<LinkHandle>, Entry, u64)> {
        let (link, table) = self.peer(engine, key.cluster_id())?;
        match find(&table, key) {
            Err(e)
                if e.status == LlmStatus::LLM_KV_CACHE_NOT_EXIST
                    && matches!(key, RemoteCache::Request { .. }) =>
            {
                let (link, table) = self.refetch(engine, key.cluster_id())?;
                let (entry, batch) = find(&table, key)?;
                Ok((link, entry, batch))
            }
            r => r.map(|(entry, batch)| (link, entry, batch)),
        }
    }
}

/// The peer's entry `key` names, and the batch of it the key names.
fn find(t: &Table, key: &RemoteCache) -> Result<(Entry, u64)> {
    let id = match *key {
        RemoteCache::ById {
            cache_id,
            batch_index,
            ..
        } => Some((cache_id, u64::from(batch_index))),
        RemoteCache::Blocks { model_id, .. } => t
            .keys
            .iter()
            .find(|k| k.req_id == u64::MAX && k.model_id == model_id)
            .map(|k| (k.cache_id, 0)),
        RemoteCache::Request {
            req_id, model_id, ..
        } => t
            .keys
            .iter()
            .find(|k| k.req_id == req_id && k.model_id == model_id)
            .map(|k| (k.cache_id, k.batch)),
    };
    id.and_then(|(id, batch)| {
        let e = t.entries.iter().find(|e| e.cache_id == id)?;
        Some((e.clone(), batch))
    })
    .ok_or_else(|| {
        Error::new(
            LlmStatus::LLM_KV_CACHE_NOT_EXIST,
            format!(
                "the peer has no cache {key:?} (in the table it published at the link's first use)"
            ),
        )
    })
}

/// The tensor indices of each side (`local`, `remote`) a transfer pairs, from its layer
/// ranges (checked on their own already, `args.rs`). `pull`: the remote side is the source.
fn tensor_pairs(
    layers: &Layers,
    local_n: usize,
    remote_n: usize,
    pull: bool,
) -> Result<(Vec<usize>, Vec<usize>)> {
    let per = layers.per_layer as usize;
    let (src_n, dst_n) = if pull {
        (remote_n, local_n)
    } else {
        (local_n, remote_n)
    };
    let range = |r: (u32, u32), n: usize, what: &str| -> Result<Vec<usize>> {
        let (a, b) = (r.0 as usize * per, (r.1 as usize + 1) * per);
        if b > n {
            return Err(Error::param(format!(
                "{what} layers {r:?} ({per} tensors each) beyond the cache's {n} tensors"
            )));
        }
        Ok((a..b).collect())
    };
    let (s, d) = match (layers.src, layers.dst) {
        (None, None) => {
            if src_n != dst_n {
                return Err(Error::param(format!(
                    "the caches have {src_n} and {dst_n} tensors"
                )));
            }
            ((0..src_n).collect(), (0..dst_n).collect())
        }
        (Some(sr), Some(dr)) => (
            range(sr, src_n, "source")?,
            range(dr, dst_n, "destination")?,
        ),
        // (`args.rs`: both or neither)
        _ => return Err(Error::param("give both layer ranges or neither")),
    };
    Ok(if pull { (d, s) } else { (s, d) })
}

/// One descriptor per tensor pair: batch `src_batch` of the source, `dst_batch` of the
/// destination, `size` bytes (`-1`: the local cache's stride). `src`/`dst` are the entries;
/// the local side's addresses are this process's.
#[allow(clippy::too_many_arguments)]
fn batch_ops(
    src: &Entry,
    dst: &Entry,
    src_tensors: &[usize],
    dst_tensors: &[usize],
    src_batch: u32,
    dst_batch: u32,
    size: i64,
    op: TransferOp,
) -> Result<Vec<AddrDesc>> {
    // a pull offsets both sides by the local (destination) cache's stride, as upstream's; a
    // push each side by its own
    let (src_stride, dst_stride) = match op {
        TransferOp::Read => (dst.stride, dst.stride),
        TransferOp::Write => (src.stride, dst.stride),
    };
    let stride = if op == TransferOp::Read {
        dst.stride
    } else {
        src.stride
    };
    // (`size` is -1 or positive: `args.rs`)
    let len = if size == -1 { stride } else { size as u64 };
    if len > src.stride || len > dst.stride {
        return Err(Error::param(format!(
            "{len} bytes exceed a batch ({} and {} bytes)",
            src.stride, dst.stride
        )));
    }
    for (b, e, what) in [(src_batch, src, "source"), (dst_batch, dst, "destination")] {
        if u64::from(b) >= e.count {
            return Err(Error::param(format!(
                "{what} batch {b} outside its cache's {} batches",
                e.count
            )));
        }
    }
    // each side's range inside its tensors: a pull offsets the peer's side by the local
    // stride, so a peer's batch index alone does not bound it (nor its arithmetic: a peer's
    // tensor may end at the top of the address space)
    let offset = |e: &Entry, b: u32, stride: u64, what: &str| {
        u64::from(b)
            .checked_mul(stride)
            .filter(|o| o.checked_add(len).is_some_and(|end| end <= e.tensor_size))
            .ok_or_else(|| {
                Error::param(format!(
                    "{what} batch {b}: {len} bytes at {stride} bytes a batch pass the end of its \
                     tensors ({} bytes)",
                    e.tensor_size
                ))
            })
    };
    let so = offset(src, src_batch, src_stride, "source")?;
    let dof = offset(dst, dst_batch, dst_stride, "destination")?;
    // (inside a tensor: the table's decoder and the registration checked address + size)
    let ops = src_tensors
        .iter()
        .zip(dst_tensors)
        .map(|(&s, &d)| desc(op, src.addrs[s] + so, dst.addrs[d] + dof, len))
        .collect();
    Ok(ops)
}

/// The tensor pairs of a block move and its block size (the local cache's stride): each pair
/// a layout of one block batch ([`run_blocks`]), the block lists (one length, not empty:
/// `args.rs`) checked here against each side's cache once (the remote side's blocks counted in
/// the local block size) and by the core against the spans. `regions`: the local cache's.
#[allow(clippy::too_many_arguments)]
fn block_pairs<'a>(
    src: &Entry,
    dst: &Entry,
    regions: &'a [Option<RegionHandle>],
    src_tensors: &[usize],
    dst_tensors: &[usize],
    src_blocks: &[u64],
    dst_blocks: &[u64],
    op: TransferOp,
) -> Result<(Vec<TensorPair<'a>>, u64)> {
    let bs = if op == TransferOp::Read {
        dst.stride
    } else {
        src.stride
    };
    for (blocks, e, what) in [
        (src_blocks, src, "source"),
        (dst_blocks, dst, "destination"),
    ] {
        // the remote side's blocks are counted in the local block size
        let count = e.tensor_size / bs;
        if let Some(b) = blocks.iter().find(|&&b| b >= count) {
            return Err(Error::param(format!(
                "{what} block {b} outside its cache's {count} blocks"
            )));
        }
    }
    // the local side is the destination of a READ, the source of a WRITE
    let (local, remote) = match op {
        TransferOp::Read => (dst, src),
        TransferOp::Write => (src, dst),
    };
    let pairs = src_tensors
        .iter()
        .zip(dst_tensors)
        .map(|(&st, &dt)| {
            let (lt, rt) = match op {
                TransferOp::Read => (dt, st),
                TransferOp::Write => (st, dt),
            };
            TensorPair {
                region: regions.get(lt).and_then(Option::as_ref),
                local: local.addrs[lt] as usize,
                remote: remote.addrs[rt],
                local_len: local.tensor_size as usize,
                remote_len: remote.tensor_size,
            }
        })
        .collect();
    Ok((pairs, bs))
}

/// Runs a block move on `link`, waited for within `timeout`: each pair's local span (from its
/// cache's region) and the peer's span (the link's table), once a tensor and not once a block,
/// then one block batch over every pair, checked as a whole before anything moves
/// (`check::layouts`).
///
/// # Errors
/// A tensor with no region here (`LLM_PARAM_INVALID`) or in no region of the peer's table, the
/// batch's checks, the transfer's errors (a deadline missed: `LLM_TIMEOUT`).
fn run_blocks(link: &LinkHandle, m: BlockMove<'_>, timeout: Duration) -> Result<()> {
    let BlockMove {
        op,
        pairs,
        block,
        local_idx,
        remote_idx,
    } = m;
    let layouts = (pairs.iter().enumerate())
        .map(|(index, p)| {
            let local = p
                .local_span()
                .ok_or_else(|| crate::error::Error::LocalNotRegistered {
                    index,
                    addr: p.local,
                    len: p.local_len,
                    why: " (a cache tensor)".into(),
                })?;
            Ok(Layout {
                local,
                remote: link.remote(p.remote, p.remote_len)?,
                block,
                local_stride: block,
                remote_stride: block,
            })
        })
        .collect::<std::result::Result<Vec<_>, crate::error::Error>>()?;
    if layouts.is_empty() {
        return Ok(()); // a cache of no tensor: nothing moves
    }
    let (local_idx, remote_idx) = (BlockIndices::U64(local_idx), BlockIndices::U64(remote_idx));
    let placed = check::layouts(link, op, &layouts, local_idx, remote_idx)?;
    let b = BlockBatch {
        layouts: &placed,
        local_idx,
        remote_idx,
    };
    link.run(op, b, b.bytes(), timeout)?;
    Ok(())
}

/// A READ of batch `batch` of each of the peer's tensors (`src`, a cache of batches) cut into
/// pieces of a local block (`dst`'s stride), piece `j` into block `dst_blocks[j]`: upstream's
/// cache-to-blocks pull. As many blocks as pieces (the last piece may be short).
fn batch_to_block_ops(
    src: &Entry,
    dst: &Entry,
    src_tensors: &[usize],
    dst_tensors: &[usize],
    batch: u64,
    dst_blocks: &[u64],
) -> Result<Vec<AddrDesc>> {
    if batch >= src.count {
        return Err(Error::param(format!(
            "batch {batch} outside the peer's cache of {} batches",
            src.count
        )));
    }
    let bs = dst.stride;
    let pieces = src.stride.div_ceil(bs);
    if dst_blocks.len() as u64 != pieces {
        return Err(Error::param(format!(
            "a batch of {} bytes fills {pieces} blocks of {bs}, not {}",
            src.stride,
            dst_blocks.len()
        )));
    }
    if let Some(b) = dst_blocks.iter().find(|&&b| b >= dst.count) {
        return Err(Error::param(format!(
            "destination block {b} outside its cache's {} blocks",
            dst.count
        )));
    }
    let mut ops = Vec::with_capacity(dst_blocks.len() * src_tensors.len());
    for (&st, &dt) in src_tensors.iter().zip(dst_tensors) {
        let base = src.addrs[st] + batch * src.stride;
        for (j, &d) in (0u64..).zip(dst_blocks) {
            let len = bs.min(src.stride - j * bs);
            ops.push(desc(
                TransferOp::Read,
                base + j * bs,
                dst.addrs[dt] + d * bs,
                len,
            ));
        }
    }
    Ok(ops)
}

/// The engine descriptor moving `len` bytes from `src` to `dst`: for a READ the local side is
/// the destination, for a WRITE the source.
fn desc(op: TransferOp, src: u64, dst: u64, len: u64) -> AddrDesc {
    let (local, remote) = match op {
        TransferOp::Read => (dst, src),
        TransferOp::Write => (src, dst),
    };
    AddrDesc {
        local: local as usize,
        remote,
        len: len as usize,
    }
}

/// The last failure of `rets`, or success.
pub(super) fn last_failure(rets: &[LlmStatus]) -> LlmStatus {
    rets.iter()
        .rev()
        .find(|s| **s != LlmStatus::LLM_SUCCESS)
        .copied()
        .unwrap_or(LlmStatus::LLM_SUCCESS)
}

#[cfg(test)]
mod tests;
