//! What the Ascend transport's two paths (HCCL's, fabric memory's) share: a link's data path
//! that the link closes ([`ClosablePath`] over an [`AscendLink`]: the link's resources go when
//! it closes, not when the last worker lets go of it; a closed path says "disconnected"), and a
//! backend's list of the engine's regions while the engine is open to links ([`RegionList`]).

use std::sync::{Arc, Mutex};

use crate::error::Error;
use crate::sync::lock;
use crate::transport::{Batch, DataPath, PathFail, Region, Regions, TransportKind};
use crate::types::batch::Descs;

/// One side of a link's Ascend data path, while it is open.
pub(crate) trait AscendLink: Send {
    /// Whether its batches enter the link's fence when the link has one
    /// ([`DataPath::enters_fence`]).
    const ENTERS_FENCE: bool;

    /// Whether it reaches region `region` of the peer's table ([`DataPath::reaches`]).
    fn reaches(&self, region: u32) -> bool;

    /// Whether it moves this batch ([`DataPath::covers`]): by default yes.
    fn covers(&self, _descs: &Descs<'_>) -> bool {
        true
    }

    /// Moves the batch ([`DataPath::run`]; [`Batch::start`] has been called).
    ///
    /// # Safety
    /// As [`DataPath::run`].
    unsafe fn run(&self, batch: &Batch<'_>) -> Result<(), PathFail>;
}

/// A link's Ascend data path: its [`AscendLink`] until the link closes it (`None` then).
pub(crate) struct ClosablePath<P>(Mutex<Option<P>>);

impl<P> ClosablePath<P> {
    /// The path over `link`.
    pub(crate) fn new(link: P) -> Self {
        Self(Mutex::new(Some(link)))
    }
}

impl<P: AscendLink> DataPath for ClosablePath<P> {
    fn kind(&self) -> TransportKind {
        TransportKind::Ascend
    }

    /// The link's answer; a closed path reaches every region (`run` says it is closed).
    fn reaches(&self, region: u32) -> bool {
        lock(&self.0)
            .as_ref()
            .is_none_or(|link| link.reaches(region))
    }

    /// The link's answer; a closed path covers every batch (`run` says it is closed).
    fn covers(&self, descs: &Descs<'_>) -> bool {
        lock(&self.0).as_ref().is_none_or(|link| link.covers(descs))
    }

    fn fenced(&self) -> bool {
        false
    }

    fn enters_fence(&self) -> bool {
        P::ENTERS_FENCE
    }

    fn refused_when_broken(&self) -> bool {
        true
    }

    fn moves_device_memory(&self) -> bool {
        true
    }

    /// Releases the link's resources now, not when the last worker lets go of the link.
    fn close(&self) {
        drop(lock(&self.0).take());
    }

    unsafe fn run(&self, batch: &Batch<'_>) -> Result<(), PathFail> {
        batch.start(None)?;
        let guard = lock(&self.0);
        let Some(link) = guard.as_ref() else {
            return Err(PathFail::Failed(Error::NotConnected {
                peer: batch.peer.to_owned(),
                why: "disconnected".into(),
            }));
        };
        // SAFETY: forwarded from the caller.
        unsafe { link.run(batch) }
    }
}

/// A backend's view of the engine's regions while the engine is open to links (a new link
/// binds or exports them); empty otherwise, and always for a backend without a runtime.
pub(crate) struct RegionList {
    regions: Mutex<Regions>,
    keep: bool,
}

impl RegionList {
    /// No region yet; `keep`: the backend has a runtime (else the list stays empty).
    pub(crate) fn new(keep: bool) -> Self {
        Self {
            regions: Mutex::new(Vec::new()),
            keep,
        }
    }

    /// The engine opens to links with `regions`.
    pub(crate) fn set(&self, regions: &Regions) {
        if self.keep {
            *lock(&self.regions) = regions.clone();
        }
    }

    /// The engine closes to links.
    pub(crate) fn clear(&self) {
        lock(&self.regions).clear();
    }

    /// A region registered while the engine is open.
    pub(crate) fn add(&self, region: &Arc<dyn Region>) {
        if self.keep {
            lock(&self.regions).push(region.clone());
        }
    }

    /// Region `id` is withdrawn.
    pub(crate) fn withdraw(&self, id: u32) {
        lock(&self.regions).retain(|r| r.view().id != id);
    }

    /// The regions now.
    pub(crate) fn snapshot(&self) -> Regions {
        lock(&self.regions).clone()
    }

    /// Runs `f` over the regions, holding the list (a withdrawal waits for it).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&Regions) -> R) -> R {
        f(&lock(&self.regions))
    }
}
