/*
 * NIXL's calls on hixl's C ABI. In short (docs/nixl.md has the table):
 *   - one hixl engine per NIXL backend instance, listening on "ip:0", AutoConnect on, so a
 *     link that broke is made again by the next post or notification;
 *   - registerMem is hixl_register_mem (DRAM only); connection info is the hixl engine's name,
 *     public data the hixl region; prepXfer makes the batch once and links to the peer,
 *     postXfer starts it with the backend's deadline (hixl_transfer_async_within), checkXfer is
 *     hixl_get_transfer_status, releaseReqH cancels and waits for the end (hixl_cancel_transfer,
 *     hixl_wait_transfer): a handle that is released, failed or past its deadline never
 *     touches its buffers again;
 *   - notifications are hixl notifies (notif.h), a transfer's sent once it completed.
 */
#include "engine.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <thread>

namespace hixl_nixl {

void log_error(const std::string &msg) { std::fprintf(stderr, "[HIXL backend] %s\n", msg.c_str()); }

namespace {

/* checks of one handle closer together than this are a caller spinning on it */
constexpr std::chrono::microseconds kSpin{50};
/* bytes per part below which a batch is not split (hixl's own split of a sync batch) */
constexpr uint64_t kSplitMin = 8u << 20;

std::string last_error() {
  const char *m = hixl_last_error_message();
  return m ? m : "";
}

/* NIXL's code for a hixl status */
nixl_status_t to_nixl(hixl_status st) {
  switch (st) {
    case HIXL_SUCCESS:
    case HIXL_ALREADY_CONNECTED:
      return NIXL_SUCCESS;
    case HIXL_PARAM_INVALID:
      return NIXL_ERR_INVALID_PARAM;
    case HIXL_NOT_CONNECTED:
      return NIXL_ERR_REMOTE_DISCONNECT;
    case HIXL_UNSUPPORTED:
      return NIXL_ERR_NOT_SUPPORTED;
    default: /* TIMEOUT, NOTIFY_FAILED, RESOURCE_EXHAUSTED, FAILED */
      return NIXL_ERR_BACKEND;
  }
}

const char *mem_name(nixl_mem_t m) {
  switch (m) {
    case DRAM_SEG:
      return "DRAM_SEG";
    case VRAM_SEG:
      return "VRAM_SEG";
    case BLK_SEG:
      return "BLK_SEG";
    case OBJ_SEG:
      return "OBJ_SEG";
    case FILE_SEG:
      return "FILE_SEG";
  }
  return "an unknown memory type";
}

/* "hixl/1 <hex> <hex>", exactly (a remote agent's words: no sign, "0x", space or value past
 * 64 bits, which sscanf's %llx took or left undefined) */
bool parse_region(const std::string &s, uintptr_t &addr, size_t &len) {
  const std::string tag = std::string(kTag) + " ";
  if (s.compare(0, tag.size(), tag) != 0) return false;
  const char *p = s.data() + tag.size(), *end = s.data() + s.size();
  uint64_t a = 0, l = 0;
  auto r = std::from_chars(p, end, a, 16);
  if (r.ec != std::errc() || r.ptr == end || *r.ptr != ' ') return false;
  r = std::from_chars(r.ptr + 1, end, l, 16);
  if (r.ec != std::errc() || r.ptr != end) return false;
  addr = static_cast<uintptr_t>(a);
  len = static_cast<size_t>(l);
  return true;
}

}  // namespace

nixlHixlEngine::nixlHixlEngine(const nixlBackendInitParams *init) : nixlBackendEngine(init) {
  std::string why;
  auto s = Settings::from(getCustomParams(), why);
  if (!s) {
    log_error(why);
    initErr = true;
    return;
  }
  settings_ = std::move(*s);
  std::vector<std::string> keys{"AutoConnect", "hixl.ConnectTimeoutMs"};
  std::vector<std::string> values{"1", std::to_string(settings_.connect_timeout_ms)};
  for (const auto &[k, v] : settings_.hixl_options) {
    keys.push_back(k);
    values.push_back(v);
  }
  std::vector<const char *> kp, vp;
  for (size_t i = 0; i < keys.size(); i++) {
    kp.push_back(keys[i].c_str());
    vp.push_back(values[i].c_str());
  }
  const bool v6 = settings_.ip.find(':') != std::string::npos;
  const std::string listen = (v6 ? "[" + settings_.ip + "]" : settings_.ip) + ":0";
  hixl_status st = hixl_create(&hx_);
  if (st == HIXL_SUCCESS) st = hixl_initialize(hx_, listen.c_str(), kp.data(), vp.data(), kp.size());
  char name[256];
  size_t n = 0;
  if (st == HIXL_SUCCESS) st = hixl_local_engine(hx_, name, sizeof name, &n);
  if (st != HIXL_SUCCESS) {
    log_error("cannot start a hixl engine on " + listen + ": " + last_error());
    initErr = true;
    return;
  }
  name_.assign(name, n);
}

nixlHixlEngine::~nixlHixlEngine() {
  /* finalizes: every link closes, its requests end first */
  if (hx_) hixl_destroy(hx_);
}

std::optional<std::string> nixlHixlEngine::peer(const std::string &agent) const {
  std::lock_guard g(peers_m_);
  auto it = peers_.find(agent);
  if (it == peers_.end()) return std::nullopt;
  return it->second;
}

nixl_status_t nixlHixlEngine::failure(hixl_status st, const std::string &what,
                                      const std::string &agent) const {
  log_error(what + " (agent " + agent + "): " + last_error());
  return to_nixl(st);
}

/* ---- memory ---- */

nixl_status_t nixlHixlEngine::registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem,
                                          nixlBackendMD *&out) {
  if (nixl_mem != DRAM_SEG) {
    log_error(std::string("registerMem: ") + mem_name(nixl_mem) +
              " memory is not supported by the HIXL backend: it moves host memory (DRAM_SEG) "
              "only");
    return NIXL_ERR_NOT_SUPPORTED;
  }
  if (mem.len == 0 || mem.addr == 0 || mem.addr + mem.len < mem.addr) {
    log_error("registerMem: an empty or wrapping range");
    return NIXL_ERR_INVALID_PARAM;
  }
  std::lock_guard g(reg_m_);
  const uintptr_t end = mem.addr + mem.len;
  auto it = regions_.upper_bound(mem.addr);
  if (it != regions_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.len >= end) { /* inside a registration: share it */
      prev->second.refs++;
      out = new LocalMD(mem.addr, mem.len, prev->first);
      return NIXL_SUCCESS;
    }
    if (prev->first + prev->second.len > mem.addr) it = prev;
  }
  if (it != regions_.end() && it->first < end) {
    char b[160];
    std::snprintf(b, sizeof b,
                  "registerMem: 0x%" PRIxPTR "+%zu overlaps the registered 0x%" PRIxPTR
                  "+%zu without lying inside it",
                  mem.addr, mem.len, it->first, it->second.len);
    log_error(std::string(b) + ": register an enclosing range first, or disjoint ranges");
    return NIXL_ERR_NOT_SUPPORTED;
  }
  hixl_mem_desc d;
  std::memset(&d, 0, sizeof d);
  d.addr = mem.addr;
  d.len = mem.len;
  hixl_mem_handle h = nullptr;
  hixl_status st = hixl_register_mem(hx_, &d, HIXL_MEM_HOST, &h);
  if (st != HIXL_SUCCESS) return failure(st, "registerMem", localAgent);
  regions_.emplace(mem.addr, Region{mem.len, h, 1, false});
  out = new LocalMD(mem.addr, mem.len, mem.addr);
  return NIXL_SUCCESS;
}

nixl_status_t nixlHixlEngine::deregisterMem(nixlBackendMD *meta) {
  auto *m = dynamic_cast<LocalMD *>(meta);
  if (!m) return NIXL_ERR_INVALID_PARAM;
  hixl_mem_handle h = nullptr;
  uintptr_t start = m->region;
  size_t len = 0;
  {
    std::lock_guard g(reg_m_);
    auto it = regions_.find(start);
    if (it == regions_.end()) return NIXL_ERR_INVALID_PARAM;
    if (--it->second.refs > 0 || it->second.allocated) { /* (an allocation stays till free) */
      delete m;
      return NIXL_SUCCESS;
    }
    h = it->second.handle;
    len = it->second.len;
    regions_.erase(it);
  }
  delete m;
  hixl_status st = hixl_deregister_mem(hx_, h);
  if (st == HIXL_RESOURCE_EXHAUSTED) {
    /* A posted transfer still uses the memory (NIXL's user deregistered it under a handle it
     * did not release). The memory goes back to its owner only once nothing of this engine
     * can write it: those transfers are cancelled, and the deregistration waits for them to
     * end (each ends at the latest at its deadline). */
    {
      std::lock_guard g(act_m_);
      for (const auto &[req, p] : posted_) {
        for (const auto &d : *p.descs) {
          if (d.local_addr < start + len && start < d.local_addr + d.len) {
            hixl_cancel_transfer(hx_, req);
            break;
          }
        }
      }
    }
    log_error("deregisterMem: memory a posted transfer still uses; the transfer is cancelled "
              "and the deregistration waits for it to end");
    auto until = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(settings_.deadline_ms) + std::chrono::seconds(5);
    auto pause = std::chrono::microseconds(100);
    while (st == HIXL_RESOURCE_EXHAUSTED && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(20000));
      st = hixl_deregister_mem(hx_, h);
    }
  }
  if (st != HIXL_SUCCESS) {
    /* still registered with hixl (its peers may still reach it): kept on record, so that a
     * registration inside it shares it and its deregistration tries again, and engine
     * destruction ends it */
    {
      std::lock_guard g(reg_m_);
      regions_.emplace(start, Region{len, h, 0, false});
    }
    /* NIXL 1.5.1 ignores the result and tells its caller the memory is free: say it here */
    log_error("deregisterMem: the memory stays registered and reachable by peers; do not free "
              "it (tried again when a registration inside it ends, and at the engine's end)");
    return failure(st, "deregisterMem", localAgent);
  }
  return NIXL_SUCCESS;
}

nixl_status_t nixlHixlEngine::alloc(size_t size, void *&addr) {
  hixl_mem_handle h = nullptr;
  void *a = nullptr;
  hixl_status st = hixl_alloc_host_mem(hx_, size, &a, &h);
  if (st != HIXL_SUCCESS) return failure(st, "hixl_nixl_alloc", localAgent);
  try {
    std::lock_guard g(reg_m_);
    regions_.emplace(reinterpret_cast<uintptr_t>(a), Region{size, h, 0, true});
  } catch (...) {
    /* no record (out of memory): not left allocated and reachable by peers unrecorded */
    hixl_deregister_mem(hx_, h);
    throw;
  }
  addr = a;
  return NIXL_SUCCESS;
}

nixl_status_t nixlHixlEngine::free(void *addr) {
  hixl_mem_handle h = nullptr;
  {
    std::lock_guard g(reg_m_);
    auto it = regions_.find(reinterpret_cast<uintptr_t>(addr));
    if (it == regions_.end() || !it->second.allocated) {
      log_error("hixl_nixl_free: not memory hixl_nixl_alloc gave this agent");
      return NIXL_ERR_INVALID_PARAM;
    }
    if (it->second.refs > 0) {
      log_error("hixl_nixl_free: the memory is still registered with NIXL (deregister it first)");
      return NIXL_ERR_NOT_ALLOWED;
    }
    h = it->second.handle;
  }
  /* the engine frees it once no peer can touch it (a same-host peer's link may still map it);
   * refused (RESOURCE_EXHAUSTED) while a posted transfer uses it: it stays allocated */
  hixl_status st = hixl_deregister_mem(hx_, h);
  if (st != HIXL_SUCCESS) return failure(st, "hixl_nixl_free", localAgent);
  std::lock_guard g(reg_m_);
  regions_.erase(reinterpret_cast<uintptr_t>(addr));
  return NIXL_SUCCESS;
}

nixl_status_t nixlHixlEngine::getPublicData(const nixlBackendMD *meta, std::string &str) const {
  auto *m = dynamic_cast<const LocalMD *>(meta);
  if (!m) return NIXL_ERR_INVALID_PARAM;
  std::lock_guard g(reg_m_);
  auto it = regions_.find(m->region);
  if (it == regions_.end()) return NIXL_ERR_INVALID_PARAM;
  char b[64];
  std::snprintf(b, sizeof b, "%s %" PRIxPTR " %zx", kTag, it->first, it->second.len);
  str = b;
  return NIXL_SUCCESS;
}

nixl_status_t nixlHixlEngine::getConnInfo(std::string &str) const {
  str = std::string(kTag) + " " + name_;
  return NIXL_SUCCESS;
}

/* ---- peers ---- */

nixl_status_t nixlHixlEngine::loadRemoteConnInfo(const std::string &remote_agent,
                                                 const std::string &remote_conn_info) {
  const std::string tag = std::string(kTag) + " ";
  if (remote_conn_info.compare(0, tag.size(), tag) != 0 || remote_conn_info.size() == tag.size()) {
    log_error("loadRemoteConnInfo: agent " + remote_agent +
              " sent connection info that is not this backend's (" + kTag + ")");
    return NIXL_ERR_MISMATCH;
  }
  std::string name = remote_conn_info.substr(tag.size());
  std::string old;
  {
    std::lock_guard g(peers_m_);
    auto [it, fresh] = peers_.try_emplace(remote_agent, name);
    if (!fresh && it->second != name) {
      old = it->second;
      it->second = name;
      linked_.erase(remote_agent);
      stale_.erase(remote_agent);
    }
  }
  if (!old.empty()) { /* the agent came back as another engine: the old link goes */
    std::unique_lock lk(links_m_);
    hixl_disconnect(hx_, old.c_str(), settings_.connect_timeout_ms);
  }
  return NIXL_SUCCESS;
}

nixl_status_t nixlHixlEngine::loadRemoteMD(const nixlBlobDesc &input, const nixl_mem_t &nixl_mem,
                                           const std::string &remote_agent,
                                           nixlBackendMD *&output) {
  if (nixl_mem != DRAM_SEG) {
    log_error(std::string("loadRemoteMD: ") + mem_name(nixl_mem) + " memory of agent " +
              remote_agent + " is not supported by the HIXL backend (DRAM_SEG only)");
    return NIXL_ERR_NOT_SUPPORTED;
  }
  uintptr_t addr = 0;
  size_t len = 0;
  if (!parse_region(input.metaInfo, addr, len)) {
    log_error("loadRemoteMD: agent " + remote_agent + " sent public data that is not this "
              "backend's");
    return NIXL_ERR_MISMATCH;
  }
  if (input.addr < addr || input.addr + input.len > addr + len || input.addr + input.len < input.addr) {
    log_error("loadRemoteMD: a descriptor of agent " + remote_agent +
              " lies outside the region its public data names");
    return NIXL_ERR_INVALID_PARAM;
  }
  output = new RemoteMD(remote_agent, addr, len);
  std::lock_guard g(peers_m_);
  /* a link made before this region was known has the peer's older table: renewed when idle.
   * Not only a link the plugin made: a notification to a known agent links too (hixl's
   * AutoConnect), so any agent whose connection info is loaded may have one */
  if (peers_.count(remote_agent)) stale_.insert(remote_agent);
  return NIXL_SUCCESS;
}

nixl_status_t nixlHixlEngine::unloadMD(nixlBackendMD *input) {
  delete input;
  return NIXL_SUCCESS;
}

nixl_status_t nixlHixlEngine::ensure_link(const std::string &agent, const std::string &name) const {
  {
    std::lock_guard g(peers_m_);
    if (linked_.count(agent)) return NIXL_SUCCESS;
  }
  hixl_status st = hixl_connect(hx_, name.c_str(), settings_.connect_timeout_ms);
  if (st != HIXL_SUCCESS && st != HIXL_ALREADY_CONNECTED) {
    log_error("cannot link to agent " + agent + " (hixl engine " + name + "): " + last_error());
    return st == HIXL_PARAM_INVALID ? NIXL_ERR_INVALID_PARAM : NIXL_ERR_REMOTE_DISCONNECT;
  }
  std::lock_guard g(peers_m_);
  linked_.insert(agent);
  return NIXL_SUCCESS;
}

void nixlHixlEngine::renew_if_stale(const std::string &agent, const std::string &name) const {
  {
    std::lock_guard g(peers_m_);
    if (!stale_.count(agent)) return;
  }
  std::unique_lock lk(links_m_); /* no post or notification on the way */
  {
    std::lock_guard g(act_m_);
    auto it = in_flight_.find(agent);
    if (it != in_flight_.end() && it->second > 0) return; /* its transfers keep the link */
  }
  hixl_disconnect(hx_, name.c_str(), settings_.connect_timeout_ms);
  std::lock_guard g(peers_m_);
  stale_.erase(agent);
  linked_.erase(agent);
}

nixl_status_t nixlHixlEngine::connect(const std::string &remote_agent) {
  auto name = peer(remote_agent);
  if (!name) {
    log_error("connect: no connection info of agent " + remote_agent + " (load its metadata)");
    return NIXL_ERR_NOT_FOUND;
  }
  renew_if_stale(remote_agent, *name);
  return ensure_link(remote_agent, *name);
}

nixl_status_t nixlHixlEngine::disconnect(const std::string &remote_agent) {
  std::string name;
  {
    std::lock_guard g(peers_m_);
    auto it = peers_.find(remote_agent);
    if (it == peers_.end()) return NIXL_SUCCESS;
    name = it->second;
    peers_.erase(it);
    linked_.erase(remote_agent);
    stale_.erase(remote_agent);
  }
  /* its requests end first (cancelled), so no handle touches its buffers afterwards */
  std::unique_lock lk(links_m_);
  hixl_status st = hixl_disconnect(hx_, name.c_str(), settings_.connect_timeout_ms);
  if (st != HIXL_SUCCESS && st != HIXL_NOT_CONNECTED) {
    return failure(st, "disconnect", remote_agent);
  }
  return NIXL_SUCCESS;
}

/* ---- transfers ---- */

nixl_status_t nixlHixlEngine::prepXfer(const nixl_xfer_op_t &operation,
                                       const nixl_meta_dlist_t &local,
                                       const nixl_meta_dlist_t &remote,
                                       const std::string &remote_agent, nixlBackendReqH *&handle,
                                       const nixl_opt_b_args_t *) const {
  if (operation != NIXL_READ && operation != NIXL_WRITE) return NIXL_ERR_INVALID_PARAM;
  if (local.getType() != DRAM_SEG || remote.getType() != DRAM_SEG) {
    log_error(std::string("prepXfer: ") + mem_name(local.getType()) + " to " +
              mem_name(remote.getType()) + ": the HIXL backend moves DRAM_SEG only");
    return NIXL_ERR_NOT_SUPPORTED;
  }
  const int n = local.descCount();
  if (n <= 0 || n != remote.descCount()) {
    log_error("prepXfer: the local and remote lists differ in length, or are empty");
    return NIXL_ERR_INVALID_PARAM;
  }
  auto name = peer(remote_agent);
  if (!name) {
    log_error("prepXfer: no connection info of agent " + remote_agent + " (load its metadata)");
    return NIXL_ERR_NOT_FOUND;
  }
  auto r = std::make_unique<Request>();
  r->op = operation == NIXL_READ ? HIXL_READ : HIXL_WRITE;
  r->agent = remote_agent;
  std::vector<hixl_transfer_op_desc> descs(static_cast<size_t>(n));
  for (int i = 0; i < n; i++) {
    const nixlMetaDesc &l = local[static_cast<size_t>(i)];
    const nixlMetaDesc &rm = remote[static_cast<size_t>(i)];
    if (l.len != rm.len || l.len == 0) {
      log_error("prepXfer: descriptor " + std::to_string(i) +
                ": local and remote lengths differ, or are 0");
      return NIXL_ERR_INVALID_PARAM;
    }
    descs[static_cast<size_t>(i)] = hixl_transfer_op_desc{l.addr, rm.addr, l.len};
  }
  r->parts = split(descs, static_cast<size_t>(settings_.lanes), kSplitMin);
  renew_if_stale(remote_agent, *name);
  nixl_status_t st = ensure_link(remote_agent, *name);
  if (st != NIXL_SUCCESS) return st;
  handle = r.release();
  return NIXL_SUCCESS;
}

nixl_status_t nixlHixlEngine::postXfer(const nixl_xfer_op_t &, const nixl_meta_dlist_t &,
                                       const nixl_meta_dlist_t &, const std::string &,
                                       nixlBackendReqH *&handle,
                                       const nixl_opt_b_args_t *opt_args) const {
  auto *r = static_cast<Request *>(handle); /* what prepXfer made */
  if (!r) return NIXL_ERR_INVALID_PARAM;
  if (r->posted) return NIXL_ERR_REPOST_ACTIVE;
  r->notify = opt_args && opt_args->hasNotif;
  r->notif = r->notify ? opt_args->notifMsg : nixl_blob_t();
  auto name = peer(r->agent);
  if (!name) {
    log_error("postXfer: agent " + r->agent + " is not loaded any more");
    return NIXL_ERR_NOT_FOUND;
  }
  /* (known as linked again once renewed: a region the peer registers later marks it stale) */
  renew_if_stale(r->agent, *name);
  if (nixl_status_t ls = ensure_link(r->agent, *name); ls != NIXL_SUCCESS) return ls;
  std::shared_lock lk(links_m_);
  r->stopping = false;
  for (auto &part : r->parts) {
    hixl_transfer_req req = nullptr;
    hixl_status st = HIXL_NOT_CONNECTED;
    /* a link that broke fails its next call, which drops it; the retry makes it again */
    bool broke = false;
    for (int attempt = 0; attempt < 2 && st == HIXL_NOT_CONNECTED; attempt++) {
      st = hixl_transfer_async_within(hx_, name->c_str(), r->op, part.descs.data(),
                                      part.descs.size(), nullptr, settings_.deadline_ms, &req);
      broke |= st == HIXL_NOT_CONNECTED;
    }
    if (st != HIXL_SUCCESS) {
      /* a link that broke and cannot be made again: the peer is gone */
      nixl_status_t e = failure(broke ? HIXL_NOT_CONNECTED : st, "postXfer", r->agent);
      stop_parts(*r); /* the parts already started end before the post returns */
      return e;
    }
    part.req = req;
    part.status = HIXL_TRANSFER_WAITING;
    std::lock_guard g(act_m_);
    posted_[req] = Posted{r->agent, &part.descs};
    in_flight_[r->agent]++;
  }
  r->posted = true;
  return NIXL_IN_PROG;
}

void nixlHixlEngine::ended(hixl_transfer_req req) const {
  std::lock_guard g(act_m_);
  auto it = posted_.find(req);
  if (it == posted_.end()) return;
  auto f = in_flight_.find(it->second.agent);
  if (f != in_flight_.end() && f->second > 0 && --f->second == 0) in_flight_.erase(f);
  posted_.erase(it);
}

/* Cancels every part still running and waits until each ended (at the latest at its
 * deadline): afterwards nothing of the handle touches its buffers. */
void nixlHixlEngine::stop_parts(Request &r) const {
  for (auto &part : r.parts) {
    if (part.req) hixl_cancel_transfer(hx_, part.req);
  }
  for (auto &part : r.parts) {
    if (!part.req) continue;
    int32_t st = HIXL_TRANSFER_WAITING;
    hixl_status hs;
    while ((hs = hixl_wait_transfer(hx_, part.req, 1000, &st)) == HIXL_SUCCESS &&
           st == HIXL_TRANSFER_WAITING) {
    }
    ended(part.req);
    part.req = nullptr;
    part.status = hs == HIXL_SUCCESS ? st : HIXL_TRANSFER_FAILED;
  }
}

nixl_status_t nixlHixlEngine::checkXfer(nixlBackendReqH *handle) const {
  auto *r = static_cast<Request *>(handle);
  if (!r || !r->posted) return NIXL_ERR_NOT_POSTED;
  /* A handle checked back to back (a caller spinning on check_xfer_state) waits for its end
   * up to poll_wait_ms, returning the moment it ends: a spinning poller would otherwise take
   * the CPU the transfer's own threads and the peer need (on 2 cores it halved a 512 MiB
   * batch's rate). A handle checked now and then (a serving loop that polls many handles
   * once per step) never waits. */
  bool wait = settings_.poll_wait_ms > 0 && std::chrono::steady_clock::now() - r->checked < kSpin;
  bool running = false;
  for (auto &part : r->parts) {
    if (!part.req) continue;
    int32_t st = HIXL_TRANSFER_WAITING;
    hixl_status hs = wait ? hixl_wait_transfer(hx_, part.req, settings_.poll_wait_ms, &st)
                          : hixl_get_transfer_status(hx_, part.req, &st);
    wait = false; /* one wait per check */
    if (hs == HIXL_SUCCESS && st == HIXL_TRANSFER_WAITING) {
      running = true;
      continue;
    }
    ended(part.req);
    part.req = nullptr;
    part.status = hs == HIXL_SUCCESS ? st : HIXL_TRANSFER_FAILED;
    if (part.status != HIXL_TRANSFER_COMPLETED && !r->stopping) {
      /* the handle failed: its other parts stop too (its end is reported once all ended) */
      r->stopping = true;
      for (auto &other : r->parts) {
        if (other.req) hixl_cancel_transfer(hx_, other.req);
      }
    }
  }
  r->checked = std::chrono::steady_clock::now();
  if (running) return NIXL_IN_PROG;
  r->posted = false;
  bool timeout = false, failed = false;
  for (const auto &part : r->parts) {
    timeout |= part.status == HIXL_TRANSFER_TIMEOUT;
    failed |= part.status != HIXL_TRANSFER_COMPLETED && part.status != HIXL_TRANSFER_TIMEOUT;
  }
  if (timeout) {
    log_error("a transfer to agent " + r->agent + " passed its deadline (" +
              std::to_string(settings_.deadline_ms) +
              " ms, parameter deadline_ms): it ended, and its buffers are not touched any more");
    return NIXL_ERR_BACKEND;
  }
  if (failed) {
    int32_t cs = HIXL_NOT_CONNECT;
    auto name = peer(r->agent);
    if (name) hixl_get_async_connect_status(hx_, name->c_str(), &cs);
    if (cs != HIXL_CONNECTED) {
      log_error("a transfer to agent " + r->agent + " failed: the link to it broke");
      return NIXL_ERR_REMOTE_DISCONNECT;
    }
    log_error("a transfer to agent " + r->agent +
              " failed (refused by the peer: a region it no longer serves; or cancelled)");
    return NIXL_ERR_BACKEND;
  }
  return r->notify ? send_blob(r->agent, r->notif) : NIXL_SUCCESS;
}

nixl_status_t nixlHixlEngine::releaseReqH(nixlBackendReqH *handle) const {
  auto *r = static_cast<Request *>(handle);
  if (!r) return NIXL_SUCCESS;
  /* still running: stopped, and waited for until it ended, so nothing touches its buffers
   * once NIXL lets the caller reuse them */
  stop_parts(*r);
  delete r;
  return NIXL_SUCCESS;
}

std::vector<Request::Part> split(const std::vector<hixl_transfer_op_desc> &descs, size_t lanes,
                                 uint64_t min_part) {
  /* in 128 bits: the lengths of a batch may add up past 2^64 (and total * (k + 1) would too),
   * which made a part end before its bytes and k run past the last part */
  using u128 = unsigned __int128;
  u128 total = 0;
  for (const auto &d : descs) total += d.len;
  size_t parts = static_cast<size_t>(
      std::max<u128>(1, std::min<u128>(lanes, min_part ? total / min_part : u128{lanes})));
  std::vector<Request::Part> out(parts);
  if (parts == 1) {
    out[0].descs = descs;
    return out;
  }
  /* part k ends at byte total * (k + 1) / parts of the batch */
  size_t k = 0;
  u128 done = 0;
  for (auto d : descs) {
    while (d.len > 0) {
      /* done < total here (d's bytes are left), so the last part always has room */
      const u128 end = k + 1 == parts ? total : total * (k + 1) / parts;
      const u128 room = end - done;
      if (room == 0) {
        k++;
        continue;
      }
      const size_t take = static_cast<size_t>(std::min<u128>(room, d.len));
      out[k].descs.push_back(hixl_transfer_op_desc{d.local_addr, d.remote_addr, take});
      d.local_addr += take;
      d.remote_addr += take;
      d.len -= take;
      done += take;
    }
  }
  return out;
}

/* ---- notifications ---- */

nixl_status_t nixlHixlEngine::send_blob(const std::string &agent, const std::string &blob) const {
  auto name = peer(agent);
  if (!name) {
    log_error("genNotif: no connection info of agent " + agent + " (load its metadata)");
    return NIXL_ERR_NOT_FOUND;
  }
  auto parts = encode_blob(localAgent, next_notif_.fetch_add(1), blob);
  if (parts.empty()) {
    log_error("genNotif: this agent's name is too long for a hixl notification name");
    return NIXL_ERR_INVALID_PARAM;
  }
  std::shared_lock lk(links_m_);
  for (size_t i = 0; i < parts.size(); i++) {
    hixl_status st = HIXL_NOT_CONNECTED;
    for (int attempt = 0; attempt < 2 && st == HIXL_NOT_CONNECTED && (attempt == 0 || i == 0);
         attempt++) {
      st = hixl_send_notify(hx_, name->c_str(), parts[i].name.c_str(), parts[i].msg.c_str(),
                            settings_.notify_timeout_ms);
    }
    if (st != HIXL_SUCCESS) return failure(st, "notification", agent);
  }
  return NIXL_SUCCESS;
}

nixl_status_t nixlHixlEngine::genNotif(const std::string &remote_agent,
                                       const std::string &msg) const {
  return send_blob(remote_agent, msg);
}

nixl_status_t nixlHixlEngine::getNotifs(notif_list_t &notif_list) {
  std::lock_guard g(notif_m_);
  hixl_list *l = nullptr;
  hixl_status st = hixl_get_notifies(hx_, &l);
  if (st != HIXL_SUCCESS) return failure(st, "getNotifs", localAgent);
  const size_t n = hixl_list_len(l);
  size_t foreign = 0;
  for (size_t i = 0; i < n; i++) {
    const char *name = nullptr;
    const char *msg = nullptr;
    if (hixl_list_notify(l, i, &name, &msg) != HIXL_SUCCESS) continue;
    if (!reassembly_.add(name, msg, notif_list)) foreign++;
  }
  hixl_list_free(l);
  if (foreign) log_error("getNotifs: " + std::to_string(foreign) + " notification(s) that are " +
                         "not NIXL's ignored");
  return NIXL_SUCCESS;
}

}  // namespace hixl_nixl
