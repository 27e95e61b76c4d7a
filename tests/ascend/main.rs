//! The Ascend backend on the ACL/HCCL ABI test double: two engines end to end, rank tables, SoCs
//! and libraries, and CANN programs built against the double (one test crate; each module is one
//! former test file; `support` holds their shared helpers). `tests/ascend_default.rs` stays a
//! crate of its own: it sets the process environment.

mod support;

mod ascend;
mod ascend_cann;
mod ascend_socs;
