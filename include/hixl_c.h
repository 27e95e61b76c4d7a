/*
 * hixl_c.h: the C ABI of hixl (libhixl.so), HIXL's engine (hixl::Hixl) as C functions.
 *
 * Build: cargo build --release -p hixl-capi  ->  target/release/libhixl.so
 * Link:  cc app.c -I include -L target/release -lhixl
 *
 * Every function returns a status with HIXL's values (HIXL_SUCCESS, HIXL_PARAM_INVALID, ...)
 * and writes results through out-parameters. On failure hixl_last_error_message() gives the
 * cause (thread-local). Null pointers, unknown handles, strings that are not UTF-8, unknown
 * enum values and counts whose byte size overflows give HIXL_PARAM_INVALID; a panic inside the
 * library gives HIXL_FAILED. Non-null pointers must point to what is documented (arrays of
 * `count` elements, NUL-terminated strings); registered memory must stay valid until it is
 * deregistered or the engine finalized, as in HIXL.
 *
 * Engines are thread-safe: any thread may call any function on one engine.
 */
#ifndef HIXL_C_H_
#define HIXL_C_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint32_t hixl_status;

#define HIXL_SUCCESS 0u
#define HIXL_PARAM_INVALID 103900u
#define HIXL_TIMEOUT 103901u
#define HIXL_NOT_CONNECTED 103902u
#define HIXL_ALREADY_CONNECTED 103903u
#define HIXL_NOTIFY_FAILED 103904u
#define HIXL_UNSUPPORTED 103905u
#define HIXL_RESOURCE_EXHAUSTED 203900u
#define HIXL_FAILED 503900u

/* MemType */
#define HIXL_MEM_DEVICE 0
#define HIXL_MEM_HOST 1
/* TransferOp */
#define HIXL_READ 0
#define HIXL_WRITE 1
/* TransferStatus */
#define HIXL_TRANSFER_WAITING 0
#define HIXL_TRANSFER_COMPLETED 1
#define HIXL_TRANSFER_TIMEOUT 2
#define HIXL_TRANSFER_FAILED 3
/* AsyncConnectStatus */
#define HIXL_NOT_CONNECT 0
#define HIXL_CONNECT_PENDING 1
#define HIXL_CONNECTING 2
#define HIXL_CONNECTED 3
#define HIXL_CONNECT_FAILED 4
#define HIXL_DISCONNECT_PENDING 5
#define HIXL_DISCONNECTING 6
/* FeatureType */
#define HIXL_AUTO_CONNECT 0
#define HIXL_CLIENT_SERVER_COMM 1
#define HIXL_FEATURE_SUPPORTED 1
#define HIXL_FEATURE_NOT_SUPPORTED 0

/* Option keys */
#define HIXL_OPTION_ENABLE_USE_FABRIC_MEM "EnableUseFabricMem"
#define HIXL_OPTION_RDMA_TRAFFIC_CLASS "RdmaTrafficClass"
#define HIXL_OPTION_RDMA_SERVICE_LEVEL "RdmaServiceLevel"
#define HIXL_OPTION_BUFFER_POOL "BufferPool"
#define HIXL_OPTION_GLOBAL_RESOURCE_CONFIG "GlobalResourceConfig"
#define HIXL_OPTION_AUTO_CONNECT "AutoConnect"
#define HIXL_OPTION_LOCAL_COMM_RES "LocalCommRes"

typedef struct hixl_engine hixl_engine;
typedef struct hixl_list hixl_list;
typedef void *hixl_mem_handle;
typedef void *hixl_transfer_req;

/* The structs have HIXL's layouts (hixl_types.h), reserved bytes included; the library ignores
 * the reserved bytes it reads and zeroes those it writes. */
typedef struct {
  uintptr_t addr;
  size_t len;
  uint8_t reserved[128];
} hixl_mem_desc; /* HIXL's MemDesc: 144 bytes on LP64 */

typedef struct {
  uintptr_t local_addr;
  uintptr_t remote_addr;
  size_t len;
} hixl_transfer_op_desc;

typedef struct {
  const void *user_data;
  uint8_t reserved[120];
} hixl_transfer_args;

typedef struct {
  uint32_t max_query_count; /* UINT32_MAX: all */
  bool skip_waiting;
  uint8_t reserved[123];
} hixl_get_transfer_status_args;

typedef struct {
  hixl_transfer_req req;
  const void *user_data;
  int32_t status; /* HIXL_TRANSFER_* */
  uint8_t reserved[108];
} hixl_transfer_result;

/* Engines. */
/* A handle is never dereferenced by the library and never reused: after hixl_destroy it stays
 * unknown (HIXL_PARAM_INVALID). */
hixl_status hixl_create(hixl_engine **out);
void hixl_destroy(hixl_engine *engine); /* finalizes; null or unknown handles are ignored */
/* local_engine: "ip" (client only), "ip:port", "ip:0" (an ephemeral port), "[ipv6]:port";
 * `count` option pairs (keys[i], values[i]); keys/values may be NULL when count is 0. Where the
 * engine cannot read its device at start (aclrtGetDevice fails: with the option
 * "hixl.ascend.require_device" "1" on a thread with no device), the status is ACL's own code
 * (107002 ACL_ERROR_RT_CONTEXT_NULL), as HIXL returns it. */
hixl_status hixl_initialize(hixl_engine *engine, const char *local_engine,
                            const char *const *keys, const char *const *values, size_t count);
/* The name peers connect to (with the real port for "ip:0"), NUL-terminated in buf.
 * *len (if not NULL) gets its length; HIXL_RESOURCE_EXHAUSTED if cap is too small (buf NULL
 * and cap 0 asks for the length alone); HIXL_PARAM_INVALID for a NULL buf with a cap. */
hixl_status hixl_local_engine(hixl_engine *engine, char *buf, size_t cap, size_t *len);
hixl_status hixl_finalize(hixl_engine *engine); /* idempotent */

/* Memory (caller-managed, as HIXL's RegisterMem). mem_type: HIXL_MEM_DEVICE or HIXL_MEM_HOST. */
hixl_status hixl_register_mem(hixl_engine *engine, const hixl_mem_desc *mem, int32_t mem_type,
                              hixl_mem_handle *handle);
/* hixl extension (HIXL has no such call): hixl_register_mem with flags, an OR of HIXL_REGISTER_*
 * bits; flags 0 is hixl_register_mem. An unknown bit gives HIXL_PARAM_INVALID (nothing is
 * registered), so a caller can tell a library that lacks a flag. */
#define HIXL_REGISTER_LOCAL_ONLY 0x1u /* for this engine's transfers only: not in the table peers
                                        get, so a peer's READ or WRITE of it is refused */
hixl_status hixl_register_mem_ex(hixl_engine *engine, const hixl_mem_desc *mem, int32_t mem_type,
                                 uint32_t flags, hixl_mem_handle *handle);
/* hixl extension (HIXL has no such call): engine-allocated host memory, the same-host fast
 * path. Allocates `size` zeroed, page-aligned bytes owned by the engine and registers them as
 * HIXL_MEM_HOST (peers may READ and WRITE them, links may exist); *addr gets the address,
 * *handle the handle. Peers on the same host map this memory and move data with a memory copy;
 * caller-managed memory (hixl_register_mem) is served to them over TCP, since the engine cannot
 * keep memory from its owner while a one-sided peer may still write it. hixl_deregister_mem
 * (or hixl_finalize / hixl_destroy) ends the registration: then stop using the memory; the
 * engine frees it once no same-host peer can touch it (it is never reused before).
 * size 0, or addr/handle NULL: HIXL_PARAM_INVALID (nothing allocated); a size that cannot be
 * allocated: HIXL_RESOURCE_EXHAUSTED. */
hixl_status hixl_alloc_host_mem(hixl_engine *engine, size_t size, void **addr,
                                hixl_mem_handle *handle);
/* Deregisters caller-managed memory, or frees a hixl_alloc_host_mem buffer. As HIXL's
 * DeregisterMem: a null handle is HIXL_PARAM_INVALID; an unknown or already-deregistered one
 * is HIXL_SUCCESS with no effect. */
hixl_status hixl_deregister_mem(hixl_engine *engine, hixl_mem_handle handle);

/* Links, by remote engine name. Timeouts in milliseconds (> 0; HIXL's default is 1000). */
hixl_status hixl_connect(hixl_engine *engine, const char *remote_engine, int32_t timeout_in_millis);
hixl_status hixl_disconnect(hixl_engine *engine, const char *remote_engine,
                            int32_t timeout_in_millis);
hixl_status hixl_connect_async(hixl_engine *engine, const char *remote_engine,
                               int32_t timeout_in_millis);
hixl_status hixl_disconnect_async(hixl_engine *engine, const char *remote_engine,
                                  int32_t timeout_in_millis);
hixl_status hixl_get_async_connect_status(hixl_engine *engine, const char *remote_engine,
                                          int32_t *status);
/* A list of (remote, status): hixl_list_len, hixl_list_connect_status, hixl_list_free. */
hixl_status hixl_get_all_async_connect_status(hixl_engine *engine, hixl_list **out);

/* Transfers. op: HIXL_READ (remote -> local) or HIXL_WRITE (local -> remote). */
hixl_status hixl_transfer_sync(hixl_engine *engine, const char *remote_engine, int32_t op,
                               const hixl_transfer_op_desc *descs, size_t count,
                               int32_t timeout_in_millis);
/* args may be NULL. *req gets a non-null request. */
hixl_status hixl_transfer_async(hixl_engine *engine, const char *remote_engine, int32_t op,
                                const hixl_transfer_op_desc *descs, size_t count,
                                const hixl_transfer_args *args, hixl_transfer_req *req);
/* *status: HIXL_TRANSFER_*. A terminal status is reported once (the request is released);
 * as HIXL's GetTransferStatus, an unknown request (never issued, or already reported) gives
 * HIXL_PARAM_INVALID and a null one HIXL_FAILED, each with *status = HIXL_TRANSFER_FAILED. */
hixl_status hixl_get_transfer_status(hixl_engine *engine, hixl_transfer_req req, int32_t *status);
/* Up to min(args->max_query_count, capacity) results, oldest first; args may be NULL. */
hixl_status hixl_get_transfer_statuses(hixl_engine *engine,
                                       const hixl_get_transfer_status_args *args,
                                       hixl_transfer_result *results, size_t capacity,
                                       size_t *count);
/* Requests not yet reported terminal (a capacity for hixl_get_transfer_statuses). */
hixl_status hixl_pending_transfers(hixl_engine *engine, size_t *count);
/* hixl extensions (HIXL has no such calls; NIXL's HIXL backend, nixl-plugin/, uses them):
 * hixl_transfer_async_within: hixl_transfer_async with the request's own deadline,
 * timeout_in_millis from now (> 0, else HIXL_PARAM_INVALID; hixl_transfer_async's is 60 s):
 * past it the request ends HIXL_TRANSFER_TIMEOUT, and the engine no longer touches its local
 * buffers (a terminal status always means that).
 * hixl_cancel_transfer: asks the engine to stop a request; it ends HIXL_TRANSFER_FAILED (or
 * COMPLETED if its data had moved) once what was running returned, and stays known until its
 * terminal status is reported. Unknown or already reported: HIXL_PARAM_INVALID (null:
 * HIXL_FAILED).
 * hixl_wait_transfer: waits up to timeout_in_millis (>= 0; 0 does not wait) for a request to
 * end, then reports as hixl_get_transfer_status does (a terminal status once). */
hixl_status hixl_transfer_async_within(hixl_engine *engine, const char *remote_engine,
                                       int32_t op, const hixl_transfer_op_desc *descs,
                                       size_t count, const hixl_transfer_args *args,
                                       int32_t timeout_in_millis, hixl_transfer_req *req);
hixl_status hixl_cancel_transfer(hixl_engine *engine, hixl_transfer_req req);
hixl_status hixl_wait_transfer(hixl_engine *engine, hixl_transfer_req req,
                               int32_t timeout_in_millis, int32_t *status);

/* Notifications. */
hixl_status hixl_send_notify(hixl_engine *engine, const char *remote_engine, const char *name,
                             const char *notify_msg, int32_t timeout_in_millis);
/* A list of (name, msg): hixl_list_len, hixl_list_notify, hixl_list_free. */
hixl_status hixl_get_notifies(hixl_engine *engine, hixl_list **out);

/* Lists. The strings point into the list and live until hixl_list_free. A list is memory the
 * library allocated for the caller, not a handle: unlike engine handles it is not checked, so
 * it must be one these calls returned and not yet freed (using or freeing it after
 * hixl_list_free is undefined behaviour, as with free()); NULL is refused (HIXL_PARAM_INVALID,
 * or a length of 0) and hixl_list_free(NULL) does nothing. */
size_t hixl_list_len(const hixl_list *list);
hixl_status hixl_list_notify(const hixl_list *list, size_t index, const char **name,
                             const char **notify_msg);
hixl_status hixl_list_connect_status(const hixl_list *list, size_t index,
                                     const char **remote_engine, int32_t *status);
void hixl_list_free(hixl_list *list);

/* HIXL GetCapability: *value HIXL_FEATURE_SUPPORTED or HIXL_FEATURE_NOT_SUPPORTED (also for a
 * value no feature has); HIXL_PARAM_INVALID for a negative feature, *value untouched. */
hixl_status hixl_get_capability(int32_t feature, int32_t *value);

/* Fabric memory's allocator statics (HIXL MallocMem / FreeMem / ExportToShareableHandle), for
 * engines with EnableUseFabricMem=1: ACL virtual memory on the calling thread's device
 * (mem_type HIXL_MEM_DEVICE or HIXL_MEM_HOST), sizes rounded up to 2 MiB; the handle is the
 * 128-byte aclrtMemFabricHandle. UNSUPPORTED without an ACL runtime with the VMM calls;
 * PARAM_INVALID for an address hixl_malloc_mem did not return. */
hixl_status hixl_malloc_mem(int32_t mem_type, size_t size, void **ptr);
hixl_status hixl_free_mem(void *ptr);
hixl_status hixl_export_to_shareable_handle(void *addr, uint8_t handle[128]);

/* Block-indexed transfers: an extension beyond HIXL (none of its peers has it). Block i,
 * block_size bytes, moves between local_addr + local_idx[i] * local_stride (inside the region
 * registered with this engine that holds local_addr) and remote_addr + remote_idx[i] *
 * remote_stride (inside the region of the peer's table that holds remote_addr); a stride of 0
 * means block_size (blocks back to back, as in a paged KV cache). The index arrays hold count
 * indices of index_width bytes (HIXL_INDEX_U32 or HIXL_INDEX_U64), aligned to it. A call is
 * checked once, not per block: PARAM_INVALID for a zero block_size, a stride below it, count 0,
 * a base address in no region, or a largest index whose block leaves its region (offset
 * overflow included). Over TCP the wire carries the remote indices, never descriptors.
 * Repeated destination indices are not refused: such a block ends with one source's bytes (or
 * a mix). The async form copies the indices: the arrays may go once it returns. */
typedef struct hixl_block_desc {
  uintptr_t local_addr;
  uintptr_t remote_addr;
  uint64_t block_size;
  uint64_t local_stride;
  uint64_t remote_stride;
} hixl_block_desc;
#define HIXL_INDEX_U32 4
#define HIXL_INDEX_U64 8
hixl_status hixl_transfer_blocks_sync(hixl_engine *engine, const char *remote_engine, int32_t op,
                                      const hixl_block_desc *desc, const void *local_idx,
                                      const void *remote_idx, size_t count, int32_t index_width,
                                      int32_t timeout_in_millis);
hixl_status hixl_transfer_blocks_async(hixl_engine *engine, const char *remote_engine,
                                       int32_t op, const hixl_block_desc *desc,
                                       const void *local_idx, const void *remote_idx,
                                       size_t count, int32_t index_width,
                                       const hixl_transfer_args *args, hixl_transfer_req *req);

/* The cause of the last failed call on this thread ("" if none). */
const char *hixl_last_error_message(void);

#ifdef __cplusplus
}
#endif

#endif /* HIXL_C_H_ */
