//! Revocable one-sided access for same-host clients: a *fence* page shared by the serving
//! engine and one client process per link.
//!
//! Same-host transfers are one-sided: the client copies into the server's memory (a mapped
//! memfd, or `/proc/PID/mem`) with no work by the server. So the server cannot see a copy in
//! flight, and without help it could hand memory back to its owner (deactivate, deregister,
//! finalize, drop) while a client is still writing it. The fence closes that gap:
//!
//! - The server makes one page (a sealed memfd) per same-host link and offers it in WELCOME; the
//!   client maps it. It holds three words: `revoked`, `abandoned` and `inflight`.
//! - The client brackets every batch: `inflight += 1`, then checks `revoked` (set: the batch is
//!   refused, nothing moves); after the copy, `inflight -= 1`, then checks `abandoned` (set: the
//!   batch is reported failed, whatever it copied).
//! - To stop serving, the server sets `revoked` on every fence, then waits (up to its grace
//!   period) until each fence's `inflight` is 0 or its client process is gone (pidfd). A client
//!   that does not get there in time (stopped, hung) cannot be trusted: the server sets
//!   `abandoned`, and the memory that client could reach is *quarantined* (see
//!   [`quarantine`](super::quarantine)): its owner gets a copy, and the original pages are freed only once the
//!   fence settles (`inflight` 0, or the client process gone).
//!
//! All three words are sequentially consistent atomics (the page is shared memory, so the
//! other process's accesses are the hardware's atomic operations on the same physical page),
//! and each side puts a `SeqCst` fence between its write and its read of the other's word (the
//! store-buffering pattern: the fences order the two sides, so at least one sees the other's
//! write; the loom model below checks it, and loom honours `SeqCst` fences, not `SeqCst`
//! accesses alone). Why it holds: a client batch that saw `revoked == 0` had incremented
//! `inflight` before the server set `revoked`, so the server sees it in flight and waits for
//! it. A batch that reports success read `abandoned == 0` after its decrement, so the server
//! set `abandoned` later and, reading `inflight` after that, observes the decrement (a
//! release): the batch's bytes are in the memory the server hands back, and no quarantine is
//! needed for it.
//!
//! The fence protects a correct program from itself; it is not a defence against a hostile
//! same-host client, which has the right to trace the server anyway (that right is what the
//! same-host transport needs).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering::SeqCst;

use crate::process::{Mapping, PeerProc, Pinned, sealed_memfd};
use crate::sync::model::{AtomicU32, AtomicU64, fence};
#[cfg(test)]
use crate::types::HostId;

/// The words of a fence page, and the protocol on them (both sides). The loom model at the end
/// of this file runs these very functions on every interleaving.
#[repr(C)]
struct Words {
    revoked: AtomicU32,
    abandoned: AtomicU32,
    inflight: AtomicU64,
    /// The link's token (its WELCOME's), written by the server before it offers the fence: a
    /// client that took the descriptor by its number checks it is this link's page (the number
    /// may name another file of the server's by then: its fence closed, the number reused).
    tag: AtomicU64,
}

impl Words {
    /// Client: enters for one batch; `None` if access was revoked (move nothing).
    fn enter(&self) -> Option<Pass<'_>> {
        self.inflight.fetch_add(1, SeqCst);
        // store-buffering (Dekker) against `revoke`: with a SeqCst fence between each side's
        // write and its read, at least one sees the other's write
        fence(SeqCst);
        if self.revoked.load(SeqCst) != 0 {
            self.inflight.fetch_sub(1, SeqCst);
            return None;
        }
        Some(Pass {
            words: self,
            left: false,
        })
    }

    /// Server: no batch may start any more.
    fn revoke(&self) {
        self.revoked.store(1, SeqCst);
        fence(SeqCst);
    }

    /// Server: no batch is in flight.
    fn idle(&self) -> bool {
        self.inflight.load(SeqCst) == 0
    }

    /// Server: gives up waiting (batches still in flight will report failure).
    fn abandon(&self) {
        self.abandoned.store(1, SeqCst);
        fence(SeqCst);
    }
}

/// What the server's stop and the quarantine need of a fence (so the loom model can run them
/// on fences without a page or a process).
pub(crate) trait Revocable {
    /// No batch may start any more.
    fn revoke(&self);
    /// Whether no batch of this client can touch the memory any more.
    fn settled(&self) -> bool;
    /// Gives up waiting; whether it settled after all.
    fn abandon(&self) -> bool;
}

impl<T: Revocable> Revocable for std::sync::Arc<T> {
    fn revoke(&self) {
        (**self).revoke()
    }
    fn settled(&self) -> bool {
        (**self).settled()
    }
    fn abandon(&self) -> bool {
        (**self).abandon()
    }
}

impl Revocable for ServerFence {
    fn revoke(&self) {
        ServerFence::revoke(self)
    }
    /// [`ServerFence::spent`]: a fence that is not revoked belongs to a live link, whose client
    /// may start a batch at any time (the quarantine holds memory such a link could reach).
    fn settled(&self) -> bool {
        ServerFence::spent(self)
    }
    fn abandon(&self) -> bool {
        ServerFence::abandon(self)
    }
}

/// The server's side of stopping: revokes every fence, waits while `wait` says so (it returns
/// false once the grace period is over) for all to settle, then gives up on those that did not:
/// they are returned (their batches will report failure; the memory they reach must be
/// quarantined).
pub(crate) fn revoke_all<F: Revocable>(fences: Vec<F>, mut wait: impl FnMut() -> bool) -> Vec<F> {
    for f in &fences {
        f.revoke();
    }
    while blocking(&fences) && wait() {}
    fences.into_iter().filter(|f| !f.abandon()).collect()
}

/// Whether any of `fences` may still touch the memory it guards: what the quarantine waits for
/// before it frees memory they block.
pub(crate) fn blocking<F: Revocable>(fences: &[F]) -> bool {
    fences.iter().any(|f| !f.settled())
}

/// Bytes of a fence page (one page; the words use the first 16).
const FENCE_LEN: u64 = 4096;

/// A fence page mapped into this process.
struct Page {
    map: Mapping,
}

impl Page {
    fn words(&self) -> &Words {
        // SAFETY: the mapping is at least FENCE_LEN bytes, page-aligned (so aligned for the
        // words), readable and writable, and lives as long as `self`. Both processes touch it
        // only with atomic operations; any bit pattern is a valid value of these integers.
        unsafe { &*(self.map.at(0) as *const Words) }
    }
}

/// A place in a server's budget of fences: taken before a fence is made, given back when the
/// fence (its memfd and its client's pidfd) is closed.
#[derive(Debug)]
pub(crate) struct Slot(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Slot {
    /// Takes a place in `count` if fewer than `max` are taken.
    pub(crate) fn take(
        count: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
        max: usize,
    ) -> Option<Self> {
        count
            .fetch_update(SeqCst, SeqCst, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| Slot(count.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// The serving side of one same-host link's fence.
pub(crate) struct ServerFence {
    page: Page,
    /// The memfd behind the page, kept open so the client can take it with `pidfd_getfd`.
    fd: OwnedFd,
    /// The client process, pinned.
    client: Pinned,
    /// The ids of the regions its link was offered one-sidedly (set once, after the table it
    /// got was taken; until then, any region may be in it).
    offered: std::sync::OnceLock<Vec<u32>>,
    /// Its place in the server's budget (declared last: given back once the descriptors are
    /// closed).
    _slot: Option<Slot>,
}

impl std::fmt::Debug for ServerFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = self.page.words();
        f.debug_struct("ServerFence")
            .field("revoked", &w.revoked.load(SeqCst))
            .field("abandoned", &w.abandoned.load(SeqCst))
            .field("inflight", &w.inflight.load(SeqCst))
            .finish()
    }
}

impl ServerFence {
    /// A new fence for a link from the client process `client`.
    #[cfg(test)]
    pub fn new(client: &HostId) -> io::Result<Self> {
        Self::for_pinned(Pinned::open(client)?, None)
    }

    /// A new fence for a link from the process `client` pins (one that proved who it is),
    /// holding `slot` of the server's budget while it lives.
    pub fn for_pinned(client: Pinned, slot: Option<Slot>) -> io::Result<Self> {
        let fd = sealed_memfd(FENCE_LEN as usize)
            .ok_or_else(|| io::Error::other("cannot create a sealed memfd for the fence"))?;
        // SAFETY: a new descriptor that nothing else owns.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let map = Mapping::new(&fd, FENCE_LEN, true)?;
        Ok(Self {
            page: Page { map },
            fd,
            client,
            offered: std::sync::OnceLock::new(),
            _slot: slot,
        })
    }

    /// Marks the page as the fence of the link of `token` (before the WELCOME offers it).
    pub fn tag(&self, token: u64) {
        self.page.words().tag.store(token, SeqCst);
    }

    /// Records the regions its link was offered one-sidedly (the table it was sent).
    pub fn offered(&self, ids: Vec<u32>) {
        let _ = self.offered.set(ids);
    }

    /// Whether its link may reach region `id` one-sidedly: it was offered it, or what it was
    /// offered is not recorded yet (its handshake is taking the table).
    pub fn may_reach(&self, id: u32) -> bool {
        self.offered.get().is_none_or(|ids| ids.contains(&id))
    }

    /// The descriptor the client takes (offered in WELCOME).
    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// No batch may start any more.
    pub fn revoke(&self) {
        self.page.words().revoke();
    }

    /// Whether [`ServerFence::revoke`] was called.
    pub fn is_revoked(&self) -> bool {
        self.page.words().revoked.load(SeqCst) != 0
    }

    /// Whether no batch of this client can touch the memory any more: it has none in flight
    /// (and, once revoked, will start none), or its process is gone.
    pub fn settled(&self) -> bool {
        self.page.words().idle() || self.client.exited()
    }

    /// Whether its client will never touch the memory again: revoked (it starts no batch) and
    /// settled (none in flight, or the client is gone).
    pub fn spent(&self) -> bool {
        self.is_revoked() && self.settled()
    }

    /// Gives up waiting: batches still in flight will report failure. Returns whether the fence
    /// settled after all (then nothing needs quarantine).
    pub fn abandon(&self) -> bool {
        self.page.words().abandon();
        self.settled()
    }
}

/// The client side of a link's fence: the server's page, mapped.
pub(crate) struct ClientFence {
    page: Page,
    /// The forks this process had made when it opened the fence ([`forks`]): a child forked
    /// since inherits the mapping but is not the process the server watches (its exit ends
    /// the server's wait), so it enters nothing.
    forks: u64,
}

/// Forks of this process's forebears so far, counted in each child (`pthread_atfork`): a
/// process whose count differs from the one it recorded is a child forked since.
static FORKED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn count_fork() {
    // (in the child, single-threaded: an atomic add is async-signal-safe)
    FORKED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// This process's fork count, with the counting set up first (once).
///
/// # Errors
/// `pthread_atfork`'s (no memory for the handler): no fence is taken without it.
fn forks() -> io::Result<u64> {
    static COUNTING: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    let rc = *COUNTING.get_or_init(|| {
        // SAFETY: registers a child handler that only adds to an atomic; no preconditions.
        unsafe { libc::pthread_atfork(None, None, Some(count_fork)) }
    });
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(FORKED.load(std::sync::atomic::Ordering::Relaxed))
}

impl std::fmt::Debug for ClientFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientFence").finish_non_exhaustive()
    }
}

impl ClientFence {
    /// Takes the server's fence descriptor `fd` and maps it (checked by [`Mapping::new`]:
    /// shared memory, not hugetlbfs; sealed against shrinking; at least a page), if it is the
    /// fence of the link of `token` (its tag).
    pub fn open(server: &PeerProc, fd: i32, token: u64) -> io::Result<Self> {
        if fd < 0 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the peer offers no fence for same-host access",
            ));
        }
        let fd = server.getfd(fd)?;
        let map = Mapping::new(&fd, FENCE_LEN, true)?;
        let page = Page { map };
        if page.words().tag.load(SeqCst) != token {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the descriptor the peer offered as this link's fence is not its page (its fence \
                 went, and the number names another file now)",
            ));
        }
        Ok(Self {
            page,
            forks: forks()?,
        })
    }

    /// Enters the fence for one batch; `None` if the server revoked access, or this is a
    /// process forked from the one that opened it (move nothing).
    pub fn enter(&self) -> Option<Pass<'_>> {
        // (an atomic load: a system call here cost the 8-byte batch a fifth of its time)
        if FORKED.load(std::sync::atomic::Ordering::Relaxed) != self.forks {
            return None;
        }
        self.page.words().enter()
    }
}

/// One batch inside a fence. Leave with [`Pass::leave`]; dropping it leaves too (unwinding).
pub(crate) struct Pass<'a> {
    words: &'a Words,
    left: bool,
}

impl Pass<'_> {
    /// The fence's word the server sets when it gives this client up (a data path polls it
    /// between its parts: [`Batch::given_up`](crate::transport::Batch)).
    pub(crate) fn given_up_word(&self) -> &AtomicU32 {
        &self.words.abandoned
    }

    /// Leaves the fence; `false` if the server gave up waiting for this batch (report it
    /// failed: the server may have handed back a copy taken before its bytes landed).
    pub fn leave(mut self) -> bool {
        self.left = true;
        self.words.inflight.fetch_sub(1, SeqCst);
        // against `abandon`, as in `enter`
        fence(SeqCst);
        self.words.abandoned.load(SeqCst) == 0
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if !self.left {
            self.words.inflight.fetch_sub(1, SeqCst);
        }
    }
}

/// A test hook: with `HIXL_TEST_STOP_IN_FENCE=1` in its environment, a process stops itself
/// (`SIGSTOP`) inside the fence of its first same-host batch, before moving a byte. The tests
/// use it to make "a client stopped in the middle of a batch" happen every time, not by luck.
#[cfg(not(feature = "testkit"))]
#[inline(always)]
pub(crate) fn test_pause() {}

/// The test hook itself, in builds with the `testkit` feature only.
#[cfg(feature = "testkit")]
pub(crate) fn test_pause() {
    static ONCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    static ARMED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ARMED.get_or_init(|| std::env::var_os("HIXL_TEST_STOP_IN_FENCE").is_some_and(|v| v == "1"))
        && !ONCE.swap(true, SeqCst)
    {
        // SAFETY: raising a signal has no memory-safety preconditions.
        unsafe { libc::raise(libc::SIGSTOP) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server fence of the link of `token` (tagged as the worker tags it).
    fn tagged(me: &HostId, token: u64) -> ServerFence {
        let f = ServerFence::new(me).unwrap();
        f.tag(token);
        f
    }

    #[test]
    fn a_fence_between_two_views_of_one_page() {
        let me = HostId::current().expect("/proc tells who we are");
        let server = tagged(&me, 1);
        let proc = PeerProc::open(&me).unwrap();
        let client = ClientFence::open(&proc, server.fd(), 1).unwrap();
        assert!(server.settled());
        let pass = client.enter().expect("not revoked yet");
        assert!(!server.settled(), "a batch is in flight");
        server.revoke();
        assert!(client.enter().is_none(), "revoked: no new batch");
        assert!(!server.settled());
        assert!(pass.leave(), "the server still waits: the batch counts");
        assert!(server.settled());
        // a batch the server gave up on reports failure
        let server = tagged(&me, 2);
        let client = ClientFence::open(&proc, server.fd(), 2).unwrap();
        let pass = client.enter().unwrap();
        server.revoke();
        assert!(!server.abandon(), "still in flight when abandoned");
        assert!(!pass.leave(), "abandoned: the batch must fail");
        assert!(server.settled());
        // dropping a pass leaves too
        let server = tagged(&me, 3);
        let client = ClientFence::open(&proc, server.fd(), 3).unwrap();
        drop(client.enter().unwrap());
        assert!(server.settled());
        assert!(ClientFence::open(&proc, -1, 3).is_err());
    }

    /// A descriptor number that names another sealed memfd of the server by the time the
    /// client takes it (the link's fence closed, the number reused: a `HostBuffer`, all
    /// zeros, or another link's fence) is refused: the client never counts its batches in
    /// the server's memory.
    #[test]
    fn a_descriptor_that_is_not_the_links_fence_is_refused() {
        let me = HostId::current().expect("/proc tells who we are");
        let proc = PeerProc::open(&me).unwrap();
        let other = tagged(&me, 0x5eed);
        let e = ClientFence::open(&proc, other.fd(), 0x1234).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        // a blank sealed memfd, as a `HostBuffer`'s
        let fd = sealed_memfd(FENCE_LEN as usize).unwrap();
        // SAFETY: a new descriptor that nothing else owns.
        let blank = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let e = ClientFence::open(&proc, blank.as_raw_fd(), 0x1234).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(ClientFence::open(&proc, other.fd(), 0x5eed).is_ok());
    }

    /// A process forked from the client (it inherits the mapping) enters no batch: the
    /// server's wait ends when the client it pinned exits, which says nothing of a child.
    #[test]
    fn a_forked_child_enters_no_batch() {
        let me = HostId::current().expect("/proc tells who we are");
        let proc = PeerProc::open(&me).unwrap();
        let server = tagged(&me, 9);
        let mut client = ClientFence::open(&proc, server.fd(), 9).unwrap();
        assert!(client.enter().is_some());
        // a real child: it only tries the fence and exits (async-signal-safe: an atomic load)
        // SAFETY: the child calls nothing but `enter` (no lock, no allocation) and `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            let refused = client.enter().is_none();
            // SAFETY: ends the child at once, running nothing of the parent's.
            unsafe { libc::_exit(if refused { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child this test forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "a forked child entered the fence ({status:#x})"
        );
        assert!(server.settled(), "nothing counted in flight");
        // as any child sees it: a fork counted since the opener recorded its count
        client.forks = client.forks.wrapping_add(1);
        assert!(client.enter().is_none(), "a forked child entered the fence");
        assert!(server.settled(), "nothing counted in flight");
    }
}

/// The fence protocol under loom, which runs every interleaving of the client's batch against
/// the server's stop and the quarantine's release (`RUSTFLAGS="--cfg loom" cargo test --release
/// --lib loom`). The words are the real [`Words`] (with loom's atomics), the protocol steps the
/// real `enter`/`leave`, [`revoke_all`] and [`blocking`] (the quarantine's rule); the one-sided copy
/// and the owner's reuse of the memory are writes to a `loom::cell::UnsafeCell`, so loom reports
/// any two that are not ordered by the protocol.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    /// A server fence without a page or a client process: its words only.
    struct ModelFence(Arc<Words>);

    impl Revocable for ModelFence {
        fn revoke(&self) {
            self.0.revoke()
        }
        /// As [`ServerFence`]'s: revoked and idle (a fence of a live link blocks its memory).
        fn settled(&self) -> bool {
            self.0.revoked.load(SeqCst) != 0 && self.0.idle()
        }
        fn abandon(&self) -> bool {
            self.0.abandon();
            self.0.idle()
        }
    }

    fn words() -> Arc<Words> {
        Arc::new(Words {
            revoked: AtomicU32::new(0),
            abandoned: AtomicU32::new(0),
            inflight: AtomicU64::new(0),
            tag: AtomicU64::new(0),
        })
    }

    /// One client batch writing the server's memory (1), against the server stopping: it either
    /// hands the memory back to its owner at once (copying it, then the owner writes 2), or, for
    /// a client it gave up on, quarantines it and frees it (3) once the fence settled.
    /// Properties: no write of the client races the owner's or the free (loom checks the cell);
    /// a batch that reports `Ok` has its byte in what the owner got back.
    #[test]
    fn a_batch_against_stop_and_quarantine() {
        loom::model(|| {
            let w = words();
            let mem = Arc::new(UnsafeCell::new(0u8));
            let client = {
                let (w, mem) = (w.clone(), mem.clone());
                loom::thread::spawn(move || match w.enter() {
                    None => false,
                    Some(pass) => {
                        // SAFETY: loom checks that no access of another thread races this one.
                        mem.with_mut(|m| unsafe { *m = 1 });
                        pass.leave()
                    }
                })
            };
            // the grace period ends at once: the hardest case for the client
            let stuck = revoke_all(vec![ModelFence(w.clone())], || false);
            let handed_back = if stuck.is_empty() {
                // SAFETY: as above.
                let copy = mem.with_mut(|m| unsafe {
                    let copy = *m;
                    *m = 2;
                    copy
                });
                Some(copy)
            } else {
                // quarantined: the owner gets a copy taken now (of unspecified bytes: the batch
                // it may race reports failure), and the memory is freed once no blocker may
                // touch it
                while blocking(&stuck) {
                    loom::thread::yield_now();
                }
                // SAFETY: as above.
                mem.with_mut(|m| unsafe { *m = 3 });
                None
            };
            let ok = client.join().unwrap();
            if ok && let Some(copy) = handed_back {
                assert_eq!(
                    copy, 1,
                    "an Ok batch whose bytes are missing from the hand-back"
                );
            }
            if ok {
                assert!(
                    handed_back.is_some(),
                    "an Ok batch whose memory was quarantined"
                );
            }
        });
    }
}
