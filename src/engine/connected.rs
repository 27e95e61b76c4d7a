//! The `Connected` state's methods: links (connect, async connects), and leaving the state.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::{Connected, Hixl, Registered};
use crate::error::{Error, check_timeout};
use crate::link::Link;
use crate::runtime::connect::AsyncConnectStatus;
use crate::runtime::link::SELF_LINK_REFUSED;
use crate::types::engine_name::EngineName;

impl Hixl<Connected> {
    /// Connects to a listening remote engine with the configured timeout (1000 ms by default),
    /// HIXL `Connect`. The link borrows the engine.
    ///
    /// # Errors
    /// As [`Hixl::connect_timeout`].
    pub fn connect(&self, remote: &str) -> Result<Link<'_>, Error> {
        self.connect_timeout(remote, self.inner.options.connect_timeout)
    }

    /// Connects to a listening remote engine; the peer sends its region table.
    ///
    /// # Errors
    /// - `PARAM_INVALID`: [`Error::InvalidTimeout`] (zero), [`Error::InvalidEngineName`],
    ///   [`Error::NotConnectable`] (no port, or this engine itself unless it is a fabric-memory
    ///   engine: see [`crate::fabric`]);
    /// - `ALREADY_CONNECTED`: [`Error::AlreadyConnected`];
    /// - `TIMEOUT`: [`Error::Timeout`] when the peer does not answer in time;
    /// - `FAILED`: [`Error::ConnectFailed`] (refused, unreachable; with the cause),
    ///   [`Error::Protocol`]; or the peer's status in [`Error::Refused`].
    pub fn connect_timeout(&self, remote: &str, timeout: Duration) -> Result<Link<'_>, Error> {
        let timeout = check_timeout(timeout)?;
        let (key, addr) = self.remote_key(remote)?;
        let shared = self.inner.open_link(&key, addr, timeout)?;
        Ok(Link::from_shared(&self.inner, shared))
    }

    /// Starts connecting in the background (HIXL `ConnectAsync`): queued (at most 128 tasks per
    /// engine), run by a pool of two threads, in order for each remote. Poll with
    /// [`Hixl::async_connect_status`]; get the link with [`Hixl::take_link`].
    ///
    /// # Errors
    /// The parameter errors of [`Hixl::connect_timeout`] at once; [`Error::QueueFull`]
    /// (`RESOURCE_EXHAUSTED`) when the queue is full. Connect errors are reported by `take_link`.
    pub fn connect_async(&self, remote: &str, timeout: Duration) -> Result<(), Error> {
        let timeout = check_timeout(timeout)?;
        let (key, addr) = self.remote_key(remote)?;
        self.inner
            .connects
            .connect(&self.inner.me, &key, addr, timeout)
    }

    /// Queues a disconnect of an async connection not yet taken (HIXL `DisconnectAsync`).
    ///
    /// # Errors
    /// [`Error::NotConnected`] if there is no such connection (or it was taken: disconnect the
    /// [`Link`] itself); [`Error::QueueFull`] when the queue is full.
    pub fn disconnect_async(&self, remote: &str, timeout: Duration) -> Result<(), Error> {
        let timeout = check_timeout(timeout)?;
        let (key, _) = self.remote_key(remote)?;
        self.inner
            .connects
            .disconnect(&self.inner.me, &key, timeout)
    }

    /// The status of the async connection to `remote` (HIXL `GetAsyncConnectStatus`).
    pub fn async_connect_status(&self, remote: &str) -> AsyncConnectStatus {
        match self.remote_key(remote) {
            Ok((key, _)) => self.inner.connects.status(&key),
            Err(_) => AsyncConnectStatus::NotConnect,
        }
    }

    /// The status of every async connection.
    pub fn async_connect_statuses(&self) -> BTreeMap<String, AsyncConnectStatus> {
        self.inner.connects.all()
    }

    /// Hands over the link of a finished async connect, or returns its error. After this the
    /// link is an ordinary [`Link`] and the async status of `remote` is `NotConnect`.
    ///
    /// # Errors
    /// The connect's own error (in [`Error::Shared`]); [`Error::NotConnected`] if it is still
    /// pending or there is none.
    pub fn take_link(&self, remote: &str) -> Result<Link<'_>, Error> {
        let (key, _) = self.remote_key(remote)?;
        let shared = self.inner.connects.take(&key)?;
        Ok(Link::from_shared(&self.inner, shared))
    }

    /// [`Hixl::connect_timeout`] for the [`crate::compat`] engine: the link holds the engine
    /// by `Arc` instead of borrowing it, so it can be kept in a table by remote name. The
    /// compat engine closes such links itself before it leaves `Connected`.
    pub(crate) fn connect_owned(
        &self,
        remote: &str,
        timeout: Duration,
    ) -> Result<Link<'static>, Error> {
        let timeout = check_timeout(timeout)?;
        let (key, addr) = self.remote_key(remote)?;
        let shared = self.inner.open_link(&key, addr, timeout)?;
        Ok(Link::owning(self.inner.clone(), shared))
    }

    /// [`Hixl::take_link`] for the [`crate::compat`] engine (an owning link).
    pub(crate) fn take_link_owned(&self, remote: &str) -> Result<Link<'static>, Error> {
        let (key, _) = self.remote_key(remote)?;
        let shared = self.inner.connects.take(&key)?;
        Ok(Link::owning(self.inner.clone(), shared))
    }

    /// For the [`crate::compat`] engine of a fabric-memory engine: the live ACL device
    /// allocation holding local memory that is not registered (upstream's FabricMem engine
    /// copies from and into such memory), as a region of its own that is in no table, served
    /// to no peer and registered with no transport: it only carries ranges into one call's
    /// batch (and keeps the batch's async request accounted).
    ///
    /// # Errors
    /// Why not (not a fabric-memory engine; not inside one device allocation).
    pub(crate) fn unregistered_device(
        &self,
        addr: usize,
        len: usize,
    ) -> Result<crate::Region<crate::MemDesc>, &'static str> {
        let Some(rt) = &self.inner.fabric else {
            return Err("only a fabric-memory engine copies memory that is not registered");
        };
        let (base, size) = rt.device_allocation(addr, len)?;
        let core = crate::runtime::region::RegionCore::new_raw(
            u32::MAX,
            self.inner.id,
            crate::MemDesc {
                addr: base,
                len: size,
            },
            crate::MemType::Device,
            crate::Access::ReadWrite,
        );
        Ok(crate::Region {
            core: std::sync::Arc::new(core),
            _mem: std::marker::PhantomData,
        })
    }

    /// How many peers hold a link to this engine right now (links it serves).
    pub(crate) fn served_links(&self) -> usize {
        self.inner.served_links()
    }

    /// The key a remote name is known by (its socket address), as links and the async connect
    /// queue use it.
    pub(crate) fn remote_key(&self, remote: &str) -> Result<(String, SocketAddr), Error> {
        let parsed = EngineName::parse(remote)?;
        let Some(addr) = parsed.socket_addr() else {
            return Err(Error::NotConnectable {
                peer: remote.to_owned(),
                problem: "the name has no port, so that engine does not listen",
            });
        };
        let key = addr.to_string();
        // HIXL's FabricMem engine connects to itself (upstream's kv benchmark does): the link
        // moves data between this process's own regions. Its other engines refuse (HIXL's
        // `PARAM_INVALID`), and so does hixl outside fabric memory; a self-link under another
        // name (`0.0.0.0:p` reached as `127.0.0.1:p`) is refused at connect (`LinkShared::open`).
        if key == self.inner.name && !self.inner.options.ascend.enable_fabric_mem {
            return Err(Error::NotConnectable {
                peer: remote.to_owned(),
                problem: SELF_LINK_REFUSED,
            });
        }
        Ok((key, addr))
    }

    /// Stops serving and returns to `Registered`, where memory can be (de)registered. Every link
    /// of this engine must be gone (the borrow checker makes sure). Requests being served get up
    /// to the `finalize_timeout` option to finish; then every incoming connection is closed.
    pub fn deactivate(self) -> Hixl<Registered> {
        self.inner.stop();
        self.into_state()
    }
}
