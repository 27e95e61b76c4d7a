//! The engine under LLM-DataDist: the core floor's handle API (`runtime::handle`: an engine and
//! its regions' records, links by remote name through `runtime::peers`), beside the compat face
//! rather than on it. A cache keeps its tensors' region records, which its block moves run from
//! (`moves.rs`); this engine runs the moves of address descriptors.

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::error::Error;
use crate::runtime::address::{self, AddrDesc};
use crate::runtime::handle::{LinkHandle, RegionHandle};
pub(super) use crate::runtime::named::Buffer;
use crate::runtime::named::Named;
use crate::{Access, DetachedContext, MemDesc, MemType, Notify, Options, TransferOp};

/// A timeout in HIXL's milliseconds (≤ 0: `PARAM_INVALID`).
fn millis(ms: i32) -> Result<Duration, Error> {
    crate::timeout_from_millis(ms)
}

/// An engine and its links by remote name (finalized when dropped).
pub(super) struct DdEngine(Named);

impl DdEngine {
    /// An engine named `name` (`"ip:port"` listens there, port 0 on one the OS chooses;
    /// `"ip"` is a client only) with HIXL's options, open to links at once.
    ///
    /// # Errors
    /// The options' and the engine's start errors.
    pub(super) fn initialize(name: &str, options: &[(String, String)]) -> Result<Self, Error> {
        let opts = Options::from_pairs(options.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
        Ok(DdEngine(Named::start(name, opts)?))
    }

    /// The engine's name as peers connect to it (with the port it got, for port 0).
    pub(super) fn local_engine(&self) -> String {
        self.0.core.name.clone()
    }

    /// The engine's device context, detached (what a rank-table link runs HCCL under).
    pub(super) fn detach_context(&self) -> DetachedContext {
        DetachedContext::new(self.0.core.id, self.0.core.device.clone())
    }

    /// A host buffer of `len` bytes that peers may access as `access` says.
    ///
    /// # Errors
    /// The allocation's or the registration's.
    pub(super) fn alloc_host_mem_with(&self, len: usize, access: Access) -> Result<Buffer, Error> {
        self.0.buffer(len, access)
    }

    /// Registers `len` bytes at `addr` of `mem_type`, read-write for peers.
    ///
    /// # Safety
    /// [`Engine::register_raw`]'s contract: the memory stays valid for reads and writes of any
    /// bytes until it is deregistered or the engine finalized, and peers and transfers access it
    /// meanwhile.
    ///
    /// # Errors
    /// [`Engine::register_raw`]'s.
    pub(super) unsafe fn register_mem(
        &self,
        addr: usize,
        len: usize,
        mem_type: MemType,
    ) -> Result<RegionHandle, Error> {
        let desc = MemDesc { addr, len };
        // SAFETY: the caller's contract.
        unsafe { self.0.core.register_raw(desc, mem_type, Access::ReadWrite) }
    }

    /// Ends a registration, through the core's one in-use rule (refused while a transfer of
    /// this engine uses it).
    ///
    /// # Errors
    /// [`Engine::deregister`]'s: a region of another engine, one in use.
    pub(super) fn deregister_mem(&self, r: &RegionHandle) -> Result<(), Error> {
        self.0.core.deregister(r)
    }

    /// Connects to the engine named `remote`: the link made (the engine holds it under that
    /// name; a caller that keeps it keeps the link it made, not whatever link the name reaches
    /// later).
    ///
    /// # Errors
    /// A bad name or timeout, `ALREADY_CONNECTED`, the connect's own.
    pub(super) fn connect(&self, remote: &str, timeout_ms: i32) -> Result<Arc<LinkHandle>, Error> {
        self.0.connect(remote, millis(timeout_ms)?)
    }

    /// Closes `link`, a link to `remote` [`DdEngine::connect`] made, telling the peer (one the
    /// engine let go of already, or a peer already gone, is not an error); a link that
    /// superseded it under that name stays.
    ///
    /// # Errors
    /// A bad name or timeout; the goodbye's other errors.
    pub(super) fn disconnect(
        &self,
        remote: &str,
        link: &Weak<LinkHandle>,
        timeout_ms: i32,
    ) -> Result<(), Error> {
        self.0.disconnect_link(remote, link, millis(timeout_ms)?)
    }

    /// Sends a notification on `link` (delivered after every transfer started before it on
    /// the link).
    ///
    /// # Errors
    /// A bad timeout, a name or message over 1024 bytes, a link gone, the peer's refusal.
    pub(super) fn send_notify(
        &self,
        link: &LinkHandle,
        name: &str,
        msg: &str,
        timeout_ms: i32,
    ) -> Result<(), Error> {
        let timeout = millis(timeout_ms)?;
        crate::notify::check_lengths(name, msg)?;
        link.notify(name, msg, std::time::Instant::now(), timeout)
    }

    /// Every notification received so far, oldest first, with the name each sender's engine
    /// gave in its handshake.
    pub(super) fn take_notifies(&self) -> Vec<Notify> {
        self.0.core.notifies.drain()
    }

    /// A READ or WRITE of address descriptors on `link` (held by the caller: not looked up by
    /// name per move), waited for within `timeout`; each local address is found in this
    /// engine's regions, each remote one in the link's table. (A block move runs from its
    /// cache's regions instead: `moves.rs`.)
    ///
    /// # Errors
    /// The batch's checks (an address in no region of this engine or of the peer's table); the
    /// transfer's errors (a deadline missed: `TIMEOUT`).
    pub(super) fn transfer(
        &self,
        link: &LinkHandle,
        op: TransferOp,
        descs: &[AddrDesc],
        timeout: Duration,
    ) -> Result<(), Error> {
        let (xds, bytes) = address::batch(&self.0.core, link, op, descs.iter().copied(), None)?;
        link.run(op, &xds, bytes, timeout)
    }

    /// Finalizes the engine: its links, listener and registrations end; the buffers it
    /// allocated get private pages.
    pub(super) fn finalize(&self) {
        self.0.finalize();
    }
}
