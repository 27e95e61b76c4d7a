//! Builds the ACL/HCCL ABI test double (`tests/ascend_double/double.c`) with the system C
//! compiler, so tests can load it in place of CANN.
//!
//! The double implements every symbol [`ffi`](super::ffi) loads over host memory, logs each call,
//! injects failures on request and moves bytes between ranks (within a process, or between
//! processes with `process_vm_writev`/`readv`), only to and from remote memory the remote rank
//! has bound to its live communicator, as HCCL. Its environment variables, control symbol and
//! log format are described at the top of the C file. `tools/ascend-double.sh DIR` builds the
//! same source under CANN's library names, for programs linked against CANN.

use crate::sync::lock;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::SystemTime;

/// The C source of the double.
pub(crate) const SOURCE: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ascend_double/double.c");
/// The file name `build` produces, before the source's hash.
pub(crate) const LIB_NAME: &str = "libascend_double.so";

/// `libascend_double-<FNV-1a of the source>.so`: trees with different sources (worktrees,
/// branches) that share a build directory never load each other's double.
fn lib_name(src: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in src {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{}-{h:016x}.so", LIB_NAME.trim_end_matches(".so"))
}

static BUILD_LOCK: Mutex<()> = Mutex::new(());

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Compiles the double into `out_dir/libascend_double-<source hash>.so` with `cc -shared -fPIC -O1`, unless
/// that file is already newer than the source, and returns its path.
///
/// Safe to call from parallel tests and processes: the library is built under a temporary name
/// and renamed into place.
///
/// # Errors
/// A description of what failed (creating `out_dir`, running `cc`, its diagnostics).
pub(crate) fn build(out_dir: &Path) -> Result<PathBuf, String> {
    let _guard = lock(&BUILD_LOCK);
    let src = Path::new(SOURCE);
    let text = std::fs::read(src).map_err(|e| format!("cannot read {}: {e}", src.display()))?;
    let out = out_dir.join(lib_name(&text));
    let src_time = mtime(src).ok_or_else(|| format!("cannot stat {}", src.display()))?;
    if mtime(&out).is_some_and(|t| t >= src_time) {
        return Ok(out);
    }
    std::fs::create_dir_all(out_dir)
        .map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
    let tmp = out_dir.join(format!(".{LIB_NAME}.{}.tmp", std::process::id()));
    let result = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-o"])
        .arg(&tmp)
        .arg(src)
        .arg("-lpthread")
        .output()
        .map_err(|e| format!("cannot run cc: {e}"))?;
    if !result.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!(
            "cc failed ({}): {}",
            result.status,
            String::from_utf8_lossy(&result.stderr)
        ));
    }
    std::fs::rename(&tmp, &out).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot rename {} to {}: {e}", tmp.display(), out.display())
    })?;
    Ok(out)
}

/// The directory unit tests build the double into (per user, kept between runs).
#[cfg(test)]
pub(crate) fn test_dir() -> PathBuf {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    std::env::temp_dir().join(format!("hixl-ascend-double-{uid}"))
}

/// A private copy of the double for one test: `dlopen` keys loaded objects by file, so a copy
/// has its own globals (log, injected failures, contexts) even while other tests run in the
/// same process. Remove the file when done.
#[cfg(test)]
pub(crate) fn test_instance(tag: &str) -> PathBuf {
    let dir = test_dir();
    let lib = build(&dir).expect("build the ACL/HCCL test double");
    let copy = dir.join(format!("inst-{}-{tag}.so", std::process::id()));
    std::fs::copy(&lib, &copy).expect("copy the test double");
    copy
}

/// Sets one of the double's settings (`"log"`, `"fail"`, `"dir"`, `"device_ip"`, ...) for the
/// instance loaded from `so`, overriding its environment variable; `None` unsets it. `"dir"`
/// set to `""` announces nowhere (unset, the double uses a default directory).
#[cfg(test)]
pub(crate) fn control(so: &Path, key: &str, value: Option<&str>) {
    use std::ffi::{CString, c_char, c_int};
    let lib = crate::dl::Library::open(&[&so.to_string_lossy()]).expect("open double");
    // SAFETY: the double declares `int hixl_double_control(const char *key, const char *value)`.
    let f: unsafe extern "C" fn(*const c_char, *const c_char) -> c_int =
        unsafe { lib.sym("hixl_double_control") }.expect("control symbol");
    let k = CString::new(key).expect("key");
    let v = value.map(|v| CString::new(v).expect("value"));
    // SAFETY: both strings are NUL-terminated and outlive the call; NULL means "unset".
    let rc = unsafe {
        f(
            k.as_ptr(),
            v.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
        )
    };
    assert_eq!(rc, 0, "unknown double setting {key}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_once_and_reuses_the_result() {
        let dir = test_dir();
        let a = build(&dir).expect("build");
        let t = mtime(&a).expect("built");
        let b = build(&dir).expect("build again");
        assert_eq!(a, b);
        assert_eq!(mtime(&b), Some(t), "not rebuilt when up to date");
        let name = a.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("libascend_double-") && name.ends_with(".so"),
            "{name}"
        );
        assert_eq!(name, lib_name(&std::fs::read(SOURCE).unwrap()));
        assert_ne!(
            lib_name(b"a"),
            lib_name(b"b"),
            "another source, another file"
        );
    }
}
