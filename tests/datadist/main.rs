//! LLM-DataDist on hixl: the runtime-checked instance, its typed layer, and the link by an explicit
//! rank table on the ACL/HCCL test double (one test crate; each module is one former test file).

#[path = "../common/mod.rs"]
mod common;

mod datadist;
mod datadist_notes;
mod datadist_races;
mod datadist_rank;
mod datadist_typed;
mod serve_child;
