//! The C++ header: a program in HIXL's style (`#include "hixl/hixl.h"`, `using namespace
//! hixl;`, `Hixl engine; engine.Initialize(...)`) built with `c++ -std=c++17` and run as two
//! processes; the data is verified on both sides.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn a_hixl_style_cpp_program_runs_as_two_processes() {
    let Some(cxx) = common::compiler("c++") else {
        return;
    };
    let dir = common::scratch("cpp");
    let exe = dir.join("hixl_style");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cpp/hixl_style.cpp");
    common::build(
        &cxx,
        &["-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1"],
        &[src],
        &exe,
    );
    let mut server = common::Server::spawn(Command::new(&exe).args(["server", "1048576"]));
    let wrote = common::run_client(Command::new(&exe).args([
        "client",
        &server.name,
        &server.addr.to_string(),
        &server.len.to_string(),
    ]));
    assert_eq!(wrote.len(), 3, "{wrote:?}");
    for (off, len, sum) in wrote {
        assert_eq!(server.sum(off, len), sum, "{off}+{len}");
    }
    assert_eq!(server.notifies(), vec!["kv ready".to_owned()]);
    server.quit();
    let _ = std::fs::remove_dir_all(dir);
}
