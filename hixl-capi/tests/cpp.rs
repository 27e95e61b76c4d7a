//! The C++ header: a program in HIXL's style (`#include "hixl/hixl.h"`, `using namespace
//! hixl;`, `Hixl engine; engine.Initialize(...)`) built with `c++ -std=c++17` and run as two
//! processes; the data is verified on both sides.

mod common;

#[test]
fn a_hixl_style_cpp_program_runs_as_two_processes() {
    let Some(cxx) = common::compiler("c++") else {
        return;
    };
    let flags = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1"];
    common::two_processes(&cxx, &flags, "cpp/hixl_style.cpp", 3);
}
