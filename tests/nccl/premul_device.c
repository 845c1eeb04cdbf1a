/*
 * PreMulSum on CUDA device memory, as PyTorch's ReduceOp.PREMUL_SUM makes it: the
 * scalar a device tensor (ncclScalarDevice) or a host value (ncclScalarHostImmediate),
 * the buffers device memory. N ranks as threads, rank r on device r % devices; the
 * driver API is loaded with dlopen, so no CUDA headers are needed (tests/nccl/run.sh
 * runs it on the simulated GPU, scripts/sim-gpu.sh).
 *
 *   premul_device N       exit 0 when every check passed, 77 when there is no CUDA
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define M 23

static int ndev = 0;

struct targ {
  ncclUniqueId id;
  int rank, n;
};

static void* rank_main(void* p) {
  struct targ* a = p;
  int rank = a->rank, n = a->n, dev = 0, q, i;
  void* ctx = NULL;
  ncclComm_t comm = NULL;
  ncclRedOp_t op = ncclSum, op2 = ncclSum;
  CUdeviceptr d_send = 0, d_recv = 0, d_scalar = 0;
  float hs[8 * M], hr[8 * M], half = 0.5f;
  int32_t is[8 * M], ir[8 * M], three = 3;

  CU(rank, cuDeviceGet(&dev, rank % ndev));
  CU(rank, cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(rank, cuCtxSetCurrent(ctx));
  OK(rank, ncclCommInitRank(&comm, n, a->id, rank));
  if (comm == NULL) return NULL;
  CU(rank, cuMemAlloc(&d_send, sizeof hs));
  CU(rank, cuMemAlloc(&d_recv, sizeof hr));
  CU(rank, cuMemAlloc(&d_scalar, sizeof half));

  /* all_reduce, the scalar a device tensor read when the call is made. */
  CU(rank, cuMemcpyHtoD(d_scalar, &half, sizeof half));
  OK(rank, ncclRedOpCreatePreMulSum(&op, (void*)(uintptr_t)d_scalar, ncclFloat, ncclScalarDevice, comm));
  half = 0.25f; /* the device copy is what counts */
  CU(rank, cuMemcpyHtoD(d_scalar, &half, sizeof half));
  for (i = 0; i < M; i++) hs[i] = (float)(rank * 5 + i + 1);
  CU(rank, cuMemcpyHtoD(d_send, hs, M * sizeof(float)));
  OK(rank, ncclAllReduce((void*)(uintptr_t)d_send, (void*)(uintptr_t)d_recv, M, ncclFloat, op, comm, NULL));
  CU(rank, cuMemcpyDtoH(hr, d_recv, M * sizeof(float)));
  for (i = 0; i < M; i++) {
    float want = 0;
    for (q = 0; q < n; q++) want += 0.25f * (float)(q * 5 + i + 1);
    CHECK(rank, hr[i] == want, "device all_reduce element %d: %g, want %g", i, hr[i], want);
  }
  OK(rank, ncclRedOpDestroy(op, comm));

  /* reduce_scatter in place, a host scalar: rank r's block is at r * M. */
  OK(rank, ncclRedOpCreatePreMulSum(&op2, &three, ncclInt32, ncclScalarHostImmediate, comm));
  for (q = 0; q < n; q++)
    for (i = 0; i < M; i++) is[q * M + i] = q * 100 + rank - i;
  CU(rank, cuMemcpyHtoD(d_send, is, (size_t)n * M * sizeof(int32_t)));
  OK(rank, ncclReduceScatter((void*)(uintptr_t)d_send, (void*)(uintptr_t)(d_send + (size_t)rank * M * sizeof(int32_t)),
                             M, ncclInt32, op2, comm, NULL));
  CU(rank, cuMemcpyDtoH(ir, d_send + (size_t)rank * M * sizeof(int32_t), M * sizeof(int32_t)));
  for (i = 0; i < M; i++) {
    int32_t want = 0;
    for (q = 0; q < n; q++) want += 3 * (rank * 100 + q - i);
    CHECK(rank, ir[i] == want, "device reduce_scatter element %d: %d, want %d", i, (int)ir[i], (int)want);
  }
  /* One buffer on the host, one on the device: refused before anything moves. */
  {
    ncclResult_t r = ncclAllReduce(is, (void*)(uintptr_t)d_recv, M, ncclInt32, op2, comm, NULL);
    CHECK(rank, r == ncclInvalidArgument, "host send, device recv: %d", (int)r);
  }
  OK(rank, ncclRedOpDestroy(op2, comm));
  CU(rank, cuMemFree(d_send));
  CU(rank, cuMemFree(d_recv));
  CU(rank, cuMemFree(d_scalar));
  OK(rank, ncclCommDestroy(comm));
  return NULL;
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2, i;
  struct targ a[8];
  pthread_t t[8];
  ncclUniqueId id;
  if (n < 1 || n > 8) return 2;
  ndev = cuda_load();
  if (ndev < 1) {
    printf("premul_device: no CUDA driver or device (skipped)\n");
    return 77;
  }
  OK(-1, ncclGetUniqueId(&id));
  for (i = 0; i < n; i++) {
    a[i].id = id;
    a[i].rank = i;
    a[i].n = n;
    pthread_create(&t[i], NULL, rank_main, &a[i]);
  }
  for (i = 0; i < n; i++) pthread_join(t[i], NULL);
  printf("premul_device %d ranks on %d devices: %d checks, %d failed\n", n, ndev, checks, failures);
  return failures == 0 ? 0 : 1;
}
