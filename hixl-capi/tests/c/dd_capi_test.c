/* LLM-DataDist's C ABI (hixl_dd.h) from C, in one process: two instances on host memory (a
 * prompt listening on an ephemeral port of 127.0.0.1 that this program picks, a decoder that
 * links to it) move random blocks and a batch both ways, checked byte for byte; and every bad
 * input gets its exact status (null pointers, unknown and destroyed handles, unknown roles and
 * placements, malformed layer ranges and addresses, calls before initialize). Prints PASS. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hixl_dd.h"

_Static_assert(sizeof(void *) != 8 || sizeof(hixl_dd_cluster_info) == 48, "cluster info");
_Static_assert(sizeof(void *) != 8 || sizeof(hixl_dd_cache_desc) == 32, "cache desc");
_Static_assert(sizeof(hixl_dd_cache_index) == 24, "cache index");
_Static_assert(sizeof(hixl_dd_layers) == 20, "layers");

static int failures = 0;

static void expect(hixl_status got, hixl_status want, int line) {
  if (got != want) {
    fprintf(stderr, "line %d: status %#x, expected %#x (%s)\n", line, got, want,
            hixl_last_error_message());
    failures++;
  }
}
#define EXPECT(call, want) expect((call), (want), __LINE__)

enum { TENSORS = 2, BLOCKS = 8, BLOCK = 128, TENSOR = BLOCKS * BLOCK };

static int free_port(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(s, (struct sockaddr *)&a, &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(s);
  return port;
}

int main(void) {
  unsigned seed = (unsigned)getpid();
  unsigned char *mem[2][TENSORS], *orig[2][TENSORS];
  for (int c = 0; c < 2; c++) {
    for (int t = 0; t < TENSORS; t++) {
      if (posix_memalign((void **)&mem[c][t], 4096, TENSOR) != 0) return 1;
      orig[c][t] = malloc(TENSOR);
      for (int i = 0; i < TENSOR; i++) orig[c][t][i] = (unsigned char)rand_r(&seed);
      memcpy(mem[c][t], orig[c][t], TENSOR);
    }
  }
  char listen[64];
  int port = free_port();
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);

  hixl_dd *prompt = NULL, *decoder = NULL;
  /* creation: a bad role, a null out-pointer */
  EXPECT(hixl_dd_create(0, 4, &prompt), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_create(0, HIXL_DD_ROLE_PROMPT, NULL), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_create(0, HIXL_DD_ROLE_PROMPT, &prompt), HIXL_LLM_SUCCESS);
  EXPECT(hixl_dd_create(1, HIXL_DD_ROLE_DECODER, &decoder), HIXL_LLM_SUCCESS);

  /* before initialize: LLM_FAILED */
  int64_t id = -1;
  hixl_dd_cache_desc desc = {HIXL_DD_PLACEMENT_HOST, TENSORS, 4 /* DT_UINT8 */, NULL, 0};
  int64_t shape[2] = {BLOCKS, BLOCK};
  desc.shape = shape;
  desc.shape_len = 2;
  uint64_t addrs[2][TENSORS];
  for (int c = 0; c < 2; c++)
    for (int t = 0; t < TENSORS; t++) addrs[c][t] = (uint64_t)(uintptr_t)mem[c][t];
  EXPECT(hixl_dd_register_cache(prompt, &desc, addrs[0], TENSORS, &id), HIXL_LLM_FAILED);

  const char *pk[] = {"llm.ListenIpInfo", "llm.DeviceId", "llm.TransferBackend"};
  const char *pv[] = {listen, "0", "hixl"};
  const char *dk[] = {"llm.DeviceId"};
  const char *dv[] = {"1"};
  const char *bad_v[] = {"127.0.0.1:99999"};
  EXPECT(hixl_dd_initialize(prompt, pk, NULL, 3), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_initialize(prompt, pk, bad_v, 1), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_initialize(prompt, pk, pv, 3), HIXL_LLM_SUCCESS);
  EXPECT(hixl_dd_initialize(prompt, pk, pv, 3), HIXL_LLM_SUCCESS); /* idempotent */
  EXPECT(hixl_dd_initialize(decoder, dk, dv, 1), HIXL_LLM_SUCCESS);
  int32_t role = 0;
  EXPECT(hixl_dd_role(decoder, &role), HIXL_LLM_SUCCESS);
  if (role != HIXL_DD_ROLE_DECODER) failures++;
  EXPECT(hixl_dd_role(decoder, NULL), HIXL_LLM_PARAM_INVALID);

  /* caches: ids from 1; bad descriptions */
  int64_t pid = -1, did = -1;
  EXPECT(hixl_dd_register_cache(prompt, NULL, addrs[0], TENSORS, &pid), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_register_cache(prompt, &desc, addrs[0], TENSORS, NULL), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_register_cache(prompt, &desc, NULL, TENSORS, &pid), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_register_cache(prompt, &desc, addrs[0], 1, &pid), HIXL_LLM_PARAM_INVALID);
  hixl_dd_cache_desc bad = desc;
  bad.placement = 2;
  EXPECT(hixl_dd_register_cache(prompt, &bad, addrs[0], TENSORS, &pid), HIXL_LLM_PARAM_INVALID);
  bad = desc;
  bad.shape = NULL;
  EXPECT(hixl_dd_register_cache(prompt, &bad, addrs[0], TENSORS, &pid), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_register_cache(prompt, &desc, addrs[0], TENSORS, &pid), HIXL_LLM_SUCCESS);
  EXPECT(hixl_dd_register_cache(decoder, &desc, addrs[1], TENSORS, &did), HIXL_LLM_SUCCESS);
  if (pid != 1 || did != 1) failures++;

  /* links: null arrays, a bad address, then the link */
  hixl_dd_ip_info remote = {"127.0.0.1", (uint16_t)port};
  hixl_dd_ip_info bad_ip = {"not-an-ip", 1};
  hixl_dd_cluster_info to_prompt = {0, 1, NULL, 0, &remote, 1};
  hixl_dd_cluster_info to_bad = {0, 1, NULL, 0, &bad_ip, 1};
  uint32_t rets[1] = {7};
  EXPECT(hixl_dd_link_clusters(decoder, NULL, 1, 1000, rets), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_link_clusters(decoder, &to_prompt, 1, 1000, NULL), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_link_clusters(decoder, &to_bad, 1, 1000, rets), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_link_clusters(decoder, &to_prompt, 1, 0, rets), HIXL_LLM_PARAM_INVALID);
  if (rets[0] != 7) failures++; /* not written by a refused call */
  hixl_dd_cache_index src = {0, 1, 0};
  uint64_t sb[3] = {1, 2, 3}, db[3] = {4, 5, 6};
  EXPECT(hixl_dd_pull_blocks(decoder, &src, did, sb, db, 3, NULL), HIXL_LLM_NOT_YET_LINK);
  EXPECT(hixl_dd_link_clusters(decoder, &to_prompt, 1, 1000, rets), HIXL_LLM_SUCCESS);
  if (rets[0] != HIXL_LLM_SUCCESS) failures++;
  EXPECT(hixl_dd_link_clusters(decoder, &to_prompt, 1, 1000, rets), HIXL_LLM_ALREADY_LINK);
  if (rets[0] != HIXL_LLM_ALREADY_LINK) failures++;

  /* pulls: blocks 1..3 into 4..6 (one run), the second tensor's batch 7 into batch 0 of the
   * first (layers of one tensor) */
  EXPECT(hixl_dd_pull_blocks(decoder, &src, did, sb, db, 3, NULL), HIXL_LLM_SUCCESS);
  for (int t = 0; t < TENSORS; t++)
    if (memcmp(mem[1][t] + 4 * BLOCK, orig[0][t] + BLOCK, 3 * BLOCK) != 0) failures++;
  hixl_dd_cache_index batch7 = {0, 1, 7};
  hixl_dd_layers one = {1, 1, 0, 0, 1};
  EXPECT(hixl_dd_pull_cache(decoder, &batch7, did, 0, -1, &one), HIXL_LLM_SUCCESS);
  if (memcmp(mem[1][0], orig[0][1] + 7 * BLOCK, BLOCK) != 0) failures++;
  if (memcmp(mem[1][1], orig[1][1], BLOCK) != 0) failures++;

  /* bad pulls: nothing moves */
  hixl_dd_layers mixed = {0, 0, -1, -1, 1}, reversed = {1, 0, 1, 0, 1}, zero = {-1, -1, -1, -1, 0};
  hixl_dd_cache_index other = {0, 9, 0}, own = {1, 1, 0};
  uint64_t out[1] = {8};
  EXPECT(hixl_dd_pull_blocks(decoder, NULL, did, sb, db, 1, NULL), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_pull_blocks(decoder, &src, did, NULL, db, 1, NULL), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_pull_blocks(decoder, &src, did, sb, db, 0, NULL), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_pull_blocks(decoder, &batch7, did, sb, db, 1, NULL), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_pull_blocks(decoder, &src, did, sb, db, 1, &mixed), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_pull_blocks(decoder, &src, did, sb, db, 1, &reversed), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_pull_blocks(decoder, &src, did, sb, db, 1, &zero), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_pull_blocks(decoder, &src, did, out, db, 1, NULL), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_pull_blocks(decoder, &src, did, sb, out, 1, NULL), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_pull_blocks(decoder, &other, did, sb, db, 1, NULL), HIXL_LLM_KV_CACHE_NOT_EXIST);
  EXPECT(hixl_dd_pull_blocks(decoder, &src, 5, sb, db, 1, NULL), HIXL_LLM_KV_CACHE_NOT_EXIST);
  EXPECT(hixl_dd_pull_blocks(decoder, &own, did, sb, db, 1, NULL), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_pull_cache(decoder, &src, did, 0, 0, NULL), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_pull_cache(decoder, &src, did, 8, -1, NULL), HIXL_LLM_PARAM_INVALID);
  if (memcmp(mem[1][0] + 7 * BLOCK, orig[1][0] + 7 * BLOCK, BLOCK) != 0) failures++;

  /* pushes: the decoder's block 7 into the prompt's block 0, its batch 2 into batch 3 */
  uint64_t s7[1] = {7}, d0[1] = {0};
  hixl_dd_cache_index dst = {0, 1, 0}, dst3 = {0, 1, 3};
  EXPECT(hixl_dd_push_blocks(decoder, did, &dst, s7, d0, 1, NULL), HIXL_LLM_SUCCESS);
  EXPECT(hixl_dd_push_cache(decoder, did, 2, &dst3, -1, NULL), HIXL_LLM_SUCCESS);
  for (int t = 0; t < TENSORS; t++) {
    if (memcmp(mem[0][t], orig[1][t] + 7 * BLOCK, BLOCK) != 0) failures++;
    if (memcmp(mem[0][t] + 3 * BLOCK, orig[1][t] + 2 * BLOCK, BLOCK) != 0) failures++;
  }
  EXPECT(hixl_dd_push_cache(decoder, did, 2, &dst3, 100, NULL), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_push_blocks(decoder, did, &dst3, s7, d0, 1, NULL), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_push_blocks(decoder, did, NULL, s7, d0, 1, NULL), HIXL_LLM_PARAM_INVALID);

  /* roles: a new listen address while linked; unlink; a forced unlink of nothing */
  const char *lk[] = {"llm.ListenIpInfo"};
  char other_listen[64];
  snprintf(other_listen, sizeof other_listen, "127.0.0.1:%d", free_port());
  const char *lv[] = {other_listen};
  EXPECT(hixl_dd_set_role(decoder, HIXL_DD_ROLE_PROMPT, lk, lv, 1), HIXL_LLM_EXIST_LINK);
  EXPECT(hixl_dd_set_role(decoder, 0, NULL, NULL, 0), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_unlink_clusters(decoder, &to_prompt, 1, 1000, false, rets), HIXL_LLM_SUCCESS);
  hixl_dd_cluster_info forced = {0, 1, NULL, 0, NULL, 0};
  EXPECT(hixl_dd_unlink_clusters(decoder, &forced, 1, 1000, true, rets), HIXL_LLM_NOT_YET_LINK);
  if (rets[0] != HIXL_LLM_NOT_YET_LINK) failures++;
  EXPECT(hixl_dd_set_role(decoder, HIXL_DD_ROLE_PROMPT, lk, lv, 1), HIXL_LLM_SUCCESS);
  EXPECT(hixl_dd_role(decoder, &role), HIXL_LLM_SUCCESS);
  if (role != HIXL_DD_ROLE_PROMPT) failures++;

  /* unregister: an unknown id succeeds; handles after destroy are unknown */
  EXPECT(hixl_dd_unregister_cache(prompt, 42), HIXL_LLM_SUCCESS);
  EXPECT(hixl_dd_unregister_cache(prompt, pid), HIXL_LLM_SUCCESS);
  EXPECT(hixl_dd_finalize(prompt), HIXL_LLM_SUCCESS);
  EXPECT(hixl_dd_finalize(prompt), HIXL_LLM_SUCCESS);
  EXPECT(hixl_dd_pull_blocks(prompt, &src, pid, sb, db, 1, NULL), HIXL_LLM_FAILED);
  hixl_dd_destroy(prompt);
  hixl_dd_destroy(decoder);
  hixl_dd_destroy(NULL);
  EXPECT(hixl_dd_finalize(prompt), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_initialize(decoder, dk, dv, 1), HIXL_LLM_PARAM_INVALID);
  EXPECT(hixl_dd_finalize((hixl_dd *)0x1234), HIXL_LLM_PARAM_INVALID);

  for (int c = 0; c < 2; c++) {
    for (int t = 0; t < TENSORS; t++) {
      free(mem[c][t]);
      free(orig[c][t]);
    }
  }
  if (failures != 0) {
    fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  printf("PASS\n");
  return 0;
}
