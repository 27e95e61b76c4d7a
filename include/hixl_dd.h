/*
 * hixl_dd.h: LLM-DataDist's C ABI (libhixl.so, also loaded as libcann_hixl.so): the KV-cache
 * manager of CANN's LLM-DataDist (hixl::datadist::DataDist) as C functions. libllm_datadist.so's
 * llm_datadist::LlmDataDist (include/llm_datadist/llm_datadist.h) is a C++ layer over them.
 *
 * Build: cargo build --release -p hixl-capi  ->  target/release/libhixl.so
 * Link:  cc app.c -I include -L target/release -lhixl
 *
 * Every function returns an LLM-DataDist status (HIXL_LLM_SUCCESS 0, HIXL_LLM_PARAM_INVALID
 * 0x5010B005, ...: the values of CANN's llm_datadist.h) and writes results through
 * out-parameters; on failure hixl_last_error_message() (hixl_c.h) gives the cause. Null
 * pointers, unknown or destroyed handles, strings that are not UTF-8, unknown roles and
 * placements, and counts whose byte size overflows give HIXL_LLM_PARAM_INVALID; a panic inside
 * the library gives HIXL_LLM_FAILED. Calls on an instance not initialized (or finalized) give
 * HIXL_LLM_FAILED, as LLM-DataDist's. Instances are thread-safe.
 *
 * What the calls do, and the order of their checks: docs/c-and-cpp.md ("LLM-DataDist"). The
 * rules an argument must follow are hixl::datadist's (src/datadist/core/args.rs), the same for
 * the Rust API, this ABI and the Python package.
 */
#ifndef HIXL_DD_H_
#define HIXL_DD_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hixl_c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* LLM-DataDist's status codes (llm_datadist.h, llm_error_codes.h) */
#define HIXL_LLM_SUCCESS 0x0u
#define HIXL_LLM_FAILED 0xFFFFFFFFu
#define HIXL_LLM_WAIT_PROC_TIMEOUT 0x5010B001u
#define HIXL_LLM_KV_CACHE_NOT_EXIST 0x5010B002u
#define HIXL_LLM_REPEAT_REQUEST 0x5010B003u
#define HIXL_LLM_REQUEST_ALREADY_COMPLETED 0x5010B004u
#define HIXL_LLM_PARAM_INVALID 0x5010B005u
#define HIXL_LLM_ENGINE_FINALIZED 0x5010B006u
#define HIXL_LLM_NOT_YET_LINK 0x5010B007u
#define HIXL_LLM_ALREADY_LINK 0x5010B008u
#define HIXL_LLM_LINK_FAILED 0x5010B009u
#define HIXL_LLM_UNLINK_FAILED 0x5010B00Au
#define HIXL_LLM_NOTIFY_PROMPT_UNLINK_FAILED 0x5010B00Bu
#define HIXL_LLM_CLUSTER_NUM_EXCEED_LIMIT 0x5010B00Cu
#define HIXL_LLM_PROCESSING_LINK 0x5010B00Du
#define HIXL_LLM_DEVICE_OUT_OF_MEMORY 0x5010B00Eu
#define HIXL_LLM_PREFIX_ALREADY_EXIST 0x5010B00Fu
#define HIXL_LLM_PREFIX_NOT_EXIST 0x5010B010u
#define HIXL_LLM_SEQ_LEN_OVER_LIMIT 0x5010B011u
#define HIXL_LLM_NO_FREE_BLOCK 0x5010B012u
#define HIXL_LLM_BLOCKS_OUT_OF_MEMORY 0x5010B013u
#define HIXL_LLM_CACHE_INCOMPATIBLE 0x5010B014u
#define HIXL_LLM_CACHE_KEY_ALREADY_EXIST 0x5010B015u
#define HIXL_LLM_COPY_CACHE_FAILED 0x5010B016u
#define HIXL_LLM_CACHE_ID_ALREADY_EXIST 0x5010B017u
#define HIXL_LLM_EXIST_LINK 0x5010B018u
#define HIXL_LLM_FEATURE_NOT_ENABLED 0x5010B019u
#define HIXL_LLM_TIMEOUT 0x5010B01Au
#define HIXL_LLM_LINK_BUSY 0x5010B01Bu
#define HIXL_LLM_OUT_OF_MEMORY 0x5010B01Cu

/* LlmRole */
#define HIXL_DD_ROLE_PROMPT 1
#define HIXL_DD_ROLE_DECODER 2
#define HIXL_DD_ROLE_MIX 3
/* CachePlacement */
#define HIXL_DD_PLACEMENT_HOST 0u
#define HIXL_DD_PLACEMENT_DEVICE 1u

typedef struct hixl_dd hixl_dd;

/* An address: IPv4 or IPv6 text, and a port. */
typedef struct {
  const char *ip;
  uint16_t port;
} hixl_dd_ip_info;

/* A peer cluster to link or unlink (ClusterInfo). Linking takes exactly one remote address
 * (the peer's llm.ListenIpInfo); the local ones are informative. */
typedef struct {
  uint64_t remote_cluster_id;
  int32_t remote_role_type;
  const hixl_dd_ip_info *local_ip_infos;
  size_t local_ip_count;
  const hixl_dd_ip_info *remote_ip_infos;
  size_t remote_ip_count;
} hixl_dd_cluster_info;

/* A cache's description (CacheDesc): num_tensors tensors of `shape` elements of data_type
 * (a ge::DataType value) each; shape[0] blocks (and batches) per tensor. */
typedef struct {
  uint32_t placement; /* HIXL_DD_PLACEMENT_* */
  uint32_t num_tensors;
  int32_t data_type;
  const int64_t *shape;
  size_t shape_len;
} hixl_dd_cache_desc;

/* A peer's cache (CacheIndex). */
typedef struct {
  uint64_t cluster_id;
  int64_t cache_id;
  uint32_t batch_index;
} hixl_dd_cache_index;

/* The layers a transfer moves (KvCacheExtParam): each side first..last inclusive, layers of
 * tensor_num_per_layer tensors; -1, -1 for every tensor. Both sides' ranges or neither. A null
 * pointer where one is taken: every tensor. */
typedef struct {
  int32_t src_first;
  int32_t src_last;
  int32_t dst_first;
  int32_t dst_last;
  uint32_t tensor_num_per_layer; /* >= 1 */
} hixl_dd_layers;

/* Instances. A handle is never dereferenced and never reused: after hixl_dd_destroy it is
 * unknown (HIXL_LLM_PARAM_INVALID). */
hixl_status hixl_dd_create(uint64_t cluster_id, int32_t role, hixl_dd **out);
void hixl_dd_destroy(hixl_dd *dd); /* finalizes; null or unknown handles are ignored */
/* `count` option pairs by CANN's keys: llm.ListenIpInfo "ip:port" (listens there; without it
 * the instance only links out), llm.DeviceId (made current on this thread where ACL loads),
 * llm.SyncKvCacheWaitTime (ms), llm.TransferBackend ("hixl" or absent: the same engine),
 * llm.LinkTotalTime (s) and llm.LinkRetryCount (1..100: for hixl_dd_link_comm),
 * llm.RdmaTrafficClass, llm.RdmaServiceLevel, llm.GlobalResourceConfig (to the engine); other
 * keys are accepted and not used. A second call succeeds and changes nothing. */
hixl_status hixl_dd_initialize(hixl_dd *dd, const char *const *keys, const char *const *values,
                               size_t count);
hixl_status hixl_dd_finalize(hixl_dd *dd); /* idempotent */
/* With llm.ListenIpInfo: listens there from now on (HIXL_LLM_EXIST_LINK while links exist). */
hixl_status hixl_dd_set_role(hixl_dd *dd, int32_t role, const char *const *keys,
                             const char *const *values, size_t count);
hixl_status hixl_dd_role(hixl_dd *dd, int32_t *role);

/* Links: rets[i] gets cluster i's status (when the call got that far); the call returns the last
 * failure, or success. timeout_in_millis > 0. A malformed address fails the whole call
 * (HIXL_LLM_PARAM_INVALID, rets not written). */
hixl_status hixl_dd_link_clusters(hixl_dd *dd, const hixl_dd_cluster_info *clusters, size_t count,
                                  int32_t timeout_in_millis, uint32_t *rets);
/* Unlinking a cluster that is not linked gives HIXL_LLM_NOT_YET_LINK in its rets entry (the C++
 * layer reports it as LLM_SUCCESS, as CANN's does); force: the peer is not told, and no remote
 * address is needed. */
hixl_status hixl_dd_unlink_clusters(hixl_dd *dd, const hixl_dd_cluster_info *clusters,
                                    size_t count, int32_t timeout_in_millis, bool force,
                                    uint32_t *rets);

/* Links by an explicit rank table (the Python package's link / query_register_mem_status /
 * unlink, as vllm-ascend's and omni-infer's connectors use them): cluster_ids[i] is rank
 * ranks[i] of rank_table (HCCL's rank-table JSON, version 1.0 or 1.2), this instance's own
 * cluster among them. The communicator comm_name (1 to 127 bytes) is made by the call; the
 * peers are linked in the background (HCCL's rendezvous, then the engines link): poll the
 * status until it is not PREPARING. Comm ids count from 1, at most 512 communicators at a
 * time (then HIXL_LLM_PARAM_INVALID). An instance without llm.ListenIpInfo listens for this
 * on an ephemeral port of its rank's server_id. HCCL refusing the table or this cluster's rank
 * in it: HIXL_LLM_LINK_FAILED; HCCL without HcclExchangeMemDesc: HIXL_LLM_FEATURE_NOT_ENABLED.
 * A peer that does not join within llm.LinkTotalTime (s, 30 by default), a peer given this
 * cluster's rank or a rank not in the table: status FAILED. An unknown comm id:
 * HIXL_LLM_NOT_YET_LINK. */
#define HIXL_DD_REGISTER_MEM_OK 0
#define HIXL_DD_REGISTER_MEM_PREPARING 1
#define HIXL_DD_REGISTER_MEM_FAILED 2
hixl_status hixl_dd_link_comm(hixl_dd *dd, const char *comm_name, const uint64_t *cluster_ids,
                              const uint32_t *ranks, size_t count, const char *rank_table,
                              int64_t *comm_id);
hixl_status hixl_dd_query_register_mem_status(hixl_dd *dd, int64_t comm_id, int32_t *status);
hixl_status hixl_dd_unlink_comm(hixl_dd *dd, int64_t comm_id);

/* Caches. Each tensor (product(shape) * element size bytes) must stay allocated until the cache
 * is unregistered or the instance finalized: peers READ and WRITE it while linked. Ids count
 * from 1 per instance. Unregistering an unknown id succeeds. */
hixl_status hixl_dd_register_cache(hixl_dd *dd, const hixl_dd_cache_desc *desc,
                                   const uint64_t *addrs, size_t count, int64_t *cache_id);
hixl_status hixl_dd_unregister_cache(hixl_dd *dd, int64_t cache_id);

/* Pulls (READs of the peer's cache into a local one) and pushes (WRITEs of a local cache into
 * the peer's, one per layer). size: -1 (a whole batch) or, for a pull, 1.. a batch's bytes.
 * Blocks: count >= 1 pairs; the batch index of src (pull) or dst (push) must be 0. */
hixl_status hixl_dd_pull_cache(hixl_dd *dd, const hixl_dd_cache_index *src, int64_t dst_cache_id,
                               uint32_t dst_batch_index, int64_t size,
                               const hixl_dd_layers *layers);
hixl_status hixl_dd_pull_blocks(hixl_dd *dd, const hixl_dd_cache_index *src, int64_t dst_cache_id,
                                const uint64_t *src_blocks, const uint64_t *dst_blocks,
                                size_t count, const hixl_dd_layers *layers);
hixl_status hixl_dd_push_cache(hixl_dd *dd, int64_t src_cache_id, uint32_t src_batch_index,
                               const hixl_dd_cache_index *dst, int64_t size,
                               const hixl_dd_layers *layers);
hixl_status hixl_dd_push_blocks(hixl_dd *dd, int64_t src_cache_id, const hixl_dd_cache_index *dst,
                                const uint64_t *src_blocks, const uint64_t *dst_blocks,
                                size_t count, const hixl_dd_layers *layers);

/* CANN's C++ class llm_datadist::LlmDataDist (libllm_datadist.so) in its own argument forms:
 * its calls forward here and check nothing themselves. As the calls above, with CANN's rules
 * for its forms: Initialize requires llm.DeviceId; links take at least one cluster and IPv4
 * addresses, and *reached says whether the call got to the clusters (and wrote rets); an
 * unlinked cluster counts as unlinked (HIXL_LLM_SUCCESS) when that was the call's failure.
 * Block lists come with a count each (C++ vectors: their lengths are the rules' to compare).
 * `ext` is a KvCacheExtParam in hixl_dd_layers' layout: each side {first, last} (-1 or more,
 * first <= last; a first below 0: no range), a pull's layers both ranges when both are set,
 * else every tensor; a push takes a cache the argument places on the device, both ranges of
 * one span, and without a source range every layer of the argument's num_tensors (a last
 * partial layer counts as one). */
typedef struct {
  int64_t cache_id;
  uint32_t placement;   /* HIXL_DD_PLACEMENT_*, as the caller's Cache says */
  uint32_t num_tensors; /* as the caller's Cache says */
} hixl_dd_cache_arg;

hixl_status hixl_dd_cann_initialize(hixl_dd *dd, const char *const *keys, const char *const *values,
                                    size_t count);
hixl_status hixl_dd_cann_link_clusters(hixl_dd *dd, const hixl_dd_cluster_info *clusters,
                                       size_t count, int32_t timeout_in_millis, uint32_t *rets,
                                       bool *reached);
hixl_status hixl_dd_cann_unlink_clusters(hixl_dd *dd, const hixl_dd_cluster_info *clusters,
                                         size_t count, int32_t timeout_in_millis, bool force,
                                         uint32_t *rets, bool *reached);
hixl_status hixl_dd_cann_pull_cache(hixl_dd *dd, const hixl_dd_cache_index *src,
                                    int64_t dst_cache_id, uint32_t dst_batch_index, int64_t size,
                                    const hixl_dd_layers *ext);
hixl_status hixl_dd_cann_pull_blocks(hixl_dd *dd, const hixl_dd_cache_index *src,
                                     int64_t dst_cache_id, const uint64_t *src_blocks,
                                     size_t src_count, const uint64_t *dst_blocks,
                                     size_t dst_count, const hixl_dd_layers *ext);
hixl_status hixl_dd_cann_push_cache(hixl_dd *dd, const hixl_dd_cache_arg *src,
                                    uint32_t src_batch_index, const hixl_dd_cache_index *dst,
                                    int64_t size, const hixl_dd_layers *ext);
hixl_status hixl_dd_cann_push_blocks(hixl_dd *dd, const hixl_dd_cache_arg *src,
                                     const hixl_dd_cache_index *dst, const uint64_t *src_blocks,
                                     size_t src_count, const uint64_t *dst_blocks,
                                     size_t dst_count, const hixl_dd_layers *ext);

#ifdef __cplusplus
}
#endif

#endif /* HIXL_DD_H_ */
