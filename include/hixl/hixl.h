/*
 * hixl/hixl.h: HIXL's C++ API (class hixl::Hixl of Huawei CANN's HIXL), header-only, over
 * hixl's C ABI (hixl_c.h). A program written against HIXL's documented API compiles unchanged
 * against this header and runs over hixl's transports (TCP, same-host, UCX; HCCL for device
 * memory):
 *
 *   c++ -std=c++17 app.cpp -I include -L target/release -lhixl
 *
 * Method names, signatures and default timeouts (1000 ms) are HIXL's. Where CANN's ACL and HCCL
 * load, an engine moves device memory over HCCL on the device aclrtGetDevice reports on the
 * thread calling Initialize, as HIXL does; elsewhere MEM_DEVICE is UNSUPPORTED. Memory may be
 * registered and deregistered while linked, as in HIXL. What differs: BufferPool staging and
 * fabric memory are not implemented, CLIENT_SERVER_COMM is not supported, a region UCX serves
 * one-sided cannot be deregistered while linked (UNSUPPORTED) (see docs/c-and-cpp.md).
 * `-lcann_hixl` (HIXL's library name) links the same library: libcann_hixl.so is a symlink to
 * libhixl.so beside it. That library also exports hixl::Hixl as CANN's libcann_hixl.so does (its
 * methods out of line, by CANN's mangled names, CANN's C++ ABI), for programs compiled against
 * CANN's own hixl/hixl.h; this header's class is a separate, header-only one in the inline
 * namespace hixl::header_only (docs/c-and-cpp.md, "Two forms of hixl::Hixl").
 *
 * Beyond HIXL (hixl extensions, not in HIXL's header): GetLocalEngine gives the name with the
 * port an "ip:0" engine got; RegisterMemEx registers with flags (REGISTER_LOCAL_ONLY: peers
 * get no access); AllocHostMem allocates and registers engine-owned host memory, which
 * same-host peers reach one-sidedly (caller memory goes to them over TCP); TransferBlocks and
 * TransferBlocksAsync move blocks named by two index arrays (BlockDesc: bases, block size,
 * strides), checked once per call.
 */
#ifndef HIXL_RS_HIXL_H_
#define HIXL_RS_HIXL_H_

#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "hixl/hixl_types.h"
#include "hixl_c.h"

namespace hixl {

static_assert(sizeof(TransferOpDesc) == sizeof(hixl_transfer_op_desc), "TransferOpDesc layout");
static_assert(sizeof(MemDesc) == sizeof(hixl_mem_desc) &&
                  offsetof(MemDesc, reserved) == offsetof(hixl_mem_desc, reserved) &&
                  sizeof(MemDesc::reserved) == 128,
              "MemDesc layout");

/* hixl extension: RegisterMemEx's flags (HIXL_REGISTER_* of hixl_c.h). REGISTER_LOCAL_ONLY:
 * peers may not READ or WRITE the region. */
constexpr uint32_t REGISTER_LOCAL_ONLY = HIXL_REGISTER_LOCAL_ONLY;

/* hixl extension, beyond HIXL: the geometry of Hixl::TransferBlocks (hixl_block_desc). */
using BlockDesc = hixl_block_desc;

/* The header-only form of HIXL's class, in an inline namespace: `hixl::Hixl` names it in source,
 * but its symbols (hixl::header_only::Hixl::...) are its own, so a program built with it never
 * meets the exported class of the same name in libcann_hixl.so (the form a program compiled
 * against CANN's own hixl/hixl.h calls: see docs/c-and-cpp.md) and the two can share a process.
 * `namespace hixl { class Hixl; }` written by a program does not declare this class. */
inline namespace header_only {
class ASCEND_FUNC_VISIBILITY Hixl {
 public:
  Hixl() { (void)hixl_create(&engine_); }
  ~Hixl() { hixl_destroy(engine_); }
  Hixl(const Hixl &) = delete;
  Hixl &operator=(const Hixl &) = delete;

  Status Initialize(const AscendString &local_engine,
                    const std::map<AscendString, AscendString> &options) {
    std::vector<const char *> keys, values;
    for (const auto &kv : options) {
      keys.push_back(kv.first.GetString());
      values.push_back(kv.second.GetString());
    }
    return hixl_initialize(engine_, local_engine.GetString(), keys.data(), values.data(),
                           keys.size());
  }

  void Finalize() { (void)hixl_finalize(engine_); }

  Status RegisterMem(const MemDesc &mem, MemType type, MemHandle &mem_handle) {
    return RegisterMemEx(mem, type, 0, mem_handle);
  }

  /* hixl extension (beyond HIXL): RegisterMem with flags, an OR of REGISTER_* (0: RegisterMem).
   * REGISTER_LOCAL_ONLY keeps the region out of the table peers get: this engine's transfers
   * use it, a peer's READ or WRITE of it is refused. An unknown flag: PARAM_INVALID. */
  Status RegisterMemEx(const MemDesc &mem, MemType type, uint32_t flags, MemHandle &mem_handle) {
    hixl_mem_desc d;
    std::memset(&d, 0, sizeof d);
    d.addr = mem.addr;
    d.len = mem.len;
    return hixl_register_mem_ex(engine_, &d, static_cast<int32_t>(type), flags, &mem_handle);
  }

  /* hixl extension (beyond HIXL): engine-allocated host memory, the same-host fast path.
   * Allocates `size` zeroed, page-aligned bytes owned by the engine and registers them as
   * MEM_HOST (as RegisterMem would: peers may READ and WRITE them, links may exist); `addr`
   * gets the address, `mem_handle` the handle. Same-host peers map this memory and move data
   * with a memory copy, while memory registered with RegisterMem (the caller's) is served to
   * them over TCP. DeregisterMem(mem_handle) (or Finalize / the destructor) ends the
   * registration: stop using the memory then; the engine frees it once no same-host peer can
   * touch it. size 0: PARAM_INVALID; a size that cannot be allocated: RESOURCE_EXHAUSTED. */
  Status AllocHostMem(size_t size, void *&addr, MemHandle &mem_handle) {
    return hixl_alloc_host_mem(engine_, size, &addr, &mem_handle);
  }

  /* Deregisters memory of RegisterMem, or frees memory of AllocHostMem. */
  Status DeregisterMem(MemHandle mem_handle) { return hixl_deregister_mem(engine_, mem_handle); }

  Status Connect(const AscendString &remote_engine, int32_t timeout_in_millis = 1000) {
    return hixl_connect(engine_, remote_engine.GetString(), timeout_in_millis);
  }

  Status Disconnect(const AscendString &remote_engine, int32_t timeout_in_millis = 1000) {
    return hixl_disconnect(engine_, remote_engine.GetString(), timeout_in_millis);
  }

  Status ConnectAsync(const AscendString &remote_engine, int32_t timeout_in_millis = 1000) {
    return hixl_connect_async(engine_, remote_engine.GetString(), timeout_in_millis);
  }

  Status DisconnectAsync(const AscendString &remote_engine, int32_t timeout_in_millis = 1000) {
    return hixl_disconnect_async(engine_, remote_engine.GetString(), timeout_in_millis);
  }

  Status GetAsyncConnectStatus(const AscendString &remote_engine, AsyncConnectStatus &status) {
    int32_t s = 0;
    Status ret = hixl_get_async_connect_status(engine_, remote_engine.GetString(), &s);
    if (ret == SUCCESS) status = static_cast<AsyncConnectStatus>(s);
    return ret;
  }

  Status GetAsyncConnectStatus(std::map<AscendString, AsyncConnectStatus> &statuses) {
    hixl_list *list = nullptr;
    Status ret = hixl_get_all_async_connect_status(engine_, &list);
    if (ret != SUCCESS) return ret;
    statuses.clear();
    for (size_t i = 0; i < hixl_list_len(list); i++) {
      const char *remote = nullptr;
      int32_t s = 0;
      if (hixl_list_connect_status(list, i, &remote, &s) == SUCCESS)
        statuses[AscendString(remote)] = static_cast<AsyncConnectStatus>(s);
    }
    hixl_list_free(list);
    return SUCCESS;
  }

  Status TransferSync(const AscendString &remote_engine, TransferOp operation,
                      const std::vector<TransferOpDesc> &op_descs,
                      int32_t timeout_in_millis = 1000) {
    std::vector<hixl_transfer_op_desc> d = Descs(op_descs);
    return hixl_transfer_sync(engine_, remote_engine.GetString(), static_cast<int32_t>(operation),
                              d.data(), d.size(), timeout_in_millis);
  }

  Status TransferAsync(const AscendString &remote_engine, TransferOp operation,
                       const std::vector<TransferOpDesc> &op_descs,
                       const TransferArgs &optional_args, TransferReq &req) {
    std::vector<hixl_transfer_op_desc> d = Descs(op_descs);
    hixl_transfer_args a;
    std::memset(&a, 0, sizeof a);
    a.user_data = optional_args.user_data;
    return hixl_transfer_async(engine_, remote_engine.GetString(),
                               static_cast<int32_t>(operation), d.data(), d.size(), &a, &req);
  }

  /* hixl extension, beyond HIXL: block-indexed transfers (hixl_transfer_blocks_sync of
   * hixl_c.h). Block i moves desc.block_size bytes between desc.local_addr + local_idx[i] *
   * local_stride and desc.remote_addr + remote_idx[i] * remote_stride (a stride of 0: the block
   * size); checked once per call, never expanded into descriptors over TCP. Index arrays of
   * uint32_t or uint64_t; the vector forms give PARAM_INVALID for vectors of different sizes. */
  Status TransferBlocks(const AscendString &remote_engine, TransferOp operation,
                        const BlockDesc &desc, const uint32_t *local_idx,
                        const uint32_t *remote_idx, size_t count,
                        int32_t timeout_in_millis = 1000) {
    return hixl_transfer_blocks_sync(engine_, remote_engine.GetString(),
                                     static_cast<int32_t>(operation), &desc, local_idx,
                                     remote_idx, count, HIXL_INDEX_U32, timeout_in_millis);
  }
  Status TransferBlocks(const AscendString &remote_engine, TransferOp operation,
                        const BlockDesc &desc, const uint64_t *local_idx,
                        const uint64_t *remote_idx, size_t count,
                        int32_t timeout_in_millis = 1000) {
    return hixl_transfer_blocks_sync(engine_, remote_engine.GetString(),
                                     static_cast<int32_t>(operation), &desc, local_idx,
                                     remote_idx, count, HIXL_INDEX_U64, timeout_in_millis);
  }
  template <typename I>
  Status TransferBlocks(const AscendString &remote_engine, TransferOp operation,
                        const BlockDesc &desc, const std::vector<I> &local_idx,
                        const std::vector<I> &remote_idx, int32_t timeout_in_millis = 1000) {
    if (local_idx.size() != remote_idx.size()) return HIXL_PARAM_INVALID;
    return TransferBlocks(remote_engine, operation, desc, local_idx.data(), remote_idx.data(),
                          local_idx.size(), timeout_in_millis);
  }
  /* The async form: the indices are copied (the arrays may go once it returns). */
  template <typename I>
  Status TransferBlocksAsync(const AscendString &remote_engine, TransferOp operation,
                             const BlockDesc &desc, const std::vector<I> &local_idx,
                             const std::vector<I> &remote_idx, const TransferArgs &optional_args,
                             TransferReq &req) {
    static_assert(sizeof(I) == 4 || sizeof(I) == 8, "uint32_t or uint64_t indices");
    if (local_idx.size() != remote_idx.size()) return HIXL_PARAM_INVALID;
    hixl_transfer_args a;
    std::memset(&a, 0, sizeof a);
    a.user_data = optional_args.user_data;
    return hixl_transfer_blocks_async(engine_, remote_engine.GetString(),
                                      static_cast<int32_t>(operation), &desc, local_idx.data(),
                                      remote_idx.data(), local_idx.size(),
                                      static_cast<int32_t>(sizeof(I)), &a, &req);
  }

  Status GetTransferStatus(const TransferReq &req, TransferStatus &status) {
    int32_t s = 0;
    Status ret = hixl_get_transfer_status(engine_, req, &s);
    status = static_cast<TransferStatus>(s);
    return ret;
  }

  Status GetTransferStatus(const GetTransferStatusArgs &args, std::vector<TransferResult> &results) {
    size_t pending = 0;
    Status ret = hixl_pending_transfers(engine_, &pending);
    if (ret != SUCCESS) return ret;
    hixl_get_transfer_status_args a;
    std::memset(&a, 0, sizeof a);
    a.max_query_count = args.max_query_count;
    a.skip_waiting = args.skip_waiting;
    std::vector<hixl_transfer_result> got(pending);
    size_t n = 0;
    ret = hixl_get_transfer_statuses(engine_, &a, got.data(), got.size(), &n);
    if (ret != SUCCESS) return ret;
    results.clear();
    for (size_t i = 0; i < n; i++) {
      TransferResult r;
      r.req = got[i].req;
      r.user_data = got[i].user_data;
      r.status = static_cast<TransferStatus>(got[i].status);
      results.push_back(r);
    }
    return SUCCESS;
  }

  Status SendNotify(const AscendString &remote_engine, const NotifyDesc &notify,
                    int32_t timeout_in_millis = 1000) {
    return hixl_send_notify(engine_, remote_engine.GetString(), notify.name.GetString(),
                            notify.notify_msg.GetString(), timeout_in_millis);
  }

  Status GetNotifies(std::vector<NotifyDesc> &notifies) {
    hixl_list *list = nullptr;
    Status ret = hixl_get_notifies(engine_, &list);
    if (ret != SUCCESS) return ret;
    notifies.clear();
    for (size_t i = 0; i < hixl_list_len(list); i++) {
      const char *name = nullptr, *msg = nullptr;
      if (hixl_list_notify(list, i, &name, &msg) == SUCCESS) {
        NotifyDesc n;
        n.name = AscendString(name);
        n.notify_msg = AscendString(msg);
        notifies.push_back(n);
      }
    }
    hixl_list_free(list);
    return SUCCESS;
  }

  static Status GetCapability(FeatureType feature_type, int32_t &value) {
    return hixl_get_capability(static_cast<int32_t>(feature_type), &value);
  }

  /* hixl extension: the name peers connect to, with the port an "ip:0" engine got. */
  Status GetLocalEngine(AscendString &local_engine) const {
    size_t len = 0;
    Status ret = hixl_local_engine(engine_, nullptr, 0, &len);
    if (ret != SUCCESS && ret != RESOURCE_EXHAUSTED) return ret;
    std::vector<char> buf(len + 1);
    ret = hixl_local_engine(engine_, buf.data(), buf.size(), &len);
    if (ret == SUCCESS) local_engine = AscendString(buf.data(), len);
    return ret;
  }

 private:
  static std::vector<hixl_transfer_op_desc> Descs(const std::vector<TransferOpDesc> &op_descs) {
    std::vector<hixl_transfer_op_desc> d(op_descs.size());
    for (size_t i = 0; i < op_descs.size(); i++) {
      d[i].local_addr = op_descs[i].local_addr;
      d[i].remote_addr = op_descs[i].remote_addr;
      d[i].len = op_descs[i].len;
    }
    return d;
  }

  hixl_engine *engine_ = nullptr;
};
}  // namespace header_only

}  // namespace hixl

#endif  // HIXL_RS_HIXL_H_
