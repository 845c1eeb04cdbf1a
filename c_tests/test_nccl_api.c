/* A program written purely in NCCL's API (host memory), built against ferroccl through
 * <ferroccl/nccl.h>: nothing here names ferroccl except that include. Compiled as C99
 * and as C++11 (c_tests/compat_tests.cmake).
 *
 *   test_nccl_api                  one rank (ncclGetUniqueId + ncclCommInitRank)
 *   test_nccl_api --threads N      N ranks as threads of this process, three ways:
 *                                  ncclCommInitAll + one pthread per rank;
 *                                  ncclGetUniqueId + ncclCommInitRank in each thread;
 *                                  one thread driving all N communicators in groups
 *   ferroccl-run -n N test_nccl_api
 *                                  one rank per process: the unique id reaches the ranks
 *                                  as 256 hex digits in FERROCCL_UNIQUE_ID (an NCCL program
 *                                  would use MPI or a file; any channel will do), rank
 *                                  and size in FERROCCL_RANK / FERROCCL_WORLD_SIZE
 *
 * Every rank makes the same sequence of calls whatever its checks find, so a failed check
 * never hangs the others. Exit status 0 when every check passed, 1 otherwise. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ferroccl/nccl.h>

#include "cuda_probe.h"

#define MAX_RANKS 64
#define N 1031 /* elements per rank and per block: odd, prime */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_failures = 0;
static int g_checks = 0;

static void fail(int rank, const char* what, const char* detail) {
  pthread_mutex_lock(&g_lock);
  g_failures++;
  fprintf(stderr, "FAIL rank %d: %s%s%s\n", rank, what, detail ? ": " : "", detail ? detail : "");
  pthread_mutex_unlock(&g_lock);
}

static void counted(void) {
  pthread_mutex_lock(&g_lock);
  g_checks++;
  pthread_mutex_unlock(&g_lock);
}

/* An NCCL call that must succeed; reports the code, its string and the last error. */
#define NCCLCHECK(rank, comm, call)                                                          \
  do {                                                                                       \
    ncclResult_t r_ = (call);                                                                \
    counted();                                                                               \
    if (r_ != ncclSuccess) {                                                                 \
      char m_[512];                                                                          \
      snprintf(m_, sizeof m_, "%s = %d (%s): %s", #call, (int)r_, ncclGetErrorString(r_),  \
               ncclGetLastError(comm));                                                      \
      fail(rank, "call failed", m_);                                                         \
    }                                                                                        \
  } while (0)

#define EXPECT(rank, cond, what)          \
  do {                                    \
    counted();                            \
    if (!(cond)) fail(rank, what, #cond); \
  } while (0)

/* Inputs: rank r's element i. Small integers, so every float sum is exact. */
static float in_f(int r, size_t i) { return (float)((r + 1) * 3 + (int)(i % 13)); }
static int in_i(int r, size_t i) { return (int)((i * 7 + (size_t)r * 5) % 101) - 50; }

static int check_floats(int rank, const char* what, const float* got, const float* want, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) {
    if (got[i] != want[i]) {
      char m[200];
      snprintf(m, sizeof m, "element %lu: got %g, expected %g", (unsigned long)i, (double)got[i], (double)want[i]);
      fail(rank, what, m);
      return 1;
    }
  }
  return 0;
}

static int check_ints(int rank, const char* what, const int* got, const int* want, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) {
    if (got[i] != want[i]) {
      char m[200];
      snprintf(m, sizeof m, "element %lu: got %d, expected %d", (unsigned long)i, got[i], want[i]);
      fail(rank, what, m);
      return 1;
    }
  }
  return 0;
}

/* The whole sequence, on one rank. */
static void body(ncclComm_t comm, int rank, int nranks) {
  size_t i;
  int p, v = 0, count = 0, me = -1, dev = 7;
  const int root = nranks - 1;
  const size_t all = (size_t)nranks * N;
  float* sendf = (float*)malloc(all * sizeof(float));
  float* recvf = (float*)malloc(all * sizeof(float));
  float* want = (float*)malloc(all * sizeof(float));
  int* sendi = (int*)malloc(N * sizeof(int));
  int* recvi = (int*)malloc(N * sizeof(int));
  int* wanti = (int*)malloc(N * sizeof(int));
  ncclResult_t async = ncclInternalError;
  if (!sendf || !recvf || !want || !sendi || !recvi || !wanti) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }

  /* communicator queries */
  NCCLCHECK(rank, comm, ncclGetVersion(&v));
  EXPECT(rank, v == NCCL_VERSION_CODE, "ncclGetVersion reports NCCL_VERSION_CODE");
  EXPECT(rank, NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0), "NCCL_VERSION_CODE mirrors NCCL 2.28");
  NCCLCHECK(rank, comm, ncclCommCount(comm, &count));
  EXPECT(rank, count == nranks, "ncclCommCount");
  NCCLCHECK(rank, comm, ncclCommUserRank(comm, &me));
  EXPECT(rank, me == rank, "ncclCommUserRank");
  NCCLCHECK(rank, comm, ncclCommCuDevice(comm, &dev));
  /* the device current when this thread created the communicator; -1 without one */
  EXPECT(rank, dev == fccl_current_cuda_device(), "ncclCommCuDevice is the device current at creation");

  /* buffer registration (an optimisation in NCCL): accepted */
  {
    void* handle = NULL;
    ncclWindow_t win = NULL;
    NCCLCHECK(rank, comm, ncclCommRegister(comm, sendf, all * sizeof(float), &handle));
    NCCLCHECK(rank, comm, ncclCommDeregister(comm, handle));
    NCCLCHECK(rank, comm, ncclCommWindowRegister(comm, recvf, all * sizeof(float), &win, NCCL_WIN_DEFAULT));
    NCCLCHECK(rank, comm, ncclCommWindowDeregister(comm, win));
  }

  /* all_reduce, float sum, out of place */
  for (i = 0; i < N; i++) sendf[i] = in_f(rank, i);
  for (i = 0; i < N; i++) {
    float s = 0;
    for (p = 0; p < nranks; p++) s += in_f(p, i);
    want[i] = s;
  }
  memset(recvf, 0, N * sizeof(float));
  NCCLCHECK(rank, comm, ncclAllReduce(sendf, recvf, N, ncclFloat, ncclSum, comm, NULL));
  check_floats(rank, "ncclAllReduce float sum", recvf, want, N);

  /* all_reduce, int32 max, in place */
  for (i = 0; i < N; i++) {
    int m = in_i(0, i);
    for (p = 1; p < nranks; p++) m = in_i(p, i) > m ? in_i(p, i) : m;
    wanti[i] = m;
    recvi[i] = in_i(rank, i);
  }
  NCCLCHECK(rank, comm, ncclAllReduce(recvi, recvi, N, ncclInt32, ncclMax, comm, NULL));
  check_ints(rank, "ncclAllReduce int32 max in place", recvi, wanti, N);

  /* all_reduce, float avg */
  for (i = 0; i < N; i++) want[i] /= (float)nranks;
  NCCLCHECK(rank, comm, ncclAllReduce(sendf, recvf, N, ncclFloat32, ncclAvg, comm, NULL));
  for (i = 0; i < N; i++) {
    float d = recvf[i] - want[i];
    if (d > 1e-4f || d < -1e-4f) {
      fail(rank, "ncclAllReduce float avg", NULL);
      break;
    }
  }

  /* broadcast from the last rank, then in-place ncclBcast from rank 0 */
  for (i = 0; i < N; i++) {
    sendf[i] = in_f(rank, i);
    want[i] = in_f(root, i);
  }
  memset(recvf, 0, N * sizeof(float));
  NCCLCHECK(rank, comm, ncclBroadcast(sendf, recvf, N, ncclFloat, root, comm, NULL));
  check_floats(rank, "ncclBroadcast", recvf, want, N);
  for (i = 0; i < N; i++) {
    recvi[i] = in_i(rank, i);
    wanti[i] = in_i(0, i);
  }
  NCCLCHECK(rank, comm, ncclBcast(recvi, N, ncclInt, 0, comm, NULL));
  check_ints(rank, "ncclBcast", recvi, wanti, N);

  /* reduce (int32 sum) to the last rank */
  for (i = 0; i < N; i++) {
    int s = 0;
    for (p = 0; p < nranks; p++) s += in_i(p, i);
    wanti[i] = s;
    sendi[i] = in_i(rank, i);
    recvi[i] = 12345;
  }
  NCCLCHECK(rank, comm, ncclReduce(sendi, recvi, N, ncclInt32, ncclSum, root, comm, NULL));
  if (rank == root) check_ints(rank, "ncclReduce", recvi, wanti, N);

  /* all_gather: rank p's block at offset p*N */
  for (i = 0; i < N; i++) sendf[i] = in_f(rank, i);
  for (p = 0; p < nranks; p++)
    for (i = 0; i < N; i++) want[(size_t)p * N + i] = in_f(p, i);
  memset(recvf, 0, all * sizeof(float));
  NCCLCHECK(rank, comm, ncclAllGather(sendf, recvf, N, ncclFloat, comm, NULL));
  check_floats(rank, "ncclAllGather", recvf, want, all);

  /* reduce_scatter: rank r gets block r of the sum */
  for (p = 0; p < nranks; p++)
    for (i = 0; i < N; i++) sendf[(size_t)p * N + i] = in_f(rank, (size_t)p * N + i);
  for (i = 0; i < N; i++) {
    float s = 0;
    for (p = 0; p < nranks; p++) s += in_f(p, (size_t)rank * N + i);
    want[i] = s;
  }
  memset(recvf, 0, N * sizeof(float));
  NCCLCHECK(rank, comm, ncclReduceScatter(sendf, recvf, N, ncclFloat, ncclSum, comm, NULL));
  check_floats(rank, "ncclReduceScatter", recvf, want, N);

  /* all_to_all: block p goes to rank p; rank q's block for me lands at offset q*N */
  for (p = 0; p < nranks; p++)
    for (i = 0; i < N; i++) {
      sendf[(size_t)p * N + i] = (float)(rank * 1000 + p * 10) + (float)(i % 5);
      want[(size_t)p * N + i] = (float)(p * 1000 + rank * 10) + (float)(i % 5);
    }
  memset(recvf, 0, all * sizeof(float));
  NCCLCHECK(rank, comm, ncclAlltoAll(sendf, recvf, N, ncclFloat, comm, NULL));
  check_floats(rank, "ncclAlltoAll", recvf, want, all);

  /* gather to rank 0, scatter from the last rank */
  for (i = 0; i < N; i++) sendf[i] = in_f(rank, i);
  for (p = 0; p < nranks; p++)
    for (i = 0; i < N; i++) want[(size_t)p * N + i] = in_f(p, i);
  memset(recvf, 0, all * sizeof(float));
  NCCLCHECK(rank, comm, ncclGather(sendf, recvf, N, ncclFloat, 0, comm, NULL));
  if (rank == 0) check_floats(rank, "ncclGather", recvf, want, all);
  for (p = 0; p < nranks; p++)
    for (i = 0; i < N; i++) sendf[(size_t)p * N + i] = (float)(rank * 100 + p) + (float)(i % 3);
  for (i = 0; i < N; i++) want[i] = (float)(root * 100 + rank) + (float)(i % 3);
  memset(recvf, 0, N * sizeof(float));
  NCCLCHECK(rank, comm, ncclScatter(sendf, recvf, N, ncclFloat, root, comm, NULL));
  check_floats(rank, "ncclScatter", recvf, want, N);

  /* send/recv around a ring, both directions, in one group (no deadlock) */
  {
    const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    int* fromprev = (int*)malloc(N * sizeof(int));
    if (!fromprev) exit(1);
    for (i = 0; i < N; i++) {
      sendi[i] = rank * 1000 + (int)i;
      recvi[i] = fromprev[i] = -1;
    }
    NCCLCHECK(rank, comm, ncclGroupStart());
    NCCLCHECK(rank, comm, ncclSend(sendi, N, ncclInt32, next, comm, NULL));
    NCCLCHECK(rank, comm, ncclSend(sendi, N, ncclInt32, prev, comm, NULL));
    NCCLCHECK(rank, comm, ncclRecv(fromprev, N, ncclInt32, prev, comm, NULL));
    NCCLCHECK(rank, comm, ncclRecv(recvi, N, ncclInt32, next, comm, NULL));
    NCCLCHECK(rank, comm, ncclGroupEnd());
    for (i = 0; i < N; i++) wanti[i] = prev * 1000 + (int)i;
    check_ints(rank, "ncclSend/ncclRecv from prev", fromprev, wanti, N);
    for (i = 0; i < N; i++) wanti[i] = next * 1000 + (int)i;
    check_ints(rank, "ncclSend/ncclRecv from next", recvi, wanti, N);
    free(fromprev);
  }

  /* errors: local argument checks, nothing sent, every rank alike */
  {
    ncclResult_t r = ncclAllReduce(sendf, recvf, N, (ncclDataType_t)99, ncclSum, comm, NULL);
    const char* s = ncclGetErrorString(ncclInvalidArgument);
    const char* last = ncclGetLastError(comm);
    EXPECT(rank, r == ncclInvalidArgument, "ncclAllReduce with datatype 99 returns ncclInvalidArgument");
    EXPECT(rank, s != NULL && s[0] != '\0', "ncclGetErrorString(ncclInvalidArgument) is a message");
    EXPECT(rank, last != NULL && strstr(last, "AllReduce") != NULL, "ncclGetLastError names the failed call");
    r = ncclBroadcast(sendf, recvf, N, ncclFloat, nranks, comm, NULL);
    EXPECT(rank, r == ncclInvalidArgument, "ncclBroadcast with root == nranks returns ncclInvalidArgument");
    r = ncclCommCount(comm, NULL);
    EXPECT(rank, r == ncclInvalidArgument, "ncclCommCount(comm, NULL) returns ncclInvalidArgument");
    EXPECT(rank, ncclGetErrorString(ncclSuccess) != NULL, "ncclGetErrorString(ncclSuccess)");
  }
  NCCLCHECK(rank, comm, ncclCommGetAsyncError(comm, &async));
  EXPECT(rank, async == ncclSuccess, "ncclCommGetAsyncError reports no error");

  /* split by parity, with a config (blocking, commName) */
  {
    ncclComm_t sub = NCCL_COMM_NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    int subn = 0, subrank = -1, expect_n = (nranks + 1 - rank % 2) / 2;
    int x = rank, want_sum = 0;
    cfg.blocking = 1;
    cfg.commName = "nccl-api-split";
    NCCLCHECK(rank, comm, ncclCommSplit(comm, rank % 2, rank, &sub, &cfg));
    NCCLCHECK(rank, sub, ncclCommCount(sub, &subn));
    EXPECT(rank, subn == expect_n, "ncclCommSplit: size of the parity group");
    NCCLCHECK(rank, sub, ncclCommUserRank(sub, &subrank));
    EXPECT(rank, subrank == rank / 2, "ncclCommSplit: rank ordered by key");
    for (p = rank % 2; p < nranks; p += 2) want_sum += p;
    NCCLCHECK(rank, sub, ncclAllReduce(&x, &x, 1, ncclInt, ncclSum, sub, NULL));
    EXPECT(rank, x == want_sum, "ncclAllReduce on the split communicator");
    NCCLCHECK(rank, sub, ncclCommFinalize(sub));
    NCCLCHECK(rank, sub, ncclCommDestroy(sub));
  }
  /* NCCL_SPLIT_NOCOLOR: no communicator */
  {
    ncclComm_t none = NCCL_COMM_NULL;
    NCCLCHECK(rank, comm, ncclCommSplit(comm, rank == 0 ? 0 : NCCL_SPLIT_NOCOLOR, 0, &none, NULL));
    EXPECT(rank, (rank == 0) == (none != NCCL_COMM_NULL), "ncclCommSplit with NCCL_SPLIT_NOCOLOR");
    if (none != NCCL_COMM_NULL) NCCLCHECK(rank, none, ncclCommDestroy(none));
  }

  free(sendf);
  free(recvf);
  free(want);
  free(sendi);
  free(recvi);
  free(wanti);
}

/* ------------------------------------------------------------------ threads */

struct rank_arg {
  ncclComm_t comm;
  int rank, nranks;
  const ncclUniqueId* id; /* non-NULL: the thread creates its communicator from it */
};

static void* rank_main(void* p) {
  struct rank_arg* a = (struct rank_arg*)p;
  if (a->id != NULL) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.commName = "nccl-api-uid";
    NCCLCHECK(a->rank, NULL, ncclCommInitRankConfig(&a->comm, a->nranks, *a->id, a->rank, &cfg));
    if (a->comm == NCCL_COMM_NULL) return NULL;
  }
  body(a->comm, a->rank, a->nranks);
  return NULL;
}

static void run_threads(ncclComm_t* comms, int n, const ncclUniqueId* id) {
  pthread_t th[MAX_RANKS];
  struct rank_arg args[MAX_RANKS];
  int r;
  for (r = 0; r < n; r++) {
    args[r].comm = comms ? comms[r] : NCCL_COMM_NULL;
    args[r].rank = r;
    args[r].nranks = n;
    args[r].id = id;
    if (pthread_create(&th[r], NULL, rank_main, &args[r]) != 0) {
      fprintf(stderr, "pthread_create failed\n");
      exit(1);
    }
  }
  for (r = 0; r < n; r++) pthread_join(th[r], NULL);
  if (comms == NULL)
    for (r = 0; r < n; r++)
      if (args[r].comm != NCCL_COMM_NULL) NCCLCHECK(r, args[r].comm, ncclCommDestroy(args[r].comm));
}

/* NCCL's single-thread, many-communicator pattern: one thread, calls grouped. */
static void one_thread(ncclComm_t* comms, int n) {
  float* buf[MAX_RANKS];
  int* ring[MAX_RANKS];
  int r, err = 0;
  size_t i;
  for (r = 0; r < n; r++) {
    buf[r] = (float*)malloc(N * sizeof(float));
    ring[r] = (int*)malloc(2 * sizeof(int));
    if (!buf[r] || !ring[r]) exit(1);
    for (i = 0; i < N; i++) buf[r][i] = in_f(r, i);
    ring[r][0] = r;
    ring[r][1] = -1;
  }
  NCCLCHECK(-1, NULL, ncclGroupStart());
  for (r = 0; r < n; r++) NCCLCHECK(r, comms[r], ncclAllReduce(buf[r], buf[r], N, ncclFloat, ncclSum, comms[r], NULL));
  NCCLCHECK(-1, NULL, ncclGroupEnd());
  for (r = 0; r < n && !err; r++)
    for (i = 0; i < N; i++) {
      float s = 0;
      int p;
      for (p = 0; p < n; p++) s += in_f(p, i);
      if (buf[r][i] != s) {
        fail(r, "grouped ncclAllReduce from one thread", NULL);
        err = 1;
        break;
      }
    }
  /* every rank sends its number to the next one */
  NCCLCHECK(-1, NULL, ncclGroupStart());
  for (r = 0; r < n; r++) {
    NCCLCHECK(r, comms[r], ncclSend(&ring[r][0], 1, ncclInt, (r + 1) % n, comms[r], NULL));
    NCCLCHECK(r, comms[r], ncclRecv(&ring[r][1], 1, ncclInt, (r + n - 1) % n, comms[r], NULL));
  }
  NCCLCHECK(-1, NULL, ncclGroupEnd());
  for (r = 0; r < n; r++) EXPECT(r, ring[r][1] == (r + n - 1) % n, "grouped ncclSend/ncclRecv from one thread");
  for (r = 0; r < n; r++) {
    free(buf[r]);
    free(ring[r]);
  }
}

/* ------------------------------------------------------------------ main */

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int main(int argc, char** argv) {
  const char* hex = getenv("FERROCCL_UNIQUE_ID");
  int nthreads = 0;
  if (argc == 3 && strcmp(argv[1], "--threads") == 0) nthreads = atoi(argv[2]);
  if (argc != 1 && (nthreads < 1 || nthreads > MAX_RANKS)) {
    fprintf(stderr, "usage: %s [--threads N]  (1 <= N <= %d)\n", argv[0], MAX_RANKS);
    return 2;
  }

  if (nthreads > 0) {
    ncclComm_t comms[MAX_RANKS];
    ncclUniqueId id;
    int r;
    /* 1. ncclCommInitAll (NULL devlist: host-memory ranks), one pthread per rank */
    NCCLCHECK(-1, NULL, ncclCommInitAll(comms, nthreads, NULL));
    if (g_failures == 0) {
      run_threads(comms, nthreads, NULL);
      /* 2. the same communicators from one thread, grouped */
      one_thread(comms, nthreads);
      for (r = 0; r < nthreads; r++) NCCLCHECK(r, comms[r], ncclCommDestroy(comms[r]));
    }
    /* 3. ncclGetUniqueId here, ncclCommInitRank in each thread */
    NCCLCHECK(-1, NULL, ncclGetUniqueId(&id));
    if (g_failures == 0) run_threads(NULL, nthreads, &id);
    printf("test_nccl_api --threads %d: %d checks, %d failed\n", nthreads, g_checks, g_failures);
  } else if (hex != NULL) {
    /* a process launched with the id, rank and size in the environment */
    ncclUniqueId id;
    ncclComm_t comm = NCCL_COMM_NULL;
    const char* rs = getenv("FERROCCL_RANK");
    const char* ns = getenv("FERROCCL_WORLD_SIZE");
    int rank = rs ? atoi(rs) : -1, nranks = ns ? atoi(ns) : 0;
    size_t i;
    if (strlen(hex) != 2 * sizeof id.internal || rank < 0 || nranks < 1) {
      fprintf(stderr, "FERROCCL_UNIQUE_ID / FERROCCL_RANK / FERROCCL_WORLD_SIZE are not usable\n");
      return 1;
    }
    for (i = 0; i < sizeof id.internal; i++) {
      int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
      if (hi < 0 || lo < 0) {
        fprintf(stderr, "FERROCCL_UNIQUE_ID is not hex\n");
        return 1;
      }
      id.internal[i] = (char)(unsigned char)(hi * 16 + lo);
    }
    NCCLCHECK(rank, NULL, ncclCommInitRank(&comm, nranks, id, rank));
    if (comm != NCCL_COMM_NULL) {
      body(comm, rank, nranks);
      NCCLCHECK(rank, comm, ncclCommFinalize(comm));
      NCCLCHECK(rank, comm, ncclCommDestroy(comm));
    }
    printf("test_nccl_api rank %d/%d: %d checks, %d failed\n", rank, nranks, g_checks, g_failures);
  } else {
    /* one rank, no launcher */
    ncclUniqueId id;
    ncclComm_t comm = NCCL_COMM_NULL, other = NCCL_COMM_NULL;
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    ncclRedOp_t premul = ncclSum;
    float scalar = 2.0f;
    NCCLCHECK(0, NULL, ncclGetUniqueId(&id));
    /* a config not made by NCCL_CONFIG_INITIALIZER is refused, with a message */
    bad.magic = 0;
    EXPECT(0, ncclCommInitRankConfig(&other, 1, id, 0, &bad) == ncclInvalidArgument,
           "ncclCommInitRankConfig refuses a config with a wrong magic");
    EXPECT(0, strstr(ncclGetLastError(NULL), "magic") != NULL, "ncclGetLastError explains the config error");
    /* an operator needs a communicator */
    EXPECT(0, ncclRedOpCreatePreMulSum(&premul, &scalar, ncclFloat, ncclScalarHostImmediate, NULL) == ncclInvalidArgument,
           "ncclRedOpCreatePreMulSum refuses a NULL communicator");
    NCCLCHECK(0, NULL, ncclCommInitRank(&comm, 1, id, 0));
    if (comm != NCCL_COMM_NULL) {
      body(comm, 0, 1);
      NCCLCHECK(0, comm, ncclCommDestroy(comm));
    }
    printf("test_nccl_api (1 rank): %d checks, %d failed\n", g_checks, g_failures);
  }
  return g_failures == 0 ? 0 : 1;
}
