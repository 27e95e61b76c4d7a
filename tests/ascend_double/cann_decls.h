/*
 * The ACL and HCCL declarations the double's C test programs (cann_program.c, remote_ranges.c)
 * call, as CANN's acl_rt.h and HCCL's hccl.h declare them (ABI only: CANN's headers are not
 * available to CI).
 */
#ifndef HIXL_TEST_CANN_DECLS_H
#define HIXL_TEST_CANN_DECLS_H

#include <stddef.h>
#include <stdint.h>

typedef int aclError;
aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtResetDevice(int32_t deviceId);
aclError aclrtGetDevice(int32_t *deviceId);
aclError aclrtGetDeviceCount(uint32_t *count);
aclError aclrtGetPhyDevIdByLogicDevId(const int32_t logicDevId, int32_t *const phyDevId);
aclError aclrtCreateContext(void **context, int32_t deviceId);
aclError aclrtDestroyContext(void *context);
aclError aclrtGetCurrentContext(void **context);
aclError aclrtSetCurrentContext(void *context);
aclError aclrtMalloc(void **devPtr, size_t size, int policy);
aclError aclrtFree(void *devPtr);
aclError aclrtMallocHost(void **hostPtr, size_t size);
aclError aclrtFreeHost(void *hostPtr);
aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, int kind);
aclError aclrtCreateStream(void **stream);
aclError aclrtDestroyStream(void *stream);
aclError aclrtSynchronizeStreamWithTimeout(void *stream, int32_t timeout);
const char *aclGetRecentErrMsg(void);

enum { ACL_MEM_MALLOC_HUGE_ONLY = 1 };
enum { H2H = 0, H2D = 1, D2H = 2, D2D = 3, DEFAULT = 4 };
enum { HCCL_E_PARA = 1, ACL_ERROR_RT_DRV_INTERNAL_ERROR = 507899 };

typedef struct {
    int type;
    void *addr;
    uint64_t size;
} HcclMem;
typedef struct {
    void *localAddr;
    void *remoteAddr;
    uint64_t count;
    int dataType;
} HcclOneSideOpDesc;
typedef struct {
    int topoType;
    uint64_t rsvd0, rsvd1, rsvd2;
} HcclPrepareConfig;
typedef struct {
    size_t configSize;
    uint32_t magicWord;
    uint32_t version;
    uint64_t reserved;
    uint32_t hcclBufferSize;
    uint32_t hcclDeterministic;
    char hcclCommName[128];
    char hcclUdi[128];
    uint32_t hcclOpExpansionMode;
    uint32_t hcclRdmaTrafficClass;
    uint32_t hcclRdmaServiceLevel;
} HcclCommConfig;
int HcclRegisterGlobalMem(const HcclMem *mem, void **memHandle);
int HcclDeregisterGlobalMem(void *memHandle);
int HcclCommInitClusterInfoMemConfig(const char *rankTable, uint32_t rank, HcclCommConfig *config, void **comm);
int HcclCommBindMem(void *comm, void *memHandle);
int HcclCommUnbindMem(void *comm, void *memHandle);
int HcclCommPrepare(void *comm, const HcclPrepareConfig *config, const int timeout);
int HcclBatchGet(void *comm, uint32_t remoteRank, HcclOneSideOpDesc *desc, uint32_t descNum, void *stream);
int HcclBatchPut(void *comm, uint32_t remoteRank, HcclOneSideOpDesc *desc, uint32_t descNum, void *stream);
int HcclCommDestroy(void *comm);


/* ACL's virtual-memory management and async copies (FabricMem), as acl_rt.h declares them. */
typedef void *aclrtDrvMemHandle;
typedef struct {
    uint32_t id;
    int type;
} aclrtMemLocation;
typedef struct {
    int handleType;
    int allocationType;
    int memAttr;
    aclrtMemLocation location;
    uint64_t reserve;
} aclrtPhysicalMemProp;
typedef struct {
    aclrtMemLocation location;
    uint32_t pageSize;
    uint32_t rsv[4];
} aclrtPtrAttributes;
typedef struct {
    int flags;
    aclrtMemLocation location;
    uint8_t rsv[12];
} aclrtMemAccessDesc;
typedef struct {
    uint8_t data[128];
} aclrtMemFabricHandle;
enum { ACL_MEM_SHARE_HANDLE_TYPE_FABRIC = 2, ACL_HBM_MEM_HUGE = 4, ACL_MEM_LOCATION_TYPE_DEVICE = 1 };
aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags);
aclError aclrtReserveMemAddressNoUCMemory(void **virPtr, size_t size, size_t alignment, void *expectPtr,
                                          uint64_t flags);
aclError aclrtReleaseMemAddress(void *virPtr);
aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop,
                             uint64_t flags);
aclError aclrtFreePhysical(aclrtDrvMemHandle handle);
aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags);
aclError aclrtUnmapMem(void *virPtr);
aclError aclrtMemExportToShareableHandleV2(aclrtDrvMemHandle handle, uint64_t flags, int shareType,
                                           void *shareableHandle);
aclError aclrtMemImportFromShareableHandleV2(void *shareableHandle, int shareType, uint64_t flags,
                                             aclrtDrvMemHandle *handle);
aclError aclrtMemRetainAllocationHandle(void *virPtr, aclrtDrvMemHandle *handle);
aclError aclrtMemGetAddressRange(void *ptr, void **pbase, size_t *psize);
aclError aclrtMemSetAccess(void *virPtr, size_t size, aclrtMemAccessDesc *desc, size_t count);
aclError aclrtPointerGetAttributes(const void *ptr, aclrtPtrAttributes *attributes);
aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, int kind, void *stream);
aclError aclrtCreateStreamWithConfig(void **stream, uint32_t priority, uint32_t flag);
aclError aclrtStreamQuery(void *stream, int *status);
aclError aclrtStreamStop(void *stream);
aclError aclrtGetLogicDevIdByUserDevId(const int32_t userDevid, int32_t *const logicDevId);

#endif
