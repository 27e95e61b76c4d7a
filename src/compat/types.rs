//! HIXL's C++ API types and constants as the compat layer takes and returns them: option keys,
//! capabilities, memory and transfer descriptors, request statuses, notifications.

use crate::{Access, MemType};

/// Whether a feature is supported ([`get_capability`]).
pub const FEATURE_SUPPORTED: i32 = 1;
/// Whether a feature is supported ([`get_capability`]).
pub const FEATURE_NOT_SUPPORTED: i32 = 0;

/// HIXL's option keys (`OPTION_*` in `hixl_types.h`).
pub const OPTION_ENABLE_USE_FABRIC_MEM: &str = "EnableUseFabricMem";
/// See [`OPTION_ENABLE_USE_FABRIC_MEM`].
pub const OPTION_RDMA_TRAFFIC_CLASS: &str = "RdmaTrafficClass";
/// See [`OPTION_ENABLE_USE_FABRIC_MEM`].
pub const OPTION_RDMA_SERVICE_LEVEL: &str = "RdmaServiceLevel";
/// See [`OPTION_ENABLE_USE_FABRIC_MEM`].
pub const OPTION_BUFFER_POOL: &str = "BufferPool";
/// See [`OPTION_ENABLE_USE_FABRIC_MEM`].
pub const OPTION_GLOBAL_RESOURCE_CONFIG: &str = "GlobalResourceConfig";
/// See [`OPTION_ENABLE_USE_FABRIC_MEM`].
pub const OPTION_AUTO_CONNECT: &str = "AutoConnect";
/// See [`OPTION_ENABLE_USE_FABRIC_MEM`].
pub const OPTION_LOCAL_COMM_RES: &str = "LocalCommRes";

/// HIXL's `MemDesc`: a caller-managed address range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemDesc {
    /// Start address.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// Register for local use only: peers may neither READ nor WRITE it (HIXL `local_only`).
    pub local_only: bool,
}

/// A registered region (HIXL `MemHandle`): a non-zero id.
pub type MemHandle = u64;
/// An async request (HIXL `TransferReq`): a non-zero id.
pub type TransferReq = u64;

/// HIXL's `TransferOpDesc`: `len` bytes between a local and a remote address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct TransferOpDesc {
    /// Address in this process, inside a region registered with this engine.
    pub local_addr: usize,
    /// Address in the peer, inside a region of its table.
    pub remote_addr: usize,
    /// Bytes to move.
    pub len: usize,
}

/// A block-indexed transfer's geometry (an extension of HIXL, `hixl_block_desc` in C): block
/// `k` of the local side is `block_size` bytes at `local_addr + k * local_stride`, inside the
/// region registered with this engine that holds `local_addr`; block `k` of the remote side is
/// at `remote_addr + k * remote_stride`, inside the region of the peer's table that holds
/// `remote_addr`. A stride of 0 means the block size (blocks back to back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct BlockDesc {
    /// Address of local block 0.
    pub local_addr: usize,
    /// Address of remote block 0, in the peer.
    pub remote_addr: usize,
    /// Bytes per block.
    pub block_size: u64,
    /// Bytes from one local block to the next (0: `block_size`).
    pub local_stride: u64,
    /// Bytes from one remote block to the next (0: `block_size`).
    pub remote_stride: u64,
}

/// HIXL's `TransferStatus` (C values 0..=3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum TransferStatus {
    /// Queued or running.
    Waiting = 0,
    /// Done.
    Completed = 1,
    /// Its deadline passed.
    Timeout = 2,
    /// It failed (or the id is unknown).
    Failed = 3,
}

/// HIXL's `FeatureType` for [`get_capability`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum FeatureType {
    /// Transfers connect on demand (`AutoConnect=1`): supported.
    AutoConnect = 0,
    /// HIXL's client/server C API (`hixl_cs.h`, hcomm types): not supported.
    ClientServerComm = 1,
}

impl FeatureType {
    /// The feature with this C value.
    pub fn from_i32(v: i32) -> Option<Self> {
        match v {
            0 => Some(Self::AutoConnect),
            1 => Some(Self::ClientServerComm),
            _ => None,
        }
    }
}

/// HIXL's `GetCapability`: [`FEATURE_SUPPORTED`] or [`FEATURE_NOT_SUPPORTED`].
pub fn get_capability(feature: FeatureType) -> i32 {
    match feature {
        FeatureType::AutoConnect => FEATURE_SUPPORTED,
        FeatureType::ClientServerComm => FEATURE_NOT_SUPPORTED,
    }
}

/// HIXL's `GetCapability` of a feature's C value: as [`get_capability`], and
/// [`FEATURE_NOT_SUPPORTED`] for a value no feature has.
///
/// # Errors
/// `PARAM_INVALID` for a negative value (HIXL's check: `hixl.cc`).
pub fn capability_of(feature: i32) -> Result<i32, super::Error> {
    if feature < 0 {
        return Err(super::Error::new(
            crate::Status::PARAM_INVALID,
            format!("feature type {feature} is negative"),
        ));
    }
    Ok(FeatureType::from_i32(feature).map_or(FEATURE_NOT_SUPPORTED, get_capability))
}

/// HIXL's `TransferArgs`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TransferArgs {
    /// Returned with the request's result (HIXL `user_data`, a pointer there).
    pub user_data: u64,
}

/// HIXL's `GetTransferStatusArgs`.
#[derive(Debug, Clone, Copy)]
pub struct GetTransferStatusArgs {
    /// Most results to return.
    pub max_query_count: u32,
    /// Leave out requests still waiting.
    pub skip_waiting: bool,
}

impl Default for GetTransferStatusArgs {
    fn default() -> Self {
        Self {
            max_query_count: u32::MAX,
            skip_waiting: false,
        }
    }
}

/// HIXL's `TransferResult`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferResult {
    /// The request.
    pub req: TransferReq,
    /// Its [`TransferArgs::user_data`].
    pub user_data: u64,
    /// Its status.
    pub status: TransferStatus,
}

/// HIXL's `NotifyDesc`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NotifyDesc {
    /// The notification's name.
    pub name: String,
    /// The message.
    pub notify_msg: String,
}

/// One region of a peer's table ([`Hixl::remote_regions`](super::Hixl::remote_regions)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRegionDesc {
    /// Start address in the peer's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Memory type.
    pub mem_type: MemType,
    /// What the peer lets this engine do with it.
    pub access: Access,
    /// The transport that moves this engine's batches on it (an extension: `SameHost` for a
    /// same-host peer's [`alloc_host_mem`](super::Hixl::alloc_host_mem) buffers, `Tcp` for its
    /// caller-managed memory; see [`crate::RemoteRegion::transport`]).
    pub transport: crate::TransportKind,
}
