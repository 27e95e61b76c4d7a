//! Registration: the `Initialized` and `Registered` states' methods (initialize, register,
//! activate), deregistration, and the typed registration operations on the engine core.

use std::marker::PhantomData;
use std::sync::Arc;

use super::{Connected, Hixl, Initialized, Quiescent, Reclaim, Registered, TransitionError};
use crate::device::ContextToken;
use crate::error::{Error, HandedBack, check_timeout};
use crate::memory::Region;
use crate::options::Options;
use crate::runtime::engine::EngineInner;
use crate::runtime::region::RegionCore;
use crate::sync::lock;
use crate::types::engine_name::EngineName;
use crate::types::raw::{RawMemory, RegistrableMemory};
use crate::types::{Access, MemDesc, MemType};

impl Hixl<Initialized> {
    /// Creates an engine (HIXL `Initialize`) named `"ip"`, `"ip:port"`, `"[ipv6]"` or
    /// `"[ipv6]:port"`. With a port > 0 the engine listens on that address (only that address)
    /// and serves its regions once connected; without one it is a client only.
    ///
    /// # Errors
    /// [`Error::InvalidEngineName`] (`PARAM_INVALID`) for a bad name; [`Error::Listen`]
    /// (`FAILED`) when the port cannot be bound.
    pub fn initialize(name: &str, options: Options) -> Result<Self, Error> {
        Self::initialize_with(name, options, false)
    }

    /// Like [`Hixl::initialize`], but a name without a port (or with port 0) listens on a port
    /// the OS chooses; [`Hixl::name`] then reports it. Useful for tests and examples.
    ///
    /// # Errors
    /// As [`Hixl::initialize`].
    pub fn initialize_ephemeral(name: &str, options: Options) -> Result<Self, Error> {
        Self::initialize_with(name, options, true)
    }

    fn initialize_with(name: &str, options: Options, ephemeral: bool) -> Result<Self, Error> {
        let parsed = EngineName::parse(name)?;
        check_timeout(options.connect_timeout)?;
        if options.auto_connect {
            return Err(Error::UnsupportedOption {
                key: "AutoConnect".into(),
                value: "1".into(),
                why: "links are explicit capabilities in the typed API; hixl::compat::Hixl honours AutoConnect",
            });
        }
        if options.psk.as_ref().is_some_and(|k| k.len() < 16) {
            return Err(Error::InvalidOption {
                key: "psk".into(),
                value: "<redacted>".into(),
                problem: "a pre-shared key needs at least 16 bytes",
            });
        }
        Ok(Hixl {
            inner: EngineInner::new(parsed, options, ephemeral)?,
            _state: PhantomData,
        })
    }

    /// Registers the first region (HIXL `RegisterMem`) with read-write access for peers; the
    /// engine moves to `Registered`.
    ///
    /// # Errors
    /// As [`Hixl::<Registered>::register`]; the engine and the memory come back in the error.
    #[allow(clippy::type_complexity)]
    pub fn register<M: RegistrableMemory>(
        self,
        mem: M,
    ) -> Result<(Hixl<Registered>, Region<M>), TransitionError<Initialized, M>> {
        self.register_with(mem, Access::ReadWrite)
    }

    /// Registers the first region with the given remote access rights.
    ///
    /// # Errors
    /// As [`Hixl::<Registered>::register`]; the engine and the memory come back in the error.
    #[allow(clippy::type_complexity)]
    pub fn register_with<M: RegistrableMemory>(
        self,
        mem: M,
        access: Access,
    ) -> Result<(Hixl<Registered>, Region<M>), TransitionError<Initialized, M>> {
        match self.inner.register_owned(mem, access, false) {
            Ok(r) => Ok((self.into_state(), r)),
            Err(HandedBack { error, value }) => Err(TransitionError {
                error,
                engine: self,
                value,
            }),
        }
    }

    /// Registers caller-managed memory as the first region (HIXL's `MemDesc` form).
    ///
    /// # Safety
    /// As [`Hixl::<Registered>::register_raw`].
    ///
    /// # Errors
    /// As [`Hixl::<Registered>::register_raw`]; the engine comes back in the error.
    pub unsafe fn register_raw(
        self,
        desc: MemDesc,
        mem_type: MemType,
    ) -> Result<(Hixl<Registered>, Region<MemDesc>), TransitionError<Initialized>> {
        match self.inner.register_raw(desc, mem_type, Access::ReadWrite) {
            Ok(r) => Ok((self.into_state(), r)),
            Err(error) => Err(TransitionError {
                error,
                engine: self,
                value: (),
            }),
        }
    }

    /// Moves to `Registered` without registering anything (a client that only needs to be
    /// connected, or code that registers in a loop).
    pub fn into_registered(self) -> Hixl<Registered> {
        self.into_state()
    }
}

impl Hixl<Registered> {
    /// Registers memory the engine takes ownership of (HIXL `RegisterMem`), with read-write
    /// access for peers. Deregistering hands it back.
    ///
    /// # Errors
    /// The memory comes back in the [`HandedBack`] error. `PARAM_INVALID`:
    /// [`Error::ZeroLengthRegion`], [`Error::AlreadyRegistered`], [`Error::OverlappingRegion`];
    /// `RESOURCE_EXHAUSTED`: [`Error::TooManyRegions`]; `UNSUPPORTED`: [`Error::UnsupportedMemory`]
    /// for device memory.
    pub fn register<M: RegistrableMemory>(&self, mem: M) -> Result<Region<M>, HandedBack<M>> {
        self.inner.register_owned(mem, Access::ReadWrite, false)
    }

    /// Registers memory with the given remote access rights.
    ///
    /// # Errors
    /// As [`Hixl::<Registered>::register`].
    pub fn register_with<M: RegistrableMemory>(
        &self,
        mem: M,
        access: Access,
    ) -> Result<Region<M>, HandedBack<M>> {
        self.inner.register_owned(mem, access, false)
    }

    /// Registers caller-managed memory (HIXL's `RegisterMem(MemDesc, MemType)` form).
    ///
    /// # Safety
    /// Until the returned region is deregistered (or, if it is dropped instead, until the
    /// engine is finalized or dropped):
    /// - `desc.addr..desc.addr + desc.len` must stay allocated, mapped and valid for reads and
    ///   writes of any byte values;
    /// - nothing else may access it in a way that conflicts with transfers: peers READ it and
    ///   WRITE it at any time while the engine is `Connected`, and local READ transfers write it.
    ///
    /// # Errors
    /// `PARAM_INVALID`: [`Error::ZeroLengthRegion`], [`Error::NullAddress`],
    /// [`Error::AddressOverflow`], [`Error::AlreadyRegistered`], [`Error::OverlappingRegion`];
    /// `RESOURCE_EXHAUSTED`: [`Error::TooManyRegions`]; `UNSUPPORTED`:
    /// [`Error::UnsupportedMemory`] for [`MemType::Device`].
    pub unsafe fn register_raw(
        &self,
        desc: MemDesc,
        mem_type: MemType,
    ) -> Result<Region<MemDesc>, Error> {
        self.inner.register_raw(desc, mem_type, Access::ReadWrite)
    }

    /// [`register_raw`](Hixl::<Registered>::register_raw) with explicit access rights.
    ///
    /// # Safety
    /// As [`Hixl::<Registered>::register_raw`].
    ///
    /// # Errors
    /// As [`Hixl::<Registered>::register_raw`].
    pub unsafe fn register_raw_with(
        &self,
        desc: MemDesc,
        mem_type: MemType,
        access: Access,
    ) -> Result<Region<MemDesc>, Error> {
        self.inner.register_raw(desc, mem_type, access)
    }

    /// Registers memory (device memory included) with a token proving the engine's device
    /// context is bound on this thread, as HIXL requires for device registrations
    /// (`HcclRegisterGlobalMem` runs under it).
    ///
    /// # Errors
    /// [`Error::ForeignHandle`] for a token of another engine; [`Error::UnsupportedMemory`]
    /// (`UNSUPPORTED`) on an engine without an Ascend runtime; the errors of
    /// [`Hixl::<Registered>::register`]; [`Error::Native`] from HCCL. The memory comes back.
    pub fn register_device<M: RegistrableMemory>(
        &self,
        ctx: &ContextToken<'_>,
        mem: M,
    ) -> Result<Region<M>, HandedBack<M>> {
        if ctx.engine_id() != self.inner.id {
            return Err(HandedBack {
                error: Error::ForeignHandle {
                    what: "context token",
                    owner: ctx.engine_id(),
                    engine: self.inner.id,
                },
                value: mem,
            });
        }
        if self.inner.device.is_none() {
            return Err(HandedBack {
                error: Error::UnsupportedMemory {
                    mem_type: MemType::Device,
                    why: self.inner.no_device,
                },
                value: mem,
            });
        }
        self.inner.register_owned(mem, Access::ReadWrite, true)
    }

    /// Closes registration and opens the engine to links: a listening engine starts serving its
    /// regions (their table is frozen and sent to each client at connect), and
    /// [`Hixl::connect`] becomes available.
    ///
    /// # Errors
    /// [`Error::Listen`] (`FAILED`) if serving threads cannot be started; the engine comes back
    /// in `Registered`.
    pub fn activate(self) -> Result<Hixl<Connected>, TransitionError<Registered>> {
        match self.inner.serve() {
            Ok(()) => Ok(self.into_state()),
            Err(source) => Err(TransitionError {
                error: Error::Listen {
                    addr: self.inner.name.clone(),
                    source,
                },
                engine: self,
                value: (),
            }),
        }
    }
}

impl<S: Quiescent> Hixl<S> {
    /// Deregisters a region (HIXL `DeregisterMem`) and hands back its memory. Only possible
    /// where no link exists and nothing is served, so no transfer can touch it any more.
    ///
    /// # Errors
    /// The region comes back in the [`HandedBack`] error: [`Error::ForeignHandle`] for a region of
    /// another engine; [`Error::RegionBusy`] (`RESOURCE_EXHAUSTED`) while an async request that
    /// uses it (a `mem::forget`ten one) has not ended.
    pub fn deregister<M: Reclaim>(&self, region: Region<M>) -> Result<M, HandedBack<Region<M>>> {
        self.inner.deregister(region)
    }
}

/// HIXL's registration while linked, for the compat engine only: the typed API keeps
/// registration after `activate` a compile error (the seed's rule), and these are not public.
impl Hixl<Connected> {
    /// Registers caller-managed memory on an engine open to links (HIXL `RegisterMem` while
    /// linked): usable by this engine's transfers at once, in the table of peers that connect
    /// from now on.
    ///
    /// # Safety
    /// As [`Hixl::<Registered>::register_raw`].
    pub(crate) unsafe fn register_raw_live(
        &self,
        desc: MemDesc,
        mem_type: MemType,
        access: Access,
    ) -> Result<Region<MemDesc>, Error> {
        let region = self.inner.register_raw(desc, mem_type, access)?;
        self.inner.publish(&region.core);
        Ok(region)
    }

    /// Registers memory the engine takes ownership of on an engine open to links (the compat
    /// engine's engine-allocated buffers): as [`register_raw_live`](Self::register_raw_live),
    /// and same-host peers that connect from now on may map it (it is one-sided like any
    /// [`HostBuffer`](crate::HostBuffer) region).
    ///
    /// # Errors
    /// As [`Hixl::<Registered>::register`]; the memory comes back.
    pub(crate) fn register_live<M: RegistrableMemory>(
        &self,
        mem: M,
        access: Access,
    ) -> Result<Region<M>, HandedBack<M>> {
        let region = self.inner.register_owned(mem, access, false)?;
        self.inner.publish(&region.core);
        Ok(region)
    }

    /// Deregisters a region from an engine open to links (HIXL `DeregisterMem` while linked;
    /// see [`EngineInner::withdraw`]) and drops it. When this returns, nothing of the engine
    /// or its peers touches caller-managed memory; memory the engine owns is freed once no
    /// serving thread and no same-host link that may reach it remains (see
    /// [`EngineInner::withdraw`]).
    ///
    /// # Errors
    /// [`Error::ForeignHandle`]; [`Error::RegionBusy`] while an async request of this engine
    /// uses the region; `UNSUPPORTED` as [`EngineInner::withdraw`]. The region comes back, still
    /// registered.
    pub(crate) fn deregister_live<M>(
        &self,
        region: Region<M>,
    ) -> Result<(), HandedBack<Region<M>>> {
        if let Err(error) = self.inner.releasable(&region.core) {
            return Err(HandedBack {
                error,
                value: region,
            });
        }
        if let Err(error) = self.inner.withdraw(&region.core) {
            return Err(HandedBack {
                error,
                value: region,
            });
        }
        self.inner.unlist(&region.core);
        tracing::debug!(parent: &self.inner.span, region = region.core.id, "deregistered while linked");
        // a raw record owns no memory; an owned one frees it when its last holder (a serving
        // thread, a `compat::HostMem`) lets go, or quarantines it while a link may reach it
        drop(region);
        Ok(())
    }
}

impl<S: Quiescent> Hixl<S> {
    /// Deregisters a region and drops it instead of handing its memory back (the compat
    /// engine's engine-allocated buffers, when they are freed with no link): memory a
    /// same-host client that did not confirm in time may still write is quarantined, the
    /// rest freed once the last holder of the record lets go.
    ///
    /// # Errors
    /// [`Error::ForeignHandle`]; [`Error::RegionBusy`] while an async request uses it. The
    /// region comes back.
    pub(crate) fn release<M>(&self, region: Region<M>) -> Result<(), HandedBack<Region<M>>> {
        if let Err(error) = self.inner.releasable(&region.core) {
            return Err(HandedBack {
                error,
                value: region,
            });
        }
        self.inner.unlist(&region.core);
        tracing::debug!(parent: &self.inner.span, region = region.core.id, "released");
        drop(region);
        Ok(())
    }
}

/// The typed registration operations on the engine core: they build and take apart
/// `Region<M>`, the API's ownership of registered memory.
impl EngineInner {
    fn register_owned<M: RegistrableMemory>(
        &self,
        mem: M,
        access: Access,
        with_token: bool,
    ) -> Result<Region<M>, HandedBack<M>> {
        let raw: RawMemory = mem.into_raw_parts();
        let engine = self.id;
        if raw.mem_type() == MemType::Device && !with_token {
            return Err(HandedBack {
                error: Error::UnsupportedMemory {
                    mem_type: MemType::Device,
                    why: "device memory is registered with register_device and a context token",
                },
                // SAFETY: `raw` came from `into_raw_parts` just above and was not registered.
                value: unsafe { M::from_raw_parts(raw) },
            });
        }
        match self.insert(
            raw.ptr().as_ptr() as usize,
            raw.len(),
            raw.mem_type(),
            |id| RegionCore::new_owned::<M>(id, engine, raw, access),
        ) {
            Ok(core) => Ok(Region {
                core,
                _mem: PhantomData,
            }),
            Err(error) => Err(HandedBack {
                error,
                // SAFETY: `raw` came from `into_raw_parts` just above and was not registered.
                value: unsafe { M::from_raw_parts(raw) },
            }),
        }
    }

    fn register_raw(
        &self,
        desc: MemDesc,
        mem_type: MemType,
        access: Access,
    ) -> Result<Region<MemDesc>, Error> {
        let engine = self.id;
        let core = self.insert(desc.addr, desc.len, mem_type, |id| {
            RegionCore::new_raw(id, engine, desc, mem_type, access)
        })?;
        Ok(Region {
            core,
            _mem: PhantomData,
        })
    }

    /// Whether `core` may leave this engine now: [`Error::ForeignHandle`] for a region of
    /// another engine, [`Error::RegionBusy`] while an async request uses it
    /// ([`RegionCore::check_idle`]). Every deregistration path asks this first.
    fn releasable(&self, core: &RegionCore) -> Result<(), Error> {
        if core.engine != self.id {
            return Err(Error::ForeignHandle {
                what: "region",
                owner: core.engine,
                engine: self.id,
            });
        }
        core.check_idle()
    }

    /// Takes the region out of the region table (if it is still there).
    fn unlist(&self, core: &Arc<RegionCore>) {
        let mut regs = lock(&self.regions);
        if regs
            .by_addr
            .get(&core.addr)
            .is_some_and(|r| Arc::ptr_eq(r, core))
        {
            regs.by_addr.remove(&core.addr);
            regs.bytes -= core.len;
        }
    }

    fn deregister<M: Reclaim>(&self, region: Region<M>) -> Result<M, HandedBack<Region<M>>> {
        if let Err(error) = self.releasable(&region.core) {
            return Err(HandedBack {
                error,
                value: region,
            });
        }
        let mut regs = lock(&self.regions);
        let listed = regs
            .by_addr
            .get(&region.core.addr)
            .is_some_and(|r| Arc::ptr_eq(r, &region.core));
        if listed {
            regs.by_addr.remove(&region.core.addr);
            regs.bytes -= region.core.len;
        }
        let (error, core) = match Arc::try_unwrap(region.core) {
            Ok(mut core) => {
                let desc = MemDesc {
                    addr: core.addr,
                    len: core.len,
                };
                match core.take_raw() {
                    Ok(raw) => {
                        tracing::debug!(parent: &self.span, region = core.id, "deregistered");
                        // SAFETY: `Region<M>` is only created by `register_owned::<M>` (with the
                        // parts of `M::into_raw_parts`, or a HostBuffer copy of them for a
                        // HostBuffer) or, for `M = MemDesc`, by `register_raw`; this is the last
                        // reference to the core, and `take_raw` hands the parts out once.
                        return Ok(unsafe { M::reclaim(raw, desc) });
                    }
                    Err(error) => (error, Arc::new(core)),
                }
            }
            Err(core) => (Error::RegionBusy { region: core.id }, core),
        };
        // not handed back: the region stays registered, and comes back to the caller
        if listed {
            regs.bytes += core.len;
            regs.by_addr.insert(core.addr, core.clone());
        }
        Err(HandedBack {
            error,
            value: Region {
                core,
                _mem: PhantomData,
            },
        })
    }
}
