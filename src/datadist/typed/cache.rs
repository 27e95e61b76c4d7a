//! A registered cache as a capability ([`Cache`]: its geometry, its tensors until unregistered), and how a link names a peer's cache ([`PeerCache`]).

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Brand, Geometry, Inner, Rejected};
use crate::datadist::types::{CacheKind, Error, LlmStatus, Placement, RemoteCache, Result};
use crate::types::raw::RawMemory;
use crate::{MemDesc, Reclaim};

/// The tensors' parts: what `into_raw_parts` gave (owned memory) and each range.
pub(super) struct Tensors(pub(super) Vec<(Option<RawMemory>, MemDesc)>);

// SAFETY: a record of memory the cache owns (as a `Box<[u8]>` owns its bytes; `M` is `Send`,
// `RegistrableMemory`'s bound) or of caller-managed addresses; shared access reads the record
// only, never the memory.
unsafe impl Send for Tensors {}
// SAFETY: as above.
unsafe impl Sync for Tensors {}

/// A registered cache: the capability to use it in this instance's pulls and pushes, with its
/// geometry (tensors, block size, block count), so indices are checked against it. `M` is what
/// [`Cache::unregister`] hands back for each tensor: the memory registered, or the
/// [`MemDesc`] of a raw registration.
///
/// Dropping a cache unregisters it; if that fails, owned memory is leaked, never freed while a
/// peer may reach it.
pub struct Cache<'id, M: Reclaim = crate::HostBuffer> {
    pub(super) inner: Arc<Inner>,
    pub(super) id: i64,
    pub(super) geometry: Geometry,
    pub(super) tensors: Tensors,
    pub(super) _brand: Brand<'id>,
    pub(super) _mem: PhantomData<fn() -> M>,
}

impl<M: Reclaim> fmt::Debug for Cache<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("id", &self.id)
            .field("kind", &self.geometry.kind)
            .field("placement", &self.geometry.placement)
            .field("num_tensors", &self.geometry.num_tensors)
            .field("block_size", &self.geometry.stride)
            .field("block_count", &self.geometry.count)
            .finish()
    }
}

impl<M: Reclaim> Cache<'_, M> {
    /// Its cache id (peers name it by this in [`PeerCache::Id`]).
    pub fn id(&self) -> i64 {
        self.id
    }
    /// Its kind.
    pub fn kind(&self) -> CacheKind {
        self.geometry.kind
    }
    /// Where its tensors live.
    pub fn placement(&self) -> Placement {
        self.geometry.placement
    }
    /// Its number of tensors.
    pub fn num_tensors(&self) -> usize {
        self.geometry.num_tensors
    }
    /// Bytes of one tensor.
    pub fn tensor_size(&self) -> u64 {
        self.geometry.tensor_size
    }
    /// Bytes of one block (or batch) of a tensor.
    pub fn block_size(&self) -> u64 {
        self.geometry.stride
    }
    /// Blocks (or batches) per tensor.
    pub fn block_count(&self) -> u64 {
        self.geometry.count
    }
    /// Tensor `i`'s address.
    pub fn tensor_addr(&self, i: usize) -> Option<usize> {
        self.tensors.0.get(i).map(|(_, d)| d.addr)
    }

    /// `LLM_PARAM_INVALID` unless every block is one of this cache's.
    pub(super) fn check_blocks(&self, blocks: &[u64], what: &str) -> Result<()> {
        match blocks.iter().find(|&&b| b >= self.geometry.count) {
            Some(b) => Err(Error::param(format!(
                "{what} block {b} outside cache {}'s {} blocks",
                self.id, self.geometry.count
            ))),
            None => Ok(()),
        }
    }

    /// The address of `len` bytes at `offset` of host tensor `tensor`.
    fn host_span(&self, tensor: usize, offset: u64, len: usize) -> Result<*mut u8> {
        if self.geometry.placement != Placement::Host {
            return Err(Error::new(
                LlmStatus::LLM_FEATURE_NOT_ENABLED,
                "a device cache is read and written with the device's copies (aclrtMemcpy)",
            ));
        }
        let (_, d) = self.tensors.0.get(tensor).ok_or_else(|| {
            Error::param(format!(
                "tensor {tensor} of a cache of {}",
                self.geometry.num_tensors
            ))
        })?;
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.geometry.tensor_size => Ok((d.addr + offset as usize) as _),
            _ => Err(Error::param(format!(
                "{len} bytes at {offset} leave a tensor of {}",
                self.geometry.tensor_size
            ))),
        }
    }

    /// Copies `buf.len()` bytes at `offset` of tensor `tensor` out of a host cache. `&mut`:
    /// no pull or push of this instance uses the cache meanwhile (peers may still WRITE it:
    /// read after they said their data landed).
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` for a tensor or span outside the cache; `LLM_FEATURE_NOT_ENABLED`
    /// for a device cache.
    pub fn read_at(&mut self, tensor: usize, offset: u64, buf: &mut [u8]) -> Result<()> {
        let p = self.host_span(tensor, offset, buf.len())?;
        // SAFETY: the span is inside a registered host tensor, alive while the cache is;
        // `&mut self` keeps this instance's transfers off it; no reference to it is made.
        unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// Copies `data` into tensor `tensor` at `offset` of a host cache.
    ///
    /// # Errors
    /// As [`Cache::read_at`].
    pub fn write_at(&mut self, tensor: usize, offset: u64, data: &[u8]) -> Result<()> {
        let p = self.host_span(tensor, offset, data.len())?;
        // SAFETY: as in `read_at`; the memory is valid for writes of any bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    /// Unregisters the cache (`UnregisterKvCache`) and hands back each tensor. When this
    /// returns, no peer reads or writes them (the engine's deregistration), and peers that
    /// still name it get an error.
    ///
    /// # Errors
    /// The engine's (the cache stays registered, and comes back in the error); after
    /// [`Cluster::finalize`](super::Cluster::finalize) it succeeds (the memory is already out of
    /// reach).
    pub fn unregister(mut self) -> std::result::Result<Vec<M>, Rejected<Self>> {
        match self.release() {
            Ok(()) => Ok(self.take()),
            Err(error) => Err(Rejected { error, value: self }),
        }
    }

    /// Ends the registration: `Ok` once no peer can reach the memory.
    fn release(&self) -> Result<()> {
        match self.inner.dd.unregister_cache(self.id) {
            Ok(()) => Ok(()),
            Err(_) if self.inner.finalized.load(Ordering::Acquire) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The tensors, out of a cache whose registration ended.
    fn take(&mut self) -> Vec<M> {
        (std::mem::take(&mut self.tensors.0).into_iter())
            // SAFETY: the parts came from `M::into_raw_parts` at registration (`Some`), or are
            // a raw registration's ranges (`M = MemDesc`, `None`); `take` empties the record,
            // so each is reclaimed once.
            .map(|(raw, desc)| unsafe { M::reclaim(raw, desc) })
            .collect()
    }
}

impl<M: Reclaim> Drop for Cache<'_, M> {
    fn drop(&mut self) {
        if self.tensors.0.is_empty() {
            return;
        }
        match self.release() {
            Ok(()) => drop(self.take()),
            Err(e) => {
                tracing::warn!(cache = self.id, error = %e, "a dropped cache could not be unregistered: its memory is leaked");
                self.tensors.0.clear();
            }
        }
    }
}

/// A peer's cache, as a pull or push on a link names it (the link says which cluster).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerCache {
    /// By cache id, and batch (for batches; 0 for blocks).
    Id {
        /// Its cache id.
        cache_id: i64,
        /// The batch.
        batch_index: u32,
    },
    /// The blocks cache registered under model `model_id` (`BlocksCacheKey`).
    Blocks {
        /// The model id.
        model_id: u64,
    },
    /// The cache registered for request `req_id` of `model_id` (`CacheKey`).
    Request {
        /// The request id.
        req_id: u64,
        /// The model id.
        model_id: u64,
    },
}

impl PeerCache {
    pub(super) fn at(self, cluster_id: u64) -> RemoteCache {
        match self {
            PeerCache::Id {
                cache_id,
                batch_index,
            } => RemoteCache::ById {
                cluster_id,
                cache_id,
                batch_index,
            },
            PeerCache::Blocks { model_id } => RemoteCache::Blocks {
                cluster_id,
                model_id,
            },
            PeerCache::Request { req_id, model_id } => RemoteCache::Request {
                cluster_id,
                req_id,
                model_id,
            },
        }
    }
}
