//! Fabric memory (`EnableUseFabricMem=1`) from C++: `tests/cpp/fabric_mem.cpp`, a program in
//! HIXL's style (two `hixl::Hixl` engines in one process; the server's memory from
//! `hixl_malloc_mem`, the client's VMM memory mapped by the program itself, as upstream's
//! fabric_mem_d2d sample maps it), built with the flags and link line of HIXL's examples and
//! run on the ACL test double that `tools/ascend-double.sh` builds under CANN's names. It moves
//! seeded random data (sync WRITE and READ, async WRITE polled with `GetTransferStatus`) and
//! checks the bad inputs (an address outside every mapping, `DeregisterMem` on the side that made a link,
//! `BufferPool` other than `"0:0"`); it prints PASS.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

fn have(name: &str) -> bool {
    let ok = Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "SKIPPED: no `{name}` on PATH (needed to build the ACL double and the C++ program)"
        );
    }
    ok
}

#[test]
fn a_fabric_mem_program_moves_vmm_memory_on_the_double() {
    if !have("cc") || !have("c++") {
        return;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = common::scratch("cpp-fabric");
    let double = dir.join("cann");
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    common::build_double(&double);

    let lib = common::lib_dir();
    let exe = dir.join("fabric_mem");
    let asan = common::asan_flags();
    let out = Command::new("c++")
        .args(common::HIXL_EXAMPLE_FLAGS)
        .args(asan)
        .arg("-I")
        .arg(common::include_dir())
        .arg(manifest.join("tests/cpp/fabric_mem.cpp"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&lib)
        .arg("-L")
        .arg(&double)
        .args([
            "-lcann_hixl",
            "-lacl_rt",
            "-lascend_hal",
            "-lpthread",
            "-lrt",
        ])
        .output()
        .expect("run c++");
    assert!(
        out.status.success(),
        "c++ failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        ^ u64::from(std::process::id());
    eprintln!("seed {seed}");
    let mut cmd = Command::new(&exe);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HIXL") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .arg(seed.to_string())
        .env(
            "LD_LIBRARY_PATH",
            std::env::join_paths([&lib, &double]).unwrap(),
        )
        .env("TMPDIR", &tmp)
        .output()
        .expect("run the program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("PASS"),
        "fabric_mem failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A failure's message reaches ACL's error channel (`aclGetRecentErrMsg`) even when ACL loads
/// after earlier failures found no error manager: `tests/c/acl_errmsg_late.c`, linked with
/// libhixl only, fails twice without ACL, loads the double's `libacl_rt.so` with `dlopen`,
/// fails once more and finds the message there (hixl skips the search while no library has
/// loaded since the last one found nothing; a load must end the skip).
#[test]
fn a_failure_after_acl_loads_late_reaches_its_error_channel() {
    if !have("cc") {
        return;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = common::scratch("acl-errmsg-late");
    let double = dir.join("cann");
    common::build_double(&double);
    let lib = common::lib_dir();
    let exe = dir.join("acl_errmsg_late");
    let asan = common::asan_flags();
    let out = Command::new("cc")
        .args(asan)
        .arg("-I")
        .arg(common::include_dir())
        .arg(manifest.join("tests/c/acl_errmsg_late.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&lib)
        .args(["-lhixl", "-ldl"])
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe)
        .env(
            "LD_LIBRARY_PATH",
            std::env::join_paths([&lib, &double]).unwrap(),
        )
        .output()
        .expect("run the program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("PASS"),
        "acl_errmsg_late failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
