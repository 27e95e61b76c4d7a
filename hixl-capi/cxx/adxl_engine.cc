// adxl::AdxlEngine (adxl/adxl_engine.h) over hixl's C ABI (hixl_c.h, libcann_hixl.so): the
// compiled C++ layer of libllm_datadist.so, so that programs linked against CANN's library (its
// mangled C++ symbols) run on hixl. Each method checks what ADXL checks itself, then forwards.
#include "adxl/adxl_engine.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "hixl_c.h"

namespace adxl {
static_assert(sizeof(TransferOpDesc) == sizeof(hixl_transfer_op_desc) &&
                  offsetof(TransferOpDesc, local_addr) == offsetof(hixl_transfer_op_desc, local_addr) &&
                  offsetof(TransferOpDesc, remote_addr) == offsetof(hixl_transfer_op_desc, remote_addr) &&
                  offsetof(TransferOpDesc, len) == offsetof(hixl_transfer_op_desc, len),
              "ADXL's TransferOpDesc is hixl's");
static_assert(sizeof(TransferArgs) == sizeof(hixl_transfer_args), "TransferArgs: 128 bytes");
static_assert(MEM_DEVICE == HIXL_MEM_DEVICE && MEM_HOST == HIXL_MEM_HOST, "MemType");
static_assert(READ == HIXL_READ && WRITE == HIXL_WRITE, "TransferOp");

namespace {
// hixl's option: the device aclrtGetDevice reports at Initialize, or its error
constexpr const char kRequireDevice[] = "hixl.ascend.require_device";

// The host allocations of MallocMem, by address: FreeMem frees only these (with their length).
std::mutex g_alloc_mu;
std::map<void *, size_t> g_allocs;
}  // namespace

// The engine behind an AdxlEngine. Its lifecycle calls (Initialize, Finalize) may run while
// other threads call the engine: the current hixl engine is published through an atomic
// pointer, and one that Initialize or Finalize retires is finalized (hixl_finalize cancels and
// waits for its work, and refuses what comes later with FAILED) but destroyed only once no call
// holds it: each call counts itself in `calls_` before it loads the engine, and a retirement
// destroys what it retired only when it saw no call under way after unpublishing it (both
// sides sequentially consistent, so at least one sees the other). What a call still holds is
// destroyed at the next retirement that sees none, or with the object.
class AdxlEngine::AdxlEngineImpl {
 public:
  AdxlEngineImpl() = default;
  ~AdxlEngineImpl() {
    std::lock_guard<std::mutex> g(mu_);
    RetireLocked();
    for (hixl_engine *e : retired_) hixl_destroy(e);
  }
  AdxlEngineImpl(const AdxlEngineImpl &) = delete;
  AdxlEngineImpl &operator=(const AdxlEngineImpl &) = delete;

  Status Initialize(const AscendString &local_engine,
                    const std::map<AscendString, AscendString> &options) {
    std::lock_guard<std::mutex> g(mu_);
    // as ADXL: a new engine every time (an earlier one goes first, finalized)
    RetireLocked();
    hixl_engine *fresh = nullptr;
    Status st = hixl_create(&fresh);
    if (st != SUCCESS) return st;
    std::vector<const char *> keys, values;
    keys.reserve(options.size() + 1);
    values.reserve(options.size() + 1);
    for (const auto &kv : options) {
      keys.push_back(kv.first.GetString());
      values.push_back(kv.second.GetString());
    }
    // ADXL reads the thread's device when it starts and fails with ACL's error where none is
    // set (107002), never taking device 0 in its place (hixl's engine would, torch_npu's way)
    if (options.find(AscendString(kRequireDevice)) == options.end()) {
      keys.push_back(kRequireDevice);
      values.push_back("1");
    }
    st = hixl_initialize(fresh, local_engine.GetString(), keys.data(), values.data(), keys.size());
    if (st != SUCCESS) {
      hixl_destroy(fresh);  // never published: no call holds it
      return st;
    }
    engine_.store(fresh, std::memory_order_seq_cst);
    return SUCCESS;
  }

  void Finalize() {
    std::lock_guard<std::mutex> g(mu_);
    RetireLocked();
  }

  // A call under way: the engine it uses stays alive (not destroyed) until it ends.
  class Call {
   public:
    explicit Call(AdxlEngineImpl *impl) : impl_(impl) {
      impl_->calls_.fetch_add(1, std::memory_order_seq_cst);
      engine_ = impl_->engine_.load(std::memory_order_seq_cst);
    }
    ~Call() { impl_->calls_.fetch_sub(1, std::memory_order_seq_cst); }
    Call(const Call &) = delete;
    Call &operator=(const Call &) = delete;
    hixl_engine *engine() const { return engine_; }

   private:
    AdxlEngineImpl *impl_;
    hixl_engine *engine_;
  };

 private:
  // Unpublishes and finalizes the current engine; destroys every retired one when no call is
  // under way (under mu_).
  void RetireLocked() {
    hixl_engine *e = engine_.exchange(nullptr, std::memory_order_seq_cst);
    if (e != nullptr) {
      (void)hixl_finalize(e);
      retired_.push_back(e);
    }
    if (calls_.load(std::memory_order_seq_cst) == 0) {
      for (hixl_engine *r : retired_) hixl_destroy(r);
      retired_.clear();
    }
  }

  std::mutex mu_;
  std::atomic<hixl_engine *> engine_{nullptr};
  std::atomic<uint64_t> calls_{0};
  std::vector<hixl_engine *> retired_;
};

// the state lives as long as the object: lifecycle calls never replace it under other calls
AdxlEngine::AdxlEngine() : impl_(new (std::nothrow) AdxlEngineImpl()) {}

AdxlEngine::~AdxlEngine() = default;

Status AdxlEngine::Initialize(const AscendString &local_engine,
                              const std::map<AscendString, AscendString> &options) {
  if (impl_ == nullptr) return FAILED;
  return impl_->Initialize(local_engine, options);
}

void AdxlEngine::Finalize() {
  if (impl_ != nullptr) impl_->Finalize();
}

#define ADXL_ENGINE_OR_FAILED()                        \
  if (impl_ == nullptr) return FAILED;                  \
  const AdxlEngineImpl::Call adxl_call_(impl_.get());   \
  hixl_engine *const e = adxl_call_.engine();           \
  if (e == nullptr) return FAILED

Status AdxlEngine::RegisterMem(const MemDesc &mem, MemType type, MemHandle &mem_handle) {
  ADXL_ENGINE_OR_FAILED();
  // a null address is the library's to refuse (PARAM_INVALID), as every argument rule
  hixl_mem_desc d;
  std::memset(&d, 0, sizeof d);
  d.addr = mem.addr;
  d.len = mem.len;
  return hixl_register_mem(e, &d, static_cast<int32_t>(type), &mem_handle);
}

Status AdxlEngine::DeregisterMem(MemHandle mem_handle) {
  ADXL_ENGINE_OR_FAILED();
  if (mem_handle == nullptr) return PARAM_INVALID;
  return hixl_deregister_mem(e, mem_handle);
}

Status AdxlEngine::Connect(const AscendString &remote_engine, int32_t timeout_in_millis) {
  ADXL_ENGINE_OR_FAILED();
  return hixl_connect(e, remote_engine.GetString(), timeout_in_millis);
}

Status AdxlEngine::Disconnect(const AscendString &remote_engine, int32_t timeout_in_millis) {
  ADXL_ENGINE_OR_FAILED();
  return hixl_disconnect(e, remote_engine.GetString(), timeout_in_millis);
}

Status AdxlEngine::TransferSync(const AscendString &remote_engine, TransferOp operation,
                                const std::vector<TransferOpDesc> &op_descs, int32_t timeout_in_millis) {
  ADXL_ENGINE_OR_FAILED();
  // (a timeout <= 0, then a null address, before the link: PARAM_INVALID from the library)
  return hixl_transfer_sync(e, remote_engine.GetString(), static_cast<int32_t>(operation),
                            reinterpret_cast<const hixl_transfer_op_desc *>(op_descs.data()),
                            op_descs.size(), timeout_in_millis);
}

Status AdxlEngine::TransferAsync(const AscendString &remote_engine, TransferOp operation,
                                 const std::vector<TransferOpDesc> &op_descs,
                                 const TransferArgs &optional_args, TransferReq &req) {
  ADXL_ENGINE_OR_FAILED();
  // as ADXL: its reserved bytes become hixl's arguments (the first 8 the request's user data)
  hixl_transfer_args args;
  std::memcpy(&args, &optional_args, sizeof args);
  return hixl_transfer_async(e, remote_engine.GetString(), static_cast<int32_t>(operation),
                             reinterpret_cast<const hixl_transfer_op_desc *>(op_descs.data()),
                             op_descs.size(), &args, &req);
}

Status AdxlEngine::GetTransferStatus(const TransferReq &req, TransferStatus &status) {
  ADXL_ENGINE_OR_FAILED();
  if (req == nullptr) {
    status = TransferStatus::FAILED;
    return FAILED;
  }
  int32_t st = HIXL_TRANSFER_FAILED;
  const Status ret = hixl_get_transfer_status(e, req, &st);
  if (ret != SUCCESS) {
    status = TransferStatus::FAILED;
    return ret;
  }
  switch (st) {
    case HIXL_TRANSFER_WAITING: status = TransferStatus::WAITING; break;
    case HIXL_TRANSFER_COMPLETED: status = TransferStatus::COMPLETED; break;
    case HIXL_TRANSFER_TIMEOUT: status = TransferStatus::TIMEOUT; break;
    default: status = TransferStatus::FAILED; break;
  }
  return SUCCESS;
}

Status AdxlEngine::SendNotify(const AscendString &remote_engine, const NotifyDesc &notify,
                              int32_t timeout_in_millis) {
  ADXL_ENGINE_OR_FAILED();
  // the timeout and the lengths are the library's to check (before it looks for the link)
  return hixl_send_notify(e, remote_engine.GetString(), notify.name.GetString(),
                          notify.notify_msg.GetString(), timeout_in_millis);
}

Status AdxlEngine::GetNotifies(std::vector<NotifyDesc> &notifies) {
  ADXL_ENGINE_OR_FAILED();
  hixl_list *list = nullptr;
  const Status ret = hixl_get_notifies(e, &list);
  if (ret != SUCCESS) return ret;
  const size_t n = hixl_list_len(list);
  // as ADXL: appended to what the vector holds
  for (size_t i = 0; i < n; i++) {
    const char *name = nullptr, *msg = nullptr;
    if (hixl_list_notify(list, i, &name, &msg) != SUCCESS) continue;
    NotifyDesc d;
    d.name = AscendString(name);
    d.notify_msg = AscendString(msg);
    notifies.push_back(d);
  }
  hixl_list_free(list);
  return SUCCESS;
}

#undef ADXL_ENGINE_OR_FAILED

Status AdxlEngine::MallocMem(MemType type, size_t size, void **ptr) {
  if (ptr == nullptr || size == 0) return PARAM_INVALID;
  // FabricMem's VMM allocator where ACL has it; else host memory only
  const Status vmm = hixl_malloc_mem(static_cast<int32_t>(type), size, ptr);
  if (vmm != UNSUPPORTED || type != MEM_HOST) return vmm;
  const long page = sysconf(_SC_PAGESIZE);
  const size_t unit = page > 0 ? static_cast<size_t>(page) : 4096;
  if (size > SIZE_MAX - unit) return RESOURCE_EXHAUSTED;
  const size_t len = (size + unit - 1) / unit * unit;
  void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return RESOURCE_EXHAUSTED;
  {
    std::lock_guard<std::mutex> g(g_alloc_mu);
    g_allocs[p] = len;
  }
  *ptr = p;
  return SUCCESS;
}

Status AdxlEngine::ExportToShareableHandle(void *addr, ShareableHandle &handle) {
  static_assert(sizeof(ShareableHandle) == 128, "aclrtMemFabricHandle");
  {
    std::lock_guard<std::mutex> g(g_alloc_mu);
    if (g_allocs.count(addr) != 0) {  // host memory of the fallback: no VMM handle
      std::memset(&handle, 0, sizeof handle);
      return UNSUPPORTED;
    }
  }
  return hixl_export_to_shareable_handle(addr, reinterpret_cast<uint8_t *>(&handle));
}

Status AdxlEngine::FreeMem(void *ptr) {
  if (ptr == nullptr) return PARAM_INVALID;
  size_t len = 0;
  {
    std::lock_guard<std::mutex> g(g_alloc_mu);
    auto it = g_allocs.find(ptr);
    if (it == g_allocs.end()) return hixl_free_mem(ptr);  // VMM memory, or PARAM_INVALID
    len = it->second;
    g_allocs.erase(it);
  }
  (void)munmap(ptr, len);
  return SUCCESS;
}

Status AdxlEngine::GetCapability(FeatureType feature_type, int32_t &value) {
  return hixl_get_capability(static_cast<int32_t>(feature_type), &value);
}
}  // namespace adxl
