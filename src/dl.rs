//! Run-time loading of vendor libraries (`dlopen`/`dlsym`), with typed errors.
//!
//! UCX, ACL and HCCL are never linked at build time: the crate builds and its host transports work
//! where they are not installed. A missing library or symbol is [`Error::LibraryUnavailable`],
//! never a panic.

use std::ffi::{CStr, CString, c_void};

use crate::error::Error;

/// An open shared library. Closed on drop (function pointers taken from it must not outlive it;
/// the loaders keep the `Library` in the same struct as the pointers).
#[derive(Debug)]
pub(crate) struct Library {
    handle: *mut c_void,
    name: String,
}

// SAFETY: a dlopen handle is a process-wide reference-counted object; dlsym and dlclose are
// thread-safe (POSIX requires them to be).
unsafe impl Send for Library {}
// SAFETY: as above; `&Library` only allows dlsym.
unsafe impl Sync for Library {}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated thread-local string valid until the next
    // dl* call on this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown dlopen error".to_string()
    } else {
        // SAFETY: non-null and NUL-terminated, as above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

impl Library {
    /// Opens the first of `candidates` that loads (each is passed to `dlopen` as given, so a
    /// bare soname searches the usual paths and a path loads that file).
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] naming every candidate and the last `dlerror`.
    pub(crate) fn open(candidates: &[&str]) -> Result<Self, Error> {
        let mut last = String::from("no candidates");
        for name in candidates {
            let Ok(c) = CString::new(*name) else {
                last = format!("{name:?}: contains NUL");
                continue;
            };
            // SAFETY: `c` is a valid C string. Loading runs the library's constructors, which is
            // the documented contract of choosing to load that vendor library.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if !h.is_null() {
                return Ok(Self {
                    handle: h,
                    name: (*name).to_string(),
                });
            }
            last = dlerror_text();
        }
        Err(Error::LibraryUnavailable {
            library: candidates.join(" or "),
            why: last,
        })
    }

    /// The name the library was opened by.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Looks up `symbol` and returns it as a `T` (a function pointer type).
    ///
    /// # Safety
    /// `T` must be a pointer-sized function pointer type whose signature matches the C symbol's
    /// declaration exactly, and the returned pointer must not be called after `self` is dropped.
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] if the symbol is missing.
    pub(crate) unsafe fn sym<T: Copy>(&self, symbol: &str) -> Result<T, Error> {
        const { assert!(std::mem::size_of::<T>() == std::mem::size_of::<*mut c_void>()) };
        let c = CString::new(symbol).map_err(|_| Error::LibraryUnavailable {
            library: self.name.clone(),
            why: format!("symbol {symbol:?} contains NUL"),
        })?;
        // SAFETY: the handle is open (we own it) and `c` is a valid C string.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        if p.is_null() {
            return Err(Error::LibraryUnavailable {
                library: self.name.clone(),
                why: format!("missing symbol {symbol}"),
            });
        }
        // SAFETY: sizes are equal (checked above); the caller guarantees T is the function
        // pointer type of this symbol.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: the handle came from dlopen and is closed once; the loaders drop the function
        // pointers together with the library.
        unsafe { libc::dlclose(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_typed_error() {
        let e = Library::open(&["libhixl-does-not-exist.so.0", "/nonexistent/libx.so"])
            .expect_err("cannot load");
        match &e {
            Error::LibraryUnavailable { library, why } => {
                assert!(library.contains("libhixl-does-not-exist.so.0"), "{library}");
                assert!(library.contains("/nonexistent/libx.so"), "{library}");
                assert!(!why.is_empty());
            }
            other => panic!("wrong error {other:?}"),
        }
        assert_eq!(e.status(), crate::Status::UNSUPPORTED);
    }

    #[test]
    fn a_missing_symbol_is_a_typed_error_and_a_present_one_works() {
        let lib = Library::open(&["libc.so.6"]).expect("libc loads");
        // SAFETY: strlen's C signature is size_t strlen(const char *).
        let strlen: unsafe extern "C" fn(*const libc::c_char) -> usize =
            unsafe { lib.sym("strlen") }.expect("strlen exists");
        // SAFETY: a NUL-terminated literal.
        assert_eq!(unsafe { strlen(c"hixl".as_ptr()) }, 4);
        // SAFETY: never called.
        let e = unsafe { lib.sym::<unsafe extern "C" fn()>("hixl_no_such_symbol") }
            .expect_err("missing");
        assert!(
            matches!(&e, Error::LibraryUnavailable { why, .. } if why.contains("hixl_no_such_symbol"))
        );
    }
}
