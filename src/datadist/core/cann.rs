//! CANN's C++ class `llm_datadist::LlmDataDist` (`libllm_datadist.so`, over the C ABI's
//! `hixl_dd_cann_*`): its calls in their own argument forms, with the rules only that API has
//! (`llm.DeviceId` required, IPv4 addresses, at least one cluster, an unlinked cluster counting
//! as unlinked, `KvCacheExtParam`, a push's `Cache` argument), then the instance's calls, whose
//! rules are every surface's (`args.rs`).

use super::DataDist;
use super::args::{CacheArg, ExtParam, push_size};
use super::moves::last_failure;
use crate::datadist::types::{ClusterInfo, Error, LlmStatus, RemoteCache, Result};

/// The codes CANN's `LlmDataDist::Initialize` returns as they are (`TransRetToLlmCodes`'s
/// set); any other becomes `LLM_FAILED`.
const INITIALIZE_CODES: &[LlmStatus] = &[
    LlmStatus::LLM_SUCCESS,
    LlmStatus::LLM_FAILED,
    LlmStatus::LLM_WAIT_PROC_TIMEOUT,
    LlmStatus::LLM_KV_CACHE_NOT_EXIST,
    LlmStatus::LLM_REPEAT_REQUEST,
    LlmStatus::LLM_REQUEST_ALREADY_COMPLETED,
    LlmStatus::LLM_PARAM_INVALID,
    LlmStatus::LLM_ENGINE_FINALIZED,
    LlmStatus::LLM_NOT_YET_LINK,
    LlmStatus::LLM_ALREADY_LINK,
    LlmStatus::LLM_LINK_FAILED,
    LlmStatus::LLM_UNLINK_FAILED,
    LlmStatus::LLM_NOTIFY_PROMPT_UNLINK_FAILED,
    LlmStatus::LLM_CLUSTER_NUM_EXCEED_LIMIT,
    LlmStatus::LLM_PROCESSING_LINK,
    LlmStatus::LLM_DEVICE_OUT_OF_MEMORY,
    LlmStatus::LLM_PREFIX_ALREADY_EXIST,
    LlmStatus::LLM_PREFIX_NOT_EXIST,
    LlmStatus::LLM_SEQ_LEN_OVER_LIMIT,
    LlmStatus::LLM_NO_FREE_BLOCK,
    LlmStatus::LLM_BLOCKS_OUT_OF_MEMORY,
    LlmStatus::LLM_EXIST_LINK,
    LlmStatus::LLM_FEATURE_NOT_ENABLED,
    LlmStatus::LLM_LINK_BUSY,
    LlmStatus::LLM_OUT_OF_MEMORY,
];

/// `e` with a code CANN's `Initialize` returns: its own if [`INITIALIZE_CODES`] has it, else
/// `LLM_FAILED`.
fn initialize_code(e: Error) -> Error {
    if INITIALIZE_CODES.contains(&e.status) {
        e
    } else {
        Error::new(LlmStatus::LLM_FAILED, e.message)
    }
}

impl DataDist {
    /// `Initialize(options)` as CANN's C++ class: a second call succeeds and changes nothing;
    /// otherwise `llm.DeviceId` is required ([`DataDist::initialize`]).
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` without `llm.DeviceId` (or with an empty one); as
    /// [`DataDist::initialize`], a code CANN's `Initialize` does not return turned into
    /// `LLM_FAILED` as CANN's `TransRetToLlmCodes` turns it.
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
        self.initialize(options).map_err(initialize_code)
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
    /// [`DataDist::unlink_clusters`], where a cluster that is not linked is unlinked already:
    /// its status `LLM_SUCCESS` wherever it stands in the list (CANN's hixl backend destroys
    /// nothing for it), the call's the last other failure.
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
        let (_, mut each) = self.unlink_clusters(clusters, timeout_ms, force)?;
        for s in &mut each {
            if *s == LlmStatus::LLM_NOT_YET_LINK {
                *s = LlmStatus::LLM_SUCCESS;
            }
        }
        Ok((last_failure(&each), each))
    }

    /// `PullKvCache` / `PullKvBlocks` with CANN's `KvCacheExtParam`
    /// ([`ExtParam::pull_layers`]): into batch `index` of `dst_cache` (`size` bytes of each
    /// tensor), or blocks from source blocks, which are required (CANN's class has no pull of a
    /// peer's batch into blocks); then [`DataDist::pull`].
    ///
    /// # Errors
    /// As [`DataDist::pull`].
    pub fn cann_pull(
        &self,
        src: &RemoteCache,
        dst_cache: i64,
        part: CannPart<'_>,
        ext: &ExtParam,
    ) -> Result<()> {
        self.ready()?;
        if let CannPart::Blocks { src: [], .. } = part {
            // (CANN's class has no pull of a peer's batch cut into blocks)
            return Err(Error::param("src_blocks can not be empty."));
        }
        let layers = ext.pull_layers()?;
        let (batch, size, blocks) = part.args();
        self.pull(src, dst_cache, batch, size, blocks, &layers)
    }

    /// `PushKvCache` / `PushKvBlocks` with CANN's `Cache` argument and `KvCacheExtParam`
    /// ([`ExtParam::push_layers`]): batch `index` of `src` (`size` -1), or its blocks; then
    /// [`DataDist::push`].
    ///
    /// # Errors
    /// As [`DataDist::push`].
    pub fn cann_push(
        &self,
        src: &CacheArg,
        dst: &RemoteCache,
        part: CannPart<'_>,
        ext: &ExtParam,
    ) -> Result<()> {
        self.ready()?;
        let (batch, size, blocks) = part.args();
        push_size(size)?;
        let layers = ext.push_layers(src)?;
        self.push(src.cache_id, dst, batch, blocks, &layers)
    }
}

/// What one of CANN's C++ class's moves names on the local side: its two forms, `…KvCache` and
/// `…KvBlocks`, whose arguments never mix.
#[derive(Debug, Clone, Copy)]
pub enum CannPart<'a> {
    /// `PullKvCache` / `PushKvCache`: a batch of the local cache and the bytes of each tensor
    /// (`-1`: a whole batch; a push takes only `-1`).
    Batch {
        /// The batch index.
        index: u32,
        /// Bytes of each tensor.
        size: i64,
    },
    /// `PullKvBlocks` / `PushKvBlocks`: block `src[i]` moves to block `dst[i]`.
    Blocks {
        /// The source side's block indices.
        src: &'a [u64],
        /// The destination side's block indices.
        dst: &'a [u64],
    },
}

/// The block lists as the instance's calls take them (source, destination), if any.
type BlockLists<'a> = Option<(&'a [u64], &'a [u64])>;

impl<'a> CannPart<'a> {
    /// As the instance's calls take it: the batch, the size, the block lists.
    fn args(self) -> (u32, i64, BlockLists<'a>) {
        match self {
            Self::Batch { index, size } => (index, size, None),
            Self::Blocks { src, dst } => (0, -1, Some((src, dst))),
        }
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

#[cfg(test)]
mod tests {
    use super::{INITIALIZE_CODES, initialize_code};
    use crate::datadist::types::{Error, LlmStatus};

    /// CANN's `Initialize` returns its set of codes as they are and turns every other one,
    /// LLM-DataDist's own included (`LLM_TIMEOUT`, the cache codes), into `LLM_FAILED`.
    #[test]
    fn initialize_returns_cann_codes_only() {
        for &(name, code) in LlmStatus::ALL {
            let got = initialize_code(Error::new(code, "x")).status;
            let kept = !matches!(
                name,
                "LLM_CACHE_INCOMPATIBLE"
                    | "LLM_CACHE_KEY_ALREADY_EXIST"
                    | "LLM_COPY_CACHE_FAILED"
                    | "LLM_CACHE_ID_ALREADY_EXIST"
                    | "LLM_TIMEOUT"
            );
            let want = if kept { code } else { LlmStatus::LLM_FAILED };
            assert_eq!(got, want, "{name}");
            assert_eq!(INITIALIZE_CODES.contains(&code), kept, "{name}");
        }
        assert_eq!(
            initialize_code(Error::new(LlmStatus(7), "x")).status,
            LlmStatus::LLM_FAILED
        );
    }
}
