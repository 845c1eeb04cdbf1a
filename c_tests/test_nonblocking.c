/* Non-blocking communicators (config.blocking = 0), NCCL's model: creation, calls and
 * groups return fcclInProgress without waiting for peers and finish on the
 * communicator's progress thread; fcclCommGetAsyncError reports fcclInProgress, then
 * fcclSuccess or the first error (its message then in fcclGetLastError, naming the
 * call).  Parts:
 *   create      fcclCommInitRankConfig(blocking 0) with an id shared by the harness
 *               (threads) or broadcast over the harness's communicator (processes)
 *   queue       six collectives issued back to back, then one poll; results checked
 *   group       send/recv ring and an all_reduce in one group (fcclGroupEnd: InProgress)
 *   args        a bad argument is refused at once; nothing is queued
 *   mix         a blocking communicator's call inside a group of non-blocking ones
 *   coalesced   fcclAllReduceCoalesced queued whole
 *   finalize    fcclCommFinalize polled, then calls are refused, then destroy
 *   error       (2+ ranks) a mismatched call fails on the progress thread, on every
 *               rank; the call queued behind it never runs; later calls are refused
 *   abort       (2+ ranks) rank 0 aborts with a receive pending: abort returns before
 *               the timeout, the others' next call fails with fcclRemoteError
 *   destroy     destroy right after issuing: it waits for the call
 * The library's creation and progress threads ("ferroccl-init", "ferroccl-progress")
 * are there while the communicators are, and gone once every one is destroyed.
 * Every rank makes the same calls on every communicator, whatever its checks found. */
#include "harness.h"

#include <dirent.h>
#include <time.h>

#define NB_TIMEOUT_MS 60000

/* `res` (of a call on a non-blocking communicator) is fcclInProgress or fcclSuccess. */
static int issued_at(fcclResult_t res, const char* call, const char* file, int line) {
  if (res == fcclInProgress || res == fcclSuccess) return 1;
  fccl_fail_at(file, line, "%s returned %d (%s), expected fcclInProgress or fcclSuccess; "
                           "fcclGetLastError: \"%s\"", call, (int)res, fccl_res_name(res),
               fcclGetLastError(NULL));
  return 0;
}
#define ISSUED(call) issued_at((call), #call, __FILE__, __LINE__)

/* Polls `c` until its work is done; it must end in fcclSuccess. */
static int settle_at(fcclComm_t c, const char* what, const char* file, int line) {
  fcclResult_t st = fccl_wait_comm(c);
  if (st == fcclSuccess) return 1;
  fccl_fail_at(file, line, "%s: fcclCommGetAsyncError ended with %d (%s); fcclGetLastError: \"%s\"",
               what, (int)st, fccl_res_name(st), fcclGetLastError(NULL));
  return 0;
}
#define SETTLE(c, what) settle_at((c), (what), __FILE__, __LINE__)

static fcclConfig_t nb_config(const char* name) {
  fcclConfig_t cfg = FCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.timeoutMs = NB_TIMEOUT_MS;
  cfg.checkMode = FCCL_CHECK_FINGERPRINT;
  cfg.commName = name;
  return cfg;
}

/* Threads of this process named like the library's non-blocking machinery (Linux keeps
 * 15 characters of a name). */
static int count_ours(void) {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  struct dirent* e;
  if (!d) return -1;
  while ((e = readdir(d)) != NULL) {
    char path[300], name[32] = "";
    FILE* f;
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    if ((f = fopen(path, "r")) == NULL) continue;
    if (fgets(name, sizeof name, f) &&
        (strncmp(name, "ferroccl-progre", 15) == 0 || strncmp(name, "ferroccl-init", 13) == 0))
      n++;
    fclose(f);
  }
  closedir(d);
  return n;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A non-blocking communicator over the same ranks, made by fcclCommSplit. */
static fcclComm_t nb_split(fcclComm_t comm, int rank, const char* name) {
  fcclComm_t nb = NULL;
  fcclConfig_t cfg = nb_config(name);
  fccl_phase("fcclCommSplit into non-blocking %s", name);
  if (CHECK_RES(fcclCommSplit(comm, 0, rank, &nb, &cfg), fcclInProgress)) {
    CHECK(nb != NULL, "a non-blocking fcclCommSplit wrote no communicator");
    if (nb && !SETTLE(nb, name)) {
      CHECK_OK(fcclCommDestroy(nb));
      nb = NULL;
    }
  }
  return nb;
}

static fcclComm_t part_create(fcclComm_t comm, int rank, int nranks) {
  fcclUniqueId id;
  fcclComm_t nb = NULL;
  fcclConfig_t cfg = nb_config("nb-init");
  int v = -1;
  fccl_phase("create: fcclCommInitRankConfig(blocking 0)");
  memset(&id, 0, sizeof id);
  if (fccl_shared_id()) {
    id = *fccl_shared_id();
  } else {
    if (rank == 0) CHECK_OK(fcclGetUniqueId(&id));
    if (nranks > 1) CHECK_OK(fcclBroadcast(&id, &id, sizeof id, fcclUint8, 0, comm, NULL));
  }
  if (!CHECK_RES(fcclCommInitRankConfig(&nb, nranks, id, rank, &cfg), fcclInProgress)) return NULL;
  CHECK(nb != NULL, "fcclCommInitRankConfig(blocking 0) returned fcclInProgress and no handle");
  if (!nb) return NULL;
  if (!SETTLE(nb, "non-blocking creation")) {
    CHECK_OK(fcclCommDestroy(nb));
    return NULL;
  }
  if (CHECK_OK(fcclCommCount(nb, &v))) CHECK(v == nranks, "fcclCommCount = %d, want %d", v, nranks);
  if (CHECK_OK(fcclCommUserRank(nb, &v))) CHECK(v == rank, "fcclCommUserRank = %d, want %d", v, rank);
  return nb;
}

static void part_queue(fcclComm_t nb, int rank, int nranks) {
  const size_t n1 = 4099, n2 = (size_t)1 << 17, n3 = 1001, n4 = 777;
  size_t per = fccl_big_per_rank(nranks) / 8 | 1u, i;
  fccl_pattern pf, pi, pl, pd;
  fccl_ref rf, ri, rd;
  float *s1 = fccl_xmalloc(n1 * 4), *r1 = fccl_xmalloc(n1 * 4);
  int32_t* b2 = fccl_xmalloc(n2 * 4);
  int64_t* b3 = fccl_xmalloc(n3 * 8);
  int64_t* ag = fccl_xmalloc((size_t)nranks * n4 * 8);
  int64_t* agin = fccl_xmalloc(n4 * 8);
  double *rs_in = fccl_xmalloc((size_t)nranks * per * 8), *rs_out = fccl_xmalloc(per * 8);
  int32_t *a2a_in = fccl_xmalloc((size_t)nranks * n4 * 4), *a2a_out = fccl_xmalloc((size_t)nranks * n4 * 4);
  int ok = 1, q;
  size_t base = 17;

  fccl_pattern_init(&pf, fcclFloat32, FCCL_SCHEME_SUM);
  fccl_pattern_init(&pi, fcclInt32, FCCL_SCHEME_FULL);
  fccl_pattern_init(&pl, fcclInt64, FCCL_SCHEME_FULL);
  fccl_pattern_init(&pd, fcclFloat64, FCCL_SCHEME_SUM);
  fccl_ref_init(&rf, &pf, fcclSum, nranks);
  fccl_ref_init(&ri, &pi, fcclMax, nranks);
  fccl_ref_init(&rd, &pd, fcclSum, nranks);
  fccl_pattern_fill(&pf, s1, n1, fccl_rank_off(base, rank));
  fccl_pattern_fill(&pi, b2, n2, fccl_rank_off(base + 1, rank));
  fccl_pattern_fill(&pl, b3, n3, fccl_rank_off(base + 2, nranks - 1));
  if (rank != nranks - 1) memset(b3, 0, n3 * 8);
  fccl_pattern_fill(&pl, agin, n4, fccl_rank_off(base + 3, rank));
  for (q = 0; q < nranks; q++) {
    fccl_pattern_fill(&pd, rs_in + (size_t)q * per, per, fccl_rank_off(base + 4, rank) + (size_t)q * per);
    for (i = 0; i < n4; i++) a2a_in[(size_t)q * n4 + i] = rank * 1000003 + q * 1009 + (int32_t)i;
  }

  fccl_phase("queue: six calls back to back");
  ok &= ISSUED(fcclAllReduce(s1, r1, n1, fcclFloat32, fcclSum, nb, NULL));
  ok &= ISSUED(fcclAllReduce(b2, b2, n2, fcclInt32, fcclMax, nb, NULL));
  ok &= ISSUED(fcclBroadcast(b3, b3, n3, fcclInt64, nranks - 1, nb, NULL));
  ok &= ISSUED(fcclAllGather(agin, ag, n4, fcclInt64, nb, NULL));
  ok &= ISSUED(fcclReduceScatter(rs_in, rs_out, per, fcclFloat64, fcclSum, nb, NULL));
  ok &= ISSUED(fcclAlltoAll(a2a_in, a2a_out, n4, fcclInt32, nb, NULL));
  if (SETTLE(nb, "queue") && ok) {
    REF_CHECK(&rf, r1, n1, base, "queued fcclAllReduce float32 sum");
    REF_CHECK(&ri, b2, n2, base + 1, "queued fcclAllReduce int32 max in place");
    PATTERN_CHECK(&pl, b3, n3, fccl_rank_off(base + 2, nranks - 1), "queued fcclBroadcast from the last rank");
    for (q = 0; q < nranks; q++)
      PATTERN_CHECK(&pl, ag + (size_t)q * n4, n4, fccl_rank_off(base + 3, q), "queued fcclAllGather block");
    REF_CHECK(&rd, rs_out, per, base + 4 + (size_t)rank * per, "queued fcclReduceScatter float64 sum");
    for (q = 0; q < nranks; q++)
      for (i = 0; i < n4; i++)
        if (a2a_out[(size_t)q * n4 + i] != q * 1000003 + rank * 1009 + (int32_t)i) {
          CHECK(0, "queued fcclAlltoAll: block %d element %zu = %d", q, i, (int)a2a_out[(size_t)q * n4 + i]);
          break;
        }
  }
  fccl_ref_free(&rf);
  fccl_ref_free(&ri);
  fccl_ref_free(&rd);
  fccl_pattern_free(&pf);
  fccl_pattern_free(&pi);
  fccl_pattern_free(&pl);
  fccl_pattern_free(&pd);
  free(s1);
  free(r1);
  free(b2);
  free(b3);
  free(ag);
  free(agin);
  free(rs_in);
  free(rs_out);
  free(a2a_in);
  free(a2a_out);
}

static void part_group(fcclComm_t nb, int rank, int nranks) {
  enum { N = 65537 };
  int32_t* send = fccl_xmalloc(N * 4);
  int32_t* recv = fccl_xmalloc(N * 4 + FCCL_SLACK);
  int32_t x[3] = {rank, 1, -rank}, y[3] = {0, 0, 0};
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks, i, ok = 1;
  fccl_phase("group: ring and all_reduce, one fcclGroupEnd");
  for (i = 0; i < N; i++) send[i] = rank * 100003 + i;
  memset(recv, FCCL_SENT_RECV, N * 4 + FCCL_SLACK);
  CHECK_OK(fcclGroupStart());
  if (nranks > 1) {
    ok &= CHECK_OK(fcclSend(send, N, fcclInt32, next, nb, NULL));
    ok &= CHECK_OK(fcclRecv(recv, N, fcclInt32, prev, nb, NULL));
  }
  ok &= CHECK_OK(fcclAllReduce(x, y, 3, fcclInt32, fcclSum, nb, NULL));
  ok &= CHECK_RES(fcclGroupEnd(), fcclInProgress);
  if (SETTLE(nb, "group") && ok) {
    CHECK(y[0] == nranks * (nranks - 1) / 2 && y[1] == nranks && y[2] == -y[0],
          "group all_reduce: %d %d %d", (int)y[0], (int)y[1], (int)y[2]);
    if (nranks > 1) {
      for (i = 0; i < N; i++)
        if (recv[i] != prev * 100003 + i) {
          CHECK(0, "group ring: element %d = %d, want %d", i, (int)recv[i], prev * 100003 + i);
          break;
        }
      BYTES_CHECK((unsigned char*)recv + N * 4, FCCL_SLACK, FCCL_SENT_RECV, "group ring: bytes past the receive");
    }
  }
  free(send);
  free(recv);
}

static void part_args(fcclComm_t nb) {
  float x[4] = {1, 2, 3, 4}, y[4] = {0, 0, 0, 0};
  fcclResult_t st = fcclInternalError;
  fccl_phase("args: refused at once");
  CHECK_ERR(fcclAllReduce(x, y, 4, (fcclDataType_t)99, fcclSum, nb, NULL), fcclInvalidArgument,
            "fcclAllReduce");
  CHECK_ERR(fcclAllReduce(NULL, y, 4, fcclFloat32, fcclSum, nb, NULL), fcclInvalidArgument, "fcclAllReduce");
  if (CHECK_OK(fcclCommGetAsyncError(nb, &st)))
    CHECK(st == fcclSuccess, "a refused call left fcclCommGetAsyncError at %d (%s)", (int)st, fccl_res_name(st));
  CHECK(y[0] == 0, "a refused call wrote its receive buffer");
}

static void part_mix(fcclComm_t comm, fcclComm_t nb, int nranks) {
  int64_t x = 5, y = 0, z = 7;
  fccl_phase("mix: a blocking communicator's call in a non-blocking group");
  CHECK_OK(fcclGroupStart());
  CHECK_OK(fcclAllReduce(&x, &y, 1, fcclInt64, fcclSum, nb, NULL));
  CHECK_ERR(fcclAllReduce(&z, &z, 1, fcclInt64, fcclSum, comm, NULL), fcclInvalidUsage, "fcclAllReduce");
  CHECK(strstr(fcclGetLastError(NULL), "a group takes one kind") != NULL, "%s", fcclGetLastError(NULL));
  CHECK_RES(fcclGroupEnd(), fcclInProgress);
  if (SETTLE(nb, "mix")) CHECK(y == 5 * nranks && z == 7, "mix: y = %lld, z = %lld", (long long)y, (long long)z);
}

static void part_coalesced(fcclComm_t nb, int rank, int nranks) {
  enum { NB = 3 };
  size_t counts[NB] = {10, 70000, 3};
  float* bufs[NB];
  const void* sends[NB];
  void* recvs[NB];
  int b, ok;
  size_t i;
  fccl_phase("coalesced: one fcclAllReduceCoalesced");
  for (b = 0; b < NB; b++) {
    bufs[b] = fccl_xmalloc(counts[b] * 4);
    for (i = 0; i < counts[b]; i++) bufs[b][i] = (float)(rank + b + (int)(i % 9));
    sends[b] = recvs[b] = bufs[b];
  }
  ok = ISSUED(fcclAllReduceCoalesced(sends, recvs, counts, NB, fcclFloat32, fcclSum, 4096, nb, NULL));
  if (SETTLE(nb, "coalesced") && ok)
    for (b = 0; b < NB; b++)
      for (i = 0; i < counts[b]; i++) {
        float want = (float)(nranks * (nranks - 1) / 2 + nranks * (b + (int)(i % 9)));
        if (bufs[b][i] != want) {
          CHECK(0, "coalesced buffer %d element %zu = %g, want %g", b, i, bufs[b][i], want);
          break;
        }
      }
  for (b = 0; b < NB; b++) free(bufs[b]);
}

static void part_finalize(fcclComm_t nb) {
  int x = 1;
  fccl_phase("finalize");
  ISSUED(fcclCommFinalize(nb));
  SETTLE(nb, "finalize");
  CHECK_ERR(fcclAllReduce(&x, &x, 1, fcclInt32, fcclSum, nb, NULL), fcclInvalidUsage, "fcclAllReduce");
  CHECK(strstr(fcclGetLastError(NULL), "finalized") != NULL, "%s", fcclGetLastError(NULL));
  CHECK_OK(fcclCommDestroy(nb));
}

static void part_error(fcclComm_t comm, int rank) {
  fcclComm_t nb = nb_split(comm, rank, "nb-error");
  int32_t x[16], y[16], z[4] = {9, 9, 9, 9};
  fcclResult_t st = fcclSuccess, res;
  int i;
  if (!nb) return;
  fccl_phase("error: counts differ by rank");
  for (i = 0; i < 16; i++) x[i] = y[i] = i;
  ISSUED(fcclAllReduce(x, y, (size_t)(10 + rank), fcclInt32, fcclSum, nb, NULL));
  /* Queued behind the failing call (or refused if it failed already): never runs. */
  res = fcclAllReduce(z, z, 4, fcclInt32, fcclSum, nb, NULL);
  CHECK(res == fcclInProgress || res == fcclSuccess || res == fcclInvalidUsage, "the call behind: %d", (int)res);
  st = fccl_wait_comm(nb);
  CHECK(st == fcclCollectiveMismatch, "mismatched counts: fcclCommGetAsyncError = %d (%s), want "
        "fcclCollectiveMismatch; \"%s\"", (int)st, fccl_res_name(st), fcclGetLastError(NULL));
  CHECK(strncmp(fcclGetLastError(NULL), "fcclAllReduce: ", 15) == 0, "the message names the call: %s",
        fcclGetLastError(NULL));
  CHECK(z[0] == 9 && z[3] == 9, "the call queued behind the failed one ran");
  CHECK_OK(fcclCommGetAsyncError(nb, &st));
  CHECK(st == fcclCollectiveMismatch, "the error did not stick: %d", (int)st);
  CHECK_ERR(fcclBarrier(nb, NULL), fcclInvalidUsage, "fcclBarrier");
  CHECK(strstr(fcclGetLastError(NULL), "unusable after an earlier error") != NULL, "%s", fcclGetLastError(NULL));
  CHECK_OK(fcclCommDestroy(nb));
}

static void part_abort(fcclComm_t comm, int rank) {
  fcclComm_t nb = nb_split(comm, rank, "nb-abort");
  fcclResult_t st = fcclSuccess;
  unsigned char* buf = fccl_xmalloc((size_t)1 << 20);
  memset(buf, 0x33, (size_t)1 << 20);
  if (nb && rank == 0) {
    double t0;
    struct timespec pause = {0, 20 * 1000000};
    fccl_phase("abort: rank 0 receives from rank 1, which never sends");
    CHECK_RES(fcclRecv(buf, (size_t)1 << 20, fcclUint8, 1, nb, NULL), fcclInProgress);
    nanosleep(&pause, NULL);
    if (CHECK_OK(fcclCommGetAsyncError(nb, &st)))
      CHECK(st == fcclInProgress, "a receive with no sender ended: %d (%s)", (int)st, fccl_res_name(st));
    t0 = now_s();
    CHECK_OK(fcclCommAbort(nb));
    CHECK(now_s() - t0 < NB_TIMEOUT_MS / 2000.0, "fcclCommAbort took %.1f s: it waited for the pending "
          "receive's timeout", now_s() - t0);
    BYTES_CHECK(buf, (size_t)1 << 20, 0x33, "the aborted receive's buffer");
    CHECK_ERR(fcclCommGetAsyncError(nb, &st), fcclInvalidArgument, "fcclCommGetAsyncError");
  }
  fccl_sync(comm);
  if (nb && rank != 0) {
    int x = 1;
    fccl_phase("abort: rank %d calls after rank 0 aborted", rank);
    ISSUED(fcclAllReduce(&x, &x, 1, fcclInt32, fcclSum, nb, NULL));
    st = fccl_wait_comm(nb);
    CHECK(st == fcclRemoteError, "after rank 0 aborted: %d (%s), want fcclRemoteError; \"%s\"", (int)st,
          fccl_res_name(st), fcclGetLastError(NULL));
    CHECK_OK(fcclCommDestroy(nb));
  }
  free(buf);
}

static void part_destroy(fcclComm_t comm, int rank, int nranks) {
  fcclComm_t nb = nb_split(comm, rank, "nb-destroy");
  enum { N = 300007 };
  int32_t* x = fccl_xmalloc(N * 4);
  int i;
  if (nb) {
    fccl_phase("destroy right after a call");
    for (i = 0; i < N; i++) x[i] = rank + i % 3;
    ISSUED(fcclAllReduce(x, x, N, fcclInt32, fcclSum, nb, NULL));
    CHECK_OK(fcclCommDestroy(nb));
    for (i = 0; i < N; i++)
      if (x[i] != nranks * (nranks - 1) / 2 + nranks * (i % 3)) {
        CHECK(0, "fcclCommDestroy returned before the call finished: element %d = %d", i, (int)x[i]);
        break;
      }
  }
  free(x);
}

static int body(fcclComm_t comm, int rank, int nranks) {
  fcclComm_t nb = part_create(comm, rank, nranks);
  fccl_sync(comm);
  if (nb) {
    part_queue(nb, rank, nranks);
    CHECK(count_ours() >= 1, "no progress thread after calls on a non-blocking communicator");
    part_group(nb, rank, nranks);
    part_args(nb);
    part_mix(comm, nb, nranks);
    part_coalesced(nb, rank, nranks);
    part_finalize(nb);
  }
  fccl_sync(comm);
  if (nranks > 1) {
    part_error(comm, rank);
    part_abort(comm, rank);
  }
  part_destroy(comm, rank, nranks);
  fccl_sync(comm); /* threads mode: every rank's communicators are gone */
  {
    /* the harness communicator's split thread ends right after its last job: let it */
    struct timespec pause = {0, 1000000};
    int k;
    for (k = 0; k < 2000 && count_ours() != 0; k++) nanosleep(&pause, NULL);
  }
  CHECK(count_ours() == 0, "%d creation or progress thread(s) left after every non-blocking communicator "
        "was destroyed", count_ours());
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
