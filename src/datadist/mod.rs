//! LLM-DataDist on hixl: the KV-cache manager of CANN's HIXL package (`llm_datadist`), whose
//! pulls and pushes are batched one-sided READs and WRITEs of the engine.
//!
//! A cluster (one instance per serving process, named by a `u64` cluster id, in a
//! [`Role`]) registers its KV tensors as caches, links to peer clusters, and pulls blocks or
//! batches of a peer's cache into its own, or pushes its own into a peer's. Each instance
//! publishes its caches (their geometry and tensor addresses) in a cache table that a peer
//! fetches once per link, so a pull or push is checked against both caches and then moves as
//! one batch of descriptors (consecutive blocks as one). Device caches move over the Ascend
//! path where the engine has it; host caches over the same-host path or TCP, so it works
//! without an NPU.
//!
//! Clusters link by their listen addresses ([`DataDist::link_clusters`], `LinkLlmClusters`) or
//! by an explicit rank table ([`DataDist::link_comm`], the Python package's `link`, which
//! vllm-ascend's and omni-infer's connectors use: HCCL's rendezvous swaps the engines' names,
//! then the engines link).
//!
//! [`DataDist`] is the runtime-checked instance, in LLM-DataDist's shape (cluster and cache
//! ids, status codes as [`LlmStatus`]): the C ABI (`hixl_dd_*`, under `libllm_datadist.so`'s
//! `llm_datadist::LlmDataDist`) and the Python package `llm_datadist` are layers over it.
//!
//! [`typed`] is the same instance with its lifecycle in the types ([`Cluster`]: the role as a
//! type state, pulls and pushes only on a [`LinkedCluster`], caches as [`Cache`] capabilities
//! that carry their geometry).
//!
//! Every argument rule is checked once, here, for every surface ([`args`]: block lists, batch
//! indices, sizes, layer ranges, registrations, timeouts; and the forms only CANN's C++ class
//! has, [`ExtParam`] and [`CacheArg`], behind `DataDist::cann_*`); the C ABI, the C++ class
//! and the Python package translate their types into these and check nothing themselves. The
//! conformance table (`tests/conformance/cases.json`) runs each rule through every surface.
//!
//! Status codes are LLM-DataDist's numeric values (`LLM_PARAM_INVALID` 0x5010B005, ...); the
//! engine's map as upstream's `hixl` backend maps them ([`LlmStatus::of_engine`]).

mod core;
pub mod table;
pub mod typed;
mod types;

pub use self::core::args::{self, CacheArg, ExtParam, LayerRange};
pub use self::core::{CannPart, DataDist, MAX_COMMS, MAX_LINKS, RegisterMemStatus};
pub use typed::{
    Cache, Cluster, Decoder, Layout, LinkedCluster, Mix, PeerCache, Prompt, Rejected, RoleState,
};
pub use types::{
    CacheDesc, CacheKey, CacheKind, ClusterInfo, DataType, Error, IpInfo, Layers, LlmStatus,
    Placement, RemoteCache, Result, Role,
};
