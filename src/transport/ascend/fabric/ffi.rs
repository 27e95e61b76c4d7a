//! ACL's virtual-memory and async-copy entry points the fabric-memory path needs, looked up in
//! the ACL runtime the engine's device already loaded (the same library, opened again by the
//! name it was found by: `dlopen` hands back the same object). A runtime without one of them is
//! [`Error::LibraryUnavailable`] (`UNSUPPORTED`) naming it, never a crash.
//!
//! Declarations: `include/external/acl/acl_rt.h` of hicann/runtime.

use std::ffi::{c_int, c_void};

use crate::device::ffi::{AclError, AclrtStream, open, syms};
use crate::dl::Library;
use crate::error::Error;

/// `aclrtMemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct MemLocation {
    pub(crate) id: u32,
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
/// `aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_DEVICE`.
pub(crate) const ACL_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

/// The fabric path's ACL entry points, with the library that keeps them valid.
#[derive(Debug)]
pub(crate) struct FabricApi {
    /// `aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void
    /// *expectPtr, uint64_t flags)`.
    pub(crate) reserve:
        unsafe extern "C" fn(*mut *mut c_void, usize, usize, *mut c_void, u64) -> AclError,
    /// `aclError aclrtReleaseMemAddress(void *virPtr)`.
    pub(crate) release: unsafe extern "C" fn(*mut c_void) -> AclError,
    /// `aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const
    /// aclrtPhysicalMemProp *prop, uint64_t flags)`.
    pub(crate) malloc_physical:
        unsafe extern "C" fn(*mut *mut c_void, usize, *const PhysicalMemProp, u64) -> AclError,
    /// `aclError aclrtFreePhysical(aclrtDrvMemHandle handle)`.
    pub(crate) free_physical: unsafe extern "C" fn(*mut c_void) -> AclError,
    /// `aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle,
    /// uint64_t flags)`.
    pub(crate) map: unsafe extern "C" fn(*mut c_void, usize, usize, *mut c_void, u64) -> AclError,
    /// `aclError aclrtUnmapMem(void *virPtr)`.
    pub(crate) unmap: unsafe extern "C" fn(*mut c_void) -> AclError,
    /// `aclError aclrtMemExportToShareableHandleV2(aclrtDrvMemHandle handle, uint64_t flags,
    /// aclrtMemSharedHandleType shareType, void *shareableHandle)`.
    pub(crate) export: unsafe extern "C" fn(*mut c_void, u64, c_int, *mut c_void) -> AclError,
    /// `aclError aclrtMemImportFromShareableHandleV2(void *shareableHandle,
    /// aclrtMemSharedHandleType shareType, uint64_t flags, aclrtDrvMemHandle *handle)`.
    pub(crate) import: unsafe extern "C" fn(*mut c_void, c_int, u64, *mut *mut c_void) -> AclError,
    /// `aclError aclrtMemRetainAllocationHandle(void *virPtr, aclrtDrvMemHandle *handle)`.
    pub(crate) retain: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> AclError,
    /// `aclError aclrtMemGetAddressRange(void *ptr, void **pbase, size_t *psize)`.
    pub(crate) address_range:
        unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut usize) -> AclError,
    /// `aclError aclrtPointerGetAttributes(const void *ptr, aclrtPtrAttributes *attributes)`.
    pub(crate) pointer_attributes:
        unsafe extern "C" fn(*const c_void, *mut PtrAttributes) -> AclError,
    /// `aclError aclrtMemSetAccess(void *virPtr, size_t size, aclrtMemAccessDesc *desc, size_t
    /// count)`.
    pub(crate) set_access:
        unsafe extern "C" fn(*mut c_void, usize, *mut MemAccessDesc, usize) -> AclError,
    /// `aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
    /// aclrtMemcpyKind kind, aclrtStream stream)`.
    pub(crate) memcpy_async: unsafe extern "C" fn(
        *mut c_void,
        usize,
        *const c_void,
        usize,
        c_int,
        AclrtStream,
    ) -> AclError,
    /// `aclError aclrtGetLogicDevIdByUserDevId(const int32_t userDevid, int32_t *const
    /// logicDevId)`.
    pub(crate) logic_dev_id: unsafe extern "C" fn(i32, *mut i32) -> AclError,
    lib: Library,
}

impl FabricApi {
    /// Looks the entry points up in the ACL runtime loaded as `library`.
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] (`UNSUPPORTED`) naming the first missing symbol.
    pub(crate) fn load(library: &str) -> Result<Self, Error> {
        let lib = open(&[library.to_owned()])?;
        syms!(lib;
            reserve = "aclrtReserveMemAddress",
            release = "aclrtReleaseMemAddress",
            malloc_physical = "aclrtMallocPhysical",
            free_physical = "aclrtFreePhysical",
            map = "aclrtMapMem",
            unmap = "aclrtUnmapMem",
            export = "aclrtMemExportToShareableHandleV2",
            import = "aclrtMemImportFromShareableHandleV2",
            retain = "aclrtMemRetainAllocationHandle",
            address_range = "aclrtMemGetAddressRange",
            pointer_attributes = "aclrtPointerGetAttributes",
            set_access = "aclrtMemSetAccess",
            memcpy_async = "aclrtMemcpyAsync",
            logic_dev_id = "aclrtGetLogicDevIdByUserDevId",
        );
        Ok(Self {
            reserve,
            release,
            malloc_physical,
            free_physical,
            map,
            unmap,
            export,
            import,
            retain,
            address_range,
            pointer_attributes,
            set_access,
            memcpy_async,
            logic_dev_id,
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

    #[test]
    fn layouts_match_acl_rt_h() {
        assert_eq!(std::mem::size_of::<MemLocation>(), 8);
        assert_eq!(std::mem::size_of::<PhysicalMemProp>(), 32);
        assert_eq!(std::mem::size_of::<MemAccessDesc>(), 24);
        assert_eq!(std::mem::size_of::<PtrAttributes>(), 28);
    }

    #[test]
    fn a_runtime_without_vmm_is_unsupported_naming_the_symbol() {
        let e = FabricApi::load("libc.so.6").unwrap_err();
        assert_eq!(e.status(), crate::Status::UNSUPPORTED);
        assert!(e.to_string().contains("aclrtReserveMemAddress"), "{e}");
    }
}
