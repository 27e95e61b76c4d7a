//! Links to peers: connect and disconnect (sync and async), their status, and how each call
//! finds its link (held, finished by an async connect, or made on demand with AutoConnect).

use std::collections::BTreeMap;

use std::sync::{Arc, RwLockReadGuard};
use std::time::Duration;

use super::{Core, Error, Hixl, Result, millis, not_initialized};
use crate::runtime::handle::{Engine, LinkHandle};
use crate::runtime::peers::InFlight;
use crate::{AsyncConnectStatus, Status};

impl Hixl {
    /// HIXL `Connect`: opens a link to a listening engine; its region table arrives with it.
    ///
    /// # Errors
    /// `PARAM_INVALID` for a bad name or timeout (or this engine's own name); `ALREADY_CONNECTED`;
    /// `TIMEOUT`; `FAILED` when the peer cannot be reached.
    pub fn connect(&self, remote_engine: &str, timeout_in_millis: i32) -> Result<()> {
        let timeout = millis(timeout_in_millis)?;
        // made without the core's lock: a connect waiting on a slow peer holds up no other call
        let (e, key, _, _in_flight) = self.outside(remote_engine)?;
        let link = (self.peers.connect(&e, remote_engine, &key, timeout))
            .map_err(|err| self.unless_finalized(&e, err.into()))?;
        drop(self.still_ours(&e, &key, &link)?);
        Ok(())
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
        let taken = self.with_remote(remote_engine, |e, key| {
            Ok(self.peers.take(e, remote_engine, &key)?)
        })?;
        let Some(link) = taken else {
            return Ok(());
        };
        // closed without the core's lock (the goodbye waits for the peer); transfers running on
        // other threads keep their clone: the link is closed under them
        let r = link.close_timeout(timeout);
        drop(link);
        match r {
            // the peer already went away (finalized, or its process ended): the link is
            // closed on this side, which is all HIXL's Disconnect promises then
            Err(e) if e.status() == Status::NOT_CONNECTED => Ok(()),
            r => Ok(r?),
        }
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
    /// use is closed at once. A remote with no connection at all is `SUCCESS`, its status
    /// `NotConnect` (as HIXL's, whose disconnect task then finds nothing to close).
    ///
    /// # Errors
    /// `PARAM_INVALID` for a bad name or timeout; `RESOURCE_EXHAUSTED` when the queue is full.
    pub fn disconnect_async(&self, remote_engine: &str, timeout_in_millis: i32) -> Result<()> {
        let timeout = millis(timeout_in_millis)?;
        let held = self.with_remote(remote_engine, |e, key| match self.peers.remove(&key) {
            Some(l) => Ok(Some(l)),
            None => match e.disconnect_async(remote_engine, timeout) {
                Ok(()) | Err(crate::Error::NotConnected { .. }) => Ok(None),
                Err(other) => Err(Error::from(other)),
            },
        })?;
        if let Some(l) = held {
            let _ = l.close_timeout(timeout); // without the core's lock, as `disconnect`
        }
        Ok(())
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

    /// The engine (a clone), the key of `remote` and AutoConnect's setting (on, the connect
    /// timeout), for a call that finds or makes its link without the core's lock; counted
    /// ([`Peers::enter`]) until the last value goes, so a (de)registration that must stop
    /// serving sees the link it may make.
    ///
    /// [`Peers::enter`]: crate::runtime::peers::Peers::enter
    fn outside(&self, remote: &str) -> Result<(Engine, String, (bool, Duration), InFlight<'_>)> {
        let core = self.read();
        let e = self.connected(&core)?;
        let (key, _) = e.remote_key(remote)?;
        let auto = (core.auto_connect, core.connect_timeout);
        Ok((e.clone(), key, auto, self.peers.enter()))
    }

    /// The core's read lock again, once `link` (to `key`) was found or made for engine `e`
    /// without it: `FAILED` if `e` was finalized meanwhile, the link let go and closed then
    /// (a link made while `finalize` ran would outlive it otherwise).
    fn still_ours(
        &self,
        e: &Engine,
        key: &str,
        link: &Arc<LinkHandle>,
    ) -> Result<RwLockReadGuard<'_, Core>> {
        let core = self.read();
        let err = match self.connected(&core) {
            Ok(now) if Arc::ptr_eq(&now.0, &e.0) => return Ok(core),
            Ok(_) => not_initialized(),
            Err(err) => err,
        };
        drop(core);
        self.peers.take_if(key, link);
        link.close_quietly();
        Err(err)
    }

    /// `err`, the failure of a link found or made for engine `e` without the core's lock; or
    /// `FAILED` (not initialized) if `e` was finalized meanwhile, which is what failed then.
    fn unless_finalized(&self, e: &Engine, err: Error) -> Error {
        match self.connected(&self.read()) {
            Ok(now) if Arc::ptr_eq(&now.0, &e.0) => err,
            Ok(_) => not_initialized(),
            Err(gone) => gone,
        }
    }

    /// Runs `f` with the link for `remote` (connecting on demand with AutoConnect), dropping a
    /// link that broke under it (AutoConnect), the core's read lock held while `f` runs.
    pub(super) fn on_link<T>(
        &self,
        remote: &str,
        f: impl FnOnce(&Engine, &LinkHandle) -> Result<T>,
    ) -> Result<T> {
        self.on_link_then(remote, f, |_, t| Ok(t))
    }

    /// As [`Hixl::on_link`]: the link is found (or made, with AutoConnect) without the core's
    /// lock, then `check` runs with the core's read lock held (it checks a batch against the
    /// engine's regions and keeps them in use), then `run` with the lock released, so a
    /// connect or a transfer waiting on a slow peer holds up no other call of the engine: a
    /// registration (which takes the write lock) would otherwise wait for it, and every call
    /// queued behind that writer with it. `finalize` meanwhile closes the link and waits for
    /// the transfer to end; a deregistration of a region it uses is refused.
    pub(super) fn on_link_then<C, T>(
        &self,
        remote: &str,
        check: impl FnOnce(&Engine, &LinkHandle) -> Result<C>,
        run: impl FnOnce(&LinkHandle, C) -> Result<T>,
    ) -> Result<T> {
        self.on_link_failing(remote, check, run, |_| true)
    }

    /// As [`Hixl::on_link_then`], but only an error `link_failed` says is the link's counts as
    /// a failure of the link (with AutoConnect, one that drops it: closing it ends every other
    /// caller's requests on it).
    pub(super) fn on_link_failing<C, T>(
        &self,
        remote: &str,
        check: impl FnOnce(&Engine, &LinkHandle) -> Result<C>,
        run: impl FnOnce(&LinkHandle, C) -> Result<T>,
        link_failed: impl FnOnce(&Error) -> bool,
    ) -> Result<T> {
        self.on_link_by(remote, None, check, run, link_failed)
    }

    /// As [`Hixl::on_link_failing`], for a call that must end by `deadline` (its own timeout):
    /// a link AutoConnect makes for it is given no longer than what is left of the call (at
    /// most the engine's connect timeout), so the call does not wait past its timeout for the
    /// connect (HIXL's `TransferSync` connects within the call's timeout too). `run` gets
    /// what is left after that ([`time_left`]).
    pub(super) fn on_link_by<C, T>(
        &self,
        remote: &str,
        deadline: Option<std::time::Instant>,
        check: impl FnOnce(&Engine, &LinkHandle) -> Result<C>,
        run: impl FnOnce(&LinkHandle, C) -> Result<T>,
        link_failed: impl FnOnce(&Error) -> bool,
    ) -> Result<T> {
        let (e, key, (auto, timeout), in_flight) = self.outside(remote)?;
        let timeout = deadline.map_or(timeout, |d| {
            timeout.min(d.saturating_duration_since(std::time::Instant::now()))
        });
        let link = (self.peers.link_for(&e, auto, timeout, remote, &key))
            .map_err(|err| self.unless_finalized(&e, err.into()))?;
        let r = {
            let core = self.still_ours(&e, &key, &link)?;
            drop(in_flight); // held (or not made): counted as a link from here on
            let r = check(self.connected(&core)?, &link);
            drop(core);
            r
        };
        let r = r.and_then(|c| run(&link, c));
        if let Err(err) = &r
            && link_failed(err)
        {
            self.peers.after_failure(auto, &key, &link, err.status);
        }
        r
    }
}

/// What is left of a call that must end by `deadline`, for its transfer or notification once
/// its link is there (the connect took the rest).
///
/// # Errors
/// `TIMEOUT` once nothing is left.
pub(super) fn time_left(
    deadline: std::time::Instant,
    op: &'static str,
    peer: &str,
) -> Result<Duration> {
    let started = std::time::Instant::now();
    match deadline.checked_duration_since(started) {
        Some(left) if !left.is_zero() => Ok(left),
        _ => Err(crate::Error::Timeout {
            op,
            peer: peer.to_owned(),
            elapsed: Duration::ZERO,
        }
        .into()),
    }
}
