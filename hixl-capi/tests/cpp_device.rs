//! Device memory from C++, as HIXL's own examples move it (quickstart, d2rd, d2rh,
//! d2rd_multiproc): `tests/cpp/hixl_device.cpp`, a program in HIXL's style, built with the
//! flags and the link line of HIXL's `examples/cpp/CMakeLists.txt`
//! (`-lcann_hixl -lacl_rt -lascend_hal -lpthread -lrt`) and run as two processes on the ACL/HCCL
//! test double that `tools/ascend-double.sh` builds under CANN's library names. The processes get
//! `LD_LIBRARY_PATH` (this profile's `libhixl.so`/`libcann_hixl.so`, and the double) and nothing
//! hixl-specific: hixl uses Ascend because ACL and HCCL load, on the device each process made
//! current with `aclrtSetDevice` (no `aclInit`).
//!
//! The program checks, on the side that received the bytes (device memory read back with
//! `aclrtMemcpy` device to host), every READ and WRITE of seeded random data: device and
//! `aclrtMallocHost` memory, `TransferSync`, `TransferAsync` polled with `GetTransferStatus`, a
//! client buffer registered while linked and used at once, `ConnectAsync` polled with
//! `GetAsyncConnectStatus` (server to client, device to remote host), the server's
//! `DeregisterMem` while the client is linked (a WRITE to the buffer on the old link fails and
//! breaks it, a new link's table lacks the buffer, and the buffer stays untouched), and the
//! client's `Disconnect` after the server finalized and exited: `SUCCESS`.
//! The double's own log (`HIXL_ASCEND_DOUBLE_LOG`) shows the bytes went over HCCL.

mod common;

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

/// The link line of HIXL's `examples/cpp/CMakeLists.txt`.
const HIXL_EXAMPLE_LIBS: [&str; 5] = [
    "-lcann_hixl",
    "-lacl_rt",
    "-lascend_hal",
    "-lpthread",
    "-lrt",
];
/// Distinct devices, as d2rd_multiproc's defaults.
const SERVER_DEVICE: &str = "2";
const CLIENT_DEVICE: &str = "0";

/// Whether `name` runs (`--version`); prints why the test is skipped when it does not.
fn have(name: &str) -> bool {
    let ok = Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "SKIPPED: no `{name}` on PATH (needed to build the ACL/HCCL double and the C++ program)"
        );
    }
    ok
}

/// One of the two processes: commands on its stdin, answers on its stdout, its stderr in a
/// file (shown when a check fails). Killed if the test fails while it runs.
struct Peer {
    role: &'static str,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    stderr: PathBuf,
}

impl Peer {
    fn spawn(role: &'static str, mut cmd: Command, stderr: PathBuf) -> Peer {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr).expect("the stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn the {role}: {e}"));
        Peer {
            role,
            stdin: child.stdin.take(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The next line it prints (a failure if it exited instead).
    fn line(&mut self) -> String {
        let mut line = String::new();
        if self.stdout.read_line(&mut line).unwrap() == 0 {
            // it closed its stdout: it is exiting
            let status = self.child.wait();
            panic!(
                "the {} ended ({status:?}) before answering; its stderr:\n{}",
                self.role,
                self.stderr()
            );
        }
        line.trim_end().to_owned()
    }

    /// Sends `cmd` and reads up to its last line, which must be `want`; returns the lines
    /// before it.
    fn ask(&mut self, cmd: &str, want: &str) -> Vec<String> {
        writeln!(self.stdin.as_mut().unwrap(), "{cmd}")
            .unwrap_or_else(|e| panic!("{} gone ({e}); its stderr:\n{}", self.role, self.stderr()));
        let mut lines = Vec::new();
        loop {
            let line = self.line();
            if line.starts_with("WROTE ") {
                lines.push(line);
                continue;
            }
            assert_eq!(
                line,
                want,
                "{} answered `{cmd}` with {line:?}; its stderr:\n{}",
                self.role,
                self.stderr()
            );
            return lines;
        }
    }

    /// Waits for it to exit (its stdin closed first).
    fn exit(&mut self) -> ExitStatus {
        self.stdin = None;
        self.child.wait().unwrap()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A `WROTE OFF LEN TAG POS` line as the server's `check` command.
fn check_of(wrote: &str) -> String {
    let rest = wrote.strip_prefix("WROTE ").expect("a WROTE line");
    assert_eq!(rest.split_whitespace().count(), 4, "{wrote}");
    format!("check {rest}")
}

/// The double's log of one process.
fn log_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("the double's log {}: {e}", path.display()))
        .lines()
        .map(str::to_owned)
        .collect()
}

fn calls<'a>(log: &'a [String], symbol: &str) -> Vec<&'a String> {
    log.iter()
        .filter(|l| l.split_whitespace().next() == Some(symbol))
        .collect()
}

#[test]
fn hixl_style_device_program_runs_as_two_processes_on_the_double() {
    if !have("cc") || !have("c++") {
        return;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = common::scratch("cpp-device");
    let double = dir.join("cann");
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();

    // the double under CANN's names
    common::build_double(&double);

    // the program, as HIXL's examples are built
    let lib = common::lib_dir();
    let exe = dir.join("hixl_device");
    let asan = common::asan_flags();
    let out = Command::new("c++")
        .args(common::HIXL_EXAMPLE_FLAGS)
        .args(asan)
        .arg("-I")
        .arg(common::include_dir())
        .arg(manifest.join("tests/cpp/hixl_device.cpp"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&lib)
        .arg("-L")
        .arg(&double)
        .args(HIXL_EXAMPLE_LIBS)
        .output()
        .expect("run c++");
    assert!(
        out.status.success(),
        "c++ failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    match common::needed(&exe) {
        Some(n) => {
            for so in ["libcann_hixl.so", "libacl_rt.so"] {
                assert!(n.iter().any(|x| x == so), "DT_NEEDED {n:?} lacks {so}");
            }
        }
        None => eprintln!("not checked: no working `readelf` for the program's DT_NEEDED"),
    }

    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let seed = (nanos as u64) ^ u64::from(std::process::id());
    eprintln!("seed {seed}");
    let seed = seed.to_string();
    let ld_path = std::env::join_paths([&lib, &double]).unwrap();
    let server_log = dir.join("server.double.log");
    let client_log = dir.join("client.double.log");
    let command = |log: &Path| {
        let mut cmd = Command::new(&exe);
        // nothing hixl-specific from the test's environment (HIXL_ACL_LIB, ...); the double's
        // log variable is the double's; a private TMPDIR holds the directory where the double's
        // processes find each other
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("HIXL") {
                cmd.env_remove(k);
            }
        }
        cmd.env("LD_LIBRARY_PATH", &ld_path)
            .env("TMPDIR", &tmp)
            .env("HIXL_ASCEND_DOUBLE_LOG", log);
        cmd
    };

    let mut cmd = command(&server_log);
    cmd.args(["server", SERVER_DEVICE, &seed]);
    let mut server = Peer::spawn("server", cmd, dir.join("server.err"));
    let ready = server.line();
    let w: Vec<&str> = ready.split_whitespace().collect();
    assert!(
        w.len() == 5 && w[0] == "READY",
        "server said {ready:?}; its stderr:\n{}",
        server.stderr()
    );
    let (server_name, server_dev, server_host, server_spare) = (w[1], w[2], w[3], w[4]);

    let mut cmd = command(&client_log);
    cmd.args([
        "client",
        CLIENT_DEVICE,
        server_name,
        server_dev,
        server_host,
        server_spare,
        &seed,
    ]);
    let mut client = Peer::spawn("client", cmd, dir.join("client.err"));
    let hello = client.line();
    let w: Vec<&str> = hello.split_whitespace().collect();
    assert!(
        w.len() == 3 && w[0] == "CLIENT",
        "client said {hello:?}; its stderr:\n{}",
        client.stderr()
    );
    let (client_name, client_host) = (w[1].to_owned(), w[2].parse::<u64>().unwrap());

    // Connect, TransferSync READ and WRITE, TransferAsync, a buffer registered while linked
    let mut wrote = Vec::new();
    loop {
        let line = client.line();
        if line == "LINKED" {
            break;
        }
        assert!(
            line.starts_with("WROTE "),
            "client said {line:?}; its stderr:\n{}",
            client.stderr()
        );
        wrote.push(line);
    }
    assert_eq!(wrote.len(), 5, "{wrote:?}");
    // what the client wrote is in the server's device memory
    for line in &wrote {
        server.ask(&check_of(line), "OK");
    }

    // the other direction: ConnectAsync, and the server's device memory to the client's host
    // buffer (bytes 0.. of the server's stream 1), checked by the client
    let target = client_host + 524_288;
    server.ask(&format!("connect {client_name} {target}"), "OK");
    client.ask("check-host 524288 65536 1 0", "OK");

    // the server withdraws a buffer while the client is linked: SUCCESS; a WRITE to it on the
    // old link fails and breaks the link; linked again, the client no longer reaches it; the
    // buffer is untouched; the rest of the server's memory still works both ways
    server.ask("deregister", "OK");
    let later = client.ask("after-deregister", "OK");
    assert_eq!(later.len(), 1, "{later:?}");
    server.ask("check-spare", "OK");
    server.ask(&check_of(&later[0]), "OK");

    // the Disconnect race: the server finalizes and exits first; the client's Disconnect is
    // SUCCESS (the program checks it) and it finishes with PASS
    server.ask("quit", "BYE");
    let status = server.exit();
    assert!(
        status.success(),
        "server: {status}; its stderr:\n{}",
        server.stderr()
    );
    client.ask("disconnect", "PASS");
    let status = client.exit();
    assert!(
        status.success(),
        "client: {status}; its stderr:\n{}",
        client.stderr()
    );

    // the bytes went over HCCL, on the devices the processes set, without aclInit
    let server_calls = log_lines(&server_log);
    let client_calls = log_lines(&client_log);
    for (who, log, device) in [
        ("server", &server_calls, SERVER_DEVICE),
        ("client", &client_calls, CLIENT_DEVICE),
    ] {
        assert!(calls(log, "aclInit").is_empty(), "{who} called aclInit");
        let set = calls(log, "aclrtSetDevice");
        assert!(
            !set.is_empty()
                && set
                    .iter()
                    .all(|l| l.starts_with(&format!("aclrtSetDevice device={device} "))),
            "{who}: {set:?}"
        );
        // the aclrtMallocHost buffer is registered with HCCL as host memory (type 1)
        assert!(
            calls(log, "HcclRegisterGlobalMem")
                .iter()
                .any(|l| l.contains(" type=1 ") && l.ends_with(" rc=0")),
            "{who}: no MEM_HOST registration with HCCL"
        );
        for l in calls(log, "aclrtSynchronizeStreamWithTimeout") {
            assert!(l.ends_with(" rc=0"), "{who}: {l}");
        }
    }
    // every batch call succeeded but the client's WRITE on the old link to the buffer the server
    // had deregistered, which HCCL refused (the double: remote memory no longer bound to the
    // server's live communicator)
    let failed = |log: &[String]| -> Vec<String> {
        ["HcclBatchGet", "HcclBatchPut"]
            .into_iter()
            .flat_map(|sym| calls(log, sym))
            .filter(|l| !l.ends_with(" rc=0"))
            .cloned()
            .collect()
    };
    assert_eq!(failed(&server_calls), Vec::<String>::new(), "server");
    let client_failed = failed(&client_calls);
    assert!(
        client_failed.len() == 1
            && client_failed[0].starts_with("HcclBatchPut ")
            && client_failed[0].contains(" remote_unbound=0 "),
        "client: {client_failed:?}"
    );
    assert!(
        !calls(&client_calls, "HcclBatchGet").is_empty(),
        "the client's READs did not use HCCL"
    );
    assert!(
        !calls(&client_calls, "HcclBatchPut").is_empty(),
        "the client's WRITEs did not use HCCL"
    );
    assert!(
        !calls(&server_calls, "HcclBatchPut").is_empty(),
        "the server's WRITE did not use HCCL"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
