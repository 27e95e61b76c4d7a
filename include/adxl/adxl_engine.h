/*
 * adxl/adxl_engine.h: adxl::AdxlEngine, ADXL's engine (adxl_engine.h of Huawei CANN's HIXL
 * package: the engine under its older name), source- and binary-compatible: libllm_datadist.so
 * exports its methods (the same mangled symbols as CANN's library), implemented over hixl's C ABI
 * (libcann_hixl.so). A pimpl class, as ADXL's: one std::unique_ptr member, methods out of line.
 *
 * Behaviour is ADXL's: every call before Initialize (or after Finalize) is FAILED; a null address
 * or handle, a timeout <= 0, a descriptor with a null local or remote address, or a notification
 * name or message over 1024 bytes is PARAM_INVALID; Initialize again replaces the engine;
 * GetNotifies appends to the vector it is given; TransferArgs' first 8 bytes are the request's
 * user data. The allocator statics are FabricMem's (EnableUseFabricMem=1): MallocMem allocates
 * ACL virtual memory (hixl_malloc_mem) on the calling thread's device, ExportToShareableHandle
 * gives its fabric handle (exported once, then cached; PARAM_INVALID for another address) and
 * FreeMem frees it. Where ACL (with its VMM calls) does not load, MallocMem(MEM_HOST) allocates
 * zeroed, page-aligned host memory instead (FreeMem frees it; it has no shareable handle:
 * UNSUPPORTED) and MEM_DEVICE is UNSUPPORTED.
 */
#ifndef CANN_HIXL_INCLUDE_ADXL_ADXL_ENGINE_H_
#define CANN_HIXL_INCLUDE_ADXL_ADXL_ENGINE_H_

#include <map>
#include <memory>
#include <vector>

#include "adxl_types.h"

namespace adxl {
class ASCEND_FUNC_VISIBILITY AdxlEngine {
 public:
  AdxlEngine();
  ~AdxlEngine();

  /* local_engine: "ip", "ip:port" (listens there), "[ipv6]", "[ipv6]:port"; options: HIXL's and
   * ADXL's keys (OPTION_*), an unknown key is PARAM_INVALID.
   * Initialize and Finalize may run while other threads call this object (each such call then
   * answers as the engine was when it started, or FAILED); destroying the object while a call
   * runs is not allowed, as for any C++ object. */
  Status Initialize(const AscendString &local_engine, const std::map<AscendString, AscendString> &options);
  void Finalize();

  Status RegisterMem(const MemDesc &mem, MemType type, MemHandle &mem_handle);
  Status DeregisterMem(MemHandle mem_handle);

  Status Connect(const AscendString &remote_engine, int32_t timeout_in_millis = 1000);
  Status Disconnect(const AscendString &remote_engine, int32_t timeout_in_millis = 1000);

  Status TransferSync(const AscendString &remote_engine, TransferOp operation,
                      const std::vector<TransferOpDesc> &op_descs, int32_t timeout_in_millis = 1000);
  Status TransferAsync(const AscendString &remote_engine, TransferOp operation,
                       const std::vector<TransferOpDesc> &op_descs, const TransferArgs &optional_args,
                       TransferReq &req);
  Status GetTransferStatus(const TransferReq &req, TransferStatus &status);

  Status SendNotify(const AscendString &remote_engine, const NotifyDesc &notify, int32_t timeout_in_millis = 1000);
  Status GetNotifies(std::vector<NotifyDesc> &notifies);

  static Status MallocMem(MemType type, size_t size, void **ptr);
  static Status ExportToShareableHandle(void *addr, ShareableHandle &handle);
  static Status FreeMem(void *ptr);
  static Status GetCapability(FeatureType feature_type, int32_t &value);

 private:
  class AdxlEngineImpl;
  std::unique_ptr<AdxlEngineImpl> impl_;
};
}  // namespace adxl

#endif  // CANN_HIXL_INCLUDE_ADXL_ADXL_ENGINE_H_
