//! Hand-written UCP FFI, loaded with `dlopen("libucp.so.0")`.
//!
//! Only the types, constants and functions hixl uses are declared, with the layout of UCX 1.13
//! (`/usr/include/ucp/api/ucp.h`). Later UCX releases only append fields to these structs (every
//! parameter struct carries a field mask, so a 1.13-sized struct stays valid for them); the
//! layout test at the bottom of this file compiles a C program against the installed headers
//! and compares every size, offset, constant and function signature declared here.
//!
//! Things worth knowing about the UCX ABI:
//! - `ucs_status_t` is a *packed* enum (`__attribute__((packed))`): one signed byte, not an
//!   `int`. Every function returning it returns an `i8`.
//! - `ucs_status_ptr_t` is a `void *` that is either NULL (done), a small negative status
//!   (`UCS_PTR_IS_ERR`) or a request handle (`UCS_PTR_IS_PTR`); see [`ptr_is_ptr`] and
//!   [`ptr_status`] (and `ptr_is_err`, which the layout test checks).

// Only what the safe layer (`ucp/`) uses is declared, and every field of the structs it passes
// (their layout must match UCX's).

#![allow(non_camel_case_types)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulong, c_void};
use std::marker::{PhantomData, PhantomPinned};
use std::sync::OnceLock;

use crate::dl::Library;
use crate::error::Error;

/// Declares opaque C types (only ever used behind pointers).
macro_rules! opaque {
    ($($(#[$m:meta])* $name:ident;)*) => {
        $(
            $(#[$m])*
            #[repr(C)]
            pub(crate) struct $name {
                _data: [u8; 0],
                _marker: PhantomData<(*mut u8, PhantomPinned)>,
            }
        )*
    };
}

opaque! {
    /// `struct ucp_context`.
    ucp_context;
    /// `ucp_config_t` (`struct ucp_config`).
    ucp_config_t;
    /// `struct ucp_worker`.
    ucp_worker;
    /// `struct ucp_ep`.
    ucp_ep;
    /// `struct ucp_mem`.
    ucp_mem;
    /// `struct ucp_rkey`.
    ucp_rkey;
    /// `ucp_address_t` (`struct ucp_address`): a packed worker address of some length.
    ucp_address_t;
    /// `struct ucp_conn_request`.
    ucp_conn_request;
    /// `ucp_tag_recv_info_t` (`struct ucp_tag_recv_info`; never dereferenced here).
    ucp_tag_recv_info_t;
}

/// `ucp_context_h`.
pub(crate) type ucp_context_h = *mut ucp_context;
/// `ucp_worker_h`.
pub(crate) type ucp_worker_h = *mut ucp_worker;
/// `ucp_ep_h`.
pub(crate) type ucp_ep_h = *mut ucp_ep;
/// `ucp_mem_h`.
pub(crate) type ucp_mem_h = *mut ucp_mem;
/// `ucp_rkey_h`.
pub(crate) type ucp_rkey_h = *mut ucp_rkey;
/// `ucp_conn_request_h`.
pub(crate) type ucp_conn_request_h = *mut ucp_conn_request;
/// `ucs_status_ptr_t`: NULL, an error status cast to a pointer, or a request handle.
pub(crate) type ucs_status_ptr_t = *mut c_void;

/// Declares integer type aliases and (for the layout test) their size and signedness.
macro_rules! c_types {
    ($($(#[$m:meta])* $name:ident = $ty:ty;)*) => {
        $( $(#[$m])* pub(crate) type $name = $ty; )*

        /// `(name, size, signed)` of every integer alias, for the layout test.
        #[cfg(test)]
        pub(super) const TYPES: &[(&str, usize, bool)] = &[
            $( (stringify!($name), std::mem::size_of::<$ty>(), ((-1i64) as $ty) < (0 as $ty)) ),*
        ];
    };
}

c_types! {
    /// `ucs_status_t`: a packed enum, one signed byte.
    ucs_status_t = i8;
    /// `ucs_thread_mode_t`.
    ucs_thread_mode_t = c_uint;
    /// `ucp_err_handling_mode_t`.
    ucp_err_handling_mode_t = c_uint;
    /// `ucs_memory_type_t`.
    ucs_memory_type_t = c_uint;
    /// `ucp_datatype_t`.
    ucp_datatype_t = u64;
    /// `ucs_cpu_mask_t`.
    ucs_cpu_mask_t = c_ulong;
    /// `socklen_t`.
    socklen_t = libc::socklen_t;
}

/// Declares callback (function pointer) types and, for the layout test, their argument types.
macro_rules! c_callbacks {
    ($($(#[$m:meta])* $name:ident = fn($($arg:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        $( $(#[$m])* pub(crate) type $name = unsafe extern "C" fn($($arg),*) $(-> $ret)?; )*

        /// `(name, argument types, return type)` of every callback type, for the layout test.
        #[cfg(test)]
        pub(super) const CALLBACKS: &[(&str, &[&str], &str)] = &[
            $( (stringify!($name), &[$(stringify!($arg)),*], {
                #[allow(unused_variables)]
                let r = "()";
                $( let r = stringify!($ret); )?
                r
            }) ),*
        ];
    };
}

c_callbacks! {
    /// `ucp_err_handler_cb_t`: called from progress when an endpoint fails.
    ucp_err_handler_cb_t = fn(*mut c_void, ucp_ep_h, ucs_status_t);
    /// `ucp_request_init_callback_t`.
    ucp_request_init_callback_t = fn(*mut c_void);
    /// `ucp_request_cleanup_callback_t`.
    ucp_request_cleanup_callback_t = fn(*mut c_void);
    /// `ucp_send_nbx_callback_t`.
    ucp_send_nbx_callback_t = fn(*mut c_void, ucs_status_t, *mut c_void);
    /// `ucp_tag_recv_nbx_callback_t`.
    ucp_tag_recv_nbx_callback_t =
        fn(*mut c_void, ucs_status_t, *const ucp_tag_recv_info_t, *mut c_void);
    /// `ucp_stream_recv_nbx_callback_t`.
    ucp_stream_recv_nbx_callback_t = fn(*mut c_void, ucs_status_t, usize, *mut c_void);
    /// `ucp_am_recv_data_nbx_callback_t`.
    ucp_am_recv_data_nbx_callback_t = fn(*mut c_void, ucs_status_t, usize, *mut c_void);
}

/// Declares `#[repr(C)]` structs and unions and records their layout for the layout test.
///
/// Each type names the C type it mirrors; a union that is an anonymous member of a C struct
/// names that struct and the member (`in "ucp_request_param_t" . "cb"`). Fields may only be
/// integers, raw pointers, `Option` of function pointers, arrays of these, or other types
/// declared here: all-zero bytes are a valid value of each, which `zeroed()` relies on.
macro_rules! c_structs {
    ($(
        $(#[$m:meta])*
        $kind:ident $name:ident in $cty:literal $(. $cpath:literal)? {
            $( $(#[$fm:meta])* $field:ident : $fty:ty ),* $(,)?
        }
    )*) => {
        $(
            $(#[$m])*
            #[repr(C)]
            #[derive(Clone, Copy)]
            pub(crate) $kind $name {
                $( $(#[$fm])* pub(crate) $field: $fty, )*
            }

            impl $name {
                /// The all-zero value (every field unset, as UCX expects before `field_mask`
                /// bits are set).
                // generated for every struct; the nested ones are only zeroed with their parent
                #[allow(dead_code)]
                pub(crate) fn zeroed() -> Self {
                    // SAFETY: the macro only accepts field types for which all-zero bytes are
                    // valid (integers, raw pointers, `Option<fn>`, arrays and unions of these).
                    unsafe { std::mem::zeroed() }
                }
            }
        )*

        /// The layout of every declared struct and union, for the layout test.
        #[cfg(test)]
        pub(super) const LAYOUTS: &[tests::Layout] = &[
            $(
                tests::Layout {
                    rust: stringify!($name),
                    c_type: $cty,
                    c_path: { #[allow(unused_variables)] let p = ""; $( let p = $cpath; )? p },
                    size: std::mem::size_of::<$name>(),
                    align: std::mem::align_of::<$name>(),
                    fields: &[
                        $( (stringify!($field), std::mem::offset_of!($name, $field),
                            std::mem::size_of::<$fty>()) ),*
                    ],
                }
            ),*
        ];
    };
}

c_structs! {
    /// `ucp_params_t`: context parameters for `ucp_init_version`.
    struct ucp_params_t in "ucp_params_t" {
        /// `UCP_PARAM_FIELD_*` bits of the fields that are set.
        field_mask: u64,
        /// `UCP_FEATURE_*` bits.
        features: u64,
        /// Bytes reserved in each request for the user.
        request_size: usize,
        /// Request initializer.
        request_init: Option<ucp_request_init_callback_t>,
        /// Request cleanup.
        request_cleanup: Option<ucp_request_cleanup_callback_t>,
        /// Tag bits of the sender.
        tag_sender_mask: u64,
        /// Non-zero: workers of this context are used from several threads.
        mt_workers_shared: c_int,
        /// Expected number of endpoints.
        estimated_num_eps: usize,
        /// Expected processes per node.
        estimated_num_ppn: usize,
        /// Context name (for UCX logs).
        name: *const c_char,
    }

    /// `ucs_cpu_set_t`.
    struct ucs_cpu_set_t in "ucs_cpu_set_t" {
        /// 1024 CPU bits.
        ucs_bits: [ucs_cpu_mask_t; 1024 / (8 * std::mem::size_of::<ucs_cpu_mask_t>())],
    }

    /// `ucp_worker_params_t`.
    struct ucp_worker_params_t in "ucp_worker_params_t" {
        /// `UCP_WORKER_PARAM_FIELD_*` bits.
        field_mask: u64,
        /// `UCS_THREAD_MODE_*`.
        thread_mode: ucs_thread_mode_t,
        /// CPU affinity of the worker's resources.
        cpu_mask: ucs_cpu_set_t,
        /// `UCP_WAKEUP_*` events that signal the event fd.
        events: c_uint,
        /// User data.
        user_data: *mut c_void,
        /// External event fd.
        event_fd: c_int,
        /// `UCP_WORKER_FLAG_*`.
        flags: u64,
        /// Worker name.
        name: *const c_char,
        /// Active-message alignment.
        am_alignment: usize,
        /// Client id.
        client_id: u64,
    }

    /// `ucp_worker_attr_t` (output of `ucp_worker_query`).
    struct ucp_worker_attr_t in "ucp_worker_attr_t" {
        /// `UCP_WORKER_ATTR_FIELD_*` bits asked for.
        field_mask: u64,
        /// The worker's actual thread mode.
        thread_mode: ucs_thread_mode_t,
        /// Address flags.
        address_flags: u32,
        /// Worker address.
        address: *mut ucp_address_t,
        /// Its length.
        address_length: usize,
        /// Maximum AM header.
        max_am_header: usize,
        /// Worker name.
        name: [c_char; 32],
        /// Maximum debug string size.
        max_debug_string: usize,
    }

    /// `ucp_err_handler_t`.
    struct ucp_err_handler_t in "ucp_err_handler_t" {
        /// The callback (NULL: none).
        cb: Option<ucp_err_handler_cb_t>,
        /// Its first argument.
        arg: *mut c_void,
    }

    /// `ucs_sock_addr_t`.
    struct ucs_sock_addr_t in "ucs_sock_addr_t" {
        /// Socket address.
        addr: *const libc::sockaddr,
        /// Its length.
        addrlen: socklen_t,
    }

    /// `ucp_ep_params_t`.
    struct ucp_ep_params_t in "ucp_ep_params_t" {
        /// `UCP_EP_PARAM_FIELD_*` bits.
        field_mask: u64,
        /// Remote worker address.
        address: *const ucp_address_t,
        /// `UCP_ERR_HANDLING_MODE_*`.
        err_mode: ucp_err_handling_mode_t,
        /// Error handler.
        err_handler: ucp_err_handler_t,
        /// User data.
        user_data: *mut c_void,
        /// `UCP_EP_PARAMS_FLAGS_*`.
        flags: c_uint,
        /// Remote socket address (client-server mode).
        sockaddr: ucs_sock_addr_t,
        /// Connection request (server side of client-server mode).
        conn_request: ucp_conn_request_h,
        /// Endpoint name.
        name: *const c_char,
        /// Local socket address.
        local_sockaddr: ucs_sock_addr_t,
    }

    /// `ucp_mem_map_params_t`.
    struct ucp_mem_map_params_t in "ucp_mem_map_params_t" {
        /// `UCP_MEM_MAP_PARAM_FIELD_*` bits.
        field_mask: u64,
        /// Start of the memory.
        address: *mut c_void,
        /// Its length.
        length: usize,
        /// `UCP_MEM_MAP_*` flags.
        flags: c_uint,
        /// `UCP_MEM_MAP_PROT_*` bits.
        prot: c_uint,
        /// Memory type hint.
        memory_type: ucs_memory_type_t,
    }

    /// The anonymous `cb` union of `ucp_request_param_t`.
    union ucp_request_param_cb_t in "ucp_request_param_t" . "cb" {
        /// Send completion.
        send: Option<ucp_send_nbx_callback_t>,
        /// Tag receive completion.
        recv: Option<ucp_tag_recv_nbx_callback_t>,
        /// Stream receive completion.
        recv_stream: Option<ucp_stream_recv_nbx_callback_t>,
        /// AM data receive completion.
        recv_am: Option<ucp_am_recv_data_nbx_callback_t>,
    }

    /// The anonymous `recv_info` union of `ucp_request_param_t`.
    union ucp_request_param_recv_info_t in "ucp_request_param_t" . "recv_info" {
        /// Received length.
        length: *mut usize,
        /// Tag receive info.
        tag_info: *mut ucp_tag_recv_info_t,
    }

    /// `ucp_request_param_t`: parameters of every `*_nbx` call.
    struct ucp_request_param_t in "ucp_request_param_t" {
        /// `UCP_OP_ATTR_FIELD_*` and `UCP_OP_ATTR_FLAG_*` bits.
        op_attr_mask: u32,
        /// Operation-specific flags (`UCP_EP_CLOSE_FLAG_*` for `ucp_ep_close_nbx`).
        flags: u32,
        /// User-allocated request.
        request: *mut c_void,
        /// Completion callback.
        cb: ucp_request_param_cb_t,
        /// Datatype.
        datatype: ucp_datatype_t,
        /// Callback argument.
        user_data: *mut c_void,
        /// Reply buffer (atomics).
        reply_buffer: *mut c_void,
        /// Memory type of the buffer.
        memory_type: ucs_memory_type_t,
        /// Receive info.
        recv_info: ucp_request_param_recv_info_t,
        /// Memory handle of the local buffer (present since UCX 1.13).
        memh: ucp_mem_h,
    }
}

/// Declares constants and (for the layout test) their values.
macro_rules! c_consts {
    ($($(#[$m:meta])* $name:ident : $ty:ty = $val:expr;)*) => {
        $( $(#[$m])* pub(crate) const $name: $ty = $val; )*

        /// `(name, value)` of every constant, for the layout test.
        #[cfg(test)]
        pub(super) const CONSTS: &[(&str, i128)] = &[ $( (stringify!($name), $name as i128) ),* ];
    };
}

c_consts! {
    /// `UCS_OK`.
    UCS_OK: ucs_status_t = 0;
    /// `UCS_INPROGRESS`.
    UCS_INPROGRESS: ucs_status_t = 1;
    /// `UCS_ERR_IO_ERROR`.
    UCS_ERR_IO_ERROR: ucs_status_t = -3;
    /// `UCS_ERR_INVALID_PARAM`.
    UCS_ERR_INVALID_PARAM: ucs_status_t = -5;
    /// `UCS_ERR_UNREACHABLE`.
    UCS_ERR_UNREACHABLE: ucs_status_t = -6;
    /// `UCS_ERR_NO_DEVICE`.
    UCS_ERR_NO_DEVICE: ucs_status_t = -14;
    /// `UCS_ERR_BUSY`.
    UCS_ERR_BUSY: ucs_status_t = -15;
    /// `UCS_ERR_NOT_CONNECTED`.
    UCS_ERR_NOT_CONNECTED: ucs_status_t = -24;
    /// `UCS_ERR_CONNECTION_RESET`.
    UCS_ERR_CONNECTION_RESET: ucs_status_t = -25;
    /// `UCS_ERR_FIRST_LINK_FAILURE`.
    UCS_ERR_FIRST_LINK_FAILURE: ucs_status_t = -40;
    /// `UCS_ERR_LAST_LINK_FAILURE`.
    UCS_ERR_LAST_LINK_FAILURE: ucs_status_t = -59;
    /// `UCS_ERR_FIRST_ENDPOINT_FAILURE`.
    UCS_ERR_FIRST_ENDPOINT_FAILURE: ucs_status_t = -60;
    /// `UCS_ERR_ENDPOINT_TIMEOUT`.
    UCS_ERR_ENDPOINT_TIMEOUT: ucs_status_t = -80;
    /// `UCS_ERR_LAST_ENDPOINT_FAILURE`.
    UCS_ERR_LAST_ENDPOINT_FAILURE: ucs_status_t = -89;
    /// `UCS_ERR_LAST`: statuses are above it; `UCS_PTR_IS_ERR` compares against it.
    UCS_ERR_LAST: ucs_status_t = -100;

    /// `UCS_THREAD_MODE_SERIALIZED`.
    UCS_THREAD_MODE_SERIALIZED: ucs_thread_mode_t = 1;
    /// `UCS_THREAD_MODE_MULTI`.
    UCS_THREAD_MODE_MULTI: ucs_thread_mode_t = 2;

    /// `UCP_PARAM_FIELD_FEATURES`.
    UCP_PARAM_FIELD_FEATURES: u64 = 1 << 0;
    /// `UCP_PARAM_FIELD_MT_WORKERS_SHARED`.
    UCP_PARAM_FIELD_MT_WORKERS_SHARED: u64 = 1 << 5;
    /// `UCP_PARAM_FIELD_NAME`.
    UCP_PARAM_FIELD_NAME: u64 = 1 << 8;
    /// `UCP_FEATURE_RMA`.
    UCP_FEATURE_RMA: u64 = 1 << 1;
    /// `UCP_FEATURE_WAKEUP`.
    UCP_FEATURE_WAKEUP: u64 = 1 << 4;

    /// `UCP_WORKER_PARAM_FIELD_THREAD_MODE`.
    UCP_WORKER_PARAM_FIELD_THREAD_MODE: u64 = 1 << 0;
    /// `UCP_WORKER_ATTR_FIELD_THREAD_MODE`.
    UCP_WORKER_ATTR_FIELD_THREAD_MODE: u64 = 1 << 0;

    /// `UCP_EP_PARAM_FIELD_REMOTE_ADDRESS`.
    UCP_EP_PARAM_FIELD_REMOTE_ADDRESS: u64 = 1 << 0;
    /// `UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE`.
    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE: u64 = 1 << 1;
    /// `UCP_EP_PARAM_FIELD_ERR_HANDLER`.
    UCP_EP_PARAM_FIELD_ERR_HANDLER: u64 = 1 << 2;
    /// `UCP_ERR_HANDLING_MODE_NONE`.
    UCP_ERR_HANDLING_MODE_NONE: ucp_err_handling_mode_t = 0;
    /// `UCP_ERR_HANDLING_MODE_PEER`.
    UCP_ERR_HANDLING_MODE_PEER: ucp_err_handling_mode_t = 1;

    /// `UCP_MEM_MAP_PARAM_FIELD_ADDRESS`.
    UCP_MEM_MAP_PARAM_FIELD_ADDRESS: u64 = 1 << 0;
    /// `UCP_MEM_MAP_PARAM_FIELD_LENGTH`.
    UCP_MEM_MAP_PARAM_FIELD_LENGTH: u64 = 1 << 1;

    /// `UCP_OP_ATTR_FIELD_FLAGS`: `ucp_request_param_t::flags` is set.
    UCP_OP_ATTR_FIELD_FLAGS: u32 = 1 << 4;
    /// `UCP_OP_ATTR_FIELD_MEMH`.
    UCP_OP_ATTR_FIELD_MEMH: u32 = 1 << 8;

    /// `UCP_EP_CLOSE_FLAG_FORCE`: in `ucp_request_param_t::flags` of `ucp_ep_close_nbx`
    /// (with `UCP_OP_ATTR_FIELD_FLAGS`); without it the close flushes first.
    UCP_EP_CLOSE_FLAG_FORCE: u32 = 1 << 0;
}

/// The UCP API version hixl is written against and passes to `ucp_init_version`.
pub(crate) const API_VERSION: (c_uint, c_uint) = (1, 13);

/// `UCS_PTR_IS_ERR(ptr)`: the pointer encodes an error status (the product needs only
/// [`ptr_status`]; the layout test checks this against the C macro).
#[cfg(test)]
pub(crate) fn ptr_is_err(p: ucs_status_ptr_t) -> bool {
    p.addr() >= UCS_ERR_LAST as isize as usize
}

/// `UCS_PTR_IS_PTR(ptr)`: the pointer is a request handle (neither NULL nor an error).
pub(crate) fn ptr_is_ptr(p: ucs_status_ptr_t) -> bool {
    p.addr().wrapping_sub(1) < (UCS_ERR_LAST as isize as usize).wrapping_sub(1)
}

/// `UCS_PTR_STATUS(ptr)`: `UCS_INPROGRESS` for a request, else the encoded status (`UCS_OK`
/// for NULL).
pub(crate) fn ptr_status(p: ucs_status_ptr_t) -> ucs_status_t {
    if ptr_is_ptr(p) {
        UCS_INPROGRESS
    } else {
        // UCS_PTR_RAW_STATUS: (ucs_status_t)(intptr_t)ptr, i.e. truncated to the packed enum.
        p.addr() as isize as ucs_status_t
    }
}

/// Declares the function table: one field per symbol, the loader, and the signatures for the
/// layout test.
macro_rules! ucp_fns {
    ($($(#[$m:meta])* $name:ident : fn($($arg:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        /// The UCP (and `ucs_status_string`) functions, resolved from one `dlopen` handle.
        pub(crate) struct Ucp {
            /// The library the pointers come from: held, never read, so that it is not closed
            /// while `Ucp` exists.
            _lib: Library,
            /// `(major, minor, release)` reported by `ucp_get_version`.
            pub(crate) version: (c_uint, c_uint, c_uint),
            $( $(#[$m])* pub(crate) $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?, )*
        }

        impl Ucp {
            fn resolve(lib: Library) -> Result<Self, Error> {
                $(
                    // SAFETY: the function pointer type is the C declaration of the symbol in
                    // ucp.h / status.h (checked by the layout test); the pointer is stored next
                    // to `lib`, which is never closed while `Ucp` exists.
                    let $name = unsafe {
                        lib.sym::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(stringify!($name))
                    }?;
                )*
                Ok(Self { _lib: lib, version: (0, 0, 0), $($name),* })
            }
        }

        /// `(name, argument types, return type)` of every function, for the layout test.
        #[cfg(test)]
        pub(super) const FNS: &[(&str, &[&str], &str)] = &[
            $( (stringify!($name), &[$(stringify!($arg)),*], {
                #[allow(unused_variables)]
                let r = "()";
                $( let r = stringify!($ret); )?
                r
            }) ),*
        ];
    };
}

ucp_fns! {
    /// `ucp_get_version`.
    ucp_get_version: fn(*mut c_uint, *mut c_uint, *mut c_uint);
    /// `ucp_config_read`.
    ucp_config_read: fn(*const c_char, *const c_char, *mut *mut ucp_config_t) -> ucs_status_t;
    /// `ucp_config_release`.
    ucp_config_release: fn(*mut ucp_config_t);
    /// `ucp_init_version`.
    ucp_init_version: fn(
        c_uint,
        c_uint,
        *const ucp_params_t,
        *const ucp_config_t,
        *mut ucp_context_h,
    ) -> ucs_status_t;
    /// `ucp_cleanup`.
    ucp_cleanup: fn(ucp_context_h);
    /// `ucp_worker_create`.
    ucp_worker_create: fn(ucp_context_h, *const ucp_worker_params_t, *mut ucp_worker_h)
        -> ucs_status_t;
    /// `ucp_worker_destroy`.
    ucp_worker_destroy: fn(ucp_worker_h);
    /// `ucp_worker_query`.
    ucp_worker_query: fn(ucp_worker_h, *mut ucp_worker_attr_t) -> ucs_status_t;
    /// `ucp_worker_get_address`.
    ucp_worker_get_address: fn(ucp_worker_h, *mut *mut ucp_address_t, *mut usize)
        -> ucs_status_t;
    /// `ucp_worker_release_address`.
    ucp_worker_release_address: fn(ucp_worker_h, *mut ucp_address_t);
    /// `ucp_worker_progress`.
    ucp_worker_progress: fn(ucp_worker_h) -> c_uint;
    /// `ucp_worker_get_efd`.
    ucp_worker_get_efd: fn(ucp_worker_h, *mut c_int) -> ucs_status_t;
    /// `ucp_worker_arm`.
    ucp_worker_arm: fn(ucp_worker_h) -> ucs_status_t;
    /// `ucp_worker_signal` (thread-safe in every mode).
    ucp_worker_signal: fn(ucp_worker_h) -> ucs_status_t;
    /// `ucp_ep_create`.
    ucp_ep_create: fn(ucp_worker_h, *const ucp_ep_params_t, *mut ucp_ep_h) -> ucs_status_t;
    /// `ucp_ep_close_nbx`.
    ucp_ep_close_nbx: fn(ucp_ep_h, *const ucp_request_param_t) -> ucs_status_ptr_t;
    /// `ucp_ep_flush_nbx`.
    ucp_ep_flush_nbx: fn(ucp_ep_h, *const ucp_request_param_t) -> ucs_status_ptr_t;
    /// `ucp_mem_map`.
    ucp_mem_map: fn(ucp_context_h, *const ucp_mem_map_params_t, *mut ucp_mem_h) -> ucs_status_t;
    /// `ucp_mem_unmap`.
    ucp_mem_unmap: fn(ucp_context_h, ucp_mem_h) -> ucs_status_t;
    /// `ucp_rkey_pack`.
    ucp_rkey_pack: fn(ucp_context_h, ucp_mem_h, *mut *mut c_void, *mut usize) -> ucs_status_t;
    /// `ucp_rkey_buffer_release`.
    ucp_rkey_buffer_release: fn(*mut c_void);
    /// `ucp_ep_rkey_unpack`.
    ucp_ep_rkey_unpack: fn(ucp_ep_h, *const c_void, *mut ucp_rkey_h) -> ucs_status_t;
    /// `ucp_rkey_destroy`.
    ucp_rkey_destroy: fn(ucp_rkey_h);
    /// `ucp_put_nbx`.
    ucp_put_nbx: fn(
        ucp_ep_h,
        *const c_void,
        usize,
        u64,
        ucp_rkey_h,
        *const ucp_request_param_t,
    ) -> ucs_status_ptr_t;
    /// `ucp_get_nbx`.
    ucp_get_nbx: fn(
        ucp_ep_h,
        *mut c_void,
        usize,
        u64,
        ucp_rkey_h,
        *const ucp_request_param_t,
    ) -> ucs_status_ptr_t;
    /// `ucp_request_check_status`.
    ucp_request_check_status: fn(*mut c_void) -> ucs_status_t;
    /// `ucp_request_free`.
    ucp_request_free: fn(*mut c_void);
    /// `ucs_status_string` (libucs, found through libucp's dependencies).
    ucs_status_string: fn(ucs_status_t) -> *const c_char;
}

impl Ucp {
    /// UCX's text for a status code.
    pub(crate) fn status_string(&self, status: ucs_status_t) -> String {
        // SAFETY: ucs_status_string accepts any value and returns a static NUL-terminated
        // string ("Unknown error" for unknown codes).
        let p = unsafe { (self.ucs_status_string)(status) };
        if p.is_null() {
            return format!("ucs status {status}");
        }
        // SAFETY: non-null, NUL-terminated and static, as above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// The environment variable naming the UCP library to load (a path or a soname); when set, it is
/// the only one tried (instead of `libucp.so.0`).
pub(crate) const LIB_ENV: &str = "HIXL_UCX_LIB";

/// The default soname.
const DEFAULT_LIB: &str = "libucp.so.0";

/// Opens the library (the override first), resolves every symbol and checks the version.
fn load() -> Result<Ucp, Error> {
    // an explicit choice is tried alone: falling back would hide a wrong path
    let custom = std::env::var(LIB_ENV).ok().filter(|s| !s.is_empty());
    let candidates: Vec<&str> = match custom.as_deref() {
        Some(c) => vec![c],
        None => vec![DEFAULT_LIB],
    };
    let lib = Library::open(&candidates)?;
    let name = lib.name().to_string();
    let mut ucp = Ucp::resolve(lib)?;
    let (mut major, mut minor, mut release) = (0, 0, 0);
    // SAFETY: three valid out-pointers, as ucp_get_version expects.
    unsafe { (ucp.ucp_get_version)(&mut major, &mut minor, &mut release) };
    ucp.version = (major, minor, release);
    if (major, minor) < API_VERSION {
        return Err(Error::LibraryUnavailable {
            library: name,
            why: format!(
                "UCX {major}.{minor}.{release} is too old; hixl needs UCX {}.{} or later",
                API_VERSION.0, API_VERSION.1
            ),
        });
    }
    Ok(ucp)
}

/// The UCP function table, loaded on first use. A failure is remembered (as text) and returned
/// again on every call.
///
/// # Errors
/// [`Error::LibraryUnavailable`] when the library, a symbol, or a recent enough version is
/// missing.
pub(crate) fn ucp() -> Result<&'static Ucp, Error> {
    static UCP: OnceLock<Result<Ucp, (String, String)>> = OnceLock::new();
    match UCP.get_or_init(|| {
        load().map_err(|e| match e {
            Error::LibraryUnavailable { library, why } => (library, why),
            other => (DEFAULT_LIB.to_string(), other.to_string()),
        })
    }) {
        Ok(u) => Ok(u),
        Err((library, why)) => Err(Error::LibraryUnavailable {
            library: library.clone(),
            why: why.clone(),
        }),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::fmt::Write as _;
    use std::path::Path;
    use std::process::Command;

    /// The layout of one declared struct or union.
    pub(crate) struct Layout {
        /// Rust name.
        pub(crate) rust: &'static str,
        /// The C type (or the C struct holding the anonymous union).
        pub(crate) c_type: &'static str,
        /// For an anonymous union member: its member name in `c_type`; else empty.
        pub(crate) c_path: &'static str,
        /// `size_of`.
        pub(crate) size: usize,
        /// `align_of`.
        pub(crate) align: usize,
        /// `(field, offset, size)`.
        pub(crate) fields: &'static [(&'static str, usize, usize)],
    }

    /// Translates a Rust FFI type (as `stringify!` prints it) into a C type name.
    fn c_type(rust: &str) -> String {
        let s = rust.trim();
        if let Some(rest) = s.strip_prefix('*') {
            let rest = rest.trim_start();
            if let Some(inner) = rest.strip_prefix("const") {
                return format!("{} const *", c_type(inner));
            }
            if let Some(inner) = rest.strip_prefix("mut") {
                return format!("{} *", c_type(inner));
            }
            panic!("cannot translate {rust:?}");
        }
        match s {
            "()" => "void".into(),
            "c_void" => "void".into(),
            "c_char" => "char".into(),
            "c_int" => "int".into(),
            "c_uint" => "unsigned int".into(),
            "usize" => "size_t".into(),
            "u64" => "uint64_t".into(),
            "u32" => "uint32_t".into(),
            other => {
                assert!(
                    other.starts_with("ucp_") || other.starts_with("ucs_"),
                    "cannot translate {rust:?}"
                );
                other.into()
            }
        }
    }

    fn c_fn_type(args: &[&str], ret: &str) -> String {
        let args: Vec<String> = args.iter().map(|a| c_type(a)).collect();
        let args = if args.is_empty() {
            "void".to_string()
        } else {
            args.join(", ")
        };
        format!("{} (*)({})", c_type(ret), args)
    }

    /// Sample pointers for the `UCS_PTR_*` macros.
    const PTR_SAMPLES: &[isize] = &[
        0,
        1,
        2,
        -1,
        -5,
        -25,
        -99,
        -100,
        -101,
        4096,
        isize::MAX,
        -4096,
    ];

    /// The C program and the lines the Rust side expects it to print.
    fn program_and_expected() -> (String, Vec<String>) {
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <stdint.h>\n\
             #include <ucp/api/ucp.h>\n\nint main(void) {\n",
        );
        let mut expected = Vec::new();
        for (name, size, signed) in TYPES {
            writeln!(
                c,
                "  printf(\"type {name} %zu %d\\n\", sizeof({name}), (int)(({name})-1 < 0));"
            )
            .unwrap();
            expected.push(format!("type {name} {size} {}", i32::from(*signed)));
        }
        for l in LAYOUTS {
            let (size, align) = if l.c_path.is_empty() {
                (
                    format!("sizeof({})", l.c_type),
                    format!("__alignof__({})", l.c_type),
                )
            } else {
                let m = format!("((({}*)0)->{})", l.c_type, l.c_path);
                (format!("sizeof{m}"), format!("__alignof__{m}"))
            };
            writeln!(
                c,
                "  printf(\"struct {} %zu %zu\\n\", (size_t){size}, (size_t){align});",
                l.rust
            )
            .unwrap();
            expected.push(format!("struct {} {} {}", l.rust, l.size, l.align));
            for (field, offset, fsize) in l.fields {
                let (off, fsz) = if l.c_path.is_empty() {
                    (
                        format!("offsetof({}, {field})", l.c_type),
                        format!("sizeof(((({}*)0)->{field}))", l.c_type),
                    )
                } else {
                    (
                        format!(
                            "(offsetof({t}, {p}.{field}) - offsetof({t}, {p}))",
                            t = l.c_type,
                            p = l.c_path
                        ),
                        format!("sizeof(((({}*)0)->{}.{field}))", l.c_type, l.c_path),
                    )
                };
                writeln!(
                    c,
                    "  printf(\"field {}.{field} %zu %zu\\n\", (size_t){off}, (size_t){fsz});",
                    l.rust
                )
                .unwrap();
                expected.push(format!("field {}.{field} {offset} {fsize}", l.rust));
            }
        }
        for (name, value) in CONSTS {
            writeln!(
                c,
                "  printf(\"const {name} %lld\\n\", (long long)({name}));"
            )
            .unwrap();
            expected.push(format!("const {name} {value}"));
        }
        for (name, args, ret) in CALLBACKS {
            writeln!(
                c,
                "  printf(\"callback {name} %d\\n\", __builtin_types_compatible_p({name}, {}));",
                c_fn_type(args, ret)
            )
            .unwrap();
            expected.push(format!("callback {name} 1"));
        }
        for (name, args, ret) in FNS {
            writeln!(
                c,
                "  printf(\"fn {name} %d\\n\", \
                 __builtin_types_compatible_p(__typeof__(&{name}), {}));",
                c_fn_type(args, ret)
            )
            .unwrap();
            expected.push(format!("fn {name} 1"));
        }
        for p in PTR_SAMPLES {
            writeln!(
                c,
                "  {{ void *p = (void *)(intptr_t){p}LL; printf(\"ptr {p} %d %d %d\\n\", \
                 (int)UCS_PTR_IS_ERR(p), (int)UCS_PTR_IS_PTR(p), (int)UCS_PTR_STATUS(p)); }}"
            )
            .unwrap();
            let ptr = std::ptr::without_provenance_mut::<c_void>(*p as usize);
            expected.push(format!(
                "ptr {p} {} {} {}",
                i32::from(ptr_is_err(ptr)),
                i32::from(ptr_is_ptr(ptr)),
                ptr_status(ptr)
            ));
        }
        // the API version we pass must not be newer than the headers'
        c.push_str(
            "  printf(\"api %d %d\\n\", (int)UCP_API_MAJOR, (int)UCP_API_MINOR);\n  return 0;\n}\n",
        );
        (c, expected)
    }

    #[test]
    fn layout_matches_the_installed_headers() {
        let header = Path::new("/usr/include/ucp/api/ucp.h");
        if !header.exists() {
            eprintln!(
                "skipped: {} not found (install libucx-dev)",
                header.display()
            );
            return;
        }
        if Command::new("cc").arg("--version").output().is_err() {
            eprintln!("skipped: no C compiler `cc` on PATH");
            return;
        }
        let dir = std::env::temp_dir().join(format!("hixl-ucx-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (program, expected) = program_and_expected();
        let src = dir.join("layout.c");
        let exe = dir.join("layout");
        std::fs::write(&src, &program).expect("write layout.c");
        let out = Command::new("cc")
            .args(["-std=gnu11", "-Wall", "-o"])
            .arg(&exe)
            .arg(&src)
            .output()
            .expect("run cc");
        assert!(
            out.status.success(),
            "cc failed on {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let run = Command::new(&exe).output().expect("run layout program");
        assert!(run.status.success(), "layout program failed");
        let text = String::from_utf8(run.stdout).expect("utf-8");
        let mut lines: Vec<&str> = text.lines().collect();
        let api = lines.pop().expect("api line");
        let mut it = api
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse::<u32>().expect("number"));
        let header_api = (it.next().expect("major"), it.next().expect("minor"));
        assert!(
            header_api >= API_VERSION,
            "headers are UCX API {header_api:?}, older than the {API_VERSION:?} hixl declares"
        );
        assert_eq!(lines.len(), expected.len(), "program:\n{program}");
        let mut mismatches = Vec::new();
        for (got, want) in lines.iter().zip(&expected) {
            if *got == want.as_str() {
                continue;
            }
            // Newer UCX releases append fields to parameter structs; our (1.13) struct may then
            // be smaller than the header's, never different in the fields it declares.
            let (g, w): (Vec<&str>, Vec<&str>) =
                (got.split(' ').collect(), want.split(' ').collect());
            let grown = header_api > API_VERSION
                && g[0] == "struct"
                && w[0] == "struct"
                && g[1] == w[1]
                && w[2].parse::<usize>().ok() <= g[2].parse::<usize>().ok()
                && g[3] == w[3];
            if !grown {
                mismatches.push(format!("C: {got}\n   Rust: {want}"));
            }
        }
        assert!(
            mismatches.is_empty(),
            "{} layout mismatches with {}:\n{}",
            mismatches.len(),
            header.display(),
            mismatches.join("\n")
        );
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!(
            "checked {} lines against {} (UCX API {}.{})",
            expected.len(),
            header.display(),
            header_api.0,
            header_api.1
        );
    }

    #[test]
    fn the_checked_tables_cover_every_declaration() {
        // every struct declared has its fields listed (the macro generates both, this guards
        // against an empty table from a macro edit)
        assert!(LAYOUTS.iter().all(|l| !l.fields.is_empty()));
        assert!(LAYOUTS.len() >= 10 && CONSTS.len() >= 33 && FNS.len() >= 28);
        assert!(FNS.iter().any(|(n, ..)| *n == "ucs_status_string"));
    }

    #[test]
    fn ucs_ptr_helpers() {
        let p = |v: isize| std::ptr::without_provenance_mut::<c_void>(v as usize);
        assert!(!ptr_is_err(p(0)) && !ptr_is_ptr(p(0)) && ptr_status(p(0)) == UCS_OK);
        assert!(ptr_is_err(p(-25)) && ptr_status(p(-25)) == UCS_ERR_CONNECTION_RESET);
        assert!(ptr_is_ptr(p(0x1000)) && ptr_status(p(0x1000)) == UCS_INPROGRESS);
        assert!(ptr_is_err(p(-100)) && !ptr_is_err(p(-101)) && ptr_is_ptr(p(-101)));
    }

    #[test]
    fn loads_when_installed() {
        match ucp() {
            Ok(u) => {
                assert!((u.version.0, u.version.1) >= API_VERSION);
                assert_eq!(
                    u.status_string(UCS_ERR_CONNECTION_RESET),
                    "Connection reset by remote peer"
                );
                eprintln!("loaded UCX {:?}", u.version);
            }
            Err(e) => {
                assert!(matches!(e, Error::LibraryUnavailable { .. }), "{e:?}");
                eprintln!("skipped: {e}");
            }
        }
    }
}
