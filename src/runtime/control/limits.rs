//! What a serving engine may spend on its connections, and the table that enforces it.
//!
//! Every accepted connection has an entry in a [`ConnTable`] from `accept` until its serving
//! thread ends, and holds exactly one descriptor (the table keeps the descriptor's number, not a
//! clone). A connection is first a *handshake* (HELLO, and CHALLENGE/AUTH with a key), counted
//! against its own small budget — a total and a per-peer-address limit — then, once authenticated
//! and allowed, an *established* lane, counted against [`Limits::max_conns`] and a per-peer-address
//! limit. So clients that connect and say nothing can neither take the slots of established
//! links nor keep honest newcomers out:
//!
//! - a peer address over its handshake limit is closed at `accept` (no thread is started);
//! - when the handshake budget is full, the oldest handshake is cut to make room (an honest
//!   handshake takes a round trip or two; an idle one is what gets cut);
//! - the whole handshake has one deadline (`server_io_timeout`), and its frames are at most
//!   [`MAX_HANDSHAKE_FRAME`] bytes, refused before anything is allocated for them.
//!
//! The descriptor numbers in the table are only used (to shut a connection down from another
//! thread) under the table's lock, and an entry is removed before its descriptor is closed, so a
//! number in the table always names the connection's own socket.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync::lock;

/// Largest HELLO or AUTH payload a serving engine reads before a client is authenticated; a
/// longer frame is refused from its header (an honest HELLO is at most about 2.2 KiB).
pub(crate) const MAX_HANDSHAKE_FRAME: u32 = 4 << 10;

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
}

impl Limits {
    /// Descriptors a server with these limits may hold at once (one per connection), with room
    /// for the rest of the process.
    pub(crate) fn descriptors(&self) -> libc::rlim_t {
        let n = self.max_conns.saturating_add(self.max_handshakes);
        libc::rlim_t::try_from(n)
            .unwrap_or(libc::rlim_t::MAX)
            .saturating_add(256)
    }
}

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Accepted, handshake not finished.
    Handshake,
    /// A lane of a link.
    Established,
    /// A handshake cut to make room; it counts against nothing while its thread winds down.
    Evicted,
}

/// One connection of a serving engine.
#[derive(Debug)]
pub(crate) struct Conn {
    fd: RawFd,
    peer: IpAddr,
    since: Instant,
    stage: Stage,
}

impl AsRawFd for Conn {
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
    map: HashMap<u64, Conn>,
    handshakes: usize,
    established: usize,
    peers: HashMap<IpAddr, PeerCount>,
}

impl ConnTable {
    /// The connection `id`.
    pub fn get(&self, id: &u64) -> Option<&Conn> {
        self.map.get(id)
    }

    /// Every connection.
    pub fn values(&self) -> impl Iterator<Item = &Conn> {
        self.map.values()
    }

    /// Connections in their handshake, and established ones.
    pub fn counts(&self) -> (usize, usize) {
        (self.handshakes, self.established)
    }

    fn peer(&mut self, ip: IpAddr) -> &mut PeerCount {
        self.peers.entry(ip).or_default()
    }

    /// Takes `c` out of the counts.
    fn uncount(&mut self, peer: IpAddr, stage: Stage) {
        let p = self.peer(peer);
        match stage {
            Stage::Handshake => p.handshakes -= 1,
            Stage::Established => p.established -= 1,
            Stage::Evicted => {}
        }
        if p.handshakes == 0 && p.established == 0 {
            self.peers.remove(&peer);
        }
        match stage {
            Stage::Handshake => self.handshakes -= 1,
            Stage::Established => self.established -= 1,
            Stage::Evicted => {}
        }
    }

    /// Forgets connection `id` (before its descriptor is closed).
    pub fn remove(&mut self, id: &u64) -> Option<Conn> {
        let c = self.map.remove(id)?;
        self.uncount(c.peer, c.stage);
        Some(c)
    }

    /// Admits a new connection `id` (socket `fd`, from `peer`) to the handshake budget. A peer
    /// over its own limit is refused; when the budget is full, the oldest handshake is shut down
    /// and no longer counted, to make room.
    pub fn admit(&mut self, id: u64, fd: RawFd, peer: IpAddr, l: &Limits) -> Result<(), Refusal> {
        if self.peers.get(&peer).map_or(0, |p| p.handshakes) >= l.max_handshakes_per_peer {
            return Err("too many handshakes from this address");
        }
        if self.handshakes >= l.max_handshakes {
            let oldest = self
                .map
                .iter()
                .filter(|(_, c)| c.stage == Stage::Handshake)
                .min_by_key(|(_, c)| c.since)
                .map(|(id, _)| *id);
            let Some(old) = oldest else {
                return Err("too many handshakes");
            };
            let (fd, peer_old) = {
                let c = &self.map[&old];
                (c.fd, c.peer)
            };
            shutdown(fd);
            self.uncount(peer_old, Stage::Handshake);
            if let Some(c) = self.map.get_mut(&old) {
                c.stage = Stage::Evicted;
            }
        }
        self.map.insert(
            id,
            Conn {
                fd,
                peer,
                since: Instant::now(),
                stage: Stage::Handshake,
            },
        );
        self.handshakes += 1;
        self.peer(peer).handshakes += 1;
        Ok(())
    }

    /// Moves connection `id` from the handshake budget to the established lanes.
    pub fn establish(&mut self, id: u64, l: &Limits) -> Result<(), Refusal> {
        let Some(c) = self.map.get(&id) else {
            return Err("connection cut");
        };
        let (peer, stage) = (c.peer, c.stage);
        match stage {
            Stage::Handshake => {}
            Stage::Established => return Ok(()),
            Stage::Evicted => return Err("handshake cut to make room for others"),
        }
        if self.established >= l.max_conns {
            return Err("too many connections");
        }
        if self.peers.get(&peer).map_or(0, |p| p.established) >= l.max_conns_per_peer {
            return Err("too many connections from this address");
        }
        self.uncount(peer, Stage::Handshake);
        self.established += 1;
        self.peer(peer).established += 1;
        if let Some(c) = self.map.get_mut(&id) {
            c.stage = Stage::Established;
        }
        Ok(())
    }
}

/// Shuts socket `fd` down in both directions (wakes a thread blocked on it).
fn shutdown(fd: RawFd) {
    // SAFETY: plain system call on a descriptor number; callers hold the connection table's
    // lock, under which every number in it names its connection's open socket.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

/// Removes its connection from the table when dropped: declared after the connection's socket,
/// it runs before the socket closes.
pub(crate) struct Entry<'a> {
    pub table: &'a Mutex<ConnTable>,
    pub id: u64,
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        lock(self.table).remove(&self.id);
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
        // -1: shutdown on an invalid descriptor is a harmless EBADF
        t.admit(1, -1, a, &l).unwrap();
        t.admit(2, -1, a, &l).unwrap();
        assert!(t.admit(3, -1, a, &l).is_err(), "per-peer handshake limit");
        t.admit(4, -1, b, &l).unwrap();
        // the budget is full: the oldest handshake (1) is cut for the newcomer
        t.admit(5, -1, c, &l).unwrap();
        assert_eq!(t.counts(), (3, 0));
        assert!(
            t.establish(1, &l).is_err(),
            "an evicted handshake is not established"
        );
        t.establish(2, &l).unwrap();
        t.establish(4, &l).unwrap();
        t.establish(5, &l).unwrap();
        assert_eq!(t.counts(), (0, 3));
        t.admit(6, -1, a, &l).unwrap();
        assert_eq!(t.establish(6, &l), Err("too many connections"));
        t.remove(&4);
        t.admit(7, -1, a, &l).unwrap();
        t.establish(6, &l).unwrap();
        assert_eq!(
            t.establish(7, &l),
            Err("too many connections"),
            "full again"
        );
        for id in [1, 2, 5, 6, 7] {
            t.remove(&id);
        }
        assert_eq!(t.counts(), (0, 0));
        assert!(t.peers.is_empty() && t.map.is_empty());
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
