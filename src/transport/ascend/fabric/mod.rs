//! Fabric memory (`EnableUseFabricMem=1`), HIXL's FabricMem engine on its host-copy path
//! (upstream's `fabric_memory.enable_aicpu_unfold=false`): memory is ACL virtual memory (VMM:
//! `aclrtReserveMemAddress` + `aclrtMallocPhysical` + `aclrtMapMem`), exchanged as fabric
//! shareable handles; the importer maps the exporter's physical memory into its own address
//! space and copies with `aclrtMemcpyAsync` (device to device) on the link's streams. No HCCL.
//!
//! - Registration ([`FabricBackend`]'s `register`): every region must be VMM memory. The range
//!   is walked with `aclrtMemGetAddressRange`. A block the engine's allocator made
//!   ([`malloc_mem`]) is exported once, with the allocator's handle, and that export is kept
//!   (upstream's `ExportToShareableHandle`: ACL holds a handle and its shareable handle one to
//!   one within a process, so a second export of one handle fails, and HDK 25.5 has no
//!   retain). A block of "foreign" VMM memory the caller mapped itself is retained
//!   (`aclrtMemRetainAllocationHandle`) and exported (`aclrtMemExportToShareableHandleV2`,
//!   `FABRIC`) by each registration, as upstream's is.
//! - Connect (client): FABRIC_HELLO, answered by FABRIC_WELCOME with the server's blocks
//!   (`wire::FabricInfo`); each is imported (`aclrtMemImportFromShareableHandleV2`), mapped into
//!   a reservation of this process, and remembered by the server's region id.
//! - Transfer: each descriptor's remote range is translated to the local mapping of the block
//!   that holds it (none: `PARAM_INVALID`), copied with `aclrtMemcpyAsync` round-robin over
//!   `fabric_memory.task_stream_num` streams, then each stream is synchronised; a failure
//!   aborts the streams before the call returns, so no copy touches memory afterwards.
//! - While a link this engine made is up (it holds imports of a peer's memory: upstream's
//!   channels), deregistration is refused with `FAILED` ("Disconnect peers before
//!   deregistering memory"), upstream's rule; links it serves do not block it (a region a peer
//!   imported is retired when its registration ends, `retire.rs`).
//! - A fabric-memory engine may connect to itself, as upstream's FabricMem engine does (its kv
//!   benchmark links each engine to itself); hixl's other engines refuse (`PARAM_INVALID`, as
//!   upstream's). The self-link is an ordinary link through the engine's own listener: its
//!   own handles imported and mapped a second time, so a transfer copies between this
//!   process's own regions. As the server's addresses are this process's, a batch whose
//!   source range overlaps a destination range (of the same or another descriptor) is refused
//!   before anything moves (`Error::OverlappingTransfer`, `PARAM_INVALID`): the copies run on
//!   several streams in no defined order. Deregistration (refused while the link is up, and
//!   in the typed API impossible while a `Link` borrows the engine) and finalize (which closes
//!   the link first) are as with any peer; an allow-list must name the engine itself.
//!
//! The AICPU path (upstream's default, `enable_aicpu_unfold=true`: copies unfolded by an AICPU
//! kernel in `libcann_hixl_kernel.so`) is not implemented: asking for it is `UNSUPPORTED`.

mod backend;
mod link;
mod options;
mod retire;
mod rt;

/// Fabric memory's allocator statics and memory kind are the device floor's (ACL virtual
/// memory); named here too, where the engine's registry finds the fabric path's parts.
pub use crate::device::{FabricBuffer, export_to_shareable_handle, free_mem, malloc_mem};
pub(crate) use backend::FabricBackend;
pub(crate) use options::check_options;
pub(crate) use rt::FabricRt;

#[cfg(test)]
mod tests;
