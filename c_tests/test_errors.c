/* Bad input for every function of docs/abi.md's "Communicators", "Memory" and "Collectives":
 * NULL out-pointers, NULL / destroyed / foreign comms, nranks <= 0, ranks, roots and peers
 * out of range, unknown data types and ops, NULL buffers with count > 0, byte sizes that
 * overflow size_t.  Each must return the documented code, leave a last-error message
 * naming the function (fcclGetLastError(NULL)), write nothing, and crash nothing; the
 * communicator must still work afterwards.  Also: error strings, fcclGetVersion,
 * fcclMemAlloc without CUDA, fcclMemAllocHost, a thread-local last error.
 *
 * All bad calls are made identically by every rank (a bad root, type, ... is bad on
 * every rank), so no rank waits on another inside a collective.  Calls that would be bad
 * on one rank only (NULL recvbuff on the root of a reduce, ...) run at 1 rank only. */
#include "harness.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#define NE 8 /* elements in the test buffers */

static const int bad_dts[3] = {12, -1, 1000};
static const int bad_ops[2] = {5, -1};
static char g_dummy_object;
#define DUMMY_COMM ((fcclComm_t)(void*)&g_dummy_object)
#define DUMMY_PTR ((void*)&g_dummy_object)

typedef struct {
  unsigned char* send;
  unsigned char* recv;
  size_t rbytes;
} bufs_t;

/* A bad call: the expected code, a message naming fname, recvbuff untouched. */
#define BAD(call, want, fname)                                                       \
  do {                                                                               \
    CHECK_ERR(call, want, fname);                                                    \
    BYTES_CHECK(B->recv, B->rbytes, FCCL_SENT_RECV, "after " #call ": recvbuff"); \
  } while (0)

static int out_untouched_comm(fcclComm_t c) { return c == DUMMY_COMM || c == NULL; }

/* ------------------------------------------------------------------ misc */

static void part_misc(void) {
  static const int results[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 100, 101};
  const char* s;
  size_t i;
  fccl_phase("error strings, version");
  for (i = 0; i < sizeof results / sizeof results[0]; i++) {
    s = fcclGetErrorString((fcclResult_t)results[i]);
    CHECK(s != NULL && s[0] != '\0', "fcclGetErrorString(%d) is %s", results[i],
          s ? "empty" : "NULL");
  }
  s = fcclGetErrorString((fcclResult_t)9999);
  CHECK(s != NULL && s[0] != '\0', "fcclGetErrorString(9999) (unknown) is %s", s ? "empty" : "NULL");
  s = fcclGetErrorString((fcclResult_t)-1);
  CHECK(s != NULL && s[0] != '\0', "fcclGetErrorString(-1) (unknown) is %s", s ? "empty" : "NULL");
  {
    const char* a = fcclGetErrorString(fcclSuccess);
    const char* b = fcclGetErrorString(fcclInvalidArgument);
    CHECK(a && b && strcmp(a, b) != 0, "fcclSuccess and fcclInvalidArgument have the same string");
  }
  CHECK_ERR(fcclGetVersion(NULL), fcclInvalidArgument, "fcclGetVersion");
  {
    int v = -1;
    if (CHECK_OK(fcclGetVersion(&v))) CHECK(v > 0, "fcclGetVersion gave %d", v);
  }
  CHECK(fcclGetLastError(NULL) != NULL, "fcclGetLastError(NULL) returned NULL");
}

/* ------------------------------------------------------------------ memory */

static void part_memory(void) {
  void* p;
  fcclResult_t r;
  long page = sysconf(_SC_PAGESIZE);
  const size_t sz = 100000;
  fccl_phase("memory");
  CHECK_ERR(fcclMemAlloc(NULL, 64), fcclInvalidArgument, "fcclMemAlloc");
  p = DUMMY_PTR;
  r = fcclMemAlloc(&p, 64);
  if (r == fcclSuccess) { /* a CUDA device is present: fine */
    CHECK(p != NULL && p != DUMMY_PTR, "fcclMemAlloc returned success without a pointer");
    if (p != DUMMY_PTR) CHECK_OK(fcclMemFree(p));
  } else {
    CHECK_ERR(r, fcclUnavailable, "fcclMemAlloc");
    CHECK(p == DUMMY_PTR || p == NULL, "failed fcclMemAlloc wrote %p to *ptr", p);
  }

  CHECK_ERR(fcclMemAllocHost(NULL, 64), fcclInvalidArgument, "fcclMemAllocHost");
  p = NULL;
  if (CHECK_OK(fcclMemAllocHost(&p, sz))) {
    CHECK(p != NULL, "fcclMemAllocHost returned success and NULL");
    if (p) {
      unsigned char* b = (unsigned char*)p;
      CHECK(page <= 0 || (uintptr_t)p % (uintptr_t)page == 0,
            "fcclMemAllocHost pointer %p is not page-aligned (page %ld)", p, page);
      memset(b, 0x5A, sz);
      CHECK(b[0] == 0x5A && b[sz / 2] == 0x5A && b[sz - 1] == 0x5A,
            "fcclMemAllocHost memory is not writable");
      CHECK_OK(fcclMemFree(p));
    }
  }
  p = DUMMY_PTR;
  r = fcclMemAllocHost(&p, SIZE_MAX);
  CHECK_ERR2(r, fcclSystemError, fcclInvalidArgument, "fcclMemAllocHost");
  if (r == fcclSuccess && p != DUMMY_PTR) CHECK_OK(fcclMemFree(p));
  else CHECK(p == DUMMY_PTR || p == NULL, "failed fcclMemAllocHost(SIZE_MAX) wrote %p", p);
  CHECK_OK(fcclMemFree(NULL));
}

/* ------------------------------------------------------------------ collectives */

/* Every collective / p2p call with `comm` as the (bad) communicator. */
static void all_calls_bad_comm(fcclComm_t comm, bufs_t* B, const char* which) {
  size_t c1[1] = {1}, d1[1] = {0};
  fccl_phase("collectives on a %s comm", which);
  BAD(fcclAllReduce(B->send, B->recv, NE, fcclFloat32, fcclSum, comm, NULL), fcclInvalidArgument,
      "fcclAllReduce");
  BAD(fcclBroadcast(B->send, B->recv, NE, fcclFloat32, 0, comm, NULL), fcclInvalidArgument,
      "fcclBroadcast");
#ifndef FCCL_MISSING_fcclReduce
  BAD(fcclReduce(B->send, B->recv, NE, fcclFloat32, fcclSum, 0, comm, NULL), fcclInvalidArgument,
      "fcclReduce");
#endif
#ifndef FCCL_MISSING_fcclAllGather
  BAD(fcclAllGather(B->send, B->recv, 1, fcclFloat32, comm, NULL), fcclInvalidArgument,
      "fcclAllGather");
#endif
#ifndef FCCL_MISSING_fcclReduceScatter
  BAD(fcclReduceScatter(B->send, B->recv, 1, fcclFloat32, fcclSum, comm, NULL),
      fcclInvalidArgument, "fcclReduceScatter");
#endif
#ifndef FCCL_MISSING_fcclAlltoAll
  BAD(fcclAlltoAll(B->send, B->recv, 1, fcclFloat32, comm, NULL), fcclInvalidArgument,
      "fcclAlltoAll");
#endif
#ifndef FCCL_MISSING_fcclGather
  BAD(fcclGather(B->send, B->recv, 1, fcclFloat32, 0, comm, NULL), fcclInvalidArgument,
      "fcclGather");
#endif
#ifndef FCCL_MISSING_fcclScatter
  BAD(fcclScatter(B->send, B->recv, 1, fcclFloat32, 0, comm, NULL), fcclInvalidArgument,
      "fcclScatter");
#endif
#ifndef FCCL_MISSING_fcclAlltoAllv
  BAD(fcclAlltoAllv(B->send, c1, d1, B->recv, c1, d1, fcclFloat32, comm, NULL),
      fcclInvalidArgument, "fcclAlltoAllv");
#endif
  (void)c1;
  (void)d1;
#ifndef FCCL_MISSING_fcclSend
  BAD(fcclSend(B->send, NE, fcclFloat32, 0, comm, NULL), fcclInvalidArgument, "fcclSend");
#endif
#ifndef FCCL_MISSING_fcclRecv
  BAD(fcclRecv(B->recv, NE, fcclFloat32, 0, comm, NULL), fcclInvalidArgument, "fcclRecv");
#endif
  BAD(fcclBarrier(comm, NULL), fcclInvalidArgument, "fcclBarrier");
}

/* Every communicator function with `comm` as the (bad) communicator. */
static void comm_calls_bad_comm(fcclComm_t comm, int freeing_ok_on_null, const char* which) {
  int v = 12345;
  fcclResult_t ae = fcclInProgress;
  fcclComm_t nc = DUMMY_COMM;
  fccl_phase("communicator calls on a %s comm", which);
  CHECK_ERR(fcclCommCount(comm, &v), fcclInvalidArgument, "fcclCommCount");
  CHECK_ERR(fcclCommUserRank(comm, &v), fcclInvalidArgument, "fcclCommUserRank");
  CHECK_ERR(fcclCommCuDevice(comm, &v), fcclInvalidArgument, "fcclCommCuDevice");
  CHECK(v == 12345, "a query on a %s comm wrote %d to its out-pointer", which, v);
  CHECK_ERR(fcclCommGetAsyncError(comm, &ae), fcclInvalidArgument, "fcclCommGetAsyncError");
  CHECK(ae == fcclInProgress, "fcclCommGetAsyncError on a %s comm wrote %d", which, (int)ae);
  CHECK_ERR(fcclCommSplit(comm, 0, 0, &nc, NULL), fcclInvalidArgument, "fcclCommSplit");
  CHECK(out_untouched_comm(nc), "fcclCommSplit on a %s comm wrote a communicator", which);
  CHECK_ERR(fcclCommFinalize(comm), fcclInvalidArgument, "fcclCommFinalize");
  if (freeing_ok_on_null) { /* freeing NULL is a no-op, as in NCCL */
    CHECK_OK(fcclCommDestroy(comm));
    CHECK_OK(fcclCommAbort(comm));
  } else {
    CHECK_ERR(fcclCommDestroy(comm), fcclInvalidArgument, "fcclCommDestroy");
    CHECK_ERR(fcclCommAbort(comm), fcclInvalidArgument, "fcclCommAbort");
  }
}

static void part_stale(fcclComm_t comm, bufs_t* B) {
  fcclUniqueId id;
  fcclComm_t tmp = NULL;
  static unsigned char foreign[4096]; /* zeroes: not a communicator */
  fccl_phase("destroyed comm");
  if (CHECK_OK(fcclGetUniqueId(&id))) CHECK_OK(fcclCommInitRank(&tmp, 1, id, 0));
  /* threads mode: nobody creates a communicator (which could reuse the freed address)
   * between the destroy and the calls on the stale handle */
  if (tmp) {
    /* used first, so that this thread's lookup of the handle is cached */
    int n = 0;
    float x = 1.0f;
    CHECK_OK(fcclCommCount(tmp, &n));
    CHECK_OK(fcclAllReduce(&x, &x, 1, fcclFloat32, fcclSum, tmp, 0));
  }
  fccl_sync(comm);
  if (tmp) CHECK_OK(fcclCommDestroy(tmp));
  fccl_sync(comm);
  if (tmp) {
    comm_calls_bad_comm(tmp, 0, "destroyed");
    all_calls_bad_comm(tmp, B, "destroyed");
  }
  fccl_sync(comm);
  {
    int v = 12345;
    fccl_phase("foreign handle");
    CHECK_ERR(fcclCommCount((fcclComm_t)(void*)foreign, &v), fcclInvalidArgument, "fcclCommCount");
    CHECK(v == 12345, "fcclCommCount on a foreign handle wrote %d", v);
    BAD(fcclAllReduce(B->send, B->recv, NE, fcclFloat32, fcclSum, (fcclComm_t)(void*)foreign, NULL),
        fcclInvalidArgument, "fcclAllReduce");
  }
}

static void part_comm_args(fcclComm_t comm, int rank, int nranks) {
  fcclUniqueId id;
  fcclComm_t c;
  fcclComm_t cs[2];
  fcclResult_t r;
  static const int bad_dev[1] = {12345};
  (void)rank;
  fccl_phase("communicator functions: bad arguments");
  CHECK_ERR(fcclCommCount(comm, NULL), fcclInvalidArgument, "fcclCommCount");
  CHECK_ERR(fcclCommUserRank(comm, NULL), fcclInvalidArgument, "fcclCommUserRank");
  CHECK_ERR(fcclCommCuDevice(comm, NULL), fcclInvalidArgument, "fcclCommCuDevice");
  CHECK_ERR(fcclCommGetAsyncError(comm, NULL), fcclInvalidArgument, "fcclCommGetAsyncError");
  CHECK_ERR(fcclGetUniqueId(NULL), fcclInvalidArgument, "fcclGetUniqueId");

  /* fcclCommInitRank / Config: validation happens before any rendezvous */
  if (CHECK_OK(fcclGetUniqueId(&id))) {
    static const int nr[5] = {0, -1, 2, 2, 1};
    static const int rk[5] = {0, 0, 2, -1, 1};
    int k;
    CHECK_ERR(fcclCommInitRank(NULL, 1, id, 0), fcclInvalidArgument, "fcclCommInitRank");
    for (k = 0; k < 5; k++) {
      c = DUMMY_COMM;
      fccl_phase("fcclCommInitRank(nranks %d, rank %d)", nr[k], rk[k]);
      CHECK_ERR(fcclCommInitRank(&c, nr[k], id, rk[k]), fcclInvalidArgument, "fcclCommInitRank");
      CHECK(out_untouched_comm(c), "failed fcclCommInitRank(nranks %d, rank %d) wrote a comm",
            nr[k], rk[k]);
    }
    {
      fcclConfig_t cfg = FCCL_CONFIG_INITIALIZER;
      CHECK_ERR(fcclCommInitRankConfig(NULL, 1, id, 0, &cfg), fcclInvalidArgument,
                "fcclCommInitRankConfig");
      for (k = 0; k < 5; k++) {
        c = DUMMY_COMM;
        CHECK_ERR(fcclCommInitRankConfig(&c, nr[k], id, rk[k], &cfg), fcclInvalidArgument,
                  "fcclCommInitRankConfig");
        CHECK(out_untouched_comm(c), "failed fcclCommInitRankConfig wrote a comm");
      }
    }
  }
  if (CHECK_OK(fcclGetUniqueId(&id))) {
    fcclConfig_t cfg = FCCL_CONFIG_INITIALIZER;
    cfg.magic = 0; /* not initialised by FCCL_CONFIG_INITIALIZER */
    c = DUMMY_COMM;
    fccl_phase("fcclCommInitRankConfig with a bad config magic");
    r = fcclCommInitRankConfig(&c, 1, id, 0, &cfg);
    CHECK_ERR(r, fcclInvalidArgument, "fcclCommInitRankConfig");
    if (r == fcclSuccess && c && c != DUMMY_COMM) CHECK_OK(fcclCommDestroy(c));
  }

  /* fcclCommInitAll */
  fccl_phase("fcclCommInitAll: bad arguments");
  CHECK_ERR(fcclCommInitAll(NULL, 2, NULL), fcclInvalidArgument, "fcclCommInitAll");
  cs[0] = cs[1] = DUMMY_COMM;
  CHECK_ERR(fcclCommInitAll(cs, 0, NULL), fcclInvalidArgument, "fcclCommInitAll");
  CHECK_ERR(fcclCommInitAll(cs, -1, NULL), fcclInvalidArgument, "fcclCommInitAll");
  CHECK(out_untouched_comm(cs[0]) && out_untouched_comm(cs[1]),
        "failed fcclCommInitAll wrote comms");
  cs[0] = DUMMY_COMM;
  r = fcclCommInitAll(cs, 1, bad_dev);
  CHECK_ERR2(r, fcclInvalidArgument, fcclUnavailable, "fcclCommInitAll");
  if (r == fcclSuccess && cs[0] && cs[0] != DUMMY_COMM) CHECK_OK(fcclCommDestroy(cs[0]));

  CHECK_ERR(fcclCommInitFromEnv(NULL), fcclInvalidArgument, "fcclCommInitFromEnv");

  /* fcclCommSplit: every rank makes the same bad call */
  fccl_phase("fcclCommSplit: bad arguments");
  CHECK_ERR(fcclCommSplit(comm, 0, 0, NULL, NULL), fcclInvalidArgument, "fcclCommSplit");
  c = DUMMY_COMM;
  r = fcclCommSplit(comm, -2, 0, &c, NULL);
  CHECK_ERR(r, fcclInvalidArgument, "fcclCommSplit");
  if (r == fcclSuccess && c && c != DUMMY_COMM) CHECK_OK(fcclCommDestroy(c));
  else CHECK(out_untouched_comm(c), "failed fcclCommSplit wrote a comm");
  {
    fcclConfig_t cfg = FCCL_CONFIG_INITIALIZER;
    cfg.magic = 0;
    c = DUMMY_COMM;
    r = fcclCommSplit(comm, 0, 0, &c, &cfg);
    CHECK_ERR(r, fcclInvalidArgument, "fcclCommSplit");
    if (r == fcclSuccess && c && c != DUMMY_COMM) CHECK_OK(fcclCommDestroy(c));
  }
  (void)nranks;
}

static void part_collectives(fcclComm_t comm, int rank, int nranks, bufs_t* B) {
  const size_t ovf = SIZE_MAX / 2;                            /* * 4 bytes overflows */
  const size_t ovf_n = SIZE_MAX / (4 * (size_t)nranks) + 1;  /* * 4 fits, * 4 * n does not */
  int k;
  size_t* sc = (size_t*)fccl_xmalloc((size_t)nranks * sizeof(size_t));
  size_t* sd = (size_t*)fccl_xmalloc((size_t)nranks * sizeof(size_t));
  size_t* rc = (size_t*)fccl_xmalloc((size_t)nranks * sizeof(size_t));
  size_t* rd = (size_t*)fccl_xmalloc((size_t)nranks * sizeof(size_t));
  (void)rank;
  (void)ovf_n;

  fccl_phase("fcclAllReduce: bad arguments");
  for (k = 0; k < 3; k++)
    BAD(fcclAllReduce(B->send, B->recv, NE, (fcclDataType_t)bad_dts[k], fcclSum, comm, NULL),
        fcclInvalidArgument, "fcclAllReduce");
  for (k = 0; k < 2; k++)
    BAD(fcclAllReduce(B->send, B->recv, NE, fcclFloat32, (fcclRedOp_t)bad_ops[k], comm, NULL),
        fcclInvalidArgument, "fcclAllReduce");
  BAD(fcclAllReduce(NULL, B->recv, NE, fcclFloat32, fcclSum, comm, NULL), fcclInvalidArgument,
      "fcclAllReduce");
  BAD(fcclAllReduce(B->send, NULL, NE, fcclFloat32, fcclSum, comm, NULL), fcclInvalidArgument,
      "fcclAllReduce");
  BAD(fcclAllReduce(B->send, B->recv, ovf, fcclFloat32, fcclSum, comm, NULL), fcclInvalidArgument,
      "fcclAllReduce");
  CHECK_OK(fcclAllReduce(NULL, NULL, 0, fcclFloat32, fcclSum, comm, NULL));

  fccl_phase("fcclBroadcast: bad arguments");
  for (k = 0; k < 3; k++)
    BAD(fcclBroadcast(B->send, B->recv, NE, (fcclDataType_t)bad_dts[k], 0, comm, NULL),
        fcclInvalidArgument, "fcclBroadcast");
  BAD(fcclBroadcast(B->send, B->recv, NE, fcclFloat32, -1, comm, NULL), fcclInvalidArgument,
      "fcclBroadcast");
  BAD(fcclBroadcast(B->send, B->recv, NE, fcclFloat32, nranks, comm, NULL), fcclInvalidArgument,
      "fcclBroadcast");
  BAD(fcclBroadcast(B->send, NULL, NE, fcclFloat32, 0, comm, NULL), fcclInvalidArgument,
      "fcclBroadcast");
  BAD(fcclBroadcast(B->send, B->recv, ovf, fcclFloat32, 0, comm, NULL), fcclInvalidArgument,
      "fcclBroadcast");
  if (nranks == 1)
    BAD(fcclBroadcast(NULL, B->recv, NE, fcclFloat32, 0, comm, NULL), fcclInvalidArgument,
        "fcclBroadcast");
  CHECK_OK(fcclBroadcast(NULL, NULL, 0, fcclFloat32, 0, comm, NULL));

#ifndef FCCL_MISSING_fcclReduce
  fccl_phase("fcclReduce: bad arguments");
  for (k = 0; k < 3; k++)
    BAD(fcclReduce(B->send, B->recv, NE, (fcclDataType_t)bad_dts[k], fcclSum, 0, comm, NULL),
        fcclInvalidArgument, "fcclReduce");
  for (k = 0; k < 2; k++)
    BAD(fcclReduce(B->send, B->recv, NE, fcclFloat32, (fcclRedOp_t)bad_ops[k], 0, comm, NULL),
        fcclInvalidArgument, "fcclReduce");
  BAD(fcclReduce(B->send, B->recv, NE, fcclFloat32, fcclSum, -1, comm, NULL), fcclInvalidArgument,
      "fcclReduce");
  BAD(fcclReduce(B->send, B->recv, NE, fcclFloat32, fcclSum, nranks, comm, NULL),
      fcclInvalidArgument, "fcclReduce");
  BAD(fcclReduce(NULL, B->recv, NE, fcclFloat32, fcclSum, 0, comm, NULL), fcclInvalidArgument,
      "fcclReduce");
  BAD(fcclReduce(B->send, B->recv, ovf, fcclFloat32, fcclSum, 0, comm, NULL), fcclInvalidArgument,
      "fcclReduce");
  if (nranks == 1)
    BAD(fcclReduce(B->send, NULL, NE, fcclFloat32, fcclSum, 0, comm, NULL), fcclInvalidArgument,
        "fcclReduce");
  CHECK_OK(fcclReduce(NULL, NULL, 0, fcclFloat32, fcclSum, 0, comm, NULL));
#endif

#ifndef FCCL_MISSING_fcclAllGather
  fccl_phase("fcclAllGather: bad arguments");
  for (k = 0; k < 3; k++)
    BAD(fcclAllGather(B->send, B->recv, 1, (fcclDataType_t)bad_dts[k], comm, NULL),
        fcclInvalidArgument, "fcclAllGather");
  BAD(fcclAllGather(NULL, B->recv, 1, fcclFloat32, comm, NULL), fcclInvalidArgument,
      "fcclAllGather");
  BAD(fcclAllGather(B->send, NULL, 1, fcclFloat32, comm, NULL), fcclInvalidArgument,
      "fcclAllGather");
  BAD(fcclAllGather(B->send, B->recv, ovf, fcclFloat32, comm, NULL), fcclInvalidArgument,
      "fcclAllGather");
  if (nranks > 1)
    BAD(fcclAllGather(B->send, B->recv, ovf_n, fcclFloat32, comm, NULL), fcclInvalidArgument,
        "fcclAllGather");
  CHECK_OK(fcclAllGather(NULL, NULL, 0, fcclFloat32, comm, NULL));
#endif

#ifndef FCCL_MISSING_fcclReduceScatter
  fccl_phase("fcclReduceScatter: bad arguments");
  for (k = 0; k < 3; k++)
    BAD(fcclReduceScatter(B->send, B->recv, 1, (fcclDataType_t)bad_dts[k], fcclSum, comm, NULL),
        fcclInvalidArgument, "fcclReduceScatter");
  for (k = 0; k < 2; k++)
    BAD(fcclReduceScatter(B->send, B->recv, 1, fcclFloat32, (fcclRedOp_t)bad_ops[k], comm, NULL),
        fcclInvalidArgument, "fcclReduceScatter");
  BAD(fcclReduceScatter(NULL, B->recv, 1, fcclFloat32, fcclSum, comm, NULL), fcclInvalidArgument,
      "fcclReduceScatter");
  BAD(fcclReduceScatter(B->send, NULL, 1, fcclFloat32, fcclSum, comm, NULL), fcclInvalidArgument,
      "fcclReduceScatter");
  BAD(fcclReduceScatter(B->send, B->recv, ovf, fcclFloat32, fcclSum, comm, NULL),
      fcclInvalidArgument, "fcclReduceScatter");
  if (nranks > 1)
    BAD(fcclReduceScatter(B->send, B->recv, ovf_n, fcclFloat32, fcclSum, comm, NULL),
        fcclInvalidArgument, "fcclReduceScatter");
  CHECK_OK(fcclReduceScatter(NULL, NULL, 0, fcclFloat32, fcclSum, comm, NULL));
#endif

#ifndef FCCL_MISSING_fcclAlltoAll
  fccl_phase("fcclAlltoAll: bad arguments");
  for (k = 0; k < 3; k++)
    BAD(fcclAlltoAll(B->send, B->recv, 1, (fcclDataType_t)bad_dts[k], comm, NULL),
        fcclInvalidArgument, "fcclAlltoAll");
  BAD(fcclAlltoAll(NULL, B->recv, 1, fcclFloat32, comm, NULL), fcclInvalidArgument, "fcclAlltoAll");
  BAD(fcclAlltoAll(B->send, NULL, 1, fcclFloat32, comm, NULL), fcclInvalidArgument, "fcclAlltoAll");
  BAD(fcclAlltoAll(B->send, B->recv, ovf, fcclFloat32, comm, NULL), fcclInvalidArgument,
      "fcclAlltoAll");
  if (nranks > 1)
    BAD(fcclAlltoAll(B->send, B->recv, ovf_n, fcclFloat32, comm, NULL), fcclInvalidArgument,
        "fcclAlltoAll");
  CHECK_OK(fcclAlltoAll(NULL, NULL, 0, fcclFloat32, comm, NULL));
#endif

#ifndef FCCL_MISSING_fcclGather
  fccl_phase("fcclGather: bad arguments");
  for (k = 0; k < 3; k++)
    BAD(fcclGather(B->send, B->recv, 1, (fcclDataType_t)bad_dts[k], 0, comm, NULL),
        fcclInvalidArgument, "fcclGather");
  BAD(fcclGather(B->send, B->recv, 1, fcclFloat32, -1, comm, NULL), fcclInvalidArgument,
      "fcclGather");
  BAD(fcclGather(B->send, B->recv, 1, fcclFloat32, nranks, comm, NULL), fcclInvalidArgument,
      "fcclGather");
  BAD(fcclGather(NULL, B->recv, 1, fcclFloat32, 0, comm, NULL), fcclInvalidArgument, "fcclGather");
  BAD(fcclGather(B->send, B->recv, ovf, fcclFloat32, 0, comm, NULL), fcclInvalidArgument,
      "fcclGather");
  if (nranks == 1)
    BAD(fcclGather(B->send, NULL, 1, fcclFloat32, 0, comm, NULL), fcclInvalidArgument,
        "fcclGather");
  CHECK_OK(fcclGather(NULL, NULL, 0, fcclFloat32, 0, comm, NULL));
#endif

#ifndef FCCL_MISSING_fcclScatter
  fccl_phase("fcclScatter: bad arguments");
  for (k = 0; k < 3; k++)
    BAD(fcclScatter(B->send, B->recv, 1, (fcclDataType_t)bad_dts[k], 0, comm, NULL),
        fcclInvalidArgument, "fcclScatter");
  BAD(fcclScatter(B->send, B->recv, 1, fcclFloat32, -1, comm, NULL), fcclInvalidArgument,
      "fcclScatter");
  BAD(fcclScatter(B->send, B->recv, 1, fcclFloat32, nranks, comm, NULL), fcclInvalidArgument,
      "fcclScatter");
  BAD(fcclScatter(B->send, NULL, 1, fcclFloat32, 0, comm, NULL), fcclInvalidArgument,
      "fcclScatter");
  BAD(fcclScatter(B->send, B->recv, ovf, fcclFloat32, 0, comm, NULL), fcclInvalidArgument,
      "fcclScatter");
  if (nranks == 1)
    BAD(fcclScatter(NULL, B->recv, 1, fcclFloat32, 0, comm, NULL), fcclInvalidArgument,
        "fcclScatter");
  CHECK_OK(fcclScatter(NULL, NULL, 0, fcclFloat32, 0, comm, NULL));
#endif

#ifndef FCCL_MISSING_fcclAlltoAllv
  fccl_phase("fcclAlltoAllv: bad arguments");
  for (k = 0; k < nranks; k++) {
    sc[k] = rc[k] = 1;
    sd[k] = rd[k] = (size_t)k;
  }
  BAD(fcclAlltoAllv(B->send, NULL, sd, B->recv, rc, rd, fcclFloat32, comm, NULL),
      fcclInvalidArgument, "fcclAlltoAllv");
  BAD(fcclAlltoAllv(B->send, sc, NULL, B->recv, rc, rd, fcclFloat32, comm, NULL),
      fcclInvalidArgument, "fcclAlltoAllv");
  BAD(fcclAlltoAllv(B->send, sc, sd, B->recv, NULL, rd, fcclFloat32, comm, NULL),
      fcclInvalidArgument, "fcclAlltoAllv");
  BAD(fcclAlltoAllv(B->send, sc, sd, B->recv, rc, NULL, fcclFloat32, comm, NULL),
      fcclInvalidArgument, "fcclAlltoAllv");
  for (k = 0; k < 3; k++)
    BAD(fcclAlltoAllv(B->send, sc, sd, B->recv, rc, rd, (fcclDataType_t)bad_dts[k], comm, NULL),
        fcclInvalidArgument, "fcclAlltoAllv");
  BAD(fcclAlltoAllv(NULL, sc, sd, B->recv, rc, rd, fcclFloat32, comm, NULL), fcclInvalidArgument,
      "fcclAlltoAllv");
  BAD(fcclAlltoAllv(B->send, sc, sd, NULL, rc, rd, fcclFloat32, comm, NULL), fcclInvalidArgument,
      "fcclAlltoAllv");
  for (k = 0; k < nranks; k++) sc[k] = rc[k] = ovf;
  BAD(fcclAlltoAllv(B->send, sc, sd, B->recv, rc, rd, fcclFloat32, comm, NULL),
      fcclInvalidArgument, "fcclAlltoAllv");
  for (k = 0; k < nranks; k++) sc[k] = rc[k] = 1;
  sd[0] = rd[0] = SIZE_MAX - 1; /* displacement + count overflows */
  BAD(fcclAlltoAllv(B->send, sc, sd, B->recv, rc, rd, fcclFloat32, comm, NULL),
      fcclInvalidArgument, "fcclAlltoAllv");
  for (k = 0; k < nranks; k++) sc[k] = rc[k] = sd[k] = rd[k] = 0;
  CHECK_OK(fcclAlltoAllv(NULL, sc, sd, NULL, rc, rd, fcclFloat32, comm, NULL));
#endif

#if !defined(FCCL_MISSING_fcclSend) && !defined(FCCL_MISSING_fcclRecv)
  fccl_phase("fcclSend / fcclRecv: bad arguments");
  for (k = 0; k < 3; k++) {
    BAD(fcclSend(B->send, NE, (fcclDataType_t)bad_dts[k], 0, comm, NULL), fcclInvalidArgument,
        "fcclSend");
    BAD(fcclRecv(B->recv, NE, (fcclDataType_t)bad_dts[k], 0, comm, NULL), fcclInvalidArgument,
        "fcclRecv");
  }
  BAD(fcclSend(B->send, NE, fcclFloat32, -1, comm, NULL), fcclInvalidArgument, "fcclSend");
  BAD(fcclSend(B->send, NE, fcclFloat32, nranks, comm, NULL), fcclInvalidArgument, "fcclSend");
  BAD(fcclRecv(B->recv, NE, fcclFloat32, -1, comm, NULL), fcclInvalidArgument, "fcclRecv");
  BAD(fcclRecv(B->recv, NE, fcclFloat32, nranks, comm, NULL), fcclInvalidArgument, "fcclRecv");
  BAD(fcclSend(NULL, NE, fcclFloat32, 0, comm, NULL), fcclInvalidArgument, "fcclSend");
  BAD(fcclRecv(NULL, NE, fcclFloat32, 0, comm, NULL), fcclInvalidArgument, "fcclRecv");
  BAD(fcclSend(B->send, ovf, fcclFloat32, 0, comm, NULL), fcclInvalidArgument, "fcclSend");
  BAD(fcclRecv(B->recv, ovf, fcclFloat32, 0, comm, NULL), fcclInvalidArgument, "fcclRecv");
  CHECK_OK(fcclGroupStart());
  CHECK_OK(fcclSend(NULL, 0, fcclFloat32, (rank + 1) % nranks, comm, NULL));
  CHECK_OK(fcclRecv(NULL, 0, fcclFloat32, (rank + nranks - 1) % nranks, comm, NULL));
  CHECK_OK(fcclGroupEnd());
#endif

  fccl_phase("fcclGroupEnd without fcclGroupStart");
  CHECK_ERR(fcclGroupEnd(), fcclInvalidUsage, "fcclGroupEnd");

  free(sc);
  free(sd);
  free(rc);
  free(rd);
}

/* ------------------------------------------------------------------ thread-local error */

typedef struct {
  pthread_barrier_t* bar;
  int which; /* 0: fails in fcclAllReduce, 1: fails in fcclBroadcast, 2: never fails */
  fcclResult_t res;
  char before[512], after[512];
  int was_null;
} tl_job;

static void copy_msg(char* out, size_t n, int* was_null) {
  const char* m = fcclGetLastError(NULL);
  if (!m) *was_null = 1;
  snprintf(out, n, "%s", m ? m : "");
}

static void* tl_thread(void* arg) {
  tl_job* j = (tl_job*)arg;
  float buf[4] = {0, 0, 0, 0};
  j->res = fcclSuccess;
  if (j->which == 0) j->res = fcclAllReduce(buf, buf, 4, fcclFloat32, fcclSum, NULL, NULL);
  pthread_barrier_wait(j->bar);
  if (j->which == 1) j->res = fcclBroadcast(buf, buf, 4, fcclFloat32, 0, NULL, NULL);
  copy_msg(j->before, sizeof j->before, &j->was_null);
  pthread_barrier_wait(j->bar);
  copy_msg(j->after, sizeof j->after, &j->was_null);
  return NULL;
}

static void part_thread_local(void) {
  pthread_barrier_t bar;
  pthread_t th[3];
  tl_job jobs[3];
  int i;
  fccl_phase("thread-local last error");
  pthread_barrier_init(&bar, NULL, 3);
  for (i = 0; i < 3; i++) {
    memset(&jobs[i], 0, sizeof jobs[i]);
    jobs[i].bar = &bar;
    jobs[i].which = i;
    if (pthread_create(&th[i], NULL, tl_thread, &jobs[i]) != 0) {
      CHECK(0, "pthread_create failed");
      _exit(1);
    }
  }
  for (i = 0; i < 3; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&bar);
  CHECK(jobs[0].res == fcclInvalidArgument && jobs[1].res == fcclInvalidArgument,
        "calls with a NULL comm returned %d and %d", (int)jobs[0].res, (int)jobs[1].res);
  for (i = 0; i < 3; i++) CHECK(!jobs[i].was_null, "thread %d: fcclGetLastError(NULL) returned NULL", i);
  CHECK(strstr(jobs[0].after, "fcclAllReduce") && !strstr(jobs[0].after, "fcclBroadcast"),
        "thread A failed in fcclAllReduce, then thread B in fcclBroadcast; A's last error is now "
        "\"%s\" (should still name fcclAllReduce only)",
        jobs[0].after);
  CHECK(strstr(jobs[1].after, "fcclBroadcast") && !strstr(jobs[1].after, "fcclAllReduce"),
        "thread B's last error is \"%s\" (should name fcclBroadcast only)", jobs[1].after);
  CHECK(!strstr(jobs[2].after, "fcclAllReduce") && !strstr(jobs[2].after, "fcclBroadcast"),
        "thread C made no failing call but its last error is \"%s\"", jobs[2].after);
}

/* Buffers that overlap other than in the exact in-place layout are refused with
 * fcclInvalidArgument before anything is written; the exact in-place layouts work. */
static void overlap_refused(fcclResult_t res, const unsigned char* buf, const unsigned char* copy,
                            size_t bytes, const char* what) {
  if (CHECK_ERR(res, fcclInvalidArgument, what)) {
    const char* m = fcclGetLastError(NULL);
    CHECK(m && strstr(m, "overlap"), "%s: the message should say the buffers overlap: \"%s\"", what,
          m ? m : "(NULL)");
  }
  CHECK(memcmp(buf, copy, bytes) == 0, "%s: a refused call wrote into its buffers", what);
}

static void part_overlap(fcclComm_t comm, int rank, int nranks) {
  const size_t count = 16, n = (size_t)nranks;
  size_t bytes = (count * n + 16) * sizeof(float), i;
  unsigned char* buf = (unsigned char*)fccl_xmalloc(bytes);
  unsigned char* copy = (unsigned char*)fccl_xmalloc(bytes);
  float* f = (float*)buf;
  int off[4] = {1, -1, 7, -7}, k;
  fccl_phase("partially overlapping buffers");
  for (i = 0; i < bytes / sizeof(float); i++) f[i] = (float)(i % 97);
  memcpy(copy, buf, bytes);
  for (k = 0; k < 4; k++) {
    float* s = f + 8;
    overlap_refused(fcclAllReduce(s, s + off[k], count, fcclFloat32, fcclSum, comm, NULL), buf, copy, bytes,
                    "fcclAllReduce");
  }
  /* all_gather: sendbuff 3 elements off its in-place position recvbuff + rank*count */
  overlap_refused(fcclAllGather(f + (size_t)rank * count + 3, f, count, fcclFloat32, comm, NULL), buf, copy,
                  bytes, "fcclAllGather");
  /* reduce_scatter: recvbuff one element before sendbuff + rank*count */
  if (rank > 0 || nranks == 1)
    overlap_refused(fcclReduceScatter(f + 1, f + 1 + (size_t)rank * count + (rank > 0 ? -1 : 1), count,
                                      fcclFloat32, fcclSum, comm, NULL),
                    buf, copy, bytes, "fcclReduceScatter");
  else
    overlap_refused(fcclReduceScatter(f + 1, f + 2, count, fcclFloat32, fcclSum, comm, NULL), buf, copy, bytes,
                    "fcclReduceScatter");
  /* the exact in-place layouts still work */
  CHECK_OK(fcclAllReduce(f, f, count, fcclFloat32, fcclMax, comm, NULL));
  CHECK_OK(fcclAllGather(f + (size_t)rank * count, f, count, fcclFloat32, comm, NULL));
  free(buf);
  free(copy);
}

/* One communicator used by two threads at once is refused (fcclInvalidUsage): rank 0's
 * second thread is inside an all_reduce that waits for rank 1, which arrives late on
 * purpose, while rank 0's own thread makes a (zero-count) call on the same comm. */
typedef struct {
  fcclComm_t comm;
  int nranks;
  volatile int started;
  fcclResult_t res;
  float got[4];
} busy_job;

static void* busy_thread(void* arg) {
  busy_job* j = (busy_job*)arg;
  float x[4] = {1, 2, 3, 4};
  j->started = 1;
  j->res = fcclAllReduce(x, j->got, 4, fcclFloat32, fcclSum, j->comm, NULL);
  return NULL;
}

static void sleep_ms(long ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&ts, NULL);
}

static void part_two_threads(fcclComm_t comm, int rank, int nranks) {
  float x[4] = {1, 2, 3, 4}, y[4];
  int i;
  if (nranks < 2) return;
  fccl_phase("one communicator, two threads at once");
  if (rank == 0) {
    busy_job j;
    pthread_t th;
    fcclResult_t res;
    memset(&j, 0, sizeof j);
    j.comm = comm;
    j.nranks = nranks;
    if (pthread_create(&th, NULL, busy_thread, &j) != 0) {
      CHECK(0, "pthread_create failed");
      _exit(1);
    }
    while (!j.started) sleep_ms(1);
    sleep_ms(200); /* the other thread is inside its call now, waiting for rank 1 */
    res = fcclAllReduce(x, y, 0, fcclFloat32, fcclSum, comm, NULL);
    if (CHECK_ERR(res, fcclInvalidUsage, "fcclAllReduce")) {
      const char* m = fcclGetLastError(NULL);
      CHECK(m && strstr(m, "another thread"), "the message should say another thread is using the comm: \"%s\"",
            m ? m : "(NULL)");
    }
    pthread_join(th, NULL);
    if (CHECK_OK(j.res))
      for (i = 0; i < 4; i++)
        CHECK(j.got[i] == (float)((i + 1) * nranks), "the other thread's all_reduce: element %d = %g", i,
              (double)j.got[i]);
  } else {
    if (rank == 1) sleep_ms(1500); /* rank 0's second call comes while it waits for us */
    if (CHECK_OK(fcclAllReduce(x, y, 4, fcclFloat32, fcclSum, comm, NULL)))
      for (i = 0; i < 4; i++) CHECK(y[i] == (float)((i + 1) * nranks), "all_reduce: element %d = %g", i, (double)y[i]);
  }
}

/* ------------------------------------------------------------------ */

static void still_works(fcclComm_t comm, int rank, int nranks) {
  fccl_pattern pat;
  fccl_ref ref;
  float* send = (float*)fccl_xmalloc(1000 * sizeof(float));
  float* recv = (float*)fccl_xmalloc(1000 * sizeof(float));
  int8_t s8[7], r8[7];
  int i;
  fccl_phase("the comm still works");
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_SUM);
  fccl_ref_init(&ref, &pat, fcclSum, nranks);
  fccl_pattern_fill(&pat, send, 1000, fccl_rank_off(4242, rank));
  memset(recv, 0, 1000 * sizeof(float));
  if (CHECK_OK(fcclAllReduce(send, recv, 1000, fcclFloat32, fcclSum, comm, NULL)))
    REF_CHECK(&ref, recv, 1000, 4242, "allreduce after the bad calls");
  for (i = 0; i < 7; i++) s8[i] = (int8_t)(i - rank);
  if (CHECK_OK(fcclAllReduce(s8, r8, 7, fcclInt8, fcclSum, comm, NULL)))
    for (i = 0; i < 7; i++)
      CHECK(r8[i] == (int8_t)(nranks * i - nranks * (nranks - 1) / 2),
            "int8 allreduce after the bad calls: element %d = %d", i, (int)r8[i]);
  fccl_ref_free(&ref);
  fccl_pattern_free(&pat);
  free(send);
  free(recv);
}

static int body(fcclComm_t comm, int rank, int nranks) {
  bufs_t b;
  size_t n = (size_t)nranks * NE * 8;
  b.send = (unsigned char*)fccl_xmalloc(n);
  b.recv = (unsigned char*)fccl_xmalloc(n + FCCL_SLACK);
  b.rbytes = n + FCCL_SLACK;
  memset(b.send, 0x11, n);
  memset(b.recv, FCCL_SENT_RECV, b.rbytes);

  part_misc();
  part_memory();
  comm_calls_bad_comm(NULL, 1, "NULL");
  all_calls_bad_comm(NULL, &b, "NULL");
  part_comm_args(comm, rank, nranks);
  part_stale(comm, &b);
  part_collectives(comm, rank, nranks, &b);
  part_overlap(comm, rank, nranks);
  part_two_threads(comm, rank, nranks);
  part_thread_local();
  still_works(comm, rank, nranks);
  free(b.send);
  free(b.recv);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
