//! Links to peers: connect and disconnect (sync and async), their status, and how each call
//! finds its link (held, finished by an async connect, or made on demand with AutoConnect).

use std::collections::BTreeMap;

use super::{Hixl, Result, millis};
use crate::runtime::handle::{Engine, LinkHandle};
use crate::{AsyncConnectStatus, Status};

impl Hixl {
    /// HIXL `Connect`: opens a link to a listening engine; its region table arrives with it.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a bad name or timeout (or this engine's own name); `ALREADY_CONNECTED`;
    /// `TIMEOUT`; `FAILED` when the peer cannot be reached.
    pub fn connect(&self, remote_engine: &str, timeout_in_millis: i32) -> Result<()> {
        let timeout = millis(timeout_in_millis)?;
        self.with_remote(remote_engine, |e, key| {
            self.peers.connect(e, remote_engine, &key, timeout)?;
            Ok(())
        })
    }

    /// HIXL `Disconnect`: closes the link (an async connection too), telling the peer.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a bad name or timeout; `NOT_CONNECTED` if there is no link (a link
    /// that broke because the peer went away still counts: as in HIXL, its disconnect
    /// succeeds); the error of the goodbye exchange other than the peer being gone (the link is
    /// closed on this side in every case).
    pub fn disconnect(&self, remote_engine: &str, timeout_in_millis: i32) -> Result<()> {
        let timeout = millis(timeout_in_millis)?;
        self.with_remote(remote_engine, |e, key| {
            let Some(link) = self.peers.take(e, remote_engine, &key)? else {
                return Ok(());
            };
            // transfers running on other threads keep their clone; the link is closed under them
            let r = link.close_timeout(timeout);
            drop(link);
            match r {
                // the peer already went away (finalized, or its process ended): the link is
                // closed on this side, which is all HIXL's Disconnect promises then
                Err(e) if e.status() == Status::NOT_CONNECTED => Ok(()),
                r => Ok(r?),
            }
        })
    }

    /// HIXL `ConnectAsync`: queues a connect; see [`Hixl::get_async_connect_status`]. The link
    /// is used by the first call that needs it once the status is `Connected`.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a bad name or timeout; `ALREADY_CONNECTED` if a link exists;
    /// `RESOURCE_EXHAUSTED` when the queue is full.
    pub fn connect_async(&self, remote_engine: &str, timeout_in_millis: i32) -> Result<()> {
        let timeout = millis(timeout_in_millis)?;
        self.with_remote(remote_engine, |e, key| {
            self.peers.refuse_if_linked(&key)?;
            Ok(e.connect_async(remote_engine, timeout)?)
        })
    }

    /// HIXL `DisconnectAsync`: queues a disconnect of an async connection; a link already in
    /// use is closed at once.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a bad name or timeout; `NOT_CONNECTED` if there is no connection.
    pub fn disconnect_async(&self, remote_engine: &str, timeout_in_millis: i32) -> Result<()> {
        let timeout = millis(timeout_in_millis)?;
        self.with_remote(remote_engine, |e, key| {
            if let Some(l) = self.peers.remove(&key) {
                let _ = l.close_timeout(timeout);
                return Ok(());
            }
            Ok(e.disconnect_async(remote_engine, timeout)?)
        })
    }

    /// HIXL `GetAsyncConnectStatus` for one remote: `Connected` for a usable link (however it
    /// was made), else the async queue's status.
    ///
    /// # Errors
    /// `FAILED` when not initialized; `PARAM_INVALID` for a bad name.
    pub fn get_async_connect_status(&self, remote_engine: &str) -> Result<AsyncConnectStatus> {
        self.with_remote(remote_engine, |e, key| {
            if self.peers.usable(&key) {
                return Ok(AsyncConnectStatus::Connected);
            }
            Ok(e.async_connect_status(remote_engine))
        })
    }

    /// HIXL `GetAsyncConnectStatus` for every remote this engine knows.
    ///
    /// # Errors
    /// `FAILED` when not initialized.
    pub fn get_all_async_connect_status(&self) -> Result<BTreeMap<String, AsyncConnectStatus>> {
        let core = self.read();
        let e = self.connected(&core)?;
        let mut all = e.async_connect_statuses();
        self.peers.statuses(&mut all);
        Ok(all)
    }

    /// Runs `f` with the engine (the core's read lock held) and the key of `remote` (its socket
    /// address).
    fn with_remote<T>(
        &self,
        remote: &str,
        f: impl FnOnce(&Engine, String) -> Result<T>,
    ) -> Result<T> {
        let core = self.read();
        let e = self.connected(&core)?;
        let (key, _) = e.remote_key(remote)?;
        f(e, key)
    }

    /// Runs `f` with the link for `remote` (connecting on demand with AutoConnect), dropping a
    /// link that broke under it (AutoConnect), the core's read lock held.
    pub(super) fn on_link<T>(
        &self,
        remote: &str,
        f: impl FnOnce(&Engine, &LinkHandle) -> Result<T>,
    ) -> Result<T> {
        self.on_link_then(remote, f, |_, t| Ok(t))
    }

    /// As [`Hixl::on_link`]: `check` runs with the core's read lock held (it checks a batch
    /// against the engine's regions and keeps them in use), then `run` with the lock released,
    /// so a transfer waiting on a slow peer holds up no other call of the engine: a
    /// registration (which takes the write lock) would otherwise wait for it, and every call
    /// queued behind that writer with it. `finalize` meanwhile closes the link and waits for
    /// the transfer to end; a deregistration of a region it uses is refused.
    pub(super) fn on_link_then<C, T>(
        &self,
        remote: &str,
        check: impl FnOnce(&Engine, &LinkHandle) -> Result<C>,
        run: impl FnOnce(&LinkHandle, C) -> Result<T>,
    ) -> Result<T> {
        let (auto, key, link, r) = {
            let core = self.read();
            let e = self.connected(&core)?;
            let (key, _) = e.remote_key(remote)?;
            let (auto, timeout) = (core.auto_connect, core.connect_timeout);
            let link = self.peers.link_for(e, auto, timeout, remote, &key)?;
            let r = check(e, &link);
            (auto, key, link, r)
        };
        let r = r.and_then(|c| run(&link, c));
        if let Err(err) = &r {
            self.peers.after_failure(auto, &key, &link, err.status);
        }
        r
    }
}
