//! The client's batches: `HixlCSClientBatch*` and `HixlCSClientQueryCompleteStatus` over
//! [`cs::Client`]'s.

use std::ffi::c_void;

use hixl_rs::{TransferOp, cs};

use super::{HixlOneSideOpDesc, clients, fail, handle, lookup, millis};
use crate::{R, entry, invalid, put};

/// The batch as the library's descriptors.
///
/// # Safety
/// `desc_list` is null or `list_num` descriptors.
unsafe fn descs(list_num: u32, desc_list: *const HixlOneSideOpDesc) -> R<Vec<cs::OpDesc>> {
    // SAFETY: the caller's contract (none is read when `list_num` is 0: the library refuses
    // an empty batch).
    let list = unsafe { crate::slice(desc_list, list_num as usize, "desc_list") }?;
    Ok(list
        .iter()
        .map(|d| cs::OpDesc {
            remote_addr: d.remote_buf as u64,
            local_addr: d.local_buf as usize,
            len: d.len,
        })
        .collect())
}

/// # Safety
/// As [`HixlCSClientBatchPutAsync`].
unsafe fn batch_async(
    client_handle: *mut c_void,
    op: TransferOp,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    complete_handle: *mut *mut c_void,
) -> u32 {
    entry(|| {
        let c = lookup(clients(), client_handle, "client")?;
        if complete_handle.is_null() {
            return Err(invalid("complete_handle is null"));
        }
        // SAFETY: the caller's contract.
        let descs = unsafe { descs(list_num, desc_list) }?;
        let h = c.client.batch_async(op, &descs).map_err(fail)?;
        // SAFETY: checked not null, writable by the caller's contract.
        unsafe { put(complete_handle, handle(h.into_raw()), "complete_handle") }
    })
}

/// # Safety
/// As [`HixlCSClientBatchPutSync`].
unsafe fn batch_sync(
    client_handle: *mut c_void,
    op: TransferOp,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    timeout_ms: u32,
) -> u32 {
    entry(|| {
        let c = lookup(clients(), client_handle, "client")?;
        // SAFETY: the caller's contract.
        let descs = unsafe { descs(list_num, desc_list) }?;
        (c.client)
            .batch_sync(op, &descs, millis(timeout_ms))
            .map_err(fail)
    })
}

/// Starts a batch PUT (client → server).
///
/// # Safety
/// `desc_list` is null or `list_num` descriptors; `complete_handle` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientBatchPutAsync(
    client_handle: *mut c_void,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    complete_handle: *mut *mut c_void,
) -> u32 {
    // SAFETY: the caller's contract.
    unsafe {
        batch_async(
            client_handle,
            TransferOp::Write,
            list_num,
            desc_list,
            complete_handle,
        )
    }
}

/// Starts a batch GET (server → client).
///
/// # Safety
/// As [`HixlCSClientBatchPutAsync`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientBatchGetAsync(
    client_handle: *mut c_void,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    complete_handle: *mut *mut c_void,
) -> u32 {
    // SAFETY: the caller's contract.
    unsafe {
        batch_async(
            client_handle,
            TransferOp::Read,
            list_num,
            desc_list,
            complete_handle,
        )
    }
}

/// A batch PUT, waited for.
///
/// # Safety
/// `desc_list` is null or `list_num` descriptors.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientBatchPutSync(
    client_handle: *mut c_void,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    timeout_ms: u32,
) -> u32 {
    // SAFETY: the caller's contract.
    unsafe {
        batch_sync(
            client_handle,
            TransferOp::Write,
            list_num,
            desc_list,
            timeout_ms,
        )
    }
}

/// A batch GET, waited for.
///
/// # Safety
/// As [`HixlCSClientBatchPutSync`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientBatchGetSync(
    client_handle: *mut c_void,
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
    timeout_ms: u32,
) -> u32 {
    // SAFETY: the caller's contract.
    unsafe {
        batch_sync(
            client_handle,
            TransferOp::Read,
            list_num,
            desc_list,
            timeout_ms,
        )
    }
}

/// The state of an async batch; COMPLETED and FAILED free the handle.
///
/// # Safety
/// `complete_status` is null or writable; any handle value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn HixlCSClientQueryCompleteStatus(
    client_handle: *mut c_void,
    complete_handle: *mut c_void,
    complete_status: *mut i32,
) -> u32 {
    entry(|| {
        let c = lookup(clients(), client_handle, "client")?;
        if complete_status.is_null() {
            return Err(invalid("complete_status is null"));
        }
        let s = (c.client)
            .query(cs::Completion::from_raw(complete_handle as u64))
            .map_err(fail)?;
        // SAFETY: checked not null, writable by the caller's contract.
        unsafe { put(complete_status, s as i32, "complete_status") }
    })
}
