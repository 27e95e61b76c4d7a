//! The LLM-DataDist instance, checked at run time ([`DataDist`]): one cluster, its caches and
//! its links to other clusters, over one [`compat::Hixl`](crate::compat::Hixl) engine. The C
//! ABI (and through it the C++ class), the Python package and the typed layer sit on it.
//!
//! - The engine listens on `llm.ListenIpInfo` (a client only without it) and links are its
//!   links, one per peer cluster, made by [`DataDist::link_clusters`] to each peer's listen
//!   address.
//! - Each instance publishes its caches in a cache table (`table.rs`) kept in a read-only
//!   region of its engine, rewritten on every registration; a peer READs it once per link, at
//!   its first pull or push there, and finds it in the link's region table (the read-only host
//!   region of that size whose bytes say they are a cache table). Caches registered after that
//!   are not known to that link (`LLM_KV_CACHE_NOT_EXIST`), as upstream's table is not
//!   refreshed either.
//! - A pull is one batch READ of the engine, a push one batch WRITE per layer, with the
//!   addresses upstream computes (below), by `llm.SyncKvCacheWaitTime` (1000 ms by default).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use super::table::{self, Entry, HEADER_LEN, Key, TABLE_LEN, Table};
use super::types::{
    CacheDesc, CacheKey, CacheKind, ClusterInfo, Error, Layers, LlmStatus, RemoteCache, Result,
    Role,
};
use crate::compat::{self, HostMem, TransferOpDesc};
use crate::sync::lock;
use crate::{Access, MemType, TransferOp};

// links by an explicit rank table (`link_comm`): a child module, for the instance's fields
#[path = "rank.rs"]
mod rank;
pub use rank::{MAX_COMMS, RegisterMemStatus};

/// Most links one instance holds (upstream's `kMaxLinkNum`).
pub const MAX_LINKS: usize = 512;

/// A local cache: its geometry, its tensors and their registrations.
#[derive(Debug, Clone)]
struct LocalCache {
    entry: Entry,
    /// The engine handles of its tensors (one per distinct tensor).
    handles: Vec<compat::MemHandle>,
    keys: Vec<CacheKey>,
}

/// A link to a peer cluster.
#[derive(Debug)]
struct PeerLink {
    /// The peer engine's name, `ip:port`.
    remote: String,
    /// The peer's cache table, fetched at the first pull or push.
    table: Option<Arc<Table>>,
}

/// What `initialize` read of its options.
#[derive(Debug, Clone, Default)]
struct Config {
    listen: Option<String>,
    sync_timeout_ms: i32,
    device_id: Option<i32>,
    engine_options: Vec<(String, String)>,
    /// `llm.LinkTotalTime` (s; `None` for 0 or absent): rank-table links' wait for peers.
    link_total_time_s: Option<u32>,
    /// `llm.LinkRetryCount` (1..=100; 0 stands for the default, 1).
    link_retry_count: u32,
}

#[derive(Default)]
struct Caches {
    by_id: BTreeMap<i64, LocalCache>,
    /// The table's version (even: complete).
    version: u64,
}

/// An LLM-DataDist instance (the runtime-checked form): `Send + Sync`.
pub struct DataDist {
    cluster_id: u64,
    role: Mutex<Role>,
    state: Mutex<Option<Live>>,
    caches: Mutex<Caches>,
    links: Mutex<HashMap<u64, PeerLink>>,
    /// Serializes table fetches (they share the download buffer).
    fetch: Mutex<()>,
    next_id: AtomicI64,
    /// The communicators of links by an explicit rank table (`rank.rs`).
    comms: rank::Comms,
}

/// An initialized instance's engine and buffers.
struct Live {
    engine: Arc<compat::Hixl>,
    config: Config,
    /// The published cache table (read-only for peers).
    table: HostMem,
    /// Where peers' tables are READ into (not in peers' view).
    download: HostMem,
}

fn not_initialized() -> Error {
    Error::new(
        LlmStatus::LLM_FAILED,
        "the LLM-DataDist instance is not initialized (or was finalized)",
    )
}

impl std::fmt::Debug for DataDist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataDist")
            .field("cluster_id", &self.cluster_id)
            .field("role", &*lock(&self.role))
            .finish_non_exhaustive()
    }
}

impl DataDist {
    /// An instance for `cluster_id` in `role` (nothing else happens until
    /// [`initialize`](DataDist::initialize)).
    pub fn new(cluster_id: u64, role: Role) -> Self {
        DataDist {
            cluster_id,
            role: Mutex::new(role),
            state: Mutex::new(None),
            caches: Mutex::new(Caches::default()),
            links: Mutex::new(HashMap::new()),
            fetch: Mutex::new(()),
            next_id: AtomicI64::new(1),
            comms: rank::Comms::default(),
        }
    }

    /// The cluster id.
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// The current role.
    pub fn role(&self) -> Role {
        *lock(&self.role)
    }

    /// Initializes the instance (`Initialize(options)`); a second call succeeds and changes
    /// nothing. Options, by their CANN keys:
    /// - `llm.ListenIpInfo` `"ip:port"` (or `llm.ListenIp` + `llm.ListenPort`, the Python
    ///   package's form): the engine listens there and peers link to it; without it the
    ///   instance only links out;
    /// - `llm.DeviceId`: the device made current on this thread where ACL loads (caches
    ///   placed on the device need it), as upstream's `aclrtSetDevice`;
    /// - `llm.SyncKvCacheWaitTime`: a pull's or push's timeout in ms (a positive integer,
    ///   1000 by default);
    /// - `llm.LinkTotalTime` (s, 0 to 2^32-1; 0 or absent: 30) and `llm.LinkRetryCount` (1 to
    ///   100): how long a link by an explicit rank table ([`DataDist::link_comm`]) waits for
    ///   its peers, in how many `HcclCommPrepare` attempts;
    /// - `llm.TransferBackend`: `hixl` (the engine), or absent (the same engine here);
    /// - `llm.RdmaTrafficClass`, `llm.RdmaServiceLevel`, `llm.LocalCommRes`,
    ///   `llm.GlobalResourceConfig`: passed to the engine under HIXL's keys;
    /// - every other key (GE's `ge.*`, `llm.EnableSwitchRole`, `llm.BufPoolCfg`, ...) is
    ///   accepted and not used.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` for a malformed listen address, device id or wait time; the
    /// engine's errors (a port in use: `LLM_FAILED`).
    pub fn initialize(&self, options: &[(String, String)]) -> Result<()> {
        let mut state = lock(&self.state);
        if state.is_some() {
            return Ok(());
        }
        let config = parse_options(options)?;
        if let Some(dev) = config.device_id {
            set_device(dev)?;
        }
        let live = Self::start(&config)?;
        *state = Some(live);
        drop(state);
        self.publish()?;
        tracing::debug!(cluster = self.cluster_id, listen = ?config.listen, "LLM-DataDist initialized");
        Ok(())
    }

    /// The engine and buffers of `config`.
    fn start(config: &Config) -> Result<Live> {
        let engine = compat::Hixl::new();
        let name = config.listen.clone().unwrap_or_else(|| "127.0.0.1".into());
        let mut opts = config.engine_options.clone();
        opts.push(("AutoConnect".into(), "0".into()));
        if let Some(dev) = config.device_id {
            // the engine takes its device on a thread of its own: name it (else it takes the
            // device current there, none, and falls back to device 0); Ascend stays where CANN
            // loads (a `hixl.ascend.*` key alone would require it)
            opts.push(("hixl.ascend.device_id".into(), dev.to_string()));
            opts.push(("hixl.ascend.enable".into(), "auto".into()));
        }
        engine.initialize(&name, opts)?;
        let table = engine.alloc_host_mem_with(TABLE_LEN, Access::Read)?;
        let download = engine.alloc_host_mem_with(TABLE_LEN, Access::None)?;
        Ok(Live {
            engine: Arc::new(engine),
            config: config.clone(),
            table,
            download,
        })
    }

    /// The engine, its configuration and the download buffer's address, or `FAILED`.
    fn live(&self) -> Result<(Arc<compat::Hixl>, Config)> {
        let s = lock(&self.state);
        let l = s.as_ref().ok_or_else(not_initialized)?;
        Ok((l.engine.clone(), l.config.clone()))
    }

    /// Finalizes (`Finalize`): every link goes, the caches' memory is deregistered, the engine
    /// finalized. Calling it again, or before `initialize`, does nothing.
    pub fn finalize(&self) {
        self.unlink_all_comms();
        let live = lock(&self.state).take();
        lock(&self.links).clear();
        lock(&self.caches).by_id.clear();
        if let Some(l) = live {
            l.engine.finalize();
        }
    }

    /// Changes the role (`SetRole`). With `llm.ListenIpInfo` in `options` the instance
    /// listens there from now on: while links exist that is `LLM_EXIST_LINK`; otherwise the
    /// engine is made anew on that address and every cache registered again in it (same ids,
    /// same table). Without it the listen address stays as it was.
    ///
    /// # Errors
    /// `LLM_FAILED` before `initialize`; `LLM_EXIST_LINK`; `LLM_PARAM_INVALID` for a malformed
    /// address; the engine's errors.
    pub fn set_role(&self, role: Role, options: &[(String, String)]) -> Result<()> {
        let (_, config) = self.live()?;
        let listen = parse_options(options)?.listen;
        if let Some(addr) = listen
            && config.listen.as_deref() != Some(addr.as_str())
        {
            let linked = !lock(&self.links).is_empty();
            if linked || self.comms.any() {
                return Err(Error::new(
                    LlmStatus::LLM_EXIST_LINK,
                    "cannot listen elsewhere while links exist: unlink them first",
                ));
            }
            self.relisten(config, addr)?;
        }
        *lock(&self.role) = role;
        Ok(())
    }

    /// A new engine listening on `addr`, with every cache registered again.
    fn relisten(&self, mut config: Config, addr: String) -> Result<()> {
        config.listen = Some(addr);
        let live = Self::start(&config)?;
        let mut caches = lock(&self.caches);
        // the new engine's handles replace the old ones only once every cache is registered
        // there: on failure the old engine (and its handles) stays, the new one goes
        let mut handles = Vec::with_capacity(caches.by_id.len());
        for c in caches.by_id.values() {
            match register_tensors(&live.engine, &c.entry) {
                Ok(h) => handles.push(h),
                Err(e) => {
                    drop(caches);
                    live.engine.finalize();
                    return Err(e);
                }
            }
        }
        for (c, h) in caches.by_id.values_mut().zip(handles) {
            c.handles = h;
        }
        drop(caches);
        let old = lock(&self.state).replace(live);
        if let Some(old) = old {
            old.engine.finalize();
        }
        self.publish()
    }

    /// Registers a cache of `desc` over the tensors at `addrs` (`RegisterKvCache`, the Python
    /// package's `register_cache` / `register_blocks_cache`): each tensor is registered with
    /// the engine (device or host memory, as `desc.placement` says), and the cache is in the
    /// table peers fetch. Returns its id (from 1).
    ///
    /// Geometry: `tensor_size = product(shape) * element size`; a blocks (or mix) cache has
    /// `shape[0]` blocks of `tensor_size / shape[0]` bytes, a cache of batches `shape[batch_dim]`
    /// batches of `tensor_size / shape[batch_dim]` (batch_dim 0 for the others).
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
    /// shape or element type, `batch_dim` outside the shape; the engine's errors (device memory
    /// without Ascend: `LLM_FEATURE_NOT_ENABLED`).
    pub unsafe fn register_cache(
        &self,
        desc: &CacheDesc,
        addrs: &[u64],
        kind: CacheKind,
        batch_dim: usize,
        keys: &[CacheKey],
    ) -> Result<i64> {
        let (engine, _) = self.live()?;
        if addrs.is_empty() || addrs.len() != desc.num_tensors as usize {
            return Err(Error::param(format!(
                "{} addresses for a cache of {} tensors",
                addrs.len(),
                desc.num_tensors
            )));
        }
        if addrs.len() > table::MAX_TENSORS as usize {
            return Err(Error::param("more tensors than a cache holds (65,536)"));
        }
        if addrs.contains(&0) {
            return Err(Error::param("a tensor address is 0"));
        }
        let tensor_size = desc.tensor_size()?;
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
        let entry = Entry {
            cache_id: self.next_id.fetch_add(1, Ordering::Relaxed),
            kind,
            placement: desc.placement,
            tensor_size,
            stride: tensor_size / count,
            count,
            addrs: addrs.to_vec(),
        };
        // a cache the table cannot hold is refused before anything is registered
        self.check_fits(&entry, keys)?;
        let handles = register_tensors(&engine, &entry)?;
        let id = entry.cache_id;
        lock(&self.caches).by_id.insert(
            id,
            LocalCache {
                entry,
                handles,
                keys: keys.to_vec(),
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
    fn check_fits(&self, new: &Entry, keys: &[CacheKey]) -> Result<()> {
        let caches = lock(&self.caches);
        let key = |cache_id: i64, k: &CacheKey| Key {
            cache_id,
            req_id: k.req_id,
            model_id: k.model_id,
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
        if t.encode_payload().len() > TABLE_LEN - HEADER_LEN {
            return Err(Error::new(
                LlmStatus::LLM_OUT_OF_MEMORY,
                "the caches do not fit the cache table (1 MiB)",
            ));
        }
        Ok(())
    }

    /// Takes cache `id` out again and deregisters its tensors; a tensor the engine keeps
    /// (it refused to let go) stays registered under `id`, for `unregister_cache` to retry.
    fn undo(&self, engine: &compat::Hixl, id: i64) {
        let mut caches = lock(&self.caches);
        let Some(mut c) = caches.by_id.remove(&id) else {
            return;
        };
        c.handles.retain(|h| engine.deregister_mem(*h).is_err());
        if !c.handles.is_empty() {
            tracing::warn!(
                cache = id,
                "a refused cache's tensors could not all be deregistered"
            );
            caches.by_id.insert(id, c);
        }
    }

    /// Unregisters cache `cache_id` (`UnregisterKvCache`): it leaves the table and its tensors
    /// are deregistered; when this returns, no peer reads or writes them (the engine's
    /// deregistration rule: refused while one of this instance's transfers uses them). An
    /// unknown id succeeds, as upstream's.
    ///
    /// # Errors
    /// `LLM_FAILED` before `initialize`; the engine's errors (the cache stays registered).
    pub fn unregister_cache(&self, cache_id: i64) -> Result<()> {
        let (engine, _) = self.live()?;
        let mut caches = lock(&self.caches);
        let Some(c) = caches.by_id.get(&cache_id).cloned() else {
            return Ok(());
        };
        for h in &c.handles {
            engine.deregister_mem(*h)?;
        }
        caches.by_id.remove(&cache_id);
        drop(caches);
        self.publish()
    }

    /// The local cache `cache_id`'s entry.
    fn local(&self, cache_id: i64) -> Result<Entry> {
        lock(&self.caches)
            .by_id
            .get(&cache_id)
            .map(|c| c.entry.clone())
            .ok_or_else(|| {
                Error::new(
                    LlmStatus::LLM_KV_CACHE_NOT_EXIST,
                    format!("no local cache {cache_id}"),
                )
            })
    }

    /// Rewrites the published table (odd version while it is written, then even).
    fn publish(&self) -> Result<()> {
        let s = lock(&self.state);
        let Some(live) = s.as_ref() else {
            return Ok(());
        };
        let mut caches = lock(&self.caches);
        let t = Table {
            entries: caches.by_id.values().map(|c| c.entry.clone()).collect(),
            keys: (caches.by_id.values())
                .flat_map(|c| {
                    c.keys.iter().map(|k| Key {
                        cache_id: c.entry.cache_id,
                        req_id: k.req_id,
                        model_id: k.model_id,
                    })
                })
                .collect(),
        };
        let payload = t.encode_payload();
        if payload.len() > TABLE_LEN - HEADER_LEN {
            return Err(Error::new(
                LlmStatus::LLM_OUT_OF_MEMORY,
                "the caches do not fit the cache table (1 MiB)",
            ));
        }
        let base = live.table.as_ptr();
        let word = |i: usize, v: u64| {
            // SAFETY: the table's region is TABLE_LEN bytes, alive while `live` is (the state
            // lock is held); peers READ it meanwhile (raw bytes, never a reference), which the
            // odd version and the checksum make them retry.
            unsafe { std::ptr::write_volatile(base.add(i * 8).cast::<[u8; 8]>(), v.to_le_bytes()) }
        };
        caches.version += 1;
        word(1, caches.version); // odd: being written
        std::sync::atomic::fence(Ordering::SeqCst);
        // SAFETY: as above; the payload fits the region (checked).
        unsafe {
            std::ptr::copy_nonoverlapping(payload.as_ptr(), base.add(HEADER_LEN), payload.len())
        };
        word(0, table::MAGIC);
        word(2, payload.len() as u64);
        word(3, table::fnv1a(&payload));
        std::sync::atomic::fence(Ordering::SeqCst);
        caches.version += 1;
        word(1, caches.version);
        Ok(())
    }

    /// Links to each cluster (`LinkLlmClusters`): the engine connects to its one
    /// `remote_ip_infos` address by `timeout_ms`. Returns the last failure (or success) and
    /// each cluster's status.
    ///
    /// # Errors
    /// `LLM_FAILED` before `initialize`; `LLM_PARAM_INVALID` for `timeout_ms <= 0`.
    pub fn link_clusters(
        &self,
        clusters: &[ClusterInfo],
        timeout_ms: i32,
    ) -> Result<(LlmStatus, Vec<LlmStatus>)> {
        let (engine, _) = self.live()?;
        if timeout_ms <= 0 {
            return Err(Error::param("the timeout must be positive"));
        }
        let mut rets = Vec::with_capacity(clusters.len());
        for c in clusters {
            rets.push(match self.link_one(&engine, c, timeout_ms) {
                Ok(()) => LlmStatus::LLM_SUCCESS,
                Err(e) => {
                    tracing::debug!(cluster = c.remote_cluster_id, error = %e, "link failed");
                    e.status
                }
            });
        }
        Ok((last_failure(&rets), rets))
    }

    fn link_one(&self, engine: &compat::Hixl, c: &ClusterInfo, timeout_ms: i32) -> Result<()> {
        let [ip] = c.remote_ip_infos.as_slice() else {
            return Err(Error::param(format!(
                "cluster {}: link to exactly one remote address, not {}",
                c.remote_cluster_id,
                c.remote_ip_infos.len()
            )));
        };
        if c.remote_cluster_id == self.cluster_id {
            return Err(Error::param("a cluster does not link to itself"));
        }
        let remote = std::net::SocketAddr::new(ip.ip, ip.port).to_string();
        {
            let links = lock(&self.links);
            if links.contains_key(&c.remote_cluster_id) {
                return Err(Error::new(
                    LlmStatus::LLM_ALREADY_LINK,
                    format!("cluster {} is linked already", c.remote_cluster_id),
                ));
            }
            if links.len() >= MAX_LINKS {
                return Err(Error::new(
                    LlmStatus::LLM_CLUSTER_NUM_EXCEED_LIMIT,
                    format!("at most {MAX_LINKS} linked clusters"),
                ));
            }
        }
        engine.connect(&remote, timeout_ms).map_err(|e| {
            let mut e = Error::from(e);
            if e.status == LlmStatus::LLM_FAILED {
                e.status = LlmStatus::LLM_LINK_FAILED;
            }
            e
        })?;
        lock(&self.links).insert(
            c.remote_cluster_id,
            PeerLink {
                remote,
                table: None,
            },
        );
        Ok(())
    }

    /// Unlinks each cluster (`UnlinkLlmClusters`); `force` needs no address. An unknown
    /// cluster is `LLM_NOT_YET_LINK` in its status.
    ///
    /// # Errors
    /// As [`DataDist::link_clusters`].
    pub fn unlink_clusters(
        &self,
        clusters: &[ClusterInfo],
        timeout_ms: i32,
        force: bool,
    ) -> Result<(LlmStatus, Vec<LlmStatus>)> {
        let (engine, _) = self.live()?;
        if timeout_ms <= 0 {
            return Err(Error::param("the timeout must be positive"));
        }
        let mut rets = Vec::with_capacity(clusters.len());
        for c in clusters {
            let link = lock(&self.links).remove(&c.remote_cluster_id);
            rets.push(match link {
                None => LlmStatus::LLM_NOT_YET_LINK,
                Some(l) => match engine.disconnect(&l.remote, timeout_ms) {
                    Ok(()) => LlmStatus::LLM_SUCCESS,
                    // the peer went away first: unlinked all the same
                    Err(e) if force || e.status() == crate::Status::NOT_CONNECTED => {
                        LlmStatus::LLM_SUCCESS
                    }
                    Err(_) => LlmStatus::LLM_UNLINK_FAILED,
                },
            });
        }
        Ok((last_failure(&rets), rets))
    }

    /// The address peers link to: the engine's listen address, with the port it got when
    /// `llm.ListenIpInfo` asks for port 0. `None` before `initialize`, after `finalize`, or for
    /// an instance that does not listen.
    pub fn listen_addr(&self) -> Option<std::net::SocketAddr> {
        let (engine, config) = self.live().ok()?;
        config.listen.as_ref()?;
        engine.local_engine().ok()?.parse().ok()
    }

    /// Whether cluster `id` is linked.
    pub fn is_linked(&self, id: u64) -> bool {
        lock(&self.links).contains_key(&id)
    }

    /// The peer's engine name and table (fetched now if it was not yet).
    fn peer(&self, engine: &compat::Hixl, cluster: u64) -> Result<(String, Arc<Table>)> {
        if !self.is_linked(cluster) {
            // a rank-table link may have linked it since the last status query
            self.settle_comms();
        }
        let remote = {
            let links = lock(&self.links);
            let l = links.get(&cluster).ok_or_else(|| {
                Error::new(
                    LlmStatus::LLM_NOT_YET_LINK,
                    format!("cluster {cluster} is not linked"),
                )
            })?;
            if let Some(t) = &l.table {
                return Ok((l.remote.clone(), t.clone()));
            }
            l.remote.clone()
        };
        let t = Arc::new(self.fetch_table(engine, &remote)?);
        if let Some(l) = lock(&self.links).get_mut(&cluster) {
            l.table = Some(t.clone());
        }
        Ok((remote, t))
    }

    /// READs `remote`'s cache table: its header, then the whole table; retried while it is
    /// being rewritten.
    fn fetch_table(&self, engine: &compat::Hixl, remote: &str) -> Result<Table> {
        let regions = engine.remote_regions(remote)?;
        let candidates: Vec<_> = regions
            .iter()
            .filter(|r| {
                r.access == Access::Read && r.mem_type == MemType::Host && r.len == TABLE_LEN as u64
            })
            .collect();
        let (timeout, download) = {
            let s = lock(&self.state);
            let l = s.as_ref().ok_or_else(not_initialized)?;
            (
                l.config.sync_timeout_ms,
                (l.download.addr(), l.download.as_ptr()),
            )
        };
        let _one = lock(&self.fetch);
        let read = |addr: u64, len: usize| -> Result<Vec<u8>> {
            let d = TransferOpDesc {
                local_addr: download.0,
                remote_addr: addr as usize,
                len,
            };
            engine.transfer_sync(remote, TransferOp::Read, &[d], timeout)?;
            let mut v = vec![0u8; len];
            // SAFETY: the download buffer holds TABLE_LEN >= len bytes and is alive while the
            // instance is (this call holds the engine); only this instance's READs write it,
            // one at a time (`fetch`), and that READ returned.
            unsafe { std::ptr::copy_nonoverlapping(download.1, v.as_mut_ptr(), len) };
            Ok(v)
        };
        let mut why = String::from("the peer publishes no cache table");
        for r in candidates {
            for _ in 0..8 {
                let header = read(r.addr, HEADER_LEN)?;
                let (version, len, _) = match Table::decode_header(&header) {
                    Ok(h) => h,
                    Err(table::TableError::Torn) => continue,
                    Err(e) => {
                        why = e.to_string();
                        break;
                    }
                };
                let img = read(r.addr, HEADER_LEN + len)?;
                match Table::decode_header(&img) {
                    Ok((v, l, sum)) if v == version && l == len => {
                        match Table::decode_payload(&img[HEADER_LEN..], sum) {
                            Ok(t) => return Ok(t),
                            Err(table::TableError::Torn) => continue,
                            Err(e) => {
                                why = e.to_string();
                                break;
                            }
                        }
                    }
                    _ => continue,
                }
            }
        }
        Err(Error::new(
            LlmStatus::LLM_FAILED,
            format!("cannot read {remote}'s cache table: {why}"),
        ))
    }

    /// Pulls from a peer's cache into local cache `dst_cache` (`PullKvCache`, `PullKvBlocks`).
    /// With `blocks` (`(src_blocks, dst_blocks)`, the same length, not empty) block
    /// `src_blocks[i]` of each tensor lands in block `dst_blocks[i]`, consecutive runs as one
    /// descriptor (a block is the local cache's stride). Without, batch
    /// `src.batch_index` of each tensor lands in batch `dst_batch` (`size` bytes, or the local
    /// stride for `-1`; the remote offset uses the local stride, as upstream's).
    ///
    /// # Errors
    /// `LLM_NOT_YET_LINK` (no link to the cluster), `LLM_KV_CACHE_NOT_EXIST` (no such local or
    /// remote cache), `LLM_PARAM_INVALID` (a block or batch outside a cache, mismatched lists
    /// or tensor counts, a bad size or layer range, the own cluster), `LLM_TIMEOUT`, the
    /// engine's other errors.
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
        if src.cluster_id() == self.cluster_id {
            return Err(Error::param("a pull from this instance's own cluster"));
        }
        let local = self.local(dst_cache)?;
        let (remote, table) = self.peer(&engine, src.cluster_id())?;
        let r = find(&table, src)?;
        let (li, ri) = tensor_pairs(layers, local.addrs.len(), r.addrs.len(), true)?;
        let ops = match blocks {
            Some((s, d)) => block_ops(&r, &local, &ri, &li, s, d, TransferOp::Read)?,
            None => {
                let src_batch = match *src {
                    RemoteCache::ById { batch_index, .. } => batch_index,
                    _ => 0,
                };
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
        engine.transfer_sync(&remote, TransferOp::Read, &ops, config.sync_timeout_ms)?;
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
        if dst.cluster_id() == self.cluster_id {
            return Err(Error::param("a push to this instance's own cluster"));
        }
        let local = self.local(src_cache)?;
        let (remote, table) = self.peer(&engine, dst.cluster_id())?;
        let r = find(&table, dst)?;
        let (li, ri) = tensor_pairs(layers, local.addrs.len(), r.addrs.len(), false)?;
        let per = layers.per_layer.max(1) as usize;
        // one WRITE per layer: the pairs `per` at a time
        for (ls, rs) in li.chunks(per).zip(ri.chunks(per)) {
            let ops = match blocks {
                Some((s, d)) => block_ops(&local, &r, ls, rs, s, d, TransferOp::Write)?,
                None => {
                    let dst_batch = match *dst {
                        RemoteCache::ById { batch_index, .. } => batch_index,
                        _ => 0,
                    };
                    batch_ops(
                        &local,
                        &r,
                        ls,
                        rs,
                        src_batch,
                        dst_batch,
                        -1,
                        TransferOp::Write,
                    )?
                }
            };
            engine.transfer_sync(&remote, TransferOp::Write, &ops, config.sync_timeout_ms)?;
        }
        Ok(())
    }
}

impl Drop for DataDist {
    fn drop(&mut self) {
        self.finalize();
    }
}

/// Registers each distinct tensor of `e` with `engine`; on failure the ones registered go.
fn register_tensors(engine: &compat::Hixl, e: &Entry) -> Result<Vec<compat::MemHandle>> {
    let mut handles = Vec::new();
    let mut seen = Vec::new();
    for &a in &e.addrs {
        if seen.contains(&a) {
            continue;
        }
        seen.push(a);
        let desc = compat::MemDesc {
            addr: a as usize,
            len: e.tensor_size as usize,
            local_only: false,
        };
        // SAFETY: the caller of `register_cache` promised this for each tensor (its `# Safety`),
        // for as long as the cache is registered; the handles go before the memory may
        let r = unsafe { engine.register_mem(desc, e.placement.mem_type()) };
        match r {
            Ok(h) => handles.push(h),
            Err(err) => {
                for h in handles {
                    let _ = engine.deregister_mem(h);
                }
                return Err(err.into());
            }
        }
    }
    Ok(handles)
}

/// The peer's entry `key` names.
fn find(t: &Table, key: &RemoteCache) -> Result<Entry> {
    let id = match *key {
        RemoteCache::ById { cache_id, .. } => Some(cache_id),
        RemoteCache::Blocks { model_id, .. } => t
            .keys
            .iter()
            .find(|k| k.req_id == u64::MAX && k.model_id == model_id)
            .map(|k| k.cache_id),
        RemoteCache::Request {
            req_id, model_id, ..
        } => t
            .keys
            .iter()
            .find(|k| k.req_id == req_id && k.model_id == model_id)
            .map(|k| k.cache_id),
    };
    id.and_then(|id| t.entries.iter().find(|e| e.cache_id == id).cloned())
        .ok_or_else(|| {
            Error::new(
                LlmStatus::LLM_KV_CACHE_NOT_EXIST,
                format!("the peer has no cache {key:?} (in the table it published at the link's first use)"),
            )
        })
}

/// The tensor indices of each side (`local`, `remote`) a transfer pairs, from its layer
/// ranges. `pull`: the remote side is the source.
fn tensor_pairs(
    layers: &Layers,
    local_n: usize,
    remote_n: usize,
    pull: bool,
) -> Result<(Vec<usize>, Vec<usize>)> {
    if layers.per_layer == 0 {
        return Err(Error::param("tensor_num_per_layer must be at least 1"));
    }
    let per = layers.per_layer as usize;
    let (src_n, dst_n) = if pull {
        (remote_n, local_n)
    } else {
        (local_n, remote_n)
    };
    let range = |r: (u32, u32), n: usize, what: &str| -> Result<Vec<usize>> {
        if r.0 > r.1 {
            return Err(Error::param(format!(
                "{what} layer range {r:?} is reversed"
            )));
        }
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
        (Some(sr), Some(dr)) => {
            let (s, d) = (
                range(sr, src_n, "source")?,
                range(dr, dst_n, "destination")?,
            );
            if s.len() != d.len() {
                return Err(Error::param("the layer ranges differ in length"));
            }
            (s, d)
        }
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
) -> Result<Vec<TransferOpDesc>> {
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
    if size == 0 || size < -1 {
        return Err(Error::param(format!(
            "size {size}: -1, or a positive number"
        )));
    }
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
    let ops = src_tensors
        .iter()
        .zip(dst_tensors)
        .map(|(&s, &d)| {
            let sa = src.addrs[s] + u64::from(src_batch) * src_stride;
            let da = dst.addrs[d] + u64::from(dst_batch) * dst_stride;
            desc(op, sa, da, len)
        })
        .collect();
    Ok(ops)
}

/// Descriptors of block runs: for each run of pairs consecutive on both sides, one per tensor
/// pair. The block size is the local cache's stride.
fn block_ops(
    src: &Entry,
    dst: &Entry,
    src_tensors: &[usize],
    dst_tensors: &[usize],
    src_blocks: &[u64],
    dst_blocks: &[u64],
    op: TransferOp,
) -> Result<Vec<TransferOpDesc>> {
    if src_blocks.is_empty() || src_blocks.len() != dst_blocks.len() {
        return Err(Error::param(format!(
            "{} source and {} destination blocks: the same number, at least one",
            src_blocks.len(),
            dst_blocks.len()
        )));
    }
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
    let mut runs: Vec<(u64, u64, u64)> = Vec::new();
    for (&s, &d) in src_blocks.iter().zip(dst_blocks) {
        match runs.last_mut() {
            Some((rs, rd, n)) if *rs + *n == s && *rd + *n == d => *n += 1,
            _ => runs.push((s, d, 1)),
        }
    }
    let mut ops = Vec::with_capacity(runs.len() * src_tensors.len());
    for (&st, &dt) in src_tensors.iter().zip(dst_tensors) {
        for &(s, d, n) in &runs {
            ops.push(desc(
                op,
                src.addrs[st] + s * bs,
                dst.addrs[dt] + d * bs,
                n * bs,
            ));
        }
    }
    Ok(ops)
}

/// The engine descriptor moving `len` bytes from `src` to `dst`: for a READ the local side is
/// the destination, for a WRITE the source.
fn desc(op: TransferOp, src: u64, dst: u64, len: u64) -> TransferOpDesc {
    let (local, remote) = match op {
        TransferOp::Read => (dst, src),
        TransferOp::Write => (src, dst),
    };
    TransferOpDesc {
        local_addr: local as usize,
        remote_addr: remote as usize,
        len: len as usize,
    }
}

/// The last failure of `rets`, or success.
fn last_failure(rets: &[LlmStatus]) -> LlmStatus {
    rets.iter()
        .rev()
        .find(|s| **s != LlmStatus::LLM_SUCCESS)
        .copied()
        .unwrap_or(LlmStatus::LLM_SUCCESS)
}

/// Reads the options `initialize` uses (the others are accepted and not used).
fn parse_options(options: &[(String, String)]) -> Result<Config> {
    let mut c = Config {
        sync_timeout_ms: 1000,
        ..Config::default()
    };
    let (mut ip, mut port) = (None, None);
    for (k, v) in options {
        match k.as_str() {
            "llm.ListenIpInfo" | "llm.listenIpInfo" => c.listen = Some(listen_address(v)?),
            "llm.ListenIp" => ip = Some(v.clone()),
            "llm.ListenPort" => port = Some(v.clone()),
            "llm.DeviceId" | "ge.exec.deviceId" => {
                let d: i32 = v
                    .parse()
                    .ok()
                    .filter(|d| *d >= 0)
                    .ok_or_else(|| Error::param(format!("device id {v:?}")))?;
                c.device_id.get_or_insert(d);
            }
            "llm.SyncKvCacheWaitTime" => {
                c.sync_timeout_ms = v.parse().ok().filter(|t| *t > 0).ok_or_else(|| {
                    Error::param(format!("llm.SyncKvCacheWaitTime {v:?}: a positive integer"))
                })?
            }
            "llm.TransferBackend" if !v.is_empty() && v != "hixl" => {
                return Err(Error::param(format!(
                    "llm.TransferBackend {v:?}: only \"hixl\""
                )));
            }
            "llm.RdmaTrafficClass" => c
                .engine_options
                .push(("RdmaTrafficClass".into(), v.clone())),
            "llm.RdmaServiceLevel" => c
                .engine_options
                .push(("RdmaServiceLevel".into(), v.clone())),
            "llm.LinkTotalTime" => {
                let t: u32 = v.parse().map_err(|_| {
                    Error::param(format!("llm.LinkTotalTime {v:?}: 0 to 2^32-1 (s)"))
                })?;
                c.link_total_time_s = (t > 0).then_some(t);
            }
            "llm.LinkRetryCount" => {
                c.link_retry_count = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| Error::param(format!("llm.LinkRetryCount {v:?}: 1 to 100")))?
            }
            "llm.GlobalResourceConfig" if !v.is_empty() => c
                .engine_options
                .push(("GlobalResourceConfig".into(), v.clone())),
            _ => {}
        }
    }
    if let (Some(ip), Some(port)) = (ip, port)
        && c.listen.is_none()
    {
        c.listen = Some(listen_address(&format!("{ip}:{port}"))?);
    }
    Ok(c)
}

/// `"ip:port"` (or `"[ipv6]:port"`) as the engine's name, checked.
fn listen_address(v: &str) -> Result<String> {
    let a: std::net::SocketAddr = v
        .parse()
        .map_err(|_| Error::param(format!("listen address {v:?}: \"ip:port\"")))?;
    Ok(a.to_string())
}

/// Makes device `id` current on this thread where ACL loads (the engine uses the device
/// current on the thread that initializes it); nothing where it does not (host caches only).
fn set_device(id: i32) -> Result<()> {
    match crate::device::acl::Acl::load(None) {
        Ok(acl) => {
            let r = acl
                .set_device(id)
                .map_err(|e| Error::new(LlmStatus::LLM_FAILED, e.to_string()));
            // the library stays loaded, as upstream's does: ACL keeps the thread's current
            // device in it, so unloading it here (the last handle, when the caller has not
            // loaded ACL itself) would forget the device just set before the engine reads it.
            // Kept in a static (reachable, so not a leak to LeakSanitizer): later loads of the
            // same library share its handle
            static KEPT: std::sync::OnceLock<crate::device::acl::Acl> = std::sync::OnceLock::new();
            let _ = KEPT.get_or_init(|| acl);
            r
        }
        Err(_) => Ok(()),
    }
}
