//! Registration: the `Initialized` and `Registered` states' methods (initialize, register,
//! activate), deregistration, and the typed registration operations on the engine core.

use std::marker::PhantomData;
use std::sync::Arc;

use super::{Connected, Hixl, Initialized, Quiescent, Reclaim, Registered, TransitionError};
use crate::device::ContextToken;
use crate::error::{Error, HandedBack};
use crate::memory::Region;
use crate::options::Options;
use crate::runtime::handle::Engine;
use crate::sync::lock;
use crate::types::raw::RegistrableMemory;
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
        if options.auto_connect {
            return Err(Error::UnsupportedOption {
                key: "AutoConnect".into(),
                value: "1".into(),
                why: "links are explicit capabilities in the typed API; hixl::compat::Hixl honours AutoConnect",
            });
        }
        Ok(Hixl {
            inner: super::Owner(Engine::initialize(name, options, ephemeral)?),
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
        match owned(&self.inner, mem, access, false) {
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
        // SAFETY: the caller upholds `register_raw`'s contract (this function's `# Safety`).
        match unsafe { raw(&self.inner, desc, mem_type, Access::ReadWrite) } {
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
        owned(&self.inner, mem, Access::ReadWrite, false)
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
        owned(&self.inner, mem, access, false)
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
        // SAFETY: the caller upholds this function's `# Safety`.
        unsafe { raw(&self.inner, desc, mem_type, Access::ReadWrite) }
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
        // SAFETY: the caller upholds this function's `# Safety`.
        unsafe { raw(&self.inner, desc, mem_type, access) }
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
        owned(&self.inner, mem, Access::ReadWrite, true)
    }

    /// Closes registration and opens the engine to links: a listening engine starts serving its
    /// regions (their table is frozen and sent to each client at connect), and
    /// [`Hixl::connect`] becomes available.
    ///
    /// # Errors
    /// [`Error::Listen`] (`FAILED`) if serving threads cannot be started; the engine comes back
    /// in `Registered`.
    pub fn activate(self) -> Result<Hixl<Connected>, TransitionError<Registered>> {
        match self.inner.open() {
            Ok(()) => Ok(self.into_state()),
            Err(error) => Err(TransitionError {
                error,
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
        deregister(&self.inner, region)
    }
}

/// Registers owned memory with the core engine and wraps the record in the typed capability.
fn owned<M: RegistrableMemory>(
    e: &Engine,
    mem: M,
    access: Access,
    device: bool,
) -> Result<Region<M>, HandedBack<M>> {
    e.register_owned(mem, access, device).map(|core| Region {
        core,
        _mem: PhantomData,
    })
}

/// Registers caller-managed memory with the core engine and wraps the record in the typed
/// capability.
///
/// # Safety
/// [`Engine::register_raw`]'s contract.
unsafe fn raw(
    e: &Engine,
    desc: MemDesc,
    mem_type: MemType,
    access: Access,
) -> Result<Region<MemDesc>, Error> {
    // SAFETY: forwarded to the caller.
    unsafe { e.register_raw(desc, mem_type, access) }.map(|core| Region {
        core,
        _mem: PhantomData,
    })
}

/// The typed deregistration on the core engine: through the one in-use rule
/// ([`Engine::releasable`]), out of the table, and the memory handed back (the last holder of
/// the record takes its parts out once).
fn deregister<M: Reclaim>(e: &Engine, region: Region<M>) -> Result<M, HandedBack<Region<M>>> {
    if let Err(error) = e.releasable(&region.core) {
        return Err(HandedBack {
            error,
            value: region,
        });
    }
    let mut regs = lock(&e.regions);
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
                    tracing::debug!(parent: &e.span, region = core.id, "deregistered");
                    // SAFETY: `Region<M>` is only created by `owned::<M>` (with the parts of
                    // `M::into_raw_parts`, or a HostBuffer copy of them for a HostBuffer) or,
                    // for `M = MemDesc`, by `raw`; this is the last reference to the core, and
                    // `take_raw` hands the parts out once.
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
