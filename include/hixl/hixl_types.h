/*
 * hixl/hixl_types.h: HIXL's types and constants (hixl_types.h of Huawei CANN's HIXL), for the
 * header-only C++ API in hixl/hixl.h over hixl's C ABI (hixl_c.h, libhixl.so). Names, values
 * and struct layouts are HIXL's (MemDesc: addr, len, reserved[128], 144 bytes on LP64).
 *
 * ge::AscendString and ge::Status: HIXL's header takes them from CANN's GE headers
 * (external/ge_common/api_error_codes.h, which includes graph/ascend_string.h). When those are
 * on the include path they are used here too, so a program that also includes CANN headers
 * sees one ge::AscendString; its methods are defined out of line in GE's metadef, so such a
 * program also links CANN's libmetadef.so, built with CANN's -D_GLIBCXX_USE_CXX11_ABI=0.
 * Without CANN's headers this header defines a header-only ge::AscendString with GE's public
 * API (and defines GE's include guard, so a later graph/ascend_string.h is skipped), plus
 * ge::char_t, ge::Status, ge::SUCCESS and ge::FAILED, and includes the standard headers GE's
 * headers bring in (HIXL programs use std::cerr, std::map, ... through them).
 */
#ifndef HIXL_RS_HIXL_TYPES_H_
#define HIXL_RS_HIXL_TYPES_H_

#include <cstddef>
#include <cstdint>

#if defined(__has_include)
#if __has_include("external/ge_common/api_error_codes.h")
#include "external/ge_common/api_error_codes.h"  // CANN >= 9.x
#define HIXL_RS_CANN_GE 1
#elif __has_include("external/ge_common/ge_api_error_codes.h")
#include "external/ge_common/ge_api_error_codes.h"  // earlier CANN
#define HIXL_RS_CANN_GE 1
#elif __has_include("graph/ascend_string.h")
#include "graph/ascend_string.h"  // GE's AscendString without its status codes
#endif
#endif

/* The standard headers GE's headers include: what HIXL programs get through them. */
#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef ASCEND_FUNC_VISIBILITY
#ifdef FUNC_VISIBILITY
#define ASCEND_FUNC_VISIBILITY __attribute__((visibility("default")))
#else
#define ASCEND_FUNC_VISIBILITY
#endif
#endif

#ifndef INC_EXTERNAL_GRAPH_ASCEND_STRING_H_
#define INC_EXTERNAL_GRAPH_ASCEND_STRING_H_  // GE's guard: this is ge::AscendString
/* Hidden: a shared library built with this header keeps its copies of these inline methods to
 * itself, so they never stand in for the out-of-line ones a program compiled against GE's own
 * header calls (those of libcann_hixl.so, libllm_datadist.so or CANN's libmetadef.so, with
 * CANN's C++ ABI), nor the other way round: each string is read by code of the form that made
 * it, whatever -D_GLIBCXX_USE_CXX11_ABI each was built with. */
#define HIXL_RS_AS_INLINE __attribute__((visibility("hidden")))
namespace ge {
using char_t = char;

/* GE's string type, header-only: an immutable, shared string. A default-constructed one, or one
 * built from a null pointer, is "null": GetString() gives "", it equals only another null one
 * (and a null char pointer), orders before every other string and contains nothing (Find gives
 * npos), as GE's does. */
class AscendString {
 public:
  AscendString() = default;
  ~AscendString() = default;
  HIXL_RS_AS_INLINE AscendString(const char_t *const name)  // NOLINT: implicit, as GE's
      : name_(name == nullptr ? nullptr : std::make_shared<const std::string>(name)) {}
  HIXL_RS_AS_INLINE AscendString(const char_t *const name, size_t length)
      : name_(name == nullptr ? nullptr : std::make_shared<const std::string>(name, length)) {}

  HIXL_RS_AS_INLINE const char_t *GetString() const { return name_ == nullptr ? "" : name_->c_str(); }
  HIXL_RS_AS_INLINE size_t GetLength() const { return name_ == nullptr ? 0 : name_->size(); }
  /* The position of the first occurrence of `s`, or std::string::npos. */
  HIXL_RS_AS_INLINE size_t Find(const AscendString &s) const {
    if (name_ == nullptr || s.name_ == nullptr) return std::string::npos;
    return name_->find(*s.name_);
  }
  /* std::hash of the string ("" for a null one). */
  HIXL_RS_AS_INLINE size_t Hash() const {
    return std::hash<std::string>()(name_ == nullptr ? std::string() : *name_);
  }

  HIXL_RS_AS_INLINE bool operator<(const AscendString &d) const { return Cmp(d) < 0; }
  HIXL_RS_AS_INLINE bool operator>(const AscendString &d) const { return Cmp(d) > 0; }
  HIXL_RS_AS_INLINE bool operator<=(const AscendString &d) const { return Cmp(d) <= 0; }
  HIXL_RS_AS_INLINE bool operator>=(const AscendString &d) const { return Cmp(d) >= 0; }
  HIXL_RS_AS_INLINE bool operator==(const AscendString &d) const { return Cmp(d) == 0; }
  HIXL_RS_AS_INLINE bool operator!=(const AscendString &d) const { return Cmp(d) != 0; }
  HIXL_RS_AS_INLINE bool operator==(const char_t *const d) const {
    if (name_ == nullptr || d == nullptr) return name_ == nullptr && d == nullptr;
    return name_->compare(d) == 0;
  }
  HIXL_RS_AS_INLINE bool operator!=(const char_t *const d) const { return !(*this == d); }

 private:
  /* <0, 0, >0; a null string orders before every other, and equals another null one. */
  HIXL_RS_AS_INLINE int Cmp(const AscendString &d) const {
    if (name_ == nullptr || d.name_ == nullptr) return (name_ != nullptr) - (d.name_ != nullptr);
    return name_->compare(*d.name_);
  }

  std::shared_ptr<const std::string> name_;
};
}  // namespace ge

namespace std {
template <>
struct hash<ge::AscendString> {
  size_t operator()(const ge::AscendString &name) const { return name.Hash(); }
};
}  // namespace std
#endif  // INC_EXTERNAL_GRAPH_ASCEND_STRING_H_

#if !defined(HIXL_RS_CANN_GE) && !defined(INC_EXTERNAL_GE_COMMON_API_ERROR_CODES_H_) && \
    !defined(INC_EXTERNAL_GE_COMMON_GE_API_ERROR_CODES_H_) && !defined(HIXL_RS_GE_STATUS)
#define HIXL_RS_GE_STATUS 1 /* also llm_datadist/ge_compat.h's: defined once */
namespace ge {
/* GE's status type and its two general codes (external/ge_common/api_error_codes.h). */
using Status = uint32_t;
constexpr Status SUCCESS = 0U;
constexpr Status FAILED = 0xFFFFFFFFU;
}  // namespace ge
#endif

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
