//! Run-time loading of vendor libraries, through `libloading`, with typed errors.
//!
//! UCX, ACL and HCCL are never linked at build time: the crate builds and its host transports work
//! where they are not installed. A missing library or symbol is [`Error::LibraryUnavailable`]
//! naming it, never a panic.
//!
//! `libloading` is the maintained standard for this (cudarc and most of the ecosystem load vendor
//! libraries with it): it owns the `dlopen` handle and closes it on drop, reads `dlerror` where
//! that is thread-safe, and rejects a symbol type that is not pointer-sized. This module keeps
//! hixl's contract on top of it: candidates tried in order, `RTLD_NOW | RTLD_LOCAL` (a library
//! that lacks a symbol it needs fails when it loads, not at its first call), and errors that name
//! the library, or the symbol, and say why.

use libloading::os::unix::{Library as Handle, RTLD_LOCAL, RTLD_NOW};

use crate::error::Error;

/// An open shared library. Closed on drop (function pointers taken from it must not outlive it;
/// the loaders keep the `Library` in the same struct as the pointers).
#[derive(Debug)]
pub(crate) struct Library {
    handle: Handle,
    name: String,
    /// The `dlopen` handle as a number: the same for every open of one loaded object.
    raw: usize,
}

/// What `libloading` says went wrong, with its cause (`dlerror`'s text).
fn describe(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

impl Library {
    /// Opens the first of `candidates` that loads (each is passed to `dlopen` as given, so a
    /// bare soname searches the usual paths and a path loads that file).
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] naming every candidate, and why the last one did not load
    /// (`dlerror`'s text, which names it).
    pub(crate) fn open(candidates: &[&str]) -> Result<Self, Error> {
        let mut last = String::from("no candidates");
        for name in candidates {
            // SAFETY: loading runs the library's initialisers (and unloading, at drop, its
            // finalisers): the documented contract of choosing to load that vendor library.
            match unsafe { Handle::open(Some(*name), RTLD_NOW | RTLD_LOCAL) } {
                Ok(handle) => {
                    let raw = handle.into_raw();
                    // SAFETY: the handle `into_raw` just gave up, taken back at once (only its
                    // value is kept, to compare).
                    let handle = unsafe { Handle::from_raw(raw) };
                    return Ok(Self {
                        handle,
                        name: (*name).to_string(),
                        raw: raw as usize,
                    });
                }
                Err(e) => last = describe(&e),
            }
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

    /// Whether `other` is the same loaded object (`dlopen` counts references: two opens of one
    /// library, by one name or two, hand back one handle).
    pub(crate) fn same_object(&self, other: &Library) -> bool {
        self.raw == other.raw
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
        const { assert!(std::mem::size_of::<T>() == std::mem::size_of::<*mut ()>()) };
        // SAFETY: the caller guarantees that `T` is the symbol's function pointer type and that
        // the pointer is not called once the library is gone.
        let found = unsafe { self.handle.get::<T>(symbol) };
        match found {
            Ok(f) => Ok(*f),
            Err(e) => Err(Error::LibraryUnavailable {
                library: self.name.clone(),
                why: format!("missing symbol {symbol} ({})", describe(&e)),
            }),
        }
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
                // dlerror's text, about the last candidate
                assert!(
                    why.starts_with("dlopen failed: /nonexistent/libx.so"),
                    "{why}"
                );
                assert!(why.contains("No such file"), "{why}");
            }
            other => panic!("wrong error {other:?}"),
        }
        assert_eq!(e.status(), crate::Status::UNSUPPORTED);
        let e = Library::open(&[]).expect_err("nothing to load");
        assert!(matches!(&e, Error::LibraryUnavailable { why, .. } if why == "no candidates"));
        let e = Library::open(&["lib\0nul.so"]).expect_err("an interior NUL");
        assert!(matches!(&e, Error::LibraryUnavailable { .. }), "{e:?}");
    }

    #[test]
    fn a_missing_symbol_is_a_typed_error_and_a_present_one_works() {
        let lib = Library::open(&["libc.so.6"]).expect("libc loads");
        assert_eq!(lib.name(), "libc.so.6");
        let again = Library::open(&["libc.so.6"]).expect("libc loads");
        assert!(lib.same_object(&again), "one loaded object, one handle");
        let other = Library::open(&["libm.so.6"]).expect("libm loads");
        assert!(!lib.same_object(&other));
        // SAFETY: strlen's C signature is size_t strlen(const char *).
        let strlen: unsafe extern "C" fn(*const libc::c_char) -> usize =
            unsafe { lib.sym("strlen") }.expect("strlen exists");
        // SAFETY: a NUL-terminated literal.
        assert_eq!(unsafe { strlen(c"hixl".as_ptr()) }, 4);
        // SAFETY: never called.
        let e = unsafe { lib.sym::<unsafe extern "C" fn()>("hixl_no_such_symbol") }
            .expect_err("missing");
        assert!(
            matches!(&e, Error::LibraryUnavailable { library, why }
                if library == "libc.so.6" && why.contains("hixl_no_such_symbol")
                    && why.contains("dlsym failed")),
            "{e:?}"
        );
        // SAFETY: never called.
        let e = unsafe { lib.sym::<unsafe extern "C" fn()>("str\0len") }.expect_err("NUL");
        assert!(matches!(&e, Error::LibraryUnavailable { .. }), "{e:?}");
    }
}
