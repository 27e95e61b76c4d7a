//! Hand-written UCP FFI, loaded with `dlopen("libucp.so.0")`.
