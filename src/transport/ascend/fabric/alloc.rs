//! The allocator statics of a fabric-memory process (HIXL's `MallocMem`, `FreeMem`,
//! `ExportToShareableHandle`): VMM memory (`aclrtMallocPhysical` + `aclrtReserveMemAddress` +
//! `aclrtMapMem`), on the calling thread's device, that a fabric-memory engine registers and
//! exports. Process-wide, as upstream's are: the ACL runtime is loaded once (`$HIXL_ACL_LIB`,
//! then CANN's names), and the allocations are kept by address.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use super::GRANULE;
use super::ffi::{self, FabricApi, MemAccessDesc, MemLocation, PhysicalMemProp};
use crate::device::acl::Acl;
use crate::error::Error;
use crate::sync::lock;
use crate::types::MemType;
use crate::wire::FABRIC_HANDLE_LEN;

/// An ACL runtime with its VMM entry points.
pub(crate) type Lib = Arc<(Acl, FabricApi)>;

struct Alloc {
    lib: Lib,
    phys: usize,
    /// Exported once, then cached (upstream: "ACL export runs at most once per allocation").
    handle: Option<[u8; FABRIC_HANDLE_LEN]>,
}

static ALLOCS: Mutex<BTreeMap<usize, Alloc>> = Mutex::new(BTreeMap::new());
static API: OnceLock<Result<Lib, Error>> = OnceLock::new();

fn api() -> Result<Lib, Error> {
    let r = API.get_or_init(|| {
        let acl = Acl::load(None)?;
        let api = FabricApi::load(acl.library())?;
        Ok(Arc::new((acl, api)))
    });
    match r {
        Ok(a) => Ok(a.clone()),
        Err(e) => Err(Error::LibraryUnavailable {
            library: "libacl_rt.so or libascendcl.so (with ACL's VMM calls)".into(),
            why: e.to_string(),
        }),
    }
}

fn check(acl: &Acl, call: &'static str, rc: i32) -> Result<(), Error> {
    if rc == 0 {
        Ok(())
    } else {
        Err(acl.error(call, rc))
    }
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
    malloc_with(&api()?, mem_type, size)
}

/// [`malloc_mem`] with the given ACL runtime (a typed engine's own).
pub(crate) fn malloc_with(lib: &Lib, mem_type: MemType, size: usize) -> Result<usize, Error> {
    let (acl, api) = &**lib;
    if size == 0 {
        return Err(Error::InvalidOption {
            key: "size".into(),
            value: "0".into(),
            problem: "a positive number of bytes",
        });
    }
    let len = size.div_ceil(GRANULE) * GRANULE;
    let device = acl.device()?;
    let prop = PhysicalMemProp {
        mem_attr: match mem_type {
            MemType::Device => ffi::ACL_HBM_MEM_HUGE,
            MemType::Host => ffi::ACL_MEM_P2P_HUGE,
        },
        location: MemLocation {
            id: match mem_type {
                MemType::Device => device as u32,
                MemType::Host => 0,
            },
            kind: match mem_type {
                MemType::Device => ffi::LOCATION_DEVICE,
                MemType::Host => ffi::LOCATION_HOST,
            },
        },
        ..PhysicalMemProp::default()
    };
    let mut h: *mut c_void = std::ptr::null_mut();
    // SAFETY: out-pointer and a valid property struct.
    check(acl, "aclrtMallocPhysical", unsafe {
        (api.malloc_physical)(&mut h, len, &prop, 0)
    })?;
    let mut va: *mut c_void = std::ptr::null_mut();
    // SAFETY: out-pointer; a size of whole granules.
    let rc = unsafe { (api.reserve)(&mut va, len, 0, std::ptr::null_mut(), 1) };
    if let Err(e) = check(acl, "aclrtReserveMemAddress", rc) {
        // SAFETY: the handle just made, released once.
        unsafe { (api.free_physical)(h) };
        return Err(e);
    }
    // SAFETY: a fresh reservation of this process and a live handle.
    let mut rc = unsafe { (api.map)(va, len, 0, h, 0) };
    if rc == 0 && mem_type == MemType::Host {
        // SAFETY: the range was just mapped.
        rc = unsafe { set_access(api, device, va, len) };
        if rc != 0 {
            // SAFETY: the mapping just made.
            unsafe { (api.unmap)(va) };
        }
    }
    if rc != 0 {
        let e = acl.error("aclrtMapMem", rc);
        // SAFETY: the reservation and the handle just made, released once.
        unsafe {
            (api.release)(va);
            (api.free_physical)(h);
        }
        return Err(e);
    }
    lock(&ALLOCS).insert(
        va as usize,
        Alloc {
            lib: lib.clone(),
            phys: h as usize,
            handle: None,
        },
    );
    Ok(va as usize)
}

/// Gives `device` read-write access to host memory mapped at `va..va + len`
/// (`aclrtMemSetAccess`, with ACL's logical id of the device; the id itself where ACL does not
/// say it); ACL's return code.
///
/// # Safety
/// `va..va + len` must be mapped (VMM memory of this process).
pub(super) unsafe fn set_access(api: &FabricApi, device: i32, va: *mut c_void, len: usize) -> i32 {
    let mut logic = 0i32;
    // SAFETY: out-pointer.
    let r = unsafe { (api.logic_dev_id)(device, &mut logic) };
    let mut desc = MemAccessDesc {
        flags: ffi::ACCESS_READWRITE,
        location: MemLocation {
            id: if r == 0 { logic as u32 } else { device as u32 },
            kind: ffi::LOCATION_DEVICE,
        },
        rsv: [0; 12],
    };
    // SAFETY: the caller's contract; one descriptor.
    unsafe { (api.set_access)(va, len, &mut desc, 1) }
}

/// HIXL's `FreeMem(ptr)`: unmaps, releases the address range and frees the physical memory of
/// a [`malloc_mem`] allocation.
///
/// # Errors
/// `PARAM_INVALID` for an address [`malloc_mem`] did not return (or already freed);
/// [`Error::Native`] from ACL.
pub fn free_mem(addr: usize) -> Result<(), Error> {
    let a = lock(&ALLOCS)
        .remove(&addr)
        .ok_or_else(|| param(format!("{addr:#x}")))?;
    let (acl, api) = &*a.lib;
    // SAFETY: what malloc_mem made, released once in its order.
    unsafe {
        check(acl, "aclrtUnmapMem", (api.unmap)(addr as *mut c_void))?;
        check(
            acl,
            "aclrtReleaseMemAddress",
            (api.release)(addr as *mut c_void),
        )?;
        check(
            acl,
            "aclrtFreePhysical",
            (api.free_physical)(a.phys as *mut c_void),
        )
    }
}

/// The allocation at `addr` now lives on the physical memory `phys` (a registration moved it
/// there: `retire`): the allocator keeps that handle for [`free_mem`], forgets its export, and
/// returns the old handle for the caller to release; `None` when `addr` is not an allocation
/// of [`malloc_mem`] (memory the caller mapped itself).
pub(super) fn replace_physical(addr: usize, phys: usize) -> Option<usize> {
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
    let mut allocs = lock(&ALLOCS);
    let a = allocs
        .get_mut(&addr)
        .ok_or_else(|| param(format!("{addr:#x}")))?;
    let lib = a.lib.clone();
    let (acl, api) = &*lib;
    if let Some(h) = a.handle {
        return Ok(h);
    }
    let mut h = [0u8; FABRIC_HANDLE_LEN];
    // SAFETY: a live handle; 128 writable bytes.
    let rc = unsafe {
        (api.export)(
            a.phys as *mut c_void,
            ffi::EXPORT_DISABLE_PID_VALIDATION,
            ffi::SHARE_FABRIC,
            h.as_mut_ptr().cast(),
        )
    };
    check(acl, "aclrtMemExportToShareableHandleV2", rc)?;
    a.handle = Some(h);
    Ok(h)
}
