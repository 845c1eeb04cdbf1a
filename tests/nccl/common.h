/*
 * What the NCCL-API test programs of tests/nccl share: checks counted under a lock (the
 * ranks may be threads of one process), and the CUDA driver API loaded with dlopen, so
 * that they build without CUDA headers or libraries and run on the simulated GPU.
 */
#ifndef FERROCCL_TESTS_NCCL_COMMON_H
#define FERROCCL_TESTS_NCCL_COMMON_H

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int failures = 0, checks = 0;

#define CHECK(rank, cond, ...)                                          \
  do {                                                                  \
    pthread_mutex_lock(&lock);                                          \
    checks++;                                                           \
    if (!(cond)) {                                                      \
      failures++;                                                       \
      fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                     \
      fprintf(stderr, "\n");                                            \
    }                                                                   \
    pthread_mutex_unlock(&lock);                                        \
  } while (0)
#define OK(rank, call)                                                                          \
  do {                                                                                          \
    ncclResult_t r_ = (call);                                                                   \
    CHECK(rank, r_ == ncclSuccess, "%s: %s (%s)", #call, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
  } while (0)

/* A non-blocking communicator's call: poll until it leaves ncclInProgress. */
static inline ncclResult_t settle(ncclComm_t comm, ncclResult_t r) {
  ncclResult_t st = ncclInProgress;
  if (r != ncclInProgress) return r;
  do {
    r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return r;
  } while (st == ncclInProgress);
  return st;
}

#define DO(rank, comm, call)                                                                  \
  do {                                                                                        \
    ncclResult_t r_ = (call);                                                                 \
    r_ = settle((comm), r_); /* after the call: it may set `comm` */                         \
    CHECK(rank, r_ == ncclSuccess, "%s: %s (%s)", #call, ncclGetErrorString(r_),              \
          ncclGetLastError(NULL));                                                            \
  } while (0)

#define CU(rank, call) CHECK(rank, (call) == 0, "%s failed", #call)

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGetCount)(int*);
static CUresult (*cuDeviceGet)(int*, int);
static CUresult (*cuDevicePrimaryCtxRetain)(void**, int);
static CUresult (*cuCtxSetCurrent)(void*);
static CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
static CUresult (*cuMemFree)(CUdeviceptr);
static CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
static CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
static CUresult (*cuStreamCreate)(void**, unsigned);
static CUresult (*cuStreamDestroy)(void*);
static CUresult (*cuStreamSynchronize)(void*);
static CUresult (*cuStreamBeginCapture)(void*, int);
static CUresult (*cuStreamEndCapture)(void*, void**);
static CUresult (*cuGraphDestroy)(void*);

/* Loads the driver and initialises it: its number of devices, or 0 where there is no
 * driver, no device or a function is missing (the caller skips). */
static inline int cuda_load(void) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW);
  int n = 0;
  if (h == NULL) return 0;
#define LOAD(var, name) *(void**)&var = dlsym(h, name)
  LOAD(cuInit, "cuInit");
  LOAD(cuDeviceGetCount, "cuDeviceGetCount");
  LOAD(cuDeviceGet, "cuDeviceGet");
  LOAD(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  LOAD(cuCtxSetCurrent, "cuCtxSetCurrent");
  LOAD(cuMemAlloc, "cuMemAlloc_v2");
  LOAD(cuMemFree, "cuMemFree_v2");
  LOAD(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  LOAD(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  LOAD(cuStreamCreate, "cuStreamCreate");
  LOAD(cuStreamDestroy, "cuStreamDestroy_v2");
  LOAD(cuStreamSynchronize, "cuStreamSynchronize");
  LOAD(cuStreamBeginCapture, "cuStreamBeginCapture_v2");
  LOAD(cuStreamEndCapture, "cuStreamEndCapture");
  LOAD(cuGraphDestroy, "cuGraphDestroy");
#undef LOAD
  if (!cuInit || !cuDeviceGetCount || !cuDeviceGet || !cuDevicePrimaryCtxRetain || !cuCtxSetCurrent || !cuMemAlloc ||
      !cuMemFree || !cuMemcpyHtoD || !cuMemcpyDtoH || !cuStreamCreate || !cuStreamDestroy || !cuStreamSynchronize ||
      !cuStreamBeginCapture || !cuStreamEndCapture || !cuGraphDestroy)
    return 0;
  if (cuInit(0) != 0 || cuDeviceGetCount(&n) != 0) return 0;
  return n;
}

#endif
