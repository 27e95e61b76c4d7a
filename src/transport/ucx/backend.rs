//! UCX's engine-wide part ([`Backend`]): the engine's UCX context, its regions mapped for its
//! own links and, while it serves, the serving worker; a new link asks the server for its
//! worker address and keys (`UCXASK` → `UCXINFO`) and connects an endpoint.

use std::any::Any;
use std::sync::{Arc, Mutex};

use super::{UcxEngine, UcxLink, UcxLocal, UcxServer};
use crate::error::{Error, Status};
use crate::sync::lock;
use crate::transport::{Accept, AcceptFail, Backend, DataPath, Regions, Setup, TransportKind};
use crate::types::RegionView;
use crate::wire::{self, Kind, UcxInfo, WireError};

/// UCX for one engine. Without a context (the engine does not use UCX) it sets nothing up and
/// answers `UCXASK` with `UNSUPPORTED`.
pub(crate) struct UcxBackend {
    eng: Option<UcxEngine>,
    /// A link that cannot use UCX fails (instead of moving its data over TCP).
    require: bool,
    /// The serving side while the engine serves.
    server: Mutex<Option<UcxServer>>,
    /// This engine's regions mapped for zero-copy PUT/GET on its links, while connected (in
    /// the context of the links made last: mapped again when the context is renewed).
    local: Mutex<Option<Arc<UcxLocal>>>,
    /// The regions UCX was given at `activate` (served one-sided to peers while it serves).
    mapped: Mutex<Vec<RegionView>>,
}

impl UcxBackend {
    /// UCX with the context `eng` (`None`: the engine does not use UCX); `require`: links must
    /// use it.
    pub(crate) fn new(eng: Option<UcxEngine>, require: bool) -> Self {
        Self {
            eng,
            require,
            server: Mutex::new(None),
            local: Mutex::new(None),
            mapped: Mutex::new(Vec::new()),
        }
    }

    /// Asks the server for its worker and keys: `Err` with the server's reason when it does not
    /// serve this client over UCX.
    fn ask(setup: &mut Setup<'_>) -> Result<Result<UcxInfo, String>, Error> {
        let ctl = &mut *setup.ctl;
        ctl.send(&wire::header(Kind::UcxAsk, 0), setup.deadline)?;
        match ctl.recv(setup.deadline)? {
            (Kind::UcxInfo, p) => UcxInfo::decode(&p)
                .map(Ok)
                .map_err(|e| ctl.protocol(e.to_string())),
            (Kind::Done, p) => match wire::decode_done(&p) {
                Ok((0, status, reason)) if status != 0 => Ok(Err(reason)),
                _ => Err(ctl.protocol("a malformed answer to UCXASK".into())),
            },
            (k, _) => Err(ctl.protocol(format!("expected UCXINFO, got {k:?}"))),
        }
    }
}

impl UcxBackend {
    /// The engine's regions mapped in `ctx`, mapped again there if they were mapped in another
    /// context (one renewed after a device went away); `None` while not connected, or if they
    /// cannot be mapped (then UCX copies).
    fn local_in(&self, ctx: &super::ucp::Context) -> Option<Arc<UcxLocal>> {
        let mut local = lock(&self.local);
        if local.as_ref().is_some_and(|l| !l.of(ctx)) {
            let views = lock(&self.mapped).clone();
            *local = match UcxLocal::map_in(ctx, &views) {
                Ok(l) => Some(Arc::new(l)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot map the regions in the renewed UCX context; UCX transfers will copy");
                    None
                }
            };
        }
        local.clone()
    }
}

/// The server's reason when it refuses UCX to a client on its host that holds no fence.
const UNFENCED: &str = "UCX from this host is served only to a fenced client (one that names its \
                        process: SameHost::Auto or Require)";

/// A DONE frame refusing UCXASK (`UNSUPPORTED`, with `reason`).
fn refusal(reason: &str) -> Vec<u8> {
    let mut out = Vec::new();
    wire::encode_done(&mut out, 0, Status::UNSUPPORTED.code(), reason);
    out
}

fn views(regions: &Regions) -> Vec<RegionView> {
    regions.iter().map(|r| r.view()).collect()
}

impl Backend for UcxBackend {
    fn kind(&self) -> TransportKind {
        TransportKind::Ucx
    }

    fn activate(&self, regions: &Regions, serving: bool, span: &tracing::Span) {
        let Some(u) = &self.eng else { return };
        // this engine's own regions, mapped for zero-copy PUT/GET on its UCX links (a failure
        // only costs speed: UCX then copies through its own buffers)
        let views = views(regions);
        *lock(&self.mapped) = views.clone();
        match UcxLocal::map(u, &views) {
            Ok(l) => *lock(&self.local) = Some(Arc::new(l)),
            Err(e) => tracing::warn!(parent: span, error = %e,
                "cannot map the regions with UCX; UCX transfers will copy"),
        }
        if serving {
            match UcxServer::start(u, &views) {
                Ok(srv) => *lock(&self.server) = Some(srv),
                Err(e) => tracing::warn!(parent: span, error = %e,
                    "cannot serve over UCX; serving over tcp only"),
            }
        }
    }

    fn deactivate(&self) {
        // no new client gets keys; the memory handles are unmapped before any region can be
        // deregistered
        drop(lock(&self.server).take());
        drop(lock(&self.local).take());
        lock(&self.mapped).clear();
    }

    /// A region registered while connected is not UCX's (its links reach it over TCP); one it
    /// was given at `activate` has keys in its clients' hands, which UCX cannot take back alone
    /// (unmapping does not stop a peer on this host, nor UCX's software RMA).
    fn can_withdraw(&self, id: u32) -> Result<(), &'static str> {
        if lock(&self.mapped).iter().any(|v| v.id == id) {
            Err("UCX serves the region one-sided to its peers and cannot take one region back")
        } else {
            Ok(())
        }
    }

    fn connect(&self, setup: &mut Setup<'_>) -> Result<Option<Box<dyn DataPath>>, Error> {
        let Some(u) = &self.eng else { return Ok(None) };
        let got = Self::ask(setup).and_then(|info| match info {
            Ok(info) => {
                let worker = u.worker()?;
                let local = self.local_in(worker.context());
                UcxLink::connect(&worker, setup.peer, &info, setup.table, local).map(Ok)
            }
            Err(no) => Ok(Err(no)),
        });
        match got {
            Ok(Ok(l)) => Ok(Some(Box::new(l))),
            Ok(Err(reason)) if self.require => Err(Error::TransportUnavailable {
                peer: setup.peer.to_owned(),
                transport: TransportKind::Ucx.name(),
                why: if reason == UNFENCED {
                    "on its own host the peer serves UCX only to a client inside its fence (name \
                     this process: SameHost::Auto or Require)"
                } else {
                    "the peer does not serve over UCX"
                },
            }),
            Ok(Err(_)) => Ok(None),
            Err(e) if self.require => Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "UCX link failed; using tcp or same-host");
                Ok(None)
            }
        }
    }

    fn request_kind(&self) -> Option<Kind> {
        Some(Kind::UcxAsk)
    }

    fn repeatable(&self) -> bool {
        true
    }

    fn accept(&self, req: Accept<'_>) -> Result<Option<Box<dyn Any + Send>>, AcceptFail> {
        if !req.payload.is_empty() {
            return Err(AcceptFail::Violation(WireError::Trailing(
                req.payload.len(),
            )));
        }
        // UCX may reach a client on this host through shared memory (CMA, mapped segments),
        // where its puts land straight from the client's process: such access must be inside
        // the fence that `deactivate` revokes and waits for. A client that could be on this
        // host (it connects from one of its addresses) and holds no fence gets no keys.
        let frame = if req.on_this_host && !req.fenced {
            refusal(UNFENCED)
        } else {
            // the frame is copied: no lock is held while the client is written to
            let frame = lock(&self.server).as_ref().map(|s| s.frame().to_vec());
            frame.unwrap_or_else(|| refusal("this engine does not serve over UCX"))
        };
        (req.send)(&frame).map(|()| None).map_err(AcceptFail::Io)
    }
}
