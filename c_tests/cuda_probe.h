/* What the tests expect fcclCommCuDevice to report, found without the library: the
 * device of the CUDA context current on the calling thread when the process has the
 * driver loaded (a CUDA program, as under -DFERROCCL_TEST_CUDA_USER=ON), else -1.
 * A communicator created on this thread with fcclCommInitRank/FromEnv (or split from
 * one) has that device, as with NCCL; fcclCommInitAll with no device list gives -1. */
#ifndef FCCL_TEST_CUDA_PROBE_H
#define FCCL_TEST_CUDA_PROBE_H

#include <dlfcn.h>

static int fccl_current_cuda_device(void) {
  int (*get_current)(void**) = 0;
  int (*get_device)(int*) = 0;
  void* ctx = 0;
  int dev = -1;
  void* h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
  if (!h) return -1;
  /* POSIX's way to turn dlsym's void* into a function pointer without a cast. */
  *(void**)(&get_current) = dlsym(h, "cuCtxGetCurrent");
  *(void**)(&get_device) = dlsym(h, "cuCtxGetDevice");
  if (!get_current || !get_device || get_current(&ctx) != 0 || !ctx || get_device(&dev) != 0) dev = -1;
  dlclose(h);
  return dev;
}

#endif
