//! The device floor's lowest level (cudarc's `sys`): CANN's C entry points, loaded with `dlopen`
//! at run time through one loader.
//!
//! - [`dl_api!`](crate::device::sys::dl_api): the loader macro. A table is a struct of
//!   `unsafe extern "C-unwind" fn` fields (CANN's entry points are C++ inside: an exception
//!   that escapes one unwinds the Rust frames above it, which is defined, and aborts where it
//!   meets an `extern "C"` frame or `catch_unwind`; through an `extern "C"` pointer it would be
//!   undefined behaviour), each looked up by its C name when the library opens (a
//!   missing one is [`Error::LibraryUnavailable`] naming it), optional groups of entry points a
//!   library may lack (using a missing group is that error then), and the [`Library`] that
//!   keeps the pointers valid. A table is opened once per process for its library: later
//!   loads share it, and the library stays loaded (as cudarc's `culib()`; ACL keeps per-thread
//!   state, the current device and context, that an unload would lose).
//! - `acl.rs`: ACL's runtime, every entry point hixl calls in one table. It is private to the
//!   device floor: only `device/acl/` (the result floor, every call a `Result`) calls it. HCCL's
//!   table is the Ascend transport's (`transport/ascend/hccl/sys.rs`), on the same macro.
//!
//! Only the C ABI is used: no header is needed at build time and nothing is linked.

pub(in crate::device) mod acl;

pub(crate) use self::acl::AclrtStream;

use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::dl::Library;
use crate::error::Error;
use crate::sync::lock;

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

/// The tables of one kind ([`dl_api!`](crate::device::sys::dl_api)'s `shared`) this process has
/// opened, never closed, and how many times the loader called `dlopen` for each name (the
/// proof, in the tests, that a library is opened once).
pub(crate) struct Loaded<T> {
    tables: Mutex<Vec<Arc<T>>>,
    opens: Mutex<Vec<(String, usize)>>,
}

impl<T> Loaded<T> {
    /// No table yet.
    pub(crate) const fn new() -> Self {
        Self {
            tables: Mutex::new(Vec::new()),
            opens: Mutex::new(Vec::new()),
        }
    }

    /// The table of the first of `cands` that loads, as [`Library::open`] chooses it: a
    /// candidate whose library this process has opened already is its table (nothing is
    /// opened again); otherwise the candidate is opened and its table built with `build` (once:
    /// the lock is held meanwhile) and kept. A library opened under another name than its
    /// table's (a path and a soname of one file) is that table too.
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] naming every candidate and why the last did not load, or
    /// `build`'s error (a missing symbol).
    pub(crate) fn get(
        &self,
        cands: &[String],
        lib: fn(&T) -> &Library,
        build: fn(Library) -> Result<T, Error>,
    ) -> Result<Arc<T>, Error> {
        let mut tables = lock(&self.tables);
        let mut last = String::from("no candidates");
        for c in cands {
            if let Some(t) = tables.iter().find(|t| lib(t).name() == c) {
                return Ok(t.clone());
            }
            match Library::open(&[c.as_str()]) {
                Ok(opened) => {
                    self.count(c);
                    if let Some(t) = tables.iter().find(|t| lib(t).same_object(&opened)) {
                        return Ok(t.clone());
                    }
                    let t = Arc::new(build(opened)?);
                    tables.push(t.clone());
                    return Ok(t);
                }
                Err(Error::LibraryUnavailable { why, .. }) => last = why,
                Err(e) => return Err(e),
            }
        }
        Err(Error::LibraryUnavailable {
            library: cands.join(" or "),
            why: last,
        })
    }

    fn count(&self, name: &str) {
        let mut opens = lock(&self.opens);
        match opens.iter_mut().find(|(n, _)| n == name) {
            Some((_, k)) => *k += 1,
            None => opens.push((name.to_owned(), 1)),
        }
    }

    /// How many times the loader opened the library `name` for this kind of table.
    #[cfg(test)]
    pub(crate) fn opened(&self, name: &str) -> usize {
        lock(&self.opens)
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, k)| *k)
    }
}

/// Declares a table of a run-time loaded C library and its loader (the one loader of the
/// crate's CANN libraries):
///
/// ```text
/// dl_api! {
///     /// docs
///     pub(crate) struct Api fields(pub(super)) {
///         /// `int f(void)`.
///         f = "f": unsafe extern "C" fn() -> c_int,
///         #[cfg(test)]
///         g = "g": unsafe extern "C" fn() -> c_int,
///     }
///     /// docs
///     optional group: GroupApi("what needs it") {
///         h = "h": unsafe extern "C" fn() -> c_int,
///     }
/// }
/// ```
///
/// makes `Api` (the fields, with the given visibility; each group a field of its own, reached
/// through `Api::group()`), `GroupApi`, and on `Api`: `shared(candidates)` (the process's table
/// of the first candidate that loads, opened once: [`Loaded::get`]), `library()` (the name it
/// was opened by), and for the tests `open_from(candidates)` (a table of its own) and
/// `opened(name)` (how many times `shared` opened that library). Each field's type is the
/// `unsafe extern "C-unwind" fn` (`"C"` for a C library) spelled from the C declaration of the
/// symbol named beside it.
macro_rules! dl_api {
    (
        $(#[doc = $doc:literal])*
        $vis:vis struct $name:ident fields($fvis:vis) {
            $(
                $(#[doc = $fdoc:literal])*
                $(#[cfg($fcfg:meta)])?
                $field:ident = $sym:literal: $ty:ty,
            )*
        }
        $(
            $(#[doc = $gdoc:literal])*
            optional $group:ident: $gname:ident($purpose:literal) {
                $(
                    $(#[doc = $gfdoc:literal])*
                    $gfield:ident = $gsym:literal: $gty:ty,
                )*
            }
        )*
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug)]
        $vis struct $name {
            $(
                $(#[doc = $fdoc])*
                $(#[cfg($fcfg)])?
                $fvis $field: $ty,
            )*
            $(
                $(#[doc = $gdoc])*
                $group: Result<$gname, (String, String)>,
            )*
            lib: $crate::dl::Library,
        }

        $(
            $(#[doc = $gdoc])*
            #[derive(Debug)]
            $vis struct $gname {
                $(
                    $(#[doc = $gfdoc])*
                    $fvis $gfield: $gty,
                )*
            }
        )*

        impl $name {
            /// Looks every entry point up in `lib`.
            fn from_library(lib: $crate::dl::Library) -> Result<Self, $crate::error::Error> {
                $(
                    $(#[cfg($fcfg)])?
                    // SAFETY: the type is the `unsafe extern` fn spelled from the C
                    // declaration of the symbol (see the field), and the pointer is stored next
                    // to the `Library` that keeps it valid.
                    let $field = unsafe { lib.sym::<$ty>($sym) }?;
                )*
                $(
                    let $group = (|| -> Result<$gname, (String, String)> {
                        Ok($gname {
                            $(
                                // SAFETY: as above.
                                $gfield: unsafe { lib.sym::<$gty>($gsym) }.map_err(|_| {
                                    (
                                        lib.name().to_owned(),
                                        format!("missing symbol {} ({})", $gsym, $purpose),
                                    )
                                })?,
                            )*
                        })
                    })();
                )*
                Ok(Self {
                    $(
                        $(#[cfg($fcfg)])?
                        $field,
                    )*
                    $($group,)*
                    lib,
                })
            }

            fn loaded() -> &'static $crate::device::sys::Loaded<Self> {
                static LOADED: $crate::device::sys::Loaded<$name> =
                    $crate::device::sys::Loaded::new();
                &LOADED
            }

            /// The process's table of the first of `cands` that loads, opened on first use and
            /// shared from then on.
            ///
            /// # Errors
            /// [`Error::LibraryUnavailable`](crate::error::Error::LibraryUnavailable) naming the
            /// candidates, or the first missing symbol.
            $vis fn shared(
                cands: &[String],
            ) -> Result<std::sync::Arc<Self>, $crate::error::Error> {
                Self::loaded().get(cands, |t| &t.lib, Self::from_library)
            }

            /// A table of its own from the first of `cands` that opens (a test may change it).
            #[cfg(test)]
            $vis fn open_from(cands: &[String]) -> Result<Self, $crate::error::Error> {
                let refs: Vec<&str> = cands.iter().map(String::as_str).collect();
                Self::from_library($crate::dl::Library::open(&refs)?)
            }

            /// How many times [`shared`](Self::shared) opened the library `name`.
            #[cfg(test)]
            $vis fn opened(name: &str) -> usize {
                Self::loaded().opened(name)
            }

            /// The name the library was opened by.
            $vis fn library(&self) -> &str {
                self.lib.name()
            }

            $(
                $(#[doc = $gdoc])*
                ///
                /// # Errors
                /// [`Error::LibraryUnavailable`](crate::error::Error::LibraryUnavailable)
                /// (`UNSUPPORTED`) naming the first of them the library lacks.
                $vis fn $group(&self) -> Result<&$gname, $crate::error::Error> {
                    self.$group.as_ref().map_err(|(library, why)| {
                        $crate::error::Error::LibraryUnavailable {
                            library: library.clone(),
                            why: why.clone(),
                        }
                    })
                }
            )*
        }
    };
}
pub(crate) use dl_api;

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::c_char;

    dl_api! {
        /// libc, as a table.
        struct Libc fields(pub(self)) {
            /// `size_t strlen(const char *)`.
            strlen = "strlen": unsafe extern "C" fn(*const c_char) -> usize,
        }
        /// Present.
        optional string: StringApi("the test") {
            /// `size_t strnlen(const char *, size_t)`.
            strnlen = "strnlen": unsafe extern "C" fn(*const c_char, usize) -> usize,
        }
        /// Not in libc.
        optional missing: MissingApi("a test of a missing group") {
            /// Nowhere.
            nothing = "hixl_no_such_symbol": unsafe extern "C" fn(),
        }
    }

    #[test]
    fn candidate_order() {
        let p = Path::new("/opt/x/libacl_rt.so");
        let d = &["liba.so", "libb.so"];
        assert_eq!(
            candidates(Some(p), Some(OsStr::new("/env/lib.so")), d),
            vec!["/opt/x/libacl_rt.so"]
        );
        let got = candidates(None, Some(OsStr::new("/env/lib.so")), d);
        assert_eq!(got[..3], ["/env/lib.so", "liba.so", "libb.so"]);
        let got = candidates(None, Some(OsStr::new("")), d);
        assert_eq!(got[..2], ["liba.so", "libb.so"]);
    }

    /// A table: its symbols, a present and a missing optional group (typed errors naming the
    /// symbol, never a panic), opened once per process by `shared`, by one name or two.
    #[test]
    fn a_table_loads_once_with_its_optional_groups() {
        let libc = vec!["libc.so.6".to_owned()];
        let a = Libc::shared(&libc).expect("libc");
        let b = Libc::shared(&["/nonexistent/libc.so".into(), "libc.so.6".into()]).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "one table");
        assert_eq!(Libc::opened("libc.so.6"), 1, "opened once");
        // SAFETY: a NUL-terminated literal.
        assert_eq!(unsafe { (a.strlen)(c"hixl".as_ptr()) }, 4);
        let s = a.string().expect("present");
        // SAFETY: as above.
        assert_eq!(unsafe { (s.strnlen)(c"hixl".as_ptr(), 2) }, 2);
        let e = a.missing().map(|m| m.nothing).unwrap_err();
        match &e {
            Error::LibraryUnavailable { library, why } => {
                assert_eq!(library, "libc.so.6");
                assert_eq!(
                    why,
                    "missing symbol hixl_no_such_symbol (a test of a missing group)"
                );
            }
            other => panic!("wrong error {other:?}"),
        }
        assert_eq!(e.status(), crate::Status::UNSUPPORTED);
        // the same object by another name: the same table
        let path = "/lib/x86_64-linux-gnu/libc.so.6";
        if Path::new(path).exists() {
            let c = Libc::shared(&[path.to_owned()]).unwrap();
            assert!(Arc::ptr_eq(&a, &c));
        }
        // a table of its own is another one
        let own = Libc::open_from(&libc).unwrap();
        assert_eq!(own.library(), "libc.so.6");
        let e =
            Libc::shared(&["/nonexistent/a.so".into(), "/nonexistent/b.so".into()]).unwrap_err();
        assert!(
            matches!(&e, Error::LibraryUnavailable { library, why }
                if library == "/nonexistent/a.so or /nonexistent/b.so"
                    && why.contains("/nonexistent/b.so")),
            "{e:?}"
        );
        let e = Libc::shared(&[]).unwrap_err();
        assert!(matches!(&e, Error::LibraryUnavailable { why, .. } if why == "no candidates"));
    }
}
