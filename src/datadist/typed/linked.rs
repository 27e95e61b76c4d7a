//! A link to a peer cluster ([`LinkedCluster`]): the only place pulls and pushes exist.

use std::fmt;
use std::time::Duration;

use super::{Brand, Cache, Inner, PeerCache, millis};
use crate::Reclaim;
use crate::datadist::types::{ClusterInfo, Error, Layers, LlmStatus, Result};

/// A link to a peer cluster, borrowed from the cluster: pulls and pushes exist only here.
/// [`LinkedCluster::unlink`] consumes it; dropping it unlinks too (forcibly).
#[must_use = "dropping a link unlinks it"]
pub struct LinkedCluster<'c, 'id> {
    pub(super) inner: &'c Inner,
    pub(super) remote: u64,
    pub(super) _brand: Brand<'id>,
}

impl fmt::Debug for LinkedCluster<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinkedCluster")
            .field("cluster_id", &self.inner.dd.cluster_id())
            .field("remote_cluster_id", &self.remote)
            .finish()
    }
}

impl<'id> LinkedCluster<'_, 'id> {
    /// The peer's cluster id.
    pub fn remote_cluster_id(&self) -> u64 {
        self.remote
    }

    /// Pulls blocks of a peer's cache into `dst` (`PullKvBlocks`), every tensor: block
    /// `src_blocks[i]` lands in block `dst_blocks[i]`, consecutive runs as one descriptor, in one
    /// batch READ.
    ///
    /// # Errors
    /// As [`LinkedCluster::pull_blocks_layers`].
    pub fn pull_blocks<M: Reclaim>(
        &self,
        src: PeerCache,
        dst: &Cache<'id, M>,
        src_blocks: &[u64],
        dst_blocks: &[u64],
    ) -> Result<()> {
        self.pull_blocks_layers(src, dst, src_blocks, dst_blocks, &Layers::all())
    }

    /// [`pull_blocks`](Self::pull_blocks) of the tensors of some layers (`KvCacheExtParam`).
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID`: a block outside `dst` (checked against its geometry before anything
    /// moves) or outside the peer's cache, lists of different lengths or empty, a bad layer
    /// range or mismatched tensor counts; `LLM_KV_CACHE_NOT_EXIST` (no such peer cache in the
    /// table it published at the link's first use); `LLM_NOT_YET_LINK` (the peer unlinked
    /// it); `LLM_TIMEOUT` (`llm.SyncKvCacheWaitTime`); the engine's other errors.
    pub fn pull_blocks_layers<M: Reclaim>(
        &self,
        src: PeerCache,
        dst: &Cache<'id, M>,
        src_blocks: &[u64],
        dst_blocks: &[u64],
        layers: &Layers,
    ) -> Result<()> {
        dst.check_blocks(dst_blocks, "destination")?;
        self.inner.dd.pull(
            &src.at(self.remote),
            dst.id,
            0,
            -1,
            Some((src_blocks, dst_blocks)),
            layers,
        )
    }

    /// Pushes blocks of `src` into a peer's cache (`PushKvBlocks`), every tensor, one batch
    /// WRITE per layer.
    ///
    /// # Errors
    /// As [`LinkedCluster::pull_blocks_layers`] (a block outside `src` is checked first).
    pub fn push_blocks<M: Reclaim>(
        &self,
        src: &Cache<'id, M>,
        src_blocks: &[u64],
        dst: PeerCache,
        dst_blocks: &[u64],
    ) -> Result<()> {
        self.push_blocks_layers(src, src_blocks, dst, dst_blocks, &Layers::all())
    }

    /// [`push_blocks`](Self::push_blocks) of the tensors of some layers.
    ///
    /// # Errors
    /// As [`LinkedCluster::push_blocks`].
    pub fn push_blocks_layers<M: Reclaim>(
        &self,
        src: &Cache<'id, M>,
        src_blocks: &[u64],
        dst: PeerCache,
        dst_blocks: &[u64],
        layers: &Layers,
    ) -> Result<()> {
        src.check_blocks(src_blocks, "source")?;
        self.inner.dd.push(
            src.id,
            &dst.at(self.remote),
            0,
            Some((src_blocks, dst_blocks)),
            layers,
        )
    }

    /// Pulls a batch of a peer's cache (`PullKvCache`): batch `src`'s `batch_index` of each
    /// tensor lands in batch `dst_batch` of `dst`, `size` bytes of it (`None`: a whole batch of
    /// `dst`).
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` for a batch outside either cache or a size beyond a batch; else as
    /// [`LinkedCluster::pull_blocks_layers`].
    pub fn pull_cache<M: Reclaim>(
        &self,
        src: PeerCache,
        dst: &Cache<'id, M>,
        dst_batch: u32,
        size: Option<u64>,
    ) -> Result<()> {
        if u64::from(dst_batch) >= dst.geometry.count {
            return Err(Error::param(format!(
                "destination batch {dst_batch} outside cache {}'s {} batches",
                dst.id, dst.geometry.count
            )));
        }
        let size = match size {
            None => -1,
            Some(s) => i64::try_from(s)
                .ok()
                .filter(|&s| s > 0)
                .ok_or_else(|| Error::param(format!("size {s}")))?,
        };
        self.inner.dd.pull(
            &src.at(self.remote),
            dst.id,
            dst_batch,
            size,
            None,
            &Layers::all(),
        )
    }

    /// Pushes batch `src_batch` of `src` into a peer's cache (`PushKvCache`): into the batch
    /// `dst` names (its `batch_index`), a whole batch.
    ///
    /// # Errors
    /// As [`LinkedCluster::pull_cache`].
    pub fn push_cache<M: Reclaim>(
        &self,
        src: &Cache<'id, M>,
        src_batch: u32,
        dst: PeerCache,
    ) -> Result<()> {
        if u64::from(src_batch) >= src.geometry.count {
            return Err(Error::param(format!(
                "source batch {src_batch} outside cache {}'s {} batches",
                src.id, src.geometry.count
            )));
        }
        self.inner.dd.push(
            src.id,
            &dst.at(self.remote),
            src_batch,
            None,
            &Layers::all(),
        )
    }

    /// Unlinks (`UnlinkLlmClusters`): the link is gone when this returns, whatever it returns.
    ///
    /// # Errors
    /// `LLM_UNLINK_FAILED` when the engine could not tell the peer (the link is gone all the
    /// same); `LLM_PARAM_INVALID` for a zero or too long timeout (the link is then unlinked
    /// forcibly).
    pub fn unlink(self, timeout: Duration) -> Result<()> {
        let this = std::mem::ManuallyDrop::new(self);
        let r = millis(timeout).and_then(|ms| this.unlink_now(ms, false));
        if r.as_ref()
            .is_err_and(|e| e.status == LlmStatus::LLM_PARAM_INVALID)
        {
            let _ = this.unlink_now(1000, true);
        }
        r
    }

    fn unlink_now(&self, ms: i32, force: bool) -> Result<()> {
        let info = ClusterInfo {
            remote_cluster_id: self.remote,
            remote_role_type: 0,
            local_ip_infos: Vec::new(),
            remote_ip_infos: Vec::new(),
        };
        let (status, _) = self.inner.dd.unlink_clusters(&[info], ms, force)?;
        if status != LlmStatus::LLM_SUCCESS {
            return Err(Error::new(
                status,
                format!("unlinking cluster {} failed", self.remote),
            ));
        }
        Ok(())
    }
}

impl Drop for LinkedCluster<'_, '_> {
    fn drop(&mut self) {
        if let Err(e) = self.unlink_now(1000, true) {
            tracing::debug!(cluster = self.remote, error = %e, "unlink on drop");
        }
    }
}
