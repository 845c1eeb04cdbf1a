/* Device memory: every collective on CUDA buffers from fcclMemAlloc.
 *
 * Each rank selects device 0 (its primary context made current) before creating its
 * communicator, so at 1 rank the NCCL backend serves the calls when NCCL is loadable,
 * and at 2-4 ranks (all on one GPU, which NCCL refuses) the built-in backend does.
 * Data goes in and out with cuMemcpy from the driver, loaded with dlopen: the test
 * needs nothing but ferroccl.h to build, and exits 77 ("skipped: no CUDA driver/GPU")
 * where there is no driver or no device.
 *
 * Inputs are small integers in float32 (exact): rank r's element i is r*1000 + i, so
 * every expected value is computed here, independently of the library. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"
#include "ferroccl.h"

static int failures;
static int g_rank, g_n;

#include "rank_check.h"

static int skip(const char* why) {
  printf("skipped: no CUDA driver/GPU (%s)\n", why);
  return 77;
}

/* Device buffer of n floats, filled with f(i) (or NaN-free garbage when f is NULL). */
static float* dev_alloc(size_t n) {
  void* p = NULL;
  OK(fcclMemAlloc(&p, n * sizeof(float) + 4));
  return (float*)p;
}
static float in(int r, size_t i) { return (float)(r * 1000 + (int)i); }

static void expect(const char* what, const float* got, const float* want, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (got[i] != want[i]) {
      CHECK(0, "%s: element %zu is %g, expected %g", what, i, (double)got[i], (double)want[i]);
      return;
    }
  }
}

static void run(fcclComm_t comm) {
  const int r = g_rank, n = g_n;
  const size_t c = 37; /* per-rank count: odd, so chunking bugs show */
  const size_t big = c * (size_t)n;
  float* h = calloc(big, sizeof(float));
  float* w = calloc(big, sizeof(float));
  float* s = dev_alloc(big);
  float* d = dev_alloc(big);
  int dev = -2;
  size_t i;
  int p;

  OK(fcclCommCuDevice(comm, &dev));
  CHECK(dev == 0, "fcclCommCuDevice = %d, expected 0", dev);

  /* all_reduce (sum), out of place and in place */
  for (i = 0; i < c; i++) h[i] = in(r, i);
  put_floats(s, h, c);
  OK(fcclAllReduce(s, d, c, fcclFloat32, fcclSum, comm, NULL));
  get_floats(h, d, c);
  for (i = 0; i < c; i++) {
    w[i] = 0;
    for (p = 0; p < n; p++) w[i] += in(p, i);
  }
  expect("all_reduce", h, w, c);
  OK(fcclAllReduce(d, d, c, fcclFloat32, fcclMax, comm, NULL));
  get_floats(h, d, c);
  expect("all_reduce in place (max of equal values)", h, w, c);

  /* broadcast from the last rank */
  for (i = 0; i < c; i++) h[i] = in(r, i);
  put_floats(s, h, c);
  OK(fcclBroadcast(s, d, c, fcclFloat32, n - 1, comm, NULL));
  get_floats(h, d, c);
  for (i = 0; i < c; i++) w[i] = in(n - 1, i);
  expect("broadcast", h, w, c);

  /* reduce (max) to rank 0 */
  for (i = 0; i < c; i++) h[i] = in(r, i);
  put_floats(s, h, c);
  OK(fcclReduce(s, d, c, fcclFloat32, fcclMax, 0, comm, NULL));
  if (r == 0) {
    get_floats(h, d, c);
    for (i = 0; i < c; i++) w[i] = in(n - 1, i);
    expect("reduce", h, w, c);
  }

  /* all_gather */
  for (i = 0; i < c; i++) h[i] = in(r, i);
  put_floats(s, h, c);
  OK(fcclAllGather(s, d, c, fcclFloat32, comm, NULL));
  get_floats(h, d, big);
  for (p = 0; p < n; p++)
    for (i = 0; i < c; i++) w[(size_t)p * c + i] = in(p, i);
  expect("all_gather", h, w, big);

  /* reduce_scatter (sum) */
  for (i = 0; i < big; i++) h[i] = in(r, i);
  put_floats(s, h, big);
  OK(fcclReduceScatter(s, d, c, fcclFloat32, fcclSum, comm, NULL));
  get_floats(h, d, c);
  for (i = 0; i < c; i++) {
    w[i] = 0;
    for (p = 0; p < n; p++) w[i] += in(p, (size_t)r * c + i);
  }
  expect("reduce_scatter", h, w, c);

  /* all_to_all: block q of rank p's input is p*1000 + q*c + i */
  for (i = 0; i < big; i++) h[i] = in(r, i);
  put_floats(s, h, big);
  OK(fcclAlltoAll(s, d, c, fcclFloat32, comm, NULL));
  get_floats(h, d, big);
  for (p = 0; p < n; p++)
    for (i = 0; i < c; i++) w[(size_t)p * c + i] = in(p, (size_t)r * c + i);
  expect("all_to_all", h, w, big);

  /* gather to rank 0, scatter from rank 0 */
  for (i = 0; i < c; i++) h[i] = in(r, i);
  put_floats(s, h, c);
  OK(fcclGather(s, d, c, fcclFloat32, 0, comm, NULL));
  if (r == 0) {
    get_floats(h, d, big);
    for (p = 0; p < n; p++)
      for (i = 0; i < c; i++) w[(size_t)p * c + i] = in(p, i);
    expect("gather", h, w, big);
  }
  for (i = 0; i < big; i++) h[i] = in(r, i);
  put_floats(s, h, big);
  OK(fcclScatter(s, d, c, fcclFloat32, 0, comm, NULL));
  get_floats(h, d, c);
  for (i = 0; i < c; i++) w[i] = in(0, (size_t)r * c + i);
  expect("scatter", h, w, c);

  /* send/recv around a ring */
  for (i = 0; i < c; i++) h[i] = in(r, i);
  put_floats(s, h, c);
  OK(fcclGroupStart());
  OK(fcclSend(s, c, fcclFloat32, (r + 1) % n, comm, NULL));
  OK(fcclRecv(d, c, fcclFloat32, (r + n - 1) % n, comm, NULL));
  OK(fcclGroupEnd());
  get_floats(h, d, c);
  for (i = 0; i < c; i++) w[i] = in((r + n - 1) % n, i);
  expect("send/recv ring", h, w, c);

  /* one call's buffers must be of one kind */
  {
    fcclResult_t res = fcclAllReduce(h, d, c, fcclFloat32, fcclSum, comm, NULL);
    CHECK(res == fcclInvalidArgument, "host sendbuff with device recvbuff returned %d, expected %d",
          (int)res, (int)fcclInvalidArgument);
  }

  OK(fcclMemFree(s));
  OK(fcclMemFree(d));
  free(h);
  free(w);
}

int main(void) {
  const char* why;
  fcclComm_t comm = NULL;
  if ((why = fccl_cu_load(RTLD_LOCAL, FCCL_CU_BASE)) || (why = fccl_cu_device0(NULL))) return skip(why);

  if (getenv("FERROCCL_RANK")) {
    OK(fcclCommInitFromEnv(&comm));
  } else {
    fcclUniqueId id;
    OK(fcclGetUniqueId(&id));
    OK(fcclCommInitRank(&comm, 1, id, 0));
  }
  if (failures) return 1;
  OK(fcclCommUserRank(comm, &g_rank));
  OK(fcclCommCount(comm, &g_n));
  run(comm);
  OK(fcclCommDestroy(comm));
  if (failures) {
    fprintf(stderr, "rank %d: %d failures\n", g_rank, failures);
    return 1;
  }
  printf("rank %d/%d: every collective on device memory passed\n", g_rank, g_n);
  return 0;
}
