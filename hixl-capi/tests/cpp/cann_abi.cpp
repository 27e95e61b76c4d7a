// A HIXL program compiled against declarations matching CANN's own include/hixl/hixl.h
// (cann_hixl.h: the exported class with a pimpl, every method out of line, and GE's
// ge::AscendString out of line), with HIXL's example flags (CANN's C++ ABI,
// -D_GLIBCXX_USE_CXX11_ABI=0), linked with -lcann_hixl alone: every call goes to
// libcann_hixl.so by CANN's mangled names. Run as two processes by tests/cpp_abi.rs.
//
//   cann_abi server SIZE              READY <name> <addr> <len>; then sum / notifies / quit
//   cann_abi client NAME ADDR LEN     connect, WRITE and READ random data sync and async,
//                                     the status lists, a notification, refused ranges;
//                                     prints WROTE <off> <len> <fnv1a> per write, then PASS
//   cann_abi mixed                    the client against a server in this process, served by
//                                     a preloaded library built with hixl's header-only form
//                                     (header_only_peer.cpp: peer_serve, peer_sum); checks
//                                     what it wrote there itself; prints PASS
//
// The server's engine listens on "127.0.0.1:0" (an ephemeral port); CANN's API has no call that
// gives the port, so the server finds it as any program may: its listening socket in
// /proc/net/tcp, by the inode of one of its own descriptors.
#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "cann_hixl.h"
#include "check.h"

using namespace hixl;

namespace {
// The port this process listens on for TCP: the inodes of its sockets, matched against
// /proc/net/tcp's listening entries (state 0A).
int ListeningPort() {
  std::set<std::string> inodes;
  if (DIR *d = opendir("/proc/self/fd")) {
    while (dirent *e = readdir(d)) {
      char link[256] = {0};
      const std::string path = std::string("/proc/self/fd/") + e->d_name;
      const ssize_t n = readlink(path.c_str(), link, sizeof link - 1);
      if (n > 9 && std::strncmp(link, "socket:[", 8) == 0) inodes.insert(std::string(link + 8, n - 9));
    }
    closedir(d);
  }
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);
  while (std::getline(tcp, line)) {
    std::istringstream w(line);
    std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
    w >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
    if (state == "0A" && inodes.count(inode)) return static_cast<int>(std::stoul(local.substr(9), nullptr, 16));
  }
  return -1;
}

// GE's ge::AscendString, every method out of line in the library.
void AscendStrings() {
  const AscendString kv("kv-cache:7"), part("kv-cache:7xyz", 8), null_str;
  CHECK(kv == "kv-cache:7" && kv != "kv" && std::strcmp(part.GetString(), "kv-cache") == 0);
  CHECK(kv.GetLength() == 10 && kv.Find(":7") == 8 && kv.Find("nope") == std::string::npos);
  CHECK(kv.Hash() == std::hash<std::string>()("kv-cache:7") && std::hash<AscendString>()(kv) == kv.Hash());
  CHECK(part < kv && kv > part && part <= kv && kv >= kv && !(kv < kv) && kv == AscendString("kv-cache:7"));
  CHECK(std::strcmp(null_str.GetString(), "") == 0 && null_str < AscendString("") && null_str != AscendString(""));
  // a length no std::string holds: GE's constructor throws std::length_error, and the exception
  // reaches the caller through the library's exported forward (which let it unwind)
  bool threw = false;
  try {
    const AscendString too_long("x", static_cast<size_t>(-1));
    (void)too_long;
  } catch (const std::length_error &) {
    threw = true;
  }
  CHECK(threw);
}

int Server(size_t size) {
  Hixl engine;
  std::map<AscendString, AscendString> options;
  EXPECT(engine.Initialize("127.0.0.1:0", options), SUCCESS);
  std::vector<unsigned char> mem(size);
  for (size_t i = 0; i < size; i++) mem[i] = static_cast<unsigned char>(i * 131u + 7u);
  MemDesc desc{};
  desc.addr = reinterpret_cast<uintptr_t>(mem.data());
  desc.len = size;
  MemHandle handle = nullptr;
  EXPECT(engine.RegisterMem(desc, MEM_HOST, handle), SUCCESS);
  const int port = ListeningPort();
  CHECK(port > 0);
  if (failures) return 1;
  std::cout << "READY 127.0.0.1:" << port << " " << desc.addr << " " << desc.len << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream cmd(line);
    std::string what;
    cmd >> what;
    if (what == "sum") {
      size_t off = 0, len = 0;
      cmd >> off >> len;
      char hex[32];
      std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(Fnv1a(mem.data() + off, len)));
      std::cout << "SUM " << hex << std::endl;
    } else if (what == "notifies") {
      std::vector<NotifyDesc> got;
      EXPECT(engine.GetNotifies(got), SUCCESS);
      for (const auto &n : got) std::cout << "NOTIFY " << n.name.GetString() << " " << n.notify_msg.GetString() << "\n";
      std::cout << "END" << std::endl;
    } else if (what == "quit") {
      break;
    }
  }
  EXPECT(engine.DeregisterMem(handle), SUCCESS);
  EXPECT(engine.DeregisterMem(handle), SUCCESS);  // already deregistered: no effect (HIXL)
  engine.Finalize();
  return failures ? 1 : 0;
}

struct Wrote {
  size_t off, len;
  uint64_t sum;
};
std::vector<Wrote> wrote;

void Written(size_t off, size_t len, const unsigned char *p) {
  wrote.push_back({off, len, Fnv1a(p, len)});
  std::printf("WROTE %zu %zu %016llx\n", off, len, static_cast<unsigned long long>(wrote.back().sum));
}

int Client(const char *name, uintptr_t raddr, size_t rlen) {
  AscendStrings();
  int32_t cap = -1;
  EXPECT(Hixl::GetCapability(AUTO_CONNECT, cap), SUCCESS);
  CHECK(cap == FEATURE_SUPPORTED);
  Hixl engine;
  std::map<AscendString, AscendString> options;
  MemHandle handle = nullptr;
  std::vector<unsigned char> mine(rlen);
  MemDesc desc{};
  desc.addr = reinterpret_cast<uintptr_t>(mine.data());
  desc.len = mine.size();
  EXPECT(engine.RegisterMem(desc, MEM_HOST, handle), FAILED);  // before Initialize
  options["AutoConnect"] = "0";
  options["NoSuchOption"] = "1";
  EXPECT(engine.Initialize("127.0.0.1", options), PARAM_INVALID);
  options.erase("NoSuchOption");
  EXPECT(engine.Initialize("127.0.0.1", options), SUCCESS);
  EXPECT(engine.RegisterMem(desc, MEM_HOST, handle), SUCCESS);
  const AscendString remote(name);
  const uintptr_t local = desc.addr;
  EXPECT(engine.TransferSync(remote, WRITE, {{local, raddr, 64}}), NOT_CONNECTED);
  EXPECT(engine.Connect(remote), SUCCESS);
  EXPECT(engine.Connect(remote), ALREADY_CONNECTED);
  std::map<AscendString, AsyncConnectStatus> all;
  EXPECT(engine.GetAsyncConnectStatus(all), SUCCESS);
  CHECK(all.size() == 1 && all.count(remote) == 1 && all[remote] == AsyncConnectStatus::CONNECTED);
  std::mt19937_64 rng(std::random_device{}());
  for (auto &b : mine) b = static_cast<unsigned char>(rng());
  // sync WRITE of two descriptors, then READ them back elsewhere
  const size_t a = 4096, b = 100003;
  EXPECT(engine.TransferSync(remote, WRITE, {{local, raddr + 17, a}, {local + a, raddr + 65536, b}}), SUCCESS);
  Written(17, a, mine.data());
  Written(65536, b, mine.data() + a);
  const size_t back = rlen / 2;
  EXPECT(engine.TransferSync(remote, READ, {{local + back, raddr + 65536, b}}), SUCCESS);
  CHECK(std::memcmp(mine.data() + back, mine.data() + a, b) == 0);
  // async WRITE, polled, then the many-request status form
  for (size_t i = 0; i < 8192; i++) mine[i] = static_cast<unsigned char>(rng());
  TransferArgs args;
  TransferReq req = nullptr;
  EXPECT(engine.TransferAsync(remote, WRITE, {{local, raddr + 300000, 8192}}, args, req), SUCCESS);
  TransferStatus st = TransferStatus::WAITING;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (st == TransferStatus::WAITING && std::chrono::steady_clock::now() < deadline) {
    EXPECT(engine.GetTransferStatus(req, st), SUCCESS);
    if (st == TransferStatus::WAITING) std::this_thread::yield();
  }
  CHECK(st == TransferStatus::COMPLETED);
  Written(300000, 8192, mine.data());
  std::vector<TransferResult> results;
  EXPECT(engine.GetTransferStatus(GetTransferStatusArgs{}, results), SUCCESS);
  CHECK(results.empty());
  // refused: a remote range past the end of the server's region; nothing moves
  std::vector<unsigned char> before(mine.begin(), mine.begin() + 64);
  EXPECT(engine.TransferSync(remote, READ, {{local, raddr + rlen - 8, 64}}), PARAM_INVALID);
  CHECK(std::memcmp(before.data(), mine.data(), 64) == 0);
  NotifyDesc note;
  note.name = "kv";
  note.notify_msg = "ready";
  EXPECT(engine.SendNotify(remote, note), SUCCESS);
  EXPECT(engine.Disconnect(remote), SUCCESS);
  AsyncConnectStatus one = AsyncConnectStatus::CONNECTED;
  EXPECT(engine.GetAsyncConnectStatus(remote, one), SUCCESS);
  CHECK(one == AsyncConnectStatus::NOT_CONNECT);
  EXPECT(engine.DeregisterMem(handle), SUCCESS);
  engine.Finalize();
  engine.Finalize();  // twice is fine
  std::fflush(stdout);
  if (failures) return 1;
  std::printf("PASS\n");
  return 0;
}
}  // namespace

// The server is a library built with hixl's header-only form, preloaded into this process
// (LD_PRELOAD), whose inline copies of ge::AscendString's methods (the default C++ ABI) must not
// stand in for the ones this program calls in libcann_hixl.so (CANN's ABI).
int Mixed() {
  using Serve = int (*)(char *, size_t, uint64_t *, uint64_t *);
  using Sum = uint64_t (*)(uint64_t, uint64_t);
  using Stop = void (*)();
  auto serve = reinterpret_cast<Serve>(dlsym(RTLD_DEFAULT, "peer_serve"));
  auto sum = reinterpret_cast<Sum>(dlsym(RTLD_DEFAULT, "peer_sum"));
  auto stop = reinterpret_cast<Stop>(dlsym(RTLD_DEFAULT, "peer_stop"));
  if (serve == nullptr || sum == nullptr || stop == nullptr) {
    std::fprintf(stderr, "no peer_serve: preload header_only_peer's library\n");
    return 1;
  }
  char name[128];
  uint64_t addr = 0, len = 0;
  CHECK(serve(name, sizeof name, &addr, &len) == 0);
  if (failures) return 1;
  const int rc = Client(name, addr, len);
  for (const Wrote &w : wrote) CHECK(sum(w.off, w.len) == w.sum);
  stop();
  if (rc != 0 || failures) return 1;
  std::printf("PASS\n");
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && std::strcmp(argv[1], "mixed") == 0) return Mixed();
  if (argc >= 3 && std::strcmp(argv[1], "server") == 0) return Server(std::strtoull(argv[2], nullptr, 10));
  if (argc >= 5 && std::strcmp(argv[1], "client") == 0)
    return Client(argv[2], std::strtoull(argv[3], nullptr, 10), std::strtoull(argv[4], nullptr, 10));
  std::cerr << "usage: cann_abi server SIZE | client NAME ADDR LEN\n";
  return 2;
}
