//! The C++ header: a program in HIXL's style (`#include "hixl/hixl.h"`, `using namespace
//! hixl;`, `Hixl engine; engine.Initialize(...)`) built with the flags of HIXL's own examples and
//! linked as they are, with `-lcann_hixl`, then run as two processes; the data is verified on
//! both sides.

mod common;

/// The C++ program as two processes, its server serving `memory` (`caller` or `engine`).
fn two_cpp_processes(memory: &str) {
    let Some(cxx) = common::compiler("c++") else {
        return;
    };
    common::two_processes(
        &cxx,
        &common::HIXL_EXAMPLE_FLAGS,
        "cann_hixl",
        "cpp/hixl_style.cpp",
        3,
        memory,
    );
}

#[test]
fn a_hixl_style_cpp_program_runs_as_two_processes() {
    two_cpp_processes("caller");
}

/// The same program, its server serving memory of `AllocHostMem` (a hixl extension): the
/// client maps it and moves data one-sidedly.
#[test]
fn a_hixl_style_cpp_program_over_engine_memory() {
    two_cpp_processes("engine");
}

/// `libcann_hixl.so` is a relative symlink to `libhixl.so` beside it (made by build.rs), so the
/// two names are one library wherever the directory is copied.
#[test]
fn libcann_hixl_is_libhixl_under_hixls_name() {
    let dir = common::lib_dir();
    let link = dir.join("libcann_hixl.so");
    assert_eq!(
        std::fs::read_link(&link).expect("libcann_hixl.so is a symlink"),
        std::path::Path::new("libhixl.so")
    );
    assert_eq!(
        std::fs::canonicalize(&link).unwrap(),
        std::fs::canonicalize(dir.join("libhixl.so")).unwrap()
    );
}
