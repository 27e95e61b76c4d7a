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

mod cache;
mod linked;
use cache::Tensors;
pub use cache::{Cache, PeerCache};
pub use linked::LinkedCluster;

use std::fmt;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::core::DataDist;
use super::types::{
    CacheDesc, CacheKey, CacheKind, ClusterInfo, Error, LlmStatus, Placement, Result, Role,
};
use crate::MemDesc;
use crate::types::raw::{RawMemory, RegistrableMemory};

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
        let info = ClusterInfo::at(remote_cluster_id, addr);
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
