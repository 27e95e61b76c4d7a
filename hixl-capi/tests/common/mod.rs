//! Helpers for the C and C++ tests: find `libhixl.so`, compile a program against it, and talk
//! to a serving child process.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The compile flags of HIXL's C++ examples (`examples/cpp/CMakeLists.txt`, with `-std=c++17`).
pub const HIXL_EXAMPLE_FLAGS: [&str; 9] = [
    "-std=c++17",
    "-D_GLIBCXX_USE_CXX11_ABI=0",
    "-O2",
    "-ftrapv",
    "-fno-common",
    "-Wfloat-equal",
    "-Wall",
    "-Werror",
    "-Wextra",
];

/// `include/` of the repository.
pub fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../include")
}

/// The directory holding `libhixl.so` and `libcann_hixl.so` (`target/<profile>/`). Cargo does
/// not build a cdylib-only package's library for its tests, so the first call builds it with
/// the cargo running these tests (`cargo build -p hixl-capi`, same profile and target directory: a no-op
/// when it is fresh, and never a stale library). `HIXL_CAPI_LIB_DIR` names a directory where
/// it was built already instead (the AddressSanitizer step of `.ci/run` builds it with the
/// same flags as the tests, for another target directory and `--target`).
pub fn lib_dir() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(dir) = std::env::var_os("HIXL_CAPI_LIB_DIR") {
                let dir = PathBuf::from(dir);
                assert!(
                    dir.join("libhixl.so").exists(),
                    "HIXL_CAPI_LIB_DIR={} has no libhixl.so",
                    dir.display()
                );
                return dir;
            }
            let exe = std::env::current_exe().expect("the test binary's path");
            let profile = exe
                .parent()
                .and_then(Path::parent)
                .expect("target/<profile>/deps/<test>");
            let target = profile.parent().expect("target/");
            let release = profile.file_name().is_some_and(|n| n == "release");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "-p", "hixl-capi", "--manifest-path"])
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
                .env("CARGO_TARGET_DIR", target);
            if release {
                cmd.arg("--release");
            }
            let o = cmd.output().expect("run cargo build -p hixl-capi");
            assert!(
                o.status.success(),
                "cargo build -p hixl-capi failed:\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(
                profile.join("libhixl.so").exists(),
                "{} has no libhixl.so",
                profile.display()
            );
            profile.to_path_buf()
        })
        .clone()
}

/// The compiler `name` (`cc`, `c++`), or `None` (the test is skipped with a printed reason).
pub fn compiler(name: &str) -> Option<String> {
    let found = Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        eprintln!("skipped: no `{name}` on PATH to build the test program");
    }
    found.then(|| name.to_owned())
}

/// A scratch directory for this test process.
pub fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hixl-capi-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Builds the ACL/HCCL test double into `dir` (`tools/ascend-double.sh`: CANN's library names,
/// and `securec.h` under `dir/include`).
pub fn build_double(dir: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/ascend-double.sh");
    let out = Command::new("bash")
        .arg(script)
        .arg(dir)
        .output()
        .expect("run tools/ascend-double.sh");
    assert!(out.status.success(), "tools/ascend-double.sh: {out:?}");
}

/// The flags a C or C++ program (or library) of the tests takes in the AddressSanitizer build
/// (`--cfg hixl_asan`: gcc's runtime then serves the instrumented `libhixl.so`), none otherwise.
pub fn asan_flags() -> &'static [&'static str] {
    if cfg!(hixl_asan) {
        &["-fsanitize=address"]
    } else {
        &[]
    }
}

/// Compiles `sources` with `compiler` and `flags` into `out`, linked with `-l<lib>` (`hixl`, or
/// `cann_hixl`: the same library under HIXL's name; rpath set). In the AddressSanitizer build
/// (`--cfg hixl_asan`) the program is built with `-fsanitize=address` too: its runtime serves
/// the instrumented `libhixl.so`.
pub fn build(compiler: &str, flags: &[&str], lib: &str, sources: &[PathBuf], out: &Path) {
    let dir = lib_dir();
    let o = Command::new(compiler)
        .args(flags)
        .args(asan_flags())
        .arg("-I")
        .arg(include_dir())
        .args(sources)
        .arg("-o")
        .arg(out)
        .arg("-L")
        .arg(&dir)
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .arg(format!("-l{lib}"))
        .output()
        .expect("run the compiler");
    assert!(
        o.status.success(),
        "{compiler} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Builds `tests/<source>` with HIXL's example flags ([`HIXL_EXAMPLE_FLAGS`]) into
/// `dir/program`, linked with `-l<lib>`; returns the program's path.
pub fn build_example(compiler: &str, lib: &str, source: &str, dir: &Path) -> PathBuf {
    let exe = dir.join("program");
    build(
        compiler,
        &HIXL_EXAMPLE_FLAGS,
        lib,
        &[Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests")
            .join(source)],
        &exe,
    );
    exe
}

/// A command for `exe` without the `HIXL*` variables this process may have inherited (the
/// double's settings among them).
pub fn clean_command(exe: &Path) -> Command {
    let mut cmd = Command::new(exe);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HIXL") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A serving child that printed `READY <name> <addr> <len>` and answers `sum`, `notifies`,
/// `quit` (the C and C++ test programs' server mode).
pub struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub name: String,
    pub addr: u64,
    pub len: u64,
}

impl Server {
    pub fn spawn(cmd: &mut Command) -> Server {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the server");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(w.first(), Some(&"READY"), "server said {line:?}");
        Server {
            name: w[1].to_owned(),
            addr: w[2].parse().unwrap(),
            len: w[3].parse().unwrap(),
            child,
            stdin,
            stdout,
        }
    }

    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim_end().to_owned()
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The FNV-1a of `len` bytes at `off` of the server's region.
    pub fn sum(&mut self, off: u64, len: u64) -> u64 {
        let line = self.ask(&format!("sum {off} {len}"));
        let hex = line
            .strip_prefix("SUM ")
            .unwrap_or_else(|| panic!("server said {line:?}"));
        u64::from_str_radix(hex, 16).unwrap()
    }

    /// The notifications received, as `"name msg"` lines.
    pub fn notifies(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let mut line = self.ask("notifies");
        while line != "END" {
            out.push(
                line.strip_prefix("NOTIFY ")
                    .unwrap_or_else(|| panic!("server said {line:?}"))
                    .to_owned(),
            );
            line.clear();
            self.stdout.read_line(&mut line).unwrap();
            line = line.trim_end().to_owned();
        }
        out
    }

    /// Asks it to finalize and exit; checks it exited 0.
    pub fn quit(mut self) {
        writeln!(self.stdin, "quit").unwrap();
        assert!(self.child.wait().unwrap().success(), "the server failed");
    }
}

/// Runs a program (a client, or a test program on its own) to completion: checks it exited 0
/// and printed `PASS`; returns its `WROTE <remote off> <len> <fnv1a hex>` lines as numbers.
pub fn run_client(cmd: &mut Command) -> Vec<(u64, u64, u64)> {
    let o = cmd.output().expect("run the client");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.lines().any(|l| l == "PASS"),
        "client failed ({}):\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    out.lines()
        .filter_map(|l| l.strip_prefix("WROTE "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (
                w[0].parse().unwrap(),
                w[1].parse().unwrap(),
                u64::from_str_radix(w[2], 16).unwrap(),
            )
        })
        .collect()
}

/// Which of `wanted` (mangled names) `lib` does not export as defined text symbols (`nm -D
/// --defined-only`); `None`, with the reason printed, where the library was not built (no C++
/// compiler) or there is no working `nm`.
pub fn missing_exports(lib: &Path, wanted: &[&str]) -> Option<Vec<String>> {
    if !lib.exists() {
        eprintln!(
            "skipped: no {} (built only where a C++ compiler is)",
            lib.display()
        );
        return None;
    }
    let nm = match Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
    {
        Ok(o) if o.status.success() => o,
        _ => {
            eprintln!("skipped: no working `nm` to list the exports");
            return None;
        }
    };
    let out = String::from_utf8_lossy(&nm.stdout);
    let defined: std::collections::BTreeSet<&str> = out
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 3 && w[1] == "T").then_some(w[2])
        })
        .collect();
    Some(
        wanted
            .iter()
            .filter(|s| !defined.contains(**s))
            .map(|s| s.to_string())
            .collect(),
    )
}

/// The `DT_NEEDED` entries of an ELF file (`readelf -d`), or `None` without a working
/// `readelf`.
pub fn needed(elf: &Path) -> Option<Vec<String>> {
    let o = Command::new("readelf").arg("-d").arg(elf).output().ok()?;
    if !o.status.success() {
        return None;
    }
    // 0x0000000000000001 (NEEDED)             Shared library: [libhixl.so]
    let out = String::from_utf8_lossy(&o.stdout);
    Some(
        out.lines()
            .filter(|l| l.contains("(NEEDED)"))
            .filter_map(|l| Some(l.split_once('[')?.1.split_once(']')?.0.to_owned()))
            .collect(),
    )
}

/// Builds `source` (under `tests/`) with `compiler` and `flags`, linked with `-l<lib>` (checks
/// that the program needs `lib<lib>.so`, when `readelf` is there), runs it as `server 1048576
/// MEMORY` and `client NAME ADDR LEN`, and checks on the server what the client wrote (`writes`
/// lines) and the one notification `kv ready`. `memory` is what the server serves: `caller`
/// (its own memory, registered) or `engine` (allocated by the engine: the same-host peer maps
/// it).
pub fn two_processes(
    compiler: &str,
    flags: &[&str],
    lib: &str,
    source: &str,
    writes: usize,
    memory: &str,
) {
    let dir = scratch(&format!(
        "{}-{memory}",
        source.rsplit('/').next().unwrap_or(source)
    ));
    let exe = dir.join("program");
    build(
        compiler,
        flags,
        lib,
        &[Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests")
            .join(source)],
        &exe,
    );
    match needed(&exe) {
        Some(n) => assert!(
            n.contains(&format!("lib{lib}.so")),
            "{lib}: DT_NEEDED {n:?}"
        ),
        None => eprintln!("not checked: no working `readelf` for the program's DT_NEEDED"),
    }
    let mut server = Server::spawn(Command::new(&exe).args(["server", "1048576", memory]));
    let wrote = run_client(Command::new(&exe).args([
        "client",
        &server.name,
        &server.addr.to_string(),
        &server.len.to_string(),
    ]));
    assert_eq!(wrote.len(), writes, "{wrote:?}");
    for (off, len, sum) in wrote {
        assert_eq!(server.sum(off, len), sum, "{off}+{len}");
    }
    assert_eq!(server.notifies(), vec!["kv ready".to_owned()]);
    server.quit();
    let _ = std::fs::remove_dir_all(dir);
}
