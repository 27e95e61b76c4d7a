/* Two-process test of HIXL-CS (include/cs/hixl_cs.h) over libcann_hixl.so, driven by
 * tests/cs.rs.
 *
 *   cs_test server SIZE          a HIXL-CS server on 127.0.0.1 at a free port, host memory
 *                                "kv0" (SIZE bytes of pattern(), registered before Listen) and
 *                                "kv1" (SIZE bytes, registered after); bad inputs first; prints
 *                                READY <port> <kv0 addr> <SIZE>, then answers `sum OFF LEN`
 *                                (FNV-1a of kv0's bytes) and `quit`
 *   cs_test client PORT ADDR LEN PID
 *                                a client of that server (PID: its process, stopped with
 *                                SIGSTOP for a while to make a batch time out): every call with
 *                                its exact status, random data moved sync and async and compared;
 *                                prints WROTE <kv0 off> <len> <fnv1a> for what it left in kv0,
 *                                then PASS
 */
#define _POSIX_C_SOURCE 200809L
#include "cs/hixl_cs.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* hixl's own (hixl_c.h, which cannot be included beside hixl_cs.h): the last failure's cause */
const char *hixl_last_error_message(void);

#define RESOURCE_EXHAUSTED 203900u

#ifdef CS_DEVICE
/* built with -DCS_DEVICE -lacl_rt: kv0 and the client's memory are device memory (aclrtMalloc on
 * the ACL/HCCL test double), the endpoints device endpoints. CANN's ACL declarations (ABI only;
 * CI has no CANN headers): */
typedef int aclError;
aclError aclrtSetDevice(int32_t deviceId);
enum { ACL_ERROR_RT_CONTEXT_NULL = 107002 };
aclError aclrtMalloc(void **devPtr, size_t size, int policy); /* aclrtMemMallocPolicy */
aclError aclrtFree(void *devPtr);
aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, int kind);
#define ACL_MEM_MALLOC_HUGE_ONLY 1
#define ACL_MEMCPY_HOST_TO_DEVICE 1
#define ACL_MEMCPY_DEVICE_TO_HOST 2
static int32_t device_id = 0;
#endif

_Static_assert(sizeof(EndpointDesc) == 160, "EndpointDesc");
_Static_assert(sizeof(CommMem) == 24, "CommMem");
_Static_assert(sizeof(HixlClientDesc) == 128, "HixlClientDesc");
_Static_assert(sizeof(HixlServerDesc) == 128, "HixlServerDesc");
_Static_assert(sizeof(HixlServerConfig) == 128 && sizeof(HixlClientConfig) == 128, "configs");
_Static_assert(sizeof(HixlOneSideOpDesc) == 24 && offsetof(HixlOneSideOpDesc, local_buf) == 8,
               "HixlOneSideOpDesc: remote_buf first");

static int failures = 0;

#define EXPECT(call, want)                                                                  \
  do {                                                                                      \
    HixlStatus got_ = (call);                                                               \
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
static void fill_random(unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    p[i] = (unsigned char)(rng_state >> 24);
  }
}

/* a RoCE endpoint on the host at 127.0.0.1 (or `ip`) */
static EndpointDesc endpoint(const char *ip) {
  EndpointDesc e;
  CHECK(EndpointDescInit(&e, 1) == 0);
  e.protocol = COMM_PROTOCOL_ROCE;
  e.commAddr.type = COMM_ADDR_TYPE_IP_V4;
  CHECK(inet_pton(AF_INET, ip, &e.commAddr.addr) == 1);
  e.loc.locType = ENDPOINT_LOC_TYPE_HOST;
  e.loc.host.id = 0;
  return e;
}

/* a port nobody listens on right now (the server retries if it is taken meanwhile) */
static uint32_t free_port(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t l = sizeof a;
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 ||
      getsockname(s, (struct sockaddr *)&a, &l) != 0) {
    perror("free_port");
    exit(1);
  }
  close(s);
  return ntohs(a.sin_port);
}

/* a server listening at a free port, with `ep` as its endpoint; *port gets the port */
static HixlServerHandle listening_server(const EndpointDesc *ep, uint32_t *port) {
  for (int attempt = 0; attempt < 50; attempt++) {
    HixlServerDesc d;
    memset(&d, 0, sizeof d);
    d.endpoint_list = ep;
    d.endpoint_list_num = 1;
    d.server_ip = "127.0.0.1";
    d.server_port = free_port();
    HixlServerConfig c;
    memset(&c, 0, sizeof c);
    HixlServerHandle s = NULL;
    EXPECT(HixlCSServerCreate(&d, &c, &s), HIXL_SUCCESS);
    if (HixlCSServerListen(s, 64) == HIXL_SUCCESS) {
      *port = d.server_port;
      return s;
    }
    EXPECT(HixlCSServerDestroy(s), HIXL_SUCCESS);
  }
  fprintf(stderr, "no free port to listen on\n");
  exit(1);
}

static void server_bad_inputs(void) {
  EndpointDesc ep = endpoint("127.0.0.1");
  HixlServerDesc d;
  memset(&d, 0, sizeof d);
  d.endpoint_list = &ep;
  d.endpoint_list_num = 1;
  d.server_ip = "127.0.0.1";
  d.server_port = 1;
  HixlServerConfig c;
  memset(&c, 0, sizeof c);
  HixlServerHandle s = (HixlServerHandle)1;
  EXPECT(HixlCSServerCreate(NULL, &c, &s), HIXL_PARAM_INVALID);
  CHECK(s == NULL); /* cleared first, as upstream does */
  EXPECT(HixlCSServerCreate(&d, NULL, &s), HIXL_PARAM_INVALID);
  EXPECT(HixlCSServerCreate(&d, &c, NULL), HIXL_PARAM_INVALID);
  d.server_port = 65536;
  EXPECT(HixlCSServerCreate(&d, &c, &s), HIXL_PARAM_INVALID);
  d.server_port = 1;
  d.server_ip = NULL;
  EXPECT(HixlCSServerCreate(&d, &c, &s), HIXL_PARAM_INVALID);
  d.server_ip = "not an address";
  EXPECT(HixlCSServerCreate(&d, &c, &s), HIXL_PARAM_INVALID);
  d.server_ip = "127.0.0.1";
  d.endpoint_list_num = 0;
  EXPECT(HixlCSServerCreate(&d, &c, &s), HIXL_PARAM_INVALID);
  d.endpoint_list_num = 1;
  d.endpoint_list = NULL;
  EXPECT(HixlCSServerCreate(&d, &c, &s), HIXL_PARAM_INVALID);
  d.endpoint_list = &ep;
  c.global_resource_config = "[1, 2]";
  EXPECT(HixlCSServerCreate(&d, &c, &s), HIXL_PARAM_INVALID);
  c.global_resource_config = "{\"comm_resource_config.listen_port\": 0}";
  EXPECT(HixlCSServerCreate(&d, &c, &s), HIXL_PARAM_INVALID);
  c.global_resource_config = "{\"comm_resource_config.max_active_channels\": 16}";
  d.server_port = 0; /* allowed: no port to listen on */
  EXPECT(HixlCSServerCreate(&d, &c, &s), HIXL_SUCCESS);
  EXPECT(HixlCSServerListen(s, 1), HIXL_PARAM_INVALID);

  static unsigned char buf[8192];
  CommMem m = {COMM_MEM_TYPE_HOST, buf, 4096};
  MemHandle h = NULL, h2 = NULL;
  EXPECT(HixlCSServerRegMem(s, "t", NULL, &h), HIXL_PARAM_INVALID);
  EXPECT(HixlCSServerRegMem(s, "t", &m, NULL), HIXL_PARAM_INVALID);
  CommMem zero = {COMM_MEM_TYPE_HOST, buf, 0};
  EXPECT(HixlCSServerRegMem(s, "t", &zero, &h), HIXL_PARAM_INVALID);
  CommMem bad_type = {(CommMemType)7, buf, 16};
  EXPECT(HixlCSServerRegMem(s, "t", &bad_type, &h), HIXL_PARAM_INVALID);
  EXPECT(HixlCSServerRegMem(s, NULL, &m, &h), HIXL_SUCCESS); /* a null tag is "" */
  CommMem over = {COMM_MEM_TYPE_HOST, buf + 100, 4096};
  EXPECT(HixlCSServerRegMem(s, "o", &over, &h2), HIXL_PARAM_INVALID);
  EXPECT(HixlCSServerRegMem((HixlServerHandle)0x42, "t", &m, &h2), HIXL_PARAM_INVALID);
  EXPECT(HixlCSServerUnregMem(s, (MemHandle)0x42), HIXL_PARAM_INVALID);
  EXPECT(HixlCSServerUnregMem(s, h), HIXL_SUCCESS);
  EXPECT(HixlCSServerUnregMem(s, h), HIXL_PARAM_INVALID);
  EXPECT(HixlCSServerDestroy(s), HIXL_SUCCESS);
  /* a destroyed server's handle */
  EXPECT(HixlCSServerDestroy(s), HIXL_PARAM_INVALID);
  EXPECT(HixlCSServerListen(s, 1), HIXL_PARAM_INVALID);
  EXPECT(HixlCSServerRegMem(s, "t", &m, &h), HIXL_PARAM_INVALID);
  EXPECT(HixlCSServerUnregMem(s, h), HIXL_PARAM_INVALID);
}

static int server(size_t size) {
  server_bad_inputs();
  EndpointDesc ep = endpoint("127.0.0.1");
  unsigned char *kv0 = malloc(size), *kv1 = malloc(size);
  for (size_t i = 0; i < size; i++) kv0[i] = pattern(i);
#ifdef CS_DEVICE
  CommMemType kv0_type = COMM_MEM_TYPE_DEVICE;
  ep.loc.locType = ENDPOINT_LOC_TYPE_DEVICE;
  ep.loc.device.devPhyId = (uint32_t)device_id;
  {
    /* a server with a device endpoint reads the thread's device at Create, as upstream's
     * (RegisterDeviceTransFinishedFlag: aclrtGetDevice): none set yet is ACL's error */
    HixlServerDesc d;
    memset(&d, 0, sizeof d);
    d.endpoint_list = &ep;
    d.endpoint_list_num = 1;
    d.server_ip = "127.0.0.1";
    HixlServerConfig c;
    memset(&c, 0, sizeof c);
    HixlServerHandle h = (HixlServerHandle)&d;
    EXPECT(HixlCSServerCreate(&d, &c, &h), ACL_ERROR_RT_CONTEXT_NULL);
    CHECK(h == NULL);
  }
  CHECK(aclrtSetDevice(device_id) == 0);
  {
    void *dev = NULL;
    CHECK(aclrtMalloc(&dev, size, ACL_MEM_MALLOC_HUGE_ONLY) == 0);
    CHECK(aclrtMemcpy(dev, size, kv0, size, ACL_MEMCPY_HOST_TO_DEVICE) == 0);
    free(kv0);
    kv0 = dev;
  }
#else
  CommMemType kv0_type = COMM_MEM_TYPE_HOST;
#endif
  memset(kv1, 0, size);
  uint32_t port = 0;
  /* kv0 before Listen needs a server that is not listening yet: register on a fresh one */
  HixlServerHandle s = NULL;
  for (int attempt = 0; attempt < 50 && s == NULL; attempt++) {
    HixlServerDesc d;
    memset(&d, 0, sizeof d);
    d.endpoint_list = &ep;
    d.endpoint_list_num = 1;
    d.server_ip = "127.0.0.1";
    d.server_port = free_port();
    HixlServerConfig c;
    memset(&c, 0, sizeof c);
    EXPECT(HixlCSServerCreate(&d, &c, &s), HIXL_SUCCESS);
    CommMem m0 = {kv0_type, kv0, size};
    MemHandle h0 = NULL;
    EXPECT(HixlCSServerRegMem(s, "kv0", &m0, &h0), HIXL_SUCCESS);
    if (HixlCSServerListen(s, 64) != HIXL_SUCCESS) {
      EXPECT(HixlCSServerDestroy(s), HIXL_SUCCESS);
      s = NULL;
      continue;
    }
    port = d.server_port;
    EXPECT(HixlCSServerListen(s, 64), HIXL_FAILED); /* twice */
  }
  CommMem m1 = {COMM_MEM_TYPE_HOST, kv1, size};
  MemHandle h1 = NULL;
  EXPECT(HixlCSServerRegMem(s, "kv1", &m1, &h1), HIXL_SUCCESS);
  if (failures) {
    fprintf(stderr, "server: %d failures\n", failures);
    return 1;
  }
  printf("READY %u %lu %zu\n", port, (unsigned long)(uintptr_t)kv0, size);
  fflush(stdout);
  char line[256];
  while (fgets(line, sizeof line, stdin)) {
    unsigned long off, len;
    if (sscanf(line, "sum %lu %lu", &off, &len) == 2 && off + len <= size) {
#ifdef CS_DEVICE
      unsigned char *tmp = malloc(len + 1);
      CHECK(aclrtMemcpy(tmp, len + 1, kv0 + off, len, ACL_MEMCPY_DEVICE_TO_HOST) == 0);
      printf("SUM %016llx\n", (unsigned long long)fnv1a(tmp, len));
      free(tmp);
#else
      printf("SUM %016llx\n", (unsigned long long)fnv1a(kv0 + off, len));
#endif
    } else if (strncmp(line, "quit", 4) == 0) {
      break;
    } else {
      printf("ERR\n");
    }
    fflush(stdout);
  }
  EXPECT(HixlCSServerUnregMem(s, h1), HIXL_SUCCESS);
  EXPECT(HixlCSServerDestroy(s), HIXL_SUCCESS);
#ifdef CS_DEVICE
  CHECK(aclrtFree(kv0) == 0);
#else
  free(kv0);
#endif
  free(kv1);
  return failures ? 1 : 0;
}

/* HixlCSClientCreate for a client of 127.0.0.1:port with these endpoints and config */
static HixlStatus create_client(const EndpointDesc *local, const EndpointDesc *remote, uint32_t port,
                                const char *config, HixlClientHandle *h) {
  HixlClientDesc d;
  memset(&d, 0, sizeof d);
  d.local_endpoint = local;
  d.remote_endpoint = remote;
  d.server_ip = "127.0.0.1";
  d.server_port = port;
  HixlClientConfig c;
  memset(&c, 0, sizeof c);
  c.global_resource_config = config;
  return HixlCSClientCreate(&d, &c, h);
}

static HixlClientHandle make_client_with(uint32_t port, const char *remote_ip, const char *config) {
  static EndpointDesc local, remote;
  local = endpoint("127.0.0.1");
  remote = endpoint(remote_ip);
  HixlClientHandle h = NULL;
  EXPECT(create_client(&local, &remote, port, config, &h), HIXL_SUCCESS);
  return h;
}

static HixlClientHandle make_client(uint32_t port, const char *remote_ip) {
  return make_client_with(port, remote_ip, NULL);
}

static void client_create_bad_inputs(uint32_t port) {
  EndpointDesc local = endpoint("127.0.0.1"), remote = endpoint("127.0.0.1");
  HixlClientDesc d;
  memset(&d, 0, sizeof d);
  d.local_endpoint = &local;
  d.remote_endpoint = &remote;
  d.server_ip = "127.0.0.1";
  d.server_port = port;
  HixlClientConfig c;
  memset(&c, 0, sizeof c);
  HixlClientHandle h = (HixlClientHandle)1;
  EXPECT(HixlCSClientCreate(NULL, &c, &h), HIXL_PARAM_INVALID);
  CHECK(h == NULL);
  EXPECT(HixlCSClientCreate(&d, NULL, &h), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientCreate(&d, &c, NULL), HIXL_PARAM_INVALID);
  d.server_port = 0;
  EXPECT(HixlCSClientCreate(&d, &c, &h), HIXL_PARAM_INVALID);
  d.server_port = 70000;
  EXPECT(HixlCSClientCreate(&d, &c, &h), HIXL_PARAM_INVALID);
  d.server_port = port;
  d.local_endpoint = NULL;
  EXPECT(HixlCSClientCreate(&d, &c, &h), HIXL_PARAM_INVALID);
  d.local_endpoint = &local;
  d.remote_endpoint = NULL;
  EXPECT(HixlCSClientCreate(&d, &c, &h), HIXL_PARAM_INVALID);
  d.remote_endpoint = &remote;
  d.server_ip = NULL;
  EXPECT(HixlCSClientCreate(&d, &c, &h), HIXL_PARAM_INVALID);
  d.server_ip = "127.0.0.1";
  c.global_resource_config = "{\"comm_resource_config.qos\": 8}";
  EXPECT(HixlCSClientCreate(&d, &c, &h), HIXL_PARAM_INVALID);
  c.global_resource_config = "{\"comm_resource_config.qos\": 7";
  EXPECT(HixlCSClientCreate(&d, &c, &h), HIXL_PARAM_INVALID);
  c.global_resource_config = NULL;
  setenv("HCCL_RDMA_RETRY_CNT", "9", 1);
  EXPECT(HixlCSClientCreate(&d, &c, &h), HIXL_PARAM_INVALID);
  unsetenv("HCCL_RDMA_RETRY_CNT");
  local.loc.locType = ENDPOINT_LOC_TYPE_RESERVED;
  EXPECT(HixlCSClientCreate(&d, &c, &h), HIXL_PARAM_INVALID);
}

#ifndef CS_DEVICE
/* waits until every thread of process `pid` is stopped (SIGSTOP takes effect when a thread
 * next leaves the kernel): /proc/PID/task/TID/stat says 'T' for each, or 20 s passed */
static int all_stopped(pid_t pid) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  for (;;) {
    DIR *d = opendir(path);
    if (d == NULL) return 0;
    int running = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.') continue;
      char stat[400], buf[256];
      snprintf(stat, sizeof stat, "%s/%s/stat", path, e->d_name);
      FILE *f = fopen(stat, "r");
      if (f == NULL) continue;
      size_t n = fread(buf, 1, sizeof buf - 1, f);
      fclose(f);
      buf[n] = 0;
      const char *close_paren = strrchr(buf, ')'); /* "tid (comm) S ..." */
      if (close_paren == NULL || close_paren[1] != ' ' || (close_paren[2] != 'T' && close_paren[2] != 't')) running++;
    }
    closedir(d);
    if (!running) return 1;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 20) return 0;
    sched_yield();
  }
}
#endif

/* waits for an async batch: COMPLETED expected, within 20 s */
static void wait_complete(HixlClientHandle c, CompleteHandle h) {
  HixlCompleteStatus st = HIXL_COMPLETE_STATUS_WAITING;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    EXPECT(HixlCSClientQueryCompleteStatus(c, h, &st), HIXL_SUCCESS);
    if (st != HIXL_COMPLETE_STATUS_WAITING) break;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 20) break;
    sched_yield();
  }
  CHECK(st == HIXL_COMPLETE_STATUS_COMPLETED);
  /* freed once reported */
  EXPECT(HixlCSClientQueryCompleteStatus(c, h, &st), HIXL_PARAM_INVALID);
}

/* an in-process server and client: memory the server registers after the client connected
 * reaches it at its next GetRemoteMem */
static void late_registration(void) {
  EndpointDesc ep = endpoint("127.0.0.1");
  uint32_t port = 0;
  HixlServerHandle s = listening_server(&ep, &port);
  HixlClientHandle c = make_client(port, "127.0.0.1");
  EXPECT(HixlCSClientConnect(c, 5000), HIXL_SUCCESS);
  CommMem *mems = NULL;
  char **tags = NULL;
  uint32_t n = 99;
  EXPECT(HixlCSClientGetRemoteMem(c, &mems, &tags, &n, 5000), HIXL_SUCCESS);
  CHECK(n == 1); /* the built-in region only */
  if (n >= 1) CHECK(strcmp(tags[0], "_hixl_builtin_host_trans_flag") == 0);
  static unsigned char late[4096], mine[4096];
  CommMem lm = {COMM_MEM_TYPE_HOST, late, sizeof late};
  MemHandle lh = NULL, mh = NULL;
  EXPECT(HixlCSServerRegMem(s, "late", &lm, &lh), HIXL_SUCCESS);
  CommMem mm = {COMM_MEM_TYPE_HOST, mine, sizeof mine};
  EXPECT(HixlCSClientRegMem(c, NULL, &mm, &mh), HIXL_SUCCESS);
  fill_random(mine, sizeof mine);
  HixlOneSideOpDesc d = {late, mine, sizeof mine};
  EXPECT(HixlCSClientBatchPutSync(c, 1, &d, 5000), HIXL_PARAM_INVALID); /* not imported yet */
  EXPECT(HixlCSClientGetRemoteMem(c, &mems, &tags, &n, 5000), HIXL_SUCCESS);
  CHECK(n == 2);
  if (n == 2) {
    CHECK(strcmp(tags[1], "late") == 0);
    CHECK(mems[1].addr == late && mems[1].size == sizeof late && mems[1].type == COMM_MEM_TYPE_HOST);
  }
  EXPECT(HixlCSClientBatchPutSync(c, 1, &d, 5000), HIXL_SUCCESS);
  CHECK(memcmp(late, mine, sizeof mine) == 0);
  /* the server goes: the next batch fails and latches */
  EXPECT(HixlCSServerDestroy(s), HIXL_SUCCESS);
  HixlStatus st = HixlCSClientBatchPutSync(c, 1, &d, 2000);
  CHECK(st == HIXL_FAILED || st == HIXL_TIMEOUT);
  EXPECT(HixlCSClientBatchGetSync(c, 1, &d, 2000), HIXL_FAILED);
  EXPECT(HixlCSClientDestroy(c), HIXL_SUCCESS);
}

#ifdef CS_DEVICE
/* device memory: random data PUT into the server's device kv0 and GET back, sync and async,
 * compared after a device-to-host copy; device to the server's host kv1 too */
static void device_section(HixlClientHandle c, unsigned char *kv0, unsigned char *kv1, size_t size) {
  const size_t dsize = 2u << 20, half = 1u << 20;
  unsigned char *dl = NULL;
  CHECK(aclrtMalloc((void **)&dl, dsize, ACL_MEM_MALLOC_HUGE_ONLY) == 0);
  CommMem dm = {COMM_MEM_TYPE_DEVICE, dl, dsize};
  MemHandle dh = NULL;
  EXPECT(HixlCSClientRegMem(c, "dev", &dm, &dh), HIXL_SUCCESS);
  unsigned char *src = malloc(half), *back = malloc(half);
  fill_random(src, half);
  CHECK(aclrtMemcpy(dl, half, src, half, ACL_MEMCPY_HOST_TO_DEVICE) == 0);
  const size_t offs[3] = {0, 12345, size / 2 + 7};
  const size_t lens[3] = {4096, 65536 + 3, size / 4};
  HixlOneSideOpDesc put[3], get[3];
  size_t at = 0;
  for (int i = 0; i < 3; i++) {
    put[i] = (HixlOneSideOpDesc){kv0 + offs[i], dl + at, lens[i]};
    get[i] = (HixlOneSideOpDesc){kv0 + offs[i], dl + half + at, lens[i]};
    at += lens[i];
  }
  EXPECT(HixlCSClientBatchPutSync(c, 3, put, 10000), HIXL_SUCCESS);
  EXPECT(HixlCSClientBatchGetSync(c, 3, get, 10000), HIXL_SUCCESS);
  CHECK(aclrtMemcpy(back, half, dl + half, at, ACL_MEMCPY_DEVICE_TO_HOST) == 0);
  CHECK(memcmp(src, back, at) == 0);
  for (int i = 0; i < 3; i++) {
    printf("WROTE %zu %zu %016llx\n", offs[i], lens[i],
           (unsigned long long)fnv1a(src + ((unsigned char *)put[i].local_buf - dl), lens[i]));
  }
  /* async, device to device (kv0 beyond what the WROTE lines cover) and device to host (kv1) */
  unsigned char *targets[2] = {kv0 + size / 4, kv1 + 999};
  for (int t = 0; t < 2; t++) {
    fill_random(src, 100000);
    CHECK(aclrtMemcpy(dl, half, src, 100000, ACL_MEMCPY_HOST_TO_DEVICE) == 0);
    HixlOneSideOpDesc ap = {targets[t], dl, 100000}, ag = {targets[t], dl + half, 100000};
    CompleteHandle ch = NULL;
    EXPECT(HixlCSClientBatchPutAsync(c, 1, &ap, &ch), HIXL_SUCCESS);
    wait_complete(c, ch);
    EXPECT(HixlCSClientBatchGetAsync(c, 1, &ag, &ch), HIXL_SUCCESS);
    wait_complete(c, ch);
    CHECK(aclrtMemcpy(back, half, dl + half, 100000, ACL_MEMCPY_DEVICE_TO_HOST) == 0);
    CHECK(memcmp(src, back, 100000) == 0);
  }
  /* a device range past its end */
  HixlOneSideOpDesc bad = {kv0, dl + dsize - 8, 16};
  EXPECT(HixlCSClientBatchPutSync(c, 1, &bad, 1000), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientUnregMem(c, dh), HIXL_SUCCESS);
  EXPECT(HixlCSClientBatchPutSync(c, 1, put, 1000), HIXL_PARAM_INVALID);
  CHECK(aclrtFree(dl) == 0);
  free(src);
  free(back);
}
#endif

static int client(uint32_t port, uintptr_t kv0_addr, size_t size, pid_t server_pid) {
  rng_state = 0x2545f4914f6cdd1dull ^ (uint64_t)getpid() ^ (uint64_t)time(NULL);
#ifdef CS_DEVICE
  {
    /* a client with a device endpoint reads the thread's device at Create, as upstream's
     * (InitDeviceResource: aclrtGetDevice): none set yet is ACL's ACL_ERROR_RT_CONTEXT_NULL */
    EndpointDesc l = endpoint("127.0.0.1"), r = endpoint("127.0.0.1");
    l.loc.locType = ENDPOINT_LOC_TYPE_DEVICE;
    l.loc.device.devPhyId = (uint32_t)device_id;
    HixlClientHandle h = (HixlClientHandle)&l;
    EXPECT(create_client(&l, &r, port, NULL, &h), ACL_ERROR_RT_CONTEXT_NULL);
    CHECK(h == NULL);
    CHECK(aclrtSetDevice(device_id) == 0);
    EXPECT(create_client(&l, &r, port, NULL, &h), HIXL_SUCCESS);
    EXPECT(HixlCSClientDestroy(h), HIXL_SUCCESS);
  }
#endif
  client_create_bad_inputs(port);

  HixlClientHandle c = make_client(port, "127.0.0.1");
  CommMem *mems = NULL;
  char **tags = NULL;
  uint32_t n = 0;
  EXPECT(HixlCSClientGetRemoteMem(c, &mems, &tags, &n, 1000), HIXL_FAILED); /* not connected */
  EXPECT(HixlCSClientConnect(c, 5000), HIXL_SUCCESS);
  EXPECT(HixlCSClientConnect(c, 5000), HIXL_FAILED); /* twice */

  EXPECT(HixlCSClientGetRemoteMem(c, NULL, &tags, &n, 1000), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientGetRemoteMem(c, &mems, NULL, &n, 1000), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientGetRemoteMem(c, &mems, &tags, NULL, 1000), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientGetRemoteMem(c, &mems, &tags, &n, 5000), HIXL_SUCCESS);
  /* the built-in region, kv0, kv1 */
  CHECK(n == 3);
  unsigned char *kv0 = NULL, *kv1 = NULL, *builtin = NULL;
  for (uint32_t i = 0; i < n; i++) {
    if (strcmp(tags[i], "kv0") == 0) kv0 = mems[i].addr;
    if (strcmp(tags[i], "kv1") == 0) kv1 = mems[i].addr;
    if (strcmp(tags[i], "_hixl_builtin_host_trans_flag") == 0) builtin = mems[i].addr;
#ifndef CS_DEVICE
    CHECK(mems[i].type == COMM_MEM_TYPE_HOST);
#endif
    if (strncmp(tags[i], "kv", 2) == 0) CHECK(mems[i].size == size);
  }
  CHECK(kv0 != NULL && kv1 != NULL && builtin != NULL);
  CHECK((uintptr_t)kv0 == kv0_addr);
  if (kv0 == NULL || kv1 == NULL || builtin == NULL) return 1;
#ifdef CS_DEVICE
  (void)server_pid;
  for (uint32_t i = 0; i < n; i++) {
    if (strcmp(tags[i], "kv0") == 0) CHECK(mems[i].type == COMM_MEM_TYPE_DEVICE);
  }
  device_section(c, kv0, kv1, size);
  EXPECT(HixlCSClientDestroy(c), HIXL_SUCCESS);
  EXPECT(HixlCSClientDestroy(c), HIXL_PARAM_INVALID);
  late_registration();
  if (failures) {
    fprintf(stderr, "client: %d failures\n", failures);
    return 1;
  }
  printf("PASS\n");
  return 0;
#else

  /* local memory: 4 MiB */
  size_t lsize = 4u << 20;
  unsigned char *local = malloc(lsize);
  memset(local, 0, lsize);
  CommMem lm = {COMM_MEM_TYPE_HOST, local, lsize};
  MemHandle lh = NULL, lh2 = NULL, bad = NULL;
  EXPECT(HixlCSClientRegMem(c, "local", NULL, &lh), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientRegMem(c, "local", &lm, NULL), HIXL_PARAM_INVALID);
  CommMem zero = {COMM_MEM_TYPE_HOST, local, 0};
  EXPECT(HixlCSClientRegMem(c, "local", &zero, &bad), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientRegMem(c, "local", &lm, &lh), HIXL_SUCCESS);
  EXPECT(HixlCSClientRegMem(c, "again", &lm, &lh2), HIXL_SUCCESS); /* identical: passed */
  CommMem part = {COMM_MEM_TYPE_HOST, local + 4096, lsize};
  EXPECT(HixlCSClientRegMem(c, "part", &part, &bad), HIXL_PARAM_INVALID); /* partial overlap */
  CommMem inner = {COMM_MEM_TYPE_HOST, local + 4096, 4096};
  EXPECT(HixlCSClientRegMem(c, "inner", &inner, &bad), HIXL_PARAM_INVALID);

  /* sync PUT of random data to kv0 at three offsets, GET back, compare */
  const size_t offs[3] = {0, 12345, size / 2 + 7};
  const size_t lens[3] = {4096, 65536 + 3, size / 4};
  HixlOneSideOpDesc put[3], get[3];
  size_t at = 0;
  for (int i = 0; i < 3; i++) {
    fill_random(local + at, lens[i]);
    put[i].remote_buf = kv0 + offs[i];
    put[i].local_buf = local + at;
    put[i].len = lens[i];
    get[i].remote_buf = kv0 + offs[i];
    get[i].local_buf = local + (2u << 20) + at;
    get[i].len = lens[i];
    at += lens[i];
  }
  EXPECT(HixlCSClientBatchPutSync(c, 3, put, 10000), HIXL_SUCCESS);
  EXPECT(HixlCSClientBatchGetSync(c, 3, get, 10000), HIXL_SUCCESS);
  CHECK(memcmp(local, local + (2u << 20), at) == 0);
  for (int i = 0; i < 3; i++) {
    printf("WROTE %zu %zu %016llx\n", offs[i], lens[i],
           (unsigned long long)fnv1a((unsigned char *)put[i].local_buf, lens[i]));
  }
  /* GET of the server's own bytes elsewhere in kv0 (its pattern) */
  HixlOneSideOpDesc pg = {kv0 + size - 1000, local + (3u << 20), 1000};
  EXPECT(HixlCSClientBatchGetSync(c, 1, &pg, 10000), HIXL_SUCCESS);
  for (size_t i = 0; i < 1000; i++) {
    if (local[(3u << 20) + i] != pattern(size - 1000 + i)) {
      CHECK(!"kv0's pattern read back");
      break;
    }
  }

  /* async PUT to kv1, async GET back, compare */
  fill_random(local, 100000);
  HixlOneSideOpDesc aput = {kv1 + 333, local, 100000}, aget = {kv1 + 333, local + (1u << 20), 100000};
  CompleteHandle ch = NULL;
  EXPECT(HixlCSClientBatchPutAsync(c, 1, &aput, &ch), HIXL_SUCCESS);
  wait_complete(c, ch);
  EXPECT(HixlCSClientBatchGetAsync(c, 1, &aget, &ch), HIXL_SUCCESS);
  wait_complete(c, ch);
  CHECK(memcmp(local, local + (1u << 20), 100000) == 0);

  /* bad batches: PARAM_INVALID, nothing moved, the client not latched */
  HixlOneSideOpDesc d = {kv0, local, 16};
  HixlCompleteStatus st;
  EXPECT(HixlCSClientBatchPutSync(c, 0, &d, 1000), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientBatchPutSync(c, 1, NULL, 1000), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientBatchPutAsync(c, 1, &d, NULL), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientBatchGetAsync(c, 0, &d, &ch), HIXL_PARAM_INVALID);
  d.len = 0;
  EXPECT(HixlCSClientBatchPutSync(c, 1, &d, 1000), HIXL_PARAM_INVALID);
  d.len = 16;
  d.local_buf = local + lsize - 8; /* local range past its end */
  EXPECT(HixlCSClientBatchPutSync(c, 1, &d, 1000), HIXL_PARAM_INVALID);
  static unsigned char unregistered[64];
  d.local_buf = unregistered;
  EXPECT(HixlCSClientBatchGetSync(c, 1, &d, 1000), HIXL_PARAM_INVALID);
  d.local_buf = local;
  d.remote_buf = kv0 + size - 8; /* remote range past kv0's end */
  EXPECT(HixlCSClientBatchPutSync(c, 1, &d, 1000), HIXL_PARAM_INVALID);
  d.remote_buf = (void *)(uintptr_t)0x10; /* outside every range */
  EXPECT(HixlCSClientBatchGetSync(c, 1, &d, 1000), HIXL_PARAM_INVALID);
  d.remote_buf = (void *)(UINTPTR_MAX - 4); /* wraps */
  EXPECT(HixlCSClientBatchGetAsync(c, 1, &d, &ch), HIXL_PARAM_INVALID);
  d.remote_buf = builtin; /* the built-in region is read-only */
  EXPECT(HixlCSClientBatchPutSync(c, 1, &d, 1000), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientBatchGetSync(c, 1, &d, 1000), HIXL_SUCCESS);
  EXPECT(HixlCSClientQueryCompleteStatus(c, (CompleteHandle)0x4242, &st), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientQueryCompleteStatus(c, NULL, &st), HIXL_PARAM_INVALID);
  d.remote_buf = kv1;
  EXPECT(HixlCSClientBatchPutAsync(c, 1, &d, &ch), HIXL_SUCCESS);
  EXPECT(HixlCSClientQueryCompleteStatus(c, ch, NULL), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientQueryCompleteStatus((HixlClientHandle)0x4242, ch, &st), HIXL_PARAM_INVALID);
  wait_complete(c, ch);

  /* 4096 unqueried handles: the 4097th is RESOURCE_EXHAUSTED; each completes once queried */
  static CompleteHandle many[4096];
  HixlOneSideOpDesc small = {kv1, local, 8};
  for (int i = 0; i < 4096; i++) {
    small.remote_buf = kv1 + (size_t)i * 8 % size;
    EXPECT(HixlCSClientBatchGetAsync(c, 1, &small, &many[i]), HIXL_SUCCESS);
  }
  EXPECT(HixlCSClientBatchGetAsync(c, 1, &small, &ch), RESOURCE_EXHAUSTED);
  EXPECT(HixlCSClientBatchPutAsync(c, 1, &small, &ch), RESOURCE_EXHAUSTED);
  for (int i = 0; i < 4096; i++) wait_complete(c, many[i]);
  EXPECT(HixlCSClientBatchGetAsync(c, 1, &small, &ch), HIXL_SUCCESS);
  wait_complete(c, ch);

  /* a client whose remote endpoint is none of the server's */
  HixlClientHandle other = make_client(port, "127.0.0.2");
  EXPECT(HixlCSClientConnect(other, 5000), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientDestroy(other), HIXL_SUCCESS);

  /* unregistration: identical registrations count; then the range is gone */
  EXPECT(HixlCSClientUnregMem(c, lh2), HIXL_SUCCESS);
  EXPECT(HixlCSClientUnregMem(c, lh2), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientBatchGetSync(c, 1, &small, 1000), HIXL_SUCCESS);
  EXPECT(HixlCSClientUnregMem(c, lh), HIXL_SUCCESS);
  EXPECT(HixlCSClientBatchGetSync(c, 1, &small, 1000), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientUnregMem(c, (MemHandle)0x4242), HIXL_PARAM_INVALID);

  /* the failure latch: a batch that times out, then every batch FAILED. Over TCP (the hixl
   * extension "hixl.SameHost": "off"; same-host copies need nothing of the server's CPU), with
   * the server process stopped: its engine reads nothing until it continues */
  EXPECT(HixlCSClientRegMem(c, "local", &lm, &lh), HIXL_SUCCESS);
  HixlClientHandle t = make_client_with(port, "127.0.0.1", "{\"hixl.SameHost\": \"off\"}");
  EXPECT(HixlCSClientConnect(t, 5000), HIXL_SUCCESS);
  MemHandle th = NULL;
  EXPECT(HixlCSClientRegMem(t, "local", &lm, &th), HIXL_SUCCESS);
  EXPECT(HixlCSClientBatchGetSync(t, 1, &small, 5000), HIXL_SUCCESS);
  HixlOneSideOpDesc slow = {kv1, local, size};
  CHECK(kill(server_pid, SIGSTOP) == 0);
  CHECK(all_stopped(server_pid));
  EXPECT(HixlCSClientBatchGetSync(t, 1, &slow, 300), HIXL_TIMEOUT);
  CHECK(kill(server_pid, SIGCONT) == 0);
  EXPECT(HixlCSClientBatchGetSync(t, 1, &small, 5000), HIXL_FAILED);
  EXPECT(HixlCSClientBatchPutAsync(t, 1, &small, &ch), HIXL_FAILED);
  EXPECT(HixlCSClientDestroy(t), HIXL_SUCCESS);
  /* the other client is not latched */
  EXPECT(HixlCSClientBatchGetSync(c, 1, &small, 5000), HIXL_SUCCESS);
  /* a bad engine option in the extension's keys */
  {
    EndpointDesc l = endpoint("127.0.0.1"), r = endpoint("127.0.0.1");
    HixlClientDesc cd;
    memset(&cd, 0, sizeof cd);
    cd.local_endpoint = &l;
    cd.remote_endpoint = &r;
    cd.server_ip = "127.0.0.1";
    cd.server_port = port;
    HixlClientConfig cc;
    memset(&cc, 0, sizeof cc);
    cc.global_resource_config = "{\"hixl.NoSuchOption\": 1}";
    HixlClientHandle x = NULL;
    EXPECT(HixlCSClientCreate(&cd, &cc, &x), HIXL_PARAM_INVALID);
  }

  /* after destroy: the handle is unknown, its arrays and completion handles too */
  EXPECT(HixlCSClientDestroy(c), HIXL_SUCCESS);
  EXPECT(HixlCSClientDestroy(c), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientConnect(c, 1000), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientGetRemoteMem(c, &mems, &tags, &n, 1000), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientRegMem(c, "x", &lm, &lh), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientUnregMem(c, lh), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientBatchPutSync(c, 1, &small, 1000), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientBatchGetAsync(c, 1, &small, &ch), HIXL_PARAM_INVALID);
  EXPECT(HixlCSClientQueryCompleteStatus(c, ch, &st), HIXL_PARAM_INVALID);

  late_registration();
  free(local);
  if (failures) {
    fprintf(stderr, "client: %d failures\n", failures);
    return 1;
  }
  printf("PASS\n");
  return 0;
#endif
}

int main(int argc, char **argv) {
#ifdef CS_DEVICE
  /* the device: the last argument */
  if (argc >= 3) {
    device_id = (int32_t)strtol(argv[argc - 1], NULL, 10);
    argc--;
  }
#endif
  if (argc == 3 && strcmp(argv[1], "server") == 0) {
    return server((size_t)strtoull(argv[2], NULL, 10));
  }
  if (argc == 6 && strcmp(argv[1], "client") == 0) {
    return client((uint32_t)strtoul(argv[2], NULL, 10), (uintptr_t)strtoull(argv[3], NULL, 10),
                  (size_t)strtoull(argv[4], NULL, 10), (pid_t)strtol(argv[5], NULL, 10));
  }
  fprintf(stderr, "usage: %s server SIZE | client PORT ADDR LEN PID\n", argv[0]);
  return 2;
}
