//! Engine options: a typed builder, plus HIXL's string keys.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::Error;

/// Options for [`Hixl::initialize`](crate::Hixl::initialize).
///
/// Build them with the typed methods, or from HIXL's `map<AscendString, AscendString>` with
/// [`Options::from_pairs`]. Unknown keys are `PARAM_INVALID`, as in HIXL.
#[derive(Debug, Clone)]
pub struct Options {
    pub(crate) max_regions: usize,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_lanes: usize,
    pub(crate) parallel_lanes: usize,
    pub(crate) server_io_timeout: Duration,
    pub(crate) finalize_timeout: Duration,
    pub(crate) max_server_conns: usize,
    pub(crate) max_server_conns_per_peer: usize,
    pub(crate) max_server_lanes_per_link: usize,
    pub(crate) max_server_handshakes: usize,
    pub(crate) max_server_handshakes_per_peer: usize,
    pub(crate) max_server_threads: usize,
    pub(crate) max_pending_notifies: usize,
    pub(crate) max_pending_notify_bytes: usize,
    pub(crate) closed_link_notify_grace: Duration,
    pub(crate) same_host: SameHost,
    pub(crate) ucx: Ucx,
    pub(crate) allow_peers: Option<Vec<String>>,
    pub(crate) psk: Option<crate::auth::Psk>,
    pub(crate) heartbeat: Option<Duration>,
    /// HIXL's `AutoConnect=1`: honoured by [`crate::compat::Hixl`]; the typed engine refuses it.
    pub(crate) auto_connect: bool,
    pub(crate) hixl: BTreeMap<String, String>,
    /// HIXL's Ascend keys and hixl's `hixl.ascend.*`, parsed.
    pub(crate) ascend: crate::transport::ascend::options::AscendOptions,
    /// Whether `initialize` starts an Ascend runtime.
    pub(crate) ascend_mode: AscendMode,
    /// Bytes of a same-host peer's memory each link populates in advance.
    pub(crate) prefault_budget: u64,
}

/// Whether an engine uses the Ascend backend (ACL device memory, HCCL transfers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AscendMode {
    /// As HIXL: where CANN's ACL runtime and HCCL load (through the loader path that CANN's
    /// `set_env.sh` sets, or `$ASCEND_HOME_PATH/lib64`), `initialize` takes the device
    /// `aclrtGetDevice` reports on the calling thread (none set: device 0, as torch_npu does)
    /// and device memory can be registered and moved; where they do not load, the engine is
    /// host-only and device memory is refused with `UNSUPPORTED`.
    #[default]
    Auto,
    /// Ascend or nothing: `initialize` fails (`UNSUPPORTED`, naming the library) where ACL or
    /// HCCL does not load. Chosen by [`Options::ascend`] and by any `hixl.ascend.*` key but
    /// `hixl.ascend.enable`.
    On,
    /// Host memory only: CANN is not loaded even where it is installed.
    Off,
}

/// Fabric memory (HIXL's `EnableUseFabricMem=1`, on its host-copy path), for
/// [`Options::fabric_mem`]: ACL only (no HCCL), memory as ACL virtual memory
/// ([`FabricBuffer`](crate::fabric::FabricBuffer)) that peers map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricConfig {
    /// The ACL runtime library; `None`: `$HIXL_ACL_LIB`, then `libacl_rt.so`, `libascendcl.so`.
    pub acl_lib: Option<PathBuf>,
    /// The logical device id (`aclrtSetDevice`); `None`: the device of the initializing thread,
    /// as HIXL takes it.
    pub device_id: Option<u32>,
    /// Streams a link's copies are spread over (`fabric_memory.task_stream_num`, 1..=8).
    pub task_streams: u32,
}

impl Default for FabricConfig {
    fn default() -> Self {
        Self {
            acl_lib: None,
            device_id: None,
            task_streams: 1,
        }
    }
}

/// Where to find CANN and which device to use, for [`Options::ascend`].
///
/// The same settings are available as string options: `hixl.ascend.acl_lib`,
/// `hixl.ascend.hccl_lib`, `hixl.ascend.device_id`, `hixl.ascend.device_ip`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AscendConfig {
    /// The ACL runtime library; `None`: `$HIXL_ACL_LIB`, then `libacl_rt.so`, `libascendcl.so`
    /// (found through the loader path, e.g. `LD_LIBRARY_PATH` set by CANN's `set_env.sh`).
    pub acl_lib: Option<PathBuf>,
    /// The HCCL library; `None`: `$HIXL_HCCL_LIB`, then `libhcomm.so`, `libhccl.so`.
    pub hccl_lib: Option<PathBuf>,
    /// The logical device id, as `aclrtSetDevice` takes it (0 by default). The rank table and
    /// `/etc/hccn.conf` use the physical id, which hixl asks ACL for
    /// (`aclrtGetPhyDevIdByLogicDevId`); the two differ in containers and with visible-device
    /// remapping.
    pub device_id: u32,
    /// The device's RoCE address; `None`: `address_<physical id>` (else
    /// `IPv6address_<physical id>`) from `/etc/hccn.conf`, and if neither is there, none: HCCL
    /// needs no device IP between two devices of one server, nor between A3 servers of one
    /// super pod (HCCS); other links are then refused with [`Error::InvalidOption`].
    pub device_ip: Option<IpAddr>,
}

/// Whether links between engines on one machine use the same-host transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SameHost {
    /// Use it when both engines are on one host and the kernel allows it; TCP otherwise.
    #[default]
    Auto,
    /// Never use it: every link moves data over TCP.
    Forbid,
    /// Use it or fail the connect (`UNSUPPORTED`) when it cannot be used.
    Require,
}

/// Whether links move data over UCX (UCP RMA: RDMA verbs, tcp or shared memory, as the
/// environment's `UCX_TLS` / `UCX_NET_DEVICES` choose). UCX is loaded at run time
/// (`libucp.so.0`, or `HIXL_UCX_LIB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ucx {
    /// Never load UCX (the default): links use TCP or the same-host transport.
    #[default]
    Off,
    /// Serve over UCX when it loads, and use it for a link when the peer offers it; otherwise
    /// fall back as with [`Ucx::Off`].
    Auto,
    /// UCX or nothing: `initialize` fails (`UNSUPPORTED`, naming the library) if UCX cannot be
    /// loaded, and a connect fails if the peer does not offer UCX.
    Require,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_regions: 4000,
            connect_timeout: Duration::from_millis(1000),
            max_lanes: 8,
            parallel_lanes: 2,
            server_io_timeout: Duration::from_secs(30),
            finalize_timeout: Duration::from_secs(5),
            max_server_conns: 1024,
            max_server_conns_per_peer: 256,
            max_server_lanes_per_link: 64,
            max_server_handshakes: 64,
            max_server_handshakes_per_peer: 8,
            max_server_threads: 64,
            max_pending_notifies: 16_384,
            max_pending_notify_bytes: 16 << 20,
            closed_link_notify_grace: Duration::from_secs(60),
            same_host: SameHost::Auto,
            ucx: Ucx::Off,
            allow_peers: None,
            psk: None,
            heartbeat: Some(Duration::from_secs(10)),
            auto_connect: false,
            hixl: BTreeMap::new(),
            ascend: Default::default(),
            ascend_mode: AscendMode::Auto,
            prefault_budget: 1 << 30,
        }
    }
}

/// HIXL's option keys that this build accepts (values are validated; see [`Options::from_pairs`]).
pub const HIXL_KEYS: &[&str] = &[
    "BufferPool",
    "RdmaTrafficClass",
    "RdmaServiceLevel",
    "AutoConnect",
    "EnableUseFabricMem",
    "LocalCommRes",
    "GlobalResourceConfig",
];

impl Options {
    /// The defaults: 4000 regions, 1000 ms connect timeout, up to 8 lanes per link, 30 s
    /// serving I/O timeout, 5 s finalize grace.
    pub fn new() -> Self {
        Self::default()
    }

    /// Most regions one engine may register (HIXL recommends at most 4000).
    pub fn max_regions(mut self, n: usize) -> Self {
        self.max_regions = n;
        self
    }
    /// The timeout [`Hixl::connect`](crate::Hixl::connect) uses.
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }
    /// Most TCP connections (lanes) per link; concurrent transfers on one link use separate lanes.
    pub fn max_lanes(mut self, n: usize) -> Self {
        self.max_lanes = n.max(1);
        self
    }
    /// How many lanes one large transfer (at least 8 MiB per lane) may use at once (default 2).
    /// 1 keeps every transfer on a single connection.
    pub fn parallel_lanes(mut self, n: usize) -> Self {
        self.parallel_lanes = n.max(1);
        self
    }
    /// How long a serving engine waits for the rest of a request once its first byte has arrived
    /// (the frame, a WRITE's payload and the reply; default 30 s), and for a new connection's
    /// whole handshake. An established connection may stay idle between requests.
    pub fn server_io_timeout(mut self, t: Duration) -> Self {
        self.server_io_timeout = t;
        self
    }
    /// How long leaving `Connected` (or finalizing) waits for requests being served to finish.
    pub fn finalize_timeout(mut self, t: Duration) -> Self {
        self.finalize_timeout = t;
        self
    }
    /// Whether links use UCX (default [`Ucx::Off`]).
    pub fn ucx(mut self, policy: Ucx) -> Self {
        self.ucx = policy;
        self
    }

    /// Whether same-host links use the same-host transport (default [`SameHost::Auto`]).
    pub fn same_host(mut self, policy: SameHost) -> Self {
        self.same_host = policy;
        self
    }
    /// Bytes of a peer's memory each same-host link maps into this process's page tables in
    /// advance (default 1 GiB; 0 turns it off), so that the first transfers after connect do
    /// not take a page fault per 4 KiB page of the peer's memory (measured on a 2-core VM,
    /// 512 MiB rounds: the first WRITE round took 4-5 times a warm one without it, about as
    /// long as a warm one with it).
    ///
    /// At connect, the first region the peer offers in a memfd (its
    /// [`HostBuffer`](crate::HostBuffer)s) is populated from its start, until the budget is
    /// spent or half the time left before the connect's deadline has passed: the connect takes
    /// longer by about 0.1 ms per MiB populated (measured: 48-67 ms for 512 MiB on a busy
    /// 2-core VM). Afterwards each WRITE batch populates the 2 MiB chunks it touches that are
    /// not yet, ahead of its copies (one `madvise` per chunk instead of a write fault per
    /// page), while the budget lasts (a READ's faults map sixteen pages each already).
    ///
    /// Only pages the peer's memory holds are populated (holes stay holes: no memory is
    /// allocated for the peer), so what the budget bounds is this process's page tables for the
    /// peer (about 2 MiB per GiB populated) and the time spent populating, at connect and in
    /// batches (the kernel's fault-around may map up to 15 pages more past the end of what was
    /// populated, pages the peer's memory holds); beyond it, pages fault on first touch as
    /// before. A caller that connects to a large peer to move a small part of it sets a smaller
    /// budget, or 0. Regions reached with `process_vm_*`, and links over TCP or UCX, are not
    /// concerned; a kernel without `MADV_POPULATE_READ` (before 5.14) faults as before. The
    /// string key is `hixl.PrefaultBudget` (bytes), for the C ABI, C++ and Python options maps.
    pub fn prefault_budget(mut self, bytes: u64) -> Self {
        self.prefault_budget = bytes;
        self
    }
    /// Serve only clients whose engine names are in `names` (others are refused with
    /// `PARAM_INVALID` at the handshake). Names are what clients say they are: pair this with
    /// peer authentication where that matters.
    pub fn allow_peers<I: IntoIterator<Item = S>, S: Into<String>>(mut self, names: I) -> Self {
        self.allow_peers = Some(names.into_iter().map(Into::into).collect());
        self
    }
    /// Authenticate peers with this pre-shared key (at least 16 bytes; checked at `initialize`):
    /// a challenge-response with HMAC-SHA256 on every connection, so the key never crosses the
    /// wire. An engine with a key refuses peers without one (or with another), and a client
    /// with a key refuses a server that cannot prove it.
    pub fn psk(mut self, key: impl AsRef<[u8]>) -> Self {
        self.psk = Some(crate::auth::Psk::new(key));
        self
    }
    /// How often idle TCP links are checked with a heartbeat (default 10 s, as HIXL's); a peer
    /// that does not answer within the same interval breaks the link (`NOT_CONNECTED`), so a
    /// stopped, hung or cut-off peer is noticed without waiting for a transfer to time out.
    /// `None` turns heartbeats off.
    pub fn heartbeat_interval(mut self, every: Option<Duration>) -> Self {
        self.heartbeat = every.filter(|d| !d.is_zero());
        self
    }
    /// Most established connections (lanes of links) a serving engine keeps open at once
    /// (default 1024); a client that completes its handshake beyond that is refused with
    /// `RESOURCE_EXHAUSTED`. Connections still in their handshake are counted apart
    /// ([`Options::max_server_handshakes`]).
    pub fn max_server_conns(mut self, n: usize) -> Self {
        self.max_server_conns = n.max(1);
        self
    }
    /// Most established connections from one peer IP address (default 256); more are refused
    /// with `RESOURCE_EXHAUSTED` at the end of their handshake.
    pub fn max_server_conns_per_peer(mut self, n: usize) -> Self {
        self.max_server_conns_per_peer = n.max(1);
        self
    }
    /// Most connections (lanes) one link may have on a serving engine (default 64, well above
    /// the default [`Options::max_lanes`] of clients); a lane beyond it is refused with
    /// `RESOURCE_EXHAUSTED`. A client keeps its link, and a transfer that finds no idle lane
    /// waits for one of those it has (until its deadline): keep it at or above the `max_lanes`
    /// of your clients, or concurrent transfers on one link queue.
    pub fn max_server_lanes_per_link(mut self, n: usize) -> Self {
        self.max_server_lanes_per_link = n.max(1);
        self
    }
    /// Most connections a serving engine keeps in their handshake (HELLO, the key challenge,
    /// the same-host proof) at once (default 64). When they are all taken, one makes room for a
    /// newcomer: from the address with the most handshakes, the one that got least far, oldest
    /// first (with a key, never one that authenticated); the whole handshake must finish within
    /// [`Options::server_io_timeout`].
    pub fn max_server_handshakes(mut self, n: usize) -> Self {
        self.max_server_handshakes = n.max(1);
        self
    }
    /// Most connections in their handshake from one peer IP address (default 8). A newcomer
    /// from an address at the limit takes the place of that address's handshake that got least
    /// far (oldest first), so clients sharing an address with idle connections still get in.
    pub fn max_server_handshakes_per_peer(mut self, n: usize) -> Self {
        self.max_server_handshakes_per_peer = n.max(1);
        self
    }
    /// Most threads a serving engine uses to serve requests at once (default 64). Handshakes
    /// and idle lanes cost no thread (one poller thread waits on them all); a thread serves a
    /// lane while its requests keep coming, then returns to the pool, whose idle threads end
    /// after 2 s. Requests beyond it wait for a thread.
    pub fn max_server_threads(mut self, n: usize) -> Self {
        self.max_server_threads = n.max(1);
        self
    }
    /// Most notifications pending on this engine, over all links (default 16,384; each link
    /// has at most [`MAX_PENDING_NOTIFIES`](crate::MAX_PENDING_NOTIFIES) of them). Beyond it a
    /// sender gets `RESOURCE_EXHAUSTED` until [`Hixl::get_notifies`](crate::Hixl::get_notifies)
    /// drains the queue.
    pub fn max_pending_notifies(mut self, n: usize) -> Self {
        self.max_pending_notifies = n.max(1);
        self
    }
    /// Most bytes of notifications pending on this engine, over all links (default 16 MiB;
    /// names, messages and sender names, plus 64 bytes each). Beyond it a sender gets
    /// `RESOURCE_EXHAUSTED`.
    pub fn max_pending_notify_bytes(mut self, n: usize) -> Self {
        self.max_pending_notify_bytes = n.max(1);
        self
    }
    /// How long the pending notifications of a closed link are kept for
    /// [`Hixl::get_notifies`](crate::Hixl::get_notifies) (default 60 s); after that they are
    /// dropped.
    pub fn closed_link_notify_grace(mut self, t: Duration) -> Self {
        self.closed_link_notify_grace = t;
        self
    }

    /// Use the Ascend backend with these libraries and this device ([`AscendMode::On`]):
    /// `initialize` loads ACL and HCCL (a missing library is [`Error::LibraryUnavailable`]),
    /// sets the device on the calling thread and takes its context; device memory can then be
    /// allocated, registered and moved with HCCL. Without this call an engine uses Ascend
    /// where CANN loads ([`AscendMode::Auto`]).
    pub fn ascend(mut self, cfg: AscendConfig) -> Self {
        self.ascend.acl_lib = cfg.acl_lib;
        self.ascend.hccl_lib = cfg.hccl_lib;
        self.ascend.device_id = Some(cfg.device_id);
        self.ascend.device_ip = cfg.device_ip.or(self.ascend.device_ip);
        self.ascend_mode = AscendMode::On;
        self
    }

    /// A fabric-memory engine (HIXL's `EnableUseFabricMem=1`, host-copy path): ACL without HCCL,
    /// regions of ACL virtual memory ([`Hixl::alloc_fabric`](crate::Hixl::alloc_fabric), or
    /// memory the caller mapped with ACL's VMM calls) whose physical memory peers map at
    /// connect, and copies with `aclrtMemcpyAsync`. See `docs/ascend.md`.
    pub fn fabric_mem(mut self, cfg: FabricConfig) -> Self {
        self.ascend.enable_fabric_mem = true;
        self.ascend.acl_lib = cfg.acl_lib;
        self.ascend.device_id = cfg.device_id;
        let mut g = self
            .ascend
            .global_resource_config
            .take()
            .unwrap_or_default();
        g.fabric_task_stream_num = Some(u64::from(cfg.task_streams.clamp(1, 8)));
        self.ascend.global_resource_config = Some(g);
        self.ascend_mode = AscendMode::On;
        self
    }

    /// Whether the engine is a fabric-memory engine ([`Options::fabric_mem`], or
    /// `EnableUseFabricMem=1`).
    pub fn uses_fabric_mem(&self) -> bool {
        self.ascend.enable_fabric_mem
    }

    /// Whether the engine uses Ascend (default [`AscendMode::Auto`]; also the string option
    /// `hixl.ascend.enable`: `"auto"`, `"1"`, `"0"`).
    pub fn ascend_mode(mut self, mode: AscendMode) -> Self {
        self.ascend_mode = mode;
        self
    }

    /// Whether `AutoConnect=1` was given (see [`crate::compat::Hixl`]).
    pub fn auto_connect(&self) -> bool {
        self.auto_connect
    }

    /// Whether `initialize` must start an Ascend runtime ([`AscendMode::On`]: [`Options::ascend`]
    /// or a `hixl.ascend.*` key was given). With [`AscendMode::Auto`], the default, it starts one
    /// where CANN loads: [`Hixl::uses_ascend`](crate::Hixl::uses_ascend) says what it did.
    pub fn uses_ascend(&self) -> bool {
        self.ascend_mode == AscendMode::On
    }

    /// The device an engine initialized with these options on the calling thread would take,
    /// read as HIXL's ADXL and HIXL-CS read it when they start (`aclrtGetDevice`), without
    /// starting one: `Ok(None)` where the engine would not use CANN ([`AscendMode::Off`], or
    /// [`AscendMode::Auto`] where ACL does not load) and where `hixl.ascend.device_id` names
    /// the device (it is set then, not read).
    ///
    /// # Errors
    /// [`Error::Native`] from `aclrtGetDevice` (`ACL_ERROR_RT_CONTEXT_NULL`, 107002, on a
    /// thread with no device); [`Error::LibraryUnavailable`] under [`AscendMode::On`] where ACL
    /// does not load.
    pub fn calling_thread_device(&self) -> Result<Option<u32>, Error> {
        if self.ascend_mode == AscendMode::Off || self.ascend.device_id.is_some() {
            return Ok(None);
        }
        let acl = match crate::device::acl::Acl::load(self.ascend.acl_lib.as_deref()) {
            Ok(acl) => acl,
            Err(_) if self.ascend_mode == AscendMode::Auto => return Ok(None),
            Err(e) => return Err(e),
        };
        let d = acl.device()?;
        Ok(u32::try_from(d).ok())
    }

    /// The validated HIXL string options, by canonical key.
    pub fn hixl_options(&self) -> &BTreeMap<String, String> {
        &self.hixl
    }

    /// Options from HIXL's string keys (`"BufferPool"`, `"RdmaTrafficClass"`, ...; the `adxl.`
    /// prefixed synonyms too) and hixl's own (`"hixl.MaxRegions"`, `"hixl.MaxLanes"`,
    /// `"hixl.ConnectTimeoutMs"`, `"hixl.ServerIoTimeoutMs"`, `"hixl.FinalizeTimeoutMs"`,
    /// `"hixl.HeartbeatMs"`: the heartbeat interval, `"0"` for none; `"hixl.PrefaultBudget"`:
    /// [`Options::prefault_budget`] in bytes, `"0"` for none; `"hixl.ascend.require_device"`:
    /// `"1"` where CANN loads, the device `aclrtGetDevice` reports on the initializing thread
    /// or its error, never device 0 in its place, as HIXL's ADXL and HIXL-CS start).
    ///
    /// # Errors
    /// - [`Error::UnknownOption`] (`PARAM_INVALID`) for a key HIXL does not define;
    /// - [`Error::InvalidOption`] (`PARAM_INVALID`) for a value outside its documented range;
    /// - `EnableUseFabricMem=1` makes a fabric-memory engine ([`Options::fabric_mem`]); HIXL's
    ///   rules for its other options (and the AICPU path, `UNSUPPORTED`) are checked when the
    ///   engine is initialized. `AutoConnect=1` is accepted here and honoured by
    ///   [`crate::compat::Hixl`]; [`Hixl::initialize`](crate::Hixl::initialize) refuses it
    ///   (`UNSUPPORTED`): typed links are explicit.
    pub fn from_pairs<K: AsRef<str>, V: AsRef<str>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, Error> {
        crate::types::options_from_pairs(pairs, Self::set)
    }

    /// Sets one option by its string key; see [`Options::from_pairs`].
    ///
    /// # Errors
    /// As [`Options::from_pairs`].
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), Error> {
        let bad = |problem| Error::invalid_option(key, value, problem);
        let k = crate::transport::ascend::options::canonical_key(key);
        let millis = |v: &str| -> Result<Duration, Error> {
            match v.parse::<u64>() {
                Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
                _ => Err(bad("a positive number of milliseconds")),
            }
        };
        let count = |v: &str| -> Result<usize, Error> {
            match v.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(bad("a positive integer")),
            }
        };
        match k {
            "hixl.ascend.enable" => {
                self.ascend_mode = match value {
                    "auto" => AscendMode::Auto,
                    "1" => AscendMode::On,
                    "0" => AscendMode::Off,
                    _ => return Err(bad("\"auto\", \"1\" or \"0\"")),
                }
            }
            // HIXL's Ascend keys and hixl's own `hixl.ascend.*`: the Ascend backend validates
            _ if crate::transport::ascend::options::is_ascend_key(k) => {
                self.ascend.set(key, value)?;
                // require_device says which device, not whether: Auto stays Auto
                if k.starts_with("hixl.ascend.") && k != "hixl.ascend.require_device" {
                    self.ascend_mode = AscendMode::On;
                }
            }
            "AutoConnect" => match value {
                "0" => self.auto_connect = false,
                "1" => self.auto_connect = true,
                _ => return Err(bad("\"0\" or \"1\"")),
            },
            "hixl.MaxRegions" => self.max_regions = count(value)?,
            "hixl.MaxLanes" => self.max_lanes = count(value)?,
            "hixl.ParallelLanes" => self.parallel_lanes = count(value)?,
            "hixl.PrefaultBudget" => {
                self.prefault_budget = value
                    .parse::<u64>()
                    .map_err(|_| bad("a number of bytes (0: none)"))?;
            }
            "hixl.ConnectTimeoutMs" => self.connect_timeout = millis(value)?,
            "hixl.ServerIoTimeoutMs" => self.server_io_timeout = millis(value)?,
            "hixl.FinalizeTimeoutMs" => self.finalize_timeout = millis(value)?,
            "hixl.HeartbeatMs" => {
                self.heartbeat = match value {
                    "0" => None,
                    v => Some(millis(v)?),
                }
            }
            "hixl.SameHost" => {
                self.same_host = match value {
                    "auto" => SameHost::Auto,
                    "off" => SameHost::Forbid,
                    "require" => SameHost::Require,
                    _ => return Err(bad("\"auto\", \"off\" or \"require\"")),
                }
            }
            "hixl.Ucx" => {
                self.ucx = match value {
                    "off" => Ucx::Off,
                    "auto" => Ucx::Auto,
                    "require" => Ucx::Require,
                    _ => return Err(bad("\"off\", \"auto\" or \"require\"")),
                }
            }
            _ => {
                return Err(Error::UnknownOption {
                    key: key.to_owned(),
                });
            }
        }
        self.hixl.insert(k.to_owned(), value.to_owned());
        Ok(())
    }
}

impl Options {
    /// The engine-wide bounds on pending notifications these options set.
    pub(crate) fn notify_limits(&self) -> crate::notify::NotifyLimits {
        crate::notify::NotifyLimits {
            max_count: self.max_pending_notifies,
            max_bytes: self.max_pending_notify_bytes,
            grace: self.closed_link_notify_grace,
        }
    }

    /// The bounds a serving engine keeps, as these options set them.
    pub(crate) fn server_limits(&self) -> crate::runtime::serve::limits::Limits {
        crate::runtime::serve::limits::Limits {
            max_conns: self.max_server_conns,
            max_conns_per_peer: self.max_server_conns_per_peer,
            max_lanes_per_link: self.max_server_lanes_per_link,
            max_handshakes: self.max_server_handshakes,
            max_handshakes_per_peer: self.max_server_handshakes_per_peer,
            max_threads: self.max_server_threads,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;

    #[test]
    fn hixl_keys_are_validated() {
        let o = Options::from_pairs([
            ("BufferPool", "4:8"),
            ("adxl.RdmaTrafficClass", "132"),
            ("RdmaServiceLevel", "4"),
        ])
        .unwrap();
        assert_eq!(o.hixl_options()["RdmaTrafficClass"], "132");
        for (k, v) in [
            ("RdmaTrafficClass", "130"),
            ("RdmaTrafficClass", "256"),
            ("RdmaServiceLevel", "8"),
            ("BufferPool", "4"),
            ("AutoConnect", "yes"),
            ("LocalCommRes", "version"),
            ("hixl.MaxRegions", "0"),
            ("hixl.PrefaultBudget", "-1"),
            ("hixl.PrefaultBudget", "1GiB"),
        ] {
            let e = Options::from_pairs([(k, v)]).unwrap_err();
            assert!(matches!(e, Error::InvalidOption { .. }), "{k}={v}: {e:?}");
            assert_eq!(e.status(), Status::PARAM_INVALID);
        }
        let e = Options::from_pairs([("NoSuchKey", "1")]).unwrap_err();
        assert!(matches!(e, Error::UnknownOption { ref key } if key == "NoSuchKey"));
        assert_eq!(e.status(), Status::PARAM_INVALID);
        let o = Options::from_pairs([("AutoConnect", "1")]).unwrap();
        assert!(o.auto_connect());
        let e = crate::Hixl::initialize("127.0.0.1", o).unwrap_err();
        assert_eq!(e.status(), Status::UNSUPPORTED);
        let o = Options::from_pairs([("hixl.MaxRegions", "7"), ("hixl.ConnectTimeoutMs", "250")])
            .unwrap();
        assert_eq!(o.max_regions, 7);
        assert_eq!(o.connect_timeout, Duration::from_millis(250));
        assert_eq!(Options::default().prefault_budget, 1 << 30);
        for (v, bytes) in [("0", 0), ("16777216", 16 << 20)] {
            let o = Options::from_pairs([("hixl.PrefaultBudget", v)]).unwrap();
            assert_eq!(o.prefault_budget, bytes, "{v}");
        }
        let o = Options::from_pairs([("hixl.HeartbeatMs", "150")]).unwrap();
        assert_eq!(o.heartbeat, Some(Duration::from_millis(150)));
        assert_eq!(
            Options::from_pairs([("hixl.HeartbeatMs", "0")])
                .unwrap()
                .heartbeat,
            None
        );
    }

    #[test]
    fn ascend_is_auto_by_default_and_chosen_by_its_keys() {
        assert_eq!(Options::default().ascend_mode, AscendMode::Auto);
        assert!(!Options::default().uses_ascend());
        for (v, mode) in [
            ("auto", AscendMode::Auto),
            ("1", AscendMode::On),
            ("0", AscendMode::Off),
        ] {
            let o = Options::from_pairs([("hixl.ascend.enable", v)]).unwrap();
            assert_eq!(o.ascend_mode, mode, "{v}");
        }
        let e = Options::from_pairs([("hixl.ascend.enable", "yes")]).unwrap_err();
        assert!(matches!(e, Error::InvalidOption { .. }), "{e:?}");
        assert_eq!(e.status(), Status::PARAM_INVALID);
        // any other hixl.ascend.* key asks for Ascend
        let o = Options::from_pairs([("hixl.ascend.device_id", "2")]).unwrap();
        assert_eq!(o.ascend_mode, AscendMode::On);
        assert!(o.uses_ascend());
        // HIXL's own keys do not change the mode
        let o = Options::from_pairs([("RdmaTrafficClass", "8")]).unwrap();
        assert_eq!(o.ascend_mode, AscendMode::Auto);
        // nor does require_device, which says which device, not whether (ADXL and HIXL-CS
        // set it, on hosts with and without CANN alike)
        for (v, want) in [("1", true), ("0", false)] {
            let o = Options::from_pairs([("hixl.ascend.require_device", v)]).unwrap();
            assert_eq!(
                (o.ascend_mode, o.ascend.require_device),
                (AscendMode::Auto, want)
            );
        }
        let e = Options::from_pairs([("hixl.ascend.require_device", "yes")]).unwrap_err();
        assert_eq!(e.status(), Status::PARAM_INVALID);
        // where the engine would not use CANN, there is no device to read
        let off = Options::from_pairs([
            ("hixl.ascend.enable", "0"),
            ("hixl.ascend.require_device", "1"),
        ])
        .unwrap();
        assert_eq!(off.calling_thread_device().unwrap(), None);
    }
}
