//! LLM-DataDist's plain types: roles, placements, data types, cache descriptions and keys,
//! cluster addresses, layer ranges, and its status codes (numeric values as CANN's
//! `llm_error_codes.h` and `llm_datadist.h`).

use std::fmt;

/// An LLM-DataDist status code (`llm_datadist::Status`, a `uint32_t`): `LLM_SUCCESS` 0,
/// `LLM_FAILED` 0xFFFFFFFF, the rest `0x5010B000 + n` as CANN defines them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LlmStatus(pub u32);

macro_rules! llm_codes {
    ($($name:ident = $value:expr, $doc:literal;)*) => {
        impl LlmStatus {
            $(#[doc = $doc] pub const $name: LlmStatus = LlmStatus($value);)*
            /// Every code this build knows, with its CANN name.
            pub const ALL: &'static [(&'static str, LlmStatus)] = &[$((stringify!($name), LlmStatus::$name)),*];
        }
    };
}

llm_codes! {
    LLM_SUCCESS = 0, "Success.";
    LLM_FAILED = 0xFFFF_FFFF, "A failure with no more specific code (`ge::FAILED`).";
    LLM_WAIT_PROC_TIMEOUT = 0x5010_B001, "A wait for a process timed out.";
    LLM_KV_CACHE_NOT_EXIST = 0x5010_B002, "No such cache (locally, or in the peer's table).";
    LLM_REPEAT_REQUEST = 0x5010_B003, "A request repeated.";
    LLM_REQUEST_ALREADY_COMPLETED = 0x5010_B004, "The request completed already.";
    LLM_PARAM_INVALID = 0x5010_B005, "A bad argument.";
    LLM_ENGINE_FINALIZED = 0x5010_B006, "The instance was finalized.";
    LLM_NOT_YET_LINK = 0x5010_B007, "No link to that cluster.";
    LLM_ALREADY_LINK = 0x5010_B008, "A link to that cluster exists.";
    LLM_LINK_FAILED = 0x5010_B009, "Linking failed.";
    LLM_UNLINK_FAILED = 0x5010_B00A, "Unlinking failed.";
    LLM_NOTIFY_PROMPT_UNLINK_FAILED = 0x5010_B00B, "Telling the prompt side of an unlink failed.";
    LLM_CLUSTER_NUM_EXCEED_LIMIT = 0x5010_B00C, "More clusters than one call (or instance) takes.";
    LLM_PROCESSING_LINK = 0x5010_B00D, "A link to that cluster is being made.";
    LLM_DEVICE_OUT_OF_MEMORY = 0x5010_B00E, "Device memory ran out.";
    LLM_PREFIX_ALREADY_EXIST = 0x5010_B00F, "The prefix exists.";
    LLM_PREFIX_NOT_EXIST = 0x5010_B010, "No such prefix.";
    LLM_SEQ_LEN_OVER_LIMIT = 0x5010_B011, "A sequence longer than allowed.";
    LLM_NO_FREE_BLOCK = 0x5010_B012, "No free block.";
    LLM_BLOCKS_OUT_OF_MEMORY = 0x5010_B013, "Blocks ran out of memory.";
    LLM_CACHE_INCOMPATIBLE = 0x5010_B014, "Two caches whose layouts do not match.";
    LLM_CACHE_KEY_ALREADY_EXIST = 0x5010_B015, "The cache key exists.";
    LLM_COPY_CACHE_FAILED = 0x5010_B016, "A cache copy failed.";
    LLM_CACHE_ID_ALREADY_EXIST = 0x5010_B017, "The cache id exists.";
    LLM_EXIST_LINK = 0x5010_B018, "Links exist (and the call needs none).";
    LLM_FEATURE_NOT_ENABLED = 0x5010_B019, "Not available in this configuration.";
    LLM_TIMEOUT = 0x5010_B01A, "Timed out.";
    LLM_LINK_BUSY = 0x5010_B01B, "The link is busy.";
    LLM_OUT_OF_MEMORY = 0x5010_B01C, "Memory ran out.";
}

impl LlmStatus {
    /// The code's value.
    pub const fn code(self) -> u32 {
        self.0
    }
    /// Its CANN name (`"LLM_PARAM_INVALID"`), if it is one of LLM-DataDist's.
    pub fn name(self) -> Option<&'static str> {
        Self::ALL.iter().find(|(_, s)| *s == self).map(|(n, _)| *n)
    }
    /// The LLM-DataDist code for an engine status, as the `hixl` backend maps them: HIXL's
    /// `PARAM_INVALID` → `LLM_PARAM_INVALID`, `TIMEOUT` → `LLM_TIMEOUT`, `NOT_CONNECTED` →
    /// `LLM_NOT_YET_LINK`, `ALREADY_CONNECTED` → `LLM_ALREADY_LINK`, `UNSUPPORTED` →
    /// `LLM_FEATURE_NOT_ENABLED`, `RESOURCE_EXHAUSTED` → `LLM_OUT_OF_MEMORY`, everything else
    /// `LLM_FAILED`.
    pub fn of_engine(s: crate::Status) -> LlmStatus {
        match s {
            crate::Status::SUCCESS => Self::LLM_SUCCESS,
            crate::Status::PARAM_INVALID => Self::LLM_PARAM_INVALID,
            crate::Status::TIMEOUT => Self::LLM_TIMEOUT,
            crate::Status::NOT_CONNECTED => Self::LLM_NOT_YET_LINK,
            crate::Status::ALREADY_CONNECTED => Self::LLM_ALREADY_LINK,
            crate::Status::UNSUPPORTED => Self::LLM_FEATURE_NOT_ENABLED,
            crate::Status::RESOURCE_EXHAUSTED => Self::LLM_OUT_OF_MEMORY,
            _ => Self::LLM_FAILED,
        }
    }
}

impl fmt::Display for LlmStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} ({:#x})", self.0),
            None => write!(f, "{:#x}", self.0),
        }
    }
}

/// An LLM-DataDist call that failed: its status and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct Error {
    /// The status code the call returns.
    pub status: LlmStatus,
    /// What went wrong.
    pub message: String,
}

impl Error {
    /// An error with this status and message.
    pub fn new(status: LlmStatus, message: impl Into<String>) -> Self {
        Error {
            status,
            message: message.into(),
        }
    }
    /// `LLM_PARAM_INVALID` with this message.
    pub fn param(message: impl Into<String>) -> Self {
        Self::new(LlmStatus::LLM_PARAM_INVALID, message)
    }
}

impl From<crate::Error> for Error {
    fn from(e: crate::Error) -> Self {
        Error::new(LlmStatus::of_engine(e.status()), e.to_string())
    }
}

/// The results of LLM-DataDist's calls.
pub type Result<T> = std::result::Result<T, Error>;

/// A C-valued enum of LLM-DataDist's: the declaration and its value both ways
/// (`from_value`, `value`), each variant's value written once.
macro_rules! valued {
    (
        $(#[$m:meta])*
        pub enum $name:ident: $repr:ident {
            $($(#[$vm:meta])* $var:ident = $val:literal,)*
        }
    ) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr($repr)]
        pub enum $name {
            $($(#[$vm])* $var = $val,)*
        }

        impl $name {
            /// The variant for its value, if there is one.
            pub fn from_value(v: $repr) -> Option<Self> {
                match v {
                    $($val => Some(Self::$var),)*
                    _ => None,
                }
            }
            /// Its value.
            pub fn value(self) -> $repr {
                self as $repr
            }
        }
    };
}
pub(crate) use valued;

valued! {
    /// A cluster's role (`llm_datadist::LlmRole`): a prompt (prefill) side, a decoder side, or
    /// both. It says who pulls and who pushes in the caller's design; links work both ways in any
    /// role (as upstream's).
    pub enum Role: i32 {
        /// `kPrompt` = 1.
        Prompt = 1,
        /// `kDecoder` = 2.
        Decoder = 2,
        /// `kMix` = 3.
        Mix = 3,
    }
}

valued! {
    /// Where a cache's tensors live (`CachePlacement`: `kHost` 0, `kDevice` 1).
    pub enum Placement: u32 {
        /// Host memory.
        Host = 0,
        /// Device memory (Ascend; on the ACL/HCCL test double without hardware).
        Device = 1,
    }
}

impl Placement {
    /// The engine's memory type for it.
    pub fn mem_type(self) -> crate::MemType {
        match self {
            Placement::Host => crate::MemType::Host,
            Placement::Device => crate::MemType::Device,
        }
    }
}

/// A tensor element type (`ge::DataType`, GE's numeric values), and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataType(pub i32);

impl DataType {
    /// `DT_FLOAT` (4 bytes).
    pub const FLOAT: DataType = DataType(0);
    /// `DT_FLOAT16` (2 bytes).
    pub const FLOAT16: DataType = DataType(1);
    /// `DT_INT8`.
    pub const INT8: DataType = DataType(2);
    /// `DT_INT32`.
    pub const INT32: DataType = DataType(3);
    /// `DT_UINT8`.
    pub const UINT8: DataType = DataType(4);
    /// `DT_INT16`.
    pub const INT16: DataType = DataType(6);
    /// `DT_UINT16`.
    pub const UINT16: DataType = DataType(7);
    /// `DT_UINT32`.
    pub const UINT32: DataType = DataType(8);
    /// `DT_INT64`.
    pub const INT64: DataType = DataType(9);
    /// `DT_UINT64`.
    pub const UINT64: DataType = DataType(10);
    /// `DT_DOUBLE`.
    pub const DOUBLE: DataType = DataType(11);
    /// `DT_BOOL`.
    pub const BOOL: DataType = DataType(12);
    /// `DT_BF16`.
    pub const BF16: DataType = DataType(27);
    /// `DT_UNDEFINED`.
    pub const UNDEFINED: DataType = DataType(28);

    /// Bytes per element, for the types a KV cache holds; `None` for the others (strings,
    /// sub-byte and complex types, `DT_UNDEFINED`), which a cache description refuses.
    pub fn size(self) -> Option<u64> {
        Some(match self.0 {
            2 | 4 | 12 => 1,     // INT8, UINT8, BOOL
            1 | 6 | 7 | 27 => 2, // FLOAT16, INT16, UINT16, BF16
            0 | 3 | 8 => 4,      // FLOAT, INT32, UINT32
            9..=11 => 8,         // INT64, UINT64, DOUBLE
            18 | 21 => 1,        // QINT8, QUINT8
            19 | 22 => 2,        // QINT16, QUINT16
            20 => 4,             // QINT32
            34..=37 => 1,        // HIFLOAT8, FLOAT8_E5M2, FLOAT8_E4M3FN, FLOAT8_E8M0
            _ => return None,
        })
    }
}

valued! {
    /// What a cache is, as a peer addresses it.
    pub enum CacheKind: u32 {
        /// Batches of sequences (`shape[batch_dim]` batches): pulled and pushed by batch index.
        Cache = 0,
        /// Blocks (`shape[0]` blocks, paged attention): pulled and pushed by block index.
        Blocks = 1,
        /// Both (the C++ API's `RegisterKvCache`): `shape[0]` batches that are also blocks.
        Mix = 2,
    }
}

/// A cache's description (`CacheDesc`): `num_tensors` tensors of `shape` elements of
/// `data_type` each, at `placement`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheDesc {
    /// Where the tensors live.
    pub placement: Placement,
    /// How many tensors (typically two per layer: K and V).
    pub num_tensors: u32,
    /// The element type.
    pub data_type: DataType,
    /// Each tensor's shape; `shape[0]` is the number of blocks (or batches).
    pub shape: Vec<i64>,
}

impl CacheDesc {
    /// Bytes of one tensor: the product of the shape times the element size.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` for an empty shape or one of 32 dimensions or more, a dimension
    /// below 1, an element type a cache cannot hold, or a size past `u64`.
    pub fn tensor_size(&self) -> Result<u64> {
        if self.shape.is_empty() || self.shape.len() >= 32 {
            return Err(Error::param(format!(
                "a cache's shape has 1 to 31 dimensions, not {}",
                self.shape.len()
            )));
        }
        let elem = self.data_type.size().ok_or_else(|| {
            Error::param(format!(
                "data type {} cannot be a cache's element type",
                self.data_type.0
            ))
        })?;
        let mut n = elem;
        for &d in &self.shape {
            if d < 1 {
                return Err(Error::param(format!(
                    "shape {:?}: every dimension is at least 1",
                    self.shape
                )));
            }
            n = n
                .checked_mul(d as u64)
                .ok_or_else(|| Error::param(format!("shape {:?} overflows", self.shape)))?;
        }
        Ok(n)
    }
}

/// How a peer's cache is named in a pull or push: by its cache id (and, for a pull of batches,
/// the batch index), or by the key it was registered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RemoteCache {
    /// `CacheIndex` / `CacheKeyByIdAndIndex`: cache `cache_id` of `cluster_id`, batch
    /// `batch_index`.
    ById {
        /// The peer's cluster.
        cluster_id: u64,
        /// Its cache id (from 1).
        cache_id: i64,
        /// The batch (0 for blocks).
        batch_index: u32,
    },
    /// `BlocksCacheKey`: the blocks cache `cluster_id` registered under `model_id`.
    Blocks {
        /// The peer's cluster.
        cluster_id: u64,
        /// The model id of its key.
        model_id: u64,
    },
    /// `CacheKey`: the cache `cluster_id` registered for request `req_id` of `model_id`.
    Request {
        /// The peer's cluster.
        cluster_id: u64,
        /// The request id.
        req_id: u64,
        /// The model id.
        model_id: u64,
    },
}

impl RemoteCache {
    /// The peer's cluster.
    pub fn cluster_id(&self) -> u64 {
        match *self {
            RemoteCache::ById { cluster_id, .. }
            | RemoteCache::Blocks { cluster_id, .. }
            | RemoteCache::Request { cluster_id, .. } => cluster_id,
        }
    }
}

/// A key a local cache is registered under, for peers to find it by (`BlocksCacheKey`,
/// `CacheKey`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// The request id (`u64::MAX` for a blocks cache's key).
    pub req_id: u64,
    /// The model id.
    pub model_id: u64,
}

/// Layers of a pull or push (`KvCacheExtParam`): tensors `first * per_layer ..` of layers
/// `first..=last`, on each side; `None` for every tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Layers {
    /// The source's layers (`src_layer_range`), inclusive.
    pub src: Option<(u32, u32)>,
    /// The destination's layers (`dst_layer_range`), inclusive.
    pub dst: Option<(u32, u32)>,
    /// Tensors per layer (`tensor_num_per_layer`, 2 by default: K and V); 0 is refused.
    pub per_layer: u32,
}

impl Layers {
    /// Every tensor, two per layer.
    pub fn all() -> Self {
        Layers {
            src: None,
            dst: None,
            per_layer: 2,
        }
    }
}

/// The address of one side of a cluster link (`IpInfo`): an IPv4 or IPv6 address and a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IpInfo {
    /// The address.
    pub ip: std::net::IpAddr,
    /// The port (the peer's `llm.ListenIpInfo` port).
    pub port: u16,
}

/// A peer cluster to link or unlink (`ClusterInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterInfo {
    /// The peer's cluster id.
    pub remote_cluster_id: u64,
    /// The peer's role (informative, as upstream's).
    pub remote_role_type: i32,
    /// This side's addresses (informative).
    pub local_ip_infos: Vec<IpInfo>,
    /// The peer's listen address: exactly one to link (none needed to unlink with `force`).
    pub remote_ip_infos: Vec<IpInfo>,
}

impl ClusterInfo {
    /// Cluster `remote_cluster_id` listening at `addr`: what a link to it needs (no role, no
    /// local address).
    pub fn at(remote_cluster_id: u64, addr: std::net::SocketAddr) -> Self {
        ClusterInfo {
            remote_cluster_id,
            remote_role_type: 0,
            local_ip_infos: Vec::new(),
            remote_ip_infos: vec![IpInfo {
                ip: addr.ip(),
                port: addr.port(),
            }],
        }
    }
}
