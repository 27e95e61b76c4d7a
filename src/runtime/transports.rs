//! The one place a transport is registered: the backends an engine uses besides TCP, in
//! preference order (a link's batches take the first of its data paths that reaches their
//! regions; every link adds TCP's after theirs, which reaches every region), and the engine's device, which the
//! Ascend transport opens. A new transport is a [`DataPath`](crate::transport::DataPath) and a
//! [`Backend`] in its own folder under `src/transport/`, and one line here.

use std::sync::Arc;

use crate::device::Device;
use crate::error::Error;
use crate::options::{AscendMode, Options, Ucx};
use crate::transport::ascend::fabric::FabricBackend;
/// A fabric-memory engine's runtime (the Ascend transport's), as the engine core holds it.
pub(crate) use crate::transport::ascend::fabric::FabricRt;
use crate::transport::ascend::{AscendBackend, Runtime};
use crate::transport::same_host::SameHostBackend;
use crate::transport::tcp::{Lanes, TcpPath};
use crate::transport::ucx::{UcxBackend, UcxEngine};
use crate::transport::{Backend, DataPath};

/// LLM-DataDist's link by an explicit rank table, HCCL's half (the Ascend transport's): the
/// communicator over the caller's rank table and its descriptor rendezvous
/// (`HcclExchangeMemDesc`); `datadist` links the engines by what the descriptors carry.
pub(crate) use crate::transport::ascend::rank_link::{RankComm, rank_server_ip};

/// Fabric memory's allocator statics and memory kind (the Ascend transport's fabric path), which
/// the crate exports as `hixl::fabric`.
pub use crate::transport::ascend::fabric::{
    FabricBuffer, export_to_shareable_handle, free_mem, malloc_mem,
};

/// TCP's data path over a link's `lanes` (last of a link's data paths: it reaches every region);
/// a large sync batch takes up to `parallel` of them.
pub(crate) fn tcp_path(lanes: Arc<Lanes>, parallel: usize) -> Box<dyn DataPath> {
    Box::new(TcpPath::new(lanes, parallel))
}

/// An engine's transports besides TCP, and its device.
pub(crate) struct Transports {
    /// Ascend (device memory), UCX, same-host: in preference order.
    pub(crate) backends: Vec<Arc<dyn Backend>>,
    /// The engine's device (where CANN loads, or as the options ask): device memory and
    /// context tokens.
    pub(crate) device: Option<Arc<Device>>,
    /// Why device memory is refused, for an engine without a device.
    pub(crate) no_device: &'static str,
    /// A fabric-memory engine's runtime (its unregistered local device memory is checked
    /// with it).
    pub(crate) fabric: Option<Arc<FabricRt>>,
}

/// Starts the transports the options ask for.
///
/// # Errors
/// What a transport the options require reports when it cannot start: Ascend with
/// [`AscendMode::On`] (a missing library, a bad device, ACL's errors), UCX without a pre-shared
/// key, or missing with `Ucx::Require`.
pub(crate) fn start(options: &Options) -> Result<Transports, Error> {
    if options.ascend.enable_fabric_mem {
        // HIXL's FabricMem engine: ACL's VMM and async copies, no HCCL
        crate::transport::ascend::fabric::check_options(options.hixl_options(), &options.ascend)?;
        let rt = crate::transport::ascend::fabric::FabricRt::start(&options.ascend)?;
        let device = Some(rt.device.clone());
        let backends: Vec<Arc<dyn Backend>> = vec![
            Arc::new(FabricBackend::new(rt.clone())),
            Arc::new(AscendBackend::new(None)),
        ];
        return Ok(Transports {
            backends,
            device,
            no_device: "",
            fabric: Some(rt),
        });
    }
    let (ascend, no_device) = match options.ascend_mode {
        AscendMode::On => (Some(Runtime::start(&options.ascend)?), ""),
        AscendMode::Off => (None, "Ascend is off for this engine (hixl.ascend.enable=0)"),
        AscendMode::Auto => match Runtime::start_if_installed(&options.ascend)? {
            Ok(rt) => (Some(rt), ""),
            Err(why) => (None, why),
        },
    };
    let device = ascend.as_ref().map(|rt| rt.device.clone());
    let backends: Vec<Arc<dyn Backend>> = vec![
        Arc::new(AscendBackend::new(ascend)),
        Arc::new(UcxBackend::new(ucx(options)?, options.ucx == Ucx::Require)),
        // a link sets it up only when the peer is on this host (`Options::same_host`)
        Arc::new(SameHostBackend {
            prefault: options.prefault_budget,
        }),
        // answers a fabric-memory client: this engine is not one
        Arc::new(FabricBackend::refuser()),
    ];
    Ok(Transports {
        backends,
        device,
        no_device,
        fabric: None,
    })
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
