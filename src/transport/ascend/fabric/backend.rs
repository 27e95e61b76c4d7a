//! The fabric path's engine-wide part ([`FabricBackend`]): every region of a fabric-memory
//! engine registered (exported, `rt.rs`), its regions while it is open to links, the count of
//! the links it made (deregistration waits for none), FABRIC_HELLO sent by a new link's client and
//! answered with the server's blocks (FABRIC_WELCOME), and the client's import (`link.rs`).

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::link::FabricLink;
use super::rt::{FabricRt, fabric_reg};
use crate::error::{Error, Status};
use crate::transport::ascend::path::{ClosablePath, RegionList};
use crate::transport::{
    Accept, AcceptFail, Backend, DataPath, Region, Regions, Registration, Setup, TransportKind,
};
use crate::types::{Access, MemType};
use crate::wire::{FabricBlock, FabricInfo, Kind};

/// Fabric memory for one engine; without a runtime (an engine that is not a fabric-memory one)
/// it only answers a fabric client's FABRIC_HELLO with a refusal that says why.
pub(crate) struct FabricBackend {
    rt: Option<Arc<FabricRt>>,
    regions: RegionList,
    /// The links this engine made (its imports of peers' memory).
    live: Arc<AtomicUsize>,
}

impl FabricBackend {
    /// The backend of a fabric-memory engine.
    pub(crate) fn new(rt: Arc<FabricRt>) -> Self {
        Self {
            rt: Some(rt),
            regions: RegionList::new(true),
            live: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The backend of an engine that is not a fabric-memory one.
    pub(crate) fn refuser() -> Self {
        Self {
            rt: None,
            regions: RegionList::new(false),
            live: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Backend for FabricBackend {
    fn kind(&self) -> TransportKind {
        TransportKind::Ascend
    }

    unsafe fn register(
        &self,
        addr: usize,
        len: usize,
        mem_type: MemType,
    ) -> Result<Option<Registration>, Error> {
        let Some(rt) = &self.rt else { return Ok(None) };
        let reg = rt.export_range(addr, len, mem_type)?;
        Ok(Some(Box::new(reg)))
    }

    fn activate(&self, regions: &Regions, _serving: bool, _span: &tracing::Span) {
        self.regions.set(regions);
    }

    fn deactivate(&self) {
        self.regions.clear();
    }

    fn region_added(&self, region: &Arc<dyn Region>) {
        self.regions.add(region);
    }

    fn region_withdrawn(&self, id: u32) {
        self.regions.withdraw(id);
    }

    fn deregistration_blocked(&self) -> Option<&'static str> {
        (self.live.load(Ordering::SeqCst) > 0)
            .then_some("Disconnect peers before deregistering memory (fabric memory)")
    }

    fn connect(&self, setup: &mut Setup<'_>) -> Result<Option<Box<dyn DataPath>>, Error> {
        let Some(rt) = &self.rt else { return Ok(None) };
        let deadline = setup.deadline;
        let mut out = Vec::new();
        FabricInfo::default().encode(Kind::FabricHello, &mut out);
        setup.ctl.send(&out, deadline)?;
        let theirs = match setup.ctl.recv(deadline)? {
            (Kind::FabricWelcome, p) => {
                FabricInfo::decode(&p).map_err(|e| setup.ctl.protocol(e.to_string()))?
            }
            (k, _) => {
                return Err(setup
                    .ctl
                    .protocol(format!("expected FabricWelcome, got {k:?}")));
            }
        };
        if theirs.status != 0 {
            return Err(setup
                .ctl
                .refused(Status::from_peer(theirs.status), theirs.reason));
        }
        let mut link = FabricLink::import(rt, setup.peer, &theirs.blocks, setup.table, &self.live)?;
        link.loopback = setup.loopback;
        link.watch = setup.ctl.watch().ok();
        Ok(Some(Box::new(ClosablePath::new(link))))
    }

    fn request_kind(&self) -> Option<Kind> {
        Some(Kind::FabricHello)
    }

    fn accept(&self, req: Accept<'_>) -> Result<Option<Box<dyn Any + Send>>, AcceptFail> {
        let hello = FabricInfo::decode(req.payload).map_err(AcceptFail::Violation)?;
        let mut info = FabricInfo::default();
        if self.rt.is_none() {
            info.status = Status::UNSUPPORTED.code();
            info.reason = "this engine does not use fabric memory (EnableUseFabricMem=1 on both \
                           sides)"
                .into();
        } else if hello.status != 0 || !hello.blocks.is_empty() {
            info.status = Status::PARAM_INVALID.code();
            info.reason = "FABRIC_HELLO carries neither a status nor blocks".into();
        } else {
            self.regions.with(|regions| {
                for r in regions {
                    let v = r.view();
                    if v.access == Access::None {
                        continue;
                    }
                    let Some(reg) = fabric_reg(&**r) else {
                        continue;
                    };
                    // from now on a peer may hold these blocks: the region is retired when it
                    // ends
                    reg.shared.store(true, Ordering::SeqCst);
                    info.blocks.extend(reg.blocks.iter().map(|b| FabricBlock {
                        region: v.id,
                        base: b.base as u64,
                        len: b.len as u64,
                        handle: b.handle,
                    }));
                }
            });
        }
        let mut out = Vec::new();
        info.encode(Kind::FabricWelcome, &mut out);
        (req.send)(&out).map_err(AcceptFail::Io)?;
        if info.status != 0 {
            return Ok(None);
        }
        tracing::debug!(
            client = req.client,
            blocks = info.blocks.len(),
            "fabric handles sent"
        );
        // (not counted: only the links this engine made keep its memory registered)
        Ok(Some(Box::new(ServedLink)))
    }
}

/// The server's side of a fabric link: nothing to keep (its regions' handles are retired when
/// their registrations end, whoever imported them).
struct ServedLink;
