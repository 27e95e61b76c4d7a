// A program in the style of CANN LLM-DataDist's C++ samples (prompt/decoder pull and push of
// blocks and caches, switch roles), built against include/llm_datadist/llm_datadist.h with CANN's
// example flags (-D_GLIBCXX_USE_CXX11_ABI=0 among them) and linked with -lllm_datadist (and, for
// device memory, -lacl_rt -lascend_hal: the ACL/HCCL double), run as two processes by
// tests/llm_datadist.rs, which sends it commands and checks every status it prints.
//
//   llm_datadist CLUSTER_ID DEVICE_ID device|host hixl|default SEED
//     Initializes (llm.DeviceId, llm.ListenIpInfo on a free port of 127.0.0.1, and
//     llm.TransferBackend=hixl for "hixl"), registers one cache of 4 tensors of int32 [8, 64]
//     (8 blocks of 256 bytes), filled with random bytes that depend on SEED, the cluster and the
//     tensor, and prints READY <port> <cache_id>. Then it answers commands on stdin, one line
//     each (STATUS <numbers...>, or OK / BAD <why>), until "quit".
//
// Device memory is aclrtMalloc'd (HUGE_ONLY) and filled and read back with aclrtMemcpy; host
// memory is page-aligned heap memory.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "llm_datadist/llm_datadist.h"
#include "llm_datadist/llm_engine_types.h"
#include "llm_datadist/llm_error_codes.h"
#ifdef HIXL_TEST_ACL
#include "acl_decls.h"
#endif

using namespace llm_datadist;

static_assert(sizeof(void *) != 8 || sizeof(IpInfo) == 152, "IpInfo: AscendString, port, reserved[128]");
static_assert(sizeof(void *) != 8 || sizeof(CacheIndex) == 152, "CacheIndex");
static_assert(sizeof(KvCacheExtParam) == 144, "KvCacheExtParam");
static_assert(sizeof(RegisterCfg) == 128, "RegisterCfg");
static_assert(ge::LLM_KV_CACHE_NOT_EXIST == 0x5010B002U && ge::LLM_CACHE_ID_ALREADY_EXIST == 0x5010B017U,
              "llm_error_codes.h");
static_assert(DT_INT32 == 3 && DT_BF16 == 27 && DT_UNDEFINED == 28, "ge::DataType");

namespace {
constexpr uint32_t kNumTensors = 4U;
constexpr size_t kBlocks = 8U;
constexpr size_t kBlockSize = 64U * sizeof(int32_t);
constexpr size_t kTensorSize = kBlocks * kBlockSize;
const std::vector<int64_t> kTensorShape = {8, 64};
constexpr int32_t kTimeout = 5000;

uint64_t g_seed = 0;
bool g_device = false;
uint64_t g_cluster = 0;
std::map<AscendString, AscendString> g_options;

uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30U)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27U)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31U);
}

// Byte i of tensor `tensor` of cluster `cluster`'s cache as it was filled.
uint8_t Original(uint64_t cluster, uint64_t tensor, size_t i) {
  const uint64_t w = SplitMix(g_seed ^ (cluster * 0x100000001B3ULL) ^ (tensor << 40U) ^ (i / 8U));
  return static_cast<uint8_t>(w >> (8U * (i % 8U)));
}

int FreePort() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(s, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
      getsockname(s, reinterpret_cast<sockaddr *>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(s);
  return port;
}

void *Alloc(size_t size) {
#ifdef HIXL_TEST_ACL
  if (g_device) {
    void *p = nullptr;
    if (aclrtMalloc(&p, size, ACL_MEM_MALLOC_HUGE_ONLY) != ACL_SUCCESS) return nullptr;
    return p;
  }
#endif
  void *p = nullptr;
  return posix_memalign(&p, 4096U, size) == 0 ? p : nullptr;
}

void Free(void *p) {
#ifdef HIXL_TEST_ACL
  if (g_device) {
    (void)aclrtFree(p);
    return;
  }
#endif
  free(p);
}

bool CopyIn(void *dst, const std::vector<uint8_t> &src) {
#ifdef HIXL_TEST_ACL
  if (g_device) return aclrtMemcpy(dst, src.size(), src.data(), src.size(), ACL_MEMCPY_HOST_TO_DEVICE) == ACL_SUCCESS;
#endif
  std::memcpy(dst, src.data(), src.size());
  return true;
}

bool CopyOut(std::vector<uint8_t> &dst, const void *src) {
#ifdef HIXL_TEST_ACL
  if (g_device) return aclrtMemcpy(dst.data(), dst.size(), src, dst.size(), ACL_MEMCPY_DEVICE_TO_HOST) == ACL_SUCCESS;
#endif
  std::memcpy(dst.data(), src, dst.size());
  return true;
}

std::vector<uint64_t> List(const std::string &csv) {
  std::vector<uint64_t> out;
  if (csv == "-") return out;
  std::stringstream ss(csv);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoull(item));
  return out;
}

ClusterInfo Cluster(uint64_t id, const char *ip, uint16_t port) {
  ClusterInfo c;
  c.remote_cluster_id = id;
  IpInfo local;
  local.ip = "127.0.0.1";
  c.local_ip_infos.push_back(local);
  if (ip != nullptr) {
    IpInfo remote;
    remote.ip = ip;
    remote.port = port;
    c.remote_ip_infos.push_back(remote);
  }
  return c;
}

KvCacheExtParam Ext(std::istringstream &in) {
  KvCacheExtParam p{};
  int32_t sf, sl, df, dl, per;
  in >> sf >> sl >> df >> dl >> per;
  p.src_layer_range = {sf, sl};
  p.dst_layer_range = {df, dl};
  p.tensor_num_per_layer = static_cast<uint8_t>(per);
  return p;
}

void Print(std::initializer_list<uint64_t> v) {
  std::cout << "STATUS";
  for (auto s : v) std::cout << ' ' << s;
  std::cout << std::endl;
}

// Calls on an instance that was never initialized (LLM_FAILED each, as CANN's), then Initialize
// without llm.DeviceId and with an unknown role (LLM_PARAM_INVALID).
void Uninit() {
  LlmDataDist dd(7, LlmRole::kMix);
  std::vector<Status> rets;
  std::vector<ClusterInfo> cs{Cluster(0, "127.0.0.1", 1)};
  CacheDesc desc{};
  desc.num_tensors = 1;
  desc.data_type = DT_INT32;
  desc.shape = kTensorShape;
  int64_t id = -1;
  CacheIndex idx{};
  Cache cache{};
  cache.cache_id = 1;
  cache.cache_desc.num_tensors = kNumTensors;
  const Status a = dd.SetRole(LlmRole::kPrompt);
  const Status b = dd.LinkLlmClusters(cs, rets, kTimeout);
  const Status c = dd.RegisterKvCache(desc, {0x1000}, {}, id);
  const Status d = dd.PullKvBlocks(idx, cache, {1}, {1});
  const Status e = dd.PullKvCache(idx, cache);
  const Status f = dd.PushKvCache(cache, idx);
  const Status g = dd.UnregisterKvCache(1);
  const Status h = dd.UnlinkLlmClusters(cs, rets, kTimeout);
  std::map<AscendString, AscendString> no_device;
  no_device[OPTION_LISTEN_IP_INFO] = "127.0.0.1:0";
  const Status i = dd.Initialize(no_device);
  LlmDataDist bad_role(8, LlmRole::kEnd);
  const Status j = bad_role.Initialize(g_options);
  Print({a, b, c, d, e, f, g, h, i, j});
}

// The calls CANN's C++ API refuses, and argument checks that need no peer.
void Misc(LlmDataDist &dd, int64_t cache_id, void *tensor) {
  CacheDesc desc{};
  desc.num_tensors = kNumTensors;
  desc.data_type = DT_INT32;
  desc.shape = kTensorShape;
  Cache cache{};
  cache.cache_id = cache_id;
  int64_t id = -1;
  std::vector<Status> rets;
  const auto t = reinterpret_cast<uint64_t>(tensor);
  const Status a = dd.AllocateCache(desc, cache);
  const Status b = dd.DeallocateCache(cache_id);
  const Status c = dd.CopyKvCache(cache, cache);
  const Status d = dd.CopyKvBlocks(cache, cache, {0}, {{1}});
  const Status e = dd.Initialize(g_options);               // again: SUCCESS
  const Status f = dd.RegisterKvCache(desc, {}, {}, id);   // no address
  const Status g = dd.RegisterKvCache(desc, {t}, {}, id);  // 1 address for 4 tensors
  const Status h = dd.RegisterKvCache(desc, {t, t, 0, t}, {}, id);
  const Status i = dd.UnregisterKvCache(99);  // unknown: SUCCESS
  std::vector<ClusterInfo> one{Cluster(0, "127.0.0.1", 1)};
  const Status j = dd.LinkLlmClusters(one, rets, 0);
  std::vector<ClusterInfo> bad_ip{Cluster(0, "not-an-ip", 1)};
  const Status k = dd.LinkLlmClusters(bad_ip, rets, kTimeout);
  const Status l = dd.LinkLlmClusters({}, rets, kTimeout);
  std::vector<ClusterInfo> two_ips{Cluster(0, "127.0.0.1", 1)};
  two_ips[0].remote_ip_infos.push_back(two_ips[0].remote_ip_infos[0]);
  const Status m = dd.LinkLlmClusters(two_ips, rets, kTimeout);
  const Status m_ret = rets.empty() ? 1U : rets[0];
  CacheIndex own{};
  own.cluster_id = g_cluster;
  own.cache_id = 1;
  const Status n = dd.PullKvBlocks(own, cache, {1}, {1});
  const Status o = dd.SetRole(LlmRole::kEnd);
  Print({a, b, c, d, e, f, g, h, i, j, k, l, m, m_ret, n, o});
}

int Run(int argc, char **argv) {
  if (argc != 6) {
    printf("[ERROR] usage: %s CLUSTER_ID DEVICE_ID device|host hixl|default SEED\n", argv[0]);
    return 2;
  }
  g_cluster = std::stoull(argv[1]);
  const std::string device_id = argv[2];
  g_device = std::string(argv[3]) == "device";
  const std::string backend = argv[4];
  g_seed = std::stoull(argv[5]);
#ifndef HIXL_TEST_ACL
  if (g_device) {
    std::cerr << "built without ACL: host memory only\n";
    return 2;
  }
#endif
  const int port = FreePort();
  g_options[OPTION_DEVICE_ID] = device_id.c_str();
  g_options[OPTION_LISTEN_IP_INFO] = ("127.0.0.1:" + std::to_string(port)).c_str();
  if (backend == "hixl") g_options[OPTION_TRANSFER_BACKEND] = "hixl";
  g_options[OPTION_SYNC_CACHE_WAIT_TIME] = "5000";
  g_options[llm::LLM_OPTION_ENABLE_SWITCH_ROLE] = "1";

  LlmDataDist dd(g_cluster, g_cluster == 0 ? LlmRole::kPrompt : LlmRole::kDecoder);
  Status ret = dd.Initialize(g_options);
  if (ret != LLM_SUCCESS) {
    printf("[ERROR] Initialize failed, ret = %u\n", ret);
    return 1;
  }
  std::vector<void *> tensors;
  std::vector<uint64_t> addrs;
  for (uint32_t t = 0U; t < kNumTensors; ++t) {
    void *p = Alloc(kTensorSize);
    std::vector<uint8_t> bytes(kTensorSize);
    for (size_t i = 0U; i < kTensorSize; ++i) bytes[i] = Original(g_cluster, t, i);
    if (p == nullptr || !CopyIn(p, bytes)) {
      printf("[ERROR] allocating tensor %u failed\n", t);
      return 1;
    }
    tensors.push_back(p);
    addrs.push_back(reinterpret_cast<uint64_t>(p));
  }
  CacheDesc desc{};
  desc.placement = g_device ? CachePlacement::kDevice : CachePlacement::kHost;
  desc.num_tensors = kNumTensors;
  desc.data_type = DT_INT32;
  desc.shape = kTensorShape;
  int64_t cache_id = -1;
  ret = dd.RegisterKvCache(desc, addrs, {}, cache_id);
  if (ret != LLM_SUCCESS) {
    printf("[ERROR] RegisterKvCache failed, ret = %u\n", ret);
    return 1;
  }
  std::vector<void *> extra;
  std::cout << "READY " << port << ' ' << cache_id << std::endl;

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    std::vector<Status> rets;
    if (cmd == "quit") {
      break;
    } else if (cmd == "uninit") {
      Uninit();
    } else if (cmd == "misc") {
      Misc(dd, cache_id, tensors[0]);
    } else if (cmd == "link" || cmd == "unlink" || cmd == "unlink_force") {
      uint64_t id;
      int p = 0;
      in >> id;
      if (cmd != "unlink_force") in >> p;
      std::vector<ClusterInfo> cs{Cluster(id, cmd == "unlink_force" ? nullptr : "127.0.0.1", static_cast<uint16_t>(p))};
      // what rets held stays, the cluster's status after it (CANN's emplace_back)
      const Status kept = 424242U;
      rets.push_back(kept);
      ret = cmd == "link" ? dd.LinkLlmClusters(cs, rets, kTimeout)
                          : dd.UnlinkLlmClusters(cs, rets, kTimeout, cmd == "unlink_force");
      Print({ret, rets.size() == 2U && rets[0] == kept ? rets[1] : 1U});
    } else if (cmd == "pull_blocks" || cmd == "pull_cache") {
      // pull_blocks CLUSTER CACHE BATCH SRCS DSTS SF SL DF DL PER LOCAL_CACHE
      // pull_cache CLUSTER CACHE SRC_BATCH DST_BATCH SIZE SF SL DF DL PER LOCAL_CACHE
      CacheIndex idx{};
      in >> idx.cluster_id >> idx.cache_id >> idx.batch_index;
      if (cmd == "pull_blocks") {
        std::string s, d;
        in >> s >> d;
        const KvCacheExtParam p = Ext(in);
        Cache local{};
        in >> local.cache_id;
        ret = dd.PullKvBlocks(idx, local, List(s), List(d), p);
      } else {
        uint32_t dst_batch;
        int64_t size;
        in >> dst_batch >> size;
        const KvCacheExtParam p = Ext(in);
        Cache local{};
        in >> local.cache_id;
        ret = dd.PullKvCache(idx, local, dst_batch, size, p);
      }
      Print({ret});
    } else if (cmd == "push_blocks" || cmd == "push_cache") {
      // push_blocks CLUSTER CACHE BATCH SRCS DSTS SF SL DF DL PER LOCAL_CACHE PLACEMENT NUM_TENSORS
      // push_cache CLUSTER CACHE DST_BATCH SRC_BATCH SIZE SF SL DF DL PER LOCAL_CACHE PLACEMENT NUM_TENSORS
      CacheIndex idx{};
      in >> idx.cluster_id >> idx.cache_id >> idx.batch_index;
      std::string s, d;
      uint32_t src_batch = 0;
      int64_t size = -1;
      if (cmd == "push_blocks") {
        in >> s >> d;
      } else {
        in >> src_batch >> size;
      }
      const KvCacheExtParam p = Ext(in);
      Cache local{};  // CANN's samples pass a bare Cache with the id
      uint32_t placement, n;
      in >> local.cache_id >> placement >> n;
      local.cache_desc.placement = static_cast<CachePlacement>(placement);
      local.cache_desc.num_tensors = n;
      ret = cmd == "push_blocks" ? dd.PushKvBlocks(local, idx, List(s), List(d), p)
                                 : dd.PushKvCache(local, idx, src_batch, size, p);
      Print({ret});
    } else if (cmd == "expect") {
      // expect TENSOR OFF LEN SRC_CLUSTER SRC_TENSOR SRC_OFF: the local bytes are the source's
      // original ones
      size_t t, off, len, src_t, src_off;
      uint64_t src_cluster;
      in >> t >> off >> len >> src_cluster >> src_t >> src_off;
      std::vector<uint8_t> got(kTensorSize);
      if (t >= tensors.size() || off + len > kTensorSize || !CopyOut(got, tensors[t])) {
        std::cout << "BAD read" << std::endl;
        continue;
      }
      size_t bad = len;
      for (size_t i = 0U; i < len && bad == len; ++i) {
        if (got[off + i] != Original(src_cluster, src_t, src_off + i)) bad = i;
      }
      if (bad == len) {
        std::cout << "OK" << std::endl;
      } else {
        std::cout << "BAD tensor " << t << " byte " << off + bad << std::endl;
      }
    } else if (cmd == "set_role") {
      // set_role ROLE NEW_LISTEN (0: no option): STATUS ret port
      int32_t role;
      int listen;
      in >> role >> listen;
      std::map<AscendString, AscendString> opts;
      int p = 0;
      if (listen != 0) {
        p = FreePort();
        opts[OPTION_LISTEN_IP_INFO] = ("127.0.0.1:" + std::to_string(p)).c_str();
      }
      ret = dd.SetRole(static_cast<LlmRole>(role), opts);
      Print({ret, static_cast<uint64_t>(p)});
    } else if (cmd == "register") {
      void *p = Alloc(kTensorSize);
      extra.push_back(p);
      CacheDesc one = desc;
      one.num_tensors = 1;
      int64_t id = -1;
      ret = dd.RegisterKvCache(one, {reinterpret_cast<uint64_t>(p)}, {}, id);
      Print({ret, static_cast<uint64_t>(id)});
    } else if (cmd == "unregister") {
      int64_t id;
      in >> id;
      Print({dd.UnregisterKvCache(id)});
    } else {
      std::cout << "BAD command " << cmd << std::endl;
    }
  }
  ret = dd.UnregisterKvCache(cache_id);
  dd.Finalize();
  // the memory goes once nothing is registered
  for (void *p : tensors) Free(p);
  for (void *p : extra) Free(p);
  std::cout << "BYE " << ret << std::endl;
  return 0;
}
}  // namespace

int main(int argc, char **argv) { return Run(argc, argv); }
