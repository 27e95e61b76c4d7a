//! Notifications (HIXL `SendNotify` / `GetNotifies`): short messages a client sends over a link,
//! acknowledged by the serving engine and drained with [`Hixl::get_notifies`](crate::Hixl::get_notifies).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Longest notification name or message, in bytes (as HIXL).
pub const MAX_NOTIFY_LEN: usize = 1024;
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

#[derive(Default)]
struct Inner {
    queue: VecDeque<(u64, Notify)>,
    pending: HashMap<u64, usize>,
}

/// The serving side's queue of received notifications, shared by its serving threads.
#[derive(Default)]
pub(crate) struct NotifyQueue {
    inner: Mutex<Inner>,
}

impl NotifyQueue {
    /// Queues a notification of link `token`; `false` when that link has too many pending.
    pub fn push(&self, token: u64, n: Notify) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let pending = g.pending.entry(token).or_insert(0);
        if *pending >= MAX_PENDING_NOTIFIES {
            return false;
        }
        *pending += 1;
        g.queue.push_back((token, n));
        true
    }

    /// Takes every queued notification, oldest first.
    pub fn drain(&self) -> Vec<Notify> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.pending.clear();
        g.queue.drain(..).map(|(_, n)| n).collect()
    }
}
