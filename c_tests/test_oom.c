/* A valid call whose own scratch the process cannot have returns fcclSystemError
 * naming the size, and the process lives on: under an address-space limit
 * (setrlimit RLIMIT_AS) that leaves room for this test's buffers, allocated first,
 * but not for the library's copies of them, each call below fails alike on every
 * rank before anything is counted or sent, and a small all_reduce afterwards still
 * succeeds:
 *   - fcclReduceScatterAxis along axis 1 (the input is packed into a copy first);
 *   - fcclAllReduceCoalesced and fcclBroadcastCoalesced with one large bucket.
 * A group's fcclSend and fcclRecv over one buffer, the receive above the send's
 * start (the send is copied aside when the run starts, after the group was counted),
 * fails too, on a communicator split for it: its error says that communicator is
 * unusable, which then refuses calls, and destroying it works.
 * Before, the first of these aborted the process (an infallible Rust allocation).
 * Process mode, one rank per process: a limit applies to a whole process. */
#include "harness.h"

#include <sys/resource.h>

#define MIB ((size_t)1 << 20)
#define BIG (256 * MIB)   /* this test's send buffer: what a packed copy needs */
#define MARGIN (64 * MIB) /* what the limit leaves above this test's own memory */

/* The process's virtual size (VmSize), which RLIMIT_AS bounds. */
static size_t vm_bytes(void) {
  char line[256];
  size_t kib = 0;
  FILE* f = fopen("/proc/self/status", "r");
  if (!f) return 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmSize: %zu kB", &kib) == 1) break;
  fclose(f);
  return kib * 1024;
}

/* fcclGetLastError names `bytes` ("N bytes") and, when given, `also`. */
static void check_message(const char* call, size_t bytes, const char* also) {
  char want[64];
  const char* le = fcclGetLastError(NULL);
  snprintf(want, sizeof want, "%zu bytes", bytes);
  CHECK(le && strstr(le, want), "%s: the error should name the %zu bytes it could not allocate: \"%s\"", call,
        bytes, le ? le : "(null)");
  CHECK(!also || (le && strstr(le, also)), "%s: the error should say \"%s\": \"%s\"", call, also, le ? le : "(null)");
  printf("rank %d: %s\n", fccl_cur_rank(), le ? le : "(null)");
}

/* A small all_reduce on `comm` succeeds with the right sum. */
static void small_all_reduce(fcclComm_t comm, int rank, int nranks, const char* after) {
  float v[64];
  int i;
  for (i = 0; i < 64; i++) v[i] = (float)(rank + i);
  fccl_phase("a small all_reduce after %s", after);
  if (CHECK_OK(fcclAllReduce(v, v, 64, fcclFloat32, fcclSum, comm, NULL))) {
    for (i = 0; i < 64; i++) {
      float want = (float)(nranks * (nranks - 1) / 2 + nranks * i);
      if (v[i] != want) {
        CHECK(0, "after %s: element %d of a small all_reduce is %g, expected %g", after, i, (double)v[i],
              (double)want);
        break;
      }
    }
  }
}

static int body(fcclComm_t comm, int rank, int nranks) {
  struct rlimit old, lim;
  fcclComm_t split = NULL;
  unsigned char* send;
  unsigned char* recv;
  size_t vm;
  if (fccl_threads_mode() || nranks != 2) return FCCL_SKIP;
  /* This test's own memory, before the limit: never touched, so only address space. */
  send = (unsigned char*)fccl_xmalloc(BIG);
  recv = (unsigned char*)fccl_xmalloc(BIG / 2);
  CHECK_OK(fcclCommSplit(comm, 0, rank, &split, NULL));
  small_all_reduce(comm, rank, nranks, "nothing");
  small_all_reduce(split, rank, nranks, "nothing (split)");

  vm = vm_bytes();
  CHECK(vm > 0, "VmSize not readable");
  CHECK(getrlimit(RLIMIT_AS, &old) == 0, "getrlimit");
  lim = old;
  lim.rlim_cur = (rlim_t)(vm + MARGIN);
  if (old.rlim_cur != RLIM_INFINITY && old.rlim_cur < lim.rlim_cur) lim.rlim_cur = old.rlim_cur;
  CHECK(setrlimit(RLIMIT_AS, &lim) == 0, "setrlimit(RLIMIT_AS, %zu)", (size_t)lim.rlim_cur);
  printf("rank %d: address space limited to %zu MiB (%zu MiB in use)\n", rank, (size_t)lim.rlim_cur / MIB,
         vm / MIB);

  {
    /* [2, BIG/8] float32 along axis 1: the packed copy is the whole input, BIG bytes. */
    size_t shape[2] = {2, BIG / 8};
    fccl_phase("fcclReduceScatterAxis along axis 1 of %zu MiB", BIG / MIB);
    if (CHECK_ERR(fcclReduceScatterAxis(send, recv, 2, shape, 1, fcclFloat32, fcclSum, comm, NULL),
                  fcclSystemError, "fcclReduceScatterAxis"))
      check_message("fcclReduceScatterAxis", BIG, "axis 1");
    small_all_reduce(comm, rank, nranks, "fcclReduceScatterAxis");
  }
  {
    /* 4 buffers of BIG/8 in place, one bucket of BIG/2 bytes. */
    const void* sends[4];
    void* recvs[4];
    size_t counts[4];
    int i;
    for (i = 0; i < 4; i++) {
      sends[i] = recvs[i] = send + (size_t)i * (BIG / 8);
      counts[i] = BIG / 8 / sizeof(float);
    }
    fccl_phase("fcclAllReduceCoalesced in one bucket of %zu MiB", BIG / 2 / MIB);
    if (CHECK_ERR(fcclAllReduceCoalesced(sends, recvs, counts, 4, fcclFloat32, fcclSum, BIG, comm, NULL),
                  fcclSystemError, "fcclAllReduceCoalesced"))
      check_message("fcclAllReduceCoalesced", BIG / 2, "bucketBytes");
    small_all_reduce(comm, rank, nranks, "fcclAllReduceCoalesced");
    fccl_phase("fcclBroadcastCoalesced in one bucket of %zu MiB", BIG / 2 / MIB);
    if (CHECK_ERR(fcclBroadcastCoalesced(recvs, counts, 4, fcclFloat32, 0, BIG, comm, NULL), fcclSystemError,
                  "fcclBroadcastCoalesced"))
      check_message("fcclBroadcastCoalesced", BIG / 2, "bucketBytes");
    small_all_reduce(comm, rank, nranks, "fcclBroadcastCoalesced");
  }
  if (split) {
    /* The send's first BIG/2 bytes go to the peer while the peer's land 8 bytes
     * above: the send is copied aside first, BIG/2 bytes. */
    fcclResult_t res;
    int peer = 1 - rank;
    fccl_phase("a group of fcclSend and fcclRecv over one buffer, the receive above");
    CHECK_OK(fcclGroupStart());
    CHECK_OK(fcclSend(send, BIG / 2, fcclUint8, peer, split, NULL));
    CHECK_OK(fcclRecv(send + 8, BIG / 2, fcclUint8, peer, split, NULL));
    res = fcclGroupEnd();
    /* Every rank fails for want of memory; one that learns of its peer's failure first
     * may report that instead. */
    if (CHECK_ERR2(res, fcclSystemError, fcclRemoteError, "fcclGroupEnd") && res == fcclSystemError)
      check_message("fcclGroupEnd", BIG / 2, "unusable");
    fccl_phase("the split communicator after its failed group");
    CHECK_ERR(fcclAllReduce(recv, recv, 16, fcclFloat32, fcclSum, split, NULL), fcclInvalidUsage, "unusable");
    CHECK_OK(fcclCommDestroy(split));
  }
  small_all_reduce(comm, rank, nranks, "the failed group on another communicator");

  CHECK(setrlimit(RLIMIT_AS, &old) == 0, "restoring RLIMIT_AS");
  free(send);
  free(recv);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
