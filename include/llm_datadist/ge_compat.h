/*
 * llm_datadist/ge_compat.h: what CANN's LLM-DataDist headers take from GE (ge::AscendString,
 * ge::Status with SUCCESS and FAILED, GE_ERRORNO_DEFINE, ge::DataType and its DT_* values), for
 * llm_datadist/llm_datadist.h and llm_datadist/llm_error_codes.h. Not one of CANN's headers:
 * hixl's, included by those two.
 *
 * Where CANN's GE headers are on the include path (external/ge_common/api_error_codes.h, as
 * CANN's llm_datadist.h includes it, and graph/types.h) they are used, so a program sees one
 * ge::AscendString and one ge::DataType; ge::AscendString's methods are then CANN's libmetadef.so's
 * or libllm_datadist.so's, whichever the program loads first (both define them out of line).
 * Without them this header declares ge::AscendString exactly as GE's graph/ascend_string.h does
 * (methods out of line, defined in libllm_datadist.so; the same declaration as adxl/adxl_types.h,
 * under GE's include guard), GE's status type and its two general codes, GE_ERRORNO_DEFINE, and
 * ge::DataType with metadef's values (graph/types.h), and includes the standard headers GE's
 * headers bring in (CANN's samples use std::string, std::map, printf through them).
 */
#ifndef HIXL_RS_LLM_DATADIST_GE_COMPAT_H_
#define HIXL_RS_LLM_DATADIST_GE_COMPAT_H_

#include <cstddef>
#include <cstdint>

#if defined(__has_include)
#if __has_include("external/ge_common/api_error_codes.h")
#include "external/ge_common/api_error_codes.h"  // CANN >= 9.x
#define HIXL_RS_CANN_GE_ERRORS 1
#elif __has_include("external/ge_common/ge_api_error_codes.h")
#include "external/ge_common/ge_api_error_codes.h"  // earlier CANN
#define HIXL_RS_CANN_GE_ERRORS 1
#elif __has_include("graph/ascend_string.h")
#include "graph/ascend_string.h"
#endif
#if __has_include("graph/types.h")
#include "graph/types.h"  // ge::DataType
#define HIXL_RS_CANN_GE_TYPES 1
#endif
#endif

/* The standard headers GE's headers include: what LLM-DataDist programs get through them. */
#include <array>
#include <atomic>
#include <cstdio>
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

#include "../hixl/ge_ascend_string.h"  // ge::AscendString, unless GE's header came first

#if !defined(HIXL_RS_CANN_GE_ERRORS) && !defined(INC_EXTERNAL_GE_COMMON_API_ERROR_CODES_H_) && \
    !defined(INC_EXTERNAL_GE_COMMON_GE_API_ERROR_CODES_H_) && !defined(HIXL_RS_GE_STATUS)
#define HIXL_RS_GE_STATUS 1 /* also hixl/hixl_types.h's: defined once */
namespace ge {
/* GE's status type and its two general codes (external/ge_common/api_error_codes.h). */
using Status = uint32_t;
constexpr Status SUCCESS = 0U;
constexpr Status FAILED = 0xFFFFFFFFU;
}  // namespace ge
#endif

#ifndef GE_ERRORNO_DEFINE
/* GE's error number: runtime (2 bits), type (2), level (3), system id (8), module id (5), value
 * (12), from the high bit down. */
#define GE_ERRORNO_DEFINE(runtime, type, level, sysid, modid, name, value)                    \
  constexpr ge::Status name =                                                                 \
      ((static_cast<uint32_t>(runtime) & 0x3U) << 30U) | ((static_cast<uint32_t>(type) & 0x3U) \
                                                           << 28U) |                          \
      ((static_cast<uint32_t>(level) & 0x7U) << 25U) | ((static_cast<uint32_t>(sysid) & 0xFFU) \
                                                        << 17U) |                             \
      ((static_cast<uint32_t>(modid) & 0x1FU) << 12U) | (static_cast<uint32_t>(value) & 0xFFFU)
#endif

#if !defined(HIXL_RS_CANN_GE_TYPES) && !defined(HIXL_RS_GE_DATA_TYPE)
#define HIXL_RS_GE_DATA_TYPE 1
namespace ge {
/* GE's tensor element types, with metadef's values (graph/types.h). */
enum DataType {
  DT_FLOAT = 0,
  DT_FLOAT16 = 1,
  DT_INT8 = 2,
  DT_INT32 = 3,
  DT_UINT8 = 4,
  DT_INT16 = 6,
  DT_UINT16 = 7,
  DT_UINT32 = 8,
  DT_INT64 = 9,
  DT_UINT64 = 10,
  DT_DOUBLE = 11,
  DT_BOOL = 12,
  DT_STRING = 13,
  DT_DUAL_SUB_INT8 = 14,
  DT_DUAL_SUB_UINT8 = 15,
  DT_COMPLEX64 = 16,
  DT_COMPLEX128 = 17,
  DT_QINT8 = 18,
  DT_QINT16 = 19,
  DT_QINT32 = 20,
  DT_QUINT8 = 21,
  DT_QUINT16 = 22,
  DT_RESOURCE = 23,
  DT_STRING_REF = 24,
  DT_DUAL = 25,
  DT_VARIANT = 26,
  DT_BF16 = 27,
  DT_UNDEFINED = 28,
  DT_INT4 = 29,
  DT_UINT1 = 30,
  DT_INT2 = 31,
  DT_UINT2 = 32,
  DT_COMPLEX32 = 33,
  DT_HIFLOAT8 = 34,
  DT_FLOAT8_E5M2 = 35,
  DT_FLOAT8_E4M3FN = 36,
  DT_FLOAT8_E8M0 = 37,
  DT_FLOAT6_E3M2 = 38,
  DT_FLOAT6_E2M3 = 39,
  DT_FLOAT4_E2M1 = 40,
  DT_FLOAT4_E1M2 = 41,
  DT_HIFLOAT4 = 42,
  DT_MAX
};
}  // namespace ge
#endif

#endif  // HIXL_RS_LLM_DATADIST_GE_COMPAT_H_
