//! Ascend's engine-wide part ([`Backend`]): the engine's ACL/HCCL runtime and, while it is open
//! to links, its regions (the device path binds them all); a new link sends DEVICE_HELLO and
//! both sides build their HCCL communicator (`link.rs`).

use std::any::Any;
use std::sync::Arc;

use super::link::{connect, serve};
use super::{Runtime, hccl_mem};
use crate::error::Error;
use crate::transport::ascend::path::{ClosablePath, RegionList};
use crate::transport::{
    Accept, AcceptFail, Backend, DataPath, Region, Regions, Registration, Setup, TransportKind,
};
use crate::types::MemType;
use crate::wire::{DeviceInfo, Kind};

/// Ascend for one engine. Without a runtime (the engine has no Ascend options) it sets nothing
/// up and answers DEVICE_HELLO with a DEVICE_WELCOME that says why not.
pub(crate) struct AscendBackend {
    rt: Option<Arc<Runtime>>,
    /// The engine's regions while it is open to links.
    regions: RegionList,
}

impl AscendBackend {
    /// Ascend with the engine's runtime (`None`: the engine has none).
    pub(crate) fn new(rt: Option<Arc<Runtime>>) -> Self {
        Self {
            regions: RegionList::new(rt.is_some()),
            rt,
        }
    }
}

impl Backend for AscendBackend {
    fn kind(&self) -> TransportKind {
        TransportKind::Ascend
    }

    /// `HcclRegisterGlobalMem`, on an engine with a runtime: every region of such an engine,
    /// host memory included, is registered with HCCL.
    unsafe fn register(
        &self,
        addr: usize,
        len: usize,
        mem_type: MemType,
    ) -> Result<Option<Registration>, Error> {
        let Some(rt) = &self.rt else { return Ok(None) };
        // SAFETY: forwarded from the caller.
        let reg = unsafe { rt.register(addr, len, mem_type) }?;
        Ok(Some(Box::new(reg)))
    }

    fn activate(&self, regions: &Regions, _serving: bool, _span: &tracing::Span) {
        self.regions.set(regions);
    }

    fn deactivate(&self) {
        self.regions.clear();
    }

    /// Links made from now on bind it; this engine's existing links bind it on their own
    /// (client) side, so its transfers can use it at once.
    fn region_added(&self, region: &Arc<dyn Region>) {
        let Some(rt) = &self.rt else { return };
        if hccl_mem(&**region).is_none() {
            return;
        }
        self.regions.add(region);
        super::link::bind_everywhere(rt, region);
    }

    /// Every device path of this engine that binds the region (a link it serves, or one of its
    /// own) is closed: its communicator is destroyed, so no peer reaches the memory through it
    /// any more, and the link falls back or breaks (HIXL: a failed channel is unusable until
    /// reconnected).
    fn region_withdrawn(&self, id: u32) {
        let Some(rt) = &self.rt else { return };
        self.regions.withdraw(id);
        super::link::close_binding(rt, id);
    }

    fn connect(&self, setup: &mut Setup<'_>) -> Result<Option<Box<dyn DataPath>>, Error> {
        let Some(rt) = &self.rt else { return Ok(None) };
        let regions = self.regions.snapshot();
        let link = connect(
            rt,
            &mut *setup.ctl,
            &regions,
            setup.table,
            setup.me,
            setup.peer,
            setup.deadline,
        )?;
        Ok(link.map(|l| Box::new(ClosablePath::new(l)) as Box<dyn DataPath>))
    }

    fn request_kind(&self) -> Option<Kind> {
        Some(Kind::DeviceHello)
    }

    fn accept(&self, req: Accept<'_>) -> Result<Option<Box<dyn Any + Send>>, AcceptFail> {
        let hello = DeviceInfo::decode(req.payload).map_err(AcceptFail::Violation)?;
        let regions = self.regions.snapshot();
        let served = serve(
            self.rt.as_ref(),
            &hello,
            &regions,
            req.me,
            req.client,
            req.send,
        );
        match served {
            Ok(link) => Ok(link.map(|l| Box::new(l) as Box<dyn Any + Send>)),
            Err(e) => Err(AcceptFail::Io(e)),
        }
    }
}
