/* cuda_driver_internal.h — what cuda_driver.c offers the rest of the CUDA backend: the driver's
 * entry points, resolved once per process, the mapping of a CUresult to a GG_E* code with its
 * message, and the device count and properties. */
#ifndef GG_BACKEND_CUDA_DRIVER_INTERNAL_H
#define GG_BACKEND_CUDA_DRIVER_INTERNAL_H

#include <cuda.h>

#include "backend/backend.h"

/* The driver entry points the library uses, each resolved for the CUDA 12.0 ABI (so cuMemAlloc
 * gives the _v2 entry, and so on). Member names carry a prefix so cuda.h's versioning macros leave
 * them alone. */
#define GG__CU_FUNCS(X)                                                                           \
  X(cuInit, (unsigned int))                                                                       \
  X(cuDriverGetVersion, (int *))                                                                  \
  X(cuGetErrorName, (CUresult, const char **))                                                    \
  X(cuGetErrorString, (CUresult, const char **))                                                  \
  X(cuDeviceGetCount, (int *))                                                                    \
  X(cuDeviceGet, (CUdevice *, int))                                                               \
  X(cuDeviceGetName, (char *, int, CUdevice))                                                     \
  X(cuDeviceGetUuid, (CUuuid *, CUdevice))                                                        \
  X(cuDeviceTotalMem, (size_t *, CUdevice))                                                       \
  X(cuDeviceGetAttribute, (int *, CUdevice_attribute, CUdevice))                                  \
  X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                            \
  X(cuDevicePrimaryCtxRelease, (CUdevice))                                                        \
  X(cuDevicePrimaryCtxReset, (CUdevice))                                                          \
  X(cuCtxGetCurrent, (CUcontext *))                                                               \
  X(cuCtxPushCurrent, (CUcontext))                                                                \
  X(cuCtxPopCurrent, (CUcontext *))                                                               \
  X(cuCtxSynchronize, (void))                                                                     \
  X(cuMemGetInfo, (size_t *, size_t *))                                                           \
  X(cuMemGetAllocationGranularity,                                                                \
    (size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags))                    \
  X(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))        \
  X(cuMemAddressFree, (CUdeviceptr, size_t))                                                      \
  X(cuMemCreate,                                                                                  \
    (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))    \
  X(cuMemRelease, (CUmemGenericAllocationHandle))                                                 \
  X(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))    \
  X(cuMemUnmap, (CUdeviceptr, size_t))                                                            \
  X(cuMemSetAccess, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))                       \
  X(cuMemExportToShareableHandle,                                                                 \
    (void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long))        \
  X(cuMemImportFromShareableHandle,                                                               \
    (CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType))                          \
  X(cuMemAlloc, (CUdeviceptr *, size_t))                                                          \
  X(cuMemFree, (CUdeviceptr))                                                                     \
  X(cuMemcpyHtoD, (CUdeviceptr, const void *, size_t))                                            \
  X(cuMemcpyDtoH, (void *, CUdeviceptr, size_t))                                                  \
  X(cuMemsetD8, (CUdeviceptr, unsigned char, size_t))                                             \
  X(cuEventCreate, (CUevent *, unsigned int))                                                     \
  X(cuEventRecord, (CUevent, CUstream))                                                           \
  X(cuEventQuery, (CUevent))                                                                      \
  X(cuEventSynchronize, (CUevent))                                                                \
  X(cuEventDestroy, (CUevent))                                                                    \
  X(cuStreamSynchronize, (CUstream))                                                              \
  X(cuStreamQuery, (CUstream))                                                                    \
  X(cuStreamWaitEvent, (CUstream, CUevent, unsigned int))                                         \
  X(cuStreamGetCaptureInfo,                                                                       \
    (CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *, const CUgraphNode **, size_t *)) \
  X(cuUserObjectCreate, (CUuserObject *, void *, CUhostFn, unsigned int, unsigned int))           \
  X(cuGraphRetainUserObject, (CUgraph, CUuserObject, unsigned int, unsigned int))                 \
  X(cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode *))

typedef struct gg__cu_table {
#define GG__CU_MEMBER(name, args) CUresult(CUDAAPI *fn_##name) args;
  GG__CU_FUNCS(GG__CU_MEMBER)
#undef GG__CU_MEMBER
} gg__cu_table_t;

/* Filled by gg__cu_ready()'s first call; read-only afterwards. */
extern gg__cu_table_t gg__cu;

/* Loads the driver on first use; fails with the reason when it is unusable in this process (no
 * driver, one too old, no device, or CUDA initialised before a fork). */
int gg__cu_ready(const char *call);
/* Records a failed driver call with its CUresult name and text; returns its GG_E* code. */
int gg__cu_fail(CUresult r, const char *call);
/* The driver's handle of device index, after the driver is ready; GG_ENODEV past the last. */
int gg__cu_device(int index, CUdevice *dev);

/* The family row's entries (cuda_driver.c, and cuda.c's open). */
int gg__cuda_count(int *count);
int gg__cuda_props(int index, gg__dev_props_t *props);
int gg__cuda_open(int index, gg__dev_t **dev);

#define GG__CU(call, what)                                        \
  do {                                                            \
    CUresult gg__r = (call);                                      \
    if (gg__r != CUDA_SUCCESS) return gg__cu_fail(gg__r, (what)); \
  } while (0)

#endif
