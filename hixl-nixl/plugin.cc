/* libplugin_HIXL.so's entry points: NIXL's plugin API version 1, and two of hixl's own for
 * engine-allocated memory (hixl_nixl_alloc, hixl_nixl_free: docs/nixl.md, "Same host"). */
#include <exception>
#include <mutex>
#include <unordered_map>

#include "engine.h"

namespace {

/* the live engines by agent name, for hixl_nixl_alloc / hixl_nixl_free */
std::mutex engines_m;
std::unordered_map<std::string, hixl_nixl::nixlHixlEngine *> engines;

nixlBackendEngine *create_engine(const nixlBackendInitParams *init) {
  try {
    auto *e = new hixl_nixl::nixlHixlEngine(init);
    if (!e->getInitErr()) {
      std::lock_guard g(engines_m);
      if (!engines.emplace(e->agent(), e).second) {
        hixl_nixl::log_error("two HIXL engines of agent " + e->agent() +
                             " in this process: hixl_nixl_alloc reaches the first");
      }
    }
    return e;
  } catch (const std::exception &e) {
    hixl_nixl::log_error(std::string("cannot create the engine: ") + e.what());
    return nullptr;
  }
}

void destroy_engine(nixlBackendEngine *engine) {
  {
    std::lock_guard g(engines_m);
    for (auto it = engines.begin(); it != engines.end(); ++it) {
      if (it->second == engine) {
        engines.erase(it);
        break;
      }
    }
  }
  delete engine;
}

const char *plugin_name() { return hixl_nixl::kPluginName; }

const char *plugin_version() { return hixl_nixl::kPluginVersion; }

nixl_b_params_t backend_options() { return hixl_nixl::default_params(); }

nixl_mem_list_t backend_mems() { return {DRAM_SEG}; }

nixlBackendPlugin plugin = {NIXL_PLUGIN_API_VERSION, create_engine,   destroy_engine, plugin_name,
                            plugin_version,          backend_options, backend_mems};

}  // namespace

extern "C" nixlBackendPlugin *nixl_plugin_init() { return &plugin; }

extern "C" void nixl_plugin_fini() {}

/* `size` zeroed, page-aligned bytes of host memory owned by the HIXL engine of agent `agent`
 * (in *addr): register them with NIXL (inside them, any ranges) as DRAM, and a peer agent on
 * this host reaches them over hixl's same-host path, one-sidedly. Usable until hixl_nixl_free
 * or the agent's end. Returns a NIXL status: NIXL_ERR_NOT_FOUND for an agent without a HIXL
 * engine in this process, NIXL_ERR_INVALID_PARAM for size 0 or a null addr. */
extern "C" __attribute__((visibility("default"))) int hixl_nixl_alloc(const char *agent,
                                                                      size_t size, void **addr) {
  if (!agent || !addr || size == 0) return NIXL_ERR_INVALID_PARAM;
  /* no C++ exception (bad_alloc, a mutex's system_error) crosses into the C caller (ctypes) */
  try {
    std::lock_guard g(engines_m);
    auto it = engines.find(agent);
    if (it == engines.end()) return NIXL_ERR_NOT_FOUND;
    void *a = nullptr;
    nixl_status_t st = it->second->alloc(size, a);
    if (st == NIXL_SUCCESS) *addr = a;
    return st;
  } catch (...) {
    return NIXL_ERR_BACKEND;
  }
}

/* Ends an allocation of hixl_nixl_alloc once NIXL no longer has it registered
 * (NIXL_ERR_NOT_ALLOWED before): stop using the memory; the engine frees it once no peer can
 * reach it. */
extern "C" __attribute__((visibility("default"))) int hixl_nixl_free(const char *agent,
                                                                     void *addr) {
  if (!agent || !addr) return NIXL_ERR_INVALID_PARAM;
  try {
    std::lock_guard g(engines_m);
    auto it = engines.find(agent);
    if (it == engines.end()) return NIXL_ERR_NOT_FOUND;
    return it->second->free(addr);
  } catch (...) {
    return NIXL_ERR_BACKEND;
  }
}
