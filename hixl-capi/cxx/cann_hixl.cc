// hixl::Hixl as CANN's libcann_hixl.so exports it, for programs compiled against CANN's own
// include/hixl/hixl.h (an exported class: every method out of line, one std::unique_ptr to its
// implementation) and prebuilt ones. Compiled with CANN's C++ ABI (-D_GLIBCXX_USE_CXX11_ABI=0),
// hidden visibility, into a static archive linked into libhixl.so (libcann_hixl.so is that
// library under CANN's name); hixl-capi/src/cann_abi.rs exports each function below under the
// mangled name of the method it implements.
//
// The object a program allocates for hixl::Hixl is 8 bytes (CANN's std::unique_ptr); it holds
// hixl's header-only engine class (hixl/hixl.h: one hixl_engine pointer), constructed in place,
// so that both forms share one implementation over the C ABI. ge::AscendString is GE's (its
// methods out of line: those libhixl.so exports as well, hixl-capi/cxx/ascend_string.cc), and
// the calls below make to it bind inside the library (-Bsymbolic-functions): a program's own
// inline definitions of the same names never stand in for them.
//
// Nothing here throws across the C boundary: a C++ exception (std::bad_alloc) is FAILED.
#include "hixl/ge_ascend_string.h"  // GE's ge::AscendString (out of line), before hixl's header

#include "hixl/hixl.h"

#include <new>

namespace {
using Impl = hixl::header_only::Hixl;
using Options = std::map<hixl::AscendString, hixl::AscendString>;
static_assert(sizeof(Impl) == sizeof(void *) && alignof(Impl) <= alignof(void *),
              "the engine fits CANN's object: one std::unique_ptr");

Impl *Self(void *self) { return static_cast<Impl *>(self); }

template <typename F>
hixl::Status Guard(F &&f) {
  try {
    return f();
  } catch (...) {
    return hixl::FAILED;
  }
}
}  // namespace

extern "C" {
void hixl_cxx_construct(void *self) { new (self) Impl(); }  // hixl_create: no allocation to fail
void hixl_cxx_destruct(void *self) { Self(self)->~Impl(); }

hixl::Status hixl_cxx_initialize(void *self, const hixl::AscendString *local, const Options *options) {
  return Guard([&] { return Self(self)->Initialize(*local, *options); });
}
void hixl_cxx_finalize(void *self) { Self(self)->Finalize(); }
hixl::Status hixl_cxx_register_mem(void *self, const hixl::MemDesc *mem, hixl::MemType type,
                                   hixl::MemHandle *handle) {
  return Guard([&] { return Self(self)->RegisterMem(*mem, type, *handle); });
}
hixl::Status hixl_cxx_deregister_mem(void *self, hixl::MemHandle handle) {
  return Guard([&] { return Self(self)->DeregisterMem(handle); });
}
hixl::Status hixl_cxx_connect(void *self, const hixl::AscendString *remote, int32_t timeout) {
  return Guard([&] { return Self(self)->Connect(*remote, timeout); });
}
hixl::Status hixl_cxx_disconnect(void *self, const hixl::AscendString *remote, int32_t timeout) {
  return Guard([&] { return Self(self)->Disconnect(*remote, timeout); });
}
hixl::Status hixl_cxx_connect_async(void *self, const hixl::AscendString *remote, int32_t timeout) {
  return Guard([&] { return Self(self)->ConnectAsync(*remote, timeout); });
}
hixl::Status hixl_cxx_disconnect_async(void *self, const hixl::AscendString *remote, int32_t timeout) {
  return Guard([&] { return Self(self)->DisconnectAsync(*remote, timeout); });
}
hixl::Status hixl_cxx_connect_status(void *self, const hixl::AscendString *remote,
                                     hixl::AsyncConnectStatus *status) {
  return Guard([&] { return Self(self)->GetAsyncConnectStatus(*remote, *status); });
}
hixl::Status hixl_cxx_connect_statuses(void *self, std::map<hixl::AscendString, hixl::AsyncConnectStatus> *all) {
  return Guard([&] { return Self(self)->GetAsyncConnectStatus(*all); });
}
hixl::Status hixl_cxx_transfer_sync(void *self, const hixl::AscendString *remote, hixl::TransferOp op,
                                    const std::vector<hixl::TransferOpDesc> *descs, int32_t timeout) {
  return Guard([&] { return Self(self)->TransferSync(*remote, op, *descs, timeout); });
}
hixl::Status hixl_cxx_transfer_async(void *self, const hixl::AscendString *remote, hixl::TransferOp op,
                                     const std::vector<hixl::TransferOpDesc> *descs,
                                     const hixl::TransferArgs *args, hixl::TransferReq *req) {
  return Guard([&] { return Self(self)->TransferAsync(*remote, op, *descs, *args, *req); });
}
hixl::Status hixl_cxx_transfer_status(void *self, const hixl::TransferReq *req, hixl::TransferStatus *status) {
  return Guard([&] { return Self(self)->GetTransferStatus(*req, *status); });
}
hixl::Status hixl_cxx_transfer_statuses(void *self, const hixl::GetTransferStatusArgs *args,
                                        std::vector<hixl::TransferResult> *results) {
  return Guard([&] { return Self(self)->GetTransferStatus(*args, *results); });
}
hixl::Status hixl_cxx_send_notify(void *self, const hixl::AscendString *remote, const hixl::NotifyDesc *notify,
                                  int32_t timeout) {
  return Guard([&] { return Self(self)->SendNotify(*remote, *notify, timeout); });
}
hixl::Status hixl_cxx_get_notifies(void *self, std::vector<hixl::NotifyDesc> *notifies) {
  return Guard([&] { return Self(self)->GetNotifies(*notifies); });
}
hixl::Status hixl_cxx_get_capability(hixl::FeatureType feature, int32_t *value) {
  return Impl::GetCapability(feature, *value);
}
}
