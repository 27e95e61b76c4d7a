//! The one place a transport is registered: the backends an engine uses besides TCP, in
//! preference order (a link's batches take the first of its data paths that covers them).
//! A new transport is a [`DataPath`](crate::transport::DataPath) and a [`Backend`] in its own
//! folder under `src/transport/`, and one line here.

use std::sync::Arc;

use crate::error::Error;
use crate::options::{Options, Ucx};
use crate::transport::Backend;
use crate::transport::ascend::{AscendBackend, Runtime};
use crate::transport::same_host::SameHostBackend;
use crate::transport::ucx::{UcxBackend, UcxEngine};

/// The engine's backends: Ascend (device memory), UCX, same host. `ascend` is the engine's
/// Ascend runtime, if it has one.
///
/// # Errors
/// What a transport the options require reports when it cannot start (UCX without a pre-shared
/// key, or missing with `Ucx::Require`).
pub(crate) fn backends(
    options: &Options,
    ascend: Option<Arc<Runtime>>,
) -> Result<Vec<Arc<dyn Backend>>, Error> {
    Ok(vec![
        Arc::new(AscendBackend::new(ascend)),
        Arc::new(UcxBackend::new(ucx(options)?, options.ucx == Ucx::Require)),
        // a link sets it up only when the peer is on this host (`Options::same_host`)
        Arc::new(SameHostBackend),
    ])
}

/// The engine's UCX context, when its options ask for UCX and it loads.
fn ucx(options: &Options) -> Result<Option<UcxEngine>, Error> {
    let policy = options.ucx;
    if policy == Ucx::Off {
        return Ok(None);
    }
    if options.psk.is_none() {
        return Err(Error::InvalidOption {
            key: "hixl.Ucx".into(),
            value: format!("{policy:?}").to_lowercase(),
            problem: "UCX needs Options::psk: its remote keys give access UCX does not bound-check, so only authenticated peers may get them",
        });
    }
    match UcxEngine::new() {
        Ok(u) => Ok(Some(u)),
        Err(e) if policy == Ucx::Require => Err(e),
        Err(e) => {
            tracing::debug!(error = %e, "UCX unavailable; links use tcp or same-host");
            Ok(None)
        }
    }
}
