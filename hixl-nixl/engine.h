/*
 * nixlHixlEngine: NIXL's backend engine over hixl's C ABI (include/hixl_c.h, libhixl.so).
 * docs/nixl.md says what each NIXL call becomes; engine.cc has the reasons.
 */
#ifndef HIXL_NIXL_ENGINE_H_
#define HIXL_NIXL_ENGINE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "hixl_c.h"
#include "nixl_abi.h"
#include "notif.h"

namespace hixl_nixl {

constexpr const char *kPluginName = "HIXL";
constexpr const char *kPluginVersion = "0.1.0";
/* the tag of this backend's connection info and public data, and their format's version */
constexpr const char *kTag = "hixl/1";

/* The backend's parameters (nixl_b_params_t, then the environment, then the defaults). */
struct Settings {
  std::string ip;                   /* "ip": the address peers reach this engine on */
  int32_t deadline_ms = 60000;      /* "deadline_ms": every posted transfer's deadline */
  int32_t connect_timeout_ms = 5000;  /* "connect_timeout_ms" */
  int32_t notify_timeout_ms = 5000;   /* "notify_timeout_ms": per notification part */
  int32_t poll_wait_ms = 1;           /* "poll_wait_ms": see nixlHixlEngine::checkXfer (0: never) */
  int32_t lanes = 2;                  /* "lanes": hixl requests one large transfer is split into */
  std::vector<std::pair<std::string, std::string>> hixl_options; /* "hixl.*" keys, passed on */

  /* std::nullopt (and why) for an unknown key or a bad value */
  static std::optional<Settings> from(const nixl_b_params_t &params, std::string &why);
};

/* the parameters NIXL lists for this plugin (get_backend_options), with their defaults */
nixl_b_params_t default_params();

void log_error(const std::string &msg);

/* A NIXL registration: a range inside one hixl registration (`region`, its start address). */
class LocalMD : public nixlBackendMD {
 public:
  LocalMD(uintptr_t addr, size_t len, uintptr_t region)
      : nixlBackendMD(true), addr(addr), len(len), region(region) {}
  uintptr_t addr;
  size_t len;
  uintptr_t region;
};

/* A peer's registration, from its public data (loadRemoteMD). */
class RemoteMD : public nixlBackendMD {
 public:
  RemoteMD(std::string agent, uintptr_t addr, size_t len)
      : nixlBackendMD(false), agent(std::move(agent)), addr(addr), len(len) {}
  std::string agent;
  uintptr_t addr;
  size_t len;
};

/* A NIXL transfer handle: the batch, made once by prepXfer, in parts of about equal bytes (a
 * large batch is split over hixl lanes, as hixl's own sync calls split one), each posted as
 * one hixl request. The handle is done when every part ended; it failed if one did. */
class Request : public nixlBackendReqH {
 public:
  struct Part {
    std::vector<hixl_transfer_op_desc> descs;
    hixl_transfer_req req = nullptr; /* posted, its end not reported yet */
    int32_t status = HIXL_TRANSFER_COMPLETED; /* its end, once reported */
  };
  int32_t op = HIXL_READ;
  std::string agent;
  std::vector<Part> parts;
  bool posted = false;   /* a post whose end checkXfer has not returned yet */
  bool stopping = false; /* a part failed: the others were cancelled */
  bool notify = false;   /* a notification to deliver once it completed */
  nixl_blob_t notif;
  std::chrono::steady_clock::time_point checked{}; /* when checkXfer last returned for it */
};

/* `descs` cut into up to `lanes` parts of about equal bytes (descriptors cut where needed), or
 * one part when each would have less than `min_part` bytes */
std::vector<Request::Part> split(const std::vector<hixl_transfer_op_desc> &descs, size_t lanes,
                                 uint64_t min_part);

class nixlHixlEngine : public nixlBackendEngine {
 public:
  explicit nixlHixlEngine(const nixlBackendInitParams *init);
  ~nixlHixlEngine() override;

  bool supportsRemote() const override { return true; }
  bool supportsLocal() const override { return false; }
  bool supportsNotif() const override { return true; }
  nixl_mem_list_t getSupportedMems() const override { return {DRAM_SEG}; }

  nixl_status_t registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem,
                            nixlBackendMD *&out) override;
  nixl_status_t deregisterMem(nixlBackendMD *meta) override;
  nixl_status_t connect(const std::string &remote_agent) override;
  nixl_status_t disconnect(const std::string &remote_agent) override;
  nixl_status_t unloadMD(nixlBackendMD *input) override;
  nixl_status_t prepXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                         const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                         nixlBackendReqH *&handle,
                         const nixl_opt_b_args_t *opt_args) const override;
  nixl_status_t postXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                         const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                         nixlBackendReqH *&handle,
                         const nixl_opt_b_args_t *opt_args) const override;
  nixl_status_t checkXfer(nixlBackendReqH *handle) const override;
  nixl_status_t releaseReqH(nixlBackendReqH *handle) const override;
  nixl_status_t getPublicData(const nixlBackendMD *meta, std::string &str) const override;
  nixl_status_t getConnInfo(std::string &str) const override;
  nixl_status_t loadRemoteConnInfo(const std::string &remote_agent,
                                   const std::string &remote_conn_info) override;
  nixl_status_t loadRemoteMD(const nixlBlobDesc &input, const nixl_mem_t &nixl_mem,
                             const std::string &remote_agent, nixlBackendMD *&output) override;
  nixl_status_t getNotifs(notif_list_t &notif_list) override;
  nixl_status_t genNotif(const std::string &remote_agent, const std::string &msg) const override;

  /* hixl_nixl_alloc / hixl_nixl_free (plugin.cc): host memory the engine allocates, which a
   * peer on this host reaches over hixl's same-host path once NIXL registered it */
  nixl_status_t alloc(size_t size, void *&addr);
  nixl_status_t free(void *addr);
  const std::string &agent() const { return localAgent; }

 private:
  struct Region {
    size_t len;
    hixl_mem_handle handle;
    size_t refs;            /* NIXL registrations inside it */
    bool allocated = false; /* the engine's memory (alloc): kept until free, not at refs 0 */
  };
  /* a posted request's peer and the local ranges it touches (for a deregistration that finds
   * memory still in use) */
  struct Posted {
    std::string agent;
    const std::vector<hixl_transfer_op_desc> *descs; /* the Request's: it outlives the entry */
  };

  hixl_engine *hx_ = nullptr;
  Settings settings_;
  std::string name_; /* this engine's hixl name, "ip:port" */

  mutable std::mutex reg_m_;
  std::map<uintptr_t, Region> regions_; /* by start address, disjoint */

  /* peers: a NIXL agent's hixl engine name (its connection info), the agents this engine may
   * hold a link to, and those that loaded regions since (their link's table is older) */
  mutable std::mutex peers_m_;
  std::unordered_map<std::string, std::string> peers_;
  mutable std::unordered_set<std::string> linked_;
  mutable std::unordered_set<std::string> stale_;
  /* posts hold it shared; renewing a link holds it exclusively */
  mutable std::shared_mutex links_m_;

  mutable std::mutex act_m_;
  mutable std::map<hixl_transfer_req, Posted> posted_;
  mutable std::unordered_map<std::string, size_t> in_flight_;

  mutable std::atomic<uint64_t> next_notif_{1};
  std::mutex notif_m_;
  Reassembly reassembly_{64u << 20};

  std::optional<std::string> peer(const std::string &agent) const;
  nixl_status_t ensure_link(const std::string &agent, const std::string &name) const;
  void renew_if_stale(const std::string &agent, const std::string &name) const;
  nixl_status_t send_blob(const std::string &agent, const std::string &blob) const;
  void ended(hixl_transfer_req req) const;
  void stop_parts(Request &r) const;
  nixl_status_t failure(hixl_status st, const std::string &what, const std::string &agent) const;
};

}  // namespace hixl_nixl

#endif /* HIXL_NIXL_ENGINE_H_ */
