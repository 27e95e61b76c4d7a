//! ACL loaded after failures: `tests/c/acl_late_test.c` fails three C calls with no ACL in the
//! process (only `hixl_last_error_message` has their messages), then `dlopen`s the ACL test
//! double (`tools/ascend-double.sh`, `RTLD_LOCAL`) and fails one more: its message is in ACL's
//! error channel (`aclGetRecentErrMsg`, `E19999`). The C ABI no longer searches the disk for
//! CANN's libraries on every failure (issue 35: ~100 µs a failed call), only once the loader
//! loaded something since the last search; this checks that a library loaded late is found.

mod common;

use std::process::Command;

#[test]
fn a_failure_after_acl_loads_late_reaches_its_error_channel() {
    let Some(cc) = common::compiler("cc") else {
        return;
    };
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = common::scratch("acl-late");
    let double = dir.join("cann");
    let out = Command::new("bash")
        .arg(manifest.join("../tools/ascend-double.sh"))
        .arg(&double)
        .output()
        .expect("run tools/ascend-double.sh");
    assert!(out.status.success(), "tools/ascend-double.sh: {out:?}");
    let exe = dir.join("acl_late_test");
    common::build(
        &cc,
        &["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"],
        "hixl",
        &[manifest.join("tests/c/acl_late_test.c")],
        &exe,
    );
    let out = Command::new(&exe)
        .arg(double.join("libacl_rt.so"))
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("run the program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("PASS"),
        "acl_late_test failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
