/*
 * ncclAllReduce inside CUDA graph capture, as torch.cuda.graph makes it: every rank
 * thread captures its own non-blocking stream (CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, so
 * that the other rank threads may keep calling the driver) and calls ncclAllReduce on
 * device buffers there. ferroccl cannot replay its device path from a graph, so the call
 * must return ncclInvalidUsage on every rank, ncclGetLastError must name the capture, the
 * capture must still end with CUDA_SUCCESS and a graph, and the same call outside capture
 * must give the right sums. N ranks as threads, rank r on device r % devices; the driver
 * API is loaded with dlopen (tests/nccl/run.sh runs it on the simulated GPU).
 *
 *   graph_capture N       exit 0 when every check passed, 77 when there is no CUDA
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define M 37
#define THREAD_LOCAL 1
#define NON_BLOCKING 1u

static int ndev = 0;

struct targ {
  ncclUniqueId id;
  int rank, n;
};

static void* rank_main(void* p) {
  struct targ* a = p;
  int rank = a->rank, n = a->n, dev = 0, q, i;
  void* ctx = NULL;
  void* stream = NULL;
  void* graph = NULL;
  ncclComm_t comm = NULL;
  CUdeviceptr d_send = 0, d_recv = 0;
  float hs[M], hr[M];

  CU(rank, cuDeviceGet(&dev, rank % ndev));
  CU(rank, cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(rank, cuCtxSetCurrent(ctx));
  OK(rank, ncclCommInitRank(&comm, n, a->id, rank));
  if (comm == NULL) return NULL;
  CU(rank, cuStreamCreate(&stream, NON_BLOCKING));
  CU(rank, cuMemAlloc(&d_send, sizeof hs));
  CU(rank, cuMemAlloc(&d_recv, sizeof hr));
  for (i = 0; i < M; i++) hs[i] = (float)(rank * 10 + i);
  CU(rank, cuMemcpyHtoD(d_send, hs, sizeof hs));

  CU(rank, cuStreamBeginCapture(stream, THREAD_LOCAL));
  {
    ncclResult_t r = ncclAllReduce((void*)(uintptr_t)d_send, (void*)(uintptr_t)d_recv, M, ncclFloat, ncclSum, comm,
                                   stream);
    const char* m = ncclGetLastError(comm);
    CHECK(rank, r == ncclInvalidUsage, "ncclAllReduce inside capture: %s, expected ncclInvalidUsage", ncclGetErrorString(r));
    CHECK(rank, m && strstr(m, "captured into a CUDA graph") && strstr(m, "AllReduce"),
          "ncclGetLastError must name the call and the capture: %s", m ? m : "(null)");
  }
  CU(rank, cuStreamEndCapture(stream, &graph));
  CHECK(rank, graph != NULL, "the capture must still end with a graph");
  if (graph) CU(rank, cuGraphDestroy(graph));

  OK(rank, ncclAllReduce((void*)(uintptr_t)d_send, (void*)(uintptr_t)d_recv, M, ncclFloat, ncclSum, comm, stream));
  CU(rank, cuStreamSynchronize(stream));
  CU(rank, cuMemcpyDtoH(hr, d_recv, sizeof hr));
  for (i = 0; i < M; i++) {
    float want = 0;
    for (q = 0; q < n; q++) want += (float)(q * 10 + i);
    CHECK(rank, hr[i] == want, "all_reduce after the capture, element %d: %g, want %g", i, hr[i], want);
  }
  CU(rank, cuMemFree(d_send));
  CU(rank, cuMemFree(d_recv));
  CU(rank, cuStreamDestroy(stream));
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
    printf("graph_capture: no CUDA driver or device with stream capture (skipped)\n");
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
  printf("graph_capture %d ranks on %d devices: %d checks, %d failed\n", n, ndev, checks, failures);
  return failures == 0 ? 0 : 1;
}
