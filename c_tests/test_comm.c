/* Communicator queries and life cycle: count / rank / device, version, async error,
 * fcclCommInitRankConfig with FCCL_CONFIG_INITIALIZER and a name, finalize + destroy,
 * abort, the host exchanges of the last call, and a second communicator (from fcclCommSplit, and in threads mode also from a
 * shared unique id) used alongside the first. */
#include "cuda_probe.h"
#include "harness.h"

/* all_reduce(sum) of int32 values rank*1000 + i*salt on comm; checked. */
static void sum_check(fcclComm_t comm, int rank, int nranks, int salt, const char* which) {
  enum { N = 1001 };
  int32_t* send = (int32_t*)fccl_xmalloc(N * sizeof(int32_t));
  int32_t* recv = (int32_t*)fccl_xmalloc(N * sizeof(int32_t));
  int i, shown = 0;
  fccl_phase("all_reduce on %s", which);
  for (i = 0; i < N; i++) send[i] = rank * 1000 + i * salt;
  memset(recv, 0xA5, N * sizeof(int32_t));
  if (CHECK_OK(fcclAllReduce(send, recv, N, fcclInt32, fcclSum, comm, NULL))) {
    for (i = 0; i < N; i++) {
      int32_t want = (int32_t)(1000 * nranks * (nranks - 1) / 2 + nranks * i * salt);
      if (recv[i] != want && shown++ < 3)
        CHECK(0, "all_reduce on %s: element %d = %d, expected %d", which, i, (int)recv[i],
              (int)want);
    }
  }
  free(send);
  free(recv);
}

static void check_queries(fcclComm_t comm, int rank, int nranks, const char* which) {
  int v;
  fcclResult_t ae = fcclInternalError;
  v = -7;
  if (CHECK_OK(fcclCommCount(comm, &v)))
    CHECK(v == nranks, "%s: fcclCommCount = %d, expected %d", which, v, nranks);
  v = -7;
  if (CHECK_OK(fcclCommUserRank(comm, &v)))
    CHECK(v == rank, "%s: fcclCommUserRank = %d, expected %d", which, v, rank);
  v = -7;
  if (CHECK_OK(fcclCommCuDevice(comm, &v))) {
    int want = fccl_threads_mode() ? -1 : fccl_current_cuda_device();
    CHECK(v == want, "%s: fcclCommCuDevice = %d, expected %d (the device current at creation, -1 for none)",
          which, v, want);
  }
  if (CHECK_OK(fcclCommGetAsyncError(comm, &ae)))
    CHECK(ae == fcclSuccess, "%s: fcclCommGetAsyncError reports %d (%s)", which, (int)ae,
          fccl_res_name(ae));
}

static int body(fcclComm_t comm, int rank, int nranks) {
  int version = -1;
  fcclUniqueId id1, id2;
  fcclComm_t c1 = NULL, c2 = NULL, c3 = NULL, c4 = NULL;
  const char* s;

  /* queries on the harness' communicator */
  check_queries(comm, rank, nranks, "main comm");
  s = fcclGetLastError(comm);
  CHECK(s != NULL, "fcclGetLastError(comm) returned NULL");
  s = fcclGetLastError(NULL);
  CHECK(s != NULL, "fcclGetLastError(NULL) returned NULL");
  s = fcclGetErrorString(fcclSuccess);
  CHECK(s != NULL && s[0] != '\0', "fcclGetErrorString(fcclSuccess) is NULL or empty");

  /* version: MAJOR*10000 + MINOR*100 + PATCH */
  if (CHECK_OK(fcclGetVersion(&version))) {
    CHECK(version > 0, "fcclGetVersion = %d", version);
#if defined(FCCL_MAJOR) && defined(FCCL_MINOR) && defined(FCCL_PATCH)
    CHECK(version == FCCL_MAJOR * 10000 + FCCL_MINOR * 100 + FCCL_PATCH,
          "fcclGetVersion = %d but the header says %d.%d.%d", version, (int)FCCL_MAJOR,
          (int)FCCL_MINOR, (int)FCCL_PATCH);
#endif
#ifdef FCCL_VERSION_CODE
    CHECK(version == (int)FCCL_VERSION_CODE, "fcclGetVersion = %d but FCCL_VERSION_CODE = %d",
          version, (int)FCCL_VERSION_CODE);
#endif
  }

  /* two unique ids differ */
  if (CHECK_OK(fcclGetUniqueId(&id1)) && CHECK_OK(fcclGetUniqueId(&id2)))
    CHECK(memcmp(&id1, &id2, sizeof id1) != 0, "two fcclGetUniqueId calls gave the same id");

  /* a private one-rank communicator from fcclCommInitRankConfig, finalized then destroyed */
  fccl_phase("fcclCommInitRankConfig (1 rank)");
  {
    fcclConfig_t cfg = FCCL_CONFIG_INITIALIZER;
    cfg.commName = "ferroccl-test-single";
    if (CHECK_OK(fcclCommInitRankConfig(&c1, 1, id1, 0, &cfg))) {
      CHECK(c1 != NULL, "fcclCommInitRankConfig returned success and a NULL comm");
    }
  }
  if (c1) {
    check_queries(c1, 0, 1, "one-rank comm");
    sum_check(c1, 0, 1, 3, "one-rank comm");
    sum_check(comm, rank, nranks, 5, "main comm (with a one-rank comm alive)");
#ifndef FCCL_MISSING_fcclCommGetLastExchanges
    {
      /* A host-memory call's only messages are its data. */
      int e = -7;
      if (CHECK_OK(fcclCommGetLastExchanges(comm, &e)))
        CHECK(e == 0, "fcclCommGetLastExchanges after a host all_reduce = %d, expected 0", e);
      CHECK(fcclCommGetLastExchanges(comm, NULL) == fcclInvalidArgument,
            "fcclCommGetLastExchanges(comm, NULL) did not return fcclInvalidArgument");
    }
#endif
    CHECK_OK(fcclCommFinalize(c1));
    CHECK_OK(fcclCommDestroy(c1));
  }

  /* threads mode: an nranks-rank communicator from a shared id, with a config */
  if (fccl_shared_id()) {
    fcclConfig_t cfg = FCCL_CONFIG_INITIALIZER;
    cfg.commName = "ferroccl-test-shared";
    fccl_phase("fcclCommInitRankConfig (%d ranks, shared id)", nranks);
    if (CHECK_OK(fcclCommInitRankConfig(&c2, nranks, *fccl_shared_id(), rank, &cfg)))
      CHECK(c2 != NULL, "fcclCommInitRankConfig returned success and a NULL comm");
    if (c2) {
      check_queries(c2, rank, nranks, "shared-id comm");
      sum_check(c2, rank, nranks, 7, "shared-id comm");
      sum_check(comm, rank, nranks, 11, "main comm (with the shared-id comm alive)");
      sum_check(c2, rank, nranks, 13, "shared-id comm (again)");
      CHECK_OK(fcclCommFinalize(c2));
      CHECK_OK(fcclCommDestroy(c2));
    }
    /* keep the collective sequence equal on every rank even if one rank failed */
  }

  /* a second communicator over the same ranks, derived with split (works in every mode) */
  fccl_phase("fcclCommSplit(comm, 0, rank)");
  if (CHECK_OK(fcclCommSplit(comm, 0, rank, &c3, NULL)))
    CHECK(c3 != NULL, "fcclCommSplit with color 0 returned a NULL comm");
  if (c3) {
    int i;
    check_queries(c3, rank, nranks, "split comm");
    for (i = 0; i < 3; i++) {
      sum_check(comm, rank, nranks, 17 + i, "main comm (interleaved)");
      sum_check(c3, rank, nranks, 23 + i, "split comm (interleaved)");
    }
    CHECK_OK(fcclBarrier(c3, NULL));
    CHECK_OK(fcclBarrier(comm, NULL));
    CHECK_OK(fcclCommFinalize(c3));
    CHECK_OK(fcclCommDestroy(c3));
  }
  sum_check(comm, rank, nranks, 29, "main comm (after destroying the split comm)");

  /* abort frees a communicator */
  fccl_phase("fcclCommAbort of a one-rank comm");
  if (CHECK_OK(fcclGetUniqueId(&id2)) && CHECK_OK(fcclCommInitRank(&c4, 1, id2, 0)) && c4) {
    sum_check(c4, 0, 1, 31, "one-rank comm before abort");
    CHECK_OK(fcclCommAbort(c4));
  }
  sum_check(comm, rank, nranks, 37, "main comm (at the end)");
  check_queries(comm, rank, nranks, "main comm (at the end)");
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
