//! Links to peers: connect and disconnect (sync and async), their status, and how each call
//! finds its link (held, finished by an async connect, or made on demand with AutoConnect).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::{Core, Error, Hixl, Result, millis};
use crate::runtime::handle::{Engine, LinkHandle};
use crate::sync::lock;
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
            let _serial = lock(&self.connecting);
            self.refuse_if_linked(&key)?;
            let link = LinkHandle::new(e, e.link(remote_engine, timeout)?);
            // a broken link under this name is superseded (and closed when dropped)
            self.hold(&key, Arc::new(link));
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
            let link = lock(&self.links).remove(&key);
            let link = match link {
                Some(l) => l,
                None => match e.take_link(remote_engine) {
                    Ok(l) => Arc::new(LinkHandle::new(e, l)),
                    // a link that broke and was dropped: the peer went away, as HIXL sees it
                    Err(_) if lock(&self.gone).remove(&key) => return Ok(()),
                    Err(_) => {
                        return Err(Error::new(
                            Status::NOT_CONNECTED,
                            format!("not connected to {key}"),
                        ));
                    }
                },
            };
            lock(&self.gone).remove(&key);
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
            self.refuse_if_linked(&key)?;
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
            let held = lock(&self.links).remove(&key);
            if let Some(l) = held {
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
            if self.has_usable_link(&key) {
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
        for (k, l) in lock(&self.links).iter() {
            if !l.is_broken() {
                all.insert(k.clone(), AsyncConnectStatus::Connected);
            }
        }
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

    /// Whether a link to `key` is held and not broken.
    fn has_usable_link(&self, key: &str) -> bool {
        lock(&self.links).get(key).is_some_and(|l| !l.is_broken())
    }

    /// `ALREADY_CONNECTED` if a usable link to `key` is held (a broken one may be superseded).
    fn refuse_if_linked(&self, key: &str) -> Result<()> {
        if self.has_usable_link(key) {
            return Err(Error::new(
                Status::ALREADY_CONNECTED,
                format!("already connected to {key}"),
            ));
        }
        Ok(())
    }

    /// Holds `link` as the link to `key` (a broken one under that name is superseded, and
    /// closed when dropped); the remote is no longer one that went away.
    fn hold(&self, key: &str, link: Arc<LinkHandle>) {
        lock(&self.gone).remove(key);
        lock(&self.links).insert(key.to_owned(), link);
    }

    /// Takes a broken link out of `links` (the caller closes it outside the lock) and remembers
    /// that its remote went away, so that its `disconnect` succeeds.
    fn drop_broken(
        &self,
        links: &mut std::collections::HashMap<String, Arc<LinkHandle>>,
        key: &str,
    ) -> Option<Arc<LinkHandle>> {
        lock(&self.gone).insert(key.to_owned());
        links.remove(key)
    }

    /// The link to `key`: a held one; one an async connect finished; or, with AutoConnect, a new
    /// one. A broken link is dropped first with AutoConnect.
    fn link_for(
        &self,
        e: &Engine,
        auto: bool,
        connect_timeout: Duration,
        remote: &str,
        key: &str,
    ) -> Result<Arc<LinkHandle>> {
        let broken = {
            let mut links = lock(&self.links);
            match links.get(key) {
                Some(l) if !(auto && l.is_broken()) => return Ok(l.clone()),
                Some(_) => self.drop_broken(&mut links, key),
                None => None,
            }
        };
        // closed outside the lock: closing waits for the link's requests to end
        drop(broken);
        if e.async_connect_status(remote) == AsyncConnectStatus::Connected
            && let Ok(l) = e.take_link(remote)
        {
            let l = Arc::new(LinkHandle::new(e, l));
            self.hold(key, l.clone());
            return Ok(l);
        }
        if !auto {
            return Err(Error::new(
                Status::NOT_CONNECTED,
                format!("not connected to {key} (connect first, or set AutoConnect=1)"),
            ));
        }
        let _serial = lock(&self.connecting);
        if let Some(l) = lock(&self.links).get(key) {
            return Ok(l.clone()); // another caller connected meanwhile
        }
        let l = Arc::new(LinkHandle::new(e, e.link(remote, connect_timeout)?));
        self.hold(key, l.clone());
        tracing::debug!(peer = key, "auto-connected");
        Ok(l)
    }

    /// After a failed call on `link`: with AutoConnect, a link that failed (broke, timed out,
    /// or failed otherwise, but not a parameter error) is dropped so the next call connects
    /// again.
    fn after_failure(&self, auto: bool, key: &str, link: &Arc<LinkHandle>, status: Status) {
        let failed = matches!(
            status,
            Status::NOT_CONNECTED | Status::TIMEOUT | Status::FAILED | Status::NOTIFY_FAILED
        );
        if auto && (failed || link.is_broken()) {
            let removed = {
                let mut links = lock(&self.links);
                match links.get(key) {
                    Some(l) if Arc::ptr_eq(l, link) => self.drop_broken(&mut links, key),
                    _ => None,
                }
            };
            // closed outside the lock: closing waits for the link's requests to end
            drop(removed);
        }
    }

    /// Runs `f` with the link for `remote` (connecting on demand with AutoConnect), dropping a
    /// link that broke under it (AutoConnect).
    pub(super) fn on_link<T>(
        &self,
        remote: &str,
        f: impl FnOnce(&Core, &Engine, &LinkHandle) -> Result<T>,
    ) -> Result<T> {
        let core = self.read();
        let e = self.connected(&core)?;
        let (key, _) = e.remote_key(remote)?;
        let link = self.link_for(e, core.auto_connect, core.connect_timeout, remote, &key)?;
        let r = f(&core, e, &link);
        if let Err(e) = &r {
            self.after_failure(core.auto_connect, &key, &link, e.status);
        }
        r
    }
}
