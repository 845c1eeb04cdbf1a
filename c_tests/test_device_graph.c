/* Collectives inside CUDA graph capture: refused, never a silent wrong result or a hang.
 *
 * Every rank selects device 0 (ranks share one GPU: the one-GPU path serves device
 * memory, or host staging with FERROCCL_CUDA_IPC=0) and creates a stream: a blocking one
 * in processes, so that any use of the legacy stream during the capture would show (the
 * driver refuses it then); a non-blocking one for rank threads, which share a context
 * whose legacy stream the other threads' synchronous copies use. Cases:
 *   1. every rank captures its stream (threads mode: THREAD_LOCAL, as the other rank
 *      threads of the process must keep calling the driver; processes: GLOBAL, the
 *      default of torch.cuda.graph), with a memset captured before the calls:
 *      fcclAllReduce and a ring of fcclSend/fcclRecv in a group each return
 *      fcclInvalidUsage with a message naming the call and the capture; the capture is
 *      still ACTIVE, cuStreamEndCapture returns CUDA_SUCCESS and a graph, and that graph
 *      (the memset) replays correctly twice;
 *   2. only rank 0 captures: every rank's fcclAllReduce returns fcclInvalidUsage (the
 *      others' messages name rank 0); in the ring, the pairs with rank 0 fail on both
 *      sides at once and the others move their data (staged too: rank 0 sends its
 *      handshakes flagged as refused, and its peers' messages name it and the capture);
 *      rank 0's capture ends with CUDA_SUCCESS;
 *   3. after each case, the same calls outside capture succeed on the same communicator
 *      with the right results.
 * Data goes in and out with the driver, loaded with dlopen; exits 77 (skipped) without
 * a driver or device. */
#include <pthread.h>
#include <string.h>

#include "harness.h"
#include "cuda_driver.h"

#define MODE_GLOBAL 0
#define MODE_THREAD_LOCAL 1
#define STATUS_ACTIVE 1

static CUcontext g_ctx;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static int pre_init(int rank, int nranks, int* devlist) {
  const char* why;
  int i;
  (void)rank;
  if ((why = fccl_cu_load(RTLD_LOCAL, FCCL_CU_BASE | FCCL_CU_STREAM | FCCL_CU_GRAPH)) ||
      (why = fccl_cu_device0(&g_ctx))) {
    printf("skipped: no CUDA driver/GPU (%s)\n", why);
    return FCCL_SKIP;
  }
  if (devlist)
    for (i = 0; i < nranks; i++) devlist[i] = 0;
  return 0;
}

#define CU_OK(call)                                             \
  do {                                                          \
    CUresult r_ = (call);                                       \
    CHECK(r_ == 0, "%s returned CUresult %d", #call, (int)r_); \
  } while (0)

enum { N = 1000 };

static float input(int r, size_t i) { return (float)(r * 1000 + (int)(i % 997)); }

static void put(float* d, const float* h) { CU_OK(cu.MemcpyHtoD((CUdeviceptr)(size_t)d, h, N * sizeof(float))); }
static void get(float* h, const float* d) { CU_OK(cu.MemcpyDtoH(h, (CUdeviceptr)(size_t)d, N * sizeof(float))); }

/* The last error names the capture and the call. */
static void names_capture(const char* what, const char* call, int rank0_only, int rank) {
  const char* m = fcclGetLastError(NULL);
  CHECK(m && strstr(m, "captured into a CUDA graph") && strstr(m, call),
        "%s: the message must name %s and the capture: %s", what, call, m ? m : "(null)");
  CHECK(m && strstr(m, "outside graph capture") && strstr(m, "nccl"),
        "%s: the message must say what to do: %s", what, m ? m : "(null)");
  if (rank0_only && rank != 0)
    CHECK(m && strstr(m, "rank(s) 0 called it"), "%s: rank %d's message must name rank 0: %s", what, rank,
          m ? m : "(null)");
}

/* The ring: send to rank + 1, receive from rank - 1, in one group. */
static fcclResult_t ring(const float* s, float* d, int rank, int n, fcclComm_t comm, CUstream st) {
  fcclResult_t a, b, c;
  a = fcclGroupStart();
  b = fcclSend(s, N, fcclFloat32, (rank + 1) % n, comm, st);
  c = fcclRecv(d, N, fcclFloat32, (rank + n - 1) % n, comm, st);
  if (a != fcclSuccess) return a;
  a = fcclGroupEnd();
  if (b != fcclSuccess) return b;
  if (c != fcclSuccess) return c;
  return a;
}

/* The same calls outside capture give the right results. */
static void outside_capture(const char* when, float* s, float* d, float* h, int rank, int n, fcclComm_t comm,
                            CUstream st) {
  size_t i;
  int p, bad = 0;
  fccl_phase("%s: all_reduce outside capture", when);
  CHECK_OK(fcclAllReduce(s, d, N, fcclFloat32, fcclSum, comm, st));
  CU_OK(cu.StreamSynchronize(st));
  get(h, d);
  for (i = 0; i < N && !bad; i++) {
    float want = 0;
    for (p = 0; p < n; p++) want += input(p, i);
    if (h[i] != want) {
      CHECK(0, "%s: all_reduce element %zu is %g, expected %g", when, i, (double)h[i], (double)want);
      bad = 1;
    }
  }
  fccl_phase("%s: send/recv outside capture", when);
  CHECK_OK(ring(s, d, rank, n, comm, st));
  CU_OK(cu.StreamSynchronize(st));
  get(h, d);
  for (i = 0; i < N; i++)
    if (h[i] != input((rank + n - 1) % n, i)) {
      CHECK(0, "%s: received element %zu is %g, expected %g", when, i, (double)h[i],
            (double)input((rank + n - 1) % n, i));
      break;
    }
}

static int body(fcclComm_t comm, int rank, int n) {
  CUstream st = NULL;
  CUgraph g = NULL;
  CUgraphExec e = NULL;
  int status = -1, round;
  int mode = fccl_threads_mode() ? MODE_THREAD_LOCAL : MODE_GLOBAL;
  float *s = NULL, *d = NULL, *m = NULL;
  float* h = calloc(N, sizeof(float));
  size_t i;
  if (n < 2) {
    free(h);
    return FCCL_SKIP;
  }
  pthread_mutex_lock(&g_mu);
  CU_OK(cu.CtxSetCurrent(g_ctx));
  pthread_mutex_unlock(&g_mu);
  CU_OK(cu.StreamCreate(&st, fccl_threads_mode() ? 1u /* CU_STREAM_NON_BLOCKING */ : 0u));
  CHECK_OK(fcclMemAlloc((void**)&s, N * sizeof(float)));
  CHECK_OK(fcclMemAlloc((void**)&d, N * sizeof(float)));
  CHECK_OK(fcclMemAlloc((void**)&m, N * sizeof(float)));
  if (fccl_failures()) return fccl_failures();
  for (i = 0; i < N; i++) h[i] = input(rank, i);
  put(s, h);
  outside_capture("before any capture", s, d, h, rank, n, comm, st);

  /* 1. Every rank captures. */
  fccl_phase("every rank captures");
  CU_OK(cu.StreamBeginCapture(st, mode));
  CU_OK(cu.MemsetD32Async((CUdeviceptr)(size_t)m, 0x3f800000u /* 1.0f */, N, st));
  CHECK_ERR(fcclAllReduce(s, d, N, fcclFloat32, fcclSum, comm, st), fcclInvalidUsage, "fcclAllReduce");
  names_capture("all_reduce, every rank capturing", "fcclAllReduce", 0, rank);
  CHECK_RES(ring(s, d, rank, n, comm, st), fcclInvalidUsage);
  names_capture("send/recv, every rank capturing", "fccl", 0, rank);
  {
    const char* msg = fcclGetLastError(NULL);
    CHECK(msg && (strstr(msg, "fcclSend") || strstr(msg, "fcclRecv")), "send/recv: the message names no call: %s",
          msg ? msg : "(null)");
  }
  CU_OK(cu.StreamIsCapturing(st, &status));
  CHECK(status == STATUS_ACTIVE, "the capture must still be active after the refused calls (status %d)", status);
  CU_OK(cu.StreamEndCapture(st, &g));
  CHECK(g != NULL, "cuStreamEndCapture gave no graph");
  if (g) {
    CU_OK(cu.GraphInstantiate(&e, g, 0));
    for (round = 0; round < 2 && e; round++) {
      put(m, h);
      CU_OK(cu.GraphLaunch(e, st));
      CU_OK(cu.StreamSynchronize(st));
      get(h, m);
      for (i = 0; i < N; i++)
        if (h[i] != 1.0f) {
          CHECK(0, "replay %d of the captured memset: element %zu is %g", round, i, (double)h[i]);
          break;
        }
    }
    if (e) CU_OK(cu.GraphExecDestroy(e));
    CU_OK(cu.GraphDestroy(g));
  }
  for (i = 0; i < N; i++) h[i] = input(rank, i);
  outside_capture("after every rank captured", s, d, h, rank, n, comm, st);

  /* 2. Only rank 0 captures. */
  fccl_phase("only rank 0 captures");
  fccl_sync(comm);
  if (rank == 0) CU_OK(cu.StreamBeginCapture(st, mode));
  CHECK_ERR(fcclAllReduce(s, d, N, fcclFloat32, fcclSum, comm, st), fcclInvalidUsage, "fcclAllReduce");
  names_capture("all_reduce, rank 0 capturing", "fcclAllReduce", 1, rank);
  {
    /* The pairs with rank 0 fail on both sides; the others move their data. */
    int touches0 = rank == 0 || rank == 1 || rank == n - 1;
    fcclResult_t r;
    if (rank != 0) {
      CU_OK(cu.MemsetD32Async((CUdeviceptr)(size_t)d, 0, N, st));
      CU_OK(cu.StreamSynchronize(st));
    }
    r = ring(s, d, rank, n, comm, st);
    CHECK(r == (touches0 ? fcclInvalidUsage : fcclSuccess), "rank %d: the ring returned %d (%s)", rank, (int)r,
          fcclGetLastError(NULL));
    if (touches0) {
      const char* m = fcclGetLastError(NULL);
      CHECK(m && strstr(m, "captured into a CUDA graph"), "rank %d: the ring's error does not name the capture: %s",
            rank, m ? m : "(null)");
    }
    if (!touches0) {
      CU_OK(cu.StreamSynchronize(st));
      get(h, d);
      CHECK(h[5] == input(rank - 1, 5), "rank %d: a pair without rank 0 must move its data", rank);
    }
  }
  if (rank == 0) {
    g = NULL;
    CU_OK(cu.StreamIsCapturing(st, &status));
    CHECK(status == STATUS_ACTIVE, "rank 0's capture must still be active (status %d)", status);
    CU_OK(cu.StreamEndCapture(st, &g));
    CHECK(g != NULL, "cuStreamEndCapture gave no graph");
    if (g) CU_OK(cu.GraphDestroy(g));
  }
  for (i = 0; i < N; i++) h[i] = input(rank, i);
  outside_capture("after rank 0 captured alone", s, d, h, rank, n, comm, st);

  CHECK_OK(fcclMemFree(s));
  CHECK_OK(fcclMemFree(d));
  CHECK_OK(fcclMemFree(m));
  CU_OK(cu.StreamDestroy(st));
  free(h);
  if (rank == 0 && !fccl_failures())
    printf("%d ranks (%s): captured collectives refused alike, captures stay valid, calls outside capture work\n",
           n, fccl_threads_mode() ? "threads" : "processes");
  return fccl_failures();
}

int main(int argc, char** argv) {
  fccl_set_pre_init(pre_init);
  return fccl_main(argc, argv, body);
}
