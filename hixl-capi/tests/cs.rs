//! HIXL-CS (`include/cs/hixl_cs.h`) from C: the header declares exactly the `HixlCS*`
//! functions `libcann_hixl.so` exports, the header compiles as C++ with HIXL's example flags,
//! and a two-process C program (a server with tagged host memory, a client over
//! `libcann_hixl.so`) moves random data sync and async both ways and compares it, reads the
//! server's tagged memory list, and gets upstream's exact status for every bad input: null
//! arguments, length 0, addresses outside every range, partial overlaps, a completion handle
//! queried twice, 4097 outstanding handles, calls after destroy, the failure latch (a batch
//! timed out while the server process was stopped). The server checks the bytes the client
//! left in its memory. The same program with device memory runs on the ACL/HCCL test double.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The `HixlCS*` functions `hixl_cs.h` declares.
fn declared() -> BTreeSet<String> {
    let h = std::fs::read_to_string(common::include_dir().join("cs/hixl_cs.h")).unwrap();
    let mut out = BTreeSet::new();
    let mut rest = h.as_str();
    while let Some(i) = rest.find("HixlCS") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if tail[end..].starts_with('(') {
            out.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    out
}

#[test]
fn header_declares_exactly_the_exported_cs_functions() {
    let declared = declared();
    assert_eq!(declared.len(), 16, "{declared:?}");
    let names: Vec<&str> = declared.iter().map(String::as_str).collect();
    for lib in ["libhixl.so", "libcann_hixl.so"] {
        let Some(missing) = common::missing_exports(&common::lib_dir().join(lib), &names) else {
            return;
        };
        assert!(missing.is_empty(), "{lib} lacks {missing:?}");
    }
}

/// The header as C++ (HIXL's example flags), the way a program written against CANN's includes
/// it: default member initializers, `nullptr`, the inline helpers; and with a `securec.h` on the
/// include path (tools/securec.h, as tools/ascend-double.sh installs it), which the hcomm
/// header then uses.
#[test]
fn header_compiles_as_cpp_with_and_without_securec() {
    let Some(cxx) = common::compiler("c++") else {
        return;
    };
    let dir = common::scratch("cs-cpp");
    let src = dir.join("cs.cpp");
    std::fs::write(
        &src,
        r#"#include "cs/hixl_cs.h"
static_assert(sizeof(HixlClientDesc) == 128 && sizeof(HixlServerDesc) == 128, "descs");
static_assert(sizeof(EndpointDesc) == 160 && sizeof(HcommChannelDesc) == 360, "hcomm");
int main() {
  HixlServerConfig config;             // defaults: null config, zeroed reserved bytes
  HixlClientDesc desc{};
  EndpointDesc ep;
  HcommChannelDesc ch;
  HixlCompleteStatus st = HIXL_COMPLETE_STATUS_WAITING;
  if (EndpointDescInit(&ep, 1) != 0 || HcommChannelDescInit(&ch, 1) != 0) return 1;
  if (ep.protocol != COMM_PROTOCOL_RESERVED || ch.header.size != sizeof(HcommChannelDesc)) return 2;
  if (config.global_resource_config != nullptr || config.reserved[119] != 0) return 3;
  if (desc.reserved[97] != 0 || st != 0 || HIXL_FAILED != 503900U) return 4;
  HixlServerHandle h = nullptr;
  return HixlCSServerDestroy(h) == HIXL_PARAM_INVALID ? 0 : 5;
}
"#,
    )
    .unwrap();
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools");
    for (i, extra) in [vec![], vec!["-I".to_owned(), tools.display().to_string()]]
        .into_iter()
        .enumerate()
    {
        let exe = dir.join(format!("cs{i}"));
        let flags: Vec<&str> = common::HIXL_EXAMPLE_FLAGS
            .iter()
            .copied()
            .chain(extra.iter().map(String::as_str))
            .collect();
        common::build(&cxx, &flags, "cann_hixl", std::slice::from_ref(&src), &exe);
        let st = Command::new(&exe)
            .env_remove("LD_LIBRARY_PATH")
            .status()
            .unwrap();
        assert!(st.success(), "{extra:?}: {st}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn two_c_processes_over_hixl_cs() {
    let Some(cc) = common::compiler("cc") else {
        return;
    };
    let dir = common::scratch("cs-c");
    let exe = dir.join("cs_test");
    let flags = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"];
    common::build(
        &cc,
        &flags,
        "cann_hixl",
        &[Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/cs_test.c")],
        &exe,
    );
    let size = 1u64 << 20;
    let mut server = common::Server::spawn(
        Command::new(&exe)
            .args(["server", &size.to_string()])
            .env_remove("LD_LIBRARY_PATH"),
    );
    assert_eq!(server.len, size);
    let wrote = common::run_client(
        Command::new(&exe)
            .args([
                "client",
                &server.name,
                &server.addr.to_string(),
                &size.to_string(),
                &server.pid().to_string(),
            ])
            .env_remove("LD_LIBRARY_PATH"),
    );
    assert_eq!(wrote.len(), 3, "{wrote:?}");
    for (off, len, sum) in wrote {
        assert_eq!(server.sum(off, len), sum, "kv0 {off}+{len}");
    }
    server.quit();
    let _ = std::fs::remove_dir_all(dir);
}

/// The same program built with `-DCS_DEVICE` and HIXL's example link line (`-lcann_hixl
/// -lacl_rt`), run as two processes on the ACL/HCCL test double (`tools/ascend-double.sh`):
/// the server's kv0 and the client's memory are device memory (`aclrtMalloc`), moved sync and
/// async, device to device and device to the server's host memory, compared after a device to
/// host copy; the server checks what the client left in kv0, and the double's log shows the
/// batches went over HCCL (`HcclBatchPut`/`HcclBatchGet`). The processes get nothing
/// hixl-specific: hixl uses Ascend because ACL and HCCL load.
#[test]
fn two_c_processes_over_hixl_cs_device_memory() {
    let Some(cc) = common::compiler("cc") else {
        return;
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = common::scratch("cs-device");
    let double = dir.join("cann");
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    common::build_double(&double);
    assert!(double.join("include/securec.h").exists());

    let lib = common::lib_dir();
    let exe = dir.join("cs_dev");
    let asan = common::asan_flags();
    let out = Command::new(&cc)
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-O1",
            "-DCS_DEVICE",
        ])
        .args(asan)
        .arg("-I")
        .arg(common::include_dir())
        .arg("-I")
        .arg(double.join("include"))
        .arg(manifest.join("tests/c/cs_test.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&lib)
        .arg("-L")
        .arg(&double)
        .args(["-lcann_hixl", "-lacl_rt"])
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ld_path = std::env::join_paths([&lib, &double]).unwrap();
    let command = |log: &Path| {
        let mut cmd = Command::new(&exe);
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
    let size = 1u64 << 20;
    let (server_log, client_log) = (dir.join("server.log"), dir.join("client.log"));
    let mut server =
        common::Server::spawn(command(&server_log).args(["server", &size.to_string(), "2"]));
    let wrote = common::run_client(command(&client_log).args([
        "client",
        &server.name,
        &server.addr.to_string(),
        &size.to_string(),
        &server.pid().to_string(),
        "0",
    ]));
    assert_eq!(wrote.len(), 3, "{wrote:?}");
    for (off, len, sum) in wrote {
        assert_eq!(server.sum(off, len), sum, "kv0 {off}+{len}");
    }
    server.quit();
    let log = std::fs::read_to_string(&client_log).unwrap_or_default();
    for call in ["HcclBatchPut", "HcclBatchGet"] {
        assert!(
            log.contains(call),
            "the client's double log has no {call}:\n{log}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
