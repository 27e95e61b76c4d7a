//! ACL's runtime: every entry point hixl calls, in one table ([`AclApi`]), with the types and
//! constants of its C declarations. The library is opened once per process
//! ([`AclApi::load`]); only the result floor (`device/acl/`) calls the table.
//!
//! Sources of the declarations (public CANN repositories): `include/external/acl/acl_rt.h`,
//! `acl_base_rt.h`, `error_codes/rt_error_codes.h` of hicann/runtime. `aclError` is `int`;
//! streams, contexts and physical memory handles are `void *`.

// Only what hixl calls is declared (plus what the unit tests use, marked `cfg(test)`).

use std::ffi::{OsStr, c_char, c_int, c_void};
use std::path::Path;
use std::sync::Arc;

use super::{candidates, dl_api};
use crate::error::Error;

/// `aclError` (`int`).
pub(crate) type AclError = c_int;
/// `aclrtStream` (`void *`).
pub(crate) type AclrtStream = *mut c_void;
/// `aclrtContext` (`void *`).
pub(crate) type AclrtContext = *mut c_void;

// ---------------------------------------------------------------------------------------------
// ACL constants
// ---------------------------------------------------------------------------------------------

/// `ACL_SUCCESS`.
pub(crate) const ACL_SUCCESS: AclError = 0;

/// `aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST`.
#[cfg(test)]
pub(crate) const ACL_MEM_MALLOC_HUGE_FIRST: u32 = 0;
/// `ACL_MEM_MALLOC_HUGE_ONLY`: huge pages only (2 MiB); required for HCCS registrations.
pub(crate) const ACL_MEM_MALLOC_HUGE_ONLY: u32 = 1;
/// `ACL_MEM_MALLOC_HUGE_ONLY_P2P`.
pub(crate) const ACL_MEM_MALLOC_HUGE_ONLY_P2P: u32 = 4;

/// `aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_HOST`.
pub(crate) const ACL_MEMCPY_HOST_TO_HOST: c_int = 0;
/// `ACL_MEMCPY_HOST_TO_DEVICE`.
pub(crate) const ACL_MEMCPY_HOST_TO_DEVICE: c_int = 1;
/// `ACL_MEMCPY_DEVICE_TO_HOST`.
pub(crate) const ACL_MEMCPY_DEVICE_TO_HOST: c_int = 2;
/// `ACL_MEMCPY_DEVICE_TO_DEVICE`.
pub(crate) const ACL_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

/// `aclrtDevAttr::ACL_DEV_ATTR_SUPER_POD_DEVICE_ID` (`..._DEVIDE_ID`, the spelling HIXL uses):
/// the device's id inside its super pod (A3), the rank table 1.2 `super_device_id`.
pub(crate) const ACL_DEV_ATTR_SUPER_POD_DEVICE_ID: c_int = 403;
/// `ACL_DEV_ATTR_SUPER_POD_ID`: the super pod (supernode) the device belongs to (A3).
pub(crate) const ACL_DEV_ATTR_SUPER_POD_ID: c_int = 405;

/// The size of a huge page that `ACL_MEM_MALLOC_HUGE_ONLY` allocations are aligned to, and the
/// granularity of virtual-memory reservations and mappings.
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// `aclError` codes HIXL's backend meets, with their header names.
pub(crate) const ACL_ERRORS: &[(AclError, &str)] = &[
    (0, "ACL_SUCCESS"),
    (100_000, "ACL_ERROR_INVALID_PARAM"),
    (100_001, "ACL_ERROR_UNINITIALIZE"),
    (100_002, "ACL_ERROR_REPEAT_INITIALIZE"),
    (100_037, "ACL_ERROR_REPEAT_FINALIZE"),
    (200_000, "ACL_ERROR_BAD_ALLOC"),
    (200_001, "ACL_ERROR_API_NOT_SUPPORT"),
    (200_002, "ACL_ERROR_INVALID_DEVICE"),
    (200_003, "ACL_ERROR_MEMORY_ADDRESS_UNALIGNED"),
    (200_006, "ACL_ERROR_FEATURE_UNSUPPORTED"),
    (300_000, "ACL_ERROR_STORAGE_OVER_LIMIT"),
    (500_000, "ACL_ERROR_INTERNAL_ERROR"),
    (500_001, "ACL_ERROR_FAILURE"),
    (500_003, "ACL_ERROR_RT_FAILURE"),
    (500_004, "ACL_ERROR_DRV_FAILURE"),
    (107_000, "ACL_ERROR_RT_PARAM_INVALID"),
    (107_001, "ACL_ERROR_RT_INVALID_DEVICEID"),
    (107_002, "ACL_ERROR_RT_CONTEXT_NULL"),
    (107_003, "ACL_ERROR_RT_STREAM_CONTEXT"),
    (107_019, "ACL_ERROR_RT_WAIT_TIMEOUT"),
    (107_020, "ACL_ERROR_RT_TASK_TIMEOUT"),
    (207_000, "ACL_ERROR_RT_FEATURE_NOT_SUPPORT"),
    (207_001, "ACL_ERROR_RT_MEMORY_ALLOCATION"),
    (207_018, "ACL_ERROR_RT_DEVICE_OOM"),
    (207_020, "ACL_ERROR_RT_TIMEOUT"),
    (507_007, "ACL_ERROR_RT_CONTEXT_RELEASE_ERROR"),
    (507_022, "ACL_ERROR_RT_IPC_ERROR"),
    (507_046, "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT"),
    (507_899, "ACL_ERROR_RT_DRV_INTERNAL_ERROR"),
    (507_910, "ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED"),
    (507_911, "ACL_ERROR_HOST_MEMORY_NOT_REGISTERED"),
];

/// `ACL_ERROR_REPEAT_INITIALIZE`: a second `aclInit`, harmless.
pub(crate) const ACL_ERROR_REPEAT_INITIALIZE: AclError = 100_002;
/// `ACL_ERROR_MEMORY_ADDRESS_UNALIGNED`.
pub(crate) const ACL_ERROR_MEMORY_ADDRESS_UNALIGNED: AclError = 200_003;
/// `ACL_ERROR_RT_CONTEXT_NULL`: no current context on the calling thread.
pub(crate) const ACL_ERROR_RT_CONTEXT_NULL: AclError = 107_002;
/// `ACL_ERROR_RT_STREAM_SYNC_TIMEOUT`: `aclrtSynchronizeStreamWithTimeout` ran out of time.
pub(crate) const ACL_ERROR_RT_STREAM_SYNC_TIMEOUT: AclError = 507_046;
/// The ACL codes that mean "timed out" (HIXL maps the stream-sync one to `TIMEOUT`; the others
/// are the runtime's wait/task/generic timeouts).
pub(crate) const ACL_TIMEOUT_CODES: &[AclError] =
    &[ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, 107_019, 107_020, 207_020];

/// The header name of an `aclError`, or `"ACL_ERROR_UNKNOWN"`.
pub(crate) fn acl_error_name(code: AclError) -> &'static str {
    ACL_ERRORS
        .iter()
        .find(|(c, _)| *c == code)
        .map_or("ACL_ERROR_UNKNOWN", |(_, n)| n)
}

// ---------------------------------------------------------------------------------------------
// Virtual memory (VMM) types and constants
// ---------------------------------------------------------------------------------------------

/// `aclrtMemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MemLocation {
    /// The device id (or 0 for the host).
    pub(crate) id: u32,
    /// [`LOCATION_HOST`] or [`LOCATION_DEVICE`].
    pub(crate) kind: c_int,
}

/// `aclrtPhysicalMemProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PhysicalMemProp {
    pub(crate) handle_type: c_int,
    pub(crate) allocation_type: c_int,
    pub(crate) mem_attr: c_int,
    pub(crate) location: MemLocation,
    pub(crate) reserve: u64,
}

/// `aclrtMemAccessDesc`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct MemAccessDesc {
    pub(crate) flags: c_int,
    pub(crate) location: MemLocation,
    pub(crate) rsv: [u8; 12],
}

/// `aclrtPtrAttributes`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PtrAttributes {
    /// Where the memory is.
    pub(crate) location: MemLocation,
    pub(crate) page_size: u32,
    pub(crate) rsv: [u32; 4],
}

/// `ACL_MEM_LOCATION_TYPE_HOST`.
pub(crate) const LOCATION_HOST: c_int = 0;
/// `ACL_MEM_LOCATION_TYPE_DEVICE`.
pub(crate) const LOCATION_DEVICE: c_int = 1;
/// `aclrtMemAttr::ACL_HBM_MEM_HUGE`.
pub(crate) const ACL_HBM_MEM_HUGE: c_int = 4;
/// `aclrtMemAttr::ACL_MEM_P2P_HUGE`.
pub(crate) const ACL_MEM_P2P_HUGE: c_int = 16;
/// `ACL_RT_MEM_ACCESS_FLAGS_READWRITE`.
pub(crate) const ACCESS_READWRITE: c_int = 3;
/// `ACL_MEM_SHARE_HANDLE_TYPE_FABRIC`.
pub(crate) const SHARE_FABRIC: c_int = 2;
/// `ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION`.
pub(crate) const EXPORT_DISABLE_PID_VALIDATION: u64 = 1;

// Layout checks against the C declarations (LP64).
const _: () = {
    assert!(size_of::<MemLocation>() == 8);
    assert!(size_of::<PhysicalMemProp>() == 32);
    assert!(size_of::<MemAccessDesc>() == 24);
    assert!(size_of::<PtrAttributes>() == 28);
};

// ---------------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------------

/// Default ACL runtime sonames, in order (`libascendcl.so` is the deprecated compatibility name).
pub(crate) const ACL_DEFAULTS: &[&str] = &["libacl_rt.so", "libascendcl.so"];
/// Environment variable naming the ACL library to try before the defaults.
pub(crate) const ACL_ENV: &str = "HIXL_ACL_LIB";

dl_api! {
    /// The ACL runtime's entry points, with the library that keeps them valid.
    pub(crate) struct AclApi fields(pub(in crate::device)) {
        /// `aclError aclInit(const char *configPath)`.
        init = "aclInit": unsafe extern "C-unwind" fn(*const c_char) -> AclError,
        /// `aclError aclFinalize(void)`.
        #[cfg(test)]
        finalize = "aclFinalize": unsafe extern "C-unwind" fn() -> AclError,
        /// `aclError aclrtSetDevice(int32_t)`.
        set_device = "aclrtSetDevice": unsafe extern "C-unwind" fn(i32) -> AclError,
        /// `aclError aclrtResetDevice(int32_t)`.
        #[cfg(test)]
        reset_device = "aclrtResetDevice": unsafe extern "C-unwind" fn(i32) -> AclError,
        /// `aclError aclrtGetDevice(int32_t *)`.
        get_device = "aclrtGetDevice": unsafe extern "C-unwind" fn(*mut i32) -> AclError,
        /// `aclError aclrtGetCurrentContext(aclrtContext *)`.
        get_current_context = "aclrtGetCurrentContext":
            unsafe extern "C-unwind" fn(*mut AclrtContext) -> AclError,
        /// `aclError aclrtSetCurrentContext(aclrtContext)`.
        set_current_context = "aclrtSetCurrentContext":
            unsafe extern "C-unwind" fn(AclrtContext) -> AclError,
        /// `aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)`.
        malloc = "aclrtMalloc": unsafe extern "C-unwind" fn(*mut *mut c_void, usize, u32) -> AclError,
        /// `aclError aclrtFree(void *devPtr)`.
        free = "aclrtFree": unsafe extern "C-unwind" fn(*mut c_void) -> AclError,
        /// `aclError aclrtMallocHost(void **hostPtr, size_t size)`.
        malloc_host = "aclrtMallocHost": unsafe extern "C-unwind" fn(*mut *mut c_void, usize) -> AclError,
        /// `aclError aclrtFreeHost(void *hostPtr)`.
        free_host = "aclrtFreeHost": unsafe extern "C-unwind" fn(*mut c_void) -> AclError,
        /// `aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
        /// aclrtMemcpyKind kind)`.
        memcpy = "aclrtMemcpy":
            unsafe extern "C-unwind" fn(*mut c_void, usize, *const c_void, usize, c_int) -> AclError,
        /// `aclError aclrtCreateStream(aclrtStream *)`.
        create_stream = "aclrtCreateStream": unsafe extern "C-unwind" fn(*mut AclrtStream) -> AclError,
        /// `aclError aclrtDestroyStream(aclrtStream)`.
        destroy_stream = "aclrtDestroyStream": unsafe extern "C-unwind" fn(AclrtStream) -> AclError,
        /// `aclError aclrtSynchronizeStreamWithTimeout(aclrtStream, int32_t timeout_ms)`.
        synchronize_stream_with_timeout = "aclrtSynchronizeStreamWithTimeout":
            unsafe extern "C-unwind" fn(AclrtStream, i32) -> AclError,
        /// `const char *aclGetRecentErrMsg(void)`.
        get_recent_err_msg = "aclGetRecentErrMsg": unsafe extern "C-unwind" fn() -> *const c_char,
        /// `aclError aclrtGetPhyDevIdByLogicDevId(const int32_t logicDevId,
        /// int32_t *const phyDevId)`.
        get_phy_dev_id_by_logic_dev_id = "aclrtGetPhyDevIdByLogicDevId":
            unsafe extern "C-unwind" fn(i32, *mut i32) -> AclError,
        /// `const char *aclrtGetSocName()`.
        get_soc_name = "aclrtGetSocName": unsafe extern "C-unwind" fn() -> *const c_char,
        /// `aclError aclrtGetDeviceInfo(uint32_t deviceId, aclrtDevAttr attr, int64_t *value)`.
        get_device_info = "aclrtGetDeviceInfo":
            unsafe extern "C-unwind" fn(u32, c_int, *mut i64) -> AclError,
        /// `aclError aclrtStreamAbort(aclrtStream stream)`: drops the stream's unexecuted tasks.
        stream_abort = "aclrtStreamAbort": unsafe extern "C-unwind" fn(AclrtStream) -> AclError,
    }
    /// ACL's virtual memory (VMM), async copies and logical device ids: what fabric memory
    /// needs. A runtime without them still loads (the HCCL path needs none of them).
    optional vmm: VmmApi("fabric memory needs ACL's virtual-memory calls") {
        /// `aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void
        /// *expectPtr, uint64_t flags)`.
        reserve = "aclrtReserveMemAddress":
            unsafe extern "C-unwind" fn(*mut *mut c_void, usize, usize, *mut c_void, u64) -> AclError,
        /// `aclError aclrtReleaseMemAddress(void *virPtr)`.
        release = "aclrtReleaseMemAddress": unsafe extern "C-unwind" fn(*mut c_void) -> AclError,
        /// `aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const
        /// aclrtPhysicalMemProp *prop, uint64_t flags)`.
        malloc_physical = "aclrtMallocPhysical":
            unsafe extern "C-unwind" fn(*mut *mut c_void, usize, *const PhysicalMemProp, u64) -> AclError,
        /// `aclError aclrtFreePhysical(aclrtDrvMemHandle handle)`.
        free_physical = "aclrtFreePhysical": unsafe extern "C-unwind" fn(*mut c_void) -> AclError,
        /// `aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle
        /// handle, uint64_t flags)`.
        map = "aclrtMapMem":
            unsafe extern "C-unwind" fn(*mut c_void, usize, usize, *mut c_void, u64) -> AclError,
        /// `aclError aclrtUnmapMem(void *virPtr)`.
        unmap = "aclrtUnmapMem": unsafe extern "C-unwind" fn(*mut c_void) -> AclError,
        /// `aclError aclrtMemExportToShareableHandleV2(aclrtDrvMemHandle handle, uint64_t
        /// flags, aclrtMemSharedHandleType shareType, void *shareableHandle)`.
        export = "aclrtMemExportToShareableHandleV2":
            unsafe extern "C-unwind" fn(*mut c_void, u64, c_int, *mut c_void) -> AclError,
        /// `aclError aclrtMemImportFromShareableHandleV2(void *shareableHandle,
        /// aclrtMemSharedHandleType shareType, uint64_t flags, aclrtDrvMemHandle *handle)`.
        import = "aclrtMemImportFromShareableHandleV2":
            unsafe extern "C-unwind" fn(*mut c_void, c_int, u64, *mut *mut c_void) -> AclError,
        /// `aclError aclrtMemRetainAllocationHandle(void *virPtr, aclrtDrvMemHandle *handle)`.
        retain = "aclrtMemRetainAllocationHandle":
            unsafe extern "C-unwind" fn(*mut c_void, *mut *mut c_void) -> AclError,
        /// `aclError aclrtMemGetAddressRange(void *ptr, void **pbase, size_t *psize)`.
        address_range = "aclrtMemGetAddressRange":
            unsafe extern "C-unwind" fn(*mut c_void, *mut *mut c_void, *mut usize) -> AclError,
        /// `aclError aclrtPointerGetAttributes(const void *ptr, aclrtPtrAttributes *attributes)`.
        pointer_attributes = "aclrtPointerGetAttributes":
            unsafe extern "C-unwind" fn(*const c_void, *mut PtrAttributes) -> AclError,
        /// `aclError aclrtMemSetAccess(void *virPtr, size_t size, aclrtMemAccessDesc *desc,
        /// size_t count)`.
        set_access = "aclrtMemSetAccess":
            unsafe extern "C-unwind" fn(*mut c_void, usize, *mut MemAccessDesc, usize) -> AclError,
        /// `aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
        /// aclrtMemcpyKind kind, aclrtStream stream)`.
        memcpy_async = "aclrtMemcpyAsync": unsafe extern "C-unwind" fn(
            *mut c_void,
            usize,
            *const c_void,
            usize,
            c_int,
            AclrtStream,
        ) -> AclError,
        /// `aclError aclrtGetLogicDevIdByUserDevId(const int32_t userDevid, int32_t *const
        /// logicDevId)`.
        logic_dev_id = "aclrtGetLogicDevIdByUserDevId":
            unsafe extern "C-unwind" fn(i32, *mut i32) -> AclError,
    }
}

impl AclApi {
    /// The process's ACL table: `explicit` alone if given, else `$HIXL_ACL_LIB` then
    /// `libacl_rt.so`, `libascendcl.so` (and the same in CANN's `lib64`); opened on first use,
    /// shared from then on.
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] naming the candidates, or the first missing symbol.
    pub(crate) fn load(explicit: Option<&Path>) -> Result<Arc<Self>, Error> {
        let env = std::env::var_os(ACL_ENV);
        Self::shared(&acl_candidates(explicit, env.as_deref()))
    }
}

/// The files [`AclApi::load`] tries, in order.
fn acl_candidates(explicit: Option<&Path>, env: Option<&OsStr>) -> Vec<String> {
    candidates(explicit, env, ACL_DEFAULTS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;

    #[test]
    fn candidate_order() {
        let p = Path::new("/opt/x/libacl_rt.so");
        assert_eq!(
            acl_candidates(Some(p), Some(OsStr::new("/env/lib.so"))),
            vec!["/opt/x/libacl_rt.so"]
        );
        assert_eq!(
            acl_candidates(None, Some(OsStr::new("/env/lib.so"))),
            vec!["/env/lib.so", "libacl_rt.so", "libascendcl.so"]
        );
        assert_eq!(
            acl_candidates(None, Some(OsStr::new(""))),
            vec!["libacl_rt.so", "libascendcl.so"]
        );
    }

    #[test]
    fn a_missing_library_names_both_candidates() {
        let e = AclApi::shared(&acl_candidates(None, None)).unwrap_err();
        match &e {
            Error::LibraryUnavailable { library, .. } => {
                assert!(library.contains("libacl_rt.so"), "{library}");
                assert!(library.contains("libascendcl.so"), "{library}");
            }
            other => panic!("wrong error {other:?}"),
        }
        assert_eq!(e.status(), Status::UNSUPPORTED);
        let e = AclApi::load(Some(Path::new("/nonexistent/libacl_rt.so"))).unwrap_err();
        assert!(
            matches!(&e, Error::LibraryUnavailable { library, .. } if library == "/nonexistent/libacl_rt.so")
        );
    }

    #[test]
    fn a_library_without_the_symbols_names_the_first_missing_one() {
        let e = AclApi::load(Some(Path::new("libc.so.6"))).unwrap_err();
        assert!(
            matches!(&e, Error::LibraryUnavailable { why, .. } if why.contains("aclInit")),
            "{e:?}"
        );
    }

    /// Every entry point, the VMM group's too; a runtime without the VMM group still loads,
    /// and using it is `UNSUPPORTED` naming the first missing symbol.
    #[test]
    fn the_double_provides_every_symbol_and_vmm_is_optional() {
        let so = crate::device::double::test_instance("ffi-load-acl");
        let acl = AclApi::load(Some(&so)).expect("ACL symbols");
        assert!(acl.library().ends_with(".so"));
        acl.vmm().expect("the double has the VMM calls");
        let mut own = AclApi::open_from(&[so.to_string_lossy().into_owned()]).unwrap();
        own.vmm = Err((
            own.library().to_owned(),
            "missing symbol aclrtReserveMemAddress (fabric memory needs ACL's virtual-memory \
             calls)"
                .to_owned(),
        ));
        let e = own.vmm().unwrap_err();
        assert_eq!(e.status(), Status::UNSUPPORTED);
        assert!(e.to_string().contains("aclrtReserveMemAddress"), "{e}");
        let _ = std::fs::remove_file(so);
    }

    #[test]
    fn names() {
        assert_eq!(acl_error_name(507_046), "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT");
        assert_eq!(acl_error_name(207_001), "ACL_ERROR_RT_MEMORY_ALLOCATION");
        assert_eq!(
            acl_error_name(507_007),
            "ACL_ERROR_RT_CONTEXT_RELEASE_ERROR"
        );
        assert_eq!(acl_error_name(-5), "ACL_ERROR_UNKNOWN");
        assert_eq!(
            acl_error_name(507_910),
            "ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED"
        );
        assert_eq!(
            acl_error_name(507_911),
            "ACL_ERROR_HOST_MEMORY_NOT_REGISTERED"
        );
    }
}
