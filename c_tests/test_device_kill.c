/* Ranks sharing one GPU: when a rank dies, the work a survivor has queued behind it ends
 * in bounded time and reads nothing more of the dead rank's memory.
 *
 * Two ranks (forked processes, before either touches CUDA) on device 0 queue K all_reduces
 * of 16 MiB on their streams without waiting. First both live, and rank 0 times how long
 * its stream takes to drain the K calls (T_alive). Then rank 1 queues K more and kills
 * itself at once: rank 0's stream is left with up to K calls whose inputs will never be
 * ready. Rank 0 must learn of the death (fcclCommGetAsyncError: fcclRemoteError naming rank
 * 1) and its stream must drain in a fraction of T_alive: the copies and reductions queued
 * behind the failure do nothing (they read the control region's failed word) instead of
 * running against the dead rank's buffers.
 *
 * Exits 77 (skipped) without a driver or a device. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_driver.h"
#include "ferroccl.h"

#define K 160 /* enough work that draining it (seconds) stands well above the ~0.5 s a death takes to notice */
#define COUNT ((size_t)4 << 20) /* floats: 16 MiB */

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

#define FAIL(...)                              \
  do {                                         \
    fprintf(stderr, "rank %d: ", rank);        \
    fprintf(stderr, __VA_ARGS__);              \
    fprintf(stderr, "\n");                     \
    _exit(1);                                  \
  } while (0)

static void rank_main(int rank, int idfd_r, int idfd_w) {
  fcclUniqueId id;
  fcclComm_t comm;
  CUcontext ctx;
  void *s, *d;
  int i;
  fcclResult_t r;
  if (rank == 0) {
    if (fcclGetUniqueId(&id) != fcclSuccess) FAIL("fcclGetUniqueId: %s", fcclGetLastError(NULL));
    if (write(idfd_w, &id, sizeof id) != (ssize_t)sizeof id) FAIL("write of the id");
  } else if (read(idfd_r, &id, sizeof id) != (ssize_t)sizeof id) {
    FAIL("read of the id");
  }
  if (cu.DevicePrimaryCtxRetain(&ctx, 0) != 0 || cu.CtxSetCurrent(ctx) != 0) FAIL("device 0 unusable");
  if (fcclCommInitRank(&comm, 2, id, rank) != fcclSuccess) FAIL("init: %s", fcclGetLastError(NULL));
  if (fcclMemAlloc(&s, COUNT * 4) != fcclSuccess || fcclMemAlloc(&d, COUNT * 4) != fcclSuccess)
    FAIL("fcclMemAlloc: %s", fcclGetLastError(NULL));

  /* Both alive: how long the stream takes to drain K queued calls. */
  for (i = 0; i < K; i++)
    if ((r = fcclAllReduce(s, d, COUNT, fcclFloat32, fcclSum, comm, NULL)) != fcclSuccess)
      FAIL("all_reduce %d: %s", i, fcclGetLastError(NULL));
  double t0 = now_ms();
  if (cu.CtxSynchronize() != 0) FAIL("cuCtxSynchronize");
  double alive = now_ms() - t0;
  {
    float x = 1;
    if (fcclAllReduce(&x, &x, 1, fcclFloat32, fcclSum, comm, NULL) != fcclSuccess) FAIL("host all_reduce");
  }
  if (rank == 1) {
    for (i = 0; i < K; i++) fcclAllReduce(s, d, COUNT, fcclFloat32, fcclSum, comm, NULL);
    raise(SIGKILL);
  }
  /* Rank 0: queue what rank 1 queued before it died (a call after the death fails). */
  for (i = 0; i < K; i++)
    if (fcclAllReduce(s, d, COUNT, fcclFloat32, fcclSum, comm, NULL) != fcclSuccess) break;
  t0 = now_ms();
  if (cu.CtxSynchronize() != 0) FAIL("cuCtxSynchronize after the death failed");
  double dead = now_ms() - t0;
  fcclResult_t ae = fcclSuccess;
  double until = now_ms() + 5000;
  while (ae == fcclSuccess && now_ms() < until) {
    if (fcclCommGetAsyncError(comm, &ae) != fcclSuccess) FAIL("fcclCommGetAsyncError");
    if (ae == fcclSuccess) {
      struct timespec ten = {0, 10000000};
      nanosleep(&ten, NULL);
    }
  }
  printf("rank 0: %d calls of 16 MiB drained in %.0f ms with both ranks alive; after rank 1 died with %d queued, in %.0f ms (async error %d)\n",
         K, alive, i, dead, (int)ae);
  fflush(stdout);
  if (ae != fcclRemoteError) FAIL("fcclCommGetAsyncError gave %d, want fcclRemoteError (%s)", (int)ae, fcclGetLastError(NULL));
  if (dead > alive / 3 + 500)
    FAIL("the work queued behind the dead rank took %.0f ms to drain, against %.0f ms for the same work with it alive: it ran instead of ending",
         dead, alive);
  fcclCommAbort(comm);
  _exit(0);
}

int main(void) {
  int p[2], i, st = 0, ndev = 0;
  const char* why;
  pid_t kids[2];
  {
    /* With the GPU-to-GPU path off every call is staged and synchronous: nothing to test. */
    const char* ipc = getenv("FERROCCL_CUDA_IPC");
    if (ipc && (strcmp(ipc, "0") == 0 || strcmp(ipc, "off") == 0)) {
      printf("skipped: FERROCCL_CUDA_IPC=%s turns off the GPU-to-GPU path this test is about\n", ipc);
      return 77;
    }
  }
  if ((why = fccl_cu_load(RTLD_LOCAL, FCCL_CU_BASE))) {
    printf("skipped: no CUDA driver (%s)\n", why);
    return 77;
  }
  /* Probe in a child: a process that initialised CUDA must not fork ranks. */
  pid_t probe = fork();
  if (probe == 0) _exit(cu.Init(0) == 0 && cu.DeviceGetCount(&ndev) == 0 && ndev > 0 ? 0 : 77);
  waitpid(probe, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    printf("skipped: no CUDA device\n");
    return 77;
  }
  if (pipe(p) != 0) return 1;
  for (i = 0; i < 2; i++) {
    kids[i] = fork();
    if (kids[i] == 0) {
      if (cu.Init(0) != 0) _exit(77);
      rank_main(i, p[0], p[1]);
    }
  }
  int bad = 0;
  waitpid(kids[0], &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "rank 0 ended wrongly (status %#x)\n", st);
    bad = 1;
  }
  waitpid(kids[1], &st, 0);
  if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
    fprintf(stderr, "rank 1 ended wrongly (status %#x)\n", st);
    bad = 1;
  }
  printf("%s\n", bad ? "FAILED" : "passed");
  return bad;
}
