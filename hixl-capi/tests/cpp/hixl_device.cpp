// Device memory as HIXL's own C++ examples move it (quickstart, d2rd, d2rh, d2rd_multiproc),
// written for hixl's CI: a program in HIXL's style built with the flags and the link line of
// HIXL's examples/cpp/CMakeLists.txt (`-lcann_hixl -lacl_rt -lascend_hal -lpthread -lrt`), run as
// two processes by tests/cpp_device.rs on CANN's ACL runtime, or on the ACL/HCCL test double
// that tools/ascend-double.sh builds under CANN's library names. Nothing hixl-specific is set:
// hixl takes the device that aclrtSetDevice made current on the thread calling Initialize.
//
//   hixl_device server DEVICE SEED
//       READY <engine> <device buffer> <host buffer> <spare device buffer>; then commands on
//       stdin, each answered with OK (FAIL if a check failed, the reason on stderr):
//         check OFF LEN TAG POS   the device buffer at OFF holds bytes POS.. of stream TAG
//         check-spare             the spare buffer still holds what the server put there
//         connect ENGINE ADDR     ConnectAsync to the client, WRITE to its host buffer at ADDR
//         deregister              DeregisterMem of the spare buffer (the client is linked)
//         quit                    Finalize (links still open), free, exit: BYE
//   hixl_device client DEVICE ENGINE DEV HOST SPARE SEED
//       CLIENT <engine> <host buffer>; connects, READs and WRITEs, prints WROTE OFF LEN TAG POS
//       for each range of the server's device buffer it wrote, then LINKED; then commands:
//         check-host OFF LEN TAG POS   its host buffer at OFF holds bytes POS.. of TAG: OK
//         after-deregister             the server deregistered the spare buffer: WROTE ..., OK
//         disconnect                   Disconnect (the server is gone: SUCCESS), free: PASS
//
// Every byte moved is random (std::mt19937_64 of SEED and a stream tag), and each side checks
// what it received: device memory through aclrtMemcpy DEVICE_TO_HOST.
#include "hixl/hixl.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "acl_decls.h"  // CANN's ACL runtime API, as acl/acl.h declares it

using namespace hixl;

namespace {
constexpr size_t kDevSize = 4 * 1024 * 1024;  // each device buffer
constexpr size_t kHalf = kDevSize / 2;        // server: [0, kHalf) is read, the rest written
constexpr size_t kHostSize = 1024 * 1024;     // each host buffer (aclrtMallocHost)
constexpr size_t kSpareSize = 2 * 1024 * 1024;
constexpr int32_t kConnectTimeoutMs = 5000;
constexpr int32_t kTransferTimeoutMs = 10000;
constexpr auto kPollLimit = std::chrono::seconds(30);

// the random streams: what each buffer is filled with
constexpr uint64_t kServerDev = 1, kServerHost = 2, kSpare = 3, kClientDev = 4, kClientHost = 5,
                   kSecond = 6;

int failures = 0;

const char *ErrMsg() {
  const char *msg = aclGetRecentErrMsg();
  return msg == nullptr ? "no error" : msg;
}

void ExpectStatus(Status got, Status want, const char *what, int line) {
  if (got != want) {
    std::cerr << "line " << line << ": " << what << ": status " << got << ", expected " << want
              << " (last error message: " << hixl_last_error_message() << ")" << std::endl;
    failures++;
  }
}
#define EXPECT(call, want) ExpectStatus((call), (want), #call, __LINE__)
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::cerr << "line " << __LINE__ << ": " #cond " is false" << std::endl; \
      failures++;                                                              \
    }                                                                          \
  } while (0)
#define CHECK_ACL(call)                                                                            \
  do {                                                                                             \
    aclError acl_ret_ = (call);                                                                    \
    if (acl_ret_ != ACL_ERROR_NONE) {                                                              \
      std::cerr << "line " << __LINE__ << ": " #call ": aclError " << acl_ret_ << " (" << ErrMsg() \
                << ")" << std::endl;                                                               \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)

// Bytes pos..pos+len of the random stream `tag` of this run's seed.
std::vector<uint8_t> Stream(uint64_t seed, uint64_t tag, size_t pos, size_t len) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + tag);
  std::vector<uint8_t> all(pos + len);
  for (size_t i = 0; i < all.size(); i += 8) {
    uint64_t v = rng();
    for (size_t k = 0; k < 8 && i + k < all.size(); k++)
      all[i + k] = static_cast<uint8_t>(v >> (8 * k));
  }
  return std::vector<uint8_t>(all.begin() + static_cast<std::ptrdiff_t>(pos), all.end());
}

void ToDevice(void *dev, size_t off, const std::vector<uint8_t> &data) {
  CHECK_ACL(aclrtMemcpy(static_cast<uint8_t *>(dev) + off, data.size(), data.data(), data.size(),
                        ACL_MEMCPY_HOST_TO_DEVICE));
}

std::vector<uint8_t> FromDevice(const void *dev, size_t off, size_t len) {
  std::vector<uint8_t> out(len);
  CHECK_ACL(aclrtMemcpy(out.data(), len, static_cast<const uint8_t *>(dev) + off, len,
                        ACL_MEMCPY_DEVICE_TO_HOST));
  return out;
}

// Whether `got` is bytes pos.. of stream `tag`; prints where it differs.
bool Same(const std::vector<uint8_t> &got, uint64_t seed, uint64_t tag, size_t pos,
          const char *what) {
  std::vector<uint8_t> want = Stream(seed, tag, pos, got.size());
  for (size_t i = 0; i < got.size(); i++) {
    if (got[i] != want[i]) {
      std::cerr << what << ": byte " << i << " of " << got.size() << " is " << int(got[i])
                << ", expected " << int(want[i]) << " (stream " << tag << " at " << pos + i << ")"
                << std::endl;
      return false;
    }
  }
  return true;
}

// The device current on this thread (-1: none). hixl works in the context of the device that was
// current when Initialize ran and gives the thread back its own each time.
int32_t CurrentDevice() {
  int32_t d = -1;
  return aclrtGetDevice(&d) == ACL_ERROR_NONE ? d : -1;
}

uintptr_t Addr(const void *p) { return reinterpret_cast<uintptr_t>(p); }

std::map<AscendString, AscendString> Options() {
  std::map<AscendString, AscendString> options;
  options[OPTION_GLOBAL_RESOURCE_CONFIG] =
      R"({"comm_resource_config.protocol_desc": ["hccs:device"]})";
  return options;
}

// Polls a request until it leaves WAITING (or kPollLimit passes).
TransferStatus Wait(Hixl &engine, TransferReq req) {
  TransferStatus st = TransferStatus::WAITING;
  const auto deadline = std::chrono::steady_clock::now() + kPollLimit;
  while (st == TransferStatus::WAITING && std::chrono::steady_clock::now() < deadline) {
    EXPECT(engine.GetTransferStatus(req, st), SUCCESS);
  }
  return st;
}

// The answer to a command: OK unless a check failed since `before`.
void Answer(int before) { std::cout << (failures == before ? "OK" : "FAIL") << std::endl; }

struct Region {
  void *ptr = nullptr;
  MemHandle handle = nullptr;
};

// aclrtMalloc(HUGE_ONLY) of `size`, filled with stream `tag` through aclrtMemcpy, registered.
Region DeviceRegion(Hixl &engine, size_t size, uint64_t seed, uint64_t tag) {
  Region r;
  CHECK_ACL(aclrtMalloc(&r.ptr, size, ACL_MEM_MALLOC_HUGE_ONLY));
  ToDevice(r.ptr, 0, Stream(seed, tag, 0, size));
  MemDesc desc{};
  desc.addr = Addr(r.ptr);
  desc.len = size;
  EXPECT(engine.RegisterMem(desc, MEM_DEVICE, r.handle), SUCCESS);
  return r;
}

// aclrtMallocHost of `size`, filled with stream `tag`, registered as MEM_HOST.
Region HostRegion(Hixl &engine, size_t size, uint64_t seed, uint64_t tag) {
  Region r;
  CHECK_ACL(aclrtMallocHost(&r.ptr, size));
  std::vector<uint8_t> fill = Stream(seed, tag, 0, size);
  std::memcpy(r.ptr, fill.data(), size);
  MemDesc desc{};
  desc.addr = Addr(r.ptr);
  desc.len = size;
  EXPECT(engine.RegisterMem(desc, MEM_HOST, r.handle), SUCCESS);
  return r;
}

int Server(int32_t device, uint64_t seed) {
  CHECK_ACL(aclrtSetDevice(device));
  Hixl engine;
  EXPECT(engine.Initialize("127.0.0.1:0", Options()), SUCCESS);
  CHECK(CurrentDevice() == device);
  Region dev = DeviceRegion(engine, kDevSize, seed, kServerDev);
  Region host = HostRegion(engine, kHostSize, seed, kServerHost);
  Region spare = DeviceRegion(engine, kSpareSize, seed, kSpare);
  AscendString name;
  EXPECT(engine.GetLocalEngine(name), SUCCESS);
  if (failures) return 1;
  std::cout << "READY " << name.GetString() << " " << Addr(dev.ptr) << " " << Addr(host.ptr) << " "
            << Addr(spare.ptr) << std::endl;

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    const int before = failures;
    if (cmd == "check") {
      size_t off = 0, len = 0, pos = 0;
      uint64_t tag = 0;
      in >> off >> len >> tag >> pos;
      CHECK(off + len <= kDevSize);
      if (off + len <= kDevSize)
        CHECK(Same(FromDevice(dev.ptr, off, len), seed, tag, pos, "server device buffer"));
      Answer(before);
    } else if (cmd == "check-spare") {
      CHECK(Same(FromDevice(spare.ptr, 0, kSpareSize), seed, kSpare, 0, "spare buffer"));
      Answer(before);
    } else if (cmd == "connect") {
      // the other direction, asynchronously: this engine connects to the client's
      std::string client;
      uintptr_t target = 0;
      in >> client >> target;
      const AscendString remote(client.c_str());
      EXPECT(engine.ConnectAsync(remote, kConnectTimeoutMs), SUCCESS);
      AsyncConnectStatus st = AsyncConnectStatus::NOT_CONNECT;
      const auto deadline = std::chrono::steady_clock::now() + kPollLimit;
      while (st != AsyncConnectStatus::CONNECTED && st != AsyncConnectStatus::CONNECT_FAILED &&
             std::chrono::steady_clock::now() < deadline) {
        EXPECT(engine.GetAsyncConnectStatus(remote, st), SUCCESS);
      }
      CHECK(st == AsyncConnectStatus::CONNECTED);
      // device to remote host, as d2rh does: bytes 0..65536 of the server's own stream
      EXPECT(
          engine.TransferSync(remote, WRITE, {{Addr(dev.ptr), target, 65536}}, kTransferTimeoutMs),
          SUCCESS);
      Answer(before);
    } else if (cmd == "deregister") {
      EXPECT(engine.DeregisterMem(spare.handle), SUCCESS);
      spare.handle = nullptr;
      Answer(before);
    } else if (cmd == "quit") {
      break;
    } else {
      std::cerr << "server: unknown command " << line << std::endl;
      failures++;
      Answer(before);
    }
  }
  // as HIXL's examples end: deregister, free, finalize, reset; links are still open (the
  // client disconnects after this process is gone)
  EXPECT(engine.DeregisterMem(dev.handle), SUCCESS);
  EXPECT(engine.DeregisterMem(host.handle), SUCCESS);
  engine.Finalize();
  CHECK(CurrentDevice() == device);
  CHECK_ACL(aclrtFree(dev.ptr));
  CHECK_ACL(aclrtFree(spare.ptr));
  CHECK_ACL(aclrtFreeHost(host.ptr));
  CHECK_ACL(aclrtResetDevice(device));
  std::cout << (failures ? "FAIL" : "BYE") << std::endl;
  return failures ? 1 : 0;
}

// WRITE of client bytes to the server's device buffer, reported to the driver for checking.
struct Wrote {
  size_t server_off, len;
  uint64_t tag;
  size_t pos;
};

// The server deregistered its spare buffer while this engine was linked to it, which closed the
// server's communicator that had the buffer bound. The link made before still has the table the
// server sent at Connect: a WRITE on it to the withdrawn buffer fails in the fabric (nothing is
// written: the driver checks the buffer afterwards) and breaks the link, which then answers
// NOT_CONNECTED (no AutoConnect). Disconnect and Connect give a new link, whose table lacks the
// spare buffer (PARAM_INVALID before anything moves) and has the rest of the server's memory.
void AfterDeregister(Hixl &engine, const AscendString &remote, const Region &dev, uintptr_t sdev,
                     uintptr_t sspare, uint64_t seed) {
  const uintptr_t cdev = Addr(dev.ptr);
  const Status old_link =
      engine.TransferSync(remote, WRITE, {{cdev, sspare + 8192, 4096}}, kTransferTimeoutMs);
  if (old_link == SUCCESS) {
    std::cerr << "a WRITE to the deregistered buffer succeeded" << std::endl;
    failures++;
  }
  EXPECT(engine.TransferSync(remote, READ, {{cdev + kHalf, sdev, 4096}}, kTransferTimeoutMs),
         NOT_CONNECTED);
  AsyncConnectStatus cs = AsyncConnectStatus::CONNECTED;
  EXPECT(engine.GetAsyncConnectStatus(remote, cs), SUCCESS);
  CHECK(cs != AsyncConnectStatus::CONNECTED);
  EXPECT(engine.Disconnect(remote, kConnectTimeoutMs), SUCCESS);
  EXPECT(engine.Connect(remote, kConnectTimeoutMs), SUCCESS);
  EXPECT(engine.TransferSync(remote, READ, {{cdev + kHalf, sspare, 4096}}, kTransferTimeoutMs),
         PARAM_INVALID);
  EXPECT(engine.TransferSync(remote, WRITE, {{cdev, sspare + 4096, 4096}}, kTransferTimeoutMs),
         PARAM_INVALID);
  EXPECT(engine.TransferSync(remote, READ, {{cdev + kHalf + 1900000, sdev + 999, 70000}},
                             kTransferTimeoutMs),
         SUCCESS);
  CHECK(Same(FromDevice(dev.ptr, kHalf + 1900000, 70000), seed, kServerDev, 999,
             "READ after the deregistration"));
  EXPECT(engine.TransferSync(remote, WRITE, {{cdev + 1500000, sdev + kHalf + 2040000, 50000}},
                             kTransferTimeoutMs),
         SUCCESS);
  std::cout << "WROTE " << kHalf + 2040000 << " 50000 " << kClientDev << " 1500000" << std::endl;
}

int Client(int32_t device, const char *server, uintptr_t sdev, uintptr_t shost, uintptr_t sspare,
           uint64_t seed) {
  CHECK_ACL(aclrtSetDevice(device));
  Hixl engine;
  EXPECT(engine.Initialize("127.0.0.1:0", Options()), SUCCESS);
  CHECK(CurrentDevice() == device);
  Region dev = DeviceRegion(engine, kDevSize, seed, kClientDev);
  Region host = HostRegion(engine, kHostSize, seed, kClientHost);
  AscendString name;
  EXPECT(engine.GetLocalEngine(name), SUCCESS);
  if (failures) return 1;
  std::cout << "CLIENT " << name.GetString() << " " << Addr(host.ptr) << std::endl;
  const AscendString remote(server);
  const uintptr_t cdev = Addr(dev.ptr), chost = Addr(host.ptr);
  std::vector<Wrote> wrote;

  EXPECT(engine.Connect(remote, kConnectTimeoutMs), SUCCESS);
  EXPECT(engine.Connect(remote, kConnectTimeoutMs), ALREADY_CONNECTED);
  AsyncConnectStatus cs = AsyncConnectStatus::NOT_CONNECT;
  EXPECT(engine.GetAsyncConnectStatus(remote, cs), SUCCESS);
  CHECK(cs == AsyncConnectStatus::CONNECTED);

  // READ: remote device and remote host into local device and local host memory
  const std::vector<TransferOpDesc> reads = {
      {cdev + kHalf, sdev, 1024 * 1024},
      {cdev + kHalf + 1048576 + 3, sdev + 1048576 + 17, 65537},
      {cdev + kHalf + 1310720, shost + 5, 100000},
      {chost + 262144 + 1, sdev + 12345, 4096}};
  EXPECT(engine.TransferSync(remote, READ, reads, kTransferTimeoutMs), SUCCESS);
  CHECK(Same(FromDevice(dev.ptr, kHalf, 1048576), seed, kServerDev, 0, "READ 0"));
  CHECK(Same(FromDevice(dev.ptr, kHalf + 1048576 + 3, 65537), seed, kServerDev, 1048576 + 17,
             "READ 1"));
  CHECK(Same(FromDevice(dev.ptr, kHalf + 1310720, 100000), seed, kServerHost, 5, "READ 2"));
  CHECK(Same(std::vector<uint8_t>(static_cast<uint8_t *>(host.ptr) + 262144 + 1,
                                  static_cast<uint8_t *>(host.ptr) + 262144 + 1 + 4096),
             seed, kServerDev, 12345, "READ 3"));

  // WRITE: local device and local host memory into the upper half of the server's device buffer
  const std::vector<TransferOpDesc> writes = {{cdev + 1, sdev + kHalf + 3, 4097},
                                              {cdev + 8192, sdev + kHalf + 65536, 300000},
                                              {chost + 7, sdev + kHalf + 1048576, 65536}};
  EXPECT(engine.TransferSync(remote, WRITE, writes, kTransferTimeoutMs), SUCCESS);
  wrote.push_back({kHalf + 3, 4097, kClientDev, 1});
  wrote.push_back({kHalf + 65536, 300000, kClientDev, 8192});
  wrote.push_back({kHalf + 1048576, 65536, kClientHost, 7});

  // TransferAsync, polled with GetTransferStatus: a READ and a WRITE
  TransferArgs args;
  TransferReq req = nullptr;
  EXPECT(engine.TransferAsync(remote, READ, {{cdev + kHalf + 1572864, sdev + 1572864 + 1, 200000}},
                              args, req),
         SUCCESS);
  CHECK(Wait(engine, req) == TransferStatus::COMPLETED);
  CHECK(Same(FromDevice(dev.ptr, kHalf + 1572864, 200000), seed, kServerDev, 1572864 + 1,
             "async READ"));
  TransferStatus gone = TransferStatus::WAITING;
  EXPECT(engine.GetTransferStatus(req, gone), PARAM_INVALID);  // reported once, then forgotten
  req = nullptr;
  EXPECT(engine.TransferAsync(remote, WRITE, {{cdev + 1048576, sdev + kHalf + 1572864, 65536}},
                              args, req),
         SUCCESS);
  CHECK(Wait(engine, req) == TransferStatus::COMPLETED);
  wrote.push_back({kHalf + 1572864, 65536, kClientDev, 1048576});

  // a second device buffer, registered while linked and used at once, both ways
  Region second = DeviceRegion(engine, kSpareSize, seed, kSecond);
  const uintptr_t c2 = Addr(second.ptr);
  EXPECT(engine.TransferSync(remote, READ, {{c2, sdev + 7, 500000}}, kTransferTimeoutMs), SUCCESS);
  CHECK(
      Same(FromDevice(second.ptr, 0, 500000), seed, kServerDev, 7, "READ into the second buffer"));
  EXPECT(engine.TransferSync(remote, WRITE, {{c2 + 1048576, sdev + kHalf + 1835008, 200000}},
                             kTransferTimeoutMs),
         SUCCESS);
  wrote.push_back({kHalf + 1835008, 200000, kSecond, 1048576});

  // the spare buffer is in the server's table: readable while registered
  EXPECT(engine.TransferSync(remote, READ, {{c2 + 1572864, sspare + 11, 4096}}, kTransferTimeoutMs),
         SUCCESS);
  CHECK(Same(FromDevice(second.ptr, 1572864, 4096), seed, kSpare, 11, "READ of the spare buffer"));

  if (failures) return 1;
  for (const auto &w : wrote)
    std::cout << "WROTE " << w.server_off << " " << w.len << " " << w.tag << " " << w.pos << "\n";
  std::cout << "LINKED" << std::endl;

  std::string line;
  int rc = 1;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    const int before = failures;
    if (cmd == "check-host") {
      size_t off = 0, len = 0, pos = 0;
      uint64_t tag = 0;
      in >> off >> len >> tag >> pos;
      CHECK(off + len <= kHostSize);
      if (off + len <= kHostSize)
        CHECK(Same(std::vector<uint8_t>(static_cast<uint8_t *>(host.ptr) + off,
                                        static_cast<uint8_t *>(host.ptr) + off + len),
                   seed, tag, pos, "client host buffer"));
      Answer(before);
    } else if (cmd == "after-deregister") {
      AfterDeregister(engine, remote, dev, sdev, sspare, seed);
      Answer(before);
    } else if (cmd == "disconnect") {
      // the server finalized and exited before this: still SUCCESS
      EXPECT(engine.Disconnect(remote, kConnectTimeoutMs), SUCCESS);
      EXPECT(engine.DeregisterMem(second.handle), SUCCESS);
      EXPECT(engine.DeregisterMem(dev.handle), SUCCESS);
      EXPECT(engine.DeregisterMem(host.handle), SUCCESS);
      engine.Finalize();
      CHECK(CurrentDevice() == device);
      CHECK_ACL(aclrtFree(second.ptr));
      CHECK_ACL(aclrtFree(dev.ptr));
      CHECK_ACL(aclrtFreeHost(host.ptr));
      CHECK_ACL(aclrtResetDevice(device));
      rc = failures ? 1 : 0;
      std::cout << (failures ? "FAIL" : "PASS") << std::endl;
      break;
    } else {
      std::cerr << "client: unknown command " << line << std::endl;
      failures++;
      Answer(before);
    }
  }
  return rc;
}
}  // namespace

int main(int argc, char **argv) {
  if (argc == 4 && std::strcmp(argv[1], "server") == 0)
    return Server(std::atoi(argv[2]), std::strtoull(argv[3], nullptr, 10));
  if (argc == 8 && std::strcmp(argv[1], "client") == 0)
    return Client(std::atoi(argv[2]), argv[3], std::strtoull(argv[4], nullptr, 10),
                  std::strtoull(argv[5], nullptr, 10), std::strtoull(argv[6], nullptr, 10),
                  std::strtoull(argv[7], nullptr, 10));
  std::cerr << "usage: hixl_device server DEVICE SEED | client DEVICE ENGINE DEV HOST SPARE SEED\n";
  return 2;
}
