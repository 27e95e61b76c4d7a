//! A face's links by remote name, on the core floor: the table the faces that name their peers
//! (the compat engine, LLM-DataDist, HIXL-CS) keep, with HIXL's rules once — one usable link a
//! remote (`ALREADY_CONNECTED`), a broken one superseded by a new connect, the link of a finished
//! async connect taken on first use, AutoConnect's on-demand connect and its drop of a link that
//! failed, and the memory of remotes that went away (whose disconnect succeeds, as HIXL's does).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Status};
use crate::runtime::connect::AsyncConnectStatus;
use crate::runtime::handle::{Engine, LinkHandle};
use crate::sync::lock;

/// Links by remote key (the peer's socket address).
#[derive(Default)]
pub(crate) struct Peers {
    links: Mutex<HashMap<String, Arc<LinkHandle>>>,
    /// The remotes a connect of this table is being made to: a second connect to one of them
    /// waits for the first (by its own deadline), so two callers do not race for one name,
    /// while connects to other remotes go on beside it.
    connecting: Mutex<HashSet<String>>,
    /// Signalled when a connect of `connecting` ends.
    connected: Condvar,
    /// Calls between finding or making a link and holding it (a face counts them as links:
    /// see [`Peers::enter`]).
    in_flight: AtomicUsize,
    /// Remotes whose broken link was dropped (AutoConnect, or closed to change the region
    /// table) and not connected since: their `disconnect` succeeds.
    gone: Mutex<HashSet<String>>,
}

/// `NOT_CONNECTED` for `key`, saying what to do.
fn not_connected(key: &str, hint: &str) -> Error {
    Error::NotConnected {
        peer: key.to_owned(),
        why: format!("no link{hint}"),
    }
}

/// `TIMEOUT`: the time to connect to `key` went by waiting for another connect to it.
fn waited_out(key: &str, started: Instant) -> Error {
    Error::Timeout {
        op: "connect (waiting for another connect to the same remote)",
        peer: key.to_owned(),
        elapsed: started.elapsed(),
    }
}

/// A connect to one remote being made ([`Peers::claim`]): the next connect to it waits until
/// this goes.
struct Claim<'a> {
    peers: &'a Peers,
    key: String,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        lock(&self.peers.connecting).remove(&self.key);
        self.peers.connected.notify_all();
    }
}

/// A call between finding or making a link and holding it ([`Peers::enter`]).
pub(crate) struct InFlight<'a>(&'a Peers);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Peers {
    /// Counts a call that is about to find or make a link (and may hold a new one) without the
    /// face's own lock, until the value goes: a face that must know no link exists (to change
    /// what its transports serve) takes [`Peers::in_flight`] with [`Peers::usable_count`],
    /// under a lock the caller of this took before.
    pub(crate) fn enter(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self)
    }

    /// How many calls [`Peers::enter`] counts now.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Claims the connect to `key`, waiting (until `started + timeout`) while another is being
    /// made to it.
    fn claim(&self, key: &str, started: Instant, timeout: Duration) -> Result<Claim<'_>, Error> {
        let mut connecting = lock(&self.connecting);
        while connecting.contains(key) {
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(waited_out(key, started));
            }
            connecting = (self.connected)
                .wait_timeout(connecting, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        connecting.insert(key.to_owned());
        Ok(Claim {
            peers: self,
            key: key.to_owned(),
        })
    }

    /// Whether a link to `key` is held and not broken.
    pub(crate) fn usable(&self, key: &str) -> bool {
        lock(&self.links).get(key).is_some_and(|l| !l.is_broken())
    }

    /// `ALREADY_CONNECTED` if a usable link to `key` is held (a broken one may be superseded).
    ///
    /// # Errors
    /// As said.
    pub(crate) fn refuse_if_linked(&self, key: &str) -> Result<(), Error> {
        if self.usable(key) {
            return Err(Error::AlreadyConnected {
                peer: key.to_owned(),
            });
        }
        Ok(())
    }

    /// Connects to `remote` (key `key`) and holds the link (HIXL `Connect`): the link made.
    ///
    /// # Errors
    /// [`Error::AlreadyConnected`]; the connect's own.
    pub(crate) fn connect(
        &self,
        e: &Engine,
        remote: &str,
        key: &str,
        timeout: Duration,
    ) -> Result<Arc<LinkHandle>, Error> {
        let started = Instant::now();
        let _claim = self.claim(key, started, timeout)?;
        self.refuse_if_linked(key)?;
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(waited_out(key, started));
        }
        let link = Arc::new(LinkHandle::new(e, e.link(remote, left)?));
        // a broken link under this name is superseded (and closed when dropped)
        self.hold(key, link.clone());
        Ok(link)
    }

    /// Takes the link to `key` out (a held one, or one an async connect finished), to close it
    /// (HIXL `Disconnect`); `Ok(None)` when its remote went away (its link broke and was
    /// dropped): disconnecting it succeeds.
    ///
    /// # Errors
    /// `NOT_CONNECTED` when there is no link.
    pub(crate) fn take(
        &self,
        e: &Engine,
        remote: &str,
        key: &str,
    ) -> Result<Option<Arc<LinkHandle>>, Error> {
        let held = lock(&self.links).remove(key);
        let link = match held {
            Some(l) => l,
            None => match e.take_link(remote) {
                Ok(l) => Arc::new(LinkHandle::new(e, l)),
                // a link that broke and was dropped: the peer went away, as HIXL sees it
                Err(_) if lock(&self.gone).remove(key) => return Ok(None),
                Err(_) => return Err(not_connected(key, "")),
            },
        };
        lock(&self.gone).remove(key);
        Ok(Some(link))
    }

    /// Takes the held link to `key` out if it is `link` (a link since superseded stays: it is
    /// another's).
    pub(crate) fn take_if(&self, key: &str, link: &Arc<LinkHandle>) {
        let mut links = lock(&self.links);
        if links.get(key).is_some_and(|l| Arc::ptr_eq(l, link)) {
            links.remove(key);
        }
    }

    /// Takes the held link to `key` out, if there is one (to close it).
    pub(crate) fn remove(&self, key: &str) -> Option<Arc<LinkHandle>> {
        lock(&self.links).remove(key)
    }

    /// The statuses of every usable held link (`Connected`), over `all`.
    pub(crate) fn statuses(
        &self,
        all: &mut std::collections::BTreeMap<String, AsyncConnectStatus>,
    ) {
        for (k, l) in lock(&self.links).iter() {
            if !l.is_broken() {
                all.insert(k.clone(), AsyncConnectStatus::Connected);
            }
        }
    }

    /// How many held links are usable.
    pub(crate) fn usable_count(&self) -> usize {
        lock(&self.links)
            .values()
            .filter(|l| !l.is_broken())
            .count()
    }

    /// Holds `link` as the link to `key` (a broken one under that name is superseded, and
    /// closed when dropped); the remote is no longer one that went away.
    fn hold(&self, key: &str, link: Arc<LinkHandle>) {
        lock(&self.gone).remove(key);
        let superseded = lock(&self.links).insert(key.to_owned(), link);
        // closed outside the lock: closing waits for the link's requests (and for sync batches
        // of other threads on it), and every lookup of every peer takes this lock
        drop(superseded);
    }

    /// Drops every held link, remembering their remotes as gone (their disconnect succeeds);
    /// returns them for the caller to close outside any lock (closing waits for a link's
    /// requests).
    pub(crate) fn drop_all(&self, gone: bool) -> Vec<Arc<LinkHandle>> {
        let held = std::mem::take(&mut *lock(&self.links));
        if gone {
            lock(&self.gone).extend(held.keys().cloned());
        }
        held.into_values().collect()
    }

    /// Takes a broken link out of `links` (the caller closes it outside the lock) and remembers
    /// that its remote went away, so that its `disconnect` succeeds.
    fn drop_broken(
        &self,
        links: &mut HashMap<String, Arc<LinkHandle>>,
        key: &str,
    ) -> Option<Arc<LinkHandle>> {
        lock(&self.gone).insert(key.to_owned());
        links.remove(key)
    }

    /// The link to `key`: a held one; one an async connect finished; or, with `auto`
    /// (AutoConnect), a new one made within `connect_timeout`. A broken link is dropped first
    /// with `auto`, and gives way to a link an async connect finished since.
    ///
    /// # Errors
    /// `NOT_CONNECTED` without a link (and no `auto`); the connect's own.
    pub(crate) fn link_for(
        &self,
        e: &Engine,
        auto: bool,
        connect_timeout: Duration,
        remote: &str,
        key: &str,
    ) -> Result<Arc<LinkHandle>, Error> {
        let held = lock(&self.links).get(key).cloned();
        if let Some(l) = held
            && !(l.is_broken()
                && (auto || e.async_connect_status(remote) == AsyncConnectStatus::Connected))
        {
            return Ok(l);
        }
        let broken = {
            let mut links = lock(&self.links);
            match links.get(key) {
                // (another caller replaced it meanwhile)
                Some(l) if !l.is_broken() => return Ok(l.clone()),
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
            return Err(not_connected(key, " (connect first, or set AutoConnect=1)"));
        }
        let started = Instant::now();
        let _claim = self.claim(key, started, connect_timeout)?;
        if let Some(l) = lock(&self.links).get(key)
            && !l.is_broken()
        {
            return Ok(l.clone()); // another caller connected meanwhile
        }
        let left = connect_timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(waited_out(key, started));
        }
        let made = match e.link(remote, left) {
            // an async connect to it is queued or running (the engine holds its slot): HIXL's
            // transfers and notifies never answer ALREADY_CONNECTED; the next call takes the
            // async connect's link once it is there
            Err(Error::AlreadyConnected { .. }) => {
                return Err(not_connected(
                    key,
                    " yet (an async connect to it is under way)",
                ));
            }
            r => r?,
        };
        let l = Arc::new(LinkHandle::new(e, made));
        self.hold(key, l.clone());
        tracing::debug!(peer = key, "auto-connected");
        Ok(l)
    }

    /// After a call on `link` failed with `status`: with `auto` (AutoConnect), a link that
    /// failed (broke, timed out, or failed otherwise, but not a parameter error) is dropped so
    /// the next call connects again.
    pub(crate) fn after_failure(
        &self,
        auto: bool,
        key: &str,
        link: &Arc<LinkHandle>,
        status: Status,
    ) {
        let failed = matches!(
            status,
            Status::NOT_CONNECTED | Status::TIMEOUT | Status::FAILED
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
}
