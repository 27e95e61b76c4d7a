//! NIXL's HIXL backend (`hixl-nixl/`), without NIXL: `hixl-nixl/build.sh` builds
//! `libplugin_HIXL.so` over this build's `libhixl.so` (C++20, `-Wall -Wextra -Werror`), and
//! `hixl-nixl/tests/harness.cc` drives it as NIXL 1.5.1's agent does (dlopen, the plugin's entry
//! points, two engines' virtual calls), checking every NIXL status code the plugin returns:
//! registrations (DRAM, VRAM, shared, overlapping), metadata, WRITE and READ with random data and
//! a notification, a split batch, release in flight, bad batches, binary notifications, a
//! deregistration under a posted transfer, and engine memory (`hixl_nixl_alloc`). The same plugin against the real wheel, two agents
//! in two processes: `hixl-nixl/tests/two_agents.py` (`.ci/run`).

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

#[test]
fn the_plugin_as_nixls_agent_drives_it() {
    let Some(cxx) = common::compiler("c++") else {
        return;
    };
    let dir = common::lib_dir();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let built = Command::new("bash")
        .arg(root.join("hixl-nixl/build.sh"))
        .arg(&dir)
        .env("CXX", &cxx)
        .env("HIXL_NIXL_CXXFLAGS", common::asan_flags().join(" "))
        .output()
        .expect("run hixl-nixl/build.sh");
    assert!(
        built.status.success(),
        "hixl-nixl/build.sh failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    // (linked with libhixl too, which it does not call: the plugin brings its own copy's name)
    built_and_ok(
        &cxx,
        "nixl-plugin",
        &["-DHIXL_NIXL_HARNESS"],
        &["hixl-nixl/tests/harness.cc"],
        &[dir.join("libplugin_HIXL.so").as_os_str()],
    );
}

/// Parts of the plugin alone, `hixl-nixl/tests/units.cc`: the reassembly of NIXL notifications
/// (`notif.cc`: its bound holds for a sender of empty parts, a restarted sender's blob arrives)
/// and the cutting of a batch into parts (`engine.cc`'s `split`: lengths adding up past 2^64).
#[test]
fn the_plugins_parts_alone() {
    let Some(cxx) = common::compiler("c++") else {
        return;
    };
    built_and_ok(
        &cxx,
        "nixl-units",
        &[],
        &[
            "hixl-nixl/tests/units.cc",
            "hixl-nixl/notif.cc",
            "hixl-nixl/engine.cc",
            "hixl-nixl/settings.cc",
        ],
        &[],
    );
}

/// Builds `sources` (paths from the repository's root) with `cxx` (C++20, warnings as errors,
/// `hixl-nixl/` on the include path, `flags` too) into a scratch directory `tag`, runs it with
/// `args`, and asserts it exits 0 printing "ok".
fn built_and_ok(cxx: &str, tag: &str, flags: &[&str], sources: &[&str], args: &[&OsStr]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let scratch = common::scratch(tag);
    let program = scratch.join(tag);
    let plugin_dir = format!("-I{}", root.join("hixl-nixl").display());
    let mut all = vec![
        "-std=c++20",
        "-O1",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
        &plugin_dir,
    ];
    all.extend_from_slice(flags);
    let sources: Vec<_> = sources.iter().map(|s| root.join(s)).collect();
    common::build(cxx, &all, "hixl", &sources, &program);
    let run = Command::new(&program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {tag}: {e}"));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.trim() == "ok",
        "{tag} failed ({:?}):\n{stdout}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let _ = std::fs::remove_dir_all(&scratch);
}
