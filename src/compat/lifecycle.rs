//! The engine's lifecycle: initialize, finalize, and registering memory (which steps the typed
//! engine back to `Registered` and activates it again).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Core, Error, Hixl, HostMem, MemDesc, MemHandle, Reg, Result, not_initialized};
use crate::runtime::handle::Engine;
use crate::sync::lock;
use crate::{Access, AsyncConnectStatus, MemType, Options, Status};

/// [`RegionCore::privatize`](crate::runtime::region::RegionCore::privatize) for an
/// engine-allocated buffer whose registration ended while its [`HostMem`] may live on.
fn privatize(core: &crate::runtime::region::RegionCore) {
    if let Err(e) = core.privatize() {
        tracing::warn!(region = core.id, error = %e,
            "an engine-allocated buffer could not be made private: a same-host peer that mapped it may still reach its pages");
    }
}

/// The next memory handle: unique in the process, not per engine, so a handle one engine gave
/// out never names a region of another (a caller holding a stale handle of an engine that was
/// replaced, as LLM-DataDist's role switch replaces its engine, gets `PARAM_INVALID` from the
/// new one, never another tensor's deregistration). Never 0.
fn next_handle() -> MemHandle {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Hixl {
    /// HIXL `Initialize`: `local_engine` is `"ip"` (a client only), `"ip:port"` (listens there;
    /// port 0 listens on a port the OS chooses, see [`Hixl::local_engine`]), or the IPv6 forms
    /// `"[ip]"`, `"[ip]:port"`. Options are HIXL's string keys ([`Options::from_pairs`]).
    ///
    /// # Errors
    /// `FAILED` if already initialized (or finalized: an engine is initialized once), the
    /// errors of [`Options::from_pairs`] and of the engine's start (as
    /// [`crate::Hixl::initialize`]'s: a bad name, a port that cannot be bound).
    pub fn initialize<K: AsRef<str>, V: AsRef<str>>(
        &self,
        local_engine: &str,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Result<()> {
        let mut core = self.write();
        if core.engine.is_some() || core.finalized {
            return Err(Error::new(
                Status::FAILED,
                "the engine is already initialized",
            ));
        }
        let mut options = Options::from_pairs(options)?;
        let auto = std::mem::take(&mut options.auto_connect);
        let timeout = options.connect_timeout;
        // "ip:0" / "[ip]:0": listen on an ephemeral port (the typed initialize reads port 0 as
        // "no port", HIXL's client-only form)
        let explicit_zero = local_engine.ends_with("]:0")
            || (local_engine.parse::<std::net::Ipv6Addr>().is_err()
                && local_engine.ends_with(":0"));
        let engine = Engine::initialize(local_engine, options, explicit_zero)?;
        engine.open()?;
        core.engine = Some(engine);
        core.auto_connect = auto;
        core.connect_timeout = timeout;
        Ok(())
    }

    /// The engine's name as peers connect to it (with the port it got, for port 0).
    ///
    /// # Errors
    /// `FAILED` before `initialize` or after `finalize`.
    pub fn local_engine(&self) -> Result<String> {
        match &self.read().engine {
            Some(e) => Ok(e.name.clone()),
            None => Err(not_initialized()),
        }
    }

    /// An extension: the engine's [`Metrics`](crate::Metrics) (regions, links, and the
    /// memory held until same-host peers cannot reach it any more: `quarantined_regions`,
    /// `quarantined_bytes`).
    ///
    /// # Errors
    /// `FAILED` before `initialize` or after `finalize`.
    pub fn metrics(&self) -> Result<crate::Metrics> {
        match &self.read().engine {
            Some(e) => Ok(e.metrics()),
            None => Err(not_initialized()),
        }
    }

    /// HIXL `Finalize`: requests in flight are cancelled and waited for (a running one ends at
    /// the latest at its deadline, [`ASYNC_DEADLINE`](super::ASYNC_DEADLINE)), every link closes, serving stops (the
    /// typed engine's `finalize`: requests being served get its grace period), the regions are
    /// released. When it returns, nothing of this engine touches registered memory any more.
    /// Calling it again, or before `initialize`, does nothing.
    pub fn finalize(&self) {
        let mut core = self.write();
        let engine = core.engine.take();
        if engine.is_some() {
            core.finalized = true;
        }
        // requests in flight may still write the caller's memory: stop them, and return only
        // once each has ended (a running one ends at the latest at its deadline)
        let reqs = std::mem::take(&mut *lock(&self.reqs));
        for p in reqs.values() {
            p.req.cancel();
        }
        for l in self.peers.drop_all(false) {
            l.close_quietly();
        }
        for p in reqs.values() {
            while !p.req.wait(Duration::from_secs(1)).is_terminal() {}
        }
        drop(reqs);
        if let Some(e) = engine {
            e.finalize();
        }
        // engine-allocated buffers outlive the engine in their keep-alives: a same-host peer
        // that `finalize` gave up on (stopped inside its fence) may still write the pages it
        // mapped, so the keep-alives get private pages at the same address first
        for reg in core.handles.values().filter(|r| r.allocated) {
            privatize(&reg.core);
        }
        core.handles.clear();
    }

    /// HIXL `RegisterMem`: makes `desc` reachable by this engine's transfers and, unless
    /// `local_only`, by peers (READ and WRITE). Returns a non-zero handle, unique in the process
    /// (another engine's `deregister_mem` does nothing with it). As in HIXL, links may
    /// exist: the region is usable by this engine's transfers at once and is in the table of
    /// every peer that connects from now on (a link sees the peer's table as it was when the
    /// link was made).
    ///
    /// # Safety
    /// Until the handle is deregistered or the engine finalized:
    /// - `desc.addr..desc.addr + desc.len` must stay allocated, mapped and valid for reads and
    ///   writes of any byte values;
    /// - nothing else may access it in a way that conflicts with transfers: peers READ and
    ///   WRITE it at any time, and this engine's READ transfers write it.
    ///
    /// (This is the typed [`crate::Hixl::register_raw`]'s contract: both register with the same
    /// core engine call.)
    ///
    /// # Errors
    /// `FAILED` when not initialized; `UNSUPPORTED` for device memory on an engine without
    /// Ascend (no CANN found); `PARAM_INVALID` for a null address, zero length, overflow or
    /// overlap with a registered region; `RESOURCE_EXHAUSTED` for too many regions.
    pub unsafe fn register_mem(&self, desc: MemDesc, mem_type: MemType) -> Result<MemHandle> {
        let mut core = self.write();
        let access = if desc.local_only {
            Access::None
        } else {
            Access::ReadWrite
        };
        let raw = crate::MemDesc {
            addr: desc.addr,
            len: desc.len,
        };
        let region = self.with_engine(&mut core, "register memory", |e| {
            // SAFETY: the caller upholds `Engine::register_raw`'s contract (this function's
            // `# Safety`).
            unsafe { e.register_raw(raw, mem_type, access) }.map_err(Error::from)
        })?;
        let handle = next_handle();
        core.handles.insert(
            handle,
            Reg {
                core: region,
                allocated: false,
            },
        );
        Ok(handle)
    }

    /// A hixl extension: allocates `len` zeroed bytes of page-aligned host memory owned by
    /// the engine, registers them (peers may READ and WRITE them) and returns the buffer's
    /// keep-alive ([`HostMem`]: its address and handle). As with `register_mem`, links may
    /// exist: the buffer is usable by this engine's transfers at once and is in the table of
    /// every peer that connects from now on.
    ///
    /// Unlike caller-managed memory, which same-host peers reach over TCP (the engine cannot
    /// keep memory from its owner while a one-sided peer may still write it), the buffer lives
    /// in a sealed memfd that same-host peers map: READ and WRITE are then a memory copy by the
    /// peer, with no work by this engine. Safe: the engine decides when the memory is freed.
    /// [`Hixl::deregister_mem`] with its handle (or `finalize`) ends the registration (and
    /// gives the [`HostMem`] private pages, at the same address, where a same-host peer may
    /// have mapped it); the memory is freed once the [`HostMem`] is dropped too and no
    /// same-host link that may reach the pages it shared remains (until then they are kept,
    /// never reused).
    ///
    /// # Errors
    /// `FAILED` when not initialized; `PARAM_INVALID` for `len == 0`; `RESOURCE_EXHAUSTED` when
    /// the memory cannot be allocated or the region table is full.
    pub fn alloc_host_mem(&self, len: usize) -> Result<HostMem> {
        self.alloc_host_mem_with(len, Access::ReadWrite)
    }

    /// [`Hixl::alloc_host_mem`] with the access peers get (the LLM-DataDist layer publishes its
    /// cache table read-only, HIXL-CS servers their memory list; [`Access::None`]: a buffer
    /// only this engine's own transfers use, left out of peers' tables).
    ///
    /// # Errors
    /// As [`Hixl::alloc_host_mem`].
    pub fn alloc_host_mem_with(&self, len: usize, access: Access) -> Result<HostMem> {
        let mut core = self.write();
        if core.engine.is_none() {
            return Err(not_initialized());
        }
        // kept mapped by the HostMem after its registration: a memfd, or nothing
        let buf = crate::HostBuffer::shared(len)?;
        let region = self.with_engine(&mut core, "allocate memory", move |e| {
            e.register_owned(buf, access, false)
                .map_err(|h| Error::from(h.error))
        })?;
        let mem = HostMem {
            core: region.clone(),
            handle: next_handle(),
        };
        core.handles.insert(
            mem.handle,
            Reg {
                core: region,
                allocated: true,
            },
        );
        Ok(mem)
    }

    /// HIXL `DeregisterMem`. As in HIXL, links may exist: peers' later requests for the region
    /// are refused (`PARAM_INVALID`) without touching it, requests being served from or into it
    /// are waited for (`hixl.FinalizeTimeoutMs`, then their lanes are cut), and every device data path that bound
    /// it (its HCCL communicator) is closed, so links that used one break and, with
    /// AutoConnect, connect again on their next call. Refused (`RESOURCE_EXHAUSTED`, the region
    /// stays registered) while a transfer of this engine uses the region (an async request,
    /// or a sync transfer running on another thread): it may still be copying into or out of
    /// it. (A sync transfer holds no lock of the engine while it waits for its peer: other
    /// calls, registrations included, go on meanwhile.)
    ///
    /// For a buffer of [`Hixl::alloc_host_mem`], this engine's transfers and peers' TCP
    /// requests refuse it from now on, and its [`HostMem`] gets private pages at the same
    /// address: a same-host peer whose link got it in its table may still copy into or out of
    /// the pages it mapped until that link ends (a link's one-sided access cannot be taken back
    /// for one region), which are kept until then, but never again what the `HostMem` shows.
    ///
    /// # Errors
    /// `FAILED` when not initialized; `PARAM_INVALID` for handle 0 (HIXL's null handle; an
    /// unknown or already-deregistered handle is `SUCCESS` with no effect, as in HIXL);
    /// `RESOURCE_EXHAUSTED` while a transfer still uses the region; `UNSUPPORTED` while
    /// links exist on an engine that serves the region one-sided over UCX.
    pub fn deregister_mem(&self, handle: MemHandle) -> Result<()> {
        let mut core = self.write();
        if core.engine.is_none() {
            return Err(not_initialized());
        }
        if handle == 0 {
            return Err(Error::new(
                Status::PARAM_INVALID,
                "mem_handle can not be null",
            ));
        }
        let Some(reg) = core.handles.get(&handle) else {
            // HIXL: an unknown or already-freed handle is no error, and nothing is done
            tracing::warn!(handle, "deregister_mem: the handle is not registered here");
            return Ok(());
        };
        let region = reg.core.clone();
        let allocated = reg.allocated;
        let e = core.engine.as_ref().expect("checked above");
        // fabric memory (EnableUseFabricMem=1): upstream refuses while any peer is connected
        if let Some(why) = e.deregistration_blocked() {
            return Err(Error::new(Status::FAILED, why));
        }
        // live where the engine serves and its transports let go of one region alone; else
        // with no link in either direction, serving stopped meanwhile
        let r = match e.deregister(&region) {
            Ok(()) => Ok(()),
            // a transfer still uses it: stepping back would not change that
            Err(busy @ crate::Error::RegionBusy { .. }) => Err(Error::from(busy)),
            Err(_) => self.with_registered(&mut core, "deregister memory", |e| {
                Ok(e.deregister(&region)?)
            }),
        };
        if r.is_ok() {
            core.handles.remove(&handle);
            if allocated {
                // out of the table, its gate closed: no peer's pages are the keep-alive's
                // from now on, whatever a same-host link that got it still does
                privatize(&region);
            }
        }
        r
    }

    /// Runs `f` on the engine: open to links (it registers live) when it is; else, or where
    /// `f` cannot be done live, see [`Hixl::with_registered`].
    fn with_engine<T>(
        &self,
        core: &mut Core,
        what: &str,
        f: impl FnOnce(&Engine) -> Result<T>,
    ) -> Result<T> {
        match &core.engine {
            None => Err(not_initialized()),
            Some(e) if e.is_open() => f(e),
            Some(_) => self.with_registered(core, what, f),
        }
    }

    /// Runs `f` on the engine closed to links (serving stopped), then opens it again. Refused
    /// (`UNSUPPORTED`) while any link exists in either direction.
    fn with_registered<T>(
        &self,
        core: &mut Core,
        what: &str,
        f: impl FnOnce(&Engine) -> Result<T>,
    ) -> Result<T> {
        let Some(e) = core.engine.clone() else {
            return Err(not_initialized());
        };
        let busy = if e.is_open() { self.link_count(&e) } else { 0 };
        if busy > 0 {
            return Err(Error::new(
                Status::UNSUPPORTED,
                format!(
                    "cannot {what} while {busy} link(s) exist: disconnect them first (hixl \
                     stops serving to change the region table, which would revoke peers' access)"
                ),
            ));
        }
        if e.is_open() {
            drop(self.peers.drop_all(true)); // closed here: closing waits for their requests
            e.close();
        }
        let r = f(&e);
        // serving could not restart: the engine stays closed and the next call that needs it
        // tries again
        if let Err(error) = e.open()
            && r.is_ok()
        {
            return Err(error.into());
        }
        r
    }

    /// Links in either direction: ours (held, in the async queue, or being found or made
    /// without the core's lock: counted under the write lock the caller holds, no call can
    /// start one meanwhile) and peers' to us.
    fn link_count(&self, e: &Engine) -> usize {
        let held = self.peers.usable_count() + self.peers.in_flight();
        let queued = e
            .async_connect_statuses()
            .values()
            .filter(|s| {
                !matches!(
                    s,
                    AsyncConnectStatus::NotConnect | AsyncConnectStatus::ConnectFailed
                )
            })
            .count();
        held + queued + e.served_links()
    }

    /// `FAILED` unless initialized (and not finalized since).
    pub(super) fn initialized(&self) -> Result<()> {
        match self.read().engine {
            Some(_) => Ok(()),
            None => Err(not_initialized()),
        }
    }

    /// The engine, open to links (a restart of serving that failed earlier is reported).
    pub(super) fn connected<'c>(&self, core: &'c Core) -> Result<&'c Engine> {
        match &core.engine {
            Some(e) if e.is_open() => Ok(e),
            Some(_) => Err(Error::new(
                Status::FAILED,
                "serving could not be restarted after the last (de)registration; register or \
                 deregister again to retry",
            )),
            _ => Err(not_initialized()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `alloc_host_mem` when no memfd can be made (the descriptor limit): refused with
    /// `RESOURCE_EXHAUSTED`, nothing registered. The buffer would otherwise be anonymous memory,
    /// which a same-host peer reaches at its address and which the `HostMem` keeps mapped
    /// there after deregistration: that peer would write into memory handed back. Before, the
    /// allocation fell back to anonymous memory and was offered one-sided.
    #[test]
    fn engine_memory_without_a_memfd_is_refused() {
        let e = Hixl::new();
        let none: [(&str, &str); 0] = [];
        e.initialize("127.0.0.1", none).unwrap();
        crate::process::NO_MEMFD.set(true);
        let r = e.alloc_host_mem(4096);
        crate::process::NO_MEMFD.set(false);
        let err = r.expect_err("no memfd");
        assert_eq!(err.status(), Status::RESOURCE_EXHAUSTED, "{err}");
        assert_eq!(e.metrics().unwrap().regions, 0);
        let m = e.alloc_host_mem(4096).expect("with a memfd");
        assert_eq!(e.metrics().unwrap().regions, 1);
        e.deregister_mem(m.handle()).unwrap();
        e.finalize();
    }

    /// Registers `buf` with `e` (both live until the end of the test that calls it).
    fn reg(e: &Hixl, buf: &mut [u8]) -> MemHandle {
        let desc = MemDesc {
            addr: buf.as_mut_ptr() as usize,
            len: buf.len(),
            local_only: false,
        };
        // SAFETY: the buffers outlive the engines (finalized at the end of the test), no peer
        // connects to them, and nothing reads or writes them while they are registered.
        unsafe { e.register_mem(desc, MemType::Host) }.unwrap()
    }

    /// A handle of engine A given to engine B deregisters nothing of B's (HIXL: an unknown
    /// handle is `SUCCESS` with no effect), and A's region stays A's; handle 0 is refused.
    #[test]
    fn a_handle_of_one_compat_engine_is_refused_by_another() {
        let (a, b) = (Hixl::new(), Hixl::new());
        let none: [(&str, &str); 0] = [];
        a.initialize("127.0.0.1", none).unwrap();
        b.initialize("127.0.0.1", none).unwrap();
        let mut mem = vec![vec![0u8; 4096]; 4];
        let [m0, m1, m2, m3] = &mut mem[..] else {
            unreachable!()
        };
        // each engine registers as many regions, in the same order
        let (a0, a1) = (reg(&a, m0), reg(&a, m1));
        let (b0, b1) = (reg(&b, m2), reg(&b, m3));
        for h in [a0, a1] {
            assert_ne!(h, b0);
            assert_ne!(h, b1);
            b.deregister_mem(h)
                .expect("an unknown handle: nothing to do");
        }
        assert_eq!(
            b.metrics().unwrap().regions,
            2,
            "B kept both of its regions"
        );
        assert_eq!(
            a.metrics().unwrap().regions,
            2,
            "A kept both of its regions"
        );
        let e = b.deregister_mem(0).expect_err("the null handle");
        assert_eq!(e.status(), Status::PARAM_INVALID);
        for (e, h) in [(&a, a0), (&a, a1), (&b, b0), (&b, b1)] {
            e.deregister_mem(h).unwrap();
        }
        a.finalize();
        b.finalize();
    }
}
