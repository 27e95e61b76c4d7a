//! HCCL global memory: `HcclRegisterGlobalMem` behind a per-process registry (one registration
//! per exact range, shared by reference count; an overlapping range is refused), and the
//! [`GlobalMem`] reference that releases it.

use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use super::sys as ffi;
use super::{Hccl, check};
#[cfg(test)]
use crate::device::take_apart;
use crate::error::Error;
use crate::sync::lock;

/// One process-wide HCCL registration: the library it was made with, its range and kind, the
/// handle, and how many [`GlobalMem`]s share it.
#[derive(Debug)]
struct SharedReg {
    handle: usize,
    kind: MemKind,
    refs: usize,
}

/// `(library, addr, len)` → the registration HCCL holds for exactly that range.
type Registry = HashMap<(String, usize, u64), SharedReg>;

static GLOBAL_MEMS: Mutex<Option<Registry>> = Mutex::new(None);

fn global_mems() -> MutexGuard<'static, Option<Registry>> {
    lock(&GLOBAL_MEMS)
}

/// Where registered memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemKind {
    /// Device memory (`COMM_MEM_TYPE_DEVICE`).
    Device,
    /// Host memory (`COMM_MEM_TYPE_HOST`).
    Host,
}

/// A reference to a process-wide HCCL registration (`HcclRegisterGlobalMem`); the last
/// reference to a range deregisters it on drop.
#[derive(Debug)]
pub(crate) struct GlobalMem {
    hccl: Hccl,
    handle: NonNull<c_void>,
    addr: usize,
    len: u64,
}

// SAFETY: the handle is an opaque HCCL token; HCCL's registration calls are thread-safe (HIXL
// calls them from any engine thread under its own mutex, which `&self` methods do not need:
// each call is independent).
unsafe impl Send for GlobalMem {}
// SAFETY: as above; `&GlobalMem` exposes only plain values and the token.
unsafe impl Sync for GlobalMem {}

impl GlobalMem {
    /// The raw handle.
    pub(crate) fn as_raw(&self) -> *mut c_void {
        self.handle.as_ptr()
    }

    /// Deregisters now, reporting a failure (dropping deregisters too, logging failures).
    ///
    /// # Errors
    /// [`Error::Native`] (e.g. while still bound to a communicator).
    #[cfg(test)]
    pub(crate) fn deregister(self) -> Result<(), Error> {
        let (hccl, handle, addr, len) = take_apart!(self => hccl, handle, addr, len);
        hccl.release_global_mem(handle, addr, len)
    }
}

impl Drop for GlobalMem {
    fn drop(&mut self) {
        if let Err(e) = self
            .hccl
            .release_global_mem(self.handle, self.addr, self.len)
        {
            tracing::warn!("HcclDeregisterGlobalMem failed: {e}");
        }
    }
}

impl Hccl {
    /// `HcclRegisterGlobalMem` for `len` bytes at `addr`.
    ///
    /// # Safety
    /// `addr..addr + len` must be memory of `kind` (from `aclrtMalloc` for device memory, or
    /// pinned host memory) that stays allocated until the returned [`GlobalMem`] is dropped, and
    /// remote ranks may write into it through communicators it is bound to: no Rust reference
    /// to that memory may be live while a peer can write it.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) unsafe fn register_global_mem(
        &self,
        kind: MemKind,
        addr: usize,
        len: u64,
    ) -> Result<GlobalMem, Error> {
        let mut regs = global_mems();
        let map = regs.get_or_insert_with(HashMap::new);
        let lib = self.library().to_owned();
        let end = (addr as u64).saturating_add(len);
        for ((l, a, n), r) in map.iter_mut() {
            if *l != lib {
                continue;
            }
            if (*a, *n) == (addr, len) && r.kind == kind {
                r.refs += 1;
                return Ok(GlobalMem {
                    hccl: self.clone(),
                    handle: NonNull::new(r.handle as *mut c_void).expect("stored non-null"),
                    addr,
                    len,
                });
            }
            if (addr as u64) < (*a as u64).saturating_add(*n) && (*a as u64) < end {
                return Err(Error::Native {
                    library: "hccl",
                    call: "HcclRegisterGlobalMem",
                    code: i64::from(ffi::HCCL_E_PARA),
                    detail: format!(
                        "HCCL_E_PARA: {addr:#x}+{len} overlaps the range {a:#x}+{n} this process \
                         registered already (HCCL keeps one registry per process; only the same \
                         range can be shared)"
                    ),
                });
            }
        }
        let mem = ffi::CommMem {
            mem_type: match kind {
                MemKind::Device => ffi::COMM_MEM_TYPE_DEVICE,
                MemKind::Host => ffi::COMM_MEM_TYPE_HOST,
            },
            addr: addr as *mut c_void,
            size: len,
        };
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: `mem` and `h` are valid for the call; the caller vouches for the range.
        let rc = unsafe { (self.api.register_global_mem)(&mem, &mut h) };
        check("HcclRegisterGlobalMem", rc, "register", "", Instant::now())?;
        let handle = NonNull::new(h).ok_or_else(|| Error::Native {
            library: "hccl",
            call: "HcclRegisterGlobalMem",
            code: 0,
            detail: "HCCL_SUCCESS with a null handle".into(),
        })?;
        map.insert(
            (lib, addr, len),
            SharedReg {
                handle: handle.as_ptr() as usize,
                kind,
                refs: 1,
            },
        );
        Ok(GlobalMem {
            hccl: self.clone(),
            handle,
            addr,
            len,
        })
    }

    /// Drops one reference to a registration; the last one deregisters it.
    fn release_global_mem(
        &self,
        handle: NonNull<c_void>,
        addr: usize,
        len: u64,
    ) -> Result<(), Error> {
        let mut regs = global_mems();
        let key = (self.library().to_owned(), addr, len);
        if let Some(r) = regs.as_mut().and_then(|m| m.get_mut(&key))
            && r.handle == handle.as_ptr() as usize
        {
            r.refs -= 1;
            if r.refs > 0 {
                return Ok(());
            }
            regs.as_mut().map(|m| m.remove(&key));
        }
        drop(regs);
        self.deregister_raw(handle)
    }

    fn deregister_raw(&self, handle: NonNull<c_void>) -> Result<(), Error> {
        // SAFETY: the handle came from HcclRegisterGlobalMem and its last reference is gone.
        let rc = unsafe { (self.api.deregister_global_mem)(handle.as_ptr()) };
        check(
            "HcclDeregisterGlobalMem",
            rc,
            "deregister",
            "",
            Instant::now(),
        )
    }
}
