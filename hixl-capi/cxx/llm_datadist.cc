// llm_datadist::LlmDataDist (llm_datadist/llm_datadist.h) over hixl's LLM-DataDist C ABI
// (hixl_dd.h, in libcann_hixl.so): the compiled C++ layer of libllm_datadist.so, so that programs
// built against CANN's LLM-DataDist (its mangled C++ symbols) run on hixl. Each method translates
// its C++ arguments into the C ABI's (CANN's own forms: hixl_dd_cann_*) and forwards; it checks
// nothing. Every rule, CANN's order and codes (LLM_FAILED before Initialize, then the arguments,
// then links, caches, block and batch bounds) are the Rust instance's
// (src/datadist/core/args.rs, cann.rs). An instance that was never created (before its first
// Initialize, or a role the C ABI refused) is LLM_FAILED, as CANN's uninitialized one.
#include "llm_datadist/llm_datadist.h"

#include <atomic>
#include <mutex>
#include <new>
#include <string>

#include "hixl_dd.h"
#include "llm_datadist/llm_error_codes.h"

namespace llm_datadist {
static_assert(LLM_PARAM_INVALID == HIXL_LLM_PARAM_INVALID && LLM_NOT_YET_LINK == HIXL_LLM_NOT_YET_LINK &&
                  LLM_FEATURE_NOT_ENABLED == HIXL_LLM_FEATURE_NOT_ENABLED && LLM_FAILED == HIXL_LLM_FAILED,
              "LLM-DataDist's codes are the C ABI's");
static_assert(ge::LLM_KV_CACHE_NOT_EXIST == LLM_KV_CACHE_NOT_EXIST && ge::LLM_OUT_OF_MEMORY == LLM_OUT_OF_MEMORY,
              "llm_error_codes.h and llm_datadist.h agree");
static_assert(static_cast<int32_t>(LlmRole::kPrompt) == HIXL_DD_ROLE_PROMPT &&
                  static_cast<int32_t>(LlmRole::kMix) == HIXL_DD_ROLE_MIX,
              "LlmRole");
static_assert(static_cast<uint32_t>(CachePlacement::kDevice) == HIXL_DD_PLACEMENT_DEVICE, "CachePlacement");
static_assert(sizeof(void *) != 8 || (sizeof(hixl_dd_cluster_info) == 48 && sizeof(hixl_dd_cache_index) == 24 &&
                                      sizeof(hixl_dd_cache_desc) == 32 && sizeof(hixl_dd_layers) == 20 &&
                                      sizeof(hixl_dd_cache_arg) == 16),
              "the C ABI's layouts");

namespace {
// Option pairs as the C ABI takes them; the strings live in `options`.
struct Options {
  explicit Options(const std::map<AscendString, AscendString> &options) {
    keys.reserve(options.size());
    values.reserve(options.size());
    for (const auto &kv : options) {
      keys.push_back(kv.first.GetString());
      values.push_back(kv.second.GetString());
    }
  }
  std::vector<const char *> keys;
  std::vector<const char *> values;
};

// A cluster's addresses in the C ABI's form (their text stays in `in`).
void ToIpInfos(const std::vector<IpInfo> &in, std::vector<hixl_dd_ip_info> &out) {
  out.reserve(in.size());
  for (const auto &ip : in) {
    hixl_dd_ip_info info{};
    info.ip = ip.ip.GetString();
    info.port = ip.port;
    out.push_back(info);
  }
}

// A KvCacheExtParam in the C ABI's form (hixl_dd_layers' layout; its meaning is CANN's).
hixl_dd_layers Ext(const KvCacheExtParam &p) {
  hixl_dd_layers l{};
  l.src_first = p.src_layer_range.first;
  l.src_last = p.src_layer_range.second;
  l.dst_first = p.dst_layer_range.first;
  l.dst_last = p.dst_layer_range.second;
  l.tensor_num_per_layer = p.tensor_num_per_layer;
  return l;
}

// A push's Cache argument as CANN's push reads it: its id, placement and tensor count.
hixl_dd_cache_arg Arg(const Cache &c) {
  hixl_dd_cache_arg a{};
  a.cache_id = c.cache_id;
  a.placement = static_cast<uint32_t>(c.cache_desc.placement);
  a.num_tensors = c.cache_desc.num_tensors;
  return a;
}

hixl_dd_cache_index Index(const CacheIndex &i) {
  hixl_dd_cache_index c{};
  c.cluster_id = i.cluster_id;
  c.cache_id = i.cache_id;
  c.batch_index = i.batch_index;
  return c;
}
}  // namespace

class LlmDataDist::LlmDataDistImpl {
 public:
  LlmDataDistImpl(uint64_t cluster_id, LlmRole role) : cluster_id_(cluster_id), role_(role) {}
  ~LlmDataDistImpl() { hixl_dd_destroy(dd_.load()); }  // finalizes
  LlmDataDistImpl(const LlmDataDistImpl &) = delete;
  LlmDataDistImpl &operator=(const LlmDataDistImpl &) = delete;

  Status Initialize(const std::map<AscendString, AscendString> &options) {
    std::lock_guard<std::mutex> lk(mu_);
    hixl_dd *dd = dd_.load();
    if (dd == nullptr) {
      // (the role is the C ABI's to check)
      const Status st = hixl_dd_create(cluster_id_, static_cast<int32_t>(role_), &dd);
      if (st != LLM_SUCCESS) return st;
      dd_.store(dd);
    }
    const Options o(options);
    return hixl_dd_cann_initialize(dd, o.keys.data(), o.values.data(), o.keys.size());
  }

  void Finalize() {
    hixl_dd *const dd = dd_.load();
    if (dd != nullptr) (void)hixl_dd_finalize(dd);
  }

  hixl_dd *dd() const { return dd_.load(); }

  Status SetRole(hixl_dd *dd, LlmRole role, const std::map<AscendString, AscendString> &options) {
    std::lock_guard<std::mutex> lk(mu_);  // role_
    const Options o(options);
    const Status st = hixl_dd_set_role(dd, static_cast<int32_t>(role), o.keys.data(), o.values.data(),
                                       o.keys.size());
    if (st == LLM_SUCCESS) role_ = role;
    return st;
  }

 private:
  std::mutex mu_;
  // made by the first Initialize (under mu_), kept until destruction
  std::atomic<hixl_dd *> dd_{nullptr};
  const uint64_t cluster_id_;
  LlmRole role_;
};

LlmDataDist::LlmDataDist(uint64_t cluster_id, LlmRole role)
    : impl_(new (std::nothrow) LlmDataDistImpl(cluster_id, role)) {}

LlmDataDist::~LlmDataDist() { Finalize(); }

Status LlmDataDist::Initialize(const std::map<AscendString, AscendString> &options) {
  if (impl_ == nullptr) return LLM_FAILED;
  // (a code CANN's Initialize does not return is LLM_FAILED already: DataDist::cann_initialize)
  return impl_->Initialize(options);
}

void LlmDataDist::Finalize() {
  if (impl_ != nullptr) impl_->Finalize();
}

// The instance of every call but Initialize and Finalize: none before the first Initialize
// (LLM_FAILED, as CANN's uninitialized instance); the C ABI reports one not initialized (or
// finalized) LLM_FAILED before anything else.
#define LLM_DD()                                      \
  hixl_dd *const dd = impl_ == nullptr ? nullptr : impl_->dd(); \
  if (dd == nullptr) return LLM_FAILED

Status LlmDataDist::SetRole(LlmRole role, const std::map<AscendString, AscendString> &options) {
  LLM_DD();
  return impl_->SetRole(dd, role, options);
}

namespace {
// Clusters in the C ABI's form (their addresses in `storage`).
void ToClusters(const std::vector<ClusterInfo> &clusters, std::vector<std::vector<hixl_dd_ip_info>> &storage,
                std::vector<hixl_dd_cluster_info> &out) {
  storage.resize(clusters.size() * 2U);
  out.reserve(clusters.size());
  for (size_t i = 0U; i < clusters.size(); ++i) {
    const auto &c = clusters[i];
    auto &remote = storage[2U * i];
    auto &local = storage[2U * i + 1U];
    ToIpInfos(c.remote_ip_infos, remote);
    ToIpInfos(c.local_ip_infos, local);
    hixl_dd_cluster_info info{};
    info.remote_cluster_id = c.remote_cluster_id;
    info.remote_role_type = c.remote_role_type;
    info.local_ip_infos = local.data();
    info.local_ip_count = local.size();
    info.remote_ip_infos = remote.data();
    info.remote_ip_count = remote.size();
    out.push_back(info);
  }
}
}  // namespace

Status LlmDataDist::LinkLlmClusters(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets,
                                    int32_t timeout_in_millis) {
  LLM_DD();
  std::vector<std::vector<hixl_dd_ip_info>> storage;
  std::vector<hixl_dd_cluster_info> cs;
  ToClusters(clusters, storage, cs);
  std::vector<Status> each(cs.size(), LLM_SUCCESS);
  bool reached = false;
  const Status st = hixl_dd_cann_link_clusters(dd, cs.data(), cs.size(), timeout_in_millis, each.data(), &reached);
  // each cluster's status after what rets held, as CANN's (a call refused before the clusters
  // leaves rets as they were)
  if (reached) rets.insert(rets.end(), each.begin(), each.end());
  return st;
}

Status LlmDataDist::UnlinkLlmClusters(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets,
                                      int32_t timeout_in_millis, bool force_flag) {
  LLM_DD();
  std::vector<std::vector<hixl_dd_ip_info>> storage;
  std::vector<hixl_dd_cluster_info> cs;
  ToClusters(clusters, storage, cs);
  std::vector<Status> each(cs.size(), LLM_SUCCESS);
  bool reached = false;
  const Status st = hixl_dd_cann_unlink_clusters(dd, cs.data(), cs.size(), timeout_in_millis, force_flag,
                                                 each.data(), &reached);
  if (reached) rets.insert(rets.end(), each.begin(), each.end());
  return st;
}

Status LlmDataDist::AllocateCache(const CacheDesc &cache_desc, Cache &cache) {
  (void)cache_desc;
  (void)cache;
  return LLM_FEATURE_NOT_ENABLED;
}

Status LlmDataDist::DeallocateCache(int64_t cache_id) {
  (void)cache_id;
  return LLM_FEATURE_NOT_ENABLED;
}

Status LlmDataDist::PullKvCache(const CacheIndex &src_cache_index, const Cache &dst_cache, uint32_t batch_index,
                                int64_t size, const KvCacheExtParam &ext_param) {
  LLM_DD();
  const hixl_dd_cache_index src = Index(src_cache_index);
  const hixl_dd_layers ext = Ext(ext_param);
  return hixl_dd_cann_pull_cache(dd, &src, dst_cache.cache_id, batch_index, size, &ext);
}

Status LlmDataDist::PullKvBlocks(const CacheIndex &src_cache_index, const Cache &dst_cache,
                                 const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                                 const KvCacheExtParam &ext_param) {
  LLM_DD();
  const hixl_dd_cache_index src = Index(src_cache_index);
  const hixl_dd_layers ext = Ext(ext_param);
  return hixl_dd_cann_pull_blocks(dd, &src, dst_cache.cache_id, src_blocks.data(), src_blocks.size(),
                                  dst_blocks.data(), dst_blocks.size(), &ext);
}

Status LlmDataDist::CopyKvCache(const Cache &src_cache, const Cache &dst_cache, uint32_t src_batch_index,
                                uint32_t dst_batch_index, uint64_t offset, int64_t size) {
  (void)src_cache;
  (void)dst_cache;
  (void)src_batch_index;
  (void)dst_batch_index;
  (void)offset;
  (void)size;
  return LLM_FEATURE_NOT_ENABLED;
}

Status LlmDataDist::CopyKvBlocks(const Cache &src_cache, const Cache &dst_cache,
                                 const std::vector<uint64_t> &src_blocks,
                                 const std::vector<std::vector<uint64_t>> &dst_blocks_list) {
  (void)src_cache;
  (void)dst_cache;
  (void)src_blocks;
  (void)dst_blocks_list;
  return LLM_FEATURE_NOT_ENABLED;
}

Status LlmDataDist::PushKvCache(const Cache &src_cache, const CacheIndex &dst_cache_index, uint32_t src_batch_index,
                                int64_t size, const KvCacheExtParam &ext_param) {
  LLM_DD();
  const hixl_dd_cache_arg src = Arg(src_cache);
  const hixl_dd_cache_index dst = Index(dst_cache_index);
  const hixl_dd_layers ext = Ext(ext_param);
  return hixl_dd_cann_push_cache(dd, &src, src_batch_index, &dst, size, &ext);
}

Status LlmDataDist::PushKvBlocks(const Cache &src_cache, const CacheIndex &dst_cache_index,
                                 const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                                 const KvCacheExtParam &ext_param) {
  LLM_DD();
  const hixl_dd_cache_arg src = Arg(src_cache);
  const hixl_dd_cache_index dst = Index(dst_cache_index);
  const hixl_dd_layers ext = Ext(ext_param);
  return hixl_dd_cann_push_blocks(dd, &src, &dst, src_blocks.data(), src_blocks.size(), dst_blocks.data(),
                                  dst_blocks.size(), &ext);
}

Status LlmDataDist::RegisterKvCache(const CacheDesc &cache_desc, const std::vector<uint64_t> &addrs,
                                    const RegisterCfg &cfg, int64_t &cache_id) {
  (void)cfg;
  LLM_DD();
  hixl_dd_cache_desc d{};
  d.placement = static_cast<uint32_t>(cache_desc.placement);
  d.num_tensors = cache_desc.num_tensors;
  d.data_type = static_cast<int32_t>(cache_desc.data_type);
  d.shape = cache_desc.shape.data();
  d.shape_len = cache_desc.shape.size();
  int64_t id = -1;
  const Status st = hixl_dd_register_cache(dd, &d, addrs.data(), addrs.size(), &id);
  if (st == LLM_SUCCESS) cache_id = id;
  return st;
}

Status LlmDataDist::UnregisterKvCache(int64_t cache_id) {
  LLM_DD();
  return hixl_dd_unregister_cache(dd, cache_id);
}
}  // namespace llm_datadist
