//! The C ABI from C: `include/hixl_c.h` and `include/hixl_dd.h` match the library's exports,
//! and a two-process C program (server + client over `libhixl.so`) moves random data both ways,
//! notifies, polls async requests, and gets the exact status for each bad input; its server
//! serves its own memory or memory the engine allocated (`hixl_alloc_host_mem`, which its client
//! also tests with two engines in one process). LLM-DataDist's `hixl_dd_*` from C: one program,
//! two instances.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

/// Every `hixl_*` function the headers declare (`hixl_c.h`, and `hixl_dd.h`: LLM-DataDist's).
fn declared() -> BTreeSet<String> {
    let h = ["hixl_c.h", "hixl_dd.h"]
        .map(|f| std::fs::read_to_string(common::include_dir().join(f)).unwrap())
        .join("\n");
    let mut out = BTreeSet::new();
    for line in h.lines().filter(|l| !l.starts_with('#')) {
        let mut rest = line;
        while let Some(i) = rest.find("hixl_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            if tail[end..].starts_with('(') {
                out.insert(tail[..end].to_owned());
            }
            rest = &tail[end..];
        }
    }
    out
}

#[test]
fn header_declares_exactly_the_exported_functions() {
    let lib = common::lib_dir().join("libhixl.so");
    let nm = match Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
    {
        Ok(o) if o.status.success() => o,
        _ => {
            eprintln!("skipped: no working `nm` to list the exports");
            return;
        }
    };
    let exported: BTreeSet<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 3 && w[1] == "T").then(|| w[2].to_owned())
        })
        // HIXL-CS's functions: include/cs/hixl_cs.h, checked by tests/cs.rs; CANN's C++ ABI
        // (hixl::Hixl, ge::AscendString by their mangled names): tests/cpp_abi.rs
        .filter(|n| !n.starts_with("HixlCS") && !n.starts_with("_Z"))
        .collect();
    let declared = declared();
    assert!(declared.len() >= 25, "{declared:?}");
    assert_eq!(exported, declared, "exports (left) vs header (right)");
}

/// The C program as two processes, its server serving `memory` (`caller` or `engine`).
fn two_c_processes(memory: &str) {
    let Some(cc) = common::compiler("cc") else {
        return;
    };
    let flags = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"];
    common::two_processes(&cc, &flags, "hixl", "c/capi_test.c", 5, memory);
}

#[test]
fn two_c_processes_over_libhixl() {
    two_c_processes("caller");
}

/// The same client against a server whose memory the engine allocated
/// (`hixl_alloc_host_mem`): the client maps it and moves data one-sidedly.
#[test]
fn two_c_processes_over_engine_memory() {
    two_c_processes("engine");
}

/// LLM-DataDist's C ABI (`hixl_dd.h`) from C, one process: two instances on host memory move
/// random blocks and batches both ways (checked byte for byte), and every bad input (null
/// pointers, unknown and destroyed handles, unknown roles and placements, malformed layer
/// ranges and addresses, calls before initialize) gets its exact LLM-DataDist status.
#[test]
fn llm_datadist_c_abi_from_c() {
    let Some(cc) = common::compiler("cc") else {
        return;
    };
    let dir = common::scratch("dd-capi");
    let exe = dir.join("dd_capi_test");
    let flags = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"];
    common::build(
        &cc,
        &flags,
        "hixl",
        &[std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/dd_capi_test.c")],
        &exe,
    );
    common::run_client(Command::new(&exe).env_remove("LD_LIBRARY_PATH"));
    let _ = std::fs::remove_dir_all(dir);
}

/// LLM-DataDist's link by an explicit rank table from C (`hixl_dd_link_comm`,
/// `hixl_dd_query_register_mem_status`, `hixl_dd_unlink_comm`), one process on the ACL/HCCL
/// test double (`tools/ascend-double.sh`): two instances link by a rank table, poll to OK,
/// move random blocks both ways (checked byte for byte), unlink; bad inputs' exact statuses.
#[test]
fn llm_datadist_rank_table_link_from_c() {
    let Some(cc) = common::compiler("cc") else {
        return;
    };
    let dir = common::scratch("dd-rank");
    let exe = dir.join("dd_rank_test");
    let flags = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"];
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    common::build(
        &cc,
        &flags,
        "hixl",
        &[manifest.join("tests/c/dd_rank_test.c")],
        &exe,
    );
    let cann = dir.join("cann");
    common::build_double(&cann);
    let ranks = dir.join("ranks");
    std::fs::create_dir_all(&ranks).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ranks, std::fs::Permissions::from_mode(0o700)).unwrap();
    let so = cann.join("libacl_rt.so");
    common::run_client(
        Command::new(&exe)
            .env_remove("LD_LIBRARY_PATH")
            .env("HIXL_ACL_LIB", &so)
            .env("HIXL_HCCL_LIB", &so)
            .env("HIXL_ASCEND_DOUBLE_DIR", &ranks),
    );
    let _ = std::fs::remove_dir_all(dir);
}
