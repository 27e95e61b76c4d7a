// The part of CANN's ACL runtime API (acl/acl_rt.h, acl/acl_base.h) that hixl_device.cpp calls,
// declared here because CI has no CANN headers: the same names, types and signatures as CANN's
// declarations (ABI only), resolved at link time by -lacl_rt (CANN's, or the test double that
// tools/ascend-double.sh builds under that name).
#ifndef HIXL_TESTS_ACL_DECLS_H_
#define HIXL_TESTS_ACL_DECLS_H_

#include <cstddef>
#include <cstdint>

extern "C" {
typedef int aclError;
static const int ACL_SUCCESS = 0;
static const int ACL_ERROR_NONE = 0;

// the first enumerators of CANN's enums, with CANN's values
typedef enum aclrtMemMallocPolicy {
  ACL_MEM_MALLOC_HUGE_FIRST,
  ACL_MEM_MALLOC_HUGE_ONLY,
  ACL_MEM_MALLOC_NORMAL_ONLY,
} aclrtMemMallocPolicy;

typedef enum aclrtMemcpyKind {
  ACL_MEMCPY_HOST_TO_HOST,
  ACL_MEMCPY_HOST_TO_DEVICE,
  ACL_MEMCPY_DEVICE_TO_HOST,
  ACL_MEMCPY_DEVICE_TO_DEVICE,
  ACL_MEMCPY_DEFAULT,
} aclrtMemcpyKind;

aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtResetDevice(int32_t deviceId);
aclError aclrtGetDevice(int32_t *deviceId);
aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtFree(void *devPtr);
aclError aclrtMallocHost(void **hostPtr, size_t size);
aclError aclrtFreeHost(void *hostPtr);
aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
                     aclrtMemcpyKind kind);
const char *aclGetRecentErrMsg();
}

#endif  // HIXL_TESTS_ACL_DECLS_H_
