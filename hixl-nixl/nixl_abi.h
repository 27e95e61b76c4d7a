/*
 * nixl_abi.h: what a NIXL backend plugin shares with NIXL 1.5.1's agent, declared for hixl's
 * HIXL backend (libplugin_HIXL.so). Written for hixl from the plugin interface NIXL 1.5.1
 * documents (its backend guide and the public `backend_engine.h`, `backend_aux.h`,
 * `backend_plugin.h`, `nixl_types.h`, `nixl_descriptors.h` of ai-dynamo/nixl); no NIXL
 * header is included or copied: the wheel ships none.
 *
 * What must match the wheel exactly, and how it was checked (abi_check.py re-checks the first
 * two against the installed wheel in CI):
 *   - the order of nixlBackendEngine's virtual functions (the agent calls them by slot): the
 *     vtable of an in-wheel engine (`_ZTV15nixlPosixEngine` in libplugin_POSIX.so, which
 *     keeps its symbol table) lists them, slot by slot, by mangled name;
 *   - the class names (typeinfo names are compared by string across libraries);
 *   - the layouts the agent reads or writes in our objects, and those we read in its: taken
 *     from the wheel's code (nixlPosixEngine's constructor inlines nixlBackendEngine's, so it
 *     writes every engine member and reads the init parameters it copies; its prepXfer reads
 *     nixlDescList<nixlMetaDesc>; nixlUcxEngine::postXfer reads
 *     nixlBackendOptionalArgs::hasNotif) and asserted below; the init parameters' members
 *     between those the constructor reads follow from their declared order.
 *
 * Only what the plugin uses is declared; nothing here is defined out of line in NIXL (the
 * plugin is linked with -z defs, so a declaration that would need NIXL's code fails the link).
 */
#ifndef HIXL_NIXL_ABI_H_
#define HIXL_NIXL_ABI_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

/* the classes NIXL's agent shares with the plugin keep default visibility (the plugin is
 * built with -fvisibility=hidden) */
#define NIXL_ABI_VISIBLE __attribute__((visibility("default")))

#if !defined(_GLIBCXX_USE_CXX11_ABI) || _GLIBCXX_USE_CXX11_ABI != 1
#error "NIXL 1.5.1 is built with libstdc++'s new ABI (std::__cxx11::basic_string)"
#endif

/* ---- nixl_types.h ---- */

enum nixl_mem_t { DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG };

enum nixl_xfer_op_t { NIXL_READ, NIXL_WRITE };

enum nixl_status_t {
  NIXL_IN_PROG = 1,
  NIXL_SUCCESS = 0,
  NIXL_ERR_NOT_POSTED = -1,
  NIXL_ERR_INVALID_PARAM = -2,
  NIXL_ERR_BACKEND = -3,
  NIXL_ERR_NOT_FOUND = -4,
  NIXL_ERR_MISMATCH = -5,
  NIXL_ERR_NOT_ALLOWED = -6,
  NIXL_ERR_REPOST_ACTIVE = -7,
  NIXL_ERR_UNKNOWN = -8,
  NIXL_ERR_NOT_SUPPORTED = -9,
  NIXL_ERR_REMOTE_DISCONNECT = -10,
  NIXL_ERR_CANCELED = -11,
  NIXL_ERR_NO_TELEMETRY = -12,
};

enum class nixl_thread_sync_t {
  NIXL_THREAD_SYNC_NONE,
  NIXL_THREAD_SYNC_STRICT,
  NIXL_THREAD_SYNC_RW,
  NIXL_THREAD_SYNC_DEFAULT = NIXL_THREAD_SYNC_NONE,
};

enum class nixl_cost_t { ANALYTICAL_BACKEND = 0 };

using nixl_backend_t = std::string;
using nixl_blob_t = std::string; /* bytes, NULs included */
using nixl_mem_list_t = std::vector<nixl_mem_t>;
using nixl_b_params_t = std::unordered_map<std::string, std::string>;
using nixl_query_resp_t = std::optional<nixl_b_params_t>;
using nixlMemViewH = void *;

/* only passed through by pointer (estimateXferCost) */
struct nixlAgentOptionalArgs;
using nixl_opt_args_t = nixlAgentOptionalArgs;

namespace nixlTime {
using us_t = uint64_t;
}

/* ---- telemetry (the engine base class holds a queue of these; this plugin adds none) ---- */

enum class nixl_telemetry_event_type_t : uint32_t {};

struct nixlTelemetryEvent {
  nixl_telemetry_event_type_t type;
  uint64_t value;
};

/* ---- nixl_descriptors.h ---- */

/* One contiguous range: address, length, device (DRAM: unused, 0 by convention). */
class NIXL_ABI_VISIBLE nixlBasicDesc {
 public:
  uintptr_t addr;
  size_t len;
  uint64_t devId;
};

/* A registration descriptor: the range and a blob (registerMem's input; loadRemoteMD's
 * carries the peer's getPublicData there). */
class NIXL_ABI_VISIBLE nixlBlobDesc : public nixlBasicDesc {
 public:
  nixl_blob_t metaInfo;
};

/* A list of descriptors of one memory type. Read only here: the agent builds them. Its other
 * virtual functions (resize, addDesc, getIndex) are NIXL's and never called by the plugin. */
template <class T>
class NIXL_ABI_VISIBLE nixlDescList {
 protected:
  nixl_mem_t type;
  std::vector<T> descs;

 public:
  nixlDescList(const nixlDescList &) = delete;
  nixlDescList &operator=(const nixlDescList &) = delete;
  virtual ~nixlDescList();
#ifdef HIXL_NIXL_HARNESS
  /* for tests/harness.cc, which plays NIXL's agent (and defines the destructor) */
  explicit nixlDescList(nixl_mem_t t) : type(t) {}
  void add(const T &d) { descs.push_back(d); }
#endif

  nixl_mem_t getType() const { return type; }
  int descCount() const { return static_cast<int>(descs.size()); }
  const T &operator[](size_t i) const { return descs[i]; }
  typename std::vector<T>::const_iterator begin() const { return descs.begin(); }
  typename std::vector<T>::const_iterator end() const { return descs.end(); }

  friend struct nixlHixlLayout;
};

/* ---- backend_aux.h ---- */

using notif_list_t = std::vector<std::pair<std::string, std::string>>;

struct NIXL_ABI_VISIBLE nixlBackendOptionalArgs {
  nixl_blob_t notifMsg; /* the notification to deliver once the transfer is done */
  bool hasNotif = false;
  nixl_blob_t customParam;
};
using nixl_opt_b_args_t = nixlBackendOptionalArgs;

class NIXL_ABI_VISIBLE nixlBackendInitParams {
 public:
  std::string localAgent;
  nixl_backend_t type;
  nixl_b_params_t *customParams = nullptr;
  bool enableProgTh = false;
  nixlTime::us_t pthrDelay = 0;
  nixl_thread_sync_t syncMode;
  bool enableTelemetry_ = false;
};

/* A backend's transfer handle (prepXfer makes it, releaseReqH ends it). */
class NIXL_ABI_VISIBLE nixlBackendReqH {
 public:
  nixlBackendReqH() {}
  virtual ~nixlBackendReqH() {}
};

/* A backend's per-region metadata, local (registerMem) or remote (loadRemoteMD). */
class NIXL_ABI_VISIBLE nixlBackendMD {
 protected:
  bool isPrivateMD;

 public:
  explicit nixlBackendMD(bool is_private) : isPrivateMD(is_private) {}
  virtual ~nixlBackendMD() {}
};

/* A transfer descriptor as the backend gets it: the range and the metadata of the region that
 * holds it (ours: what registerMem or loadRemoteMD returned). */
class NIXL_ABI_VISIBLE nixlMetaDesc : public nixlBasicDesc {
 public:
  nixlBackendMD *metadataP;
};

struct NIXL_ABI_VISIBLE nixlRemoteMetaDesc : public nixlMetaDesc {
  std::string remoteAgent;
};

using nixl_meta_dlist_t = nixlDescList<nixlMetaDesc>;
using nixl_remote_meta_dlist_t = nixlDescList<nixlRemoteMetaDesc>;
using nixl_reg_dlist_t = nixlDescList<nixlBlobDesc>;

/* ---- backend_engine.h ---- */

class NIXL_ABI_VISIBLE nixlBackendEngine {
 private:
  /* the agent reads these through inline functions of its own (getType, getCustomParams,
   * getTelemetryEvents), so they sit where its header puts them */
  nixl_backend_t backendType;
  nixl_b_params_t customParams;
  std::vector<nixlTelemetryEvent> telemetryEvents_;
  std::mutex telemetryEventsMutex_;

 protected:
  bool initErr = false; /* set by a constructor that failed: the agent refuses the engine */
  const std::string localAgent;
  const bool enableTelemetry_;

 public:
  explicit nixlBackendEngine(const nixlBackendInitParams *p)
      : backendType(p->type),
        customParams(*p->customParams),
        localAgent(p->localAgent),
        enableTelemetry_(p->enableTelemetry_) {}
  nixlBackendEngine(const nixlBackendEngine &) = delete;
  nixlBackendEngine &operator=(const nixlBackendEngine &) = delete;

  /* slots 0 and 1: the complete and the deleting destructor */
  virtual ~nixlBackendEngine() = default;

  /* the agent's accessors (inline, non-virtual) */
  bool getInitErr() const noexcept { return initErr; }
  const nixl_backend_t &getType() const noexcept { return backendType; }
  const nixl_b_params_t &getCustomParams() const noexcept { return customParams; }

  /* slots 2..26, in NIXL 1.5.1's order */
  virtual bool supportsRemote() const = 0;
  virtual bool supportsLocal() const = 0;
  virtual bool supportsNotif() const = 0;
  virtual nixl_mem_list_t getSupportedMems() const = 0;
  virtual nixl_status_t registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem,
                                    nixlBackendMD *&out) = 0;
  virtual nixl_status_t deregisterMem(nixlBackendMD *meta) = 0;
  virtual nixl_status_t connect(const std::string &remote_agent) = 0;
  virtual nixl_status_t disconnect(const std::string &remote_agent) = 0;
  virtual nixl_status_t unloadMD(nixlBackendMD *input) = 0;
  virtual nixl_status_t prepXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                                 const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                                 nixlBackendReqH *&handle,
                                 const nixl_opt_b_args_t *opt_args = nullptr) const = 0;
  virtual nixl_status_t postXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                                 const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                                 nixlBackendReqH *&handle,
                                 const nixl_opt_b_args_t *opt_args = nullptr) const = 0;
  virtual nixl_status_t checkXfer(nixlBackendReqH *handle) const = 0;
  virtual nixl_status_t releaseReqH(nixlBackendReqH *handle) const = 0;
  /* GPU-initiated transfers' memory views: not offered */
  virtual nixl_status_t prepMemView(const nixl_remote_meta_dlist_t &, nixlMemViewH &,
                                    const nixl_opt_b_args_t * = nullptr) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }
  virtual nixl_status_t prepMemView(const nixl_meta_dlist_t &, nixlMemViewH &,
                                    const nixl_opt_b_args_t * = nullptr) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }
  virtual void releaseMemView(nixlMemViewH) const {}
  virtual nixl_status_t getPublicData(const nixlBackendMD *, std::string &) const {
    return NIXL_ERR_BACKEND;
  }
  virtual nixl_status_t getConnInfo(std::string &) const { return NIXL_ERR_BACKEND; }
  virtual nixl_status_t loadRemoteConnInfo(const std::string &, const std::string &) {
    return NIXL_ERR_BACKEND;
  }
  virtual nixl_status_t loadRemoteMD(const nixlBlobDesc &, const nixl_mem_t &,
                                     const std::string &, nixlBackendMD *&) {
    return NIXL_ERR_BACKEND;
  }
  virtual nixl_status_t loadLocalMD(nixlBackendMD *, nixlBackendMD *&) { return NIXL_ERR_BACKEND; }
  virtual nixl_status_t getNotifs(notif_list_t &) { return NIXL_ERR_BACKEND; }
  virtual nixl_status_t genNotif(const std::string &, const std::string &) const {
    return NIXL_ERR_BACKEND;
  }
  virtual nixl_status_t queryMem(const nixl_reg_dlist_t &, std::vector<nixl_query_resp_t> &) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }
  virtual nixl_status_t estimateXferCost(const nixl_xfer_op_t &, const nixl_meta_dlist_t &,
                                         const nixl_meta_dlist_t &, const std::string &,
                                         nixlBackendReqH *const &, std::chrono::microseconds &,
                                         std::chrono::microseconds &, nixl_cost_t &,
                                         const nixl_opt_args_t * = nullptr) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }

  friend struct nixlHixlLayout;
};

/* ---- backend_plugin.h ---- */

#define NIXL_PLUGIN_API_VERSION 1

class NIXL_ABI_VISIBLE nixlBackendPlugin {
 public:
  int api_version;
  nixlBackendEngine *(*create_engine)(const nixlBackendInitParams *init_params);
  void (*destroy_engine)(nixlBackendEngine *engine);
  const char *(*get_plugin_name)();
  const char *(*get_plugin_version)();
  nixl_b_params_t (*get_backend_options)();
  nixl_mem_list_t (*get_backend_mems)();
};

extern "C" {
__attribute__((visibility("default"))) nixlBackendPlugin *nixl_plugin_init();
__attribute__((visibility("default"))) void nixl_plugin_fini();
}

/* ---- the layouts, as the wheel's code uses them (x86-64, libstdc++) ---- */

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
struct nixlHixlLayout {
  static_assert(sizeof(std::string) == 32 && sizeof(nixl_b_params_t) == 56 &&
                sizeof(std::mutex) == 40 && sizeof(std::vector<int>) == 24);
  /* nixlPosixEngine's constructor: init params read at 0x0, 0x20, 0x40, 0x5c */
  static_assert(offsetof(nixlBackendInitParams, localAgent) == 0x00);
  static_assert(offsetof(nixlBackendInitParams, type) == 0x20);
  static_assert(offsetof(nixlBackendInitParams, customParams) == 0x40);
  static_assert(offsetof(nixlBackendInitParams, enableProgTh) == 0x48);
  static_assert(offsetof(nixlBackendInitParams, pthrDelay) == 0x50);
  static_assert(offsetof(nixlBackendInitParams, syncMode) == 0x58);
  static_assert(offsetof(nixlBackendInitParams, enableTelemetry_) == 0x5c);
  /* ... and the engine written at 0x8, 0x28, 0x60..0xa0, 0xa0, 0xa8, 0xc8 */
  static_assert(offsetof(nixlBackendEngine, backendType) == 0x08);
  static_assert(offsetof(nixlBackendEngine, customParams) == 0x28);
  static_assert(offsetof(nixlBackendEngine, telemetryEvents_) == 0x60);
  static_assert(offsetof(nixlBackendEngine, telemetryEventsMutex_) == 0x78);
  static_assert(offsetof(nixlBackendEngine, initErr) == 0xa0);
  static_assert(offsetof(nixlBackendEngine, localAgent) == 0xa8);
  static_assert(offsetof(nixlBackendEngine, enableTelemetry_) == 0xc8);
  static_assert(sizeof(nixlBackendEngine) == 0xd0);
  /* nixlPosixEngine::prepXfer: a list's type at 0x8, its vector at 0x10, 32-byte elements */
  static_assert(offsetof(nixl_meta_dlist_t, type) == 0x08);
  static_assert(offsetof(nixl_meta_dlist_t, descs) == 0x10);
  static_assert(sizeof(nixlMetaDesc) == 32 && offsetof(nixlMetaDesc, metadataP) == 24);
  static_assert(sizeof(nixlBlobDesc) == 56 && offsetof(nixlBlobDesc, metaInfo) == 24);
  /* nixlUcxEngine::postXfer: hasNotif at 0x20 */
  static_assert(offsetof(nixlBackendOptionalArgs, hasNotif) == 0x20);
  static_assert(offsetof(nixlBackendOptionalArgs, customParam) == 0x28);
  static_assert(sizeof(nixlBackendMD) == 16 && sizeof(nixlBackendReqH) == 8);
  static_assert(sizeof(nixlBackendPlugin) == 56 &&
                offsetof(nixlBackendPlugin, create_engine) == 8 &&
                offsetof(nixlBackendPlugin, get_backend_mems) == 48);
};
#pragma GCC diagnostic pop

#endif /* HIXL_NIXL_ABI_H_ */
