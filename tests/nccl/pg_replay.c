/*
 * PyTorch's ProcessGroupNCCL, replayed as plain NCCL calls (tests/nccl/run.sh): what
 * a training job's process group asks of libnccl.so.2.
 *
 *   pg_replay --threads N [--nonblocking] [--device]      N ranks as threads of this process
 *   ferroccl-run -n N pg_replay [--nonblocking] [--device] one rank per process
 *
 * Buffers are host memory, or with --device CUDA memory on device 0 (every rank on the
 * one GPU, as torchrun on a one-GPU machine), each rank's calls on a non-blocking stream
 * of its own as ProcessGroupNCCL's; exit 77 there without a CUDA driver or device.
 *
 * Each rank: ncclCommInitRankConfig with a config (blocking, or non-blocking polled as
 * TORCH_NCCL_USE_COMM_NONBLOCKING does), a watchdog thread polling
 * ncclCommGetAsyncError the whole time (ProcessGroupNCCL's watchdog), ncclCommSplit
 * into even and odd ranks (new_group), a batch of ncclSend/ncclRecv to every peer in
 * one group (batch_isend_irecv, all_to_all), ReduceOp.PREMUL_SUM all_reduce and
 * reduce_scatter (ncclRedOpCreatePreMulSum, the collective, ncclRedOpDestroy right
 * after it, as ProcessGroupNCCL's RAII does), then a hang that the watchdog ends: the
 * last rank skips an all_reduce, and every rank's watchdog calls ncclCommAbort after a
 * deadline, which must return the blocked call. Processes sharing the GPU (--device
 * under ferroccl-run) post their device calls as NCCL enqueues them, unless
 * FERROCCL_CHECK is set to other than 0: there the skipped all_reduce returns at once,
 * as NCCL's does, and the abort must release the stream that waits for it. Exit 0 when
 * every check passed.
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"

#define M 19


static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ProcessGroupNCCL's watchdog: polls the communicator's asynchronous error; after
 * `deadline` (0: none) it aborts the communicator, as on a collective timeout. */
struct watchdog {
  ncclComm_t comm;
  int rank, stop, polls, errors;
  double deadline;
  pthread_mutex_t mu;
};

static void* watchdog_main(void* p) {
  struct watchdog* w = p;
  for (;;) {
    ncclResult_t st = ncclSuccess;
    double deadline;
    int stop;
    pthread_mutex_lock(&w->mu);
    stop = w->stop;
    deadline = w->deadline;
    pthread_mutex_unlock(&w->mu);
    if (stop) return NULL;
    if (deadline > 0 && now() > deadline) {
      ncclResult_t r = ncclCommAbort(w->comm);
      CHECK(w->rank, r == ncclSuccess, "watchdog's ncclCommAbort: %s", ncclGetErrorString(r));
      return NULL;
    }
    /* Before the hang, every poll must find the communicator healthy. */
    if (deadline == 0 &&
        (ncclCommGetAsyncError(w->comm, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)))
      w->errors++;
    w->polls++;
    {
      struct timespec ms = {0, 1000000};
      nanosleep(&ms, NULL);
    }
  }
}

/* --device: buffers in device memory, each rank's calls on its own stream. */
static int g_device = 0;
/* Device calls of processes sharing the GPU, not agreed on the host (NCCL's contract). */
static int g_posted = 0;

/* `bytes` at `host` where the calls read them: the same memory, or with --device a
 * copy in device memory (freed with unplace). */
static void* place(int rank, const void* host, size_t bytes) {
  CUdeviceptr d = 0;
  if (!g_device) return (void*)host;
  CU(rank, cuMemAlloc(&d, bytes));
  CU(rank, cuMemcpyHtoD(d, host, bytes));
  return (void*)(uintptr_t)d;
}

/* The calls' results in `placed` back at `host`, once `stream` has run them. */
static void fetch(int rank, void* host, const void* placed, size_t bytes, void* stream) {
  if (!g_device) return;
  CU(rank, cuStreamSynchronize(stream));
  CU(rank, cuMemcpyDtoH(host, (CUdeviceptr)(uintptr_t)placed, bytes));
}

static void unplace(int rank, void* placed) {
  if (g_device) CU(rank, cuMemFree((CUdeviceptr)(uintptr_t)placed));
}

static void rank_main(ncclUniqueId id, int rank, int n, int blocking) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclComm_t comm = NULL, sub = NULL;
  struct watchdog w;
  pthread_t wt;
  char name[32];
  int32_t send[64 * M], recv[64 * M];
  float fs[64 * M], fr[64 * M];
  int p, i;
  void *ctx = NULL, *st = NULL;
  int32_t *dsend, *drecv;
  float *dfs, *dfr;

  if (g_device) {
    /* ProcessGroupNCCL's own stream: non-blocking (CU_STREAM_NON_BLOCKING). */
    CU(rank, cuDevicePrimaryCtxRetain(&ctx, 0));
    CU(rank, cuCtxSetCurrent(ctx));
    CU(rank, cuStreamCreate(&st, 1u));
  }
  snprintf(name, sizeof name, "pg-%d", rank);
  cfg.blocking = blocking;
  cfg.commName = name;
  cfg.splitShare = 0; /* set by ProcessGroupNCCL (TORCH_NCCL_SPLIT_SHARE); ignored here */
  cfg.cgaClusterSize = 2;
  DO(rank, comm, ncclCommInitRankConfig(&comm, n, id, rank, &cfg));
  if (comm == NULL) return;

  memset(&w, 0, sizeof w);
  w.comm = comm;
  w.rank = rank;
  pthread_mutex_init(&w.mu, NULL);
  pthread_create(&wt, NULL, watchdog_main, &w);

  /* new_group: even and odd ranks; the child inherits the parent's config. */
  {
    ncclConfig_t scfg = NCCL_CONFIG_INITIALIZER;
    int cnt = 0, x = rank + 1, y = 0, want = 0;
    int32_t *dx, *dy;
    scfg.blocking = blocking;
    scfg.commName = "pg-split";
    DO(rank, sub, ncclCommSplit(comm, rank % 2, rank, &sub, &scfg));
    if (sub != NULL) {
      DO(rank, sub, ncclCommCount(sub, &cnt));
      CHECK(rank, cnt == (n - rank % 2 + 1) / 2, "split size %d", cnt);
      dx = place(rank, &x, sizeof x);
      dy = place(rank, &y, sizeof y);
      DO(rank, sub, ncclAllReduce(dx, dy, 1, ncclInt32, ncclSum, sub, st));
      fetch(rank, &y, dy, sizeof y, st);
      unplace(rank, dx);
      unplace(rank, dy);
      for (p = rank % 2; p < n; p += 2) want += p + 1;
      CHECK(rank, y == want, "all_reduce on the split: %d, want %d", y, want);
    }
  }

  /* batch_isend_irecv / all_to_all: a send to and a receive from every peer, one group. */
  for (p = 0; p < n; p++)
    for (i = 0; i < M; i++) send[p * M + i] = rank * 1000 + p * 10 + i;
  memset(recv, 0, sizeof recv);
  dsend = place(rank, send, sizeof send);
  drecv = place(rank, recv, sizeof recv);
  DO(rank, comm, ncclGroupStart());
  for (p = 0; p < n; p++) {
    DO(rank, comm, ncclSend(dsend + p * M, M, ncclInt32, p, comm, st));
    DO(rank, comm, ncclRecv(drecv + p * M, M, ncclInt32, p, comm, st));
  }
  DO(rank, comm, ncclGroupEnd());
  fetch(rank, recv, drecv, sizeof recv, st);
  for (p = 0; p < n; p++)
    for (i = 0; i < M; i++)
      CHECK(rank, recv[p * M + i] == p * 1000 + rank * 10 + i, "p2p from %d element %d: %d", p, i,
            (int)recv[p * M + i]);

  /* ReduceOp.PREMUL_SUM: a Python float factor (host immediate), then a tensor factor
   * (ncclScalarDevice; in device memory with --device, a host pointer otherwise). The
   * operator is destroyed right after the call is issued. */
  {
    ncclRedOp_t op = ncclSum;
    float factor = 1.0f / (float)n;
    for (i = 0; i < M; i++) fs[i] = (float)(n * (rank + 1) * (i + 1));
    dfs = place(rank, fs, sizeof fs);
    dfr = place(rank, fr, sizeof fr);
    DO(rank, comm, ncclRedOpCreatePreMulSum(&op, &factor, ncclFloat, ncclScalarHostImmediate, comm));
    DO(rank, comm, ncclAllReduce(dfs, dfr, M, ncclFloat, op, comm, st));
    DO(rank, comm, ncclRedOpDestroy(op, comm));
    fetch(rank, fr, dfr, sizeof fr, st);
    unplace(rank, dfs);
    unplace(rank, dfr);
    for (i = 0; i < M; i++) {
      float want = 0;
      for (p = 0; p < n; p++) want += (float)((p + 1) * (i + 1));
      CHECK(rank, fr[i] == want, "PREMUL_SUM 1/n all_reduce element %d: %g, want %g", i, fr[i], want);
    }
  }
  {
    ncclRedOp_t op = ncclSum;
    float factor = 3.0f, *dfactor;
    for (p = 0; p < n; p++)
      for (i = 0; i < M; i++) fs[p * M + i] = (float)(p - rank);
    dfs = place(rank, fs, sizeof fs);
    dfr = place(rank, fr, sizeof fr);
    dfactor = place(rank, &factor, sizeof factor);
    DO(rank, comm, ncclRedOpCreatePreMulSum(&op, dfactor, ncclFloat, ncclScalarDevice, comm));
    DO(rank, comm, ncclGroupStart());
    DO(rank, comm, ncclReduceScatter(dfs, dfr, M, ncclFloat, op, comm, st));
    DO(rank, comm, ncclGroupEnd());
    DO(rank, comm, ncclRedOpDestroy(op, comm));
    fetch(rank, fr, dfr, sizeof fr, st);
    unplace(rank, dfs);
    unplace(rank, dfr);
    unplace(rank, dfactor);
    for (i = 0; i < M; i++) {
      float want = 0;
      for (p = 0; p < n; p++) want += 3.0f * (float)(rank - p);
      CHECK(rank, fr[i] == want, "PREMUL_SUM 3 reduce_scatter element %d: %g, want %g", i, fr[i], want);
    }
  }
  if (sub != NULL) DO(rank, sub, ncclCommAbort(sub));

  /* The hang: the last rank never joins; every watchdog aborts at the deadline. */
  {
    double t0 = now();
    pthread_mutex_lock(&w.mu);
    w.deadline = t0 + 0.3;
    pthread_mutex_unlock(&w.mu);
    if (rank != n - 1) {
      ncclResult_t r = ncclAllReduce(dsend, drecv, M, ncclInt32, ncclSum, comm, st);
      if (g_posted) {
        CHECK(rank, r == ncclSuccess || r == ncclInProgress, "the posted all_reduce the last rank skipped: %d (%s)",
              (int)r, ncclGetLastError(comm));
        CHECK(rank, now() - t0 < 0.3, "the posted all_reduce waited %.2f s for the last rank", now() - t0);
      } else if (blocking) {
        CHECK(rank, r != ncclSuccess, "the all_reduce the last rank skipped succeeded");
        CHECK(rank, now() - t0 < 30, "the blocked all_reduce took %.1f s to return", now() - t0);
      } else {
        CHECK(rank, r == ncclInProgress || r != ncclSuccess, "non-blocking all_reduce: %d", (int)r);
      }
    }
    pthread_join(wt, NULL); /* the watchdog has aborted the communicator */
    if (g_posted && rank != n - 1) {
      /* What the stream waited for will never come: the abort released it. */
      double t1 = now();
      cuStreamSynchronize(st);
      CHECK(rank, now() - t1 < 30, "the stream of the aborted call took %.1f s to finish", now() - t1);
    }
  }
  CHECK(rank, w.polls > 0 && w.errors == 0, "watchdog: %d polls, %d errors before the hang", w.polls, w.errors);
  pthread_mutex_destroy(&w.mu);
  /* The aborted call enqueued nothing that still reads these (the last rank never came). */
  unplace(rank, dsend);
  unplace(rank, drecv);
  if (st != NULL) CU(rank, cuStreamDestroy(st));
}

struct targ {
  ncclUniqueId id;
  int rank, n, blocking;
};

static void* thread_main(void* p) {
  struct targ* a = p;
  rank_main(a->id, a->rank, a->n, a->blocking);
  return NULL;
}

int main(int argc, char** argv) {
  int blocking = 1, n = 0, i, version = 0;
  const char* hex = getenv("FERROCCL_UNIQUE_ID");
  for (i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--nonblocking") == 0) blocking = 0;
    else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) n = atoi(argv[++i]);
    else if (strcmp(argv[i], "--device") == 0) g_device = 1;
  }
  if (g_device && cuda_load() < 1) {
    printf("pg_replay: no CUDA driver or device (skipped)\n");
    return 77;
  }
  CHECK(-1, ncclGetVersion(&version) == ncclSuccess && version >= 22800, "ncclGetVersion %d", version);
  if (n > 0) {
    struct targ* a = calloc((size_t)n, sizeof *a);
    pthread_t* t = calloc((size_t)n, sizeof *t);
    ncclUniqueId id;
    CHECK(-1, ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    for (i = 0; i < n; i++) {
      a[i].id = id;
      a[i].rank = i;
      a[i].n = n;
      a[i].blocking = blocking;
      pthread_create(&t[i], NULL, thread_main, &a[i]);
    }
    for (i = 0; i < n; i++) pthread_join(t[i], NULL);
    free(a);
    free(t);
  } else if (hex != NULL && strlen(hex) == 2 * NCCL_UNIQUE_ID_BYTES && getenv("FERROCCL_RANK") &&
             getenv("FERROCCL_WORLD_SIZE")) {
    ncclUniqueId id;
    for (i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
      unsigned v = 0;
      if (sscanf(hex + 2 * i, "%2x", &v) != 1) return 2;
      id.internal[i] = (char)v;
    }
    n = atoi(getenv("FERROCCL_WORLD_SIZE"));
    {
      const char* check = getenv("FERROCCL_CHECK");
      g_posted = g_device && (!check || !*check || strcmp(check, "0") == 0);
    }
    rank_main(id, atoi(getenv("FERROCCL_RANK")), n, blocking);
  } else {
    fprintf(stderr, "usage: pg_replay --threads N [--nonblocking] [--device], or under ferroccl-run -n N\n");
    return 2;
  }
  printf("pg_replay %d ranks, %s, %s memory: %d checks, %d failed\n", n, blocking ? "blocking" : "non-blocking",
         g_device ? "device" : "host", checks, failures);
  return failures == 0 ? 0 : 1;
}
