//! The engine under HIXL-CS: the core floor's handle API (`runtime::handle`: an engine, its
//! regions' records, links by remote name through `runtime::peers`, batches given as addresses
//! through `runtime::address`), beside the compat face rather than on it. This is the only file
//! of `cs/` that names the engine: the server, the client and the batches call these few
//! functions, with CS's types and status codes.

use std::sync::Arc;
use std::time::Duration;

use super::{CompleteStatus, Error, OpDesc};
use crate::runtime::address::{self, AddrDesc};
use crate::runtime::handle::{RegionHandle, ReqHandle};
pub(super) use crate::runtime::named::Buffer;
use crate::runtime::named::Named;
use crate::runtime::request::TransferStatus;
use crate::{Access, MemDesc, MemType, Options, Status, TransferOp};

/// The deadline the engine enforces on an async batch (upstream leaves it to the caller,
/// whose status queries never end a request that hangs; as the compat engine's).
const ASYNC_DEADLINE: Duration = Duration::from_secs(60);

/// A registration with the engine.
pub(super) type Registration = RegionHandle;
/// An async batch of the engine.
pub(super) type Request = Arc<ReqHandle>;

/// A region of a peer's table, as a link has it.
pub(super) type RemoteRegion = crate::wire::TableEntry;

/// An engine and its links by remote name (finalized when dropped).
pub(super) struct Engine(Named);

/// The engine's error with HIXL-CS's codes: the engine's connection statuses are `FAILED`.
pub(super) fn fail(e: crate::Error) -> Error {
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
    Error::with(status, e.to_string())
}

/// An engine that could not start (or a device that could not be read at Create): ACL's own
/// code where reading the device failed (as upstream's `HIXL_CHK_ACL_RET` on `aclrtGetDevice`
/// returns it), else as [`fail`].
pub(super) fn start_fail(e: crate::Error) -> Error {
    match e.acl_start_code() {
        Some(code) => Error {
            code,
            message: e.to_string(),
        },
        None => fail(e),
    }
}

/// Reads the calling thread's device, as an engine started now with `options` would (a
/// server with a device endpoint does it at Create, as upstream's does), or the error of that
/// (ACL's own code where no device is set).
pub(super) fn check_device(options: &[(String, String)]) -> Result<(), Error> {
    Options::from_pairs(options.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .and_then(|o| o.calling_thread_device())
        .map(drop)
        .map_err(start_fail)
}

impl Engine {
    /// A client's engine: named `name` (its own host) with `options`, open to links at once;
    /// a CS client connects explicitly.
    pub(super) fn start(name: &str, options: Vec<(String, String)>) -> Result<Engine, Error> {
        let e = Engine::initialize(name, options)?;
        e.open()?;
        Ok(e)
    }

    /// A server's engine: listening on `name` with `options`, but serving nothing until
    /// [`Engine::open`] (a client that connects meanwhile waits for its answer).
    pub(super) fn initialize(name: &str, options: Vec<(String, String)>) -> Result<Engine, Error> {
        let opts = Options::from_pairs(options.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(start_fail)?;
        Ok(Engine(Named::initialize(name, opts).map_err(start_fail)?))
    }

    /// Opens the engine to links: it serves what was registered and written before.
    pub(super) fn open(&self) -> Result<(), Error> {
        self.0.open().map_err(start_fail)
    }

    /// A host buffer of `len` bytes that peers may access as `access` says.
    pub(super) fn buffer(&self, len: usize, access: Access) -> Result<Buffer, Error> {
        self.0.buffer(len, access).map_err(fail)
    }

    /// Registers `len` bytes at `addr` of `typ`; `local_only`: not offered to peers.
    ///
    /// # Safety
    /// [`Core::register_raw`]'s contract: the memory stays valid for reads and writes of any
    /// bytes until it is deregistered or the engine finalized, and peers (unless `local_only`)
    /// and transfers access it meanwhile.
    pub(super) unsafe fn register(
        &self,
        typ: MemType,
        addr: usize,
        len: usize,
        local_only: bool,
    ) -> Result<Registration, Error> {
        let access = if local_only {
            Access::None
        } else {
            Access::ReadWrite
        };
        // SAFETY: the caller's contract.
        unsafe { (self.0.core).register_raw(MemDesc { addr, len }, typ, access) }.map_err(fail)
    }

    /// Ends a registration (refused while a transfer uses it).
    pub(super) fn deregister(&self, r: &Registration) -> Result<(), Error> {
        self.0.core.deregister(r).map_err(fail)
    }

    /// Connects to the engine named `remote` within `timeout`.
    pub(super) fn connect(&self, remote: &str, timeout: Duration) -> Result<(), Error> {
        self.0.connect(remote, timeout).map(drop).map_err(fail)
    }

    /// Disconnects from `remote`, waiting up to `timeout` for its answer (best effort: the
    /// link is closed either way, and a peer that went away is gone all the same).
    pub(super) fn disconnect(&self, remote: &str, timeout: Duration) {
        let _ = self.0.disconnect(remote, timeout);
    }

    /// The regions of `remote`'s table, as the link got them.
    pub(super) fn remote_regions(&self, remote: &str) -> Result<Vec<RemoteRegion>, Error> {
        let link = self.0.link(remote).map_err(fail)?;
        Ok(link.table.clone())
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
        let d = OpDesc {
            local_addr: buffer.addr(),
            remote_addr: addr,
            len: buf.len() as u64,
        };
        self.transfer_sync(remote, TransferOp::Read, &[d], timeout)?;
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
        let link = self.0.link(remote).map_err(fail)?;
        let (xds, bytes) =
            address::batch(&self.0.core, &link, op, addrs(descs), None).map_err(fail)?;
        link.run(op, &xds, bytes, timeout.max(Duration::from_millis(1)))
            .map_err(fail)
    }

    /// A batch to `remote`, started (with [`ASYNC_DEADLINE`]).
    pub(super) fn transfer_async(
        &self,
        remote: &str,
        op: TransferOp,
        descs: &[OpDesc],
    ) -> Result<Request, Error> {
        let link = self.0.link(remote).map_err(fail)?;
        let mut keep = Vec::new();
        let (xds, bytes) =
            address::batch(&self.0.core, &link, op, addrs(descs), Some(&mut keep)).map_err(fail)?;
        let h = (link.shared())
            .start(op, xds, bytes, keep, ASYNC_DEADLINE, 0)
            .map_err(fail)?;
        Ok(Arc::new(h))
    }

    /// An async batch's state (a deadline passed or an error is `Failed`), and its outcome's
    /// status code (`None` while waiting).
    pub(super) fn status(&self, r: &Request) -> (CompleteStatus, Option<Status>) {
        let s = r.status();
        let c = match s {
            TransferStatus::Waiting => CompleteStatus::Waiting,
            TransferStatus::Completed => CompleteStatus::Completed,
            _ => CompleteStatus::Failed,
        };
        (c, s.code())
    }

    /// Finalizes the engine: its links, listener and registrations end; the buffers it
    /// allocated get private pages.
    pub(super) fn finalize(&self) {
        self.0.finalize();
    }
}

/// A batch's descriptors (checked already: `batch.rs`, each range inside one registration, so
/// every address and length fits a `usize`) as the core's address descriptors.
fn addrs(descs: &[OpDesc]) -> impl ExactSizeIterator<Item = AddrDesc> + Clone + '_ {
    descs.iter().map(|d| AddrDesc {
        local: d.local_addr,
        remote: d.remote_addr,
        len: d.len as usize,
    })
}
