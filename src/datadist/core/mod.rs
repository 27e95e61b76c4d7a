//! The LLM-DataDist instance, checked at run time ([`DataDist`]): one cluster, its caches and
//! its links to other clusters, over one engine of the core floor (`engine.rs`). The C
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
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::table::{Entry, TABLE_LEN, Table};
use super::types::{CacheKey, Error, LlmStatus, Placement, Result, Role};
use crate::Access;
use crate::runtime::handle::{LinkHandle, RegionHandle};
use crate::sync::lock;
use engine::{Buffer, DdEngine};

// the instance's methods by job, as child modules (they see its private fields): the argument
// rules of every surface, CANN's C++ forms, caches and the table peers fetch, links by listen
// address, pulls and pushes, links by a rank table
pub mod args;
mod caches;
mod cann;
mod downloads;
mod engine;
mod links;
mod moves;
mod rank;
mod uses;
use caches::register_tensors;
pub use cann::CannPart;
use moves::last_failure;
pub use rank::{MAX_COMMS, RegisterMemStatus};

/// Most links one instance holds (upstream's `kMaxLinkNum`).
pub const MAX_LINKS: usize = 512;

/// A local cache: its geometry, its tensors and their registrations.
#[derive(Clone)]
struct LocalCache {
    entry: Entry,
    /// The engine handles of its tensors (one per distinct tensor outside every pool).
    handles: Vec<RegionHandle>,
    /// Each tensor's region, by tensor index (its own registration or its pool's): a move
    /// builds its local spans from these, not from the engine's index. `None`: a tensor whose
    /// registration went (a failed unregistration kept the rest).
    regions: Regions,
    /// Its keys, each with the batch it names.
    keys: Vec<(CacheKey, u64)>,
    /// Its running pulls and pushes (`uses.rs`): unregistering waits for them.
    uses: Arc<uses::Uses>,
}

/// Each tensor's region of a local cache, by tensor index ([`LocalCache::regions`]).
type Regions = Arc<[Option<RegionHandle>]>;

/// A link to a peer cluster.
#[derive(Debug)]
struct PeerLink {
    /// The peer engine's name, `ip:port`.
    remote: String,
    /// The peer's cache table, fetched at the first pull or push.
    table: Option<Arc<Table>>,
    /// The link this record made (or took from a rank-table link), which its table is fetched
    /// over and its moves run on; the engine owns it. Never another link the engine has under
    /// the same name: once this one broke or went, the cluster is linked again by its own id.
    link: Weak<LinkHandle>,
    /// Made back to a cluster that linked to this one (it goes when that cluster unlinks):
    /// the engine that cluster linked from, whose notifications alone speak for it.
    back: Option<String>,
    /// A later link note for the cluster (a process of it that crashed and came back, or a
    /// claim): taken at the cluster's next pull or push if this link's peer is gone by then.
    claim: Option<Inbound>,
    /// Whether a PING for `claim` went unanswered (no second one: the link's breaking decides).
    claim_probed: bool,
    /// The peer process a link back reached (its engine's instance id): a link back that
    /// broke is made again to this process only.
    instance: Option<u64>,
}

impl PeerLink {
    /// A record of `link`, this engine's link to the peer engine `remote`, nothing fetched
    /// yet (`back`: see the field).
    fn new(remote: String, link: Weak<LinkHandle>, back: Option<String>) -> Self {
        PeerLink {
            remote,
            table: None,
            link,
            back,
            claim: None,
            claim_probed: false,
            instance: None,
        }
    }
}

/// Where a cluster that linked to this one listens (`links.rs`), as its link note said, and
/// the engine that sent the note: the cluster is bound to that engine until it unlinks, or
/// until that engine is gone and another note claimed the cluster.
#[derive(Debug, Clone)]
struct Inbound {
    /// The sending engine's name.
    from: String,
    /// The address to link back to.
    addr: String,
    /// A later note of another engine for the cluster: linked back to instead if nothing
    /// listens at `addr` any more, at the cluster's next pull or push (a boxed `Inbound`
    /// without a claim of its own).
    claim: Option<Box<Inbound>>,
    /// The process a link back made again after a break must reach (the one it reached
    /// before): a new process at `addr` links again first. `None`: any, until the first link
    /// back.
    instance: Option<u64>,
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

impl Config {
    /// `llm.SyncKvCacheWaitTime`, checked positive when it was read.
    fn sync_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.sync_timeout_ms.max(0) as u64)
    }
}

#[derive(Default)]
struct Caches {
    by_id: BTreeMap<i64, LocalCache>,
    /// The memory pools (`register_pool`): registered once, for caches carved from them.
    pools: Vec<Pool>,
    /// The published table's writer (its version).
    publisher: crate::published::Publisher,
}

/// A memory pool: one engine registration that caches inside it share.
#[derive(Clone)]
struct Pool {
    addr: u64,
    len: u64,
    placement: Placement,
    /// Its registration.
    handle: RegionHandle,
}

impl Pool {
    /// Whether `len` bytes at `addr` of `placement` lie inside this pool.
    fn holds(&self, placement: Placement, addr: u64, len: u64) -> bool {
        self.placement == placement
            && addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len)
    }
}

/// An LLM-DataDist instance (the runtime-checked form): `Send + Sync`.
pub struct DataDist {
    cluster_id: u64,
    role: Mutex<Role>,
    state: Mutex<Option<Live>>,
    caches: Mutex<Caches>,
    links: Mutex<HashMap<u64, PeerLink>>,
    /// Held while link notes are taken and applied: in the order they came (two pulls that
    /// took one note each must not apply an unlink before the link it ends).
    notes: Mutex<()>,
    next_id: AtomicI64,
    /// The communicators of links by an explicit rank table (`rank.rs`).
    comms: rank::Comms,
    /// Clusters that linked to this one and said where they listen (`links.rs`): a pull or
    /// push there links back on first use.
    inbound: Mutex<HashMap<u64, Inbound>>,
    /// Held by whatever registers or unregisters memory with the engine, and by whatever
    /// replaces the engine (`relisten`) or finalizes it: a registration's handles are always
    /// the current engine's.
    regs: Mutex<()>,
}

/// An initialized instance's engine and buffers.
struct Live {
    engine: Arc<DdEngine>,
    /// (shared: every pull and push reads it)
    config: Arc<Config>,
    /// The published cache table (read-only for peers).
    table: Buffer,
    /// Where peers' tables are READ into (not in peers' view): a buffer a fetch, each fetch's
    /// own while it runs (`downloads.rs`).
    downloads: Arc<downloads::Downloads>,
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
            notes: Mutex::new(()),
            next_id: AtomicI64::new(1),
            comms: rank::Comms::default(),
            inbound: Mutex::new(HashMap::new()),
            regs: Mutex::new(()),
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
    /// - hixl's own engine options (`hixl.*`: `hixl.SameHost`, `hixl.MaxLanes`, ... as
    ///   [`Options::from_pairs`](crate::Options::from_pairs) reads them): passed to the engine as
    ///   they are (a bad value fails `initialize` with the engine's error);
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
        let engine = DdEngine::initialize(&name, &opts)?;
        let table = engine.alloc_host_mem_with(TABLE_LEN, Access::Read)?;
        let download = engine.alloc_host_mem_with(TABLE_LEN, Access::None)?;
        Ok(Live {
            engine: Arc::new(engine),
            config: Arc::new(config.clone()),
            table,
            downloads: Arc::new(downloads::Downloads::new(download)),
        })
    }

    /// The engine and its configuration, or `FAILED`.
    fn live(&self) -> Result<(Arc<DdEngine>, Arc<Config>)> {
        let s = lock(&self.state);
        let l = s.as_ref().ok_or_else(not_initialized)?;
        Ok((l.engine.clone(), l.config.clone()))
    }

    /// Finalizes (`Finalize`): every link goes, the caches' memory is deregistered, the engine
    /// finalized. Calling it again, or before `initialize`, does nothing.
    pub fn finalize(&self) {
        self.unlink_all_comms();
        // not while a registration or an engine swap is under way (it would bring an engine
        // back, or register with the one finalized)
        let _regs = lock(&self.regs);
        let live = lock(&self.state).take();
        lock(&self.links).clear();
        lock(&self.inbound).clear();
        {
            let mut caches = lock(&self.caches);
            caches.by_id.clear();
            // (the engine's finalize below deregisters them with everything else)
            caches.pools.clear();
        }
        if let Some(l) = live {
            l.engine.finalize();
        }
    }

    /// Changes the role (`SetRole`). With `llm.ListenIpInfo` in `options` the instance
    /// listens there from now on: while links exist that is `LLM_EXIST_LINK`; otherwise the
    /// engine is made anew on that address and every cache registered again in it (same ids,
    /// same table). Without it, a switch to the decoder role closes the listener (upstream's
    /// decoder does not listen) when no link exists, and the listen address stays otherwise.
    ///
    /// # Errors
    /// `LLM_FAILED` before `initialize`; `LLM_EXIST_LINK`; `LLM_PARAM_INVALID` for a malformed
    /// address; the engine's errors.
    pub fn set_role(&self, role: Role, options: &[(String, String)]) -> Result<()> {
        // the whole switch excludes registrations (and other switches): the engine it reads is
        // the one it replaces
        let regs = lock(&self.regs);
        let (_, config) = self.live()?;
        let listen = parse_options(options)?.listen;
        if let Some(addr) = listen.clone()
            && config.listen.as_deref() != Some(addr.as_str())
        {
            let linked = !lock(&self.links).is_empty();
            if linked || self.comms.any() {
                return Err(Error::new(
                    LlmStatus::LLM_EXIST_LINK,
                    "cannot listen elsewhere while links exist: unlink them first",
                ));
            }
            self.relisten(&regs, config, Some(addr))?;
        } else if listen.is_none()
            && role == Role::Decoder
            && config.listen.is_some()
            && lock(&self.links).is_empty()
            && !self.comms.any()
        {
            self.relisten(&regs, config, None)?;
        }
        *lock(&self.role) = role;
        Ok(())
    }

    /// A new engine listening on `addr` (or a client only, for `None`), with every cache
    /// registered again. Clusters that linked to the old engine have lost their links.
    ///
    /// `_regs` is [`DataDist::regs`], held by the caller from before it read `config` (the
    /// engine's) until this returns: no registration or unregistration runs meanwhile, so none
    /// is made with the old engine after the caches were registered with the new one, nor
    /// hands the new engine's handles to the old one.
    fn relisten(
        &self,
        _regs: &MutexGuard<'_, ()>,
        config: Arc<Config>,
        addr: Option<String>,
    ) -> Result<()> {
        let mut config = Config::clone(&config);
        config.listen = addr;
        let live = Self::start(&config)?;
        let mut caches = lock(&self.caches);
        // the new engine's handles replace the old ones only once every pool and cache is
        // registered there: on failure the old engine (and its handles) stays, the new one goes
        let mut pools = Vec::with_capacity(caches.pools.len());
        for p in &caches.pools {
            let (addr, len) = (p.addr as usize, p.len as usize);
            // SAFETY: the caller of `register_pool` promised this for the pool until finalize
            match unsafe { live.engine.register_mem(addr, len, p.placement.mem_type()) } {
                Ok(handle) => pools.push(Pool {
                    handle,
                    ..p.clone()
                }),
                Err(e) => {
                    drop(caches);
                    live.engine.finalize();
                    return Err(e.into());
                }
            }
        }
        let mut handles = Vec::with_capacity(caches.by_id.len());
        for c in caches.by_id.values() {
            match register_tensors(&live.engine, &c.entry, &pools) {
                Ok(h) => handles.push(h),
                Err(e) => {
                    drop(caches);
                    live.engine.finalize();
                    return Err(e);
                }
            }
        }
        for (c, (h, r)) in caches.by_id.values_mut().zip(handles) {
            c.handles = h;
            c.regions = r;
        }
        caches.pools = pools;
        drop(caches);
        lock(&self.inbound).clear();
        let old = lock(&self.state).replace(live);
        if let Some(old) = old {
            old.engine.finalize();
        }
        self.publish()
    }
}

impl Drop for DataDist {
    fn drop(&mut self) {
        self.finalize();
    }
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
            k if k.starts_with("hixl.") => c.engine_options.push((k.into(), v.clone())),
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
