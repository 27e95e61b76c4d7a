// A shared library built with hixl's header-only include/hixl/hixl.h (the inline class and
// hixl's header-only ge::AscendString) with the default C++ ABI and no optimisation, so that it
// carries its own out-of-line copies of every inline method it uses: the worst neighbour for a
// program compiled against CANN's header in the same process. tests/cpp_abi.rs preloads it
// (LD_PRELOAD: first in the process's symbol scope) into cann_abi's `mixed` mode, which serves
// from it and transfers to it through libcann_hixl.so's exported class. Its copies are hidden,
// so none stands in for the library's (std::string layouts of two C++ ABIs would meet there).
#include <cstring>
#include <map>
#include <vector>

#include "hixl/hixl.h"

namespace {
hixl::Hixl *engine = nullptr;
std::vector<unsigned char> memory;
}  // namespace

extern "C" __attribute__((visibility("default"))) int peer_serve(char *name, size_t cap, uint64_t *addr,
                                                                  uint64_t *len) {
  engine = new hixl::Hixl();
  std::map<hixl::AscendString, hixl::AscendString> options;
  options[hixl::AscendString("hixl.MaxRegions")] = hixl::AscendString("64");
  if (engine->Initialize(hixl::AscendString("127.0.0.1:0"), options) != hixl::SUCCESS) return 1;
  memory.assign(1 << 20, 0);
  for (size_t i = 0; i < memory.size(); i++) memory[i] = static_cast<unsigned char>(i * 131u + 7u);
  hixl::MemDesc desc{};
  desc.addr = reinterpret_cast<uintptr_t>(memory.data());
  desc.len = memory.size();
  hixl::MemHandle handle = nullptr;
  if (engine->RegisterMem(desc, hixl::MEM_HOST, handle) != hixl::SUCCESS) return 2;
  hixl::AscendString local;
  if (engine->GetLocalEngine(local) != hixl::SUCCESS || local.GetLength() + 1 > cap) return 3;
  std::memcpy(name, local.GetString(), local.GetLength() + 1);
  *addr = desc.addr;
  *len = desc.len;
  return 0;
}

extern "C" __attribute__((visibility("default"))) uint64_t peer_sum(uint64_t off, uint64_t len) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t i = off; i < off + len; i++) {
    h ^= memory[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

extern "C" __attribute__((visibility("default"))) void peer_stop() {
  engine->Finalize();
  delete engine;
  engine = nullptr;
}
