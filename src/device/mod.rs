//! Device memory and device contexts: a leaf the API and the Ascend transport both use, in
//! cudarc's three levels.
//!
//! - `sys/`: the loader (`dl_api!`, one macro for every CANN table) and ACL's C entry points in
//!   one table, opened once per process. Private to this floor: no code outside `device/`
//!   calls ACL raw.
//! - `acl/`: the result level, every ACL call a `Result` through one check: devices, contexts,
//!   memory (`AclBuffer`), streams, virtual memory (`vmm.rs`).
//! - The safe level: [`Device`] (the ACL runtime, the device an engine took on the thread that
//!   initialized it, and that thread's device context; copies in and out of registered memory
//!   with `aclrtMemcpy` under that context); [`DeviceBuffer`] (`aclrtMalloc`),
//!   [`PinnedHostBuffer`] (`aclrtMallocHost`) and [`FabricBuffer`] (ACL virtual memory) over
//!   one device-memory type (`memory.rs`), with fabric memory's allocator statics (HIXL's
//!   `MallocMem`, `FreeMem`, `ExportToShareableHandle`: `fabric.rs`); [`ContextToken`] and
//!   [`DetachedContext`]: device-bound calls as types (`context.rs`).
//!
//! The HCCL data path (communicators, one-sided put/get, registration of memory with HCCL) and
//! fabric memory's links are the Ascend transport's (`transport/ascend/`): they build on this
//! leaf, and this leaf names no transport.

/// Takes `$value` apart without running its `Drop`, for the methods that release a native
/// handle explicitly and report the error that `Drop` could only log (`AclBuffer::free`, and
/// the Ascend transport's `Comm::destroy`, `GlobalMem::deregister`): moves the field `$owner`
/// out and copies the `$copied` fields (which must be `Copy`); the value itself is never
/// dropped and never reachable again, so the owner has exactly one owner.
macro_rules! take_apart {
    ($value:expr => $owner:ident $(, $copied:ident)* $(,)?) => {{
        let rest = std::mem::ManuallyDrop::new($value);
        // SAFETY: the field is read once, out of a value that is never dropped (it is
        // `ManuallyDrop`) nor used again (`rest` does not leave this block).
        let owner = unsafe { std::ptr::read(&rest.$owner) };
        (owner $(, rest.$copied)*)
    }};
}
pub(crate) use take_apart;

pub(crate) mod acl;
mod context;
#[cfg(any(test, feature = "testkit"))]
pub(crate) mod double;
mod fabric;
mod memory;
pub(crate) mod sys;

pub(crate) use self::context::bind;
pub use self::context::{ContextToken, DetachedContext};
#[cfg(test)]
pub(crate) use self::fabric::{Holder, malloc_with};
pub use self::fabric::{export_to_shareable_handle, free_mem, malloc_mem};
pub(crate) use self::fabric::{own_export, replace_physical};
pub(crate) use self::memory::{Alloc, DeviceMem};
pub use self::memory::{DeviceBuffer, FabricBuffer, PinnedHostBuffer};

use std::fmt;

use self::acl::{Acl, Context, ContextGuard};
use crate::error::Error;

/// An engine's device: the loaded ACL runtime, the device the engine took and the device
/// context of the thread that initialized it (HIXL's `Initialize`).
pub(crate) struct Device {
    pub(crate) acl: Acl,
    /// The logical id (`aclrtSetDevice`).
    pub(crate) device_id: u32,
    /// The physical id (`aclrtGetPhyDevIdByLogicDevId`: rank tables, `/etc/hccn.conf`).
    pub(crate) phy_id: u32,
    /// `aclrtGetSocName`, or empty.
    pub(crate) soc_name: String,
    pub(crate) ctx: Context,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("acl", &self.acl.library())
            .field("device_id", &self.device_id)
            .field("phy_id", &self.phy_id)
            .field("soc", &self.soc_name)
            .finish()
    }
}

impl Device {
    /// Takes the device of the calling thread, whose context becomes the engine's: `device_id`
    /// when given (`aclInit`, then `aclrtSetDevice`), else the device `aclrtGetDevice` reports
    /// (HIXL's way: the caller set it), else device 0 (`aclrtSetDevice(0)`, as torch_npu does
    /// when none was set) unless `require_device`: then `aclrtGetDevice`'s error is the engine's,
    /// as HIXL's ADXL and HIXL-CS fail at start on a thread with no device. Then asks ACL for
    /// the device's physical id and the SoC.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] (`hixl.ascend.device_id`) for a device id of 2^31 or more;
    /// [`Error::Native`] from ACL (`aclrtGetDevice`'s `ACL_ERROR_RT_CONTEXT_NULL`, 107002, on a
    /// thread with no device when `require_device`).
    pub(crate) fn open(
        acl: Acl,
        device_id: Option<u32>,
        require_device: bool,
    ) -> Result<Self, Error> {
        let device = match device_id {
            Some(id) => {
                let device = i32::try_from(id).map_err(|_| Error::InvalidOption {
                    key: "hixl.ascend.device_id".into(),
                    value: id.to_string(),
                    problem: "a device id below 2^31",
                })?;
                acl.init()?;
                acl.set_device(device)?;
                device
            }
            None => match acl.device() {
                Ok(d) => d,
                Err(Error::Native { code, .. })
                    if code == i64::from(acl::ACL_ERROR_RT_CONTEXT_NULL) && !require_device =>
                {
                    acl.init()?;
                    acl.set_device(0)?;
                    0
                }
                Err(e) => return Err(e),
            },
        };
        // not negative: `aclrtGetDevice` reported it or it came from a u32 below 2^31
        let device_id = u32::try_from(device).map_err(|_| Error::Native {
            library: "acl",
            call: "aclrtGetDevice",
            code: 0,
            detail: format!("ACL_SUCCESS with the device id {device}"),
        })?;
        let ctx = acl.current_context()?;
        let phy_id = acl.physical_device_id(device)?;
        let soc_name = acl.soc_name().unwrap_or_default();
        Ok(Self {
            acl,
            device_id,
            phy_id,
            soc_name,
            ctx,
        })
    }

    /// Makes the engine's context current on this thread until the guard drops.
    ///
    /// # Errors
    /// [`Error::Native`] from `aclrtSetCurrentContext`.
    pub(crate) fn enter(&self) -> Result<ContextGuard, Error> {
        self.acl.enter(self.ctx)
    }

    /// Binds the engine's context on this thread and checks, with `aclrtGetCurrentContext`,
    /// that it is current: what a [`ContextToken`] is minted from.
    ///
    /// # Errors
    /// [`Error::Native`] from ACL.
    pub(crate) fn bind(&self) -> Result<ContextGuard, Error> {
        let guard = self.enter()?;
        let now = self.acl.current_context()?;
        if now != self.ctx {
            return Err(Error::Native {
                library: "acl",
                call: "aclrtGetCurrentContext",
                code: i64::from(acl::ACL_ERROR_RT_CONTEXT_NULL),
                detail: "the engine's context did not become current".into(),
            });
        }
        Ok(guard)
    }

    /// Copies `data` to `addr` with `aclrtMemcpy` under the engine's context (`device`: `addr`
    /// is device memory, else host memory).
    ///
    /// # Safety
    /// `addr..addr + data.len()` is memory of that kind, allocated, that nothing else accesses
    /// meanwhile in a way that races the copy.
    pub(crate) unsafe fn write(&self, addr: usize, data: &[u8], device: bool) -> Result<(), Error> {
        let _g = self.enter()?;
        // SAFETY: forwarded from the caller.
        unsafe { self.acl.write_raw(addr, data, device) }
    }

    /// Copies from `addr` into `buf` with `aclrtMemcpy` under the engine's context.
    ///
    /// # Safety
    /// As [`Device::write`].
    pub(crate) unsafe fn read(
        &self,
        addr: usize,
        buf: &mut [u8],
        device: bool,
    ) -> Result<(), Error> {
        let _g = self.enter()?;
        // SAFETY: forwarded from the caller.
        unsafe { self.acl.read_raw(addr, buf, device) }
    }
}
