// llm_datadist::LlmDataDist (llm_datadist/llm_datadist.h) over hixl's LLM-DataDist C ABI
// (hixl_dd.h, in libcann_hixl.so): the compiled C++ layer of libllm_datadist.so, so that programs
// built against CANN's LLM-DataDist (its mangled C++ symbols) run on hixl. Each method makes the
// checks CANN's makes before its transfer engine is reached, in CANN's order and with CANN's
// codes (LLM_FAILED before Initialize, then its argument checks), then forwards; the instance
// checks the rest (links, caches, block and batch bounds).
#include "llm_datadist/llm_datadist.h"

#include <arpa/inet.h>

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
                                      sizeof(hixl_dd_cache_desc) == 32 && sizeof(hixl_dd_layers) == 20),
              "the C ABI's layouts");

namespace {
bool ValidRole(LlmRole role) {
  const auto r = static_cast<int32_t>(role);
  return r >= static_cast<int32_t>(LlmRole::kPrompt) && r <= static_cast<int32_t>(LlmRole::kMix);
}

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

// A cluster's addresses in the C ABI's form; `false` for an empty or non-IPv4 address (CANN
// turns each into a 32-bit IPv4 number before anything is linked).
bool ToIpInfos(const std::vector<IpInfo> &in, std::vector<hixl_dd_ip_info> &out) {
  out.reserve(in.size());
  for (const auto &ip : in) {
    in_addr a{};
    if (ip.ip.GetLength() == 0 || inet_pton(AF_INET, ip.ip.GetString(), &a) != 1) return false;
    hixl_dd_ip_info info{};
    info.ip = ip.ip.GetString();
    info.port = ip.port;
    out.push_back(info);
  }
  return true;
}

// CANN's checks of a transfer's layer ranges (KvCacheExtParam); `same`: the two ranges must
// span as many layers (pushes).
bool ValidExtParam(const KvCacheExtParam &p, bool same) {
  const auto &s = p.src_layer_range;
  const auto &d = p.dst_layer_range;
  if (s.first < -1 || s.second < -1 || s.first > s.second) return false;
  if (d.first < -1 || d.second < -1 || d.first > d.second) return false;
  if (p.tensor_num_per_layer == 0U) return false;
  return !same || (s.second - s.first) == (d.second - d.first);
}

hixl_dd_layers Layers(int32_t src_first, int32_t src_last, int32_t dst_first, int32_t dst_last, uint8_t per_layer) {
  hixl_dd_layers l{};
  l.src_first = src_first;
  l.src_last = src_last;
  l.dst_first = dst_first;
  l.dst_last = dst_last;
  l.tensor_num_per_layer = per_layer;
  return l;
}

// A pull's layers: both ranges when both are set (first >= 0), else every tensor, as CANN's.
hixl_dd_layers PullLayers(const KvCacheExtParam &p) {
  if (p.src_layer_range.first < 0 || p.dst_layer_range.first < 0) {
    return Layers(-1, -1, -1, -1, p.tensor_num_per_layer);
  }
  return Layers(p.src_layer_range.first, p.src_layer_range.second, p.dst_layer_range.first,
                p.dst_layer_range.second, p.tensor_num_per_layer);
}

// A push's layers, as CANN's pushes them: a given range layer by layer from the destination's
// first layer; without one, layers 0..max of both sides, max from the argument's num_tensors
// (a last partial layer counts as one; fewer tensors than a layer's: one layer).
hixl_dd_layers PushLayers(const Cache &src, const KvCacheExtParam &p) {
  const int32_t per = p.tensor_num_per_layer;
  if (p.src_layer_range.first >= 0) {
    return Layers(p.src_layer_range.first, p.src_layer_range.second, p.dst_layer_range.first,
                  p.dst_layer_range.second, p.tensor_num_per_layer);
  }
  const auto n = static_cast<int32_t>(src.cache_desc.num_tensors);
  int32_t max = 0;
  if (n >= per) max = (n % per == 0) ? n / per - 1 : n / per;
  return Layers(0, max, 0, max, p.tensor_num_per_layer);
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
  ~LlmDataDistImpl() { hixl_dd_destroy(dd_); }  // finalizes
  LlmDataDistImpl(const LlmDataDistImpl &) = delete;
  LlmDataDistImpl &operator=(const LlmDataDistImpl &) = delete;

  Status Initialize(const std::map<AscendString, AscendString> &options) {
    std::lock_guard<std::mutex> lk(mu_);
    if (initialized_.load()) return LLM_SUCCESS;
    if (!ValidRole(role_)) return LLM_PARAM_INVALID;
    // llm.DeviceId is required, a device id (CANN's: a non-negative integer)
    const auto dev = options.find(OPTION_DEVICE_ID);
    if (dev == options.end() || dev->second.GetLength() == 0) return LLM_PARAM_INVALID;
    if (dd_ == nullptr) {
      hixl_dd *dd = nullptr;
      const Status st = hixl_dd_create(cluster_id_, static_cast<int32_t>(role_), &dd);
      if (st != LLM_SUCCESS) return st;
      dd_ = dd;
    }
    const Options o(options);
    const Status st = hixl_dd_initialize(dd_, o.keys.data(), o.values.data(), o.keys.size());
    if (st != LLM_SUCCESS) return st;
    initialized_.store(true);
    return LLM_SUCCESS;
  }

  void Finalize() {
    std::lock_guard<std::mutex> lk(mu_);
    initialized_.store(false);
    if (dd_ != nullptr) (void)hixl_dd_finalize(dd_);
  }

  bool initialized() const { return initialized_.load(); }
  hixl_dd *dd() const { return dd_; }
  uint64_t cluster_id() const { return cluster_id_; }

  Status SetRole(LlmRole role, const std::map<AscendString, AscendString> &options) {
    if (!ValidRole(role)) return LLM_PARAM_INVALID;
    std::lock_guard<std::mutex> lk(mu_);  // role_
    const Options o(options);
    const Status st = hixl_dd_set_role(dd_, static_cast<int32_t>(role), o.keys.data(), o.values.data(),
                                       o.keys.size());
    if (st == LLM_SUCCESS) role_ = role;
    return st;
  }

 private:
  std::mutex mu_;
  std::atomic<bool> initialized_{false};
  // made by the first Initialize (under mu_, before initialized_ is set), kept until destruction
  hixl_dd *dd_ = nullptr;
  const uint64_t cluster_id_;
  LlmRole role_;
};

LlmDataDist::LlmDataDist(uint64_t cluster_id, LlmRole role)
    : impl_(new (std::nothrow) LlmDataDistImpl(cluster_id, role)) {}

LlmDataDist::~LlmDataDist() { Finalize(); }

Status LlmDataDist::Initialize(const std::map<AscendString, AscendString> &options) {
  if (impl_ == nullptr) return LLM_FAILED;
  const Status st = impl_->Initialize(options);
  // as CANN's: a code that is not one of LLM-DataDist's becomes LLM_FAILED
  const bool llm_code = st == LLM_SUCCESS || st == LLM_FAILED || (st > 0x5010B000U && st <= 0x5010B01CU);
  return llm_code ? st : LLM_FAILED;
}

void LlmDataDist::Finalize() {
  if (impl_ != nullptr) impl_->Finalize();
}

// CANN's first check of every call but Initialize and Finalize: an instance initialized.
#define LLM_DD_OR_FAILED()                                        \
  if (impl_ == nullptr || !impl_->initialized()) return LLM_FAILED; \
  hixl_dd *const dd = impl_->dd()

Status LlmDataDist::SetRole(LlmRole role, const std::map<AscendString, AscendString> &options) {
  LLM_DD_OR_FAILED();
  (void)dd;
  return impl_->SetRole(role, options);
}

namespace {
// Clusters in the C ABI's form (their addresses in `storage`); LLM_PARAM_INVALID for a bad
// timeout or address, or no cluster.
Status ToClusters(const std::vector<ClusterInfo> &clusters, int32_t timeout,
                  std::vector<std::vector<hixl_dd_ip_info>> &storage, std::vector<hixl_dd_cluster_info> &out) {
  if (timeout <= 0) return LLM_PARAM_INVALID;
  storage.resize(clusters.size() * 2U);
  out.reserve(clusters.size());
  for (size_t i = 0U; i < clusters.size(); ++i) {
    const auto &c = clusters[i];
    auto &remote = storage[2U * i];
    auto &local = storage[2U * i + 1U];
    if (!ToIpInfos(c.remote_ip_infos, remote) || !ToIpInfos(c.local_ip_infos, local)) return LLM_PARAM_INVALID;
    hixl_dd_cluster_info info{};
    info.remote_cluster_id = c.remote_cluster_id;
    info.remote_role_type = c.remote_role_type;
    info.local_ip_infos = local.data();
    info.local_ip_count = local.size();
    info.remote_ip_infos = remote.data();
    info.remote_ip_count = remote.size();
    out.push_back(info);
  }
  return out.empty() ? LLM_PARAM_INVALID : LLM_SUCCESS;
}
}  // namespace

Status LlmDataDist::LinkLlmClusters(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets,
                                    int32_t timeout_in_millis) {
  LLM_DD_OR_FAILED();
  std::vector<std::vector<hixl_dd_ip_info>> storage;
  std::vector<hixl_dd_cluster_info> cs;
  const Status st = ToClusters(clusters, timeout_in_millis, storage, cs);
  if (st != LLM_SUCCESS) return st;
  rets.assign(cs.size(), LLM_SUCCESS);
  return hixl_dd_link_clusters(dd, cs.data(), cs.size(), timeout_in_millis, rets.data());
}

Status LlmDataDist::UnlinkLlmClusters(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets,
                                      int32_t timeout_in_millis, bool force_flag) {
  LLM_DD_OR_FAILED();
  std::vector<std::vector<hixl_dd_ip_info>> storage;
  std::vector<hixl_dd_cluster_info> cs;
  const Status st = ToClusters(clusters, timeout_in_millis, storage, cs);
  if (st != LLM_SUCCESS) return st;
  rets.assign(cs.size(), LLM_SUCCESS);
  Status st2 = hixl_dd_unlink_clusters(dd, cs.data(), cs.size(), timeout_in_millis, force_flag, rets.data());
  if (st2 != LLM_NOT_YET_LINK) return st2;
  // as CANN's: a cluster that is not linked is unlinked already (SUCCESS); the call returns the
  // last other failure
  st2 = LLM_SUCCESS;
  for (auto &r : rets) {
    if (r == LLM_NOT_YET_LINK) r = LLM_SUCCESS;
    if (r != LLM_SUCCESS) st2 = r;
  }
  return st2;
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
  LLM_DD_OR_FAILED();
  if (size != -1 && size <= 0) return LLM_PARAM_INVALID;
  if (!ValidExtParam(ext_param, false)) return LLM_PARAM_INVALID;
  if (src_cache_index.cluster_id == impl_->cluster_id()) return LLM_PARAM_INVALID;
  const hixl_dd_cache_index src = Index(src_cache_index);
  const hixl_dd_layers layers = PullLayers(ext_param);
  return hixl_dd_pull_cache(dd, &src, dst_cache.cache_id, batch_index, size, &layers);
}

Status LlmDataDist::PullKvBlocks(const CacheIndex &src_cache_index, const Cache &dst_cache,
                                 const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                                 const KvCacheExtParam &ext_param) {
  LLM_DD_OR_FAILED();
  if (src_cache_index.batch_index != 0U) return LLM_PARAM_INVALID;
  if (!ValidExtParam(ext_param, false)) return LLM_PARAM_INVALID;
  if (src_blocks.empty() || src_blocks.size() != dst_blocks.size()) return LLM_PARAM_INVALID;
  if (src_cache_index.cluster_id == impl_->cluster_id()) return LLM_PARAM_INVALID;
  const hixl_dd_cache_index src = Index(src_cache_index);
  const hixl_dd_layers layers = PullLayers(ext_param);
  return hixl_dd_pull_blocks(dd, &src, dst_cache.cache_id, src_blocks.data(), dst_blocks.data(), src_blocks.size(),
                             &layers);
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

namespace {
// The checks CANN's pushes share: the argument's placement, the ranges (of one span), and a
// source range or a tensor count to derive one from.
bool ValidPush(const Cache &src_cache, const KvCacheExtParam &ext_param) {
  if (src_cache.cache_desc.placement != CachePlacement::kDevice) return false;
  if (!ValidExtParam(ext_param, true)) return false;
  return ext_param.src_layer_range.first >= 0 || src_cache.cache_desc.num_tensors > 0U;
}
}  // namespace

Status LlmDataDist::PushKvCache(const Cache &src_cache, const CacheIndex &dst_cache_index, uint32_t src_batch_index,
                                int64_t size, const KvCacheExtParam &ext_param) {
  LLM_DD_OR_FAILED();
  if (size != -1 || !ValidPush(src_cache, ext_param)) return LLM_PARAM_INVALID;
  const hixl_dd_cache_index dst = Index(dst_cache_index);
  const hixl_dd_layers layers = PushLayers(src_cache, ext_param);
  return hixl_dd_push_cache(dd, src_cache.cache_id, src_batch_index, &dst, -1, &layers);
}

Status LlmDataDist::PushKvBlocks(const Cache &src_cache, const CacheIndex &dst_cache_index,
                                 const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                                 const KvCacheExtParam &ext_param) {
  LLM_DD_OR_FAILED();
  // all LLM_PARAM_INVALID: their order does not show
  if (src_blocks.empty() || src_blocks.size() != dst_blocks.size()) return LLM_PARAM_INVALID;
  if (dst_cache_index.batch_index != 0U || !ValidPush(src_cache, ext_param)) return LLM_PARAM_INVALID;
  const hixl_dd_cache_index dst = Index(dst_cache_index);
  const hixl_dd_layers layers = PushLayers(src_cache, ext_param);
  return hixl_dd_push_blocks(dd, src_cache.cache_id, &dst, src_blocks.data(), dst_blocks.data(), src_blocks.size(),
                             &layers);
}

Status LlmDataDist::RegisterKvCache(const CacheDesc &cache_desc, const std::vector<uint64_t> &addrs,
                                    const RegisterCfg &cfg, int64_t &cache_id) {
  (void)cfg;
  LLM_DD_OR_FAILED();
  if (addrs.empty() || addrs.size() != static_cast<size_t>(cache_desc.num_tensors)) return LLM_PARAM_INVALID;
  for (const auto a : addrs) {
    if (a == 0U) return LLM_PARAM_INVALID;
  }
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
  LLM_DD_OR_FAILED();
  return hixl_dd_unregister_cache(dd, cache_id);
}
}  // namespace llm_datadist
