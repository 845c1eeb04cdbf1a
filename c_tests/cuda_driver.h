/* The CUDA driver as the device tests use it, loaded with dlopen("libcuda.so.1") so that
 * they build with nothing but ferroccl.h: the driver's types they use (as cuda.h lays
 * them out), one table `cu` of its functions (cu.Init is cuInit), the loader, and the
 * bring-up of device 0. Each test names the groups of functions it needs; a function of
 * another group is NULL where the driver lacks it. Where there is no driver or no device
 * the tests exit 77 (skipped), saying the reason these functions return. */
#ifndef FCCL_TEST_CUDA_DRIVER_H
#define FCCL_TEST_CUDA_DRIVER_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream; /* ferroccl.h's struct: a CUstream is an fcclStream_t */
typedef struct CUgraph_st* CUgraph;
typedef struct CUgraphExec_st* CUgraphExec;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct {
  int type;
  int id;
} CUmemLocation;
typedef struct {
  int type;
  int requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  unsigned char compressionType, gpuDirectRDMACapable;
  unsigned short usage;
  unsigned char reserved[4];
} CUmemAllocationProp;
typedef struct {
  CUmemLocation location;
  int flags;
} CUmemAccessDesc;

#define CU_STREAM_NON_BLOCKING 0x1u

/* Groups of functions a test needs (fccl_cu_load's `need`). */
#define FCCL_CU_BASE 0x1u    /* initialise, pick a device, make its context current, copy */
#define FCCL_CU_STREAM 0x2u  /* streams and the copies and memsets queued on them */
#define FCCL_CU_GRAPH 0x4u   /* stream capture and CUDA graphs */
#define FCCL_CU_MANAGED 0x8u /* managed memory */
#define FCCL_CU_VMM 0x10u    /* virtual memory management (cuMemCreate, cuMemMap) */
#define FCCL_CU_OPTIONAL 0u  /* used when present */

/* X(field, symbol, group, parameters): every function of the table. */
#define FCCL_CU_FUNCTIONS(X)                                                                                     \
  X(Init, "cuInit", FCCL_CU_BASE, (unsigned))                                                                    \
  X(DeviceGetCount, "cuDeviceGetCount", FCCL_CU_BASE, (int*))                                                    \
  X(DeviceGet, "cuDeviceGet", FCCL_CU_BASE, (CUdevice*, int))                                                    \
  X(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", FCCL_CU_BASE, (CUcontext*, CUdevice))                    \
  X(CtxSetCurrent, "cuCtxSetCurrent", FCCL_CU_BASE, (CUcontext))                                                 \
  X(CtxSynchronize, "cuCtxSynchronize", FCCL_CU_BASE, (void))                                                    \
  X(MemcpyHtoD, "cuMemcpyHtoD_v2", FCCL_CU_BASE, (CUdeviceptr, const void*, size_t))                             \
  X(MemcpyDtoH, "cuMemcpyDtoH_v2", FCCL_CU_BASE, (void*, CUdeviceptr, size_t))                                   \
  X(StreamCreate, "cuStreamCreate", FCCL_CU_STREAM, (CUstream*, unsigned))                                       \
  X(StreamDestroy, "cuStreamDestroy_v2", FCCL_CU_STREAM, (CUstream))                                             \
  X(StreamSynchronize, "cuStreamSynchronize", FCCL_CU_STREAM, (CUstream))                                        \
  X(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", FCCL_CU_STREAM, (CUdeviceptr, const void*, size_t, CUstream))       \
  X(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", FCCL_CU_STREAM, (void*, CUdeviceptr, size_t, CUstream))             \
  X(MemsetD32Async, "cuMemsetD32Async", FCCL_CU_STREAM, (CUdeviceptr, unsigned, size_t, CUstream))               \
  X(StreamBeginCapture, "cuStreamBeginCapture_v2", FCCL_CU_GRAPH, (CUstream, int))                               \
  X(StreamEndCapture, "cuStreamEndCapture", FCCL_CU_GRAPH, (CUstream, CUgraph*))                                 \
  X(StreamIsCapturing, "cuStreamIsCapturing", FCCL_CU_GRAPH, (CUstream, int*))                                   \
  X(GraphInstantiate, "cuGraphInstantiateWithFlags", FCCL_CU_GRAPH,                                              \
    (CUgraphExec*, CUgraph, unsigned long long))                                                                 \
  X(GraphLaunch, "cuGraphLaunch", FCCL_CU_GRAPH, (CUgraphExec, CUstream))                                        \
  X(GraphExecDestroy, "cuGraphExecDestroy", FCCL_CU_GRAPH, (CUgraphExec))                                        \
  X(GraphDestroy, "cuGraphDestroy", FCCL_CU_GRAPH, (CUgraph))                                                    \
  X(MemAllocManaged, "cuMemAllocManaged", FCCL_CU_MANAGED, (CUdeviceptr*, size_t, unsigned))                     \
  X(MemFree, "cuMemFree_v2", FCCL_CU_MANAGED, (CUdeviceptr))                                                     \
  X(DeviceGetAttribute, "cuDeviceGetAttribute", FCCL_CU_VMM, (int*, int, CUdevice))                              \
  X(MemGetAllocationGranularity, "cuMemGetAllocationGranularity", FCCL_CU_VMM,                                   \
    (size_t*, const CUmemAllocationProp*, int))                                                                  \
  X(MemCreate, "cuMemCreate", FCCL_CU_VMM,                                                                       \
    (CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long))                     \
  X(MemRelease, "cuMemRelease", FCCL_CU_VMM, (CUmemGenericAllocationHandle))                                     \
  X(MemAddressReserve, "cuMemAddressReserve", FCCL_CU_VMM,                                                       \
    (CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long))                                             \
  X(MemAddressFree, "cuMemAddressFree", FCCL_CU_VMM, (CUdeviceptr, size_t))                                      \
  X(MemMap, "cuMemMap", FCCL_CU_VMM,                                                                             \
    (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))                             \
  X(MemUnmap, "cuMemUnmap", FCCL_CU_VMM, (CUdeviceptr, size_t))                                                  \
  X(MemSetAccess, "cuMemSetAccess", FCCL_CU_VMM, (CUdeviceptr, size_t, const CUmemAccessDesc*, size_t))          \
  X(GetErrorName, "cuGetErrorName", FCCL_CU_OPTIONAL, (CUresult, const char**))

#define FCCL_CU_FIELD(field, symbol, group, params) CUresult(*field) params;
static struct {
  FCCL_CU_FUNCTIONS(FCCL_CU_FIELD)
} cu;
#undef FCCL_CU_FIELD

/* Opens the driver (dlopen `flags` besides RTLD_NOW) and fills `cu`. NULL when it has
 * every function of the groups in `need`, else why not ("libcuda.so.1 lacks cuMemCreate"). */
static inline const char* fccl_cu_load(int flags, unsigned need) {
  static char why[256];
  const char* missing = NULL;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | flags);
  if (!h) {
    const char* e = dlerror();
    snprintf(why, sizeof why, "libcuda.so.1 not loadable: %s", e ? e : "?");
    return why;
  }
  /* POSIX's way to store dlsym's void* into a function pointer without a cast. */
#define FCCL_CU_SYM(field, symbol, group, params) \
  *(void**)(&cu.field) = dlsym(h, symbol);        \
  if (!cu.field && ((group) & need) && !missing) missing = symbol;
  FCCL_CU_FUNCTIONS(FCCL_CU_SYM)
#undef FCCL_CU_SYM
  if (!missing) return NULL;
  snprintf(why, sizeof why, "libcuda.so.1 lacks %s", missing);
  return why;
}

/* The driver's name for `r` ("CUDA_ERROR_INVALID_VALUE"), or "CUDA error". */
static inline const char* fccl_cu_name(CUresult r) {
  const char* s = NULL;
  if (cu.GetErrorName && cu.GetErrorName(r, &s) == 0 && s) return s;
  return "CUDA error";
}

/* After fccl_cu_load: initialises the driver and makes device 0's primary context
 * current on this thread (stored at `ctx` when not NULL). NULL, or why not. */
static inline const char* fccl_cu_device0(CUcontext* ctx) {
  int n = 0;
  CUdevice dev = 0;
  CUcontext c = NULL;
  if (cu.Init(0) != 0) return "cuInit failed";
  if (cu.DeviceGetCount(&n) != 0 || n == 0) return "no device";
  if (cu.DeviceGet(&dev, 0) != 0 || cu.DevicePrimaryCtxRetain(&c, dev) != 0 || cu.CtxSetCurrent(c) != 0)
    return "device 0 unusable";
  if (ctx) *ctx = c;
  return NULL;
}

#endif
