//! HIXL-CS batches: PUT (a WRITE) and GET (a READ), sync and async; completion handles (at
//! most [`MAX_HANDLES`] unqueried); the latch a failed or timed-out batch sets.

use std::ffi::c_void;

use hixl_rs::compat::{self, TransferStatus};
use hixl_rs::{Status, TransferOp};

use super::client::ClientState;
use super::{
    HixlOneSideOpDesc, MAX_HANDLES, TIMEOUT, clients, cs_fail, failed, lock, lookup, millis,
    next_handle,
};
use crate::{R, entry, invalid, put};

impl ClientState {
    /// Latches the client on a failed or timed-out batch.
    fn after(&mut self, r: R<()>) -> R<()> {
        if let Err((code, _)) = &r
            && *code != Status::PARAM_INVALID.code()
            && *code != Status::RESOURCE_EXHAUSTED.code()
        {
            self.latched = true;
        }
        r
    }
}

/// # Safety
/// `desc_list` is null or `list_num` descriptors.
unsafe fn batch_descs<'a>(
    list_num: u32,
    desc_list: *const HixlOneSideOpDesc,
) -> R<&'a [HixlOneSideOpDesc]> {
    if list_num == 0 {
        return Err(invalid("list_num is 0"));
    }
    if desc_list.is_null() {
        return Err(invalid("desc_list is null"));
    }
    // SAFETY: the caller's contract.
    unsafe { crate::slice(desc_list, list_num as usize, "desc_list") }
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
        let descs = unsafe { batch_descs(list_num, desc_list) }?;
        let mut st = lock(&c.state);
        if st.latched {
            return Err(failed(
                "an earlier batch failed or timed out: destroy the client and create it again",
            ));
        }
        let descs = st.descs(descs)?;
        if st.handles.len() >= MAX_HANDLES {
            return Err((
                Status::RESOURCE_EXHAUSTED.code(),
                format!("{MAX_HANDLES} async batches are not yet reported COMPLETED or FAILED"),
            ));
        }
        let r = st
            .engine
            .transfer_async(&st.remote, op, &descs, compat::TransferArgs::default())
            .map_err(cs_fail);
        let req = match r {
            Ok(req) => req,
            Err(e) => return st.after(Err(e)),
        };
        let h = next_handle();
        st.handles.insert(h, req);
        // SAFETY: checked not null, writable by the caller's contract.
        unsafe {
            put(
                complete_handle,
                h as usize as *mut c_void,
                "complete_handle",
            )
        }
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
        let descs = unsafe { batch_descs(list_num, desc_list) }?;
        let mut st = lock(&c.state);
        if st.latched {
            return Err(failed(
                "an earlier batch failed or timed out: destroy the client and create it again",
            ));
        }
        let descs = st.descs(descs)?;
        if timeout_ms == 0 {
            return st.after(Err((TIMEOUT, "timeout_ms is 0".into())));
        }
        let r = st
            .engine
            .transfer_sync(&st.remote, op, &descs, millis(timeout_ms))
            .map_err(cs_fail);
        st.after(r)
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
        let mut st = lock(&c.state);
        let key = complete_handle as usize as u64;
        let Some(&req) = st.handles.get(&key) else {
            return Err(invalid(format!(
                "{complete_handle:p} is not a live completion handle of this client (never \
                 issued, or already reported COMPLETED or FAILED)"
            )));
        };
        let s = match st.engine.get_transfer_status(req) {
            Ok(TransferStatus::Waiting) => 0,
            Ok(TransferStatus::Completed) => 1,
            Ok(_) | Err(_) => 3,
        };
        if s != 0 {
            st.handles.remove(&key);
        }
        if s == 3 {
            st.latched = true;
        }
        // SAFETY: checked not null, writable by the caller's contract.
        unsafe { put(complete_status, s, "complete_status") }
    })
}
