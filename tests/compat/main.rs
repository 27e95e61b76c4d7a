//! The runtime-checked engine in HIXL's shape (`hixl::compat`): data and every runtime check
//! across two processes, engine-allocated memory, the extensions the Python package uses, and
//! the lifecycle while linked (one test crate; each module is one former test file).

#[path = "../common/mod.rs"]
mod common;

mod compat;
mod compat_alloc;
mod compat_ext;
mod compat_lifecycle;
