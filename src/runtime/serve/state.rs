//! What the poller and the workers share ([`Shared`]: the server's settings, its flags and
//! counters, the worker queue, the way lanes come back) and the link registry ([`Links`], whose
//! methods are the only place a link record is edited).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::conn::{Returns, Work};
use super::limits::{ConnTable, Limits};
use super::table::ServeTable;
use crate::auth::Psk;
use crate::error::deadline_after;
use crate::io::Sock;
use crate::notify::NotifyQueue;
use crate::runtime::revoke::fence::ServerFence;
use crate::sync::lock;
use crate::types::HostId;
use crate::wire::Hello;

/// One link a server serves: its client, its lanes (connection ids), and what its lanes and
/// transports hold of it.
pub(super) struct LinkRec {
    /// The client engine's name and instance (read by the worker's log).
    pub(super) client: String,
    pub(super) instance: u64,
    /// Its lanes (connection ids).
    conns: HashSet<u64>,
    /// Cleared when the link is superseded or closed: its lanes apply nothing more.
    live: Arc<AtomicBool>,
    /// Requests of this link being applied right now.
    busy: Arc<AtomicUsize>,
    /// The server's side of the link's data paths (what its transports' `accept` returned),
    /// dropped with the link.
    paths: Vec<Box<dyn std::any::Any + Send>>,
    /// The link's fence, when its client is on this host: revoked when the link ends.
    fence: Option<Arc<ServerFence>>,
    /// Since when the link has no lane (a client that cancelled a running request closed its
    /// only one): its client may join it again for [`Shared::orphan_grace`].
    orphaned: Option<std::time::Instant>,
}

/// At most this many links without a lane are kept for their client to rejoin; beyond it the
/// oldest go first.
const MAX_ORPHANS: usize = 1024;

/// Removes the links without a lane that have had none for `grace`, and the oldest beyond `max`;
/// returns their tokens. Links with a lane are never removed.
fn prune_orphans(links: &mut HashMap<u64, LinkRec>, grace: Duration, max: usize) -> Vec<u64> {
    let mut orphans: Vec<(std::time::Instant, u64)> = links
        .iter()
        .filter_map(|(t, l)| l.orphaned.map(|at| (at, *t)))
        .collect();
    orphans.sort_unstable();
    let excess = orphans.len().saturating_sub(max);
    let gone: Vec<u64> = orphans
        .iter()
        .enumerate()
        .filter(|(i, (at, _))| *i < excess || at.elapsed() >= grace)
        .map(|(_, (_, t))| *t)
        .collect();
    for t in &gone {
        links.remove(t);
    }
    gone
}

impl Drop for LinkRec {
    fn drop(&mut self) {
        // a link that ended grants no more one-sided access
        if let Some(f) = &self.fence {
            f.revoke();
        }
    }
}

impl LinkRec {
    /// Stops the link's lanes: they apply no request after this returns, except those already
    /// being applied, which [`LinkRec::drain`] waits for.
    fn retire(&self, conns: &Mutex<ConnTable>) {
        self.live.store(false, Ordering::SeqCst);
        let conns = lock(conns);
        for c in self.conns.iter().filter_map(|c| conns.get(c)) {
            Sock::shutdown(c);
        }
    }
    /// Waits (up to `limit`) until no request of this retired link is being applied.
    pub(super) fn drain(&self, limit: Duration) -> bool {
        let until = deadline_after(Instant::now(), limit);
        while self.busy.load(Ordering::SeqCst) > 0 {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }
}

/// What a lane holds of its link: the flag that says the link is live, and the count of its
/// requests being applied.
pub(super) struct Member {
    pub(super) live: Arc<AtomicBool>,
    pub(super) busy: Arc<AtomicUsize>,
}

impl Member {
    fn of(l: &LinkRec) -> Self {
        Self {
            live: l.live.clone(),
            busy: l.busy.clone(),
        }
    }
}

/// Why a lane cannot join a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum JoinFail {
    /// No link of this client has the token.
    Unknown,
    /// The link has its most lanes.
    Full,
}

/// What a lane's leaving did to the registry.
#[derive(Default)]
pub(super) struct Left {
    /// The fence of a link that lost its last lane: the caller revokes it (outside the lock).
    pub(super) fence: Option<Arc<ServerFence>>,
    /// The lane was its link's last: the link is kept a while for its client to rejoin.
    pub(super) emptied: bool,
    /// Links forgotten (orphaned past the grace, or beyond [`MAX_ORPHANS`]).
    pub(super) gone: Vec<u64>,
}

/// The link registry: every link a server serves (or keeps for its client to rejoin), by
/// token. Its methods are the only place it is edited, and the only place it is locked.
#[derive(Default)]
pub(crate) struct Links(Mutex<HashMap<u64, LinkRec>>);

impl Links {
    /// Opens link `token` for `hello`'s client, with lane `id` and `fence`. The client's old
    /// links (same name *and* instance: many client-only engines on one host share the name
    /// of its address) are taken out and retired first (their lanes shut through `conns`):
    /// returned, for the caller to drain before it welcomes the new link.
    pub(super) fn open(
        &self,
        token: u64,
        hello: &Hello,
        id: u64,
        fence: Option<Arc<ServerFence>>,
        conns: &Mutex<ConnTable>,
    ) -> (Member, Vec<LinkRec>) {
        let mut links = lock(&self.0);
        let stale: Vec<u64> = (links.iter())
            .filter(|(_, l)| l.client == hello.name && l.instance == hello.instance)
            .map(|(t, _)| *t)
            .collect();
        let mut retired = Vec::new();
        for t in stale {
            if let Some(old) = links.remove(&t) {
                old.retire(conns);
                retired.push(old);
            }
        }
        let rec = LinkRec {
            client: hello.name.clone(),
            instance: hello.instance,
            conns: HashSet::from([id]),
            live: Arc::new(AtomicBool::new(true)),
            busy: Arc::new(AtomicUsize::new(0)),
            paths: Vec::new(),
            fence,
            orphaned: None,
        };
        let member = Member::of(&rec);
        links.insert(token, rec);
        (member, retired)
    }

    /// Joins lane `id` to the link `hello` names (its token, client name and instance), if it
    /// has fewer than `max_lanes`; `reopened` runs (under the registry's lock) when the link had
    /// no lane and its client is back.
    pub(super) fn join(
        &self,
        hello: &Hello,
        id: u64,
        max_lanes: usize,
        reopened: impl FnOnce(),
    ) -> Result<Member, JoinFail> {
        let mut links = lock(&self.0);
        match links.get_mut(&hello.token) {
            Some(l) if l.instance == hello.instance && l.client == hello.name => {
                if l.conns.len() >= max_lanes {
                    return Err(JoinFail::Full);
                }
                l.conns.insert(id);
                if l.orphaned.take().is_some() {
                    reopened();
                }
                Ok(Member::of(l))
            }
            _ => Err(JoinFail::Unknown),
        }
    }

    /// Closes link `token` (its client said BYE on lane `id`): it applies nothing more, its
    /// other lanes are shut (through `conns`), its fence is revoked. Returns its client's name.
    pub(super) fn close(&self, token: u64, id: u64, conns: &Mutex<ConnTable>) -> Option<String> {
        let rec = lock(&self.0).remove(&token)?;
        rec.live.store(false, Ordering::SeqCst);
        let conns = lock(conns);
        for c in (rec.conns.iter())
            .filter(|&&c| c != id)
            .filter_map(|c| conns.get(c))
        {
            Sock::shutdown(c);
        }
        drop(conns);
        Some(rec.client.clone())
    }

    /// Whether link `token` has a fence (its client proved it is on this host).
    pub(super) fn fenced(&self, token: u64) -> bool {
        lock(&self.0).get(&token).is_some_and(|l| l.fence.is_some())
    }

    /// Keeps a transport's server side of link `token` (dropped with the link).
    pub(super) fn add_path(&self, token: u64, side: Box<dyn std::any::Any + Send>) {
        if let Some(l) = lock(&self.0).get_mut(&token) {
            l.paths.push(side);
        }
    }

    /// Takes lane `id` out of link `token`. A link that lost its last lane (not by BYE) is
    /// kept for `grace` for its client to rejoin, without its fence (returned, for the caller
    /// to revoke); orphans past the grace, and the oldest beyond [`MAX_ORPHANS`], are forgotten.
    pub(super) fn leave(&self, id: u64, token: u64, bye: bool, grace: Duration) -> Left {
        let mut links = lock(&self.0);
        let mut left = Left::default();
        if let Some(l) = links.get_mut(&token) {
            l.conns.remove(&id);
            // its last lane: the link is kept a while for its client to rejoin (a client
            // that cancels a running request closes that request's lane, maybe its only
            // one); its pending notifications start their grace now. Its fence goes now:
            // an orphaned link holds no descriptor
            if l.conns.is_empty() && !bye {
                l.orphaned = Some(Instant::now());
                left.fence = l.fence.take();
                left.emptied = true;
            }
        } // else: closed by BYE or replaced
        // fences of links that go are revoked as their records go
        left.gone = prune_orphans(&mut links, grace, MAX_ORPHANS);
        left
    }

    /// How many links have a lane now.
    pub(super) fn served(&self) -> usize {
        lock(&self.0)
            .values()
            .filter(|l| l.orphaned.is_none())
            .count()
    }
}

/// State shared by the poller and every serving worker of one engine.
pub(crate) struct Shared {
    pub(super) name: String,
    pub(super) instance: u64,
    pub(super) table: Arc<ServeTable>,
    pub(super) io_timeout: Duration,
    pub(super) limits: Limits,
    pub(super) stop: AtomicBool,
    /// Set once the stop's grace is over: the poller ends, closing what it still holds.
    pub(super) halt: AtomicBool,
    /// Requests being served right now.
    pub(super) active: Arc<AtomicUsize>,
    /// Workers waiting a moment for their lane's next request; while one does, a new job
    /// starts no thread: the lingering worker gives up its wait and takes it.
    pub(super) lingering: AtomicUsize,
    /// Every connection, from accept until its thread ends, with the counts [`Limits`] bound.
    pub(super) conns: Arc<Mutex<ConnTable>>,
    pub(super) links: Links,
    pub(super) next_id: AtomicU64,
    pub(super) notifies: Arc<NotifyQueue>,
    /// This process, offered to same-host clients (`None`: same-host transfers are off).
    pub(super) host: Option<HostId>,
    /// The client engine names served (`None`: all).
    pub(super) allow: Option<Vec<String>>,
    /// The pre-shared key clients must prove (`None`: no authentication).
    pub(super) psk: Option<Psk>,
    /// Keepalive interval for served connections (`None`: off).
    pub(super) keepalive: Option<Duration>,
    /// The engine's transports besides TCP: they answer clients' setup requests.
    pub(super) backends: Vec<Arc<dyn crate::transport::Backend>>,
    /// Every fence handed to a same-host client that may still be in use: revoked (and waited
    /// for) when serving stops; dropped once revoked and settled. `None` once serving stops: no
    /// fence is handed out after that.
    pub(super) fences: Mutex<Option<Vec<Arc<ServerFence>>>>,
    /// Fences alive now (their places in the budget of [`Limits::max_fenced`]).
    pub(super) fenced: Arc<AtomicUsize>,
    /// The workers' queue: completed handshakes and lanes with a request.
    pub(super) queue: Arc<crate::runtime::executor::Queue<Work>>,
    /// Lanes on their way back to the poller, and its wake-up.
    pub(super) returns: Returns,
    pub(super) span: tracing::Span,
}

impl Shared {
    /// How long a link without a lane is kept for its client to rejoin: the I/O timeout.
    pub(super) fn orphan_grace(&self) -> Duration {
        self.io_timeout
    }

    /// Forgets fences that are revoked and settled: their clients start no batch and have
    /// none in flight.
    pub(super) fn prune_fences(&self) {
        if let Some(fences) = lock(&self.fences).as_mut() {
            fences.retain(|f| !f.spent());
        }
    }

    /// Records a fence before it is offered to its client; `false` once serving has stopped
    /// (then the fence must not be offered: `stop` would not wait for it).
    pub(super) fn offer_fence(&self, fence: &Arc<ServerFence>) -> bool {
        let mut fences = lock(&self.fences);
        match fences.as_mut() {
            Some(list) => {
                list.retain(|f| !f.spent());
                list.push(fence.clone());
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(orphaned: Option<Instant>) -> LinkRec {
        LinkRec {
            client: "c".into(),
            instance: 1,
            conns: HashSet::new(),
            live: Arc::new(AtomicBool::new(true)),
            busy: Arc::new(AtomicUsize::new(0)),
            paths: Vec::new(),
            fence: None,
            orphaned,
        }
    }

    #[test]
    fn links_without_lanes_are_kept_for_the_grace_and_bounded_in_number() {
        let now = Instant::now();
        let ago = |s: u64| now.checked_sub(Duration::from_secs(s)).unwrap_or(now);
        let mut links = HashMap::new();
        // 10 links with a lane, 1030 without: the oldest one past the grace
        for t in 0..10u64 {
            links.insert(t, rec(None));
        }
        links.insert(100, rec(Some(ago(120))));
        for t in 0..1029u64 {
            links.insert(1000 + t, rec(Some(ago(30) + Duration::from_millis(t))));
        }
        let gone = prune_orphans(&mut links, Duration::from_secs(60), 1024);
        // the one past the grace, then the oldest until 1024 are left
        let mut gone = gone;
        gone.sort_unstable();
        assert_eq!(gone, vec![100, 1000, 1001, 1002, 1003, 1004]);
        assert_eq!(
            links.values().filter(|l| l.orphaned.is_some()).count(),
            1024
        );
        assert!(
            (0..10).all(|t| links.contains_key(&t)),
            "a link with a lane went"
        );
        // nothing more goes while they are within the grace and the bound
        assert!(prune_orphans(&mut links, Duration::from_secs(60), 1024).is_empty());
    }
}
