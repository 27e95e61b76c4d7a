//! HCCL's one-sided entry points, in one table loaded with `dlopen` at run time, once per
//! process, by the device floor's loader (`device/sys/`: `dl_api!`, which ACL's table uses
//! too). Only `hccl/` calls the table (its fields are private to it).
//!
//! Only the C ABI is used: no header is needed at build time and nothing is linked. Every symbol
//! is looked up when the library is loaded, so a missing one is [`Error::LibraryUnavailable`]
//! naming it, never a crash on first use.
//!
//! Sources of the declarations (public CANN repositories): `pkg_inc/legacy/hccl/hccl_one_sided_services.h`
//! of hcomm, and HIXL's private copy `src/llm_datadist/comm_adapter/comm_types.h`;
//! `HcclCommConfig` from `hccl/hccl_types.h` at `HCCL_COMM_CONFIG_VERSION = 5`, the version
//! HIXL's `DlHcclCommConfigInit` writes.

// Only what hixl calls is declared.

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::sync::Arc;

use crate::device::sys::{AclrtStream, candidates, dl_api};
use crate::error::Error;

/// `HcclResult` (a C enum, `int`).
pub(crate) type HcclResult = c_int;
/// `HcclComm` (`void *`).
pub(crate) type HcclComm = *mut c_void;

// ---------------------------------------------------------------------------------------------
// HCCL constants and types
// ---------------------------------------------------------------------------------------------

/// `HcclResult` names, indexed by value 0..=24 (`hccl_types.h`); 1041 is `HCCL_E_IN_STATUS`.
pub(crate) const HCCL_RESULTS: &[&str] = &[
    "HCCL_SUCCESS",
    "HCCL_E_PARA",
    "HCCL_E_PTR",
    "HCCL_E_MEMORY",
    "HCCL_E_INTERNAL",
    "HCCL_E_NOT_SUPPORT",
    "HCCL_E_NOT_FOUND",
    "HCCL_E_UNAVAIL",
    "HCCL_E_SYSCALL",
    "HCCL_E_TIMEOUT",
    "HCCL_E_OPEN_FILE_FAILURE",
    "HCCL_E_TCP_CONNECT",
    "HCCL_E_ROCE_CONNECT",
    "HCCL_E_TCP_TRANSFER",
    "HCCL_E_ROCE_TRANSFER",
    "HCCL_E_RUNTIME",
    "HCCL_E_DRV",
    "HCCL_E_PROFILING",
    "HCCL_E_CCE",
    "HCCL_E_NETWORK",
    "HCCL_E_AGAIN",
    "HCCL_E_REMOTE",
    "HCCL_E_SUSPENDING",
    "HCCL_E_OPRETRY_FAIL",
    "HCCL_E_OOM",
];

/// `HCCL_SUCCESS`.
pub(crate) const HCCL_SUCCESS: HcclResult = 0;
/// `HCCL_E_PARA`.
pub(crate) const HCCL_E_PARA: HcclResult = 1;
/// `HCCL_E_TIMEOUT`.
pub(crate) const HCCL_E_TIMEOUT: HcclResult = 9;
/// `HCCL_E_IN_STATUS`.
pub(crate) const HCCL_E_IN_STATUS: HcclResult = 1041;

/// The header name of an `HcclResult`, or `"HCCL_E_UNKNOWN"`.
pub(crate) fn hccl_result_name(code: HcclResult) -> &'static str {
    if code == HCCL_E_IN_STATUS {
        return "HCCL_E_IN_STATUS";
    }
    usize::try_from(code)
        .ok()
        .and_then(|i| HCCL_RESULTS.get(i).copied())
        .unwrap_or("HCCL_E_UNKNOWN")
}

/// `HcclDataType::HCCL_DATA_TYPE_UINT8`: HIXL describes every one-sided op in bytes.
pub(crate) const HCCL_DATA_TYPE_UINT8: c_int = 7;
/// `CommMemType::COMM_MEM_TYPE_DEVICE` (= `HCCL_MEM_TYPE_DEVICE`).
pub(crate) const COMM_MEM_TYPE_DEVICE: c_int = 0;
/// `CommMemType::COMM_MEM_TYPE_HOST` (= `HCCL_MEM_TYPE_HOST`).
pub(crate) const COMM_MEM_TYPE_HOST: c_int = 1;
/// `HcclTopoType::HCCL_TOPO_FULLMESH`.
pub(crate) const HCCL_TOPO_FULLMESH: c_int = 0;

/// `HCCL_COMM_CONFIG_MAGIC_WORD`.
pub(crate) const HCCL_COMM_CONFIG_MAGIC_WORD: u32 = 0xf0f0_f0f0;
/// The config version HIXL writes (`DlHcclCommConfigInit`: 5). HCCL reads fields by version.
pub(crate) const HCCL_COMM_CONFIG_VERSION: u32 = 5;
/// `HCCL_COMM_DEFAULT_BUFFSIZE`, in MB.
pub(crate) const HCCL_COMM_DEFAULT_BUFFSIZE: u32 = 200;
/// `HCCL_COMM_TRAFFIC_CLASS_CONFIG_NOT_SET` / `..._SERVICE_LEVEL_...`: the field is unset.
pub(crate) const HCCL_COMM_CONFIG_NOT_SET: u32 = 0xffff_ffff;
/// `COMM_NAME_MAX_LENGTH`, including the NUL.
pub(crate) const COMM_NAME_MAX_LENGTH: usize = 128;
/// `UDI_MAX_LENGTH`, including the NUL.
pub(crate) const UDI_MAX_LENGTH: usize = 128;

/// `CommMem` (= `HcclMem`): `{CommMemType type; void *addr; uint64_t size;}`.
///
/// Documented: HIXL's `hcomm_res_defs.h` copy and hcomm's `hccl_mem_defs.h` (`HcclMem`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct CommMem {
    /// `COMM_MEM_TYPE_DEVICE` or `COMM_MEM_TYPE_HOST`.
    pub(crate) mem_type: c_int,
    /// Start address.
    pub(crate) addr: *mut c_void,
    /// Length in bytes.
    pub(crate) size: u64,
}

/// `HcclOneSideOpDesc`: `{void *localAddr; void *remoteAddr; u64 count; HcclDataType dataType;}`.
///
/// Documented: HIXL `comm_types.h` and hcomm `hccl_one_sided_services.h` (identical).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct HcclOneSideOpDesc {
    /// Local address.
    pub(crate) local_addr: *mut c_void,
    /// Remote address (in the remote rank's address space).
    pub(crate) remote_addr: *mut c_void,
    /// Element count (bytes with `HCCL_DATA_TYPE_UINT8`).
    pub(crate) count: u64,
    /// `HcclDataType`.
    pub(crate) data_type: c_int,
}

/// `HcclPrepareConfig`: `{HcclTopoType topoType; uint64_t rsvd0, rsvd1, rsvd2;}`.
///
/// Documented: HIXL `comm_types.h`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct HcclPrepareConfig {
    /// `HCCL_TOPO_FULLMESH`.
    pub(crate) topo_type: c_int,
    /// Reserved, zero.
    pub(crate) rsvd0: u64,
    /// Reserved, zero.
    pub(crate) rsvd1: u64,
    /// Reserved, zero.
    pub(crate) rsvd2: u64,
}

/// The text bytes of an [`HcclMemDesc`] (HIXL's `HCCL_MEM_DESC_LENGTH`, 504).
pub(crate) const HCCL_MEM_DESC_TEXT: usize = 504;

/// `HcclMemDesc`, as LLM-DataDist fills it: `{u32 localRank; u32 remoteRank; char desc[504];}`,
/// 512 bytes.
///
/// Documented twice, with different spellings of the same 512 bytes: HIXL's
/// `src/llm_datadist/comm_adapter/comm_types.h` declares this layout with
/// `HCCL_MEM_DESC_LENGTH = 504`; hcomm's public `hccl_one_sided_services.h` declares
/// `{char desc[HCCL_MEM_DESC_LENGTH + 1];}` with `HCCL_MEM_DESC_LENGTH = 511` (opaque to the
/// caller), and reads it internally as `HcclMemDescData {u32 localRankId; u32 remoteRankId;
/// char memDesc[511 + 1 - 8]}`, this layout. Same size, so arrays of them agree too.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct HcclMemDesc {
    /// The rank that posts the descriptor.
    pub(crate) local_rank: u32,
    /// The rank it is for.
    pub(crate) remote_rank: u32,
    /// NUL-terminated text (LLM-DataDist writes JSON).
    pub(crate) desc: [c_char; HCCL_MEM_DESC_TEXT],
}

/// `HcclMemDescs`: `{HcclMemDesc *array; u32 arrayLength;}`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct HcclMemDescs {
    /// The descriptors.
    pub(crate) array: *mut HcclMemDesc,
    /// How many (in: the array's capacity for the remote side).
    pub(crate) array_length: u32,
}

/// `HcclResult HcclExchangeMemDesc(HcclComm comm, u32 remoteRank, HcclMemDescs *local,
/// int timeout, HcclMemDescs *remote, u32 *actualNum)`.
pub(crate) type ExchangeMemDescFn = unsafe extern "C-unwind" fn(
    HcclComm,
    u32,
    *mut HcclMemDescs,
    c_int,
    *mut HcclMemDescs,
    *mut u32,
) -> HcclResult;

/// The 24 reserved leading bytes of `HcclCommConfig` as `HcclCommConfigInit` fills them
/// (`{size_t configSize; uint32_t magicWord; uint32_t version; uint64_t reserved;}`).
///
/// Documented: HIXL `comm_adapter.cc` `DlHcclCommConfigInit` (`struct HcclConfigInfo`) and
/// hcomm `CommConfigHandle.info`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct HcclCommConfigInfo {
    /// How many bytes of the struct HCCL may read.
    pub(crate) config_size: usize,
    /// `HCCL_COMM_CONFIG_MAGIC_WORD`.
    pub(crate) magic_word: u32,
    /// `HCCL_COMM_CONFIG_VERSION`.
    pub(crate) version: u32,
    /// Zero.
    pub(crate) reserved: u64,
}

/// `HcclCommConfig` at version 5 (`hccl_types.h`, `HCCL_COMM_CONFIG_VERSION = 5`):
/// `{char reserved[24]; uint32_t hcclBufferSize; uint32_t hcclDeterministic;
/// char hcclCommName[128]; char hcclUdi[128]; uint32_t hcclOpExpansionMode;
/// uint32_t hcclRdmaTrafficClass; uint32_t hcclRdmaServiceLevel;}` (300 bytes of fields, 304
/// with the trailing padding: `sizeof` is 304 in C).
///
/// Documented for these fields. Newer headers append fields (`hcclWorldRankID`, `hcclJobID`, ...);
/// HCCL copies `min(configSize, its sizeof)` bytes and reads fields by `version`, so a version-5
/// config with `configSize` = [`HCCL_COMM_CONFIG_V5_SIZE`] is what a HIXL built against the v5
/// header passes: HIXL's `DlHcclCommConfigInit` writes `configSize = sizeof(HcclCommConfig)`,
/// the full struct including its trailing padding (`tail` here), 304 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct HcclCommConfig {
    /// The reserved header.
    pub(crate) info: HcclCommConfigInfo,
    /// `hcclBufferSize` in MB (default 200).
    pub(crate) buffer_size: u32,
    /// `hcclDeterministic` (0).
    pub(crate) deterministic: u32,
    /// `hcclCommName`, NUL-terminated.
    pub(crate) comm_name: [c_char; COMM_NAME_MAX_LENGTH],
    /// `hcclUdi`, NUL-terminated.
    pub(crate) udi: [c_char; UDI_MAX_LENGTH],
    /// `hcclOpExpansionMode` (0 = default).
    pub(crate) op_expansion_mode: u32,
    /// `hcclRdmaTrafficClass`, or `HCCL_COMM_CONFIG_NOT_SET`.
    pub(crate) rdma_traffic_class: u32,
    /// `hcclRdmaServiceLevel`, or `HCCL_COMM_CONFIG_NOT_SET`.
    pub(crate) rdma_service_level: u32,
    /// The C struct's trailing padding (zero).
    pub(crate) tail: u32,
}

/// `sizeof(HcclCommConfig)` in C at version 5: the fields up to `hcclRdmaServiceLevel` (300
/// bytes) and the padding to 8-byte alignment.
pub(crate) const HCCL_COMM_CONFIG_V5_SIZE: usize = size_of::<HcclCommConfig>();

impl HcclCommConfig {
    /// The config exactly as HIXL's `DlHcclCommConfigInit` leaves it: magic, version 5,
    /// 200 MB buffer, no name, TC/SL unset.
    pub(crate) fn hixl_default() -> Self {
        Self {
            info: HcclCommConfigInfo {
                config_size: HCCL_COMM_CONFIG_V5_SIZE,
                magic_word: HCCL_COMM_CONFIG_MAGIC_WORD,
                version: HCCL_COMM_CONFIG_VERSION,
                reserved: 0,
            },
            buffer_size: HCCL_COMM_DEFAULT_BUFFSIZE,
            deterministic: 0,
            comm_name: [0; COMM_NAME_MAX_LENGTH],
            udi: [0; UDI_MAX_LENGTH],
            op_expansion_mode: 0,
            rdma_traffic_class: HCCL_COMM_CONFIG_NOT_SET,
            rdma_service_level: HCCL_COMM_CONFIG_NOT_SET,
            tail: 0,
        }
    }
}

// Layout checks against the C declarations (LP64).
const _: () = {
    assert!(size_of::<CommMem>() == 24);
    assert!(offset_of!(CommMem, addr) == 8);
    assert!(offset_of!(CommMem, size) == 16);
    assert!(size_of::<HcclOneSideOpDesc>() == 32);
    assert!(offset_of!(HcclOneSideOpDesc, remote_addr) == 8);
    assert!(offset_of!(HcclOneSideOpDesc, count) == 16);
    assert!(offset_of!(HcclOneSideOpDesc, data_type) == 24);
    assert!(size_of::<HcclPrepareConfig>() == 32);
    assert!(offset_of!(HcclPrepareConfig, rsvd0) == 8);
    assert!(size_of::<HcclCommConfigInfo>() == 24);
    assert!(offset_of!(HcclCommConfig, buffer_size) == 24);
    assert!(offset_of!(HcclCommConfig, deterministic) == 28);
    assert!(offset_of!(HcclCommConfig, comm_name) == 32);
    assert!(offset_of!(HcclCommConfig, udi) == 160);
    assert!(offset_of!(HcclCommConfig, op_expansion_mode) == 288);
    assert!(offset_of!(HcclCommConfig, rdma_traffic_class) == 292);
    assert!(offset_of!(HcclCommConfig, rdma_service_level) == 296);
    assert!(offset_of!(HcclCommConfig, tail) == 300);
    assert!(HCCL_COMM_CONFIG_V5_SIZE == 304);
    assert!(size_of::<HcclMemDesc>() == 512);
    assert!(offset_of!(HcclMemDesc, remote_rank) == 4);
    assert!(offset_of!(HcclMemDesc, desc) == 8);
    assert!(size_of::<HcclMemDescs>() == 16);
    assert!(offset_of!(HcclMemDescs, array_length) == 8);
    assert!(size_of::<usize>() == 8);
};

/// Default HCCL sonames, in order (`libhcomm.so` since CANN 8.5, `libhccl.so` before).
pub(crate) const HCCL_DEFAULTS: &[&str] = &["libhcomm.so", "libhccl.so"];
/// Environment variable naming the HCCL library to try before the defaults.
pub(crate) const HCCL_ENV: &str = "HIXL_HCCL_LIB";

dl_api! {
    /// The HCCL one-sided entry points, with the library that keeps them valid.
    pub(crate) struct HcclApi fields(pub(super)) {
        /// `HcclResult HcclRegisterGlobalMem(const CommMem *mem, void **memHandle)`.
        register_global_mem = "HcclRegisterGlobalMem":
            unsafe extern "C-unwind" fn(*const CommMem, *mut *mut c_void) -> HcclResult,
        /// `HcclResult HcclDeregisterGlobalMem(void *memHandle)`.
        deregister_global_mem = "HcclDeregisterGlobalMem":
            unsafe extern "C-unwind" fn(*mut c_void) -> HcclResult,
        /// `HcclResult HcclCommInitClusterInfoMemConfig(const char *rankTableJson,
        /// uint32_t rank, HcclCommConfig *cfg, HcclComm *comm)`.
        comm_init_cluster_info_mem_config = "HcclCommInitClusterInfoMemConfig":
            unsafe extern "C-unwind" fn(*const c_char, u32, *mut HcclCommConfig, *mut HcclComm)
                -> HcclResult,
        /// `HcclResult HcclCommBindMem(HcclComm comm, void *memHandle)`.
        comm_bind_mem = "HcclCommBindMem": unsafe extern "C-unwind" fn(HcclComm, *mut c_void) -> HcclResult,
        /// `HcclResult HcclCommUnbindMem(HcclComm comm, void *memHandle)`.
        comm_unbind_mem = "HcclCommUnbindMem":
            unsafe extern "C-unwind" fn(HcclComm, *mut c_void) -> HcclResult,
        /// `HcclResult HcclCommPrepare(HcclComm comm, const HcclPrepareConfig *cfg,
        /// const int timeout_s)`.
        comm_prepare = "HcclCommPrepare":
            unsafe extern "C-unwind" fn(HcclComm, *const HcclPrepareConfig, c_int) -> HcclResult,
        /// `HcclResult HcclBatchPut(HcclComm, u32 remoteRank, HcclOneSideOpDesc *desc,
        /// u32 descNum, rtStream_t stream)`.
        batch_put = "HcclBatchPut": unsafe extern "C-unwind" fn(
            HcclComm,
            u32,
            *mut HcclOneSideOpDesc,
            u32,
            AclrtStream,
        ) -> HcclResult,
        /// `HcclResult HcclBatchGet(...)`, as `HcclBatchPut`.
        batch_get = "HcclBatchGet": unsafe extern "C-unwind" fn(
            HcclComm,
            u32,
            *mut HcclOneSideOpDesc,
            u32,
            AclrtStream,
        ) -> HcclResult,
        /// `HcclResult HcclCommDestroy(HcclComm comm)`.
        comm_destroy = "HcclCommDestroy": unsafe extern "C-unwind" fn(HcclComm) -> HcclResult,
    }
    /// `HcclExchangeMemDesc` (LLM-DataDist's explicit-rank-table link), where the library has
    /// it: optional, so that an HCCL without it (CANN before hcomm's one-sided descriptor
    /// exchange) still serves the engine.
    optional exchange: ExchangeApi("LLM-DataDist's explicit-rank-table link needs it") {
        /// See [`ExchangeMemDescFn`].
        exchange_mem_desc = "HcclExchangeMemDesc": ExchangeMemDescFn,
    }
}

impl HcclApi {
    /// The process's HCCL table: `explicit` alone if given, else `$HIXL_HCCL_LIB` then
    /// `libhcomm.so`, `libhccl.so` (and the same in CANN's `lib64`); opened on first use, shared
    /// from then on.
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] naming the candidates, or the first missing symbol.
    pub(crate) fn load(explicit: Option<&Path>) -> Result<Arc<Self>, Error> {
        let env = std::env::var_os(HCCL_ENV);
        Self::shared(&candidates(explicit, env.as_deref(), HCCL_DEFAULTS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;

    #[test]
    fn candidate_order() {
        assert_eq!(
            candidates(None, Some(std::ffi::OsStr::new("")), HCCL_DEFAULTS),
            vec!["libhcomm.so", "libhccl.so"]
        );
        assert_eq!(
            candidates(None, None, HCCL_DEFAULTS),
            vec!["libhcomm.so", "libhccl.so"]
        );
    }

    #[test]
    fn a_missing_library_names_both_candidates() {
        let e = HcclApi::shared(&candidates(None, None, HCCL_DEFAULTS)).unwrap_err();
        match &e {
            Error::LibraryUnavailable { library, .. } => {
                assert!(library.contains("libhcomm.so"), "{library}");
                assert!(library.contains("libhccl.so"), "{library}");
            }
            other => panic!("wrong error {other:?}"),
        }
        assert_eq!(e.status(), Status::UNSUPPORTED);
    }

    #[test]
    fn a_library_without_the_symbols_names_the_first_missing_one() {
        let e = HcclApi::load(Some(Path::new("libc.so.6"))).unwrap_err();
        assert!(
            matches!(&e, Error::LibraryUnavailable { why, .. } if why.contains("HcclRegisterGlobalMem")),
            "{e:?}"
        );
    }

    #[test]
    fn the_double_provides_every_symbol() {
        let so = crate::device::double::test_instance("ffi-load");
        let acl = crate::device::acl::Acl::load(Some(&so)).expect("ACL symbols");
        let hccl = HcclApi::load(Some(&so)).expect("HCCL symbols");
        assert_eq!(acl.library(), hccl.library());
        let _ = std::fs::remove_file(so);
    }

    #[test]
    fn exchange_mem_desc_is_optional_and_typed_when_missing() {
        // libc has none of HCCL's symbols: the table does not load at all
        assert!(HcclApi::load(Some(Path::new("libc.so.6"))).is_err());
        let so = crate::device::double::test_instance("ffi-exchange");
        let mut hccl = HcclApi::open_from(&[so.to_string_lossy().into_owned()]).expect("HCCL");
        assert!(hccl.exchange().is_ok(), "the double has it");
        // an HCCL without it (as CANN before hcomm's descriptor exchange) still loads; the
        // call is a typed error, never a panic (the loader's own test, on libc, has a group
        // that is missing for real)
        hccl.exchange = Err((
            hccl.library().to_owned(),
            "missing symbol HcclExchangeMemDesc (LLM-DataDist's explicit-rank-table link needs \
             it)"
            .to_owned(),
        ));
        let e = hccl.exchange().map(|x| x.exchange_mem_desc).unwrap_err();
        assert!(
            matches!(&e, Error::LibraryUnavailable { why, .. } if why.contains("HcclExchangeMemDesc")),
            "{e:?}"
        );
        assert_eq!(e.status(), Status::UNSUPPORTED);
        let _ = std::fs::remove_file(so);
    }

    #[test]
    fn names_and_defaults() {
        assert_eq!(hccl_result_name(9), "HCCL_E_TIMEOUT");
        assert_eq!(hccl_result_name(24), "HCCL_E_OOM");
        assert_eq!(hccl_result_name(1041), "HCCL_E_IN_STATUS");
        assert_eq!(hccl_result_name(99), "HCCL_E_UNKNOWN");
        let c = HcclCommConfig::hixl_default();
        assert_eq!(c.info.magic_word, 0xf0f0_f0f0);
        assert_eq!(c.info.version, 5);
        assert_eq!(
            c.info.config_size, 304,
            "sizeof(HcclCommConfig) at version 5"
        );
        assert_eq!(c.buffer_size, 200);
        assert_eq!(c.rdma_traffic_class, u32::MAX);
        assert_eq!(c.rdma_service_level, u32::MAX);
    }
}
