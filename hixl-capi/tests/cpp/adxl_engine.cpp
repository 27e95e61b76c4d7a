// A program in ADXL's style (adxl::AdxlEngine, as Mooncake's and DLSlime's Ascend transports use
// it), built against include/adxl/adxl_engine.h with CANN's example flags (among them
// -D_GLIBCXX_USE_CXX11_ABI=0, as CANN builds) and linked with -lllm_datadist alone (the library
// brings hixl's engine with it), run as two processes by tests/adxl.rs.
//
//   adxl_engine server SIZE [caller]  READY <name> <addr> <len>; then sum / notifies / quit
//   adxl_engine client NAME ADDR LEN  every call against that server, with its exact status;
//                                     prints WROTE <off> <len> <fnv1a>, then PASS
//   adxl_engine nodevice              where ACL loads (the test double): Initialize on a thread
//                                     with no device is ACL's 107002, then with one SUCCESS;
//                                     prints PASS
//   adxl_engine race                  Initialize/Finalize on one thread while two others call
//                                     the engine: every call answers SUCCESS or FAILED, no
//                                     crash; prints RACED <calls> and PASS
#include "adxl/adxl_engine.h"
#include "check.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace adxl;

static_assert(sizeof(void *) != 8 || sizeof(MemDesc) == 144, "MemDesc: 144 bytes");
static_assert(sizeof(TransferArgs) == 128, "TransferArgs: reserved[128]");
static_assert(sizeof(ShareableHandle) == 128, "aclrtMemFabricHandle");
static_assert(sizeof(TransferOpDesc) == 3 * sizeof(uint64_t), "TransferOpDesc");

namespace {
unsigned char Pattern(size_t i) { return static_cast<unsigned char>((i * 131u + 7u) & 0xffu); }

// A port nobody listens on now (ADXL has no call that tells an engine's port).
int FreePort() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
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

int Server(size_t size) {
  std::vector<unsigned char> mem(size);
  for (size_t i = 0; i < size; i++) mem[i] = Pattern(i);
  AdxlEngine e;
  std::string name;
  Status st = FAILED;
  for (int tries = 0; tries < 20 && st != SUCCESS; tries++) {  // another may take the port first
    name = "127.0.0.1:" + std::to_string(FreePort());
    st = e.Initialize(name.c_str(), {{OPTION_AUTO_CONNECT, "0"}});
  }
  EXPECT(st, SUCCESS);
  MemDesc md{};
  md.addr = reinterpret_cast<uintptr_t>(mem.data());
  md.len = size;
  MemHandle h = nullptr;
  EXPECT(e.RegisterMem(md, MEM_HOST, h), SUCCESS);
  std::printf("READY %s %lu %lu\n", name.c_str(), static_cast<unsigned long>(md.addr),
              static_cast<unsigned long>(size));
  std::fflush(stdout);
  std::vector<NotifyDesc> seen;
  char line[256];
  while (std::fgets(line, sizeof line, stdin) != nullptr) {
    unsigned long off = 0, len = 0;
    if (std::sscanf(line, "sum %lu %lu", &off, &len) == 2 && off + len <= size) {
      std::printf("SUM %016llx\n", static_cast<unsigned long long>(Fnv1a(mem.data() + off, len)));
    } else if (std::strncmp(line, "notifies", 8) == 0) {
      EXPECT(e.GetNotifies(seen), SUCCESS);
      for (const auto &n : seen) std::printf("NOTIFY %s %s\n", n.name.GetString(), n.notify_msg.GetString());
      std::printf("END\n");
      seen.clear();
    } else if (std::strncmp(line, "quit", 4) == 0) {
      break;
    }
    std::fflush(stdout);
  }
  EXPECT(e.DeregisterMem(h), SUCCESS);
  e.Finalize();
  return failures ? 1 : 0;
}

int Client(const std::string &name, uintptr_t raddr, size_t rlen) {
  const size_t size = 1 << 20;
  std::mt19937_64 rng(std::random_device{}());
  std::vector<unsigned char> mem(size);
  const AscendString remote(name.c_str());

  // before Initialize: FAILED, as ADXL
  AdxlEngine e;
  MemDesc md{};
  md.addr = reinterpret_cast<uintptr_t>(mem.data());
  md.len = size;
  MemHandle h = nullptr;
  EXPECT(e.RegisterMem(md, MEM_HOST, h), FAILED);
  EXPECT(e.Connect(remote), FAILED);
  std::vector<NotifyDesc> none;
  EXPECT(e.GetNotifies(none), FAILED);
  EXPECT(e.Initialize("127.0.0.1", {{"NoSuchKey", "1"}}), PARAM_INVALID);
  EXPECT(e.Connect(remote), FAILED);  // that engine did not initialize
  EXPECT(e.Initialize("127.0.0.1", {{OPTION_AUTO_CONNECT, "0"}, {OPTION_BUFFER_POOL, "0:0"}}), SUCCESS);

  // memory
  MemDesc null_md{};
  EXPECT(e.RegisterMem(null_md, MEM_HOST, h), PARAM_INVALID);
  EXPECT(e.RegisterMem(md, MEM_DEVICE, h), UNSUPPORTED);  // no Ascend here
  EXPECT(e.RegisterMem(md, MEM_HOST, h), SUCCESS);
  CHECK(h != nullptr);
  EXPECT(e.DeregisterMem(nullptr), PARAM_INVALID);

  // links
  std::vector<TransferOpDesc> d1{{md.addr, raddr, 64}};
  EXPECT(e.TransferSync(remote, WRITE, d1), NOT_CONNECTED);
  EXPECT(e.Connect(remote, 0), PARAM_INVALID);
  EXPECT(e.Connect(remote, -5), PARAM_INVALID);
  EXPECT(e.Connect(remote, 5000), SUCCESS);
  EXPECT(e.Connect(remote, 5000), ALREADY_CONNECTED);

  // bad transfers: ADXL refuses null addresses itself; the engine checks the ranges
  std::vector<TransferOpDesc> null_local{{0, raddr, 64}}, null_remote{{md.addr, 0, 64}};
  EXPECT(e.TransferSync(remote, WRITE, null_local), PARAM_INVALID);
  EXPECT(e.TransferSync(remote, READ, null_remote), PARAM_INVALID);
  EXPECT(e.TransferSync(remote, WRITE, d1, 0), PARAM_INVALID);
  std::vector<TransferOpDesc> outside{{md.addr, raddr + rlen - 8, 64}};
  EXPECT(e.TransferSync(remote, READ, outside), PARAM_INVALID);
  TransferReq req = nullptr;
  EXPECT(e.TransferAsync(remote, WRITE, null_local, TransferArgs{}, req), PARAM_INVALID);

  // WRITE random data at odd offsets, READ it back elsewhere
  for (size_t i = 0; i < 200000; i++) mem[i] = static_cast<unsigned char>(rng());
  std::vector<TransferOpDesc> w{{md.addr + 1, raddr + 3, 4097},
                                {md.addr + 5000, raddr + 9001, 65537},
                                {md.addr + 80001, raddr + 200003, 999}};
  EXPECT(e.TransferSync(remote, WRITE, w), SUCCESS);
  for (const auto &x : w) {
    std::printf("WROTE %lu %lu %016llx\n", static_cast<unsigned long>(x.remote_addr - raddr),
                static_cast<unsigned long>(x.len),
                static_cast<unsigned long long>(Fnv1a(reinterpret_cast<const unsigned char *>(x.local_addr), x.len)));
  }
  std::vector<TransferOpDesc> r = w;
  for (auto &x : r) x.local_addr += 300000;
  EXPECT(e.TransferSync(remote, READ, r, 5000), SUCCESS);
  for (size_t i = 0; i < w.size(); i++) {
    CHECK(std::memcmp(reinterpret_cast<void *>(r[i].local_addr), reinterpret_cast<void *>(w[i].local_addr),
                      w[i].len) == 0);
  }
  // the server's untouched pattern
  std::vector<TransferOpDesc> p{{md.addr + 600001, raddr + 300007, 7777}};
  EXPECT(e.TransferSync(remote, READ, p), SUCCESS);
  bool same = true;
  for (size_t i = 0; i < 7777; i++) same &= mem[600001 + i] == Pattern(300007 + i);
  CHECK(same);

  // async, with the user data in TransferArgs' first bytes, polled to its end
  for (size_t i = 0; i < 3000; i++) mem[700001 + i] = static_cast<unsigned char>(rng());
  std::vector<TransferOpDesc> a{{md.addr + 700001, raddr + 400001, 3000}};
  TransferArgs args{};
  const uint64_t tag = 0x77;
  std::memcpy(args.reserved, &tag, sizeof tag);
  EXPECT(e.TransferAsync(remote, WRITE, a, args, req), SUCCESS);
  CHECK(req != nullptr);
  TransferStatus ts = TransferStatus::WAITING;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ts == TransferStatus::WAITING && std::chrono::steady_clock::now() < until) {
    EXPECT(e.GetTransferStatus(req, ts), SUCCESS);
  }
  CHECK(ts == TransferStatus::COMPLETED);
  std::printf("WROTE %lu %lu %016llx\n", 400001ul, 3000ul,
              static_cast<unsigned long long>(Fnv1a(mem.data() + 700001, 3000)));
  TransferReq null_req = nullptr;
  EXPECT(e.GetTransferStatus(null_req, ts), FAILED);
  CHECK(ts == TransferStatus::FAILED);
  EXPECT(e.GetTransferStatus(req, ts), PARAM_INVALID);  // reported: released ("not found")
  CHECK(ts == TransferStatus::FAILED);

  // notifications
  std::string long_name(1025, 'n');
  EXPECT(e.SendNotify(remote, NotifyDesc{long_name.c_str(), "x"}), PARAM_INVALID);
  EXPECT(e.SendNotify(remote, NotifyDesc{"kv", "ready"}, 0), PARAM_INVALID);
  EXPECT(e.SendNotify(remote, NotifyDesc{"kv", "ready"}), SUCCESS);
  std::vector<NotifyDesc> mine{NotifyDesc{"kept", "as it was"}};
  EXPECT(e.GetNotifies(mine), SUCCESS);  // appends (nothing came to this engine)
  CHECK(mine.size() == 1 && mine[0].name == "kept");

  // the allocator statics: host memory; device memory and handles are FabricMem's
  void *hp = nullptr;
  EXPECT(AdxlEngine::MallocMem(MEM_HOST, 10000, &hp), SUCCESS);
  CHECK(hp != nullptr && reinterpret_cast<uintptr_t>(hp) % 4096 == 0);
  CHECK(static_cast<unsigned char *>(hp)[9999] == 0);
  std::memset(hp, 0x5a, 10000);
  EXPECT(AdxlEngine::MallocMem(MEM_HOST, 0, &hp), PARAM_INVALID);
  EXPECT(AdxlEngine::MallocMem(MEM_HOST, 64, nullptr), PARAM_INVALID);
  void *dp = nullptr;
  EXPECT(AdxlEngine::MallocMem(MEM_DEVICE, 4096, &dp), UNSUPPORTED);
  ShareableHandle sh{};
  EXPECT(AdxlEngine::ExportToShareableHandle(hp, sh), UNSUPPORTED);
  EXPECT(AdxlEngine::FreeMem(hp), SUCCESS);
  EXPECT(AdxlEngine::FreeMem(hp), PARAM_INVALID);  // freed already
  EXPECT(AdxlEngine::FreeMem(nullptr), PARAM_INVALID);
  int32_t cap = -1;
  EXPECT(AdxlEngine::GetCapability(AUTO_CONNECT, cap), SUCCESS);
  CHECK(cap == FEATURE_SUPPORTED);

  // teardown; then Initialize again makes a new engine (the old one goes)
  EXPECT(e.Disconnect(remote, 0), PARAM_INVALID);
  EXPECT(e.Disconnect(remote), SUCCESS);
  EXPECT(e.DeregisterMem(h), SUCCESS);
  EXPECT(e.Initialize("127.0.0.1", {}), SUCCESS);
  EXPECT(e.TransferSync(remote, READ, p), NOT_CONNECTED);  // a new engine: no link
  e.Finalize();
  EXPECT(e.Connect(remote), FAILED);
  e.Finalize();  // twice is fine

  // ge::AscendString, as GE's
  const AscendString empty, null_ptr(nullptr), abc("abc"), abd("abd", 3);
  CHECK(empty == null_ptr && empty.GetLength() == 0 && std::strcmp(empty.GetString(), "") == 0);
  CHECK(empty < abc && abc < abd && abd > abc && abc <= abc && abd >= abc && abc != abd);
  CHECK(abc == "abc" && abc != "abd" && empty == static_cast<const char *>(nullptr));
  CHECK(AscendString("xxabc").Find(abc) == 2 && empty.Find(abc) == std::string::npos);
  CHECK(std::hash<AscendString>()(abc) == AscendString("abc").Hash());

  if (failures) return 1;
  std::printf("PASS\n");
  return 0;
}
}  // namespace

using SetDevice = int (*)(int32_t);

// ACL's aclrtSetDevice-shaped call `name`, reached with dlopen (the program links
// -lllm_datadist alone), or null with the reason on stderr.
SetDevice AclCall(const char *name) {
  void *acl = dlopen("libascendcl.so", RTLD_NOW | RTLD_GLOBAL);
  if (acl == nullptr) {
    std::fprintf(stderr, "no libascendcl.so: %s\n", dlerror());
    return nullptr;
  }
  return reinterpret_cast<SetDevice>(dlsym(acl, name));
}

// ADXL reads the thread's device when it starts, as upstream's (aclrtGetDevice): on a thread
// with none, Initialize fails with ACL's ACL_ERROR_RT_CONTEXT_NULL; once aclrtSetDevice ran,
// it succeeds.
int NoDevice() {
  auto set_device = AclCall("aclrtSetDevice");
  auto reset_device = AclCall("aclrtResetDevice");
  CHECK(set_device != nullptr && reset_device != nullptr);
  if (set_device == nullptr || reset_device == nullptr) return 1;
  std::map<AscendString, AscendString> none;
  {
    AdxlEngine engine;
    EXPECT(engine.Initialize("127.0.0.1", none), 107002U);  // ACL_ERROR_RT_CONTEXT_NULL
    MemHandle h = nullptr;
    MemDesc d{};
    d.addr = 4096;
    d.len = 4096;
    EXPECT(engine.RegisterMem(d, MEM_HOST, h), FAILED);  // not initialized
  }
  CHECK(set_device(3) == 0);
  {
    AdxlEngine engine;
    EXPECT(engine.Initialize("127.0.0.1", none), SUCCESS);
    engine.Finalize();
  }
  CHECK(reset_device(3) == 0);
  if (failures) return 1;
  std::printf("PASS\n");
  return 0;
}

// AdxlEngine's lifecycle calls against the others, on three threads: one thread re-initializes
// and finalizes the engine again and again while two call it (register and deregister host
// memory, take notifications, connect to a port nobody listens on). Every call answers
// SUCCESS or FAILED (the engine is not initialized at that moment), NOT_CONNECTED-like
// statuses for the connect; nothing crashes or touches freed memory (the AddressSanitizer
// step runs it too).
int Race() {
  auto set_device = AclCall("aclrtSetDevice");
  CHECK(set_device != nullptr);
  if (set_device == nullptr) return 1;
  std::map<AscendString, AscendString> none;
  AdxlEngine engine;
  CHECK(set_device(0) == 0);
  EXPECT(engine.Initialize("127.0.0.1", none), SUCCESS);
  std::atomic<bool> done{false};
  std::atomic<uint64_t> calls{0}, odd{0};
  std::vector<unsigned char> mem(1 << 16);
  auto caller = [&](int which) {
    CHECK(set_device(0) == 0);
    while (!done.load()) {
      Status st;
      if (which == 0) {
        MemHandle h = nullptr;
        MemDesc d{};
        d.addr = reinterpret_cast<uintptr_t>(mem.data()) + 4096 * static_cast<uintptr_t>(calls.load() % 8);
        d.len = 4096;
        st = engine.RegisterMem(d, MEM_HOST, h);
        // the handle may belong to an engine a re-initialization finalized since: the new
        // engine refuses it (PARAM_INVALID), the old one is gone (FAILED)
        if (st == SUCCESS && engine.DeregisterMem(h) == FAILED) st = FAILED;
      } else {
        std::vector<NotifyDesc> got;
        st = engine.GetNotifies(got);
        if (st == SUCCESS) st = engine.Connect("127.0.0.1:1", 20);
        if (st != SUCCESS && st != FAILED) st = SUCCESS;  // the connect's own refusal
      }
      if (st != SUCCESS && st != FAILED) {
        odd.fetch_add(1);
        std::fprintf(stderr, "thread %d: status %u\n", which, static_cast<unsigned>(st));
      }
      calls.fetch_add(1);
    }
  };
  std::thread a(caller, 0), b(caller, 1);
  for (int i = 0; i < 100; ++i) {
    engine.Finalize();
    Status st = engine.Initialize("127.0.0.1", none);
    if (st != SUCCESS) {
      odd.fetch_add(1);
      std::fprintf(stderr, "Initialize: status %u\n", static_cast<unsigned>(st));
    }
  }
  done.store(true);
  a.join();
  b.join();
  engine.Finalize();
  CHECK(odd.load() == 0);
  if (failures) return 1;
  std::printf("RACED %llu\nPASS\n", static_cast<unsigned long long>(calls.load()));
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && std::strcmp(argv[1], "nodevice") == 0) return NoDevice();
  if (argc == 2 && std::strcmp(argv[1], "race") == 0) return Race();
  if ((argc == 3 || argc == 4) && std::strcmp(argv[1], "server") == 0) return Server(std::strtoul(argv[2], nullptr, 10));
  if (argc == 5 && std::strcmp(argv[1], "client") == 0) {
    return Client(argv[2], static_cast<uintptr_t>(std::strtoull(argv[3], nullptr, 10)),
                  std::strtoul(argv[4], nullptr, 10));
  }
  std::fprintf(stderr, "usage: adxl_engine server SIZE | client NAME ADDR LEN\n");
  return 2;
}
