/* Preloaded into the host-memory contract tests (cmake -DFERROCCL_TEST_CUDA_USER=ON) to
 * make every test program a program that uses CUDA, as frameworks are: before main it
 * initialises the driver and makes device 0's primary context current, so the library
 * sees CUDA in use on every call (buffer kinds asked of the driver, fcclMemAllocHost
 * page-locked) while the tests still pass host memory. Does nothing where no driver
 * or device is present. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <stdio.h>

#include "cuda_driver.h"

__attribute__((constructor)) static void fccl_use_cuda(void) {
  int n = 0;
  if (fccl_cu_load(RTLD_GLOBAL, FCCL_CU_BASE) || cu.Init(0) != 0 || cu.DeviceGetCount(&n) != 0 || n == 0) return;
  if (fccl_cu_device0(NULL)) fprintf(stderr, "cuda_user: device 0 is unusable\n");
}
