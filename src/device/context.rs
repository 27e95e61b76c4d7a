//! Device-context tokens.
//!
//! HIXL requires device-bound calls to run on the thread where the engine's device context is
//! current (`aclrtGetCurrentContext` / `aclrtSetCurrentContext`). hixl turns that rule into types:
//!
//! - a [`ContextToken`] is proof that the calling thread has the engine's context current. It is
//!   `!Send + !Sync`, can only be minted by binding on the current thread, and is handed to a
//!   closure, so it never crosses threads or `.await` points;
//! - a [`DetachedContext`] is `Send`: the explicit way to carry the context to another thread,
//!   where [`DetachedContext::bind`] makes it current and mints a token there.
//!
//! On an Ascend engine a token is minted only after the engine's ACL context was made current
//! on the calling thread (`aclrtSetCurrentContext`) and confirmed with `aclrtGetCurrentContext`;
//! the previous context is restored when the closure returns. Host-only engines have no device
//! context, so for them binding is trivial; the same API applies.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use super::Device;
use crate::error::Error;

/// Binds `device`'s context (if any) on this thread, mints a token for `engine` and runs `f`.
pub(crate) fn bind<R>(
    engine: u64,
    device: Option<&Device>,
    f: impl FnOnce(&ContextToken<'_>) -> R,
) -> Result<R, Error> {
    let _guard = match device {
        Some(dev) => Some(dev.bind()?),
        None => None,
    };
    let tok = ContextToken::mint(engine);
    Ok(f(&tok))
}

/// Proof that the current thread has an engine's device context bound. `!Send + !Sync`.
pub struct ContextToken<'e> {
    engine: u64,
    _not_send: PhantomData<(*const (), &'e ())>,
}

impl ContextToken<'_> {
    pub(crate) fn mint(engine: u64) -> Self {
        Self {
            engine,
            _not_send: PhantomData,
        }
    }
    /// The engine whose context is bound.
    pub fn engine_id(&self) -> u64 {
        self.engine
    }
}

impl fmt::Debug for ContextToken<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContextToken")
            .field("engine", &self.engine)
            .finish()
    }
}

/// An engine's device context, detached from the thread it was taken on. `Send`, so it can move
/// to a worker thread, where [`DetachedContext::bind`] makes it current again.
#[derive(Debug, Clone)]
pub struct DetachedContext {
    engine: u64,
    device: Option<Arc<Device>>,
}

impl DetachedContext {
    pub(crate) fn new(engine: u64, device: Option<Arc<Device>>) -> Self {
        Self { engine, device }
    }

    /// Binds the context on the calling thread (`aclrtSetCurrentContext` on an Ascend engine)
    /// and runs `f` with a token for it; the thread's previous context comes back afterwards.
    ///
    /// # Errors
    /// [`Error::Native`] when ACL cannot make the context current; host engines cannot fail.
    pub fn bind<R>(&self, f: impl FnOnce(&ContextToken<'_>) -> R) -> Result<R, Error> {
        bind(self.engine, self.device.as_deref(), f)
    }

    /// The engine whose context this is.
    pub fn engine_id(&self) -> u64 {
        self.engine
    }
}

static_assertions::assert_not_impl_any!(ContextToken<'static>: Send, Sync);
static_assertions::assert_impl_all!(DetachedContext: Send, Sync);
