/* LLM-DataDist's link by an explicit rank table from C (hixl_dd_link_comm,
 * hixl_dd_query_register_mem_status, hixl_dd_unlink_comm), in one process on the ACL/HCCL test
 * double (HIXL_ACL_LIB / HIXL_HCCL_LIB name it; two ranks of one comm in one process stand for
 * two processes to it): two instances (clusters 0 and 1 on devices 0 and 1, the first without
 * llm.ListenIpInfo) link by a generated rank table, poll to OK, move random host blocks both
 * ways (checked byte for byte) and unlink; every bad input gets its exact status. Prints PASS. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hixl_dd.h"

static int failures = 0;

static void expect(hixl_status got, hixl_status want, int line) {
  if (got != want) {
    fprintf(stderr, "line %d: status %#x, expected %#x (%s)\n", line, got, want,
            hixl_last_error_message());
    failures++;
  }
}
#define EXPECT(call, want) expect((call), (want), __LINE__)

enum { TENSORS = 2, BLOCKS = 8, BLOCK = 256, TENSOR = BLOCKS * BLOCK };

static const char *TABLE =
    "{\"version\":\"1.0\",\"server_count\":\"1\",\"status\":\"completed\",\"server_list\":[{"
    "\"server_id\":\"127.0.0.1\",\"device\":["
    "{\"device_id\":\"10\",\"device_ip\":\"10.93.0.1\",\"rank_id\":\"0\"},"
    "{\"device_id\":\"11\",\"device_ip\":\"10.93.0.2\",\"rank_id\":\"1\"}]}]}";

/* Polls until the status is not PREPARING (at most 20 s). */
static int32_t settle(hixl_dd *dd, int64_t id) {
  int32_t st = HIXL_DD_REGISTER_MEM_PREPARING;
  struct timespec nap = {0, 5 * 1000 * 1000};
  for (int i = 0; i < 4000 && st == HIXL_DD_REGISTER_MEM_PREPARING; i++) {
    EXPECT(hixl_dd_query_register_mem_status(dd, id, &st), HIXL_LLM_SUCCESS);
    if (st == HIXL_DD_REGISTER_MEM_PREPARING) nanosleep(&nap, NULL);
  }
  return st;
}

int main(void) {
  unsigned seed = (unsigned)getpid();
  unsigned char *mem[2][TENSORS], *orig[2][TENSORS];
  uint64_t addrs[2][TENSORS];
  for (int c = 0; c < 2; c++)
    for (int t = 0; t < TENSORS; t++) {
      if (posix_memalign((void **)&mem[c][t], 4096, TENSOR) != 0) return 1;
      orig[c][t] = malloc(TENSOR);
      for (int i = 0; i < TENSOR; i++) orig[c][t][i] = (unsigned char)rand_r(&seed);
      memcpy(mem[c][t], orig[c][t], TENSOR);
      addrs[c][t] = (uint64_t)(uintptr_t)mem[c][t];
    }
  hixl_dd *dd[2];
  uint64_t ids[2] = {0, 1};
  uint32_t ranks[2] = {0, 1};
  int64_t comm[2] = {0, 0};
  int32_t st = -1;
  for (int c = 0; c < 2; c++) EXPECT(hixl_dd_create((uint64_t)c, 1 + c, &dd[c]), HIXL_LLM_SUCCESS);

  /* before initialize: LLM_FAILED, as every call */
  EXPECT(hixl_dd_link_comm(dd[0], "x", ids, ranks, 2, TABLE, &comm[0]), HIXL_LLM_FAILED);
  EXPECT(hixl_dd_query_register_mem_status(dd[0], 1, &st), HIXL_LLM_FAILED);
  EXPECT(hixl_dd_unlink_comm(dd[0], 1), HIXL_LLM_FAILED);

  const char *k0[] = {"llm.DeviceId", "llm.LinkTotalTime"};
  const char *v0[] = {"0", "10"};
  const char *k1[] = {"llm.DeviceId", "llm.LinkTotalTime", "llm.ListenIpInfo"};
  const char *v1[] = {"1", "10", "127.0.0.1:0"};
  EXPECT(hixl_dd_initialize(dd[0], k0, v0, 2), HIXL_LLM_SUCCESS);
  EXPECT(hixl_dd_initialize(dd[1], k1, v1, 3), HIXL_LLM_SUCCESS);
  int64_t shape[2] = {BLOCKS, BLOCK};
  hixl_dd_cache_desc desc = {HIXL_DD_PLACEMENT_HOST, TENSORS, 2 /* DT_INT8 */, shape, 2};
  int64_t cache[2];
  for (int c = 0; c < 2; c++)
    EXPECT(hixl_dd_register_cache(dd[c], &desc, addrs[c], TENSORS, &cache[c]), HIXL_LLM_SUCCESS);

  /* bad inputs */
  EXPECT(hixl_dd_link_comm(dd[0], "x", ids, ranks, 2, TABLE, NULL), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_link_comm(dd[0], NULL, ids, ranks, 2, TABLE, &comm[0]), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_link_comm(dd[0], "x", ids, ranks, 2, NULL, &comm[0]), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_link_comm(dd[0], "x", NULL, ranks, 2, TABLE, &comm[0]), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_link_comm(dd[0], "", ids, ranks, 2, TABLE, &comm[0]), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_link_comm(dd[0], "x", ids + 1, ranks + 1, 1, TABLE, &comm[0]),
         HIXL_LLM_PARAM_INVALID); /* its own cluster is not among them */
  EXPECT(hixl_dd_link_comm((hixl_dd *)0x10, "x", ids, ranks, 2, TABLE, &comm[0]),
         HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_query_register_mem_status(dd[0], 1, NULL), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_query_register_mem_status(dd[0], 77, &st), HIXL_LLM_NOT_YET_LINK);
  EXPECT(hixl_dd_unlink_comm(dd[0], 77), HIXL_LLM_NOT_YET_LINK);

  /* link, poll to OK */
  for (int c = 0; c < 2; c++)
    EXPECT(hixl_dd_link_comm(dd[c], "dd_rank_c", ids, ranks, 2, TABLE, &comm[c]), HIXL_LLM_SUCCESS);
  if (comm[0] != 1 || comm[1] != 1) {
    fprintf(stderr, "comm ids %lld %lld, expected 1 1\n", (long long)comm[0], (long long)comm[1]);
    failures++;
  }
  for (int c = 0; c < 2; c++) {
    int32_t s = settle(dd[c], comm[c]);
    if (s != HIXL_DD_REGISTER_MEM_OK) {
      fprintf(stderr, "instance %d: status %d, expected OK\n", c, s);
      failures++;
    }
  }
  /* cluster 1 pulls blocks 1, 2 of cluster 0's into its 5, 6; cluster 0 pushes its 7 into 1's 0 */
  uint64_t src[2] = {1, 2}, dst[2] = {5, 6}, s7 = 7, d0 = 0;
  hixl_dd_cache_index of0 = {0, cache[0], 0}, of1 = {1, cache[1], 0};
  EXPECT(hixl_dd_pull_blocks(dd[1], &of0, cache[1], src, dst, 2, NULL), HIXL_LLM_SUCCESS);
  EXPECT(hixl_dd_push_blocks(dd[0], cache[0], &of1, &s7, &d0, 1, NULL), HIXL_LLM_SUCCESS);
  for (int t = 0; t < TENSORS; t++) {
    if (memcmp(mem[1][t] + 5 * BLOCK, orig[0][t] + 1 * BLOCK, 2 * BLOCK) != 0 ||
        memcmp(mem[1][t], orig[0][t] + 7 * BLOCK, BLOCK) != 0 ||
        memcmp(mem[1][t] + BLOCK, orig[1][t] + BLOCK, 4 * BLOCK) != 0 ||
        memcmp(mem[0][t], orig[0][t], TENSOR) != 0) {
      fprintf(stderr, "tensor %d: bytes differ\n", t);
      failures++;
    }
  }
  for (int c = 0; c < 2; c++) EXPECT(hixl_dd_unlink_comm(dd[c], comm[c]), HIXL_LLM_SUCCESS);
  EXPECT(hixl_dd_query_register_mem_status(dd[0], comm[0], &st), HIXL_LLM_NOT_YET_LINK);
  EXPECT(hixl_dd_pull_blocks(dd[1], &of0, cache[1], src, dst, 2, NULL), HIXL_LLM_NOT_YET_LINK);
  for (int c = 0; c < 2; c++) hixl_dd_destroy(dd[c]);
  for (int c = 0; c < 2; c++)
    for (int t = 0; t < TENSORS; t++) {
      free(mem[c][t]);
      free(orig[c][t]);
    }
  if (failures == 0) printf("PASS\n");
  return failures == 0 ? 0 : 1;
}
