//! The same-host transport's engine-wide part ([`Backend`]): on a new link to a peer on this
//! host that granted one-sided access (the runtime took the server's fence and pinned the peer's
//! process), map the peer's regions or open its memory. Nothing to do at `activate`, and no
//! setup request: the server offers its memfds in the region table it sends with WELCOME.

use super::path::SameHostPath;
use crate::error::Error;
use crate::transport::{Backend, DataPath, Setup, TransportKind};

/// The same-host transport; engine-wide, only what its links are set up with.
pub(crate) struct SameHostBackend {
    /// Bytes of a peer's memory each link may populate in advance (`Options::prefault_budget`).
    pub(crate) prefault: u64,
}

impl Backend for SameHostBackend {
    fn kind(&self) -> TransportKind {
        TransportKind::SameHost
    }

    fn connect(&self, setup: &mut Setup<'_>) -> Result<Option<Box<dyn DataPath>>, Error> {
        let Some(proc) = setup.local.take() else {
            return Ok(None);
        };
        if setup.covered {
            // a faster path moves the link's batches; the link still holds the fence
            return Ok(None);
        }
        let path = setup.ctl.watch().and_then(|watch| {
            SameHostPath::setup(proc, setup.table, watch, (self.prefault, setup.deadline))
        });
        match path {
            Ok(p) => Ok(Some(Box::new(p))),
            Err(e) => {
                tracing::debug!(error = %e, "same-host transport refused by the kernel; using tcp");
                setup.why_not = Some(
                    "the kernel refused to hand over or map the peer's memory, or to read it \
                     (pidfd_getfd, mmap, process_vm_readv)",
                );
                Ok(None)
            }
        }
    }
}
