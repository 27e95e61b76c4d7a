//! The native module `hixl._hixl`: CANN HIXL's Python API (its pybind module `hixl`) over
//! [`hixl::compat::Hixl`], name for name, default for default, return shape for return shape.
//! `hixl/__init__.py` re-exports it as the module `hixl` and adds the Pythonic layer.
//!
//! Every method that can block releases the GIL (`Python::allow_threads`). Addresses are
//! Python ints; a transfer's local and remote ranges are checked by the compat engine against
//! the registered regions and the peer's table before anything moves. Bad Python input (a
//! wrong type, `None`, a negative or too large int) raises `TypeError` / `ValueError`, never
//! reaches the engine.
//!
//! The submodule `datadist` (`datadist.rs`) is the native half of the package `llm_datadist`.
//!
//! Extensions beyond CANN's surface (documented in the README): `Hixl.local_engine()`,
//! `Hixl.wait_transfer()`, `Hixl.cancel_transfer()`, `Hixl.remote_regions()`,
//! `Hixl.transport()`, `Hixl.alloc_host_mem()` (with `HostMem`), and the packed-descriptor
//! transfers the Pythonic layer uses.
#![deny(unsafe_op_in_unsafe_fn, missing_docs)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

mod datadist;

use hixl::compat;
use hixl::{Access, Status};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};

/// HIXL's default timeout of every blocking call, in milliseconds.
const DEFAULT_TIMEOUT_MS: i32 = 1000;

thread_local! {
    /// The message of the last failed call on this thread (`last_error_message()`).
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

pub(crate) fn set_last_error(msg: String) {
    LAST_ERROR.with(|l| *l.borrow_mut() = msg);
}

/// The status code of a compat result (recording its message for `last_error_message()`).
fn code<T>(r: &compat::Result<T>) -> u32 {
    match r {
        Ok(_) => Status::SUCCESS.code(),
        Err(e) => {
            set_last_error(e.message().to_owned());
            e.status().code()
        }
    }
}

fn failed_uninit() -> u32 {
    set_last_error("the engine is not initialized (or finalized)".into());
    Status::FAILED.code()
}

/// The message of the last call on this thread that returned an error status (an extension:
/// CANN's module has none; the Pythonic layer puts it in its exceptions).
#[pyfunction]
fn last_error_message() -> String {
    LAST_ERROR.with(|l| l.borrow().clone())
}

/// An unsigned int of at most `max`: `TypeError` for a non-int (`None`, a float, a str),
/// `ValueError` for a negative or too large one.
fn uint(obj: &Bound<'_, PyAny>, what: &str, max: u64) -> PyResult<u64> {
    if !obj.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{what} must be an int, not {}",
            obj.get_type().name()?
        )));
    }
    match obj.extract::<u64>() {
        Ok(v) if v <= max => Ok(v),
        _ => Err(PyValueError::new_err(format!(
            "{what} must be in 0..={max}, got {obj}"
        ))),
    }
}

fn usize_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    Ok(uint(obj, what, usize::MAX as u64)? as usize)
}

fn bool_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<bool> {
    if let Ok(b) = obj.downcast::<PyBool>() {
        return Ok(b.is_true());
    }
    Err(PyTypeError::new_err(format!(
        "{what} must be a bool, not {}",
        obj.get_type().name()?
    )))
}

fn str_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    match obj.downcast::<PyString>() {
        Ok(s) => Ok(s.to_cow()?.into_owned()),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{what} must be a str, not {}",
            obj.get_type().name()?
        ))),
    }
}

/// A timeout in milliseconds (an `int32_t` in HIXL; ≤ 0 is the engine's `PARAM_INVALID`).
fn timeout_of(obj: &Bound<'_, PyAny>) -> PyResult<i32> {
    if !obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "timeout_in_millis must be an int, not {}",
            obj.get_type().name()?
        )));
    }
    obj.extract::<i32>().map_err(|_| {
        PyValueError::new_err(format!("timeout_in_millis must fit an int32, got {obj}"))
    })
}

macro_rules! hixl_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $v:ident = $n:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[pyclass(eq, eq_int, frozen, hash, module = "hixl")]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        pub enum $name {
            $($(#[$vdoc])* $v = $n),+
        }

        #[pymethods]
        impl $name {
            /// The member's C value (pybind11's `.value`).
            #[getter]
            fn value(&self) -> i32 {
                *self as i32
            }
            /// The member's name (pybind11's `.name`).
            #[getter]
            fn name(&self) -> &'static str {
                match self {
                    $(Self::$v => stringify!($v)),+
                }
            }
            fn __index__(&self) -> i32 {
                *self as i32
            }
        }

        impl $name {
            /// The member for an enum member or its int value.
            #[allow(dead_code)] // not every enum is an argument
            fn of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Self> {
                if let Ok(v) = obj.downcast::<Self>() {
                    return Ok(*v.get());
                }
                if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>() {
                    return match obj.extract::<i64>() {
                        $(Ok($n) => Ok(Self::$v),)+
                        _ => Err(PyValueError::new_err(format!(
                            "{what}: {obj} is not a {} value", stringify!($name)
                        ))),
                    };
                }
                Err(PyTypeError::new_err(format!(
                    "{what} must be a {} (or its int value), not {}",
                    stringify!($name),
                    obj.get_type().name()?
                )))
            }
        }
    };
}

hixl_enum!(
    /// HIXL `MemType`.
    MemType {
        /// Device (Ascend) memory: refused with `UNSUPPORTED` without an Ascend runtime.
        MEM_DEVICE = 0,
        /// Host memory.
        MEM_HOST = 1,
    }
);
hixl_enum!(
    /// HIXL `TransferOp`.
    TransferOp {
        /// Remote → local.
        READ = 0,
        /// Local → remote.
        WRITE = 1,
    }
);
hixl_enum!(
    /// HIXL `TransferStatus`.
    TransferStatus {
        /// Queued or running.
        WAITING = 0,
        /// Done.
        COMPLETED = 1,
        /// Its deadline passed.
        TIMEOUT = 2,
        /// Failed, cancelled, or unknown.
        FAILED = 3,
    }
);
hixl_enum!(
    /// HIXL `AsyncConnectStatus`.
    AsyncConnectStatus {
        /// No async connection.
        NOT_CONNECT = 0,
        /// Queued.
        CONNECT_PENDING = 1,
        /// Running.
        CONNECTING = 2,
        /// Connected.
        CONNECTED = 3,
        /// The last connect failed.
        CONNECT_FAILED = 4,
        /// A disconnect is queued.
        DISCONNECT_PENDING = 5,
        /// A disconnect is running.
        DISCONNECTING = 6,
    }
);
hixl_enum!(
    /// HIXL `FeatureType`.
    FeatureType {
        /// `AutoConnect`: supported.
        AUTO_CONNECT = 0,
        /// HIXL's client/server C API: not supported.
        CLIENT_SERVER_COMM = 1,
    }
);

impl From<compat::TransferStatus> for TransferStatus {
    fn from(s: compat::TransferStatus) -> Self {
        match s {
            compat::TransferStatus::Waiting => Self::WAITING,
            compat::TransferStatus::Completed => Self::COMPLETED,
            compat::TransferStatus::Timeout => Self::TIMEOUT,
            compat::TransferStatus::Failed => Self::FAILED,
        }
    }
}

impl From<hixl::AsyncConnectStatus> for AsyncConnectStatus {
    fn from(s: hixl::AsyncConnectStatus) -> Self {
        use hixl::AsyncConnectStatus as A;
        match s {
            A::NotConnect => Self::NOT_CONNECT,
            A::ConnectPending => Self::CONNECT_PENDING,
            A::Connecting => Self::CONNECTING,
            A::Connected => Self::CONNECTED,
            A::ConnectFailed => Self::CONNECT_FAILED,
            A::DisconnectPending => Self::DISCONNECT_PENDING,
            A::Disconnecting => Self::DISCONNECTING,
        }
    }
}

/// HIXL `MemDesc(addr, len)`; `local_only` (default `False`) is read-write too.
#[pyclass(module = "hixl")]
#[derive(Clone, Copy)]
pub struct MemDesc {
    addr: usize,
    len: usize,
    local_only: bool,
}

#[pymethods]
impl MemDesc {
    #[new]
    #[pyo3(signature = (addr, len))]
    fn new(addr: &Bound<'_, PyAny>, len: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self {
            addr: usize_of(addr, "addr")?,
            len: usize_of(len, "len")?,
            local_only: false,
        })
    }
    #[getter]
    fn addr(&self) -> usize {
        self.addr
    }
    #[setter]
    fn set_addr(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.addr = usize_of(v, "addr")?;
        Ok(())
    }
    #[getter]
    fn len(&self) -> usize {
        self.len
    }
    #[setter]
    fn set_len(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.len = usize_of(v, "len")?;
        Ok(())
    }
    #[getter]
    fn local_only(&self) -> bool {
        self.local_only
    }
    #[setter]
    fn set_local_only(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.local_only = bool_of(v, "local_only")?;
        Ok(())
    }
    fn __repr__(&self) -> String {
        format!(
            "MemDesc(addr={:#x}, len={}, local_only={})",
            self.addr,
            self.len,
            if self.local_only { "True" } else { "False" }
        )
    }
}

/// HIXL `TransferOpDesc(local_addr, remote_addr, len)`.
#[pyclass(module = "hixl")]
#[derive(Clone, Copy)]
pub struct TransferOpDesc {
    inner: compat::TransferOpDesc,
}

#[pymethods]
impl TransferOpDesc {
    #[new]
    #[pyo3(signature = (local_addr, remote_addr, len))]
    fn new(
        local_addr: &Bound<'_, PyAny>,
        remote_addr: &Bound<'_, PyAny>,
        len: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Ok(Self {
            inner: compat::TransferOpDesc {
                local_addr: usize_of(local_addr, "local_addr")?,
                remote_addr: usize_of(remote_addr, "remote_addr")?,
                len: usize_of(len, "len")?,
            },
        })
    }
    #[getter]
    fn local_addr(&self) -> usize {
        self.inner.local_addr
    }
    #[setter]
    fn set_local_addr(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.local_addr = usize_of(v, "local_addr")?;
        Ok(())
    }
    #[getter]
    fn remote_addr(&self) -> usize {
        self.inner.remote_addr
    }
    #[setter]
    fn set_remote_addr(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.remote_addr = usize_of(v, "remote_addr")?;
        Ok(())
    }
    #[getter]
    fn len(&self) -> usize {
        self.inner.len
    }
    #[setter]
    fn set_len(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.len = usize_of(v, "len")?;
        Ok(())
    }
    fn __repr__(&self) -> String {
        format!(
            "TransferOpDesc(local_addr={:#x}, remote_addr={:#x}, len={})",
            self.inner.local_addr, self.inner.remote_addr, self.inner.len
        )
    }
}

/// HIXL `TransferArgs()`: `user_data` (an int, default 0) comes back in `TransferResult`.
#[pyclass(module = "hixl")]
#[derive(Clone, Copy, Default)]
pub struct TransferArgs {
    user_data: u64,
}

#[pymethods]
impl TransferArgs {
    #[new]
    fn new() -> Self {
        Self::default()
    }
    #[getter]
    fn user_data(&self) -> u64 {
        self.user_data
    }
    #[setter]
    fn set_user_data(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.user_data = uint(v, "user_data", u64::MAX)?;
        Ok(())
    }
    fn __repr__(&self) -> String {
        format!("TransferArgs(user_data={:#x})", self.user_data)
    }
}

/// HIXL `GetTransferStatusArgs(max_query_count=4294967295, skip_waiting=False)`.
#[pyclass(module = "hixl")]
#[derive(Clone, Copy)]
pub struct GetTransferStatusArgs {
    max_query_count: u32,
    skip_waiting: bool,
}

#[pymethods]
impl GetTransferStatusArgs {
    #[new]
    #[pyo3(signature = (max_query_count = None, skip_waiting = None))]
    fn new(
        max_query_count: Option<&Bound<'_, PyAny>>,
        skip_waiting: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(Self {
            max_query_count: match max_query_count {
                Some(v) => uint(v, "max_query_count", u32::MAX as u64)? as u32,
                None => u32::MAX,
            },
            skip_waiting: match skip_waiting {
                Some(v) => bool_of(v, "skip_waiting")?,
                None => false,
            },
        })
    }
    #[getter]
    fn max_query_count(&self) -> u32 {
        self.max_query_count
    }
    #[setter]
    fn set_max_query_count(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.max_query_count = uint(v, "max_query_count", u32::MAX as u64)? as u32;
        Ok(())
    }
    #[getter]
    fn skip_waiting(&self) -> bool {
        self.skip_waiting
    }
    #[setter]
    fn set_skip_waiting(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.skip_waiting = bool_of(v, "skip_waiting")?;
        Ok(())
    }
    fn __repr__(&self) -> String {
        format!(
            "GetTransferStatusArgs(max_query_count={}, skip_waiting={})",
            self.max_query_count,
            if self.skip_waiting { "True" } else { "False" }
        )
    }
}

/// HIXL `TransferResult()`: `req` and `user_data` (read-write ints, 0), `status` (read-only,
/// `WAITING`).
#[pyclass(module = "hixl")]
#[derive(Clone, Copy)]
pub struct TransferResult {
    req: u64,
    user_data: u64,
    status: TransferStatus,
}

#[pymethods]
impl TransferResult {
    #[new]
    fn new() -> Self {
        Self {
            req: 0,
            user_data: 0,
            status: TransferStatus::WAITING,
        }
    }
    #[getter]
    fn req(&self) -> u64 {
        self.req
    }
    #[setter]
    fn set_req(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.req = uint(v, "req", u64::MAX)?;
        Ok(())
    }
    #[getter]
    fn user_data(&self) -> u64 {
        self.user_data
    }
    #[setter]
    fn set_user_data(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.user_data = uint(v, "user_data", u64::MAX)?;
        Ok(())
    }
    #[getter]
    fn status(&self) -> TransferStatus {
        self.status
    }
    fn __repr__(&self) -> String {
        format!(
            "TransferResult(req={}, user_data={:#x}, status=TransferStatus.{})",
            self.req,
            self.user_data,
            self.status.name()
        )
    }
}

/// HIXL `NotifyDesc(name, notify_msg)`.
#[pyclass(module = "hixl")]
#[derive(Clone)]
pub struct NotifyDesc {
    name: String,
    notify_msg: String,
}

#[pymethods]
impl NotifyDesc {
    #[new]
    #[pyo3(signature = (name, notify_msg))]
    fn new(name: &Bound<'_, PyAny>, notify_msg: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self {
            name: str_of(name, "name")?,
            notify_msg: str_of(notify_msg, "notify_msg")?,
        })
    }
    #[getter]
    fn name(&self) -> String {
        self.name.clone()
    }
    #[setter]
    fn set_name(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.name = str_of(v, "name")?;
        Ok(())
    }
    #[getter]
    fn notify_msg(&self) -> String {
        self.notify_msg.clone()
    }
    #[setter]
    fn set_notify_msg(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.notify_msg = str_of(v, "notify_msg")?;
        Ok(())
    }
    fn __repr__(&self) -> String {
        format!(
            "NotifyDesc(name={:?}, notify_msg={:?})",
            self.name, self.notify_msg
        )
    }
}

/// The descriptors of a Python sequence of `TransferOpDesc`.
fn op_descs_of(obj: &Bound<'_, PyAny>) -> PyResult<Vec<compat::TransferOpDesc>> {
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "op_descs must be a list of TransferOpDesc, not str",
        ));
    }
    // (the caller's `__len__` is a hint, not a size to allocate: a huge one panicked or aborted)
    let mut out = Vec::with_capacity(obj.len().unwrap_or(0).min(1 << 16));
    for (i, item) in obj.try_iter()?.enumerate() {
        let item = item?;
        let d = item
            .downcast::<TransferOpDesc>()
            .map_err(|_| PyTypeError::new_err(format!("op_descs[{i}] must be a TransferOpDesc")))?;
        out.push(d.borrow().inner);
    }
    Ok(out)
}

/// Descriptors packed as native-endian u64 triples `(local_addr, remote_addr, len)`: borrowed
/// in place when the bytes are aligned for [`compat::TransferOpDesc`] (a `bytes` object's data
/// is, on 64-bit targets), else converted. No allocation or pass per descriptor in the common
/// case (10^5-descriptor batches: issue #35); the bytes are immutable, so the view stays valid
/// while the GIL is released.
fn packed_descs(packed: &[u8]) -> PyResult<std::borrow::Cow<'_, [compat::TransferOpDesc]>> {
    if !packed.len().is_multiple_of(24) {
        return Err(PyValueError::new_err(
            "packed descriptors must be a multiple of 24 bytes (three u64 each)",
        ));
    }
    #[cfg(target_pointer_width = "64")]
    {
        // the layout the cast below relies on (a change to the type fails the build)
        const _: () = assert!(
            std::mem::size_of::<compat::TransferOpDesc>() == 24
                && std::mem::align_of::<compat::TransferOpDesc>() == 8
        );
        // SAFETY: `TransferOpDesc` is `repr(C)` of three `usize`, 24 bytes with no padding,
        // and every bit pattern is a valid `usize`; on a 64-bit target a u64 triple has exactly
        // its layout. `align_to` only yields the middle part at the type's alignment.
        let (head, mid, tail) = unsafe { packed.align_to::<compat::TransferOpDesc>() };
        if head.is_empty() && tail.is_empty() {
            return Ok(std::borrow::Cow::Borrowed(mid));
        }
    }
    let word = |c: &[u8]| -> PyResult<usize> {
        let v = u64::from_ne_bytes(c.try_into().expect("8 bytes"));
        usize::try_from(v).map_err(|_| PyValueError::new_err("an address does not fit usize"))
    };
    packed
        .chunks_exact(24)
        .map(|c| {
            Ok(compat::TransferOpDesc {
                local_addr: word(&c[0..8])?,
                remote_addr: word(&c[8..16])?,
                len: word(&c[16..24])?,
            })
        })
        .collect::<PyResult<Vec<_>>>()
        .map(std::borrow::Cow::Owned)
}

/// Host memory the engine allocated (`Hixl.alloc_host_mem`, an extension): `addr`, `nbytes`
/// (also `len()`), `handle` (for `deregister_mem`). The object keeps the memory mapped while it
/// lives, registered or not, so a view made from it (the Pythonic layer's `HostBuffer` holds
/// this object) never outlives the memory.
#[pyclass(module = "hixl", frozen)]
pub struct HostMem {
    mem: compat::HostMem,
}

#[pymethods]
impl HostMem {
    /// The first byte's address (page-aligned).
    #[getter]
    fn addr(&self) -> usize {
        self.mem.addr()
    }
    /// Length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.mem.len()
    }
    /// The registration's handle (`deregister_mem(handle)`).
    #[getter]
    fn handle(&self) -> u64 {
        self.mem.handle()
    }
    fn __len__(&self) -> usize {
        self.mem.len()
    }
    fn __repr__(&self) -> String {
        format!(
            "HostMem(addr={:#x}, nbytes={}, handle={})",
            self.mem.addr(),
            self.mem.len(),
            self.mem.handle()
        )
    }
}

/// HIXL's engine (CANN's `hixl.Hixl`). Every method returns HIXL's status int, or a
/// `(status, value)` tuple; none raises for an engine error. `initialize` twice is `SUCCESS`
/// (as CANN's), `finalize` is safe twice and the engine can be initialized again after it.
#[pyclass(module = "hixl", frozen)]
pub struct Hixl {
    engine: RwLock<Option<Arc<compat::Hixl>>>,
    /// Serialises `initialize`.
    init: Mutex<()>,
}

impl Hixl {
    fn engine(&self) -> Option<Arc<compat::Hixl>> {
        self.engine
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    fn take(&self) -> Option<Arc<compat::Hixl>> {
        self.engine
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

impl Drop for Hixl {
    fn drop(&mut self) {
        if let Some(e) = self.take() {
            // an engine still initialized when collected: finalize it without the GIL (it waits
            // for requests in flight), as CANN's destructor does
            Python::with_gil(|py| py.allow_threads(move || e.finalize()));
        }
    }
}

/// Runs `f` on the engine without the GIL, giving its status code.
fn call<T: Send>(
    py: Python<'_>,
    this: &Hixl,
    f: impl FnOnce(&compat::Hixl) -> compat::Result<T> + Send,
) -> (u32, Option<T>) {
    let Some(e) = this.engine() else {
        return (failed_uninit(), None);
    };
    let r = py.allow_threads(move || f(&e));
    let c = code(&r);
    (c, r.ok())
}

#[pymethods]
impl Hixl {
    #[new]
    fn new() -> Self {
        Self {
            engine: RwLock::new(None),
            init: Mutex::new(()),
        }
    }

    /// `initialize(local_engine, options={}) -> int`. `local_engine` is `"ip"` (a client),
    /// `"ip:port"` (listens there) or `"ip:0"` (an ephemeral port, see `local_engine()`).
    #[pyo3(signature = (local_engine, options = None))]
    fn initialize(
        &self,
        py: Python<'_>,
        local_engine: &Bound<'_, PyAny>,
        options: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u32> {
        let name = str_of(local_engine, "local_engine")?;
        let mut opts = Vec::new();
        if let Some(o) = options {
            let d = o
                .downcast::<PyDict>()
                .map_err(|_| PyTypeError::new_err("options must be a dict[str, str]"))?;
            for (k, v) in d.iter() {
                opts.push((str_of(&k, "an option key")?, str_of(&v, "an option value")?));
            }
        }
        // without the GIL, and the slot's lock taken only without it: a thread holding the GIL
        // and waiting for the slot must never wait for a thread that waits for the GIL
        let r = py.allow_threads(|| -> compat::Result<()> {
            let _serial = self.init.lock().unwrap_or_else(|e| e.into_inner());
            if self.engine().is_some() {
                return Ok(()); // CANN's: initializing twice succeeds
            }
            let engine = Arc::new(compat::Hixl::new());
            engine.initialize(&name, opts)?;
            *self.engine.write().unwrap_or_else(|e| e.into_inner()) = Some(engine);
            Ok(())
        });
        Ok(code(&r))
    }

    /// `finalize() -> None`: closes every link, ends requests, stops serving. Safe twice.
    fn finalize(&self, py: Python<'_>) {
        if let Some(e) = self.take() {
            py.allow_threads(move || e.finalize());
        }
    }

    /// An extension: `local_engine() -> (int, str)`, the engine's name as peers connect to it
    /// (with the port an `"ip:0"` engine got).
    fn local_engine(&self, py: Python<'_>) -> (u32, String) {
        let (c, v) = call(py, self, |e| e.local_engine());
        (c, v.unwrap_or_default())
    }

    /// `register_mem(mem_desc, mem_type) -> (int, handle)`; handle 0 on failure. The range must
    /// stay allocated until it is deregistered or the engine finalized (CANN's contract).
    /// `MEM_DEVICE` without an Ascend runtime: `UNSUPPORTED`.
    fn register_mem(
        &self,
        py: Python<'_>,
        mem_desc: &Bound<'_, PyAny>,
        mem_type: &Bound<'_, PyAny>,
    ) -> PyResult<(u32, u64)> {
        let d = *mem_desc
            .downcast::<MemDesc>()
            .map_err(|_| PyTypeError::new_err("mem_desc must be a MemDesc"))?
            .borrow();
        let t = match MemType::of(mem_type, "mem_type")? {
            MemType::MEM_DEVICE => hixl::MemType::Device,
            MemType::MEM_HOST => hixl::MemType::Host,
        };
        let desc = compat::MemDesc {
            addr: d.addr,
            len: d.len,
            local_only: d.local_only,
        };
        let (c, h) = call(py, self, move |e| {
            // SAFETY: CANN's `register_mem` contract, which this module's users accept as
            // they do CANN's: the range stays allocated and is accessed only as transfers allow
            // until deregistered or finalized. The Pythonic layer upholds it by deriving the
            // range from a buffer it keeps exported (alive and unresizable) while registered.
            unsafe { e.register_mem(desc, t) }
        });
        Ok((c, h.unwrap_or(0)))
    }

    /// An extension: `alloc_host_mem(size) -> (int, HostMem | None)`: `size` zeroed bytes of
    /// page-aligned host memory the engine allocates and registers (peers may READ and WRITE
    /// them); same-host peers reach it one-sidedly (caller memory goes to them over TCP).
    /// `deregister_mem(mem.handle)` or `finalize` ends the registration; the memory lives on
    /// while the `HostMem` does (and while a same-host link may still reach it).
    fn alloc_host_mem(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyAny>,
    ) -> PyResult<(u32, Option<HostMem>)> {
        let n = usize_of(size, "size")?;
        let (c, m) = call(py, self, move |e| e.alloc_host_mem(n));
        Ok((c, m.map(|mem| HostMem { mem })))
    }

    /// `deregister_mem(handle) -> int`.
    fn deregister_mem(&self, py: Python<'_>, mem_handle: &Bound<'_, PyAny>) -> PyResult<u32> {
        let h = uint(mem_handle, "mem_handle", u64::MAX)?;
        Ok(call(py, self, move |e| e.deregister_mem(h)).0)
    }

    /// `connect(remote_engine, timeout_in_millis=1000) -> int`.
    #[pyo3(signature = (remote_engine, timeout_in_millis = None))]
    fn connect(
        &self,
        py: Python<'_>,
        remote_engine: &Bound<'_, PyAny>,
        timeout_in_millis: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u32> {
        let (r, t) = remote_and_timeout(remote_engine, timeout_in_millis)?;
        Ok(call(py, self, move |e| e.connect(&r, t)).0)
    }

    /// `disconnect(remote_engine, timeout_in_millis=1000) -> int`.
    #[pyo3(signature = (remote_engine, timeout_in_millis = None))]
    fn disconnect(
        &self,
        py: Python<'_>,
        remote_engine: &Bound<'_, PyAny>,
        timeout_in_millis: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u32> {
        let (r, t) = remote_and_timeout(remote_engine, timeout_in_millis)?;
        Ok(call(py, self, move |e| e.disconnect(&r, t)).0)
    }

    /// `connect_async(remote_engine, timeout_in_millis=1000) -> int`.
    #[pyo3(signature = (remote_engine, timeout_in_millis = None))]
    fn connect_async(
        &self,
        py: Python<'_>,
        remote_engine: &Bound<'_, PyAny>,
        timeout_in_millis: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u32> {
        let (r, t) = remote_and_timeout(remote_engine, timeout_in_millis)?;
        Ok(call(py, self, move |e| e.connect_async(&r, t)).0)
    }

    /// `disconnect_async(remote_engine, timeout_in_millis=1000) -> int`.
    #[pyo3(signature = (remote_engine, timeout_in_millis = None))]
    fn disconnect_async(
        &self,
        py: Python<'_>,
        remote_engine: &Bound<'_, PyAny>,
        timeout_in_millis: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u32> {
        let (r, t) = remote_and_timeout(remote_engine, timeout_in_millis)?;
        Ok(call(py, self, move |e| e.disconnect_async(&r, t)).0)
    }

    /// `get_async_connect_status(remote_engine) -> (int, AsyncConnectStatus)`.
    fn get_async_connect_status(
        &self,
        py: Python<'_>,
        remote_engine: &Bound<'_, PyAny>,
    ) -> PyResult<(u32, AsyncConnectStatus)> {
        let r = str_of(remote_engine, "remote_engine")?;
        let (c, s) = call(py, self, move |e| e.get_async_connect_status(&r));
        Ok((
            c,
            s.map(Into::into).unwrap_or(AsyncConnectStatus::NOT_CONNECT),
        ))
    }

    /// `get_all_async_connect_status() -> (int, dict[str, AsyncConnectStatus])`.
    fn get_all_async_connect_status(
        &self,
        py: Python<'_>,
    ) -> (u32, HashMap<String, AsyncConnectStatus>) {
        let (c, m) = call(py, self, |e| e.get_all_async_connect_status());
        let m = m
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into()))
            .collect();
        (c, m)
    }

    /// `transfer_sync(remote_engine, op, op_descs, timeout_in_millis=1000) -> int`.
    #[pyo3(signature = (remote_engine, op, op_descs, timeout_in_millis = None))]
    fn transfer_sync(
        &self,
        py: Python<'_>,
        remote_engine: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
        op_descs: &Bound<'_, PyAny>,
        timeout_in_millis: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u32> {
        let (r, t) = remote_and_timeout(remote_engine, timeout_in_millis)?;
        let op = op_of(op)?;
        let descs = op_descs_of(op_descs)?;
        Ok(call(py, self, move |e| e.transfer_sync(&r, op, &descs, t)).0)
    }

    /// `transfer_async(remote_engine, op, op_descs, args=TransferArgs()) -> (int, req)`; req 0
    /// on failure.
    #[pyo3(signature = (remote_engine, op, op_descs, args = None))]
    fn transfer_async(
        &self,
        py: Python<'_>,
        remote_engine: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
        op_descs: &Bound<'_, PyAny>,
        args: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(u32, u64)> {
        let r = str_of(remote_engine, "remote_engine")?;
        let op = op_of(op)?;
        let descs = op_descs_of(op_descs)?;
        let user_data = match args {
            None => 0,
            Some(a) if a.is_none() => 0,
            Some(a) => {
                a.downcast::<TransferArgs>()
                    .map_err(|_| PyTypeError::new_err("args must be a TransferArgs"))?
                    .borrow()
                    .user_data
            }
        };
        let (c, req) = call(py, self, move |e| {
            e.transfer_async(&r, op, &descs, compat::TransferArgs { user_data })
        });
        Ok((c, req.unwrap_or(0)))
    }

    /// `get_transfer_status(req) -> (int, TransferStatus)`: a terminal status is reported once;
    /// an unknown request gives `(PARAM_INVALID, TransferStatus.FAILED)`, request 0
    /// `(FAILED, TransferStatus.FAILED)`, as CANN's.
    fn get_transfer_status(
        &self,
        py: Python<'_>,
        req: &Bound<'_, PyAny>,
    ) -> PyResult<(u32, TransferStatus)> {
        let id = uint(req, "req", u64::MAX)?;
        let (c, s) = call(py, self, move |e| e.get_transfer_status(id));
        Ok((c, s.map(Into::into).unwrap_or(TransferStatus::FAILED)))
    }

    /// `get_all_transfer_status(args=GetTransferStatusArgs()) -> (int, list[TransferResult])`.
    #[pyo3(signature = (args = None))]
    fn get_all_transfer_status(
        &self,
        py: Python<'_>,
        args: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(u32, Vec<TransferResult>)> {
        let a = match args {
            None => compat::GetTransferStatusArgs::default(),
            Some(a) if a.is_none() => compat::GetTransferStatusArgs::default(),
            Some(a) => {
                let a = *a
                    .downcast::<GetTransferStatusArgs>()
                    .map_err(|_| PyTypeError::new_err("args must be a GetTransferStatusArgs"))?
                    .borrow();
                compat::GetTransferStatusArgs {
                    max_query_count: a.max_query_count,
                    skip_waiting: a.skip_waiting,
                }
            }
        };
        let (c, v) = call(py, self, move |e| e.get_transfer_statuses(a));
        let v = v
            .unwrap_or_default()
            .into_iter()
            .map(|r| TransferResult {
                req: r.req,
                user_data: r.user_data,
                status: r.status.into(),
            })
            .collect();
        Ok((c, v))
    }

    /// `send_notify(remote_engine, notify, timeout_in_millis=1000) -> int`.
    #[pyo3(signature = (remote_engine, notify, timeout_in_millis = None))]
    fn send_notify(
        &self,
        py: Python<'_>,
        remote_engine: &Bound<'_, PyAny>,
        notify: &Bound<'_, PyAny>,
        timeout_in_millis: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u32> {
        let (r, t) = remote_and_timeout(remote_engine, timeout_in_millis)?;
        let n = notify
            .downcast::<NotifyDesc>()
            .map_err(|_| PyTypeError::new_err("notify must be a NotifyDesc"))?
            .borrow()
            .clone();
        let n = compat::NotifyDesc {
            name: n.name,
            notify_msg: n.notify_msg,
        };
        Ok(call(py, self, move |e| e.send_notify(&r, &n, t)).0)
    }

    /// `get_notifies() -> (int, list[NotifyDesc])`: every notification received since the last
    /// call, oldest first.
    fn get_notifies(&self, py: Python<'_>) -> (u32, Vec<NotifyDesc>) {
        let (c, v) = call(py, self, |e| e.get_notifies());
        let v = v
            .unwrap_or_default()
            .into_iter()
            .map(|n| NotifyDesc {
                name: n.name,
                notify_msg: n.notify_msg,
            })
            .collect();
        (c, v)
    }

    // ---- extensions (not in CANN's module) ----

    /// An extension: `wait_transfer(req, timeout_in_millis) -> (int, TransferStatus)`, waiting
    /// (without the GIL) up to the timeout for the request to end; reports as
    /// `get_transfer_status` does.
    fn wait_transfer(
        &self,
        py: Python<'_>,
        req: &Bound<'_, PyAny>,
        timeout_in_millis: &Bound<'_, PyAny>,
    ) -> PyResult<(u32, TransferStatus)> {
        let id = uint(req, "req", u64::MAX)?;
        let t = uint(timeout_in_millis, "timeout_in_millis", u32::MAX as u64)?;
        let (c, s) = call(py, self, move |e| {
            e.wait_transfer(id, Duration::from_millis(t))
        });
        Ok((c, s.map(Into::into).unwrap_or(TransferStatus::FAILED)))
    }

    /// An extension: `cancel_transfer(req) -> int`. The request ends `FAILED` once what was
    /// running stopped (poll or wait for it before reusing the buffers).
    fn cancel_transfer(&self, py: Python<'_>, req: &Bound<'_, PyAny>) -> PyResult<u32> {
        let id = uint(req, "req", u64::MAX)?;
        Ok(call(py, self, move |e| e.cancel_transfer(id)).0)
    }

    /// An extension: `remote_regions(remote_engine) -> (int, list[tuple[addr, len, MemType,
    /// readable, writable, transport]])`, the table the peer sent at connect, and the transport
    /// that moves each region (`"same-host"` for a same-host peer's `alloc_host_mem` buffers,
    /// `"tcp"` for its own memory).
    fn remote_regions(
        &self,
        py: Python<'_>,
        remote_engine: &Bound<'_, PyAny>,
    ) -> PyResult<(u32, Vec<RemoteRegionTuple>)> {
        let r = str_of(remote_engine, "remote_engine")?;
        let (c, v) = call(py, self, move |e| e.remote_regions(&r));
        let v = v
            .unwrap_or_default()
            .into_iter()
            .map(|d| {
                let t = match d.mem_type {
                    hixl::MemType::Device => MemType::MEM_DEVICE,
                    hixl::MemType::Host => MemType::MEM_HOST,
                };
                let (rd, wr) = match d.access {
                    Access::None => (false, false),
                    Access::Read => (true, false),
                    Access::Write => (false, true),
                    Access::ReadWrite => (true, true),
                };
                (d.addr, d.len, t, rd, wr, d.transport.name())
            })
            .collect();
        Ok((c, v))
    }

    /// An extension: `transport(remote_engine) -> (int, str)`, the link's transport
    /// (`"tcp"`, `"same-host"` (one-sided), `"ucx"`, `"ascend"`: `TransportKind::name`).
    fn transport(
        &self,
        py: Python<'_>,
        remote_engine: &Bound<'_, PyAny>,
    ) -> PyResult<(u32, String)> {
        let r = str_of(remote_engine, "remote_engine")?;
        let (c, t) = call(py, self, move |e| e.transport(&r));
        let name = t.map_or("", hixl::TransportKind::name);
        Ok((c, name.to_owned()))
    }

    /// The Pythonic layer's `transfer_sync`: descriptors packed as native-endian u64 triples.
    fn _transfer_sync_packed(
        &self,
        py: Python<'_>,
        remote_engine: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
        packed: &[u8],
        timeout_in_millis: &Bound<'_, PyAny>,
    ) -> PyResult<u32> {
        let (r, t) = remote_and_timeout(remote_engine, Some(timeout_in_millis))?;
        let op = op_of(op)?;
        let descs = packed_descs(packed)?;
        Ok(call(py, self, move |e| e.transfer_sync(&r, op, &descs, t)).0)
    }

    /// The Pythonic layer's `transfer_async`: descriptors packed as native-endian u64 triples.
    fn _transfer_async_packed(
        &self,
        py: Python<'_>,
        remote_engine: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
        packed: &[u8],
        user_data: &Bound<'_, PyAny>,
    ) -> PyResult<(u32, u64)> {
        let r = str_of(remote_engine, "remote_engine")?;
        let op = op_of(op)?;
        let descs = packed_descs(packed)?;
        let user_data = uint(user_data, "user_data", u64::MAX)?;
        let (c, req) = call(py, self, move |e| {
            e.transfer_async(&r, op, &descs, compat::TransferArgs { user_data })
        });
        Ok((c, req.unwrap_or(0)))
    }

    /// The Pythonic layer's block transfer (beyond HIXL): `desc` is `(local_addr, remote_addr,
    /// block_size, local_stride, remote_stride)`, each index array native-endian bytes of its
    /// width (4 or 8). No Python object per block.
    #[allow(clippy::too_many_arguments)]
    fn _transfer_blocks_sync_packed(
        &self,
        py: Python<'_>,
        remote_engine: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
        desc: BlockArgs<'_>,
        local_idx: &[u8],
        local_width: u32,
        remote_idx: &[u8],
        remote_width: u32,
        timeout_in_millis: &Bound<'_, PyAny>,
    ) -> PyResult<u32> {
        let (r, t) = remote_and_timeout(remote_engine, Some(timeout_in_millis))?;
        let op = op_of(op)?;
        let d = block_desc(desc)?;
        let (l, rr) = (
            Indices::of(local_idx, local_width)?,
            Indices::of(remote_idx, remote_width)?,
        );
        Ok(call(py, self, move |e| {
            e.transfer_blocks_sync(&r, op, &d, l.borrow(), rr.borrow(), t)
        })
        .0)
    }

    /// [`Hixl::_transfer_blocks_sync_packed`] as an async request.
    #[allow(clippy::too_many_arguments)]
    fn _transfer_blocks_async_packed(
        &self,
        py: Python<'_>,
        remote_engine: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
        desc: BlockArgs<'_>,
        local_idx: &[u8],
        local_width: u32,
        remote_idx: &[u8],
        remote_width: u32,
        user_data: &Bound<'_, PyAny>,
    ) -> PyResult<(u32, u64)> {
        let r = str_of(remote_engine, "remote_engine")?;
        let op = op_of(op)?;
        let d = block_desc(desc)?;
        let (l, rr) = (
            Indices::of(local_idx, local_width)?,
            Indices::of(remote_idx, remote_width)?,
        );
        let user_data = uint(user_data, "user_data", u64::MAX)?;
        let (c, req) = call(py, self, move |e| {
            e.transfer_blocks_async(
                &r,
                op,
                &d,
                l.borrow(),
                rr.borrow(),
                compat::TransferArgs { user_data },
            )
        });
        Ok((c, req.unwrap_or(0)))
    }
}

/// `(local_addr, remote_addr, block_size, local_stride, remote_stride)` as a block geometry.
/// `(local_addr, remote_addr, block_size, local_stride, remote_stride)` as Python passes
/// them: ints, each checked as [`uint`] checks (a negative or too large one is `ValueError`).
type BlockArgs<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
);

fn block_desc(d: BlockArgs<'_>) -> PyResult<compat::BlockDesc> {
    Ok(compat::BlockDesc {
        local_addr: usize_of(&d.0, "local_addr")?,
        remote_addr: usize_of(&d.1, "remote_addr")?,
        block_size: uint(&d.2, "block_size", u64::MAX)?,
        local_stride: uint(&d.3, "local_stride", u64::MAX)?,
        remote_stride: uint(&d.4, "remote_stride", u64::MAX)?,
    })
}

/// Block indices decoded from native-endian bytes (one pass, no Python object per index).
enum Indices {
    U32(Vec<u32>),
    U64(Vec<u64>),
}

impl Indices {
    fn of(b: &[u8], width: u32) -> PyResult<Self> {
        match width {
            4 if b.len().is_multiple_of(4) => Ok(Self::U32(
                b.chunks_exact(4)
                    .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            )),
            8 if b.len().is_multiple_of(8) => Ok(Self::U64(
                b.chunks_exact(8)
                    .map(|c| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                    .collect(),
            )),
            _ => Err(PyValueError::new_err(format!(
                "index width {width} with {} bytes: indices are 4 or 8 bytes each",
                b.len()
            ))),
        }
    }
    fn borrow(&self) -> hixl::BlockIndices<'_> {
        match self {
            Self::U32(v) => hixl::BlockIndices::U32(v),
            Self::U64(v) => hixl::BlockIndices::U64(v),
        }
    }
}

/// `(addr, len, mem_type, readable, writable)` of one region of a peer's table.
type RemoteRegionTuple = (u64, u64, MemType, bool, bool, &'static str);

fn remote_and_timeout(
    remote: &Bound<'_, PyAny>,
    timeout: Option<&Bound<'_, PyAny>>,
) -> PyResult<(String, i32)> {
    let r = str_of(remote, "remote_engine")?;
    let t = match timeout {
        None => DEFAULT_TIMEOUT_MS,
        Some(t) => timeout_of(t)?,
    };
    Ok((r, t))
}

fn op_of(op: &Bound<'_, PyAny>) -> PyResult<hixl::TransferOp> {
    Ok(match TransferOp::of(op, "op")? {
        TransferOp::READ => hixl::TransferOp::Read,
        TransferOp::WRITE => hixl::TransferOp::Write,
    })
}

/// `get_capability(feature_type) -> (int, int)`: `FEATURE_SUPPORTED` for `AUTO_CONNECT`,
/// `FEATURE_NOT_SUPPORTED` for `CLIENT_SERVER_COMM` (and any other value, with `SUCCESS`);
/// `(PARAM_INVALID, FEATURE_NOT_SUPPORTED)` for a negative one (the C ABI's rule).
#[pyfunction]
fn get_capability(feature_type: &Bound<'_, PyAny>) -> PyResult<(u32, i32)> {
    let v = match FeatureType::of(feature_type, "feature_type") {
        Ok(FeatureType::AUTO_CONNECT) => compat::get_capability(compat::FeatureType::AutoConnect),
        Ok(FeatureType::CLIENT_SERVER_COMM) => {
            compat::get_capability(compat::FeatureType::ClientServerComm)
        }
        // an int no feature has: the C ABI's answer (any int beyond i32 is one too)
        Err(_) if feature_type.is_instance_of::<PyInt>() => {
            let n: i64 = match feature_type.extract() {
                Ok(n) => n,
                // past i64 either way: its sign is what the rule reads
                Err(_) if feature_type.lt(0)? => i64::MIN,
                Err(_) => i64::MAX,
            };
            let n = n.clamp(i32::MIN.into(), i32::MAX.into()) as i32;
            match compat::capability_of(n) {
                Ok(v) => v,
                Err(e) => return Ok((e.status().code(), compat::FEATURE_NOT_SUPPORTED)),
            }
        }
        Err(e) => return Err(e),
    };
    Ok((Status::SUCCESS.code(), v))
}

/// The module `hixl._hixl`.
#[pymodule]
fn _hixl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for (name, s) in [
        ("SUCCESS", Status::SUCCESS),
        ("PARAM_INVALID", Status::PARAM_INVALID),
        ("TIMEOUT", Status::TIMEOUT),
        ("NOT_CONNECTED", Status::NOT_CONNECTED),
        ("ALREADY_CONNECTED", Status::ALREADY_CONNECTED),
        ("NOTIFY_FAILED", Status::NOTIFY_FAILED),
        ("UNSUPPORTED", Status::UNSUPPORTED),
        ("FAILED", Status::FAILED),
        ("RESOURCE_EXHAUSTED", Status::RESOURCE_EXHAUSTED),
    ] {
        m.add(name, s.code())?;
    }
    for (name, v) in [
        (
            "OPTION_ENABLE_USE_FABRIC_MEM",
            compat::OPTION_ENABLE_USE_FABRIC_MEM,
        ),
        (
            "OPTION_RDMA_TRAFFIC_CLASS",
            compat::OPTION_RDMA_TRAFFIC_CLASS,
        ),
        (
            "OPTION_RDMA_SERVICE_LEVEL",
            compat::OPTION_RDMA_SERVICE_LEVEL,
        ),
        ("OPTION_BUFFER_POOL", compat::OPTION_BUFFER_POOL),
        (
            "OPTION_GLOBAL_RESOURCE_CONFIG",
            compat::OPTION_GLOBAL_RESOURCE_CONFIG,
        ),
        ("OPTION_AUTO_CONNECT", compat::OPTION_AUTO_CONNECT),
        ("OPTION_LOCAL_COMM_RES", compat::OPTION_LOCAL_COMM_RES),
    ] {
        m.add(name, v)?;
    }
    m.add("FEATURE_SUPPORTED", compat::FEATURE_SUPPORTED)?;
    m.add("FEATURE_NOT_SUPPORTED", compat::FEATURE_NOT_SUPPORTED)?;

    m.add_class::<MemType>()?;
    m.add_class::<TransferOp>()?;
    m.add_class::<TransferStatus>()?;
    m.add_class::<AsyncConnectStatus>()?;
    m.add_class::<FeatureType>()?;
    // pybind11's `export_values()`: CANN exports these four enums' members by bare name
    // (not TransferStatus's, whose TIMEOUT/FAILED would shadow the status ints)
    m.add("MEM_DEVICE", MemType::MEM_DEVICE)?;
    m.add("MEM_HOST", MemType::MEM_HOST)?;
    m.add("READ", TransferOp::READ)?;
    m.add("WRITE", TransferOp::WRITE)?;
    for s in [
        AsyncConnectStatus::NOT_CONNECT,
        AsyncConnectStatus::CONNECT_PENDING,
        AsyncConnectStatus::CONNECTING,
        AsyncConnectStatus::CONNECTED,
        AsyncConnectStatus::CONNECT_FAILED,
        AsyncConnectStatus::DISCONNECT_PENDING,
        AsyncConnectStatus::DISCONNECTING,
    ] {
        m.add(s.name(), s)?;
    }
    m.add("AUTO_CONNECT", FeatureType::AUTO_CONNECT)?;
    m.add("CLIENT_SERVER_COMM", FeatureType::CLIENT_SERVER_COMM)?;

    m.add_class::<MemDesc>()?;
    m.add_class::<TransferOpDesc>()?;
    m.add_class::<TransferArgs>()?;
    m.add_class::<GetTransferStatusArgs>()?;
    m.add_class::<TransferResult>()?;
    m.add_class::<NotifyDesc>()?;
    m.add_class::<Hixl>()?;
    m.add_class::<HostMem>()?;
    m.add_function(wrap_pyfunction!(get_capability, m)?)?;
    m.add_function(wrap_pyfunction!(last_error_message, m)?)?;

    // `llm_datadist`'s native half (its package imports `hixl._hixl.datadist`)
    let dd = PyModule::new(m.py(), "datadist")?;
    datadist::register(&dd)?;
    m.add_submodule(&dd)?;
    Ok(())
}
