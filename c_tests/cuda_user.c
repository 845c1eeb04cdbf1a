/* Preloaded into the host-memory contract tests (cmake -DFERROCCL_TEST_CUDA_USER=ON) to
 * make every test program a program that uses CUDA, as frameworks are: before main it
 * initialises the driver and makes device 0's primary context current, so the library
 * sees CUDA in use on every call (buffer kinds asked of the driver, fcclMemAllocHost
 * page-locked) while the tests still pass host memory. Does nothing where no driver
 * or device is present. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <dlfcn.h>
#include <stdio.h>

typedef int CUresult;

__attribute__((constructor)) static void fccl_use_cuda(void) {
  CUresult (*init)(unsigned) = NULL;
  CUresult (*count)(int*) = NULL;
  CUresult (*get)(int*, int) = NULL;
  CUresult (*retain)(void**, int) = NULL;
  CUresult (*set)(void*) = NULL;
  int n = 0, dev = 0;
  void* ctx = NULL;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) return;
  *(void**)(&init) = dlsym(h, "cuInit");
  *(void**)(&count) = dlsym(h, "cuDeviceGetCount");
  *(void**)(&get) = dlsym(h, "cuDeviceGet");
  *(void**)(&retain) = dlsym(h, "cuDevicePrimaryCtxRetain");
  *(void**)(&set) = dlsym(h, "cuCtxSetCurrent");
  if (!init || !count || !get || !retain || !set) return;
  if (init(0) != 0 || count(&n) != 0 || n == 0) return;
  if (get(&dev, 0) != 0 || retain(&ctx, dev) != 0 || set(ctx) != 0) {
    fprintf(stderr, "cuda_user: device 0 is unusable\n");
  }
}
