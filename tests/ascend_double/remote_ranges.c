/*
 * Two processes (a fork) on the ACL/HCCL test double, run by tests/ascend/ascend.rs: the double's rule
 * that a one-sided call reaches only remote memory bound to the remote rank's live
 * communicator, across processes (where the double reads the ranges the remote process
 * published in the announce directory, HIXL_ASCEND_DOUBLE_DIR).
 *
 * The server (rank 1, the parent) registers, binds and prepares 1 MiB filled with 0x5A; the
 * client (rank 0, the child) then:
 *   - reads it with HcclBatchGet (the path works), and is refused a range running past its end;
 *   - after the server's HcclCommUnbindMem: HcclBatchGet and HcclBatchPut fail HCCL_E_PARA,
 *     and neither its own buffer nor the server's changes;
 *   - after the server binds it again and prepares again: HcclBatchGet works again;
 *   - queues an HcclBatchPut (accepted), the server unbinds before the client synchronises:
 *     the sync fails 507899 and the server's memory is unchanged;
 *   - after the server's HcclCommDestroy: HcclBatchGet fails HCCL_E_PARA.
 * Each check prints "FAIL <what>" and exits 1; "OK" at the end. Linked with the double
 * (-l:libascend_double.so), run with LD_LIBRARY_PATH.
 */
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
#define FILL 0x5A  /* the server's bytes */
#define LOCAL 0x11 /* the client's, before it reads */
#define PUT 0xC3   /* what the client tries to write */

static const char *who = "?";

static void check(int ok, const char *what) {
    if (ok) return;
    const char *msg = aclGetRecentErrMsg();
    printf("FAIL %s: %s (errmsg: %s)\n", who, what, msg ? msg : "none");
    fflush(stdout);
    exit(1);
}

#define OK(expr) check((expr) == 0, #expr)

typedef struct {
    void *buf, *mem, *comm;
} Rank;

static const HcclPrepareConfig prep = {0, 0, 0, 0};

static void rank_up(Rank *r, int32_t device, uint32_t rank) {
    char table[512];
    int32_t phy0 = -1, phy2 = -1;
    HcclMem mem;
    HcclCommConfig cfg;
    OK(aclrtSetDevice(device));
    OK(aclrtGetPhyDevIdByLogicDevId(0, &phy0));
    OK(aclrtGetPhyDevIdByLogicDevId(2, &phy2));
    snprintf(table, sizeof table,
             "{\"version\":\"1.0\",\"server_count\":\"1\",\"server_list\":[{\"server_id\":\"127.0.0.1\","
             "\"device\":[{\"device_id\":\"%d\",\"rank_id\":\"0\"},{\"device_id\":\"%d\",\"rank_id\":\"1\"}]}],"
             "\"status\":\"completed\"}",
             phy0, phy2);
    OK(aclrtMalloc(&r->buf, SIZE, ACL_MEM_MALLOC_HUGE_ONLY));
    mem.type = 0;
    mem.addr = r->buf;
    mem.size = SIZE;
    OK(HcclRegisterGlobalMem(&mem, &r->mem));
    memset(&cfg, 0, sizeof cfg);
    cfg.configSize = sizeof cfg;
    cfg.magicWord = 0xf0f0f0f0u;
    cfg.version = 5;
    cfg.hcclBufferSize = 200;
    snprintf(cfg.hcclCommName, sizeof cfg.hcclCommName, "remote_ranges");
    OK(HcclCommInitClusterInfoMemConfig(table, rank, &cfg, &r->comm));
    OK(HcclCommBindMem(r->comm, r->mem));
    OK(HcclCommPrepare(r->comm, &prep, 10));
}

/* Whether all SIZE bytes of device buffer `buf` are `byte`. */
static int all(void *buf, unsigned char byte) {
    unsigned char *host = malloc(SIZE);
    int same = 1;
    check(host != NULL, "malloc");
    OK(aclrtMemcpy(host, SIZE, buf, SIZE, D2H));
    for (size_t i = 0; i < SIZE; i++)
        if (host[i] != byte) same = 0;
    free(host);
    return same;
}

static void fill(void *buf, unsigned char byte) {
    unsigned char *host = malloc(SIZE);
    check(host != NULL, "malloc");
    memset(host, byte, SIZE);
    OK(aclrtMemcpy(buf, SIZE, host, SIZE, H2D));
    free(host);
}

static void say(int fd, char c) { check(write(fd, &c, 1) == 1, "write to the other process"); }

static void expect(int fd, char want) {
    char c = 0;
    check(read(fd, &c, 1) == 1 && c == want, "the other process's next step");
}

static int errmsg_has(const char *what) {
    const char *m = aclGetRecentErrMsg();
    return m != NULL && strstr(m, what) != NULL;
}

static void client(int in, int out) {
    Rank r;
    void *stream = NULL, *remote = NULL;
    HcclOneSideOpDesc d = {NULL, NULL, SIZE, 0 /* HCCL_DATA_TYPE_INT8 */};
    who = "client";
    rank_up(&r, 0, 0);
    check(read(in, &remote, sizeof remote) == (ssize_t)sizeof remote, "read the server's address");
    OK(aclrtCreateStream(&stream));
    d.localAddr = r.buf;
    d.remoteAddr = remote;

    /* bound: the path works; a range past the end of the server's registration does not */
    fill(r.buf, LOCAL);
    OK(HcclBatchGet(r.comm, 1, &d, 1, stream));
    OK(aclrtSynchronizeStreamWithTimeout(stream, 5000));
    check(all(r.buf, FILL), "HcclBatchGet brought the server's bytes");
    {
        HcclOneSideOpDesc past = {r.buf, (char *)remote + SIZE - 10, 20, 0};
        check(HcclBatchGet(r.comm, 1, &past, 1, stream) == HCCL_E_PARA, "a range past the remote's end is HCCL_E_PARA");
    }
    fill(r.buf, LOCAL);
    say(out, 'a');

    /* the server unbound its memory: refused before anything is queued */
    expect(in, 'u');
    check(HcclBatchGet(r.comm, 1, &d, 1, stream) == HCCL_E_PARA, "HcclBatchGet of unbound remote memory is HCCL_E_PARA");
    check(errmsg_has("is not inside memory bound to rank 1's live communicator"), "the error message");
    check(HcclBatchPut(r.comm, 1, &d, 1, stream) == HCCL_E_PARA, "HcclBatchPut to unbound remote memory is HCCL_E_PARA");
    OK(aclrtSynchronizeStreamWithTimeout(stream, 5000)); /* nothing was queued */
    check(all(r.buf, LOCAL), "the client's buffer is unchanged");
    say(out, 'b');

    /* bound and prepared again: reachable again */
    expect(in, 'r');
    OK(HcclBatchGet(r.comm, 1, &d, 1, stream));
    OK(aclrtSynchronizeStreamWithTimeout(stream, 5000));
    check(all(r.buf, FILL), "HcclBatchGet after the server bound it again");

    /* queued while bound, unbound before the copy runs: the sync fails, nothing moves */
    fill(r.buf, PUT);
    OK(HcclBatchPut(r.comm, 1, &d, 1, stream));
    say(out, 'q');
    expect(in, 'u');
    check(aclrtSynchronizeStreamWithTimeout(stream, 5000) == ACL_ERROR_RT_DRV_INTERNAL_ERROR,
          "the sync of a copy whose remote range was unbound after it was queued is 507899");
    check(errmsg_has("is not inside memory bound"), "the sync's error message");
    say(out, 's');

    /* the server destroyed its communicator */
    expect(in, 'x');
    check(HcclBatchGet(r.comm, 1, &d, 1, stream) == HCCL_E_PARA, "HcclBatchGet once the remote comm is destroyed");
    say(out, 'd');

    OK(aclrtDestroyStream(stream));
    OK(HcclCommUnbindMem(r.comm, r.mem));
    OK(HcclCommDestroy(r.comm));
    OK(HcclDeregisterGlobalMem(r.mem));
    OK(aclrtFree(r.buf));
    OK(aclrtResetDevice(0));
}

static void server(int in, int out) {
    Rank r;
    who = "server";
    rank_up(&r, 2, 1);
    fill(r.buf, FILL);
    check(write(out, &r.buf, sizeof r.buf) == (ssize_t)sizeof r.buf, "write the address");
    expect(in, 'a');

    OK(HcclCommUnbindMem(r.comm, r.mem));
    say(out, 'u');
    expect(in, 'b');
    check(all(r.buf, FILL), "the server's memory is unchanged by the refused calls");

    OK(HcclCommBindMem(r.comm, r.mem));
    OK(HcclCommPrepare(r.comm, &prep, 10));
    say(out, 'r');

    expect(in, 'q');
    OK(HcclCommUnbindMem(r.comm, r.mem));
    say(out, 'u');
    expect(in, 's');
    check(all(r.buf, FILL), "the server's memory is unchanged by the copy queued before the unbind");

    OK(HcclCommDestroy(r.comm));
    say(out, 'x');
    expect(in, 'd');
    OK(HcclDeregisterGlobalMem(r.mem));
    OK(aclrtFree(r.buf));
    OK(aclrtResetDevice(2));
}

int main(void) {
    fork_pair(client, server, "client OK");
    return 0;
}
