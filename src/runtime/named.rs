//! An engine of the core floor as the products keep one (HIXL-CS's and LLM-DataDist's engines
//! are one of these, with their own errors around it): the engine, its links by remote name
//! ([`Peers`]), and the host buffers it allocated for itself (a published table, a download
//! buffer), whose pages are made private when it ends.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::error::{Error, Status};
use crate::options::Options;
use crate::runtime::handle::{Engine, LinkHandle, RegionHandle};
use crate::runtime::peers::Peers;
use crate::sync::lock;
use crate::types::Access;

/// A host buffer the engine allocated and registered: its record, which keeps it mapped while
/// it lives.
#[derive(Clone)]
pub(crate) struct Buffer(RegionHandle);

impl Buffer {
    /// Its first byte.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.0.ptr_at(0)
    }
    /// Its address.
    pub(crate) fn addr(&self) -> usize {
        self.0.addr
    }
    /// Its length.
    pub(crate) fn len(&self) -> usize {
        self.0.len
    }
}

/// An engine with its links by remote name (finalized when dropped).
pub(crate) struct Named {
    pub(crate) core: Engine,
    pub(crate) peers: Peers,
    /// The buffers it allocated: their pages are made private when it ends (a same-host peer
    /// that mapped one reaches nothing its owner reads afterwards).
    buffers: Mutex<Vec<RegionHandle>>,
}

impl Drop for Named {
    fn drop(&mut self) {
        self.finalize();
    }
}

impl Named {
    /// An engine named `name` (`"ip:port"` listens there, port 0 on one the OS chooses; `"ip"`
    /// is a client only) with `options` (AutoConnect off: links are made explicitly), open to
    /// links at once.
    ///
    /// # Errors
    /// The engine's start errors.
    pub(crate) fn start(name: &str, options: Options) -> Result<Self, Error> {
        let named = Self::initialize(name, options)?;
        named.open()?;
        Ok(named)
    }

    /// As [`Named::start`], but not open to links yet: a listening engine has its port (a peer
    /// that connects meanwhile waits for its answer) and serves nothing until [`Named::open`],
    /// so what it registers and writes before is all there for every peer.
    ///
    /// # Errors
    /// The engine's initialize errors.
    pub(crate) fn initialize(name: &str, mut options: Options) -> Result<Self, Error> {
        options.auto_connect = false;
        Ok(Named {
            core: Engine::initialize(name, options, name.ends_with(":0"))?,
            peers: Peers::default(),
            buffers: Mutex::new(Vec::new()),
        })
    }

    /// Opens the engine to links (once; [`Named::start`] does it).
    ///
    /// # Errors
    /// `FAILED` when serving cannot start.
    pub(crate) fn open(&self) -> Result<(), Error> {
        self.core.open()
    }

    /// A host buffer of `len` bytes that peers may access as `access` says.
    ///
    /// # Errors
    /// The allocation's or the registration's.
    pub(crate) fn buffer(&self, len: usize, access: Access) -> Result<Buffer, Error> {
        // kept mapped by the Buffer after its registration: a memfd, or nothing
        let buf = crate::buffers::HostBuffer::shared(len)?;
        let r = (self.core)
            .register_owned(buf, access, false)
            .map_err(|h| h.error)?;
        lock(&self.buffers).push(r.clone());
        Ok(Buffer(r))
    }

    /// Connects to the engine named `remote`: the link made.
    ///
    /// # Errors
    /// A bad name or timeout, `ALREADY_CONNECTED`, the connect's own.
    pub(crate) fn connect(
        &self,
        remote: &str,
        timeout: Duration,
    ) -> Result<Arc<LinkHandle>, Error> {
        let (key, _) = self.core.remote_key(remote)?;
        self.peers.connect(&self.core, remote, &key, timeout)
    }

    /// Closes the link to `remote`, telling the peer (a peer already gone is not an error).
    ///
    /// # Errors
    /// A bad name; `NOT_CONNECTED` without a link; the goodbye's other errors.
    pub(crate) fn disconnect(&self, remote: &str, timeout: Duration) -> Result<(), Error> {
        let (key, _) = self.core.remote_key(remote)?;
        let Some(link) = self.peers.take(&self.core, remote, &key)? else {
            return Ok(());
        };
        match link.close_timeout(timeout) {
            Err(e) if e.status() == Status::NOT_CONNECTED => Ok(()),
            r => r,
        }
    }

    /// Closes `link`, a link to `remote` this engine made, telling the peer; the engine lets go
    /// of it if it still holds it under `remote` (not of a link that superseded it there). A
    /// link the engine let go of already (it broke and was superseded), or a peer already gone,
    /// is not an error.
    ///
    /// # Errors
    /// A bad name; the goodbye's other errors.
    pub(crate) fn disconnect_link(
        &self,
        remote: &str,
        link: &Weak<LinkHandle>,
        timeout: Duration,
    ) -> Result<(), Error> {
        let (key, _) = self.core.remote_key(remote)?;
        let Some(link) = link.upgrade() else {
            return Ok(());
        };
        self.peers.take_if(&key, &link);
        match link.close_timeout(timeout) {
            Err(e) if e.status() == Status::NOT_CONNECTED => Ok(()),
            r => r,
        }
    }

    /// The link to `remote` (made before).
    ///
    /// # Errors
    /// A bad name; `NOT_CONNECTED` without a link.
    pub(crate) fn link(&self, remote: &str) -> Result<Arc<LinkHandle>, Error> {
        let (key, _) = self.core.remote_key(remote)?;
        (self.peers).link_for(&self.core, false, Duration::from_secs(1), remote, &key)
    }

    /// Finalizes the engine: its links, listener and registrations end; the buffers it
    /// allocated get private pages. Calling it again does nothing more.
    pub(crate) fn finalize(&self) {
        for l in self.peers.drop_all(false) {
            l.close_quietly();
        }
        self.core.finalize();
        for b in std::mem::take(&mut *lock(&self.buffers)) {
            if let Err(e) = b.privatize() {
                tracing::warn!(region = b.id, error = %e, "an engine's buffer could not be made private");
            }
        }
    }
}
