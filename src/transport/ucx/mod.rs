//! UCX transport (UCP RMA over verbs, tcp or shared memory), loaded at run time.

pub(crate) mod ffi;
