//! ACL's error channel: a failed call's message also goes where CANN programs look for it,
//! `aclGetRecentErrMsg()`, as upstream's engine reports every failure (its `HIXL_CHK_*` macros:
//! `REPORT_INNER_ERR_MSG("E19999", ...)` into CANN's error manager).
//!
//! The entry point is the error manager's C one, `ReportInnerErrMsgForC(file, func, line,
//! error_code, format, ...)` (hicann/runtime, src/dfx/error_manager/error_manager.h, in
//! `liberror_manager.so`, which ACL's runtime depends on). It is looked up only in libraries the
//! process has already loaded (never loading one): the global scope first (a program linked with
//! `-lacl_rt`), then CANN's libraries by name with `RTLD_NOLOAD`. The library that has it is
//! pinned (`dlopen` again, never closed), so the cached function stays valid. Without it (no
//! ACL in the process), nothing is reported there and `hixl_last_error_message()` alone has
//! the message, as before.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// `int32_t ReportInnerErrMsgForC(const char *file_name, const char *func, uint32_t line,
/// const char *error_code, const char *format, ...)`. CANN's C++ behind it may throw (out of
/// memory): `C-unwind`, so an exception is defined behaviour here, and the exported C function
/// it reaches aborts the process rather than unwind into C.
type Report = unsafe extern "C-unwind" fn(
    *const c_char,
    *const c_char,
    u32,
    *const c_char,
    *const c_char,
    ...
) -> i32;

const SYMBOL: &CStr = c"ReportInnerErrMsgForC";
/// CANN's libraries that have it, or depend on the one that has it.
const LIBRARIES: [&CStr; 4] = [
    c"liberror_manager.so",
    c"libacl_rt.so",
    c"libascendcl.so",
    c"libruntime.so",
];

/// The entry point, once found (only a found one is cached: ACL may load after a first
/// failure).
static FOUND: OnceLock<usize> = OnceLock::new();

/// The loader's count of libraries loaded so far (plus one) when a lookup last found nothing:
/// until another library loads, the next failure need not search again (a search is a dlsym
/// and four dlopen calls, about 100 us; a failing call in a loop paid it every time).
static MISSED_AT: AtomicU64 = AtomicU64::new(0);

/// How many libraries the dynamic loader has loaded in this process's life (glibc's
/// `dlpi_adds`), from the first object `dl_iterate_phdr` reports; `None` when unknown.
fn loads() -> Option<u64> {
    /// `dl_iterate_phdr`'s callback: copies the first object's `dlpi_adds` into `out`, then
    /// stops the walk.
    ///
    /// # Safety
    /// Called by `dl_iterate_phdr` only: `info` points to a live `dl_phdr_info` of `size`
    /// bytes, and `out` is the `u64` this function's caller passed.
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        size: usize,
        out: *mut c_void,
    ) -> c_int {
        let has_adds = size
            >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_adds)
                + std::mem::size_of::<libc::c_ulonglong>();
        if has_adds {
            // SAFETY: `info` points to a `size`-byte dl_phdr_info for the duration of the
            // callback (dl_iterate_phdr's contract), and `size` covers `dlpi_adds`; `out` is
            // the `u64` passed below.
            unsafe { *out.cast::<u64>() = (*info).dlpi_adds + 1 };
        }
        1 // stop after the first object
    }
    let mut adds: u64 = 0;
    // SAFETY: `first` matches the callback type and only writes through `out`, a live u64.
    unsafe { libc::dl_iterate_phdr(Some(first), (&raw mut adds).cast()) };
    (adds != 0).then_some(adds)
}

/// Looks the entry point up in what is loaded, pinning the library that has it.
fn lookup() -> Option<Report> {
    if let Some(&p) = FOUND.get() {
        // SAFETY: a pointer to `ReportInnerErrMsgForC` of a library pinned below (never
        // unloaded), whose C declaration is `Report`'s.
        return Some(unsafe { std::mem::transmute::<usize, Report>(p) });
    }
    let loaded = loads();
    if loaded.is_some_and(|n| n == MISSED_AT.load(Ordering::Relaxed)) {
        return None; // nothing loaded since the last search found nothing
    }
    // SAFETY: dlsym/dladdr/dlopen with NUL-terminated names; RTLD_NOLOAD never loads anything.
    let p = unsafe {
        let mut p = libc::dlsym(libc::RTLD_DEFAULT, SYMBOL.as_ptr());
        let mut pinned = false;
        if !p.is_null() {
            // pin the library it is in: dlopen by its path (already loaded: no loading)
            let mut info: libc::Dl_info = std::mem::zeroed();
            if libc::dladdr(p, &mut info) != 0 && !info.dli_fname.is_null() {
                pinned =
                    !libc::dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD).is_null();
            }
        }
        if !pinned {
            p = std::ptr::null_mut();
            for name in LIBRARIES {
                let h = libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
                if h.is_null() {
                    continue;
                }
                // searches the library and what it depends on (liberror_manager under ACL)
                let q = libc::dlsym(h, SYMBOL.as_ptr());
                if q.is_null() {
                    libc::dlclose(h);
                    continue;
                }
                p = q; // `h` is kept open: the library stays loaded
                break;
            }
        }
        p
    };
    if p.is_null() {
        if let Some(n) = loaded {
            MISSED_AT.store(n, Ordering::Relaxed);
        }
        return None;
    }
    let p = *FOUND.get_or_init(|| p as usize);
    // SAFETY: as above.
    Some(unsafe { std::mem::transmute::<usize, Report>(p) })
}

/// Reports `msg` as an inner error (`E19999`, as upstream's engine reports its failures) to
/// CANN's error manager, when the process has one loaded; otherwise does nothing.
pub(crate) fn report(msg: &CStr) {
    let Some(f) = lookup() else { return };
    // SAFETY: `f` is `ReportInnerErrMsgForC`; every string is NUL-terminated and lives across
    // the call; the format is "%s" with one string argument, so the message is never parsed
    // as a format.
    let _: c_int = unsafe {
        f(
            c"hixl".as_ptr(),
            c"hixl".as_ptr(),
            0,
            c"E19999".as_ptr(),
            c"%s".as_ptr(),
            msg.as_ptr(),
        )
    };
}
