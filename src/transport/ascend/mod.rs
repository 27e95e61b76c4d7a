//! Ascend backend: ACL runtime memory and HCCL one-sided transfers, loaded at run time.

pub(crate) mod acl;
pub(crate) mod double;
pub(crate) mod ffi;
pub(crate) mod hccl;
pub(crate) mod options;
