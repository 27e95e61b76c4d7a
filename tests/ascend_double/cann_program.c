/*
 * A program written as a CANN user writes one, run by tests/ascend/ascend.rs against the double built
 * by tools/ascend-double.sh: linked with `-lacl_rt -lascend_hal` (the line of HIXL's
 * examples/cpp/CMakeLists.txt) and run with LD_LIBRARY_PATH alone, no HIXL_ASCEND_DOUBLE_*
 * variable. It never calls aclInit, as HIXL's examples do not.
 *
 * The checks (each prints "FAIL <what>" and exits 1; "OK" at the end):
 *   - ACL without aclInit: aclrtGetDevice is 107002 before any aclrtSetDevice, then the device
 *     set on this thread; aclrtGetDeviceCount > 0; aclrtCreateContext/aclrtDestroyContext;
 *     aclrtMalloc (HUGE_ONLY, 2 MiB aligned), aclrtMallocHost, aclrtMemcpy of every direction,
 *     aclrtFree(Host), aclrtResetDevice (507007 once nothing is left to reset),
 *     aclGetRecentErrMsg (NULL when nothing failed, a message after a failure);
 *   - every CANN library name opens the one object (libhcomm.so, libhccl.so, libascendcl.so,
 *     libascend_hal.so are the libacl_rt.so this program was linked with), so that hixl, which
 *     dlopens ACL and HCCL by name, shares the program's devices and contexts;
 *   - two processes (a fork) on devices 0 and 2, with a rank table without device IPs (as
 *     HIXL writes for "hccs:device"), find each other with nothing set: the client reads the
 *     server's device memory with HcclBatchGet.
 *
 * The CANN headers are not available to CI: cann_decls.h declares what it calls, as CANN's
 * acl_rt.h and HCCL's hccl.h do (ABI only).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cann_decls.h"
#include "fork_pair.h"

#define SIZE (1u << 20)
#define FILL 0x5A

static void check(int ok, const char *what) {
    if (ok) return;
    const char *msg = aclGetRecentErrMsg();
    printf("FAIL %s (errmsg: %s)\n", what, msg ? msg : "none");
    fflush(stdout);
    exit(1);
}

#define ACL_OK(expr) check((expr) == 0, #expr)

/* ACL as a program uses it, without aclInit. */
static void acl_checks(void) {
    int32_t dev = -1;
    uint32_t count = 0;
    void *ctx = NULL, *cur = NULL, *dbuf = NULL, *hbuf = NULL;
    unsigned char host[64], back[64];
    check(aclrtGetDevice(&dev) == 107002, "aclrtGetDevice before aclrtSetDevice is ACL_ERROR_RT_CONTEXT_NULL");
    ACL_OK(aclrtGetDeviceCount(&count));
    check(count > 2, "aclrtGetDeviceCount > 2");
    check(aclrtSetDevice((int32_t)count) == 107001, "aclrtSetDevice(count) is ACL_ERROR_RT_INVALID_DEVICEID");
    check(aclGetRecentErrMsg() != NULL, "aclGetRecentErrMsg after a failure");
    check(aclGetRecentErrMsg() == NULL, "aclGetRecentErrMsg once read");

    ACL_OK(aclrtCreateContext(&ctx, 1));
    ACL_OK(aclrtGetDevice(&dev));
    check(dev == 1, "aclrtCreateContext makes its context current");
    ACL_OK(aclrtGetCurrentContext(&cur));
    check(cur == ctx, "aclrtGetCurrentContext is the created context");
    ACL_OK(aclrtDestroyContext(ctx));
    check(aclrtGetDevice(&dev) == 107002, "no current context once it is destroyed");
    check(aclrtDestroyContext(ctx) == 107002, "a second aclrtDestroyContext");
    check(aclrtSetCurrentContext(ctx) != 0, "aclrtSetCurrentContext of a destroyed context");

    ACL_OK(aclrtSetDevice(0));
    ACL_OK(aclrtGetDevice(&dev));
    check(dev == 0, "aclrtGetDevice is the device set on this thread");
    ACL_OK(aclrtMalloc(&dbuf, SIZE, ACL_MEM_MALLOC_HUGE_ONLY));
    check((uintptr_t)dbuf % (2u << 20) == 0, "HUGE_ONLY is 2 MiB aligned");
    ACL_OK(aclrtMallocHost(&hbuf, 64));
    for (int i = 0; i < 64; i++) host[i] = (unsigned char)i;
    ACL_OK(aclrtMemcpy(hbuf, 64, host, 64, H2H));
    ACL_OK(aclrtMemcpy(dbuf, SIZE, hbuf, 64, H2D));
    ACL_OK(aclrtMemcpy((char *)dbuf + 4096, SIZE - 4096, dbuf, 64, D2D));
    ACL_OK(aclrtMemcpy((char *)dbuf + 8192, SIZE - 8192, (char *)dbuf + 4096, 64, DEFAULT));
    ACL_OK(aclrtMemcpy(back, sizeof back, (char *)dbuf + 8192, 64, D2H));
    check(memcmp(host, back, 64) == 0, "aclrtMemcpy round trip");
    ACL_OK(aclrtFreeHost(hbuf));
    ACL_OK(aclrtFree(dbuf));
    ACL_OK(aclrtResetDevice(0));
    check(aclrtResetDevice(0) == 507007, "aclrtResetDevice of a device reset is ACL_ERROR_RT_CONTEXT_RELEASE_ERROR");
}

/* One rank: device memory registered and bound to a two-rank comm, prepared (waits for the
 * other process to announce itself). */
typedef struct {
    void *buf, *mem, *comm;
} Rank;

static void rank_up(Rank *r, int32_t device, uint32_t rank) {
    char table[512];
    int32_t phy0 = -1, phy2 = -1;
    HcclMem mem;
    HcclCommConfig cfg;
    HcclPrepareConfig prep = {0, 0, 0, 0};
    ACL_OK(aclrtSetDevice(device));
    ACL_OK(aclrtGetPhyDevIdByLogicDevId(0, &phy0));
    ACL_OK(aclrtGetPhyDevIdByLogicDevId(2, &phy2));
    snprintf(table, sizeof table,
             "{\"version\":\"1.0\",\"server_count\":\"1\",\"server_list\":[{\"server_id\":\"127.0.0.1\","
             "\"device\":[{\"device_id\":\"%d\",\"rank_id\":\"0\"},{\"device_id\":\"%d\",\"rank_id\":\"1\"}]}],"
             "\"status\":\"completed\"}",
             phy0, phy2);
    ACL_OK(aclrtMalloc(&r->buf, SIZE, ACL_MEM_MALLOC_HUGE_ONLY));
    mem.type = 0;
    mem.addr = r->buf;
    mem.size = SIZE;
    check(HcclRegisterGlobalMem(&mem, &r->mem) == 0, "HcclRegisterGlobalMem");
    memset(&cfg, 0, sizeof cfg);
    cfg.configSize = sizeof cfg;
    cfg.magicWord = 0xf0f0f0f0u;
    cfg.version = 5;
    cfg.hcclBufferSize = 200;
    snprintf(cfg.hcclCommName, sizeof cfg.hcclCommName, "cann_program");
    check(HcclCommInitClusterInfoMemConfig(table, rank, &cfg, &r->comm) == 0, "HcclCommInitClusterInfoMemConfig");
    check(HcclCommBindMem(r->comm, r->mem) == 0, "HcclCommBindMem");
    check(HcclCommPrepare(r->comm, &prep, 10) == 0, "HcclCommPrepare (the peer announced itself)");
}

static void rank_down(Rank *r, int32_t device) {
    check(HcclCommUnbindMem(r->comm, r->mem) == 0, "HcclCommUnbindMem");
    check(HcclCommDestroy(r->comm) == 0, "HcclCommDestroy");
    check(HcclDeregisterGlobalMem(r->mem) == 0, "HcclDeregisterGlobalMem");
    ACL_OK(aclrtFree(r->buf));
    ACL_OK(aclrtResetDevice(device));
}

static void client(int addr_in, int done_out) {
    Rank r;
    void *stream = NULL, *remote = NULL;
    unsigned char *host = malloc(SIZE);
    HcclOneSideOpDesc d;
    check(host != NULL, "malloc");
    acl_checks();
    rank_up(&r, 0, 0);
    check(read(addr_in, &remote, sizeof remote) == (ssize_t)sizeof remote, "read the server's address");
    ACL_OK(aclrtCreateStream(&stream));
    d.localAddr = r.buf;
    d.remoteAddr = remote;
    d.count = SIZE;
    d.dataType = 0; /* HCCL_DATA_TYPE_INT8 */
    check(HcclBatchGet(r.comm, 1, &d, 1, stream) == 0, "HcclBatchGet");
    ACL_OK(aclrtSynchronizeStreamWithTimeout(stream, 5000));
    ACL_OK(aclrtMemcpy(host, SIZE, r.buf, SIZE, D2H));
    for (size_t i = 0; i < SIZE; i++) check(host[i] == FILL, "the server's bytes arrived");
    check(write(done_out, "d", 1) == 1, "write done");
    ACL_OK(aclrtDestroyStream(stream));
    rank_down(&r, 0);
    free(host);
}

static void server(int addr_out, int done_in) {
    Rank r;
    char done = 0;
    unsigned char *fill = malloc(SIZE);
    check(fill != NULL, "malloc");
    memset(fill, FILL, SIZE);
    ACL_OK(aclrtSetDevice(2));
    rank_up(&r, 2, 1);
    ACL_OK(aclrtMemcpy(r.buf, SIZE, fill, SIZE, H2D));
    check(write(addr_out, &r.buf, sizeof r.buf) == (ssize_t)sizeof r.buf, "write the address");
    check(read(done_in, &done, 1) == 1 && done == 'd', "the client's done");
    rank_down(&r, 2);
    ACL_OK(aclrtResetDevice(2));
    free(fill);
}

/* dlopen of each CANN name gives the object this program was linked with. */
static void one_object(void) {
    static const char *const names[] = {"libacl_rt.so", "libascendcl.so", "libhcomm.so", "libhccl.so",
                                        "libascend_hal.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *h = dlopen(names[i], RTLD_NOW);
        check(h != NULL, names[i]);
        check(dlsym(h, "HcclBatchGet") == (void *)HcclBatchGet && dlsym(h, "aclrtSetDevice") == (void *)aclrtSetDevice,
              "every CANN name is the one object");
    }
}

/* the server side as fork_pair's parent: it writes the address, reads the done signal */
static void parent(int in, int out) { server(out, in); }

int main(void) {
    one_object();
    fork_pair(client, parent, "client OK");
    return 0;
}
