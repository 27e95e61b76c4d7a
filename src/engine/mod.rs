//! The engine and its type states.
//!
//! ```text
//! Hixl<Initialized> --register--> Hixl<Registered> --activate--> Hixl<Connected> --finalize--> Hixl<Finalized>
//!                                   ^  (register more)                 |  connect(&self) -> Link<'_>
//!                                   +-------------- deactivate --------+  (all links dropped first)
//! ```
//!
//! `Hixl<S>` is an `Arc` to the engine's resources plus a zero-sized state marker. Methods exist
//! only in the states where they are allowed, and transitions consume the engine, so misuse is a
//! compile error. Fallible transitions hand the engine back in its previous state
//! ([`TransitionError::into_engine`]).

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::device::{Alloc, ContextToken, DetachedContext, DeviceMem};
use crate::error::{Error, Status};
use crate::link::Link;
use crate::memory::Region;
use crate::metrics::Metrics;
use crate::notify::Notify;
use crate::options::Options;
use crate::runtime::handle::Engine;
use crate::types::MemDesc;
use crate::types::MemType;
use crate::types::raw::{RawMemory, RegistrableMemory};

mod connected;
mod register;

mod sealed {
    pub trait Sealed {}
    pub trait SealedReclaim {}
}

/// An engine state. Sealed: the four states below are all there are.
pub trait State: sealed::Sealed + fmt::Debug + Send + Sync + 'static {
    /// The state's name, for diagnostics.
    const NAME: &'static str;
}

/// Initialized: the name is parsed and, for a server, the port is bound. No memory yet.
#[derive(Debug)]
pub struct Initialized;
/// Registered: memory can be registered and deregistered; no link can exist, nothing is served.
#[derive(Debug)]
pub struct Registered;
/// Connected: registration is closed; the engine serves its regions (if it listens) and can
/// connect to remote engines.
#[derive(Debug)]
pub struct Connected;
/// Finalized: everything is torn down; regions can only be handed back.
#[derive(Debug)]
pub struct Finalized;

macro_rules! states {
    ($($s:ident),*) => {$(
        impl sealed::Sealed for $s {}
        impl State for $s { const NAME: &'static str = stringify!($s); }
    )*};
}
states!(Initialized, Registered, Connected, Finalized);

/// States that can be finalized (every state but `Finalized`).
pub trait Live: State {}
impl Live for Initialized {}
impl Live for Registered {}
impl Live for Connected {}

/// States in which no link exists and nothing is served, so regions can be handed back.
pub trait Quiescent: State {}
impl Quiescent for Registered {}
impl Quiescent for Finalized {}

/// A hixl engine in state `S`.
///
/// Created by [`Hixl::initialize`]. See the [crate docs](crate) for the lifecycle.
#[must_use = "dropping an engine tears it down; call `finalize()` to do it explicitly"]
pub struct Hixl<S: State> {
    /// The engine of the core floor: every operation below is one of its handle API's, in the
    /// states where it is allowed.
    inner: Owner,
    _state: PhantomData<S>,
}

/// The typed engine's hold on its core engine: finalized when the `Hixl` value is dropped (not
/// when it moves to its next state, which moves this along). Whatever else holds the core
/// engine for a while (an async connect waiting on its peer, a heartbeat round) does not keep
/// it serving past the drop: "dropping an engine tears it down" holds on return.
pub(crate) struct Owner(Engine);

impl std::ops::Deref for Owner {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        &self.0
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.finalize();
    }
}

impl<S: State> fmt::Debug for Hixl<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hixl")
            .field("state", &S::NAME)
            .field("name", &self.inner.name)
            .field("id", &self.inner.id)
            .finish()
    }
}

/// What deregistration hands back for a region of type `Region<M>`. Sealed.
pub trait Reclaim: sealed::SealedReclaim + Sized {
    #[doc(hidden)]
    /// Rebuilds the value from what the region held: its owned memory (for owned registrations,
    /// handed out once) and its address range.
    ///
    /// # Safety
    /// `raw` must be what `into_raw_parts` of `Self` returned when the region was registered.
    unsafe fn reclaim(raw: Option<RawMemory>, desc: MemDesc) -> Self;
}

impl<M: RegistrableMemory> sealed::SealedReclaim for M {}
impl<M: RegistrableMemory> Reclaim for M {
    unsafe fn reclaim(raw: Option<RawMemory>, _desc: MemDesc) -> Self {
        let raw = raw.expect("a Region<M> of owned memory holds its memory until reclaimed");
        // SAFETY: the caller passes the parts `M::into_raw_parts` produced at registration.
        unsafe { M::from_raw_parts(raw) }
    }
}

impl sealed::SealedReclaim for MemDesc {}
impl Reclaim for MemDesc {
    unsafe fn reclaim(_raw: Option<RawMemory>, desc: MemDesc) -> Self {
        desc
    }
}

/// A failed transition: the error, the engine in its previous state, and whatever else the call
/// consumed (the memory of a failed first registration).
pub struct TransitionError<S: State, M = ()> {
    /// Why the transition failed.
    pub error: Error,
    engine: Hixl<S>,
    value: M,
}

impl<S: State, M> TransitionError<S, M> {
    /// The engine, back in its previous state.
    pub fn into_engine(self) -> Hixl<S> {
        self.engine
    }
    /// The error, the engine and the consumed value.
    pub fn into_parts(self) -> (Error, Hixl<S>, M) {
        (self.error, self.engine, self.value)
    }
    /// HIXL's status code for the failure.
    pub fn status(&self) -> Status {
        self.error.status()
    }
}

impl<S: State, M> fmt::Debug for TransitionError<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransitionError")
            .field("error", &self.error)
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl<S: State, M> fmt::Display for TransitionError<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "transition failed; engine returned in state {}: {}",
            S::NAME,
            self.error
        )
    }
}

impl<S: State, M> std::error::Error for TransitionError<S, M> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<S: State, M> From<TransitionError<S, M>> for Error {
    fn from(e: TransitionError<S, M>) -> Self {
        e.error
    }
}

impl<S: State> Hixl<S> {
    fn into_state<T: State>(self) -> Hixl<T> {
        tracing::debug!(parent: &self.inner.span, from = S::NAME, to = T::NAME, "transition");
        Hixl {
            inner: self.inner,
            _state: PhantomData,
        }
    }

    /// The engine name (for an engine listening on an ephemeral port, with the port it got).
    pub fn name(&self) -> &str {
        &self.inner.name
    }
    /// Whether the engine has an Ascend runtime: it registers and moves device memory
    /// ([`AscendMode`](crate::AscendMode): where CANN loads, by default).
    pub fn uses_ascend(&self) -> bool {
        self.inner.device.is_some()
    }
    /// The engine's id, unique in this process (regions and links carry it).
    pub fn id(&self) -> u64 {
        self.inner.id
    }
    /// The per-process instance id peers see (random; changes when the process restarts).
    pub fn instance(&self) -> u64 {
        self.inner.instance
    }
    /// Whether the engine listens (serves its regions to peers).
    pub fn is_server(&self) -> bool {
        self.inner.is_listening()
    }
    /// The number of registered regions.
    pub fn region_count(&self) -> usize {
        self.inner.region_totals().0
    }
    /// The number of registered bytes.
    pub fn registered_bytes(&self) -> usize {
        self.inner.region_totals().1
    }
    /// The options the engine was initialized with.
    pub fn options(&self) -> &Options {
        &self.inner.options
    }

    /// A snapshot of the engine's metrics: registered regions and bytes, and per link and
    /// operation the bytes, operations, errors by status, requests in flight and latency
    /// percentiles.
    pub fn metrics(&self) -> Metrics {
        self.inner.metrics()
    }

    /// Takes every notification received from peers so far, oldest first (HIXL `GetNotifies`).
    pub fn get_notifies(&self) -> Vec<Notify> {
        self.inner.notifies.drain()
    }

    /// Binds the engine's device context on this thread and runs `f` with a token proving it.
    ///
    /// # Errors
    /// Binding a device context can fail on device backends; host engines always succeed.
    pub fn with_context<R>(&self, f: impl FnOnce(&ContextToken<'_>) -> R) -> Result<R, Error> {
        crate::device::bind(self.inner.id, self.inner.device.as_deref(), f)
    }

    /// The engine's context, detached so it can be carried to another thread and bound there.
    pub fn detach_context(&self) -> DetachedContext {
        DetachedContext::new(self.inner.id, self.inner.device.clone())
    }

    /// Allocates `len` bytes of device memory (`aclrtMalloc`, `ACL_MEM_MALLOC_HUGE_ONLY`) on
    /// the engine's device.
    ///
    /// # Errors
    /// [`Error::UnsupportedMemory`] on an engine without an Ascend runtime;
    /// [`Error::ForeignHandle`] for a token of another engine; [`Error::ZeroLengthRegion`];
    /// [`Error::Native`] from ACL (e.g. `ACL_ERROR_RT_MEMORY_ALLOCATION`, or
    /// `ACL_ERROR_MEMORY_ADDRESS_UNALIGNED` for a misaligned huge-page allocation).
    pub fn alloc_device(
        &self,
        ctx: &ContextToken<'_>,
        len: usize,
    ) -> Result<crate::DeviceBuffer, Error> {
        self.alloc(ctx, len, Alloc::Device)
            .map(crate::DeviceBuffer::from)
    }

    /// Allocates `len` bytes of fabric memory (ACL virtual memory, HIXL's `MallocMem`) of
    /// `mem_type` on a fabric-memory engine's device ([`Options::fabric_mem`]).
    ///
    /// # Errors
    /// [`Error::UnsupportedMemory`] on an engine that is not a fabric-memory engine;
    /// [`Error::ForeignHandle`] for a token of another engine; [`Error::ZeroLengthRegion`];
    /// [`Error::LibraryUnavailable`] for an ACL runtime without the VMM calls;
    /// [`Error::Native`] from ACL.
    pub fn alloc_fabric(
        &self,
        ctx: &ContextToken<'_>,
        mem_type: MemType,
        len: usize,
    ) -> Result<crate::fabric::FabricBuffer, Error> {
        self.alloc(ctx, len, Alloc::Fabric(mem_type))
            .map(crate::fabric::FabricBuffer::from)
    }

    /// Allocates `len` zeroed bytes of pinned host memory (`aclrtMallocHost`).
    ///
    /// # Errors
    /// As [`Hixl::alloc_device`].
    pub fn alloc_pinned_host(
        &self,
        ctx: &ContextToken<'_>,
        len: usize,
    ) -> Result<crate::PinnedHostBuffer, Error> {
        self.alloc(ctx, len, Alloc::PinnedHost)
            .map(crate::PinnedHostBuffer::from)
    }

    /// The one allocation of the three: on the engine's device (fabric memory only on a
    /// fabric-memory engine), under the engine's token.
    fn alloc(&self, ctx: &ContextToken<'_>, len: usize, kind: Alloc) -> Result<DeviceMem, Error> {
        let device = match (&self.inner.device, kind) {
            (Some(d), Alloc::Fabric(_)) if self.inner.options.uses_fabric_mem() => d,
            (_, Alloc::Fabric(mem_type)) => {
                return Err(Error::UnsupportedMemory {
                    mem_type,
                    why: "fabric memory needs a fabric-memory engine (Options::fabric_mem, or \
                          EnableUseFabricMem=1)",
                });
            }
            (Some(d), _) => d,
            (None, _) => {
                return Err(Error::UnsupportedMemory {
                    mem_type: MemType::Device,
                    why: self.inner.no_device,
                });
            }
        };
        DeviceMem::alloc(device, self.inner.id, ctx, len, kind)
    }
}

impl<S: Live> Hixl<S> {
    /// Tears the engine down (HIXL `Finalize`): serving stops (requests in flight get up to the
    /// `finalize_timeout` option to finish), the listening socket closes, and the region table is
    /// released. Regions still held can be handed back with [`Hixl::deregister`] on the
    /// finalized engine; dropped ones are freed.
    pub fn finalize(self) -> Hixl<Finalized> {
        self.inner.finalize();
        self.into_state()
    }
}

static_assertions::assert_eq_size!(Hixl<Initialized>, Hixl<Connected>);
static_assertions::assert_eq_size!(Hixl<Registered>, Arc<()>);
static_assertions::assert_eq_size!(Hixl<Finalized>, Hixl<Registered>);
static_assertions::assert_impl_all!(Hixl<Connected>: Send, Sync);
static_assertions::assert_impl_all!(Hixl<Registered>: Send, Sync);
static_assertions::assert_impl_all!(Link<'static>: Send, Sync);
static_assertions::assert_impl_all!(Region<crate::HostBuffer>: Send, Sync);
static_assertions::assert_impl_all!(TransitionError<Registered>: std::error::Error, Send, Sync);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::engine_name::EngineName;

    #[test]
    fn engine_names() {
        let ok = [
            ("127.0.0.1", "127.0.0.1", None),
            ("10.1.2.3:26000", "10.1.2.3:26000", Some(26000)),
            ("10.1.2.3:0", "10.1.2.3", None),
            ("[::1]:7", "[::1]:7", Some(7)),
            ("[fe80::1]", "[fe80::1]", None),
            ("::1", "[::1]", None),
        ];
        for (name, shown, port) in ok {
            let n = EngineName::parse(name).unwrap();
            assert_eq!(n.to_string(), shown);
            assert_eq!(n.port, port);
        }
        for bad in [
            "",
            "localhost",
            "1.2.3",
            "1.2.3.4:",
            "1.2.3.4:x",
            "1.2.3.4:65536",
            "1.2.3.4:-1",
            "[::1",
            "[::1]x",
            "[1.2.3.4]:5",
            " 1.2.3.4",
            "1.2.3.4:5:6",
        ] {
            let e = EngineName::parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidEngineName { .. }), "{bad:?}");
            assert_eq!(e.status(), Status::PARAM_INVALID);
        }
    }
}
