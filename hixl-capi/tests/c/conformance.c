/* The conformance table (tests/conformance/cases.json) through the C ABI, driven by
 * hixl-capi/tests/conformance.rs: each line on stdin is one case, rendered into this program's
 * words by the driver; each answer is `STATUS <n>` (or `BAD <why>` when a case could not be
 * set up). Every case starts from a fresh instance brought to its state and destroys it after.
 *
 *   conformance ENGINE_PEER PEER_REGION DD_PEER_IP DD_PEER_PORT
 *
 *   engine STATE initialize NAME N [KEY VALUE]...
 *   engine STATE register fresh|null|overlap LEN
 *   engine STATE deregister | transfer_status
 *   engine STATE connect|disconnect peer|malformed TIMEOUT
 *   engine STATE notify peer|malformed TIMEOUT NAME_LEN MSG_LEN
 *   engine STATE transfer OP N [region|unregistered LOFF peer|outside ROFF LEN]... TIMEOUT
 *   dd STATE pull_blocks|push_blocks CLUSTER CACHE BATCH SRCS DSTS SF SL DF DL PER LOCAL
 *   dd STATE pull_cache|push_cache CLUSTER CACHE KEY_BATCH BATCH SIZE SF SL DF DL PER LOCAL
 *   dd STATE register ok|none|one|zero
 *   dd STATE unregister ID
 *   dd STATE link|unlink CLUSTER TIMEOUT WITH_ADDRESS
 *   cs ... (conformance_cs.c)
 *
 * Strings are %-escaped (%20 a space; `~` the empty string); lists comma-separated, `-` empty;
 * LOCAL is this side's cache id (its blocks cache is 1, its cache of batches 2). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hixl_c.h"
#include "hixl_dd.h"

/* conformance_cs.c */
unsigned cs_case(char **tok, int n);
char *unescape(char *s);

enum { REGION = 4096, TENSORS = 4, MAX_TOK = 64, MAX_LIST = 64 };

static const char *engine_peer;
static uintptr_t peer_region;
static const char *dd_ip;
static uint16_t dd_port;

/* %XX escapes decoded in place; `~` is "" (conformance_cs.c's strings too) */
char *unescape(char *s) {
  if (strcmp(s, "~") == 0) {
    s[0] = '\0';
    return s;
  }
  char *w = s;
  for (char *r = s; *r; r++) {
    if (r[0] == '%' && r[1] && r[2]) {
      char hex[3] = {r[1], r[2], 0};
      *w++ = (char)strtol(hex, NULL, 16);
      r += 2;
    } else {
      *w++ = *r;
    }
  }
  *w = '\0';
  return s;
}

static size_t list(const char *s, uint64_t *out) {
  if (strcmp(s, "-") == 0) return 0;
  size_t n = 0;
  char *end = NULL;
  for (const char *p = s; *p && n < MAX_LIST; p = (*end == ',') ? end + 1 : end) {
    out[n++] = strtoull(p, &end, 10);
  }
  return n;
}

static long num(const char *s) { return strtol(s, NULL, 10); }

/* ---- the engine ---- */

static unsigned engine_case(char **tok, int n) {
  static unsigned char region[REGION], unregistered[REGION], fresh[REGION];
  const char *state = tok[1], *call = tok[2];
  hixl_engine *me = NULL;
  if (hixl_create(&me) != HIXL_SUCCESS) return 1;
  if (strcmp(state, "fresh") != 0) {
    hixl_mem_desc d;
    memset(&d, 0, sizeof d);
    d.addr = (uintptr_t)region;
    d.len = REGION;
    hixl_mem_handle h = NULL;
    if (hixl_initialize(me, "127.0.0.1", NULL, NULL, 0) != HIXL_SUCCESS ||
        hixl_register_mem(me, &d, HIXL_MEM_HOST, &h) != HIXL_SUCCESS) {
      hixl_destroy(me);
      return 1;
    }
  }
  if (strcmp(state, "connected") == 0 && hixl_connect(me, engine_peer, 5000) != HIXL_SUCCESS) {
    hixl_destroy(me);
    return 1;
  }
  if (strcmp(state, "finalized") == 0) (void)hixl_finalize(me);
  hixl_status st = 1;
  if (strcmp(call, "initialize") == 0) {
    const char *keys[16], *values[16];
    int count = (int)num(tok[4]);
    for (int i = 0; i < count && i < 16 && 6 + 2 * i <= n; i++) {
      keys[i] = unescape(tok[5 + 2 * i]);
      values[i] = unescape(tok[6 + 2 * i]);
    }
    st = hixl_initialize(me, unescape(tok[3]), keys, values, (size_t)count);
  } else if (strcmp(call, "register") == 0) {
    hixl_mem_desc d;
    memset(&d, 0, sizeof d);
    d.addr = strcmp(tok[3], "null") == 0      ? 0
             : strcmp(tok[3], "overlap") == 0 ? (uintptr_t)region + 1024
                                              : (uintptr_t)fresh;
    d.len = (size_t)num(tok[4]);
    hixl_mem_handle h = NULL;
    st = hixl_register_mem(me, &d, HIXL_MEM_HOST, &h);
  } else if (strcmp(call, "deregister") == 0) {
    st = hixl_deregister_mem(me, (hixl_mem_handle)(uintptr_t)0xdeadbeef);
  } else if (strcmp(call, "transfer_status") == 0) {
    int32_t s = 0;
    st = hixl_get_transfer_status(me, (hixl_transfer_req)(uintptr_t)0xdeadbeef, &s);
  } else if (strcmp(call, "connect") == 0 || strcmp(call, "disconnect") == 0 ||
             strcmp(call, "notify") == 0) {
    const char *remote = strcmp(tok[3], "peer") == 0 ? engine_peer : "not an engine name";
    int32_t t = (int32_t)num(tok[4]);
    if (call[0] == 'c') {
      st = hixl_connect(me, remote, t);
    } else if (call[0] == 'd') {
      st = hixl_disconnect(me, remote, t);
    } else {
      /* a name and a message of NAME_LEN and MSG_LEN bytes */
      static char name[4096], msg[4096];
      size_t nl = (size_t)num(tok[5]), ml = (size_t)num(tok[6]);
      if (nl >= sizeof name || ml >= sizeof msg) {
        fprintf(stderr, "notify: lengths %zu %zu too long for this program\n", nl, ml);
        exit(2);
      }
      memset(name, 'n', nl);
      name[nl] = 0;
      memset(msg, 'm', ml);
      msg[ml] = 0;
      st = hixl_send_notify(me, remote, name, msg, t);
    }
  } else if (strcmp(call, "transfer") == 0) {
    int32_t op = (int32_t)num(tok[3]);
    int count = (int)num(tok[4]);
    hixl_transfer_op_desc descs[8];
    for (int i = 0; i < count && i < 8; i++) {
      char **d = tok + 5 + 5 * i;
      uintptr_t local = strcmp(d[0], "region") == 0 ? (uintptr_t)region : (uintptr_t)unregistered;
      uintptr_t remote = strcmp(d[2], "peer") == 0 ? peer_region : peer_region + 16 * REGION;
      descs[i].local_addr = local + (uintptr_t)num(d[1]);
      descs[i].remote_addr = remote + (uintptr_t)num(d[3]);
      descs[i].len = (size_t)num(d[4]);
    }
    st = hixl_transfer_sync(me, engine_peer, op, count > 0 ? descs : NULL, (size_t)count,
                            (int32_t)num(tok[5 + 5 * count]));
  }
  hixl_destroy(me);
  return st;
}

/* ---- LLM-DataDist ---- */

static hixl_dd_cluster_info peer_cluster(uint64_t id, int with_address, hixl_dd_ip_info *ip) {
  ip->ip = dd_ip;
  ip->port = dd_port;
  hixl_dd_cluster_info c;
  memset(&c, 0, sizeof c);
  c.remote_cluster_id = id;
  c.remote_ip_infos = with_address ? ip : NULL;
  c.remote_ip_count = with_address ? 1 : 0;
  return c;
}

static hixl_dd_layers layers(char **t) {
  hixl_dd_layers l;
  l.src_first = (int32_t)num(t[0]);
  l.src_last = (int32_t)num(t[1]);
  l.dst_first = (int32_t)num(t[2]);
  l.dst_last = (int32_t)num(t[3]);
  l.tensor_num_per_layer = (uint32_t)num(t[4]);
  return l;
}

static unsigned dd_case(char **tok, int n) {
  (void)n;
  enum { BLOCK_BYTES = 16 * 128, BATCH_BYTES = 4 * 256 };
  static unsigned char blocks[TENSORS][BLOCK_BYTES], batches[TENSORS][BATCH_BYTES], extra[2][128];
  const char *state = tok[1], *call = tok[2];
  hixl_dd *me = NULL;
  if (hixl_dd_create(2, HIXL_DD_ROLE_DECODER, &me) != HIXL_LLM_SUCCESS) return 1;
  if (strcmp(state, "uninit") != 0) {
    int64_t shape_blocks[2] = {16, 32}, shape_batches[2] = {4, 64}, id = -1;
    uint64_t ba[TENSORS], ca[TENSORS];
    for (int t = 0; t < TENSORS; t++) {
      ba[t] = (uint64_t)(uintptr_t)blocks[t];
      ca[t] = (uint64_t)(uintptr_t)batches[t];
    }
    hixl_dd_cache_desc d = {HIXL_DD_PLACEMENT_HOST, TENSORS, 3 /* DT_INT32 */, shape_blocks, 2};
    hixl_dd_cache_desc e = {HIXL_DD_PLACEMENT_HOST, TENSORS, 3, shape_batches, 2};
    if (hixl_dd_initialize(me, NULL, NULL, 0) != HIXL_LLM_SUCCESS ||
        hixl_dd_register_cache(me, &d, ba, TENSORS, &id) != HIXL_LLM_SUCCESS || id != 1 ||
        hixl_dd_register_cache(me, &e, ca, TENSORS, &id) != HIXL_LLM_SUCCESS || id != 2) {
      hixl_dd_destroy(me);
      return 1;
    }
  }
  if (strcmp(state, "linked") == 0) {
    hixl_dd_ip_info ip;
    hixl_dd_cluster_info c = peer_cluster(1, 1, &ip);
    uint32_t ret = 0;
    if (hixl_dd_link_clusters(me, &c, 1, 5000, &ret) != HIXL_LLM_SUCCESS) {
      hixl_dd_destroy(me);
      return 1;
    }
  }
  if (strcmp(state, "finalized") == 0) (void)hixl_dd_finalize(me);
  hixl_status st = 1;
  int blocks_call = strcmp(call, "pull_blocks") == 0 || strcmp(call, "push_blocks") == 0;
  if (blocks_call) {
    hixl_dd_cache_index key = {(uint64_t)strtoull(tok[3], NULL, 10), num(tok[4]),
                               (uint32_t)num(tok[5])};
    uint64_t src[MAX_LIST], dst[MAX_LIST];
    size_t ns = list(tok[6], src), nd = list(tok[7], dst);
    hixl_dd_layers l = layers(tok + 8);
    int64_t local = num(tok[13]);
    if (ns != nd) {
      st = 1; /* (one count: the driver sends no such case) */
    } else if (call[1] == 'u' && call[2] == 'l') {
      st = hixl_dd_pull_blocks(me, &key, local, src, dst, ns, &l);
    } else {
      st = hixl_dd_push_blocks(me, local, &key, src, dst, ns, &l);
    }
  } else if (strcmp(call, "pull_cache") == 0 || strcmp(call, "push_cache") == 0) {
    hixl_dd_cache_index key = {(uint64_t)strtoull(tok[3], NULL, 10), num(tok[4]),
                               (uint32_t)num(tok[5])};
    uint32_t batch = (uint32_t)num(tok[6]);
    int64_t size = num(tok[7]);
    hixl_dd_layers l = layers(tok + 8);
    int64_t local = num(tok[13]);
    if (call[1] == 'u' && call[2] == 'l') {
      st = hixl_dd_pull_cache(me, &key, local, batch, size, &l);
    } else {
      st = hixl_dd_push_cache(me, local, batch, &key, size, &l);
    }
  } else if (strcmp(call, "register") == 0) {
    int64_t shape[2] = {4, 8}, id = -1;
    uint64_t addrs[2] = {(uint64_t)(uintptr_t)extra[0], (uint64_t)(uintptr_t)extra[1]};
    size_t count = 2;
    if (strcmp(tok[3], "none") == 0) count = 0;
    if (strcmp(tok[3], "one") == 0) count = 1;
    if (strcmp(tok[3], "zero") == 0) addrs[1] = 0;
    hixl_dd_cache_desc d = {HIXL_DD_PLACEMENT_HOST, 2, 3, shape, 2};
    st = hixl_dd_register_cache(me, &d, addrs, count, &id);
  } else if (strcmp(call, "unregister") == 0) {
    st = hixl_dd_unregister_cache(me, num(tok[3]));
  } else if (strcmp(call, "link") == 0 || strcmp(call, "unlink") == 0) {
    hixl_dd_ip_info ip;
    hixl_dd_cluster_info c = peer_cluster((uint64_t)num(tok[3]), (int)num(tok[5]), &ip);
    uint32_t ret = 0;
    int32_t t = (int32_t)num(tok[4]);
    st = call[0] == 'l' ? hixl_dd_link_clusters(me, &c, 1, t, &ret)
                        : hixl_dd_unlink_clusters(me, &c, 1, t, false, &ret);
  }
  hixl_dd_destroy(me);
  return st;
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s ENGINE_PEER PEER_REGION DD_PEER_IP DD_PEER_PORT\n", argv[0]);
    return 2;
  }
  engine_peer = argv[1];
  peer_region = (uintptr_t)strtoull(argv[2], NULL, 10);
  dd_ip = argv[3];
  dd_port = (uint16_t)num(argv[4]);
  char line[4096];
  while (fgets(line, sizeof line, stdin)) {
    char *tok[MAX_TOK];
    int n = 0;
    for (char *t = strtok(line, " \n"); t && n < MAX_TOK; t = strtok(NULL, " \n")) tok[n++] = t;
    if (n < 3) {
      printf("BAD a line of %d words\n", n);
    } else if (strcmp(tok[0], "engine") == 0) {
      printf("STATUS %u\n", engine_case(tok, n));
    } else if (strcmp(tok[0], "dd") == 0) {
      printf("STATUS %u\n", dd_case(tok, n));
    } else if (strcmp(tok[0], "cs") == 0) {
      printf("STATUS %u\n", cs_case(tok, n));
    } else {
      printf("BAD product %s\n", tok[0]);
    }
    fflush(stdout);
  }
  return 0;
}
