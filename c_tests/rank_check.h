/* CHECK and OK of the tests that link ferroccl directly (not the harness): a failed
 * check counts in `failures` and prints `g_rank`, the file and line, and the message;
 * OK checks that a ferroccl call returned fcclSuccess and prints the library's last
 * error otherwise. With cuda_driver.h included first, put_floats and get_floats copy floats to and
 * from device memory (get after the context's work finished). The including file
 * defines `static int failures, g_rank;` and includes stdio.h and ferroccl.h first. */
#ifndef FCCL_TEST_RANK_CHECK_H
#define FCCL_TEST_RANK_CHECK_H

#define CHECK(cond, ...)                                               \
  do {                                                                 \
    if (!(cond)) {                                                     \
      failures++;                                                      \
      fprintf(stderr, "rank %d: %s:%d: ", g_rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                    \
      fprintf(stderr, "\n");                                           \
    }                                                                  \
  } while (0)
#define OK(call)                                                                             \
  do {                                                                                       \
    fcclResult_t r_ = (call);                                                                \
    CHECK(r_ == fcclSuccess, "%s returned %d: %s", #call, (int)r_, fcclGetLastError(NULL)); \
  } while (0)

#ifdef FCCL_TEST_CUDA_DRIVER_H
static inline void put_floats(float* d, const float* h, size_t n) {
  CHECK(cu.MemcpyHtoD((CUdeviceptr)(size_t)d, h, n * sizeof(float)) == 0, "cuMemcpyHtoD failed");
}
static inline void get_floats(float* h, const float* d, size_t n) {
  CHECK(cu.CtxSynchronize() == 0, "cuCtxSynchronize failed");
  CHECK(cu.MemcpyDtoH(h, (CUdeviceptr)(size_t)d, n * sizeof(float)) == 0, "cuMemcpyDtoH failed");
}
#endif

#endif
