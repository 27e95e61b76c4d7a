//! CANN's C++ class `llm_datadist::LlmDataDist` (`libllm_datadist.so`, over the C ABI's
//! `hixl_dd_cann_*`): its calls in their own argument forms, with the rules only that API has
//! (`llm.DeviceId` required, IPv4 addresses, at least one cluster, an unlinked cluster counting
//! as unlinked, `KvCacheExtParam`, a push's `Cache` argument), then the instance's calls, whose
//! rules are every surface's (`args.rs`).

use super::DataDist;
use super::args::{CacheArg, ExtParam, push_size};
use super::moves::last_failure;
use crate::datadist::types::{ClusterInfo, Error, LlmStatus, RemoteCache, Result};

impl DataDist {
    /// `Initialize(options)` as CANN's C++ class: a second call succeeds and changes nothing;
    /// otherwise `llm.DeviceId` is required ([`DataDist::initialize`]).
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` without `llm.DeviceId` (or with an empty one); as
    /// [`DataDist::initialize`].
    pub fn cann_initialize(&self, options: &[(String, String)]) -> Result<()> {
        if self.ready().is_ok() {
            return Ok(());
        }
        if !options
            .iter()
            .any(|(k, v)| k == "llm.DeviceId" && !v.is_empty())
        {
            return Err(Error::param("llm.DeviceId is required"));
        }
        self.initialize(options)
    }

    /// `LinkLlmClusters` as CANN's C++ class: at least one cluster, IPv4 addresses (CANN turns
    /// each into a 32-bit number before anything is linked); then [`DataDist::link_clusters`].
    ///
    /// # Errors
    /// As [`DataDist::link_clusters`]; `LLM_PARAM_INVALID` for no cluster or an IPv6 address.
    pub fn cann_link_clusters(
        &self,
        clusters: &[ClusterInfo],
        timeout_ms: i32,
    ) -> Result<(LlmStatus, Vec<LlmStatus>)> {
        self.ready()?;
        cann_clusters(clusters)?;
        self.link_clusters(clusters, timeout_ms)
    }

    /// `UnlinkLlmClusters` as CANN's C++ class: [`DataDist::cann_link_clusters`]'s rules, then
    /// [`DataDist::unlink_clusters`], where a cluster that is not linked is unlinked already
    /// (its status `LLM_SUCCESS`, the call's the last other failure) when the call's failure
    /// was that one.
    ///
    /// # Errors
    /// As [`DataDist::cann_link_clusters`].
    pub fn cann_unlink_clusters(
        &self,
        clusters: &[ClusterInfo],
        timeout_ms: i32,
        force: bool,
    ) -> Result<(LlmStatus, Vec<LlmStatus>)> {
        self.ready()?;
        cann_clusters(clusters)?;
        let (last, mut each) = self.unlink_clusters(clusters, timeout_ms, force)?;
        if last != LlmStatus::LLM_NOT_YET_LINK {
            return Ok((last, each));
        }
        for s in &mut each {
            if *s == LlmStatus::LLM_NOT_YET_LINK {
                *s = LlmStatus::LLM_SUCCESS;
            }
        }
        Ok((last_failure(&each), each))
    }

    /// `PullKvCache` / `PullKvBlocks` with CANN's `KvCacheExtParam`
    /// ([`ExtParam::pull_layers`]), source blocks required (CANN's class has no pull of a
    /// peer's batch into blocks); then [`DataDist::pull`].
    ///
    /// # Errors
    /// As [`DataDist::pull`].
    pub fn cann_pull(
        &self,
        src: &RemoteCache,
        dst_cache: i64,
        dst_batch: u32,
        size: i64,
        blocks: Option<(&[u64], &[u64])>,
        ext: &ExtParam,
    ) -> Result<()> {
        self.ready()?;
        if blocks.is_some_and(|(s, _)| s.is_empty()) {
            // (CANN's class has no pull of a peer's batch cut into blocks)
            return Err(Error::param("src_blocks can not be empty."));
        }
        let layers = ext.pull_layers()?;
        self.pull(src, dst_cache, dst_batch, size, blocks, &layers)
    }

    /// `PushKvCache` / `PushKvBlocks` with CANN's `Cache` argument and `KvCacheExtParam`
    /// (`size` -1, [`ExtParam::push_layers`]); then [`DataDist::push`].
    ///
    /// # Errors
    /// As [`DataDist::push`].
    pub fn cann_push(
        &self,
        src: &CacheArg,
        dst: &RemoteCache,
        src_batch: u32,
        size: i64,
        blocks: Option<(&[u64], &[u64])>,
        ext: &ExtParam,
    ) -> Result<()> {
        self.ready()?;
        push_size(size)?;
        let layers = ext.push_layers(src)?;
        self.push(src.cache_id, dst, src_batch, blocks, &layers)
    }
}

/// CANN's C++ clusters: at least one, every address IPv4.
fn cann_clusters(clusters: &[ClusterInfo]) -> Result<()> {
    if clusters.is_empty() {
        return Err(Error::param("no cluster"));
    }
    let v6 = clusters
        .iter()
        .flat_map(|c| c.local_ip_infos.iter().chain(&c.remote_ip_infos))
        .find(|i| !i.ip.is_ipv4());
    match v6 {
        Some(i) => Err(Error::param(format!("{} is not an IPv4 address", i.ip))),
        None => Ok(()),
    }
}
