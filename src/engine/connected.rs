//! The `Connected` state's methods: links (connect, async connects), and leaving the state.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Connected, Hixl, Registered};
use crate::error::Error;
use crate::link::Link;
use crate::runtime::connect::AsyncConnectStatus;

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
        let shared = self.inner.link(remote, timeout)?;
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
        self.inner.connect_async(remote, timeout)
    }

    /// Queues a disconnect of an async connection not yet taken (HIXL `DisconnectAsync`).
    ///
    /// # Errors
    /// [`Error::NotConnected`] if there is no such connection (or it was taken: disconnect the
    /// [`Link`] itself); [`Error::QueueFull`] when the queue is full.
    pub fn disconnect_async(&self, remote: &str, timeout: Duration) -> Result<(), Error> {
        self.inner.disconnect_async(remote, timeout)
    }

    /// The status of the async connection to `remote` (HIXL `GetAsyncConnectStatus`).
    pub fn async_connect_status(&self, remote: &str) -> AsyncConnectStatus {
        self.inner.async_connect_status(remote)
    }

    /// The status of every async connection.
    pub fn async_connect_statuses(&self) -> BTreeMap<String, AsyncConnectStatus> {
        self.inner.async_connect_statuses()
    }

    /// Hands over the link of a finished async connect, or returns its error. After this the
    /// link is an ordinary [`Link`] and the async status of `remote` is `NotConnect`.
    ///
    /// # Errors
    /// The connect's own error (in [`Error::Shared`]); [`Error::NotConnected`] if it is still
    /// pending or there is none.
    pub fn take_link(&self, remote: &str) -> Result<Link<'_>, Error> {
        let shared = self.inner.take_link(remote)?;
        Ok(Link::from_shared(&self.inner, shared))
    }

    /// Stops serving and returns to `Registered`, where memory can be (de)registered. Every link
    /// of this engine must be gone (the borrow checker makes sure). Requests being served get up
    /// to the `finalize_timeout` option to finish; then every incoming connection is closed.
    pub fn deactivate(self) -> Hixl<Registered> {
        self.inner.close();
        self.into_state()
    }
}
