//! What a serving engine may spend on its connections, and the table that enforces it.
//!
//! Every accepted connection has an entry in a [`ConnTable`] from `accept` until its socket
//! closes, and holds exactly one descriptor (the table keeps the descriptor's number, not a
//! clone). A connection is first a *handshake* (HELLO, CHALLENGE/AUTH with a key, PROVE/PROOF for
//! a same-host client), counted against its own small budget — a total and a per-peer-address
//! limit — then, once authenticated and allowed, an *established* lane, counted against
//! [`Limits::max_conns`] and a per-peer-address limit. So clients that connect and say nothing
//! can neither take the slots of established links nor keep honest newcomers out:
//!
//! - a newcomer always gets a handshake slot: when its address, or the whole budget, is full, a
//!   handshake makes room ([`make_room`]): from the newcomer's address, or else from the address
//!   with the most handshakes, the one that got least far (said nothing, then greeted), the
//!   oldest first. An honest client answers within a round trip, so it is past the silent ones
//!   before it could be cut; with a key, a client that authenticated is never cut for one that
//!   did not;
//! - the whole handshake has one deadline (`server_io_timeout`), and its frames are at most
//!   [`MAX_HANDSHAKE_FRAME`] bytes, refused before anything is allocated for them.
//!
//! Descriptors: one per connection (at most `max_conns + max_handshakes`), two per same-host
//! link's fence (its memfd and the client's pidfd, at most [`Limits::max_fenced`] such links),
//! and a few of the server's own; [`Limits::descriptors`] is their sum, which the server raises
//! its soft limit to.
//!
//! The descriptor numbers in the table are only used (to shut a connection down from another
//! thread) under the table's lock, and an entry is removed before its descriptor is closed, so a
//! number in the table always names the connection's own socket.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use crate::error::Status;

/// The status of the REFUSE that ends a connection whose input breaks the protocol (a frame
/// that does not decode, one of a kind its stage does not expect, a malformed payload): one
/// status for one kind of input, at every stage of the handshake and on established lanes.
pub(crate) const PROTOCOL_VIOLATION: Status = Status::FAILED;

/// Largest HELLO or AUTH payload a serving engine reads before a client is authenticated; a
/// longer frame is refused from its header (an honest HELLO is at most about 2.2 KiB).
pub const MAX_HANDSHAKE_FRAME: u32 = 4 << 10;

/// The bounds a serving engine keeps (see [`Options`](crate::Options) for each default).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Most established lanes ([`Options::max_server_conns`](crate::Options::max_server_conns)).
    pub max_conns: usize,
    /// Most established lanes from one peer address ([`Options::max_server_conns_per_peer`](crate::Options::max_server_conns_per_peer)).
    pub max_conns_per_peer: usize,
    /// Most lanes of one link ([`Options::max_server_lanes_per_link`](crate::Options::max_server_lanes_per_link)).
    pub max_lanes_per_link: usize,
    /// Most connections still in their handshake ([`Options::max_server_handshakes`](crate::Options::max_server_handshakes)).
    pub max_handshakes: usize,
    /// Most handshakes from one peer address ([`Options::max_server_handshakes_per_peer`](crate::Options::max_server_handshakes_per_peer)).
    pub max_handshakes_per_peer: usize,
    /// Most threads serving requests at once ([`Options::max_server_threads`](crate::Options::max_server_threads)).
    pub max_threads: usize,
}

/// Descriptors a server keeps besides its connections and fences: the listener, the poller's
/// epoll and wake-up descriptors, one pidfd while a same-host proof is checked.
pub(crate) const OWN_DESCRIPTORS: usize = 4;

/// Room left in the soft limit for the rest of the process.
pub(crate) const PROCESS_DESCRIPTORS: usize = 256;

impl Limits {
    /// Most same-host links with a fence at once (a quarter of [`Limits::max_conns`], at
    /// least one); a same-host client beyond it is served over TCP.
    pub(crate) fn max_fenced(&self) -> usize {
        (self.max_conns / 4).max(1)
    }

    /// Descriptors a server with these limits holds at most: one per connection (established
    /// or in its handshake), two per fenced link, and its own.
    pub(crate) fn server_descriptors(&self) -> usize {
        self.max_conns
            .saturating_add(self.max_handshakes)
            .saturating_add(self.max_fenced().saturating_mul(2))
            .saturating_add(OWN_DESCRIPTORS)
    }

    /// The soft limit a server raises its process to: [`Limits::server_descriptors`], with
    /// room for the rest of the process.
    pub(crate) fn descriptors(&self) -> libc::rlim_t {
        libc::rlim_t::try_from(self.server_descriptors())
            .unwrap_or(libc::rlim_t::MAX)
            .saturating_add(PROCESS_DESCRIPTORS as libc::rlim_t)
    }
}

/// How far a handshake got: what decides which one makes room for a newcomer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Progress {
    /// No complete HELLO yet.
    Silent,
    /// Its HELLO was read (and, with a key, challenged).
    Greeted,
    /// It proved the pre-shared key (only with one): never cut for a newcomer.
    Authenticated,
}

/// A handshake in progress, as [`make_room`] weighs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Candidate {
    pub id: u64,
    pub peer: IpAddr,
    pub progress: Progress,
    pub since: Instant,
}

/// Which handshake goes so that a newcomer from `peer` gets a slot: `Ok(None)` when there is
/// room, `Ok(Some(id))` to cut `id`, `Err` when every candidate authenticated (the newcomer is
/// closed). `handshakes` are all the handshakes in progress.
pub(crate) fn make_room(
    handshakes: &[Candidate],
    peer: IpAddr,
    l: &Limits,
) -> Result<Option<u64>, Refusal> {
    let from = |ip: IpAddr| handshakes.iter().filter(move |c| c.peer == ip);
    let cuttable = |c: &&Candidate| c.progress != Progress::Authenticated;
    let least = |it: &mut dyn Iterator<Item = &Candidate>| {
        it.filter(cuttable)
            .min_by_key(|c| (c.progress, c.since))
            .map(|c| c.id)
    };
    if from(peer).count() >= l.max_handshakes_per_peer {
        return least(&mut from(peer))
            .map(Some)
            .ok_or("too many authenticated handshakes from this address");
    }
    if handshakes.len() < l.max_handshakes {
        return Ok(None);
    }
    // the budget is full: the address holding the most handshakes gives one up (any other
    // when all of its own authenticated)
    let mut counts: HashMap<IpAddr, usize> = HashMap::new();
    for c in handshakes.iter().filter(cuttable) {
        *counts.entry(c.peer).or_default() += 1;
    }
    let busiest = counts
        .into_iter()
        .max_by_key(|&(ip, n)| (n, ip))
        .map(|(ip, _)| ip);
    match busiest {
        Some(ip) => Ok(least(&mut from(ip))),
        None => Err("too many authenticated handshakes"),
    }
}

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Accepted, handshake not finished.
    Handshake,
    /// A lane of a link.
    Established,
}

/// One connection of a serving engine.
#[derive(Debug)]
pub(crate) struct Entry {
    fd: RawFd,
    peer: IpAddr,
    phase: Phase,
}

impl AsRawFd for Entry {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct PeerCount {
    handshakes: usize,
    established: usize,
}

/// Why a connection was not admitted (or not established).
pub(crate) type Refusal = &'static str;

/// The connections of one serving engine, with their counts.
#[derive(Debug, Default)]
pub(crate) struct ConnTable {
    map: HashMap<u64, Entry>,
    handshakes: usize,
    established: usize,
    peers: HashMap<IpAddr, PeerCount>,
}

impl ConnTable {
    /// The connection `id`.
    pub fn get(&self, id: &u64) -> Option<&Entry> {
        self.map.get(id)
    }

    /// Every connection.
    pub fn values(&self) -> impl Iterator<Item = &Entry> {
        self.map.values()
    }

    /// Connections in their handshake, and established ones.
    pub fn counts(&self) -> (usize, usize) {
        (self.handshakes, self.established)
    }

    /// Connections in their handshake from `ip`.
    pub fn handshakes_from(&self, ip: IpAddr) -> usize {
        self.peers.get(&ip).map_or(0, |p| p.handshakes)
    }

    fn peer(&mut self, ip: IpAddr) -> &mut PeerCount {
        self.peers.entry(ip).or_default()
    }

    /// Takes `c` out of the counts.
    fn uncount(&mut self, peer: IpAddr, phase: Phase) {
        let p = self.peer(peer);
        match phase {
            Phase::Handshake => p.handshakes -= 1,
            Phase::Established => p.established -= 1,
        }
        if p.handshakes == 0 && p.established == 0 {
            self.peers.remove(&peer);
        }
        match phase {
            Phase::Handshake => self.handshakes -= 1,
            Phase::Established => self.established -= 1,
        }
    }

    /// Forgets connection `id` (before its descriptor is closed).
    pub fn remove(&mut self, id: &u64) -> Option<Entry> {
        let c = self.map.remove(id)?;
        self.uncount(c.peer, c.phase);
        Some(c)
    }

    /// Admits a new connection `id` (socket `fd`, from `peer`) to the handshake budget (the
    /// caller made room for it: [`make_room`]).
    pub fn admit(&mut self, id: u64, fd: RawFd, peer: IpAddr) {
        self.map.insert(
            id,
            Entry {
                fd,
                peer,
                phase: Phase::Handshake,
            },
        );
        self.handshakes += 1;
        self.peer(peer).handshakes += 1;
    }

    /// Moves connection `id` from the handshake budget to the established lanes.
    pub fn establish(&mut self, id: u64, l: &Limits) -> Result<(), Refusal> {
        let Some(c) = self.map.get(&id) else {
            return Err("connection cut");
        };
        let (peer, phase) = (c.peer, c.phase);
        if phase == Phase::Established {
            return Ok(());
        }
        if self.established >= l.max_conns {
            return Err("too many connections");
        }
        if self.peers.get(&peer).map_or(0, |p| p.established) >= l.max_conns_per_peer {
            return Err("too many connections from this address");
        }
        self.uncount(peer, Phase::Handshake);
        self.established += 1;
        self.peer(peer).established += 1;
        if let Some(c) = self.map.get_mut(&id) {
            c.phase = Phase::Established;
        }
        Ok(())
    }
}

/// Waits between failed `accept`s that a retry cannot fix at once (out of descriptors or
/// memory): 10 ms, doubling up to 320 ms, back to none after a success.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    next: Option<Duration>,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_millis(320);

    /// Resets after an `accept` that worked.
    pub fn reset(&mut self) {
        self.next = None;
    }

    /// The next wait.
    pub fn step(&mut self) -> Duration {
        let d = self.next.unwrap_or(Self::FIRST);
        self.next = Some((d * 2).min(Self::MAX));
        d
    }
}

/// Raises this process's soft limit on open descriptors towards `want` (never above the hard
/// limit, never lowering it): a server holds one descriptor per connection, and the common soft
/// limit of 1024 is below what the default limits allow. Returns the soft limit now in force.
pub(crate) fn raise_nofile(want: libc::rlim_t) -> libc::rlim_t {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a live rlimit the call fills.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 0;
    }
    let target = want.min(r.rlim_max);
    if r.rlim_cur < target {
        let raised = libc::rlimit {
            rlim_cur: target,
            rlim_max: r.rlim_max,
        };
        // SAFETY: `raised` is a live rlimit within the hard limit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return target;
        }
    }
    r.rlim_cur
}

/// Whether an `accept` error is one to wait out (out of descriptors, buffers or memory), rather
/// than one that concerns a single connection.
pub(crate) fn wait_out(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_conns: 3,
            max_conns_per_peer: 2,
            max_lanes_per_link: 8,
            max_handshakes: 3,
            max_handshakes_per_peer: 2,
            max_threads: 4,
        }
    }

    #[test]
    fn handshakes_and_lanes_are_counted_apart() {
        let l = limits();
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            "10.0.0.3".parse().unwrap(),
        );
        let mut t = ConnTable::default();
        t.admit(1, -1, a);
        t.admit(2, -1, a);
        assert_eq!(t.handshakes_from(a), 2);
        t.admit(4, -1, b);
        t.admit(5, -1, c);
        assert_eq!(t.counts(), (4, 0));
        t.establish(2, &l).unwrap();
        t.establish(4, &l).unwrap();
        t.establish(5, &l).unwrap();
        assert_eq!(t.counts(), (1, 3));
        assert_eq!(t.handshakes_from(a), 1);
        t.admit(6, -1, a);
        assert_eq!(t.establish(6, &l), Err("too many connections"));
        t.remove(&4);
        t.establish(6, &l).unwrap();
        t.admit(7, -1, a);
        assert_eq!(t.establish(7, &l), Err("too many connections"));
        t.remove(&5);
        assert_eq!(
            t.establish(7, &l),
            Err("too many connections from this address")
        );
        for id in [1, 2, 6, 7] {
            t.remove(&id);
        }
        assert_eq!(t.counts(), (0, 0));
        assert!(t.peers.is_empty() && t.map.is_empty());
    }

    fn cand(id: u64, peer: IpAddr, progress: Progress, age_ms: u64) -> Candidate {
        let now = Instant::now();
        Candidate {
            id,
            peer,
            progress,
            since: now
                .checked_sub(Duration::from_millis(age_ms))
                .unwrap_or(now),
        }
    }

    #[test]
    fn a_newcomer_gets_room_from_the_least_advanced_handshake() {
        let l = limits();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        // room left: nobody goes
        let one = [cand(1, a, Progress::Silent, 10)];
        assert_eq!(make_room(&one, b, &l), Ok(None));
        // the address is at its limit: its least advanced handshake goes, not the oldest
        let two = [
            cand(1, a, Progress::Greeted, 50),
            cand(2, a, Progress::Silent, 10),
        ];
        assert_eq!(make_room(&two, a, &l), Ok(Some(2)));
        // ... among equals, the oldest
        let two = [
            cand(1, a, Progress::Silent, 50),
            cand(2, a, Progress::Silent, 10),
        ];
        assert_eq!(make_room(&two, a, &l), Ok(Some(1)));
        // the budget is full: the address with the most handshakes gives one up
        let full = [
            cand(1, b, Progress::Silent, 90),
            cand(2, a, Progress::Greeted, 50),
            cand(3, a, Progress::Greeted, 10),
        ];
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        assert_eq!(make_room(&full, c, &l), Ok(Some(2)));
        // authenticated handshakes are never cut for a newcomer
        let keyed = [
            cand(1, a, Progress::Authenticated, 90),
            cand(2, a, Progress::Authenticated, 50),
        ];
        assert!(make_room(&keyed, a, &l).is_err());
        let keyed = [
            cand(1, a, Progress::Authenticated, 90),
            cand(2, a, Progress::Authenticated, 50),
            cand(3, b, Progress::Greeted, 10),
        ];
        assert_eq!(make_room(&keyed, c, &l), Ok(Some(3)));
        let all = [
            cand(1, a, Progress::Authenticated, 90),
            cand(2, b, Progress::Authenticated, 50),
            cand(3, b, Progress::Authenticated, 10),
        ];
        assert!(make_room(&all, c, &l).is_err());
    }

    #[test]
    fn backoff_doubles_and_resets() {
        let mut b = Backoff::default();
        let steps: Vec<u64> = (0..7).map(|_| b.step().as_millis() as u64).collect();
        assert_eq!(steps, [10, 20, 40, 80, 160, 320, 320]);
        b.reset();
        assert_eq!(b.step(), Duration::from_millis(10));
    }
}
