//! ADXL (`adxl::AdxlEngine`, in `libllm_datadist.so`): a program in the style of its users
//! (Mooncake's and DLSlime's Ascend transports), built against `include/adxl/adxl_engine.h` with
//! CANN's example flags and linked with `-lllm_datadist` alone, run as two processes: random data
//! both ways, async with polling, notifications, each bad input's exact status, the allocator
//! statics and `ge::AscendString`. And the library exports the symbols a program built against
//! CANN's headers calls.

mod common;

/// Every method of `adxl::AdxlEngine` and of `ge::AscendString` that CANN's headers declare out
/// of line, by its mangled name (what a prebuilt program looks up).
const EXPORTED: &[&str] = &[
    "_ZN4adxl10AdxlEngineC1Ev",
    "_ZN4adxl10AdxlEngineD1Ev",
    "_ZN4adxl10AdxlEngine10InitializeERKN2ge12AscendStringERKSt3mapIS2_S2_St4lessIS2_ESaISt4pairIS3_S2_EEE",
    "_ZN4adxl10AdxlEngine8FinalizeEv",
    "_ZN4adxl10AdxlEngine11RegisterMemERKNS_7MemDescENS_7MemTypeERPv",
    "_ZN4adxl10AdxlEngine13DeregisterMemEPv",
    "_ZN4adxl10AdxlEngine7ConnectERKN2ge12AscendStringEi",
    "_ZN4adxl10AdxlEngine10DisconnectERKN2ge12AscendStringEi",
    "_ZN4adxl10AdxlEngine12TransferSyncERKN2ge12AscendStringENS_10TransferOpERKSt6vectorINS_14TransferOpDescESaIS7_EEi",
    "_ZN4adxl10AdxlEngine13TransferAsyncERKN2ge12AscendStringENS_10TransferOpERKSt6vectorINS_14TransferOpDescESaIS7_EERKNS_12TransferArgsERPv",
    "_ZN4adxl10AdxlEngine17GetTransferStatusERKPvRNS_14TransferStatusE",
    "_ZN4adxl10AdxlEngine10SendNotifyERKN2ge12AscendStringERKNS_10NotifyDescEi",
    "_ZN4adxl10AdxlEngine11GetNotifiesERSt6vectorINS_10NotifyDescESaIS2_EE",
    "_ZN4adxl10AdxlEngine9MallocMemENS_7MemTypeEmPPv",
    "_ZN4adxl10AdxlEngine23ExportToShareableHandleEPvR20aclrtMemFabricHandle",
    "_ZN4adxl10AdxlEngine7FreeMemEPv",
    "_ZN4adxl10AdxlEngine13GetCapabilityENS_11FeatureTypeERi",
    "_ZN2ge12AscendStringC1EPKc",
    "_ZN2ge12AscendStringC1EPKcm",
    "_ZNK2ge12AscendString9GetStringEv",
    "_ZNK2ge12AscendString9GetLengthEv",
    "_ZNK2ge12AscendString4FindERKS0_",
    "_ZNK2ge12AscendString4HashEv",
    "_ZNK2ge12AscendStringltERKS0_",
    "_ZNK2ge12AscendStringeqERKS0_",
    "_ZNK2ge12AscendStringeqEPKc",
];

/// Whether `libllm_datadist.so` was built (it needs a C++ compiler); says the test is skipped
/// when not.
fn llm_datadist_built() -> bool {
    let built = common::lib_dir().join("libllm_datadist.so").exists();
    if !built {
        eprintln!("skipped: no libllm_datadist.so (built only where a C++ compiler is)");
    }
    built
}

#[test]
fn libllm_datadist_exports_adxl_and_ascend_string() {
    let lib = common::lib_dir().join("libllm_datadist.so");
    let Some(missing) = common::missing_exports(&lib, EXPORTED) else {
        return;
    };
    assert!(missing.is_empty(), "not exported: {missing:?}");
    // it needs hixl's engine under CANN's name, found beside it
    if let Some(n) = common::needed(&lib) {
        assert!(n.contains(&"libcann_hixl.so".to_owned()), "{n:?}");
    }
}

/// ADXL on a thread with no device, where ACL loads (the test double of
/// `tools/ascend-double.sh`): `Initialize` fails with ACL's `ACL_ERROR_RT_CONTEXT_NULL`
/// (107002), as upstream's ADXL (which reads the device when it starts); after
/// `aclrtSetDevice` it succeeds.
#[test]
fn adxl_without_a_device_fails_at_initialize_with_acls_error() {
    let Some(cxx) = common::compiler("c++") else {
        return;
    };
    if !llm_datadist_built() {
        return;
    }
    let dir = common::scratch("adxl-nodevice");
    let double = dir.join("cann");
    common::build_double(&double);
    let exe = common::build_example(&cxx, "llm_datadist", "cpp/adxl_engine.cpp", &dir);
    let mut cmd = common::clean_command(&exe);
    cmd.arg("nodevice")
        .env("LD_LIBRARY_PATH", &double)
        .env("TMPDIR", &dir);
    common::run_client(&mut cmd);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_adxl_program_runs_as_two_processes() {
    let Some(cxx) = common::compiler("c++") else {
        return;
    };
    if !llm_datadist_built() {
        return;
    }
    common::two_processes(
        &cxx,
        &common::HIXL_EXAMPLE_FLAGS,
        "llm_datadist",
        "cpp/adxl_engine.cpp",
        4,
        "caller",
    );
}

/// `AdxlEngine::Initialize`/`Finalize` on one thread while two others call the engine (on the
/// test double, with a device set): every call answers `SUCCESS` or `FAILED`, nothing crashes
/// (`cpp/adxl_engine.cpp`'s `race`; the AddressSanitizer step runs it too). Before, `Initialize`
/// deleted the engine's state under the other threads' calls.
#[test]
fn adxl_lifecycle_calls_race_safely_with_other_calls() {
    let Some(cxx) = common::compiler("c++") else {
        return;
    };
    if !llm_datadist_built() {
        return;
    }
    let dir = common::scratch("adxl-race");
    let double = dir.join("cann");
    common::build_double(&double);
    let exe = common::build_example(&cxx, "llm_datadist", "cpp/adxl_engine.cpp", &dir);
    let mut cmd = common::clean_command(&exe);
    cmd.arg("race")
        .env("LD_LIBRARY_PATH", &double)
        .env("TMPDIR", &dir);
    common::run_client(&mut cmd);
    let _ = std::fs::remove_dir_all(dir);
}
