//! HCCL communicators: the [`CommConfig`] they are made with, the [`Comm`] handle, and the
//! calls on one (init under the process-wide lock, bind/unbind memory, prepare).

use std::ffi::{CString, c_int, c_void};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::sys as ffi;
use super::{GlobalMem, Hccl, check};
use crate::device::take_apart;
use crate::error::Error;
use crate::sync::lock;

/// Serialises `HcclCommInitClusterInfoMemConfig` in this process: HCCL does not support
/// parallel communicator initialisation (HIXL guards it with a global mutex too).
static INIT_LOCK: Mutex<()> = Mutex::new(());

/// Communicator settings, applied on top of HIXL's defaults (see
/// [`HcclCommConfig::hixl_default`](ffi::HcclCommConfig::hixl_default)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CommConfig {
    /// `hcclBufferSize` in MB (HIXL: 200).
    pub(crate) buffer_size_mb: u32,
    /// `hcclRdmaTrafficClass` (`RdmaTrafficClass`), unset by default.
    pub(crate) traffic_class: Option<u32>,
    /// `hcclRdmaServiceLevel` (`RdmaServiceLevel`), unset by default.
    pub(crate) service_level: Option<u32>,
    /// `hcclCommName` (HIXL: `hixl_<client>_<server>`; 1 to 127 bytes, no NUL). HCCL refuses
    /// an empty name and a name a live communicator of this process already has (`HCCL_E_PARA`).
    pub(crate) comm_name: String,
}

impl Default for CommConfig {
    fn default() -> Self {
        Self {
            buffer_size_mb: ffi::HCCL_COMM_DEFAULT_BUFFSIZE,
            traffic_class: None,
            service_level: None,
            comm_name: String::new(),
        }
    }
}

impl CommConfig {
    /// The C struct.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for an empty name, a name over 127 bytes or containing NUL.
    pub(crate) fn to_ffi(&self) -> Result<ffi::HcclCommConfig, Error> {
        let mut c = ffi::HcclCommConfig::hixl_default();
        c.buffer_size = self.buffer_size_mb;
        c.rdma_traffic_class = self.traffic_class.unwrap_or(ffi::HCCL_COMM_CONFIG_NOT_SET);
        c.rdma_service_level = self.service_level.unwrap_or(ffi::HCCL_COMM_CONFIG_NOT_SET);
        let name = self.comm_name.as_bytes();
        if name.is_empty() || name.len() >= ffi::COMM_NAME_MAX_LENGTH || name.contains(&0) {
            return Err(Error::InvalidOption {
                key: "hcclCommName".into(),
                value: self.comm_name.clone(),
                problem: "1 to 127 bytes and no NUL",
            });
        }
        for (d, s) in c.comm_name.iter_mut().zip(name) {
            *d = *s as std::ffi::c_char;
        }
        Ok(c)
    }
}

/// An `HcclComm`, destroyed on drop.
#[derive(Debug)]
pub(crate) struct Comm {
    hccl: Hccl,
    raw: NonNull<c_void>,
    #[cfg(test)]
    rank: u32,
}

// SAFETY: an HcclComm may be used from any thread (HIXL's channels do); `!Sync` keeps calls on
// one communicator from running concurrently from safe code.
unsafe impl Send for Comm {}

impl Comm {
    /// This process's rank in the communicator.
    #[cfg(test)]
    pub(crate) fn rank(&self) -> u32 {
        self.rank
    }
    /// The raw handle.
    pub(crate) fn as_raw(&self) -> *mut c_void {
        self.raw.as_ptr()
    }

    /// Destroys it now, reporting a failure (dropping destroys too, logging failures).
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn destroy(self) -> Result<(), Error> {
        let (hccl, raw) = take_apart!(self => hccl, raw);
        hccl.destroy_raw(raw)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if let Err(e) = self.hccl.destroy_raw(self.raw) {
            tracing::warn!("HcclCommDestroy failed: {e}");
        }
    }
}

impl Hccl {
    fn destroy_raw(&self, comm: NonNull<c_void>) -> Result<(), Error> {
        // SAFETY: the communicator came from HcclCommInitClusterInfoMemConfig and is destroyed
        // once.
        let rc = unsafe { (self.api.comm_destroy)(comm.as_ptr()) };
        check("HcclCommDestroy", rc, "disconnect", "", Instant::now())
    }

    /// `HcclCommInitClusterInfoMemConfig(rank_table, rank, cfg)`: a communicator over the ranks
    /// of `rank_table` (HCCL rank-table JSON, version "1.0" or "1.2"), this process being
    /// `rank`. Holds the process-wide init lock for the call.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a rank table containing NUL or a bad comm name;
    /// [`Error::Timeout`] / [`Error::Native`].
    pub(crate) fn init_comm(
        &self,
        rank_table: &str,
        rank: u32,
        cfg: &CommConfig,
    ) -> Result<Comm, Error> {
        let table = CString::new(rank_table).map_err(|_| Error::InvalidOption {
            key: "rank_table".into(),
            value: rank_table.to_owned(),
            problem: "JSON without NUL bytes",
        })?;
        let mut c = cfg.to_ffi()?;
        let mut comm: *mut c_void = std::ptr::null_mut();
        let start = Instant::now();
        let serial = lock(&INIT_LOCK);
        // SAFETY: all pointers are valid for the call; `c` is a fully initialised v5 config.
        let rc = unsafe {
            (self.api.comm_init_cluster_info_mem_config)(table.as_ptr(), rank, &mut c, &mut comm)
        };
        drop(serial);
        check("HcclCommInitClusterInfoMemConfig", rc, "connect", "", start)?;
        let raw = NonNull::new(comm).ok_or_else(|| Error::Native {
            library: "hccl",
            call: "HcclCommInitClusterInfoMemConfig",
            code: 0,
            detail: "HCCL_SUCCESS with a null communicator".into(),
        })?;
        Ok(Comm {
            hccl: self.clone(),
            raw,
            #[cfg(test)]
            rank,
        })
    }

    /// `HcclCommBindMem`: makes a registration usable through `comm`.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn bind(&self, comm: &Comm, mem: &GlobalMem) -> Result<(), Error> {
        // SAFETY: both handles are alive (borrowed).
        let rc = unsafe { (self.api.comm_bind_mem)(comm.as_raw(), mem.as_raw()) };
        check("HcclCommBindMem", rc, "connect", "", Instant::now())
    }

    /// `HcclCommUnbindMem`.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn unbind(&self, comm: &Comm, mem: &GlobalMem) -> Result<(), Error> {
        // SAFETY: both handles are alive (borrowed).
        let rc = unsafe { (self.api.comm_unbind_mem)(comm.as_raw(), mem.as_raw()) };
        check("HcclCommUnbindMem", rc, "disconnect", "", Instant::now())
    }

    /// `HcclCommPrepare` (full mesh): connects the data plane and exchanges bound memory.
    /// Blocks up to `timeout`, rounded up to whole seconds as HIXL does (`ceil(ms / 1000)`).
    ///
    /// # Errors
    /// [`Error::Timeout`] (`op: "connect"`, `peer`) for `HCCL_E_TIMEOUT`; [`Error::Native`].
    pub(crate) fn prepare(&self, comm: &Comm, timeout: Duration, peer: &str) -> Result<(), Error> {
        let cfg = ffi::HcclPrepareConfig {
            topo_type: ffi::HCCL_TOPO_FULLMESH,
            rsvd0: 0,
            rsvd1: 0,
            rsvd2: 0,
        };
        let secs = c_int::try_from(timeout.as_millis().div_ceil(1000).max(1)).unwrap_or(c_int::MAX);
        let start = Instant::now();
        // SAFETY: the communicator is alive (borrowed) and `cfg` is valid for the call.
        let rc = unsafe { (self.api.comm_prepare)(comm.as_raw(), &cfg, secs) };
        check("HcclCommPrepare", rc, "connect", peer, start)
    }
}
