//! CANN's C++ ABI of `libcann_hixl.so`: `hixl::Hixl`'s methods and `ge::AscendString`'s
//! out-of-line methods, exported under the mangled names a program compiled against CANN's own
//! `include/hixl/hixl.h` (and GE's `graph/ascend_string.h`) calls.
//!
//! The methods are compiled C++ (`cxx/cann_hixl.cc`, `cxx/ascend_string.cc`, built by
//! `build.rs` with `-D_GLIBCXX_USE_CXX11_ABI=0` and hidden visibility into a static archive):
//! only symbols Rust defines are exported from a Rust `cdylib` (its version script), so each
//! exported name here is a one-line forward to its hidden C++ implementation. The C++ ones
//! are `extern "C"` functions (`hixl_cxx_*`) for `hixl::Hixl`, and `ge::AscendString`'s own
//! methods compiled under the namespace `hixl_ge` (the same mangled names after the namespace).
//! Itanium's C++ ABI passes `this` first and references as pointers, and every parameter here
//! is a pointer or an integer, so a C-ABI forward is the method's own calling convention.
//!
//! The library is linked with `-Bsymbolic-functions`: its own calls to these names (the C++
//! layer reads `ge::AscendString` through them) bind inside it, never to a program's inline
//! definitions of the same names (hixl's header-only `ge::AscendString`, for one).

use std::ffi::{c_char, c_void};

/// Defines each exported symbol as an `unsafe extern "C-unwind"` forward to its implementation:
/// a C++ method may throw (GE's `AscendString(const char*, size_t)` throws `std::length_error`
/// for a length no `std::string` holds, `std::bad_alloc` anywhere memory runs out), and the
/// exception must reach the C++ caller through this frame, which `extern "C"` forbids (undefined
/// behaviour: it has no unwind tables to pass through, and may abort).
macro_rules! forward {
    ($(
        $(#[$doc:meta])*
        $export:literal => $imp:literal fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?;
    )*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// Called by C++ code as the method it implements: `this` (the first pointer of a
        /// method) is a live object of the class, and every other pointer is a valid reference
        /// of the type the method's C++ signature names.
        #[unsafe(export_name = $export)]
        pub unsafe extern "C-unwind" fn $name($($arg: $ty),*) $(-> $ret)? {
            unsafe extern "C-unwind" {
                #[link_name = $imp]
                fn imp($($arg: $ty),*) $(-> $ret)?;
            }
            // SAFETY: the arguments are the caller's, passed on unchanged to the method's
            // implementation, which has the same contract (this function's `# Safety`).
            unsafe { imp($($arg),*) }
        }
    )*};
}

type P = *const c_void;
type M = *mut c_void;

forward! {
    /// `hixl::Hixl::Hixl()` (complete object).
    "_ZN4hixl4HixlC1Ev" => "hixl_cxx_construct" fn hixl_ctor_c1(this: M);
    /// `hixl::Hixl::Hixl()` (base object).
    "_ZN4hixl4HixlC2Ev" => "hixl_cxx_construct" fn hixl_ctor_c2(this: M);
    /// `hixl::Hixl::~Hixl()` (complete object).
    "_ZN4hixl4HixlD1Ev" => "hixl_cxx_destruct" fn hixl_dtor_d1(this: M);
    /// `hixl::Hixl::~Hixl()` (base object).
    "_ZN4hixl4HixlD2Ev" => "hixl_cxx_destruct" fn hixl_dtor_d2(this: M);
    /// `Initialize(const AscendString&, const std::map<AscendString, AscendString>&)`.
    "_ZN4hixl4Hixl10InitializeERKN2ge12AscendStringERKSt3mapIS2_S2_St4lessIS2_ESaISt4pairIS3_S2_EEE"
        => "hixl_cxx_initialize" fn hixl_initialize_cxx(this: M, local: P, options: P) -> u32;
    /// `Finalize()`.
    "_ZN4hixl4Hixl8FinalizeEv" => "hixl_cxx_finalize" fn hixl_finalize_cxx(this: M);
    /// `RegisterMem(const MemDesc&, MemType, MemHandle&)`.
    "_ZN4hixl4Hixl11RegisterMemERKNS_7MemDescENS_7MemTypeERPv"
        => "hixl_cxx_register_mem" fn hixl_register_mem_cxx(this: M, mem: P, kind: i32, handle: M) -> u32;
    /// `DeregisterMem(MemHandle)`.
    "_ZN4hixl4Hixl13DeregisterMemEPv"
        => "hixl_cxx_deregister_mem" fn hixl_deregister_mem_cxx(this: M, handle: M) -> u32;
    /// `Connect(const AscendString&, int32_t)`.
    "_ZN4hixl4Hixl7ConnectERKN2ge12AscendStringEi"
        => "hixl_cxx_connect" fn hixl_connect_cxx(this: M, remote: P, timeout: i32) -> u32;
    /// `Disconnect(const AscendString&, int32_t)`.
    "_ZN4hixl4Hixl10DisconnectERKN2ge12AscendStringEi"
        => "hixl_cxx_disconnect" fn hixl_disconnect_cxx(this: M, remote: P, timeout: i32) -> u32;
    /// `ConnectAsync(const AscendString&, int32_t)`.
    "_ZN4hixl4Hixl12ConnectAsyncERKN2ge12AscendStringEi"
        => "hixl_cxx_connect_async" fn hixl_connect_async_cxx(this: M, remote: P, timeout: i32) -> u32;
    /// `DisconnectAsync(const AscendString&, int32_t)`.
    "_ZN4hixl4Hixl15DisconnectAsyncERKN2ge12AscendStringEi"
        => "hixl_cxx_disconnect_async" fn hixl_disconnect_async_cxx(this: M, remote: P, timeout: i32) -> u32;
    /// `GetAsyncConnectStatus(const AscendString&, AsyncConnectStatus&)`.
    "_ZN4hixl4Hixl21GetAsyncConnectStatusERKN2ge12AscendStringERNS_18AsyncConnectStatusE"
        => "hixl_cxx_connect_status" fn hixl_connect_status_cxx(this: M, remote: P, status: M) -> u32;
    /// `GetAsyncConnectStatus(std::map<AscendString, AsyncConnectStatus>&)`.
    "_ZN4hixl4Hixl21GetAsyncConnectStatusERSt3mapIN2ge12AscendStringENS_18AsyncConnectStatusESt4lessIS3_ESaISt4pairIKS3_S4_EEE"
        => "hixl_cxx_connect_statuses" fn hixl_connect_statuses_cxx(this: M, all: M) -> u32;
    /// `TransferSync(const AscendString&, TransferOp, const std::vector<TransferOpDesc>&, int32_t)`.
    "_ZN4hixl4Hixl12TransferSyncERKN2ge12AscendStringENS_10TransferOpERKSt6vectorINS_14TransferOpDescESaIS7_EEi"
        => "hixl_cxx_transfer_sync" fn hixl_transfer_sync_cxx(this: M, remote: P, op: i32, descs: P, timeout: i32) -> u32;
    /// `TransferAsync(const AscendString&, TransferOp, const std::vector<TransferOpDesc>&,
    /// const TransferArgs&, TransferReq&)`.
    "_ZN4hixl4Hixl13TransferAsyncERKN2ge12AscendStringENS_10TransferOpERKSt6vectorINS_14TransferOpDescESaIS7_EERKNS_12TransferArgsERPv"
        => "hixl_cxx_transfer_async" fn hixl_transfer_async_cxx(this: M, remote: P, op: i32, descs: P, args: P, req: M) -> u32;
    /// `GetTransferStatus(const TransferReq&, TransferStatus&)`.
    "_ZN4hixl4Hixl17GetTransferStatusERKPvRNS_14TransferStatusE"
        => "hixl_cxx_transfer_status" fn hixl_transfer_status_cxx(this: M, req: P, status: M) -> u32;
    /// `GetTransferStatus(const GetTransferStatusArgs&, std::vector<TransferResult>&)`.
    "_ZN4hixl4Hixl17GetTransferStatusERKNS_21GetTransferStatusArgsERSt6vectorINS_14TransferResultESaIS5_EE"
        => "hixl_cxx_transfer_statuses" fn hixl_transfer_statuses_cxx(this: M, args: P, results: M) -> u32;
    /// `SendNotify(const AscendString&, const NotifyDesc&, int32_t)`.
    "_ZN4hixl4Hixl10SendNotifyERKN2ge12AscendStringERKNS_10NotifyDescEi"
        => "hixl_cxx_send_notify" fn hixl_send_notify_cxx(this: M, remote: P, notify: P, timeout: i32) -> u32;
    /// `GetNotifies(std::vector<NotifyDesc>&)`.
    "_ZN4hixl4Hixl11GetNotifiesERSt6vectorINS_10NotifyDescESaIS2_EE"
        => "hixl_cxx_get_notifies" fn hixl_get_notifies_cxx(this: M, notifies: M) -> u32;
    /// `static GetCapability(FeatureType, int32_t&)`.
    "_ZN4hixl4Hixl13GetCapabilityENS_11FeatureTypeERi"
        => "hixl_cxx_get_capability" fn hixl_get_capability_cxx(feature: i32, value: M) -> u32;

    /// `ge::AscendString::AscendString(const char*)` (complete object).
    "_ZN2ge12AscendStringC1EPKc" => "_ZN7hixl_ge12AscendStringC1EPKc"
        fn ascend_string_c1(this: M, s: *const c_char);
    /// `ge::AscendString::AscendString(const char*)` (base object).
    "_ZN2ge12AscendStringC2EPKc" => "_ZN7hixl_ge12AscendStringC2EPKc"
        fn ascend_string_c2(this: M, s: *const c_char);
    /// `ge::AscendString::AscendString(const char*, size_t)` (complete object).
    "_ZN2ge12AscendStringC1EPKcm" => "_ZN7hixl_ge12AscendStringC1EPKcm"
        fn ascend_string_len_c1(this: M, s: *const c_char, len: usize);
    /// `ge::AscendString::AscendString(const char*, size_t)` (base object).
    "_ZN2ge12AscendStringC2EPKcm" => "_ZN7hixl_ge12AscendStringC2EPKcm"
        fn ascend_string_len_c2(this: M, s: *const c_char, len: usize);
    /// `GetString() const`.
    "_ZNK2ge12AscendString9GetStringEv" => "_ZNK7hixl_ge12AscendString9GetStringEv"
        fn ascend_string_get_string(this: P) -> *const c_char;
    /// `GetLength() const`.
    "_ZNK2ge12AscendString9GetLengthEv" => "_ZNK7hixl_ge12AscendString9GetLengthEv"
        fn ascend_string_get_length(this: P) -> usize;
    /// `Find(const AscendString&) const`.
    "_ZNK2ge12AscendString4FindERKS0_" => "_ZNK7hixl_ge12AscendString4FindERKS0_"
        fn ascend_string_find(this: P, other: P) -> usize;
    /// `Hash() const`.
    "_ZNK2ge12AscendString4HashEv" => "_ZNK7hixl_ge12AscendString4HashEv"
        fn ascend_string_hash(this: P) -> usize;
    /// `operator<(const AscendString&) const`.
    "_ZNK2ge12AscendStringltERKS0_" => "_ZNK7hixl_ge12AscendStringltERKS0_"
        fn ascend_string_lt(this: P, other: P) -> bool;
    /// `operator>(const AscendString&) const`.
    "_ZNK2ge12AscendStringgtERKS0_" => "_ZNK7hixl_ge12AscendStringgtERKS0_"
        fn ascend_string_gt(this: P, other: P) -> bool;
    /// `operator<=(const AscendString&) const`.
    "_ZNK2ge12AscendStringleERKS0_" => "_ZNK7hixl_ge12AscendStringleERKS0_"
        fn ascend_string_le(this: P, other: P) -> bool;
    /// `operator>=(const AscendString&) const`.
    "_ZNK2ge12AscendStringgeERKS0_" => "_ZNK7hixl_ge12AscendStringgeERKS0_"
        fn ascend_string_ge(this: P, other: P) -> bool;
    /// `operator==(const AscendString&) const`.
    "_ZNK2ge12AscendStringeqERKS0_" => "_ZNK7hixl_ge12AscendStringeqERKS0_"
        fn ascend_string_eq(this: P, other: P) -> bool;
    /// `operator!=(const AscendString&) const`.
    "_ZNK2ge12AscendStringneERKS0_" => "_ZNK7hixl_ge12AscendStringneERKS0_"
        fn ascend_string_ne(this: P, other: P) -> bool;
    /// `operator==(const char*) const`.
    "_ZNK2ge12AscendStringeqEPKc" => "_ZNK7hixl_ge12AscendStringeqEPKc"
        fn ascend_string_eq_chars(this: P, other: *const c_char) -> bool;
    /// `operator!=(const char*) const`.
    "_ZNK2ge12AscendStringneEPKc" => "_ZNK7hixl_ge12AscendStringneEPKc"
        fn ascend_string_ne_chars(this: P, other: *const c_char) -> bool;
}
