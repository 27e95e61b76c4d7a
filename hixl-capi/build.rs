//! `libcann_hixl.so`, CANN's name for HIXL's library, beside `libhixl.so`: a relative symlink
//! in the profile directory (`target/<profile>/`, or `target/<triple>/<profile>/` with
//! `--target`), so a program built for CANN links unchanged with `-lcann_hixl`, and its
//! `DT_NEEDED libcann_hixl.so` is found at run time wherever `libhixl.so` is.
//!
//! A symlink, not a second cdylib: one library, so one engine registry in a process that
//! loads both names, and nothing built twice. Cargo has no post-build step and its build
//! scripts run before the library is linked, so the link may dangle until the cdylib is
//! written (the same run of cargo writes it). It is the one thing this script writes outside
//! `OUT_DIR`. `libhixl.so` has no `DT_SONAME`, so a program records the name it was linked
//! with: `-lhixl` needs `libhixl.so` at run time, `-lcann_hixl` needs `libcann_hixl.so`.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let family = std::env::var("CARGO_CFG_TARGET_FAMILY").unwrap_or_default();
    if !family.split(',').any(|f| f == "unix") {
        return; // no symlinked library names to provide (Windows: hixl.dll)
    }
    let suffix = match std::env::var("CARGO_CFG_TARGET_OS").as_deref() {
        Ok("macos" | "ios") => "dylib",
        _ => "so",
    };
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is <profile dir>/build/hixl-capi-<hash>/out
    let Some(profile) = out_dir.ancestors().nth(3) else {
        println!(
            "cargo::warning=OUT_DIR {} has no profile directory",
            out_dir.display()
        );
        return;
    };
    if let Err(e) = link(
        profile,
        &format!("libhixl.{suffix}"),
        &format!("libcann_hixl.{suffix}"),
    ) {
        println!(
            "cargo::warning=could not create libcann_hixl.{suffix} in {}: {e}",
            profile.display()
        );
    }
}

/// Makes `dir/name` a symlink to `target` (relative), replacing whatever else is there.
#[cfg(unix)]
fn link(dir: &Path, target: &str, name: &str) -> std::io::Result<()> {
    let path = dir.join(name);
    match std::fs::read_link(&path) {
        Ok(t) if t == Path::new(target) => return Ok(()),
        Ok(_) => std::fs::remove_file(&path)?,
        Err(_) if path.symlink_metadata().is_ok() => std::fs::remove_file(&path)?,
        Err(_) => {}
    }
    match std::os::unix::fs::symlink(target, &path) {
        // another cargo made it meanwhile
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if std::fs::read_link(&path)? == Path::new(target) {
                Ok(())
            } else {
                Err(e)
            }
        }
        r => r,
    }
}

#[cfg(not(unix))]
fn link(_: &Path, _: &str, _: &str) -> std::io::Result<()> {
    Err(std::io::Error::other("symlinks need a Unix build host"))
}
