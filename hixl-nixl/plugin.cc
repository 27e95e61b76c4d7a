/* libplugin_HIXL.so's entry points: NIXL's plugin API version 1. */
#include <exception>

#include "engine.h"

namespace {

nixlBackendEngine *create_engine(const nixlBackendInitParams *init) {
  try {
    return new hixl_nixl::nixlHixlEngine(init);
  } catch (const std::exception &e) {
    hixl_nixl::log_error(std::string("cannot create the engine: ") + e.what());
    return nullptr;
  }
}

void destroy_engine(nixlBackendEngine *engine) { delete engine; }

const char *plugin_name() { return hixl_nixl::kPluginName; }

const char *plugin_version() { return hixl_nixl::kPluginVersion; }

nixl_b_params_t backend_options() { return hixl_nixl::default_params(); }

nixl_mem_list_t backend_mems() { return {DRAM_SEG}; }

nixlBackendPlugin plugin = {NIXL_PLUGIN_API_VERSION, create_engine,   destroy_engine, plugin_name,
                            plugin_version,          backend_options, backend_mems};

}  // namespace

extern "C" nixlBackendPlugin *nixl_plugin_init() { return &plugin; }

extern "C" void nixl_plugin_fini() {}
