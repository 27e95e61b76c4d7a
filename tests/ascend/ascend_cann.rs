//! The ACL/HCCL test double as CANN programs meet it: built by `tools/ascend-double.sh` under
//! CANN's library names, a C program written as a CANN user writes one runs on it with nothing
//! set, and across two processes a one-sided call reaches only remote memory the remote rank has
//! bound to its live communicator (the programs are in `tests/ascend_double/`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles one of the double's C test programs (`tests/ascend_double/<src>`) into `out` with
/// `-Wall -Wextra -Werror` and the link arguments `link`.
fn build_c_program(src: &str, out: &Path, link: &[std::ffi::OsString]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let r = Command::new("cc")
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(out)
        .arg(root.join("tests/ascend_double").join(src))
        .args(link)
        .output()
        .expect("run cc");
    assert!(r.status.success(), "{r:?}");
}

/// A command for `prog` without the double's settings this process may have inherited.
fn clean_command(prog: &Path) -> Command {
    let mut run = Command::new(prog);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HIXL_ASCEND_DOUBLE_") {
            run.env_remove(k);
        }
    }
    run
}

/// Runs a test program to its end: it exited 0 and printed each of `lines` on a line of its own.
fn run_ok(cmd: &mut Command, lines: &[&str]) {
    let out = cmd.output().expect("run the program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && lines.iter().all(|w| stdout.lines().any(|l| l == *w)),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether the system C compiler is there; says the test is skipped when not.
fn cc_available() -> bool {
    let there = Command::new("cc").arg("--version").output().is_ok();
    if !there {
        eprintln!("SKIPPED: no system C compiler (`cc`) to build the ACL/HCCL test double");
    }
    there
}

/// Builds the double and `tests/ascend_double/<src>` linked with it into a fresh directory of
/// this test's (`hixl-ascend-<tag>-<pid>`), runs the program with the double's announce
/// directory (`<base>/announce`) and log (`<base>/double.log`), and checks it exited 0 printing
/// both `child_ok` and `OK`. Returns the directory, the announce directory and the log's text;
/// `None` (the test skipped, saying why) without a C compiler.
fn run_two_process_program(
    tag: &str,
    src: &str,
    child_ok: &str,
) -> Option<(PathBuf, PathBuf, String)> {
    if !cc_available() {
        return None;
    }
    let base = std::env::temp_dir().join(format!("hixl-ascend-{tag}-{}", std::process::id()));
    let lib = hixl::testkit::build_ascend_double(&base).expect("build the test double");
    let dir = base.join("announce");
    std::fs::create_dir_all(&dir).unwrap();
    let log = base.join("double.log");
    let _ = std::fs::remove_file(&log);
    let prog = base.join(src.trim_end_matches(".c"));
    let link: Vec<std::ffi::OsString> = vec![
        "-L".into(),
        lib.parent().unwrap().into(),
        format!("-l:{}", lib.file_name().unwrap().to_string_lossy()).into(),
        "-lpthread".into(),
    ];
    build_c_program(src, &prog, &link);
    run_ok(
        clean_command(&prog)
            .env("LD_LIBRARY_PATH", lib.parent().unwrap())
            .env("HIXL_ASCEND_DOUBLE_DIR", &dir)
            .env("HIXL_ASCEND_DOUBLE_LOG", &log),
        &[child_ok, "OK"],
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    Some((base, dir, text))
}

/// `tools/ascend-double.sh DIR` builds the double under CANN's library names, and a program
/// written and linked as CANN's users do (`-lacl_rt -lascend_hal`, HIXL's examples' line; no
/// `aclInit`) runs on it with `LD_LIBRARY_PATH` alone: every name is one object, ACL behaves as
/// CANN's where programs depend on it, and two processes (devices 0 and 2, no device IPs) find
/// each other with no `HIXL_ASCEND_DOUBLE_*` variable (`tests/ascend_double/cann_program.c`).
#[test]
fn cann_layout_runs_a_cann_program_with_nothing_set() {
    if !cc_available() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let base = std::env::temp_dir().join(format!("hixl-ascend-cann-{}", std::process::id()));
    let lib = base.join("lib");
    let tmp = base.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let out = Command::new("bash")
        .arg(root.join("tools/ascend-double.sh"))
        .arg(&lib)
        .output()
        .expect("run tools/ascend-double.sh");
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    for name in [
        "libascendcl.so",
        "libhcomm.so",
        "libhccl.so",
        "libascend_hal.so",
    ] {
        let target = std::fs::read_link(lib.join(name)).expect("a symlink");
        assert_eq!(target, Path::new("libacl_rt.so"), "{name}");
        assert!(said.contains(name), "{said}");
    }
    let prog = base.join("cann_program");
    let link: Vec<std::ffi::OsString> = vec!["-L".into(), lib.clone().into()];
    let libs = ["-lacl_rt", "-lascend_hal", "-lpthread", "-ldl"].map(Into::into);
    build_c_program("cann_program.c", &prog, &[link, libs.to_vec()].concat());
    // a private TMPDIR, so the default directory the processes meet in is this test's own
    run_ok(
        clean_command(&prog)
            .env("LD_LIBRARY_PATH", &lib)
            .env("TMPDIR", &tmp),
        &["OK"],
    );
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let meet = tmp.join(format!("hixl-ascend-ranks-{uid}"));
    let mode = std::fs::metadata(&meet)
        .expect("the default directory was made")
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o700
    );
    let _ = std::fs::remove_dir_all(&base);
}

/// The double's rule across processes: a one-sided call reaches only remote memory bound to the
/// remote rank's live communicator, as the remote process published it in the announce
/// directory. `tests/ascend_double/remote_ranges.c` forks a server and a client: the server
/// unbinds, binds and prepares again, unbinds under a queued copy, destroys its communicator;
/// the client's calls then fail `HCCL_E_PARA` (its sync 507899 for the queued copy) and the
/// server's memory is unchanged. The published files are gone once both processes end.
#[test]
fn two_processes_reach_only_remote_memory_that_is_bound() {
    let Some((base, dir, log)) = run_two_process_program("remote", "remote_ranges.c", "client OK")
    else {
        return;
    };
    let lines: Vec<String> = log.lines().map(str::to_owned).collect();
    for want in [
        "HcclBatchGet rank=1 num=1 remote_unbound=0 rc=1",
        "HcclBatchPut rank=1 num=1 remote_unbound=0 rc=1",
    ] {
        assert!(lines.iter().any(|l| l == want), "no {want:?} in {lines:#?}");
    }
    assert!(
        lines.iter().any(|l| {
            l.starts_with("aclrtSynchronizeStreamWithTimeout ") && l.ends_with(" ops=1 rc=507899")
        }),
        "{lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.starts_with("publish ")),
        "every rewrite of the published ranges succeeded: {lines:#?}"
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in the announce directory: {left:?}");
    let _ = std::fs::remove_dir_all(&base);
}

/// The ACL calls Mooncake's NPU wheel links besides hixl's, as the double implements them
/// (`tests/ascend_double/acl_extra.c`, every status exact): `aclrtHostRegister` and
/// `aclrtHostUnregister` (overlaps, unknown starts, what `aclrtPointerGetAttributes` then says),
/// `aclrtMemcpyBatch` (random data H2D then D2H in one call; each refusal's status and failing
/// index, nothing copied), `aclrtMemGetAllocationGranularity`, and device memory shared by IPC
/// between two processes: one exports `aclrtMalloc` memory (a whitelisted key and an open one),
/// the other imports both, reads the exporter's random bytes and writes its own, which the
/// exporter reads; a key whose exporter exited, a closed export, a key never exported are
/// refused. Every key file is gone afterwards but the one of the process that exited without
/// unloading the double.
#[test]
fn the_calls_mooncakes_wheel_links_behave_as_canns() {
    let Some((base, dir, lines)) = run_two_process_program("extra", "acl_extra.c", "importer OK")
    else {
        return;
    };
    for want in [
        "aclrtMemcpyBatch num=4 attrs=2 fail=-1 rc=0",
        "aclrtMemcpyBatch num=2 attrs=2 fail=1 rc=107000",
    ] {
        assert!(lines.lines().any(|l| l == want), "no {want:?} in {lines}");
    }
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left.len(),
        1,
        "only the exited exporter's key file: {left:?}"
    );
    assert!(left[0].starts_with(".ipc.hxipc-"), "{left:?}");
    let _ = std::fs::remove_dir_all(&base);
}
