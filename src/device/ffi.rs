//! Hand-written ACL runtime FFI, loaded with `dlopen` at run time, and the loader both CANN
//! libraries share (the HCCL half is the Ascend transport's, `transport/ascend/ffi.rs`).
//!
//! Only the C ABI is used: no header is needed at build time and nothing is linked. Every symbol
//! is looked up when the library is loaded, so a missing one is [`Error::LibraryUnavailable`]
//! naming it, never a crash on first use.
//!
//! Sources of the declarations (public CANN repositories): `include/external/acl/acl_rt.h`,
//! `acl_base_rt.h`, `error_codes/rt_error_codes.h` of hicann/runtime. `aclError` is `int`;
//! streams and contexts are `void *`.

// Only what hixl calls is declared (plus what the unit tests use, marked `cfg(test)`).

use std::ffi::{OsStr, c_char, c_int, c_void};
use std::path::Path;

use crate::dl::Library;
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

/// `aclrtDevAttr::ACL_DEV_ATTR_SUPER_POD_DEVICE_ID` (`..._DEVIDE_ID`, the spelling HIXL uses):
/// the device's id inside its super pod (A3), the rank table 1.2 `super_device_id`.
pub(crate) const ACL_DEV_ATTR_SUPER_POD_DEVICE_ID: c_int = 403;
/// `ACL_DEV_ATTR_SUPER_POD_ID`: the super pod (supernode) the device belongs to (A3).
pub(crate) const ACL_DEV_ATTR_SUPER_POD_ID: c_int = 405;

/// The size of a huge page that `ACL_MEM_MALLOC_HUGE_ONLY` allocations are aligned to.
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
// Loaders
// ---------------------------------------------------------------------------------------------

/// Default ACL runtime sonames, in order (`libascendcl.so` is the deprecated compatibility name).
pub(crate) const ACL_DEFAULTS: &[&str] = &["libacl_rt.so", "libascendcl.so"];
/// Environment variable naming the ACL library to try before the defaults.
pub(crate) const ACL_ENV: &str = "HIXL_ACL_LIB";

/// Which files to `dlopen`, in order: an explicit path alone (the caller chose it; falling back
/// would hide a mistake), else the environment override (if set and non-empty), the default
/// sonames (found through the loader path), and the same names in CANN's `lib64`
/// ([`CANN_HOME_ENV`]).
pub(crate) fn candidates(
    explicit: Option<&Path>,
    env: Option<&OsStr>,
    defaults: &[&str],
) -> Vec<String> {
    if let Some(p) = explicit {
        return vec![p.to_string_lossy().into_owned()];
    }
    let mut v = Vec::with_capacity(3 * defaults.len() + 1);
    if let Some(e) = env.filter(|e| !e.is_empty()) {
        v.push(e.to_string_lossy().into_owned());
    }
    v.extend(defaults.iter().map(|s| (*s).to_owned()));
    // CANN's install, for a process started without `set_env.sh`'s library path
    for var in CANN_HOME_ENV {
        if let Some(home) = std::env::var_os(var).filter(|h| !h.is_empty()) {
            let lib64 = Path::new(&home).join("lib64");
            v.extend(
                defaults
                    .iter()
                    .map(|s| lib64.join(s).to_string_lossy().into_owned()),
            );
        }
    }
    v
}

/// The environment variables CANN's `set_env.sh` sets to its install directory, whose `lib64`
/// holds the ACL runtime and HCCL.
pub(crate) const CANN_HOME_ENV: &[&str] = &["ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"];

/// Opens the first of `cands` that loads.
///
/// # Errors
/// [`Error::LibraryUnavailable`] naming every candidate.
pub(crate) fn open(cands: &[String]) -> Result<Library, Error> {
    let refs: Vec<&str> = cands.iter().map(String::as_str).collect();
    Library::open(&refs)
}

/// Looks a symbol up as the field's declared function pointer type.
macro_rules! syms {
    ($lib:ident; $($field:ident = $name:literal),* $(,)?) => {
        $(
            // SAFETY: each field's type is the `unsafe extern "C" fn` spelled from the C
            // declaration of the symbol of the same name (see the struct), and the pointer is
            // stored next to the `Library` that keeps it valid.
            let $field = unsafe { $lib.sym($name) }?;
        )*
    };
}
pub(crate) use syms;

/// The ACL runtime entry points, with the library that keeps them valid.
#[derive(Debug)]
pub(crate) struct AclApi {
    /// `aclError aclInit(const char *configPath)`.
    pub(crate) init: unsafe extern "C" fn(*const c_char) -> AclError,
    /// `aclError aclFinalize(void)`.
    #[cfg(test)]
    pub(crate) finalize: unsafe extern "C" fn() -> AclError,
    /// `aclError aclrtSetDevice(int32_t)`.
    pub(crate) set_device: unsafe extern "C" fn(i32) -> AclError,
    /// `aclError aclrtResetDevice(int32_t)`.
    #[cfg(test)]
    pub(crate) reset_device: unsafe extern "C" fn(i32) -> AclError,
    /// `aclError aclrtGetDevice(int32_t *)`.
    pub(crate) get_device: unsafe extern "C" fn(*mut i32) -> AclError,
    /// `aclError aclrtGetCurrentContext(aclrtContext *)`.
    pub(crate) get_current_context: unsafe extern "C" fn(*mut AclrtContext) -> AclError,
    /// `aclError aclrtSetCurrentContext(aclrtContext)`.
    pub(crate) set_current_context: unsafe extern "C" fn(AclrtContext) -> AclError,
    /// `aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)`.
    pub(crate) malloc: unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> AclError,
    /// `aclError aclrtFree(void *devPtr)`.
    pub(crate) free: unsafe extern "C" fn(*mut c_void) -> AclError,
    /// `aclError aclrtMallocHost(void **hostPtr, size_t size)`.
    pub(crate) malloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> AclError,
    /// `aclError aclrtFreeHost(void *hostPtr)`.
    pub(crate) free_host: unsafe extern "C" fn(*mut c_void) -> AclError,
    /// `aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
    /// aclrtMemcpyKind kind)`.
    pub(crate) memcpy:
        unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, c_int) -> AclError,
    /// `aclError aclrtCreateStream(aclrtStream *)`.
    pub(crate) create_stream: unsafe extern "C" fn(*mut AclrtStream) -> AclError,
    /// `aclError aclrtDestroyStream(aclrtStream)`.
    pub(crate) destroy_stream: unsafe extern "C" fn(AclrtStream) -> AclError,
    /// `aclError aclrtSynchronizeStreamWithTimeout(aclrtStream, int32_t timeout_ms)`.
    pub(crate) synchronize_stream_with_timeout: unsafe extern "C" fn(AclrtStream, i32) -> AclError,
    /// `const char *aclGetRecentErrMsg(void)`.
    pub(crate) get_recent_err_msg: unsafe extern "C" fn() -> *const c_char,
    /// `aclError aclrtGetPhyDevIdByLogicDevId(const int32_t logicDevId, int32_t *const phyDevId)`.
    pub(crate) get_phy_dev_id_by_logic_dev_id: unsafe extern "C" fn(i32, *mut i32) -> AclError,
    /// `const char *aclrtGetSocName()`.
    pub(crate) get_soc_name: unsafe extern "C" fn() -> *const c_char,
    /// `aclError aclrtGetDeviceInfo(uint32_t deviceId, aclrtDevAttr attr, int64_t *value)`.
    pub(crate) get_device_info: unsafe extern "C" fn(u32, c_int, *mut i64) -> AclError,
    /// `aclError aclrtStreamAbort(aclrtStream stream)`: drops the stream's unexecuted tasks.
    pub(crate) stream_abort: unsafe extern "C" fn(AclrtStream) -> AclError,
    lib: Library,
}

impl AclApi {
    /// Loads ACL: `explicit` alone if given, else `$HIXL_ACL_LIB` then `libacl_rt.so`,
    /// `libascendcl.so`.
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] naming the candidates, or the first missing symbol.
    pub(crate) fn load(explicit: Option<&Path>) -> Result<Self, Error> {
        let env = std::env::var_os(ACL_ENV);
        Self::load_from(&candidates(explicit, env.as_deref(), ACL_DEFAULTS))
    }

    /// Loads ACL from the first of `cands` that opens.
    ///
    /// # Errors
    /// As [`AclApi::load`].
    pub(crate) fn load_from(cands: &[String]) -> Result<Self, Error> {
        let lib = open(cands)?;
        syms!(lib;
            init = "aclInit",
            set_device = "aclrtSetDevice",
            get_device = "aclrtGetDevice",
            get_current_context = "aclrtGetCurrentContext",
            set_current_context = "aclrtSetCurrentContext",
            malloc = "aclrtMalloc",
            free = "aclrtFree",
            malloc_host = "aclrtMallocHost",
            free_host = "aclrtFreeHost",
            memcpy = "aclrtMemcpy",
            create_stream = "aclrtCreateStream",
            destroy_stream = "aclrtDestroyStream",
            synchronize_stream_with_timeout = "aclrtSynchronizeStreamWithTimeout",
            get_recent_err_msg = "aclGetRecentErrMsg",
            get_phy_dev_id_by_logic_dev_id = "aclrtGetPhyDevIdByLogicDevId",
            get_soc_name = "aclrtGetSocName",
            get_device_info = "aclrtGetDeviceInfo",
            stream_abort = "aclrtStreamAbort",
        );
        // used by the unit tests only (hixl leaves ACL initialised, as HIXL does)
        #[cfg(test)]
        syms!(lib;
            finalize = "aclFinalize",
            reset_device = "aclrtResetDevice",
        );
        Ok(Self {
            init,
            #[cfg(test)]
            finalize,
            set_device,
            #[cfg(test)]
            reset_device,
            get_device,
            get_current_context,
            set_current_context,
            malloc,
            free,
            malloc_host,
            free_host,
            memcpy,
            create_stream,
            destroy_stream,
            synchronize_stream_with_timeout,
            get_recent_err_msg,
            get_phy_dev_id_by_logic_dev_id,
            get_soc_name,
            get_device_info,
            stream_abort,
            lib,
        })
    }

    /// The name the library was opened by.
    pub(crate) fn library(&self) -> &str {
        self.lib.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;

    #[test]
    fn candidate_order() {
        let p = Path::new("/opt/x/libacl_rt.so");
        assert_eq!(
            candidates(Some(p), Some(OsStr::new("/env/lib.so")), ACL_DEFAULTS),
            vec!["/opt/x/libacl_rt.so"]
        );
        assert_eq!(
            candidates(None, Some(OsStr::new("/env/lib.so")), ACL_DEFAULTS),
            vec!["/env/lib.so", "libacl_rt.so", "libascendcl.so"]
        );
        assert_eq!(
            candidates(None, Some(OsStr::new("")), ACL_DEFAULTS),
            vec!["libacl_rt.so", "libascendcl.so"]
        );
    }

    #[test]
    fn a_missing_library_names_both_candidates() {
        let e = AclApi::load_from(&candidates(None, None, ACL_DEFAULTS)).unwrap_err();
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

    #[test]
    fn the_double_provides_every_symbol() {
        let so = crate::device::double::test_instance("ffi-load-acl");
        let acl = AclApi::load(Some(&so)).expect("ACL symbols");
        assert!(acl.library().ends_with(".so"));
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
