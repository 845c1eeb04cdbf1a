/* Ranks that pass different calls never get a silent wrong result, with or without
 * checkMode (the suite runs this with FERROCCL_CHECK=0 and =1).
 *
 * FCCL_TEST_CASE selects what runs:
 *   all (default)  On one host (processes or threads): for every collective, at sizes
 *                  that take each path (the board, the buffers mapped into each other,
 *                  the links), rank 1 passes twice the count (then another type, op or
 *                  root) of the others. Every rank must return fcclCollectiveMismatch
 *                  naming both calls, nothing may land in the receive buffers, and the
 *                  communicator must stay usable (a right all_reduce follows each case).
 *   abort          Rank 0 passes 4000 elements to an all_reduce, the others 4096; each
 *                  rank aborts its communicator as soon as its call returns (5 rounds,
 *                  each on a communicator split off the harness's). Every rank must
 *                  still return fcclCollectiveMismatch: the announcements every rank
 *                  needs were delivered before any abort.
 *   links          (FERROCCL_TRANSPORT=tcp: no shared memory between the ranks) an
 *                  all_reduce of different counts: every rank must return
 *                  fcclCollectiveMismatch; the communicator is unusable after it with
 *                  FERROCCL_CHECK=0 (found in a message) and usable with checkMode on.
 *   links-bcast    the same with a broadcast where rank 1's count differs: rank 1 must
 *                  return it; the root, which only sends, and receivers whose call
 *                  matched the root's (their data is right) return it or success, and
 *                  then their next call must return it. */
#include "harness.h"

#define GUARD 0x5a

static const char* case_name(void) {
  const char* c = getenv("FCCL_TEST_CASE");
  return c && *c ? c : "all";
}

enum { K_ALLREDUCE, K_BCAST, K_REDUCE, K_ALLGATHER, K_RS, K_A2A, K_GATHER, K_SCATTER, NKINDS };
static const char* const KNAME[NKINDS] = {"all_reduce", "broadcast", "reduce",  "all_gather",
                                          "reduce_scatter", "all_to_all", "gather", "scatter"};

/* Elements a rank's buffers hold for `count` (the largest a call of `k` may touch). */
static size_t span(int k, size_t count, int nranks) {
  switch (k) {
  case K_ALLREDUCE:
  case K_BCAST:
  case K_REDUCE:
    return count;
  default:
    return count * (size_t)nranks;
  }
}

static fcclResult_t run_call(int k, const void* s, void* r, size_t count, fcclDataType_t dt, fcclRedOp_t op,
                             int root, fcclComm_t comm) {
  switch (k) {
  case K_ALLREDUCE:
    return fcclAllReduce(s, r, count, dt, op, comm, NULL);
  case K_BCAST:
    return fcclBroadcast(s, r, count, dt, root, comm, NULL);
  case K_REDUCE:
    return fcclReduce(s, r, count, dt, op, root, comm, NULL);
  case K_ALLGATHER:
    return fcclAllGather(s, r, count, dt, comm, NULL);
  case K_RS:
    return fcclReduceScatter(s, r, count, dt, op, comm, NULL);
  case K_A2A:
    return fcclAlltoAll(s, r, count, dt, comm, NULL);
  case K_GATHER:
    return fcclGather(s, r, count, dt, root, comm, NULL);
  default:
    return fcclScatter(s, r, count, dt, root, comm, NULL);
  }
}

/* A right all_reduce: the communicator is still usable and in step. */
static void still_usable(fcclComm_t comm, int nranks, const char* after) {
  float x[3] = {1, 2, 3};
  if (!CHECK_OK(fcclAllReduce(x, x, 3, fcclFloat32, fcclSum, comm, NULL))) return;
  CHECK(x[0] == (float)nranks && x[2] == (float)(3 * nranks), "all_reduce after %s gave %g %g", after,
        (double)x[0], (double)x[2]);
}

/* One mismatched call: every rank must say so, and the receive buffer is untouched. */
static void one_case(fcclComm_t comm, int rank, int nranks, int k, size_t base, const char* how) {
  size_t count = base;
  fcclDataType_t dt = fcclFloat32;
  fcclRedOp_t op = fcclSum;
  int root = 0;
  if (rank == 1) {
    if (strcmp(how, "count") == 0) count = 2 * base;
    if (strcmp(how, "type") == 0) dt = fcclInt32; /* same bytes, other type */
    if (strcmp(how, "op") == 0) op = fcclMax;
    if (strcmp(how, "root") == 0) root = 1;
  }
  size_t n = span(k, 2 * base, nranks);
  unsigned char* s = malloc(n * 4 + 64);
  unsigned char* r = malloc(n * 4 + 64);
  if (!s || !r) {
    CHECK(0, "out of memory");
    free(s);
    free(r);
    return;
  }
  memset(s, 1, n * 4);
  memset(r, GUARD, n * 4);
  fccl_phase("%s of %zu elements, rank 1 differs in its %s", KNAME[k], base, how);
  fcclResult_t res = run_call(k, s, r, count, dt, op, root, comm);
  const char* msg = fcclGetLastError(NULL);
  CHECK(res == fcclCollectiveMismatch, "%s of %zu elements, rank 1's %s differs: returned %s (%s)", KNAME[k], base, how,
        fccl_res_name(res), msg);
  if (res == fcclCollectiveMismatch) {
    char me[32];
    snprintf(me, sizeof me, "rank %d called", rank);
    CHECK(strstr(msg, me) && strstr(msg, "rank 1 called"), "%s: the verdict names this rank's call and rank 1's: %s",
          KNAME[k], msg);
  }
  size_t i;
  for (i = 0; i < n * 4; i++) {
    if (r[i] != GUARD) {
      CHECK(0, "%s of %zu elements, rank 1's %s differs: byte %zu of the receive buffer was written", KNAME[k],
            base, how, i);
      break;
    }
  }
  free(s);
  free(r);
  still_usable(comm, nranks, KNAME[k]);
}

static int body_all(fcclComm_t comm, int rank, int nranks) {
  /* 1 element and 1000: the board; 20000: above the board, between mapped buffers or on
   * the links; 300000: large pieces. */
  static const size_t BASES[] = {1, 1000, 20000, 300000};
  int k;
  size_t b;
  if (nranks < 2) return FCCL_SKIP;
  for (k = 0; k < NKINDS; k++)
    for (b = 0; b < sizeof BASES / sizeof BASES[0]; b++) one_case(comm, rank, nranks, k, BASES[b], "count");
  for (k = 0; k < NKINDS; k++) one_case(comm, rank, nranks, k, 1000, "type");
  one_case(comm, rank, nranks, K_ALLREDUCE, 1000, "op");
  one_case(comm, rank, nranks, K_RS, 1000, "op");
  one_case(comm, rank, nranks, K_BCAST, 1000, "root");
  one_case(comm, rank, nranks, K_GATHER, 20000, "root");
  return fccl_failures();
}

static int body_abort(fcclComm_t comm, int rank, int nranks) {
  float* x;
  size_t count = rank == 0 ? 4000 : 4096;
  fcclResult_t res;
  fcclComm_t sub = NULL;
  int round;
  if (nranks < 2) return FCCL_SKIP;
  x = calloc(4096, sizeof(float));
  if (!x) return 1;
  /* Each round on a communicator split off the harness's, which the abort ends. */
  for (round = 0; round < 5; round++) {
    fccl_phase("round %d: split", round);
    if (!CHECK_OK(fcclCommSplit(comm, 0, rank, &sub, NULL))) break;
    fccl_phase("round %d: all_reduce of 4000 / 4096 elements, then an abort at once", round);
    res = fcclAllReduce(x, x, count, fcclFloat32, fcclSum, sub, NULL);
    CHECK(res == fcclCollectiveMismatch, "round %d, rank %d: mismatched all_reduce returned %s (%s), expected the verdict",
          round, rank, fccl_res_name(res), fcclGetLastError(NULL));
    CHECK_OK(fcclCommAbort(sub));
  }
  free(x);
  return fccl_failures();
}

static int body_links(fcclComm_t comm, int rank, int nranks) {
  float* x;
  fcclResult_t res;
  if (nranks < 2) return FCCL_SKIP;
  x = calloc(4000, sizeof(float));
  if (!x) return 1;
  fccl_phase("all_reduce of different counts over the links");
  res = fcclAllReduce(x, x, rank == 1 ? 2000 : 1000, fcclFloat32, fcclSum, comm, NULL);
  CHECK(res == fcclCollectiveMismatch, "rank %d: all_reduce of different counts returned %s (%s)", rank,
        fccl_res_name(res), fcclGetLastError(NULL));
  fccl_phase("a second call");
  res = fcclAllReduce(x, x, 10, fcclFloat32, fcclSum, comm, NULL);
  if (getenv("FERROCCL_CHECK") && strcmp(getenv("FERROCCL_CHECK"), "0") == 0)
    /* Found in a message: the streams are out of step, the communicator is done. */
    CHECK(res != fcclSuccess, "rank %d: a call after the mismatch succeeded", rank);
  else
    /* Found by comparing the calls first: nothing moved, the communicator goes on. */
    CHECK(res == fcclSuccess, "rank %d: a call after a mismatch found by checkMode returned %s (%s)", rank,
          fccl_res_name(res), fcclGetLastError(NULL));
  free(x);
  return fccl_failures();
}

/* A rooted call over the links: the root only sends, and may return before a peer
 * answers; its next call must fail with the verdict. */
static int body_links_bcast(fcclComm_t comm, int rank, int nranks) {
  float* x;
  fcclResult_t res;
  if (nranks < 2) return FCCL_SKIP;
  x = calloc(4000, sizeof(float));
  if (!x) return 1;
  fccl_phase("broadcast of different counts over the links");
  res = fcclBroadcast(x, x, rank == 1 ? 2000 : 1000, fcclFloat32, 0, comm, NULL);
  if (rank == 1)
    CHECK(res == fcclCollectiveMismatch, "rank 1, whose count differs from the root's, returned %s (%s)",
          fccl_res_name(res), fcclGetLastError(NULL));
  else
    /* The root, and receivers whose call matched the root's, may not have heard yet. */
    CHECK(res == fcclCollectiveMismatch || res == fcclSuccess, "rank %d returned %s (%s)", rank, fccl_res_name(res),
          fcclGetLastError(NULL));
  fccl_phase("the next call");
  if (res == fcclSuccess) {
    res = fcclAllReduce(x, x, 10, fcclFloat32, fcclSum, comm, NULL);
    CHECK(res == fcclCollectiveMismatch, "rank %d's call after a broadcast of different counts returned %s (%s)", rank,
          fccl_res_name(res), fcclGetLastError(NULL));
  }
  free(x);
  return fccl_failures();
}

static int body(fcclComm_t comm, int rank, int nranks) {
  const char* c = case_name();
  if (strcmp(c, "abort") == 0) return body_abort(comm, rank, nranks);
  if (strcmp(c, "links") == 0) return body_links(comm, rank, nranks);
  if (strcmp(c, "links-bcast") == 0) return body_links_bcast(comm, rank, nranks);
  return body_all(comm, rank, nranks);
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
