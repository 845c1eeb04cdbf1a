/* What served each call: fcclCommGetLastPath on device memory of ranks sharing one GPU.
 *
 * Every rank selects device 0 before creating its communicator, so all ranks share one
 * GPU and the GPU-to-GPU path ("ipc") must serve every collective and extension, out of
 * place and in place (all_to_all and all_to_allv in place included). With
 * FERROCCL_CUDA_IPC=0 every one must say "staged"; FCCL_TEST_BACKEND names the backend
 * expected otherwise. Host memory must
 * say "host". Managed memory cannot be shared through CUDA IPC: it must still say "ipc"
 * (a rank whose buffer peers map copies it through lent device memory), give the right
 * results, and the library must have logged one WARN for it on this communicator naming
 * the reason and the fix (checked in the log file this test points FERROCCL_DEBUG_FILE at).
 * Ranks that pass different counts get fcclCollectiveMismatch on every rank (the
 * descriptors carry what each rank called), and the communicator goes on.
 * A child of fcclCommSplit (key reversing the ranks; from 4 ranks the last one passes
 * FCCL_SPLIT_NOCOLOR) runs every call again and must be served as its parent is.
 * A test of the gate: with the path gated on an attribute a stock driver reports as 0
 * (the simulated GPU reports stock values), every device call here says "staged".
 *
 * Data goes in and out with the driver's cuMemcpy, loaded with dlopen; exits 77
 * (skipped) without a driver or device. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_driver.h"
#include "ferroccl.h"

static int failures;
static int g_rank, g_n, g_mps;
static const char* g_want;
static char g_log[256];

#include "rank_check.h"

static int skip(const char* why) {
  printf("skipped: no CUDA driver/GPU (%s)\n", why);
  return 77;
}

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

/* The last call's path must name backend `want`; rank 0 prints it. */
/* Rank 0's algorithm, where the GPU-to-GPU path served the call. */
static void algo_is(fcclComm_t comm, const char* what, const char* want) {
  const char* b = NULL;
  const char* a = NULL;
  OK(fcclCommGetLastPath(comm, &b, &a));
  if (g_rank == 0 && b && a && strcmp(b, "ipc") == 0)
    CHECK(strcmp(a, want) == 0, "%s: algorithm %s, expected %s", what, a, want);
}

static void path_is(fcclComm_t comm, const char* what, const char* want) {
  const char* b = NULL;
  const char* a = NULL;
  OK(fcclCommGetLastPath(comm, &b, &a));
  if (!b || !a) {
    CHECK(0, "%s: fcclCommGetLastPath left a NULL string", what);
    return;
  }
  CHECK(strcmp(b, want) == 0, "%s: served by backend %s (algorithm %s), expected %s", what, b, a, want);
  CHECK(a[0] != '\0', "%s: empty algorithm name", what);
  if (g_rank == 0) printf("path: %-28s backend %-7s algorithm %s\n", what, b, a);
}

/* Every collective and extension on device memory, each path checked. */
static void device_calls(fcclComm_t comm) {
  const int r = g_rank, n = g_n;
  const size_t c = 37;
  const size_t big = c * (size_t)n;
  float* h = calloc(big, sizeof(float));
  float* w = calloc(big, sizeof(float));
  float* s = dev_alloc(big);
  float* d = dev_alloc(big);
  size_t* counts = calloc((size_t)n, sizeof(size_t));
  size_t* displs = calloc((size_t)n, sizeof(size_t));
  size_t i;
  int p;
  for (i = 0; i < big; i++) h[i] = in(r, i);
  put_floats(s, h, big);
  put_floats(d, h, big);
  for (p = 0; p < n; p++) {
    counts[p] = c;
    displs[p] = (size_t)p * c;
  }

  OK(fcclAllReduce(s, d, c, fcclFloat32, fcclSum, comm, NULL));
  path_is(comm, "all_reduce", g_want);
  OK(fcclAllReduce(d, d, c, fcclFloat32, fcclSum, comm, NULL));
  path_is(comm, "all_reduce in place", g_want);
  OK(fcclBroadcast(s, d, c, fcclFloat32, n - 1, comm, NULL));
  path_is(comm, "broadcast", g_want);
  OK(fcclReduce(s, d, c, fcclFloat32, fcclMax, 0, comm, NULL));
  path_is(comm, "reduce", g_want);
  OK(fcclAllGather(s, d, c, fcclFloat32, comm, NULL));
  path_is(comm, "all_gather", g_want);
  OK(fcclReduceScatter(s, d, c, fcclFloat32, fcclSum, comm, NULL));
  path_is(comm, "reduce_scatter", g_want);
  OK(fcclGather(s, d, c, fcclFloat32, 0, comm, NULL));
  path_is(comm, "gather", g_want);
  OK(fcclScatter(s, d, c, fcclFloat32, 0, comm, NULL));
  path_is(comm, "scatter", g_want);
  OK(fcclAllGatherV(s, c, d, counts, displs, fcclFloat32, comm, NULL));
  path_is(comm, "all_gather_v", g_want);
  OK(fcclReduceScatterV(s, counts, displs, d, fcclFloat32, fcclSum, comm, NULL));
  path_is(comm, "reduce_scatter_v", g_want);
  {
    /* Inputs of 3 x 4 (gather) and 3 x 4n (scatter) elements: within the c*n buffers. */
    size_t gshape[2] = {3, 4};
    size_t sshape[2] = {3, (size_t)n * 4};
    OK(fcclAllGatherAxis(s, d, 2, gshape, 1, fcclFloat32, comm, NULL));
    path_is(comm, "all_gather_axis", g_want);
    OK(fcclReduceScatterAxis(s, d, 2, sshape, 1, fcclFloat32, fcclSum, comm, NULL));
    path_is(comm, "reduce_scatter_axis", g_want);
  }
  OK(fcclAllReduceWire(s, d, c, fcclFloat32, fcclSum, fcclBfloat16, comm, NULL));
  path_is(comm, "all_reduce_wire", g_want);
  {
    const void* sb[2] = {s, s + c};
    void* rb[2] = {d, d + c};
    size_t cc[2] = {c, c};
    OK(fcclAllReduceCoalesced(sb, rb, cc, 2, fcclFloat32, fcclSum, 0, comm, NULL));
    path_is(comm, "all_reduce_coalesced", g_want);
  }
  OK(fcclGroupStart());
  OK(fcclSend(s, c, fcclFloat32, (r + 1) % n, comm, NULL));
  OK(fcclRecv(d, c, fcclFloat32, (r + n - 1) % n, comm, NULL));
  OK(fcclGroupEnd());
  path_is(comm, "send/recv ring", g_want);

  /* all_to_all out of place and in place: block q of rank p's input is p*1000 + q*c + i */
  for (i = 0; i < big; i++) h[i] = in(r, i);
  put_floats(s, h, big);
  OK(fcclAlltoAll(s, d, c, fcclFloat32, comm, NULL));
  path_is(comm, "all_to_all", g_want);
  get_floats(h, d, big);
  for (p = 0; p < n; p++)
    for (i = 0; i < c; i++) w[(size_t)p * c + i] = in(p, (size_t)r * c + i);
  expect("all_to_all", h, w, big);
  for (i = 0; i < big; i++) h[i] = in(r, i);
  put_floats(d, h, big);
  OK(fcclAlltoAll(d, d, c, fcclFloat32, comm, NULL));
  path_is(comm, "all_to_all in place", g_want);
  algo_is(comm, "all_to_all in place", "exec-swap");
  get_floats(h, d, big);
  expect("all_to_all in place", h, w, big);
  for (i = 0; i < big; i++) h[i] = in(r, i);
  put_floats(d, h, big);
  OK(fcclAlltoAllv(d, counts, displs, d, counts, displs, fcclFloat32, comm, NULL));
  path_is(comm, "all_to_allv in place", g_want);
  algo_is(comm, "all_to_allv in place", "exec-swap");
  get_floats(h, d, big);
  expect("all_to_allv in place", h, w, big);

  /* Different counts on one rank: every rank gets the verdict before anything is
   * enqueued, whatever FERROCCL_CHECK says, and the communicator goes on. */
  {
    fcclResult_t res = fcclAllReduce(s, d, r == 1 ? 2 * c : c, fcclFloat32, fcclSum, comm, NULL);
    const char* msg = fcclGetLastError(NULL);
    CHECK(res == fcclCollectiveMismatch, "all_reduce of different counts returned %d (%s)", (int)res, msg);
    CHECK(strstr(msg, "rank 1 called fcclAllReduce(count 74"), "the verdict names rank 1's call: %s", msg);
    OK(fcclAllReduce(s, d, c, fcclFloat32, fcclSum, comm, NULL));
    path_is(comm, "all_reduce after a mismatch", g_want);
  }

  OK(fcclMemFree(s));
  OK(fcclMemFree(d));
  free(h);
  free(w);
  free(counts);
  free(displs);
}

/* How many times the log holds `needle`. */
static int log_count(const char* needle) {
  FILE* f = fopen(g_log, "r");
  char line[4096];
  int k = 0;
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (strstr(line, needle)) k++;
  fclose(f);
  return k;
}

/* Managed memory cannot be exported through CUDA IPC. It stays on the GPU-to-GPU path all
 * the same: rank 0 (the executor, without MPS) reads and writes it in place, and a rank
 * whose buffer a peer process must map copies it through device memory the communicator
 * lends ("signal-wait-copied"), with one WARN naming the reason and the fix. In place and
 * out of place, results checked. */
static void managed_goes_through_lent_memory(fcclComm_t comm) {
  const size_t c = 1000;
  CUdeviceptr m = 0;
  float h[2000], w[1000];
  size_t i;
  int k;
  const int copies = g_mps || g_rank != 0;
  if (cu.MemAllocManaged(&m, 2 * c * sizeof(float), 1 /* CU_MEM_ATTACH_GLOBAL */) != 0) {
    CHECK(0, "cuMemAllocManaged failed");
    return;
  }
  for (i = 0; i < c; i++) w[i] = (float)(1000 * g_n * (g_n - 1) / 2) + (float)g_n * (float)i;
  for (k = 0; k < 2; k++) {
    /* k = 0 in place, k = 1 out of place (into the second half). */
    float* d = (float*)(size_t)m;
    const char* b = "?";
    const char* a = "?";
    for (i = 0; i < 2 * c; i++) h[i] = i < c ? in(g_rank, i) : -1.0f;
    put_floats(d, h, 2 * c);
    OK(fcclAllReduce(d, k ? d + c : d, c, fcclFloat32, fcclSum, comm, NULL));
    path_is(comm, "all_reduce of managed memory", "ipc");
    OK(fcclCommGetLastPath(comm, &b, &a));
    /* Under MPS every rank moves its share and names that; the WARN tells of the copies. */
    if (!g_mps && g_rank != 0 && b && a)
      CHECK(strcmp(a, "signal-wait-copied") == 0, "all_reduce of managed memory: algorithm %s", a);
    get_floats(h, d, 2 * c);
    expect(k ? "all_reduce of managed memory, out of place" : "all_reduce of managed memory, in place",
           k ? h + c : h, w, c);
    if (k) {
      /* The input stays as it was. */
      for (i = 0; i < c; i++) w[i] = in(g_rank, i);
      expect("the input of an all_reduce of managed memory", h, w, c);
    }
  }
  {
    /* Per-rank counts with gaps in the receive buffer: the gaps keep what they held. */
    float* d = (float*)(size_t)m;
    size_t counts[64], displs[64];
    int q;
    for (q = 0; q < g_n && q < 64; q++) {
      counts[q] = 4;
      displs[q] = (size_t)q * 6;
    }
    for (i = 0; i < 2 * c; i++) h[i] = i < 4 ? in(g_rank, i) : -1.0f;
    put_floats(d, h, 2 * c);
    OK(fcclAllGatherV(d, 4, d + c, counts, displs, fcclFloat32, comm, NULL));
    path_is(comm, "all_gather_v of managed memory", "ipc");
    get_floats(h, d, 2 * c);
    for (i = 0; i < (size_t)g_n * 6; i++) {
      float want = i % 6 < 4 ? in((int)(i / 6), i % 6) : -1.0f;
      if (h[c + i] != want) {
        CHECK(0, "all_gather_v of managed memory: element %zu is %g, expected %g", i, (double)h[c + i], (double)want);
        break;
      }
    }
  }
  if (copies) {
    CHECK(log_count("stays GPU to GPU, but its buffer") >= 1, "no WARN about the lent memory in %s", g_log);
    CHECK(log_count("cuMemCreate") == 1, "the WARN names the fix once per communicator (%d lines in %s)",
          log_count("cuMemCreate"), g_log);
  }
  CHECK(log_count("goes through host staging") == 0, "managed memory was staged (%s)", g_log);
  cu.MemFree(m);
}

int main(void) {
  const char* why;
  fcclComm_t comm = NULL;
  const char* b = "?";
  const char* a = "?";
  snprintf(g_log, sizeof g_log, "/tmp/fccl-test-path-%d.log", (int)getpid());
  unlink(g_log);
  setenv("FERROCCL_DEBUG_FILE", g_log, 1);
  if ((why = fccl_cu_load(RTLD_LOCAL, FCCL_CU_BASE | FCCL_CU_MANAGED)) || (why = fccl_cu_device0(NULL)))
    return skip(why);
  if (!getenv("FERROCCL_RANK")) {
    printf("skipped: start it with ferroccl-run -n N (N >= 2)\n");
    return 77;
  }
  OK(fcclCommInitFromEnv(&comm));
  if (failures) return 1;
  OK(fcclCommUserRank(comm, &g_rank));
  OK(fcclCommCount(comm, &g_n));
  {
    /* FERROCCL_CUDA_IPC=0 stages every device call on purpose (the suite also runs so). */
    const char* ipc = getenv("FERROCCL_CUDA_IPC");
    int off = ipc && (strcmp(ipc, "0") == 0 || strcmp(ipc, "off") == 0);
    g_want = getenv("FCCL_TEST_BACKEND") ? getenv("FCCL_TEST_BACKEND") : off ? "staged" : "ipc";
    g_mps = getenv("FERROCCL_CUDA_MPS") && strcmp(getenv("FERROCCL_CUDA_MPS"), "1") == 0;
  }

  CHECK(fcclCommGetLastPath(NULL, &b, &a) == fcclInvalidArgument, "a NULL comm must be fcclInvalidArgument");
  OK(fcclCommGetLastPath(comm, NULL, NULL));
  OK(fcclCommGetLastPath(comm, &b, &a));
  CHECK(strcmp(b, "none") == 0 && strcmp(a, "none") == 0, "before any call: %s/%s, expected none/none", b, a);
  {
    float x[4] = {1, 2, 3, 4};
    OK(fcclAllReduce(x, x, 4, fcclFloat32, fcclSum, comm, NULL));
    path_is(comm, "all_reduce of host memory", "host");
  }
  device_calls(comm);
  if (strcmp(g_want, "ipc") == 0) managed_goes_through_lent_memory(comm);
  {
    fcclComm_t sub = NULL;
    int rank = g_rank, n = g_n, out = n >= 4 && rank == n - 1;
    OK(fcclCommSplit(comm, out ? FCCL_SPLIT_NOCOLOR : 0, n - rank, &sub, NULL));
    if (!out && sub) {
      OK(fcclCommUserRank(sub, &g_rank));
      OK(fcclCommCount(sub, &g_n));
      CHECK(g_n == (n >= 4 ? n - 1 : n) && g_rank == g_n - 1 - rank, "split: rank %d of %d, expected %d of %d", g_rank,
            g_n, (n >= 4 ? n - 1 : n) - 1 - rank, n >= 4 ? n - 1 : n);
      if (g_rank == 0) printf("path: the same calls on a child of fcclCommSplit (%d ranks)\n", g_n);
      device_calls(sub);
      g_rank = rank;
      g_n = n;
    }
    CHECK(out ? sub == NULL : sub != NULL, "split: rank %d got %s communicator", rank, sub ? "a" : "no");
    if (sub) OK(fcclCommDestroy(sub));
  }
  OK(fcclCommDestroy(comm));
  if (failures) {
    fprintf(stderr, "rank %d: %d failures (log: %s)\n", g_rank, failures, g_log);
    return 1;
  }
  unlink(g_log);
  printf("rank %d/%d: every device call was served by %s\n", g_rank, g_n, g_want);
  return 0;
}
