//! Ascend backend: ACL runtime memory and HCCL one-sided transfers, loaded at run time.

pub(crate) mod ffi;
