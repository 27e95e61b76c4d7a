/*
 * hixl::Hixl declared as CANN's own include/hixl/hixl.h declares it: an exported class whose
 * methods are all out of line, with one std::unique_ptr to its implementation (CANN's
 * pimpl), over CANN's types (include/hixl/hixl_types.h, hixl's copy of them) and GE's
 * ge::AscendString with its methods out of line (include/hixl/ge_ascend_string.h). Written for
 * hixl's ABI test (tests/cpp_abi.rs): a program compiled against this, as against CANN's
 * header, calls libcann_hixl.so by CANN's mangled names, so hixl's header-only hixl/hixl.h is
 * not included.
 */
#ifndef HIXL_TEST_CANN_HIXL_H_
#define HIXL_TEST_CANN_HIXL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "hixl/ge_ascend_string.h"  // GE's declaration: every method out of line
#include "hixl/hixl_types.h"

namespace hixl {
class Hixl {
 public:
  Hixl();
  ~Hixl();
  Status Initialize(const AscendString &local_engine, const std::map<AscendString, AscendString> &options);
  void Finalize();
  Status RegisterMem(const MemDesc &mem, MemType type, MemHandle &mem_handle);
  Status DeregisterMem(MemHandle mem_handle);
  Status Connect(const AscendString &remote_engine, int32_t timeout_in_millis = 1000);
  Status Disconnect(const AscendString &remote_engine, int32_t timeout_in_millis = 1000);
  Status ConnectAsync(const AscendString &remote_engine, int32_t timeout_in_millis = 1000);
  Status DisconnectAsync(const AscendString &remote_engine, int32_t timeout_in_millis = 1000);
  Status GetAsyncConnectStatus(const AscendString &remote_engine, AsyncConnectStatus &status);
  Status GetAsyncConnectStatus(std::map<AscendString, AsyncConnectStatus> &statuses);
  Status TransferSync(const AscendString &remote_engine, TransferOp operation,
                      const std::vector<TransferOpDesc> &op_descs, int32_t timeout_in_millis = 1000);
  Status TransferAsync(const AscendString &remote_engine, TransferOp operation,
                       const std::vector<TransferOpDesc> &op_descs, const TransferArgs &optional_args,
                       TransferReq &req);
  Status GetTransferStatus(const TransferReq &req, TransferStatus &status);
  Status GetTransferStatus(const GetTransferStatusArgs &args, std::vector<TransferResult> &results);
  Status SendNotify(const AscendString &remote_engine, const NotifyDesc &notify, int32_t timeout_in_millis = 1000);
  Status GetNotifies(std::vector<NotifyDesc> &notifies);
  static Status GetCapability(FeatureType feature_type, int32_t &value);

 private:
  class HixlImpl;
  std::unique_ptr<HixlImpl> impl_;
};
}  // namespace hixl

#endif  // HIXL_TEST_CANN_HIXL_H_
