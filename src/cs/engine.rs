//! The engine under HIXL-CS: today the runtime-checked engine in HIXL's shape
//! ([`crate::compat::Hixl`]). This is the only file of `cs/` that names `compat`: the server,
//! the client and the batches call these few functions, with CS's types and status codes, so
//! that moving CS onto another engine API is an edit of this file.

use std::time::Duration;

use super::{CompleteStatus, Error, OpDesc};
use crate::compat::{self, MemDesc, TransferArgs, TransferOpDesc, TransferStatus};
use crate::{Access, MemType, Status, TransferOp};

/// A registration with the engine.
pub(super) type Registration = compat::MemHandle;
/// An async batch of the engine.
pub(super) type Request = compat::TransferReq;
/// A host buffer the engine allocated and registered (the published list, a download buffer).
pub(super) type Buffer = compat::HostMem;

/// A region of a peer's table, as a link has it.
#[derive(Debug, Clone, Copy)]
pub(super) struct RemoteRegion {
    pub addr: u64,
    pub len: u64,
    pub mem_type: MemType,
    pub access: Access,
}

/// An engine (finalized when dropped).
pub(super) struct Engine(compat::Hixl);

/// The engine's error with HIXL-CS's codes: the engine's connection statuses are `FAILED`.
pub(super) fn fail(e: compat::Error) -> Error {
    let s = e.status();
    let status = if [
        Status::PARAM_INVALID,
        Status::TIMEOUT,
        Status::RESOURCE_EXHAUSTED,
        Status::UNSUPPORTED,
    ]
    .contains(&s)
    {
        s
    } else {
        Status::FAILED
    };
    Error::with(status, e.message())
}

/// An engine that could not start (or a device that could not be read at Create): ACL's own
/// code where reading the device failed (as upstream's `HIXL_CHK_ACL_RET` on `aclrtGetDevice`
/// returns it), else as [`fail`].
pub(super) fn start_fail(e: compat::Error) -> Error {
    match e.acl_start_code() {
        Some(code) => Error {
            code,
            message: e.message().to_owned(),
        },
        None => fail(e),
    }
}

/// Reads the calling thread's device, as an engine started now with `options` would (a
/// server with a device endpoint does it at Create, as upstream's does), or the error of that
/// (ACL's own code where no device is set).
pub(super) fn check_device(options: &[(String, String)]) -> Result<(), Error> {
    crate::Options::from_pairs(options.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .and_then(|o| o.calling_thread_device())
        .map(drop)
        .map_err(|e| start_fail(e.into()))
}

/// Milliseconds for the engine: at least 1, at most `i32::MAX`.
fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX).max(1)
}

impl Engine {
    /// An engine named `name` (a listen address, or a client's own host) with `options`,
    /// AutoConnect off (a CS client connects explicitly).
    pub(super) fn start(name: &str, mut options: Vec<(String, String)>) -> Result<Engine, Error> {
        let e = compat::Hixl::new();
        options.push(("AutoConnect".into(), "0".into()));
        e.initialize(name, options).map_err(start_fail)?;
        Ok(Engine(e))
    }

    /// A host buffer of `len` bytes that peers may access as `access` says.
    pub(super) fn buffer(&self, len: usize, access: Access) -> Result<Buffer, Error> {
        self.0.alloc_host_mem_with(len, access).map_err(fail)
    }

    /// Registers `len` bytes at `addr` of `typ`; `local_only`: not offered to peers.
    ///
    /// # Safety
    /// The engine's `register_mem` contract: the memory stays valid for reads and writes of any
    /// bytes until it is deregistered or the engine finalized, and peers (unless `local_only`)
    /// and transfers access it meanwhile.
    pub(super) unsafe fn register(
        &self,
        typ: MemType,
        addr: usize,
        len: usize,
        local_only: bool,
    ) -> Result<Registration, Error> {
        let desc = MemDesc {
            addr,
            len,
            local_only,
        };
        // SAFETY: the caller's contract.
        unsafe { self.0.register_mem(desc, typ) }.map_err(fail)
    }

    /// Ends a registration (refused while a transfer uses it).
    pub(super) fn deregister(&self, r: Registration) -> Result<(), Error> {
        self.0.deregister_mem(r).map_err(fail)
    }

    /// Connects to the engine named `remote` within `timeout`.
    pub(super) fn connect(&self, remote: &str, timeout: Duration) -> Result<(), Error> {
        self.0.connect(remote, millis(timeout)).map_err(fail)
    }

    /// Disconnects from `remote` (best effort: a peer that went away is gone all the same).
    pub(super) fn disconnect(&self, remote: &str) {
        let _ = self.0.disconnect(remote, 1000);
    }

    /// The regions of `remote`'s table, as the link got them.
    pub(super) fn remote_regions(&self, remote: &str) -> Result<Vec<RemoteRegion>, Error> {
        let regions = self.0.remote_regions(remote).map_err(fail)?;
        Ok(regions
            .iter()
            .map(|r| RemoteRegion {
                addr: r.addr,
                len: r.len,
                mem_type: r.mem_type,
                access: r.access,
            })
            .collect())
    }

    /// READs the first `buf.len()` bytes at `addr` of `remote` into `buffer`, then copies them
    /// into `buf`.
    ///
    /// # Safety
    /// Nothing else may write `buffer` meanwhile (it is not offered to peers: its access is
    /// [`Access::None`]; the caller serializes its own READs into it).
    pub(super) unsafe fn read(
        &self,
        remote: &str,
        buffer: &Buffer,
        addr: u64,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<(), Error> {
        if buf.len() > buffer.len() {
            return Err(Error::failed("a READ longer than the download buffer"));
        }
        let d = TransferOpDesc {
            local_addr: buffer.addr(),
            remote_addr: addr as usize,
            len: buf.len(),
        };
        self.0
            .transfer_sync(remote, TransferOp::Read, &[d], millis(timeout))
            .map_err(fail)?;
        // SAFETY: the buffer holds buf.len() bytes (checked) while `buffer` lives, that READ
        // returned, and nothing else writes it (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(buffer.as_ptr(), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// A batch to `remote`, waited for within `timeout`.
    pub(super) fn transfer_sync(
        &self,
        remote: &str,
        op: TransferOp,
        descs: &[OpDesc],
        timeout: Duration,
    ) -> Result<(), Error> {
        self.0
            .transfer_sync(remote, op, &descs_of(descs), millis(timeout))
            .map_err(fail)
    }

    /// A batch to `remote`, started (the engine's default deadline).
    pub(super) fn transfer_async(
        &self,
        remote: &str,
        op: TransferOp,
        descs: &[OpDesc],
    ) -> Result<Request, Error> {
        self.0
            .transfer_async(remote, op, &descs_of(descs), TransferArgs::default())
            .map_err(fail)
    }

    /// An async batch's state: a deadline passed or an error is `Failed`.
    pub(super) fn status(&self, r: Request) -> CompleteStatus {
        match self.0.get_transfer_status(r) {
            Ok(TransferStatus::Waiting) => CompleteStatus::Waiting,
            Ok(TransferStatus::Completed) => CompleteStatus::Completed,
            Ok(_) | Err(_) => CompleteStatus::Failed,
        }
    }

    /// Finalizes the engine: its links, listener and registrations end.
    pub(super) fn finalize(&self) {
        self.0.finalize();
    }
}

/// The engine's descriptors of a batch checked already (`batch.rs`: each range inside one
/// registration, so every address and length fits a `usize`).
fn descs_of(descs: &[OpDesc]) -> Vec<TransferOpDesc> {
    descs
        .iter()
        .map(|d| TransferOpDesc {
            local_addr: d.local_addr,
            remote_addr: d.remote_addr as usize,
            len: d.len as usize,
        })
        .collect()
}
