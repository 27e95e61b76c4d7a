//! NIXL's HIXL backend (`hixl-nixl/`), without NIXL: `hixl-nixl/build.sh` builds
//! `libplugin_HIXL.so` over this build's `libhixl.so` (C++20, `-Wall -Wextra -Werror`), and
//! `hixl-nixl/tests/harness.cc` drives it as NIXL 1.5.1's agent does (dlopen, the plugin's entry
//! points, two engines' virtual calls), checking every NIXL status code the plugin returns:
//! registrations (DRAM, VRAM, shared, overlapping), metadata, WRITE and READ with random data and
//! a notification, a split batch, release in flight, bad batches, binary notifications, a
//! deregistration under a posted transfer, and engine memory (`hixl_nixl_alloc`). The same plugin against the real wheel, two agents
//! in two processes: `hixl-nixl/tests/two_agents.py` (`.ci/run`).

mod common;

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
    let scratch = common::scratch("nixl-plugin");
    let harness = scratch.join("harness");
    let plugin_dir = format!("-I{}", root.join("hixl-nixl").display());
    // (linked with libhixl too, which it does not call: the plugin brings its own copy's name)
    common::build(
        &cxx,
        &[
            "-std=c++20",
            "-O1",
            "-g",
            "-DHIXL_NIXL_HARNESS",
            "-Wall",
            "-Wextra",
            "-Werror",
            &plugin_dir,
        ],
        "hixl",
        &[root.join("hixl-nixl/tests/harness.cc")],
        &harness,
    );
    let run = Command::new(&harness)
        .arg(dir.join("libplugin_HIXL.so"))
        .output()
        .expect("run the harness");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.trim() == "ok",
        "the harness failed ({:?}):\n{stdout}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let _ = std::fs::remove_dir_all(&scratch);
}

/// Parts of the plugin alone, `hixl-nixl/tests/units.cc`: the reassembly of NIXL notifications
/// (`notif.cc`: its bound holds for a sender of empty parts, a restarted sender's blob arrives)
/// and the cutting of a batch into parts (`engine.cc`'s `split`: lengths adding up past 2^64).
#[test]
fn the_plugins_parts_alone() {
    let Some(cxx) = common::compiler("c++") else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let scratch = common::scratch("nixl-units");
    let test = scratch.join("units");
    let plugin_dir = format!("-I{}", root.join("hixl-nixl").display());
    common::build(
        &cxx,
        &[
            "-std=c++20",
            "-O1",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            &plugin_dir,
        ],
        "hixl",
        &[
            root.join("hixl-nixl/tests/units.cc"),
            root.join("hixl-nixl/notif.cc"),
            root.join("hixl-nixl/engine.cc"),
            root.join("hixl-nixl/settings.cc"),
        ],
        &test,
    );
    let run = Command::new(&test).output().expect("run the units test");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.trim() == "ok",
        "units failed ({:?}):\n{stdout}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let _ = std::fs::remove_dir_all(&scratch);
}
