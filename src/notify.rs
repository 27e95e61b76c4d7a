//! Notifications (HIXL `SendNotify` / `GetNotifies`): short messages a client sends over a link,
//! acknowledged by the serving engine and drained with [`Hixl::get_notifies`](crate::Hixl::get_notifies).

use crate::error::Error;
use crate::sync::lock;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Longest notification name or message, in bytes (as HIXL).
pub const MAX_NOTIFY_LEN: usize = 1024;
/// Checks a notification's name and message against [`MAX_NOTIFY_LEN`]: the one checker of
/// the rule, for every face that sends (the typed link, compat, LLM-DataDist), each at the
/// point its contract puts it (compat's before it looks for the link, as HIXL's `SendNotify`).
///
/// # Errors
/// [`Error::NotifyTooLong`] for the first of the two that is too long.
pub(crate) fn check_lengths(name: &str, msg: &str) -> Result<(), Error> {
    for (what, s) in [("name", name), ("message", msg)] {
        if s.len() > MAX_NOTIFY_LEN {
            return Err(Error::NotifyTooLong {
                what,
                len: s.len(),
                limit: MAX_NOTIFY_LEN,
            });
        }
    }
    Ok(())
}

/// Most notifications pending (received, not yet drained) per link; over that the sender gets
/// `RESOURCE_EXHAUSTED`.
pub const MAX_PENDING_NOTIFIES: usize = 4096;

/// A notification received from a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notify {
    /// The sending engine's name.
    pub from: String,
    /// The notification's name (HIXL `NotifyDesc::name`).
    pub name: String,
    /// The message (HIXL `NotifyDesc::notify_msg`).
    pub msg: String,
}

/// Bytes counted for one notification besides its strings.
const NOTIFY_OVERHEAD: usize = 64;

/// The bytes a pending notification is counted for.
fn cost(n: &Notify) -> usize {
    n.from.len() + n.name.len() + n.msg.len() + NOTIFY_OVERHEAD
}

/// Engine-wide bounds on pending notifications (see [`Options`](crate::Options)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct NotifyLimits {
    /// Most notifications pending over all links.
    pub max_count: usize,
    /// Most bytes pending over all links ([`cost`] of each).
    pub max_bytes: usize,
    /// How long a closed link's pending notifications are kept.
    pub grace: Duration,
}

#[derive(Default)]
struct Inner {
    queue: VecDeque<(u64, Notify)>,
    /// Pending notifications per link.
    pending: HashMap<u64, usize>,
    /// Bytes pending over all links.
    bytes: usize,
    /// Links that closed with notifications pending, and when.
    closed: HashMap<u64, Instant>,
}

impl Inner {
    /// Drops the notifications of links closed more than `grace` ago.
    fn expire(&mut self, grace: Duration) {
        let now = Instant::now();
        let gone: Vec<u64> = self
            .closed
            .iter()
            .filter(|(_, at)| now.duration_since(**at) >= grace)
            .map(|(t, _)| *t)
            .collect();
        if gone.is_empty() {
            return;
        }
        for t in &gone {
            self.closed.remove(t);
            self.pending.remove(t);
        }
        let mut freed = 0;
        self.queue.retain(|(t, n)| {
            let keep = !gone.contains(t);
            if !keep {
                freed += cost(n);
            }
            keep
        });
        self.bytes -= freed;
    }
}

/// The serving side's queue of received notifications, shared by its serving threads: at most
/// [`MAX_PENDING_NOTIFIES`] per link, and at most [`NotifyLimits`] over all links.
pub(crate) struct NotifyQueue {
    inner: Mutex<Inner>,
    limits: NotifyLimits,
}

impl NotifyQueue {
    pub fn new(limits: NotifyLimits) -> Self {
        Self {
            inner: Mutex::default(),
            limits,
        }
    }

    /// Queues a notification of link `token`; `Err` with the reason when that link, or the
    /// engine, has too many pending.
    pub fn push(&self, token: u64, n: Notify) -> Result<(), String> {
        let mut g = lock(&self.inner);
        g.expire(self.limits.grace);
        let size = cost(&n);
        if g.pending.get(&token).copied().unwrap_or(0) >= MAX_PENDING_NOTIFIES {
            return Err(format!(
                "more than {MAX_PENDING_NOTIFIES} notifications pending on this link"
            ));
        }
        if g.queue.len() >= self.limits.max_count
            || g.bytes.saturating_add(size) > self.limits.max_bytes
        {
            return Err(format!(
                "the engine's notification queue is full ({} notifications, {} bytes pending)",
                g.queue.len(),
                g.bytes
            ));
        }
        *g.pending.entry(token).or_insert(0) += 1;
        g.bytes += size;
        g.queue.push_back((token, n));
        Ok(())
    }

    /// Link `token` closed: its pending notifications stay for the grace period, then go.
    pub fn link_closed(&self, token: u64) {
        let mut g = lock(&self.inner);
        if g.pending.contains_key(&token) {
            g.closed.entry(token).or_insert_with(Instant::now);
        }
    }

    /// Link `token` has a lane again (a client rejoined it): its notifications are kept.
    pub fn link_reopened(&self, token: u64) {
        lock(&self.inner).closed.remove(&token);
    }

    /// Takes every queued notification, oldest first.
    pub fn drain(&self) -> Vec<Notify> {
        let mut g = lock(&self.inner);
        g.expire(self.limits.grace);
        g.pending.clear();
        g.closed.clear();
        g.bytes = 0;
        g.queue.drain(..).map(|(_, n)| n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(len: usize) -> Notify {
        Notify {
            from: String::new(),
            name: "n".repeat(len),
            msg: String::new(),
        }
    }

    #[test]
    fn the_queue_is_bounded_over_all_links() {
        let q = NotifyQueue::new(NotifyLimits {
            max_count: 10,
            max_bytes: 1000,
            grace: Duration::from_secs(3600),
        });
        for t in 0..5 {
            q.push(t, n(1)).unwrap();
            q.push(t, n(1)).unwrap();
        }
        assert!(q.push(9, n(1)).is_err(), "count bound");
        assert_eq!(q.drain().len(), 10);
        // 1000 bytes: 64 + 400 twice, not a third time
        q.push(1, n(400)).unwrap();
        q.push(2, n(400)).unwrap();
        assert!(q.push(3, n(400)).is_err(), "byte bound");
        assert_eq!(q.drain().len(), 2);
        q.push(3, n(400)).unwrap();
    }

    #[test]
    fn a_closed_links_notifications_expire() {
        let q = NotifyQueue::new(NotifyLimits {
            max_count: 4,
            max_bytes: 1 << 20,
            grace: Duration::ZERO,
        });
        for _ in 0..4 {
            q.push(1, n(10)).unwrap();
        }
        assert!(q.push(2, n(10)).is_err());
        q.link_closed(1);
        q.push(2, n(10)).unwrap();
        let got = q.drain();
        assert_eq!(got.len(), 1);
    }

    #[test]
    fn a_rejoined_links_notifications_are_kept() {
        let q = NotifyQueue::new(NotifyLimits {
            max_count: 4,
            max_bytes: 1 << 20,
            grace: Duration::ZERO,
        });
        for _ in 0..3 {
            q.push(1, n(10)).unwrap();
        }
        q.link_closed(1);
        q.link_reopened(1);
        // the grace (zero) has passed: a closed link's would go at the next push
        q.push(2, n(10)).unwrap();
        assert_eq!(q.drain().len(), 4);
    }
}
