/*
 * hixl/hixl_types.h: HIXL's types and constants (hixl_types.h of Huawei CANN's HIXL), for the
 * header-only C++ API in hixl/hixl.h over hixl's C ABI (hixl_c.h, libhixl.so). Names, values
 * and struct layouts follow HIXL's public header (MemDesc: addr, len, reserved[128], 144 bytes
 * on LP64).
 */
#ifndef HIXL_RS_HIXL_TYPES_H_
#define HIXL_RS_HIXL_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace ge {
/* A minimal AscendString (HIXL uses GE's): built from a C string, read with GetString(),
 * ordered and compared by content so it can key a std::map. */
class AscendString {
 public:
  AscendString() = default;
  AscendString(const char *name) : s_(name == nullptr ? "" : name) {}  // NOLINT: implicit, as GE's
  AscendString(const char *name, size_t length) : s_(name == nullptr ? "" : std::string(name, length)) {}
  const char *GetString() const { return s_.c_str(); }
  size_t GetLength() const { return s_.size(); }
  bool operator<(const AscendString &o) const { return s_ < o.s_; }
  bool operator>(const AscendString &o) const { return s_ > o.s_; }
  bool operator<=(const AscendString &o) const { return s_ <= o.s_; }
  bool operator>=(const AscendString &o) const { return s_ >= o.s_; }
  bool operator==(const AscendString &o) const { return s_ == o.s_; }
  bool operator!=(const AscendString &o) const { return s_ != o.s_; }

 private:
  std::string s_;
};
}  // namespace ge

namespace hixl {
using Status = uint32_t;
using AscendString = ge::AscendString;
using TransferReq = void *;

// options
constexpr const char OPTION_ENABLE_USE_FABRIC_MEM[] = "EnableUseFabricMem";
constexpr const char OPTION_RDMA_TRAFFIC_CLASS[] = "RdmaTrafficClass";
constexpr const char OPTION_RDMA_SERVICE_LEVEL[] = "RdmaServiceLevel";
constexpr const char OPTION_BUFFER_POOL[] = "BufferPool";
constexpr const char OPTION_GLOBAL_RESOURCE_CONFIG[] = "GlobalResourceConfig";
constexpr const char OPTION_AUTO_CONNECT[] = "AutoConnect";
constexpr const char OPTION_LOCAL_COMM_RES[] = "LocalCommRes";

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

enum FeatureType : int32_t {
  AUTO_CONNECT = 0,
  CLIENT_SERVER_COMM = 1,
};

constexpr int32_t FEATURE_SUPPORTED = 1;
constexpr int32_t FEATURE_NOT_SUPPORTED = 0;

using MemHandle = void *;

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
  const void *user_data = nullptr;
  uint8_t reserved[120] = {};
};

struct GetTransferStatusArgs {
  uint32_t max_query_count = UINT32_MAX;
  bool skip_waiting = false;
  uint8_t reserved[123] = {};
};

struct TransferResult {
  TransferReq req = nullptr;
  const void *user_data = nullptr;
  TransferStatus status = TransferStatus::WAITING;
  uint8_t reserved[108] = {};
};

struct NotifyDesc {
  AscendString name;
  AscendString notify_msg;
};

enum class AsyncConnectStatus {
  NOT_CONNECT,
  CONNECT_PENDING,
  CONNECTING,
  CONNECTED,
  CONNECT_FAILED,
  DISCONNECT_PENDING,
  DISCONNECTING
};
}  // namespace hixl

#endif  // HIXL_RS_HIXL_TYPES_H_
