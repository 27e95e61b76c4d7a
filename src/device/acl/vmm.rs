//! ACL's virtual memory (VMM), as fabric memory uses it: address reservations, physical memory,
//! mappings, access for the device to host memory, fabric shareable handles (export and
//! import), the queries that find an allocation, and async device-to-device copies on a
//! stream. Each call is a `Result` through [`Acl::check`]; a runtime without these entry points
//! (they are an optional group of the table) is [`Error::LibraryUnavailable`] (`UNSUPPORTED`)
//! naming the first missing one.
//!
//! Virtual addresses and physical-memory handles are plain numbers here (`usize`): hixl only
//! hands them back to ACL, and copies into mapped memory go through ACL too.

use std::ffi::c_void;

use super::{Acl, Stream};
use crate::device::sys::acl::{
    self as sys, MemAccessDesc, MemLocation, PhysicalMemProp, PtrAttributes, VmmApi,
};
use crate::error::Error;
use crate::wire::FABRIC_HANDLE_LEN;

/// The VMM granularity reservations and mappings are rounded to (2 MiB).
pub(crate) const VMM_GRANULE: usize = sys::HUGE_PAGE;

impl MemLocation {
    /// Device `id`'s memory.
    pub(crate) fn device(id: u32) -> Self {
        Self {
            id,
            kind: sys::LOCATION_DEVICE,
        }
    }

    /// Host memory.
    pub(crate) fn host() -> Self {
        Self {
            id: 0,
            kind: sys::LOCATION_HOST,
        }
    }

    /// Whether it is a device's memory.
    pub(crate) fn is_device(&self) -> bool {
        self.kind == sys::LOCATION_DEVICE
    }
}

impl Acl {
    /// The VMM entry points.
    fn vmm(&self) -> Result<&VmmApi, Error> {
        self.api.vmm()
    }

    /// `Ok` when the runtime has the VMM entry points.
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] (`UNSUPPORTED`) naming the first missing one.
    pub(crate) fn check_vmm(&self) -> Result<(), Error> {
        self.vmm().map(|_| ())
    }

    /// `aclrtMemGetAddressRange`: the allocation (`(base, size)`) that holds `addr`.
    ///
    /// # Errors
    /// [`Error::Native`] (memory ACL did not allocate or map).
    pub(crate) fn address_range(&self, addr: usize) -> Result<(usize, usize), Error> {
        let vmm = self.vmm()?;
        let (mut base, mut size): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: plain out-pointers; `addr` is only looked up, not dereferenced.
        let rc = unsafe { (vmm.address_range)(addr as *mut c_void, &mut base, &mut size) };
        self.check("aclrtMemGetAddressRange", rc)?;
        Ok((base as usize, size))
    }

    /// `aclrtPointerGetAttributes`: where the memory at `addr` is.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn pointer_attributes(&self, addr: usize) -> Result<PtrAttributes, Error> {
        let vmm = self.vmm()?;
        let mut attr = PtrAttributes::default();
        // SAFETY: `addr` is only looked up; `attr` is a writable aclrtPtrAttributes.
        let rc = unsafe { (vmm.pointer_attributes)(addr as *const c_void, &mut attr) };
        self.check("aclrtPointerGetAttributes", rc)?;
        Ok(attr)
    }

    /// `aclrtMemRetainAllocationHandle`: a new reference to the physical memory mapped at
    /// `addr`, to be released with [`free_physical`](Self::free_physical).
    ///
    /// # Errors
    /// [`Error::Native`] (no mapping there).
    pub(crate) fn retain_allocation(&self, addr: usize) -> Result<usize, Error> {
        let vmm = self.vmm()?;
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: `addr` is only looked up; `h` is an out-pointer.
        let rc = unsafe { (vmm.retain)(addr as *mut c_void, &mut h) };
        self.check("aclrtMemRetainAllocationHandle", rc)?;
        Ok(h as usize)
    }

    /// `aclrtMallocPhysical`: `len` bytes (whole granules) of huge-page physical memory at
    /// `location` (device memory: `ACL_HBM_MEM_HUGE`; host memory the device may map:
    /// `ACL_MEM_P2P_HUGE`), to be released with [`free_physical`](Self::free_physical).
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn malloc_physical(
        &self,
        len: usize,
        location: MemLocation,
    ) -> Result<usize, Error> {
        let vmm = self.vmm()?;
        let prop = PhysicalMemProp {
            mem_attr: if location.is_device() {
                sys::ACL_HBM_MEM_HUGE
            } else {
                sys::ACL_MEM_P2P_HUGE
            },
            location,
            ..PhysicalMemProp::default()
        };
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: an out-pointer and a valid property struct.
        let rc = unsafe { (vmm.malloc_physical)(&mut h, len, &prop, 0) };
        self.check("aclrtMallocPhysical", rc)?;
        Ok(h as usize)
    }

    /// `aclrtFreePhysical`: releases a reference to physical memory (the memory goes with the
    /// last one: its mappings and importers hold theirs).
    ///
    /// # Safety
    /// `handle` came from [`malloc_physical`](Self::malloc_physical),
    /// [`retain_allocation`](Self::retain_allocation) or [`import_fabric`](Self::import_fabric)
    /// and is released once.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) unsafe fn free_physical(&self, handle: usize) -> Result<(), Error> {
        let vmm = self.vmm()?;
        // SAFETY: the caller's contract.
        let rc = unsafe { (vmm.free_physical)(handle as *mut c_void) };
        self.check("aclrtFreePhysical", rc)
    }

    /// `aclrtReserveMemAddress`: `len` bytes (whole granules) of this process's address space,
    /// to be released with [`release`](Self::release).
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn reserve(&self, len: usize) -> Result<usize, Error> {
        let vmm = self.vmm()?;
        let mut va: *mut c_void = std::ptr::null_mut();
        // SAFETY: an out-pointer; no address is asked for.
        let rc = unsafe { (vmm.reserve)(&mut va, len, 0, std::ptr::null_mut(), 1) };
        self.check("aclrtReserveMemAddress", rc)?;
        Ok(va as usize)
    }

    /// `aclrtReleaseMemAddress`.
    ///
    /// # Safety
    /// `va` is a reservation of [`reserve`](Self::reserve), unmapped, released once.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) unsafe fn release(&self, va: usize) -> Result<(), Error> {
        let vmm = self.vmm()?;
        // SAFETY: the caller's contract.
        let rc = unsafe { (vmm.release)(va as *mut c_void) };
        self.check("aclrtReleaseMemAddress", rc)
    }

    /// `aclrtMapMem`: maps `len` bytes of the physical memory `handle` at `va`.
    ///
    /// # Safety
    /// `va..va + len` lies in a reservation of this process and is not mapped; `handle` is
    /// live; nothing in this process relies on what was at `va` before.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) unsafe fn map(&self, va: usize, len: usize, handle: usize) -> Result<(), Error> {
        let vmm = self.vmm()?;
        // SAFETY: the caller's contract.
        let rc = unsafe { (vmm.map)(va as *mut c_void, len, 0, handle as *mut c_void, 0) };
        self.check("aclrtMapMem", rc)
    }

    /// `aclrtUnmapMem`.
    ///
    /// # Safety
    /// `va` starts a mapping of [`map`](Self::map) that nothing uses any more (no copy in
    /// flight, no Rust reference).
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) unsafe fn unmap(&self, va: usize) -> Result<(), Error> {
        let vmm = self.vmm()?;
        // SAFETY: the caller's contract.
        let rc = unsafe { (vmm.unmap)(va as *mut c_void) };
        self.check("aclrtUnmapMem", rc)
    }

    /// `aclrtGetLogicDevIdByUserDevId`: ACL's logical id of the user's device id.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) fn logical_device_id(&self, device: i32) -> Result<i32, Error> {
        let vmm = self.vmm()?;
        let mut logic = 0i32;
        // SAFETY: an out-pointer.
        let rc = unsafe { (vmm.logic_dev_id)(device, &mut logic) };
        self.check("aclrtGetLogicDevIdByUserDevId", rc)?;
        Ok(logic)
    }

    /// `aclrtMemSetAccess`: gives `device` read-write access to host memory mapped at
    /// `va..va + len`, by ACL's logical id of the device (the id itself where ACL does not say
    /// it).
    ///
    /// # Safety
    /// `va..va + len` is mapped (VMM memory of this process).
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) unsafe fn set_access(
        &self,
        device: i32,
        va: usize,
        len: usize,
    ) -> Result<(), Error> {
        let vmm = self.vmm()?;
        let id = self.logical_device_id(device).unwrap_or(device);
        let mut desc = MemAccessDesc {
            flags: sys::ACCESS_READWRITE,
            location: MemLocation::device(id as u32),
            rsv: [0; 12],
        };
        // SAFETY: the caller's contract; one descriptor.
        let rc = unsafe { (vmm.set_access)(va as *mut c_void, len, &mut desc, 1) };
        self.check("aclrtMemSetAccess", rc)
    }

    /// `aclrtMemExportToShareableHandleV2` (`FABRIC`, without pid validation): the fabric
    /// shareable handle of the physical memory `handle`, which another process imports.
    ///
    /// # Safety
    /// `handle` is live physical memory of this process.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) unsafe fn export_fabric(
        &self,
        handle: usize,
    ) -> Result<[u8; FABRIC_HANDLE_LEN], Error> {
        let vmm = self.vmm()?;
        let mut out = [0u8; FABRIC_HANDLE_LEN];
        // SAFETY: the caller's contract for `handle`; the output is 128 writable bytes.
        let rc = unsafe {
            (vmm.export)(
                handle as *mut c_void,
                sys::EXPORT_DISABLE_PID_VALIDATION,
                sys::SHARE_FABRIC,
                out.as_mut_ptr().cast(),
            )
        };
        self.check("aclrtMemExportToShareableHandleV2", rc)?;
        Ok(out)
    }

    /// `aclrtMemImportFromShareableHandleV2` (`FABRIC`): the physical memory a peer exported as
    /// `handle` (any bytes: ACL refuses what it did not export), to be mapped and released with
    /// [`free_physical`](Self::free_physical).
    ///
    /// # Errors
    /// [`Error::Native`] (`ACL_ERROR_RT_PARAM_INVALID` for a handle of a process that has
    /// gone, or garbage).
    pub(crate) fn import_fabric(&self, handle: &[u8; FABRIC_HANDLE_LEN]) -> Result<usize, Error> {
        let vmm = self.vmm()?;
        let mut bytes = *handle;
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: `bytes` is 128 readable bytes (ACL only reads them); `h` is an out-pointer.
        let rc = unsafe { (vmm.import)(bytes.as_mut_ptr().cast(), sys::SHARE_FABRIC, 0, &mut h) };
        self.check("aclrtMemImportFromShareableHandleV2", rc)?;
        Ok(h as usize)
    }

    /// `aclrtMemcpyAsync` device to device: queues a copy of `len` bytes from `src` to `dst` on
    /// `stream` (the caller synchronises the stream, or aborts it).
    ///
    /// # Safety
    /// Both ranges are mapped memory of this process of `len` bytes that stay mapped, with no
    /// Rust reference to the destination, until the stream is synchronised or aborted; the
    /// stream's context is current.
    ///
    /// # Errors
    /// [`Error::Native`].
    pub(crate) unsafe fn copy_device_async(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        stream: &Stream,
    ) -> Result<(), Error> {
        let vmm = self.vmm()?;
        // SAFETY: the caller's contract; the stream is alive (borrowed).
        let rc = unsafe {
            (vmm.memcpy_async)(
                dst as *mut c_void,
                len,
                src as *const c_void,
                len,
                sys::ACL_MEMCPY_DEVICE_TO_DEVICE,
                stream.as_raw(),
            )
        };
        self.check("aclrtMemcpyAsync", rc)
    }
}
