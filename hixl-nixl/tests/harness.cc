/*
 * libplugin_HIXL.so driven the way NIXL 1.5.1's agent drives a backend plugin, without NIXL:
 * dlopen (RTLD_NOW | RTLD_LOCAL), nixl_plugin_init, create_engine, and the engine's virtual
 * calls through hixl-nixl/nixl_abi.h, with two engines (two "agents") in this process. What the
 * wheel's agent collapses into NIXL_ERR_BACKEND (or refuses before the plugin sees it) is checked
 * here code by code; and the plugin's own hixl_nixl_alloc / hixl_nixl_free. Run by
 * hixl-capi/tests/nixl_plugin.rs (cargo test); prints "ok".
 *
 *   harness PATH/libplugin_HIXL.so
 */
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "expect.h"
#include "nixl_abi.h"

template <class T>
nixlDescList<T>::~nixlDescList() {}

namespace {

nixlBackendPlugin *plugin = nullptr;

nixlBackendEngine *engine(const std::string &agent, nixl_b_params_t params) {
  nixlBackendInitParams init;
  init.localAgent = agent;
  init.type = "HIXL";
  init.customParams = &params;
  init.syncMode = nixl_thread_sync_t::NIXL_THREAD_SYNC_NONE;
  return plugin->create_engine(&init);
}

nixlBlobDesc blob(const void *addr, size_t len, std::string meta = "") {
  nixlBlobDesc d;
  d.addr = reinterpret_cast<uintptr_t>(addr);
  d.len = len;
  d.devId = 0;
  d.metaInfo = std::move(meta);
  return d;
}

nixlMetaDesc meta(uintptr_t addr, size_t len, nixlBackendMD *md) {
  nixlMetaDesc d;
  d.addr = addr;
  d.len = len;
  d.devId = 0;
  d.metadataP = md;
  return d;
}

std::vector<unsigned char> random_bytes(size_t n, unsigned seed) {
  std::mt19937_64 g(seed);
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t x = g();
    std::memcpy(&v[i], &x, 8);
  }
  return v;
}

/* checkXfer until the handle ends (bounded: a hung transfer fails the test, not hangs it) */
nixl_status_t finish(nixlBackendEngine *e, nixlBackendReqH *h) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  nixl_status_t st = NIXL_IN_PROG;
  while (st == NIXL_IN_PROG && std::chrono::steady_clock::now() < until) st = e->checkXfer(h);
  return st;
}

/* notifications until `n` arrived (bounded) */
notif_list_t take(nixlBackendEngine *e, size_t n) {
  notif_list_t all;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (all.size() < n && std::chrono::steady_clock::now() < until) {
    notif_list_t got;
    EXPECT(e->getNotifs(got), NIXL_SUCCESS);
    all.insert(all.end(), got.begin(), got.end());
  }
  return all;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: harness PATH/libplugin_HIXL.so\n");
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  auto init = reinterpret_cast<nixlBackendPlugin *(*)()>(dlsym(lib, "nixl_plugin_init"));
  CHECK(init != nullptr && dlsym(lib, "nixl_plugin_fini") != nullptr);
  if (!init) return 1;
  plugin = init();
  EXPECT(plugin->api_version, NIXL_PLUGIN_API_VERSION);
  CHECK(std::string(plugin->get_plugin_name()) == "HIXL");
  CHECK(plugin->get_backend_options().count("deadline_ms") == 1);
  CHECK(plugin->get_backend_mems() == nixl_mem_list_t{DRAM_SEG});

  /* parameters: unknown keys and bad values fail the engine (initErr), as NIXL checks */
  for (nixl_b_params_t bad : {nixl_b_params_t{{"nonsense", "1"}}, {{"deadline_ms", "0"}},
                              {{"deadline_ms", "x"}}, {{"lanes", "17"}}, {{"poll_wait_ms", "-1"}}}) {
    nixlBackendEngine *e = engine("bad", bad);
    CHECK(e != nullptr && e->getInitErr());
    plugin->destroy_engine(e);
  }

  nixlBackendEngine *a = engine("A", {{"ip", "127.0.0.1"}});
  nixlBackendEngine *b = engine("B", {{"ip", "127.0.0.1"}, {"deadline_ms", "30000"}});
  CHECK(!a->getInitErr() && !b->getInitErr());
  CHECK(a->supportsRemote() && a->supportsNotif() && !a->supportsLocal());
  CHECK(a->getSupportedMems() == nixl_mem_list_t{DRAM_SEG});

  /* memory: A serves 32 MiB, B has 32 MiB */
  const size_t len = 32u << 20;
  auto ma = random_bytes(len, 1);
  auto mb = random_bytes(len, 2);
  nixlBackendMD *mda = nullptr, *mdb = nullptr, *inner = nullptr, *x = nullptr;
  EXPECT(a->registerMem(blob(ma.data(), len), DRAM_SEG, mda), NIXL_SUCCESS);
  EXPECT(b->registerMem(blob(mb.data(), len), DRAM_SEG, mdb), NIXL_SUCCESS);
  EXPECT(a->registerMem(blob(ma.data(), len), VRAM_SEG, x), NIXL_ERR_NOT_SUPPORTED);
  EXPECT(a->registerMem(blob(ma.data(), len), FILE_SEG, x), NIXL_ERR_NOT_SUPPORTED);
  EXPECT(a->registerMem(blob(ma.data(), 0), DRAM_SEG, x), NIXL_ERR_INVALID_PARAM);
  /* inside a registration: shares it; across its end: refused */
  EXPECT(a->registerMem(blob(ma.data() + 4096, 8192), DRAM_SEG, inner), NIXL_SUCCESS);
  EXPECT(a->registerMem(blob(ma.data() + len / 2, len), DRAM_SEG, x), NIXL_ERR_NOT_SUPPORTED);

  /* metadata */
  std::string ca, cb, pa, pinner;
  EXPECT(a->getConnInfo(ca), NIXL_SUCCESS);
  EXPECT(b->getConnInfo(cb), NIXL_SUCCESS);
  CHECK(ca.rfind("hixl/1 127.0.0.1:", 0) == 0);
  EXPECT(a->getPublicData(mda, pa), NIXL_SUCCESS);
  EXPECT(a->getPublicData(inner, pinner), NIXL_SUCCESS);
  CHECK(pa == pinner); /* the hixl region both lie in */
  EXPECT(b->loadRemoteConnInfo("A", ca), NIXL_SUCCESS);
  EXPECT(a->loadRemoteConnInfo("B", cb), NIXL_SUCCESS);
  EXPECT(b->loadRemoteConnInfo("Z", "ucx 1234"), NIXL_ERR_MISMATCH);
  nixlBackendMD *rma = nullptr;
  EXPECT(b->loadRemoteMD(blob(ma.data(), len, pa), DRAM_SEG, "A", rma), NIXL_SUCCESS);
  EXPECT(b->loadRemoteMD(blob(ma.data(), len, "junk"), DRAM_SEG, "A", x), NIXL_ERR_MISMATCH);
  /* public data exactly as the backend writes it: no sign, 0x, extra space or 65-bit value */
  for (std::string bad : {"hixl/1 -1 1", "hixl/1 0x10 1", "hixl/1  10 1", "hixl/1 10 1 ",
                          "hixl/1 10000000000000000 1", "hixl/1 10"}) {
    EXPECT(b->loadRemoteMD(blob(ma.data(), len, bad), DRAM_SEG, "A", x), NIXL_ERR_MISMATCH);
  }
  EXPECT(b->loadRemoteMD(blob(ma.data(), len + 1, pa), DRAM_SEG, "A", x), NIXL_ERR_INVALID_PARAM);
  EXPECT(b->loadRemoteMD(blob(ma.data(), len, pa), VRAM_SEG, "A", x), NIXL_ERR_NOT_SUPPORTED);

  /* WRITE 64 blocks of 16 KiB, B's block i -> A's block perm[i], with a notification */
  const size_t blk = 16384, n = 64;
  std::vector<size_t> perm(n);
  for (size_t i = 0; i < n; i++) perm[i] = (i * 37 + 11) % n;
  nixl_meta_dlist_t wl(DRAM_SEG), wr(DRAM_SEG);
  for (size_t i = 0; i < n; i++) {
    wl.add(meta(reinterpret_cast<uintptr_t>(mb.data()) + i * blk, blk, mdb));
    wr.add(meta(reinterpret_cast<uintptr_t>(ma.data()) + perm[i] * blk, blk, rma));
  }
  nixl_opt_b_args_t notif;
  notif.notifMsg = std::string("w\0rite", 6);
  notif.hasNotif = true;
  nixlBackendReqH *h = nullptr;
  EXPECT(b->prepXfer(NIXL_WRITE, wl, wr, "A", h, &notif), NIXL_SUCCESS);
  EXPECT(b->postXfer(NIXL_WRITE, wl, wr, "A", h, &notif), NIXL_IN_PROG);
  EXPECT(b->postXfer(NIXL_WRITE, wl, wr, "A", h, &notif), NIXL_ERR_REPOST_ACTIVE);
  EXPECT(finish(b, h), NIXL_SUCCESS);
  for (size_t i = 0; i < n; i++)
    CHECK(std::memcmp(ma.data() + perm[i] * blk, mb.data() + i * blk, blk) == 0);
  auto got = take(a, 1);
  CHECK(got.size() == 1 && got[0].first == "B" && got[0].second == std::string("w\0rite", 6));
  /* reposted, without a notification */
  EXPECT(b->postXfer(NIXL_WRITE, wl, wr, "A", h, nullptr), NIXL_IN_PROG);
  EXPECT(finish(b, h), NIXL_SUCCESS);
  EXPECT(b->releaseReqH(h), NIXL_SUCCESS);

  /* READ the second half of A (one 16 MiB descriptor: split into two hixl requests) */
  nixl_meta_dlist_t rl(DRAM_SEG), rr(DRAM_SEG);
  rl.add(meta(reinterpret_cast<uintptr_t>(mb.data()) + len / 2, len / 2, mdb));
  rr.add(meta(reinterpret_cast<uintptr_t>(ma.data()) + len / 2, len / 2, rma));
  EXPECT(b->prepXfer(NIXL_READ, rl, rr, "A", h, nullptr), NIXL_SUCCESS);
  EXPECT(b->postXfer(NIXL_READ, rl, rr, "A", h, nullptr), NIXL_IN_PROG);
  EXPECT(finish(b, h), NIXL_SUCCESS);
  CHECK(std::memcmp(ma.data() + len / 2, mb.data() + len / 2, len / 2) == 0);
  /* released in flight: the call returns once it ended; the engine goes on */
  EXPECT(b->postXfer(NIXL_READ, rl, rr, "A", h, nullptr), NIXL_IN_PROG);
  EXPECT(b->releaseReqH(h), NIXL_SUCCESS);

  /* bad batches: NIXL's codes */
  nixl_meta_dlist_t empty(DRAM_SEG), vram(VRAM_SEG), shortl(DRAM_SEG);
  vram.add(meta(reinterpret_cast<uintptr_t>(mb.data()), 4096, mdb));
  shortl.add(meta(reinterpret_cast<uintptr_t>(mb.data()), 4095, mdb));
  nixl_meta_dlist_t one(DRAM_SEG);
  one.add(meta(reinterpret_cast<uintptr_t>(ma.data()), 4096, rma));
  EXPECT(b->prepXfer(NIXL_WRITE, empty, empty, "A", h, nullptr), NIXL_ERR_INVALID_PARAM);
  EXPECT(b->prepXfer(NIXL_WRITE, vram, one, "A", h, nullptr), NIXL_ERR_NOT_SUPPORTED);
  EXPECT(b->prepXfer(NIXL_WRITE, shortl, one, "A", h, nullptr), NIXL_ERR_INVALID_PARAM);
  EXPECT(b->prepXfer(NIXL_WRITE, one, one, "nobody", h, nullptr), NIXL_ERR_NOT_FOUND);
  EXPECT(b->genNotif("nobody", "x"), NIXL_ERR_NOT_FOUND);
  EXPECT(b->connect("nobody"), NIXL_ERR_NOT_FOUND);
  EXPECT(b->connect("A"), NIXL_SUCCESS);

  /* notifications both ways: empty, and 100 kB with NULs (in parts) */
  auto big = random_bytes(100000, 3);
  big[0] = 0;
  std::string bigs(big.begin(), big.end());
  EXPECT(b->genNotif("A", ""), NIXL_SUCCESS);
  EXPECT(b->genNotif("A", bigs), NIXL_SUCCESS);
  got = take(a, 2);
  CHECK(got.size() == 2 && got[0].second.empty() && got[1].second == bigs);
  EXPECT(a->genNotif("B", "back"), NIXL_SUCCESS);
  got = take(b, 1);
  CHECK(got.size() == 1 && got[0].first == "A" && got[0].second == "back");

  /* deregistering memory a posted transfer uses: the transfer is cancelled and waited for,
   * then the memory is the caller's; the handle ends (not DONE-with-garbage) */
  auto mc = random_bytes(len, 4);
  nixlBackendMD *mdc = nullptr;
  EXPECT(b->registerMem(blob(mc.data(), len), DRAM_SEG, mdc), NIXL_SUCCESS);
  nixl_meta_dlist_t cl(DRAM_SEG), cr(DRAM_SEG);
  cl.add(meta(reinterpret_cast<uintptr_t>(mc.data()), len, mdc));
  cr.add(meta(reinterpret_cast<uintptr_t>(ma.data()), len, rma));
  EXPECT(b->prepXfer(NIXL_READ, cl, cr, "A", h, nullptr), NIXL_SUCCESS);
  EXPECT(b->postXfer(NIXL_READ, cl, cr, "A", h, nullptr), NIXL_IN_PROG);
  EXPECT(b->deregisterMem(mdc), NIXL_SUCCESS);
  nixl_status_t st = finish(b, h);
  CHECK(st == NIXL_SUCCESS || st == NIXL_ERR_BACKEND);
  EXPECT(b->releaseReqH(h), NIXL_SUCCESS);

  /* engine memory (the plugin's hixl_nixl_alloc / hixl_nixl_free): registered with NIXL,
   * read by the other engine (the same-host path), freed only once deregistered */
  auto ealloc = reinterpret_cast<int (*)(const char *, size_t, void **)>(
      dlsym(lib, "hixl_nixl_alloc"));
  auto efree = reinterpret_cast<int (*)(const char *, void *)>(dlsym(lib, "hixl_nixl_free"));
  CHECK(ealloc != nullptr && efree != nullptr);
  void *em = nullptr;
  EXPECT(ealloc("nobody", 4096, &em), NIXL_ERR_NOT_FOUND);
  EXPECT(ealloc("A", 0, &em), NIXL_ERR_INVALID_PARAM);
  EXPECT(ealloc("A", 1u << 20, &em), NIXL_SUCCESS);
  auto eb = random_bytes(1u << 20, 5);
  std::memcpy(em, eb.data(), eb.size());
  nixlBackendMD *mde = nullptr, *rme = nullptr;
  EXPECT(a->registerMem(blob(static_cast<char *>(em) + 4096, 65536), DRAM_SEG, mde), NIXL_SUCCESS);
  std::string pe;
  EXPECT(a->getPublicData(mde, pe), NIXL_SUCCESS);
  EXPECT(b->loadRemoteMD(blob(static_cast<char *>(em) + 4096, 65536, pe), DRAM_SEG, "A", rme),
         NIXL_SUCCESS);
  nixl_meta_dlist_t el(DRAM_SEG), er(DRAM_SEG);
  el.add(meta(reinterpret_cast<uintptr_t>(mb.data()), 65536, mdb));
  er.add(meta(reinterpret_cast<uintptr_t>(em) + 4096, 65536, rme));
  EXPECT(b->prepXfer(NIXL_READ, el, er, "A", h, nullptr), NIXL_SUCCESS);
  EXPECT(b->postXfer(NIXL_READ, el, er, "A", h, nullptr), NIXL_IN_PROG);
  EXPECT(finish(b, h), NIXL_SUCCESS);
  CHECK(std::memcmp(mb.data(), eb.data() + 4096, 65536) == 0);
  EXPECT(b->releaseReqH(h), NIXL_SUCCESS);
  EXPECT(efree("A", em), NIXL_ERR_NOT_ALLOWED); /* NIXL still has it registered */
  EXPECT(efree("A", mb.data()), NIXL_ERR_INVALID_PARAM);
  EXPECT(b->unloadMD(rme), NIXL_SUCCESS);
  EXPECT(a->deregisterMem(mde), NIXL_SUCCESS);
  EXPECT(efree("A", em), NIXL_SUCCESS);

  /* a prepared handle posted after the peer's table grew: the post renews the link and knows
   * it, so a region the peer registers after that renews it again at the next prepXfer (it
   * was INVALID_PARAM: the post left the link unknown, and an AutoConnect link with the older
   * table served the region loaded later) */
  auto u = [](const std::vector<unsigned char> &v) { return reinterpret_cast<uintptr_t>(v.data()); };
  nixl_meta_dlist_t hl(DRAM_SEG), hr(DRAM_SEG);
  hl.add(meta(u(mb), 4096, mdb));
  hr.add(meta(u(ma), 4096, rma));
  nixlBackendReqH *h1 = nullptr;
  EXPECT(b->prepXfer(NIXL_READ, hl, hr, "A", h1, nullptr), NIXL_SUCCESS);
  std::vector<std::vector<unsigned char>> grown;
  std::vector<nixlBackendMD *> grown_md, grown_rm;
  auto grow = [&](unsigned seed) {
    grown.push_back(random_bytes(65536, seed));
    nixlBackendMD *md = nullptr, *rm = nullptr;
    std::string pub;
    EXPECT(a->registerMem(blob(grown.back().data(), 65536), DRAM_SEG, md), NIXL_SUCCESS);
    EXPECT(a->getPublicData(md, pub), NIXL_SUCCESS);
    EXPECT(b->loadRemoteMD(blob(grown.back().data(), 65536, pub), DRAM_SEG, "A", rm),
           NIXL_SUCCESS);
    grown_md.push_back(md);
    grown_rm.push_back(rm);
  };
  grow(6);
  EXPECT(b->postXfer(NIXL_READ, hl, hr, "A", h1, nullptr), NIXL_IN_PROG);
  EXPECT(finish(b, h1), NIXL_SUCCESS);
  CHECK(std::memcmp(mb.data(), ma.data(), 4096) == 0);
  EXPECT(b->releaseReqH(h1), NIXL_SUCCESS);
  grow(7);
  nixl_meta_dlist_t gl(DRAM_SEG), gr(DRAM_SEG);
  gl.add(meta(u(mb), 65536, mdb));
  gr.add(meta(u(grown[1]), 65536, grown_rm[1]));
  EXPECT(b->prepXfer(NIXL_READ, gl, gr, "A", h, nullptr), NIXL_SUCCESS);
  EXPECT(b->postXfer(NIXL_READ, gl, gr, "A", h, nullptr), NIXL_IN_PROG);
  EXPECT(finish(b, h), NIXL_SUCCESS);
  CHECK(std::memcmp(mb.data(), grown[1].data(), 65536) == 0);
  EXPECT(b->releaseReqH(h), NIXL_SUCCESS);
  for (size_t i = 0; i < grown.size(); i++) {
    EXPECT(b->unloadMD(grown_rm[i]), NIXL_SUCCESS);
    EXPECT(a->deregisterMem(grown_md[i]), NIXL_SUCCESS);
  }

  /* a link a notification made (hixl's AutoConnect, before any prepXfer) has the peer's table
   * of then: a region the peer registers later renews it at the next prepXfer (it was
   * INVALID_PARAM on every post: only links the plugin made itself were marked stale) */
  {
    nixlBackendEngine *c = engine("C", {{"ip", "127.0.0.1"}});
    CHECK(!c->getInitErr());
    EXPECT(c->loadRemoteConnInfo("A", ca), NIXL_SUCCESS);
    EXPECT(c->genNotif("A", "hello"), NIXL_SUCCESS);
    got = take(a, 1);
    CHECK(got.size() == 1 && got[0].first == "C" && got[0].second == "hello");
    auto later = random_bytes(65536, 8);
    auto mine = random_bytes(65536, 9);
    nixlBackendMD *lmd = nullptr, *lrm = nullptr, *cmd = nullptr;
    std::string pub;
    EXPECT(a->registerMem(blob(later.data(), 65536), DRAM_SEG, lmd), NIXL_SUCCESS);
    EXPECT(a->getPublicData(lmd, pub), NIXL_SUCCESS);
    EXPECT(c->registerMem(blob(mine.data(), 65536), DRAM_SEG, cmd), NIXL_SUCCESS);
    EXPECT(c->loadRemoteMD(blob(later.data(), 65536, pub), DRAM_SEG, "A", lrm), NIXL_SUCCESS);
    nixl_meta_dlist_t ll(DRAM_SEG), lr(DRAM_SEG);
    ll.add(meta(u(mine), 65536, cmd));
    lr.add(meta(u(later), 65536, lrm));
    nixlBackendReqH *lh = nullptr;
    EXPECT(c->prepXfer(NIXL_READ, ll, lr, "A", lh, nullptr), NIXL_SUCCESS);
    EXPECT(c->postXfer(NIXL_READ, ll, lr, "A", lh, nullptr), NIXL_IN_PROG);
    EXPECT(finish(c, lh), NIXL_SUCCESS);
    CHECK(mine == later);
    EXPECT(c->releaseReqH(lh), NIXL_SUCCESS);
    EXPECT(c->disconnect("A"), NIXL_SUCCESS);
    EXPECT(c->unloadMD(lrm), NIXL_SUCCESS);
    EXPECT(c->deregisterMem(cmd), NIXL_SUCCESS);
    EXPECT(a->deregisterMem(lmd), NIXL_SUCCESS);
    plugin->destroy_engine(c);
  }

  /* teardown, in NIXL's order */
  EXPECT(b->disconnect("A"), NIXL_SUCCESS);
  EXPECT(b->unloadMD(rma), NIXL_SUCCESS);
  EXPECT(a->deregisterMem(inner), NIXL_SUCCESS);
  EXPECT(a->deregisterMem(mda), NIXL_SUCCESS);
  EXPECT(b->deregisterMem(mdb), NIXL_SUCCESS);
  plugin->destroy_engine(a);
  plugin->destroy_engine(b);
  if (failures) {
    std::fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
