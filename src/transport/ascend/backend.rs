//! Ascend's engine-wide part ([`Backend`]): the engine's ACL/HCCL runtime and, while it is open
//! to links, its regions (the device path binds them all); a new link sends DEVICE_HELLO and
//! both sides build their HCCL communicator (`link.rs`).

use std::any::Any;
use std::sync::{Arc, Mutex};

use super::Runtime;
use super::link::{connect, serve};
use crate::error::Error;
use crate::sync::lock;
use crate::transport::{Accept, AcceptFail, Backend, DataPath, Regions, Setup, TransportKind};
use crate::wire::{DeviceInfo, Kind};

/// Ascend for one engine. Without a runtime (the engine has no Ascend options) it sets nothing
/// up and answers DEVICE_HELLO with a DEVICE_WELCOME that says why not.
pub(crate) struct AscendBackend {
    rt: Option<Arc<Runtime>>,
    /// The engine's regions while it is open to links.
    regions: Mutex<Regions>,
}

impl AscendBackend {
    /// Ascend with the engine's runtime (`None`: the engine has none).
    pub(crate) fn new(rt: Option<Arc<Runtime>>) -> Self {
        Self {
            rt,
            regions: Mutex::new(Vec::new()),
        }
    }
}

impl Backend for AscendBackend {
    fn kind(&self) -> TransportKind {
        TransportKind::Ascend
    }

    fn activate(&self, regions: &Regions, _serving: bool, _span: &tracing::Span) {
        if self.rt.is_some() {
            *lock(&self.regions) = regions.clone();
        }
    }

    fn deactivate(&self) {
        lock(&self.regions).clear();
    }

    fn connect(&self, setup: &mut Setup<'_>) -> Result<Option<Box<dyn DataPath>>, Error> {
        let Some(rt) = &self.rt else { return Ok(None) };
        let regions = lock(&self.regions).clone();
        let link = connect(
            rt,
            &mut *setup.ctl,
            &regions,
            setup.table,
            setup.me,
            setup.peer,
            setup.deadline,
        )?;
        Ok(link.map(|l| Box::new(Mutex::new(Some(l))) as Box<dyn DataPath>))
    }

    fn request_kind(&self) -> Option<Kind> {
        Some(Kind::DeviceHello)
    }

    fn accept(&self, req: Accept<'_>) -> Result<Option<Box<dyn Any + Send>>, AcceptFail> {
        let hello = DeviceInfo::decode(req.payload).map_err(AcceptFail::Violation)?;
        let regions = lock(&self.regions).clone();
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
