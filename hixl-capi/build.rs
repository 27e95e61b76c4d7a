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
    println!("cargo::rustc-check-cfg=cfg(hixl_cxx)");
    if suffix == "so" {
        match cann_abi(&out_dir) {
            Ok(()) => println!("cargo::rustc-cfg=hixl_cxx"),
            Err(e) => println!(
                "cargo::warning=libhixl.so built without CANN's C++ ABI (hixl::Hixl, ge::AscendString): {e}"
            ),
        }
    }
    if suffix == "so"
        && let Err(e) = llm_datadist(profile, &out_dir)
    {
        println!("cargo::warning=libllm_datadist.so not built: {e}");
    }
}

/// The C++ layer of CANN's ABI in `libhixl.so` (so in `libcann_hixl.so`): `cxx/cann_hixl.cc`
/// (`hixl::Hixl`'s methods as `extern "C"` functions over hixl's header-only class) and
/// `cxx/ascend_string.cc` compiled under the namespace `hixl_ge` (`ge::AscendString`'s methods,
/// which `src/cann_abi.rs` exports under GE's names), both with CANN's C++ ABI
/// (`-D_GLIBCXX_USE_CXX11_ABI=0`) and hidden visibility, in the static archive
/// `OUT_DIR/libhixl_cxx.a` linked into the library with libstdc++. The library is linked with
/// `-Bsymbolic-functions`, so its calls to its own exported names bind inside it. Without a C++
/// compiler (`$CXX`, else `c++`) or `ar` (`$AR`, else `ar`), it is left out, with a warning.
fn cann_abi(out_dir: &Path) -> Result<(), String> {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").ok_or("no manifest dir")?);
    let include = manifest.join("../include");
    let cann = manifest.join("cxx/cann_hixl.cc");
    let ascend = manifest.join("cxx/ascend_string.cc");
    for f in [
        &cann,
        &ascend,
        &include.join("hixl/hixl.h"),
        &include.join("hixl/hixl_types.h"),
        &include.join("hixl/ge_ascend_string.h"),
        &include.join("adxl/adxl_types.h"),
        &include.join("hixl_c.h"),
    ] {
        println!("cargo::rerun-if-changed={}", f.display());
    }
    println!("cargo::rerun-if-env-changed=AR");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let ar = std::env::var("AR").unwrap_or_else(|_| "ar".into());
    let run = |tool: &str, cmd: &mut std::process::Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{tool}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    };
    let flags = [
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-fvisibility=hidden",
        "-fvisibility-inlines-hidden",
        "-D_GLIBCXX_USE_CXX11_ABI=0",
        "-Wall",
        "-Wextra",
        "-Werror",
    ];
    let objs = [out_dir.join("cann_hixl.o"), out_dir.join("ascend_string.o")];
    run(
        &cxx,
        std::process::Command::new(&cxx)
            .args(flags)
            .arg("-I")
            .arg(&include)
            .arg("-c")
            .arg(&cann)
            .arg("-o")
            .arg(&objs[0]),
    )?;
    // GE's class under another namespace: its methods keep GE's mangled names after it
    run(
        &cxx,
        std::process::Command::new(&cxx)
            .args(flags)
            .arg("-Dge=hixl_ge")
            .arg("-I")
            .arg(&include)
            .arg("-c")
            .arg(&ascend)
            .arg("-o")
            .arg(&objs[1]),
    )?;
    let lib = out_dir.join("libhixl_cxx.a");
    let _ = std::fs::remove_file(&lib);
    run(
        &ar,
        std::process::Command::new(&ar)
            .arg("crs")
            .arg(&lib)
            .args(&objs),
    )?;
    println!("cargo::rustc-link-search=native={}", out_dir.display());
    println!("cargo::rustc-link-lib=static=hixl_cxx");
    println!("cargo::rustc-link-lib=dylib=stdc++");
    println!("cargo::rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    Ok(())
}

/// `libllm_datadist.so` in the profile directory: `adxl::AdxlEngine`, `llm_datadist::LlmDataDist`
/// and `ge::AscendString` (`cxx/`, headers in `include/adxl/` and `include/llm_datadist/`),
/// compiled C++ over hixl's C ABI (`hixl_c.h`, `hixl_dd.h`), for programs built
/// against CANN's library that call its mangled C++ symbols. It needs `libcann_hixl.so` (its
/// `DT_NEEDED`, found beside it through `$ORIGIN`), which is linked after this script runs: the
/// link is made against an empty stand-in of that name, and the C ABI's symbols are left for the
/// loader. Without a C++ compiler (`$CXX`, else `c++`) it is not built, with a warning.
fn llm_datadist(profile: &Path, out_dir: &Path) -> Result<(), String> {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").ok_or("no manifest dir")?);
    let include = manifest.join("../include");
    let sources = [
        manifest.join("cxx/ascend_string.cc"),
        manifest.join("cxx/adxl_engine.cc"),
        manifest.join("cxx/llm_datadist.cc"),
    ];
    for f in sources.iter().chain(&[
        include.join("adxl/adxl_types.h"),
        include.join("adxl/adxl_engine.h"),
        include.join("hixl_c.h"),
        include.join("hixl_dd.h"),
        include.join("llm_datadist/llm_datadist.h"),
        include.join("llm_datadist/llm_error_codes.h"),
        include.join("llm_datadist/ge_compat.h"),
    ]) {
        println!("cargo::rerun-if-changed={}", f.display());
    }
    println!("cargo::rerun-if-env-changed=CXX");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let run = |cmd: &mut std::process::Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{cxx}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    };
    // the stand-in: an empty library named libcann_hixl.so
    let stub = out_dir.join("stub");
    std::fs::create_dir_all(&stub).map_err(|e| e.to_string())?;
    let empty = stub.join("empty.cc");
    std::fs::write(&empty, "").map_err(|e| e.to_string())?;
    run(std::process::Command::new(&cxx)
        .args(["-shared", "-fPIC", "-o"])
        .arg(stub.join("libcann_hixl.so"))
        .arg(&empty))?;
    // built aside, then moved into place: a program never sees half a library
    let tmp = out_dir.join("libllm_datadist.so");
    run(std::process::Command::new(&cxx)
        .args([
            "-std=c++17",
            // CANN's C++ ABI, as libcann_hixl.so's C++ layer and CANN's own libraries: the
            // ge::AscendString both libraries define then share one std::string layout
            "-D_GLIBCXX_USE_CXX11_ABI=0",
            "-O2",
            "-fPIC",
            "-shared",
            "-Wall",
            "-Wextra",
            "-Werror",
        ])
        // the AddressSanitizer step (`--cfg hixl_asan`) instruments the C++ layer too: the
        // test programs built with -fsanitize=address bring its runtime
        .args(std::env::var_os("CARGO_CFG_HIXL_ASAN").map(|_| "-fsanitize=address"))
        .arg("-I")
        .arg(&include)
        .args(&sources)
        .arg("-o")
        .arg(&tmp)
        .arg("-L")
        .arg(&stub)
        .args(["-Wl,--no-as-needed", "-lcann_hixl", "-Wl,-rpath,$ORIGIN"]))?;
    std::fs::rename(&tmp, profile.join("libllm_datadist.so"))
        .or_else(|_| std::fs::copy(&tmp, profile.join("libllm_datadist.so")).map(drop))
        .map_err(|e| e.to_string())
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
