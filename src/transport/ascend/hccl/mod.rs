//! HCCL's path of the Ascend transport, HIXL's default engine: one-sided transfers between
//! device (and host) memory over a two-rank HCCL communicator per link.
//!
//! An engine with Ascend (where CANN loads, [`Options::ascend`](crate::Options::ascend) or the
//! `hixl.ascend.*` keys) owns a [`Runtime`] (`runtime.rs`): its device (the device floor,
//! `crate::device`) and HCCL. Every region of such an engine is registered with
//! `HcclRegisterGlobalMem` ([`AscendBackend`]'s `register`, `backend.rs`); links between two
//! Ascend engines move bytes with `HcclBatchPut`/`HcclBatchGet` (`link.rs`, over the rank table
//! of `rank_table.rs`); LLM-DataDist's link by an explicit rank table is `rank_link.rs`.
//!
//! Below them, thin wrappers over HCCL's one-sided API (HCCL's result level over its table,
//! `sys.rs`): global memory registration, communicators built from a rank table, and batched
//! put/get on an ACL stream. Failures become [`Error::Timeout`] for `HCCL_E_TIMEOUT`
//! (`TIMEOUT`) and [`Error::Native`] with `library: "hccl"` otherwise (`FAILED`). A transfer
//! follows HIXL's `CommChannel`: the descriptors are issued in calls of at most
//! [`MAX_DESCS_PER_CALL`] (64 on Ascend950, see [`Soc`](runtime::Soc)), then the stream is synchronised with
//! the caller's timeout.
//!
//! Two rules of HCCL are process-wide and kept here: communicators are created one at a time
//! ([`Hccl::init_comm`] holds a process-wide lock, as HIXL's `CommChannel` does, because HCCL
//! does not support parallel `HcclCommInitClusterInfoMemConfig`), and `HcclRegisterGlobalMem`
//! has one registry per process (the same range gets the same handle, an overlapping range is
//! refused), so [`Hccl::register_global_mem`] counts references per exact range and deregisters
//! with the last one.
//!
//! Files: `sys` (the table), `mem` (the per-process registry of global memory, [`GlobalMem`]),
//! `comm` (communicators, [`Comm`] and [`CommConfig`]), `exchange` (`HcclExchangeMemDesc`);
//! `runtime`, `backend`, `link`, `rank_table`, `rank_link` as above; this file has the loaded
//! library, the error mapping and the batched transfer.

mod backend;
mod comm;
mod exchange;
mod link;
mod mem;
pub(crate) mod rank_link;
mod rank_table;
mod runtime;
pub(crate) mod sys;

use std::ffi::c_void;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use self::sys::{HcclApi, HcclResult};
use crate::device::acl::{Acl, Stream};
use crate::error::Error;

pub(crate) use self::backend::AscendBackend;
pub(crate) use self::comm::{Comm, CommConfig};
pub(crate) use self::mem::{GlobalMem, MemKind};
pub(crate) use self::runtime::{Runtime, SuperIds, probe};

/// Most descriptors HIXL passes to one `HcclBatchPut`/`HcclBatchGet` (`kMaxOpDescNum`).
pub(crate) const MAX_DESCS_PER_CALL: usize = 256;
/// HCCL's limit per batch call on its V2 one-sided path (Ascend950 / A5).
pub(crate) const MAX_DESCS_PER_CALL_V2: usize = 64;

/// A loaded HCCL. Cheap to clone (shared).
#[derive(Clone, Debug)]
pub(crate) struct Hccl {
    /// The function table.
    api: Arc<HcclApi>,
}

/// One one-sided operation: `len` bytes between `local` (this process) and `remote` (the remote
/// rank's address space).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OneSideDesc {
    /// Local address.
    pub(crate) local: u64,
    /// Remote address.
    pub(crate) remote: u64,
    /// Length in bytes.
    pub(crate) len: u64,
}

/// Which way bytes move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Local → remote (`HcclBatchPut`, HIXL `WRITE`).
    Put,
    /// Remote → local (`HcclBatchGet`, HIXL `READ`).
    Get,
}

impl Direction {
    /// HIXL's name for the operation, as timeouts report it.
    pub(crate) fn op_name(self) -> &'static str {
        match self {
            Self::Put => "WRITE",
            Self::Get => "READ",
        }
    }
}

/// The error for a failed HCCL call: `HCCL_E_TIMEOUT` is [`Error::Timeout`] (for `op` with
/// `peer`), anything else [`Error::Native`].
pub(crate) fn hccl_error(
    call: &'static str,
    code: HcclResult,
    op: &'static str,
    peer: &str,
    elapsed: Duration,
) -> Error {
    if code == sys::HCCL_E_TIMEOUT {
        return Error::Timeout {
            op,
            peer: peer.to_owned(),
            elapsed,
        };
    }
    Error::Native {
        library: "hccl",
        call,
        code: i64::from(code),
        detail: sys::hccl_result_name(code).to_owned(),
    }
}

/// `Ok` for `HCCL_SUCCESS`, else [`hccl_error`] (with the time since `start`).
pub(super) fn check(
    call: &'static str,
    code: HcclResult,
    op: &'static str,
    peer: &str,
    start: Instant,
) -> Result<(), Error> {
    if code == sys::HCCL_SUCCESS {
        Ok(())
    } else {
        Err(hccl_error(call, code, op, peer, start.elapsed()))
    }
}

impl Hccl {
    /// HCCL (see [`HcclApi::load`] for the search order): loaded once per process, shared by
    /// every `Hccl` from then on.
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`].
    pub(crate) fn load(path: Option<&Path>) -> Result<Self, Error> {
        Ok(Self {
            api: HcclApi::load(path)?,
        })
    }

    /// How many times this process opened the HCCL library `name` (once, however often it is
    /// loaded).
    #[cfg(test)]
    pub(crate) fn opened(name: &str) -> usize {
        HcclApi::opened(name)
    }

    /// The name the library was opened by.
    pub(crate) fn library(&self) -> &str {
        self.api.library()
    }

    /// Moves bytes for every descriptor: `HcclBatchPut`/`HcclBatchGet` in calls of at most
    /// `per_call` descriptors on `stream`, then `aclrtSynchronizeStreamWithTimeout` with what is
    /// left of `timeout`. Runs under the stream's context.
    ///
    /// On an error, copies issued by earlier calls may still be queued on the stream (a
    /// stream-sync timeout does not cancel them either): the caller aborts the stream
    /// ([`Acl::abort`]) before it releases any memory they touch.
    ///
    /// # Safety
    /// Every local range must lie in memory registered with HCCL and bound to `comm`, allocated
    /// until this returns and until the stream is drained or aborted; for [`Direction::Get`] no
    /// Rust reference to a local range may be live (HCCL writes it). Remote ranges are the
    /// remote rank's business, but must be registered and bound there.
    ///
    /// # Errors
    /// [`Error::EmptyBatch`]; [`Error::Timeout`] (HCCL or stream-sync timeouts, as
    /// `direction.op_name()` with `peer`); [`Error::Native`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn transfer(
        &self,
        acl: &Acl,
        comm: &Comm,
        remote_rank: u32,
        direction: Direction,
        descs: &[OneSideDesc],
        per_call: usize,
        stream: &Stream,
        timeout: Duration,
        peer: &str,
    ) -> Result<(), Error> {
        if descs.is_empty() {
            return Err(Error::EmptyBatch);
        }
        let per_call = per_call.clamp(1, MAX_DESCS_PER_CALL);
        let start = Instant::now();
        let op = direction.op_name();
        let _guard = acl.enter_if(stream.context())?;
        let (call, f) = match direction {
            Direction::Put => ("HcclBatchPut", self.api.batch_put),
            Direction::Get => ("HcclBatchGet", self.api.batch_get),
        };
        let mut chunk: Vec<sys::HcclOneSideOpDesc> = Vec::with_capacity(per_call.min(descs.len()));
        for part in descs.chunks(per_call) {
            chunk.clear();
            chunk.extend(part.iter().map(|d| sys::HcclOneSideOpDesc {
                local_addr: d.local as usize as *mut c_void,
                remote_addr: d.remote as usize as *mut c_void,
                count: d.len,
                data_type: sys::HCCL_DATA_TYPE_UINT8,
            }));
            let n = u32::try_from(chunk.len()).unwrap_or(u32::MAX);
            // SAFETY: `chunk` holds `n` initialised descriptors and lives across the call; the
            // communicator and stream are alive (borrowed); the caller vouches for the ranges.
            let rc = unsafe {
                f(
                    comm.as_raw(),
                    remote_rank,
                    chunk.as_mut_ptr(),
                    n,
                    stream.as_raw(),
                )
            };
            check(call, rc, op, peer, start)?;
        }
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            // still give the stream a chance to drain: HIXL always synchronises
            return acl.synchronize(stream, Duration::from_millis(1), op, peer);
        }
        acl.synchronize(stream, left, op, peer)
    }
}

/// A region's HCCL registration (`HcclRegisterGlobalMem`, made when it was registered with an
/// engine that has a runtime: [`AscendBackend`]'s `register`), if it has one.
pub(crate) fn hccl_mem(region: &dyn crate::transport::Region) -> Option<&GlobalMem> {
    region
        .registrations()
        .iter()
        .find_map(|r| (**r).downcast_ref::<GlobalMem>())
}

#[cfg(test)]
mod tests;
