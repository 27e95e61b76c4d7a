//! Async requests beyond HIXL's calls (extensions, marked as such in `include/hixl_c.h`): a
//! request with its own deadline, cancelling one, and waiting for one to end. What NIXL's
//! HIXL backend (`nixl-plugin/`) maps NIXL's post, release and status onto.

use std::ffi::{c_char, c_void};
use std::time::Duration;

use hixl_rs::compat;

use super::{HixlEngine, HixlStatus, TransferArgs, entry, fail, invalid, put};

/// `hixl_transfer_async` with the request's deadline `timeout_in_millis` from now (> 0);
/// past it the request ends `HIXL_TRANSFER_TIMEOUT`, and the engine no longer touches its local
/// buffers.
///
/// # Safety
/// As [`super::hixl_transfer_async`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_transfer_async_within(
    engine: *mut HixlEngine,
    remote: *const c_char,
    operation: i32,
    descs: *const compat::TransferOpDesc,
    count: usize,
    args: *const TransferArgs,
    timeout_in_millis: i32,
    req: *mut *mut c_void,
) -> HixlStatus {
    // SAFETY: the caller's contract, forwarded.
    unsafe {
        super::start_async(
            engine,
            remote,
            operation,
            descs,
            count,
            args,
            Some(timeout_in_millis),
            req,
        )
    }
}

/// Asks the engine to stop an async request: descriptors not started are skipped, and it ends
/// `HIXL_TRANSFER_FAILED` (or `COMPLETED`, had its data moved already) once what was running
/// returned. It stays known until its terminal status is reported ([`hixl_wait_transfer`],
/// `hixl_get_transfer_status`). An unknown (or already reported) request: `FAILED`.
///
/// # Safety
/// Any `req` value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_cancel_transfer(
    engine: *mut HixlEngine,
    req: *mut c_void,
) -> HixlStatus {
    entry(|| {
        let e = super::engine(engine)?;
        e.cancel_transfer(req as usize as u64).map_err(fail)
    })
}

/// Waits up to `timeout_in_millis` (≥ 0; 0 does not wait) for an async request to end, then
/// reports its status as `hixl_get_transfer_status` does (`*status`: `HIXL_TRANSFER_*`; a
/// terminal status once, then the request is released). An unknown (or already reported)
/// request gives `FAILED` and `HIXL_TRANSFER_FAILED`.
///
/// # Safety
/// `status` is null or writable; any `req` value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_wait_transfer(
    engine: *mut HixlEngine,
    req: *mut c_void,
    timeout_in_millis: i32,
    status: *mut i32,
) -> HixlStatus {
    entry(|| {
        let e = super::engine(engine)?;
        if status.is_null() {
            return Err(invalid("status is null"));
        }
        let Ok(ms) = u64::try_from(timeout_in_millis) else {
            return Err(invalid(format!(
                "timeout_in_millis {timeout_in_millis} is negative"
            )));
        };
        let r = e.wait_transfer(req as usize as u64, Duration::from_millis(ms));
        let s = match &r {
            Ok(s) => *s,
            Err(_) => compat::TransferStatus::Failed,
        };
        // SAFETY: checked not null; writable by the caller's contract.
        unsafe { put(status, s as i32, "status") }?;
        r.map(drop).map_err(fail)
    })
}
