//! LLM-DataDist with its lifecycle in the types, as the engine's ([`Hixl<S>`](crate::Hixl)):
//! a layer over the runtime-checked [`DataDist`], so a typed cluster, a C++ program and a Python
//! one link and move caches with one another (one cache table, one wire).
//!
//! ```text
//! Cluster::<Prompt>::scope(id, options, |cluster| ...)      one instance, branded 'id
//!   cluster.register_cache(desc, layout, tensors, keys) -> Cache<'id, M>   (geometry inside)
//!   cluster.link(peer, addr, timeout)     -> LinkedCluster<'_, 'id>        (borrows the cluster)
//!     linked.pull_blocks / push_blocks / pull_cache / push_cache (&Cache<'id, M>)
//!     linked.unlink(timeout)              consumes the link
//!   cache.unregister()                    consumes the cache, hands its memory back
//!   cluster.switch_role::<Decoder>(opts)  consumes Cluster<'id, Prompt> -> Cluster<'id, Decoder>
//!   cluster.finalize()                    (or the end of the scope)
//! ```
//!
//! What the compiler refuses (each has a case in `ui-tests/`):
//! - a pull or push without a link: they are methods of [`LinkedCluster`] only;
//! - a link used after [`LinkedCluster::unlink`], a cache after [`Cache::unregister`]
//!   (both consume);
//! - [`Cluster::switch_role`] or [`Cluster::finalize`] while a link lives (a link borrows the
//!   cluster);
//! - [`Cache::unregister`] while a call has it borrowed (pulls and pushes take `&Cache`);
//! - a cache of one instance given to another's link: each [`Cluster::scope`] brands its
//!   cluster, links and caches with a lifetime `'id` of its own (invariant, as in `GhostCell`),
//!   and a cache of another brand does not type-check; nothing branded leaves its scope.
//!
//! What only the run time knows keeps LLM-DataDist's status: a block index outside the cache
//! it names (`LLM_PARAM_INVALID`, checked against the [`Cache`]'s geometry before anything
//! moves; the peer's side against the table it published), an unknown peer cache
//! (`LLM_KV_CACHE_NOT_EXIST`), a second link to one cluster (`LLM_ALREADY_LINK`), and
//! `switch_role` to a new listen address while a link was `mem::forget`ten (`LLM_EXIST_LINK`).
//!
//! The role is a type ([`Prompt`], [`Decoder`], [`Mix`]: sealed, zero-sized). As upstream's, it
//! does not restrict transfers (links work both ways in any role); `switch_role` is its
//! transition, and while links exist it cannot be called.
//!
//! Memory: [`Cluster::register_cache`] takes ownership of the tensors (any
//! [`RegistrableMemory`]: [`HostBuffer`](crate::HostBuffer), `Vec<u8>`, `Box<[u8]>`, ...),
//! which is safe; [`Cache::unregister`] hands them back once no peer can reach them any more
//! (the engine's deregistration guarantee). Raw addresses (device memory allocated elsewhere)
//! go through the `unsafe` [`Cluster::register_cache_raw`].
//!
//! # Example
//! Two clusters in one process: the decoder pulls blocks 0 and 1 of the prompt's cache into
//! its blocks 2 and 3, and pushes its block 0 to the prompt's block 7.
//! ```
//! use hixl::datadist::typed::{Cluster, Decoder, Layout, PeerCache, Prompt};
//! use hixl::datadist::{CacheDesc, CacheKey, DataType, Placement};
//! use hixl::HostBuffer;
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 2 tensors (K and V) of 8 blocks of 4 KiB
//! let desc = CacheDesc {
//!     placement: Placement::Host,
//!     num_tensors: 2,
//!     data_type: DataType::FLOAT16,
//!     shape: vec![8, 2048],
//! };
//! let key = CacheKey { req_id: u64::MAX, model_id: 1 };
//! let listen = [("llm.ListenIpInfo", "127.0.0.1:0")];
//! Cluster::<Prompt>::scope(1, &listen, |prompt| -> Result<(), Box<dyn std::error::Error>> {
//!     let kv = vec![HostBuffer::from_slice(&[0xAA; 8 * 4096])?, HostBuffer::from_slice(&[0xBB; 8 * 4096])?];
//!     let prompt_cache = prompt.register_cache(&desc, Layout::Blocks, kv, &[key])?;
//!     let addr = prompt.listen_addr().expect("it listens");
//!
//!     Cluster::<Decoder>::scope(2, &[] as &[(&str, &str)], |decoder| {
//!         let kv = vec![HostBuffer::new(8 * 4096)?, HostBuffer::new(8 * 4096)?];
//!         let mut cache = decoder.register_cache(&desc, Layout::Blocks, kv, &[])?;
//!         assert_eq!((cache.block_count(), cache.block_size()), (8, 4096));
//!
//!         let link = decoder.link(1, addr, Duration::from_secs(5))?;
//!         link.pull_blocks(PeerCache::Blocks { model_id: 1 }, &cache, &[0, 1], &[2, 3])?;
//!         link.push_blocks(&cache, &[0], PeerCache::Blocks { model_id: 1 }, &[7])?;
//!         link.unlink(Duration::from_secs(1))?;
//!
//!         let mut block = vec![0u8; 4096];
//!         cache.read_at(1, 3 * 4096, &mut block)?;
//!         assert!(block.iter().all(|&b| b == 0xBB));
//!         let kv = cache.unregister().map_err(|r| r.error)?; // the HostBuffers, back
//!         assert!(kv[0][2 * 4096..4 * 4096].iter().all(|&b| b == 0xAA));
//!         Ok::<(), Box<dyn std::error::Error>>(())
//!     })??;
//!
//!     let kv = prompt_cache.unregister().map_err(|r| r.error)?;
//!     assert!(kv[0][7 * 4096..].iter().all(|&b| b == 0)); // the decoder's zeroed block 0
//!     Ok(())
//! })??;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::core::DataDist;
use super::types::{
    CacheDesc, CacheKey, CacheKind, ClusterInfo, Error, IpInfo, Layers, LlmStatus, Placement,
    RemoteCache, Result, Role,
};
use crate::types::raw::{RawMemory, RegistrableMemory};
use crate::{MemDesc, Reclaim};

mod sealed {
    pub trait Sealed {}
}

/// A cluster's role as a type. Sealed: [`Prompt`], [`Decoder`] and [`Mix`] are all there are.
pub trait RoleState: sealed::Sealed + fmt::Debug + Send + Sync + 'static {
    /// The role's value.
    const ROLE: Role;
}

/// The prompt (prefill) role, `kPrompt`.
#[derive(Debug)]
pub struct Prompt;
/// The decoder role, `kDecoder`.
#[derive(Debug)]
pub struct Decoder;
/// Both, `kMix`.
#[derive(Debug)]
pub struct Mix;

macro_rules! roles {
    ($($s:ident),*) => {$(
        impl sealed::Sealed for $s {}
        impl RoleState for $s { const ROLE: Role = Role::$s; }
    )*};
}
roles!(Prompt, Decoder, Mix);

/// The brand of one instance: an invariant lifetime, so the caches and links of two instances
/// are of different types.
type Brand<'id> = PhantomData<fn(&'id ()) -> &'id ()>;

/// What a cluster, its caches and its links share.
struct Inner {
    dd: DataDist,
    /// Set once `finalize` returned: nothing of the engine touches registered memory.
    finalized: AtomicBool,
}

impl Inner {
    fn finalize(&self) {
        self.dd.finalize();
        self.finalized.store(true, Ordering::Release);
    }
}

/// A failed call that consumed something: the error, and what it consumed, unchanged.
pub struct Rejected<T> {
    /// Why the call failed.
    pub error: Error,
    /// What it consumed, handed back.
    pub value: T,
}

impl<T> Rejected<T> {
    /// The status of the failure.
    pub fn status(&self) -> LlmStatus {
        self.error.status
    }
}

impl<T> fmt::Debug for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejected")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Display for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<T> std::error::Error for Rejected<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<T> From<Rejected<T>> for Error {
    fn from(r: Rejected<T>) -> Self {
        r.error
    }
}

/// One LLM-DataDist instance (a cluster) in role `R`, branded `'id`: made by
/// [`Cluster::scope`], which finalizes it when its closure returns.
#[must_use = "dropping a cluster leaves it running until its scope ends; finalize() ends it now"]
pub struct Cluster<'id, R: RoleState> {
    inner: Arc<Inner>,
    _brand: Brand<'id>,
    _role: PhantomData<R>,
}

impl<R: RoleState> fmt::Debug for Cluster<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("cluster_id", &self.inner.dd.cluster_id())
            .field("role", &R::ROLE)
            .finish_non_exhaustive()
    }
}

/// How a cache's memory is addressed by peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `shape[0]` blocks per tensor (paged attention: `register_blocks_cache`), pulled and
    /// pushed by block index.
    Blocks,
    /// `shape[batch_dim]` batches per tensor (`register_cache`), pulled and pushed by batch.
    Batches {
        /// The dimension of the batches.
        batch_dim: usize,
    },
    /// `shape[0]` batches that are also blocks (the C++ `RegisterKvCache`).
    Mix,
}

impl Layout {
    fn kind(self) -> (CacheKind, usize) {
        match self {
            Layout::Blocks => (CacheKind::Blocks, 0),
            Layout::Batches { batch_dim } => (CacheKind::Cache, batch_dim),
            Layout::Mix => (CacheKind::Mix, 0),
        }
    }
}

/// A cache's geometry: what its block (or batch) indices are checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Geometry {
    kind: CacheKind,
    placement: Placement,
    num_tensors: usize,
    tensor_size: u64,
    /// Bytes of one block (or batch).
    stride: u64,
    /// Blocks (or batches) per tensor.
    count: u64,
}

impl Geometry {
    /// As [`DataDist::register_cache`] computes it.
    fn of(desc: &CacheDesc, layout: Layout) -> Result<Geometry> {
        let tensor_size = desc.tensor_size()?;
        let (kind, dim) = layout.kind();
        let count = *desc
            .shape
            .get(dim)
            .ok_or_else(|| Error::param(format!("batch dimension {dim} is not in the shape")))?
            as u64;
        Ok(Geometry {
            kind,
            placement: desc.placement,
            num_tensors: desc.num_tensors as usize,
            tensor_size,
            stride: tensor_size / count,
            count,
        })
    }
}

impl<R: RoleState> Cluster<'_, R> {
    /// Initializes an instance for `cluster_id` in role `R` with LLM-DataDist's `options` (as
    /// [`DataDist::initialize`]: `llm.ListenIpInfo` `"ip:port"`, port 0 for one the OS
    /// picks, ...), runs `f` with it, then finalizes it. Everything `f` gets is branded with a
    /// lifetime of this call alone, so nothing of it outlives the instance, and caches and
    /// links of two instances cannot be mixed up.
    ///
    /// # Errors
    /// [`DataDist::initialize`]'s: `LLM_PARAM_INVALID` for a malformed option, the engine's
    /// errors (a port in use: `LLM_FAILED`). `f` does not run then.
    pub fn scope<T, K: AsRef<str>, V: AsRef<str>>(
        cluster_id: u64,
        options: &[(K, V)],
        f: impl for<'id> FnOnce(Cluster<'id, R>) -> T,
    ) -> Result<T> {
        let dd = DataDist::new(cluster_id, R::ROLE);
        dd.initialize(&owned(options))?;
        let inner = Arc::new(Inner {
            dd,
            finalized: AtomicBool::new(false),
        });
        let out = f(Cluster {
            inner: inner.clone(),
            _brand: PhantomData,
            _role: PhantomData,
        });
        // every cache and link of the brand is gone (dropped, or leaked: their registrations
        // end here)
        inner.finalize();
        Ok(out)
    }
}

fn owned<K: AsRef<str>, V: AsRef<str>>(options: &[(K, V)]) -> Vec<(String, String)> {
    (options.iter())
        .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
        .collect()
}

impl<'id, R: RoleState> Cluster<'id, R> {
    /// The role, as a value.
    pub const ROLE: Role = R::ROLE;

    /// The cluster id.
    pub fn cluster_id(&self) -> u64 {
        self.inner.dd.cluster_id()
    }

    /// The role (`R::ROLE`).
    pub fn role(&self) -> Role {
        R::ROLE
    }

    /// The address peers link to (with the port the OS picked for port 0); `None` if the
    /// instance does not listen.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.inner.dd.listen_addr()
    }

    /// The runtime-checked instance underneath: its links and caches are this cluster's. The
    /// escape hatch (a leaked link can be unlinked through it, for example): what it does to
    /// the typed links and caches is checked at run time only (a cache unregistered through it
    /// is `LLM_KV_CACHE_NOT_EXIST` to the typed calls; its memory is still freed only when the
    /// [`Cache`] goes).
    pub fn as_runtime(&self) -> &DataDist {
        &self.inner.dd
    }

    /// Registers a cache of `desc` laid out as `layout` over `tensors` (one per
    /// `desc.num_tensors`, each of at least `desc.tensor_size()` bytes of `desc.placement`'s
    /// memory), findable by peers under `keys`. The cache owns the tensors until
    /// [`Cache::unregister`] hands them back.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID`: more or fewer tensors than `num_tensors`, one too small or of
    /// another placement, a bad shape or element type, `batch_dim` outside the shape; the
    /// engine's errors (device memory without Ascend: `LLM_FEATURE_NOT_ENABLED`). The tensors
    /// come back in the error.
    pub fn register_cache<M: RegistrableMemory>(
        &self,
        desc: &CacheDesc,
        layout: Layout,
        tensors: Vec<M>,
        keys: &[CacheKey],
    ) -> std::result::Result<Cache<'id, M>, Rejected<Vec<M>>> {
        let raws: Vec<RawMemory> = tensors.into_iter().map(M::into_raw_parts).collect();
        let back = |error: Error, raws: Vec<RawMemory>| Rejected {
            error,
            // SAFETY: each came from `M::into_raw_parts` above and was not registered (or its
            // registration was undone by the failed `register_cache`), and is used once.
            value: raws
                .into_iter()
                .map(|r| unsafe { M::from_raw_parts(r) })
                .collect(),
        };
        let geometry = match Geometry::of(desc, layout) {
            Ok(g) => g,
            Err(e) => return Err(back(e, raws)),
        };
        if raws.len() != geometry.num_tensors {
            let e = Error::param(format!(
                "{} tensors for a cache of {}",
                raws.len(),
                geometry.num_tensors
            ));
            return Err(back(e, raws));
        }
        if let Some((i, r)) =
            (raws.iter().enumerate()).find(|(_, r)| (r.len() as u64) < geometry.tensor_size)
        {
            let e = Error::param(format!(
                "tensor {i} has {} bytes, the cache's tensors {}",
                r.len(),
                geometry.tensor_size
            ));
            return Err(back(e, raws));
        }
        if let Some((i, r)) =
            (raws.iter().enumerate()).find(|(_, r)| r.mem_type() != desc.placement.mem_type())
        {
            let e = Error::param(format!(
                "tensor {i} is {:?} memory, the cache's placement {:?}",
                r.mem_type(),
                desc.placement
            ));
            return Err(back(e, raws));
        }
        let addrs: Vec<u64> = raws.iter().map(|r| r.ptr().as_ptr() as u64).collect();
        let (kind, batch_dim) = layout.kind();
        // SAFETY: each tensor's memory was handed over by `into_raw_parts` (the
        // `RegistrableMemory` contract: nothing else reads, writes, moves or frees it until
        // `from_raw_parts`), and is at least `tensor_size` bytes of the placement's memory
        // (checked). It is handed back only once the cache is unregistered or the instance
        // finalized (`Cache::unregister`, `Cache`'s drop), or leaked.
        match unsafe {
            self.inner
                .dd
                .register_cache(desc, &addrs, kind, batch_dim, keys)
        } {
            Ok(id) => Ok(Cache {
                inner: self.inner.clone(),
                id,
                geometry,
                tensors: Tensors(
                    raws.into_iter()
                        .map(|r| {
                            let desc = MemDesc {
                                addr: r.ptr().as_ptr() as usize,
                                len: r.len(),
                            };
                            (Some(r), desc)
                        })
                        .collect(),
                ),
                _brand: PhantomData,
                _mem: PhantomData,
            }),
            Err(e) => Err(back(e, raws)),
        }
    }

    /// Registers a cache over caller-managed memory at `addrs` (device memory allocated
    /// elsewhere, for example), as [`DataDist::register_cache`]. Unregistering hands back the
    /// tensors' [`MemDesc`]s.
    ///
    /// # Safety
    /// Each `addrs[i]..addrs[i] + desc.tensor_size()` must be memory of `desc.placement` that
    /// stays allocated and valid for reads and writes of any bytes until the cache is
    /// unregistered ([`Cache::unregister`] returned `Ok`) or the instance finalized, and
    /// nothing else may access it in a way that conflicts with transfers: linked peers READ
    /// and WRITE it, and this instance's pulls write it.
    ///
    /// # Errors
    /// As [`Cluster::register_cache`].
    pub unsafe fn register_cache_raw(
        &self,
        desc: &CacheDesc,
        layout: Layout,
        addrs: &[u64],
        keys: &[CacheKey],
    ) -> Result<Cache<'id, MemDesc>> {
        let geometry = Geometry::of(desc, layout)?;
        let (kind, batch_dim) = layout.kind();
        // SAFETY: the caller's contract (this function's `# Safety`) is `register_cache`'s.
        let id = unsafe {
            self.inner
                .dd
                .register_cache(desc, addrs, kind, batch_dim, keys)
        }?;
        Ok(Cache {
            inner: self.inner.clone(),
            id,
            geometry,
            tensors: Tensors(
                (addrs.iter())
                    .map(|&a| {
                        let desc = MemDesc {
                            addr: a as usize,
                            len: geometry.tensor_size as usize,
                        };
                        (None, desc)
                    })
                    .collect(),
            ),
            _brand: PhantomData,
            _mem: PhantomData,
        })
    }

    /// Links to cluster `remote_cluster_id` listening at `addr` (`LinkLlmClusters` of one
    /// cluster), by `timeout`. The link borrows the cluster: while it lives the cluster cannot
    /// switch roles or be finalized.
    ///
    /// # Errors
    /// `LLM_ALREADY_LINK` (a link to that cluster exists), `LLM_PARAM_INVALID` (this cluster
    /// itself, a zero or too long timeout), `LLM_CLUSTER_NUM_EXCEED_LIMIT`, `LLM_LINK_FAILED`
    /// (nobody answers there), `LLM_TIMEOUT`.
    pub fn link(
        &self,
        remote_cluster_id: u64,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<LinkedCluster<'_, 'id>> {
        let ms = millis(timeout)?;
        let info = ClusterInfo {
            remote_cluster_id,
            remote_role_type: 0,
            local_ip_infos: Vec::new(),
            remote_ip_infos: vec![IpInfo {
                ip: addr.ip(),
                port: addr.port(),
            }],
        };
        let (status, _) = self.inner.dd.link_clusters(&[info], ms)?;
        if status != LlmStatus::LLM_SUCCESS {
            return Err(Error::new(
                status,
                format!("linking to cluster {remote_cluster_id} at {addr} failed"),
            ));
        }
        Ok(LinkedCluster {
            inner: &self.inner,
            remote: remote_cluster_id,
            _brand: PhantomData,
        })
    }

    /// Switches to role `T` (`SetRole`); with `llm.ListenIpInfo` in `options` the instance
    /// listens there from now on (its caches stay registered, same ids). No link of this
    /// cluster can be alive (they borrow it).
    ///
    /// # Errors
    /// `LLM_EXIST_LINK` when a link was leaked (`mem::forget`) and the listen address changes;
    /// `LLM_PARAM_INVALID` for a malformed address; the engine's errors. The cluster comes
    /// back, in its role.
    pub fn switch_role<T: RoleState, K: AsRef<str>, V: AsRef<str>>(
        self,
        options: &[(K, V)],
    ) -> std::result::Result<Cluster<'id, T>, Rejected<Cluster<'id, R>>> {
        match self.inner.dd.set_role(T::ROLE, &owned(options)) {
            Ok(()) => Ok(Cluster {
                inner: self.inner,
                _brand: PhantomData,
                _role: PhantomData,
            }),
            Err(error) => Err(Rejected { error, value: self }),
        }
    }

    /// Finalizes the instance now (`Finalize`): its links go, its caches' memory is
    /// deregistered (caches still held answer `LLM_FAILED`, and hand their memory back when
    /// unregistered or dropped), the engine stops. No link can be alive (they borrow it).
    pub fn finalize(self) {
        self.inner.finalize();
    }
}

/// A timeout in LLM-DataDist's milliseconds (1 ms to `i32::MAX`).
fn millis(t: Duration) -> Result<i32> {
    match i32::try_from(t.as_millis()) {
        Ok(ms) if ms > 0 => Ok(ms),
        _ => Err(Error::param(format!(
            "timeout {t:?}: 1 ms to {} ms",
            i32::MAX
        ))),
    }
}

/// The tensors' parts: what `into_raw_parts` gave (owned memory) and each range.
struct Tensors(Vec<(Option<RawMemory>, MemDesc)>);

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
    inner: Arc<Inner>,
    id: i64,
    geometry: Geometry,
    tensors: Tensors,
    _brand: Brand<'id>,
    _mem: PhantomData<fn() -> M>,
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
    fn check_blocks(&self, blocks: &[u64], what: &str) -> Result<()> {
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
    /// [`Cluster::finalize`] it succeeds (the memory is already out of reach).
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
    fn at(self, cluster_id: u64) -> RemoteCache {
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

/// A link to a peer cluster, borrowed from the cluster: pulls and pushes exist only here.
/// [`LinkedCluster::unlink`] consumes it; dropping it unlinks too (forcibly).
#[must_use = "dropping a link unlinks it"]
pub struct LinkedCluster<'c, 'id> {
    inner: &'c Inner,
    remote: u64,
    _brand: Brand<'id>,
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

static_assertions::assert_eq_size!(Prompt, ());
static_assertions::assert_eq_size!(Decoder, ());
static_assertions::assert_eq_size!(Mix, ());
static_assertions::assert_eq_size!(Cluster<'static, Prompt>, Arc<()>);
static_assertions::assert_eq_size!(Cluster<'static, Decoder>, Cluster<'static, Mix>);
static_assertions::assert_eq_size!(LinkedCluster<'static, 'static>, (&'static (), u64));
static_assertions::assert_impl_all!(Cluster<'static, Prompt>: Send, Sync);
static_assertions::assert_impl_all!(LinkedCluster<'static, 'static>: Send, Sync);
static_assertions::assert_impl_all!(Cache<'static, crate::HostBuffer>: Send, Sync);
static_assertions::assert_impl_all!(Cache<'static, MemDesc>: Send, Sync);
static_assertions::assert_impl_all!(Rejected<Cache<'static>>: std::error::Error, Send, Sync);
