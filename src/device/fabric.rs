//! The allocator statics of a fabric-memory process (HIXL's `MallocMem`, `FreeMem`,
//! `ExportToShareableHandle`): VMM memory (`aclrtMallocPhysical` + `aclrtReserveMemAddress` +
//! `aclrtMapMem`), on the calling thread's device, that a fabric-memory engine registers and
//! exports. Process-wide, as upstream's are: the ACL runtime is the process's
//! ([`Acl::load`]: `$HIXL_ACL_LIB`, then CANN's names), and the allocations are kept by address.
//! [`FabricBuffer`](super::FabricBuffer) is the typed API's memory over them.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::acl::{Acl, MemLocation, VMM_GRANULE};
use crate::error::Error;
use crate::sync::lock;
use crate::types::MemType;
use crate::wire::FABRIC_HANDLE_LEN;

struct Alloc {
    acl: Acl,
    phys: usize,
    /// Exported once, then cached (upstream: "ACL export runs at most once per allocation").
    handle: Option<[u8; FABRIC_HANDLE_LEN]>,
    /// Who frees it: only that owner may.
    holder: Holder,
}

/// Who owns an allocation of the table, and so who may free it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// The caller of [`malloc_mem`], with [`free_mem`].
    Caller,
    /// A [`FabricBuffer`](super::FabricBuffer), when it drops ([`free_buffer`]); [`free_mem`]
    /// refuses it, as it would free memory the buffer still uses.
    Buffer,
}

static ALLOCS: Mutex<BTreeMap<usize, Alloc>> = Mutex::new(BTreeMap::new());

/// The process's ACL runtime, with its VMM entry points.
fn acl() -> Result<Acl, Error> {
    Acl::load(None)
        .and_then(|acl| acl.check_vmm().map(|()| acl))
        .map_err(|e| Error::LibraryUnavailable {
            library: "libacl_rt.so or libascendcl.so (with ACL's VMM calls)".into(),
            why: e.to_string(),
        })
}

fn param(why: String) -> Error {
    Error::InvalidOption {
        key: "addr".into(),
        value: why,
        problem: "an address MallocMem returned and FreeMem has not freed",
    }
}

/// HIXL's `MallocMem(type, size, &ptr)`: `size` bytes (rounded up to 2 MiB) of VMM memory on
/// the calling thread's device (`MemType::Device`: HBM, `ACL_HBM_MEM_HUGE`; `MemType::Host`:
/// host memory the device may access, `ACL_MEM_P2P_HUGE`, with `aclrtMemSetAccess`), mapped
/// at a reserved address, which it returns.
///
/// # Errors
/// [`Error::LibraryUnavailable`] (`UNSUPPORTED`) without an ACL runtime with the VMM calls;
/// [`Error::InvalidOption`] (`PARAM_INVALID`) for a zero size; [`Error::Native`] from ACL (no
/// device on this thread: `ACL_ERROR_RT_CONTEXT_NULL`).
pub fn malloc_mem(mem_type: MemType, size: usize) -> Result<usize, Error> {
    malloc_with(&acl()?, mem_type, size, Holder::Caller)
}

/// [`malloc_mem`] with the given ACL runtime (a typed engine's own), for `holder` (only it
/// frees the allocation).
///
/// # Errors
/// As [`malloc_mem`].
pub(crate) fn malloc_with(
    acl: &Acl,
    mem_type: MemType,
    size: usize,
    holder: Holder,
) -> Result<usize, Error> {
    if size == 0 {
        return Err(Error::InvalidOption {
            key: "size".into(),
            value: "0".into(),
            problem: "a positive number of bytes",
        });
    }
    let len = size.div_ceil(VMM_GRANULE) * VMM_GRANULE;
    let device = acl.device()?;
    let location = match mem_type {
        MemType::Device => MemLocation::device(device as u32),
        MemType::Host => MemLocation::host(),
    };
    let h = acl.malloc_physical(len, location)?;
    let va = match acl.reserve(len) {
        Ok(va) => va,
        Err(e) => {
            // SAFETY: the handle just made, released once.
            let _ = unsafe { acl.free_physical(h) };
            return Err(e);
        }
    };
    // SAFETY: a fresh reservation of this process and a live handle.
    let mut mapped = unsafe { acl.map(va, len, h) };
    if mapped.is_ok() && mem_type == MemType::Host {
        // SAFETY: the range was just mapped.
        mapped = unsafe { acl.set_access(device, va, len) };
        if mapped.is_err() {
            // SAFETY: the mapping just made, which nothing uses.
            let _ = unsafe { acl.unmap(va) };
        }
    }
    if let Err(e) = mapped {
        // SAFETY: the reservation (unmapped) and the handle just made, released once.
        unsafe {
            let _ = acl.release(va);
            let _ = acl.free_physical(h);
        }
        return Err(e);
    }
    lock(&ALLOCS).insert(
        va,
        Alloc {
            acl: acl.clone(),
            phys: h,
            handle: None,
            holder,
        },
    );
    Ok(va)
}

/// HIXL's `FreeMem(ptr)`: unmaps, releases the address range and frees the physical memory of
/// a [`malloc_mem`] allocation.
///
/// # Errors
/// `PARAM_INVALID` for an address [`malloc_mem`] did not return (or already freed), the
/// memory of a live [`FabricBuffer`](super::FabricBuffer) included (its drop frees it);
/// [`Error::Native`] from ACL.
pub fn free_mem(addr: usize) -> Result<(), Error> {
    free(addr, Holder::Caller)
}

/// Frees the allocation of a [`FabricBuffer`](super::FabricBuffer) at `addr` (its drop).
///
/// # Errors
/// As [`free_mem`].
pub(crate) fn free_buffer(addr: usize) -> Result<(), Error> {
    free(addr, Holder::Buffer)
}

/// Frees the allocation at `addr` if `holder` holds it; another's is `PARAM_INVALID`, as an
/// unknown address is, and stays allocated.
fn free(addr: usize, holder: Holder) -> Result<(), Error> {
    let a = {
        let mut allocs = lock(&ALLOCS);
        match allocs.get(&addr) {
            Some(a) if a.holder == holder => allocs.remove(&addr),
            _ => None,
        }
    }
    .ok_or_else(|| param(format!("{addr:#x}")))?;
    // SAFETY: what malloc_with made for `holder`, who frees it now (so no longer uses it; a
    // buffer's memory is freed only by the buffer's drop, and the caller's is refused to
    // anyone else), removed from the table above so released once, in its order.
    unsafe {
        a.acl.unmap(addr)?;
        a.acl.release(addr)?;
        a.acl.free_physical(a.phys)
    }
}

/// The allocation at `addr` now lives on the physical memory `phys` (a registration moved it
/// there: the fabric path's `retire`): the allocator keeps that handle for [`free_mem`], forgets
/// its export, and returns the old handle for the caller to release; `None` when `addr` is not
/// an allocation of [`malloc_mem`] (memory the caller mapped itself).
pub(crate) fn replace_physical(addr: usize, phys: usize) -> Option<usize> {
    let mut allocs = lock(&ALLOCS);
    let a = allocs.get_mut(&addr)?;
    a.handle = None;
    Some(std::mem::replace(&mut a.phys, phys))
}

/// HIXL's `ExportToShareableHandle(addr, handle)`: the fabric shareable handle of a
/// [`malloc_mem`] allocation (exported once, then the cached one), which another process
/// imports to map the same physical memory.
///
/// # Errors
/// `PARAM_INVALID` for an address [`malloc_mem`] did not return; [`Error::Native`] from ACL.
pub fn export_to_shareable_handle(addr: usize) -> Result<[u8; FABRIC_HANDLE_LEN], Error> {
    own_export(addr)
        .unwrap_or_else(|| Err(param(format!("{addr:#x}"))))
        .map(|(_, h)| h)
}

/// The physical handle and the fabric shareable handle of the [`malloc_mem`] allocation at
/// `addr` (exported once, then the cached one: ACL holds a handle and its shareable handle one
/// to one within a process, so a second export of one handle fails); `None` when `addr` is not
/// one (memory the caller mapped itself). A fabric registration of the allocator's memory
/// takes these, as upstream's does, instead of retaining the handle
/// (`aclrtMemRetainAllocationHandle`, which HDK 25.5 lacks) and exporting it again.
///
/// # Errors
/// [`Error::Native`] from ACL's export.
pub(crate) fn own_export(addr: usize) -> Option<Result<(usize, [u8; FABRIC_HANDLE_LEN]), Error>> {
    let mut allocs = lock(&ALLOCS);
    let a = allocs.get_mut(&addr)?;
    if let Some(h) = a.handle {
        return Some(Ok((a.phys, h)));
    }
    // SAFETY: the allocation's live handle (kept in the table until `free_mem`).
    let h = match unsafe { a.acl.export_fabric(a.phys) } {
        Ok(h) => h,
        Err(e) => return Some(Err(e)),
    };
    a.handle = Some(h);
    Some(Ok((a.phys, h)))
}
