/*
 * adxl/adxl_types.h: ADXL's types and constants (adxl_types.h of Huawei CANN's HIXL package), for
 * adxl::AdxlEngine (adxl/adxl_engine.h), which libllm_datadist.so implements over hixl's engine.
 * Names, values and struct layouts are ADXL's (MemDesc: addr, len, reserved[128]; TransferArgs:
 * reserved[128], whose first 8 bytes are the request's user data, as ADXL copies them).
 *
 * ge::AscendString and aclrtMemFabricHandle come from CANN's headers when they are on the include
 * path (external/ge_common/api_error_codes.h or graph/ascend_string.h, and acl/acl_rt.h), as in
 * ADXL's own header. Without them this header declares ge::AscendString exactly as GE's
 * graph/ascend_string.h does (its methods out of line: libllm_datadist.so defines them, or CANN's
 * libmetadef.so when a program loads it first) and ACL's aclrtMemFabricHandle (128 bytes).
 */
#ifndef CANN_HIXL_INCLUDE_ADXL_ADXL_TYPES_H_
#define CANN_HIXL_INCLUDE_ADXL_ADXL_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#if defined(__has_include)
#if __has_include("acl/acl_rt.h")
#include "acl/acl_rt.h"
#define HIXL_RS_CANN_ACL 1
#endif
#if __has_include("external/ge_common/api_error_codes.h")
#include "external/ge_common/api_error_codes.h"
#elif __has_include("graph/ascend_string.h")
#include "graph/ascend_string.h"
#endif
#endif

#include "../hixl/ge_ascend_string.h"  // ge::AscendString, unless GE's header came first

#ifndef HIXL_RS_CANN_ACL
#ifndef HIXL_RS_ACL_MEM_FABRIC_HANDLE
#define HIXL_RS_ACL_MEM_FABRIC_HANDLE
/* ACL's fabric memory handle (acl/acl_rt.h), what AdxlEngine::ExportToShareableHandle fills. */
typedef struct aclrtMemFabricHandle {
  uint8_t data[128];
} aclrtMemFabricHandle;
#endif
#endif

#ifdef FUNC_VISIBILITY
#define ASCEND_FUNC_VISIBILITY __attribute__((visibility("default")))
#else
#define ASCEND_FUNC_VISIBILITY
#endif

namespace adxl {
using Status = uint32_t;
using AscendString = ge::AscendString;
using TransferReq = void *;

// options
constexpr const char OPTION_RDMA_TRAFFIC_CLASS[] = "adxl.RdmaTrafficClass";
constexpr const char OPTION_RDMA_SERVICE_LEVEL[] = "adxl.RdmaServiceLevel";
constexpr const char OPTION_BUFFER_POOL[] = "adxl.BufferPool";
constexpr const char OPTION_LOCAL_COMM_RES[] = "adxl.LocalCommRes";
constexpr const char OPTION_AUTO_CONNECT[] = "AutoConnect";

// status codes
constexpr Status SUCCESS = 0U;
constexpr Status PARAM_INVALID = 103900U;
constexpr Status TIMEOUT = 103901U;
constexpr Status NOT_CONNECTED = 103902U;
constexpr Status ALREADY_CONNECTED = 103903U;
constexpr Status NOTIFY_FAILED = 103904U;
constexpr Status UNSUPPORTED = 103905U;
constexpr Status FAILED = 503900U;
constexpr Status RESOURCE_EXHAUSTED = 203900U;

// the values are fixed; new capabilities go at the end
enum FeatureType : int32_t {
  AUTO_CONNECT = 0,
  CLIENT_SERVER_COMM = 1,
};

constexpr int32_t FEATURE_SUPPORTED = 1;
constexpr int32_t FEATURE_NOT_SUPPORTED = 0;

using MemHandle = void *;
using ShareableHandle = aclrtMemFabricHandle;

enum MemType { MEM_DEVICE, MEM_HOST };

enum TransferOp { READ, WRITE };

struct MemDesc {
  uintptr_t addr;
  size_t len;
  uint8_t reserved[128] = {};
};

struct TransferOpDesc {
  uintptr_t local_addr;
  uintptr_t remote_addr;
  size_t len;
};

enum class TransferStatus { WAITING, COMPLETED, TIMEOUT, FAILED };

struct TransferArgs {
  uint8_t reserved[128] = {};
};

struct NotifyDesc {
  AscendString name;
  AscendString notify_msg;
};
}  // namespace adxl

#endif  // CANN_HIXL_INCLUDE_ADXL_ADXL_TYPES_H_
