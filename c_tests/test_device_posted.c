/* Device collectives with FERROCCL_CHECK=0 (or checkMode unset: .default) on ranks
 * sharing one GPU: after the first call on device memory, which every rank agrees on,
 * the ranks post their descriptors and only the proxy thread of the executor (rank 0)
 * reads them (with FERROCCL_CUDA_MPS=1 every rank's proxy thread, each enqueuing its
 * rank's share), so no rank's calling thread waits on the host for another rank.
 *
 *   0. one rank has checkMode on (fcclConfig_t): no rank posts, every call is agreed
 *      (one host exchange on every rank) and right.
 *   1. posted calls give the right results: all_reduce, all_gather and all_to_allv on
 *      device memory, over buffers that repeat and buffers freed and allocated again
 *      (the executor maps the new ones from the posts); all_gather_v on host memory of
 *      every rank, then of rank 1 alone (through device memory the communicator lends:
 *      the results are in the host buffer when the call returns). Each says backend
 *      "ipc" (rank 0: algorithm exec-proxy; under MPS every rank: mps-proxy);
 *      fcclCommGetLastExchanges says 0 on every rank.
 *   2. ranks that call different counts: every call returned before a proxy thread
 *      compared them, so the communicator fails: on every
 *      rank the streams finish (nothing hangs), fcclCommGetAsyncError comes to
 *      fcclCollectiveMismatch with a message naming the counts, FERROCCL_CHECK=1 and the
 *      failure, no receive buffer was written, and the next call fails.
 *   3. rank 1's stream is being captured into a CUDA graph: rank 1 returns
 *      fcclInvalidUsage, and every rank's communicator fails with an error that names the
 *      capture (fcclInvalidUsage).
 *   4. every rank's stream is being captured: every rank returns fcclInvalidUsage at once
 *      and the communicator stays usable (nothing was enqueued anywhere).
 *   5. (checkMode unset) calls the path takes on host memory (all_gather_v) stay agreed
 *      and go through the host until a call on device memory; after it the ranks post.
 * Each case runs on a communicator of its own. Start with
 * ferroccl-run -n N (N >= 2) and FERROCCL_CHECK=0 or unset; exits 77 without a driver or
 * device. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_driver.h"
#include "ferroccl.h"

static int failures, g_rank, g_n, g_mps;

#include "rank_check.h"

#define C 1000
#define SENTINEL (-7.0f)

static float* dev_alloc(size_t n) {
  void* p = NULL;
  OK(fcclMemAlloc(&p, n * sizeof(float)));
  return (float*)p;
}
static float in(int r, size_t i, int round) { return (float)(r * 100000 + (int)i + round * 7); }

static int expect(const char* what, int round, const float* got, const float* want, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (got[i] != want[i]) {
      CHECK(0, "%s, round %d: element %zu is %g, expected %g", what, round, i, (double)got[i], (double)want[i]);
      return 0;
    }
  }
  return 1;
}

/* A new communicator of the same ranks, through its own unique id; `checked`: this rank
 * sets checkMode on in its config; otherwise off, or left unset when FERROCCL_CHECK is
 * (test_device_posted.default: posting from the first call on device memory). */
static fcclComm_t fresh_with(fcclComm_t comm, int checked) {
  fcclUniqueId id;
  fcclComm_t sub = NULL;
  fcclConfig_t cfg = FCCL_CONFIG_INITIALIZER;
  memset(&id, 0, sizeof id);
  if (g_rank == 0) OK(fcclGetUniqueId(&id));
  OK(fcclBroadcast(&id, &id, sizeof id, fcclUint8, 0, comm, NULL));
  if (checked || getenv("FERROCCL_CHECK")) cfg.checkMode = checked ? FCCL_CHECK_FINGERPRINT : FCCL_CHECK_OFF;
  OK(fcclCommInitRankConfig(&sub, g_n, id, g_rank, &cfg));
  return sub;
}
static fcclComm_t fresh(fcclComm_t comm) { return fresh_with(comm, 0); }

/* 0. One rank with checkMode on: nobody posts, every call is agreed (1 exchange on
 * every rank) and right. */
static void one_rank_checks(fcclComm_t comm) {
  float* s = dev_alloc(C);
  float* d = dev_alloc(C);
  float* h = malloc(C * sizeof(float));
  float* w = malloc(C * sizeof(float));
  for (int round = 0; round < 4; round++) {
    const char* b = "?";
    const char* a = "?";
    int x = -1;
    for (size_t i = 0; i < C; i++) h[i] = in(g_rank, i, round);
    put_floats(s, h, C);
    OK(fcclAllReduce(s, d, C, fcclFloat32, fcclSum, comm, NULL));
    OK(fcclCommGetLastPath(comm, &b, &a));
    OK(fcclCommGetLastExchanges(comm, &x));
    CHECK(strcmp(b, "ipc") == 0, "one rank checking, round %d: served by %s/%s, not ipc", round, b, a);
    CHECK(x == 1, "one rank checking, round %d: %d host exchanges on rank %d, expected 1 (agreed, not posted)",
          round, x, g_rank);
    get_floats(h, d, C);
    for (size_t i = 0; i < C; i++) {
      w[i] = 0;
      for (int q = 0; q < g_n; q++) w[i] += in(q, i, round);
    }
    expect("all_reduce, one rank checking", round, h, w, C);
  }
  OK(fcclMemFree(s));
  OK(fcclMemFree(d));
  free(h), free(w);
}

/* Served GPU to GPU, with the exchanges of a posted call. */
static void posted(fcclComm_t comm, const char* what, int round) {
  const char* b = "?";
  const char* a = "?";
  int x = -1;
  OK(fcclCommGetLastPath(comm, &b, &a));
  OK(fcclCommGetLastExchanges(comm, &x));
  CHECK(strcmp(b, "ipc") == 0, "%s, round %d: served by %s/%s, not ipc", what, round, b, a);
  CHECK(x == 0, "%s, round %d: %d host exchanges on rank %d, expected none", what, round, x, g_rank);
  if (g_mps && strcmp(b, "ipc") == 0)
    CHECK(strcmp(a, "mps-proxy") == 0, "%s, round %d: rank %d's algorithm %s under MPS, expected mps-proxy", what,
          round, g_rank, a);
  else if (g_rank == 0 && strcmp(b, "ipc") == 0)
    CHECK(strcmp(a, "exec-proxy") == 0, "%s, round %d: rank 0's algorithm %s, expected exec-proxy", what, round, a);
}

/* 5. checkMode unset: calls the GPU-to-GPU path takes on host memory (all_gather_v, as
 * per-rank counts are agreed there) stay agreed (through the host, one exchange or more) until a
 * call passes device memory on every rank; that one is agreed too, and from the next
 * call on the ranks post (host memory then goes through lent device memory). */
static void unset_waits_for_device(fcclComm_t comm) {
  const size_t all = (size_t)C * g_n;
  float* d = dev_alloc(all);
  float* hs = malloc(C * sizeof(float));
  float* hr = malloc(all * sizeof(float));
  size_t* counts = calloc((size_t)g_n, sizeof(size_t));
  size_t* displs = calloc((size_t)g_n, sizeof(size_t));
  int x = -1;
  for (int q = 0; q < g_n; q++) counts[q] = C, displs[q] = (size_t)q * C;
  for (int round = 0; round < 5; round++) {
    /* Rounds 0-1: before any device call; then the first device call (round 2, agreed)
     * and rounds 2-4 once posting. */
    const char* b = "?";
    const char* a = "?";
    if (round == 2) {
      OK(fcclAllReduce(d, d, C, fcclFloat32, fcclSum, comm, NULL));
      OK(fcclCommGetLastExchanges(comm, &x));
      CHECK(x == 1, "checkMode unset, the first device call: %d host exchanges on rank %d, expected 1 (agreed)", x,
            g_rank);
    }
    for (size_t i = 0; i < C; i++) hs[i] = in(g_rank, i, round);
    OK(fcclAllGatherV(hs, C, hr, counts, displs, fcclFloat32, comm, NULL));
    OK(fcclCommGetLastPath(comm, &b, &a));
    OK(fcclCommGetLastExchanges(comm, &x));
    if (round < 2)
      CHECK(strcmp(b, "ipc") != 0 && x >= 1,
            "checkMode unset, all_gather_v on host memory before any device call, round %d: served by %s/%s with %d "
            "exchanges on rank %d; expected agreed and served through the host, not posted",
            round, b, a, x, g_rank);
    else
      posted(comm, "checkMode unset, all_gather_v on host memory after a device call", round);
    for (size_t i = 0; i < all; i++) {
      float w = in((int)(i / C), i % C, round);
      if (hr[i] != w) {
        CHECK(0, "checkMode unset, all_gather_v round %d: element %zu is %g, expected %g", round, i, (double)hr[i],
              (double)w);
        break;
      }
    }
  }
  OK(fcclMemFree(d));
  free(hs), free(hr), free(counts), free(displs);
}

/* 1. Results of posted calls over repeated, renewed and host buffers. */
static void results(fcclComm_t comm) {
  const int r = g_rank, n = g_n;
  const size_t all = (size_t)C * n;
  float* h = malloc(all * sizeof(float));
  float* w = malloc(all * sizeof(float));
  float* hs = malloc(all * sizeof(float));
  float* hr = malloc(all * sizeof(float));
  size_t* counts = calloc((size_t)n, sizeof(size_t));
  size_t* displs = calloc((size_t)n, sizeof(size_t));
  size_t* sc = calloc((size_t)n, sizeof(size_t));
  size_t* sd = calloc((size_t)n, sizeof(size_t));
  size_t* rc = calloc((size_t)n, sizeof(size_t));
  size_t* rd = calloc((size_t)n, sizeof(size_t));
  float *s = NULL, *d = NULL;
  size_t at = 0;
  for (int q = 0; q < n; q++) {
    counts[q] = (size_t)(q % 3 + 1) * 50; /* rank q's block of all_gather_v */
    displs[q] = at;
    at += counts[q];
  }
  /* all_to_allv: rank p sends p + q + 1 elements to q. */
  for (int q = 0, so = 0, ro = 0; q < n; q++) {
    sc[q] = (size_t)(r + q + 1);
    sd[q] = (size_t)so;
    so += (int)sc[q];
    rc[q] = (size_t)(q + r + 1);
    rd[q] = (size_t)ro;
    ro += (int)rc[q];
  }
  /* The first call is agreed on (every rank learns that every rank posts from then on). */
  s = dev_alloc(all);
  d = dev_alloc(all);
  OK(fcclAllReduce(s, d, C, fcclFloat32, fcclSum, comm, NULL));
  for (int round = 0; round < 12; round++) {
    if (round % 4 == 3) {
      /* New buffers: the old ones go first, so the allocator may hand the same
       * addresses back as other allocations. */
      CHECK(cu.CtxSynchronize() == 0, "cuCtxSynchronize failed");
      OK(fcclMemFree(s));
      OK(fcclMemFree(d));
      s = dev_alloc(all + (size_t)round);
      d = dev_alloc(all + (size_t)round);
    }
    for (size_t i = 0; i < C; i++) h[i] = in(r, i, round);
    put_floats(s, h, C);
    OK(fcclAllReduce(s, d, C, fcclFloat32, fcclSum, comm, NULL));
    posted(comm, "all_reduce", round);
    get_floats(h, d, C);
    for (size_t i = 0; i < C; i++) {
      float v = 0;
      for (int q = 0; q < n; q++) v += in(q, i, round);
      w[i] = v;
    }
    expect("all_reduce", round, h, w, C);

    for (size_t i = 0; i < C; i++) h[i] = in(r, i, round);
    put_floats(s, h, C);
    OK(fcclAllGather(s, d, C, fcclFloat32, comm, NULL));
    posted(comm, "all_gather", round);
    get_floats(h, d, all);
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < C; i++) w[(size_t)q * C + i] = in(q, i, round);
    expect("all_gather", round, h, w, all);

    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < sc[q]; i++) h[sd[q] + i] = in(r, (size_t)q * 1000 + i, round);
    put_floats(s, h, sd[n - 1] + sc[n - 1]);
    OK(fcclAlltoAllv(s, sc, sd, d, rc, rd, fcclFloat32, comm, NULL));
    posted(comm, "all_to_allv", round);
    get_floats(h, d, rd[n - 1] + rc[n - 1]);
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < rc[q]; i++) w[rd[q] + i] = in(q, (size_t)r * 1000 + i, round);
    expect("all_to_allv", round, h, w, rd[n - 1] + rc[n - 1]);

    /* Host memory: every rank's (rounds 0-5), then rank 1's alone. */
    {
      int host = round < 6 || r == 1;
      float* src = host ? hs : s;
      float* dst = host ? hr : d;
      for (size_t i = 0; i < counts[r]; i++) hs[i] = in(r, i, round);
      for (size_t i = 0; i < at; i++) hr[i] = SENTINEL;
      if (!host) {
        put_floats(s, hs, counts[r]);
        put_floats(d, hr, at);
      }
      OK(fcclAllGatherV(src, counts[r], dst, counts, displs, fcclFloat32, comm, NULL));
      posted(comm, host ? "all_gather_v of host memory" : "all_gather_v", round);
      /* Host memory holds the results when the call returns: no synchronisation. */
      if (!host) get_floats(hr, d, at);
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < counts[q]; i++) w[displs[q] + i] = in(q, i, round);
      expect(host ? "all_gather_v of host memory" : "all_gather_v", round, hr, w, at);
    }
  }
  CHECK(cu.CtxSynchronize() == 0, "cuCtxSynchronize failed");
  OK(fcclMemFree(s));
  OK(fcclMemFree(d));
  free(h), free(w), free(hs), free(hr), free(counts), free(displs), free(sc), free(sd), free(rc), free(rd);
}

/* Polls fcclCommGetAsyncError until it is an error (at most 60 s); the error. */
static fcclResult_t async_error(fcclComm_t comm) {
  fcclResult_t e = fcclSuccess;
  for (int i = 0; i < 60000; i++) {
    if (fcclCommGetAsyncError(comm, &e) != fcclSuccess) return fcclInternalError;
    if (e != fcclSuccess && e != fcclInProgress) return e;
    struct timespec t = {0, 1000000};
    nanosleep(&t, NULL);
  }
  return e;
}

/* Every rank's communicator fails with `want`, its message naming each of `names`;
 * the streams finished; the next call fails. */
static void fails_everywhere(fcclComm_t comm, const char* what, fcclResult_t want, const char* const* names) {
  fcclResult_t e;
  const char* m;
  float* x = dev_alloc(4);
  CHECK(cu.CtxSynchronize() == 0, "%s: the streams must finish once the communicator failed", what);
  e = async_error(comm);
  m = fcclGetLastError(comm);
  CHECK(e == want, "%s: fcclCommGetAsyncError came to %d (%s), expected %d", what, (int)e, m ? m : "", (int)want);
  for (; *names; names++)
    CHECK(m && strstr(m, *names), "%s: the error must name \"%s\": %s", what, *names, m ? m : "(null)");
  CHECK(fcclAllReduce(x, x, 4, fcclFloat32, fcclSum, comm, NULL) != fcclSuccess,
        "%s: a call after the failure succeeded", what);
  OK(fcclMemFree(x));
}

/* 2. Different counts. */
static void mismatch(fcclComm_t comm) {
  float* s = dev_alloc(2 * C);
  float* d = dev_alloc(2 * C);
  float* h = malloc(2 * C * sizeof(float));
  fcclResult_t res;
  const char* const names[] = {"different collectives", "FERROCCL_CHECK=1", "communicator", NULL};
  OK(fcclAllReduce(s, d, C, fcclFloat32, fcclSum, comm, NULL)); /* agreed */
  OK(fcclAllReduce(s, d, C, fcclFloat32, fcclSum, comm, NULL)); /* posted */
  for (size_t i = 0; i < 2 * C; i++) h[i] = SENTINEL;
  put_floats(d, h, 2 * C);
  res = fcclAllReduce(s, d, g_rank == 1 ? C + 1 : C, fcclFloat32, fcclSum, comm, NULL);
  CHECK(res == fcclSuccess || res == fcclCollectiveMismatch, "rank %d's mismatched call returned %d (%s)", g_rank,
        (int)res, fcclGetLastError(NULL));
  fails_everywhere(comm, "mismatched counts", fcclCollectiveMismatch, names);
  get_floats(h, d, 2 * C);
  for (size_t i = 0; i < 2 * C; i++)
    if (h[i] != SENTINEL) {
      CHECK(0, "mismatched counts: element %zu of the receive buffer was written (%g)", i, (double)h[i]);
      break;
    }
  OK(fcclMemFree(s));
  OK(fcclMemFree(d));
  free(h);
}

/* 3 and 4. Capture on rank 1 only, or on every rank. */
static void capture(fcclComm_t comm, int everyone) {
  CUstream st = NULL;
  CUgraph g = NULL;
  float* s = dev_alloc(C);
  float* d = dev_alloc(C);
  int mine = everyone || g_rank == 1;
  fcclResult_t res;
  CHECK(cu.StreamCreate(&st, CU_STREAM_NON_BLOCKING) == 0, "cuStreamCreate");
  OK(fcclAllReduce(s, d, C, fcclFloat32, fcclSum, comm, st)); /* agreed */
  OK(fcclAllReduce(s, d, C, fcclFloat32, fcclSum, comm, st)); /* posted */
  CHECK(cu.StreamSynchronize(st) == 0, "cuStreamSynchronize");
  if (mine) CHECK(cu.StreamBeginCapture(st, 1 /* THREAD_LOCAL */) == 0, "cuStreamBeginCapture");
  res = fcclAllReduce(s, d, C, fcclFloat32, fcclSum, comm, st);
  if (mine) {
    CHECK(cu.StreamEndCapture(st, &g) == 0, "cuStreamEndCapture");
    if (g) cu.GraphDestroy(g);
  }
  if (everyone || g_rank == 1)
    CHECK(res == fcclInvalidUsage, "%s: rank %d's call returned %d (%s), expected fcclInvalidUsage",
          everyone ? "every rank capturing" : "rank 1 capturing", g_rank, (int)res, fcclGetLastError(NULL));
  if (everyone) {
    float* h = malloc(C * sizeof(float));
    float* w = malloc(C * sizeof(float));
    for (size_t i = 0; i < C; i++) h[i] = in(g_rank, i, 3);
    put_floats(s, h, C);
    OK(fcclAllReduce(s, d, C, fcclFloat32, fcclSum, comm, st));
    posted(comm, "all_reduce after every rank's capture", 0);
    get_floats(h, d, C);
    for (size_t i = 0; i < C; i++) {
      w[i] = 0;
      for (int q = 0; q < g_n; q++) w[i] += in(q, i, 3);
    }
    expect("all_reduce after every rank's capture", 0, h, w, C);
    free(h), free(w);
  } else {
    const char* const names[] = {"captured into a CUDA graph", "FERROCCL_CHECK=1", NULL};
    fails_everywhere(comm, "rank 1 capturing", fcclInvalidUsage, names);
  }
  CHECK(cu.StreamDestroy(st) == 0, "cuStreamDestroy");
  OK(fcclMemFree(s));
  OK(fcclMemFree(d));
}

int main(void) {
  const char* why;
  const char* check = getenv("FERROCCL_CHECK");
  fcclComm_t comm = NULL, sub = NULL;
  if ((why = fccl_cu_load(RTLD_LOCAL, FCCL_CU_BASE | FCCL_CU_STREAM | FCCL_CU_GRAPH)) ||
      (why = fccl_cu_device0(NULL))) {
    printf("skipped: no CUDA driver/GPU (%s)\n", why);
    return 77;
  }
  {
    /* With the GPU-to-GPU path off every call is staged and agreed: nothing to test. */
    const char* ipc = getenv("FERROCCL_CUDA_IPC");
    if (ipc && (strcmp(ipc, "0") == 0 || strcmp(ipc, "off") == 0)) {
      printf("skipped: FERROCCL_CUDA_IPC=%s turns off the GPU-to-GPU path this test is about\n", ipc);
      return 77;
    }
  }
  if (!getenv("FERROCCL_RANK") || (check && strcmp(check, "0") != 0)) {
    printf("skipped: start it with ferroccl-run -n N (N >= 2) and FERROCCL_CHECK=0 or unset\n");
    return 77;
  }
  {
    const char* mps = getenv("FERROCCL_CUDA_MPS");
    g_mps = mps && strcmp(mps, "1") == 0;
  }
  OK(fcclCommInitFromEnv(&comm));
  if (failures) return 1;
  OK(fcclCommUserRank(comm, &g_rank));
  OK(fcclCommCount(comm, &g_n));
  if (g_n < 2) {
    printf("skipped: one rank posts to no one\n");
    return 77;
  }
  sub = fresh_with(comm, g_rank == g_n - 1);
  one_rank_checks(sub);
  OK(fcclCommDestroy(sub));
  if (g_rank == 0) printf("posted calls: none while one rank has checkMode on\n");
  sub = fresh(comm);
  results(sub);
  OK(fcclCommDestroy(sub));
  if (g_rank == 0) printf("posted calls: right results over repeated, new and host buffers\n");
  sub = fresh(comm);
  mismatch(sub);
  OK(fcclCommAbort(sub));
  if (g_rank == 0) printf("posted calls: different counts fail the communicator on every rank\n");
  sub = fresh(comm);
  capture(sub, 0);
  OK(fcclCommAbort(sub));
  if (g_rank == 0) printf("posted calls: one rank's capture fails the communicator on every rank\n");
  sub = fresh(comm);
  capture(sub, 1);
  OK(fcclCommDestroy(sub));
  if (g_rank == 0) printf("posted calls: every rank's capture refused alike, the communicator goes on\n");
  if (!check) {
    sub = fresh(comm);
    unset_waits_for_device(sub);
    OK(fcclCommDestroy(sub));
    if (g_rank == 0) printf("checkMode unset: host calls agreed until a call on device memory, then posted\n");
  }
  OK(fcclCommDestroy(comm));
  if (failures) {
    fprintf(stderr, "rank %d: %d failures\n", g_rank, failures);
    return 1;
  }
  printf("rank %d/%d: posted device calls passed\n", g_rank, g_n);
  return 0;
}
