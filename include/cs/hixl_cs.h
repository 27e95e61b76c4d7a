/*
 * cs/hixl_cs.h: HIXL-CS, HIXL's client/server C API, in hixl (libcann_hixl.so / libhixl.so).
 *
 * Source-compatible with CANN HIXL's header of the same path: the same names, types, struct
 * layouts (128-byte descriptors on LP64), constants and functions, so a program written against
 * CANN's compiles against this one unchanged. Unlike CANN's (C++ only), it is also C (C11):
 * in C the structs have no default member initializers (zero them: `= {0}` or memset) and
 * their names are typedef'd.
 *
 * A server registers memory under tags and listens on server_ip:server_port; a client
 * connects, fetches the server's tagged memory list (HixlCSClientGetRemoteMem), registers its
 * own memory, and PUTs (local -> server) and GETs (server -> local) batches, synchronously or
 * asynchronously (a CompleteHandle, polled with HixlCSClientQueryCompleteStatus, which frees it
 * on COMPLETED or FAILED). Returns HIXL_SUCCESS or an HIXL status: HIXL_PARAM_INVALID (103900:
 * null arguments, unknown or destroyed handles, an address outside every registered range),
 * HIXL_TIMEOUT (103901), HIXL_FAILED (503900), 203900 (RESOURCE_EXHAUSTED: 4096 unqueried
 * handles), 103905 (UNSUPPORTED). docs/ascend.md ("HIXL-CS on hixl") says what maps to what.
 *
 * Not to be included with hixl_c.h in one file (both name HIXL_SUCCESS ...).
 */
#ifndef CANN_HIXL_INCLUDE_CS_HIXL_CS_H_
#define CANN_HIXL_INCLUDE_CS_HIXL_CS_H_

#ifdef __cplusplus
#include <cstdint>
#else
#include <stdint.h>
#endif
#include "hcomm/hcomm_res_defs.h"

/* C++ gets CANN's default member initializers; C zero-initializes by hand */
#ifdef __cplusplus
#define HIXL_CS_DEFAULT(v) = v
#else
#define HIXL_CS_DEFAULT(v)
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef void *HixlServerHandle;
typedef void *HixlClientHandle;
typedef void *CompleteHandle;
typedef uint32_t HixlStatus;
typedef void *MemHandle;

static const uint32_t HIXL_SUCCESS = 0U;
static const uint32_t HIXL_PARAM_INVALID = 103900U;
static const uint32_t HIXL_TIMEOUT = 103901U;
static const uint32_t HIXL_FAILED = 503900U;

/* global_resource_config: null, "", or a JSON object (keys "comm_resource_config.*") */
struct HixlServerConfig {
  const char *global_resource_config HIXL_CS_DEFAULT(nullptr);
  uint8_t reserved[120] HIXL_CS_DEFAULT({});
};

struct HixlClientConfig {
  const char *global_resource_config HIXL_CS_DEFAULT(nullptr);
  uint8_t reserved[120] HIXL_CS_DEFAULT({});
};

/* a client: its endpoint, the server endpoint it asks for, the server's control address (port
 * 1..65535), RDMA traffic class and service level; 128 bytes */
struct HixlClientDesc {
  const EndpointDesc *local_endpoint;
  const EndpointDesc *remote_endpoint;
  const char *server_ip;
  uint32_t server_port;
  uint8_t tc;
  uint8_t sl;
  uint8_t reserved[98] HIXL_CS_DEFAULT({});
};

/* a server: its endpoints and its control address (port 0: none to listen on); 128 bytes */
struct HixlServerDesc {
  const EndpointDesc *endpoint_list;
  const char *server_ip;
  uint32_t server_port;
  uint32_t endpoint_list_num;
  uint8_t reserved[104] HIXL_CS_DEFAULT({});
};

/* one transfer: the server's range first, then the client's */
struct HixlOneSideOpDesc {
  void *remote_buf;
  void *local_buf;
  uint64_t len;
};

enum HixlCompleteStatus {
  HIXL_COMPLETE_STATUS_WAITING,
  HIXL_COMPLETE_STATUS_COMPLETED,
  HIXL_COMPLETE_STATUS_TIMEOUT,
  HIXL_COMPLETE_STATUS_FAILED
};

#ifndef __cplusplus
typedef struct HixlServerConfig HixlServerConfig;
typedef struct HixlClientConfig HixlClientConfig;
typedef struct HixlClientDesc HixlClientDesc;
typedef struct HixlServerDesc HixlServerDesc;
typedef struct HixlOneSideOpDesc HixlOneSideOpDesc;
typedef enum HixlCompleteStatus HixlCompleteStatus;
#endif

/* Creates a server (not listening yet); *server_handle is null on failure. */
HixlStatus HixlCSServerCreate(const HixlServerDesc *server_desc, const HixlServerConfig *config,
                              HixlServerHandle *server_handle);

/* Registers `mem` under `mem_tag` (null: ""); clients see it in their remote memory list. */
HixlStatus HixlCSServerRegMem(HixlServerHandle server_handle, const char *mem_tag, const CommMem *mem,
                              MemHandle *mem_handle);

/* Starts serving clients on server_ip:server_port. */
HixlStatus HixlCSServerListen(HixlServerHandle server_handle, uint32_t backlog);

/* Unregisters memory of HixlCSServerRegMem. */
HixlStatus HixlCSServerUnregMem(HixlServerHandle server_handle, MemHandle mem_handle);

/* Stops the server and frees it; the handle is invalid afterwards. */
HixlStatus HixlCSServerDestroy(HixlServerHandle server_handle);

/* Creates a client of the server client_desc names; *client_handle is null on failure. */
HixlStatus HixlCSClientCreate(const HixlClientDesc *client_desc, const HixlClientConfig *config,
                              HixlClientHandle *client_handle);

/* Connects to the server (matching remote_endpoint among its endpoints) within timeout_ms, and
 * fetches its memory list. */
HixlStatus HixlCSClientConnect(HixlClientHandle client_handle, uint32_t timeout_ms);

/* The server's memory list and tags (fetched again), in arrays the client owns until the next
 * call or HixlCSClientDestroy; both null when the list is empty. */
HixlStatus HixlCSClientGetRemoteMem(HixlClientHandle client_handle, CommMem **remote_mem_list, char ***mem_tag_list,
                                    uint32_t *list_num, uint32_t timeout_ms);

/* Registers client memory: every local_buf of a batch lies inside one such range. */
HixlStatus HixlCSClientRegMem(HixlClientHandle client_handle, const char *mem_tag, const CommMem *mem,
                              MemHandle *mem_handle);

/* Unregisters memory of HixlCSClientRegMem. */
HixlStatus HixlCSClientUnregMem(HixlClientHandle client_handle, MemHandle mem_handle);

/* Starts writing list_num ranges local_buf -> remote_buf; *complete_handle to poll. */
HixlStatus HixlCSClientBatchPutAsync(HixlClientHandle client_handle, uint32_t list_num,
                                     const HixlOneSideOpDesc *desc_list, CompleteHandle *complete_handle);

/* Starts reading list_num ranges remote_buf -> local_buf; *complete_handle to poll. */
HixlStatus HixlCSClientBatchGetAsync(HixlClientHandle client_handle, uint32_t list_num,
                                     const HixlOneSideOpDesc *desc_list, CompleteHandle *complete_handle);

/* Writes list_num ranges local_buf -> remote_buf, waiting at most timeout_ms. */
HixlStatus HixlCSClientBatchPutSync(HixlClientHandle client_handle, uint32_t list_num,
                                    const HixlOneSideOpDesc *desc_list, uint32_t timeout_ms);

/* Reads list_num ranges remote_buf -> local_buf, waiting at most timeout_ms. */
HixlStatus HixlCSClientBatchGetSync(HixlClientHandle client_handle, uint32_t list_num,
                                    const HixlOneSideOpDesc *desc_list, uint32_t timeout_ms);

/* The state of an async batch; COMPLETED and FAILED free the handle (asking again:
 * HIXL_PARAM_INVALID). */
HixlStatus HixlCSClientQueryCompleteStatus(HixlClientHandle client_handle, CompleteHandle complete_handle,
                                           HixlCompleteStatus *complete_status);

/* Disconnects and frees the client; the handle and its complete handles are invalid afterwards. */
HixlStatus HixlCSClientDestroy(HixlClientHandle client_handle);

#ifdef __cplusplus
}
#endif

#undef HIXL_CS_DEFAULT

#endif /* CANN_HIXL_INCLUDE_CS_HIXL_CS_H_ */
