//! The engine's record of a registered region ([`RegionCore`]): the memory it owns, how to free
//! or copy it, who may still touch it (async requests, same-host clients), and its
//! transports' registrations. The user's `Region` handle (src/memory.rs) and every serving thread share it.

use crate::buffers::HostBuffer;
use crate::error::Error;
use crate::transport::Registration;
use crate::types::raw::{RawMemory, RegistrableMemory};
use crate::types::{Access, MemDesc, MemType, RegionView};

/// Replaces memory a peer may have mapped by a private copy (a HostBuffer, since only
/// HostBuffers have a memfd), releasing the shared one.
fn unshare(raw: RawMemory, free: unsafe fn(RawMemory)) -> Result<RawMemory, (Error, RawMemory)> {
    let mut copy = match HostBuffer::new(raw.len) {
        Ok(b) => b,
        Err(e) => return Err((e, raw)),
    };
    // SAFETY: `raw` describes `len` readable bytes; `copy` is a fresh buffer of the same length.
    unsafe { std::ptr::copy_nonoverlapping(raw.ptr.as_ptr(), copy.as_mut_ptr(), raw.len) };
    // SAFETY: `free` is the release function of the type that produced `raw`, called once.
    unsafe { free(raw) };
    Ok(copy.into_raw_parts())
}

/// The engine-side record of a registered region: shared by the user's `Region` handle, the
/// engine's table and every serving thread, so the memory lives while any of them may touch it.
pub(crate) struct RegionCore {
    pub(crate) id: u32,
    pub(crate) engine: u64,
    pub(crate) addr: usize,
    pub(crate) len: usize,
    pub(crate) mem_type: MemType,
    pub(crate) access: Access,
    /// The sealed memfd behind the memory, or -1.
    pub(crate) fd: i32,
    /// Set once the memfd was offered to a same-host peer, which may have mapped it.
    pub(crate) exposed: std::sync::atomic::AtomicBool,
    /// The owned memory and how to free it; `None` once handed back, or for raw registrations.
    owned: Option<(RawMemory, unsafe fn(RawMemory))>,
    /// How to copy the owned memory into a new value of its type, for quarantine; only memory
    /// that can be copied is offered to same-host peers for one-sided access.
    dup: Option<Duplicate>,
    /// Fences of same-host clients that did not confirm in time that they stopped touching the
    /// memory (set when the engine stops serving); while one of them may still touch it, the
    /// memory is quarantined instead of handed back or freed.
    pub(crate) blockers: std::sync::Mutex<crate::runtime::revoke::quarantine::Blockers>,
    /// The engine's quarantine counters.
    pub(crate) stats: std::sync::Arc<crate::runtime::revoke::quarantine::Stats>,
    /// Async requests using the region that have not ended (a forgotten request does not end
    /// the borrow the compiler sees, so `read_at`/`write_at` check this).
    pub(crate) uses: crate::sync::model::AtomicUsize,
    /// The engine's device, on an engine that has one: `read_device`/`write_device` copy with
    /// it.
    pub(crate) device: Option<std::sync::Arc<crate::device::Device>>,
    /// What the engine's transports registered of the region with their libraries
    /// ([`Backend::register`](crate::transport::Backend::register): HCCL's, on an Ascend
    /// engine); released before the memory.
    pub(crate) registrations: Vec<Registration>,
    /// Peers' TCP requests applying to the region right now; closed when the region is
    /// withdrawn from a serving engine's table.
    pub(crate) gate: std::sync::Arc<ServeGate>,
}

/// Counts the peer requests being applied to a region, so that withdrawing it from a serving
/// engine (HIXL's `DeregisterMem` while linked) can wait until none touches it, and refuses
/// every later one. Each request inside is listed by its lane's connection id, so a withdrawal
/// that has waited long enough can cut those lanes. (Its locks are the loom model's,
/// `loom_model` below.)
pub(crate) struct ServeGate {
    /// The connection ids of the requests inside (one per request), and whether the gate is
    /// closed.
    state: crate::sync::model::Mutex<(Vec<u64>, bool)>,
    left: crate::sync::model::Condvar,
}

impl Default for ServeGate {
    fn default() -> Self {
        ServeGate {
            state: crate::sync::model::Mutex::new((Vec::new(), false)),
            left: crate::sync::model::Condvar::new(),
        }
    }
}

impl std::fmt::Debug for ServeGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = crate::sync::model::lock(&self.state);
        f.debug_struct("ServeGate")
            .field("inside", &s.0.len())
            .field("closed", &s.1)
            .finish()
    }
}

impl ServeGate {
    /// A request of the lane `conn` starts applying to the region; `false` once the gate is
    /// closed (the region was withdrawn: the request must not touch it).
    pub(crate) fn enter(&self, conn: u64) -> bool {
        let mut s = crate::sync::model::lock(&self.state);
        if s.1 {
            return false;
        }
        s.0.push(conn);
        true
    }

    /// A request of the lane `conn` that [`enter`](Self::enter)ed is done with the region.
    pub(crate) fn leave(&self, conn: u64) {
        let mut s = crate::sync::model::lock(&self.state);
        if let Some(i) = s.0.iter().position(|&c| c == conn) {
            s.0.swap_remove(i);
        }
        if s.0.is_empty() {
            self.left.notify_all();
        }
    }

    /// Closes the gate and waits until every request inside has left.
    pub(crate) fn close(&self) {
        let mut s = crate::sync::model::lock(&self.state);
        s.1 = true;
        while !s.0.is_empty() {
            s = self.left.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Calls `cut` with the lanes of the requests inside now, under the gate's lock (so no lane
    /// whose request left meanwhile is named); nothing when none is inside.
    pub(crate) fn cut_inside(&self, cut: impl FnOnce(&[u64])) {
        let s = crate::sync::model::lock(&self.state);
        if !s.0.is_empty() {
            cut(&s.0);
        }
    }

    /// Closes the gate and waits up to `grace` for the requests inside to leave; returns the
    /// lanes of those still inside then (empty: none is), for the caller to cut before it
    /// waits for them ([`close`](Self::close)).
    pub(crate) fn close_within(&self, grace: std::time::Duration) -> Vec<u64> {
        let until = crate::error::deadline_after(std::time::Instant::now(), grace);
        let mut s = crate::sync::model::lock(&self.state);
        s.1 = true;
        while !s.0.is_empty() {
            let rem = until.saturating_duration_since(std::time::Instant::now());
            if rem.is_zero() {
                break;
            }
            s = (self.left.wait_timeout(s, rem))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        s.0.clone()
    }
}

/// Copies owned memory into a new value of the same type and returns its raw parts.
type Duplicate = unsafe fn(&RawMemory) -> Option<RawMemory>;

/// The copy function for `M`, for the memory types the crate knows how to copy: `Vec<u8>`,
/// `Box<[u8]>` and [`HostBuffer`].
fn duplicator<M: RegistrableMemory>() -> Option<Duplicate> {
    use std::any::TypeId;
    let t = TypeId::of::<M>();
    if t == TypeId::of::<Vec<u8>>() {
        Some(dup_vec)
    } else if t == TypeId::of::<Box<[u8]>>() {
        Some(dup_box)
    } else if t == TypeId::of::<HostBuffer>() {
        Some(dup_host_buffer)
    } else {
        None
    }
}

/// A `Vec<u8>` holding a copy of `raw`'s bytes, or `None` if it cannot be allocated.
///
/// # Safety
/// `raw` must describe `len` bytes valid for reads.
unsafe fn copy_to_vec(raw: &RawMemory) -> Option<Vec<u8>> {
    let mut v: Vec<u8> = Vec::new();
    v.try_reserve_exact(raw.len).ok()?;
    // SAFETY: `raw` is readable (the caller's contract); `v` has room for `len` bytes, which
    // are initialised by the copy before `set_len`. The source may be written by another
    // process meanwhile: it is read through raw pointers only, and any byte value is valid.
    unsafe {
        std::ptr::copy_nonoverlapping(raw.ptr.as_ptr(), v.as_mut_ptr(), raw.len);
        v.set_len(raw.len);
    }
    Some(v)
}

/// A `Vec<u8>` copy of `raw`'s bytes, as raw parts (a [`Duplicate`] for `Vec<u8>` regions).
///
/// # Safety
/// As [`copy_to_vec`]: `raw` must describe `len` bytes valid for reads.
unsafe fn dup_vec(raw: &RawMemory) -> Option<RawMemory> {
    // SAFETY: forwarded caller contract.
    unsafe { copy_to_vec(raw) }.map(RegistrableMemory::into_raw_parts)
}

/// A `Box<[u8]>` copy of `raw`'s bytes, as raw parts (a [`Duplicate`] for `Box<[u8]>`).
///
/// # Safety
/// As [`copy_to_vec`]: `raw` must describe `len` bytes valid for reads.
unsafe fn dup_box(raw: &RawMemory) -> Option<RawMemory> {
    // SAFETY: forwarded caller contract.
    unsafe { copy_to_vec(raw) }.map(|v| v.into_boxed_slice().into_raw_parts())
}

/// A [`HostBuffer`] copy of `raw`'s bytes, as raw parts (a [`Duplicate`] for `HostBuffer`).
///
/// # Safety
/// `raw` must describe `len` bytes valid for reads.
unsafe fn dup_host_buffer(raw: &RawMemory) -> Option<RawMemory> {
    let mut b = HostBuffer::new(raw.len).ok()?;
    // SAFETY: `raw` is readable (the caller's contract); `b` is a fresh buffer of that length.
    unsafe { std::ptr::copy_nonoverlapping(raw.ptr.as_ptr(), b.as_mut_ptr(), raw.len) };
    Some(b.into_raw_parts())
}

// SAFETY: the core only stores addresses and owned memory of a `Send` type; the memory itself is
// only touched through raw pointers by the engine's transfer code and `read_at`/`write_at`.
unsafe impl Send for RegionCore {}
// SAFETY: what `&RegionCore` changes is behind locks or atomics (`uses`, `blockers`, the gate,
// the stats) or is the memory's mapping, which `privatize` replaces in place with one
// `mremap` system call (the pages stay valid at the same address throughout); the memory
// itself is only touched through raw pointers, as for `Send`.
unsafe impl Sync for RegionCore {}

/// Gives `raw` back to its type `M`, which drops it (frees the memory).
///
/// # Safety
/// `raw` came from `M::into_raw_parts`, is released once, and nothing (this engine or a peer)
/// touches its memory any more.
unsafe fn release<M: RegistrableMemory>(raw: RawMemory) {
    // SAFETY: `raw` came from `M::into_raw_parts` and is released once (see `RegionCore::drop`).
    drop(unsafe { M::from_raw_parts(raw) });
}

impl RegionCore {
    /// Whether an async request that uses the region has not ended (its memory may still be
    /// touched by the engine).
    pub(crate) fn in_use(&self) -> bool {
        self.uses.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// The rule every way memory leaves its registration goes through (the typed
    /// `deregister`, the compat engine's live deregistration and release, and so the C ABI and
    /// Python), and `read_at`/`write_at` too: `RegionBusy` while an async request that uses the
    /// region has not ended, as it may still be copying into or out of the memory. A request
    /// that is held borrows the region (the typed API's `&mut` and consuming calls do not
    /// compile beside it); one that was `mem::forget`ten, or one the compat engine holds by id,
    /// is caught here. No new use can start meanwhile: a use is taken from a live `Region`
    /// (which the typed calls consume or borrow mutably) under the compat engine's read lock
    /// (its deregistration holds the write lock).
    pub(crate) fn check_idle(&self) -> Result<(), Error> {
        if self.in_use() {
            return Err(Error::RegionBusy { region: self.id });
        }
        Ok(())
    }

    /// `RegionBusy` while a same-host client that `deactivate` or `finalize` gave up on
    /// (stopped or hung inside its fence past `finalize_timeout`) may still write the memory:
    /// until it leaves its fence or exits, what it copies lands here, so the owner's own copies
    /// (`read_at`/`write_at`) wait for that (`deregister` hands back a copy instead).
    pub(crate) fn check_unblocked(&self) -> Result<(), Error> {
        if !self.live_blockers().is_empty() {
            return Err(Error::RegionBusy { region: self.id });
        }
        Ok(())
    }

    /// What a transport needs to know of the region.
    pub(crate) fn view(&self) -> RegionView {
        RegionView {
            id: self.id,
            addr: self.addr,
            len: self.len,
            mem_type: self.mem_type,
            access: self.access,
        }
    }

    pub(crate) fn new_owned<M: RegistrableMemory>(
        id: u32,
        engine: u64,
        raw: RawMemory,
        access: Access,
    ) -> Self {
        let desc = MemDesc {
            addr: raw.ptr.as_ptr() as usize,
            len: raw.len,
        };
        let mut r = Self::new_raw(id, engine, desc, raw.mem_type, access);
        r.fd = raw.fd;
        r.dup = duplicator::<M>();
        // released with `release::<M>` when the record goes
        r.owned = Some((raw, release::<M> as unsafe fn(RawMemory)));
        r
    }

    pub(crate) fn new_raw(
        id: u32,
        engine: u64,
        desc: MemDesc,
        mem_type: MemType,
        access: Access,
    ) -> Self {
        Self {
            id,
            engine,
            addr: desc.addr,
            len: desc.len,
            mem_type,
            access,
            fd: -1,
            exposed: std::sync::atomic::AtomicBool::new(false),
            owned: None,
            dup: None,
            blockers: std::sync::Mutex::new(Vec::new()),
            stats: Default::default(),
            uses: crate::sync::model::AtomicUsize::new(0),
            device: None,
            registrations: Vec::new(),
            gate: Default::default(),
        }
    }

    /// Whether same-host peers may reach the memory one-sidedly (mapped or `/proc/PID/mem`):
    /// only owned memory the engine can quarantine (copy out and keep) is offered; the rest is
    /// served over TCP, by serving threads the engine joins before it hands memory back.
    pub(crate) fn one_sided(&self) -> bool {
        self.dup.is_some()
    }

    /// The fences still blocking the memory (none if every client confirmed, or is gone).
    fn live_blockers(&self) -> crate::runtime::revoke::quarantine::Blockers {
        let b = std::sync::Mutex::lock(&self.blockers)
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if crate::runtime::revoke::quarantine::blocking(&b) {
            b
        } else {
            Vec::new()
        }
    }

    /// Takes the owned memory out (deregistration); the core then frees nothing. Memory a
    /// same-host peer may have mapped is replaced by a private copy first.
    pub(crate) fn take_raw(&mut self) -> Result<Option<RawMemory>, Error> {
        // the transports' registrations go first: the memory is about to leave the engine
        self.registrations.clear();
        let Some((raw, free)) = self.owned.take() else {
            return Ok(None);
        };
        let blockers = self.live_blockers();
        if !blockers.is_empty() {
            // a same-host client may still write the original: hand back a copy, keep it
            let copy = self.dup.and_then(|dup| {
                // SAFETY: `raw` is this region's owned memory, readable; `dup` is the copy
                // function of the type that produced it.
                unsafe { dup(&raw) }
            });
            let Some(copy) = copy else {
                self.owned = Some((raw, free));
                return Err(Error::OutOfMemory { len: self.len });
            };
            crate::runtime::revoke::quarantine::hold(raw, free, blockers, &self.stats);
            return Ok(Some(copy));
        }
        if raw.fd < 0 || !self.exposed.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(Some(raw));
        }
        match unshare(raw, free) {
            Ok(copy) => Ok(Some(copy)),
            Err((e, raw)) => {
                self.owned = Some((raw, free));
                Err(e)
            }
        }
    }

    /// Makes the owned memory private where a same-host peer may have mapped it (its memfd
    /// was offered), keeping its address and bytes ([`HostBuffer::privatize`]): for engine
    /// memory that outlives its registration at the same address (the compat engine's
    /// [`HostMem`](crate::compat::HostMem) and the Python views over it), so that once its
    /// registration ends no peer reaches the pages this process sees, stuck peers given up on
    /// by `finalize` included. (Same-host clients reach a memfd region only through its
    /// mapping, never at its address.) Nothing to do for memory never offered, or already
    /// made private.
    ///
    /// The caller makes sure nothing of this engine moves the region's bytes meanwhile (it is
    /// out of the region table and the serving gate is closed, and no request uses it).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the private copy cannot be made: the memory is left shared.
    pub(crate) fn privatize(&self) -> Result<(), Error> {
        let Some((raw, _)) = &self.owned else {
            return Ok(());
        };
        if raw.fd < 0
            || !self
                .exposed
                .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(());
        }
        // SAFETY: only a `HostBuffer`'s parts carry a memfd (`RawMemory::fd` is set by its
        // `into_raw_parts` alone); the core owns them until it drops, and nothing else maps or
        // unmaps that range meanwhile.
        let r = unsafe { HostBuffer::privatize(raw) };
        if r.is_err() {
            self.exposed
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        r
    }

    pub(crate) fn ptr_at(&self, offset: usize) -> *mut u8 {
        (self.addr + offset) as *mut u8
    }
}

impl Drop for RegionCore {
    fn drop(&mut self) {
        self.registrations.clear();
        if let Some((raw, free)) = self.owned.take() {
            let blockers = self.live_blockers();
            if !blockers.is_empty() {
                // a same-host client may still write it: free it once it cannot
                crate::runtime::revoke::quarantine::hold(raw, free, blockers, &self.stats);
                return;
            }
            // SAFETY: this is the last reference to the region (it is in an `Arc` that is being
            // dropped), so no transfer or serving thread of this process can touch the memory
            // any more, and no same-host client can (none blocks it: every one confirmed, or is
            // gone); `free` is the release function of the type that produced `raw`.
            unsafe { free(raw) }
        }
    }
}

/// An async request's hold on a region: keeps the core alive and counted in its `uses` until
/// the request is done with the memory.
pub(crate) struct RegionUse(std::sync::Arc<RegionCore>);

impl RegionUse {
    pub(crate) fn new(core: &std::sync::Arc<RegionCore>) -> Self {
        core.uses.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self(core.clone())
    }
    pub(crate) fn core(&self) -> &std::sync::Arc<RegionCore> {
        &self.0
    }
}

impl Drop for RegionUse {
    fn drop(&mut self) {
        self.0
            .uses
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl crate::transport::Region for RegionCore {
    fn view(&self) -> RegionView {
        RegionCore::view(self)
    }
    fn registrations(&self) -> &[Registration] {
        &self.registrations
    }
}

/// The serving gate under loom (`RUSTFLAGS="--cfg loom" cargo test --release --lib loom`): a
/// peer's TCP request entering a region (and, if let in, writing its memory) against the
/// region's withdrawal (HIXL's `DeregisterMem` while linked), which closes the gate and then
/// hands the memory back (its owner writes it). The real [`ServeGate`] with loom's lock and
/// condition variable; the memory is a `loom::cell::UnsafeCell`, so loom reports a request's
/// write that is not ordered before the owner's. Properties: a request either is refused or
/// has left before `close` returns; a refused request touches nothing; nobody waits forever.
#[cfg(all(test, loom))]
mod loom_model {
    use super::ServeGate;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    #[test]
    fn a_withdrawal_waits_for_the_requests_it_let_in() {
        loom::model(|| {
            let gate = Arc::new(ServeGate::default());
            // the bytes each request writes (two requests may be inside at once)
            let mem = Arc::new([UnsafeCell::new(0u8), UnsafeCell::new(0u8)]);
            let requests: Vec<_> = (0..2usize)
                .map(|i| {
                    let (gate, mem) = (gate.clone(), mem.clone());
                    loom::thread::spawn(move || {
                        if gate.enter(i as u64) {
                            // SAFETY: loom checks that no access of another thread races it.
                            mem[i].with_mut(|m| unsafe { *m = 1 });
                            gate.leave(i as u64);
                        }
                    })
                })
                .collect();
            gate.close();
            // the region is the owner's again
            for m in mem.iter() {
                // SAFETY: as above.
                m.with_mut(|m| unsafe { *m = 9 });
            }
            assert!(!gate.enter(7), "a request let in after the withdrawal");
            for r in requests {
                r.join().unwrap();
            }
        });
    }
}
