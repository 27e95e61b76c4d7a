//! `libhixl.so`: hixl's C ABI, declared in `include/hixl_c.h` (written by hand), over the
//! runtime-checked engine [`hixl_rs::compat::Hixl`]. `include/hixl/hixl.h` is a header-only
//! C++ API in HIXL's shape over these functions.
//!
//! Every entry point:
//! - runs under `catch_unwind`: a panic becomes `FAILED` and never crosses the boundary;
//! - checks its pointers before reading them (null → `PARAM_INVALID`), its strings (not UTF-8
//!   → `PARAM_INVALID`), its enum values and lengths (a count whose byte size overflows →
//!   `PARAM_INVALID`);
//! - looks engine handles up in a registry before use, so a handle that was never created or
//!   was destroyed gives `PARAM_INVALID`, never a dereference;
//! - leaves a human-readable cause in a thread-local buffer on failure
//!   ([`hixl_last_error_message`]).
//!
//! What cannot be checked is the caller's duty, as in HIXL: pointers that are not null point
//! to what the header says (arrays of `count` elements, NUL-terminated strings), and memory
//! registered with [`hixl_register_mem`] stays valid until it is deregistered or the engine is
//! finalized (the `# Safety` contract of [`hixl_rs::compat::Hixl::register_mem`]). Memory from
//! [`hixl_alloc_host_mem`] is the engine's: nothing is asked of the caller but to stop using it
//! once it is deregistered or the engine finalized.
//!
//! LLM-DataDist's C ABI (`hixl_dd_*`, `include/hixl_dd.h`) is the module [`datadist`], under the
//! same rules with LLM-DataDist's status codes.

#![deny(unsafe_op_in_unsafe_fn, missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};

use hixl_rs::compat::{self, Hixl};
use hixl_rs::{AsyncConnectStatus, MemType, Status, TransferOp};

mod acl_errmsg;
#[cfg(hixl_cxx)]
pub mod cann_abi;
pub mod cs;
pub mod datadist;
pub mod requests;

/// A status code (HIXL's values: 0 success, 103900 `PARAM_INVALID`, ...).
pub type HixlStatus = u32;

const SUCCESS: HixlStatus = 0;
const PARAM_INVALID: HixlStatus = 103_900;
const FAILED: HixlStatus = 503_900;

/// An engine handle (`hixl_engine *`): opaque to C. Its value is a key in the registry, never
/// dereferenced, and never reused in a process (a destroyed handle stays unknown).
pub struct HixlEngine {
    _private: [u8; 0],
}

/// The next handle value of every kind (engines, HIXL-CS clients and servers, LLM-DataDist
/// instances: one counter, so a handle of one kind is never a live handle of another; distinct
/// from null, and spaced like pointers for debuggers' sake).
static NEXT_HANDLE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0x1000);

/// A list of results (`hixl_list *`): notifications or async connect statuses.
pub enum HixlList {
    /// `(name, message)` pairs.
    Notifies(Vec<(CString, CString)>),
    /// `(remote engine, AsyncConnectStatus)` pairs.
    Connects(Vec<(CString, i32)>),
}

/// `hixl_mem_desc`: HIXL's `MemDesc` layout (address, length, 128 reserved bytes).
#[repr(C)]
pub struct MemDesc {
    /// Start address.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// Reserved, ignored.
    pub reserved: [u8; 128],
}

/// [`hixl_register_mem_ex`] flag `HIXL_REGISTER_LOCAL_ONLY`: peers may neither READ nor WRITE
/// the region (it stays out of the table they get).
pub const REGISTER_LOCAL_ONLY: u32 = 0x1;
/// Every flag [`hixl_register_mem_ex`] knows.
const REGISTER_FLAGS: u32 = REGISTER_LOCAL_ONLY;

/// `hixl_transfer_args`: HIXL's `TransferArgs` layout.
#[repr(C)]
pub struct TransferArgs {
    /// Returned with the request's result.
    pub user_data: *const c_void,
    /// Reserved, ignored.
    pub reserved: [u8; 120],
}

/// `hixl_get_transfer_status_args`: HIXL's `GetTransferStatusArgs` layout.
#[repr(C)]
pub struct GetTransferStatusArgs {
    /// Most results.
    pub max_query_count: u32,
    /// Non-zero: leave out waiting requests (C `bool`, read as a byte).
    pub skip_waiting: u8,
    /// Reserved, ignored.
    pub reserved: [u8; 123],
}

/// `hixl_transfer_result`: HIXL's `TransferResult` layout.
#[repr(C)]
pub struct TransferResult {
    /// The request.
    pub req: *mut c_void,
    /// Its user data.
    pub user_data: *const c_void,
    /// `HIXL_TRANSFER_*` (HIXL's `TransferStatus` values).
    pub status: i32,
    /// Reserved, zeroed.
    pub reserved: [u8; 108],
}

// HIXL's layouts on LP64 (its hixl_types.h; include/hixl_c.h and include/hixl/hixl.h assert the
// same in C and C++): a struct that drifted from them fails the build here.
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::offset_of;
    assert!(size_of::<MemDesc>() == 144 && offset_of!(MemDesc, reserved) == 16);
    assert!(size_of::<compat::TransferOpDesc>() == 24);
    assert!(size_of::<TransferArgs>() == 128 && offset_of!(TransferArgs, reserved) == 8);
    assert!(size_of::<GetTransferStatusArgs>() == 128);
    assert!(offset_of!(GetTransferStatusArgs, skip_waiting) == 4);
    assert!(offset_of!(GetTransferStatusArgs, reserved) == 5);
    assert!(size_of::<TransferResult>() == 128 && offset_of!(TransferResult, status) == 16);
    assert!(offset_of!(TransferResult, reserved) == 20);
};

type Registry = Mutex<HashMap<usize, Arc<Hixl>>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    // also into ACL's error channel (`aclGetRecentErrMsg()`), when the process has CANN's
    acl_errmsg::report(&c);
    // (a call from a thread's destructors, after its thread-locals went, keeps no message:
    // `with` would panic outside `catch_unwind`)
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = c);
}

/// A failed call: the status and the message for `hixl_last_error_message`.
type Fail = (HixlStatus, String);
type R<T> = Result<T, Fail>;

fn invalid(msg: impl Into<String>) -> Fail {
    (PARAM_INVALID, msg.into())
}

fn fail(e: compat::Error) -> Fail {
    (e.status().code(), e.message().to_owned())
}

/// The code of an engine that could not read its device when it started: HIXL returns ACL's
/// own error there (`HIXL_CHK_ACL_RET` / `ADXL_CHK_ACL_RET` on `aclrtGetDevice`: 107002
/// `ACL_ERROR_RT_CONTEXT_NULL` on a thread with no device); any other failure as [`fail`].
pub(crate) fn start_fail(e: compat::Error) -> Fail {
    match e.acl_start_code() {
        Some(code) => (code, e.message().to_owned()),
        None => fail(e),
    }
}

fn c(r: compat::Result<()>) -> R<()> {
    r.map_err(fail)
}

/// Runs an entry point: a panic becomes `FAILED`, a failure leaves its message.
fn entry(f: impl FnOnce() -> R<()>) -> HixlStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err((status, msg))) => {
            set_error(&msg);
            status
        }
        Err(_) => {
            set_error("internal error: a panic was caught at the C boundary");
            FAILED
        }
    }
}

fn engine(h: *mut HixlEngine) -> R<Arc<Hixl>> {
    registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(h as usize))
        .cloned()
        .ok_or_else(|| invalid(format!("{h:p} is not a live hixl engine handle")))
}

/// # Safety
/// `s` is null or a NUL-terminated string that lives for `'a`.
unsafe fn string<'a>(s: *const c_char, what: &str) -> R<&'a str> {
    if s.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    // SAFETY: not null, and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| invalid(format!("{what} is not UTF-8")))
}

/// # Safety
/// `p` is null or points to `count` readable `T`s that live for `'a`.
unsafe fn slice<'a, T>(p: *const T, count: usize, what: &str) -> R<&'a [T]> {
    if count == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    if count
        .checked_mul(size_of::<T>())
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(invalid(format!("{what}: {count} elements overflow")));
    }
    if !(p as usize).is_multiple_of(align_of::<T>()) {
        return Err(invalid(format!("{what} is misaligned")));
    }
    // SAFETY: not null, aligned, the byte size fits in isize, and `count` elements are
    // readable by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, count) })
}

/// # Safety
/// `p` is null or valid for writing a `T`.
unsafe fn put<T>(p: *mut T, v: T, what: &str) -> R<()> {
    if p.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    // SAFETY: not null and writable by the caller's contract (`write_unaligned`: no alignment
    // assumed).
    unsafe { p.write_unaligned(v) };
    Ok(())
}

fn op(v: i32) -> R<TransferOp> {
    match v {
        0 => Ok(TransferOp::Read),
        1 => Ok(TransferOp::Write),
        _ => Err(invalid(format!(
            "{v} is not a TransferOp (0 READ, 1 WRITE)"
        ))),
    }
}

fn connect_status(s: AsyncConnectStatus) -> i32 {
    match s {
        AsyncConnectStatus::NotConnect => 0,
        AsyncConnectStatus::ConnectPending => 1,
        AsyncConnectStatus::Connecting => 2,
        AsyncConnectStatus::Connected => 3,
        AsyncConnectStatus::ConnectFailed => 4,
        AsyncConnectStatus::DisconnectPending => 5,
        AsyncConnectStatus::Disconnecting => 6,
    }
}

/// Creates an engine (not initialized yet) and stores its handle in `*out`.
///
/// # Safety
/// `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_create(out: *mut *mut HixlEngine) -> HixlStatus {
    entry(|| {
        if out.is_null() {
            return Err(invalid("out is null"));
        }
        let key = NEXT_HANDLE.fetch_add(16, std::sync::atomic::Ordering::Relaxed);
        registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, Arc::new(Hixl::new()));
        let key = key as *mut HixlEngine;
        // SAFETY: checked not null; writable by the caller's contract.
        unsafe { put(out, key, "out") }
    })
}

/// Finalizes (if needed) and destroys an engine; the handle is invalid afterwards. A null or
/// unknown handle is ignored.
///
/// # Safety
/// Any pointer value is accepted (it is looked up, not dereferenced).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_destroy(engine: *mut HixlEngine) {
    entry(|| {
        let e = registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(engine as usize));
        if let Some(e) = e {
            // other threads still inside a call hold their own reference; the engine is
            // finalized now and freed with the last one
            e.finalize();
        }
        Ok(())
    });
}

/// HIXL `Initialize`: `local_engine` (`"ip"`, `"ip:port"`, port 0 for an ephemeral port) and
/// `count` option pairs.
///
/// # Safety
/// `local_engine` is a NUL-terminated string; `keys` and `values` are null (with `count` 0) or
/// arrays of `count` NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_initialize(
    engine: *mut HixlEngine,
    local_engine: *const c_char,
    keys: *const *const c_char,
    values: *const *const c_char,
    count: usize,
) -> HixlStatus {
    entry(|| {
        let e = self::engine(engine)?;
        // SAFETY: the caller's contract.
        let name = unsafe { string(local_engine, "local_engine") }?;
        // SAFETY: the caller's contract.
        let (ks, vs) = unsafe { (slice(keys, count, "keys")?, slice(values, count, "values")?) };
        let mut opts = Vec::with_capacity(count);
        for (k, v) in ks.iter().zip(vs) {
            // SAFETY: the caller's contract: each element is a NUL-terminated string.
            opts.push(unsafe { (string(*k, "option key")?, string(*v, "option value")?) });
        }
        e.initialize(name, opts).map_err(start_fail)
    })
}

/// The engine's name as peers reach it (with the port it got for port 0), NUL-terminated in
/// `buf` (`cap` bytes). `*len` gets the name's length without the NUL; `RESOURCE_EXHAUSTED`
/// if `cap` is too small (then `*len` says how much is needed).
///
/// # Safety
/// `buf` is null (with `cap` 0) or writable for `cap` bytes; `len` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_local_engine(
    engine: *mut HixlEngine,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> HixlStatus {
    entry(|| {
        let e = self::engine(engine)?;
        if buf.is_null() && cap > 0 {
            // (a size query passes NULL and 0)
            return Err(invalid(format!("buf is null with cap {cap}")));
        }
        let name = e.local_engine().map_err(fail)?;
        if !len.is_null() {
            // SAFETY: not null; writable by the caller's contract.
            unsafe { put(len, name.len(), "len") }?;
        }
        if cap <= name.len() || buf.is_null() {
            return Err((
                Status::RESOURCE_EXHAUSTED.code(),
                format!("the name needs {} bytes", name.len() + 1),
            ));
        }
        // SAFETY: `buf` is writable for `cap > name.len()` bytes by the caller's contract.
        unsafe {
            std::ptr::copy_nonoverlapping(name.as_ptr(), buf.cast::<u8>(), name.len());
            buf.add(name.len()).write(0);
        }
        Ok(())
    })
}

/// HIXL `Finalize`: idempotent.
///
/// # Safety
/// Any pointer value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_finalize(engine: *mut HixlEngine) -> HixlStatus {
    entry(|| {
        self::engine(engine)?.finalize();
        Ok(())
    })
}

/// HIXL `RegisterMem`; `*handle` gets a non-null handle. [`hixl_register_mem_ex`] with no
/// flags.
///
/// # Safety
/// As [`hixl_register_mem_ex`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_register_mem(
    engine: *mut HixlEngine,
    mem: *const MemDesc,
    mem_type: i32,
    handle: *mut *mut c_void,
) -> HixlStatus {
    // SAFETY: the caller's contract is `hixl_register_mem_ex`'s.
    unsafe { hixl_register_mem_ex(engine, mem, mem_type, 0, handle) }
}

/// hixl's extension of `RegisterMem` (HIXL has none): `flags` is an OR of `HIXL_REGISTER_*`
/// bits ([`REGISTER_LOCAL_ONLY`]: peers get no access); an unknown bit is `PARAM_INVALID`.
/// `*handle` gets a non-null handle.
///
/// # Safety
/// `mem` is null or readable; `handle` is null or writable. The registered range must stay
/// allocated and valid for reads and writes until deregistered or the engine finalized, and
/// nothing else may access it in a way that conflicts with transfers (peers READ and WRITE it
/// at any time unless it is local-only; this engine's READs write it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_register_mem_ex(
    engine: *mut HixlEngine,
    mem: *const MemDesc,
    mem_type: i32,
    flags: u32,
    handle: *mut *mut c_void,
) -> HixlStatus {
    entry(|| {
        let e = self::engine(engine)?;
        if mem.is_null() || handle.is_null() {
            return Err(invalid("mem or handle is null"));
        }
        if flags & !REGISTER_FLAGS != 0 {
            return Err(invalid(format!(
                "unknown registration flags {:#x} (known: HIXL_REGISTER_LOCAL_ONLY {REGISTER_LOCAL_ONLY:#x})",
                flags & !REGISTER_FLAGS
            )));
        }
        // SAFETY: not null; readable by the caller's contract (no alignment assumed).
        let m = unsafe { mem.read_unaligned() };
        let t = match mem_type {
            0 => MemType::Device,
            1 => MemType::Host,
            v => return Err(invalid(format!("{v} is not a MemType (0 DEVICE, 1 HOST)"))),
        };
        let desc = compat::MemDesc {
            addr: m.addr,
            len: m.len,
            local_only: flags & REGISTER_LOCAL_ONLY != 0,
        };
        // SAFETY: the caller's contract is `register_mem`'s (this function's `# Safety`).
        let h = unsafe { e.register_mem(desc, t) }.map_err(fail)?;
        // SAFETY: checked not null; writable by the caller's contract.
        unsafe { put(handle, h as usize as *mut c_void, "handle") }
    })
}

/// hixl's extension (HIXL has none): allocates `size` zeroed bytes of page-aligned host memory
/// owned by the engine and registers them (peers may READ and WRITE them); `*addr` gets the
/// address, `*handle` a non-null handle. Same-host peers map this memory and move data with a
/// memory copy (caller-managed memory is served to them over TCP). [`hixl_deregister_mem`]
/// (or `hixl_finalize` / `hixl_destroy`) ends the registration; the memory is then freed by the
/// engine once no same-host peer may still touch it, and must not be used by the caller any
/// more. Size 0 or a null `addr`/`handle`: `PARAM_INVALID` (nothing is allocated); a size that
/// cannot be allocated: `RESOURCE_EXHAUSTED`.
///
/// # Safety
/// `addr` and `handle` are null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_alloc_host_mem(
    engine: *mut HixlEngine,
    size: usize,
    addr: *mut *mut c_void,
    handle: *mut *mut c_void,
) -> HixlStatus {
    entry(|| {
        let e = self::engine(engine)?;
        // checked before anything is allocated: a buffer the caller could not name would stay
        // registered until finalize
        if addr.is_null() || handle.is_null() {
            return Err(invalid("addr or handle is null"));
        }
        // the keep-alive goes: the memory lives as long as its registration (and its peers)
        let mem = e.alloc_host_mem(size).map_err(fail)?;
        // SAFETY: checked not null; writable by the caller's contract.
        unsafe { put(addr, mem.as_ptr().cast::<c_void>(), "addr") }?;
        // SAFETY: as above.
        unsafe { put(handle, mem.handle() as usize as *mut c_void, "handle") }
    })
}

/// HIXL `DeregisterMem` (of caller-managed memory, or of a buffer of [`hixl_alloc_host_mem`]).
///
/// # Safety
/// Any handle value is accepted (it is looked up).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_deregister_mem(
    engine: *mut HixlEngine,
    handle: *mut c_void,
) -> HixlStatus {
    entry(|| c(self::engine(engine)?.deregister_mem(handle as usize as u64)))
}

macro_rules! by_remote {
    ($(#[$doc:meta])* $name:ident => $method:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `remote` is null or a NUL-terminated string.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            engine: *mut HixlEngine,
            remote: *const c_char,
            timeout_in_millis: i32,
        ) -> HixlStatus {
            entry(|| {
                let e = self::engine(engine)?;
                // SAFETY: the caller's contract.
                let remote = unsafe { string(remote, "remote_engine") }?;
                c(e.$method(remote, timeout_in_millis))
            })
        }
    };
}

by_remote!(
    /// HIXL `Connect`.
    hixl_connect => connect
);
by_remote!(
    /// HIXL `Disconnect`.
    hixl_disconnect => disconnect
);
by_remote!(
    /// HIXL `ConnectAsync`.
    hixl_connect_async => connect_async
);
by_remote!(
    /// HIXL `DisconnectAsync`.
    hixl_disconnect_async => disconnect_async
);

/// HIXL `GetAsyncConnectStatus` for one remote (`*status`: `HIXL_NOT_CONNECT` ...).
///
/// # Safety
/// `remote` is null or a NUL-terminated string; `status` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_get_async_connect_status(
    engine: *mut HixlEngine,
    remote: *const c_char,
    status: *mut i32,
) -> HixlStatus {
    entry(|| {
        let e = self::engine(engine)?;
        // SAFETY: the caller's contract.
        let remote = unsafe { string(remote, "remote_engine") }?;
        if status.is_null() {
            return Err(invalid("status is null"));
        }
        let s = e.get_async_connect_status(remote).map_err(fail)?;
        // SAFETY: checked not null; writable by the caller's contract.
        unsafe { put(status, connect_status(s), "status") }
    })
}

/// Builds a list from the engine and hands it to the caller through `out`.
fn list_out(
    engine: *mut HixlEngine,
    out: *mut *mut HixlList,
    make: impl FnOnce(&Hixl) -> compat::Result<HixlList>,
) -> R<()> {
    let e = self::engine(engine)?;
    if out.is_null() {
        return Err(invalid("out is null"));
    }
    let list = Box::into_raw(Box::new(make(&e).map_err(fail)?));
    // SAFETY: checked not null; writable by the caller's contract (`*out` is the caller's).
    unsafe { out.write_unaligned(list) };
    Ok(())
}

/// A Rust string for C (an interior NUL, which names and messages cannot carry through C
/// anyway, gives an empty string).
fn cstring(s: String) -> CString {
    CString::new(s).unwrap_or_default()
}

/// HIXL `GetAsyncConnectStatus` for every remote: a list (read it with
/// [`hixl_list_connect_status`], free it with [`hixl_list_free`]).
///
/// # Safety
/// `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_get_all_async_connect_status(
    engine: *mut HixlEngine,
    out: *mut *mut HixlList,
) -> HixlStatus {
    entry(|| {
        list_out(engine, out, |e| {
            let all = e.get_all_async_connect_status()?;
            Ok(HixlList::Connects(
                all.into_iter()
                    .map(|(k, s)| (cstring(k), connect_status(s)))
                    .collect(),
            ))
        })
    })
}

/// # Safety
/// As for `hixl_transfer_sync`.
unsafe fn batch<'a>(
    remote: *const c_char,
    operation: i32,
    descs: *const compat::TransferOpDesc,
    count: usize,
) -> R<(&'a str, TransferOp, &'a [compat::TransferOpDesc])> {
    // SAFETY: the caller's contract.
    let remote = unsafe { string(remote, "remote_engine") }?;
    // SAFETY: the caller's contract.
    let descs = unsafe { slice(descs, count, "op_descs") }?;
    Ok((remote, op(operation)?, descs))
}

/// HIXL `TransferSync`: `count` descriptors, READ (0) or WRITE (1).
///
/// # Safety
/// `remote` is null or a NUL-terminated string; `descs` is null (with `count` 0) or an array
/// of `count` descriptors. The addresses themselves are validated against the registered
/// regions (local) and the peer's table (remote).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_transfer_sync(
    engine: *mut HixlEngine,
    remote: *const c_char,
    operation: i32,
    descs: *const compat::TransferOpDesc,
    count: usize,
    timeout_in_millis: i32,
) -> HixlStatus {
    entry(|| {
        let e = self::engine(engine)?;
        // SAFETY: the caller's contract.
        let (remote, op, descs) = unsafe { batch(remote, operation, descs, count) }?;
        c(e.transfer_sync(remote, op, descs, timeout_in_millis))
    })
}

/// HIXL `TransferAsync`; `*req` gets a non-null request handle. `args` may be null.
///
/// # Safety
/// As [`hixl_transfer_sync`]; `args` is null or readable; `req` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_transfer_async(
    engine: *mut HixlEngine,
    remote: *const c_char,
    operation: i32,
    descs: *const compat::TransferOpDesc,
    count: usize,
    args: *const TransferArgs,
    req: *mut *mut c_void,
) -> HixlStatus {
    // SAFETY: the caller's contract, forwarded.
    unsafe { start_async(engine, remote, operation, descs, count, args, None, req) }
}

/// [`hixl_transfer_async`], and with `Some(timeout)` `hixl_transfer_async_within`
/// ([`requests`]): starts the batch, its id in `*req`.
///
/// # Safety
/// As [`hixl_transfer_async`].
#[allow(clippy::too_many_arguments)]
unsafe fn start_async(
    engine: *mut HixlEngine,
    remote: *const c_char,
    operation: i32,
    descs: *const compat::TransferOpDesc,
    count: usize,
    args: *const TransferArgs,
    timeout_in_millis: Option<i32>,
    req: *mut *mut c_void,
) -> HixlStatus {
    entry(|| {
        let e = self::engine(engine)?;
        if req.is_null() {
            return Err(invalid("req is null"));
        }
        // SAFETY: the caller's contract.
        let (remote, op, descs) = unsafe { batch(remote, operation, descs, count) }?;
        let user_data = if args.is_null() {
            0
        } else {
            // SAFETY: not null; readable by the caller's contract.
            unsafe { args.read_unaligned() }.user_data as usize as u64
        };
        let args = compat::TransferArgs { user_data };
        let id = match timeout_in_millis {
            None => e.transfer_async(remote, op, descs, args),
            Some(t) => e.transfer_async_within(remote, op, descs, args, t),
        }
        .map_err(fail)?;
        // SAFETY: checked not null; writable by the caller's contract.
        unsafe { put(req, id as usize as *mut c_void, "req") }
    })
}

/// HIXL `GetTransferStatus` for one request (`*status`: `HIXL_TRANSFER_*`). An unknown (or
/// already reported) request gives `FAILED` and `HIXL_TRANSFER_FAILED`.
///
/// # Safety
/// `status` is null or writable; any `req` value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_get_transfer_status(
    engine: *mut HixlEngine,
    req: *mut c_void,
    status: *mut i32,
) -> HixlStatus {
    entry(|| {
        let e = self::engine(engine)?;
        if status.is_null() {
            return Err(invalid("status is null"));
        }
        let r = e.get_transfer_status(req as usize as u64);
        let s = match &r {
            Ok(s) => *s,
            Err(_) => compat::TransferStatus::Failed,
        };
        // SAFETY: checked not null; writable by the caller's contract.
        unsafe { put(status, s as i32, "status") }?;
        r.map(drop).map_err(fail)
    })
}

/// HIXL's many-request `GetTransferStatus`: writes up to `min(args.max_query_count,
/// capacity)` results to `results` and their number to `*count`. `args` may be null
/// (defaults). [`hixl_pending_transfers`] says how many requests could be reported.
///
/// # Safety
/// `results` is null (with `capacity` 0) or writable for `capacity` results; `count` is null
/// or writable; `args` is null or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_get_transfer_statuses(
    engine: *mut HixlEngine,
    args: *const GetTransferStatusArgs,
    results: *mut TransferResult,
    capacity: usize,
    count: *mut usize,
) -> HixlStatus {
    entry(|| {
        let e = self::engine(engine)?;
        if count.is_null() || (results.is_null() && capacity > 0) {
            return Err(invalid("results or count is null"));
        }
        let mut a = compat::GetTransferStatusArgs::default();
        if !args.is_null() {
            // SAFETY: not null; readable by the caller's contract.
            let given = unsafe { args.read_unaligned() };
            a.max_query_count = given.max_query_count;
            a.skip_waiting = given.skip_waiting != 0;
        }
        a.max_query_count = a
            .max_query_count
            .min(u32::try_from(capacity).unwrap_or(u32::MAX));
        let got = e.get_transfer_statuses(a).map_err(fail)?;
        for (i, r) in got.iter().enumerate() {
            let out = TransferResult {
                req: r.req as usize as *mut c_void,
                user_data: r.user_data as usize as *const c_void,
                status: r.status as i32,
                reserved: [0; 108],
            };
            // SAFETY: `i < got.len() <= capacity`, so in bounds of the caller's array.
            unsafe { results.add(i).write_unaligned(out) };
        }
        // SAFETY: checked not null; writable by the caller's contract.
        unsafe { put(count, got.len(), "count") }
    })
}

/// How many async requests have not been reported terminal yet (an upper bound for the next
/// [`hixl_get_transfer_statuses`]).
///
/// # Safety
/// `count` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_pending_transfers(
    engine: *mut HixlEngine,
    count: *mut usize,
) -> HixlStatus {
    entry(|| {
        let e = self::engine(engine)?;
        // SAFETY: the caller's contract.
        unsafe { put(count, e.pending_transfers(), "count") }
    })
}

/// HIXL `SendNotify`.
///
/// # Safety
/// `remote`, `name` and `msg` are null or NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_send_notify(
    engine: *mut HixlEngine,
    remote: *const c_char,
    name: *const c_char,
    msg: *const c_char,
    timeout_in_millis: i32,
) -> HixlStatus {
    entry(|| {
        let e = self::engine(engine)?;
        // SAFETY: the caller's contract.
        let (remote, name, msg) = unsafe {
            (
                string(remote, "remote_engine")?,
                string(name, "name")?,
                string(msg, "notify_msg")?,
            )
        };
        let n = compat::NotifyDesc {
            name: name.to_owned(),
            notify_msg: msg.to_owned(),
        };
        c(e.send_notify(remote, &n, timeout_in_millis))
    })
}

/// HIXL `GetNotifies`: a list (read it with [`hixl_list_notify`], free it with
/// [`hixl_list_free`]).
///
/// # Safety
/// `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_get_notifies(
    engine: *mut HixlEngine,
    out: *mut *mut HixlList,
) -> HixlStatus {
    entry(|| {
        list_out(engine, out, |e| {
            let got = e.get_notifies()?;
            Ok(HixlList::Notifies(
                got.into_iter()
                    .map(|n| (cstring(n.name), cstring(n.notify_msg)))
                    .collect(),
            ))
        })
    })
}

/// The number of entries in a list (0 for null).
///
/// # Safety
/// `list` is null or a list from this library not yet freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_list_len(list: *const HixlList) -> usize {
    // SAFETY: null or a live list, by the caller's contract.
    unsafe { list.as_ref() }.map_or(0, list_len)
}

/// The length of a live list (or 0), without going through the exported entry point.
fn list_len(l: &HixlList) -> usize {
    match l {
        HixlList::Notifies(v) => v.len(),
        HixlList::Connects(v) => v.len(),
    }
}

/// # Safety
/// `list` is null or a live list.
unsafe fn entry_of<'a>(list: *const HixlList, index: usize) -> R<&'a HixlList> {
    // SAFETY: null or a live list, by the caller's contract.
    let l = unsafe { list.as_ref() }.ok_or_else(|| invalid("list is null"))?;
    if index >= list_len(l) {
        return Err(invalid(format!("index {index} is out of range")));
    }
    Ok(l)
}

/// Entry `index` of a notification list: `*name` and `*msg` point into the list (valid until
/// it is freed).
///
/// # Safety
/// `list` is null or a live list; `name` and `msg` are null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_list_notify(
    list: *const HixlList,
    index: usize,
    name: *mut *const c_char,
    msg: *mut *const c_char,
) -> HixlStatus {
    entry(|| {
        // SAFETY: the caller's contract.
        match unsafe { entry_of(list, index) }? {
            HixlList::Notifies(v) => {
                let (n, m) = &v[index];
                // SAFETY: the caller's contract.
                unsafe {
                    put(name, n.as_ptr(), "name")?;
                    put(msg, m.as_ptr(), "msg")
                }
            }
            HixlList::Connects(_) => Err(invalid("not a notification list")),
        }
    })
}

/// Entry `index` of an async connect status list: `*remote` points into the list (valid until
/// it is freed), `*status` is an `HIXL_*` async connect status.
///
/// # Safety
/// `list` is null or a live list; `remote` and `status` are null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_list_connect_status(
    list: *const HixlList,
    index: usize,
    remote: *mut *const c_char,
    status: *mut i32,
) -> HixlStatus {
    entry(|| {
        // SAFETY: the caller's contract.
        match unsafe { entry_of(list, index) }? {
            HixlList::Connects(v) => {
                let (r, s) = &v[index];
                // SAFETY: the caller's contract.
                unsafe {
                    put(remote, r.as_ptr(), "remote")?;
                    put(status, *s, "status")
                }
            }
            HixlList::Notifies(_) => Err(invalid("not an async connect status list")),
        }
    })
}

/// Frees a list (null is ignored).
///
/// # Safety
/// `list` is null or a list from this library, not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_list_free(list: *mut HixlList) {
    entry(|| {
        if !list.is_null() {
            // SAFETY: made by `Box::into_raw` here and freed once, by the caller's contract.
            drop(unsafe { Box::from_raw(list) });
        }
        Ok(())
    });
}

/// HIXL `GetCapability`: `*value` is 1 (supported) or 0 (not supported, also for an unknown
/// feature); `PARAM_INVALID` for a negative feature (`*value` untouched).
///
/// # Safety
/// `value` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_get_capability(feature: i32, value: *mut i32) -> HixlStatus {
    entry(|| {
        let v = compat::capability_of(feature).map_err(fail)?;
        // SAFETY: the caller's contract.
        unsafe { put(value, v, "value") }
    })
}

/// The cause of the last failed call on this thread (an empty string if none failed yet);
/// valid until the next failing call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn hixl_last_error_message() -> *const c_char {
    LAST_ERROR
        .try_with(|e| e.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// Fabric memory's allocator statics (HIXL's `MallocMem`, `FreeMem`, `ExportToShareableHandle`;
/// `hixl::fabric`): a failure of the Rust API as this ABI reports it.
fn fabric_fail(e: hixl_rs::Error) -> Fail {
    (e.status().code(), e.to_string())
}

/// HIXL `MallocMem(type, size, &ptr)`: `size` bytes (rounded up to 2 MiB) of ACL virtual
/// memory on the calling thread's device (`type` 0: device memory, 1: host memory the device
/// may access), for an engine with `EnableUseFabricMem=1`. `UNSUPPORTED` without an ACL runtime
/// that has the VMM calls; `PARAM_INVALID` for a zero size or a null `ptr`.
///
/// # Safety
/// `ptr` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_malloc_mem(
    mem_type: i32,
    size: usize,
    ptr: *mut *mut c_void,
) -> HixlStatus {
    entry(|| {
        if ptr.is_null() {
            return Err(invalid("ptr is null"));
        }
        let t = match mem_type {
            0 => MemType::Device,
            1 => MemType::Host,
            v => return Err(invalid(format!("mem_type {v} (0: device, 1: host)"))),
        };
        let addr = hixl_rs::fabric::malloc_mem(t, size).map_err(fabric_fail)?;
        // SAFETY: not null and writable by the caller's contract.
        unsafe { put(ptr, addr as *mut c_void, "ptr") }
    })
}

/// HIXL `FreeMem(ptr)`: frees a [`hixl_malloc_mem`] allocation (`PARAM_INVALID` for any other
/// address, or one freed already).
///
/// # Safety
/// Nothing else uses the memory any more (no engine has it registered).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_free_mem(ptr: *mut c_void) -> HixlStatus {
    entry(|| hixl_rs::fabric::free_mem(ptr as usize).map_err(fabric_fail))
}

/// HIXL `ExportToShareableHandle(addr, handle)`: the 128-byte fabric shareable handle
/// (`aclrtMemFabricHandle`) of a [`hixl_malloc_mem`] allocation, exported once and then the
/// cached one; `PARAM_INVALID` for any other address.
///
/// # Safety
/// `handle` is null or 128 writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hixl_export_to_shareable_handle(
    addr: *mut c_void,
    handle: *mut u8,
) -> HixlStatus {
    entry(|| {
        if handle.is_null() {
            return Err(invalid("handle is null"));
        }
        let h = hixl_rs::fabric::export_to_shareable_handle(addr as usize).map_err(fabric_fail)?;
        // SAFETY: 128 writable bytes by the caller's contract; `h` is 128 bytes.
        unsafe { std::ptr::copy_nonoverlapping(h.as_ptr(), handle, h.len()) };
        Ok(())
    })
}

// ---- block-indexed transfers (an extension of HIXL, issue 35) ----

/// `hixl_block_desc`: the geometry of a block-indexed transfer ([`compat::BlockDesc`]).
pub type BlockDesc = compat::BlockDesc;

#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::offset_of;
    assert!(size_of::<BlockDesc>() == 40 && offset_of!(BlockDesc, block_size) == 16);
    assert!(offset_of!(BlockDesc, remote_stride) == 32);
};

/// `HIXL_INDEX_U32`: index arrays of `uint32_t`.
pub const INDEX_U32: i32 = 4;
/// `HIXL_INDEX_U64`: index arrays of `uint64_t`.
pub const INDEX_U64: i32 = 8;

/// The arguments of a block transfer, checked.
///
/// # Safety
/// As for [`hixl_transfer_blocks_sync`].
#[allow(clippy::type_complexity)]
unsafe fn blocks_args<'a>(
    remote: *const c_char,
    operation: i32,
    desc: *const BlockDesc,
    local_idx: *const c_void,
    remote_idx: *const c_void,
    count: usize,
    index_width: i32,
) -> R<(
    &'a str,
    TransferOp,
    BlockDesc,
    hixl_rs::BlockIndices<'a>,
    hixl_rs::BlockIndices<'a>,
)> {
    // SAFETY: the caller's contract.
    let remote = unsafe { string(remote, "remote_engine") }?;
    if desc.is_null() {
        return Err(invalid("desc is null"));
    }
    // SAFETY: not null; readable by the caller's contract (no alignment assumed).
    let d = unsafe { desc.read_unaligned() };
    let (l, r) = match index_width {
        INDEX_U32 => (
            // SAFETY: the caller's contract: `count` uint32_t's.
            hixl_rs::BlockIndices::U32(unsafe {
                slice(local_idx.cast::<u32>(), count, "local_idx")
            }?),
            // SAFETY: as above.
            hixl_rs::BlockIndices::U32(unsafe {
                slice(remote_idx.cast::<u32>(), count, "remote_idx")
            }?),
        ),
        INDEX_U64 => (
            // SAFETY: the caller's contract: `count` uint64_t's.
            hixl_rs::BlockIndices::U64(unsafe {
                slice(local_idx.cast::<u64>(), count, "local_idx")
            }?),
            // SAFETY: as above.
            hixl_rs::BlockIndices::U64(unsafe {
                slice(remote_idx.cast::<u64>(), count, "remote_idx")
            }?),
        ),
        w => {
            return Err(invalid(format!(
                "index_width {w} is neither HIXL_INDEX_U32 (4) nor HIXL_INDEX_U64 (8)"
            )));
        }
    };
    Ok((remote, op(operation)?, d, l, r))
}

/// Block-indexed READ (0) or WRITE (1), an extension of HIXL: block `i` (`desc->block_size`
/// bytes) moves between `desc->local_addr + local_idx[i] * local_stride` and
/// `desc->remote_addr + remote_idx[i] * remote_stride` (a stride of 0: the block size). The
/// index arrays hold `count` elements of `index_width` bytes (`HIXL_INDEX_U32` or
/// `HIXL_INDEX_U64`). Checked once per call (each side's largest index against its region),
/// never per block.
///
/// # Safety
/// `remote` is null or a NUL-terminated string; `desc` is null or readable; `local_idx` and
/// `remote_idx` are null (with `count` 0) or aligned arrays of `count` indices of
/// `index_width` bytes. The addresses themselves are validated.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hixl_transfer_blocks_sync(
    engine: *mut HixlEngine,
    remote: *const c_char,
    operation: i32,
    desc: *const BlockDesc,
    local_idx: *const c_void,
    remote_idx: *const c_void,
    count: usize,
    index_width: i32,
    timeout_in_millis: i32,
) -> HixlStatus {
    entry(|| {
        let e = self::engine(engine)?;
        // SAFETY: the caller's contract.
        let (remote, op, d, l, r) = unsafe {
            blocks_args(
                remote,
                operation,
                desc,
                local_idx,
                remote_idx,
                count,
                index_width,
            )
        }?;
        c(e.transfer_blocks_sync(remote, op, &d, l, r, timeout_in_millis))
    })
}

/// [`hixl_transfer_blocks_sync`] as an async request (`*req`, polled with
/// `hixl_get_transfer_status`); the indices are copied, so the arrays may go once this
/// returns. `args` may be null.
///
/// # Safety
/// As [`hixl_transfer_blocks_sync`]; `args` is null or readable; `req` is null or writable.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hixl_transfer_blocks_async(
    engine: *mut HixlEngine,
    remote: *const c_char,
    operation: i32,
    desc: *const BlockDesc,
    local_idx: *const c_void,
    remote_idx: *const c_void,
    count: usize,
    index_width: i32,
    args: *const TransferArgs,
    req: *mut *mut c_void,
) -> HixlStatus {
    entry(|| {
        let e = self::engine(engine)?;
        if req.is_null() {
            return Err(invalid("req is null"));
        }
        // SAFETY: the caller's contract.
        let (remote, op, d, l, r) = unsafe {
            blocks_args(
                remote,
                operation,
                desc,
                local_idx,
                remote_idx,
                count,
                index_width,
            )
        }?;
        let user_data = if args.is_null() {
            0
        } else {
            // SAFETY: not null; readable by the caller's contract.
            unsafe { args.read_unaligned() }.user_data as usize as u64
        };
        let id = e
            .transfer_blocks_async(remote, op, &d, l, r, compat::TransferArgs { user_data })
            .map_err(fail)?;
        // SAFETY: checked not null; writable by the caller's contract.
        unsafe { put(req, id as usize as *mut c_void, "req") }
    })
}
