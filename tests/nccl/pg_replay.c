/*
 * PyTorch's ProcessGroupNCCL, replayed as plain NCCL calls on host memory
 * (tests/nccl/run.sh): what a training job's process group asks of libnccl.so.2.
 *
 *   pg_replay --threads N [--nonblocking]      N ranks as threads of this process
 *   ferroccl-run -n N pg_replay [--nonblocking] one rank per process
 *
 * Each rank: ncclCommInitRankConfig with a config (blocking, or non-blocking polled as
 * TORCH_NCCL_USE_COMM_NONBLOCKING does), a watchdog thread polling
 * ncclCommGetAsyncError the whole time (ProcessGroupNCCL's watchdog), ncclCommSplit
 * into even and odd ranks (new_group), a batch of ncclSend/ncclRecv to every peer in
 * one group (batch_isend_irecv, all_to_all), ReduceOp.PREMUL_SUM all_reduce and
 * reduce_scatter (ncclRedOpCreatePreMulSum, the collective, ncclRedOpDestroy right
 * after it, as ProcessGroupNCCL's RAII does), then a hang that the watchdog ends: the
 * last rank skips an all_reduce, and every rank's watchdog calls ncclCommAbort after a
 * deadline, which must return the blocked call. Exit 0 when every check passed.
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define M 19

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int failures = 0, checks_total = 0;

#define CHECK(rank, cond, ...)                                          \
  do {                                                                  \
    pthread_mutex_lock(&lock);                                          \
    checks_total++;                                                     \
    if (!(cond)) {                                                      \
      failures++;                                                       \
      fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                     \
      fprintf(stderr, "\n");                                            \
    }                                                                   \
    pthread_mutex_unlock(&lock);                                        \
  } while (0)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A non-blocking communicator's call: poll until it leaves ncclInProgress. */
static ncclResult_t settle(ncclComm_t comm, ncclResult_t r) {
  ncclResult_t st = ncclInProgress;
  if (r != ncclInProgress) return r;
  do {
    r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return r;
  } while (st == ncclInProgress);
  return st;
}

#define DO(rank, comm, call)                                                                  \
  do {                                                                                        \
    ncclResult_t r_ = (call);                                                                 \
    r_ = settle((comm), r_); /* after the call: it may set `comm` */                         \
    CHECK(rank, r_ == ncclSuccess, "%s: %s (%s)", #call, ncclGetErrorString(r_),              \
          ncclGetLastError(NULL));                                                            \
  } while (0)

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

static void rank_main(ncclUniqueId id, int rank, int n, int blocking) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclComm_t comm = NULL, sub = NULL;
  struct watchdog w;
  pthread_t wt;
  char name[32];
  int32_t send[64 * M], recv[64 * M];
  float fs[64 * M], fr[64 * M];
  int p, i;

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
    scfg.blocking = blocking;
    scfg.commName = "pg-split";
    DO(rank, sub, ncclCommSplit(comm, rank % 2, rank, &sub, &scfg));
    if (sub != NULL) {
      DO(rank, sub, ncclCommCount(sub, &cnt));
      CHECK(rank, cnt == (n - rank % 2 + 1) / 2, "split size %d", cnt);
      DO(rank, sub, ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, sub, NULL));
      for (p = rank % 2; p < n; p += 2) want += p + 1;
      CHECK(rank, y == want, "all_reduce on the split: %d, want %d", y, want);
    }
  }

  /* batch_isend_irecv / all_to_all: a send to and a receive from every peer, one group. */
  for (p = 0; p < n; p++)
    for (i = 0; i < M; i++) send[p * M + i] = rank * 1000 + p * 10 + i;
  memset(recv, 0, sizeof recv);
  DO(rank, comm, ncclGroupStart());
  for (p = 0; p < n; p++) {
    DO(rank, comm, ncclSend(send + p * M, M, ncclInt32, p, comm, NULL));
    DO(rank, comm, ncclRecv(recv + p * M, M, ncclInt32, p, comm, NULL));
  }
  DO(rank, comm, ncclGroupEnd());
  for (p = 0; p < n; p++)
    for (i = 0; i < M; i++)
      CHECK(rank, recv[p * M + i] == p * 1000 + rank * 10 + i, "p2p from %d element %d: %d", p, i,
            (int)recv[p * M + i]);

  /* ReduceOp.PREMUL_SUM: a Python float factor (host immediate), then a tensor factor
   * (ncclScalarDevice; a host pointer here). The operator is destroyed right after the
   * call is issued. */
  {
    ncclRedOp_t op = ncclSum;
    float factor = 1.0f / (float)n;
    for (i = 0; i < M; i++) fs[i] = (float)(n * (rank + 1) * (i + 1));
    DO(rank, comm, ncclRedOpCreatePreMulSum(&op, &factor, ncclFloat, ncclScalarHostImmediate, comm));
    DO(rank, comm, ncclAllReduce(fs, fr, M, ncclFloat, op, comm, NULL));
    DO(rank, comm, ncclRedOpDestroy(op, comm));
    for (i = 0; i < M; i++) {
      float want = 0;
      for (p = 0; p < n; p++) want += (float)((p + 1) * (i + 1));
      CHECK(rank, fr[i] == want, "PREMUL_SUM 1/n all_reduce element %d: %g, want %g", i, fr[i], want);
    }
  }
  {
    ncclRedOp_t op = ncclSum;
    float factor = 3.0f;
    for (p = 0; p < n; p++)
      for (i = 0; i < M; i++) fs[p * M + i] = (float)(p - rank);
    DO(rank, comm, ncclRedOpCreatePreMulSum(&op, &factor, ncclFloat, ncclScalarDevice, comm));
    DO(rank, comm, ncclGroupStart());
    DO(rank, comm, ncclReduceScatter(fs, fr, M, ncclFloat, op, comm, NULL));
    DO(rank, comm, ncclGroupEnd());
    DO(rank, comm, ncclRedOpDestroy(op, comm));
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
      ncclResult_t r = ncclAllReduce(send, recv, M, ncclInt32, ncclSum, comm, NULL);
      if (blocking) {
        CHECK(rank, r != ncclSuccess, "the all_reduce the last rank skipped succeeded");
        CHECK(rank, now() - t0 < 30, "the blocked all_reduce took %.1f s to return", now() - t0);
      } else {
        CHECK(rank, r == ncclInProgress || r != ncclSuccess, "non-blocking all_reduce: %d", (int)r);
      }
    }
    pthread_join(wt, NULL); /* the watchdog has aborted the communicator */
  }
  CHECK(rank, w.polls > 0 && w.errors == 0, "watchdog: %d polls, %d errors before the hang", w.polls, w.errors);
  pthread_mutex_destroy(&w.mu);
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
    rank_main(id, atoi(getenv("FERROCCL_RANK")), n, blocking);
  } else {
    fprintf(stderr, "usage: pg_replay --threads N [--nonblocking], or under ferroccl-run -n N\n");
    return 2;
  }
  printf("pg_replay %d ranks, %s: %d checks, %d failed\n", n, blocking ? "blocking" : "non-blocking",
         checks_total, failures);
  return failures == 0 ? 0 : 1;
}
