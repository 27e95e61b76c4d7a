// The conformance table's LLM-DataDist cases (tests/conformance/cases.json) through CANN's C++
// class llm_datadist::LlmDataDist (libllm_datadist.so), driven by hixl-capi/tests/conformance.rs
// with the words of tests/c/conformance.c's `dd` lines (pushes add the Cache argument's
// PLACEMENT and NUM_TENSORS); answers `STATUS <n>`. Every case starts from a fresh instance
// brought to its state (Initialize with llm.DeviceId 0, this side's two caches registered: ids
// 1 and 2), and ends it.
//
//   conformance DD_PEER_IP DD_PEER_PORT
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "llm_datadist/llm_datadist.h"

using namespace llm_datadist;

namespace {
std::string g_ip;
uint16_t g_port = 0;

std::vector<uint64_t> List(const std::string &s) {
  std::vector<uint64_t> out;
  if (s == "-") return out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoull(item));
  return out;
}

ClusterInfo Peer(uint64_t id, bool with_address) {
  ClusterInfo c;
  c.remote_cluster_id = id;
  if (with_address) {
    IpInfo ip;
    ip.ip = g_ip.c_str();
    ip.port = g_port;
    c.remote_ip_infos.push_back(ip);
  }
  return c;
}

KvCacheExtParam Ext(const std::vector<std::string> &t, size_t at) {
  KvCacheExtParam p{};
  p.src_layer_range = {std::stoi(t[at]), std::stoi(t[at + 1])};
  p.dst_layer_range = {std::stoi(t[at + 2]), std::stoi(t[at + 3])};
  p.tensor_num_per_layer = static_cast<uint8_t>(std::stoi(t[at + 4]));
  return p;
}

CacheDesc Desc(uint32_t tensors, std::vector<int64_t> shape) {
  CacheDesc d{};
  d.placement = CachePlacement::kHost;
  d.num_tensors = tensors;
  d.data_type = DT_INT32;
  d.shape = std::move(shape);
  return d;
}

uint64_t Run(const std::vector<std::string> &t) {
  constexpr size_t kTensors = 4U;
  static uint8_t blocks[kTensors][16 * 128], batches[kTensors][4 * 256], extra[2][128];
  const std::string &state = t[1];
  const std::string &call = t[2];
  LlmDataDist dd(2, LlmRole::kDecoder);
  if (state != "uninit") {
    std::map<AscendString, AscendString> options;
    options[OPTION_DEVICE_ID] = "0";
    std::vector<uint64_t> ba, ca;
    for (size_t i = 0U; i < kTensors; ++i) {
      ba.push_back(reinterpret_cast<uint64_t>(blocks[i]));
      ca.push_back(reinterpret_cast<uint64_t>(batches[i]));
    }
    int64_t id1 = -1, id2 = -1;
    if (dd.Initialize(options) != LLM_SUCCESS || dd.RegisterKvCache(Desc(kTensors, {16, 32}), ba, {}, id1) != 0 ||
        dd.RegisterKvCache(Desc(kTensors, {4, 64}), ca, {}, id2) != 0 || id1 != 1 || id2 != 2) {
      return 1;
    }
  }
  if (state == "linked") {
    std::vector<Status> rets;
    if (dd.LinkLlmClusters({Peer(1, true)}, rets, 5000) != LLM_SUCCESS) return 1;
  }
  if (state == "finalized") dd.Finalize();
  const bool blocks_call = call == "pull_blocks" || call == "push_blocks";
  if (blocks_call || call == "pull_cache" || call == "push_cache") {
    CacheIndex key{};
    key.cluster_id = std::stoull(t[3]);
    key.cache_id = std::stoll(t[4]);
    key.batch_index = static_cast<uint32_t>(std::stoul(t[5]));
    const KvCacheExtParam ext = Ext(t, 8);
    Cache local{};
    local.cache_id = std::stoll(t[13]);
    if (call == "pull_blocks") return dd.PullKvBlocks(key, local, List(t[6]), List(t[7]), ext);
    if (call == "pull_cache") {
      return dd.PullKvCache(key, local, static_cast<uint32_t>(std::stoul(t[6])), std::stoll(t[7]), ext);
    }
    local.cache_desc.placement = static_cast<CachePlacement>(std::stoul(t[14]));
    local.cache_desc.num_tensors = static_cast<uint32_t>(std::stoul(t[15]));
    if (call == "push_blocks") return dd.PushKvBlocks(local, key, List(t[6]), List(t[7]), ext);
    return dd.PushKvCache(local, key, static_cast<uint32_t>(std::stoul(t[6])), std::stoll(t[7]), ext);
  }
  if (call == "register") {
    std::vector<uint64_t> addrs{reinterpret_cast<uint64_t>(extra[0]), reinterpret_cast<uint64_t>(extra[1])};
    if (t[3] == "none") addrs.clear();
    if (t[3] == "one") addrs.pop_back();
    if (t[3] == "zero") addrs[1] = 0U;
    int64_t id = -1;
    return dd.RegisterKvCache(Desc(2, {4, 8}), addrs, {}, id);
  }
  if (call == "unregister") return dd.UnregisterKvCache(std::stoll(t[3]));
  if (call == "link" || call == "unlink") {
    std::vector<Status> rets;
    const std::vector<ClusterInfo> cs{Peer(std::stoull(t[3]), t[5] == "1")};
    const int32_t timeout = std::stoi(t[4]);
    return call == "link" ? dd.LinkLlmClusters(cs, rets, timeout) : dd.UnlinkLlmClusters(cs, rets, timeout);
  }
  return 1;
}
}  // namespace

int main(int argc, char **argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " DD_PEER_IP DD_PEER_PORT\n";
    return 2;
  }
  g_ip = argv[1];
  g_port = static_cast<uint16_t>(std::stoul(argv[2]));
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::vector<std::string> t;
    for (std::string w; in >> w;) t.push_back(w);
    if (t.size() < 3U || t[0] != "dd") {
      std::cout << "BAD " << line << std::endl;
      continue;
    }
    std::cout << "STATUS " << Run(t) << std::endl;
  }
  return 0;
}
