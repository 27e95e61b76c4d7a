/*
 * hcomm/hcomm_res_defs.h: the hcomm resource types HIXL-CS (cs/hixl_cs.h) takes: memory
 * descriptors (CommMem), endpoint descriptors (EndpointDesc) and, for source compatibility,
 * hcomm's channel and batch-transfer descriptors. Written for hixl with the layout, names and
 * values of CANN hcomm's header of the same name (as HIXL's repository carries a copy of it),
 * so a program built against CANN's compiles against this one unchanged; hixl itself does not
 * use hcomm (its HIXL-CS runs on hixl's own engine, see docs/ascend.md).
 *
 * C (C11: anonymous unions) and C++. Sizes on LP64: CommAddr 40, EndpointLoc 64,
 * EndpointDesc 160, CommMem 24, HcommBatchTransferDesc 64 bytes.
 */
#ifndef HCOMM_RES_DEFS_H
#define HCOMM_RES_DEFS_H

#include <arpa/inet.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* CANN's header includes securec.h (Huawei's bounds-checked C library, which a CANN install
 * puts on the include path) and clears descriptors with its memset_s; without it, memset. */
#if defined(__has_include)
#if __has_include("securec.h")
#include "securec.h"
#define HCOMM_RES_DEFS_HAVE_SECUREC 1
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

static const uint32_t COMM_ADDR_EID_LEN = 16U;
static const uint32_t HCOMM_CHANNEL_MAGIC_WORD = 0x0fcf0f0fU;
static const uint32_t HCOMM_CHANNEL_VERSION_ONE = 1U;
/* the channel descriptor's ABI version (3: qos and channelName appended) */
static const uint32_t HCOMM_CHANNEL_VERSION = 3U;
/* the longest channelName, in bytes */
static const uint32_t HCOMM_CHANNEL_NAME_MAX_LEN = 191U;

typedef int32_t HcommResult;
typedef void *EndpointHandle;
typedef void *HcommMemHandle;
typedef void *HcommSocket;

#ifndef CHANNEL_HANDLE_DEFINED
#define CHANNEL_HANDLE_DEFINED
typedef uint64_t ChannelHandle;
#endif

#ifndef THREAD_HANDLE_DEFINED
#define THREAD_HANDLE_DEFINED
typedef uint64_t ThreadHandle;
#endif

/* who drives a channel */
typedef enum {
  COMM_ENGINE_RESERVED = -1,
  COMM_ENGINE_CPU = 0,
  COMM_ENGINE_CPU_TS = 1,
  COMM_ENGINE_AICPU = 2,
  COMM_ENGINE_AICPU_TS = 3,
  COMM_ENGINE_AIV = 4,
  COMM_ENGINE_CCU = 5,
} CommEngine;

/* the link an endpoint speaks */
typedef enum {
  COMM_PROTOCOL_RESERVED = -1,
  COMM_PROTOCOL_HCCS = 0,
  COMM_PROTOCOL_ROCE = 1,
  COMM_PROTOCOL_PCIE = 2,
  COMM_PROTOCOL_SIO = 3,
  COMM_PROTOCOL_UBC_CTP = 4,
  COMM_PROTOCOL_UBC_TP = 5,
  COMM_PROTOCOL_UB_MEM = 6,
  COMM_PROTOCOL_UBOE = 7,
  COMM_PROTOCOL_HCCS_ONLY = 8,
  COMM_PROTOCOL_UBG = 9,
} CommProtocol;

/* which member of CommAddr's union holds the address */
typedef enum {
  COMM_ADDR_TYPE_RESERVED = -1,
  COMM_ADDR_TYPE_IP_V4 = 0,
  COMM_ADDR_TYPE_IP_V6 = 1,
  COMM_ADDR_TYPE_ID = 2,
  COMM_ADDR_TYPE_EID = 3,
} CommAddrType;

/* an endpoint's address: 4 + 36 bytes */
typedef struct {
  CommAddrType type;
  union {
    uint8_t raws[36];
    struct in_addr addr;
    struct in6_addr addr6;
    uint32_t id;
    uint8_t eid[16]; /* COMM_ADDR_EID_LEN */
  };
} CommAddr;

typedef enum {
  ENDPOINT_LOC_TYPE_RESERVED = -1,
  ENDPOINT_LOC_TYPE_DEVICE = 0,
  ENDPOINT_LOC_TYPE_HOST = 1,
} EndpointLocType;

/* where an endpoint is: 4 + 60 bytes */
typedef struct {
  EndpointLocType locType;
  union {
    uint8_t raws[60];
    struct {
      uint32_t devPhyId;
      uint32_t superDevId;
      uint32_t serverIdx;
      uint32_t superPodIdx;
    } device;
    struct {
      uint32_t id;
    } host;
  };
} EndpointLoc;

/* an endpoint: protocol, address, location, 52 spare bytes (160 bytes) */
typedef struct {
  CommProtocol protocol;
  CommAddr commAddr;
  EndpointLoc loc;
  union {
    uint8_t raws[52];
  };
} EndpointDesc;

typedef enum {
  COMM_MEM_TYPE_INVALID = -1,
  COMM_MEM_TYPE_DEVICE = 0,
  COMM_MEM_TYPE_HOST = 1,
} CommMemType;

/* a memory range and where it lives (24 bytes) */
typedef struct {
  CommMemType type;
  void *addr;
  uint64_t size;
} CommMem;

typedef struct {
  uint32_t version;
  uint32_t magicWord;
  uint32_t size;
  uint32_t reserved;
} CommAbiHeader;

typedef enum {
  HCOMM_SOCKET_ROLE_RESERVED = -1,
  HCOMM_SOCKET_ROLE_CLIENT = 0,
  HCOMM_SOCKET_ROLE_SERVER = 1,
} HcommSocketRole;

/* hcomm's channel descriptor (ABI version 3); appended fields bump the version */
typedef struct {
  CommAbiHeader header;
  EndpointDesc remoteEndpoint;
  uint32_t notifyNum;
  bool exchangeAllMems;
  HcommMemHandle *memHandles;
  uint32_t memHandleNum;
  HcommSocket socket;
  HcommSocketRole role;
  uint16_t port;
  union {
    uint8_t raws[128];
    struct {
      uint32_t queueNum;
      uint32_t retryCnt;
      uint32_t retryInterval;
      uint8_t tc;
      uint8_t sl;
    } roceAttr;
    struct {
      uint32_t qos;
    } hccsAttr;
  };
  uint32_t qos;
  const char *channelName;
} HcommChannelDesc;

typedef enum {
  HCOMM_TRANSFER_TYPE_INVALID = -1,
  HCOMM_TRANSFER_TYPE_WRITE = 0,
  HCOMM_TRANSFER_TYPE_WRITE_REDUCE = 1,
  HCOMM_TRANSFER_TYPE_WRITE_WITH_NOTIFY = 2,
  HCOMM_TRANSFER_TYPE_WRITE_REDUCE_WITH_NOTIFY = 3,
  HCOMM_TRANSFER_TYPE_READ = 4,
  HCOMM_TRANSFER_TYPE_READ_REDUCE = 5,
  HCOMM_TRANSFER_TYPE_NOTIFY_RECORD = 6,
  HCOMM_TRANSFER_TYPE_NOTIFY_WAIT = 7
} HcommTransferType;

typedef enum {
  HCOMM_REDUCE_SUM = 0,
  HCOMM_REDUCE_PROD = 1,
  HCOMM_REDUCE_MAX = 2,
  HCOMM_REDUCE_MIN = 3,
  HCOMM_REDUCE_RESERVED = 255
} HcommReduceOp;

typedef enum {
  HCOMM_DATA_TYPE_INT8 = 0,
  HCOMM_DATA_TYPE_INT16 = 1,
  HCOMM_DATA_TYPE_INT32 = 2,
  HCOMM_DATA_TYPE_FP16 = 3,
  HCOMM_DATA_TYPE_FP32 = 4,
  HCOMM_DATA_TYPE_INT64 = 5,
  HCOMM_DATA_TYPE_UINT64 = 6,
  HCOMM_DATA_TYPE_UINT8 = 7,
  HCOMM_DATA_TYPE_UINT16 = 8,
  HCOMM_DATA_TYPE_UINT32 = 9,
  HCOMM_DATA_TYPE_FP64 = 10,
  HCOMM_DATA_TYPE_BFP16 = 11,
  HCOMM_DATA_TYPE_INT128 = 12,
  HCOMM_DATA_TYPE_HIF8 = 14,
  HCOMM_DATA_TYPE_FP8E4M3 = 15,
  HCOMM_DATA_TYPE_FP8E5M2 = 16,
  HCOMM_DATA_TYPE_FP8E8M0 = 17,
  HCOMM_DATA_TYPE_RESERVED = 255
} HcommDataType;

/* one operation of an hcomm batch: its type, 4 spare bytes, a 56-byte union (64 bytes) */
typedef struct {
  HcommTransferType transType;
  uint8_t reserved[4];
  union {
    uint8_t raws[56];
    struct {
      uint64_t len;
      void *dst;
      void *src;
    } write;
    struct {
      uint64_t len;
      void *dst;
      void *src;
    } read;
    struct {
      uint64_t count;
      void *dst;
      void *src;
      HcommReduceOp reduceOp;
      HcommDataType dataType;
    } reduce;
    struct {
      uint32_t notifyIdx;
    } notifyRecord;
    struct {
      uint32_t notifyIdx;
      uint32_t timeOut;
    } notifyWait;
    struct {
      uint64_t len;
      void *dst;
      void *src;
      uint32_t notifyIdx;
    } writeWithNotify;
    struct {
      uint64_t count;
      void *dst;
      void *src;
      HcommReduceOp reduceOp;
      HcommDataType dataType;
      uint32_t notifyIdx;
    } writeReduceWithNotify;
  } transferInfo;
} HcommBatchTransferDesc;

/* Fills `n` bytes of `p` with `byte` (securec's memset_s where it is available). */
static inline void HcommResDefsFill(void *p, size_t n, int byte) {
#ifdef HCOMM_RES_DEFS_HAVE_SECUREC
  (void)memset_s(p, n, byte, n);
#else
  (void)memset(p, byte, n);
#endif
}

/*
 * Sets `num` endpoint descriptors to "nothing chosen": every byte 0xFF, then protocol, address
 * type and location type RESERVED. Returns 0, or 2 (hcomm's E_PTR) for a null pointer.
 */
static inline HcommResult EndpointDescInit(EndpointDesc *endpoint, uint32_t num) {
  if (endpoint == NULL) {
    return (HcommResult)2;
  }
  for (uint32_t i = 0; i < num; ++i) {
    EndpointDesc *ep = endpoint + i;
    HcommResDefsFill(ep, sizeof(*ep), 0xFF);
    ep->protocol = COMM_PROTOCOL_RESERVED;
    ep->commAddr.type = COMM_ADDR_TYPE_RESERVED;
    ep->loc.locType = ENDPOINT_LOC_TYPE_RESERVED;
  }
  return 0;
}

/*
 * Sets `descNum` channel descriptors to their defaults: every byte 0xFF, then the ABI header
 * (version 3, magic, size), zero counts, null pointers, role RESERVED, port 0 and a reserved
 * remote endpoint. Returns 0, 2 (E_PTR) for a null pointer, 4 (E_INTERNAL) if the endpoint
 * could not be set.
 */
static inline HcommResult HcommChannelDescInit(HcommChannelDesc *channelDesc, uint32_t descNum) {
  if (channelDesc == NULL) {
    return (HcommResult)2;
  }
  for (uint32_t i = 0; i < descNum; ++i) {
    HcommChannelDesc *d = channelDesc + i;
    HcommResDefsFill(d, sizeof(*d), 0xFF);
    d->header.version = HCOMM_CHANNEL_VERSION;
    d->header.magicWord = HCOMM_CHANNEL_MAGIC_WORD;
    d->header.size = (uint32_t)sizeof(HcommChannelDesc);
    d->header.reserved = 0;
    d->notifyNum = 0;
    d->exchangeAllMems = false;
    d->memHandles = NULL;
    d->memHandleNum = 0;
    d->socket = NULL;
    d->role = HCOMM_SOCKET_ROLE_RESERVED;
    d->port = 0;
    d->channelName = NULL;
    if (EndpointDescInit(&d->remoteEndpoint, 1) != 0) {
      return (HcommResult)4;
    }
  }
  return 0;
}

#ifdef __cplusplus
}
#endif

#endif /* HCOMM_RES_DEFS_H */
