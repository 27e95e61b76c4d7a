/*
 * The double's ACL calls that Mooncake's NPU wheel links besides hixl's (see "host registration,
 * batched copies, allocation granularity, IPC of device memory" in double.c), as a CANN program
 * calls them, with every exact status: aclrtHostRegister/aclrtHostUnregister,
 * aclrtMemcpyBatch, aclrtMemGetAllocationGranularity, and IPC of device memory between two
 * processes (aclrtIpcMemGetExportKey, aclrtIpcMemSetImportPid, aclrtIpcMemImportByKey,
 * aclrtIpcMemClose): random data written on each side is read on the other. Prints "OK".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cann_decls.h"
#include "fork_pair.h"

typedef struct {
    aclrtMemLocation dstLoc;
    aclrtMemLocation srcLoc;
    uint8_t rsv[16];
} aclrtMemcpyBatchAttr;

aclError aclrtHostRegister(void *ptr, uint64_t size, int type, void **devPtr);
aclError aclrtHostUnregister(void *ptr);
aclError aclrtMemcpyBatch(void **dsts, size_t *destMaxs, void **srcs, size_t *sizes, size_t numBatches,
                          aclrtMemcpyBatchAttr *attrs, size_t *attrsIndexes, size_t numAttrs, size_t *failIndex);
aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp *prop, int option, size_t *granularity);
aclError aclrtIpcMemGetExportKey(void *devPtr, size_t size, char *key, size_t len, uint64_t flags);
aclError aclrtIpcMemSetImportPid(const char *key, int32_t *pid, size_t num);
aclError aclrtIpcMemImportByKey(void **devPtr, const char *key, uint64_t flags);
aclError aclrtIpcMemClose(const char *key);

enum {
    INVALID_PARAM = 100000,
    RT_PARAM_INVALID = 107000,
    RT_CONTEXT_NULL = 107002,
    FEATURE_NOT_SUPPORT = 207000,
    ALREADY_REGISTERED = 507910,
    NOT_REGISTERED = 507911,
    LOC_HOST = 0,
    LOC_DEVICE = 1,
    LOC_UNREGISTERED = 2,
    LOC_HOST_NUMA = 4,
    MEM_P2P_HUGE = 16,
    DDR_MEM_HUGE = 2,
    KEY_LEN = 65,
    N = 1 << 16,
};

static void check(int ok, const char *what) {
    if (!ok) {
        printf("FAIL: %s (%s)\n", what, aclGetRecentErrMsg() ? aclGetRecentErrMsg() : "");
        fflush(stdout);
        exit(1);
    }
}

#define IS(call, want)                                                                  \
    do {                                                                                \
        aclError got_ = (call);                                                         \
        if (got_ != (want)) {                                                           \
            printf("FAIL: %s = %d, expected %d (%s)\n", #call, got_, (int)(want),       \
                   aclGetRecentErrMsg() ? aclGetRecentErrMsg() : "");                   \
            fflush(stdout);                                                             \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static void fill(unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        p[i] = (unsigned char)rng;
    }
}

static int loc_of(const void *p) {
    aclrtPtrAttributes a;
    IS(aclrtPointerGetAttributes(p, &a), 0);
    return a.location.type;
}

static void host_register(void) {
    unsigned char *host = aligned_alloc(4096, N);
    void *dev = NULL;
    check(host != NULL, "aligned_alloc");
    IS(aclrtHostRegister(NULL, N, 0, &dev), INVALID_PARAM);
    IS(aclrtHostRegister(host, 0, 0, &dev), INVALID_PARAM);
    IS(aclrtHostRegister(host, N, 0, NULL), INVALID_PARAM);
    IS(aclrtHostRegister(host, N, 0x1, &dev), FEATURE_NOT_SUPPORT);
    check(loc_of(host) == LOC_UNREGISTERED, "plain host memory is unregistered");
    IS(aclrtHostRegister(host, N, 0 /* ACL_HOST_REGISTER_MAPPED */, &dev), 0);
    check(dev == host, "the device address of registered host memory (the double: the same)");
    check(loc_of(host + 100) == LOC_HOST, "registered host memory is HOST memory");
    IS(aclrtHostRegister(host + 4096, 4096, 0, &dev), ALREADY_REGISTERED);
    IS(aclrtHostUnregister(host + 4096), NOT_REGISTERED);
    IS(aclrtHostUnregister(NULL), INVALID_PARAM);
    IS(aclrtHostUnregister(host), 0);
    IS(aclrtHostUnregister(host), NOT_REGISTERED);
    check(loc_of(host) == LOC_UNREGISTERED, "unregistered again");
    IS(aclrtHostRegister(host, N, 0x08 /* READONLY */, &dev), 0);
    IS(aclrtHostUnregister(host), 0);
    free(host);
}

static aclrtMemcpyBatchAttr attr(int dst, uint32_t did, int src, uint32_t sid) {
    aclrtMemcpyBatchAttr a;
    memset(&a, 0, sizeof a);
    a.dstLoc.type = dst;
    a.dstLoc.id = did;
    a.srcLoc.type = src;
    a.srcLoc.id = sid;
    return a;
}

static void memcpy_batch(void) {
    unsigned char *h = malloc(4 * N), *back = malloc(2 * N);
    void *d = NULL;
    size_t fail = 0;
    check(h != NULL && back != NULL, "malloc");
    IS(aclrtMalloc(&d, 2 * N, 0), 0);
    fill(h, 4 * N);
    /* two H2D copies, then two D2H copies, in one call: attrs[0] for 0..1, attrs[1] for 2..3 */
    {
        void *dsts[4] = {d, (char *)d + N, back, back + N};
        void *srcs[4] = {h, h + N, d, (char *)d + N};
        size_t sizes[4] = {N, N, N, N}, maxs[4] = {N, N, N, N}, idx[2] = {0, 2};
        aclrtMemcpyBatchAttr at[2] = {attr(LOC_DEVICE, 3, LOC_HOST, 0), attr(LOC_HOST_NUMA, 0, LOC_DEVICE, 3)};
        IS(aclrtMemcpyBatch(dsts, maxs, srcs, sizes, 4, at, idx, 2, &fail), 0);
        check(fail == SIZE_MAX, "failIndex SIZE_MAX on success");
        check(memcmp(back, h, 2 * N) == 0, "H2D then D2H brings the bytes back");
    }
    /* each refusal: its status, the failing index, and nothing copied */
    {
        unsigned char *h2 = h + 2 * N;
        void *dsts[2] = {d, back};
        void *srcs[2] = {h2, d};
        size_t sizes[2] = {N, N}, maxs[2] = {N, N}, idx[2] = {0, 1}, zero[2] = {0, 0}, small[2] = {N, N - 1};
        aclrtMemcpyBatchAttr good[2] = {attr(LOC_DEVICE, 3, LOC_HOST, 0), attr(LOC_HOST, 0, LOC_DEVICE, 3)};
        aclrtMemcpyBatchAttr wrong_dev[2] = {attr(LOC_DEVICE, 3, LOC_HOST, 0), attr(LOC_HOST, 0, LOC_DEVICE, 1)};
        aclrtMemcpyBatchAttr h2h[2] = {attr(LOC_DEVICE, 3, LOC_HOST, 0), attr(LOC_HOST, 0, LOC_HOST, 0)};
        aclrtMemcpyBatchAttr rsv[2] = {attr(LOC_DEVICE, 3, LOC_HOST, 0), attr(LOC_HOST, 0, LOC_DEVICE, 3)};
        size_t bad_idx[2] = {1, 1};
        unsigned char before[64];
        memcpy(before, back, sizeof before);
        IS(aclrtMemcpyBatch(dsts, maxs, srcs, sizes, 2, good, idx, 2, NULL), INVALID_PARAM);
        IS(aclrtMemcpyBatch(dsts, maxs, srcs, sizes, 0, good, idx, 2, &fail), INVALID_PARAM);
        IS(aclrtMemcpyBatch(dsts, maxs, srcs, zero, 2, NULL, NULL, 0, &fail), 0);
        check(fail == SIZE_MAX, "all sizes 0: nothing to do");
        IS(aclrtMemcpyBatch(dsts, small, srcs, sizes, 2, good, idx, 2, &fail), INVALID_PARAM);
        rsv[1].rsv[3] = 1;
        IS(aclrtMemcpyBatch(dsts, maxs, srcs, sizes, 2, rsv, idx, 2, &fail), INVALID_PARAM);
        IS(aclrtMemcpyBatch(dsts, maxs, srcs, sizes, 2, good, idx, 0, &fail), RT_PARAM_INVALID);
        IS(aclrtMemcpyBatch(dsts, maxs, srcs, sizes, 2, good, bad_idx, 2, &fail), RT_PARAM_INVALID);
        IS(aclrtMemcpyBatch(dsts, maxs, srcs, sizes, 2, wrong_dev, idx, 2, &fail), RT_PARAM_INVALID);
        check(fail == 1, "the wrong device id is pair 1's");
        IS(aclrtMemcpyBatch(dsts, maxs, srcs, sizes, 2, h2h, idx, 2, &fail), RT_PARAM_INVALID);
        check(fail == 1, "H2H is pair 1's");
        {
            void *past[2] = {(char *)d + N + 1, back};
            IS(aclrtMemcpyBatch(past, maxs, srcs, sizes, 2, good, idx, 2, &fail), RT_PARAM_INVALID);
            check(fail == 0, "a device range past its allocation's end is pair 0's");
        }
        {
            unsigned char dcheck[64];
            IS(aclrtMemcpy(dcheck, sizeof dcheck, d, sizeof dcheck, 2), 0);
            check(memcmp(dcheck, h, sizeof dcheck) == 0 && memcmp(back, before, sizeof before) == 0,
                  "refused batches copied nothing");
        }
        {
            static void *many_d[4097], *many_s[4097];
            static size_t many_n[4097], many_m[4097];
            size_t z = 0;
            for (int i = 0; i < 4097; i++) {
                many_d[i] = d;
                many_s[i] = h;
                many_n[i] = 1;
                many_m[i] = 1;
            }
            IS(aclrtMemcpyBatch(many_d, many_m, many_s, many_n, 4097, good, &z, 1, &fail), RT_PARAM_INVALID);
        }
    }
    IS(aclrtFree(d), 0);
    free(h);
    free(back);
}

static void granularity(void) {
    aclrtPhysicalMemProp p;
    size_t g = 0;
    memset(&p, 0, sizeof p);
    p.memAttr = MEM_P2P_HUGE;
    p.location.type = LOC_HOST;
    IS(aclrtMemGetAllocationGranularity(&p, 0 /* MINIMUM */, &g), 0);
    check(g == 2u << 20, "2 MiB, what aclrtMallocPhysical takes");
    IS(aclrtMemGetAllocationGranularity(&p, 1 /* RECOMMENDED */, &g), 0);
    check(g == 2u << 20, "RECOMMENDED: 2 MiB");
    IS(aclrtMemGetAllocationGranularity(NULL, 0, &g), INVALID_PARAM);
    IS(aclrtMemGetAllocationGranularity(&p, 0, NULL), INVALID_PARAM);
    IS(aclrtMemGetAllocationGranularity(&p, 0xFFFF /* UNDEF */, &g), RT_PARAM_INVALID);
    p.memAttr = 0; /* ACL_DDR_MEM: not one ACL maps */
    IS(aclrtMemGetAllocationGranularity(&p, 0, &g), INVALID_PARAM);
    p.memAttr = DDR_MEM_HUGE;
    IS(aclrtMemGetAllocationGranularity(&p, 0, &g), 0);
    p.location.type = LOC_DEVICE;
    IS(aclrtMemGetAllocationGranularity(&p, 0, &g), INVALID_PARAM);
    p.memAttr = ACL_HBM_MEM_HUGE;
    IS(aclrtMemGetAllocationGranularity(&p, 0, &g), 0);
}

static void say(int fd, const void *p, size_t n) { check(write(fd, p, n) == (ssize_t)n, "write to the pipe"); }
static void hear(int fd, void *p, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        check(r > 0, "the other process is there");
        got += (size_t)r;
    }
}

/* The importer: device 5. Reads the exporter's bytes through the mapping, writes its own. */
static void importer(int in, int out) {
    char key[KEY_LEN], open_key[KEY_LEN], gone_key[KEY_LEN];
    unsigned char want[N], got[N];
    void *p = NULL, *p2 = NULL;
    int32_t me = (int32_t)getpid();
    IS(aclrtIpcMemImportByKey(&p, "hxipc-1-1", 0), RT_CONTEXT_NULL);
    IS(aclrtSetDevice(5), 0);
    say(out, &me, sizeof me);
    hear(in, key, sizeof key);
    hear(in, open_key, sizeof open_key);
    hear(in, gone_key, sizeof gone_key);
    hear(in, want, sizeof want);
    IS(aclrtIpcMemImportByKey(NULL, key, 0), INVALID_PARAM);
    IS(aclrtIpcMemImportByKey(&p, key, 2), RT_PARAM_INVALID);
    IS(aclrtIpcMemImportByKey(&p, "hxipc-no-such-key", 0), RT_PARAM_INVALID);
    IS(aclrtIpcMemImportByKey(&p, gone_key, 0), RT_PARAM_INVALID); /* its exporter has exited */
    /* the whitelisted key (the exporter listed this pid) and the open one both import */
    IS(aclrtIpcMemImportByKey(&p, key, 1 /* ENABLE_PEER_ACCESS */), 0);
    IS(aclrtIpcMemImportByKey(&p2, open_key, 0), 0);
    check(loc_of(p) == LOC_DEVICE, "imported memory is device memory of the importer");
    IS(aclrtMemcpy(got, N, p, N, 2), 0);
    check(memcmp(got, want, N) == 0, "the importer reads the exporter's bytes");
    IS(aclrtFree(p), RT_PARAM_INVALID);
    fill(want, N);
    IS(aclrtMemcpy(p2, N, want, N, 1), 0);
    say(out, want, N);
    hear(in, got, 1); /* the exporter checked them and ended the open key's export */
    IS(aclrtIpcMemClose(open_key), 0); /* this process's mapping of it */
    IS(aclrtIpcMemClose(open_key), RT_PARAM_INVALID);
    IS(aclrtIpcMemImportByKey(&p2, open_key, 0), RT_PARAM_INVALID); /* its export ended */
    IS(aclrtIpcMemClose(key), 0);
    IS(aclrtResetDevice(5), 0);
}

static void exporter(int in, int out) {
    char key[KEY_LEN], open_key[KEY_LEN], gone_key[KEY_LEN] = {0}, small[8];
    unsigned char data[N], got[N];
    void *d = NULL, *host = NULL;
    int32_t peer = 0;
    int gone[2], st = 0;
    pid_t g;
    IS(aclrtSetDevice(4), 0);
    IS(aclrtMalloc(&d, 2 * N, 1), 0);
    IS(aclrtMallocHost(&host, N), 0);
    fill(data, N);
    IS(aclrtMemcpy(d, N, data, N, 1), 0);
    IS(aclrtIpcMemGetExportKey(NULL, N, key, KEY_LEN, 0), INVALID_PARAM);
    IS(aclrtIpcMemGetExportKey(d, 0, key, KEY_LEN, 0), RT_PARAM_INVALID);
    IS(aclrtIpcMemGetExportKey(d, N, key, KEY_LEN, 2), RT_PARAM_INVALID);
    IS(aclrtIpcMemGetExportKey(d, N, small, sizeof small, 0), RT_PARAM_INVALID);
    IS(aclrtIpcMemGetExportKey(host, N, key, KEY_LEN, 0), RT_PARAM_INVALID);
    IS(aclrtIpcMemGetExportKey(d, 2 * N + 1, key, KEY_LEN, 0), RT_PARAM_INVALID);
    IS(aclrtIpcMemGetExportKey(d, N, key, KEY_LEN, 0), 0); /* whitelisted: SetImportPid below */
    IS(aclrtIpcMemGetExportKey((char *)d + N, N, open_key, KEY_LEN, 1), 0);
    IS(aclrtIpcMemSetImportPid("hxipc-not-mine", &peer, 1), RT_PARAM_INVALID);
    /* a key whose exporter exits without closing it */
    check(pipe(gone) == 0, "pipe");
    g = fork();
    check(g >= 0, "fork");
    if (g == 0) {
        void *x = NULL;
        char k[KEY_LEN];
        IS(aclrtSetDevice(6), 0);
        IS(aclrtMalloc(&x, N, 0), 0);
        IS(aclrtIpcMemGetExportKey(x, N, k, KEY_LEN, 1), 0);
        say(gone[1], k, sizeof k);
        _exit(0); /* no unload: its key file stays, naming a process that is gone */
    }
    hear(gone[0], gone_key, sizeof gone_key);
    check(waitpid(g, &st, 0) == g && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the short-lived exporter");
    hear(in, &peer, sizeof peer);
    IS(aclrtIpcMemSetImportPid(key, &peer, 1), 0);
    say(out, key, sizeof key);
    say(out, open_key, sizeof open_key);
    say(out, gone_key, sizeof gone_key);
    say(out, data, N);
    hear(in, data, N);
    IS(aclrtMemcpy(got, N, (char *)d + N, N, 2), 0);
    check(memcmp(got, data, N) == 0, "the exporter reads what the importer wrote");
    IS(aclrtIpcMemClose(open_key), 0); /* ends the export */
    say(out, "c", 1);
    IS(aclrtIpcMemClose("hxipc-not-mine"), RT_PARAM_INVALID);
    IS(aclrtFree(d), 0); /* ends the whitelisted key's export too */
    IS(aclrtFreeHost(host), 0);
}

int main(void) {
    int host = 0;
    void *dev = NULL;
    IS(aclrtHostRegister(&host, sizeof host, 0, &dev), RT_CONTEXT_NULL);
    {
        char a[8], b[8];
        void *dsts[1] = {a}, *srcs[1] = {b};
        size_t sizes[1] = {1}, idx[1] = {0}, fail = 0;
        aclrtMemcpyBatchAttr at[1] = {attr(LOC_DEVICE, 0, LOC_HOST, 0)};
        IS(aclrtMemcpyBatch(dsts, sizes, srcs, sizes, 1, at, idx, 1, &fail), RT_CONTEXT_NULL);
    }
    IS(aclrtSetDevice(3), 0);
    host_register();
    memcpy_batch();
    granularity();
    IS(aclrtResetDevice(3), 0);
    fork_pair(importer, exporter, "importer OK");
    return 0;
}
