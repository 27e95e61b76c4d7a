// A program in HIXL's style (its documented C++ API, host memory), built against
// include/hixl/hixl.h with HIXL's example flags (`-std=c++17 -D_GLIBCXX_USE_CXX11_ABI=0 -O2
// -ftrapv -fno-common -Wfloat-equal -Wall -Werror -Wextra`), linked with `-lcann_hixl` as
// HIXL's examples are, and run as two processes by tests/cpp.rs.
//
//   hixl_style server SIZE [MEMORY]   READY <name> <addr> <len>; then sum / notifies / quit;
//                                     MEMORY `caller` (its own, the default) or `engine`
//                                     (AllocHostMem, a hixl extension)
//   hixl_style client NAME ADDR LEN   connect, WRITE and READ random data, async + polling,
//                                     notify; prints WROTE <off> <len> <fnv1a>, then PASS
#include "hixl/hixl.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <unordered_map>

using namespace hixl;

// HIXL's layouts on LP64 (its hixl_types.h)
static_assert(sizeof(void *) != 8 || sizeof(MemDesc) == 144, "MemDesc: 144 bytes");
static_assert(offsetof(MemDesc, addr) == 0 && offsetof(MemDesc, len) == sizeof(uintptr_t) &&
                  offsetof(MemDesc, reserved) == sizeof(uintptr_t) + sizeof(size_t) &&
                  sizeof(MemDesc::reserved) == 128,
              "MemDesc: addr, len, reserved[128]");
static_assert(sizeof(void *) != 8 || sizeof(TransferOpDesc) == 24, "TransferOpDesc");
static_assert(sizeof(void *) != 8 || sizeof(TransferArgs) == 128, "TransferArgs");
static_assert(sizeof(void *) != 8 || sizeof(GetTransferStatusArgs) == 128, "GetTransferStatusArgs");
static_assert(sizeof(void *) != 8 || sizeof(TransferResult) == 128, "TransferResult");
static_assert(std::is_same<ge::char_t, char>::value && std::is_same<ge::Status, uint32_t>::value,
              "GE's types");
// HIXL programs initialize MemDesc positionally
constexpr MemDesc kPositional{0x1000, 64, {}};
static_assert(kPositional.addr == 0x1000 && kPositional.len == 64 && kPositional.reserved[127] == 0,
              "MemDesc{addr, len, {...}}");

namespace {
int failures = 0;

void Expect(Status got, Status want, int line) {
  if (got != want) {
    std::cerr << "line " << line << ": status " << got << ", expected " << want << " ("
              << hixl_last_error_message() << ")\n";
    failures++;
  }
}
#define EXPECT(call, want) Expect((call), (want), __LINE__)
#define CHECK(cond)                                                      \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::cerr << "line " << __LINE__ << ": " #cond " is false\n";      \
      failures++;                                                        \
    }                                                                    \
  } while (0)

unsigned char Pattern(size_t i) { return static_cast<unsigned char>((i * 131u + 7u) & 0xffu); }

uint64_t Fnv1a(const unsigned char *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// GE's AscendString API: construction, Find, Hash, std::hash, comparisons, null strings.
void AscendStrings() {
  const std::string text = "kv-cache:7";
  const AscendString kv("kv-cache:7"), kv2(text.c_str()), part("kv-cache:7xyz", 8);
  CHECK(kv == kv2 && kv == "kv-cache:7" && kv != "kv");
  CHECK(std::strcmp(part.GetString(), "kv-cache") == 0);
  CHECK(kv.GetLength() == 10 && part.GetLength() == 8);
  CHECK(kv.Find(":7") == 8 && kv.Find("cache") == 3 && kv.Find("nope") == std::string::npos);
  CHECK(kv.Find("") == 0 && kv.Find(AscendString()) == std::string::npos);
  CHECK(kv.Hash() == std::hash<std::string>()("kv-cache:7"));
  CHECK(std::hash<AscendString>()(kv) == kv.Hash());
  std::unordered_map<AscendString, int> by_name;
  by_name["127.0.0.1:16000"] = 1;
  by_name[AscendString("127.0.0.1:16001")] = 2;
  by_name["127.0.0.1:16000"] += 10;
  CHECK(by_name.size() == 2 && by_name.at("127.0.0.1:16000") == 11 && by_name.count("x") == 0);
  CHECK(part < kv && kv > part && part <= kv && kv >= kv && !(kv < kv2));
  const AscendString null_str, null_ptr(nullptr), empty("");
  CHECK(std::strcmp(null_str.GetString(), "") == 0 && null_str.GetLength() == 0);
  CHECK(null_str == null_ptr && null_str != empty && null_str < empty && !(empty < null_str));
  const char *const no_chars = nullptr;
  CHECK(null_str == no_chars && empty != no_chars);
  CHECK(null_str.Hash() == empty.Hash());
  AscendString copy = kv;
  copy = "other";
  CHECK(kv == "kv-cache:7" && copy == "other");
}

// RegisterMemEx (a hixl extension): a local-only region serves its own engine's transfers and is
// refused to a peer (PARAM_INVALID).
void LocalOnly() {
  Hixl server, client;
  std::map<AscendString, AscendString> none;
  EXPECT(server.Initialize("127.0.0.1:0", none), SUCCESS);
  EXPECT(client.Initialize("127.0.0.1", none), SUCCESS);
  std::vector<unsigned char> pub(1 << 16), priv(1 << 16, 0xee), mine(1 << 16);
  for (size_t i = 0; i < pub.size(); i++) pub[i] = Pattern(i);
  MemDesc d{reinterpret_cast<uintptr_t>(priv.data()), priv.size(), {}};
  MemHandle hp = nullptr, hq = nullptr, hm = nullptr;
  EXPECT(server.RegisterMemEx(d, MEM_HOST, 0x80, hq), PARAM_INVALID);
  EXPECT(server.RegisterMemEx(d, MEM_HOST, REGISTER_LOCAL_ONLY, hq), SUCCESS);
  EXPECT(server.RegisterMemEx({reinterpret_cast<uintptr_t>(pub.data()), pub.size(), {}}, MEM_HOST,
                              0, hp),
         SUCCESS);
  EXPECT(client.RegisterMemEx({reinterpret_cast<uintptr_t>(mine.data()), mine.size(), {}}, MEM_HOST,
                              REGISTER_LOCAL_ONLY, hm),
         SUCCESS);
  AscendString name;
  EXPECT(server.GetLocalEngine(name), SUCCESS);
  EXPECT(client.Connect(name), SUCCESS);
  const uintptr_t local = reinterpret_cast<uintptr_t>(mine.data());
  const uintptr_t pub_addr = reinterpret_cast<uintptr_t>(pub.data());
  EXPECT(client.TransferSync(name, READ, {{local, pub_addr + 9, 999}}), SUCCESS);
  for (size_t i = 0; i < 999; i++) CHECK(mine[i] == Pattern(9 + i));
  const std::vector<TransferOpDesc> refused = {{local, d.addr, 64}};
  EXPECT(client.TransferSync(name, READ, refused), PARAM_INVALID);
  EXPECT(client.TransferSync(name, WRITE, refused), PARAM_INVALID);
  for (unsigned char b : priv) CHECK(b == 0xee);
  EXPECT(client.Disconnect(name), SUCCESS);
  client.Finalize();
  server.Finalize();
}

// AllocHostMem (a hixl extension) with two engines in this process: random data between
// engine-allocated buffers both ways, bad input, freeing while linked.
void EngineMemory() {
  Hixl server, client;
  std::map<AscendString, AscendString> none;
  void *p = nullptr;
  MemHandle hs = nullptr, hc = nullptr;
  EXPECT(server.AllocHostMem(4096, p, hs), FAILED);  // not initialized
  EXPECT(server.Initialize("127.0.0.1:0", none), SUCCESS);
  EXPECT(client.Initialize("127.0.0.1", none), SUCCESS);
  EXPECT(server.AllocHostMem(0, p, hs), PARAM_INVALID);
  EXPECT(server.AllocHostMem(SIZE_MAX, p, hs), RESOURCE_EXHAUSTED);
  CHECK(p == nullptr && hs == nullptr);
  const size_t size = 1 << 20;
  EXPECT(server.AllocHostMem(size, p, hs), SUCCESS);
  auto *kv = static_cast<unsigned char *>(p);
  EXPECT(client.AllocHostMem(size, p, hc), SUCCESS);
  auto *mine = static_cast<unsigned char *>(p);
  if (kv == nullptr || mine == nullptr) return;
  AscendString name;
  EXPECT(server.GetLocalEngine(name), SUCCESS);
  EXPECT(client.Connect(name), SUCCESS);
  std::mt19937_64 rng(std::random_device{}());
  for (size_t i = 0; i < size / 2; i++) mine[i] = static_cast<unsigned char>(rng());
  const auto at = [](unsigned char *b, size_t off) { return reinterpret_cast<uintptr_t>(b) + off; };
  EXPECT(client.TransferSync(name, WRITE, {{at(mine, 1), at(kv, 8191), 300007}}), SUCCESS);
  CHECK(std::memcmp(kv + 8191, mine + 1, 300007) == 0);
  EXPECT(client.TransferSync(name, READ, {{at(mine, size / 2), at(kv, 8191), 300007}}), SUCCESS);
  CHECK(std::memcmp(mine + size / 2, mine + 1, 300007) == 0);
  EXPECT(client.TransferSync(name, READ, {{at(mine, 0), at(kv, size - 8), 64}}), PARAM_INVALID);
  EXPECT(server.DeregisterMem(hs), SUCCESS);
  EXPECT(server.DeregisterMem(hs), SUCCESS);  // already deregistered: no effect (HIXL)
  EXPECT(client.DeregisterMem(hc), SUCCESS);
  EXPECT(client.TransferSync(name, WRITE, {{at(mine, 0), at(kv, 0), 64}}), PARAM_INVALID);
  EXPECT(client.Disconnect(name), SUCCESS);
  client.Finalize();
  server.Finalize();
}

int Server(size_t size, bool engine_memory) {
  Hixl engine;
  std::map<AscendString, AscendString> options;
  EXPECT(engine.Initialize("127.0.0.1:0", options), SUCCESS);
  std::vector<unsigned char> own;
  unsigned char *mem = nullptr;
  MemHandle handle = nullptr;
  if (engine_memory) {
    void *p = nullptr;
    EXPECT(engine.AllocHostMem(size, p, handle), SUCCESS);
    if (p == nullptr) return 1;
    mem = static_cast<unsigned char *>(p);
  } else {
    own.resize(size);
    mem = own.data();
    MemDesc desc{};
    desc.addr = reinterpret_cast<uintptr_t>(mem);
    desc.len = size;
    EXPECT(engine.RegisterMem(desc, MEM_HOST, handle), SUCCESS);
  }
  for (size_t i = 0; i < size; i++) mem[i] = Pattern(i);
  MemDesc desc{};
  desc.addr = reinterpret_cast<uintptr_t>(mem);
  desc.len = size;
  AscendString name;
  EXPECT(engine.GetLocalEngine(name), SUCCESS);
  if (failures) return 1;
  std::cout << "READY " << name.GetString() << " " << desc.addr << " " << desc.len << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    unsigned long off = 0, n = 0;
    if (std::sscanf(line.c_str(), "sum %lu %lu", &off, &n) == 2 && off + n <= size) {
      char hex[32];
      std::snprintf(hex, sizeof hex, "%016llx",
                    static_cast<unsigned long long>(Fnv1a(mem + off, n)));
      std::cout << "SUM " << hex << std::endl;
    } else if (line == "notifies") {
      std::vector<NotifyDesc> notifies;
      EXPECT(engine.GetNotifies(notifies), SUCCESS);
      for (const auto &nd : notifies)
        std::cout << "NOTIFY " << nd.name.GetString() << " " << nd.notify_msg.GetString() << "\n";
      std::cout << "END" << std::endl;
    } else if (line == "quit") {
      break;
    }
  }
  EXPECT(engine.DeregisterMem(handle), SUCCESS);
  engine.Finalize();
  return failures ? 1 : 0;
}

int Client(const char *remote, uintptr_t raddr, size_t rlen) {
  AscendStrings();
  LocalOnly();
  EngineMemory();
  Hixl engine;
  std::map<AscendString, AscendString> options;
  options[OPTION_RDMA_TRAFFIC_CLASS] = "132";
  EXPECT(engine.Initialize("127.0.0.1", options), SUCCESS);
  std::vector<unsigned char> mem(1 << 20);
  MemDesc desc{};
  desc.addr = reinterpret_cast<uintptr_t>(mem.data());
  desc.len = mem.size();
  MemHandle handle = nullptr;
  EXPECT(engine.RegisterMem(desc, MEM_HOST, handle), SUCCESS);
  EXPECT(engine.Connect(remote), SUCCESS);
  EXPECT(engine.Connect(remote, 1000), ALREADY_CONNECTED);
  AsyncConnectStatus cs = AsyncConnectStatus::NOT_CONNECT;
  EXPECT(engine.GetAsyncConnectStatus(remote, cs), SUCCESS);
  CHECK(cs == AsyncConnectStatus::CONNECTED);
  std::map<AscendString, AsyncConnectStatus> all;
  EXPECT(engine.GetAsyncConnectStatus(all), SUCCESS);
  CHECK(all.size() == 1 && all.count(remote) == 1);

  std::mt19937_64 rng(std::random_device{}());
  for (size_t i = 0; i < 300000; i++) mem[i] = static_cast<unsigned char>(rng());
  const uintptr_t base = desc.addr;
  std::vector<TransferOpDesc> writes = {{base + 1, raddr + 3, 4097},
                                        {base + 5000, raddr + 9001, 65537},
                                        {base + 80001, raddr + 200003, 999}};
  EXPECT(engine.TransferSync(remote, WRITE, writes), SUCCESS);
  for (const auto &w : writes)
    std::printf("WROTE %lu %lu %016llx\n", static_cast<unsigned long>(w.remote_addr - raddr),
                static_cast<unsigned long>(w.len),
                static_cast<unsigned long long>(
                    Fnv1a(reinterpret_cast<const unsigned char *>(w.local_addr), w.len)));
  std::vector<TransferOpDesc> reads = writes;
  for (auto &r : reads) r.local_addr += 400000;
  EXPECT(engine.TransferSync(remote, READ, reads, 1000), SUCCESS);
  for (size_t i = 0; i < reads.size(); i++)
    CHECK(std::memcmp(reinterpret_cast<void *>(reads[i].local_addr),
                      reinterpret_cast<void *>(writes[i].local_addr), writes[i].len) == 0);
  // a remote range outside the peer's registered memory
  std::vector<TransferOpDesc> outside = {{base, raddr + rlen - 4, 64}};
  EXPECT(engine.TransferSync(remote, READ, outside), PARAM_INVALID);

  // async READ of the server's untouched pattern, polled one by one and many at once
  TransferArgs args;
  TransferReq req = nullptr;
  std::vector<TransferOpDesc> pat = {{base + 600001, raddr + 300007, 7777}};
  EXPECT(engine.TransferAsync(remote, READ, pat, args, req), SUCCESS);
  TransferStatus st = TransferStatus::WAITING;
  for (int spins = 0; st == TransferStatus::WAITING && spins < 10000000; spins++)
    EXPECT(engine.GetTransferStatus(req, st), SUCCESS);
  CHECK(st == TransferStatus::COMPLETED);
  for (size_t i = 0; i < 7777; i++) CHECK(mem[600001 + i] == Pattern(300007 + i));
  EXPECT(engine.GetTransferStatus(req, st), PARAM_INVALID);  // reported: released
  std::vector<TransferReq> reqs;
  for (int i = 0; i < 4; i++) {
    TransferArgs tagged;
    tagged.user_data = reinterpret_cast<const void *>(static_cast<uintptr_t>(10 + i));
    std::vector<TransferOpDesc> d = {{base + 700000 + 1000 * i, raddr + 500000 + 1000 * i, 1000}};
    TransferReq r = nullptr;
    EXPECT(engine.TransferAsync(remote, READ, d, tagged, r), SUCCESS);
    reqs.push_back(r);
  }
  GetTransferStatusArgs query;
  query.skip_waiting = true;
  size_t done = 0;
  for (int spins = 0; done < reqs.size() && spins < 10000000; spins++) {
    std::vector<TransferResult> results;
    EXPECT(engine.GetTransferStatus(query, results), SUCCESS);
    for (const auto &r : results) {
      CHECK(r.status == TransferStatus::COMPLETED);
      uintptr_t tag = reinterpret_cast<uintptr_t>(r.user_data);
      CHECK(tag >= 10 && tag < 14 && r.req == reqs[tag - 10]);
      done++;
    }
  }
  CHECK(done == reqs.size());
  for (size_t i = 0; i < 4000; i++) CHECK(mem[700000 + i] == Pattern(500000 + i));

  // beyond HIXL: block-indexed READs of the server's untouched pattern (8 blocks of 1000
  // bytes from raddr + 800000, in reverse order), sync with 32-bit and async with 64-bit indices
  {
    BlockDesc bd;
    std::memset(&bd, 0, sizeof bd);
    bd.local_addr = base + 800000;
    bd.remote_addr = raddr + 800000;
    bd.block_size = 1000;
    std::vector<uint32_t> li = {0, 1, 2, 3, 4, 5, 6, 7}, ri = {7, 6, 5, 4, 3, 2, 1, 0};
    EXPECT(engine.TransferBlocks(remote, READ, bd, li, ri), SUCCESS);
    for (size_t k = 0; k < 8; k++)
      for (size_t i = 0; i < 1000; i++)
        CHECK(mem[800000 + k * 1000 + i] == Pattern(800000 + (7 - k) * 1000 + i));
    std::vector<uint64_t> li64 = {0, 1, 2, 3}, ri64 = {3, 2, 1, 0};
    bd.local_addr = base + 900000;
    TransferReq breq = nullptr;
    EXPECT(engine.TransferBlocksAsync(remote, READ, bd, li64, ri64, args, breq), SUCCESS);
    TransferStatus bst = TransferStatus::WAITING;
    for (int spins = 0; bst == TransferStatus::WAITING && spins < 10000000; spins++)
      EXPECT(engine.GetTransferStatus(breq, bst), SUCCESS);
    CHECK(bst == TransferStatus::COMPLETED);
    for (size_t k = 0; k < 4; k++)
      for (size_t i = 0; i < 1000; i++)
        CHECK(mem[900000 + k * 1000 + i] == Pattern(800000 + (3 - k) * 1000 + i));
    std::vector<uint32_t> shorter = {0};
    EXPECT(engine.TransferBlocks(remote, READ, bd, li, shorter), PARAM_INVALID);
    bd.block_size = 0;
    EXPECT(engine.TransferBlocks(remote, READ, bd, li, ri), PARAM_INVALID);
  }

  NotifyDesc notify;
  notify.name = "kv";
  notify.notify_msg = "ready";
  EXPECT(engine.SendNotify(remote, notify), SUCCESS);
  int32_t value = -1;
  EXPECT(Hixl::GetCapability(AUTO_CONNECT, value), SUCCESS);
  CHECK(value == FEATURE_SUPPORTED);
  EXPECT(Hixl::GetCapability(CLIENT_SERVER_COMM, value), SUCCESS);
  CHECK(value == FEATURE_NOT_SUPPORTED);
  EXPECT(engine.Disconnect(remote), SUCCESS);
  EXPECT(engine.DeregisterMem(handle), SUCCESS);
  engine.Finalize();
  engine.Finalize();
  if (failures) return 1;
  std::printf("PASS\n");
  return 0;
}
}  // namespace

int main(int argc, char **argv) {
  if ((argc == 3 || argc == 4) && std::strcmp(argv[1], "server") == 0)
    return Server(std::strtoul(argv[2], nullptr, 10),
                  argc == 4 && std::strcmp(argv[3], "engine") == 0);
  if (argc == 5 && std::strcmp(argv[1], "client") == 0)
    return Client(argv[2], static_cast<uintptr_t>(std::strtoull(argv[3], nullptr, 10)),
                  std::strtoul(argv[4], nullptr, 10));
  std::cerr << "usage: hixl_style server SIZE [caller|engine] | client NAME ADDR LEN\n";
  return 2;
}
