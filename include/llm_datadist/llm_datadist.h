/*
 * llm_datadist/llm_datadist.h: llm_datadist::LlmDataDist, CANN LLM-DataDist's KV-cache manager
 * (llm_datadist.h of Huawei CANN's HIXL package), source- and binary-compatible:
 * libllm_datadist.so exports its methods (the same mangled symbols as CANN's library),
 * implemented over hixl's LLM-DataDist C ABI (hixl_dd.h, in libcann_hixl.so). A pimpl class, as
 * CANN's: one std::unique_ptr member, methods out of line. Names, values and struct layouts are
 * CANN's (the option keys, the 20 LLM_* codes, IpInfo, ClusterInfo, CacheIndex, CacheDesc, Cache,
 * KvCacheExtParam, RegisterCfg with their reserved bytes).
 *
 * Build and link as CANN's samples do:
 *   c++ -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=0 app.cpp -I <hixl>/include -L <hixl>/target/release
 *       -lllm_datadist          (+ -lacl_rt -lascend_hal for ACL's device memory)
 *
 * Behaviour is CANN's where a program can tell (the checks, their order and their codes; cache ids
 * from 1; Initialize idempotent and llm.DeviceId required; AllocateCache, DeallocateCache,
 * CopyKvCache and CopyKvBlocks LLM_FEATURE_NOT_ENABLED); both transfer backends (absent, and
 * llm.TransferBackend=hixl) are hixl's engine. What differs: docs/c-and-cpp.md ("LLM-DataDist").
 */
#ifndef CANN_GRAPH_ENGINE_INC_EXTERNAL_LLM_DATADIST_LLM_DATA_DIST_H_
#define CANN_GRAPH_ENGINE_INC_EXTERNAL_LLM_DATADIST_LLM_DATA_DIST_H_  // CANN's guard

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "ge_compat.h"

#ifndef ASCEND_FUNC_VISIBILITY
#ifdef FUNC_VISIBILITY
#define ASCEND_FUNC_VISIBILITY __attribute__((visibility("default")))
#else
#define ASCEND_FUNC_VISIBILITY
#endif
#endif

namespace llm_datadist {
namespace {
constexpr uint8_t kDefaultTensorNumPerLayer = 2U;
}
using Status = ge::Status;
using AscendString = ge::AscendString;
using DataType = ge::DataType;

// options
constexpr const char OPTION_LISTEN_IP_INFO[] = "llm.ListenIpInfo";            // "ip:port"
constexpr const char OPTION_DEVICE_ID[] = "llm.DeviceId";                     // required
constexpr const char OPTION_SYNC_CACHE_WAIT_TIME[] = "llm.SyncKvCacheWaitTime";  // ms
constexpr const char OPTION_BUF_POOL_CFG[] = "llm.BufPoolCfg";
constexpr const char OPTION_ENABLE_SET_ROLE[] = "llm.EnableSwitchRole";
constexpr const char OPTION_LOCAL_COMM_RES[] = "llm.LocalCommRes";
constexpr const char OPTION_TRANSFER_BACKEND[] = "llm.TransferBackend";  // "hixl"
constexpr const char OPTION_GLOBAL_RESOURCE_CONFIG[] = "llm.GlobalResourceConfig";

// status codes
constexpr Status LLM_SUCCESS = 0x0U;
constexpr Status LLM_FAILED = 0xFFFFFFFFU;
constexpr Status LLM_WAIT_PROC_TIMEOUT = 0x5010B001U;
constexpr Status LLM_KV_CACHE_NOT_EXIST = 0x5010B002U;
constexpr Status LLM_PARAM_INVALID = 0x5010B005U;
constexpr Status LLM_NOT_YET_LINK = 0x5010B007U;
constexpr Status LLM_ALREADY_LINK = 0x5010B008U;
constexpr Status LLM_LINK_FAILED = 0x5010B009U;
constexpr Status LLM_UNLINK_FAILED = 0x5010B00AU;
constexpr Status LLM_NOTIFY_PROMPT_UNLINK_FAILED = 0x5010B00BU;
constexpr Status LLM_CLUSTER_NUM_EXCEED_LIMIT = 0x5010B00CU;
constexpr Status LLM_PROCESSING_LINK = 0x5010B00DU;
constexpr Status LLM_DEVICE_OUT_OF_MEMORY = 0x5010B00EU;
constexpr Status LLM_EXIST_LINK = 0x5010B018U;
constexpr Status LLM_FEATURE_NOT_ENABLED = 0x5010B019U;
constexpr Status LLM_TIMEOUT = 0x5010B01AU;
constexpr Status LLM_LINK_BUSY = 0x5010B01BU;
constexpr Status LLM_OUT_OF_MEMORY = 0x5010B01CU;

// data types (ge::DataType's)
using ge::DT_BF16;
using ge::DT_BOOL;
using ge::DT_COMPLEX128;
using ge::DT_COMPLEX32;
using ge::DT_COMPLEX64;
using ge::DT_DOUBLE;
using ge::DT_DUAL;
using ge::DT_DUAL_SUB_INT8;
using ge::DT_DUAL_SUB_UINT8;
using ge::DT_FLOAT;
using ge::DT_FLOAT16;
using ge::DT_FLOAT4_E1M2;
using ge::DT_FLOAT4_E2M1;
using ge::DT_FLOAT6_E2M3;
using ge::DT_FLOAT6_E3M2;
using ge::DT_FLOAT8_E4M3FN;
using ge::DT_FLOAT8_E5M2;
using ge::DT_FLOAT8_E8M0;
using ge::DT_HIFLOAT8;
using ge::DT_INT16;
using ge::DT_INT2;
using ge::DT_INT32;
using ge::DT_INT4;
using ge::DT_INT64;
using ge::DT_INT8;
using ge::DT_QINT16;
using ge::DT_QINT32;
using ge::DT_QINT8;
using ge::DT_QUINT16;
using ge::DT_QUINT8;
using ge::DT_RESOURCE;
using ge::DT_STRING;
using ge::DT_STRING_REF;
using ge::DT_UINT1;
using ge::DT_UINT16;
using ge::DT_UINT2;
using ge::DT_UINT32;
using ge::DT_UINT64;
using ge::DT_UINT8;
using ge::DT_UNDEFINED;
using ge::DT_VARIANT;

/* An address: IPv4 text and a port. */
struct IpInfo {
  AscendString ip;
  uint16_t port = 0U;
  uint8_t reserved[128];
};

/* A peer to link or unlink: its cluster id, and exactly one remote address (its
 * llm.ListenIpInfo) to link; the local addresses and the role are informative. */
struct ClusterInfo {
  uint64_t remote_cluster_id = 0U;
  int32_t remote_role_type = 0;
  std::vector<IpInfo> local_ip_infos;
  std::vector<IpInfo> remote_ip_infos;
  uint8_t reserved[128];
};

enum class LlmRole : int32_t { kPrompt = 1, kDecoder = 2, kMix = 3, kEnd };

/* A peer's cache: its cluster, its cache id (from 1), a batch of it. */
struct CacheIndex {
  uint64_t cluster_id;
  int64_t cache_id;
  uint32_t batch_index;
  uint8_t reserved[128];
};

enum class CachePlacement : uint32_t {
  kHost = 0U,
  kDevice = 1U,
};

/* num_tensors tensors of `shape` (shape[0] blocks, which are also its batches) of data_type. */
struct CacheDesc {
  CachePlacement placement = CachePlacement::kDevice;
  uint32_t num_tensors = 0U;
  DataType data_type = DT_UNDEFINED;
  std::vector<int64_t> shape;
  uint8_t reserved[128];
};

/* A local cache: transfers read only cache_id (pushes also cache_desc.placement, which must be
 * kDevice, and cache_desc.num_tensors when no layer range is given). */
struct Cache {
  int64_t cache_id = -1;
  std::vector<uintptr_t> tensor_addrs;
  CacheDesc cache_desc;
  uint8_t reserved[128];
};

/* Layers of a transfer: tensors [first * n, (last + 1) * n) of each side, n =
 * tensor_num_per_layer; {-1, -1} for every tensor. */
struct KvCacheExtParam {
  std::pair<int32_t, int32_t> src_layer_range = {-1, -1};
  std::pair<int32_t, int32_t> dst_layer_range{-1, -1};
  uint8_t tensor_num_per_layer = kDefaultTensorNumPerLayer;
  uint8_t reserved[127];
};

struct RegisterCfg {
  uint8_t reserved[128] = {0};
};

class ASCEND_FUNC_VISIBILITY LlmDataDist {
 public:
  /* Stores the cluster id and the role; nothing else happens before Initialize. */
  LlmDataDist(uint64_t cluster_id, LlmRole role);
  /* Finalizes. */
  ~LlmDataDist();

  /* Starts the instance: llm.DeviceId (required; made current on this thread), llm.ListenIpInfo
   * "ip:port" (listens there; without it the instance only links out), llm.SyncKvCacheWaitTime
   * (a transfer's timeout in ms, 1000 by default), llm.TransferBackend ("hixl" or absent). A
   * second call is LLM_SUCCESS and changes nothing. */
  Status Initialize(const std::map<AscendString, AscendString> &options);

  /* Unlinks every cluster, deregisters every cache, stops the instance. Idempotent. */
  void Finalize();

  /* Changes the role; with OPTION_LISTEN_IP_INFO listens there from now on (LLM_EXIST_LINK
   * while links exist). LLM_FAILED before Initialize. */
  Status SetRole(LlmRole role, const std::map<AscendString, AscendString> &options = {});

  /* Links to each cluster; rets[i] is cluster i's status; returns the last failure. */
  Status LinkLlmClusters(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets,
                         int32_t timeout_in_millis = 1000);

  /* Unlinks each cluster (force_flag: without telling the peer); as LinkLlmClusters. */
  Status UnlinkLlmClusters(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets,
                           int32_t timeout_in_millis = 1000, bool force_flag = false);

  /* LLM_FEATURE_NOT_ENABLED, as in CANN's C++ API. */
  Status AllocateCache(const CacheDesc &cache_desc, Cache &cache);

  /* LLM_FEATURE_NOT_ENABLED, as in CANN's C++ API. */
  Status DeallocateCache(int64_t cache_id);

  /* Pulls batch src_cache_index.batch_index of the peer's cache into batch batch_index of
   * dst_cache (size bytes of each tensor, -1: a whole batch). */
  Status PullKvCache(const CacheIndex &src_cache_index, const Cache &dst_cache, uint32_t batch_index = 0U,
                     int64_t size = -1, const KvCacheExtParam &ext_param = {});

  /* Pulls the peer's blocks src_blocks[i] into dst_cache's blocks dst_blocks[i]. */
  Status PullKvBlocks(const CacheIndex &src_cache_index, const Cache &dst_cache,
                      const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                      const KvCacheExtParam &ext_param = {});

  /* LLM_FEATURE_NOT_ENABLED, as in CANN's C++ API. */
  Status CopyKvCache(const Cache &src_cache, const Cache &dst_cache, uint32_t src_batch_index = 0U,
                     uint32_t dst_batch_index = 0U, uint64_t offset = 0U, int64_t size = -1);

  /* LLM_FEATURE_NOT_ENABLED, as in CANN's C++ API. */
  Status CopyKvBlocks(const Cache &src_cache, const Cache &dst_cache, const std::vector<uint64_t> &src_blocks,
                      const std::vector<std::vector<uint64_t>> &dst_blocks_list);

  /* Pushes batch src_batch_index of src_cache into batch dst_cache_index.batch_index of the
   * peer's cache, layer by layer (size: -1 only). */
  Status PushKvCache(const Cache &src_cache, const CacheIndex &dst_cache_index, uint32_t src_batch_index = 0U,
                     int64_t size = -1, const KvCacheExtParam &ext_param = {});

  /* Pushes src_cache's blocks src_blocks[i] into the peer's blocks dst_blocks[i], layer by
   * layer. */
  Status PushKvBlocks(const Cache &src_cache, const CacheIndex &dst_cache_index,
                      const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                      const KvCacheExtParam &ext_param = {});

  /* Registers addrs (one per tensor, each prod(shape) * element size bytes of cache_desc's
   * placement, valid until unregistered) as one cache; cache_id gets its id (from 1). cfg is
   * not used. */
  Status RegisterKvCache(const CacheDesc &cache_desc, const std::vector<uint64_t> &addrs, const RegisterCfg &cfg,
                         int64_t &cache_id);

  /* Unregisters a cache (an unknown id is LLM_SUCCESS); unlink the peers that fetched its
   * table first. */
  Status UnregisterKvCache(int64_t cache_id);

 private:
  class LlmDataDistImpl;
  std::unique_ptr<LlmDataDistImpl> impl_;
};
}  // namespace llm_datadist

#endif  // CANN_GRAPH_ENGINE_INC_EXTERNAL_LLM_DATADIST_LLM_DATA_DIST_H_
