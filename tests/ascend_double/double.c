/*
 * ABI test double for the ACL runtime and HCCL one-sided symbols hixl's Ascend backend uses.
 *
 * Built by src/device/double.rs with `cc -shared -fPIC -O1` into libascend_double-<source hash>.so,
 * and by tools/ascend-double.sh DIR under CANN's library names (libacl_rt.so, with
 * libascendcl.so, libhcomm.so, libhccl.so and libascend_hal.so as symlinks to it: one object,
 * so ACL and HCCL share state), so that programs built against CANN's headers run on it
 * unchanged: `tools/ascend-double.sh /tmp/cann && LD_LIBRARY_PATH=/tmp/cann ./program`.
 * Device memory is host memory; contexts are tokens (a default one per device, and those
 * aclrtCreateContext makes); the current context is thread-local; HcclBatchPut/HcclBatchGet really move bytes, within a process (memmove) or to
 * another process running the double (process_vm_writev/readv).
 *
 * Configuration (each key read from the environment unless set with hixl_double_control()):
 *   HIXL_ASCEND_DOUBLE_LOG   file to append one line per call to:
 *                            "<symbol> key=value ... rc=<code>"
 *   HIXL_ASCEND_DOUBLE_FAIL  comma-separated failures to inject:
 *                            "<symbol>"        that symbol fails (aclrtMalloc/aclrtMallocHost:
 *                                              207001, other acl*: 500000, Hccl*: 4)
 *                            "<symbol>=<code>" that symbol returns <code>
 *                            "sync_timeout"    aclrtSynchronizeStreamWithTimeout returns 507046
 *                                              (the queued copies stay queued, as on hardware;
 *                                              only aclrtStreamAbort drops them)
 *                            "misalign"        aclrtMalloc returns a pointer 64 bytes past a
 *                                              2 MiB boundary (the memory is valid)
 *   HIXL_ASCEND_DOUBLE_DIR   directory where processes announce themselves: a file named after
 *                            the device_ip of their rank, containing their pid (written by
 *                            HcclCommInitClusterInfoMemConfig for the caller's rank, logged as
 *                            "announce device_ip=<ip> pid=<pid>"; removed when the double is
 *                            unloaded; entries naming dead pids are ignored). Announcing also
 *                            sets PR_SET_PTRACER_ANY so peers may write under Yama scope 1.
 *                            Beside it, ".bound.<device_ip>" and ".lock.<device_ip>": the
 *                            ranges the process's ranks have bound (see "Remote ranges" below).
 *                            Unset or empty: $TMPDIR (or /tmp) + "/hixl-ascend-ranks-<uid>",
 *                            created 0700 and used only while private to this uid, so that the
 *                            processes of one user find each other with nothing set (both must
 *                            see the same $TMPDIR). Set to "" with hixl_double_control(): none
 *                            (ranks of one process still find each other).
 *   HIXL_ASCEND_DOUBLE_DEVICE_IP  if set, aclrtSetDevice announces this device_ip at once
 *   HIXL_ASCEND_DOUBLE_SOC   what aclrtGetSocName returns ("Ascend910B1" by default; an
 *                            "Ascend910_93xx" name is A3, an "Ascend950..." name is A5)
 *   HIXL_ASCEND_DOUBLE_PHY_MAP  logical->physical device ids, "L:P,L:P" (unlisted: L + 10, never
 *                            the identity: a container with remapped visible devices)
 *   HIXL_ASCEND_DOUBLE_SUPER_POD_ID  aclrtGetDeviceInfo(ACL_DEV_ATTR_SUPER_POD_ID) on A3 (0);
 *                            ACL_DEV_ATTR_SUPER_POD_DEVICE_ID is 1000 + the physical id
 *   HIXL_ASCEND_DOUBLE_INIT_HOLD_MS  how long each HcclCommInitClusterInfoMemConfig takes (0)
 *   HIXL_ASCEND_DOUBLE_DEVICE_COUNT  what aclrtGetDeviceCount returns (16, at most 64); device ids
 *                            from it on are 107001 ACL_ERROR_RT_INVALID_DEVICEID
 *
 * ACL as CANN behaves where programs depend on it (checked against hicann/runtime: the headers
 * include/external/acl/acl_rt.h for every signature, src/acl/aclrt_impl/{acl,device}.cpp,
 * src/runtime/api/impl/api_impl.cc, docs/zh/design/modules/context/context.md; each function
 * below names what it follows):
 *   - aclInit is optional: aclrtSetDevice and everything after it work without it (the upstream
 *     HIXL examples never call it); a repeated aclInit is 100002 ACL_ERROR_REPEAT_INITIALIZE, a
 *     repeated aclFinalize 100037 ACL_ERROR_REPEAT_FINALIZE;
 *   - aclrtSetDevice makes the device's default context current on the calling thread,
 *     aclrtCreateContext a new one; aclrtGetDevice/aclrtGetCurrentContext answer for the
 *     calling thread, 107002 ACL_ERROR_RT_CONTEXT_NULL when it has none; aclrtResetDevice
 *     releases one aclrtSetDevice, and with none left is 507007 ACL_ERROR_RT_CONTEXT_RELEASE_ERROR;
 *   - aclGetRecentErrMsg is NULL when nothing failed since it was last read, else the message
 *     (the double's own, or the last one reported through ReportInnerErrMsgForC).
 *
 * Rules the double enforces (so that the caller's discipline is testable):
 *   - a current context on the calling thread for aclrtGetDevice, aclrtMalloc(Host), aclrtFree
 *     (Host), aclrtMemcpy, stream calls (else 107002 ACL_ERROR_RT_CONTEXT_NULL), and for
 *     HcclRegisterGlobalMem, HcclCommInitClusterInfoMemConfig, HcclBatchPut/Get (else 15
 *     HCCL_E_RUNTIME);
 *   - stream calls and batch calls run under the context the stream was created in (else 107003
 *     ACL_ERROR_RT_STREAM_CONTEXT, or HCCL_E_PARA for batch calls);
 *   - HUGE_ONLY / HUGE_ONLY_P2P allocations are 2 MiB aligned, others 64-byte aligned;
 *   - batch calls need a prepared comm, a remote rank other than the own, and every local range
 *     inside a global memory registration bound to the comm (else HCCL_E_PARA);
 *   - batch calls reach only remote memory whose keys the remote rank exchanged, as HCCL's do
 *     (hixl relies on it: closing the communicators that bind a region fences peers off it):
 *     every remote range (per descriptor) must lie inside a global memory registration bound
 *     to the remote rank's live communicator of the same comm name, bound before that comm's
 *     latest HcclCommPrepare and not unbound since (else HCCL_E_PARA with nothing queued,
 *     logged "<symbol> rank=<r> num=<n> remote_unbound=<first bad descriptor> rc=1"); memory
 *     bound after the prepare is reachable once HcclCommPrepare runs again. Each copy is
 *     checked again when aclrtSynchronizeStreamWithTimeout runs it (see "Remote ranges");
 *   - deregistering memory still bound to a comm is HCCL_E_PARA.
 *   - HcclExchangeMemDesc (LLM-DataDist's explicit-rank-table link swaps a descriptor with each
 *     peer rank through it) is a rendezvous with the remote rank of the same comm name, in this
 *     process or another: each side posts its descriptors in HIXL_ASCEND_DOUBLE_DIR
 *     (".desc.<comm name in hex>.<from rank>.<to rank>", with its pid and start time) and waits
 *     up to its timeout for the other's, which it takes (renames, reads, removes). Only a post of
 *     the process that announced the remote rank's key, alive, counts. Unread posts go when their
 *     comm is destroyed or the double unloads; without a directory, ranks of one process post in
 *     memory. HcclMemDesc is HIXL's 512-byte layout (see
 *     there); HcclRemapRegistedMemory is a stub (fault recovery).
 * and what real HCCL checks (each a rule hixl once broke):
 *   - HcclCommInitClusterInfoMemConfig: the rank table's device_id of the caller's rank must be
 *     the physical id of the current device (else 7 HCCL_E_UNAVAIL); the comm name must be
 *     non-empty and not that of a live comm of the same rank (else HCCL_E_PARA; two ranks of one
 *     comm in one process stand for two processes); calls must not overlap (HCCL does not
 *     support parallel init: overlapping calls all fail with HCCL_E_INTERNAL); the table is
 *     checked as parse_rank_table() says;
 *   - HcclRegisterGlobalMem keeps one registry per process: the same range (address, size,
 *     type) gets the same handle back (logged "shared=1"; one deregister releases it), an
 *     overlapping range is HCCL_E_PARA;
 *   - batch calls on an "Ascend950" SoC take at most 64 descriptors (else HCCL_E_PARA);
 *   - HcclCommUnbindMem, HcclCommDestroy and HcclDeregisterGlobalMem refuse while copies of that
 *     comm (or touching that memory) are still queued on a stream (HCCL_E_PARA/_INTERNAL):
 *     abort (aclrtStreamAbort) or drain the stream first.
 *
 * Batch copies are queued on the stream and performed by aclrtSynchronizeStreamWithTimeout; a
 * copy that fails there (remote process gone, remote range unmapped, remote range no longer
 * bound) makes the sync return 507899 ACL_ERROR_RT_DRV_INTERNAL_ERROR with the reason in
 * aclGetRecentErrMsg; that copy and the ones queued after it do not run.
 *
 * Remote ranges (the rule above), checked at each batch call (HCCL_E_PARA) and again, under a
 * lock, just before each copy moves a byte at sync (507899):
 *   - remote rank in this process (both ranks on one loaded double): a lookup in the double's
 *     tables. At sync the lookup and the memmove happen under the double's mutex, which
 *     HcclCommUnbindMem and HcclCommDestroy take: no window.
 *   - remote rank in another process: each process publishes, per announce key (the device_ip
 *     its rank announced), the file "<dir>/.bound.<key>": "pid <pid> start <ticks>" (the start
 *     time from /proc/<pid>/stat, so that a later process given the same pid is not taken for
 *     it), then "<comm name in hex> <rank> <address in hex> <size>" per registration bound to a
 *     live prepared comm of that rank (and bound before its latest prepare). It is rewritten
 *     (temporary file + rename, so a reader sees the old or the new file whole) by
 *     HcclCommPrepare, HcclCommUnbindMem and HcclCommDestroy before they return; if the rewrite
 *     fails the file is removed (peers then refuse everything rather than trust stale ranges);
 *     the files go when the double unloads. A batch call reads the remote's file without a
 *     lock (it must name the pid HcclCommPrepare resolved, alive with the start time written;
 *     a missing or foreign file refuses every range); a sync holds
 *     "<dir>/.lock.<key>" shared (flock) from reading the file until its copies to that remote
 *     are done, and HcclCommUnbindMem/HcclCommDestroy hold it exclusively from before they
 *     change the tables until the file is rewritten. So an unbind waits for copies already
 *     checked, and copies checked after it see the new file.
 *   - the race window: none in one process, and none across processes while both are alive
 *     and no lock is held past 10 s. A remote that unbinds between a peer's batch call and its
 *     sync makes that sync fail (507899) without running the copy (copies before it in the
 *     same sync, checked while still bound, ran); an unbind that comes while a checked copy
 *     runs waits for it to finish. Past 10 s (a peer stopped while holding the lock shared) the
 *     unbind goes ahead (logged "publish key=<key> lock_timeout=1"), and a copy already checked
 *     may then touch memory no longer bound: still allocated until the remote deregisters and
 *     frees it, after which the copy either fails (EFAULT, 507899) or lands in whatever the
 *     remote's allocator put there. A sync that waits 10 s for an unbind in progress fails
 *     (507899) without copying. Memory freed without being unbound first is outside HCCL's
 *     contract and not detected (the check is of bindings, not allocations); nor is a remote
 *     comm destroyed and made again under the same name and rank told from the old one (once
 *     prepared, the new one's memory is reachable through a peer's old comm).
 *
 * Rank table: HCCL's version "1.0" format, as HIXL's RankTableGeneratorV1 produces it:
 *   {"version":"1.0","server_count":"1","server_list":[{"server_id":"...","device":[
 *     {"device_id":"0","device_ip":"192.168.1.8","rank_id":"0"}, ...]}],"status":"completed"}
 * or version "1.2" (RankTableGeneratorV2, A3) with "super_device_id" in every device and a
 * "super_pod_list":[{"super_pod_id":"0","server_list":[{"server_id":"..."}]}], or version "1.2"
 * with neither (upstream's Python samples build such tables; the rule and its evidence are at
 * parse_rank_table()).
 * The double reads, for every object holding a "rank_id", its "rank_id", "device_id",
 * "device_ip" and "super_device_id" (device objects are flat), and the top-level "version",
 * "server_count" and the "super_pod_id"s. A rank without device_ip is found by
 * "sdid_<super_device_id>" or "phy_<device_id>" in HIXL_ASCEND_DOUBLE_DIR. At most 64 ranks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int aclError;
typedef int HcclResult;

enum {
    ACL_OK = 0,
    ACL_INVALID_PARAM = 100000,
    ACL_REPEAT_INITIALIZE = 100002,
    ACL_REPEAT_FINALIZE = 100037,
    ACL_INTERNAL_ERROR = 500000,
    ACL_FEATURE_UNSUPPORTED = 200006,
    RT_PARAM_INVALID = 107000,
    RT_INVALID_DEVICEID = 107001,
    RT_CONTEXT_NULL = 107002,
    RT_STREAM_CONTEXT = 107003,
    RT_MEMORY_ALLOCATION = 207001,
    RT_CONTEXT_RELEASE_ERROR = 507007,
    RT_STREAM_SYNC_TIMEOUT = 507046,
    RT_DRV_INTERNAL_ERROR = 507899,
};

enum {
    HCCL_OK = 0,
    HCCL_E_PARA = 1,
    HCCL_E_PTR = 2,
    HCCL_E_MEMORY = 3,
    HCCL_E_INTERNAL = 4,
    HCCL_E_UNAVAIL = 7,
    HCCL_E_TIMEOUT = 9,
    HCCL_E_RUNTIME = 15,
};

#define MAX_DEVICES 64
#define MAX_RANKS 64
#define HUGE_PAGE (2u << 20)

typedef struct {
    int type;
    void *addr;
    uint64_t size;
} CommMem;

typedef struct {
    void *localAddr;
    void *remoteAddr;
    uint64_t count;
    int dataType;
} HcclOneSideOpDesc;

typedef struct {
    int topoType;
    uint64_t rsvd0, rsvd1, rsvd2;
} HcclPrepareConfig;

typedef struct {
    size_t configSize;
    uint32_t magicWord;
    uint32_t version;
    uint64_t reserved;
    uint32_t hcclBufferSize;
    uint32_t hcclDeterministic;
    char hcclCommName[128];
    char hcclUdi[128];
    uint32_t hcclOpExpansionMode;
    uint32_t hcclRdmaTrafficClass;
    uint32_t hcclRdmaServiceLevel;
} HcclCommConfigV5;

/* ------------------------------------------------------------------------------------------ */
/* state                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* A context: the default one of a device (ctxs[device], made by aclrtSetDevice, counted by
 * refs) or one made by aclrtCreateContext (on the user_ctxs list, refs 1 while alive; never
 * freed, so that a thread still naming a destroyed one finds it dead rather than reused). */
typedef struct Ctx {
    struct Ctx *next;
    int device;
    int refs;
} Ctx;

/* An allocation of aclrtMalloc (device memory: a memfd mapped shared, so that
 * aclrtIpcMemGetExportKey can hand it to another process), aclrtMallocHost (posix_memalign), or
 * a mapping aclrtIpcMemImportByKey made of another process's device memory. */
typedef struct Alloc {
    struct Alloc *next;
    void *base;    /* the mapping's start (device, imported) or what posix_memalign returned (host) */
    void *ptr;     /* what the caller got */
    size_t size;
    int host;
    int fd;        /* device memory: its memfd (-1 otherwise) */
    size_t maplen; /* device and imported memory: the mapping's length */
    int device;    /* the device current when it was allocated (imported: when it was imported) */
    char key[72];  /* imported memory: the key it was imported by (empty otherwise) */
} Alloc;

typedef struct {
    int put;
    void *comm; /* the communicator that queued it */
    pid_t pid; /* 0: this process */
    void *local;
    void *remote;
    uint64_t len;
    /* whom the remote range must be bound to when the copy runs (see "Remote ranges") */
    char name[128]; /* the comm name */
    char key[64];   /* the remote rank's announce key */
    uint32_t rank;  /* the remote rank */
} Op;

typedef struct Stream {
    struct Stream *next;
    Ctx *ctx;
    Op *ops;
    size_t nops, cap;
} Stream;

typedef struct GMem {
    struct GMem *next;
    CommMem mem;
    int binds;
} GMem;

typedef struct Comm {
    struct Comm *next;
    uint32_t rank, nranks;
    char name[128];
    char ips[MAX_RANKS][64]; /* the key a rank announces itself under (see rank_key) */
    pid_t pids[MAX_RANKS];
    GMem *bound[1024];
    unsigned char exchanged[1024]; /* bound[i] was bound before a HcclCommPrepare: peers reach it */
    size_t nbound;
    int prepared;
} Comm;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static Ctx ctxs[MAX_DEVICES];
static Ctx *user_ctxs;
static int acl_inits;     /* aclInit's reference count */
static int acl_finalized; /* aclFinalize ran since the last successful aclInit */
static Alloc *allocs;
static Stream *streams;
static GMem *gmems;
static Comm *comms;
static char own_ips[MAX_RANKS][64];
static int n_own_ips;
static char announced_dir[4096];

static __thread Ctx *cur_ctx;
static __thread char errmsg[512];
static __thread char errmsg_out[512];

/* The remote ranges a remote rank of another process has bound to its live communicator of
 * one name, as it published them (see "Remote ranges" in the header). */
typedef struct {
    uint64_t lo, size;
} Range;

typedef struct {
    int fd;             /* the remote's lock file, held shared (-1: not held) */
    int loaded;         /* pid, key, name and rank say what was loaded */
    pid_t pid;
    char key[64];
    char name[128];
    uint32_t rank;
    Range *r;
    size_t n;
    char why[160];      /* empty when the ranges were read */
} Remote;

static int bound_here(const char *name, uint32_t rank, uintptr_t a, uint64_t len);
static Comm *find_comm(void *c);
static void remote_init(Remote *rm);
static void remote_drop(Remote *rm);
static int remote_load(Remote *rm, pid_t pid, const char *key, const char *name, uint32_t rank, int hold);
static int remote_has(const Remote *rm, uintptr_t a, uint64_t len);
static void drop_descs(const Comm *c);
static int vmm_run_copy(const Op *op, char *why, size_t cap);
static void ipc_forget(const Alloc *a);
static int host_registered(uintptr_t p);

/* ------------------------------------------------------------------------------------------ */
/* configuration, log, failure injection                                                       */
/* ------------------------------------------------------------------------------------------ */

/* The settings: key, environment variable, value set by hixl_double_control(). */
typedef struct {
    const char *key;
    const char *env;
    char value[4096];
    int set;
} Setting;

static Setting settings[] = {
    {"log", "HIXL_ASCEND_DOUBLE_LOG", "", 0},
    {"fail", "HIXL_ASCEND_DOUBLE_FAIL", "", 0},
    {"dir", "HIXL_ASCEND_DOUBLE_DIR", "", 0},
    {"device_ip", "HIXL_ASCEND_DOUBLE_DEVICE_IP", "", 0},
    {"soc", "HIXL_ASCEND_DOUBLE_SOC", "", 0},
    {"phy_map", "HIXL_ASCEND_DOUBLE_PHY_MAP", "", 0},
    {"super_pod_id", "HIXL_ASCEND_DOUBLE_SUPER_POD_ID", "", 0},
    {"init_hold_ms", "HIXL_ASCEND_DOUBLE_INIT_HOLD_MS", "", 0},
    {"device_count", "HIXL_ASCEND_DOUBLE_DEVICE_COUNT", "", 0},
};
#define N_SETTINGS (sizeof settings / sizeof settings[0])

EXPORT int hixl_double_control(const char *key, const char *value) {
    size_t i;
    if (key == NULL) return -1;
    for (i = 0; i < N_SETTINGS; i++) {
        if (strcmp(key, settings[i].key) != 0) continue;
        pthread_mutex_lock(&mu);
        if (value == NULL) {
            settings[i].set = 0;
            settings[i].value[0] = 0;
        } else {
            snprintf(settings[i].value, sizeof settings[i].value, "%s", value);
            settings[i].set = 1;
        }
        pthread_mutex_unlock(&mu);
        return 0;
    }
    return -1;
}

/* Copies the setting into out (empty when unset). Returns 1 when the value was set with
 * hixl_double_control() (even to ""), 0 when it came from the environment or is unset. */
static int setting(const char *key, char *out, size_t cap) {
    size_t i;
    const char *v = NULL;
    out[0] = 0;
    for (i = 0; i < N_SETTINGS; i++) {
        if (strcmp(key, settings[i].key) != 0) continue;
        pthread_mutex_lock(&mu);
        if (settings[i].set) {
            snprintf(out, cap, "%s", settings[i].value);
            pthread_mutex_unlock(&mu);
            return 1;
        }
        pthread_mutex_unlock(&mu);
        v = getenv(settings[i].env);
        snprintf(out, cap, "%s", v ? v : "");
        return 0;
    }
    return 0;
}

static void logf_(const char *fmt, ...) {
    char path[4096];
    char line[1024];
    va_list ap;
    int n, fd;
    setting("log", path, sizeof path);
    if (path[0] == 0) return;
    va_start(ap, fmt);
    n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    if (write(fd, line, (size_t)n) < 0) { /* best effort */ }
    close(fd);
}

static void set_err(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
}

/* Whether `token` is in the comma-separated fail list; *code gets "=<code>" if given. */
static int fail_has(const char *token, long *code) {
    char list[4096];
    char *save = NULL, *t;
    setting("fail", list, sizeof list);
    for (t = strtok_r(list, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        if (eq != NULL) *eq = 0;
        if (strcmp(t, token) == 0) {
            if (eq != NULL && code != NULL) *code = strtol(eq + 1, NULL, 10);
            return 1;
        }
    }
    return 0;
}

/* The injected return code for `sym`, or 0. */
static int injected(const char *sym, int dflt) {
    long code = dflt;
    if (!fail_has(sym, &code)) return 0;
    set_err("double: injected failure of %s (code %ld)", sym, code);
    return (int)code;
}

static int acl_inject(const char *sym) {
    int dflt = ACL_INTERNAL_ERROR;
    if (strcmp(sym, "aclrtMalloc") == 0 || strcmp(sym, "aclrtMallocHost") == 0) dflt = RT_MEMORY_ALLOCATION;
    return injected(sym, dflt);
}

#define ACL_FAIL_POINT(sym, fmt, ...)                                \
    do {                                                             \
        int inj_ = acl_inject(sym);                                  \
        if (inj_ != 0) {                                             \
            logf_(sym " " fmt " rc=%d", __VA_ARGS__, inj_);          \
            return inj_;                                             \
        }                                                            \
    } while (0)

#define HCCL_FAIL_POINT(sym, fmt, ...)                               \
    do {                                                             \
        int inj_ = injected(sym, HCCL_E_INTERNAL);                   \
        if (inj_ != 0) {                                             \
            logf_(sym " " fmt " rc=%d", __VA_ARGS__, inj_);          \
            return inj_;                                             \
        }                                                            \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* ACL                                                                                         */
/* ------------------------------------------------------------------------------------------ */

/* Whether c is a live context (a default one with references, or a created one not yet
 * destroyed). Under mu. */
static int ctx_valid(const Ctx *c) {
    const Ctx *u;
    if (c == NULL) return 0;
    if (c >= &ctxs[0] && c < &ctxs[MAX_DEVICES]) return c->refs > 0;
    for (u = user_ctxs; u != NULL; u = u->next)
        if (u == c) return u->refs > 0;
    return 0;
}

/* The number of devices: the "device_count" setting, 16 by default, at most MAX_DEVICES. */
static int device_count(void) {
    char v[32];
    long n;
    setting("device_count", v, sizeof v);
    n = strtol(v, NULL, 10);
    if (n <= 0) return 16;
    return n > MAX_DEVICES ? MAX_DEVICES : (int)n;
}

/* Returns 0 when the calling thread has a live current context. */
static int need_ctx(const char *sym) {
    int ok;
    pthread_mutex_lock(&mu);
    ok = ctx_valid(cur_ctx);
    pthread_mutex_unlock(&mu);
    if (ok) return 0;
    set_err("double: %s called without a current context on this thread", sym);
    return 1;
}

/* CANN's error manager (liberror_manager.so, which ACL's runtime depends on): its C entry for
 * an inner error, as HIXL's REPORT_INNER_ERR_MSG reports every failure. Here it becomes the
 * calling thread's message for aclGetRecentErrMsg, "<error_code>: Inner Error! <message>". */
EXPORT int32_t ReportInnerErrMsgForC(const char *file_name, const char *func, uint32_t line, const char *error_code,
                                     const char *format, ...) {
    va_list ap;
    int n;
    (void)file_name;
    (void)func;
    (void)line;
    if (error_code == NULL || format == NULL) return -1;
    n = snprintf(errmsg, sizeof errmsg, "%.16s: Inner Error! ", error_code);
    if (n < 0 || (size_t)n >= sizeof errmsg) return -1;
    va_start(ap, format);
    vsnprintf(errmsg + n, sizeof errmsg - (size_t)n, format, ap);
    va_end(ap);
    return 0;
}

EXPORT const char *aclGetRecentErrMsg(void) {
    if (errmsg[0] == 0) return NULL;
    memcpy(errmsg_out, errmsg, sizeof errmsg_out);
    errmsg[0] = 0;
    return errmsg_out;
}

/* CANN (src/acl/aclrt_impl/acl.cpp, aclInitImpl/aclFinalizeImpl): aclInit is reference
 * counted, a repeated call adds a reference and returns ACL_ERROR_REPEAT_INITIALIZE; aclFinalize
 * finalizes whatever the count, and only a second aclFinalize (without an aclInit between)
 * returns ACL_ERROR_REPEAT_FINALIZE. Nothing else needs aclInit (see aclrtSetDevice). */
EXPORT aclError aclInit(const char *configPath) {
    int rc = ACL_OK;
    ACL_FAIL_POINT("aclInit", "config=%s", configPath ? configPath : "(null)");
    pthread_mutex_lock(&mu);
    if (acl_inits > 0) {
        acl_inits++;
        rc = ACL_REPEAT_INITIALIZE;
    } else {
        acl_inits = 1;
        acl_finalized = 0;
    }
    pthread_mutex_unlock(&mu);
    logf_("aclInit config=%s rc=%d", configPath ? configPath : "(null)", rc);
    return rc;
}

EXPORT aclError aclFinalize(void) {
    int rc = ACL_OK;
    ACL_FAIL_POINT("aclFinalize", "%s", "");
    pthread_mutex_lock(&mu);
    if (acl_finalized) {
        rc = ACL_REPEAT_FINALIZE;
    } else {
        acl_finalized = 1;
        acl_inits = 0;
    }
    pthread_mutex_unlock(&mu);
    if (rc) set_err("double: aclFinalize: repeatedly finalized");
    logf_("aclFinalize rc=%d", rc);
    return rc;
}

static void announce(const char *ip);

/* CANN (src/acl/aclrt_impl/device.cpp aclrtSetDeviceImpl -> ApiImpl::SetDevice in
 * src/runtime/api/impl/api_impl.cc): no aclInit needed; retains the device's default context
 * (one reference per call, released by aclrtResetDevice) and makes it current on the calling
 * thread. The upstream HIXL examples call it without aclInit. */
EXPORT aclError aclrtSetDevice(int32_t deviceId) {
    int rc = ACL_OK, count = device_count();
    char ip[64];
    ACL_FAIL_POINT("aclrtSetDevice", "device=%d", deviceId);
    pthread_mutex_lock(&mu);
    if (deviceId < 0 || deviceId >= count) {
        rc = RT_INVALID_DEVICEID;
    } else {
        ctxs[deviceId].device = deviceId;
        ctxs[deviceId].refs++;
        cur_ctx = &ctxs[deviceId];
    }
    pthread_mutex_unlock(&mu);
    if (rc) set_err("double: aclrtSetDevice(%d): no such device (%d devices)", deviceId, count);
    logf_("aclrtSetDevice device=%d ctx=%p rc=%d", deviceId, rc ? NULL : (void *)cur_ctx, rc);
    if (rc == ACL_OK) {
        setting("device_ip", ip, sizeof ip);
        if (ip[0] != 0) announce(ip);
    }
    return rc;
}

/* CANN (ApiErrorDecorator::DeviceReset in src/runtime/api/impl/api_error.cc, and
 * Runtime::PrimaryContextRelease): an id that is no device is ACL_ERROR_RT_INVALID_DEVICEID; a
 * device with no aclrtSetDevice left to release ("has not been set or has already been reset")
 * is 507007 ACL_ERROR_RT_CONTEXT_RELEASE_ERROR; else one reference is released, the last one
 * ending the default context. */
EXPORT aclError aclrtResetDevice(int32_t deviceId) {
    int rc = ACL_OK, count = device_count();
    ACL_FAIL_POINT("aclrtResetDevice", "device=%d", deviceId);
    pthread_mutex_lock(&mu);
    if (deviceId < 0 || deviceId >= count) {
        rc = RT_INVALID_DEVICEID;
    } else if (ctxs[deviceId].refs == 0) {
        rc = RT_CONTEXT_RELEASE_ERROR;
    } else {
        ctxs[deviceId].refs--;
        if (ctxs[deviceId].refs == 0 && cur_ctx == &ctxs[deviceId]) cur_ctx = NULL;
    }
    pthread_mutex_unlock(&mu);
    if (rc == RT_INVALID_DEVICEID) set_err("double: aclrtResetDevice(%d): no such device (%d devices)", deviceId, count);
    if (rc == RT_CONTEXT_RELEASE_ERROR)
        set_err("double: aclrtResetDevice(%d): the device has not been set or has already been reset", deviceId);
    logf_("aclrtResetDevice device=%d rc=%d", deviceId, rc);
    return rc;
}

/* CANN (ApiImpl::GetDevice, and rtGetDevice in src/runtime/api/api_c_device.cc): the device of
 * the calling thread's current context, else ACL_ERROR_RT_CONTEXT_NULL, which callers rely on
 * (torch_npu's c10_npu::GetDevice, torch_npu/csrc/core/npu/NPUFunctions.cpp, then sets device 0). */
EXPORT aclError aclrtGetDevice(int32_t *deviceId) {
    ACL_FAIL_POINT("aclrtGetDevice", "%s", "");
    if (deviceId == NULL) return ACL_INVALID_PARAM;
    if (need_ctx("aclrtGetDevice")) {
        logf_("aclrtGetDevice rc=%d", RT_CONTEXT_NULL);
        return RT_CONTEXT_NULL;
    }
    *deviceId = cur_ctx->device;
    logf_("aclrtGetDevice device=%d rc=0", *deviceId);
    return ACL_OK;
}

/* CANN (ApiImpl::GetDeviceCount): the number of visible devices; here the "device_count"
 * setting (16). */
EXPORT aclError aclrtGetDeviceCount(uint32_t *count) {
    ACL_FAIL_POINT("aclrtGetDeviceCount", "%s", "");
    if (count == NULL) {
        set_err("double: aclrtGetDeviceCount: null count");
        logf_("aclrtGetDeviceCount rc=%d", ACL_INVALID_PARAM);
        return ACL_INVALID_PARAM;
    }
    *count = (uint32_t)device_count();
    logf_("aclrtGetDeviceCount count=%u rc=0", *count);
    return ACL_OK;
}

/* CANN (ApiImpl::ContextCreate; docs/zh/design/modules/context/context.md): a new context on
 * the device, current on the calling thread at once; no aclrtSetDevice needed. */
EXPORT aclError aclrtCreateContext(void **context, int32_t deviceId) {
    Ctx *c;
    int count = device_count();
    ACL_FAIL_POINT("aclrtCreateContext", "device=%d", deviceId);
    if (context == NULL) {
        set_err("double: aclrtCreateContext: null context pointer");
        logf_("aclrtCreateContext device=%d rc=%d", deviceId, ACL_INVALID_PARAM);
        return ACL_INVALID_PARAM;
    }
    if (deviceId < 0 || deviceId >= count) {
        set_err("double: aclrtCreateContext(%d): no such device (%d devices)", deviceId, count);
        logf_("aclrtCreateContext device=%d rc=%d", deviceId, RT_INVALID_DEVICEID);
        return RT_INVALID_DEVICEID;
    }
    c = calloc(1, sizeof *c);
    if (c == NULL) return RT_MEMORY_ALLOCATION;
    c->device = deviceId;
    c->refs = 1;
    pthread_mutex_lock(&mu);
    c->next = user_ctxs;
    user_ctxs = c;
    cur_ctx = c;
    pthread_mutex_unlock(&mu);
    *context = c;
    logf_("aclrtCreateContext device=%d ctx=%p rc=0", deviceId, (void *)c);
    return ACL_OK;
}

/* CANN (ApiImpl::ContextDestroy): only a live created context (a default one, or one already
 * destroyed, is ACL_ERROR_RT_CONTEXT_NULL); its streams go with it; it stops being current on
 * the calling thread (other threads naming it find it dead). */
EXPORT aclError aclrtDestroyContext(void *context) {
    Ctx *u;
    Stream **pp;
    int rc = RT_CONTEXT_NULL;
    ACL_FAIL_POINT("aclrtDestroyContext", "ctx=%p", context);
    pthread_mutex_lock(&mu);
    for (u = user_ctxs; u != NULL; u = u->next)
        if ((void *)u == context && u->refs > 0) {
            u->refs = 0;
            rc = ACL_OK;
            break;
        }
    if (rc == ACL_OK) {
        if (cur_ctx == u) cur_ctx = NULL;
        for (pp = &streams; *pp != NULL;) {
            Stream *s = *pp;
            if (s->ctx != u) {
                pp = &s->next;
                continue;
            }
            *pp = s->next;
            free(s->ops);
            free(s);
        }
    }
    pthread_mutex_unlock(&mu);
    if (rc) set_err("double: aclrtDestroyContext(%p): not a live context made by aclrtCreateContext", context);
    logf_("aclrtDestroyContext ctx=%p rc=%d", context, rc);
    return rc;
}

EXPORT aclError aclrtGetCurrentContext(void **ctx) {
    ACL_FAIL_POINT("aclrtGetCurrentContext", "%s", "");
    if (ctx == NULL) return ACL_INVALID_PARAM;
    if (need_ctx("aclrtGetCurrentContext")) {
        logf_("aclrtGetCurrentContext rc=%d", RT_CONTEXT_NULL);
        return RT_CONTEXT_NULL;
    }
    *ctx = cur_ctx;
    logf_("aclrtGetCurrentContext ctx=%p rc=0", (void *)cur_ctx);
    return ACL_OK;
}

EXPORT aclError aclrtSetCurrentContext(void *ctx) {
    int ok;
    ACL_FAIL_POINT("aclrtSetCurrentContext", "ctx=%p", ctx);
    pthread_mutex_lock(&mu);
    ok = ctx_valid((Ctx *)ctx);
    if (ok) cur_ctx = (Ctx *)ctx;
    pthread_mutex_unlock(&mu);
    if (!ok) set_err("double: aclrtSetCurrentContext(%p): not a live context", ctx);
    logf_("aclrtSetCurrentContext ctx=%p rc=%d", ctx, ok ? 0 : RT_PARAM_INVALID);
    return ok ? ACL_OK : RT_PARAM_INVALID;
}

/* The physical id of logical device `logical`: the "phy_map" setting ("L:P,L:P,..."), else
 * logical + 10 (never the identity, as in a container with remapped visible devices). */
static int phy_of(int logical) {
    char map[4096];
    char *save = NULL, *t;
    setting("phy_map", map, sizeof map);
    for (t = strtok_r(map, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(t, ':');
        if (colon == NULL) continue;
        *colon = 0;
        if (strtol(t, NULL, 10) == logical) return (int)strtol(colon + 1, NULL, 10);
    }
    return logical + 10;
}

EXPORT aclError aclrtGetPhyDevIdByLogicDevId(const int32_t logicDevId, int32_t *const phyDevId) {
    ACL_FAIL_POINT("aclrtGetPhyDevIdByLogicDevId", "logic=%d", logicDevId);
    if (phyDevId == NULL || logicDevId < 0 || logicDevId >= device_count()) {
        set_err("double: aclrtGetPhyDevIdByLogicDevId(%d): bad arguments", logicDevId);
        logf_("aclrtGetPhyDevIdByLogicDevId logic=%d rc=%d", logicDevId, RT_INVALID_DEVICEID);
        return RT_INVALID_DEVICEID;
    }
    *phyDevId = phy_of(logicDevId);
    logf_("aclrtGetPhyDevIdByLogicDevId logic=%d phy=%d rc=0", logicDevId, *phyDevId);
    return ACL_OK;
}

static char soc_name_buf[256];

/* The "soc" setting, "Ascend910B1" by default. */
static void soc_of(char *out, size_t cap) {
    setting("soc", out, cap);
    if (out[0] == 0) snprintf(out, cap, "%s", "Ascend910B1");
}

static int soc_is_a3(void) {
    char soc[256];
    soc_of(soc, sizeof soc);
    return strncmp(soc, "Ascend910_93", 12) == 0;
}

EXPORT const char *aclrtGetSocName(void) {
    char soc[256];
    soc_of(soc, sizeof soc);
    pthread_mutex_lock(&mu);
    snprintf(soc_name_buf, sizeof soc_name_buf, "%s", soc);
    pthread_mutex_unlock(&mu);
    logf_("aclrtGetSocName soc=%s", soc_name_buf);
    return soc_name_buf;
}

/* 403 ACL_DEV_ATTR_SUPER_POD_DEVICE_ID: 1000 + the physical id; 405 ACL_DEV_ATTR_SUPER_POD_ID:
 * the "super_pod_id" setting (0 by default). Only on A3 SoCs (else 200006). */
EXPORT aclError aclrtGetDeviceInfo(uint32_t deviceId, int attr, int64_t *value) {
    char pod[64];
    int rc = ACL_OK;
    ACL_FAIL_POINT("aclrtGetDeviceInfo", "device=%u attr=%d", deviceId, attr);
    if (value == NULL || deviceId >= (uint32_t)device_count()) rc = ACL_INVALID_PARAM;
    else if ((attr == 403 || attr == 405) && !soc_is_a3()) rc = ACL_FEATURE_UNSUPPORTED;
    else if (attr == 403) *value = 1000 + phy_of((int)deviceId);
    else if (attr == 405) {
        setting("super_pod_id", pod, sizeof pod);
        *value = strtoll(pod, NULL, 10);
    } else rc = ACL_INVALID_PARAM;
    if (rc) set_err("double: aclrtGetDeviceInfo(%u, %d) is not supported here", deviceId, attr);
    logf_("aclrtGetDeviceInfo device=%u attr=%d value=%lld rc=%d", deviceId, attr,
          rc ? -1LL : (long long)*value, rc);
    return rc;
}

/* Device memory: a memfd of `total` bytes (rounded up to whole pages) mapped shared at an
 * `align`-aligned address, so that another process can map the same pages (IPC). Returns the
 * mapping, or NULL with errno. */
static void *map_device(size_t total, size_t align, int *fd_out, size_t *maplen_out) {
    long page = sysconf(_SC_PAGESIZE);
    size_t len = (total + (size_t)page - 1) & ~((size_t)page - 1);
    size_t span = len + (align > (size_t)page ? align : 0);
    uintptr_t at;
    char *resv;
    void *m;
    int fd = memfd_create("hixl-double-device", MFD_CLOEXEC);
    if (fd < 0) return NULL;
    if (ftruncate(fd, (off_t)len) != 0) {
        close(fd);
        return NULL;
    }
    resv = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (resv == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    at = align > (size_t)page ? ((uintptr_t)resv + align - 1) & ~(uintptr_t)(align - 1) : (uintptr_t)resv;
    m = mmap((void *)at, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (m == MAP_FAILED) {
        munmap(resv, span);
        close(fd);
        return NULL;
    }
    if (at > (uintptr_t)resv) munmap(resv, at - (uintptr_t)resv);
    if ((uintptr_t)resv + span > at + len) munmap((void *)(at + len), (uintptr_t)resv + span - (at + len));
    *fd_out = fd;
    *maplen_out = len;
    return m;
}

static aclError do_malloc(const char *sym, void **out, size_t size, uint32_t policy, int host) {
    size_t align = 64;
    size_t total, maplen = 0;
    void *base = NULL;
    void *ptr;
    Alloc *a;
    int misalign = 0, fd = -1, device = 0;
    uint32_t p = policy & 0xffu;
    if (out == NULL || size == 0) {
        set_err("double: %s: null out pointer or zero size", sym);
        return ACL_INVALID_PARAM;
    }
    if (!host && (p == 1 || p == 4)) {
        align = HUGE_PAGE;
        misalign = fail_has("misalign", NULL);
    }
    total = size + (misalign ? 64 : 0);
    if (host) {
        if (posix_memalign(&base, align, total) != 0) base = NULL;
        else memset(base, 0, total);
    } else {
        base = map_device(total, align, &fd, &maplen); /* zeroed */
    }
    if (base == NULL) {
        set_err("double: %s: out of host memory for %zu bytes", sym, size);
        return RT_MEMORY_ALLOCATION;
    }
    ptr = (char *)base + (misalign ? 64 : 0);
    a = calloc(1, sizeof *a);
    if (a == NULL) {
        if (host) free(base);
        else {
            munmap(base, maplen);
            close(fd);
        }
        return RT_MEMORY_ALLOCATION;
    }
    pthread_mutex_lock(&mu);
    if (ctx_valid(cur_ctx)) device = cur_ctx->device;
    a->base = base;
    a->ptr = ptr;
    a->size = size;
    a->host = host;
    a->fd = fd;
    a->maplen = maplen;
    a->device = device;
    a->next = allocs;
    allocs = a;
    pthread_mutex_unlock(&mu);
    *out = ptr;
    return ACL_OK;
}

EXPORT aclError aclrtMalloc(void **devPtr, size_t size, uint32_t policy) {
    aclError rc;
    ACL_FAIL_POINT("aclrtMalloc", "size=%zu policy=%u", size, policy);
    if (need_ctx("aclrtMalloc")) {
        logf_("aclrtMalloc size=%zu policy=%u rc=%d", size, policy, RT_CONTEXT_NULL);
        return RT_CONTEXT_NULL;
    }
    rc = do_malloc("aclrtMalloc", devPtr, size, policy, 0);
    logf_("aclrtMalloc size=%zu policy=%u ptr=%p rc=%d", size, policy, rc ? NULL : *devPtr, rc);
    return rc;
}

EXPORT aclError aclrtMallocHost(void **hostPtr, size_t size) {
    aclError rc;
    ACL_FAIL_POINT("aclrtMallocHost", "size=%zu", size);
    if (need_ctx("aclrtMallocHost")) {
        logf_("aclrtMallocHost size=%zu rc=%d", size, RT_CONTEXT_NULL);
        return RT_CONTEXT_NULL;
    }
    rc = do_malloc("aclrtMallocHost", hostPtr, size, 0, 1);
    logf_("aclrtMallocHost size=%zu ptr=%p rc=%d", size, rc ? NULL : *hostPtr, rc);
    return rc;
}

static aclError do_free(const char *sym, void *ptr, int host) {
    Alloc **pp, *a = NULL;
    pthread_mutex_lock(&mu);
    for (pp = &allocs; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->ptr == ptr && (*pp)->host == host && (*pp)->key[0] == 0) {
            a = *pp;
            *pp = a->next;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    if (a == NULL) {
        set_err("double: %s(%p): not an allocation of this kind", sym, ptr);
        return RT_PARAM_INVALID;
    }
    if (host) free(a->base);
    else {
        ipc_forget(a); /* its exports end with it */
        munmap(a->base, a->maplen);
        close(a->fd);
    }
    free(a);
    return ACL_OK;
}

EXPORT aclError aclrtFree(void *devPtr) {
    aclError rc;
    ACL_FAIL_POINT("aclrtFree", "ptr=%p", devPtr);
    if (need_ctx("aclrtFree")) {
        logf_("aclrtFree ptr=%p rc=%d", devPtr, RT_CONTEXT_NULL);
        return RT_CONTEXT_NULL;
    }
    rc = do_free("aclrtFree", devPtr, 0);
    logf_("aclrtFree ptr=%p rc=%d", devPtr, rc);
    return rc;
}

EXPORT aclError aclrtFreeHost(void *hostPtr) {
    aclError rc;
    ACL_FAIL_POINT("aclrtFreeHost", "ptr=%p", hostPtr);
    if (need_ctx("aclrtFreeHost")) {
        logf_("aclrtFreeHost ptr=%p rc=%d", hostPtr, RT_CONTEXT_NULL);
        return RT_CONTEXT_NULL;
    }
    rc = do_free("aclrtFreeHost", hostPtr, 1);
    logf_("aclrtFreeHost ptr=%p rc=%d", hostPtr, rc);
    return rc;
}

EXPORT aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, int kind) {
    ACL_FAIL_POINT("aclrtMemcpy", "count=%zu kind=%d", count, kind);
    if (need_ctx("aclrtMemcpy")) {
        logf_("aclrtMemcpy count=%zu kind=%d rc=%d", count, kind, RT_CONTEXT_NULL);
        return RT_CONTEXT_NULL;
    }
    if (dst == NULL || src == NULL || count > destMax || kind < 0 || kind > 7) {
        set_err("double: aclrtMemcpy: bad arguments");
        logf_("aclrtMemcpy count=%zu kind=%d rc=%d", count, kind, ACL_INVALID_PARAM);
        return ACL_INVALID_PARAM;
    }
    memmove(dst, src, count);
    logf_("aclrtMemcpy count=%zu kind=%d rc=0", count, kind);
    return ACL_OK;
}

static Stream *find_stream(void *s) {
    Stream *it;
    for (it = streams; it != NULL; it = it->next)
        if ((void *)it == s) return it;
    return NULL;
}

EXPORT aclError aclrtCreateStream(void **stream) {
    Stream *s;
    ACL_FAIL_POINT("aclrtCreateStream", "%s", "");
    if (stream == NULL) return ACL_INVALID_PARAM;
    if (need_ctx("aclrtCreateStream")) {
        logf_("aclrtCreateStream rc=%d", RT_CONTEXT_NULL);
        return RT_CONTEXT_NULL;
    }
    s = calloc(1, sizeof *s);
    if (s == NULL) return RT_MEMORY_ALLOCATION;
    s->ctx = cur_ctx;
    pthread_mutex_lock(&mu);
    s->next = streams;
    streams = s;
    pthread_mutex_unlock(&mu);
    *stream = s;
    logf_("aclrtCreateStream stream=%p ctx=%p rc=0", (void *)s, (void *)s->ctx);
    return ACL_OK;
}

/* Checks the stream exists and belongs to the current context. */
static int stream_check(const char *sym, void *stream, Stream **out) {
    Stream *s;
    int rc = 0;
    pthread_mutex_lock(&mu);
    s = find_stream(stream);
    if (s == NULL) rc = RT_PARAM_INVALID;
    else if (!ctx_valid(cur_ctx)) rc = RT_CONTEXT_NULL;
    else if (s->ctx != cur_ctx) rc = RT_STREAM_CONTEXT;
    pthread_mutex_unlock(&mu);
    if (rc == RT_PARAM_INVALID) set_err("double: %s(%p): unknown stream", sym, stream);
    if (rc == RT_CONTEXT_NULL) set_err("double: %s called without a current context", sym);
    if (rc == RT_STREAM_CONTEXT) set_err("double: %s: stream %p belongs to another context", sym, stream);
    *out = s;
    return rc;
}

EXPORT aclError aclrtDestroyStream(void *stream) {
    Stream *s, **pp;
    int rc;
    ACL_FAIL_POINT("aclrtDestroyStream", "stream=%p", stream);
    rc = stream_check("aclrtDestroyStream", stream, &s);
    if (rc == 0) {
        pthread_mutex_lock(&mu);
        for (pp = &streams; *pp != NULL; pp = &(*pp)->next)
            if (*pp == s) {
                *pp = s->next;
                break;
            }
        pthread_mutex_unlock(&mu);
        free(s->ops);
        free(s);
    }
    logf_("aclrtDestroyStream stream=%p rc=%d", stream, rc);
    return rc;
}

static int run_op(const Op *op, char *why, size_t cap) {
    ssize_t n;
    struct iovec l, r;
    if (op->len == 0) return 0;
    if (op->pid == 0) {
        if (op->put) memmove(op->remote, op->local, op->len);
        else memmove(op->local, op->remote, op->len);
        return 0;
    }
    l.iov_base = op->local;
    l.iov_len = op->len;
    r.iov_base = op->remote;
    r.iov_len = op->len;
    n = op->put ? process_vm_writev(op->pid, &l, 1, &r, 1, 0) : process_vm_readv(op->pid, &l, 1, &r, 1, 0);
    if (n == (ssize_t)op->len) return 0;
    snprintf(why, cap, "%s pid %d remote %p len %llu: %s", op->put ? "process_vm_writev" : "process_vm_readv",
             (int)op->pid, op->remote, (unsigned long long)op->len, n < 0 ? strerror(errno) : "short copy");
    return -1;
}

/* Runs one queued copy if its remote range is still bound to the remote rank's live
 * communicator (see "Remote ranges" in the header): in this process, the check and the memmove
 * under mu (which HcclCommUnbindMem and HcclCommDestroy take); across processes, under the
 * remote's lock file held shared (rm keeps it, and the ranges read, for the copies after this
 * one to the same remote). */
static int run_checked(const Op *op, Remote *rm, char *why, size_t cap) {
    int ok;
    const char *detail = "";
    if (op->comm == NULL) return vmm_run_copy(op, why, cap); /* aclrtMemcpyAsync (see "VMM") */
    if (op->pid == 0) {
        pthread_mutex_lock(&mu);
        ok = bound_here(op->name, op->rank, (uintptr_t)op->remote, op->len);
        if (ok) run_op(op, why, cap); /* a memmove: cannot fail */
        pthread_mutex_unlock(&mu);
        if (ok) return 0;
    } else {
        if (!rm->loaded || rm->pid != op->pid || rm->rank != op->rank || strcmp(rm->key, op->key) != 0 ||
            strcmp(rm->name, op->name) != 0) {
            remote_drop(rm);
            remote_load(rm, op->pid, op->key, op->name, op->rank, 1);
        }
        if (rm->why[0] == 0 && remote_has(rm, (uintptr_t)op->remote, op->len)) return run_op(op, why, cap);
        detail = rm->why;
    }
    snprintf(why, cap, "remote %p len %llu is not inside memory bound to rank %u's live communicator \"%s\"%s%s",
             op->remote, (unsigned long long)op->len, op->rank, op->name, detail[0] ? ": " : "", detail);
    return -1;
}

EXPORT aclError aclrtSynchronizeStreamWithTimeout(void *stream, int32_t timeout) {
    Stream *s;
    Op *ops;
    size_t nops, i;
    int rc;
    char why[512] = "";
    Remote rm;
    ACL_FAIL_POINT("aclrtSynchronizeStreamWithTimeout", "stream=%p timeout=%d", stream, timeout);
    rc = stream_check("aclrtSynchronizeStreamWithTimeout", stream, &s);
    if (rc != 0) {
        logf_("aclrtSynchronizeStreamWithTimeout stream=%p timeout=%d rc=%d", stream, timeout, rc);
        return rc;
    }
    if (fail_has("sync_timeout", NULL)) {
        /* a stream-sync timeout cancels nothing: the copies stay queued */
        pthread_mutex_lock(&mu);
        nops = s->nops;
        pthread_mutex_unlock(&mu);
        set_err("double: injected stream sync timeout after %d ms (%zu copies still queued)", timeout, nops);
        logf_("aclrtSynchronizeStreamWithTimeout stream=%p timeout=%d ops=%zu rc=%d", stream, timeout, nops,
              RT_STREAM_SYNC_TIMEOUT);
        return RT_STREAM_SYNC_TIMEOUT;
    }
    pthread_mutex_lock(&mu);
    ops = s->ops;
    nops = s->nops;
    s->ops = NULL;
    s->nops = s->cap = 0;
    pthread_mutex_unlock(&mu);
    remote_init(&rm);
    for (i = 0; i < nops; i++) {
        if (run_checked(&ops[i], &rm, why, sizeof why) != 0) {
            rc = RT_DRV_INTERNAL_ERROR;
            set_err("double: copy %zu failed: %s", i, why);
            break;
        }
    }
    remote_drop(&rm);
    free(ops);
    logf_("aclrtSynchronizeStreamWithTimeout stream=%p timeout=%d ops=%zu rc=%d", stream, timeout, nops, rc);
    return rc;
}

/* Drops the stream's queued copies (they never run). */
EXPORT aclError aclrtStreamAbort(void *stream) {
    Stream *s;
    size_t dropped = 0;
    int rc;
    ACL_FAIL_POINT("aclrtStreamAbort", "stream=%p", stream);
    rc = stream_check("aclrtStreamAbort", stream, &s);
    if (rc == 0) {
        pthread_mutex_lock(&mu);
        dropped = s->nops;
        free(s->ops);
        s->ops = NULL;
        s->nops = s->cap = 0;
        pthread_mutex_unlock(&mu);
    }
    logf_("aclrtStreamAbort stream=%p dropped=%zu rc=%d", stream, dropped, rc);
    return rc;
}

/* Whether a stream has queued copies of `comm` (or, with comm NULL, touching [lo, lo+len)). Under mu. */
static int queued_for(void *comm, uintptr_t lo, uint64_t len) {
    Stream *st;
    for (st = streams; st != NULL; st = st->next)
        for (size_t i = 0; i < st->nops; i++) {
            const Op *op = &st->ops[i];
            uintptr_t a = (uintptr_t)op->local;
            if (comm != NULL && op->comm == comm) return 1;
            if (comm == NULL && a < lo + len && lo < a + op->len) return 1;
        }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* process directory                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* The directory where processes announce themselves, into dir; returns -1 when there is none:
 *   - the "dir" setting set with hixl_double_control() (empty: announce nowhere);
 *   - else $HIXL_ASCEND_DOUBLE_DIR when set and not empty (used as it is);
 *   - else the default, $TMPDIR (or /tmp) + "/hixl-ascend-ranks-<uid>", made 0700 when `create`
 *     and used only if it is a directory of ours that no one else may write (lstat: not a
 *     symlink, owned by this uid, no group/other bits), so that no other user can plant
 *     announcements in it. */
static int dir_of(char *dir, size_t cap, int create) {
    const char *tmp;
    struct stat st;
    if (setting("dir", dir, cap)) return dir[0] == 0 ? -1 : 0;
    if (dir[0] != 0) return 0;
    tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] == 0) tmp = "/tmp";
    snprintf(dir, cap, "%s/hixl-ascend-ranks-%u", tmp, (unsigned)getuid());
    if (create && mkdir(dir, 0700) != 0 && errno != EEXIST) {
        set_err("double: cannot create %s: %s", dir, strerror(errno));
        logf_("announce dir=%s error=%s", dir, strerror(errno));
        return -1;
    }
    if (lstat(dir, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077) != 0) {
        set_err("double: %s is not a private directory of uid %u (mode %o, owner %u): not used", dir,
                (unsigned)getuid(), (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
        logf_("announce dir=%s refused=1", dir);
        return -1;
    }
    return 0;
}

static void announce(const char *ip) {
    char dir[4096], tmp[4400], path[4400], buf[32];
    int fd, n, i, known = 0;
    pthread_mutex_lock(&mu);
    for (i = 0; i < n_own_ips; i++)
        if (strcmp(own_ips[i], ip) == 0) known = 1;
    if (!known && n_own_ips < MAX_RANKS) snprintf(own_ips[n_own_ips++], 64, "%s", ip);
    pthread_mutex_unlock(&mu);
    if (dir_of(dir, sizeof dir, 1) != 0) return;
    /* let peers write into this process even under Yama ptrace_scope=1 */
    (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    pthread_mutex_lock(&mu);
    snprintf(announced_dir, sizeof announced_dir, "%s", dir);
    pthread_mutex_unlock(&mu);
    snprintf(tmp, sizeof tmp, "%s/.tmp.%d.%s", dir, (int)getpid(), ip);
    snprintf(path, sizeof path, "%s/%s", dir, ip);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    n = snprintf(buf, sizeof buf, "%d\n", (int)getpid());
    if (write(fd, buf, (size_t)n) < 0) { /* best effort */ }
    close(fd);
    if (rename(tmp, path) != 0) unlink(tmp);
    logf_("announce device_ip=%s pid=%d", ip, (int)getpid());
}

/* The pid serving `ip`: 0 for this process, -1 when unknown. */
static pid_t resolve(const char *ip) {
    char dir[4096], path[4400], buf[32];
    int fd, i;
    ssize_t n;
    long pid;
    pthread_mutex_lock(&mu);
    for (i = 0; i < n_own_ips; i++)
        if (strcmp(own_ips[i], ip) == 0) {
            pthread_mutex_unlock(&mu);
            return 0;
        }
    pthread_mutex_unlock(&mu);
    if (dir_of(dir, sizeof dir, 0) != 0) return -1;
    snprintf(path, sizeof path, "%s/%s", dir, ip);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    pid = strtol(buf, NULL, 10);
    if (pid <= 0) return -1;
    if (pid == (long)getpid()) return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return -1; /* a stale announcement */
    return (pid_t)pid;
}

/* Removes this process's announcements (those still naming its pid) when the double unloads. */
__attribute__((destructor)) static void unannounce(void) {
    char path[8300], buf[32];
    int fd, i;
    ssize_t n;
    for (Comm *c = comms; c != NULL; c = c->next) drop_descs(c);
    if (announced_dir[0] == 0) return;
    for (i = 0; i < n_own_ips; i++) {
        snprintf(path, sizeof path, "%s/%s", announced_dir, own_ips[i]);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0) continue;
        buf[n] = 0;
        if (strtol(buf, NULL, 10) == (long)getpid()) unlink(path);
    }
    for (i = 0; i < n_own_ips; i++) {
        snprintf(path, sizeof path, "%s/.bound.%s", announced_dir, own_ips[i]);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0) continue;
        buf[n] = 0;
        if (strncmp(buf, "pid ", 4) != 0 || strtol(buf + 4, NULL, 10) != (long)getpid()) continue;
        unlink(path);
        snprintf(path, sizeof path, "%s/.lock.%s", announced_dir, own_ips[i]);
        unlink(path);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* remote bindings (see "Remote ranges" in the header)                                         */
/* ------------------------------------------------------------------------------------------ */

/* How long HcclCommUnbindMem/HcclCommDestroy wait for peers' copies in flight (holding the lock
 * file shared), and a peer's sync for an unbind in progress (holding it exclusively). */
#define LOCK_WAIT_MS 10000

static pthread_mutex_t pub_mu = PTHREAD_MUTEX_INITIALIZER; /* orders rewrites of the files */

/* Whether [a, a+len) lies inside [lo, lo+size). */
static int range_in(uintptr_t lo, uint64_t size, uintptr_t a, uint64_t len) {
    return a >= lo && len <= size && a - lo <= size - len;
}

/* Whether [a, a+len) is inside a global memory registration bound, before its latest
 * HcclCommPrepare, to this process's live prepared communicator `name` of rank `rank`. Under mu. */
static int bound_here(const char *name, uint32_t rank, uintptr_t a, uint64_t len) {
    const Comm *c;
    for (c = comms; c != NULL; c = c->next) {
        if (c->rank != rank || !c->prepared || strcmp(c->name, name) != 0) continue;
        for (size_t b = 0; b < c->nbound; b++)
            if (c->exchanged[b] && range_in((uintptr_t)c->bound[b]->mem.addr, c->bound[b]->mem.size, a, len))
                return 1;
    }
    return 0;
}

/* The comm name in hex (names may hold any byte but NUL): out holds 2 * 127 + 1 bytes. */
static void hexname(const char *name, char *out, size_t cap) {
    static const char digits[] = "0123456789abcdef";
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)name; *p != 0 && n + 2 < cap; p++) {
        out[n++] = digits[*p >> 4];
        out[n++] = digits[*p & 15];
    }
    out[n] = 0;
}

/* The start time of process `pid` (field 22 of /proc/<pid>/stat, clock ticks since boot), which
 * tells a live process from a later one given the same pid. -1 when there is no such process. */
static int proc_start(pid_t pid, unsigned long long *out) {
    char path[64], buf[1024];
    const char *p;
    ssize_t n;
    int fd;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (p == NULL) return -1;
    p++;
    for (int field = 2; field < 22; field++) { /* p is at the space before field + 1 */
        p = strchr(p, ' ');
        if (p == NULL) return -1;
        p++;
    }
    *out = strtoull(p, NULL, 10);
    return 0;
}

/* flock(fd, op) retried for up to ms milliseconds. */
static int flock_wait(int fd, int op, int ms) {
    struct timespec nap = {0, 1000 * 1000};
    for (int i = 0;; i++) {
        if (flock(fd, op | LOCK_NB) == 0) return 0;
        if (errno != EWOULDBLOCK && errno != EINTR) return -1;
        if (i >= ms) return -1;
        nanosleep(&nap, NULL);
    }
}

/* The whole file, NUL-terminated (free it), or NULL. */
static char *slurp(const char *path) {
    struct stat st;
    char *buf;
    size_t got = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    if (fstat(fd, &st) != 0 || st.st_size < 0 || (buf = malloc((size_t)st.st_size + 1)) == NULL) {
        close(fd);
        return NULL;
    }
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = 0;
    return buf;
}

/* Rewrites <dir>/.bound.<key> from this process's tables: "pid <pid> start <ticks>", then one
 * line "<comm name in hex> <rank> <address in hex> <size>" per registration bound (and
 * exchanged: bound before the latest prepare) to a live prepared comm whose own rank announced
 * itself under `key`. Written to a temporary file and renamed over the old one; when that fails
 * the old file is removed, so that peers refuse rather than trust stale ranges. Under pub_mu. */
static void write_bound(const char *dir, const char *key) {
    char path[4400], tmp[4440], hex[260];
    char *buf = NULL;
    size_t len = 0, done = 0;
    unsigned long long start = 0;
    const char *err = NULL;
    const Comm *c;
    FILE *m;
    int fd;
    snprintf(path, sizeof path, "%s/.bound.%s", dir, key);
    /* per process and per loaded copy of the double (each has its own pub_mu) */
    snprintf(tmp, sizeof tmp, "%s/.bound.%s.tmp.%d.%p", dir, key, (int)getpid(), (void *)&pub_mu);
    if (proc_start(getpid(), &start) != 0) start = 0;
    m = open_memstream(&buf, &len);
    if (m == NULL) {
        err = "open_memstream failed";
    } else {
        fprintf(m, "pid %d start %llu\n", (int)getpid(), start);
        pthread_mutex_lock(&mu);
        for (c = comms; c != NULL; c = c->next) {
            if (!c->prepared || strcmp(c->ips[c->rank], key) != 0) continue;
            hexname(c->name, hex, sizeof hex);
            for (size_t b = 0; b < c->nbound; b++)
                if (c->exchanged[b])
                    fprintf(m, "%s %u %llx %llu\n", hex, c->rank, (unsigned long long)(uintptr_t)c->bound[b]->mem.addr,
                            (unsigned long long)c->bound[b]->mem.size);
        }
        pthread_mutex_unlock(&mu);
        if (fclose(m) != 0 || buf == NULL) err = "open_memstream failed";
    }
    if (err == NULL) {
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) err = strerror(errno);
        while (err == NULL && done < len) {
            ssize_t n = write(fd, buf + done, len - done);
            if (n <= 0) err = n < 0 ? strerror(errno) : "short write";
            else done += (size_t)n;
        }
        if (fd >= 0 && close(fd) != 0 && err == NULL) err = strerror(errno);
        if (err == NULL && rename(tmp, path) != 0) err = strerror(errno);
    }
    free(buf);
    if (err != NULL) {
        unlink(tmp);
        unlink(path);
        logf_("publish key=%s error=%s", key, err);
    }
}

/* A change to this process's bindings: pub_begin before it, pub_end after (which rewrites the
 * file of the comm's own key). `exclusive` (for changes that take ranges away: unbind, destroy)
 * also holds <dir>/.lock.<key> exclusively from before the change until the file is rewritten,
 * so that no peer copy checked against the old file is still running after it. */
typedef struct {
    char dir[4096];
    char key[64];
    int fd;
    int lock_timeout;
} Pub;

static void pub_begin(Pub *p, void *comm, int exclusive) {
    char path[4400];
    Comm *c;
    pthread_mutex_lock(&pub_mu);
    p->dir[0] = p->key[0] = 0;
    p->fd = -1;
    p->lock_timeout = 0;
    pthread_mutex_lock(&mu);
    c = find_comm(comm);
    if (c != NULL && announced_dir[0] != 0) {
        snprintf(p->dir, sizeof p->dir, "%s", announced_dir);
        snprintf(p->key, sizeof p->key, "%s", c->ips[c->rank]);
    }
    pthread_mutex_unlock(&mu);
    if (p->key[0] == 0) return; /* announced nowhere: no peer in another process finds us */
    snprintf(path, sizeof path, "%s/.lock.%s", p->dir, p->key);
    p->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (p->fd >= 0 && exclusive && flock_wait(p->fd, LOCK_EX, LOCK_WAIT_MS) != 0) p->lock_timeout = 1;
}

static void pub_end(Pub *p) {
    if (p->key[0] != 0) write_bound(p->dir, p->key);
    if (p->fd >= 0) close(p->fd); /* releases the lock */
    pthread_mutex_unlock(&pub_mu);
    if (p->lock_timeout) logf_("publish key=%s lock_timeout=1", p->key);
}

static void remote_init(Remote *rm) {
    memset(rm, 0, sizeof *rm);
    rm->fd = -1;
}

static void remote_drop(Remote *rm) {
    if (rm->fd >= 0) close(rm->fd); /* releases the shared lock */
    free(rm->r);
    remote_init(rm);
}

/* Reads the ranges the process `pid` published for rank `rank` of comm `name` under `key`, into
 * rm (rm->why says why not); `hold` takes the remote's lock file shared first, and keeps it
 * until remote_drop. */
static int remote_load(Remote *rm, pid_t pid, const char *key, const char *name, uint32_t rank, int hold) {
    char dir[4096], path[4400], hex[260], *buf, *line, *save = NULL;
    int fpid = 0;
    unsigned long long fstart = 0, start = 0;
    remote_drop(rm);
    rm->loaded = 1;
    rm->pid = pid;
    rm->rank = rank;
    snprintf(rm->key, sizeof rm->key, "%s", key);
    snprintf(rm->name, sizeof rm->name, "%s", name);
    if (dir_of(dir, sizeof dir, 0) != 0) {
        snprintf(rm->why, sizeof rm->why, "no announce directory to read the remote's bindings from");
        return -1;
    }
    if (hold) {
        snprintf(path, sizeof path, "%s/.lock.%s", dir, key);
        rm->fd = open(path, O_RDONLY | O_CLOEXEC);
        if (rm->fd < 0) {
            snprintf(rm->why, sizeof rm->why, "the remote process published no bindings (%s)", strerror(errno));
            return -1;
        }
        if (flock_wait(rm->fd, LOCK_SH, LOCK_WAIT_MS) != 0) {
            snprintf(rm->why, sizeof rm->why, "the remote's bindings stayed locked for %d ms", LOCK_WAIT_MS);
            return -1;
        }
    }
    snprintf(path, sizeof path, "%s/.bound.%s", dir, key);
    buf = slurp(path);
    if (buf == NULL) {
        snprintf(rm->why, sizeof rm->why, "the remote process published no bindings");
        return -1;
    }
    line = strtok_r(buf, "\n", &save);
    if (line == NULL || sscanf(line, "pid %d start %llu", &fpid, &fstart) != 2 || fpid != (int)pid) {
        snprintf(rm->why, sizeof rm->why, "the bindings under %s are not those of pid %d", key, (int)pid);
        free(buf);
        return -1;
    }
    if (proc_start(pid, &start) != 0 || start != fstart) {
        snprintf(rm->why, sizeof rm->why, "the remote process (pid %d) is gone", (int)pid);
        free(buf);
        return -1;
    }
    hexname(name, hex, sizeof hex);
    while ((line = strtok_r(NULL, "\n", &save)) != NULL) {
        char h[260];
        unsigned r;
        unsigned long long lo, size;
        Range *grown;
        if (sscanf(line, "%259s %u %llx %llu", h, &r, &lo, &size) != 4 || r != rank || strcmp(h, hex) != 0) continue;
        grown = realloc(rm->r, (rm->n + 1) * sizeof *grown);
        if (grown == NULL) break;
        rm->r = grown;
        rm->r[rm->n].lo = lo;
        rm->r[rm->n].size = size;
        rm->n++;
    }
    free(buf);
    return 0;
}

static int remote_has(const Remote *rm, uintptr_t a, uint64_t len) {
    for (size_t i = 0; i < rm->n; i++)
        if (range_in((uintptr_t)rm->r[i].lo, rm->r[i].size, a, len)) return 1;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* HCCL                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static GMem *find_gmem(void *h) {
    GMem *g;
    for (g = gmems; g != NULL; g = g->next)
        if ((void *)g == h) return g;
    return NULL;
}

static Comm *find_comm(void *c) {
    Comm *it;
    for (it = comms; it != NULL; it = it->next)
        if ((void *)it == c) return it;
    return NULL;
}

EXPORT HcclResult HcclRegisterGlobalMem(const CommMem *mem, void **memHandle) {
    GMem *g;
    HCCL_FAIL_POINT("HcclRegisterGlobalMem", "type=%d addr=%p size=%llu", mem ? mem->type : -1,
                    mem ? mem->addr : NULL, mem ? (unsigned long long)mem->size : 0ULL);
    if (mem == NULL || memHandle == NULL || mem->addr == NULL || mem->size == 0 ||
        (mem->type != 0 && mem->type != 1)) {
        set_err("double: HcclRegisterGlobalMem: bad arguments");
        logf_("HcclRegisterGlobalMem rc=%d", HCCL_E_PARA);
        return HCCL_E_PARA;
    }
    if (need_ctx("HcclRegisterGlobalMem")) {
        logf_("HcclRegisterGlobalMem type=%d addr=%p size=%llu rc=%d", mem->type, mem->addr,
              (unsigned long long)mem->size, HCCL_E_RUNTIME);
        return HCCL_E_RUNTIME;
    }
    /* one registry per process: the same range gets the same handle, an overlap is refused */
    pthread_mutex_lock(&mu);
    for (g = gmems; g != NULL; g = g->next) {
        uintptr_t lo = (uintptr_t)g->mem.addr, a = (uintptr_t)mem->addr;
        if (lo == a && g->mem.size == mem->size && g->mem.type == mem->type) break;
        if (a < lo + g->mem.size && lo < a + mem->size) {
            pthread_mutex_unlock(&mu);
            set_err("double: HcclRegisterGlobalMem: %p+%llu overlaps the registration %p+%llu", mem->addr,
                    (unsigned long long)mem->size, g->mem.addr, (unsigned long long)g->mem.size);
            logf_("HcclRegisterGlobalMem type=%d addr=%p size=%llu overlap=%p rc=%d", mem->type, mem->addr,
                  (unsigned long long)mem->size, (void *)g, HCCL_E_PARA);
            return HCCL_E_PARA;
        }
    }
    pthread_mutex_unlock(&mu);
    if (g != NULL) {
        *memHandle = g;
        logf_("HcclRegisterGlobalMem type=%d addr=%p size=%llu handle=%p shared=1 rc=0", mem->type, mem->addr,
              (unsigned long long)mem->size, (void *)g);
        return HCCL_OK;
    }
    g = calloc(1, sizeof *g);
    if (g == NULL) return HCCL_E_MEMORY;
    g->mem = *mem;
    pthread_mutex_lock(&mu);
    g->next = gmems;
    gmems = g;
    pthread_mutex_unlock(&mu);
    *memHandle = g;
    logf_("HcclRegisterGlobalMem type=%d addr=%p size=%llu handle=%p rc=0", mem->type, mem->addr,
          (unsigned long long)mem->size, (void *)g);
    return HCCL_OK;
}

EXPORT HcclResult HcclDeregisterGlobalMem(void *memHandle) {
    GMem **pp, *g = NULL;
    int rc = HCCL_OK;
    HCCL_FAIL_POINT("HcclDeregisterGlobalMem", "handle=%p", memHandle);
    pthread_mutex_lock(&mu);
    for (pp = &gmems; *pp != NULL; pp = &(*pp)->next)
        if ((void *)*pp == memHandle) {
            g = *pp;
            if (g->binds > 0 || queued_for(NULL, (uintptr_t)g->mem.addr, g->mem.size)) {
                rc = HCCL_E_PARA;
            } else {
                *pp = g->next;
            }
            break;
        }
    if (g == NULL) rc = HCCL_E_PARA;
    pthread_mutex_unlock(&mu);
    if (rc == HCCL_OK) free(g);
    else set_err("double: HcclDeregisterGlobalMem(%p): %s", memHandle, g ? "still bound to a comm or under a queued copy" : "unknown handle");
    logf_("HcclDeregisterGlobalMem handle=%p rc=%d", memHandle, rc);
    return rc;
}

/* Reads the string or number value of "key" inside [p, end) into out. */
static int json_field(const char *p, const char *end, const char *key, char *out, size_t cap) {
    char pat[64];
    const char *k, *v;
    size_t n = 0;
    snprintf(pat, sizeof pat, "\"%s\"", key);
    k = strstr(p, pat);
    if (k == NULL || k >= end) return -1;
    v = k + strlen(pat);
    while (v < end && (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r')) v++;
    if (v >= end || *v != ':') return -1;
    v++;
    while (v < end && (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r')) v++;
    if (v < end && *v == '"') {
        v++;
        while (v < end && *v != '"' && n + 1 < cap) out[n++] = *v++;
        if (v >= end || *v != '"') return -1;
    } else {
        while (v < end && *v >= '0' && *v <= '9' && n + 1 < cap) out[n++] = *v++;
        if (n == 0) return -1;
    }
    out[n] = 0;
    return 0;
}

static int count_key(const char *json, const char *key) {
    char pat[64];
    int n = 0;
    const char *p = json;
    snprintf(pat, sizeof pat, "\"%s\"", key);
    while ((p = strstr(p, pat)) != NULL) {
        n++;
        p += strlen(pat);
    }
    return n;
}

/* Parses the rank table into c->ips (the key each rank announces itself under: its device_ip,
 * else "sdid_<super_device_id>", else "phy_<device_id>") and devids; returns the number of
 * ranks, or -1 with *why set. Checks what HCCL's parser checks, and accepts what upstream's own
 * programs build:
 *   - "version" is "1.0" or "1.2"; a "1.2" table with a "super_pod_list" (A3's layout, as HIXL's
 *     RankTableGeneratorV2 writes it) has "super_device_id" in every device; a "1.2" table
 *     without one is read as a 1.0 table. The evidence: upstream HIXL's Python samples
 *     examples/python/llm_datadist/{pull_cache_sample,pull_blocks_sample,
 *     pull_from_cache_to_blocks}.py build version "1.2" tables with neither super_pod_list nor
 *     super_device_id (_build_single_rank_table, _build_distributed_rank_table), and
 *     examples/run_example.sh runs them (--is_single true) on CANN's HCCL;
 *   - a device without "device_ip" only where HCCL needs none: one server ("server_count" 1),
 *     or version 1.2 with all servers in one super pod (one "super_pod_id"). */
static int parse_rank_table(const char *json, Comm *c, long devids[MAX_RANKS], const char **why) {
    const char *p = json, *whole_end = json + strlen(json);
    int count = 0, seen[MAX_RANKS] = {0}, v12, missing_ip = 0, servers;
    char version[16], sc[16];
    if (json_field(json, whole_end, "version", version, sizeof version) != 0 ||
        (strcmp(version, "1.0") != 0 && strcmp(version, "1.2") != 0)) {
        *why = "version must be 1.0 or 1.2";
        return -1;
    }
    v12 = strcmp(version, "1.2") == 0;
    if (json_field(json, whole_end, "server_count", sc, sizeof sc) != 0) {
        *why = "no server_count";
        return -1;
    }
    servers = atoi(sc);
    /* a 1.2 table without a super_pod_list (upstream's samples build one) is read as 1.0 */
    if (v12 && strstr(json, "\"super_pod_list\"") == NULL) v12 = 0;
    if (v12 && count_key(json, "super_pod_id") < 1) {
        *why = "version 1.2 with a super_pod_list without super_pod_id";
        return -1;
    }
    while ((p = strstr(p, "\"rank_id\"")) != NULL) {
        const char *start = p, *end = p;
        char rid[16], ip[64], did[16], sdid[32];
        long r;
        while (start > json && *start != '{') start--;
        while (*end != 0 && *end != '}') end++;
        if (*start != '{' || *end != '}') { *why = "malformed device"; return -1; }
        if (json_field(start, end, "rank_id", rid, sizeof rid) != 0 ||
            json_field(start, end, "device_id", did, sizeof did) != 0) {
            *why = "a device without rank_id or device_id";
            return -1;
        }
        r = strtol(rid, NULL, 10);
        if (r < 0 || r >= MAX_RANKS || seen[r]) { *why = "bad or repeated rank_id"; return -1; }
        seen[r] = 1;
        devids[r] = strtol(did, NULL, 10);
        if (json_field(start, end, "super_device_id", sdid, sizeof sdid) != 0) {
            if (v12) { *why = "version 1.2 device without super_device_id (with a super_pod_list)"; return -1; }
            sdid[0] = 0;
        }
        if (json_field(start, end, "device_ip", ip, sizeof ip) == 0) {
            snprintf(c->ips[r], sizeof c->ips[r], "%s", ip);
        } else {
            missing_ip = 1;
            if (sdid[0] != 0) snprintf(c->ips[r], sizeof c->ips[r], "sdid_%s", sdid);
            else snprintf(c->ips[r], sizeof c->ips[r], "phy_%s", did);
        }
        count++;
        p = end;
    }
    for (int i = 0; i < count; i++)
        if (!seen[i]) { *why = "rank ids are not 0..n-1"; return -1; }
    if (missing_ip && servers > 1 && !(v12 && count_key(json, "super_pod_id") == 1)) {
        *why = "a device without device_ip between servers (not one A3 super pod)";
        return -1;
    }
    return count;
}

static int init_active, init_overlap;

static HcclResult init_comm(const char *rankTableJson, uint32_t rank, HcclCommConfigV5 *cfg, void **comm) {
    Comm *c, *it;
    int n, dup = 0, device;
    long devids[MAX_RANKS];
    const char *why = "";
    char name[128];
    if (rankTableJson == NULL || cfg == NULL || comm == NULL) {
        set_err("double: HcclCommInitClusterInfoMemConfig: null argument");
        logf_("HcclCommInitClusterInfoMemConfig rank=%u rc=%d", rank, HCCL_E_PTR);
        return HCCL_E_PTR;
    }
    if (cfg->magicWord != 0xf0f0f0f0u || cfg->version < 1 || cfg->configSize < 32) {
        set_err("double: HcclCommInitClusterInfoMemConfig: config not initialised (magic %#x version %u size %zu)",
                cfg->magicWord, cfg->version, cfg->configSize);
        logf_("HcclCommInitClusterInfoMemConfig rank=%u rc=%d", rank, HCCL_E_PARA);
        return HCCL_E_PARA;
    }
    if (need_ctx("HcclCommInitClusterInfoMemConfig")) {
        logf_("HcclCommInitClusterInfoMemConfig rank=%u rc=%d", rank, HCCL_E_RUNTIME);
        return HCCL_E_RUNTIME;
    }
    snprintf(name, sizeof name, "%.127s", cfg->configSize >= 32 + 128 ? cfg->hcclCommName : "");
    pthread_mutex_lock(&mu);
    for (it = comms; it != NULL; it = it->next)
        if (strcmp(it->name, name) == 0 && it->rank == rank) dup = 1;
    device = cur_ctx->device;
    pthread_mutex_unlock(&mu);
    if (name[0] == 0 || dup) {
        set_err("double: HcclCommInitClusterInfoMemConfig: comm name \"%s\" %s", name,
                name[0] == 0 ? "is empty" : "is in use by a live communicator of this rank");
        logf_("HcclCommInitClusterInfoMemConfig rank=%u name=%s dup=%d rc=%d", rank, name, dup, HCCL_E_PARA);
        return HCCL_E_PARA;
    }
    c = calloc(1, sizeof *c);
    if (c == NULL) return HCCL_E_MEMORY;
    n = parse_rank_table(rankTableJson, c, devids, &why);
    if (n <= 0 || rank >= (uint32_t)n) {
        free(c);
        set_err("double: HcclCommInitClusterInfoMemConfig: bad rank table (%s) or rank %u", why, rank);
        logf_("HcclCommInitClusterInfoMemConfig rank=%u why=%s rc=%d", rank, why, HCCL_E_PARA);
        return HCCL_E_PARA;
    }
    if (devids[rank] != phy_of(device)) {
        free(c);
        set_err("double: HcclCommInitClusterInfoMemConfig: the rank table's device_id %ld is not the physical "
                "id %d of the current device %d", devids[rank], phy_of(device), device);
        logf_("HcclCommInitClusterInfoMemConfig rank=%u device_id=%ld phy=%d rc=%d", rank, devids[rank],
              phy_of(device), HCCL_E_UNAVAIL);
        return HCCL_E_UNAVAIL;
    }
    c->rank = rank;
    c->nranks = (uint32_t)n;
    snprintf(c->name, sizeof c->name, "%s", name);
    for (int i = 0; i < n; i++) c->pids[i] = -1;
    c->pids[rank] = 0;
    announce(c->ips[rank]);
    pthread_mutex_lock(&mu);
    c->next = comms;
    comms = c;
    pthread_mutex_unlock(&mu);
    *comm = c;
    {
        char version[16] = "";
        json_field(rankTableJson, rankTableJson + strlen(rankTableJson), "version", version, sizeof version);
        logf_("HcclCommInitClusterInfoMemConfig rank=%u nranks=%d device_ip=%s name=%s version=%u size=%zu "
              "bufsize=%u tc=%u sl=%u table=%s device_id=%ld comm=%p rc=0",
              rank, n, c->ips[rank], name, cfg->version, cfg->configSize, cfg->hcclBufferSize,
              cfg->configSize >= 300 ? cfg->hcclRdmaTrafficClass : 0xffffffffu,
              cfg->configSize >= 300 ? cfg->hcclRdmaServiceLevel : 0xffffffffu, version, devids[rank], (void *)c);
    }
    return HCCL_OK;
}

/* HCCL does not support parallel communicator initialisation: a call that overlaps another one
 * fails (both fail), with HCCL_E_INTERNAL. The "init_hold_ms" setting makes each call take that
 * long, so that an overlap cannot slip through unnoticed. */
EXPORT HcclResult HcclCommInitClusterInfoMemConfig(const char *rankTableJson, uint32_t rank, HcclCommConfigV5 *cfg,
                                                   void **comm) {
    HcclResult rc;
    char hold[32];
    int overlapped;
    HCCL_FAIL_POINT("HcclCommInitClusterInfoMemConfig", "rank=%u", rank);
    pthread_mutex_lock(&mu);
    if (++init_active > 1) init_overlap = 1;
    pthread_mutex_unlock(&mu);
    setting("init_hold_ms", hold, sizeof hold);
    if (atol(hold) > 0) {
        struct timespec ts = {atol(hold) / 1000, (atol(hold) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    rc = init_comm(rankTableJson, rank, cfg, comm);
    pthread_mutex_lock(&mu);
    overlapped = init_overlap;
    if (--init_active == 0) init_overlap = 0;
    pthread_mutex_unlock(&mu);
    if (overlapped) {
        if (rc == HCCL_OK) {
            Comm **pp;
            pthread_mutex_lock(&mu);
            for (pp = &comms; *pp != NULL; pp = &(*pp)->next)
                if ((void *)*pp == *comm) {
                    Comm *c = *pp;
                    *pp = c->next;
                    free(c);
                    break;
                }
            pthread_mutex_unlock(&mu);
            *comm = NULL;
        }
        set_err("double: HcclCommInitClusterInfoMemConfig called while another call was running");
        logf_("HcclCommInitClusterInfoMemConfig rank=%u overlap=1 rc=%d", rank, HCCL_E_INTERNAL);
        return HCCL_E_INTERNAL;
    }
    return rc;
}

EXPORT HcclResult HcclCommBindMem(void *comm, void *memHandle) {
    Comm *c;
    GMem *g;
    int rc = HCCL_OK;
    HCCL_FAIL_POINT("HcclCommBindMem", "comm=%p handle=%p", comm, memHandle);
    pthread_mutex_lock(&mu);
    c = find_comm(comm);
    g = find_gmem(memHandle);
    if (c == NULL || g == NULL || c->nbound >= 1024) {
        rc = HCCL_E_PARA;
    } else {
        for (size_t i = 0; i < c->nbound; i++)
            if (c->bound[i] == g) rc = HCCL_E_PARA;
        if (rc == HCCL_OK) {
            c->exchanged[c->nbound] = 0; /* peers reach it after the next HcclCommPrepare */
            c->bound[c->nbound++] = g;
            g->binds++;
        }
    }
    pthread_mutex_unlock(&mu);
    if (rc) set_err("double: HcclCommBindMem: unknown comm/handle or already bound");
    logf_("HcclCommBindMem comm=%p handle=%p rc=%d", comm, memHandle, rc);
    return rc;
}

EXPORT HcclResult HcclCommUnbindMem(void *comm, void *memHandle) {
    Comm *c;
    Pub pub;
    int rc = HCCL_E_PARA;
    HCCL_FAIL_POINT("HcclCommUnbindMem", "comm=%p handle=%p", comm, memHandle);
    pub_begin(&pub, comm, 1);
    pthread_mutex_lock(&mu);
    c = find_comm(comm);
    if (c != NULL && !queued_for(comm, 0, 0)) {
        for (size_t i = 0; i < c->nbound; i++)
            if ((void *)c->bound[i] == memHandle) {
                c->bound[i]->binds--;
                c->nbound--;
                c->bound[i] = c->bound[c->nbound];
                c->exchanged[i] = c->exchanged[c->nbound];
                rc = HCCL_OK;
                break;
            }
    }
    pthread_mutex_unlock(&mu);
    pub_end(&pub);
    if (rc) set_err("double: HcclCommUnbindMem: not bound, or copies of the comm are still queued");
    logf_("HcclCommUnbindMem comm=%p handle=%p rc=%d", comm, memHandle, rc);
    return rc;
}

EXPORT HcclResult HcclCommPrepare(void *comm, const HcclPrepareConfig *cfg, const int timeout) {
    Comm *c;
    struct timespec t0, now, nap = {0, 5 * 1000 * 1000};
    uint32_t missing = 0;
    HCCL_FAIL_POINT("HcclCommPrepare", "comm=%p timeout=%d", comm, timeout);
    pthread_mutex_lock(&mu);
    c = find_comm(comm);
    pthread_mutex_unlock(&mu);
    if (c == NULL || cfg == NULL || cfg->topoType != 0 || timeout <= 0) {
        set_err("double: HcclCommPrepare: bad arguments");
        logf_("HcclCommPrepare comm=%p timeout=%d rc=%d", comm, timeout, HCCL_E_PARA);
        return HCCL_E_PARA;
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        missing = 0;
        for (uint32_t r = 0; r < c->nranks; r++) {
            pid_t pid;
            pthread_mutex_lock(&mu);
            pid = c->pids[r];
            pthread_mutex_unlock(&mu);
            if (pid >= 0) continue;
            pid = resolve(c->ips[r]);
            pthread_mutex_lock(&mu);
            c->pids[r] = pid;
            pthread_mutex_unlock(&mu);
            if (pid < 0) missing++;
        }
        if (missing == 0) break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000 >= (long)timeout * 1000) {
            set_err("double: HcclCommPrepare: %u peer(s) did not announce within %d s", missing, timeout);
            logf_("HcclCommPrepare comm=%p timeout=%d missing=%u rc=%d", comm, timeout, missing, HCCL_E_TIMEOUT);
            return HCCL_E_TIMEOUT;
        }
        nanosleep(&nap, NULL);
    }
    {
        Pub pub;
        pub_begin(&pub, comm, 0);
        pthread_mutex_lock(&mu);
        if (find_comm(comm) == c) { /* the keys of what is bound now are exchanged */
            c->prepared = 1;
            memset(c->exchanged, 1, c->nbound);
        }
        pthread_mutex_unlock(&mu);
        pub_end(&pub);
    }
    logf_("HcclCommPrepare comm=%p timeout=%d rc=0", comm, timeout);
    return HCCL_OK;
}

static size_t dtype_size(int t) {
    switch (t) {
    case 0: case 7: return 1;
    case 1: case 3: case 8: case 11: return 2;
    case 2: case 4: case 9: return 4;
    case 5: case 6: case 10: return 8;
    case 12: return 16;
    default: return 0;
    }
}

static HcclResult batch(const char *sym, int put, void *comm, uint32_t remoteRank, HcclOneSideOpDesc *desc,
                        uint32_t descNum, void *stream) {
    Comm *c;
    Stream *s;
    int rc = HCCL_OK;
    const char *why = "";
    char soc[256], name[128] = "", key[64] = "", detail[192] = "";
    pid_t pid = -1;
    uint32_t bad = UINT32_MAX; /* the first descriptor whose remote range is not bound */
    int inj = injected(sym, HCCL_E_INTERNAL);
    soc_of(soc, sizeof soc);
    if (inj != 0) {
        logf_("%s rank=%u num=%u rc=%d", sym, remoteRank, descNum, inj);
        return inj;
    }
    pthread_mutex_lock(&mu);
    c = find_comm(comm);
    s = find_stream(stream);
    if (!ctx_valid(cur_ctx)) {
        rc = HCCL_E_RUNTIME;
        why = "no current context on this thread";
    } else if (c == NULL || s == NULL) {
        rc = HCCL_E_PARA;
        why = "unknown comm or stream";
    } else if (s->ctx != cur_ctx) {
        rc = HCCL_E_PARA;
        why = "stream belongs to another context";
    } else if (!c->prepared) {
        rc = HCCL_E_PARA;
        why = "comm not prepared";
    } else if (remoteRank >= c->nranks || remoteRank == c->rank) {
        rc = HCCL_E_PARA;
        why = "bad remote rank";
    } else if (descNum > 0 && desc == NULL) {
        rc = HCCL_E_PTR;
        why = "null descriptors";
    } else if (descNum > 64 && strstr(soc, "Ascend950") != NULL) {
        rc = HCCL_E_PARA;
        why = "more than 64 descriptors in one call on Ascend950 (HCCL's V2 batch limit)";
    }
    for (uint32_t i = 0; rc == HCCL_OK && i < descNum; i++) {
        size_t es = dtype_size(desc[i].dataType);
        uint64_t len = desc[i].count * es;
        uintptr_t a = (uintptr_t)desc[i].localAddr;
        int inside = 0;
        if (es == 0 || (es > 1 && desc[i].count > UINT64_MAX / es)) {
            rc = HCCL_E_PARA;
            why = "bad data type or count";
            break;
        }
        for (size_t b = 0; b < c->nbound; b++)
            if (range_in((uintptr_t)c->bound[b]->mem.addr, c->bound[b]->mem.size, a, len)) inside = 1;
        if (!inside) {
            rc = HCCL_E_PARA;
            why = "local range is not inside memory bound to the comm";
            break;
        }
    }
    /* the remote ranges: bound to the remote rank's live communicator of this name (in this
     * process: in the tables; else as the remote process published them, below) */
    if (rc == HCCL_OK) {
        pid = c->pids[remoteRank];
        snprintf(name, sizeof name, "%s", c->name);
        snprintf(key, sizeof key, "%s", c->ips[remoteRank]);
        for (uint32_t i = 0; pid == 0 && i < descNum; i++)
            if (!bound_here(name, remoteRank, (uintptr_t)desc[i].remoteAddr,
                            desc[i].count * dtype_size(desc[i].dataType))) {
                bad = i;
                break;
            }
    }
    pthread_mutex_unlock(&mu);
    if (rc == HCCL_OK && pid != 0 && descNum > 0) {
        Remote rm;
        remote_init(&rm);
        if (remote_load(&rm, pid, key, name, remoteRank, 0) != 0) {
            bad = 0;
            snprintf(detail, sizeof detail, ": %s", rm.why);
        }
        for (uint32_t i = 0; bad == UINT32_MAX && i < descNum; i++)
            if (!remote_has(&rm, (uintptr_t)desc[i].remoteAddr, desc[i].count * dtype_size(desc[i].dataType)))
                bad = i;
        remote_drop(&rm);
    }
    if (bad != UINT32_MAX) {
        set_err("double: %s: the remote range %p+%llu (descriptor %u) is not inside memory bound to rank %u's live "
                "communicator \"%s\"%s", sym, desc[bad].remoteAddr,
                (unsigned long long)(desc[bad].count * dtype_size(desc[bad].dataType)), bad, remoteRank, name, detail);
        logf_("%s rank=%u num=%u remote_unbound=%u rc=%d", sym, remoteRank, descNum, bad, HCCL_E_PARA);
        return HCCL_E_PARA;
    }
    if (rc == HCCL_OK && descNum > 0) {
        pthread_mutex_lock(&mu);
        c = find_comm(comm);
        s = find_stream(stream);
        if (c == NULL || s == NULL) {
            rc = HCCL_E_PARA;
            why = "comm or stream destroyed during the call";
        } else if (s->nops + descNum > s->cap) {
            size_t cap = (s->nops + descNum) * 2;
            Op *n = realloc(s->ops, cap * sizeof *n);
            if (n == NULL) {
                rc = HCCL_E_MEMORY;
            } else {
                s->ops = n;
                s->cap = cap;
            }
        }
        for (uint32_t i = 0; rc == HCCL_OK && i < descNum; i++) {
            Op *op = &s->ops[s->nops++];
            op->put = put;
            op->comm = comm;
            op->pid = pid;
            op->local = desc[i].localAddr;
            op->remote = desc[i].remoteAddr;
            op->len = desc[i].count * dtype_size(desc[i].dataType);
            memcpy(op->name, name, sizeof op->name);
            memcpy(op->key, key, sizeof op->key);
            op->rank = remoteRank;
        }
        pthread_mutex_unlock(&mu);
    }
    if (rc) set_err("double: %s: %s", sym, why);
    logf_("%s rank=%u num=%u rc=%d", sym, remoteRank, descNum, rc);
    return rc;
}

EXPORT HcclResult HcclBatchPut(void *comm, uint32_t remoteRank, HcclOneSideOpDesc *desc, uint32_t descNum,
                               void *stream) {
    return batch("HcclBatchPut", 1, comm, remoteRank, desc, descNum, stream);
}

EXPORT HcclResult HcclBatchGet(void *comm, uint32_t remoteRank, HcclOneSideOpDesc *desc, uint32_t descNum,
                               void *stream) {
    return batch("HcclBatchGet", 0, comm, remoteRank, desc, descNum, stream);
}

/* ------------------------------------------------------------------------------------------ */
/* HcclExchangeMemDesc, HcclRemapRegistedMemory (LLM-DataDist's explicit-rank-table link)      */
/* ------------------------------------------------------------------------------------------ */

/* HcclMemDesc is 512 bytes in both published declarations: hcomm's public header has an opaque
 * `char desc[HCCL_MEM_DESC_LENGTH + 1]` with HCCL_MEM_DESC_LENGTH 511, and HIXL's private copy
 * (src/llm_datadist/comm_adapter/comm_types.h) `{u32 localRank; u32 remoteRank; char
 * desc[504]}` with HCCL_MEM_DESC_LENGTH 504. The two agree on the size (and so on the stride
 * of an array of them): hcomm reads the opaque bytes as its internal HcclMemDescData {u32
 * localRankId; u32 remoteRankId; char memDesc[511 + 1 - 8 = 504]}, HIXL's layout. The double
 * takes HIXL's (the one a caller fills) and checks its two rank fields. */
#define MEM_DESC_TEXT 504
typedef struct {
    uint32_t localRank;
    uint32_t remoteRank;
    char desc[MEM_DESC_TEXT];
} HcclMemDesc;

typedef struct {
    HcclMemDesc *array;
    uint32_t arrayLength;
} HcclMemDescs;

_Static_assert(sizeof(HcclMemDesc) == 512, "HcclMemDesc is 512 bytes");

#define MAX_MEM_DESCS 64
/* HCCL's own wait when the caller passes no timeout (hcomm ignores the argument and uses its
 * connect timeout, HCCL_CONNECT_TIMEOUT, 120 s by default) */
#define EXCHANGE_DEFAULT_S 120

/* "<dir>/.desc.<comm name in hex>.<from>.<to>": the descriptors rank `from` of the comm posted
 * for rank `to`. */
static void desc_path(char *out, size_t cap, const char *dir, const char *name, uint32_t from, uint32_t to) {
    char hex[260];
    hexname(name, hex, sizeof hex);
    snprintf(out, cap, "%s/.desc.%s.%u.%u", dir, hex, from, to);
}

/* Posts `n` descriptors for rank `to`: "pid <pid> start <ticks> n <n>\n" and the raw structs,
 * written to a temporary file and renamed, so a reader sees all of it or nothing. */
static int post_descs(const char *dir, const Comm *c, uint32_t to, const HcclMemDesc *d, uint32_t n) {
    char tmp[4400], path[4400], head[96];
    unsigned long long start = 0;
    int fd, len, ok;
    if (proc_start(getpid(), &start) != 0) return -1;
    desc_path(path, sizeof path, dir, c->name, c->rank, to);
    snprintf(tmp, sizeof tmp, "%s/.tmp.desc.%d.%p", dir, (int)getpid(), (const void *)c);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    len = snprintf(head, sizeof head, "pid %d start %llu n %u\n", (int)getpid(), start, n);
    ok = write(fd, head, (size_t)len) == len &&
         write(fd, d, (size_t)n * sizeof *d) == (ssize_t)((size_t)n * sizeof *d);
    close(fd);
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Takes the descriptors rank `from` posted for this rank, if there are any from the process
 * that serves `from` now (the pid its announcement names, alive with the start time written):
 * the file is claimed by renaming it (so it is read once), read, and removed. A file of another
 * process (a dead one, or one that served that rank before) is removed and ignored.
 * Returns 1 with the descriptors copied (*got of them), 0 when there are none yet. */
static int take_descs(const char *dir, const Comm *c, uint32_t from, HcclMemDescs *remote, uint32_t *got) {
    char path[4400], claimed[4500], buf[96 + MAX_MEM_DESCS * sizeof(HcclMemDesc)];
    unsigned long long start = 0, now = 0;
    unsigned n = 0;
    int pid = 0, fd, used = 0;
    ssize_t len;
    pid_t want;
    char *nl;
    desc_path(path, sizeof path, dir, c->name, from, c->rank);
    snprintf(claimed, sizeof claimed, "%s.taken.%d.%p", path, (int)getpid(), (void *)remote);
    if (rename(path, claimed) != 0) return 0;
    fd = open(claimed, O_RDONLY | O_CLOEXEC);
    unlink(claimed);
    if (fd < 0) return 0;
    len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len <= 0) return 0;
    buf[len] = 0;
    nl = memchr(buf, '\n', (size_t)len);
    if (nl == NULL || sscanf(buf, "pid %d start %llu n %u", &pid, &start, &n) != 3 || n > MAX_MEM_DESCS ||
        (size_t)(buf + len - (nl + 1)) != (size_t)n * sizeof(HcclMemDesc))
        return 0;
    want = resolve(c->ips[from]);
    if (want == 0) want = getpid();
    if (want < 0 || pid != (int)want || proc_start((pid_t)pid, &now) != 0 || now != start) {
        logf_("HcclExchangeMemDesc name=%s rank=%u remote=%u stale_pid=%d", c->name, c->rank, from, pid);
        return 0;
    }
    for (unsigned i = 0; i < n && i < remote->arrayLength; i++, used++)
        memcpy(&remote->array[i], nl + 1 + (size_t)i * sizeof(HcclMemDesc), sizeof(HcclMemDesc));
    *got = (uint32_t)used;
    return 1;
}

/* Without an announce directory, the ranks of one process post in memory. */
typedef struct Post {
    struct Post *next;
    char name[128];
    uint32_t from, to, n;
    HcclMemDesc d[MAX_MEM_DESCS];
} Post;
static Post *posts;

static int post_mem(const Comm *c, uint32_t to, const HcclMemDesc *d, uint32_t n) {
    Post *p = calloc(1, sizeof *p), **pp;
    if (p == NULL) return -1;
    snprintf(p->name, sizeof p->name, "%s", c->name);
    p->from = c->rank;
    p->to = to;
    p->n = n;
    memcpy(p->d, d, (size_t)n * sizeof *d);
    pthread_mutex_lock(&mu);
    for (pp = &posts; *pp != NULL; pp = &(*pp)->next)
        if (strcmp((*pp)->name, p->name) == 0 && (*pp)->from == p->from && (*pp)->to == to) {
            Post *old = *pp;
            *pp = old->next;
            free(old);
            break;
        }
    p->next = posts;
    posts = p;
    pthread_mutex_unlock(&mu);
    return 0;
}

static int take_mem(const Comm *c, uint32_t from, HcclMemDescs *remote, uint32_t *got) {
    Post **pp, *p = NULL;
    uint32_t used = 0;
    pthread_mutex_lock(&mu);
    for (pp = &posts; *pp != NULL; pp = &(*pp)->next)
        if (strcmp((*pp)->name, c->name) == 0 && (*pp)->from == from && (*pp)->to == c->rank) {
            p = *pp;
            *pp = p->next;
            break;
        }
    pthread_mutex_unlock(&mu);
    if (p == NULL) return 0;
    for (; used < p->n && used < remote->arrayLength; used++) remote->array[used] = p->d[used];
    *got = used;
    free(p);
    return 1;
}

/* Removes the descriptors this process posted for comm `c` that no peer took. */
static void drop_descs(const Comm *c) {
    char dir[4096], path[4400], head[64];
    int fd, pid;
    ssize_t n;
    Post **pp = &posts;
    pthread_mutex_lock(&mu);
    while (*pp != NULL) {
        if (strcmp((*pp)->name, c->name) == 0 && (*pp)->from == c->rank) {
            Post *old = *pp;
            *pp = old->next;
            free(old);
        } else {
            pp = &(*pp)->next;
        }
    }
    pthread_mutex_unlock(&mu);
    if (dir_of(dir, sizeof dir, 0) != 0) return;
    for (uint32_t r = 0; r < c->nranks; r++) {
        desc_path(path, sizeof path, dir, c->name, c->rank, r);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        n = read(fd, head, sizeof head - 1);
        close(fd);
        if (n <= 0) continue;
        head[n] = 0;
        if (sscanf(head, "pid %d", &pid) == 1 && pid == (int)getpid()) unlink(path);
    }
}

/* Swaps descriptors with rank `remoteRank` of the same comm name (in this process or another):
 * posts `local` for it in the announce directory, waits (polling every 5 ms) up to `timeout`
 * seconds (EXCHANGE_DEFAULT_S when it is not positive) for what the remote rank posted for this
 * one, and copies at most remote->arrayLength of them into remote->array (*actualNum: how
 * many). As hcomm's: the own rank is HCCL_SUCCESS with nothing exchanged (*actualNum left as it
 * was). Checks: a live comm (else HCCL_E_PARA), remoteRank below the comm's rank count
 * (HCCL_E_PARA), non-null pointers (HCCL_E_PTR), at most 64 local descriptors, each naming
 * this rank as localRank and remoteRank as remoteRank (HCCL_E_PARA); HCCL_E_TIMEOUT when the
 * remote rank posts nothing in time. Without an announce directory (the "dir" setting ""), the
 * ranks of one process find each other in memory. */
EXPORT HcclResult HcclExchangeMemDesc(void *comm, uint32_t remoteRank, HcclMemDescs *local, int timeout,
                                      HcclMemDescs *remote, uint32_t *actualNum) {
    Comm *c;
    Comm snap;
    char dir[4096];
    uint32_t got = 0;
    int use_dir;
    struct timespec t0, now, nap = {0, 5 * 1000 * 1000};
    long limit_ms = (long)(timeout > 0 ? timeout : EXCHANGE_DEFAULT_S) * 1000;
    HCCL_FAIL_POINT("HcclExchangeMemDesc", "comm=%p remote=%u", comm, remoteRank);
    if (local == NULL || remote == NULL || actualNum == NULL ||
        (local->arrayLength > 0 && local->array == NULL) || (remote->arrayLength > 0 && remote->array == NULL)) {
        set_err("double: HcclExchangeMemDesc: null argument");
        logf_("HcclExchangeMemDesc comm=%p remote=%u rc=%d", comm, remoteRank, HCCL_E_PTR);
        return HCCL_E_PTR;
    }
    pthread_mutex_lock(&mu);
    c = find_comm(comm);
    if (c != NULL) memcpy(&snap, c, sizeof snap);
    pthread_mutex_unlock(&mu);
    if (c == NULL || remoteRank >= snap.nranks) {
        set_err("double: HcclExchangeMemDesc: %s", c == NULL ? "unknown comm" : "remote rank outside the comm");
        logf_("HcclExchangeMemDesc comm=%p remote=%u rc=%d", comm, remoteRank, HCCL_E_PARA);
        return HCCL_E_PARA;
    }
    if (remoteRank == snap.rank) {
        logf_("HcclExchangeMemDesc comm=%p rank=%u remote=%u self=1 rc=0", comm, snap.rank, remoteRank);
        return HCCL_OK;
    }
    if (local->arrayLength > MAX_MEM_DESCS) {
        set_err("double: HcclExchangeMemDesc: %u descriptors (at most %d)", local->arrayLength, MAX_MEM_DESCS);
        logf_("HcclExchangeMemDesc comm=%p remote=%u num=%u rc=%d", comm, remoteRank, local->arrayLength,
              HCCL_E_PARA);
        return HCCL_E_PARA;
    }
    for (uint32_t i = 0; i < local->arrayLength; i++)
        if (local->array[i].localRank != snap.rank || local->array[i].remoteRank != remoteRank) {
            set_err("double: HcclExchangeMemDesc: descriptor %u names ranks %u -> %u, not %u -> %u", i,
                    local->array[i].localRank, local->array[i].remoteRank, snap.rank, remoteRank);
            logf_("HcclExchangeMemDesc comm=%p rank=%u remote=%u desc_ranks=%u,%u rc=%d", comm, snap.rank,
                  remoteRank, local->array[i].localRank, local->array[i].remoteRank, HCCL_E_PARA);
            return HCCL_E_PARA;
        }
    use_dir = dir_of(dir, sizeof dir, 1) == 0;
    if (use_dir ? post_descs(dir, &snap, remoteRank, local->array, local->arrayLength)
                : post_mem(&snap, remoteRank, local->array, local->arrayLength)) {
        set_err("double: HcclExchangeMemDesc: cannot post the descriptors in %s", use_dir ? dir : "memory");
        logf_("HcclExchangeMemDesc comm=%p remote=%u rc=%d", comm, remoteRank, HCCL_E_INTERNAL);
        return HCCL_E_INTERNAL;
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!(use_dir ? take_descs(dir, &snap, remoteRank, remote, &got) : take_mem(&snap, remoteRank, remote, &got))) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000 >= limit_ms) {
            set_err("double: HcclExchangeMemDesc: rank %u of comm \"%s\" posted nothing within %ld s", remoteRank,
                    snap.name, limit_ms / 1000);
            logf_("HcclExchangeMemDesc comm=%p rank=%u remote=%u timeout=%d rc=%d", comm, snap.rank, remoteRank,
                  timeout, HCCL_E_TIMEOUT);
            return HCCL_E_TIMEOUT;
        }
        nanosleep(&nap, NULL);
    }
    *actualNum = got;
    logf_("HcclExchangeMemDesc comm=%p rank=%u remote=%u num=%u got=%u timeout=%d rc=0", comm, snap.rank,
          remoteRank, local->arrayLength, got, timeout);
    return HCCL_OK;
}

/* Fault recovery (re-maps registered memory after a device reset): nothing to do on host
 * memory. Null arrays with non-zero sizes are HCCL_E_PTR; otherwise HCCL_SUCCESS. */
EXPORT HcclResult HcclRemapRegistedMemory(void **comm, CommMem *memInfoArray, uint64_t commSize, uint64_t arraySize) {
    HCCL_FAIL_POINT("HcclRemapRegistedMemory", "comms=%llu mems=%llu", (unsigned long long)commSize,
                    (unsigned long long)arraySize);
    if ((commSize > 0 && comm == NULL) || (arraySize > 0 && memInfoArray == NULL)) {
        set_err("double: HcclRemapRegistedMemory: null array");
        logf_("HcclRemapRegistedMemory comms=%llu mems=%llu rc=%d", (unsigned long long)commSize,
              (unsigned long long)arraySize, HCCL_E_PTR);
        return HCCL_E_PTR;
    }
    logf_("HcclRemapRegistedMemory comms=%llu mems=%llu rc=0", (unsigned long long)commSize,
          (unsigned long long)arraySize);
    return HCCL_OK;
}

EXPORT HcclResult HcclCommDestroy(void *comm) {
    Comm **pp, *c = NULL;
    Pub pub;
    HCCL_FAIL_POINT("HcclCommDestroy", "comm=%p", comm);
    pub_begin(&pub, comm, 1);
    pthread_mutex_lock(&mu);
    if (queued_for(comm, 0, 0)) {
        pthread_mutex_unlock(&mu);
        pub_end(&pub);
        set_err("double: HcclCommDestroy(%p): copies of the comm are still queued (abort the stream)", comm);
        logf_("HcclCommDestroy comm=%p queued=1 rc=%d", comm, HCCL_E_INTERNAL);
        return HCCL_E_INTERNAL;
    }
    for (pp = &comms; *pp != NULL; pp = &(*pp)->next)
        if ((void *)*pp == comm) {
            c = *pp;
            *pp = c->next;
            break;
        }
    if (c != NULL)
        for (size_t i = 0; i < c->nbound; i++) c->bound[i]->binds--;
    pthread_mutex_unlock(&mu);
    pub_end(&pub);
    if (c == NULL) {
        set_err("double: HcclCommDestroy(%p): unknown comm", comm);
        logf_("HcclCommDestroy comm=%p rc=%d", comm, HCCL_E_PARA);
        return HCCL_E_PARA;
    }
    drop_descs(c);
    logf_("HcclCommDestroy comm=%p bound=%zu rc=0", comm, c->nbound);
    free(c);
    return HCCL_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* VMM: virtual memory management and fabric shareable handles (FabricMem)                     */
/* ------------------------------------------------------------------------------------------ */
/*
 * ACL's virtual-memory calls (acl_rt.h: aclrtReserveMemAddress(NoUCMemory), aclrtMallocPhysical,
 * aclrtMapMem, aclrtMemExportToShareableHandleV2, ...), as HIXL's FabricMem engine and its
 * fabric_mem_d2d sample use them, across processes:
 *   - a reservation is an anonymous PROT_NONE mapping (2 MiB aligned; sizes a multiple of
 *     2 MiB, the granularity, else 100000 ACL_ERROR_INVALID_PARAM);
 *   - physical memory is a memfd of that size (aclrtMallocPhysical; location HOST/HOST_NUMA is
 *     host memory, DEVICE device memory, for aclrtPointerGetAttributes);
 *   - aclrtMapMem maps (MAP_SHARED | MAP_FIXED) the memfd into a range of one of this process's
 *     own reservations that nothing is mapped in yet; aclrtUnmapMem puts PROT_NONE back;
 *   - a physical handle is reference counted: aclrtMallocPhysical/Import make it (1),
 *     aclrtMemRetainAllocationHandle adds one (and returns the same handle), aclrtFreePhysical
 *     drops one; the memfd closes when no reference and no mapping is left;
 *   - the fabric handle (aclrtMemFabricHandle, 128 bytes; aclrtMemExportToShareableHandleV2 with
 *     ACL_MEM_SHARE_HANDLE_TYPE_FABRIC only: DEFAULT is 207000) carries the exporter's pid, its
 *     start time (/proc/<pid>/stat), the memfd's number, device and inode, and the size; an
 *     importer opens /proc/<pid>/fd/<fd> and checks the inode: a handle of a process that has
 *     gone (or of a later process given its pid, or of memory freed since) is 107000
 *     ACL_ERROR_RT_PARAM_INVALID with the reason in aclGetRecentErrMsg, never a crash;
 *   - aclrtMemcpyAsync queues a copy on the stream (run by aclrtSynchronizeStreamWithTimeout or
 *     aclrtStreamQuery, dropped by aclrtStreamAbort/aclrtStreamStop); when it runs, a range
 *     that touches a reservation must lie inside one live mapping (else 507899 with the
 *     reason), checked and copied under the double's mutex, so an unmap cannot race it.
 * aclrtGetLogicDevIdByUserDevId is the identity (no ASCEND_RT_VISIBLE_DEVICES here).
 */

enum {
    RT_FEATURE_NOT_SUPPORT = 207000,
    VMM_SHARE_FABRIC = 2,
    VMM_LOC_HOST = 0,
    VMM_LOC_DEVICE = 1,
    VMM_LOC_UNREGISTERED = 2,
    VMM_LOC_HOST_NUMA = 4,
};

typedef struct {
    uint32_t id;
    int type;
} VmmLocation;

typedef struct {
    int handleType;
    int allocationType;
    int memAttr;
    VmmLocation location;
    uint64_t reserve;
} VmmPhysProp;

typedef struct {
    VmmLocation location;
    uint32_t pageSize;
    uint32_t rsv[4];
} VmmPtrAttributes;

typedef struct {
    int flags;
    VmmLocation location;
    uint8_t rsv[12];
} VmmAccessDesc;

typedef struct Phys {
    struct Phys *next;
    int fd;
    size_t size;
    int refs;  /* handle references (malloc/import/retain minus free) */
    int maps;  /* live mappings */
    int host;  /* allocated with a host location */
    int exported; /* exported once: a handle and its shareable handle are one to one */
    dev_t dev;
    ino_t ino;
} Phys;

typedef struct Resv {
    struct Resv *next;
    uintptr_t base;
    size_t size;
} Resv;

typedef struct VMap {
    struct VMap *next;
    uintptr_t va;
    size_t size;
    Phys *phys;
    size_t offset;
} VMap;

/* The 128-byte fabric handle's contents. */
typedef struct {
    char magic[8];
    int32_t pid;
    int32_t fd;
    uint64_t start;
    uint64_t dev;
    uint64_t ino;
    uint64_t size;
} FabricWire;

static const char fabric_magic[8] = {'H', 'X', 'D', 'B', 'L', 'F', 'A', 'B'};
static Phys *physs;
static Resv *resvs;
static VMap *vmaps;

/* Under mu. */
static Phys *find_phys(void *h) {
    for (Phys *p = physs; p != NULL; p = p->next)
        if ((void *)p == h) return p;
    return NULL;
}

/* The reservation holding [a, a+len), under mu. */
static Resv *resv_of(uintptr_t a, size_t len) {
    for (Resv *r = resvs; r != NULL; r = r->next)
        if (a >= r->base && len <= r->size && a - r->base <= r->size - len) return r;
    return NULL;
}

/* The mapping holding [a, a+len) (len 0: the byte at a), under mu. */
static VMap *vmap_of(uintptr_t a, size_t len) {
    for (VMap *m = vmaps; m != NULL; m = m->next)
        if (a >= m->va && a - m->va < m->size && (len == 0 || len <= m->size - (a - m->va))) return m;
    return NULL;
}

/* Whether [a, a+len) touches any reservation, under mu. */
static int touches_resv(uintptr_t a, size_t len) {
    for (Resv *r = resvs; r != NULL; r = r->next)
        if (a < r->base + r->size && r->base < a + len) return 1;
    return 0;
}

/* Closes a physical allocation with no reference and no mapping left; under mu. */
static void phys_maybe_release(Phys *p) {
    Phys **pp;
    if (p->refs > 0 || p->maps > 0) return;
    for (pp = &physs; *pp != NULL; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    close(p->fd);
    free(p);
}

static aclError reserve(const char *sym, void **virPtr, size_t size, size_t alignment, void *expectPtr) {
    void *m;
    uintptr_t a, aligned;
    size_t align = alignment > HUGE_PAGE ? alignment : HUGE_PAGE;
    Resv *r;
    int inj = acl_inject(sym);
    if (inj != 0) {
        logf_("%s size=%zu rc=%d", sym, size, inj);
        return inj;
    }
    if (virPtr == NULL || size == 0 || size % HUGE_PAGE != 0 || (align & (align - 1)) != 0) {
        set_err("double: %s: null pointer, or size %zu not a positive multiple of 2 MiB", sym, size);
        logf_("%s size=%zu rc=%d", sym, size, ACL_INVALID_PARAM);
        return ACL_INVALID_PARAM;
    }
    m = mmap(expectPtr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        set_err("double: %s: cannot reserve %zu bytes: %s", sym, size, strerror(errno));
        logf_("%s size=%zu rc=%d", sym, size, RT_MEMORY_ALLOCATION);
        return RT_MEMORY_ALLOCATION;
    }
    a = (uintptr_t)m;
    aligned = (a + align - 1) & ~(uintptr_t)(align - 1);
    if (aligned > a) munmap(m, aligned - a);
    if (a + size + align > aligned + size) munmap((void *)(aligned + size), a + size + align - (aligned + size));
    r = calloc(1, sizeof *r);
    if (r == NULL) {
        munmap((void *)aligned, size);
        return RT_MEMORY_ALLOCATION;
    }
    r->base = aligned;
    r->size = size;
    pthread_mutex_lock(&mu);
    r->next = resvs;
    resvs = r;
    pthread_mutex_unlock(&mu);
    *virPtr = (void *)aligned;
    logf_("%s size=%zu va=%p rc=0", sym, size, (void *)aligned);
    return ACL_OK;
}

EXPORT aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr,
                                       uint64_t flags) {
    (void)flags;
    return reserve("aclrtReserveMemAddress", virPtr, size, alignment, expectPtr);
}

EXPORT aclError aclrtReserveMemAddressNoUCMemory(void **virPtr, size_t size, size_t alignment, void *expectPtr,
                                                 uint64_t flags) {
    (void)flags;
    return reserve("aclrtReserveMemAddressNoUCMemory", virPtr, size, alignment, expectPtr);
}

EXPORT aclError aclrtReleaseMemAddress(void *virPtr) {
    Resv **pp, *r = NULL;
    int rc = 0;
    ACL_FAIL_POINT("aclrtReleaseMemAddress", "va=%p", virPtr);
    pthread_mutex_lock(&mu);
    for (pp = &resvs; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->base == (uintptr_t)virPtr) {
            r = *pp;
            break;
        }
    if (r == NULL) rc = RT_PARAM_INVALID;
    else {
        for (VMap *m = vmaps; m != NULL; m = m->next)
            if (m->va >= r->base && m->va < r->base + r->size) rc = ACL_INVALID_PARAM;
        if (rc == 0) *pp = r->next;
    }
    pthread_mutex_unlock(&mu);
    if (rc == RT_PARAM_INVALID) set_err("double: aclrtReleaseMemAddress(%p): not a reservation", virPtr);
    if (rc == ACL_INVALID_PARAM) set_err("double: aclrtReleaseMemAddress(%p): memory is still mapped in it", virPtr);
    if (rc == 0) {
        munmap((void *)r->base, r->size);
        free(r);
    }
    logf_("aclrtReleaseMemAddress va=%p rc=%d", virPtr, rc);
    return rc;
}

EXPORT aclError aclrtMallocPhysical(void **handle, size_t size, const VmmPhysProp *prop, uint64_t flags) {
    Phys *p;
    int fd;
    struct stat st;
    (void)flags;
    ACL_FAIL_POINT("aclrtMallocPhysical", "size=%zu", size);
    if (need_ctx("aclrtMallocPhysical")) {
        logf_("aclrtMallocPhysical size=%zu rc=%d", size, RT_CONTEXT_NULL);
        return RT_CONTEXT_NULL;
    }
    if (handle == NULL || prop == NULL || size == 0 || size % HUGE_PAGE != 0) {
        set_err("double: aclrtMallocPhysical: null pointer, or size %zu not a positive multiple of 2 MiB", size);
        logf_("aclrtMallocPhysical size=%zu rc=%d", size, ACL_INVALID_PARAM);
        return ACL_INVALID_PARAM;
    }
    fd = memfd_create("hixl-double-physical", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 || fstat(fd, &st) != 0) {
        set_err("double: aclrtMallocPhysical: memfd of %zu bytes: %s", size, strerror(errno));
        if (fd >= 0) close(fd);
        logf_("aclrtMallocPhysical size=%zu rc=%d", size, RT_MEMORY_ALLOCATION);
        return RT_MEMORY_ALLOCATION;
    }
    p = calloc(1, sizeof *p);
    if (p == NULL) {
        close(fd);
        return RT_MEMORY_ALLOCATION;
    }
    p->fd = fd;
    p->size = size;
    p->refs = 1;
    p->host = prop->location.type == VMM_LOC_HOST || prop->location.type == VMM_LOC_HOST_NUMA;
    p->dev = st.st_dev;
    p->ino = st.st_ino;
    pthread_mutex_lock(&mu);
    p->next = physs;
    physs = p;
    pthread_mutex_unlock(&mu);
    *handle = p;
    logf_("aclrtMallocPhysical size=%zu host=%d handle=%p rc=0", size, p->host, (void *)p);
    return ACL_OK;
}

EXPORT aclError aclrtFreePhysical(void *handle) {
    Phys *p;
    int rc = 0;
    ACL_FAIL_POINT("aclrtFreePhysical", "handle=%p", handle);
    pthread_mutex_lock(&mu);
    p = find_phys(handle);
    if (p == NULL || p->refs <= 0) rc = RT_PARAM_INVALID;
    else {
        p->refs--;
        phys_maybe_release(p);
    }
    pthread_mutex_unlock(&mu);
    if (rc != 0) set_err("double: aclrtFreePhysical(%p): not a live physical allocation", handle);
    logf_("aclrtFreePhysical handle=%p rc=%d", handle, rc);
    return rc;
}

EXPORT aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, void *handle, uint64_t flags) {
    Phys *p;
    int rc = 0;
    uintptr_t a = (uintptr_t)virPtr;
    VMap *m = NULL;
    (void)flags;
    ACL_FAIL_POINT("aclrtMapMem", "va=%p size=%zu", virPtr, size);
    pthread_mutex_lock(&mu);
    p = find_phys(handle);
    if (p == NULL || p->refs <= 0) rc = RT_PARAM_INVALID;
    else if (size == 0 || size % HUGE_PAGE != 0 || a % HUGE_PAGE != 0 || offset % HUGE_PAGE != 0 ||
             offset > p->size || size > p->size - offset || resv_of(a, size) == NULL)
        rc = ACL_INVALID_PARAM;
    else
        for (VMap *o = vmaps; o != NULL; o = o->next)
            if (a < o->va + o->size && o->va < a + size) rc = ACL_INVALID_PARAM;
    if (rc == 0) {
        m = calloc(1, sizeof *m);
        if (m == NULL) rc = RT_MEMORY_ALLOCATION;
    }
    if (rc == 0 && mmap(virPtr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, p->fd, (off_t)offset) == MAP_FAILED) {
        set_err("double: aclrtMapMem: mmap: %s", strerror(errno));
        rc = RT_DRV_INTERNAL_ERROR;
    }
    if (rc == 0) {
        m->va = a;
        m->size = size;
        m->phys = p;
        m->offset = offset;
        m->next = vmaps;
        vmaps = m;
        p->maps++;
    } else {
        free(m);
    }
    pthread_mutex_unlock(&mu);
    if (rc == RT_PARAM_INVALID) set_err("double: aclrtMapMem: %p is not a live physical allocation", handle);
    if (rc == ACL_INVALID_PARAM)
        set_err("double: aclrtMapMem(%p, %zu, offset %zu): not 2 MiB aligned, beyond the allocation, outside this "
                "process's reservations, or over a mapping",
                virPtr, size, offset);
    logf_("aclrtMapMem va=%p size=%zu offset=%zu handle=%p rc=%d", virPtr, size, offset, handle, rc);
    return rc;
}

EXPORT aclError aclrtUnmapMem(void *virPtr) {
    VMap **pp, *m = NULL;
    int rc = 0;
    ACL_FAIL_POINT("aclrtUnmapMem", "va=%p", virPtr);
    pthread_mutex_lock(&mu);
    for (pp = &vmaps; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->va == (uintptr_t)virPtr) {
            m = *pp;
            *pp = m->next;
            break;
        }
    if (m == NULL) rc = RT_PARAM_INVALID;
    else {
        /* back to a reservation: nothing else may be mapped there meanwhile */
        mmap(virPtr, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        m->phys->maps--;
        phys_maybe_release(m->phys);
        free(m);
    }
    pthread_mutex_unlock(&mu);
    if (rc != 0) set_err("double: aclrtUnmapMem(%p): nothing is mapped there", virPtr);
    logf_("aclrtUnmapMem va=%p rc=%d", virPtr, rc);
    return rc;
}

EXPORT aclError aclrtMemExportToShareableHandleV2(void *handle, uint64_t flags, int shareType, void *shareableHandle) {
    Phys *p;
    FabricWire w;
    unsigned long long start = 0;
    int rc = 0, again = 0;
    (void)flags;
    ACL_FAIL_POINT("aclrtMemExportToShareableHandleV2", "handle=%p", handle);
    if (shareableHandle == NULL) return ACL_INVALID_PARAM;
    if (shareType != VMM_SHARE_FABRIC) {
        set_err("double: aclrtMemExportToShareableHandleV2: share type %d (only FABRIC, 2)", shareType);
        logf_("aclrtMemExportToShareableHandleV2 handle=%p type=%d rc=%d", handle, shareType, RT_FEATURE_NOT_SUPPORT);
        return RT_FEATURE_NOT_SUPPORT;
    }
    memset(&w, 0, sizeof w);
    pthread_mutex_lock(&mu);
    p = find_phys(handle);
    if (p == NULL || p->refs <= 0) rc = RT_PARAM_INVALID;
    else if (p->exported) {
        /* acl_rt docs (aclrtMemSetPidToShareableHandleV2): handle and shareableHandle are one
         * to one; one handle is not exported to two shareable handles within a process */
        rc = RT_PARAM_INVALID;
        again = 1;
    } else {
        p->exported = 1;
        memcpy(w.magic, fabric_magic, sizeof w.magic);
        w.pid = (int32_t)getpid();
        w.fd = p->fd;
        w.dev = (uint64_t)p->dev;
        w.ino = (uint64_t)p->ino;
        w.size = p->size;
    }
    pthread_mutex_unlock(&mu);
    if (rc == 0 && proc_start(getpid(), &start) != 0) rc = RT_DRV_INTERNAL_ERROR;
    w.start = start;
    if (rc == 0) {
        memset(shareableHandle, 0, 128);
        memcpy(shareableHandle, &w, sizeof w);
    } else if (again) {
        set_err("double: aclrtMemExportToShareableHandleV2(%p): the handle was exported already", handle);
    } else {
        set_err("double: aclrtMemExportToShareableHandleV2(%p): not a live physical allocation", handle);
    }
    logf_("aclrtMemExportToShareableHandleV2 handle=%p rc=%d", handle, rc);
    return rc;
}

EXPORT aclError aclrtMemImportFromShareableHandleV2(void *shareableHandle, int shareType, uint64_t flags,
                                                    void **handle) {
    FabricWire w;
    unsigned long long start = 0;
    char path[64];
    struct stat st;
    int fd;
    Phys *p;
    (void)flags;
    ACL_FAIL_POINT("aclrtMemImportFromShareableHandleV2", "type=%d", shareType);
    if (shareableHandle == NULL || handle == NULL) return ACL_INVALID_PARAM;
    if (shareType != VMM_SHARE_FABRIC) {
        set_err("double: aclrtMemImportFromShareableHandleV2: share type %d (only FABRIC, 2)", shareType);
        logf_("aclrtMemImportFromShareableHandleV2 type=%d rc=%d", shareType, RT_FEATURE_NOT_SUPPORT);
        return RT_FEATURE_NOT_SUPPORT;
    }
    memcpy(&w, shareableHandle, sizeof w);
    if (memcmp(w.magic, fabric_magic, sizeof w.magic) != 0 || w.pid <= 0 || w.fd < 0 || w.size == 0) {
        set_err("double: aclrtMemImportFromShareableHandleV2: not a fabric handle of this double");
        logf_("aclrtMemImportFromShareableHandleV2 rc=%d", RT_PARAM_INVALID);
        return RT_PARAM_INVALID;
    }
    if (proc_start((pid_t)w.pid, &start) != 0 || start != w.start) {
        set_err("double: aclrtMemImportFromShareableHandleV2: the exporting process %d is gone", (int)w.pid);
        logf_("aclrtMemImportFromShareableHandleV2 pid=%d gone=1 rc=%d", (int)w.pid, RT_PARAM_INVALID);
        return RT_PARAM_INVALID;
    }
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)w.pid, (int)w.fd);
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_ino != w.ino || (uint64_t)st.st_dev != w.dev ||
        (uint64_t)st.st_size < w.size) {
        set_err("double: aclrtMemImportFromShareableHandleV2: the memory of process %d is freed or cannot be "
                "opened (%s)",
                (int)w.pid, fd < 0 ? strerror(errno) : "another file");
        if (fd >= 0) close(fd);
        logf_("aclrtMemImportFromShareableHandleV2 pid=%d rc=%d", (int)w.pid, RT_PARAM_INVALID);
        return RT_PARAM_INVALID;
    }
    p = calloc(1, sizeof *p);
    if (p == NULL) {
        close(fd);
        return RT_MEMORY_ALLOCATION;
    }
    p->fd = fd;
    p->size = (size_t)w.size;
    p->refs = 1;
    p->dev = st.st_dev;
    p->ino = st.st_ino;
    pthread_mutex_lock(&mu);
    p->next = physs;
    physs = p;
    pthread_mutex_unlock(&mu);
    *handle = p;
    logf_("aclrtMemImportFromShareableHandleV2 pid=%d size=%zu handle=%p rc=0", (int)w.pid, p->size, (void *)p);
    return ACL_OK;
}

EXPORT aclError aclrtMemRetainAllocationHandle(void *virPtr, void **handle) {
    VMap *m;
    int rc = 0;
    ACL_FAIL_POINT("aclrtMemRetainAllocationHandle", "va=%p", virPtr);
    if (handle == NULL) return ACL_INVALID_PARAM;
    pthread_mutex_lock(&mu);
    m = vmap_of((uintptr_t)virPtr, 0);
    if (m == NULL || m->phys->refs <= 0) rc = RT_PARAM_INVALID;
    else {
        m->phys->refs++;
        *handle = m->phys;
    }
    pthread_mutex_unlock(&mu);
    if (rc != 0) set_err("double: aclrtMemRetainAllocationHandle(%p): not mapped VMM memory", virPtr);
    logf_("aclrtMemRetainAllocationHandle va=%p rc=%d", virPtr, rc);
    return rc;
}

EXPORT aclError aclrtMemGetAddressRange(void *ptr, void **pbase, size_t *psize) {
    VMap *m;
    int rc = 0;
    ACL_FAIL_POINT("aclrtMemGetAddressRange", "ptr=%p", ptr);
    pthread_mutex_lock(&mu);
    m = vmap_of((uintptr_t)ptr, 0);
    if (m != NULL) {
        if (pbase) *pbase = (void *)m->va;
        if (psize) *psize = m->size;
    } else {
        Alloc *a;
        for (a = allocs; a != NULL; a = a->next)
            if ((uintptr_t)ptr >= (uintptr_t)a->ptr && (uintptr_t)ptr - (uintptr_t)a->ptr < a->size) break;
        if (a == NULL) rc = RT_PARAM_INVALID;
        else {
            if (pbase) *pbase = a->ptr;
            if (psize) *psize = a->size;
        }
    }
    pthread_mutex_unlock(&mu);
    if (rc != 0) set_err("double: aclrtMemGetAddressRange(%p): not memory of ACL", ptr);
    logf_("aclrtMemGetAddressRange ptr=%p rc=%d", ptr, rc);
    return rc;
}

EXPORT aclError aclrtMemSetAccess(void *virPtr, size_t size, VmmAccessDesc *desc, size_t count) {
    int rc = 0;
    uintptr_t a = (uintptr_t)virPtr, end = a + size;
    ACL_FAIL_POINT("aclrtMemSetAccess", "va=%p size=%zu", virPtr, size);
    if (desc == NULL || count == 0 || size == 0) return ACL_INVALID_PARAM;
    pthread_mutex_lock(&mu);
    while (a < end) { /* every byte mapped (possibly by several mappings) */
        VMap *m = vmap_of(a, 0);
        if (m == NULL) {
            rc = RT_PARAM_INVALID;
            break;
        }
        a = m->va + m->size;
    }
    pthread_mutex_unlock(&mu);
    if (rc != 0) set_err("double: aclrtMemSetAccess(%p, %zu): not all mapped", virPtr, size);
    logf_("aclrtMemSetAccess va=%p size=%zu count=%zu rc=%d", virPtr, size, count, rc);
    return rc;
}

EXPORT aclError aclrtPointerGetAttributes(const void *ptr, VmmPtrAttributes *attr) {
    VMap *m;
    Alloc *a;
    int dev = 0;
    ACL_FAIL_POINT("aclrtPointerGetAttributes", "ptr=%p", ptr);
    if (attr == NULL) return ACL_INVALID_PARAM;
    memset(attr, 0, sizeof *attr);
    pthread_mutex_lock(&mu);
    if (ctx_valid(cur_ctx)) dev = cur_ctx->device;
    m = vmap_of((uintptr_t)ptr, 0);
    if (m != NULL) {
        attr->location.type = m->phys->host ? VMM_LOC_HOST : VMM_LOC_DEVICE;
        attr->location.id = m->phys->host ? 0 : (uint32_t)dev;
        attr->pageSize = HUGE_PAGE;
    } else {
        for (a = allocs; a != NULL; a = a->next)
            if ((uintptr_t)ptr >= (uintptr_t)a->ptr && (uintptr_t)ptr - (uintptr_t)a->ptr < a->size) break;
        if (a != NULL) {
            attr->location.type = a->host ? VMM_LOC_HOST : VMM_LOC_DEVICE;
            attr->location.id = a->host ? 0 : (uint32_t)a->device;
            attr->pageSize = 4096;
        } else {
            /* host memory aclrtHostRegister mapped for the device is host memory ACL knows */
            attr->location.type = host_registered((uintptr_t)ptr) ? VMM_LOC_HOST : VMM_LOC_UNREGISTERED;
            attr->pageSize = 4096;
        }
    }
    pthread_mutex_unlock(&mu);
    logf_("aclrtPointerGetAttributes ptr=%p type=%d rc=0", ptr, attr->location.type);
    return ACL_OK;
}

EXPORT aclError aclrtGetLogicDevIdByUserDevId(const int32_t userDevid, int32_t *const logicDevId) {
    ACL_FAIL_POINT("aclrtGetLogicDevIdByUserDevId", "user=%d", userDevid);
    if (logicDevId == NULL || userDevid < 0 || userDevid >= device_count()) {
        set_err("double: aclrtGetLogicDevIdByUserDevId(%d): no such device", userDevid);
        return RT_INVALID_DEVICEID;
    }
    *logicDevId = userDevid;
    return ACL_OK;
}

EXPORT aclError aclrtCreateStreamWithConfig(void **stream, uint32_t priority, uint32_t flag) {
    (void)priority;
    (void)flag;
    return aclrtCreateStream(stream);
}

EXPORT aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, int kind, void *stream) {
    Stream *s;
    Op op;
    int rc;
    ACL_FAIL_POINT("aclrtMemcpyAsync", "count=%zu kind=%d", count, kind);
    rc = stream_check("aclrtMemcpyAsync", stream, &s);
    if (rc == 0 && (dst == NULL || src == NULL || count > destMax || kind < 0 || kind > 7)) {
        set_err("double: aclrtMemcpyAsync: bad arguments");
        rc = ACL_INVALID_PARAM;
    }
    if (rc == 0) {
        memset(&op, 0, sizeof op);
        op.put = 1;
        op.local = (void *)src;
        op.remote = dst;
        op.len = count;
        pthread_mutex_lock(&mu);
        if (s->nops == s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 16;
            Op *n = realloc(s->ops, cap * sizeof *n);
            if (n == NULL) rc = RT_MEMORY_ALLOCATION;
            else {
                s->ops = n;
                s->cap = cap;
            }
        }
        if (rc == 0) s->ops[s->nops++] = op;
        pthread_mutex_unlock(&mu);
    }
    logf_("aclrtMemcpyAsync dst=%p src=%p count=%zu kind=%d stream=%p rc=%d", dst, src, count, kind, stream, rc);
    return rc;
}

/* A queued aclrtMemcpyAsync runs: each side that touches a reservation must lie in one live
 * mapping; checked and copied under mu (aclrtUnmapMem takes it). */
static int vmm_run_copy(const Op *op, char *why, size_t cap) {
    uintptr_t s = (uintptr_t)op->local, d = (uintptr_t)op->remote;
    int ok = 1;
    if (op->len == 0) return 0;
    pthread_mutex_lock(&mu);
    if (touches_resv(s, op->len) && vmap_of(s, op->len) == NULL) ok = 0;
    if (touches_resv(d, op->len) && vmap_of(d, op->len) == NULL) ok = 0;
    if (ok) memmove(op->remote, op->local, op->len);
    pthread_mutex_unlock(&mu);
    if (ok) return 0;
    snprintf(why, cap, "aclrtMemcpyAsync %p -> %p len %llu: a range is not mapped", op->local, op->remote,
             (unsigned long long)op->len);
    return -1;
}

EXPORT aclError aclrtStreamQuery(void *stream, int *status) {
    aclError rc;
    if (status == NULL) return ACL_INVALID_PARAM;
    /* the double's streams run when asked: a query runs what is queued */
    rc = aclrtSynchronizeStreamWithTimeout(stream, -1);
    if (rc == 0) *status = 0; /* ACL_STREAM_STATUS_COMPLETE */
    return rc;
}

EXPORT aclError aclrtStreamStop(void *stream) {
    return aclrtStreamAbort(stream);
}

/* ------------------------------------------------------------------------------------------ */
/* host registration, batched copies, allocation granularity, IPC of device memory             */
/* ------------------------------------------------------------------------------------------ */
/*
 * The ACL calls Mooncake's NPU wheel links besides those above (acl_rt.h declares each; the
 * checks follow hicann/runtime: src/acl/aclrt_impl/memory.cpp, src/runtime/api/impl/api_error.cc,
 * api_impl.cc and api_impl_standard_soc.cc). ACL's own argument checks give 100000
 * ACL_ERROR_INVALID_PARAM, the runtime's 107000 ACL_ERROR_RT_PARAM_INVALID, a thread without a
 * current context 107002.
 *   - aclrtHostRegister(ptr, size, type, &devPtr) maps host memory for the device: type
 *     ACL_HOST_REGISTER_MAPPED (0), optionally with IOMEMORY (0x04) / READONLY (0x08), another
 *     bit 207000 ACL_ERROR_RT_FEATURE_NOT_SUPPORT; a range overlapping a registered one 507910
 *     ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED. The device address is the host address (device
 *     memory is host memory here), and aclrtPointerGetAttributes says HOST for it until
 *     aclrtHostUnregister(ptr) (ptr the registered start, else 507911
 *     ACL_ERROR_HOST_MEMORY_NOT_REGISTERED).
 *   - aclrtMemcpyBatch copies synchronously, H2D and D2H only: each pair's attribute (attrs[k]
 *     from attrsIndexes[k] on; attrsIndexes[0] 0 and increasing below numBatches, numAttrs
 *     between 1 and numBatches, at most 4096 copies, reserved bytes 0) must name the actual
 *     location of its destination and source as aclrtPointerGetAttributes reports it (HOST_NUMA
 *     counts as HOST, unknown memory as host; a device's id must match), the two locations
 *     must differ, and a device range must lie inside its allocation: else 107000 with
 *     *failIndex the pair's index and nothing copied (SIZE_MAX when no pair is to blame).
 *     All sizes 0: success, nothing checked. destMaxs[i] < sizes[i]: 100000.
 *   - aclrtMemGetAllocationGranularity: 2 MiB, what the double's aclrtMallocPhysical takes, for
 *     every memAttr ACL accepts (HBM_MEM_HUGE/NORMAL/HUGE1G, DDR_MEM_HUGE/NORMAL/P2P_*,
 *     MEM_*): another memAttr, or a DDR one with a DEVICE location, 100000; an option other
 *     than MINIMUM/RECOMMENDED 107000.
 *   - aclrtIpcMemGetExportKey(devPtr, size, key, len, flags) exports a range of one aclrtMalloc
 *     allocation (107000 for anything else, size or len 0, flags above 1, a key that does not
 *     fit len with its NUL) under a key "hxipc-<pid>-<n>" (at most 32 bytes; Mooncake passes 65):
 *     the file "<dir>/.ipc.<key>" of the announce directory (HIXL_ASCEND_DOUBLE_DIR, above; none:
 *     107000) holds the exporter's pid and start time, its memfd's number, device and inode, the
 *     range, and who may import it: anyone with ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION
 *     (1), else only the pids aclrtIpcMemSetImportPid(key, pids, n) listed (as ACL's whitelist).
 *   - aclrtIpcMemImportByKey(&devPtr, key, flags) maps those pages shared into the importer
 *     (opening /proc/<pid>/fd/<n> and checking the inode), device memory of the importer's
 *     current device for aclrtPointerGetAttributes, aclrtMemcpy and aclrtMemcpyBatch: both
 *     processes see one memory. An unknown or closed key, a process gone, a pid not allowed:
 *     107000 (the codes CANN's driver gives there were not checked). Each import maps again.
 *   - aclrtIpcMemClose(key) as ACL's runtime does it: in a process that imported the key it
 *     unmaps the first mapping made by it; otherwise, in the exporter, it ends the export (later
 *     imports fail; mappings made stay valid); a key neither imported nor exported here: 107000.
 *     aclrtFree of exported memory ends its exports too, and an imported mapping cannot be
 *     freed with aclrtFree (107000).
 */
enum {
    HOST_MEMORY_ALREADY_REGISTERED = 507910,
    HOST_MEMORY_NOT_REGISTERED = 507911,
    HOST_REGISTER_IOMEMORY = 0x04,
    HOST_REGISTER_READONLY = 0x08,
    MEMCPY_BATCH_MAX = 4096,
};

typedef struct HostReg {
    struct HostReg *next;
    uintptr_t ptr;
    uint64_t size;
} HostReg;

static HostReg *hostregs;

/* Under mu. */
static int host_registered(uintptr_t p) {
    for (HostReg *r = hostregs; r != NULL; r = r->next)
        if (p >= r->ptr && p - r->ptr < r->size) return 1;
    return 0;
}

EXPORT aclError aclrtHostRegister(void *ptr, uint64_t size, int type, void **devPtr) {
    HostReg *r;
    int rc = 0;
    ACL_FAIL_POINT("aclrtHostRegister", "ptr=%p size=%llu", ptr, (unsigned long long)size);
    if (ptr == NULL || devPtr == NULL || size == 0) {
        set_err("double: aclrtHostRegister: null pointer or zero size");
        rc = ACL_INVALID_PARAM;
    } else if (((unsigned)type & ~(unsigned)(HOST_REGISTER_IOMEMORY | HOST_REGISTER_READONLY)) != 0) {
        set_err("double: aclrtHostRegister: type %d not supported", type);
        rc = RT_FEATURE_NOT_SUPPORT;
    } else if (need_ctx("aclrtHostRegister")) {
        rc = RT_CONTEXT_NULL;
    }
    if (rc != 0) {
        logf_("aclrtHostRegister ptr=%p size=%llu rc=%d", ptr, (unsigned long long)size, rc);
        return rc;
    }
    r = calloc(1, sizeof *r);
    if (r == NULL) return RT_MEMORY_ALLOCATION;
    r->ptr = (uintptr_t)ptr;
    r->size = size;
    pthread_mutex_lock(&mu);
    for (HostReg *it = hostregs; it != NULL; it = it->next)
        if (r->ptr < it->ptr + it->size && it->ptr < r->ptr + size) rc = HOST_MEMORY_ALREADY_REGISTERED;
    if (rc == 0) {
        r->next = hostregs;
        hostregs = r;
    }
    pthread_mutex_unlock(&mu);
    if (rc != 0) {
        free(r);
        set_err("double: aclrtHostRegister(%p, %llu): overlaps a registered range", ptr, (unsigned long long)size);
    } else {
        *devPtr = ptr;
    }
    logf_("aclrtHostRegister ptr=%p size=%llu type=%d rc=%d", ptr, (unsigned long long)size, type, rc);
    return rc;
}

EXPORT aclError aclrtHostUnregister(void *ptr) {
    HostReg **pp, *r = NULL;
    ACL_FAIL_POINT("aclrtHostUnregister", "ptr=%p", ptr);
    if (ptr == NULL) {
        set_err("double: aclrtHostUnregister: null pointer");
        logf_("aclrtHostUnregister ptr=%p rc=%d", ptr, ACL_INVALID_PARAM);
        return ACL_INVALID_PARAM;
    }
    if (need_ctx("aclrtHostUnregister")) {
        logf_("aclrtHostUnregister ptr=%p rc=%d", ptr, RT_CONTEXT_NULL);
        return RT_CONTEXT_NULL;
    }
    pthread_mutex_lock(&mu);
    for (pp = &hostregs; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->ptr == (uintptr_t)ptr) {
            r = *pp;
            *pp = r->next;
            break;
        }
    pthread_mutex_unlock(&mu);
    free(r);
    if (r == NULL) set_err("double: aclrtHostUnregister(%p): not the start of a registered range", ptr);
    logf_("aclrtHostUnregister ptr=%p rc=%d", ptr, r ? 0 : HOST_MEMORY_NOT_REGISTERED);
    return r ? ACL_OK : HOST_MEMORY_NOT_REGISTERED;
}

typedef struct {
    VmmLocation dstLoc;
    VmmLocation srcLoc;
    uint8_t rsv[16];
} MemcpyBatchAttr;

/* Where [p, p+len) is, as aclrtPointerGetAttributes says (unknown memory: host), and whether a
 * device range lies inside its allocation or mapping. Under mu. */
static int batch_loc(uintptr_t p, size_t len, int *type, uint32_t *id) {
    VMap *m = vmap_of(p, 0);
    if (m != NULL) {
        *type = m->phys->host ? VMM_LOC_HOST : VMM_LOC_DEVICE;
        *id = 0;
        if (!m->phys->host && ctx_valid(cur_ctx)) *id = (uint32_t)cur_ctx->device;
        return len <= m->va + m->size - p;
    }
    for (Alloc *a = allocs; a != NULL; a = a->next)
        if (p >= (uintptr_t)a->ptr && p - (uintptr_t)a->ptr < a->size) {
            *type = a->host ? VMM_LOC_HOST : VMM_LOC_DEVICE;
            *id = a->host ? 0 : (uint32_t)a->device;
            return a->host || len <= a->size - (p - (uintptr_t)a->ptr);
        }
    *type = VMM_LOC_HOST;
    *id = 0;
    return 1;
}

EXPORT aclError aclrtMemcpyBatch(void **dsts, size_t *destMaxs, void **srcs, size_t *sizes, size_t numBatches,
                                 MemcpyBatchAttr *attrs, size_t *attrsIndexes, size_t numAttrs, size_t *failIndex) {
    size_t i, k = 0, fail = SIZE_MAX, zero = 1;
    int rc = 0;
    const char *why = NULL;
    ACL_FAIL_POINT("aclrtMemcpyBatch", "num=%zu", numBatches);
    if (failIndex == NULL || sizes == NULL || numBatches == 0) {
        set_err("double: aclrtMemcpyBatch: null failIndex or sizes, or no copy");
        logf_("aclrtMemcpyBatch num=%zu rc=%d", numBatches, ACL_INVALID_PARAM);
        return ACL_INVALID_PARAM;
    }
    for (i = 0; i < numBatches; i++)
        if (sizes[i] != 0) zero = 0;
    *failIndex = SIZE_MAX;
    if (zero) {
        logf_("aclrtMemcpyBatch num=%zu zero=1 rc=0", numBatches);
        return ACL_OK;
    }
    if (dsts == NULL || destMaxs == NULL || srcs == NULL || attrs == NULL || attrsIndexes == NULL) {
        why = "a null array";
        rc = ACL_INVALID_PARAM;
    }
    for (i = 0; rc == 0 && i < numBatches; i++)
        if (destMaxs[i] < sizes[i]) {
            why = "a size above its destMax";
            rc = ACL_INVALID_PARAM;
        }
    for (i = 0; rc == 0 && i < numAttrs; i++)
        for (size_t b = 0; b < sizeof attrs[i].rsv; b++)
            if (attrs[i].rsv[b] != 0) {
                why = "reserved bytes of an attribute not 0";
                rc = ACL_INVALID_PARAM;
                break;
            }
    if (rc == 0 && need_ctx("aclrtMemcpyBatch")) rc = RT_CONTEXT_NULL;
    if (rc == 0 && (numAttrs == 0 || numAttrs > numBatches || numBatches > MEMCPY_BATCH_MAX || attrsIndexes[0] != 0)) {
        why = "numAttrs 0 or above numBatches, more than 4096 copies, or attrsIndexes[0] not 0";
        rc = RT_PARAM_INVALID;
    }
    for (i = 1; rc == 0 && i < numAttrs; i++)
        if (attrsIndexes[i] <= attrsIndexes[i - 1] || attrsIndexes[i] >= numBatches) {
            why = "attrsIndexes not increasing below numBatches";
            rc = RT_PARAM_INVALID;
        }
    pthread_mutex_lock(&mu);
    for (i = 0; rc == 0 && i < numBatches; i++) {
        int dt, st, want_d, want_s;
        uint32_t did, sid;
        int din, sin;
        if (k + 1 < numAttrs && i >= attrsIndexes[k + 1]) k++;
        din = batch_loc((uintptr_t)dsts[i], sizes[i], &dt, &did);
        sin = batch_loc((uintptr_t)srcs[i], sizes[i], &st, &sid);
        want_d = attrs[k].dstLoc.type == VMM_LOC_HOST_NUMA ? VMM_LOC_HOST : attrs[k].dstLoc.type;
        want_s = attrs[k].srcLoc.type == VMM_LOC_HOST_NUMA ? VMM_LOC_HOST : attrs[k].srcLoc.type;
        if (dt != want_d || (dt == VMM_LOC_DEVICE && did != attrs[k].dstLoc.id))
            why = "the destination is not where its attribute says";
        else if (st != want_s || (st == VMM_LOC_DEVICE && sid != attrs[k].srcLoc.id))
            why = "the source is not where its attribute says";
        else if (dt == st)
            why = "only H2D and D2H copies";
        else if (!din || !sin)
            why = "a device range past the end of its allocation";
        else
            continue;
        fail = i;
        rc = RT_PARAM_INVALID;
    }
    if (rc == 0)
        for (i = 0; i < numBatches; i++) memmove(dsts[i], srcs[i], sizes[i]);
    pthread_mutex_unlock(&mu);
    if (rc != 0) {
        *failIndex = fail;
        if (why != NULL) set_err("double: aclrtMemcpyBatch: %s (index %zu)", why, fail == SIZE_MAX ? 0 : fail);
    }
    logf_("aclrtMemcpyBatch num=%zu attrs=%zu fail=%zd rc=%d", numBatches, numAttrs,
          fail == SIZE_MAX ? (ssize_t)-1 : (ssize_t)fail, rc);
    return rc;
}

EXPORT aclError aclrtMemGetAllocationGranularity(VmmPhysProp *prop, int option, size_t *granularity) {
    /* the memAttr values ACL maps to the driver's (memAttrHandlers in memory.cpp) */
    static const int known[] = {4 /* HBM_HUGE */, 5, 10, 2 /* DDR_HUGE */, 3, 6, 7, 12 /* MEM_NORMAL */, 13, 14, 15,
                                16, 17};
    int rc = ACL_INVALID_PARAM, attr;
    ACL_FAIL_POINT("aclrtMemGetAllocationGranularity", "option=%d", option);
    if (prop == NULL || granularity == NULL) {
        set_err("double: aclrtMemGetAllocationGranularity: null pointer");
        logf_("aclrtMemGetAllocationGranularity rc=%d", rc);
        return rc;
    }
    attr = prop->memAttr;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (known[i] == attr) rc = 0;
    if (rc == 0 && prop->location.type == VMM_LOC_DEVICE && (attr == 2 || attr == 3 || attr == 6 || attr == 7))
        rc = ACL_INVALID_PARAM; /* DDR memory is host memory */
    if (rc != 0) set_err("double: aclrtMemGetAllocationGranularity: memAttr %d not supported here", attr);
    else if (option != 0 && option != 1) {
        set_err("double: aclrtMemGetAllocationGranularity: option %d", option);
        rc = RT_PARAM_INVALID;
    } else {
        *granularity = HUGE_PAGE;
    }
    logf_("aclrtMemGetAllocationGranularity attr=%d option=%d rc=%d", attr, option, rc);
    return rc;
}

/* An export of this process (aclrtIpcMemGetExportKey). Under mu. */
typedef struct Export {
    struct Export *next;
    char key[72];
    const Alloc *alloc;
    uintptr_t ptr;
    size_t size;
    int any;           /* ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION */
    int pids[64];      /* aclrtIpcMemSetImportPid's whitelist */
    int npids;
    char path[4200];   /* its file in the announce directory */
} Export;

static Export *exports;
static unsigned export_seq;

/* (Re)writes an export's file, whole (temporary file + rename). Under mu. */
static int write_export(const Export *e) {
    char tmp[4300], buf[1024];
    unsigned long long start = 0;
    struct stat st;
    int fd, n;
    if (proc_start(getpid(), &start) != 0 || fstat(e->alloc->fd, &st) != 0) return -1;
    n = snprintf(buf, sizeof buf, "pid %d start %llu fd %d dev %llu ino %llu off %llu size %zu any %d pids",
                 (int)getpid(), start, e->alloc->fd, (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
                 (unsigned long long)(e->ptr - (uintptr_t)e->alloc->base), e->size, e->any);
    for (int i = 0; i < e->npids && n < (int)sizeof buf - 16; i++) n += snprintf(buf + n, sizeof buf - (size_t)n, " %d", e->pids[i]);
    n += snprintf(buf + n, sizeof buf - (size_t)n, "\n");
    snprintf(tmp, sizeof tmp, "%s.tmp", e->path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    if (write(fd, buf, (size_t)n) != n) {
        close(fd);
        unlink(tmp);
        return -1;
    }
    close(fd);
    if (rename(tmp, e->path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

EXPORT aclError aclrtIpcMemGetExportKey(void *devPtr, size_t size, char *key, size_t len, uint64_t flags) {
    char dir[4096], name[72];
    Export *e;
    Alloc *a;
    int rc = 0;
    ACL_FAIL_POINT("aclrtIpcMemGetExportKey", "ptr=%p size=%zu", devPtr, size);
    if (devPtr == NULL || key == NULL) {
        set_err("double: aclrtIpcMemGetExportKey: null pointer");
        rc = ACL_INVALID_PARAM;
    } else if (size == 0 || len == 0 || flags > 1) {
        set_err("double: aclrtIpcMemGetExportKey: size %zu, len %zu, flags %llu", size, len, (unsigned long long)flags);
        rc = RT_PARAM_INVALID;
    } else if (need_ctx("aclrtIpcMemGetExportKey")) {
        rc = RT_CONTEXT_NULL;
    } else if (dir_of(dir, sizeof dir, 1) != 0) {
        set_err("double: aclrtIpcMemGetExportKey: no announce directory to publish the key in");
        rc = RT_PARAM_INVALID;
    }
    if (rc != 0) {
        logf_("aclrtIpcMemGetExportKey ptr=%p size=%zu rc=%d", devPtr, size, rc);
        return rc;
    }
    e = calloc(1, sizeof *e);
    if (e == NULL) return RT_MEMORY_ALLOCATION;
    (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); /* importers open /proc/<pid>/fd */
    pthread_mutex_lock(&mu);
    for (a = allocs; a != NULL; a = a->next)
        if (!a->host && a->key[0] == 0 && (uintptr_t)devPtr >= (uintptr_t)a->ptr &&
            (uintptr_t)devPtr - (uintptr_t)a->ptr < a->size && size <= a->size - ((uintptr_t)devPtr - (uintptr_t)a->ptr))
            break;
    snprintf(name, sizeof name, "hxipc-%d-%u", (int)getpid(), ++export_seq);
    if (a == NULL) {
        set_err("double: aclrtIpcMemGetExportKey(%p, %zu): not inside one aclrtMalloc allocation", devPtr, size);
        rc = RT_PARAM_INVALID;
    } else if (strlen(name) + 1 > len) {
        set_err("double: aclrtIpcMemGetExportKey: the key needs %zu bytes, len is %zu", strlen(name) + 1, len);
        rc = RT_PARAM_INVALID;
    } else {
        snprintf(e->key, sizeof e->key, "%s", name);
        snprintf(e->path, sizeof e->path, "%s/.ipc.%s", dir, name);
        e->alloc = a;
        e->ptr = (uintptr_t)devPtr;
        e->size = size;
        e->any = (flags & 1) != 0;
        if (write_export(e) != 0) {
            set_err("double: aclrtIpcMemGetExportKey: cannot write %s", e->path);
            rc = RT_DRV_INTERNAL_ERROR;
        } else {
            e->next = exports;
            exports = e;
            memcpy(key, name, strlen(name) + 1);
        }
    }
    pthread_mutex_unlock(&mu);
    if (rc != 0) free(e);
    logf_("aclrtIpcMemGetExportKey ptr=%p size=%zu flags=%llu key=%s rc=%d", devPtr, size, (unsigned long long)flags,
          rc ? "" : name, rc);
    return rc;
}

EXPORT aclError aclrtIpcMemSetImportPid(const char *key, int32_t *pid, size_t num) {
    Export *e;
    int rc = 0;
    ACL_FAIL_POINT("aclrtIpcMemSetImportPid", "num=%zu", num);
    if (key == NULL || pid == NULL) return ACL_INVALID_PARAM;
    if (num == 0 || num > 64) return RT_PARAM_INVALID;
    pthread_mutex_lock(&mu);
    for (e = exports; e != NULL; e = e->next)
        if (strcmp(e->key, key) == 0) break;
    if (e == NULL) rc = RT_PARAM_INVALID;
    else {
        for (size_t i = 0; i < num && e->npids < 64; i++) e->pids[e->npids++] = pid[i];
        if (write_export(e) != 0) rc = RT_DRV_INTERNAL_ERROR;
    }
    pthread_mutex_unlock(&mu);
    if (rc != 0) set_err("double: aclrtIpcMemSetImportPid(%s): not a key this process exported", key);
    logf_("aclrtIpcMemSetImportPid key=%s num=%zu rc=%d", key, num, rc);
    return rc;
}

EXPORT aclError aclrtIpcMemImportByKey(void **devPtr, const char *key, uint64_t flags) {
    char dir[4096], path[4300], *text = NULL, *pids;
    unsigned long long start = 0, pstart = 0, dev = 0, ino = 0, off = 0;
    size_t size = 0, delta, maplen;
    int pid = 0, fd = -1, efd = -1, any = 0, allowed, rc = 0;
    long page = sysconf(_SC_PAGESIZE);
    struct stat st;
    void *m = MAP_FAILED;
    Alloc *a;
    ACL_FAIL_POINT("aclrtIpcMemImportByKey", "flags=%llu", (unsigned long long)flags);
    if (devPtr == NULL || key == NULL) {
        set_err("double: aclrtIpcMemImportByKey: null pointer");
        logf_("aclrtIpcMemImportByKey rc=%d", ACL_INVALID_PARAM);
        return ACL_INVALID_PARAM;
    }
    if (flags > 1) rc = RT_PARAM_INVALID;
    else if (need_ctx("aclrtIpcMemImportByKey")) rc = RT_CONTEXT_NULL;
    else if (strncmp(key, "hxipc-", 6) != 0 || strchr(key, '/') != NULL || dir_of(dir, sizeof dir, 0) != 0)
        rc = RT_PARAM_INVALID;
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/.ipc.%s", dir, key);
        text = slurp(path);
        if (text == NULL ||
            sscanf(text, "pid %d start %llu fd %d dev %llu ino %llu off %llu size %zu any %d", &pid, &start, &efd,
                   &dev, &ino, &off, &size, &any) != 8) {
            set_err("double: aclrtIpcMemImportByKey(%s): no such key (never exported, or closed)", key);
            rc = RT_PARAM_INVALID;
        }
    }
    if (rc == 0 && (proc_start((pid_t)pid, &pstart) != 0 || pstart != start)) {
        set_err("double: aclrtIpcMemImportByKey(%s): the exporting process %d is gone", key, pid);
        rc = RT_PARAM_INVALID;
    }
    if (rc == 0) {
        allowed = any;
        pids = strstr(text, " pids");
        for (char *p = pids ? pids + 5 : NULL; p != NULL && !allowed && *p == ' ';) {
            char *end;
            long v = strtol(p + 1, &end, 10);
            if (end == p + 1) break;
            if (v == (long)getpid()) allowed = 1;
            p = end;
        }
        if (!allowed) {
            set_err("double: aclrtIpcMemImportByKey(%s): pid %d is not allowed (aclrtIpcMemSetImportPid)", key,
                    (int)getpid());
            rc = RT_PARAM_INVALID;
        }
    }
    if (rc == 0) {
        snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, efd);
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) != 0 || (unsigned long long)st.st_dev != dev ||
            (unsigned long long)st.st_ino != ino) {
            set_err("double: aclrtIpcMemImportByKey(%s): the memory of process %d cannot be opened (%s)", key, pid,
                    fd < 0 ? strerror(errno) : "another file");
            rc = RT_PARAM_INVALID;
        }
    }
    if (rc == 0) {
        delta = (size_t)(off % (unsigned long long)page);
        maplen = delta + size;
        m = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)(off - delta));
        a = m == MAP_FAILED ? NULL : calloc(1, sizeof *a);
        if (a == NULL) {
            set_err("double: aclrtIpcMemImportByKey(%s): cannot map %zu bytes", key, size);
            if (m != MAP_FAILED) munmap(m, maplen);
            rc = RT_MEMORY_ALLOCATION;
        } else {
            a->base = m;
            a->ptr = (char *)m + delta;
            a->size = size;
            a->fd = -1;
            a->maplen = maplen;
            snprintf(a->key, sizeof a->key, "%s", key);
            pthread_mutex_lock(&mu);
            a->device = ctx_valid(cur_ctx) ? cur_ctx->device : 0;
            /* appended: aclrtIpcMemClose unmaps the first mapping of a key */
            {
                Alloc **pp = &allocs;
                while (*pp != NULL) pp = &(*pp)->next;
                *pp = a;
            }
            pthread_mutex_unlock(&mu);
            *devPtr = a->ptr;
        }
    }
    if (fd >= 0) close(fd);
    free(text);
    logf_("aclrtIpcMemImportByKey key=%s pid=%d size=%zu rc=%d", key, pid, size, rc);
    return rc;
}

EXPORT aclError aclrtIpcMemClose(const char *key) {
    Alloc **pp, *a = NULL;
    Export **ep, *e = NULL;
    ACL_FAIL_POINT("aclrtIpcMemClose", "key=%s", key ? key : "");
    if (key == NULL) return ACL_INVALID_PARAM;
    if (need_ctx("aclrtIpcMemClose")) {
        logf_("aclrtIpcMemClose key=%s rc=%d", key, RT_CONTEXT_NULL);
        return RT_CONTEXT_NULL;
    }
    pthread_mutex_lock(&mu);
    for (pp = &allocs; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->key[0] != 0 && strcmp((*pp)->key, key) == 0) {
            a = *pp;
            *pp = a->next;
            break;
        }
    if (a == NULL)
        for (ep = &exports; *ep != NULL; ep = &(*ep)->next)
            if (strcmp((*ep)->key, key) == 0) {
                e = *ep;
                *ep = e->next;
                unlink(e->path);
                break;
            }
    pthread_mutex_unlock(&mu);
    if (a != NULL) munmap(a->base, a->maplen);
    free(a);
    free(e);
    if (a == NULL && e == NULL) set_err("double: aclrtIpcMemClose(%s): neither imported nor exported here", key);
    logf_("aclrtIpcMemClose key=%s imported=%d exported=%d rc=%d", key, a != NULL, e != NULL,
          a || e ? 0 : RT_PARAM_INVALID);
    return a || e ? ACL_OK : RT_PARAM_INVALID;
}

/* aclrtFree of exported memory ends its exports. */
static void ipc_forget(const Alloc *a) {
    Export **ep = &exports;
    pthread_mutex_lock(&mu);
    while (*ep != NULL) {
        Export *e = *ep;
        if (e->alloc == a) {
            *ep = e->next;
            unlink(e->path);
            free(e);
        } else {
            ep = &e->next;
        }
    }
    pthread_mutex_unlock(&mu);
}

/* Removes this process's export files when the double unloads. */
__attribute__((destructor)) static void unexport(void) {
    for (Export *e = exports; e != NULL; e = e->next) unlink(e->path);
}
