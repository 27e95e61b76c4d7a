//! The Ascend transport: device (and host) memory moved by CANN, loaded at run time, in two
//! paths split by job, both on the device floor (`crate::device`: ACL's table, its result
//! level and the device memory types; no ACL call is made here but through it):
//!
//! - `hccl/`: HIXL's default engine, HCCL one-sided transfers over a two-rank communicator per
//!   link (its own table of HCCL's entry points, on the device floor's loader);
//! - `fabric/`: HIXL's FabricMem engine (`EnableUseFabricMem=1`), ACL virtual memory exported
//!   as fabric handles and copied with `aclrtMemcpyAsync`, no HCCL;
//! - `path.rs`: what both paths share: a link's data path that closes ([`ClosablePath`]) and a
//!   backend's list of the engine's regions ([`RegionList`]);
//! - `options/`: HIXL's option keys for both.

pub(crate) mod fabric;
pub(crate) mod hccl;
pub(crate) mod options;
mod path;

pub(crate) use self::hccl::{AscendBackend, Runtime, probe, rank_link};
