//! The conformance table (`cases.json`, issue 44: each rule checked once, in Rust, and answered
//! alike on every surface) through the Rust surface: the engine's cases through
//! [`hixl::compat::Hixl`], LLM-DataDist's through [`hixl::datadist::DataDist`]. The same table
//! runs through C and C++ (`hixl-capi/tests/conformance.rs`) and Python
//! (`python/tests/test_conformance.py`).

mod datadist;
mod engine;
mod peer;
mod table;

use std::path::PathBuf;

fn cases() -> Vec<table::Case> {
    table::load(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/cases.json"))
}

#[test]
fn the_table_is_well_formed() {
    let cases = cases();
    let mut ids = std::collections::HashSet::new();
    for c in &cases {
        assert!(ids.insert(c.id.clone()), "{} twice", c.id);
        assert!(
            table::code(&c.expect).is_some(),
            "{}: no status {}",
            c.id,
            c.expect
        );
        assert!(!c.surfaces.is_empty(), "{} runs on no surface", c.id);
        assert!(
            c.id.starts_with(match c.product.as_str() {
                "engine" => "engine.",
                "datadist" => "dd.",
                "cs" => "cs.",
                p => panic!("{}: product {p}", c.id),
            }),
            "{}: the id names its product",
            c.id
        );
    }
}

#[test]
fn engine_cases_through_rust() {
    let peer = peer::EnginePeer::start();
    table::check(&cases(), "engine", "rust", |c| engine::run(c, &peer));
}

#[test]
fn datadist_cases_through_rust() {
    let peer = peer::DdPeer::start();
    table::check(&cases(), "datadist", "rust", |c| datadist::run(c, &peer));
}
