/* Two-process test of libhixl.so through include/hixl_c.h (driven by tests/c_abi.rs).
 *
 *   capi_test server SIZE [MEMORY]  serves SIZE bytes of pattern(), in its own memory (MEMORY
 *                                   `caller`, the default) or in memory the engine allocated
 *                                   (`engine`: hixl_alloc_host_mem); prints READY <name> <addr>
 *                                   <len>, then answers `sum OFF LEN`, `notifies`, `quit`
 *   capi_test client NAME ADDR LEN  every call against that server, with its exact status;
 *                                   prints WROTE <remote off> <len> <fnv1a> for the data it
 *                                   wrote, then PASS
 */
#include "hixl_c.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* HIXL's layouts on LP64 (its hixl_types.h) */
#if UINTPTR_MAX == UINT64_MAX && SIZE_MAX == UINT64_MAX
_Static_assert(sizeof(hixl_mem_desc) == 144, "MemDesc: 144 bytes");
_Static_assert(offsetof(hixl_mem_desc, len) == 8 && offsetof(hixl_mem_desc, reserved) == 16,
               "MemDesc: addr, len, reserved[128]");
_Static_assert(sizeof(hixl_transfer_op_desc) == 24, "TransferOpDesc");
_Static_assert(sizeof(hixl_transfer_args) == 128, "TransferArgs");
_Static_assert(sizeof(hixl_get_transfer_status_args) == 128 &&
                   offsetof(hixl_get_transfer_status_args, reserved) == 5,
               "GetTransferStatusArgs");
_Static_assert(sizeof(hixl_transfer_result) == 128 && offsetof(hixl_transfer_result, status) == 16,
               "TransferResult");
#endif

static int failures = 0;

#define EXPECT(call, want)                                                                  \
  do {                                                                                      \
    hixl_status got_ = (call);                                                              \
    if (got_ != (want)) {                                                                   \
      fprintf(stderr, "line %d: %s = %u, expected %u (%s)\n", __LINE__, #call, got_,        \
              (unsigned)(want), hixl_last_error_message());                                 \
      failures++;                                                                           \
    }                                                                                       \
  } while (0)

#define CHECK(cond)                                                                         \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      fprintf(stderr, "line %d: %s is false\n", __LINE__, #cond);                           \
      failures++;                                                                           \
    }                                                                                       \
  } while (0)

static unsigned char pattern(size_t i) { return (unsigned char)((i * 131u + 7u) & 0xffu); }

static uint64_t fnv1a(const unsigned char *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

static uint64_t rng_state;
static unsigned char rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (unsigned char)(rng_state >> 24);
}

static int server(size_t size, int engine_memory) {
  hixl_engine *e = NULL;
  EXPECT(hixl_create(&e), HIXL_SUCCESS);
  EXPECT(hixl_initialize(e, "127.0.0.1:0", NULL, NULL, 0), HIXL_SUCCESS);
  unsigned char *mem = NULL;
  hixl_mem_handle h = NULL;
  if (engine_memory) {
    void *p = NULL;
    EXPECT(hixl_alloc_host_mem(e, size, &p, &h), HIXL_SUCCESS);
    if (p == NULL) return 1;
    mem = p;
    CHECK((uintptr_t)mem % 4096 == 0);
    int zero = 1;
    for (size_t i = 0; i < size; i++) zero &= mem[i] == 0;
    CHECK(zero);
  } else {
    mem = malloc(size);
    hixl_mem_desc d;
    memset(&d, 0, sizeof d);
    d.addr = (uintptr_t)mem;
    d.len = size;
    EXPECT(hixl_register_mem(e, &d, HIXL_MEM_HOST, &h), HIXL_SUCCESS);
  }
  CHECK(h != NULL);
  for (size_t i = 0; i < size; i++) mem[i] = pattern(i);
  char name[128];
  size_t len = 0;
  EXPECT(hixl_local_engine(e, name, sizeof name, &len), HIXL_SUCCESS);
  if (failures) return 1;
  printf("READY %s %lu %lu\n", name, (unsigned long)(uintptr_t)mem, (unsigned long)size);
  fflush(stdout);
  char line[256];
  while (fgets(line, sizeof line, stdin)) {
    unsigned long off, n;
    if (sscanf(line, "sum %lu %lu", &off, &n) == 2 && off + n <= size) {
      printf("SUM %016llx\n", (unsigned long long)fnv1a(mem + off, n));
    } else if (strncmp(line, "notifies", 8) == 0) {
      hixl_list *l = NULL;
      EXPECT(hixl_get_notifies(e, &l), HIXL_SUCCESS);
      for (size_t i = 0; i < hixl_list_len(l); i++) {
        const char *nm = NULL, *msg = NULL;
        EXPECT(hixl_list_notify(l, i, &nm, &msg), HIXL_SUCCESS);
        printf("NOTIFY %s %s\n", nm, msg);
      }
      hixl_list_free(l);
      printf("END\n");
    } else if (strncmp(line, "quit", 4) == 0) {
      break;
    } else {
      printf("ERR %s", line);
    }
    fflush(stdout);
  }
  EXPECT(hixl_deregister_mem(e, h), HIXL_SUCCESS);
  EXPECT(hixl_deregister_mem(e, h), HIXL_SUCCESS); /* already deregistered: no effect (HIXL) */
  EXPECT(hixl_deregister_mem(e, NULL), HIXL_PARAM_INVALID);
  EXPECT(hixl_finalize(e), HIXL_SUCCESS);
  hixl_destroy(e);
  if (!engine_memory) free(mem); /* engine memory is the engine's: freed by it */
  return failures ? 1 : 0;
}

static hixl_transfer_op_desc desc(const unsigned char *local, size_t loff, uintptr_t remote,
                                  size_t roff, size_t len) {
  hixl_transfer_op_desc d = {(uintptr_t)(local + loff), remote + roff, len};
  return d;
}

/* hixl_register_mem_ex: a local-only region is usable by its own engine's transfers and refused
 * to a peer's (PARAM_INVALID: it is not in the table the peer got), in both directions. */
static void local_only(void) {
  const size_t size = 1 << 16;
  unsigned char *pub = malloc(size), *priv = malloc(size), *mine = calloc(size, 1);
  for (size_t i = 0; i < size; i++) {
    pub[i] = pattern(i);
    priv[i] = 0xee;
  }
  hixl_engine *srv = NULL, *cli = NULL;
  EXPECT(hixl_create(&srv), HIXL_SUCCESS);
  EXPECT(hixl_create(&cli), HIXL_SUCCESS);
  EXPECT(hixl_initialize(srv, "127.0.0.1:0", NULL, NULL, 0), HIXL_SUCCESS);
  EXPECT(hixl_initialize(cli, "127.0.0.1", NULL, NULL, 0), HIXL_SUCCESS);
  hixl_mem_desc d;
  memset(&d, 0, sizeof d);
  hixl_mem_handle hp = NULL, hq = NULL, hm = NULL;
  d.addr = (uintptr_t)priv;
  d.len = size;
  EXPECT(hixl_register_mem_ex(srv, &d, HIXL_MEM_HOST, 0x2u, &hq), HIXL_PARAM_INVALID);
  EXPECT(hixl_register_mem_ex(srv, &d, HIXL_MEM_HOST, HIXL_REGISTER_LOCAL_ONLY, NULL),
         HIXL_PARAM_INVALID);
  EXPECT(hixl_register_mem_ex(srv, &d, HIXL_MEM_HOST, HIXL_REGISTER_LOCAL_ONLY, &hq), HIXL_SUCCESS);
  CHECK(hq != NULL);
  d.addr = (uintptr_t)pub;
  EXPECT(hixl_register_mem_ex(srv, &d, HIXL_MEM_HOST, 0, &hp), HIXL_SUCCESS);
  d.addr = (uintptr_t)mine;
  EXPECT(hixl_register_mem_ex(cli, &d, HIXL_MEM_HOST, HIXL_REGISTER_LOCAL_ONLY, &hm), HIXL_SUCCESS);
  char name[128];
  EXPECT(hixl_local_engine(srv, name, sizeof name, NULL), HIXL_SUCCESS);
  EXPECT(hixl_connect(cli, name, 1000), HIXL_SUCCESS);
  /* the client's local-only region as the local side: fine */
  hixl_transfer_op_desc ok = desc(mine, 0, (uintptr_t)pub, 100, 4000);
  EXPECT(hixl_transfer_sync(cli, name, HIXL_READ, &ok, 1, 1000), HIXL_SUCCESS);
  int same = 1;
  for (size_t i = 0; i < 4000; i++) same &= mine[i] == pattern(100 + i);
  CHECK(same);
  /* the server's local-only region as the remote side: refused both ways, untouched */
  hixl_transfer_op_desc no = desc(mine, 0, (uintptr_t)priv, 0, 64);
  EXPECT(hixl_transfer_sync(cli, name, HIXL_READ, &no, 1, 1000), HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_sync(cli, name, HIXL_WRITE, &no, 1, 1000), HIXL_PARAM_INVALID);
  same = 1;
  for (size_t i = 0; i < size; i++) same &= priv[i] == 0xee;
  CHECK(same);
  EXPECT(hixl_disconnect(cli, name, 1000), HIXL_SUCCESS);
  hixl_destroy(cli);
  hixl_destroy(srv);
  free(pub);
  free(priv);
  free(mine);
}

/* hixl_alloc_host_mem with two engines in this process: random data moved both ways between
 * engine-allocated buffers (over the same-host path where the kernel allows it), the statuses
 * of bad input, and deregistration while linked. */
static void engine_memory(void) {
  const size_t size = 1 << 20;
  hixl_engine *srv = NULL, *cli = NULL;
  void *p = NULL;
  hixl_mem_handle hs = NULL, hc = NULL;
  EXPECT(hixl_create(&srv), HIXL_SUCCESS);
  EXPECT(hixl_create(&cli), HIXL_SUCCESS);
  EXPECT(hixl_alloc_host_mem(srv, size, &p, &hs), HIXL_FAILED); /* not initialized */
  EXPECT(hixl_alloc_host_mem((hixl_engine *)(uintptr_t)0x1234, size, &p, &hs), HIXL_PARAM_INVALID);
  EXPECT(hixl_alloc_host_mem(NULL, size, &p, &hs), HIXL_PARAM_INVALID);
  EXPECT(hixl_initialize(srv, "127.0.0.1:0", NULL, NULL, 0), HIXL_SUCCESS);
  EXPECT(hixl_initialize(cli, "127.0.0.1", NULL, NULL, 0), HIXL_SUCCESS);
  EXPECT(hixl_alloc_host_mem(srv, 0, &p, &hs), HIXL_PARAM_INVALID);
  EXPECT(hixl_alloc_host_mem(srv, size, NULL, &hs), HIXL_PARAM_INVALID);
  EXPECT(hixl_alloc_host_mem(srv, size, &p, NULL), HIXL_PARAM_INVALID);
  EXPECT(hixl_alloc_host_mem(srv, SIZE_MAX, &p, &hs), HIXL_RESOURCE_EXHAUSTED);
  CHECK(p == NULL && hs == NULL); /* nothing written on failure */
  EXPECT(hixl_alloc_host_mem(srv, size, &p, &hs), HIXL_SUCCESS);
  unsigned char *kv = p;
  p = NULL;
  EXPECT(hixl_alloc_host_mem(cli, size, &p, &hc), HIXL_SUCCESS);
  unsigned char *mine = p;
  if (kv == NULL || mine == NULL) return;
  CHECK(hs != NULL && hc != NULL);
  char name[128];
  EXPECT(hixl_local_engine(srv, name, sizeof name, NULL), HIXL_SUCCESS);
  EXPECT(hixl_connect(cli, name, 1000), HIXL_SUCCESS);
  /* WRITE random bytes at odd offsets, READ them back elsewhere, compare in both buffers */
  for (size_t i = 0; i < size / 2; i++) mine[i] = rnd();
  hixl_transfer_op_desc w[2] = {desc(mine, 3, (uintptr_t)kv, 4099, 70001),
                                desc(mine, 100000, (uintptr_t)kv, 300001, 200003)};
  EXPECT(hixl_transfer_sync(cli, name, HIXL_WRITE, w, 2, 1000), HIXL_SUCCESS);
  CHECK(memcmp(kv + 4099, mine + 3, 70001) == 0);
  CHECK(memcmp(kv + 300001, mine + 100000, 200003) == 0);
  hixl_transfer_op_desc r = desc(mine, size / 2, (uintptr_t)kv, 300001, 200003);
  EXPECT(hixl_transfer_sync(cli, name, HIXL_READ, &r, 1, 1000), HIXL_SUCCESS);
  CHECK(memcmp(mine + size / 2, mine + 100000, 200003) == 0);
  /* ranges are checked against the buffers like any region */
  hixl_transfer_op_desc bad = desc(mine, size - 8, (uintptr_t)kv, 0, 64);
  EXPECT(hixl_transfer_sync(cli, name, HIXL_WRITE, &bad, 1, 1000), HIXL_PARAM_INVALID);
  bad = desc(mine, 0, (uintptr_t)kv, size - 8, 64);
  EXPECT(hixl_transfer_sync(cli, name, HIXL_READ, &bad, 1, 1000), HIXL_PARAM_INVALID);
  /* freed while linked: fine; the client's own buffer is then no longer a local region */
  EXPECT(hixl_deregister_mem(srv, hs), HIXL_SUCCESS);
  EXPECT(hixl_deregister_mem(srv, hs), HIXL_SUCCESS); /* no effect */
  EXPECT(hixl_deregister_mem(cli, hc), HIXL_SUCCESS);
  hixl_transfer_op_desc gone = desc(mine, 0, (uintptr_t)kv, 0, 64);
  EXPECT(hixl_transfer_sync(cli, name, HIXL_WRITE, &gone, 1, 1000), HIXL_PARAM_INVALID);
  /* another buffer while linked, freed by finalize */
  EXPECT(hixl_alloc_host_mem(cli, 4096, &p, &hc), HIXL_SUCCESS);
  EXPECT(hixl_disconnect(cli, name, 1000), HIXL_SUCCESS);
  EXPECT(hixl_finalize(cli), HIXL_SUCCESS);
  EXPECT(hixl_alloc_host_mem(cli, 4096, &p, &hc), HIXL_FAILED);
  hixl_destroy(cli);
  hixl_destroy(srv);
}

/* Block-indexed transfers (hixl_transfer_blocks_*, beyond HIXL): 16 random 4 KiB blocks
 * written into the server's region at 640 KiB in reverse order (printed as one WROTE range the
 * parent checks), read back with 64-bit indices and async, compared; every bad input's exact
 * status. */
static void blocks(hixl_engine *e, const char *name, uintptr_t raddr, size_t rlen,
                   unsigned char *mem) {
  enum { B = 4096, N = 16 };
  unsigned char *src = mem + 900000, *back = mem + 900000 + N * B;
  for (size_t i = 0; i < N * B; i++) src[i] = rnd();
  uint32_t li[N], ri[N];
  uint64_t li64[N], ri64[N];
  for (uint32_t k = 0; k < N; k++) {
    li[k] = k;
    ri[k] = N - 1 - k;
    li64[k] = k;
    ri64[k] = N - 1 - k;
  }
  hixl_block_desc bd;
  memset(&bd, 0, sizeof bd);
  bd.local_addr = (uintptr_t)src;
  bd.remote_addr = raddr + 655360;
  bd.block_size = B; /* strides 0: back to back */
  EXPECT(hixl_transfer_blocks_sync(e, name, HIXL_WRITE, &bd, li, ri, N, HIXL_INDEX_U32, 1000),
         HIXL_SUCCESS);
  static unsigned char expect[N * B];
  for (int k = 0; k < N; k++) memcpy(expect + (N - 1 - k) * B, src + k * B, B);
  printf("WROTE %lu %lu %016llx\n", 655360ul, (unsigned long)(N * B),
         (unsigned long long)fnv1a(expect, N * B));
  /* READ back into `back` with 64-bit indices: the same blocks, the same order */
  memset(back, 0, N * B);
  bd.local_addr = (uintptr_t)back;
  EXPECT(hixl_transfer_blocks_sync(e, name, HIXL_READ, &bd, li64, ri64, N, HIXL_INDEX_U64, 1000),
         HIXL_SUCCESS);
  CHECK(memcmp(back, src, N * B) == 0);
  /* async READ with a gap: every other local block (local stride 2 blocks), then compare */
  memset(back, 0, N * B);
  bd.local_stride = 2 * B;
  hixl_transfer_req req = NULL;
  EXPECT(hixl_transfer_blocks_async(e, name, HIXL_READ, &bd, li, ri, N / 2, HIXL_INDEX_U32, NULL,
                                    &req),
         HIXL_SUCCESS);
  int32_t st = HIXL_TRANSFER_WAITING;
  time_t until = time(NULL) + 30;
  while (st == HIXL_TRANSFER_WAITING && time(NULL) < until)
    EXPECT(hixl_get_transfer_status(e, req, &st), HIXL_SUCCESS);
  CHECK(st == HIXL_TRANSFER_COMPLETED);
  for (int k = 0; k < N / 2; k++) CHECK(memcmp(back + 2 * k * B, src + k * B, B) == 0);
  bd.local_stride = 0;
  /* bad inputs */
  EXPECT(hixl_transfer_blocks_sync(e, name, HIXL_READ, NULL, li, ri, N, HIXL_INDEX_U32, 1000),
         HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_blocks_sync(e, name, HIXL_READ, &bd, li, ri, N, 3, 1000),
         HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_blocks_sync(e, name, HIXL_READ, &bd, li, ri, 0, HIXL_INDEX_U32, 1000),
         HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_blocks_sync(e, name, HIXL_READ, &bd, NULL, ri, N, HIXL_INDEX_U32, 1000),
         HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_blocks_sync(e, name, 9, &bd, li, ri, N, HIXL_INDEX_U32, 1000),
         HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_blocks_sync(e, name, HIXL_READ, &bd, li, ri, N, HIXL_INDEX_U32, 0),
         HIXL_PARAM_INVALID);
  /* misaligned 64-bit indices */
  EXPECT(hixl_transfer_blocks_sync(e, name, HIXL_READ, &bd, (const char *)li64 + 4, ri64, 1,
                                   HIXL_INDEX_U64, 1000),
         HIXL_PARAM_INVALID);
  hixl_block_desc bad = bd;
  bad.block_size = 0;
  EXPECT(hixl_transfer_blocks_sync(e, name, HIXL_READ, &bad, li, ri, N, HIXL_INDEX_U32, 1000),
         HIXL_PARAM_INVALID);
  bad = bd;
  bad.remote_stride = B / 2; /* below the block */
  EXPECT(hixl_transfer_blocks_sync(e, name, HIXL_READ, &bad, li, ri, N, HIXL_INDEX_U32, 1000),
         HIXL_PARAM_INVALID);
  bad = bd;
  bad.remote_addr = raddr + rlen + 4096; /* in no region of the peer */
  EXPECT(hixl_transfer_blocks_sync(e, name, HIXL_READ, &bad, li, ri, N, HIXL_INDEX_U32, 1000),
         HIXL_PARAM_INVALID);
  bad = bd;
  bad.local_addr = (uintptr_t)&bad; /* in no registered region */
  EXPECT(hixl_transfer_blocks_sync(e, name, HIXL_READ, &bad, li, ri, N, HIXL_INDEX_U32, 1000),
         HIXL_PARAM_INVALID);
  /* the largest remote index leaves the region (its last block is 1 MiB - 640 KiB in) */
  uint32_t far[2] = {0, (uint32_t)((rlen - 655360) / B)};
  EXPECT(hixl_transfer_blocks_sync(e, name, HIXL_READ, &bd, li, far, 2, HIXL_INDEX_U32, 1000),
         HIXL_PARAM_INVALID);
  CHECK(strstr(hixl_last_error_message(), "remote block index") != NULL);
  far[1] -= 1; /* the last block that fits */
  EXPECT(hixl_transfer_blocks_sync(e, name, HIXL_READ, &bd, li, far, 2, HIXL_INDEX_U32, 1000),
         HIXL_SUCCESS);
  uint64_t huge[1] = {UINT64_MAX / 2}; /* index x stride overflows */
  EXPECT(hixl_transfer_blocks_sync(e, name, HIXL_READ, &bd, li64, huge, 1, HIXL_INDEX_U64, 1000),
         HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_blocks_async(e, name, HIXL_READ, &bad, li, ri, N, HIXL_INDEX_U32, NULL,
                                    &req),
         HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_blocks_async(e, name, HIXL_READ, &bd, li, ri, N, HIXL_INDEX_U32, NULL,
                                    NULL),
         HIXL_PARAM_INVALID);
}

static int client(const char *name, uintptr_t raddr, size_t rlen) {
  const size_t size = 1 << 20;
  rng_state = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ 0x9e3779b97f4a7c15ull;
  unsigned char *mem = calloc(size, 1);
  unsigned char *other = calloc(4096, 1);

  local_only();
  engine_memory();

  /* handles and pointers */
  EXPECT(hixl_create(NULL), HIXL_PARAM_INVALID);
  hixl_engine *bogus = (hixl_engine *)(uintptr_t)0x1234;
  EXPECT(hixl_initialize(bogus, "127.0.0.1", NULL, NULL, 0), HIXL_PARAM_INVALID);
  EXPECT(hixl_initialize(NULL, "127.0.0.1", NULL, NULL, 0), HIXL_PARAM_INVALID);
  CHECK(strlen(hixl_last_error_message()) > 0);
  hixl_engine *e = NULL;
  EXPECT(hixl_create(&e), HIXL_SUCCESS);
  CHECK(e != NULL);
  EXPECT(hixl_connect(e, name, 1000), HIXL_FAILED); /* not initialized */
  EXPECT(hixl_initialize(e, NULL, NULL, NULL, 0), HIXL_PARAM_INVALID);
  EXPECT(hixl_initialize(e, "\xff\xfe", NULL, NULL, 0), HIXL_PARAM_INVALID);
  EXPECT(hixl_initialize(e, "127.0.0.1", NULL, NULL, 1), HIXL_PARAM_INVALID);
  const char *badk[] = {"NoSuchKey"}, *badv[] = {"1"};
  EXPECT(hixl_initialize(e, "127.0.0.1", badk, badv, 1), HIXL_PARAM_INVALID);
  const char *k[] = {HIXL_OPTION_AUTO_CONNECT}, *v[] = {"0"};
  EXPECT(hixl_initialize(e, "127.0.0.1", k, v, 1), HIXL_SUCCESS);
  EXPECT(hixl_initialize(e, "127.0.0.1", NULL, NULL, 0), HIXL_FAILED);

  /* memory */
  hixl_mem_desc md;
  memset(&md, 0, sizeof md);
  md.addr = (uintptr_t)mem;
  md.len = size;
  hixl_mem_handle h = NULL;
  EXPECT(hixl_register_mem(e, NULL, HIXL_MEM_HOST, &h), HIXL_PARAM_INVALID);
  EXPECT(hixl_register_mem(e, &md, 7, &h), HIXL_PARAM_INVALID);
  EXPECT(hixl_register_mem(e, &md, HIXL_MEM_HOST, NULL), HIXL_PARAM_INVALID);
  EXPECT(hixl_register_mem(e, &md, HIXL_MEM_DEVICE, &h), HIXL_UNSUPPORTED);
  EXPECT(hixl_register_mem(e, &md, HIXL_MEM_HOST, &h), HIXL_SUCCESS);
  CHECK(h != NULL);
  EXPECT(hixl_register_mem(e, &md, HIXL_MEM_HOST, &h), HIXL_PARAM_INVALID); /* overlap */

  /* links */
  hixl_transfer_op_desc d1 = desc(mem, 0, raddr, 0, 64);
  EXPECT(hixl_transfer_sync(e, name, HIXL_WRITE, &d1, 1, 1000), HIXL_NOT_CONNECTED);
  EXPECT(hixl_connect(e, name, 0), HIXL_PARAM_INVALID);
  EXPECT(hixl_connect(e, "\xc3\x28", 1000), HIXL_PARAM_INVALID);
  EXPECT(hixl_connect(e, NULL, 1000), HIXL_PARAM_INVALID);
  EXPECT(hixl_connect(e, name, 1000), HIXL_SUCCESS);
  EXPECT(hixl_connect(e, name, 1000), HIXL_ALREADY_CONNECTED);
  int32_t cs = -1;
  EXPECT(hixl_get_async_connect_status(e, name, &cs), HIXL_SUCCESS);
  CHECK(cs == HIXL_CONNECTED);
  EXPECT(hixl_get_async_connect_status(e, name, NULL), HIXL_PARAM_INVALID);
  hixl_list *all = NULL;
  EXPECT(hixl_get_all_async_connect_status(e, &all), HIXL_SUCCESS);
  CHECK(hixl_list_len(all) == 1);
  const char *rn = NULL;
  EXPECT(hixl_list_connect_status(all, 0, &rn, &cs), HIXL_SUCCESS);
  CHECK(rn != NULL && strcmp(rn, name) == 0 && cs == HIXL_CONNECTED);
  EXPECT(hixl_list_connect_status(all, 1, &rn, &cs), HIXL_PARAM_INVALID);
  EXPECT(hixl_list_notify(all, 0, &rn, &rn), HIXL_PARAM_INVALID);
  hixl_list_free(all);
  /* registration while linked works, as in HIXL (the same range again still overlaps) */
  hixl_mem_handle h2 = NULL;
  EXPECT(hixl_register_mem(e, &md, HIXL_MEM_HOST, &h2), HIXL_PARAM_INVALID);
  hixl_mem_desc od;
  memset(&od, 0, sizeof od);
  od.addr = (uintptr_t)other;
  od.len = 64;
  EXPECT(hixl_register_mem(e, &od, HIXL_MEM_HOST, &h2), HIXL_SUCCESS);
  CHECK(h2 != NULL && h2 != h);
  EXPECT(hixl_deregister_mem(e, h2), HIXL_SUCCESS);
  EXPECT(hixl_deregister_mem(e, h2), HIXL_SUCCESS); /* unknown handles: no effect (HIXL) */
  EXPECT(hixl_deregister_mem(e, (hixl_mem_handle)(uintptr_t)0xbad), HIXL_SUCCESS);

  /* bad transfers */
  EXPECT(hixl_transfer_sync(e, name, 5, &d1, 1, 1000), HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_sync(e, name, HIXL_WRITE, NULL, 2, 1000), HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_sync(e, name, HIXL_WRITE, &d1, SIZE_MAX, 1000), HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_sync(e, name, HIXL_WRITE, &d1, 0, 1000), HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_sync(e, name, HIXL_WRITE, &d1, 1, 0), HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_sync(e, "\xff", HIXL_WRITE, &d1, 1, 1000), HIXL_PARAM_INVALID);
  hixl_transfer_op_desc bad = desc(other, 0, raddr, 0, 64); /* unregistered local */
  EXPECT(hixl_transfer_sync(e, name, HIXL_WRITE, &bad, 1, 1000), HIXL_PARAM_INVALID);
  bad = desc(mem, size - 8, raddr, 0, 64); /* leaves the local region */
  EXPECT(hixl_transfer_sync(e, name, HIXL_WRITE, &bad, 1, 1000), HIXL_PARAM_INVALID);
  bad = desc(mem, 0, raddr, rlen - 8, 64); /* leaves the remote region */
  EXPECT(hixl_transfer_sync(e, name, HIXL_READ, &bad, 1, 1000), HIXL_PARAM_INVALID);
  bad = desc(mem, 0, raddr + rlen + 4096, 0, 64); /* not in the peer's table */
  EXPECT(hixl_transfer_sync(e, name, HIXL_READ, &bad, 1, 1000), HIXL_PARAM_INVALID);
  hixl_transfer_req req = NULL;
  EXPECT(hixl_transfer_async(e, name, HIXL_WRITE, &bad, 1, NULL, &req), HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_async(e, name, HIXL_WRITE, &d1, 1, NULL, NULL), HIXL_PARAM_INVALID);

  /* WRITE random data at odd offsets, then READ it back elsewhere */
  for (size_t i = 0; i < 200000; i++) mem[i] = rnd();
  hixl_transfer_op_desc w[3] = {desc(mem, 1, raddr, 3, 4097), desc(mem, 5000, raddr, 9001, 65537),
                                desc(mem, 80001, raddr, 200003, 999)};
  EXPECT(hixl_transfer_sync(e, name, HIXL_WRITE, w, 3, 1000), HIXL_SUCCESS);
  for (int i = 0; i < 3; i++) {
    printf("WROTE %lu %lu %016llx\n", (unsigned long)(w[i].remote_addr - raddr),
           (unsigned long)w[i].len,
           (unsigned long long)fnv1a((const unsigned char *)w[i].local_addr, w[i].len));
  }
  hixl_transfer_op_desc r[3];
  for (int i = 0; i < 3; i++) {
    r[i] = w[i];
    r[i].local_addr += 300000;
  }
  EXPECT(hixl_transfer_sync(e, name, HIXL_READ, r, 3, 1000), HIXL_SUCCESS);
  for (int i = 0; i < 3; i++)
    CHECK(memcmp((void *)r[i].local_addr, (void *)w[i].local_addr, w[i].len) == 0);
  /* READ the server's untouched pattern */
  hixl_transfer_op_desc p = desc(mem, 600001, raddr, 300007, 7777);
  EXPECT(hixl_transfer_sync(e, name, HIXL_READ, &p, 1, 1000), HIXL_SUCCESS);
  int same = 1;
  for (size_t i = 0; i < 7777; i++) same &= mem[600001 + i] == pattern(300007 + i);
  CHECK(same);

  /* async, polled one by one */
  for (size_t i = 0; i < 3000; i++) mem[700001 + i] = rnd();
  hixl_transfer_op_desc a = desc(mem, 700001, raddr, 400001, 3000);
  hixl_transfer_args args;
  memset(&args, 0, sizeof args);
  args.user_data = (const void *)(uintptr_t)0x77;
  EXPECT(hixl_transfer_async(e, name, HIXL_WRITE, &a, 1, &args, &req), HIXL_SUCCESS);
  CHECK(req != NULL);
  int32_t st = HIXL_TRANSFER_WAITING;
  time_t until = time(NULL) + 30;
  while (st == HIXL_TRANSFER_WAITING && time(NULL) < until)
    EXPECT(hixl_get_transfer_status(e, req, &st), HIXL_SUCCESS);
  CHECK(st == HIXL_TRANSFER_COMPLETED);
  printf("WROTE %lu %lu %016llx\n", 400001ul, 3000ul, (unsigned long long)fnv1a(mem + 700001, 3000));
  EXPECT(hixl_get_transfer_status(e, req, &st), HIXL_PARAM_INVALID); /* reported: released */
  CHECK(st == HIXL_TRANSFER_FAILED);
  EXPECT(hixl_get_transfer_status(e, (hixl_transfer_req)(uintptr_t)0xdead, &st),
         HIXL_PARAM_INVALID);
  EXPECT(hixl_get_transfer_status(e, NULL, &st), HIXL_FAILED); /* HIXL: a null request */
  EXPECT(hixl_get_transfer_status(e, req, NULL), HIXL_PARAM_INVALID);

  /* async, polled many at once */
  hixl_transfer_req reqs[3];
  for (int i = 0; i < 3; i++) {
    hixl_transfer_op_desc rd = desc(mem, 800000 + 1000 * i, raddr, 500000 + 1000 * i, 1000);
    args.user_data = (const void *)(uintptr_t)(100 + i);
    EXPECT(hixl_transfer_async(e, name, HIXL_READ, &rd, 1, &args, &reqs[i]), HIXL_SUCCESS);
  }
  size_t pending = 0;
  EXPECT(hixl_pending_transfers(e, &pending), HIXL_SUCCESS);
  CHECK(pending == 3);
  hixl_get_transfer_status_args qa;
  memset(&qa, 0, sizeof qa);
  qa.max_query_count = 1;
  qa.skip_waiting = true;
  hixl_transfer_result res[4];
  int seen = 0, tagged = 0;
  until = time(NULL) + 30;
  while (seen < 3 && time(NULL) < until) {
    size_t n = 99;
    EXPECT(hixl_get_transfer_statuses(e, &qa, res, 4, &n), HIXL_SUCCESS);
    CHECK(n <= 1);
    for (size_t i = 0; i < n && i < 1; i++) {
      CHECK(res[i].status == HIXL_TRANSFER_COMPLETED);
      for (int j = 0; j < 3; j++)
        if (res[i].req == reqs[j] && (uintptr_t)res[i].user_data == (uintptr_t)(100 + j)) tagged++;
      seen++;
    }
  }
  CHECK(seen == 3 && tagged == 3);
  same = 1;
  for (size_t i = 0; i < 3000; i++) same &= mem[800000 + i] == pattern(500000 + i);
  CHECK(same);
  /* extensions: a request with its own deadline, waited for; cancel and wait's bad input */
  for (size_t i = 0; i < 2000; i++) mem[810000 + i] = rnd();
  hixl_transfer_op_desc within = desc(mem, 810000, raddr, 510000, 2000);
  EXPECT(hixl_transfer_async_within(e, name, HIXL_READ, &within, 1, NULL, 0, &req), HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_async_within(e, name, HIXL_READ, &within, 1, NULL, 30000, NULL),
         HIXL_PARAM_INVALID);
  EXPECT(hixl_transfer_async_within(e, name, HIXL_READ, &within, 1, NULL, 30000, &req), HIXL_SUCCESS);
  EXPECT(hixl_wait_transfer(e, req, -1, &st), HIXL_PARAM_INVALID);
  EXPECT(hixl_wait_transfer(e, req, 30000, NULL), HIXL_PARAM_INVALID);
  EXPECT(hixl_wait_transfer(e, req, 30000, &st), HIXL_SUCCESS);
  CHECK(st == HIXL_TRANSFER_COMPLETED);
  same = 1;
  for (size_t i = 0; i < 2000; i++) same &= mem[810000 + i] == pattern(510000 + i);
  CHECK(same);
  EXPECT(hixl_wait_transfer(e, req, 0, &st), HIXL_PARAM_INVALID); /* reported: released */
  CHECK(st == HIXL_TRANSFER_FAILED);
  EXPECT(hixl_cancel_transfer(e, req), HIXL_PARAM_INVALID);
  EXPECT(hixl_cancel_transfer(e, (hixl_transfer_req)(uintptr_t)0xdead), HIXL_PARAM_INVALID);

  size_t n = 5;
  EXPECT(hixl_get_transfer_statuses(e, NULL, res, 4, &n), HIXL_SUCCESS);
  CHECK(n == 0);
  EXPECT(hixl_get_transfer_statuses(e, NULL, NULL, 4, &n), HIXL_PARAM_INVALID);
  EXPECT(hixl_get_transfer_statuses(e, NULL, res, 4, NULL), HIXL_PARAM_INVALID);

  /* deregistering memory an async READ is writing: refused until the request ended, so the
   * program may free it once the call succeeds (it returned SUCCESS at once before, and the
   * free below then crashed the process in 5 of 10 runs, ASan: heap-use-after-free) */
  {
    const size_t blen = 8u << 20;
    unsigned char *big = malloc(blen);
    CHECK(big != NULL);
    hixl_mem_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.addr = (uintptr_t)big;
    bd.len = blen;
    hixl_mem_handle bh = NULL;
    EXPECT(hixl_register_mem(e, &bd, HIXL_MEM_HOST, &bh), HIXL_SUCCESS);
    /* the server's region 512 times over, into the same 1 MiB: far longer than the calls */
    enum { N = 512 };
    static hixl_transfer_op_desc many[N];
    for (int i = 0; i < N; i++) many[i] = desc(big, (size_t)(i % 8) << 20, raddr, 0, rlen);
    hixl_transfer_req breq = NULL;
    EXPECT(hixl_transfer_async(e, name, HIXL_READ, many, N, NULL, &breq), HIXL_SUCCESS);
    EXPECT(hixl_deregister_mem(e, bh), HIXL_RESOURCE_EXHAUSTED);
    int32_t bst = HIXL_TRANSFER_WAITING;
    until = time(NULL) + 60;
    while (bst == HIXL_TRANSFER_WAITING && time(NULL) < until)
      EXPECT(hixl_get_transfer_status(e, breq, &bst), HIXL_SUCCESS);
    CHECK(bst == HIXL_TRANSFER_COMPLETED);
    EXPECT(hixl_deregister_mem(e, bh), HIXL_SUCCESS);
    memset(big, 0xa5, blen);
    free(big);
  }

  blocks(e, name, raddr, rlen, mem);

  /* notifications */
  EXPECT(hixl_send_notify(e, name, "kv", "ready", 1000), HIXL_SUCCESS);
  EXPECT(hixl_send_notify(e, name, "kv", NULL, 1000), HIXL_PARAM_INVALID);
  EXPECT(hixl_send_notify(e, name, "kv", "\xff", 1000), HIXL_PARAM_INVALID);
  EXPECT(hixl_get_notifies(e, NULL), HIXL_PARAM_INVALID);

  /* capabilities, names */
  int32_t cap = -1;
  EXPECT(hixl_get_capability(HIXL_AUTO_CONNECT, &cap), HIXL_SUCCESS);
  CHECK(cap == HIXL_FEATURE_SUPPORTED);
  EXPECT(hixl_get_capability(HIXL_CLIENT_SERVER_COMM, &cap), HIXL_SUCCESS);
  CHECK(cap == HIXL_FEATURE_NOT_SUPPORTED);
  EXPECT(hixl_get_capability(99, &cap), HIXL_SUCCESS);
  CHECK(cap == HIXL_FEATURE_NOT_SUPPORTED);
  cap = 7; /* a negative feature is refused (HIXL's check), the value untouched */
  EXPECT(hixl_get_capability(-1, &cap), HIXL_PARAM_INVALID);
  CHECK(cap == 7);
  EXPECT(hixl_get_capability(HIXL_AUTO_CONNECT, NULL), HIXL_PARAM_INVALID);
  char small[4];
  size_t need = 0;
  EXPECT(hixl_local_engine(e, small, sizeof small, &need), HIXL_RESOURCE_EXHAUSTED);
  CHECK(need == strlen("127.0.0.1"));
  /* the size query (NULL, 0) as above; a NULL buffer said to have room is a null pointer */
  need = 0;
  EXPECT(hixl_local_engine(e, NULL, 0, &need), HIXL_RESOURCE_EXHAUSTED);
  CHECK(need == strlen("127.0.0.1"));
  EXPECT(hixl_local_engine(e, NULL, 64, &need), HIXL_PARAM_INVALID);
  CHECK(hixl_list_len(NULL) == 0);
  hixl_list_free(NULL);

  /* teardown */
  EXPECT(hixl_disconnect(e, name, 1000), HIXL_SUCCESS);
  EXPECT(hixl_disconnect(e, name, 1000), HIXL_NOT_CONNECTED);
  EXPECT(hixl_deregister_mem(e, h), HIXL_SUCCESS);
  EXPECT(hixl_deregister_mem(e, h), HIXL_SUCCESS); /* already deregistered: no effect (HIXL) */
  EXPECT(hixl_deregister_mem(e, NULL), HIXL_PARAM_INVALID);
  EXPECT(hixl_finalize(e), HIXL_SUCCESS);
  EXPECT(hixl_finalize(e), HIXL_SUCCESS);
  EXPECT(hixl_connect(e, name, 1000), HIXL_FAILED);
  hixl_destroy(e);
  hixl_destroy(e); /* unknown now: ignored */
  EXPECT(hixl_finalize(e), HIXL_PARAM_INVALID);
  free(mem);
  free(other);
  if (failures) return 1;
  printf("PASS\n");
  return 0;
}

int main(int argc, char **argv) {
  if ((argc == 3 || argc == 4) && strcmp(argv[1], "server") == 0)
    return server(strtoul(argv[2], NULL, 10), argc == 4 && strcmp(argv[3], "engine") == 0);
  if (argc == 5 && strcmp(argv[1], "client") == 0)
    return client(argv[2], (uintptr_t)strtoull(argv[3], NULL, 10), strtoul(argv[4], NULL, 10));
  fprintf(stderr, "usage: capi_test server SIZE [caller|engine] | client NAME ADDR LEN\n");
  return 2;
}
