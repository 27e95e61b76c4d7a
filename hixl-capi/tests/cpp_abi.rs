//! CANN's C++ ABI of `libcann_hixl.so`: `hixl::Hixl` (and `ge::AscendString`) exported by the
//! mangled names a program compiled against CANN's own `include/hixl/hixl.h` calls. A program
//! written against declarations matching CANN's header (`tests/cpp/cann_hixl.h`: the pimpl
//! class, every method out of line; hixl's header-only `hixl/hixl.h` is not included), built
//! with HIXL's example flags (CANN's C++ ABI) and linked with `-lcann_hixl` alone, runs as two
//! processes: random data both ways, sync and async, checked on both sides.

mod common;

/// `hixl::Hixl`'s methods and `ge::AscendString`'s out-of-line ones, by CANN's mangled names.
const EXPORTED: &[&str] = &[
    "_ZN4hixl4HixlC1Ev",
    "_ZN4hixl4HixlC2Ev",
    "_ZN4hixl4HixlD1Ev",
    "_ZN4hixl4HixlD2Ev",
    "_ZN4hixl4Hixl10InitializeERKN2ge12AscendStringERKSt3mapIS2_S2_St4lessIS2_ESaISt4pairIS3_S2_EEE",
    "_ZN4hixl4Hixl8FinalizeEv",
    "_ZN4hixl4Hixl11RegisterMemERKNS_7MemDescENS_7MemTypeERPv",
    "_ZN4hixl4Hixl13DeregisterMemEPv",
    "_ZN4hixl4Hixl7ConnectERKN2ge12AscendStringEi",
    "_ZN4hixl4Hixl10DisconnectERKN2ge12AscendStringEi",
    "_ZN4hixl4Hixl12ConnectAsyncERKN2ge12AscendStringEi",
    "_ZN4hixl4Hixl15DisconnectAsyncERKN2ge12AscendStringEi",
    "_ZN4hixl4Hixl21GetAsyncConnectStatusERKN2ge12AscendStringERNS_18AsyncConnectStatusE",
    "_ZN4hixl4Hixl21GetAsyncConnectStatusERSt3mapIN2ge12AscendStringENS_18AsyncConnectStatusESt4lessIS3_ESaISt4pairIKS3_S4_EEE",
    "_ZN4hixl4Hixl12TransferSyncERKN2ge12AscendStringENS_10TransferOpERKSt6vectorINS_14TransferOpDescESaIS7_EEi",
    "_ZN4hixl4Hixl13TransferAsyncERKN2ge12AscendStringENS_10TransferOpERKSt6vectorINS_14TransferOpDescESaIS7_EERKNS_12TransferArgsERPv",
    "_ZN4hixl4Hixl17GetTransferStatusERKPvRNS_14TransferStatusE",
    "_ZN4hixl4Hixl17GetTransferStatusERKNS_21GetTransferStatusArgsERSt6vectorINS_14TransferResultESaIS5_EE",
    "_ZN4hixl4Hixl10SendNotifyERKN2ge12AscendStringERKNS_10NotifyDescEi",
    "_ZN4hixl4Hixl11GetNotifiesERSt6vectorINS_10NotifyDescESaIS2_EE",
    "_ZN4hixl4Hixl13GetCapabilityENS_11FeatureTypeERi",
    "_ZN2ge12AscendStringC1EPKc",
    "_ZN2ge12AscendStringC2EPKc",
    "_ZN2ge12AscendStringC1EPKcm",
    "_ZN2ge12AscendStringC2EPKcm",
    "_ZNK2ge12AscendString9GetStringEv",
    "_ZNK2ge12AscendString9GetLengthEv",
    "_ZNK2ge12AscendString4FindERKS0_",
    "_ZNK2ge12AscendString4HashEv",
    "_ZNK2ge12AscendStringltERKS0_",
    "_ZNK2ge12AscendStringgtERKS0_",
    "_ZNK2ge12AscendStringleERKS0_",
    "_ZNK2ge12AscendStringgeERKS0_",
    "_ZNK2ge12AscendStringeqERKS0_",
    "_ZNK2ge12AscendStringneERKS0_",
    "_ZNK2ge12AscendStringeqEPKc",
    "_ZNK2ge12AscendStringneEPKc",
];

#[test]
fn libcann_hixl_exports_hixl_as_canns_does() {
    let lib = common::lib_dir().join("libcann_hixl.so");
    let Some(missing) = common::missing_exports(&lib, EXPORTED) else {
        return;
    };
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

/// The program compiled against CANN's declarations, linked with `-lcann_hixl` alone, as a
/// server and a client process.
#[test]
fn a_program_built_against_canns_header_runs_as_two_processes() {
    let Some(cxx) = common::compiler("c++") else {
        return;
    };
    common::two_processes(
        &cxx,
        &common::HIXL_EXAMPLE_FLAGS,
        "cann_hixl",
        "cpp/cann_abi.cpp",
        3,
        "caller",
    );
}

/// Both forms in one process, the interposition case: a shared library built with hixl's
/// header-only `hixl/hixl.h` (its inline `ge::AscendString`, the default C++ ABI, `-O0` so every
/// inline method it uses is emitted), preloaded ahead of everything (`LD_PRELOAD`), serves
/// memory from a header-only engine; the program compiled against CANN's declarations (CANN's
/// C++ ABI) moves data to and from it through `libcann_hixl.so`'s exported class, and checks
/// the bytes the library holds. The library exports none of `ge::AscendString`'s or
/// `hixl::Hixl`'s names (its inline copies are hidden), so the program's strings are made and
/// read by `libcann_hixl.so` alone.
#[test]
fn both_forms_share_a_process_without_interposing() {
    let Some(cxx) = common::compiler("c++") else {
        return;
    };
    let dir = common::scratch("cpp-abi-mixed");
    let lib = common::lib_dir();
    let peer = dir.join("libhixlpeer.so");
    let asan: &[&str] = if cfg!(hixl_asan) {
        &["-fsanitize=address"]
    } else {
        &[]
    };
    let o = std::process::Command::new(&cxx)
        .args([
            "-std=c++17",
            "-O0",
            "-fPIC",
            "-shared",
            "-Wall",
            "-Wextra",
            "-Werror",
        ])
        .args(asan)
        .arg("-I")
        .arg(common::include_dir())
        .arg(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cpp/header_only_peer.cpp"),
        )
        .arg("-o")
        .arg(&peer)
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lcann_hixl")
        .output()
        .expect("run the compiler");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // no dynamic symbol of the library's, strong or weak, has one of the exported names
    match std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&peer)
        .output()
    {
        Ok(o) if o.status.success() => {
            let out = String::from_utf8_lossy(&o.stdout);
            let leaked: Vec<&str> = out
                .lines()
                .filter_map(|l| l.split_whitespace().nth(2))
                .filter(|n| EXPORTED.contains(n))
                .collect();
            assert!(
                leaked.is_empty(),
                "the header-only library exports {leaked:?}"
            );
        }
        _ => eprintln!("not checked: no working `nm` for the library's exports"),
    }
    let exe = common::build_example(&cxx, "cann_hixl", "cpp/cann_abi.cpp", &dir);
    let mut cmd = common::clean_command(&exe);
    cmd.arg("mixed").env("LD_PRELOAD", &peer);
    if cfg!(hixl_asan) {
        // ASan's runtime must come first; the test program links it, the preload does not need to
        cmd.env_remove("LD_PRELOAD");
        eprintln!("not checked under AddressSanitizer: LD_PRELOAD would precede its runtime");
        let _ = std::fs::remove_dir_all(dir);
        return;
    }
    common::run_client(&mut cmd);
    let _ = std::fs::remove_dir_all(dir);
}
