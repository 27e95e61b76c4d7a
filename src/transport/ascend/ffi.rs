//! Hand-written ACL and HCCL FFI, loaded with `dlopen` at run time.
