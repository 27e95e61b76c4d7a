//! The runtime under the API: the control plane (`control/`). The engine core, the link core and
//! the executor are still in engine.rs, link.rs and connect.rs (issue #13 moves them here).

pub(crate) mod control;
