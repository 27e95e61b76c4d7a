//! Registering and unregistering caches, and publishing them in the cache table peers fetch.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::engine::DdEngine;
use super::{DataDist, LocalCache, Pool, Regions, args};
use crate::datadist::table::{Entry, FORMAT, Key, Table};
use crate::datadist::types::{CacheDesc, CacheKey, CacheKind, Error, LlmStatus, Placement, Result};
use crate::runtime::handle::RegionHandle;
use crate::sync::lock;

impl DataDist {
    /// Registers a cache of `desc` over the tensors at `addrs` (`RegisterKvCache`, the Python
    /// package's `register_cache` / `register_blocks_cache`): each tensor is registered with
    /// the engine (device or host memory, as `desc.placement` says), and the cache is in the
    /// table peers fetch. Returns its id (from 1).
    ///
    /// Geometry: `tensor_size = product(shape) * element size`; a blocks (or mix) cache has
    /// `shape[0]` blocks of `tensor_size / shape[0]` bytes, a cache of batches `shape[batch_dim]`
    /// batches of `tensor_size / shape[batch_dim]` (batch_dim 0 for the others).
    ///
    /// Keys: key `i` of a cache of batches names its batch `i` (one key per request, as
    /// upstream's `allocate_cache(desc, cache_keys)`); a blocks cache's key names the cache.
    ///
    /// # Safety
    /// Each `addrs[i]..addrs[i] + tensor_size` must be memory of `desc.placement` that stays
    /// allocated and valid for reads and writes of any bytes until the cache is unregistered
    /// (or the instance finalized), and nothing else may access it in a way that conflicts
    /// with transfers: peers READ and WRITE it while they are linked, and this instance's pulls
    /// write it. (The engine's `register_mem` contract, for each tensor.)
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID`: no address, more or fewer than `num_tensors`, a null one, a bad
    /// shape or element type, `batch_dim` outside the shape, more keys than batches (or more
    /// than one for a blocks cache); the engine's errors (device memory without Ascend:
    /// `LLM_FEATURE_NOT_ENABLED`).
    pub unsafe fn register_cache(
        &self,
        desc: &CacheDesc,
        addrs: &[u64],
        kind: CacheKind,
        batch_dim: usize,
        keys: &[CacheKey],
    ) -> Result<i64> {
        // no role switch replaces the engine between registering with it and recording the
        // handles (`relisten` registers what is recorded)
        let _regs = lock(&self.regs);
        let (engine, _) = self.live()?;
        let (tensor_size, count) = args::register(desc, addrs, kind, batch_dim, keys.len())?;
        let entry = Entry {
            cache_id: self.next_id.fetch_add(1, Ordering::Relaxed),
            kind,
            placement: desc.placement,
            tensor_size,
            stride: tensor_size / count,
            count,
            addrs: addrs.to_vec(),
        };
        let batch = |i: usize| {
            if kind == CacheKind::Cache {
                i as u64
            } else {
                0
            }
        };
        let keys: Vec<(CacheKey, u64)> = (keys.iter().enumerate())
            .map(|(i, k)| (*k, batch(i)))
            .collect();
        // a cache the table cannot hold is refused before anything is registered
        self.check_fits(&entry, &keys)?;
        let pools = lock(&self.caches).pools.clone();
        let (handles, regions) = register_tensors(&engine, &entry, &pools)?;
        let id = entry.cache_id;
        lock(&self.caches).by_id.insert(
            id,
            LocalCache {
                entry,
                handles,
                regions,
                keys,
                uses: Arc::default(),
            },
        );
        if let Err(e) = self.publish() {
            // (a concurrent registration filled the table first) the error says the memory is
            // not registered: undo it, so the caller may free it
            self.undo(&engine, id);
            return Err(e);
        }
        Ok(id)
    }

    /// `LLM_OUT_OF_MEMORY` when the cache table cannot hold the caches and `new`.
    fn check_fits(&self, new: &Entry, keys: &[(CacheKey, u64)]) -> Result<()> {
        let caches = lock(&self.caches);
        let key = |cache_id: i64, (k, batch): &(CacheKey, u64)| Key {
            cache_id,
            req_id: k.req_id,
            model_id: k.model_id,
            batch: *batch,
        };
        let t = Table {
            entries: (caches.by_id.values().map(|c| c.entry.clone()))
                .chain([new.clone()])
                .collect(),
            keys: (caches.by_id.values())
                .flat_map(|c| c.keys.iter().map(|k| key(c.entry.cache_id, k)))
                .chain(keys.iter().map(|k| key(new.cache_id, k)))
                .collect(),
        };
        if t.encode_payload().len() > FORMAT.max_payload() {
            return Err(Error::new(
                LlmStatus::LLM_OUT_OF_MEMORY,
                "the caches do not fit the cache table (1 MiB)",
            ));
        }
        Ok(())
    }

    /// Takes cache `id` out again and deregisters its tensors; a tensor the engine keeps
    /// (it refused to let go) stays registered under `id`, for `unregister_cache` to retry.
    /// A pull or push that found the cache meanwhile (ids are sequential) moves from the
    /// regions it took: it is waited for before the tensors go, as `unregister_cache` waits.
    fn undo(&self, engine: &DdEngine, id: i64) {
        let Some(mut c) = lock(&self.caches).by_id.remove(&id) else {
            return;
        };
        c.uses.close();
        let mut caches = lock(&self.caches);
        if deregister_all(engine, &mut c.handles).is_err() {
            tracing::warn!(
                cache = id,
                "a refused cache's tensors could not all be deregistered"
            );
            c.regions = tensor_regions(&c.entry, &c.handles, &caches.pools);
            c.uses.reopen();
            caches.by_id.insert(id, c);
        }
    }

    /// Unregisters cache `cache_id` (`UnregisterKvCache`): it leaves the table and its tensors
    /// are deregistered; when this returns, no peer reads or writes them (the engine's
    /// deregistration rule: refused while one of this instance's async transfers uses them)
    /// and no pull or push of this instance does: it waits for those running on the cache
    /// (each ends by its deadline, `llm.SyncKvCacheWaitTime`) and refuses new ones
    /// (`LLM_KV_CACHE_NOT_EXIST`) meanwhile. That holds for a cache carved from a memory pool
    /// too, which has no registration of its own: its range may go back to the pool when this
    /// returns. An unknown id succeeds, as upstream's.
    ///
    /// # Errors
    /// `LLM_FAILED` before `initialize`; the engine's errors (the cache stays registered, with
    /// the tensors the engine refused to let go).
    pub fn unregister_cache(&self, cache_id: i64) -> Result<()> {
        self.live()?;
        let Some(uses) = (lock(&self.caches).by_id.get(&cache_id)).map(|c| c.uses.clone()) else {
            return Ok(());
        };
        // waited for without `regs`: registrations, role switches and `finalize` go on while
        // a pull or push of this cache waits on its peer
        uses.close();
        // the engine is the one the cache's handles are of: no role switch replaces it until
        // this returns
        let _regs = lock(&self.regs);
        let engine = match self.live() {
            Ok((engine, _)) => engine,
            // finalized meanwhile: the cache went with everything else
            Err(_) => return Ok(()),
        };
        let mut guard = lock(&self.caches);
        let caches = &mut *guard;
        // (gone, or unregistered and registered again under this id meanwhile: not ours)
        let Some(c) = (caches.by_id.get_mut(&cache_id)).filter(|c| Arc::ptr_eq(&c.uses, &uses))
        else {
            return Ok(());
        };
        if let Err(e) = deregister_all(&engine, &mut c.handles) {
            // (the tensors whose registration went are no longer a move's)
            c.regions = tensor_regions(&c.entry, &c.handles, &caches.pools);
            drop(guard);
            uses.reopen();
            return Err(e);
        }
        caches.by_id.remove(&cache_id);
        drop(guard);
        self.publish()
    }

    /// Registers `len` bytes at `addr` of `placement` as a memory pool (upstream's
    /// `llm.MemPoolConfig` / `llm.HostMemPoolConfig`, whose memory the Python package's
    /// `allocate_cache` carves caches from): one engine registration, kept until `finalize`.
    /// A cache whose tensors lie inside a pool registers nothing more, so a cache carved from
    /// a pool registered before a link is reachable over that link (an engine link knows the
    /// regions registered when it was made).
    ///
    /// Unregistering a cache inside a pool leaves its memory registered with the pool: peers
    /// that kept its address can still reach it until `finalize` (upstream's pools behave so).
    ///
    /// # Safety
    /// `addr..addr + len` must be memory of `placement` that stays allocated and valid for
    /// reads and writes of any bytes until the instance is finalized, and nothing else may
    /// access it in a way that conflicts with transfers (the engine's `register_mem` contract).
    ///
    /// # Errors
    /// `LLM_FAILED` before `initialize`; `LLM_PARAM_INVALID` for a null address, no length, a
    /// range past the end of memory or one that overlaps another pool; the engine's errors.
    pub unsafe fn register_pool(&self, placement: Placement, addr: u64, len: u64) -> Result<()> {
        let _regs = lock(&self.regs);
        let (engine, _) = self.live()?;
        args::pool(addr, len)?;
        let mut caches = lock(&self.caches);
        if caches
            .pools
            .iter()
            .any(|p| addr < p.addr + p.len && p.addr < addr + len)
        {
            return Err(Error::param("a pool that overlaps another"));
        }
        // SAFETY: the caller promised the engine's contract for the range until finalize (the
        // pool is deregistered with the engine then, before the memory may go)
        let handle =
            unsafe { engine.register_mem(addr as usize, len as usize, placement.mem_type()) }?;
        caches.pools.push(Pool {
            addr,
            len,
            placement,
            handle,
        });
        Ok(())
    }

    /// Removes `key` from the cache it names (`remove_cache_key`): peers that fetch the table
    /// from now on no longer find it; the cache stays registered. A key no cache has is fine
    /// (upstream's call is then a no-op too).
    ///
    /// A peer that fetched the table before still finds the key in its copy: until the cache
    /// is unregistered its pulls by that key read the batch, afterwards they fail (the memory
    /// is no longer registered), never reach other memory.
    ///
    /// # Errors
    /// `LLM_FAILED` before `initialize`.
    pub fn remove_cache_key(&self, key: &CacheKey) -> Result<()> {
        self.live()?;
        let mut caches = lock(&self.caches);
        let mut removed = false;
        for c in caches.by_id.values_mut() {
            let before = c.keys.len();
            c.keys.retain(|(k, _)| k != key);
            removed |= c.keys.len() != before;
        }
        drop(caches);
        if removed { self.publish() } else { Ok(()) }
    }

    /// Rewrites the published table (odd version while it is written, then even).
    pub(super) fn publish(&self) -> Result<()> {
        let s = lock(&self.state);
        let Some(live) = s.as_ref() else {
            return Ok(());
        };
        let mut caches = lock(&self.caches);
        let t = Table {
            entries: caches.by_id.values().map(|c| c.entry.clone()).collect(),
            keys: (caches.by_id.values())
                .flat_map(|c| {
                    c.keys.iter().map(|(k, batch)| Key {
                        cache_id: c.entry.cache_id,
                        req_id: k.req_id,
                        model_id: k.model_id,
                        batch: *batch,
                    })
                })
                .collect(),
        };
        let payload = t.encode_payload();
        let base = live.table.as_ptr();
        // SAFETY: the table's region is FORMAT's region_len bytes, alive while `live` is (the
        // state lock is held), and written only here, under the caches lock; peers READ it
        // meanwhile (raw bytes, never a reference).
        unsafe { caches.publisher.publish(&FORMAT, base, &payload) }.map_err(|_| {
            Error::new(
                LlmStatus::LLM_OUT_OF_MEMORY,
                "the caches do not fit the cache table (1 MiB)",
            )
        })
    }
}

/// Registers each distinct tensor of `e` with `engine`, but those inside one of `pools`
/// (registered already); on failure the ones registered go. Returns the registrations and
/// each tensor's region ([`tensor_regions`]).
pub(super) fn register_tensors(
    engine: &DdEngine,
    e: &Entry,
    pools: &[Pool],
) -> Result<(Vec<RegionHandle>, Regions)> {
    let mut handles: Vec<RegionHandle> = Vec::new();
    for &a in &e.addrs {
        let (addr, len) = (a as usize, e.tensor_size as usize);
        if handles.iter().any(|h| h.addr == addr)
            || pools.iter().any(|p| p.holds(e.placement, a, e.tensor_size))
        {
            continue;
        }
        // SAFETY: the caller of `register_cache` promised this for each tensor (its `# Safety`),
        // for as long as the cache is registered; the handles go before the memory may
        let r = unsafe { engine.register_mem(addr, len, e.placement.mem_type()) };
        match r {
            Ok(h) => handles.push(h),
            Err(err) => {
                for h in &handles {
                    let _ = engine.deregister_mem(h);
                }
                return Err(err.into());
            }
        }
    }
    let regions = tensor_regions(e, &handles, pools);
    Ok((handles, regions))
}

/// Each tensor of `e`'s region: the pool's that holds it, or its own registration among
/// `handles` (`None` if that went).
pub(super) fn tensor_regions(e: &Entry, handles: &[RegionHandle], pools: &[Pool]) -> Regions {
    (e.addrs.iter())
        .map(|&a| {
            let pool = pools
                .iter()
                .find(|p| p.holds(e.placement, a, e.tensor_size));
            pool.map(|p| &p.handle)
                .or_else(|| {
                    (handles.iter())
                        .find(|h| h.addr == a as usize && h.len == e.tensor_size as usize)
                })
                .cloned()
        })
        .collect()
}

/// Deregisters each of `handles` from `engine`, keeping those it refuses; the first refusal.
fn deregister_all(engine: &DdEngine, handles: &mut Vec<RegionHandle>) -> Result<()> {
    let mut refused = None;
    handles.retain(|h| match engine.deregister_mem(h) {
        Ok(()) => false,
        Err(e) => {
            refused.get_or_insert(e);
            true
        }
    });
    refused.map_or(Ok(()), |e| Err(e.into()))
}
